/* llama.c: llama-server's native POST /completion (see server_int.h,
 * ksrv_llama_*): the request is a /v1/completions body (llama.cpp's field
 * names: prompt, n_predict, stop, stream, the samplers), one prompt, n = 1;
 * the answer is llama-server's {"content", "tokens", "stop", "stop_type",
 * ...}; a stream is `data: {"content": piece, "stop": false}` events and a
 * last one with "stop": true and the totals (llama-server sends no [DONE]). */
#include <string.h>

#include "server/server_int.h"

static const char *stop_type(kgen_finish f) {
    switch (f) {
    case KGEN_FINISH_EOS:
    case KGEN_FINISH_GRAMMAR: return "eos";
    case KGEN_FINISH_STOP_STRING: return "word";
    case KGEN_FINISH_LENGTH:
    case KGEN_FINISH_CONTEXT: return "limit";
    default: return "none";
    }
}

/* The fields after "content" of the last event or the whole answer. */
static void totals(ksrv_job *j, ksrv_buf *b) {
    const ksrv_choice *c = &j->ch[0];
    ksrv_buf_str(b, ", \"model\": ");
    ksrv_buf_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
    ksrv_buf_printf(b, ", \"stop\": true, \"stop_type\": \"%s\", \"tokens_predicted\": %d, \"tokens_evaluated\": %d, "
                       "\"tokens_cached\": %d, \"id_slot\": -1, \"timings\": ",
                    stop_type(c->finish), (int)c->n_generated, (int)j->n_prompt[0], (int)c->n_cached);
    ksrv_timings_json(j, b);
    ksrv_buf_str(b, "}");
}

kiln_status ksrv_llama_check(const ksrv_job *j) {
    if (j->n_choices != 1)
        return kiln_error(KILN_EINVAL, "\"prompt\": /completion takes one prompt and n = 1 (/v1/completions takes more)");
    return NULL;
}

void ksrv_llama_stream(ksrv_job *j) {
    int from, to;
    bool all = ksrv_job_take(j, &from, &to);
    for (int k = from; k < to; k++) {
        ksrv_ev ev = ksrv_job_ev(j, k);
        if (ev.end && ev.error) {
            ksrv_buf_str(&j->out, "data: ");
            ksrv_error_json(&j->out, 500, "server_error", NULL, ev.error);
            ksrv_buf_str(&j->out, "\n\n");
        }
        if (ev.end || !ev.len) continue;
        ksrv_buf_str(&j->out, "data: {\"content\": ");
        ksrv_buf_json_str(&j->out, ev.text, ev.len);
        ksrv_buf_printf(&j->out, ", \"tokens\": [%d], \"stop\": false}\n\n", (int)ev.token);
    }
    if (all && to == j->n_ev) {
        ksrv_buf_str(&j->out, "data: {\"content\": \"\"");
        totals(j, &j->out);
        ksrv_buf_str(&j->out, "\n\n");
        j->done_sent = true;
    }
}

int ksrv_llama_response(ksrv_job *j, ksrv_buf *b) {
    ksrv_buf text = {0}, toks = {0};
    int nt = 0;
    for (int k = 0; k < j->n_ev; k++) {
        const ksrv_ev *ev = &j->ev[k];
        if (ev->end && ev->error) {
            ksrv_buf_free(&text), ksrv_buf_free(&toks);
            ksrv_error_json(b, 500, "server_error", NULL, ev->error);
            return 500;
        }
        if (ev->end) continue;
        ksrv_buf_add(&text, ev->text ? ev->text : "", ev->len);
        ksrv_buf_printf(&toks, "%s%d", nt++ ? ", " : "", (int)ev->token);
    }
    ksrv_buf_str(b, "{\"content\": ");
    ksrv_buf_json_str(b, text.p ? text.p : "", text.len);
    ksrv_buf_printf(b, ", \"tokens\": [%s]", toks.p ? toks.p : "");
    totals(j, b);
    ksrv_buf_free(&text), ksrv_buf_free(&toks);
    return b->oom || j->failed ? 500 : 200;
}
