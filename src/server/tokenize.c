/* tokenize.c: llama-server's /tokenize and /detokenize (also vLLM's
 * fields: prompt, add_special_tokens) on the model's tokenizer, for a
 * generating server and an embedding / reranking one alike. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "embed/embed.h"
#include "server/server_int.h"

static int fail(ksrv_buf *out, kiln_status st) {
    int code = kiln_status_code(st) == KILN_ENOMEM ? 500 : 400;
    ksrv_error_json(out, code, code == 400 ? "invalid_request_error" : "server_error", NULL, kiln_status_msg(st));
    kiln_status_free(st);
    return code;
}

int ksrv_tokenize(ksrv *s, const cJSON *body, ksrv_buf *out) {
    const char *text;
    bool special, special2, pieces;
    kiln_status st = cJSON_IsObject(body) ? NULL : kiln_error(KILN_EINVAL, "request body: expected a JSON object");
    if (!st) st = ku_json_str(body, "content", NULL, &text);
    if (!st && !text) st = ku_json_str(body, "prompt", NULL, &text);
    if (!st && !text) st = kiln_error(KILN_EINVAL, "\"content\": required (a string)");
    if (!st) st = ku_json_bool(body, "add_special", false, &special);
    if (!st) st = ku_json_bool(body, "add_special_tokens", special, &special2);
    if (!st) st = ku_json_bool(body, "with_pieces", false, &pieces);
    if (!st && !s->tok) st = kiln_error(KILN_EINVAL, "the model has no tokenizer.json");
    int32_t *ids = NULL;
    size_t n = 0;
    if (!st) st = ktok_encode(s->tok, text, strlen(text), special2, &ids, &n);
    if (st) return fail(out, st);
    ksrv_buf_str(out, "{\"tokens\": [");
    for (size_t i = 0; i < n; i++) {
        if (!pieces) {
            ksrv_buf_printf(out, "%s%d", i ? ", " : "", (int)ids[i]);
            continue;
        }
        char *t = NULL;
        size_t len = 0;
        kiln_status_free(ktok_decode(s->tok, &ids[i], 1, false, &t, &len));
        ksrv_buf_printf(out, "%s{\"id\": %d, \"piece\": ", i ? ", " : "", (int)ids[i]);
        ksrv_buf_json_str(out, t ? t : "", t ? len : 0);
        ksrv_buf_str(out, "}");
        free(t);
    }
    ksrv_buf_printf(out, "], \"count\": %zu, \"max_model_len\": %lld}", n, (long long)ke_ctx_n_ctx(s->c ? s->c : s->emb_c));
    free(ids);
    return out->oom ? 500 : 200;
}

int ksrv_detokenize(ksrv *s, const cJSON *body, ksrv_buf *out) {
    const cJSON *t = ku_json_get(body, "tokens");
    kiln_status st = NULL;
    if (!cJSON_IsObject(body)) st = kiln_error(KILN_EINVAL, "request body: expected a JSON object");
    else if (!cJSON_IsArray(t)) st = kiln_error(KILN_EINVAL, "\"tokens\": required (a list of token ids)");
    else if (!s->tok) st = kiln_error(KILN_EINVAL, "the model has no tokenizer.json");
    int n = st ? 0 : cJSON_GetArraySize(t), i = 0;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    if (!st && !ids) st = kiln_error(KILN_ENOMEM, "out of memory");
    const cJSON *e;
    int64_t vocab = ke_model_hparams(s->m ? s->m : kemb_engine_model(s->emb))->vocab;
    if (!st)
        cJSON_ArrayForEach(e, t) {
            double d = e->valuedouble;
            if (!cJSON_IsNumber(e) || d != floor(d) || d < 0 || d > INT32_MAX) {
                st = kiln_error(KILN_EINVAL, "\"tokens\"[%d]: expected a token id", i);
                break;
            }
            if (d >= (double)vocab) {
                st = kiln_error(KILN_EINVAL, "\"tokens\"[%d]: token %lld is outside the model's vocabulary (%lld)", i,
                                (long long)d, (long long)vocab);
                break;
            }
            ids[i++] = (int32_t)d;
        }
    char *text = NULL;
    size_t len = 0;
    if (!st) st = ktok_decode(s->tok, ids, (size_t)n, false, &text, &len);
    free(ids);
    if (st) return fail(out, st);
    ksrv_buf_str(out, "{\"content\": ");
    ksrv_buf_json_str(out, text, len);
    ksrv_buf_str(out, ", \"prompt\": ");
    ksrv_buf_json_str(out, text, len);
    ksrv_buf_str(out, "}");
    free(text);
    return out->oom ? 500 : 200;
}

