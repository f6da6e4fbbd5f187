/* tools.c: function calling and reasoning in /v1/chat/completions: the
 * request's tools, tool_choice, parallel_tool_calls, reasoning_format and
 * reasoning_effort; assistant tool_calls and tool messages made ready for
 * the chat template; and the output split by the template's tool-call
 * format (src/tools/toolcall.h) into content, reasoning_content and
 * tool_calls, streamed as OpenAI streams them (a call's id and name first,
 * then its argument fragments).
 *
 * Constrained arguments: where the format has a grammar (ktc_grammar), a
 * call's text after the format's trigger is generated under it (each
 * function's arguments under its schema): lazily with tool_choice auto (on
 * where the model writes the trigger, off when the call is complete, on at
 * the next), and with tool_choice required or a named function the prompt
 * ends with the trigger, so a call is certain; when the prompt opened a
 * thinking block (MiniMax-M2, Qwen3 thinking, DeepSeek-R1) the grammar
 * switches on where the block closes instead (its close marker is the
 * trigger) and forces the format's trigger and a call there; the output
 * ends where the calls do (one, or with parallel_tool_calls one or more). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "grammar/grammar.h"
#include "server/server_int.h"

struct ksrv_tools {
    ktc_syntax syn;
    cJSON *tools;       /* the request's tools (a copy; NULL: none) */
    bool parallel;      /* parallel_tool_calls */
    int n_choices;
    ktc_stream **st;    /* per choice (streaming), made at the first event */
    uint64_t id_base;   /* tool call ids */
    bool force;         /* tool_choice required / named: the prompt ends with the trigger */
    int64_t budget;     /* reasoning_budget > 0: thinking ends after this many tokens */
    char *after_think;  /* force, when the prompt opens a thinking block: the grammar after its close */
};

/* ---------------------------------------------------------------- the request */

static kiln_status check_tools(const cJSON *tools) {
    if (!cJSON_IsArray(tools)) return kiln_error(KILN_EINVAL, "\"tools\": expected a list of tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function"))
            return kiln_error(KILN_EUNSUPPORTED, "\"tools\"[%d]: only {\"type\": \"function\", \"function\": {...}} tools are supported", i);
        if (!cJSON_IsObject(f) || !cJSON_IsString(n) || !*n->valuestring)
            return kiln_error(KILN_EINVAL, "\"tools\"[%d].function.name: required (a string)", i);
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (pa && !cJSON_IsObject(pa) && !cJSON_IsNull(pa))
            return kiln_error(KILN_EINVAL, "\"tools\"[%d].function.parameters: expected a JSON schema object", i);
        i++;
    }
    return NULL;
}

/* tool_choice: "auto", "none", "required", or {"type": "function",
 * "function": {"name": ..}}. *none: the tools are dropped; *force: a call
 * is required (of the function *only, borrowed from body; NULL: any). */
static kiln_status check_choice(const cJSON *body, const cJSON *tools, bool *none, bool *force, const char **only) {
    const cJSON *c = ku_json_get(body, "tool_choice");
    *none = *force = false;
    *only = NULL;
    if (!c) return NULL;
    if (cJSON_IsString(c)) {
        const char *v = c->valuestring;
        *force = !strcmp(v, "required");
        if (!strcmp(v, "none")) *none = true;
        else if (strcmp(v, "auto") && strcmp(v, "required"))
            return kiln_error(KILN_EINVAL, "\"tool_choice\": \"%s\": expected \"auto\", \"none\", \"required\" or a function", v);
        if (!strcmp(v, "required") && !tools) return kiln_error(KILN_EINVAL, "\"tool_choice\": \"required\" needs \"tools\"");
        return NULL;
    }
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "function"), "name");
    if (!cJSON_IsObject(c) || !cJSON_IsString(n))
        return kiln_error(KILN_EINVAL, "\"tool_choice\": expected a string or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (!tools || !ktc_has_tool(tools, n->valuestring))
        return kiln_error(KILN_EINVAL, "\"tool_choice\": the function \"%s\" is not in \"tools\"", n->valuestring);
    *force = true;
    *only = n->valuestring;
    return NULL;
}

kiln_status ksrv_tools_fix_messages(cJSON *msgs) {
    cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (tc && !cJSON_IsArray(tc) && !cJSON_IsNull(tc))
            return kiln_error(KILN_EINVAL, "\"messages\"[%d].tool_calls: expected a list", i);
        /* templates test or split the content of a tool-call turn (Qwen3:
         * '</think>' in message.content): null as "" */
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_GetArraySize(tc) > 0 && (!content || cJSON_IsNull(content))) {
            cJSON *e = cJSON_CreateString("");
            if (!e) return kiln_error(KILN_ENOMEM, "out of memory");
            if (content) cJSON_ReplaceItemInObjectCaseSensitive(m, "content", e);
            else cJSON_AddItemToObject(m, "content", e);
        }
        int k = 0;
        cJSON *c;
        cJSON_ArrayForEach(c, tc) {
            cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
            if (!cJSON_IsObject(f) || !cJSON_IsString(n))
                return kiln_error(KILN_EINVAL, "\"messages\"[%d].tool_calls[%d].function.name: required (a string)", i, k);
            /* templates want the arguments as an object (as vLLM passes them) */
            cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
            if (cJSON_IsString(a)) {
                cJSON *o = cJSON_Parse(a->valuestring);
                if (cJSON_IsObject(o)) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", o);
                else cJSON_Delete(o);
            } else if (!a) {
                cJSON_AddItemToObject(f, "arguments", cJSON_CreateObject());
            }
            k++;
        }
        /* gpt-oss's template reads a turn's reasoning from "thinking" */
        const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
        if (cJSON_IsString(rc) && !cJSON_GetObjectItemCaseSensitive(m, "thinking"))
            cJSON_AddStringToObject(m, "thinking", rc->valuestring);
        i++;
    }
    return NULL;
}

/* id as 9 alphanumerics into out (see ksrv_tools_fit_ids). */
static void fit_id(const char *id, char out[10]) {
    static const char a[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    int n = 0;
    for (const char *p = id + strlen(id); p > id && n < 9;)
        if (strchr(a, *--p)) out[8 - n++] = *p;
    if (n == 9) {
        out[9] = 0;
        return;
    }
    uint64_t x = 1469598103934665603ull; /* FNV-1a of the whole id */
    for (const char *p = id; *p; p++) x = (x ^ (unsigned char)*p) * 1099511628211ull;
    for (int c = 0; c < 9; c++) out[c] = a[x % 62], x /= 62;
    out[9] = 0;
}

static kiln_status fit_field(cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) return NULL; /* (the template names what is missing) */
    size_t n = strlen(v->valuestring);
    if (n == 9 && strspn(v->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 9) return NULL;
    char id[10];
    fit_id(v->valuestring, id);
    cJSON *e = cJSON_CreateString(id);
    if (!e) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_ReplaceItemInObjectCaseSensitive(o, key, e);
    return NULL;
}

kiln_status ksrv_tools_fit_ids(cJSON *msgs) {
    cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) if (cJSON_IsObject(c)) KILN_TRY(fit_field(c, "id"));
        KILN_TRY(fit_field(m, "tool_call_id"));
    }
    return NULL;
}

void ksrv_tools_free(ksrv_tools *t) {
    if (!t) return;
    for (int i = 0; t->st && i < t->n_choices; i++) ktc_stream_destroy(t->st[i]);
    free(t->st);
    cJSON_Delete(t->tools);
    free(t->after_think);
    free(t);
}

kiln_status ksrv_tools_phi4_system(const ksrv_tools *t0, cJSON *msgs, const cJSON *tools) {
    if (!t0 || !tools || t0->syn.format != KTC_PHI4) return NULL;
    cJSON *m, *sys = NULL;
    cJSON_ArrayForEach(m, msgs) {
        if (cJSON_GetObjectItemCaseSensitive(m, "tools")) return NULL; /* the client's own */
        if (!sys && cJSON_IsString(ku_json_get(m, "role")) && !strcmp(ku_json_get(m, "role")->valuestring, "system")) sys = m;
    }
    cJSON *fns = cJSON_CreateArray(), *t;
    cJSON_ArrayForEach(t, tools) {
        cJSON *f = cJSON_Duplicate(ku_json_get(t, "function"), true);
        if (f) cJSON_DeleteItemFromObjectCaseSensitive(f, "strict");
        if (!f || !cJSON_AddItemToArray(fns, f)) {
            cJSON_Delete(f);
            cJSON_Delete(fns);
            return kiln_error(KILN_ENOMEM, "out of memory");
        }
    }
    char *text = fns ? cJSON_PrintUnformatted(fns) : NULL;
    cJSON_Delete(fns);
    if (!text) return kiln_error(KILN_ENOMEM, "out of memory");
    if (!sys && (sys = cJSON_CreateObject())) {
        if (!cJSON_AddStringToObject(sys, "role", "system") || !cJSON_AddStringToObject(sys, "content", "") ||
            !cJSON_InsertItemInArray(msgs, 0, sys)) {
            cJSON_Delete(sys);
            sys = NULL;
        }
    }
    bool ok = sys && cJSON_AddStringToObject(sys, "tools", text);
    free(text);
    return ok ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
}

/* The calls' grammar as gp's (lazy; see the top) */
static kiln_status set_grammar(ksrv_tools *t, const cJSON *tools, const char *only, const ktok *tok, kgen_params *gp) {
    ktc_format f = t->syn.format;
    bool strict = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, tools) strict |= cJSON_IsTrue(ku_json_get(ku_json_get(e, "function"), "strict"));
    if (!ktc_grammar_supported(f)) { /* documented: such calls are parsed, not constrained */
        t->force = false;
        return NULL;
    }
    /* pythonic calls are the whole output from its start, where a lazy trigger ("[" anywhere) would force
     * calls into text: only a forced call is constrained (documented) */
    if (f == KTC_PYTHONIC && !t->force) return NULL;
    if (gp->grammar) {
        if (t->force || strict)
            return kiln_error(KILN_EUNSUPPORTED, "\"tools\": constrained tool calls (strict, tool_choice required or a "
                                                "function) cannot be combined with another constraint (response_format, grammar)");
        t->force = false;
        return NULL;
    }
    char *g;
    KILN_TRY(ktc_grammar(f, tools, only, t->parallel, tok, &g));
    kgr_grammar *gr;
    kiln_status st = kgr_from_gbnf(g, strlen(g), &gr);
    if (st) {
        free(g);
        return kiln_status_wrap(st, "\"tools\": the tool-call grammar");
    }
    kgr_grammar_free(gr);
    gp->grammar = g;
    gp->grammar_lazy = true;
    if (!(gp->grammar_trigger = strdup(ktc_trigger(f)))) return kiln_error(KILN_ENOMEM, "out of memory");
    if (t->force && t->syn.reasoning != KTC_THINK_NONE) { /* (without it, a prompt that opens the block keeps the lazy grammar) */
        kiln_status st2 = ktc_grammar_after_think(f, g, tok, &t->after_think);
        if (st2 && kiln_status_code(st2) == KILN_ENOMEM) return st2;
        kiln_status_free(st2);
    }
    return NULL;
}

kiln_status ksrv_tools_parse(ksrv *s, const cJSON *body, kgen_params *gp, ksrv_tools **out, const cJSON **tmpl_tools,
                             cJSON **extra) {
    *out = NULL;
    *tmpl_tools = NULL;
    const cJSON *tools = ku_json_get(body, "tools");
    if (tools) KILN_TRY(check_tools(tools));
    if (tools && cJSON_GetArraySize(tools) == 0) tools = NULL;
    bool none, force;
    const char *only;
    KILN_TRY(check_choice(body, tools, &none, &force, &only));
    bool parallel;
    KILN_TRY(ku_json_bool(body, "parallel_tool_calls", true, &parallel));
    const char *rf, *effort;
    KILN_TRY(ku_json_str(body, "reasoning_format", s->p.reasoning_none ? "none" : "auto", &rf));
    if (strcmp(rf, "none") && strcmp(rf, "auto") && strcmp(rf, "deepseek"))
        return kiln_error(KILN_EINVAL, "\"reasoning_format\": \"%s\": expected \"none\", \"auto\" or \"deepseek\"", rf);
    KILN_TRY(ku_json_str(body, "reasoning_effort", NULL, &effort));
    int64_t budget;
    KILN_TRY(ku_json_int(body, "reasoning_budget", s->p.no_thinking ? 0 : s->p.think_budget > 0 ? s->p.think_budget : -1, &budget));
    if (budget < -1 || budget > (1 << 24))
        return kiln_error(KILN_EINVAL, "\"reasoning_budget\": %lld is out of range [-1, %d]", (long long)budget, 1 << 24);
    if (budget == 0) { /* as llama.cpp: the template's switch */
        if (!*extra && !(*extra = cJSON_CreateObject())) return kiln_error(KILN_ENOMEM, "out of memory");
        if (!cJSON_GetObjectItemCaseSensitive(*extra, "enable_thinking")) cJSON_AddFalseToObject(*extra, "enable_thinking");
    }
    if (effort) { /* gpt-oss's template reads it */
        if (!*extra && !(*extra = cJSON_CreateObject())) return kiln_error(KILN_ENOMEM, "out of memory");
        if (!cJSON_GetObjectItemCaseSensitive(*extra, "reasoning_effort"))
            cJSON_AddStringToObject(*extra, "reasoning_effort", effort);
    }
    const char *src = kchat_source(s->tmpl);
    ktc_format f = ktc_detect(src);
    ktc_reasoning r = strcmp(rf, "none") ? ktc_detect_reasoning(src) : KTC_THINK_NONE;
    bool use_tools = tools && !none;
    if (use_tools && f == KTC_NONE)
        return kiln_error(KILN_EUNSUPPORTED,
                          "\"tools\": the model's chat template writes tool calls in no format kiln knows "
                          "(Hermes <tool_call>, Qwen3-Coder, Llama 3, Mistral [TOOL_CALLS], gpt-oss Harmony, DeepSeek, GLM-4.5, Kimi K2, "
                          "Command R7B, Granite, Seed-OSS, MiniMax-M2, Phi-4-mini, Command R+, FireFunction, DeepSeek DSML, MiniCPM5, Hy3, "
                          "Apriel, MiniMax-M1/M3, Nemotron Nano v2, GigaChat 3, Apertus, Solar Open, functionary v3.1/v3.2, LFM2, "
                          "Gemma 4, Kimi K3, pythonic: Llama 4 / Llama 3.2)");
    if (use_tools) *tmpl_tools = tools;
    if (f == KTC_FIREFUNCTION) { /* its template reads the tools as text, "functions" (llama.cpp passes them) */
        if (!*extra && !(*extra = cJSON_CreateObject())) return kiln_error(KILN_ENOMEM, "out of memory");
        char *fs = use_tools ? cJSON_Print(tools) : strdup("[]");
        if (!fs) return kiln_error(KILN_ENOMEM, "out of memory");
        if (!cJSON_GetObjectItemCaseSensitive(*extra, "functions")) cJSON_AddStringToObject(*extra, "functions", fs);
        free(fs);
        char when[64]; /* and the date, as llama.cpp formats it */
        time_t now = time(NULL);
        struct tm tm;
        strftime(when, sizeof when, "%b %d %Y %H:%M:%S GMT", gmtime_r(&now, &tm));
        if (!cJSON_GetObjectItemCaseSensitive(*extra, "datetime")) cJSON_AddStringToObject(*extra, "datetime", when);
    }
    /* Harmony's channels (and Muse Glimmer's messages) are parsed even without tools (their markers would
     * otherwise be dropped as special tokens and run together) */
    if (!use_tools && f != KTC_HARMONY && f != KTC_MUSE_GLIMMER) f = KTC_NONE;
    if (f == KTC_NONE && r == KTC_THINK_NONE) return NULL;
    ksrv_tools *t = calloc(1, sizeof *t);
    if (!t) return kiln_error(KILN_ENOMEM, "out of memory");
    t->tools = use_tools ? cJSON_Duplicate(tools, true) : NULL;
    if (use_tools && !t->tools) {
        free(t);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    t->syn = (ktc_syntax){.format = f, .reasoning = r, .tools = t->tools};
    t->parallel = parallel;
    t->force = use_tools && force;
    t->budget = budget;
    kiln_status st = use_tools ? set_grammar(t, t->tools, only, s->tok, gp) : NULL;
    if (st) {
        ksrv_tools_free(t);
        return st;
    }
    static atomic_ulong counter;
    t->id_base = ((uint64_t)time(NULL) << 20) ^ ((uint64_t)atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    *out = t;
    return NULL;
}

kiln_status ksrv_tools_set_prompt(ksrv_tools *t, char **prompt, kgen_params *gp) {
    t->syn.think_open = ktc_prompt_opens_think(t->syn.reasoning, *prompt);
    const char *o, *c;
    ktc_think_markers(t->syn.format, t->syn.reasoning, &o, &c);
    if (t->budget > 0 && c && !gp->think_close) { /* the budget: the session forces the closing text */
        if (!(gp->think_open = strdup(o)) || !(gp->think_close = strdup(c))) return kiln_error(KILN_ENOMEM, "out of memory");
        gp->think_in_prompt = t->syn.think_open;
        gp->reasoning_budget = (int32_t)t->budget;
    }
    if (!t->force) return NULL;
    if (t->syn.think_open) { /* the model thinks first: the call is forced where the block closes */
        if (!t->after_think || !c) return NULL;
        char *tr = strdup(c);
        if (!tr) return kiln_error(KILN_ENOMEM, "out of memory");
        free(gp->grammar);
        free(gp->grammar_trigger);
        gp->grammar = t->after_think;
        gp->grammar_trigger = tr;
        t->after_think = NULL;
        gp->grammar_lazy = true;
        gp->grammar_once = true; /* the calls (one, or with parallel_tool_calls one or more), then the end */
        return NULL;
    }
    /* a forced call: the prompt ends with the trigger, the grammar on */
    const char *tr = ktc_trigger(t->syn.format);
    size_t n = strlen(*prompt), k = strlen(tr);
    if (n < k || strcmp(*prompt + n - k, tr)) { /* (functionary v3.2's prompt ends with its >>>) */
        char *p = realloc(*prompt, n + k + 1);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        memcpy(p + n, tr, k + 1);
        *prompt = p;
    }
    t->syn.prefix = tr;
    gp->grammar_lazy = false;
    /* the grammar takes one call, or with parallel_tool_calls one or more
     * (ktc_grammar; llama.cpp's root ::= tool_call+); the output ends where
     * it completes, never with free text after the calls */
    gp->grammar_once = true;
    return NULL;
}

bool ksrv_tools_keep_special(const ksrv_tools *t) { return t && ktc_needs_special(t->syn.format); }

/* ---------------------------------------------------------------- output */

ktc_syntax ksrv_tools_syntax(const ksrv_tools *t) { return t ? t->syn : (ktc_syntax){0}; }

/* Call k of choice i: 9 alphanumerics (Mistral's templates refuse other ids). */
void ksrv_tools_call_id(const ksrv_tools *t, int i, int k, char out[10]) {
    static const char a[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t x = (t ? t->id_base : 0) + (uint64_t)i * 1000003u + (uint64_t)k * 7919u;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    for (int c = 0; c < 9; c++) out[c] = a[x % 62], x /= 62;
    out[9] = 0;
}

static const char *finish_of(const ksrv_tools *t, int n_calls, kgen_finish f) {
    const char *r = kgen_finish_reason(f);
    if (!r) r = "length";
    return n_calls > 0 && strcmp(r, "length") ? "tool_calls" : r;
}

static int visible_calls(const ksrv_tools *t, int n) { return !t->parallel && n > 1 ? 1 : n; }

void ksrv_tools_message(ksrv_job *j, int i, const char *text, size_t len, ksrv_buf *b, const char **finish) {
    ksrv_tools *t = j->tools;
    ktc_msg m;
    kiln_status st = ktc_parse(&t->syn, text ? text : "", len, false, &m);
    if (st) {
        kiln_status_free(st);
        b->oom = true;
        return;
    }
    int nc = visible_calls(t, m.n_calls);
    ksrv_buf_str(b, "\"message\": {\"role\": \"assistant\", \"content\": ");
    if (nc && !m.n_content) ksrv_buf_str(b, "null");
    else ksrv_buf_json_str(b, m.content, m.n_content);
    if (m.n_reasoning) {
        ksrv_buf_str(b, ", \"reasoning_content\": ");
        ksrv_buf_json_str(b, m.reasoning, m.n_reasoning);
    }
    if (nc) {
        ksrv_buf_str(b, ", \"tool_calls\": [");
        for (int k = 0; k < nc; k++) {
            char id[10];
            ksrv_tools_call_id(t, i, k, id);
            ksrv_buf_printf(b, "%s{\"id\": \"%s\", \"type\": \"function\", \"function\": {\"name\": ", k ? ", " : "", id);
            ksrv_buf_json_str(b, m.calls[k].name, strlen(m.calls[k].name));
            ksrv_buf_str(b, ", \"arguments\": ");
            ksrv_buf_json_str(b, m.calls[k].arguments, strlen(m.calls[k].arguments));
            ksrv_buf_str(b, "}}");
        }
        ksrv_buf_str(b, "]");
    }
    ksrv_buf_str(b, "}");
    *finish = finish_of(t, nc, j->ch[i].finish);
    ktc_msg_free(&m);
}

typedef struct {
    ksrv_job *j;
    int choice;
} delta_ctx;

static void chunk_tail(ksrv_job *j, const char *fin) {
    ksrv_buf *b = &j->out;
    ksrv_buf_str(b, "}, \"logprobs\": null, ");
    if (fin) ksrv_buf_printf(b, "\"finish_reason\": \"%s\"}]", fin);
    else ksrv_buf_str(b, "\"finish_reason\": null}]");
    if (j->include_usage) ksrv_buf_str(b, ", \"usage\": null");
    ksrv_buf_str(b, "}\n\n");
}

static kiln_status on_delta(void *ud, const ktc_delta *d) {
    delta_ctx *c = ud;
    ksrv_job *j = c->j;
    ksrv_tools *t = j->tools;
    if ((d->kind == KTC_D_CALL || d->kind == KTC_D_ARGS) && !t->parallel && d->index > 0) return NULL;
    ksrv_buf *b = &j->out;
    ksrv_chunk_head(j, b);
    ksrv_buf_printf(b, "{\"index\": %d, \"delta\": {", c->choice);
    switch (d->kind) {
    case KTC_D_CONTENT:
    case KTC_D_REASONING:
        ksrv_buf_str(b, d->kind == KTC_D_CONTENT ? "\"content\": " : "\"reasoning_content\": ");
        ksrv_buf_json_str(b, d->text, d->len);
        break;
    case KTC_D_CALL: {
        char id[10];
        ksrv_tools_call_id(t, c->choice, d->index, id);
        ksrv_buf_printf(b, "\"tool_calls\": [{\"index\": %d, \"id\": \"%s\", \"type\": \"function\", \"function\": {\"name\": ",
                        d->index, id);
        ksrv_buf_json_str(b, d->text, d->len);
        ksrv_buf_str(b, ", \"arguments\": \"\"}}]");
        break;
    }
    case KTC_D_ARGS:
        ksrv_buf_printf(b, "\"tool_calls\": [{\"index\": %d, \"function\": {\"arguments\": ", d->index);
        ksrv_buf_json_str(b, d->text, d->len);
        ksrv_buf_str(b, "}}]");
        break;
    }
    chunk_tail(j, NULL);
    return NULL;
}

void ksrv_tools_stream_event(ksrv_job *j, const ksrv_ev *ev, const char *fin) {
    ksrv_tools *t = j->tools;
    if (!t->st) {
        t->n_choices = j->n_choices;
        t->st = calloc((size_t)j->n_choices, sizeof *t->st);
        if (!t->st) {
            j->out.oom = true;
            return;
        }
    }
    int i = ev->choice;
    if (!t->st[i] && !(t->st[i] = ktc_stream_create(&t->syn))) {
        j->out.oom = true;
        return;
    }
    delta_ctx c = {j, i};
    kiln_status st = ktc_stream_feed(t->st[i], ev->text ? ev->text : "", ev->len, fin != NULL, on_delta, &c);
    if (st) {
        kiln_status_free(st);
        j->out.oom = true;
        return;
    }
    if (!fin) return;
    const ktc_msg *m = ktc_stream_msg(t->st[i]);
    ksrv_chunk_head(j, &j->out);
    ksrv_buf_printf(&j->out, "{\"index\": %d, \"delta\": {", i);
    chunk_tail(j, finish_of(t, visible_calls(t, m->n_calls), ev->finish));
}
