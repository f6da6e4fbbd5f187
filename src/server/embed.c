/* embed.c: /v1/embeddings (OpenAI) and /v1/rerank, /rerank, /v2/rerank
 * (Jina / Cohere, as llama.cpp and vLLM serve them) over an embedding or
 * cross-encoder checkpoint (src/embed). A server of such a folder serves
 * these (and /tokenize, /v1/models, /health) instead of generation. Requests
 * run one at a time, each as ragged engine steps over all its inputs. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/json.h"
#include "embed/embed.h"
#include "server/server_int.h"

#define KSRV_EMBED_MAX_INPUTS 2048 /* OpenAI's limit per request */

bool ksrv_embed_folder(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/modules.json", dir);
    if (ku_file_exists(path)) return true;
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *cfg;
    kiln_status st = ku_json_load(path, &cfg);
    if (st) {
        kiln_status_free(st); /* no readable config: the model load says why */
        return false;
    }
    bool cross = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, ku_json_get(cfg, "architectures")) {
        const char *a = cJSON_GetStringValue(it);
        cross |= a && strstr(a, "ForSequenceClassification") != NULL;
    }
    cJSON_Delete(cfg);
    return cross;
}

kiln_status ksrv_embed_load(ksrv *s) {
    pthread_mutex_init(&s->emb_mu, NULL);
    kemb_pooling pool = KEMB_POOL_DEFAULT;
    if (s->p.pooling) KILN_TRYF(kemb_pooling_parse(s->p.pooling, &pool), "--pooling");
    s->emb_pooling = pool;
    kemb_as as = s->p.embed_mode == KSRV_EMBEDDINGS ? KEMB_AS_EMBED : s->p.embed_mode == KSRV_RERANK ? KEMB_AS_RERANK : KEMB_AS_AUTO;
    KILN_TRY(kemb_load_as(s->model_dir, as, &s->emb));
    if (s->p.pooling && (kemb_is_cross_encoder(s->emb) || kemb_is_decoder_reranker(s->emb)))
        return kiln_error(KILN_EINVAL, "--pooling: %s is served as a reranker, which pools nothing", s->model_dir);
    kiln_status st = ktok_load(s->model_dir, &s->tok);
    if (st && kiln_status_code(st) != KILN_ENOTFOUND) return st;
    kiln_status_free(st);
    if (kemb_is_decoder_reranker(s->emb)) { /* Qwen3-Reranker: P(yes) of its prompt, which needs the tokenizer */
        if (!s->tok) return kiln_error(KILN_EINVAL, "%s: a decoder reranker needs the model's tokenizer", s->model_dir);
        KILN_TRYF(kemb_yes_no(s->tok, &s->emb_yes, &s->emb_no), "%s", s->model_dir);
    }
    ke_ctx_params cp = {.n_ctx = s->p.ctx_size, .n_threads = s->p.threads, .block_size = s->p.block_size, .pooling = true};
    if (cp.n_ctx <= 0) {
        int64_t mp = ke_model_hparams(kemb_engine_model(s->emb))->max_pos;
        cp.n_ctx = mp > 0 && mp < 8192 ? mp : 8192;
    }
    cp.n_cache = s->p.kv_tokens > 0 ? s->p.kv_tokens : cp.n_ctx * s->p.parallel;
    return ke_ctx_create(kemb_engine_model(s->emb), &cp, &s->emb_c);
}

void ksrv_embed_free(ksrv *s) {
    if (!s->emb) return;
    ke_ctx_free(s->emb_c);
    kemb_free(s->emb);
    pthread_mutex_destroy(&s->emb_mu);
    s->emb = NULL;
}

typedef struct {
    int n;
    int32_t *ids[KSRV_EMBED_MAX_INPUTS];
    int32_t *types[KSRV_EMBED_MAX_INPUTS];
    int64_t lens[KSRV_EMBED_MAX_INPUTS];
    int64_t tokens;
} inputs;

static void inputs_free(inputs *in) {
    for (int i = 0; i < in->n; i++) free(in->ids[i]), free(in->types[i]);
}

static int bad(ksrv_buf *out, const char *msg) {
    ksrv_error_json(out, 400, "invalid_request_error", NULL, msg);
    return 400;
}

static int fail(ksrv_buf *out, kiln_status st) {
    int code = kiln_status_code(st) == KILN_ENOMEM ? 500 : 400;
    ksrv_error_json(out, code, code == 400 ? "invalid_request_error" : "server_error", NULL, kiln_status_msg(st));
    kiln_status_free(st);
    return code;
}

static kiln_status add_ids(inputs *in, const cJSON *list, int i) {
    int n = cJSON_GetArraySize(list);
    if (n <= 0) return kiln_error(KILN_EINVAL, "input[%d]: an empty list of token ids", i);
    if (!(in->ids[in->n] = malloc(sizeof(int32_t) * (size_t)n))) return kiln_error(KILN_ENOMEM, "out of memory");
    int k = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, list) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 2147483647.0 || v->valuedouble != (double)(int32_t)v->valuedouble) {
            free(in->ids[in->n]);
            return kiln_error(KILN_EINVAL, "input[%d][%d]: not a token id", i, k);
        }
        in->ids[in->n][k++] = (int32_t)v->valuedouble;
    }
    in->lens[in->n++] = n;
    return NULL;
}

static kiln_status add_text(ksrv *s, inputs *in, const char *text, const char *prompt, int i) {
    if (!s->tok) return kiln_error(KILN_EINVAL, "input[%d]: text needs a tokenizer (this model has none; send token ids)", i);
    KILN_TRYF(kemb_encode(s->tok, prompt, text, &in->ids[in->n], &in->lens[in->n]), "input[%d]", i);
    in->n++;
    return NULL;
}

/* OpenAI's input: a string, a list of strings, a list of ids, or a list of id lists. */
static kiln_status parse_input(ksrv *s, const cJSON *x, const char *prompt, inputs *in) {
    if (cJSON_IsString(x)) return add_text(s, in, x->valuestring, prompt, 0);
    if (!cJSON_IsArray(x) || !cJSON_GetArraySize(x))
        return kiln_error(KILN_EINVAL, "\"input\" must be a string, a list of strings, a list of token ids or a list of such lists");
    if (cJSON_IsNumber(cJSON_GetArrayItem(x, 0))) return add_ids(in, x, 0);
    if (cJSON_GetArraySize(x) > KSRV_EMBED_MAX_INPUTS)
        return kiln_error(KILN_ELIMIT, "\"input\" holds %d inputs, more than %d", cJSON_GetArraySize(x), KSRV_EMBED_MAX_INPUTS);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, x) {
        if (cJSON_IsString(it)) KILN_TRY(add_text(s, in, it->valuestring, prompt, i));
        else if (cJSON_IsArray(it)) KILN_TRY(add_ids(in, it, i));
        else return kiln_error(KILN_EINVAL, "input[%d]: not a string or a list of token ids", i);
        i++;
    }
    return NULL;
}

/* Each input within the context: a clear 400 naming it, not an engine error. */
static kiln_status check_lengths(ksrv *s, inputs *in) {
    int64_t ctx = ke_ctx_n_ctx(s->emb_c);
    int64_t vocab = ke_model_hparams(kemb_engine_model(s->emb))->vocab;
    for (int i = 0; i < in->n; i++) {
        if (in->lens[i] > ctx)
            return kiln_error(KILN_EINVAL, "input[%d] has %lld tokens, more than the %lld this server takes per input", i,
                              (long long)in->lens[i], (long long)ctx);
        for (int64_t k = 0; k < in->lens[i]; k++)
            if (in->ids[i][k] >= vocab)
                return kiln_error(KILN_EINVAL, "input[%d]: token id %d is out of range (the vocabulary has %lld tokens)", i,
                                  in->ids[i][k], (long long)vocab);
        in->tokens += in->lens[i];
    }
    return NULL;
}

static void base64(ksrv_buf *b, const uint8_t *p, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        q[0] = t[v >> 18 & 63], q[1] = t[v >> 12 & 63];
        q[2] = i + 1 < n ? t[v >> 6 & 63] : '=';
        q[3] = i + 2 < n ? t[v & 63] : '=';
        ksrv_buf_add(b, q, 4);
    }
}

static void floats(ksrv_buf *b, const float *e, int64_t d) {
    ksrv_buf_str(b, "[");
    for (int64_t j = 0; j < d; j++) ksrv_buf_printf(b, "%s%.9g", j ? "," : "", e[j]);
    ksrv_buf_str(b, "]");
}

/* One input's result: a vector (float or base64), or its tokens' vectors
 * (pooling none) as a list of lists. */
static void vector(ksrv_buf *b, const float *e, int64_t rows, int64_t d, bool b64) {
    if (b64) {
        ksrv_buf_str(b, "\"");
        base64(b, (const uint8_t *)e, sizeof(float) * (size_t)d); /* little-endian float32, as OpenAI's */
        ksrv_buf_str(b, "\"");
        return;
    }
    if (rows < 0) return floats(b, e, d);
    ksrv_buf_str(b, "[");
    for (int64_t r = 0; r < rows; r++) ksrv_buf_str(b, r ? "," : ""), floats(b, e + r * d, d);
    ksrv_buf_str(b, "]");
}

int ksrv_embeddings(ksrv *s, const cJSON *body, ksrv_buf *out, ksrv_embed_api api) {
    if (!s->emb || kemb_is_cross_encoder(s->emb) || kemb_is_decoder_reranker(s->emb))
        return bad(out, "this server's model is not an embedding model (serve a folder with sentence-transformers' modules.json, "
                        "or any encoder or decoder with kiln serve --embeddings)");
    bool per_token = s->emb_pooling == KEMB_POOL_NONE;
    if (per_token && api == KSRV_EMBED_OPENAI)
        return bad(out, "this server runs --pooling none (a vector per token), which /v1/embeddings cannot return: "
                        "use /embedding or /pooling, or serve with another --pooling");
    const char *fmt = "float", *prompt_name = NULL;
    int64_t dims = 0, norm = 2;
    kiln_status st = api == KSRV_EMBED_LLAMA ? NULL : ku_json_str(body, "encoding_format", "float", &fmt);
    if (!st && api == KSRV_EMBED_OPENAI) st = ku_json_int(body, "dimensions", 0, &dims);
    if (!st && api == KSRV_EMBED_LLAMA) st = ku_json_int(body, "embd_normalize", 2, &norm); /* llama.cpp's: 2 Euclidean, -1 none */
    if (!st) st = ku_json_str(body, "prompt_name", NULL, &prompt_name); /* sentence-transformers' prompts (vLLM, TEI) */
    if (st) return fail(out, st);
    if (norm != 2 && norm != -1) return bad(out, "\"embd_normalize\" must be 2 (Euclidean) or -1 (none); kiln has no other norms");
    int64_t dim = per_token ? ke_model_hparams(kemb_engine_model(s->emb))->hidden : kemb_dim(s->emb);
    if (strcmp(fmt, "float") && strcmp(fmt, "base64")) return bad(out, "\"encoding_format\" must be \"float\" or \"base64\"");
    if (per_token && !strcmp(fmt, "base64")) return bad(out, "\"encoding_format\" base64 is for one vector per input, not --pooling none");
    if (dims < 0 || dims > dim || (ku_json_get(body, "dimensions") && dims == 0)) {
        char msg[160];
        snprintf(msg, sizeof msg, "\"dimensions\" must be between 1 and %lld (the model's)", (long long)dim);
        return bad(out, msg);
    }
    const char *prompt = prompt_name ? kemb_prompt(s->emb, prompt_name) : NULL;
    if (prompt_name && !prompt) return bad(out, "\"prompt_name\" names no prompt of config_sentence_transformers.json");
    /* llama.cpp's /embedding takes "content" (or "input"), in the same shapes */
    const cJSON *x = ku_json_get(body, "input");
    if (!x && api == KSRV_EMBED_LLAMA) x = ku_json_get(body, "content");
    if (!x) return bad(out, api == KSRV_EMBED_LLAMA ? "\"content\" or \"input\" is required" : "\"input\" is required");
    inputs *in = calloc(1, sizeof *in);
    float *v = NULL;
    if (!in) return fail(out, kiln_error(KILN_ENOMEM, "out of memory"));
    st = parse_input(s, x, prompt, in);
    if (!st) st = check_lengths(s, in);
    if (!st && !(v = malloc(sizeof(float) * (size_t)((per_token ? in->tokens : in->n) * dim)))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) {
        kemb_opts o = {.pooling = (kemb_pooling)s->emb_pooling, .normalize = api == KSRV_EMBED_LLAMA ? norm == 2 : -1};
        pthread_mutex_lock(&s->emb_mu);
        st = per_token ? kemb_token_states(s->emb, s->emb_c, in->n, (const int32_t *const *)in->ids, in->lens, v)
                       : kemb_embed(s->emb, s->emb_c, in->n, (const int32_t *const *)in->ids, in->lens, &o, v);
        pthread_mutex_unlock(&s->emb_mu);
    }
    if (st) {
        free(v), inputs_free(in), free(in);
        return fail(out, st);
    }
    int64_t d = dims > 0 ? dims : dim, row = 0;
    if (api == KSRV_EMBED_LLAMA) ksrv_buf_str(out, "[");
    else if (api == KSRV_EMBED_POOLING) {
        static atomic_ulong counter; /* ids as oai.c's */
        unsigned long k = atomic_fetch_add(&counter, 1);
        ksrv_buf_printf(out, "{\"id\":\"pool-%lx%04lx\",\"object\":\"list\",\"created\":%ld,\"data\":[", (unsigned long)time(NULL),
                        k & 0xFFFF, (long)time(NULL));
    }
    else ksrv_buf_str(out, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < in->n; i++) {
        float *e = v + (per_token ? row : i) * dim;
        row += in->lens[i];
        if (d < dim && kemb_model_normalizes(s->emb)) kemb_normalize(e, d); /* Matryoshka: truncated, renormalised */
        if (api == KSRV_EMBED_LLAMA) { /* llama.cpp: a list of vectors, one per token, or the one pooled */
            ksrv_buf_printf(out, "%s{\"index\":%d,\"embedding\":", i ? "," : "", i);
            vector(out, e, per_token ? in->lens[i] : 1, d, false);
        } else {
            ksrv_buf_printf(out, "%s{\"object\":\"%s\",\"index\":%d,\"%s\":", i ? "," : "",
                            api == KSRV_EMBED_POOLING ? "pooling" : "embedding", i, api == KSRV_EMBED_POOLING ? "data" : "embedding");
            vector(out, e, per_token ? in->lens[i] : -1, d, !strcmp(fmt, "base64"));
        }
        ksrv_buf_str(out, "}");
    }
    if (api == KSRV_EMBED_LLAMA) ksrv_buf_str(out, "]");
    else {
        ksrv_buf_str(out, "],\"model\":");
        ksrv_buf_json_str(out, s->model_id, strlen(s->model_id));
        ksrv_buf_printf(out, ",\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}", (long long)in->tokens, (long long)in->tokens);
    }
    free(v), inputs_free(in), free(in);
    return out->oom ? 500 : 200;
}

int ksrv_rerank(ksrv *s, const cJSON *body, ksrv_buf *out) {
    if (!s->emb || !(kemb_is_cross_encoder(s->emb) || kemb_is_decoder_reranker(s->emb)))
        return bad(out, "this server's model is not a reranker (serve a *ForSequenceClassification cross-encoder, "
                        "or a causal LM such as Qwen3-Reranker with kiln serve --rerank)");
    if (!s->tok) return bad(out, "reranking needs the model's tokenizer");
    const char *query = cJSON_GetStringValue(ku_json_get(body, "query"));
    const cJSON *docs = ku_json_get(body, "documents");
    if (!query) return bad(out, "\"query\" must be a string");
    if (!cJSON_IsArray(docs) || !cJSON_GetArraySize(docs)) return bad(out, "\"documents\" must be a non-empty list");
    if (cJSON_GetArraySize(docs) > KSRV_EMBED_MAX_INPUTS) return bad(out, "\"documents\" holds more than 2048 documents");
    int64_t top_n;
    bool ret_docs;
    kiln_status st = ku_json_int(body, "top_n", cJSON_GetArraySize(docs), &top_n);
    if (!st) st = ku_json_bool(body, "return_documents", true, &ret_docs);
    if (st) return fail(out, st);
    if (top_n < 0) return bad(out, "\"top_n\" must not be negative");
    inputs *in = calloc(1, sizeof *in);
    if (!in) return fail(out, kiln_error(KILN_ENOMEM, "out of memory"));
    const char *text[KSRV_EMBED_MAX_INPUTS];
    const cJSON *it;
    cJSON_ArrayForEach(it, docs) {
        /* a string, or {"text": ...} (Cohere v2, Jina) */
        text[in->n] = cJSON_IsString(it) ? it->valuestring : cJSON_GetStringValue(ku_json_get(it, "text"));
        if (!text[in->n]) {
            st = kiln_error(KILN_EINVAL, "documents[%d]: not a string or an object with \"text\"", in->n);
            break;
        }
        st = kemb_encode_pair(s->emb, s->tok, NULL, query, text[in->n], &in->ids[in->n], &in->types[in->n], &in->lens[in->n]);
        if (st) {
            st = kiln_status_wrap(st, "documents[%d]", in->n);
            break;
        }
        in->n++;
    }
    if (!st) st = check_lengths(s, in);
    float *sc = NULL;
    int *r = NULL;
    if (!st && (!(sc = malloc(sizeof(float) * (size_t)in->n)) || !(r = malloc(sizeof(int) * (size_t)in->n))))
        st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) {
        pthread_mutex_lock(&s->emb_mu);
        st = kemb_score(s->emb, s->emb_c, in->n, (const int32_t *const *)in->ids, in->lens, (const int32_t *const *)in->types, s->emb_yes,
                        s->emb_no, sc);
        pthread_mutex_unlock(&s->emb_mu);
    }
    for (int i = 0; !st && i < in->n; i++) sc[i] = kemb_relevance(s->emb, sc[i]);
    if (!st) st = kemb_rank(sc, in->n, r);
    if (st) {
        free(sc), free(r), inputs_free(in), free(in);
        return fail(out, st);
    }
    ksrv_buf_str(out, "{\"object\":\"list\",\"model\":");
    ksrv_buf_json_str(out, s->model_id, strlen(s->model_id));
    ksrv_buf_str(out, ",\"results\":[");
    for (int i = 0; i < in->n && i < top_n; i++) {
        ksrv_buf_printf(out, "%s{\"index\":%d,\"relevance_score\":%.9g", i ? "," : "", r[i], sc[r[i]]);
        if (ret_docs) {
            ksrv_buf_str(out, ",\"document\":{\"text\":");
            ksrv_buf_json_str(out, text[r[i]], strlen(text[r[i]]));
            ksrv_buf_str(out, "}");
        }
        ksrv_buf_str(out, "}");
    }
    ksrv_buf_printf(out, "],\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}", (long long)in->tokens, (long long)in->tokens);
    free(sc), free(r), inputs_free(in), free(in);
    return out->oom ? 500 : 200;
}
