/* grammar.c: the grammar of a format's tool calls (see toolcall.h,
 * ktc_grammar): GBNF for the text after the format's trigger, each call's
 * arguments under its function's JSON schema (kgr_schema_to_gbnf).
 *
 * The grammar starts after the trigger and ends where the last call's
 * arguments end (the closing "}" or "]"): the text after it (a closing
 * </tool_call>, a special end token) is the model's again. So the grammar
 * never needs a special token: kiln's grammar vocabulary has none. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "tools/toolcall.h"

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} gbuf;

static void put(gbuf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
static void put(gbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q, b->cap = cap;
    }
}

/* s as a GBNF literal's body (inside the quotes) */
static void put_lit(gbuf *b, const char *s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') put(b, "\\%c", *c);
        else if (*c < 0x20) put(b, "\\x%02X", *c);
        else put(b, "%c", *c);
    }
}

/* the JSON string of s, as a GBNF literal */
static void put_json_name(gbuf *b, const char *s) {
    char *j = cJSON_PrintUnformatted(&(cJSON){.type = cJSON_String, .valuestring = (char *)s});
    if (!j) {
        b->oom = true;
        return;
    }
    put(b, "\"");
    put_lit(b, j);
    put(b, "\"");
    free(j);
}

bool ktc_grammar_supported(ktc_format f) {
    return f == KTC_HERMES || f == KTC_LLAMA3 || f == KTC_MISTRAL || f == KTC_GRANITE || f == KTC_COMMAND_R ||
           f == KTC_PHI4 || f == KTC_COMMAND_R_PLUS || f == KTC_FIREFUNCTION;
}

/* Rule tc-aK for tool K's arguments: its schema's GBNF with the root
 * renamed (a schema kiln cannot honour: a 400 when strict, else any object). */
static kiln_status add_args(gbuf *b, const cJSON *fn, int k, int idx, const kgr_opts *o) {
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    bool strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
    char prefix[32];
    snprintf(prefix, sizeof prefix, "tc%d-", k);
    char *g = NULL;
    kiln_status st = NULL;
    cJSON *any = NULL;
    if (cJSON_IsObject(pa)) st = kgr_schema_to_gbnf(pa, o, prefix, &g);
    if (st && strict) return kiln_status_wrap(st, "\"tools\"[%d].function.parameters", idx);
    kiln_status_free(st);
    if (!g) {
        if (!(any = cJSON_Parse("{\"type\": \"object\", \"additionalProperties\": true}"))) return kiln_error(KILN_ENOMEM, "out of memory");
        st = kgr_schema_to_gbnf(any, o, prefix, &g);
        cJSON_Delete(any);
        if (st) return st;
    }
    /* the schema's root is its last line, "root ::= TOP" */
    size_t n = strlen(g);
    char *r = n >= 9 && !strncmp(g, "root ::= ", 9) ? g : NULL;
    for (char *q = g; (q = strstr(q, "\nroot ::= ")); q++) r = q + 1;
    if (!r) {
        free(g);
        return kiln_error(KILN_EINVAL, "tool grammar: the schema's GBNF has no root");
    }
    put(b, "%.*stc-a%d ::= %s", (int)(r - g), g, k, r + 9);
    if (n && g[n - 1] != '\n') put(b, "\n");
    free(g);
    return NULL;
}

/* key-value: "KEY" ws ":" ws */
static void put_key(gbuf *b, const char *key) { put(b, "\"\\\"%s\\\"\" tc-ws \":\" tc-ws", key); }

kiln_status ktc_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, char **gbnf) {
    *gbnf = NULL;
    if (!ktc_grammar_supported(f))
        return kiln_error(KILN_EUNSUPPORTED, "the %s tool-call format has no grammar", ktc_format_name(f));
    gbuf b = {0};
    kiln_status st = NULL;
    /* one call: tc-call ::= tc-c0 | tc-c1 ... (the call objects differ by format) */
    bool cohere = f == KTC_COMMAND_R || f == KTC_COMMAND_R_PLUS;
    kgr_opts o;
    kgr_opts_default(&o);
    /* an object without additionalProperties takes no other keys (as
     * llama.cpp's tool grammars: a model should not invent arguments) */
    o.additional_properties = false;
    if (f == KTC_COMMAND_R_PLUS) o.max_ws = 16; /* its template indents the arguments by 12 */
    const char *name_key = cohere ? "tool_name" : "name";
    const char *args_key = f == KTC_LLAMA3 || cohere ? "parameters" : "arguments";
    int k = 0, idx = -1;
    const cJSON *t;
    put(&b, "tc-ws ::= [ \\t\\n]{0,16}\n"); /* Command R7B's template writes 10 in a row */
    gbuf alts = {0};
    cJSON_ArrayForEach(t, tools) {
        idx++;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(nm) || (only && strcmp(only, nm->valuestring))) continue;
        if ((st = add_args(&b, fn, k, idx, &o))) break;
        put(&alts, "%s", k ? " | " : "");
        if (f != KTC_LLAMA3) put(&alts, "\"{\" tc-ws ");
        if (f == KTC_COMMAND_R) {
            put_key(&alts, "tool_call_id");
            put(&alts, " \"\\\"\" [0-9]{1,3} \"\\\"\" tc-ws \",\" tc-ws ");
        }
        if (f != KTC_LLAMA3) put_key(&alts, name_key); /* Llama 3's trigger is {"name" */
        else put(&alts, "\":\" tc-ws");
        put(&alts, " ");
        put_json_name(&alts, nm->valuestring);
        put(&alts, " tc-ws \",\" tc-ws ");
        put_key(&alts, args_key);
        put(&alts, " tc-a%d", k);
        /* Mistral's templates write an id after the arguments */
        if (f == KTC_MISTRAL) put(&alts, " (tc-ws \",\" tc-ws \"\\\"id\\\"\" tc-ws \":\" tc-ws \"\\\"\" [a-zA-Z0-9]{9} \"\\\"\")?");
        put(&alts, " tc-ws \"}\"");
        k++;
    }
    if (!st && k == 0) st = kiln_error(KILN_EINVAL, "\"tool_choice\": no tool to call");
    if (!st) {
        put(&b, "tc-call ::= %s\n", alts.p ? alts.p : "");
        /* Command R+ fences its list */
        const char *open = f == KTC_COMMAND_R_PLUS ? "tc-ws (\"```json\" tc-ws)? \"[\"" : "tc-ws \"[\"";
        if (f == KTC_HERMES || f == KTC_LLAMA3) put(&b, "root ::= tc-ws tc-call\n");
        else if (parallel) put(&b, "root ::= %s tc-ws tc-call (tc-ws \",\" tc-ws tc-call)* tc-ws \"]\"\n", open);
        else put(&b, "root ::= %s tc-ws tc-call tc-ws \"]\"\n", open);
    }
    free(alts.p);
    if (!st && (b.oom || alts.oom)) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (st) {
        free(b.p);
        return st;
    }
    *gbnf = b.p;
    return NULL;
}
