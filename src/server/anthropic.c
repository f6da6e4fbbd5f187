/* anthropic.c: the Anthropic Messages API (POST /v1/messages and
 * /v1/messages/count_tokens): the request as a chat body (system, content
 * blocks text / image / tool_use / tool_result / thinking, tools with
 * input_schema, tool_choice, thinking), the output as content blocks with
 * stop_reason and usage, Anthropic's stream events, and its error shape. */
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/agent.h"

/* ---------------------------------------------------------------- the request */

static const char *type_of(const cJSON *b) {
    const cJSON *t = ku_json_get(b, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

/* Text of a string or of a list of text blocks (system, tool_result content). */
static kiln_status text_of(const cJSON *c, const char *what, ksrv_buf *t) {
    if (cJSON_IsString(c)) {
        ksrv_buf_str(t, c->valuestring);
        return NULL;
    }
    if (!c) return NULL;
    if (!cJSON_IsArray(c)) return kiln_error(KILN_EINVAL, "\"%s\": expected a string or a list of text blocks", what);
    const cJSON *b;
    int k = 0;
    cJSON_ArrayForEach(b, c) {
        const cJSON *x = ku_json_get(b, "text");
        if (strcmp(type_of(b), "text") || !cJSON_IsString(x))
            return kiln_error(KILN_EINVAL, "\"%s\"[%d]: expected a {\"type\": \"text\", \"text\": ...} block", what, k);
        if (t->len) ksrv_buf_str(t, "\n");
        ksrv_buf_str(t, x->valuestring);
        k++;
    }
    return NULL;
}

static cJSON *add_msg(cJSON *msgs, const char *role) {
    cJSON *m = cJSON_CreateObject();
    if (m) {
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", role);
    }
    return m;
}

/* An image block (base64 source) as a data-URL image_url part of parts. */
static kiln_status image_part(const cJSON *b, const char *what, cJSON *parts) {
    const cJSON *src = ku_json_get(b, "source"), *mt = ku_json_get(src, "media_type"), *data = ku_json_get(src, "data");
    if (strcmp(type_of(src), "base64") || !cJSON_IsString(mt) || !cJSON_IsString(data))
        return kiln_error(KILN_EUNSUPPORTED, "\"%s\".source: only {\"type\": \"base64\", \"media_type\", \"data\"} images are supported", what);
    ksrv_buf url = {0};
    ksrv_buf_printf(&url, "data:%s;base64,%s", mt->valuestring, data->valuestring);
    cJSON *p = cJSON_CreateObject();
    cJSON_AddItemToArray(parts, p);
    cJSON_AddStringToObject(p, "type", "image_url");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(p, "image_url"), "url", url.p ? url.p : "");
    bool oom = url.oom || !p;
    ksrv_buf_free(&url);
    return oom ? kiln_error(KILN_ENOMEM, "out of memory") : NULL;
}

/* A tool_result block as a tool message: its content a string, text
 * blocks joined, or (with image blocks among them, as a screenshot tool
 * answers) text and image_url parts, so the images reach the model (a
 * text-only model then answers a 400 that says so, not a silent drop). */
static kiln_status tool_result(const cJSON *b, const char *id, const char *what, cJSON *msgs) {
    const cJSON *c = ku_json_get(b, "content"), *e;
    bool images = false;
    if (cJSON_IsArray(c)) cJSON_ArrayForEach(e, c) images |= !strcmp(type_of(e), "image");
    cJSON *o = add_msg(msgs, "tool");
    if (!o) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_AddStringToObject(o, "tool_call_id", id);
    if (!images) {
        ksrv_buf out = {0};
        kiln_status st = text_of(c, what, &out);
        cJSON_AddStringToObject(o, "content", out.p ? out.p : "");
        ksrv_buf_free(&out);
        return st;
    }
    cJSON *parts = cJSON_AddArrayToObject(o, "content");
    int k = 0;
    cJSON_ArrayForEach(e, c) {
        char w[96];
        snprintf(w, sizeof w, "%s.content[%d]", what, k++);
        const cJSON *x = ku_json_get(e, "text");
        if (!strcmp(type_of(e), "image")) {
            KILN_TRY(image_part(e, w, parts));
        } else if (!strcmp(type_of(e), "text") && cJSON_IsString(x)) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddItemToArray(parts, p);
            cJSON_AddStringToObject(p, "type", "text");
            cJSON_AddStringToObject(p, "text", x->valuestring);
        } else {
            return kiln_error(KILN_EINVAL, "\"%s\": expected a text or an image block", w);
        }
    }
    return NULL;
}

/* One Anthropic message as chat messages: tool_result blocks become tool
 * messages (before the rest of the turn), tool_use blocks the assistant's
 * tool_calls, thinking its reasoning_content, images data-URL parts. */
static kiln_status message(const cJSON *m, int i, cJSON *msgs) {
    const cJSON *role = ku_json_get(m, "role"), *c = ku_json_get(m, "content");
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return kiln_error(KILN_EINVAL, "\"messages\"[%d].role: expected \"user\" or \"assistant\"", i);
    bool user = !strcmp(role->valuestring, "user");
    if (cJSON_IsString(c)) {
        cJSON *o = add_msg(msgs, role->valuestring);
        if (!o) return kiln_error(KILN_ENOMEM, "out of memory");
        cJSON_AddStringToObject(o, "content", c->valuestring);
        return NULL;
    }
    if (!cJSON_IsArray(c)) return kiln_error(KILN_EINVAL, "\"messages\"[%d].content: expected a string or a list of blocks", i);
    cJSON *parts = cJSON_CreateArray(), *calls = cJSON_CreateArray();
    ksrv_buf thinking = {0};
    kiln_status st = NULL;
    int k = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, c) {
        const char *t = type_of(b);
        char what[64];
        snprintf(what, sizeof what, "messages[%d].content[%d]", i, k++);
        if (!strcmp(t, "text")) {
            const cJSON *x = ku_json_get(b, "text");
            if (!cJSON_IsString(x)) {
                st = kiln_error(KILN_EINVAL, "\"%s\".text: required", what);
                break;
            }
            cJSON *p = cJSON_CreateObject();
            cJSON_AddItemToArray(parts, p);
            cJSON_AddStringToObject(p, "type", "text");
            cJSON_AddStringToObject(p, "text", x->valuestring);
        } else if (!strcmp(t, "image")) {
            if ((st = image_part(b, what, parts))) break;
        } else if (!strcmp(t, "tool_use") && !user) {
            const cJSON *id = ku_json_get(b, "id"), *name = ku_json_get(b, "name"), *in = ku_json_get(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name)) {
                st = kiln_error(KILN_EINVAL, "\"%s\": a tool_use block needs \"id\" and \"name\"", what);
                break;
            }
            ksrv_agent_chat_call(calls, id->valuestring, name->valuestring, in ? cJSON_Duplicate(in, true) : cJSON_CreateObject());
        } else if (!strcmp(t, "tool_result") && user) {
            const cJSON *id = ku_json_get(b, "tool_use_id");
            if (!cJSON_IsString(id)) {
                st = kiln_error(KILN_EINVAL, "\"%s\".tool_use_id: required", what);
                break;
            }
            if ((st = tool_result(b, id->valuestring, what, msgs))) break;
        } else if (!strcmp(t, "thinking") && !user) {
            const cJSON *x = ku_json_get(b, "thinking");
            if (cJSON_IsString(x)) ksrv_buf_str(&thinking, x->valuestring);
        } else if (!strcmp(t, "redacted_thinking") && !user) {
            continue;
        } else {
            st = kiln_error(KILN_EUNSUPPORTED, "\"%s\": \"%s\" blocks are not supported in %s messages", what, t, role->valuestring);
            break;
        }
    }
    if (!st && (cJSON_GetArraySize(parts) || cJSON_GetArraySize(calls) || thinking.len)) {
        cJSON *o = add_msg(msgs, role->valuestring);
        if (cJSON_GetArraySize(parts)) cJSON_AddItemToObject(o, "content", parts), parts = NULL;
        else cJSON_AddStringToObject(o, "content", "");
        if (cJSON_GetArraySize(calls)) cJSON_AddItemToObject(o, "tool_calls", calls), calls = NULL;
        if (thinking.len) cJSON_AddStringToObject(o, "reasoning_content", thinking.p);
    }
    cJSON_Delete(parts), cJSON_Delete(calls);
    ksrv_buf_free(&thinking);
    return st;
}

kiln_status ksrv_anthropic_fill(const cJSON *body, cJSON *chat) {
    const cJSON *mt = ku_json_get(body, "max_tokens");
    if (!mt) return kiln_error(KILN_EINVAL, "\"max_tokens\": required");
    KILN_TRY(ksrv_agent_copy(body, "max_tokens", chat, "max_tokens"));
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    ksrv_buf sys = {0};
    kiln_status st = text_of(ku_json_get(body, "system"), "system", &sys);
    if (!st && sys.len) cJSON_AddStringToObject(add_msg(msgs, "system"), "content", sys.p);
    ksrv_buf_free(&sys);
    KILN_TRY(st);
    const cJSON *ms = ku_json_get(body, "messages");
    if (!cJSON_IsArray(ms) || !cJSON_GetArraySize(ms)) return kiln_error(KILN_EINVAL, "\"messages\": expected a non-empty list of messages");
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) KILN_TRY(message(m, i++, msgs));
    const cJSON *tools = ku_json_get(body, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return kiln_error(KILN_EINVAL, "\"tools\": expected a list of tools");
        cJSON *ct = cJSON_AddArrayToObject(chat, "tools");
        i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *ty = ku_json_get(t, "type");
            if (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "custom")))
                return kiln_error(KILN_EUNSUPPORTED, "\"tools\"[%d]: only client tools (name, description, input_schema) are supported", i);
            KILN_TRY(ksrv_agent_chat_tool(ct, t, "input_schema"));
            i++;
        }
    }
    const cJSON *tc = ku_json_get(body, "tool_choice");
    if (tc) {
        const char *t = type_of(tc);
        const cJSON *n = ku_json_get(tc, "name");
        if (!strcmp(t, "auto") || !strcmp(t, "none")) cJSON_AddStringToObject(chat, "tool_choice", t);
        else if (!strcmp(t, "any")) cJSON_AddStringToObject(chat, "tool_choice", "required");
        else if (!strcmp(t, "tool") && cJSON_IsString(n)) {
            cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", n->valuestring);
        } else {
            return kiln_error(KILN_EINVAL, "\"tool_choice\": expected {\"type\": \"auto\" | \"any\" | \"none\" | \"tool\", \"name\": ...}");
        }
        const cJSON *dp = ku_json_get(tc, "disable_parallel_tool_use");
        if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(chat, "parallel_tool_calls");
    }
    /* thinking: the template's switch (Qwen3's enable_thinking) */
    const cJSON *th = ku_json_get(body, "thinking");
    cJSON *kw = cJSON_AddObjectToObject(chat, "chat_template_kwargs");
    if (th) cJSON_AddBoolToObject(kw, "enable_thinking", !strcmp(type_of(th), "enabled"));
    /* its budget_tokens: the reasoning budget */
    const cJSON *bt = ku_json_get(th, "budget_tokens");
    if (bt && !strcmp(type_of(th), "enabled")) {
        if (!cJSON_IsNumber(bt) || bt->valuedouble < 1 || bt->valuedouble != (double)(int64_t)bt->valuedouble)
            return kiln_error(KILN_EINVAL, "\"thinking.budget_tokens\": expected a positive integer");
        cJSON_AddNumberToObject(chat, "reasoning_budget", bt->valuedouble);
    }
    KILN_TRY(ksrv_agent_copy(body, "model", chat, "model"));
    KILN_TRY(ksrv_agent_copy(body, "stop_sequences", chat, "stop"));
    /* seed: an extension (Anthropic's API has none), as vLLM and llama.cpp
     * take their sampling fields on every route: a reproducible sample */
    static const char *const same[] = {"temperature", "top_p", "top_k", "seed", "stream"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) KILN_TRY(ksrv_agent_copy(body, same[k], chat, same[k]));
    return NULL;
}

void ksrv_anthropic_error(ksrv_buf *b, int status, const char *msg) {
    const char *t = status == 401 ? "authentication_error"
                    : status == 403 ? "permission_error"
                    : status == 404 ? "not_found_error"
                    : status == 413 ? "request_too_large"
                    : status == 429 ? "rate_limit_error"
                    : status == 503 ? "overloaded_error"
                    : status >= 500 ? "api_error"
                                    : "invalid_request_error";
    ksrv_buf_printf(b, "{\"type\": \"error\", \"error\": {\"type\": \"%s\", \"message\": ", t);
    ksrv_buf_json_str(b, msg, strlen(msg));
    ksrv_buf_str(b, "}}");
}

/* ---------------------------------------------------------------- output */

static bool any_call(const ksrv_agent *a) {
    for (int b = 0; b < a->n; b++)
        if (a->b[b].kind == KA_CALL) return true;
    return false;
}

static const char *stop_reason(const ksrv_job *j) {
    kgen_finish f = j->ch[0].finish;
    if (f == KGEN_FINISH_LENGTH || f == KGEN_FINISH_CONTEXT) return "max_tokens";
    if (any_call(j->agent)) return "tool_use";
    return f == KGEN_FINISH_STOP_STRING ? "stop_sequence" : "end_turn";
}

/* A call's input: its arguments as an object ({} while they do not parse). */
static void input_json(const ka_block *b, ksrv_buf *o) {
    cJSON *v = cJSON_ParseWithLength(b->text.p ? b->text.p : "", b->text.len);
    char *s = cJSON_IsObject(v) ? cJSON_PrintUnformatted(v) : NULL;
    ksrv_buf_str(o, s ? s : "{}");
    free(s);
    cJSON_Delete(v);
}

/* Block b as a content block; full: with its text (else the empty start). */
static void block_json(const ka_block *b, bool full, ksrv_buf *o) {
    const char *t = full && b->text.p ? b->text.p : "";
    size_t n = full ? b->text.len : 0;
    switch (b->kind) {
    case KA_REASONING:
        ksrv_buf_str(o, "{\"type\": \"thinking\", \"thinking\": ");
        ksrv_buf_json_str(o, t, n);
        ksrv_buf_str(o, ", \"signature\": \"\"}");
        break;
    case KA_TEXT:
        ksrv_buf_str(o, "{\"type\": \"text\", \"text\": ");
        ksrv_buf_json_str(o, t, n);
        ksrv_buf_str(o, "}");
        break;
    case KA_CALL:
        ksrv_buf_printf(o, "{\"type\": \"tool_use\", \"id\": \"%s\", \"name\": ", b->id);
        ksrv_buf_json_str(o, b->name, strlen(b->name));
        ksrv_buf_str(o, ", \"input\": ");
        if (full) input_json(b, o);
        else ksrv_buf_str(o, "{}");
        ksrv_buf_str(o, "}");
        break;
    }
}

static void message_head(ksrv_job *j, ksrv_buf *o) {
    ksrv_buf_printf(o, "{\"id\": \"%s\", \"type\": \"message\", \"role\": \"assistant\", \"model\": ", j->agent->id);
    ksrv_buf_json_str(o, j->srv->model_id, strlen(j->srv->model_id));
}

/* Anthropic's usage: input_tokens beside the prompt's cached prefix
 * (cache_read_input_tokens; their sum is the prompt), output so far */
static void usage(const ksrv_job *j, ksrv_buf *o, bool with_output) {
    int64_t in, out, cached = j->n_choices ? j->ch[0].n_cached : 0;
    ksrv_agent_usage(j, &in, &out);
    if (cached > in) cached = in;
    ksrv_buf_printf(o, "{\"input_tokens\": %lld, \"cache_creation_input_tokens\": 0, \"cache_read_input_tokens\": %lld, "
                       "\"output_tokens\": %lld}",
                    (long long)(in - cached), (long long)cached, (long long)(with_output ? out : 0));
}

static void a_body(ksrv_job *j, ksrv_buf *o) {
    ksrv_agent *a = j->agent;
    message_head(j, o);
    ksrv_buf_str(o, ", \"content\": [");
    for (int b = 0; b < a->n; b++) {
        if (b) ksrv_buf_str(o, ", ");
        block_json(&a->b[b], true, o);
    }
    ksrv_buf_printf(o, "], \"stop_reason\": \"%s\", \"stop_sequence\": null, \"usage\": ", stop_reason(j));
    usage(j, o, true);
    ksrv_buf_str(o, "}");
}

static ksrv_buf *event(ksrv_job *j, const char *type) {
    ksrv_buf_printf(&j->out, "event: %s\ndata: {\"type\": \"%s\"", type, type);
    return &j->out;
}

static void a_start(ksrv_job *j) {
    ksrv_buf *o = event(j, "message_start");
    ksrv_buf_str(o, ", \"message\": ");
    message_head(j, o);
    ksrv_buf_str(o, ", \"content\": [], \"stop_reason\": null, \"stop_sequence\": null, \"usage\": ");
    usage(j, o, false);
    ksrv_buf_str(o, "}}\n\n");
    ksrv_buf_str(event(j, "ping"), "}\n\n");
}

static void a_open(ksrv_job *j, int b) {
    ksrv_buf *o = event(j, "content_block_start");
    ksrv_buf_printf(o, ", \"index\": %d, \"content_block\": ", b);
    block_json(&j->agent->b[b], false, o);
    ksrv_buf_str(o, "}\n\n");
}

static void a_delta(ksrv_job *j, int b, const char *t, size_t n) {
    static const char *const kind[3][2] = {{"thinking_delta", "thinking"}, {"text_delta", "text"}, {"input_json_delta", "partial_json"}};
    const char *const *k = kind[j->agent->b[b].kind];
    ksrv_buf *o = event(j, "content_block_delta");
    ksrv_buf_printf(o, ", \"index\": %d, \"delta\": {\"type\": \"%s\", \"%s\": ", b, k[0], k[1]);
    ksrv_buf_json_str(o, t, n);
    ksrv_buf_str(o, "}}\n\n");
}

static void a_close(ksrv_job *j, int b) {
    ksrv_buf *o;
    if (j->agent->b[b].kind == KA_REASONING) { /* the SDK's thinking blocks carry a signature */
        o = event(j, "content_block_delta");
        ksrv_buf_printf(o, ", \"index\": %d, \"delta\": {\"type\": \"signature_delta\", \"signature\": \"\"}}\n\n", b);
    }
    o = event(j, "content_block_stop");
    ksrv_buf_printf(o, ", \"index\": %d}\n\n", b);
}

static void a_finish(ksrv_job *j) {
    int64_t in, out;
    ksrv_agent_usage(j, &in, &out);
    ksrv_buf *o = event(j, "message_delta");
    ksrv_buf_printf(o, ", \"delta\": {\"stop_reason\": \"%s\", \"stop_sequence\": null}, \"usage\": {\"output_tokens\": %lld}}\n\n",
                    stop_reason(j), (long long)out);
    ksrv_buf_str(event(j, "message_stop"), "}\n\n");
}

static void a_error(ksrv_job *j, ksrv_buf *b, int status, const char *msg) {
    if (b == &j->out) ksrv_buf_str(b, "event: error\ndata: ");
    ksrv_anthropic_error(b, status, msg);
    if (b == &j->out) ksrv_buf_str(b, "\n\n");
}

const ka_api ksrv_anthropic_api = {a_start, a_open, a_delta, a_close, a_finish, a_body, a_error};
