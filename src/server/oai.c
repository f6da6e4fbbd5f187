/* oai.c: OpenAI /v1/completions and /v1/chat/completions: request bodies
 * to scheduler requests, scheduler events to responses (SSE chunks or one
 * JSON body). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "engine/textio.h"
#include "server/server_int.h"

#define ERR_BAD(e) (*(e) = (ksrv_err){400, "invalid_request_error", NULL})

/* ---------------------------------------------------------------- parsing */

static kiln_status json_ids(const cJSON *a, const char *what, int64_t vocab, int32_t **out, int32_t *n) {
    int cnt = cJSON_GetArraySize(a);
    if (cnt <= 0) return kiln_error(KILN_EINVAL, "\"%s\": the prompt is empty", what);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)cnt);
    if (!ids) return kiln_error(KILN_ENOMEM, "out of memory");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != floor(d) || d < 0 || d >= (double)vocab) {
            free(ids);
            return kiln_error(KILN_EINVAL, "\"%s\"[%d]: expected a token id in [0, %lld)", what, i, (long long)vocab);
        }
        ids[i++] = (int32_t)d;
    }
    *out = ids;
    *n = cnt;
    return NULL;
}

static kiln_status encode(ksrv *s, const char *what, const char *text, bool add_special, int32_t **ids, int32_t *n) {
    if (!s->tok)
        return kiln_error(KILN_EINVAL, "\"%s\": the model has no tokenizer.json: give the prompt as token ids", what);
    size_t cnt;
    KILN_TRY(ktok_encode(s->tok, text, strlen(text), add_special, ids, &cnt));
    if (cnt == 0) {
        free(*ids);
        *ids = NULL;
        return kiln_error(KILN_EINVAL, "\"%s\": the prompt is empty", what);
    }
    *n = (int32_t)cnt;
    int64_t vocab = ke_model_hparams(s->m)->vocab;
    for (size_t i = 0; i < cnt; i++)
        if ((*ids)[i] >= vocab)
            return kiln_error(KILN_EINVAL, "\"%s\": token %d is outside the model's vocabulary (%lld)", what,
                              (int)(*ids)[i], (long long)vocab);
    return NULL;
}

/* Takes ids; copies text (NULL for token prompts). */
static kiln_status add_prompt(ksrv_job *j, int32_t *ids, int32_t n, const char *text) {
    size_t k = (size_t)j->n_prompts + 1;
    int32_t **p = realloc(j->prompts, sizeof(int32_t *) * k);
    if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
    j->prompts = p;
    int32_t *np = realloc(j->n_prompt, sizeof(int32_t) * k);
    if (!np) return kiln_error(KILN_ENOMEM, "out of memory");
    j->n_prompt = np;
    char **ps = realloc(j->prompt_str, sizeof(char *) * k);
    if (!ps) return kiln_error(KILN_ENOMEM, "out of memory");
    j->prompt_str = ps;
    char *t = text ? strdup(text) : NULL;
    if (text && !t) return kiln_error(KILN_ENOMEM, "out of memory");
    j->prompt_str[j->n_prompts] = t;
    j->prompts[j->n_prompts] = ids;
    j->n_prompt[j->n_prompts++] = n;
    return NULL;
}

/* llama-server's multimodal prompt {"prompt_string": "... <__media__> ...",
 * "multimodal_data": ["<base64>", ...]}: the text between the markers
 * tokenized piece by piece (special tokens on the first, as mtmd_tokenize),
 * each marker becoming its image's placeholder, expanded to the image's
 * block as a chat message's image is. */
static kiln_status parse_media_prompt(ksrv *s, ksrv_job *j, const cJSON *p) {
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(p, "prompt_string"), *md = cJSON_GetObjectItemCaseSensitive(p, "multimodal_data");
    if (!cJSON_IsString(ps)) return kiln_error(KILN_EINVAL, "\"prompt.prompt_string\": expected a string");
    if (md && !cJSON_IsArray(md)) return kiln_error(KILN_EINVAL, "\"prompt.multimodal_data\": expected a list of base64 images");
    if (!s->tok) return kiln_error(KILN_EINVAL, "\"prompt.prompt_string\": the model has no tokenizer.json");
    int k = 0, n_md = md ? cJSON_GetArraySize(md) : 0;
    const char *text = ps->valuestring, *at;
    for (at = strstr(text, KSRV_MEDIA_MARKER); at; at = strstr(at + strlen(KSRV_MEDIA_MARKER), KSRV_MEDIA_MARKER)) k++;
    if (k != n_md)
        return kiln_error(KILN_EINVAL, "\"prompt.multimodal_data\": %d items for %d %s markers in \"prompt.prompt_string\"", n_md, k,
                          KSRV_MEDIA_MARKER);
    if (n_md > 0 && !j->images && !(j->images = calloc(1, sizeof *j->images))) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = NULL;
    for (int i = 0; i < n_md && !st; i++) {
        const cJSON *e = cJSON_GetArrayItem(md, i);
        char what[48];
        snprintf(what, sizeof what, "\"prompt.multimodal_data\"[%d]", i);
        st = cJSON_IsString(e) ? ksrv_images_add_base64(s, j->images, e->valuestring, what)
                               : kiln_error(KILN_EINVAL, "%s: expected a base64 string", what);
    }
    int32_t *ids = NULL, n = 0, ph = n_md > 0 ? kvis_placeholder_token(ke_model_vision(s->m)) : -1;
    for (int piece = 0; !st; piece++) {
        const char *end = strstr(text, KSRV_MEDIA_MARKER);
        size_t len = end ? (size_t)(end - text) : strlen(text), cnt = 0;
        int32_t *t = NULL;
        if (len > 0 || piece == 0) st = ktok_encode(s->tok, text, len, piece == 0, &t, &cnt);
        int32_t *grown = st ? NULL : realloc(ids, sizeof(int32_t) * ((size_t)n + cnt + 1));
        if (!st && !grown) st = kiln_error(KILN_ENOMEM, "out of memory");
        if (!st) {
            ids = grown;
            if (cnt) memcpy(ids + n, t, sizeof(int32_t) * cnt);
            n += (int32_t)cnt;
            if (end) ids[n++] = ph;
        }
        free(t);
        if (!end) break;
        text = end + strlen(KSRV_MEDIA_MARKER);
    }
    if (!st && n == 0) st = kiln_error(KILN_EINVAL, "\"prompt.prompt_string\": the prompt is empty");
    int64_t vocab = ke_model_hparams(s->m)->vocab;
    for (int32_t i = 0; !st && i < n; i++)
        if (ids[i] >= vocab) st = kiln_error(KILN_EINVAL, "\"prompt.prompt_string\": token %d is outside the model's vocabulary", (int)ids[i]);
    if (!st && j->images) st = ksrv_images_apply(s, j->images, "prompt", &ids, &n);
    if (!st) st = add_prompt(j, ids, n, ps->valuestring);
    if (st) free(ids);
    return st;
}

/* prompt: a string, a list of token ids, a list of strings, or a list of
 * lists of token ids; or llama-server's multimodal object (parse_media_prompt). */
static kiln_status parse_prompt(ksrv *s, ksrv_job *j, const cJSON *body) {
    const cJSON *p = ku_json_get(body, "prompt");
    int64_t vocab = ke_model_hparams(s->m)->vocab;
    int32_t *ids = NULL, n = 0;
    if (!p) return kiln_error(KILN_EINVAL, "\"prompt\": required");
    if (cJSON_IsObject(p)) return parse_media_prompt(s, j, p);
    if (cJSON_IsString(p)) {
        KILN_TRY(encode(s, "prompt", p->valuestring, true, &ids, &n));
        kiln_status st = add_prompt(j, ids, n, p->valuestring);
        if (st) free(ids);
        return st;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return kiln_error(KILN_EINVAL, "\"prompt\": expected a string, a list of token ids, or a list of either");
    const cJSON *first = p->child;
    if (cJSON_IsNumber(first)) {
        KILN_TRY(json_ids(p, "prompt", vocab, &ids, &n));
        kiln_status st = add_prompt(j, ids, n, NULL);
        if (st) free(ids);
        return st;
    }
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, p) {
        char what[32];
        snprintf(what, sizeof what, "prompt[%d]", i++);
        if (i > s->p.max_choices)
            return kiln_error(KILN_EINVAL, "\"prompt\": more than %d prompts", s->p.max_choices);
        if (cJSON_IsString(e)) KILN_TRY(encode(s, what, e->valuestring, true, &ids, &n));
        else if (cJSON_IsArray(e)) KILN_TRY(json_ids(e, what, vocab, &ids, &n));
        else return kiln_error(KILN_EINVAL, "\"%s\": expected a string or a list of token ids", what);
        kiln_status st = add_prompt(j, ids, n, cJSON_IsString(e) ? e->valuestring : NULL);
        if (st) {
            free(ids);
            return st;
        }
    }
    return NULL;
}

/* Message content as the templates expect it: a string, or, when a part
 * is an image, the list of parts as transformers passes them to templates
 * ({"type": "text", "text": ...} and {"type": "image"}), the images going
 * to *images (calloc'ed; NULL when none). Without images a list of text
 * parts is joined into a string. */
static kiln_status content_parts(ksrv *s, cJSON *m, int i, ksrv_images **images) {
    cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    ksrv_buf t = {0};
    cJSON *parts = cJSON_CreateArray();
    if (!parts) return kiln_error(KILN_ENOMEM, "out of memory");
    bool has_image = false;
    const cJSON *part;
    int k = 0;
    kiln_status st = NULL;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        char what[64];
        snprintf(what, sizeof what, "\"messages\"[%d].content[%d]", i, k++);
        cJSON *np = cJSON_CreateObject();
        if (!np) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            break;
        }
        cJSON_AddItemToArray(parts, np);
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "text") && cJSON_IsString(text)) {
            ksrv_buf_str(&t, text->valuestring);
            cJSON_AddStringToObject(np, "type", "text");
            cJSON_AddStringToObject(np, "text", text->valuestring);
        } else if (cJSON_IsString(type) && !strcmp(type->valuestring, "image_url")) {
            if (!*images && !(*images = calloc(1, sizeof **images))) {
                st = kiln_error(KILN_ENOMEM, "out of memory");
                break;
            }
            if ((st = ksrv_images_add(s, *images, part, what))) break;
            cJSON_AddStringToObject(np, "type", "image");
            has_image = true;
        } else if (cJSON_IsString(type) && (!strcmp(type->valuestring, "video") || !strcmp(type->valuestring, "video_url"))) {
            if (!*images && !(*images = calloc(1, sizeof **images))) {
                st = kiln_error(KILN_ENOMEM, "out of memory");
                break;
            }
            if ((st = ksrv_videos_add(s, *images, part, what))) break;
            cJSON_AddStringToObject(np, "type", "video"); /* as transformers passes a video part to templates */
            has_image = true;
        } else {
            st = kiln_error(KILN_EINVAL, "%s: only {\"type\": \"text\", \"text\": ...}, {\"type\": \"image_url\", \"image_url\": {\"url\": ...}} and {\"type\": \"video\", \"video\": [frame URLs]} parts are supported",
                            what);
            break;
        }
    }
    cJSON *str = st || has_image ? NULL : cJSON_CreateString(t.p ? t.p : "");
    ksrv_buf_free(&t);
    if (st) {
        cJSON_Delete(parts);
        return st;
    }
    if (!has_image) cJSON_Delete(parts);
    cJSON *rep = has_image ? parts : str;
    if (!rep) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_ReplaceItemInObjectCaseSensitive(m, "content", rep);
    return NULL;
}

static kiln_status flatten_messages(ksrv *s, const cJSON *msgs, cJSON **out, ksrv_images **images) {
    *out = NULL;
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return kiln_error(KILN_EINVAL, "\"messages\": expected a non-empty list of messages");
    cJSON *copy = cJSON_Duplicate(msgs, true);
    if (!copy) return kiln_error(KILN_ENOMEM, "out of memory");
    int i = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, copy) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            cJSON_Delete(copy);
            return kiln_error(KILN_EINVAL, "\"messages\"[%d]: expected an object with a string \"role\"", i);
        }
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsArray(c)) {
            kiln_status st = content_parts(s, m, i, images);
            if (st) {
                cJSON_Delete(copy);
                return st;
            }
        } else if (c && !cJSON_IsString(c) && !cJSON_IsNull(c)) {
            cJSON_Delete(copy);
            return kiln_error(KILN_EINVAL, "\"messages\"[%d].content: expected a string or a list of parts", i);
        }
        i++;
    }
    *out = copy;
    return NULL;
}

/* Content part lists back to strings (their text parts joined), for a
 * template that does not iterate over parts. */
static kiln_status join_parts(cJSON *msgs) {
    cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
        if (!cJSON_IsArray(c)) continue;
        ksrv_buf t = {0};
        cJSON_ArrayForEach(part, c) {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(text)) ksrv_buf_str(&t, text->valuestring);
        }
        cJSON *str = t.oom ? NULL : cJSON_CreateString(t.p ? t.p : "");
        ksrv_buf_free(&t);
        if (!str) return kiln_error(KILN_ENOMEM, "out of memory");
        cJSON_ReplaceItemInObjectCaseSensitive(m, "content", str);
    }
    return NULL;
}

static kiln_status parse_chat(ksrv *s, ksrv_job *j, const cJSON *body) {
    if (!s->tmpl) return kiln_error(KILN_EINVAL, "\"messages\": the model has no chat template: use /v1/completions");
    cJSON *msgs;
    KILN_TRY(flatten_messages(s, ku_json_get(body, "messages"), &msgs, &j->images));
    const cJSON *kw = ku_json_get(body, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) {
        cJSON_Delete(msgs);
        return kiln_error(KILN_EINVAL, "\"chat_template_kwargs\": expected an object");
    }
    const cJSON *tools = NULL;
    cJSON *extra = kw ? cJSON_Duplicate(kw, true) : NULL;
    kiln_status st = kw && !extra ? kiln_error(KILN_ENOMEM, "out of memory") : ksrv_tools_fix_messages(msgs);
    if (!st && strstr(kchat_source(s->tmpl), "length != 9")) st = ksrv_tools_fit_ids(msgs); /* Mistral's */
    if (!st) st = ksrv_tools_parse(s, body, &j->gp, &j->tools, &tools, &extra);
    if (!st) st = ksrv_tools_phi4_system(j->tools, msgs, tools);
    if (st) {
        cJSON_Delete(msgs), cJSON_Delete(extra);
        return st;
    }
    kchat_input in = {.messages = msgs, .tools = tools, .extra = extra, .add_generation_prompt = true};
    char *text = NULL;
    st = kchat_render(s->tmpl, &in, &text);
    /* A template written for string content prints a list of parts as the
     * list itself (where Python's jinja would fail): render the joined text
     * instead, and the image goes where kiln generate puts it. */
    if (!st && j->images && (strstr(text, "{\"type\": \"image\"}") || strstr(text, "{\"type\": \"video\"}"))) {
        free(text);
        text = NULL;
        st = join_parts(msgs);
        if (!st) st = kchat_render(s->tmpl, &in, &text);
    }
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    if (st) return kiln_status_wrap(st, "\"messages\": the chat template failed");
    int32_t *ids = NULL, n = 0;
    if (j->tools) st = ksrv_tools_set_prompt(j->tools, &text, &j->gp);
    if (!st) st = encode(s, "messages", text, false, &ids, &n); /* the template writes its own special tokens */
    free(j->rendered);
    j->rendered = text;
    if (!st && j->images) st = ksrv_images_apply(s, j->images, "messages", &ids, &n);
    if (!st) st = add_prompt(j, ids, n, NULL);
    if (st) free(ids);
    return st;
}

static kiln_status parse_body(ksrv *s, ksrv_job *j, const cJSON *body, bool chat, ksrv_err *e) {
    ERR_BAD(e);
    if (!cJSON_IsObject(body)) return kiln_error(KILN_EINVAL, "request body: expected a JSON object");
    const char *model;
    KILN_TRY(ku_json_str(body, "model", NULL, &model));
    if (model && !s->p.any_model && strcmp(model, s->model_id) && strcmp(model, s->model_dir)) {
        *e = (ksrv_err){404, "invalid_request_error", "model_not_found"};
        return kiln_error(KILN_ENOTFOUND, "\"model\": the model \"%s\" does not exist (this server has \"%s\")", model,
                          s->model_id);
    }
    int64_t n;
    KILN_TRY(ku_json_int(body, "n", 1, &n));
    if (n < 1 || n > s->p.max_choices)
        return kiln_error(KILN_EINVAL, "\"n\": %lld is out of range [1, %d]", (long long)n, s->p.max_choices);
    int64_t best_of;
    KILN_TRY(ku_json_int(body, "best_of", n, &best_of));
    if (best_of != n) return kiln_error(KILN_EINVAL, "\"best_of\": only best_of = n is supported");
    KILN_TRY(ku_json_bool(body, "stream", false, &j->stream));
    const cJSON *so = ku_json_get(body, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return kiln_error(KILN_EINVAL, "\"stream_options\": expected an object");
        KILN_TRYF(ku_json_bool(so, "include_usage", false, &j->include_usage), "\"stream_options\"");
    }
    KILN_TRY(ku_json_bool(body, "return_tokens", false, &j->return_tokens));
    const char *user, *suffix;
    KILN_TRY(ku_json_str(body, "user", NULL, &user));
    if (!chat) {
        KILN_TRY(ku_json_bool(body, "echo", false, &j->echo));
        KILN_TRY(ku_json_str(body, "suffix", NULL, &suffix));
        if (suffix && *suffix) return kiln_error(KILN_EUNSUPPORTED, "\"suffix\": not supported");
    }
    /* OpenAI's and vLLM's ranges (llama.cpp's n_predict keeps -1, no limit) */
    const char *mt_key = NULL; /* the field that set the length, when the body did */
    static const char *const mt_keys[] = {"n_predict", "max_completion_tokens", "max_tokens"}; /* kgen_params_from_json's order */
    for (int i = 0; i < 3; i++) {
        const cJSON *mt = ku_json_get(body, mt_keys[i]);
        if (!mt) continue;
        if (!mt_key) mt_key = mt_keys[i];
        if (i > 0 && cJSON_IsNumber(mt) && mt->valuedouble < 1)
            return kiln_error(KILN_EINVAL, "\"%s\": must be at least 1, got %g", mt_keys[i], mt->valuedouble);
    }
    const cJSON *temp = ku_json_get(body, "temperature");
    if (cJSON_IsNumber(temp) && temp->valuedouble < 0)
        return kiln_error(KILN_EINVAL, "\"temperature\": must be at least 0, got %g", temp->valuedouble);
    /* sampling: the server's defaults, then the body (text logit_bias keys
     * need the tokenizer) */
    ke_text_vocab tv;
    int64_t vocab = ke_model_hparams(s->m)->vocab;
    kgen_vocab v = {(int32_t)vocab, NULL, NULL, NULL, NULL};
    if (s->tok) {
        ke_text_vocab_init(&tv, s->tok, (int32_t)vocab);
        v = ke_text_vocab_get(&tv);
    }
    KILN_TRY(kgen_params_copy(&j->gp, &s->defaults));
    kiln_status st = kgen_params_from_json(&j->gp, body, &v);
    if (s->tok) ke_text_vocab_free(&tv);
    if (st) return st;
    /* no length given: chat runs to the end of the context (vLLM's
     * default); /v1/completions generates 16 tokens as OpenAI documents,
     * unless the server was given a default (-n) */
    if (!mt_key && !chat && s->defaults.n_predict < 0) j->gp.n_predict = 16;
    j->want_logprobs = j->gp.logprobs;
    j->n_top = j->gp.n_probs;
    KILN_TRY(chat ? parse_chat(s, j, body) : parse_prompt(s, j, body));
    int64_t n_ctx = ke_ctx_n_ctx(s->c);
    for (int i = 0; i < j->n_prompts; i++) {
        if (j->n_prompt[i] >= n_ctx)
            return kiln_error(KILN_ELIMIT, "\"%s\": the prompt has %d tokens, the context size is %lld (room is needed for one token)",
                              chat ? "messages" : "prompt", (int)j->n_prompt[i], (long long)n_ctx);
        if (mt_key && j->gp.n_predict > 0 && j->n_prompt[i] + (int64_t)j->gp.n_predict > n_ctx)
            return kiln_error(KILN_ELIMIT, "\"%s\": the prompt's %d tokens + %d is more than the context of %lld tokens: "
                                           "lower %s or shorten the prompt",
                              mt_key, (int)j->n_prompt[i], (int)j->gp.n_predict, (long long)n_ctx, mt_key);
    }
    if ((int64_t)j->n_prompts * n > s->p.max_choices)
        return kiln_error(KILN_EINVAL, "\"n\": %d prompts x n = %lld choices, more than %d", j->n_prompts,
                          (long long)j->n_prompts * n, s->p.max_choices);
    j->n_choices = j->n_prompts * (int)n;
    /* a non-streamed response is built in memory: bound its log-probability
     * entries (choices x tokens x (1 + alternatives)), so that a small
     * request cannot ask for gigabytes of JSON */
    /* echo with logprobs: the prompt's tokens get theirs too (OpenAI's
     * completions; the first token's is null), computed without the prefix
     * cache since every position's logits are needed */
    j->prompt_lp = !chat && j->echo && j->want_logprobs;
    if (!j->stream && j->want_logprobs) {
        int64_t toks = j->gp.n_predict > 0 && j->gp.n_predict < n_ctx ? j->gp.n_predict : n_ctx;
        for (int i = 0; j->prompt_lp && i < j->n_prompts; i++) toks += j->n_prompt[i];
        int64_t entries = (int64_t)j->n_choices * toks * (1 + (int64_t)j->n_top);
        if (entries > KSRV_MAX_LOGPROB_ENTRIES)
            return kiln_error(KILN_ELIMIT, "\"%s\": %d choices x %lld tokens x %d alternatives is %lld log-probabilities in one "
                                           "response (at most %d): lower n, max_tokens or the alternatives, or stream it",
                              ku_json_get(body, "n_probs") ? "n_probs" : chat ? "top_logprobs" : "logprobs", j->n_choices,
                              (long long)toks, 1 + j->n_top, (long long)entries, KSRV_MAX_LOGPROB_ENTRIES);
    }
    j->ch = calloc((size_t)j->n_choices, sizeof *j->ch);
    if (!j->ch) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; i < j->n_choices; i++)
        j->ch[i] = (ksrv_choice){.job = j, .index = i, .prompt = i / (int)n};
    return NULL;
}

kiln_status ksrv_job_parse(ksrv *s, const cJSON *body, bool chat, ksrv_job **out, ksrv_err *e) {
    *out = NULL;
    ksrv_job *j = calloc(1, sizeof *j);
    if (!j) {
        *e = (ksrv_err){500, "server_error", NULL};
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    j->srv = s;
    j->chat = chat;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    static atomic_ulong counter;
    unsigned long k = atomic_fetch_add(&counter, 1);
    snprintf(j->id, sizeof j->id, "%s-%lx%04lx", chat ? "chatcmpl" : "cmpl", (unsigned long)time(NULL), k & 0xFFFF);
    j->created = (long)time(NULL);
    kiln_status st = parse_body(s, j, body, chat, e);
    if (st) {
        if (kiln_status_code(st) == KILN_ENOMEM) *e = (ksrv_err){500, "server_error", NULL};
        ksrv_job_free(j);
        return st;
    }
    *out = j;
    return NULL;
}

/* ---------------------------------------------------------------- events */

static void push_ev(ksrv_job *j, const ksrv_ev *ev) {
    if (j->n_ev == j->cap_ev) {
        int nc = j->cap_ev ? j->cap_ev * 2 : 64;
        ksrv_ev *p = realloc(j->ev, sizeof *p * (size_t)nc);
        if (!p) {
            j->failed = true;
            free(ev->text), free(ev->top), free(ev->error);
            return;
        }
        j->ev = p;
        j->cap_ev = nc;
    }
    j->ev[j->n_ev++] = *ev;
}

/* The scheduler's thread: copy the event into the job. */
static void on_event(const ksch_event *e) {
    ksrv_choice *c = e->ud;
    ksrv_job *j = c->job;
    ksrv *s = j->srv;
    double now = ksrv_now();
    ksrv_ev ev = {.choice = c->index, .end = e->kind == KSCH_END, .token = e->token, .finish = e->finish};
    if (e->kind == KSCH_PROMPT_LOGPROB) {
        ev.prompt = ev.has_lp = true;
        ev.logprob = e->sample->logprob;
        if (e->sample->n_top > 0 && (ev.top = malloc(sizeof(kgen_logprob) * (size_t)e->sample->n_top))) {
            memcpy(ev.top, e->sample->top, sizeof(kgen_logprob) * (size_t)e->sample->n_top);
            ev.n_top = e->sample->n_top;
        }
        pthread_mutex_lock(&j->mu);
        push_ev(j, &ev);
        pthread_mutex_unlock(&j->mu);
        return;
    }
    if (e->kind == KSCH_TOKEN) {
        if (!c->got_first) ksrv_metrics_first_token(s->met, now - c->t_arrive);
        else ksrv_metrics_token(s->met, now - c->t_last);
        c->got_first = true;
        c->t_last = now;
        if (e->text_len) {
            ev.text = malloc(e->text_len);
            if (ev.text) memcpy(ev.text, e->text, e->text_len), ev.len = e->text_len;
        }
        if (j->want_logprobs && e->sample) {
            ev.has_lp = true;
            ev.logprob = e->sample->logprob;
            if (e->sample->n_top > 0) {
                ev.top = malloc(sizeof(kgen_logprob) * (size_t)e->sample->n_top);
                if (ev.top) {
                    memcpy(ev.top, e->sample->top, sizeof(kgen_logprob) * (size_t)e->sample->n_top);
                    ev.n_top = e->sample->n_top;
                }
            }
        }
    } else {
        ev.cancelled = e->cancelled;
        ev.n_generated = e->n_generated;
        ev.n_cached = e->n_cached;
        if (e->error) ev.error = strdup(kiln_status_msg(e->error));
        const char *reason = e->cancelled || e->error ? NULL : kgen_finish_reason(e->finish);
        ksrv_metrics_end(s->met, reason, e->cancelled, now - c->t_arrive, e->n_prompt, e->n_generated);
    }
    pthread_mutex_lock(&j->mu);
    push_ev(j, &ev);
    if (ev.end) {
        c->ended = true;
        c->n_generated = e->n_generated;
        c->n_cached = e->n_cached;
        c->prompt_s = e->prompt_s, c->gen_s = e->gen_s;
        c->n_draft = e->n_draft, c->n_accepted = e->n_accepted;
        c->finish = e->finish;
        j->n_ended++;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

kiln_status ksrv_job_submit(ksrv_job *j, ksrv_err *e) {
    ksrv *s = j->srv;
    int n = j->n_choices / j->n_prompts;
    double now = ksrv_now();
    kgen_params gp;
    KILN_TRY(kgen_params_copy(&gp, &j->gp));
    kiln_status st = NULL;
    for (int i = 0; i < j->n_choices && !st; i++) {
        ksrv_choice *c = &j->ch[i];
        /* choice k of a seeded request draws from seed + k */
        if (j->gp.seed != KGEN_SEED_RANDOM) {
            gp.seed = j->gp.seed + (uint32_t)(i % n);
            if (gp.seed == KGEN_SEED_RANDOM) gp.seed = 0;
        }
        /* (image prompts are never cached: nothing to wait for) */
        uint64_t after = i % n && !s->p.no_prefix_cache && !j->images && !j->prompt_lp ? j->ch[i - i % n].id : 0;
        c->t_arrive = now;
        ksch_request r = {j->prompts[c->prompt], j->n_prompt[c->prompt], &gp, after, on_event, c,
                          j->images ? &j->images->x : NULL, ksrv_tools_keep_special(j->tools), j->prompt_lp};
        pthread_mutex_lock(&j->mu);
        j->n_submitted++; /* before: the END may come before ksch_submit returns */
        pthread_mutex_unlock(&j->mu);
        st = ksch_submit(s->sch, &r, &c->id);
        if (st) {
            pthread_mutex_lock(&j->mu);
            j->n_submitted--;
            pthread_mutex_unlock(&j->mu);
        } else {
            c->submitted = true;
        }
    }
    kgen_params_free(&gp);
    if (st) {
        *e = kiln_status_code(st) == KILN_ELIMIT   ? (ksrv_err){503, "unavailable_error", "queue_full"}
             : kiln_status_code(st) == KILN_EINVAL ? (ksrv_err){400, "invalid_request_error", NULL}
                                                   : (ksrv_err){500, "server_error", NULL};
        ksrv_job_cancel_wait(j);
    }
    return st;
}

void ksrv_job_cancel_wait(ksrv_job *j) {
    pthread_mutex_lock(&j->mu);
    for (int i = 0; i < j->n_choices; i++)
        if (j->ch[i].submitted && !j->ch[i].ended) ksch_cancel(j->srv->sch, j->ch[i].id);
    /* ksrv_lost: the steps that would end them never finish */
    while (j->n_ended < j->n_submitted && !atomic_load(&j->srv->lost)) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
}

void ksrv_job_wait(ksrv_job *j, double timeout) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_nsec * 1e-9 + timeout;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec = (long)((t - floor(t)) * 1e9);
    pthread_mutex_lock(&j->mu);
    if (j->ev_off == j->n_ev && j->n_ended < j->n_submitted) pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    pthread_mutex_unlock(&j->mu);
}

bool ksrv_job_finished(ksrv_job *j) {
    pthread_mutex_lock(&j->mu);
    bool f = j->n_ended == j->n_submitted;
    pthread_mutex_unlock(&j->mu);
    return f;
}

void ksrv_job_free(ksrv_job *j) {
    if (!j) return;
    for (int i = 0; i < j->n_ev; i++) free(j->ev[i].text), free(j->ev[i].top), free(j->ev[i].error);
    free(j->ev);
    for (int i = 0; i < j->n_prompts; i++) free(j->prompts[i]), free(j->prompt_str[i]);
    free(j->prompts);
    free(j->prompt_str);
    free(j->rendered);
    free(j->n_prompt);
    ksrv_images_free(j->images);
    ksrv_tools_free(j->tools);
    ksrv_agent_free(j->agent);
    free(j->ch);
    kgen_params_free(&j->gp);
    ksrv_buf_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* ---------------------------------------------------------------- output */

/* Text of one token for logprobs (special tokens as their text). */
static void token_text(ksrv *s, int32_t id, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!s->tok) return;
    kiln_status st = ktok_decode(s->tok, &id, 1, false, out, len);
    if (st) {
        kiln_status_free(st);
        *out = NULL;
        *len = 0;
    }
}

static void json_bytes(ksrv_buf *b, const char *t, size_t n) {
    ksrv_buf_str(b, "[");
    for (size_t i = 0; i < n; i++) ksrv_buf_printf(b, "%s%u", i ? ", " : "", (unsigned)(unsigned char)t[i]);
    ksrv_buf_str(b, "]");
}

static void json_float(ksrv_buf *b, float v) {
    if (isfinite(v)) ksrv_buf_printf(b, "%.9g", (double)v);
    else ksrv_buf_str(b, "-9999.0"); /* JSON has no -inf: OpenAI's floor for "impossible" */
}

/* chat: one entry of logprobs.content */
static void chat_lp_entry(ksrv *s, ksrv_buf *b, const ksrv_ev *ev) {
    char *t;
    size_t n;
    token_text(s, ev->token, &t, &n);
    ksrv_buf_str(b, "{\"token\": ");
    ksrv_buf_json_str(b, t ? t : "", n);
    ksrv_buf_str(b, ", \"logprob\": ");
    json_float(b, ev->logprob);
    ksrv_buf_str(b, ", \"bytes\": ");
    json_bytes(b, t, n);
    free(t);
    ksrv_buf_str(b, ", \"top_logprobs\": [");
    for (int k = 0; k < ev->n_top; k++) {
        token_text(s, ev->top[k].id, &t, &n);
        ksrv_buf_str(b, k ? ", {\"token\": " : "{\"token\": ");
        ksrv_buf_json_str(b, t ? t : "", n);
        ksrv_buf_str(b, ", \"logprob\": ");
        json_float(b, ev->top[k].logprob);
        ksrv_buf_str(b, ", \"bytes\": ");
        json_bytes(b, t, n);
        ksrv_buf_str(b, "}");
        free(t);
    }
    ksrv_buf_str(b, "]}");
}

/* completions: parallel arrays over a run of token events */
typedef struct {
    ksrv_buf tokens, lps, tops, offs;
    int n;
    size_t offset; /* text_offset of the next token */
} comp_lp;

static void comp_lp_add(ksrv *s, comp_lp *c, const ksrv_ev *ev) {
    char *t;
    size_t n;
    token_text(s, ev->token, &t, &n);
    const char *sep = c->n ? ", " : "";
    ksrv_buf_str(&c->tokens, sep);
    ksrv_buf_json_str(&c->tokens, t ? t : "", n);
    ksrv_buf_str(&c->lps, sep);
    json_float(&c->lps, ev->logprob);
    ksrv_buf_printf(&c->offs, "%s%zu", sep, c->offset);
    c->offset += n;
    free(t);
    ksrv_buf_str(&c->tops, sep);
    ksrv_buf_str(&c->tops, "{");
    for (int k = 0; k < ev->n_top; k++) {
        token_text(s, ev->top[k].id, &t, &n);
        if (k) ksrv_buf_str(&c->tops, ", ");
        ksrv_buf_json_str(&c->tops, t ? t : "", n);
        ksrv_buf_str(&c->tops, ": ");
        json_float(&c->tops, ev->top[k].logprob);
        free(t);
    }
    ksrv_buf_str(&c->tops, "}");
    c->n++;
}

/* The prompt's first token: no log-probability (nothing before it). */
static void comp_lp_first(ksrv *s, comp_lp *c, int32_t token) {
    char *t;
    size_t n;
    token_text(s, token, &t, &n);
    const char *sep = c->n ? ", " : "";
    ksrv_buf_str(&c->tokens, sep);
    ksrv_buf_json_str(&c->tokens, t ? t : "", n);
    ksrv_buf_printf(&c->lps, "%snull", sep);
    ksrv_buf_printf(&c->tops, "%snull", sep);
    ksrv_buf_printf(&c->offs, "%s%zu", sep, c->offset);
    c->offset += n;
    free(t);
    c->n++;
}

static void comp_lp_write(ksrv_buf *b, comp_lp *c) {
    ksrv_buf_str(b, "{\"tokens\": [");
    if (c->tokens.p) ksrv_buf_str(b, c->tokens.p);
    ksrv_buf_str(b, "], \"token_logprobs\": [");
    if (c->lps.p) ksrv_buf_str(b, c->lps.p);
    ksrv_buf_str(b, "], \"top_logprobs\": [");
    if (c->tops.p) ksrv_buf_str(b, c->tops.p);
    ksrv_buf_str(b, "], \"text_offset\": [");
    if (c->offs.p) ksrv_buf_str(b, c->offs.p);
    ksrv_buf_str(b, "]}");
}

static void comp_lp_free(comp_lp *c) {
    ksrv_buf_free(&c->tokens), ksrv_buf_free(&c->lps), ksrv_buf_free(&c->tops), ksrv_buf_free(&c->offs);
}

static const char *finish_str(kgen_finish f) {
    const char *r = kgen_finish_reason(f);
    return r ? r : "length";
}

/* The prompt's text for echo: as given, or its token ids decoded. */
static char *prompt_text(ksrv_job *j, int p, size_t *len) {
    char *t = NULL;
    *len = 0;
    if (j->prompt_str[p]) {
        *len = strlen(j->prompt_str[p]);
        return strdup(j->prompt_str[p]);
    }
    if (!j->srv->tok) return NULL;
    kiln_status st = ktok_decode(j->srv->tok, j->prompts[p], (size_t)j->n_prompt[p], false, &t, len);
    if (st) {
        kiln_status_free(st);
        return NULL;
    }
    return t;
}

static void usage_json(ksrv_job *j, ksrv_buf *b) {
    int64_t prompt = 0, gen = 0, cached = 0;
    for (int i = 0; i < j->n_prompts; i++) prompt += j->n_prompt[i];
    int n = j->n_choices / j->n_prompts;
    for (int i = 0; i < j->n_choices; i++) {
        gen += j->ch[i].n_generated;
        if (i % n == 0) cached += j->ch[i].n_cached;
    }
    ksrv_buf_printf(b,
                    "{\"prompt_tokens\": %lld, \"completion_tokens\": %lld, \"total_tokens\": %lld, "
                    "\"prompt_tokens_details\": {\"cached_tokens\": %lld}}",
                    (long long)prompt, (long long)gen, (long long)(prompt + gen), (long long)cached);
}

/* llama-server's "timings" of the first choice: prompt tokens computed
 * (those not found in the cache) and generated tokens, their milliseconds
 * and rates; draft_n and draft_n_accepted when speculation ran. */
void ksrv_timings_json(const ksrv_job *j, ksrv_buf *b) {
    const ksrv_choice *c = &j->ch[0];
    int64_t pn = j->n_prompt[0] - c->n_cached, gn = c->n_generated;
    double pms = 1e3 * c->prompt_s, gms = 1e3 * c->gen_s;
    ksrv_buf_printf(b,
                    "{\"cache_n\": %d, \"prompt_n\": %lld, \"prompt_ms\": %.3f, \"prompt_per_token_ms\": %.3f, "
                    "\"prompt_per_second\": %.3f, \"predicted_n\": %lld, \"predicted_ms\": %.3f, "
                    "\"predicted_per_token_ms\": %.3f, \"predicted_per_second\": %.3f",
                    (int)c->n_cached, (long long)pn, pms, pn > 0 ? pms / (double)pn : 0.0,
                    pms > 0 ? 1e3 * (double)pn / pms : 0.0, (long long)gn, gms, gn > 0 ? gms / (double)gn : 0.0,
                    gms > 0 ? 1e3 * (double)gn / gms : 0.0);
    if (c->n_draft > 0) ksrv_buf_printf(b, ", \"draft_n\": %d, \"draft_n_accepted\": %d", (int)c->n_draft, (int)c->n_accepted);
    ksrv_buf_str(b, "}");
}

void ksrv_chunk_head(ksrv_job *j, ksrv_buf *b) {
    ksrv_buf_printf(b, "data: {\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", j->id,
                    j->chat ? "chat.completion.chunk" : "text_completion", j->created);
    ksrv_buf_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
    ksrv_buf_str(b, ", \"choices\": [");
}

/* One SSE chunk for choice i: text, token and logprobs of ev (may be NULL),
 * finish reason when fin. */
static void stream_chunk(ksrv_job *j, int i, const char *text, size_t len, const ksrv_ev *ev, const char *fin) {
    ksrv_buf *b = &j->out;
    ksrv_chunk_head(j, b);
    ksrv_buf_printf(b, "{\"index\": %d, ", i);
    if (j->chat) {
        ksrv_buf_str(b, "\"delta\": {");
        if (!j->ch[i].sent_first) ksrv_buf_str(b, "\"role\": \"assistant\", ");
        if (text || !j->ch[i].sent_first) {
            ksrv_buf_str(b, "\"content\": ");
            ksrv_buf_json_str(b, text ? text : "", len);
        }
        ksrv_buf_str(b, "}, \"logprobs\": ");
        if (ev && ev->has_lp) {
            ksrv_buf_str(b, "{\"content\": [");
            chat_lp_entry(j->srv, b, ev);
            ksrv_buf_str(b, "]}");
        } else {
            ksrv_buf_str(b, "null");
        }
    } else {
        ksrv_buf_str(b, "\"text\": ");
        ksrv_buf_json_str(b, text ? text : "", len);
        ksrv_buf_str(b, ", \"logprobs\": ");
        if (ev && ev->has_lp) {
            comp_lp c = {.offset = j->ch[i].text_off};
            comp_lp_add(j->srv, &c, ev);
            j->ch[i].text_off = c.offset;
            comp_lp_write(b, &c);
            comp_lp_free(&c);
        } else {
            ksrv_buf_str(b, "null");
        }
    }
    j->ch[i].sent_first = true;
    if (j->return_tokens) {
        if (ev && !ev->end) ksrv_buf_printf(b, ", \"tokens\": [%d]", (int)ev->token);
        else ksrv_buf_str(b, ", \"tokens\": []");
    }
    if (fin) ksrv_buf_printf(b, ", \"finish_reason\": \"%s\"}]", fin);
    else ksrv_buf_str(b, ", \"finish_reason\": null}]");
    if (j->include_usage) ksrv_buf_str(b, ", \"usage\": null");
    ksrv_buf_str(b, "}\n\n");
}

bool ksrv_job_take(ksrv_job *j, int *from, int *to) {
    pthread_mutex_lock(&j->mu);
    *from = j->ev_off, *to = j->n_ev;
    bool all = j->n_ended == j->n_submitted;
    j->ev_off = *to;
    pthread_mutex_unlock(&j->mu);
    return all;
}

ksrv_ev ksrv_job_ev(ksrv_job *j, int k) {
    /* events below n_ev are not moved by the producer (it only appends,
     * possibly reallocating: take the array under the lock per item) */
    pthread_mutex_lock(&j->mu);
    ksrv_ev ev = j->ev[k];
    pthread_mutex_unlock(&j->mu);
    return ev;
}

/* Streamed echo with logprobs: choice i's first chunk, sent once its prompt
 * tokens' log-probabilities are all in (at its first generated token or its
 * end), as vLLM streams it: the prompt's text with every prompt token's entry
 * (the first's null), text_offset from 0, so that the chunks' concatenation
 * is the non-streamed response. Events below upto are the choice's. */
static void stream_echo_lp(ksrv_job *j, int i, int upto) {
    size_t len;
    char *t = prompt_text(j, j->ch[i].prompt, &len);
    comp_lp c = {0};
    if (j->n_prompt[j->ch[i].prompt] > 0) comp_lp_first(j->srv, &c, j->prompts[j->ch[i].prompt][0]);
    for (int k = 0; k < upto; k++) {
        ksrv_ev ev = ksrv_job_ev(j, k);
        if (ev.prompt && ev.choice == i) comp_lp_add(j->srv, &c, &ev);
    }
    ksrv_buf *b = &j->out;
    ksrv_chunk_head(j, b);
    ksrv_buf_printf(b, "{\"index\": %d, \"text\": ", i);
    ksrv_buf_json_str(b, t ? t : "", len);
    ksrv_buf_str(b, ", \"logprobs\": ");
    comp_lp_write(b, &c);
    if (j->return_tokens) ksrv_buf_str(b, ", \"tokens\": []");
    ksrv_buf_str(b, ", \"finish_reason\": null}]");
    if (j->include_usage) ksrv_buf_str(b, ", \"usage\": null");
    ksrv_buf_str(b, "}\n\n");
    j->ch[i].text_off = c.offset;
    j->ch[i].sent_first = true;
    comp_lp_free(&c);
    free(t);
}

void ksrv_job_stream(ksrv_job *j) {
    if (j->done_sent) return;
    if (j->agent) {
        ksrv_agent_stream(j);
        return;
    }
    if (j->llama) {
        ksrv_llama_stream(j);
        return;
    }
    /* the first call: chat's role, or completions' echoed prompt */
    if (!j->started)
        for (int i = 0; i < j->n_choices; i++) {
            if (j->echo && !j->prompt_lp) { /* with logprobs: stream_echo_lp, once they are in */
                size_t len;
                char *t = prompt_text(j, j->ch[i].prompt, &len);
                stream_chunk(j, i, t ? t : "", len, NULL, NULL);
                j->ch[i].text_off = len;
                free(t);
            } else if (j->chat) {
                stream_chunk(j, i, "", 0, NULL, NULL);
            }
        }
    j->started = true;
    int from, to;
    bool all = ksrv_job_take(j, &from, &to);
    for (int k = from; k < to; k++) {
        ksrv_ev ev = ksrv_job_ev(j, k);
        if (ev.prompt) continue; /* sent by stream_echo_lp */
        if (j->prompt_lp && !j->ch[ev.choice].sent_first && !(ev.end && ev.error)) stream_echo_lp(j, ev.choice, k);
        if (!ev.end) {
            const char *fin = ev.finish != KGEN_CONTINUE ? finish_str(ev.finish) : NULL;
            if (j->tools) {
                ksrv_tools_stream_event(j, &ev, fin);
                continue;
            }
            if (ev.len || ev.has_lp || fin || j->return_tokens) stream_chunk(j, ev.choice, ev.text, ev.len, &ev, fin);
            continue;
        }
        if (ev.error) {
            ksrv_buf_str(&j->out, "data: ");
            ksrv_error_json(&j->out, 500, "server_error", NULL, ev.error);
            ksrv_buf_str(&j->out, "\n\n");
        } else if (!ev.cancelled && ev.n_generated == 0) { /* ended before any token */
            stream_chunk(j, ev.choice, NULL, 0, &ev, finish_str(ev.finish));
        }
    }
    if (all && to == j->n_ev) {
        if (j->include_usage) {
            ksrv_chunk_head(j, &j->out);
            ksrv_buf_str(&j->out, "], \"usage\": ");
            usage_json(j, &j->out);
            ksrv_buf_str(&j->out, ", \"timings\": ");
            ksrv_timings_json(j, &j->out);
            ksrv_buf_str(&j->out, "}\n\n");
        }
        ksrv_buf_str(&j->out, "data: [DONE]\n\n");
        j->done_sent = true;
    }
}

int ksrv_job_response(ksrv_job *j, ksrv_buf *b) {
    if (j->agent) return ksrv_agent_response(j, b);
    if (j->llama) return ksrv_llama_response(j, b);
    for (int k = 0; k < j->n_ev; k++)
        if (j->ev[k].end && j->ev[k].error) {
            ksrv_error_json(b, 500, "server_error", NULL, j->ev[k].error);
            return 500;
        }
    if (j->failed) {
        ksrv_error_json(b, 500, "server_error", NULL, "out of memory");
        return 500;
    }
    ksrv_buf_printf(b, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", j->id,
                    j->chat ? "chat.completion" : "text_completion", j->created);
    ksrv_buf_json_str(b, j->srv->model_id, strlen(j->srv->model_id));
    ksrv_buf_str(b, ", \"choices\": [");
    for (int i = 0; i < j->n_choices; i++) {
        ksrv_buf text = {0}, toks = {0}, chat_lp = {0};
        comp_lp lp = {0};
        if (j->echo) {
            size_t len;
            char *t = prompt_text(j, j->ch[i].prompt, &len);
            if (t) ksrv_buf_add(&text, t, len);
            lp.offset = len;
            free(t);
        }
        if (j->prompt_lp && j->n_prompt[j->ch[i].prompt] > 0) { /* offsets from the prompt's first token */
            lp.offset = 0;
            comp_lp_first(j->srv, &lp, j->prompts[j->ch[i].prompt][0]);
        }
        int nt = 0;
        for (int k = 0; k < j->n_ev; k++) {
            const ksrv_ev *ev = &j->ev[k];
            if (ev->choice != i || ev->end) continue;
            if (ev->prompt) {
                comp_lp_add(j->srv, &lp, ev);
                continue;
            }
            ksrv_buf_add(&text, ev->text ? ev->text : "", ev->len);
            ksrv_buf_printf(&toks, "%s%d", nt++ ? ", " : "", (int)ev->token);
            if (ev->has_lp) {
                if (j->chat) {
                    if (chat_lp.len) ksrv_buf_str(&chat_lp, ", ");
                    chat_lp_entry(j->srv, &chat_lp, ev);
                } else {
                    comp_lp_add(j->srv, &lp, ev);
                }
            }
        }
        ksrv_buf_printf(b, "%s{\"index\": %d, ", i ? ", " : "", i);
        const char *fin = finish_str(j->ch[i].finish);
        if (j->chat) {
            if (j->tools) {
                ksrv_tools_message(j, i, text.p, text.len, b, &fin);
            } else {
                ksrv_buf_str(b, "\"message\": {\"role\": \"assistant\", \"content\": ");
                ksrv_buf_json_str(b, text.p ? text.p : "", text.len);
                ksrv_buf_str(b, "}");
            }
            ksrv_buf_str(b, ", \"logprobs\": ");
            if (j->want_logprobs) {
                ksrv_buf_str(b, "{\"content\": [");
                if (chat_lp.p) ksrv_buf_str(b, chat_lp.p);
                ksrv_buf_str(b, "]}");
            } else {
                ksrv_buf_str(b, "null");
            }
        } else {
            ksrv_buf_str(b, "\"text\": ");
            ksrv_buf_json_str(b, text.p ? text.p : "", text.len);
            ksrv_buf_str(b, ", \"logprobs\": ");
            if (j->want_logprobs) comp_lp_write(b, &lp);
            else ksrv_buf_str(b, "null");
        }
        if (j->return_tokens) ksrv_buf_printf(b, ", \"tokens\": [%s]", toks.p ? toks.p : "");
        ksrv_buf_printf(b, ", \"finish_reason\": \"%s\"}", fin);
        ksrv_buf_free(&text), ksrv_buf_free(&toks), ksrv_buf_free(&chat_lp);
        comp_lp_free(&lp);
    }
    ksrv_buf_str(b, "], \"usage\": ");
    usage_json(j, b);
    ksrv_buf_str(b, ", \"timings\": ");
    ksrv_timings_json(j, b);
    ksrv_buf_str(b, "}");
    return b->oom ? 500 : 200;
}
