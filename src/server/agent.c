/* agent.c: the agent APIs' shared machinery (see agent.h): the request as a
 * chat job, the output as blocks, streamed or whole. */
#include "server/agent.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"

void ksrv_agent_free(ksrv_agent *a) {
    if (!a) return;
    for (int i = 0; i < a->n; i++) ksrv_buf_free(&a->b[i].text), free(a->b[i].name);
    free(a->b);
    ktc_stream_destroy(a->st);
    cJSON_Delete(a->req);
    free(a);
}

void ksrv_agent_usage(const ksrv_job *j, int64_t *in, int64_t *out) {
    *in = j->n_prompts ? j->n_prompt[0] : 0;
    *out = j->n_choices ? j->ch[0].n_generated : 0;
}

kiln_status ksrv_agent_copy(const cJSON *from, const char *key, cJSON *to, const char *as) {
    const cJSON *v = ku_json_get(from, key);
    cJSON *d = v ? cJSON_Duplicate(v, true) : NULL;
    if (v && !d) return kiln_error(KILN_ENOMEM, "out of memory");
    if (d) cJSON_AddItemToObject(to, as, d);
    return NULL;
}

kiln_status ksrv_agent_chat_tool(cJSON *tools, const cJSON *t, const char *schema) {
    cJSON *c = cJSON_CreateObject();
    if (!c) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_AddItemToArray(tools, c);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    KILN_TRY(ksrv_agent_copy(t, "name", f, "name"));
    KILN_TRY(ksrv_agent_copy(t, "description", f, "description"));
    KILN_TRY(ksrv_agent_copy(t, schema, f, "parameters"));
    return ksrv_agent_copy(t, "strict", f, "strict");
}

void ksrv_agent_chat_call(cJSON *calls, const char *id, const char *name, cJSON *args) {
    cJSON *c = cJSON_CreateObject();
    if (!c) {
        cJSON_Delete(args);
        return;
    }
    cJSON_AddItemToArray(calls, c);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddItemToObject(f, "arguments", args);
}

/* A message's text: its string content, or its text parts joined. */
static void message_text(const cJSON *m, ksrv_buf *t) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *p;
    if (cJSON_IsString(c)) ksrv_buf_str(t, c->valuestring);
    if (!cJSON_IsArray(c)) return;
    cJSON_ArrayForEach(p, c) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(x)) ksrv_buf_str(t, x->valuestring);
    }
}

/* System (and developer) messages after the conversation began are folded
 * into the leading one: many templates only read messages[0] as the
 * system prompt and would drop (or refuse) the others. */
kiln_status ksrv_agent_fold_system(cJSON *msgs) {
    bool late = false, talk = false;
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
        bool sys = cJSON_IsString(r) && !strcmp(r->valuestring, "system");
        if (sys && talk) late = true;
        if (!sys) talk = true;
    }
    if (!late) return NULL;
    ksrv_buf t = {0};
    for (cJSON *x = msgs->child, *next; x; x = next) {
        next = x->next;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(x, "role");
        if (!cJSON_IsString(r) || strcmp(r->valuestring, "system")) continue;
        if (t.len) ksrv_buf_str(&t, "\n\n");
        message_text(x, &t);
        cJSON_Delete(cJSON_DetachItemViaPointer(msgs, x));
    }
    cJSON *sys = cJSON_CreateObject();
    if (sys) {
        cJSON_AddStringToObject(sys, "role", "system");
        cJSON_AddStringToObject(sys, "content", t.p ? t.p : "");
    }
    bool oom = !sys || t.oom;
    ksrv_buf_free(&t);
    if (oom || !cJSON_InsertItemInArray(msgs, 0, sys)) {
        cJSON_Delete(sys);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    return NULL;
}

kiln_status ksrv_agent_to_chat(ksrv_api api, const cJSON *body, cJSON **out) {
    *out = cJSON_CreateObject();
    if (!*out) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = api == KSRV_API_RESPONSES ? ksrv_responses_fill(body, *out) : ksrv_anthropic_fill(body, *out);
    if (!st) st = ksrv_agent_fold_system(cJSON_GetObjectItemCaseSensitive(*out, "messages"));
    if (st) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return st;
}

kiln_status ksrv_agent_parse(ksrv *s, const cJSON *body, ksrv_api api, ksrv_job **out, ksrv_err *e) {
    *out = NULL;
    *e = (ksrv_err){400, "invalid_request_error", NULL};
    cJSON *chat = NULL;
    kiln_status st = !cJSON_IsObject(body) ? kiln_error(KILN_EINVAL, "request body: expected a JSON object")
                                           : ksrv_agent_to_chat(api, body, &chat);
    if (st) {
        if (kiln_status_code(st) == KILN_ENOMEM) *e = (ksrv_err){500, "server_error", NULL};
        return st;
    }
    ksrv_job *j;
    st = ksrv_job_parse(s, chat, true, &j, e);
    cJSON_Delete(chat);
    if (st) return st;
    ksrv_agent *a = calloc(1, sizeof *a);
    if (a) {
        a->api = api;
        a->fn = api == KSRV_API_RESPONSES ? &ksrv_responses_api : &ksrv_anthropic_api;
        a->open = -1;
        a->req = cJSON_Duplicate(body, true);
        ktc_syntax syn = ksrv_tools_syntax(j->tools);
        a->st = ktc_stream_create(&syn);
        const char *hex = strchr(j->id, '-');
        snprintf(a->id, sizeof a->id, "%s%.32s", api == KSRV_API_RESPONSES ? "resp_" : "msg_", hex ? hex + 1 : j->id);
    }
    if (!a || !a->req || !a->st) {
        ksrv_agent_free(a);
        ksrv_job_free(j);
        *e = (ksrv_err){500, "server_error", NULL};
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    j->agent = a;
    *out = j;
    return NULL;
}

/* ---------------------------------------------------------------- blocks */

static int add_block(ksrv_job *j, ka_kind k, const char *name, size_t nn, int call) {
    ksrv_agent *a = j->agent;
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        ka_block *b = realloc(a->b, sizeof *b * (size_t)cap);
        if (!b) return -1;
        a->b = b;
        a->cap = cap;
    }
    ka_block *b = &a->b[a->n];
    *b = (ka_block){.kind = k, .call = call};
    if (name && !(b->name = strndup(name, nn))) return -1;
    static const char *const prefix[2][3] = {{"rs_", "msg_", "fc_"}, {"", "", "toolu_"}};
    const char *hex = strchr(a->id, '_');
    if (k == KA_CALL && a->api == KSRV_API_RESPONSES) { /* item id fc_..., call id: the chat call id */
        snprintf(b->id, sizeof b->id, "fc_%.24s_%d", hex ? hex + 1 : a->id, a->n);
    } else {
        snprintf(b->id, sizeof b->id, "%s%.24s_%d", prefix[a->api == KSRV_API_ANTHROPIC][k], hex ? hex + 1 : a->id, a->n);
    }
    return a->n++;
}

static void close_open(ksrv_job *j) {
    ksrv_agent *a = j->agent;
    if (a->open < 0) return;
    if (j->stream) a->fn->close(j, a->open);
    a->open = -1;
}

static void grow(ksrv_job *j, int b, const char *t, size_t n) {
    ksrv_agent *a = j->agent;
    ksrv_buf_add(&a->b[b].text, t, n);
    if (j->stream && a->open == b) a->fn->delta(j, b, t, n);
}

static int open_block(ksrv_job *j, ka_kind k, const char *name, size_t nn, int call) {
    close_open(j);
    int b = add_block(j, k, name, nn, call);
    if (b < 0) {
        j->out.oom = true;
        return -1;
    }
    j->agent->open = b;
    if (j->stream) j->agent->fn->open(j, b);
    return b;
}

static kiln_status on_delta(void *ud, const ktc_delta *d) {
    ksrv_job *j = ud;
    ksrv_agent *a = j->agent;
    if (d->kind == KTC_D_CALL) {
        open_block(j, KA_CALL, d->text, d->len, d->index);
        return NULL;
    }
    if (d->kind == KTC_D_ARGS) {
        for (int b = a->n - 1; b >= 0; b--)
            if (a->b[b].kind == KA_CALL && a->b[b].call == d->index) {
                grow(j, b, d->text, d->len);
                break;
            }
        return NULL;
    }
    ka_kind k = d->kind == KTC_D_CONTENT ? KA_TEXT : KA_REASONING;
    int b = a->open >= 0 && a->b[a->open].kind == k ? a->open : open_block(j, k, NULL, 0, -1);
    if (b >= 0) grow(j, b, d->text, d->len);
    return NULL;
}

static void feed(ksrv_job *j, const char *t, size_t n, bool final) {
    ksrv_agent *a = j->agent;
    if (a->fed_final) return;
    a->fed_final = final;
    kiln_status st = ktc_stream_feed(a->st, t ? t : "", n, final, on_delta, j);
    if (st) {
        kiln_status_free(st);
        j->out.oom = true;
    }
}

/* ---------------------------------------------------------------- output */

void ksrv_agent_stream(ksrv_job *j) {
    ksrv_agent *a = j->agent;
    if (!a->started) {
        a->fn->start(j);
        a->started = true;
    }
    int from, to;
    bool all = ksrv_job_take(j, &from, &to);
    for (int k = from; k < to; k++) {
        ksrv_ev ev = ksrv_job_ev(j, k);
        if (!ev.end) feed(j, ev.text, ev.len, ev.finish != KGEN_CONTINUE);
        else if (ev.error && !a->failed) {
            a->fn->error(j, &j->out, 500, ev.error);
            a->failed = true;
        }
    }
    if (all && to == j->n_ev) {
        feed(j, "", 0, true);
        close_open(j);
        if (!a->failed) a->fn->finish(j);
        j->done_sent = true;
    }
}

int ksrv_agent_response(ksrv_job *j, ksrv_buf *b) {
    ksrv_agent *a = j->agent;
    for (int k = 0; k < j->n_ev; k++)
        if (j->ev[k].end && j->ev[k].error) {
            a->fn->error(j, b, 500, j->ev[k].error);
            return 500;
        }
    ksrv_buf text = {0};
    for (int k = 0; k < j->n_ev; k++)
        if (!j->ev[k].end && j->ev[k].len) ksrv_buf_add(&text, j->ev[k].text, j->ev[k].len);
    ktc_syntax syn = ksrv_tools_syntax(j->tools);
    ktc_msg m;
    kiln_status st = ktc_parse(&syn, text.p ? text.p : "", text.len, false, &m);
    ksrv_buf_free(&text);
    if (st || j->failed) {
        kiln_status_free(st);
        a->fn->error(j, b, 500, "out of memory");
        return 500;
    }
    /* the blocks in their usual order: reasoning, text, calls */
    int r;
    if (m.n_reasoning && (r = add_block(j, KA_REASONING, NULL, 0, -1)) >= 0) ksrv_buf_add(&a->b[r].text, m.reasoning, m.n_reasoning);
    if (m.n_content && (r = add_block(j, KA_TEXT, NULL, 0, -1)) >= 0) ksrv_buf_add(&a->b[r].text, m.content, m.n_content);
    for (int i = 0; i < m.n_calls; i++)
        if ((r = add_block(j, KA_CALL, m.calls[i].name, strlen(m.calls[i].name), i)) >= 0)
            ksrv_buf_str(&a->b[r].text, m.calls[i].arguments);
    ktc_msg_free(&m);
    a->fn->body(j, b);
    return b->oom ? 500 : 200;
}
