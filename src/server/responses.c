/* responses.c: the OpenAI Responses API (POST /v1/responses): the request
 * as a chat body, the output as Response items (reasoning, message,
 * function_call), and the typed stream events with sequence numbers.
 *
 * Limits: responses are not stored (previous_response_id is refused with
 * a 400; "store" is answered false); tools are function tools only;
 * text.format json_schema passes on as the chat body's response_format. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "server/agent.h"

/* ---------------------------------------------------------------- the request */

static cJSON *chat_message(cJSON *msgs, const char *role) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", role);
    return m;
}

/* Message content: a string, or input_text / output_text / input_image parts
 * as chat parts. */
static kiln_status content_of(const cJSON *c, const char *what, cJSON *m) {
    if (cJSON_IsString(c)) {
        cJSON_AddStringToObject(m, "content", c->valuestring);
        return NULL;
    }
    if (!cJSON_IsArray(c)) return kiln_error(KILN_EINVAL, "\"%s\".content: expected a string or a list of parts", what);
    cJSON *parts = cJSON_AddArrayToObject(m, "content");
    int k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const char *ty = cJSON_IsString(ku_json_get(p, "type")) ? ku_json_get(p, "type")->valuestring : "";
        const cJSON *text = ku_json_get(p, "text"), *url = ku_json_get(p, "image_url");
        cJSON *np = cJSON_CreateObject();
        cJSON_AddItemToArray(parts, np);
        if ((!strcmp(ty, "input_text") || !strcmp(ty, "output_text") || !strcmp(ty, "text")) && cJSON_IsString(text)) {
            cJSON_AddStringToObject(np, "type", "text");
            cJSON_AddStringToObject(np, "text", text->valuestring);
        } else if (!strcmp(ty, "input_image") && cJSON_IsString(url)) {
            cJSON_AddStringToObject(np, "type", "image_url");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(np, "image_url"), "url", url->valuestring);
        } else {
            return kiln_error(KILN_EINVAL, "\"%s\".content[%d]: only input_text, output_text and input_image (a data URL) parts are supported",
                              what, k);
        }
        k++;
    }
    return NULL;
}

static kiln_status input_items(const cJSON *input, cJSON *msgs) {
    if (cJSON_IsString(input)) {
        cJSON *m = chat_message(msgs, "user");
        if (m) cJSON_AddStringToObject(m, "content", input->valuestring);
        return NULL;
    }
    if (!cJSON_IsArray(input)) return kiln_error(KILN_EINVAL, "\"input\": expected a string or a list of items");
    int i = 0;
    const cJSON *it;
    cJSON *last_calls = NULL; /* the assistant message that function_call items join */
    cJSON_ArrayForEach(it, input) {
        char what[48];
        snprintf(what, sizeof what, "input[%d]", i++);
        const cJSON *ty = ku_json_get(it, "type"), *role = ku_json_get(it, "role");
        const char *t = cJSON_IsString(ty) ? ty->valuestring : "message";
        if (!strcmp(t, "message")) {
            if (!cJSON_IsString(role)) return kiln_error(KILN_EINVAL, "\"%s\".role: required", what);
            const char *r = !strcmp(role->valuestring, "developer") ? "system" : role->valuestring;
            if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system"))
                return kiln_error(KILN_EINVAL, "\"%s\".role: \"%s\": expected user, assistant, system or developer", what, r);
            cJSON *m = chat_message(msgs, r);
            if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
            KILN_TRY(content_of(ku_json_get(it, "content"), what, m));
            last_calls = !strcmp(r, "assistant") ? m : NULL;
        } else if (!strcmp(t, "function_call")) {
            const cJSON *name = ku_json_get(it, "name"), *args = ku_json_get(it, "arguments"), *id = ku_json_get(it, "call_id");
            if (!cJSON_IsString(name) || !cJSON_IsString(id))
                return kiln_error(KILN_EINVAL, "\"%s\": a function_call needs \"name\" and \"call_id\"", what);
            if (!last_calls && !(last_calls = chat_message(msgs, "assistant"))) return kiln_error(KILN_ENOMEM, "out of memory");
            if (!cJSON_GetObjectItemCaseSensitive(last_calls, "content")) cJSON_AddNullToObject(last_calls, "content");
            cJSON *tc = cJSON_GetObjectItemCaseSensitive(last_calls, "tool_calls");
            if (!tc) tc = cJSON_AddArrayToObject(last_calls, "tool_calls");
            ksrv_agent_chat_call(tc, id->valuestring, name->valuestring, cJSON_CreateString(cJSON_IsString(args) ? args->valuestring : "{}"));
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = ku_json_get(it, "call_id"), *o = ku_json_get(it, "output");
            if (!cJSON_IsString(id)) return kiln_error(KILN_EINVAL, "\"%s\": a function_call_output needs \"call_id\"", what);
            cJSON *m = chat_message(msgs, "tool");
            if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            if (cJSON_IsString(o)) cJSON_AddStringToObject(m, "content", o->valuestring);
            else KILN_TRY(content_of(o, what, m));
            last_calls = NULL;
        } else if (!strcmp(t, "reasoning")) {
            continue; /* past reasoning: templates drop it */
        } else {
            return kiln_error(KILN_EUNSUPPORTED, "\"%s\".type: \"%s\" items are not supported", what, t);
        }
    }
    return NULL;
}

kiln_status ksrv_responses_fill(const cJSON *body, cJSON *chat) {
    if (ku_json_get(body, "previous_response_id"))
        return kiln_error(KILN_EUNSUPPORTED, "\"previous_response_id\": this server does not store responses: send the whole conversation in \"input\"");
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *ins = ku_json_get(body, "instructions");
    if (ins && !cJSON_IsString(ins)) return kiln_error(KILN_EINVAL, "\"instructions\": expected a string");
    if (ins) cJSON_AddStringToObject(chat_message(msgs, "system"), "content", ins->valuestring);
    const cJSON *input = ku_json_get(body, "input");
    if (!input) return kiln_error(KILN_EINVAL, "\"input\": required");
    KILN_TRY(input_items(input, msgs));
    const cJSON *tools = ku_json_get(body, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return kiln_error(KILN_EINVAL, "\"tools\": expected a list of tools");
        cJSON *ct = cJSON_AddArrayToObject(chat, "tools");
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *ty = ku_json_get(t, "type");
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))
                return kiln_error(KILN_EUNSUPPORTED, "\"tools\"[%d]: only function tools are supported", i);
            KILN_TRY(ksrv_agent_chat_tool(ct, t, "parameters"));
            i++;
        }
    }
    const cJSON *tc = ku_json_get(body, "tool_choice");
    if (cJSON_IsObject(tc)) { /* {"type": "function", "name": ...} */
        const cJSON *n = ku_json_get(tc, "name");
        if (!cJSON_IsString(n)) return kiln_error(KILN_EINVAL, "\"tool_choice\": expected a string or {\"type\": \"function\", \"name\": ...}");
        cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", n->valuestring);
    } else {
        KILN_TRY(ksrv_agent_copy(body, "tool_choice", chat, "tool_choice"));
    }
    KILN_TRY(ksrv_agent_copy(body, "model", chat, "model"));
    KILN_TRY(ksrv_agent_copy(body, "max_output_tokens", chat, "max_tokens"));
    static const char *const same[] = {"temperature", "top_p", "top_k", "min_p", "seed", "stream", "parallel_tool_calls",
                                       "chat_template_kwargs", "stop", "presence_penalty", "frequency_penalty"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) KILN_TRY(ksrv_agent_copy(body, same[i], chat, same[i]));
    const cJSON *eff = ku_json_get(ku_json_get(body, "reasoning"), "effort");
    if (cJSON_IsString(eff)) cJSON_AddStringToObject(chat, "reasoning_effort", eff->valuestring);
    const cJSON *fmt = ku_json_get(ku_json_get(body, "text"), "format");
    const cJSON *fty = ku_json_get(fmt, "type");
    if (cJSON_IsString(fty) && strcmp(fty->valuestring, "text")) { /* json_schema / json_object: the chat response_format */
        cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
        cJSON_AddStringToObject(rf, "type", fty->valuestring);
        if (!strcmp(fty->valuestring, "json_schema")) {
            cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
            KILN_TRY(ksrv_agent_copy(fmt, "name", js, "name"));
            KILN_TRY(ksrv_agent_copy(fmt, "schema", js, "schema"));
            KILN_TRY(ksrv_agent_copy(fmt, "strict", js, "strict"));
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- output */

static void call_id(ksrv_job *j, int b, char id[10]) { ksrv_tools_call_id(j->tools, 0, j->agent->b[b].call, id); }

/* One output item; done: as in response.output_item.done / the response. */
static void item_json(ksrv_job *j, int bi, bool done, ksrv_buf *o) {
    const ka_block *b = &j->agent->b[bi];
    kgen_finish f = j->ch[0].finish; /* the last item of an output cut short is incomplete (a call's arguments a prefix) */
    bool cut = done && bi == j->agent->n - 1 && (f == KGEN_FINISH_LENGTH || f == KGEN_FINISH_CONTEXT);
    const char *status = !done ? "in_progress" : cut ? "incomplete" : "completed";
    const char *t = b->text.p ? b->text.p : "";
    switch (b->kind) {
    case KA_REASONING:
        ksrv_buf_printf(o, "{\"type\": \"reasoning\", \"id\": \"%s\", \"summary\": [], \"content\": [", b->id);
        if (done) {
            ksrv_buf_str(o, "{\"type\": \"reasoning_text\", \"text\": ");
            ksrv_buf_json_str(o, t, b->text.len);
            ksrv_buf_str(o, "}");
        }
        ksrv_buf_printf(o, "], \"status\": \"%s\"}", status);
        break;
    case KA_TEXT:
        ksrv_buf_printf(o, "{\"type\": \"message\", \"id\": \"%s\", \"status\": \"%s\", \"role\": \"assistant\", \"content\": [", b->id,
                        status);
        if (done) {
            ksrv_buf_str(o, "{\"type\": \"output_text\", \"text\": ");
            ksrv_buf_json_str(o, t, b->text.len);
            ksrv_buf_str(o, ", \"annotations\": [], \"logprobs\": []}");
        }
        ksrv_buf_str(o, "]}");
        break;
    case KA_CALL: {
        char id[10];
        call_id(j, bi, id);
        ksrv_buf_printf(o, "{\"type\": \"function_call\", \"id\": \"%s\", \"call_id\": \"%s\", \"name\": ", b->id, id);
        ksrv_buf_json_str(o, b->name, strlen(b->name));
        ksrv_buf_str(o, ", \"arguments\": ");
        ksrv_buf_json_str(o, done ? t : "", done ? b->text.len : 0);
        ksrv_buf_printf(o, ", \"status\": \"%s\"}", status);
        break;
    }
    }
}

/* The Response object; final: with output, usage and the end status. */
static void response_json(ksrv_job *j, bool final, ksrv_buf *o) {
    ksrv_agent *a = j->agent;
    const cJSON *q = a->req;
    kgen_finish f = j->ch[0].finish;
    bool cut = final && (f == KGEN_FINISH_LENGTH || f == KGEN_FINISH_CONTEXT);
    ksrv_buf_printf(o, "{\"id\": \"%s\", \"object\": \"response\", \"created_at\": %ld, \"status\": \"%s\", ", a->id, j->created,
                    !final ? "in_progress" : cut ? "incomplete" : "completed");
    ksrv_buf_str(o, "\"error\": null, \"incomplete_details\": ");
    ksrv_buf_str(o, cut ? "{\"reason\": \"max_output_tokens\"}" : "null");
    ksrv_buf_str(o, ", \"model\": ");
    ksrv_buf_json_str(o, j->srv->model_id, strlen(j->srv->model_id));
    static const char *const echo[] = {"instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens",
                                       "metadata", "reasoning", "parallel_tool_calls", "text"};
    static const char *const dflt[] = {"null", "[]", "\"auto\"", "1.0", "1.0", "null", "{}", "{\"effort\": null, \"summary\": null}",
                                       "true", "{\"format\": {\"type\": \"text\"}}"};
    for (size_t i = 0; i < sizeof echo / sizeof echo[0]; i++) {
        ksrv_buf_printf(o, ", \"%s\": ", echo[i]);
        const cJSON *v = ku_json_get(q, echo[i]);
        char *s = v ? cJSON_PrintUnformatted(v) : NULL;
        ksrv_buf_str(o, s ? s : dflt[i]);
        free(s);
    }
    ksrv_buf_str(o, ", \"store\": false, \"output\": [");
    for (int b = 0; final && b < a->n; b++) {
        if (b) ksrv_buf_str(o, ", ");
        item_json(j, b, true, o);
    }
    ksrv_buf_str(o, "], \"usage\": ");
    if (!final) {
        ksrv_buf_str(o, "null}");
        return;
    }
    int64_t in, out;
    ksrv_agent_usage(j, &in, &out);
    /* (reasoning_tokens: 0, the generated tokens are not counted per block) */
    ksrv_buf_printf(o,
                    "{\"input_tokens\": %lld, \"input_tokens_details\": {\"cached_tokens\": %d}, \"output_tokens\": %lld, "
                    "\"output_tokens_details\": {\"reasoning_tokens\": 0}, \"total_tokens\": %lld}}",
                    (long long)in, (int)j->ch[0].n_cached, (long long)out, (long long)(in + out));
}

/* "event: TYPE\ndata: {"type": TYPE, "sequence_number": N, ...REST}" */
static ksrv_buf *event(ksrv_job *j, const char *type) {
    ksrv_buf *o = &j->out;
    ksrv_buf_printf(o, "event: %s\ndata: {\"type\": \"%s\", \"sequence_number\": %d", type, type, j->agent->seq++);
    return o;
}

static void end_event(ksrv_buf *o) { ksrv_buf_str(o, "}\n\n"); }

static void r_start(ksrv_job *j) {
    static const char *const t[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        ksrv_buf *o = event(j, t[i]);
        ksrv_buf_str(o, ", \"response\": ");
        response_json(j, false, o);
        end_event(o);
    }
}

static void r_open(ksrv_job *j, int b) {
    ksrv_buf *o = event(j, "response.output_item.added");
    ksrv_buf_printf(o, ", \"output_index\": %d, \"item\": ", b);
    item_json(j, b, false, o);
    end_event(o);
    /* a message's text and a reasoning item's text are content part 0 (the
     * official client adds their deltas to the part this event opened) */
    ka_kind k = j->agent->b[b].kind;
    if (k == KA_TEXT || k == KA_REASONING) {
        o = event(j, "response.content_part.added");
        ksrv_buf_printf(o, ", \"item_id\": \"%s\", \"output_index\": %d, \"content_index\": 0, \"part\": {\"type\": ",
                        j->agent->b[b].id, b);
        ksrv_buf_str(o, k == KA_TEXT ? "\"output_text\", \"text\": \"\", \"annotations\": [], \"logprobs\": []}" : "\"reasoning_text\", \"text\": \"\"}");
        end_event(o);
    }
}

static const char *delta_type(ka_kind k, bool done) {
    static const char *const t[3][2] = {{"response.reasoning_text.delta", "response.reasoning_text.done"},
                                        {"response.output_text.delta", "response.output_text.done"},
                                        {"response.function_call_arguments.delta", "response.function_call_arguments.done"}};
    return t[k][done];
}

static void r_delta(ksrv_job *j, int b, const char *t, size_t n) {
    const ka_block *k = &j->agent->b[b];
    ksrv_buf *o = event(j, delta_type(k->kind, false));
    ksrv_buf_printf(o, ", \"item_id\": \"%s\", \"output_index\": %d", k->id, b);
    if (k->kind != KA_CALL) ksrv_buf_str(o, ", \"content_index\": 0");
    ksrv_buf_str(o, ", \"delta\": ");
    ksrv_buf_json_str(o, t, n);
    if (k->kind == KA_TEXT) ksrv_buf_str(o, ", \"logprobs\": []");
    end_event(o);
}

static void r_close(ksrv_job *j, int b) {
    const ka_block *k = &j->agent->b[b];
    const char *t = k->text.p ? k->text.p : "";
    ksrv_buf *o = event(j, delta_type(k->kind, true));
    ksrv_buf_printf(o, ", \"item_id\": \"%s\", \"output_index\": %d", k->id, b);
    if (k->kind != KA_CALL) ksrv_buf_str(o, ", \"content_index\": 0");
    ksrv_buf_str(o, k->kind == KA_CALL ? ", \"arguments\": " : ", \"text\": ");
    ksrv_buf_json_str(o, t, k->text.len);
    if (k->kind == KA_TEXT) ksrv_buf_str(o, ", \"logprobs\": []");
    end_event(o);
    if (k->kind == KA_TEXT || k->kind == KA_REASONING) {
        o = event(j, "response.content_part.done");
        ksrv_buf_printf(o, ", \"item_id\": \"%s\", \"output_index\": %d, \"content_index\": 0, \"part\": {\"type\": \"%s\", \"text\": ",
                        k->id, b, k->kind == KA_TEXT ? "output_text" : "reasoning_text");
        ksrv_buf_json_str(o, t, k->text.len);
        ksrv_buf_str(o, k->kind == KA_TEXT ? ", \"annotations\": [], \"logprobs\": []}" : "}");
        end_event(o);
    }
    o = event(j, "response.output_item.done");
    ksrv_buf_printf(o, ", \"output_index\": %d, \"item\": ", b);
    item_json(j, b, true, o);
    end_event(o);
}

static void r_finish(ksrv_job *j) {
    kgen_finish f = j->ch[0].finish;
    bool cut = f == KGEN_FINISH_LENGTH || f == KGEN_FINISH_CONTEXT;
    ksrv_buf *o = event(j, cut ? "response.incomplete" : "response.completed");
    ksrv_buf_str(o, ", \"response\": ");
    response_json(j, true, o);
    end_event(o);
}

static void r_body(ksrv_job *j, ksrv_buf *b) { response_json(j, true, b); }

static void r_error(ksrv_job *j, ksrv_buf *b, int status, const char *msg) {
    if (b != &j->out) {
        ksrv_error_json(b, status, "server_error", NULL, msg);
        return;
    }
    ksrv_buf *o = event(j, "error");
    ksrv_buf_str(o, ", \"code\": \"server_error\", \"message\": ");
    ksrv_buf_json_str(o, msg, strlen(msg));
    ksrv_buf_str(o, ", \"param\": null");
    end_event(o);
}

const ka_api ksrv_responses_api = {r_start, r_open, r_delta, r_close, r_finish, r_body, r_error};
