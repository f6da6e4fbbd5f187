/* grammar.c: the grammar of a format's tool calls (see toolcall.h,
 * ktc_grammar): GBNF for the text after the format's trigger, each call's
 * arguments under its function's JSON schema (kgr_schema_to_gbnf).
 *
 * JSON formats (Hermes, Llama 3, Mistral v3, ...): the grammar ends where
 * the last call's arguments end (the closing "}" or "]"); the text after it
 * is the model's again. Formats whose markup is special tokens (Harmony,
 * DeepSeek, Kimi K2, Mistral [ARGS]) name them as token terminals (<[id]>,
 * grammar.h), so only the token itself is taken, and end with the call's
 * closing marker. XML formats (Qwen3-Coder, Seed-OSS, MiniMax-M2, GLM-4.5,
 * DeepSeek's DSML)
 * write each parameter as tagged text: a "string" parameter as raw text (the
 * parser takes it as is), another as its JSON under the property's schema
 * (the parser parses it), as their parsers in toolcall.c read them. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"
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

bool ktc_grammar_supported(ktc_format f) { return f > KTC_NONE && f < KTC_N_FORMATS; }

/* Rule `rule` for the JSON of schema (its other rules prefixed with prefix). */
static kiln_status put_schema_rule(gbuf *b, const cJSON *schema, const char *prefix, const char *rule, const kgr_opts *o) {
    char *g = NULL;
    KILN_TRY(kgr_schema_to_gbnf(schema, o, prefix, &g));
    /* the schema's root is its last line, "root ::= TOP" */
    size_t n = strlen(g);
    char *r = n >= 9 && !strncmp(g, "root ::= ", 9) ? g : NULL;
    for (char *q = g; (q = strstr(q, "\nroot ::= ")); q++) r = q + 1;
    if (!r) {
        free(g);
        return kiln_error(KILN_EINVAL, "tool grammar: the schema's GBNF has no root");
    }
    put(b, "%.*s%s ::= %s", (int)(r - g), g, rule, r + 9);
    if (n && g[n - 1] != '\n') put(b, "\n");
    free(g);
    return NULL;
}

static kiln_status put_any_object(gbuf *b, const char *prefix, const char *rule, const kgr_opts *o) {
    cJSON *any = cJSON_Parse("{\"type\": \"object\", \"additionalProperties\": true}");
    if (!any) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = put_schema_rule(b, any, prefix, rule, o);
    cJSON_Delete(any);
    return st;
}

/* Rule tc-aK for tool K's arguments: its schema's GBNF with the root
 * renamed (a schema kiln cannot honour: a 400 when strict, else any object). */
static kiln_status add_args(gbuf *b, const cJSON *fn, int k, int idx, const kgr_opts *o) {
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    bool strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
    char prefix[32], rule[32];
    snprintf(prefix, sizeof prefix, "tc%d-", k);
    snprintf(rule, sizeof rule, "tc-a%d", k);
    if (!cJSON_IsObject(pa)) return put_any_object(b, prefix, rule, o);
    gbuf tmp = {0};
    kiln_status st = put_schema_rule(&tmp, pa, prefix, rule, o);
    if (st && strict) {
        free(tmp.p);
        return kiln_status_wrap(st, "\"tools\"[%d].function.parameters", idx);
    }
    if (!st) {
        put(b, "%s", tmp.p ? tmp.p : "");
        free(tmp.p);
        return NULL;
    }
    kiln_status_free(st);
    free(tmp.p);
    return put_any_object(b, prefix, rule, o);
}

/* A marker: the special token that spells it (tok's, a terminal), else its text. */
static void put_tok(gbuf *b, const ktok *tok, const char *text) {
    int32_t id = tok ? ktok_token_id(tok, text) : -1;
    if (id >= 0 && ktok_is_special(tok, id)) put(b, " <[%d]> ", id);
    else {
        put(b, " \"");
        put_lit(b, text);
        put(b, "\" ");
    }
}

/* The tools that may be called (only: of that name), in order: it.fn
 * (function), it.nm (its name), it.idx (the index in tools). */
typedef struct {
    const cJSON *t;
    int idx;
    const cJSON *fn, *nm;
} tool_it;

static bool tool_next(const cJSON *tools, const char *only, tool_it *it) {
    for (it->t = it->t ? it->t->next : tools ? tools->child : NULL; it->t; it->t = it->t->next) {
        it->idx++;
        it->fn = cJSON_GetObjectItemCaseSensitive(it->t, "function");
        it->nm = cJSON_GetObjectItemCaseSensitive(it->fn, "name");
        if (cJSON_IsString(it->nm) && (!only || !strcmp(only, it->nm->valuestring))) return true;
    }
    return false;
}

/* key-value: "KEY" ws ":" ws */
static void put_key(gbuf *b, const char *key) { put(b, "\"\\\"%s\\\"\" tc-ws \":\" tc-ws", key); }

/* The JSON formats: a call object, or a list of them. */
static kiln_status json_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, char **gbnf) {
    gbuf b = {0};
    kiln_status st = NULL;
    /* one call: tc-call ::= tc-c0 | tc-c1 ... (the call objects differ by format) */
    bool cohere = f == KTC_COMMAND_R || f == KTC_COMMAND_R_PLUS;
    /* one object after the trigger (each call its own trigger), else a list */
    bool single = f == KTC_HERMES || f == KTC_LLAMA3 || f == KTC_MINIMAX_M1 || f == KTC_GIGACHAT3 || f == KTC_GIGACHAT31;
    kgr_opts o;
    kgr_opts_default(&o);
    /* an object without additionalProperties takes no other keys (as
     * llama.cpp's tool grammars: a model should not invent arguments) */
    o.additional_properties = false;
    if (f == KTC_COMMAND_R_PLUS) o.max_ws = 16; /* its template indents the arguments by 12 */
    const char *name_key = cohere ? "tool_name" : "name";
    const char *args_key = f == KTC_LLAMA3 || cohere ? "parameters" : "arguments";
    int k = 0, idx = -1;
    put(&b, "tc-ws ::= [ \\t\\n]{0,16}\n"); /* Command R7B's template writes 10 in a row */
    gbuf alts = {0};
    for (tool_it it = {NULL, -1, NULL, NULL}; tool_next(tools, only, &it);) {
        const cJSON *fn = it.fn, *nm = it.nm;
        idx = it.idx;
        if ((st = add_args(&b, fn, k, idx, &o))) break;
        put(&alts, "%s", k ? " | " : "");
        if (f == KTC_APERTUS) { /* {"NAME": ARGS} */
            put(&alts, "\"{\" tc-ws ");
            put_json_name(&alts, nm->valuestring);
            put(&alts, " tc-ws \":\" tc-ws tc-a%d tc-ws \"}\"", k);
            k++;
            continue;
        }
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
        if (f == KTC_MINIMAX_M1) /* one a line, then the block's close */
            put(&b, "root ::= tc-ws tc-call (\"\\n\" tc-call)%s \"\\n</tool_calls>\"\n", parallel ? "*" : "{0}");
        else if (single) put(&b, "root ::= tc-ws tc-call\n");
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

/* ---- special-token formats ---- */

/* Each format's call and root as GBNF patterns: {{TEXT}} is the marker
 * TEXT (put_tok), %N the tool's name, %A its arguments' rule, %M the
 * repetition of further calls (* parallel, else {0}). */
typedef struct {
    ktc_format f;
    const char *call, *root;
} marker_fmt;

static const marker_fmt k_marker_fmts[] = {
    /* gpt-oss: NAME [<|channel|>commentary] [ [<|constrain|>]json]<|message|>ARGS<|call|>; one call a message */
    {KTC_HARMONY, "%N ({{<|channel|>}} \"commentary\")? ((\" \" {{<|constrain|>}}? | {{<|constrain|>}}) \"json\")? {{<|message|>}} %A {{<|call|>}}",
     "root ::= tc-call\n"},
    /* V3.1: NAME<sep>ARGS; R1 / V3: function<sep>NAME\n```json\nARGS\n``` (R1's template: a newline between calls) */
    {KTC_DEEPSEEK, "(%N {{<｜tool▁sep｜>}} %A | \"function\" {{<｜tool▁sep｜>}} %N \"\\n```json\\n\" %A \"\\n```\")",
     "tc-one ::= {{<｜tool▁call▁begin｜>}} tc-call {{<｜tool▁call▁end｜>}}\nroot ::= tc-one (\"\\n\"? tc-one)%M {{<｜tool▁calls▁end｜>}}\n"},
    {KTC_KIMI_K2, "\"functions.\" %N \":\" [0-9]{1,3} {{<|tool_call_argument_begin|>}} %A",
     "tc-one ::= {{<|tool_call_begin|>}} tc-call {{<|tool_call_end|>}}\nroot ::= tc-one tc-one%M {{<|tool_calls_section_end|>}}\n"},
    /* Mistral v11: NAME[CALL_ID]ID[ARGS]ARGS (the id optional), [TOOL_CALLS] before each next call */
    {KTC_MISTRAL_V11, "%N ({{[CALL_ID]}} [a-zA-Z0-9]{9})? {{[ARGS]}} %A", "root ::= tc-call ({{[TOOL_CALLS]}} tc-call)%M\n"},
    /* Solar Open: <|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>ARGS<|tool_call:end|>, then <|calls|> */
    {KTC_SOLAR, "[a-zA-Z0-9_-]{1,40} {{<|tool_call:name|>}} %N {{<|tool_call:args|>}} %A {{<|tool_call:end|>}}",
     "tc-one ::= {{<|tool_call:begin|>}} tc-call\nroot ::= tc-one tc-one%M {{<|calls|>}}\n"},
    /* functionary v3.1: NAME>ARGS</function>, <function= before each next call */
    {KTC_FUNCTIONARY31, "%N \">\" %A \"</function>\"", "root ::= tc-call (\"<function=\" tc-call)%M\n"},
    /* functionary v3.2: NAME\nARGS, >>> before each next call */
    {KTC_FUNCTIONARY32, "%N \"\\n\" %A", "root ::= tc-call (\">>>\" tc-call)%M\n"},
};

static void put_pattern(gbuf *b, const char *pat, const ktok *tok, const char *name, int k, bool parallel) {
    for (const char *c = pat; *c;) {
        const char *e;
        if (!strncmp(c, "{{", 2) && (e = strstr(c + 2, "}}"))) {
            char text[64];
            snprintf(text, sizeof text, "%.*s", (int)(e - c - 2), c + 2);
            put_tok(b, tok, text);
            c = e + 2;
        } else if (c[0] == '%' && (c[1] == 'N' || c[1] == 'A' || c[1] == 'M')) {
            if (c[1] == 'N') {
                put(b, "\"");
                put_lit(b, name);
                put(b, "\"");
            } else if (c[1] == 'A') put(b, "tc-a%d", k);
            else put(b, "%s", parallel ? "*" : "{0}");
            c += 2;
        } else {
            put(b, "%c", *c++);
        }
    }
}

static kiln_status marker_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, const ktok *tok,
                                  const kgr_opts *o, gbuf *b) {
    const marker_fmt *mf = NULL;
    for (size_t i = 0; i < sizeof k_marker_fmts / sizeof *k_marker_fmts; i++)
        if (k_marker_fmts[i].f == f) mf = &k_marker_fmts[i];
    if (!mf) return kiln_error(KILN_EUNSUPPORTED, "the %s tool-call format has no grammar", ktc_format_name(f));
    gbuf alts = {0};
    kiln_status st = NULL;
    int k = 0;
    for (tool_it it = {NULL, -1, NULL, NULL}; !st && tool_next(tools, only, &it); k++) {
        if ((st = add_args(b, it.fn, k, it.idx, o))) break;
        put(&alts, "%s", k ? " | " : "");
        put_pattern(&alts, mf->call, tok, it.nm->valuestring, k, parallel);
    }
    if (!st && k == 0) st = kiln_error(KILN_EINVAL, "\"tool_choice\": no tool to call");
    if (!st) {
        put(b, "tc-call ::= %s\n", alts.p ? alts.p : "");
        put_pattern(b, mf->root, tok, "", 0, parallel);
    }
    if (alts.oom) b->oom = true;
    free(alts.p);
    return st;
}

/* ---- XML formats ---- */

typedef struct {
    const char *head;              /* after the trigger, before the first call */
    const char *fn_open, *fn_mid;  /* fn_open NAME fn_mid */
    const char *key_open, *key_mid; /* key_open KEY key_mid VALUE */
    const char *val_close;          /* after the value (held out of raw text) */
    bool nl;                        /* the value between newlines (Qwen3-Coder) */
    const char *param_end;          /* after val_close */
    const char *fn_close;           /* after the parameters */
    const char *next;               /* between parallel calls ("" none: calls follow fn_close) */
    const char *block_close;        /* next "": after the last call */
    const char *key_mid_json;       /* DSML: key_mid of a value written as JSON (key_mid: of a raw string) */
    const char *fn_mid_rule;        /* GBNF after fn_mid (Kimi K3: the call's index), or NULL */
    bool close_key;                 /* MiniMax-M3: val_close KEY ">" */
    bool typed;                     /* Kimi K3: key_mid_json, the JSON type, "<|sep|> */
} xgram;

static const xgram k_xq3 = {"\n", "<function=", ">\n", "<parameter=", ">", "</parameter>", true, "\n", "</function>\n</tool_call>",
                            "\n<tool_call>\n", NULL, NULL, NULL, false, false};
static const xgram k_xseed = {"\n", "<function=", ">\n", "<parameter=", ">", "</parameter>", false, "\n",
                              "</function>\n</seed:tool_call>", "\n<seed:tool_call>\n", NULL, NULL, NULL, false, false};
static const xgram k_xmm = {"\n", "<invoke name=\"", "\">\n", "<parameter name=\"", "\">", "</parameter>", false, "\n",
                            "</invoke>\n", "", "</minimax:tool_call>", NULL, NULL, false, false};
static const xgram k_xdsml = {"\n", "<｜DSML｜invoke name=\"", "\">\n", "<｜DSML｜parameter name=\"", "\" string=\"true\">",
                              "</｜DSML｜parameter>", false, "\n", "</｜DSML｜invoke>\n", "", "</｜DSML｜function_calls>",
                              "\" string=\"false\">", NULL, false, false};
static const xgram k_xdsml4 = {"\n", "<｜DSML｜invoke name=\"", "\">\n", "<｜DSML｜parameter name=\"", "\" string=\"true\">",
                               "</｜DSML｜parameter>", false, "\n", "</｜DSML｜invoke>\n", "", "</｜DSML｜tool_calls>",
                               "\" string=\"false\">", NULL, false, false};
/* MiniCPM5: the trigger is the call's own start; calls one per line */
static const xgram k_xcpm = {"", "", "\">", "<param name=\"", "\">", "</param>", false, "", "</function>",
                             "\n<function name=\"", NULL, NULL, NULL, false, false};
static const xgram k_xhy3 = {"\n", "<tool_call:opensource>", "<tool_sep:opensource>\n", "<arg_key:opensource>",
                             "</arg_key:opensource>\n<arg_value:opensource>", "</arg_value:opensource>", false, "\n",
                             "</tool_call:opensource>\n", "", "</tool_calls:opensource>", NULL, NULL, false, false};
static const xgram k_xglm = {"", "", "\n", "<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>", false, "\n", "</tool_call>",
                             "\n<tool_call>", NULL, NULL, NULL, false, false};
static const xgram k_xatem = {"\n", "<atem:invoke name=\"", "\">\n", "<atem:parameter name=\"", "\">", "</atem:parameter>", false,
                              "\n", "</atem:invoke>\n", "", "</atem:function_calls>", NULL, NULL, false, false};
#define MM_NS "]<]minimax[>["
static const xgram k_xmm3 = {"\n", MM_NS "<invoke name=\"", "\">", MM_NS "<", ">", MM_NS "</", false, "", MM_NS "</invoke>\n", "",
                             MM_NS "</tool_call>", NULL, NULL, true, false};
static const xgram k_xk3 = {"", "<|open|>call tool=\"", "\" index=\"", "<|open|>argument key=\"", "\" type=\"string\"<|sep|>",
                            "<|close|>argument<|sep|>", false, "", "<|close|>call<|sep|>", "", "<|close|>tools<|sep|>",
                            "\" type=\"", " [0-9]{1,3} \"\\\"<|sep|>\"", false, true};

/* rule-0 .. rule-(m-1): text that holds no `stop` (no proper border, so
 * that text + stop first holds it at the end) from a state that has matched
 * q of its characters (code points: DSML's markers are not ASCII) */
static void put_cp(gbuf *b, uint32_t c) {
    if (c < 0x80) put(b, "\\x%02X", c);
    else put(b, "\\u%04X", c);
}

static kiln_status put_not_containing(gbuf *b, const char *rule, const char *stop) {
    uint32_t cp[64];
    size_t m = 0;
    for (const unsigned char *q = (const unsigned char *)stop; *q && m < 64; m++) {
        unsigned c = *q++;
        int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
        if (c >= 0x80 && !more) return kiln_error(KILN_EINTERNAL, "tool grammar: a marker that is not UTF-8");
        uint32_t v = more ? c & (0x3Fu >> more) : c;
        for (int k = 0; k < more; k++) {
            if ((*q & 0xC0) != 0x80) return kiln_error(KILN_EINTERNAL, "tool grammar: a marker that is not UTF-8");
            v = v << 6 | (*q++ & 0x3F);
        }
        if (v > 0xFFFF) return kiln_error(KILN_EINTERNAL, "tool grammar: a marker beyond the BMP");
        cp[m] = v;
    }
    for (size_t l = 1; l < m; l++)
        if (!memcmp(cp, cp + m - l, l * sizeof *cp)) return kiln_error(KILN_EINTERNAL, "tool grammar: a marker with a border");
    uint32_t c0 = cp[0];
    for (size_t q = 0; q < m; q++) {
        uint32_t c = cp[q];
        put(b, "%s-%zu ::= (", rule, q);
        if (q + 1 < m) {
            put(b, "[");
            put_cp(b, c);
            put(b, "] %s-%zu | ", rule, q + 1);
        }
        if (c != c0) {
            put(b, "[");
            put_cp(b, c0);
            put(b, "] %s-1 | [^", rule);
            put_cp(b, c);
            put_cp(b, c0);
            put(b, "] %s-0)?\n", rule);
        } else {
            put(b, "[^");
            put_cp(b, c);
            put(b, "] %s-0)?\n", rule);
        }
    }
    return NULL;
}

static bool is_string_type(const cJSON *sch) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(sch, "type");
    return cJSON_IsString(ty) && !strcmp(ty->valuestring, "string");
}

static bool annotation(const char *k) {
    static const char *const a[] = {"description", "title", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"};
    for (size_t i = 0; i < sizeof a / sizeof *a; i++)
        if (!strcmp(k, a[i])) return true;
    return false;
}

/* Rule `rule` for a "string" parameter's raw text: enum/const values,
 * minLength/maxLength (then without '<'), or any text without val_close. */
static kiln_status put_raw_string(gbuf *b, const cJSON *sch, const char *rule, const xgram *x, bool *any_text) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(sch, "enum"), *c = cJSON_GetObjectItemCaseSensitive(sch, "const");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(sch, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(sch, "maxLength");
    const cJSON *kw;
    cJSON_ArrayForEach(kw, sch) {
        const char *k = kw->string;
        if (!strcmp(k, "type") || !strcmp(k, "enum") || !strcmp(k, "const") || !strcmp(k, "minLength") ||
            !strcmp(k, "maxLength") || annotation(k))
            continue;
        return kiln_error(KILN_EUNSUPPORTED, "\"%s\" of a string parameter: not supported in this XML tool-call format", k);
    }
    if (e || c) {
        put(b, "%s ::= ", rule);
        int n = 0;
        for (const cJSON *v = e ? e->child : c; v; v = e ? v->next : NULL) {
            if (!cJSON_IsString(v) || strstr(v->valuestring, x->val_close))
                return kiln_error(KILN_EUNSUPPORTED, "an enum of a string parameter holds a value this XML format cannot write");
            put(b, "%s\"", n++ ? " | " : "");
            put_lit(b, v->valuestring);
            put(b, "\"");
        }
        if (!n) return kiln_error(KILN_EINVAL, "an empty enum");
        put(b, "\n");
        return NULL;
    }
    if (mn || mx) {
        double lo = cJSON_IsNumber(mn) ? mn->valuedouble : 0, hi = cJSON_IsNumber(mx) ? mx->valuedouble : -1;
        if (lo < 0 || lo > 100000 || hi > 100000 || (hi >= 0 && hi < lo))
            return kiln_error(KILN_EUNSUPPORTED, "minLength/maxLength of a string parameter out of range");
        /* (without the format's own newlines round the value, the parser
         * strips one at either end: none then, or the length would change) */
        const char *cls = x->nl ? "[^<]" : "[^<\\n]";
        if (hi >= 0) put(b, "%s ::= %s{%d,%d}\n", rule, cls, (int)lo, (int)hi);
        else put(b, "%s ::= %s{%d,}\n", rule, cls, (int)lo);
        return NULL;
    }
    *any_text = true;
    put(b, "%s ::= tc-raw-0\n", rule);
    return NULL;
}

/* Rule `rule` for property pr of schema: its schema's GBNF, with the
 * root's definitions for its refs. */
static kiln_status put_prop_schema(gbuf *b, const cJSON *schema, const cJSON *pr, const char *prefix, const char *rule,
                                   const kgr_opts *o) {
    cJSON *sub = cJSON_Duplicate(pr, true);
    const char *defs[] = {"$defs", "definitions"};
    for (int d = 0; sub && d < 2; d++) {
        const cJSON *dv = cJSON_GetObjectItemCaseSensitive(schema, defs[d]);
        if (dv && !cJSON_GetObjectItemCaseSensitive(sub, defs[d])) cJSON_AddItemToObject(sub, defs[d], cJSON_Duplicate(dv, true));
    }
    kiln_status st = sub ? put_schema_rule(b, sub, prefix, rule, o) : kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_Delete(sub);
    return st;
}

/* tool k's parameter j: its value's rule, and the prefix of the rules under it (48 bytes each) */
static void prop_rule_names(char *rule, char *prefix, int k, int j) {
    snprintf(rule, 48, "tc-v%d-%d", k, j);
    snprintf(prefix, 48, "tc%d-%d-", k, j);
}

static bool is_required(const cJSON *req, const char *name) {
    const cJSON *r;
    cJSON_ArrayForEach(r, req) if (cJSON_IsString(r) && !strcmp(r->valuestring, name)) return true;
    return false;
}

/* tc-pK ::= the parameters' sequence (consumed); st passed through */
static kiln_status end_params(gbuf *b, int k, gbuf *seq, kiln_status st) {
    if (!st) put(b, "tc-p%d ::= \"\"%s\n", k, seq->p ? seq->p : "");
    if (seq->oom) b->oom = true;
    free(seq->p);
    return st;
}

/* Rule tc-pK for tool K's parameters, in the schema's order (required ones
 * once, the others optional), each value raw or JSON as the parser reads it. */
static kiln_status xml_params(gbuf *b, const cJSON *schema, int k, const xgram *x, const kgr_opts *o, bool *any_text) {
    const cJSON *kw;
    cJSON_ArrayForEach(kw, schema) {
        const char *n = kw->string;
        if (!strcmp(n, "type") || !strcmp(n, "properties") || !strcmp(n, "required") || !strcmp(n, "$defs") ||
            !strcmp(n, "definitions") || !strcmp(n, "$schema") || !strcmp(n, "strict") || annotation(n) ||
            (!strcmp(n, "additionalProperties") && cJSON_IsFalse(kw)))
            continue;
        return kiln_error(KILN_EUNSUPPORTED, "unsupported keyword '%s' at # (in this XML tool-call format)", n);
    }
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(schema, "required");
    gbuf seq = {0};
    int j = 0;
    kiln_status st = NULL;
    const cJSON *pr;
    cJSON_ArrayForEach(pr, props) {
        char rule[48], prefix[48];
        prop_rule_names(rule, prefix, k, j);
        if (is_string_type(pr)) st = put_raw_string(b, pr, rule, x, any_text);
        else st = put_prop_schema(b, schema, pr, prefix, rule, o);
        if (st) {
            st = kiln_status_wrap(st, "properties.%s", pr->string);
            break;
        }
        bool required = is_required(req, pr->string);
        put(&seq, " (\"");
        put_lit(&seq, x->key_open);
        put_lit(&seq, pr->string);
        const char *mid = x->key_mid_json && !is_string_type(pr) ? x->key_mid_json : x->key_mid;
        if (x->typed && mid == x->key_mid_json) { /* Kimi K3 names the value's JSON type */
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pr, "type");
            const char *tn = !cJSON_IsString(ty) ? "object" : !strcmp(ty->valuestring, "integer") ? "number" : ty->valuestring;
            put_lit(&seq, mid);
            put_lit(&seq, tn);
            put_lit(&seq, "\"<|sep|>");
        } else put_lit(&seq, mid);
        if (x->nl) put_lit(&seq, "\n");
        put(&seq, "\" %s \"", rule);
        if (x->nl) put_lit(&seq, "\n");
        put_lit(&seq, x->val_close);
        if (x->close_key) put_lit(&seq, pr->string), put_lit(&seq, ">");
        put_lit(&seq, x->param_end);
        put(&seq, "\")%s", required ? "" : "?");
        j++;
    }
    return end_params(b, k, &seq, st);
}

static kiln_status xml_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, const kgr_opts *o, gbuf *b) {
    const xgram *x = f == KTC_QWEN3_CODER ? &k_xq3 : f == KTC_SEED_OSS ? &k_xseed : f == KTC_MINIMAX_M2 ? &k_xmm
                     : f == KTC_DSML ? &k_xdsml : f == KTC_DSML_V4 ? &k_xdsml4 : f == KTC_MINICPM5 ? &k_xcpm
                     : f == KTC_HY3 ? &k_xhy3 : f == KTC_MINIMAX_M3 ? &k_xmm3 : f == KTC_KIMI_K3 ? &k_xk3
                     : f == KTC_MUSE_GLIMMER ? &k_xatem : &k_xglm;
    gbuf alts = {0};
    int k = 0, idx = -1;
    bool any_text = false;
    kiln_status st = NULL;
    for (tool_it it = {NULL, -1, NULL, NULL}; tool_next(tools, only, &it);) {
        const cJSON *fn = it.fn, *nm = it.nm;
        idx = it.idx;
        const cJSON *pa = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        gbuf tmp = {0};
        bool tmp_any = false;
        st = cJSON_IsObject(pa) ? xml_params(&tmp, pa, k, x, o, &tmp_any) : NULL;
        if (!cJSON_IsObject(pa)) put(&tmp, "tc-p%d ::= \"\"\n", k);
        if (st && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"))) {
            free(tmp.p);
            st = kiln_status_wrap(st, "\"tools\"[%d].function.parameters", idx);
            break;
        }
        if (st) { /* not strict: any parameters, raw */
            kiln_status_free(st);
            st = NULL;
            free(tmp.p);
            tmp = (gbuf){0};
            put(&tmp, "tc-p%d ::= (\"", k);
            put_lit(&tmp, x->key_open);
            put(&tmp, "\" [^<>\"\\n]+ \"");
            put_lit(&tmp, x->key_mid);
            put(&tmp, "\" tc-raw-0 \"");
            put_lit(&tmp, x->val_close);
            if (x->close_key) put(&tmp, "\" [^<>\"\\n]+ \">");
            put_lit(&tmp, x->param_end);
            put(&tmp, "\")*\n");
            tmp_any = true;
        }
        any_text |= tmp_any;
        put(b, "%s", tmp.p ? tmp.p : "");
        free(tmp.p);
        put(&alts, "%s\"", k ? " | " : "");
        put_lit(&alts, x->fn_open);
        put_lit(&alts, nm->valuestring);
        put_lit(&alts, x->fn_mid);
        put(&alts, "\"%s tc-p%d", x->fn_mid_rule ? x->fn_mid_rule : "", k);
        k++;
    }
    if (!st && k == 0) st = kiln_error(KILN_EINVAL, "\"tool_choice\": no tool to call");
    if (!st && any_text) st = put_not_containing(b, "tc-raw", x->val_close);
    if (!st) {
        put(b, "tc-call ::= %s\n", alts.p ? alts.p : "");
        const char *more = parallel ? "*" : "{0}";
        put(b, "tc-one ::= tc-call \"");
        put_lit(b, x->fn_close);
        put(b, "\"\nroot ::= \"");
        put_lit(b, x->head);
        if (*x->next) {
            put(b, "\" tc-one (\"");
            put_lit(b, x->next);
            put(b, "\" tc-one)%s\n", more);
        } else { /* MiniMax, DSML: calls one after another, then the block's end */
            put(b, "\" tc-one tc-one%s \"", more);
            put_lit(b, x->block_close);
            put(b, "\"\n");
        }
    }
    if (alts.oom) b->oom = true;
    free(alts.p);
    return st;
}

/* ---- pythonic formats (LFM2, Gemma 4) ---- */

/* LFM2: [NAME(k=V, ..), ..]<|tool_call_end|>; Gemma 4: call:NAME{k:V,..}
 * <tool_call|> (<|tool_call> before each next call). Parameters in the
 * schema's order (required ones once, the others optional; a separator
 * before all but the first, which the parsers take either way); a "string"
 * one quoted (LFM2 '..' with \ escapes, Gemma 4 <|"|>..<|"|>), an enum's
 * values as alternatives; another as its JSON, which both parsers read. */
/* A "string" parameter without an enum: any quoted string (tc-str), or
 * with minLength/maxLength that many characters (LFM2: an escape is one;
 * Gemma 4: no '<', so that the delimiter cannot start inside). Another
 * keyword (format, pattern, ..) of a strict tool is refused, as the XML
 * formats refuse it, and not checked in a tool that is not strict. */
static kiln_status lit_string(gbuf *b, const cJSON *sch, const char *rule, bool gemma, bool dq, bool strict) {
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(sch, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(sch, "maxLength");
    const cJSON *kw;
    cJSON_ArrayForEach(kw, sch) {
        const char *k = kw->string;
        if (strcmp(k, "type") && strcmp(k, "minLength") && strcmp(k, "maxLength") && !annotation(k) && strict)
            return kiln_error(KILN_EUNSUPPORTED, "\"%s\" of a string parameter: not supported in this tool-call format", k);
    }
    if (!mn && !mx) {
        put(b, "%s ::= tc-str\n", rule);
        return NULL;
    }
    double lo = cJSON_IsNumber(mn) ? mn->valuedouble : 0, hi = cJSON_IsNumber(mx) ? mx->valuedouble : -1;
    if (lo < 0 || lo > 100000 || hi > 100000 || (hi >= 0 && hi < lo))
        return kiln_error(KILN_EUNSUPPORTED, "minLength/maxLength of a string parameter out of range");
    const char *q = gemma ? "\"<|\\\"|>\"" : dq ? "\"\\\"\"" : "\"'\"";
    const char *ch = gemma ? "[^<]" : dq ? "([^\"\\\\\\n] | \"\\\\\" [nt\"\\\\])" : "([^'\\\\\\n] | \"\\\\\" [nt'\\\\])";
    if (hi >= 0) put(b, "%s ::= %s %s{%d,%d} %s\n", rule, q, ch, (int)lo, (int)hi, q);
    else put(b, "%s ::= %s %s{%d,} %s\n", rule, q, ch, (int)lo, q);
    return NULL;
}

static kiln_status lit_params(gbuf *b, const cJSON *fn, int k, bool gemma, bool dq, const kgr_opts *o) {
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(schema, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(schema, "required");
    bool strict = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(fn, "strict"));
    kiln_status st = NULL;
    gbuf seq = {0};
    int j = 0;
    for (const cJSON *pr = props ? props->child : NULL; pr; pr = pr->next) {
        char rule[48], prefix[48];
        prop_rule_names(rule, prefix, k, j);
        const cJSON *en = cJSON_GetObjectItemCaseSensitive(pr, "enum");
        if (is_string_type(pr) && cJSON_IsArray(en) && cJSON_GetArraySize(en) > 0) {
            put(b, "%s ::= ", rule);
            int n = 0;
            const cJSON *v;
            cJSON_ArrayForEach(v, en) {
                if (!cJSON_IsString(v) || strpbrk(v->valuestring, dq ? "\"\\\n" : "'\\\n") || strstr(v->valuestring, "<|\"|>")) {
                    st = kiln_error(KILN_EUNSUPPORTED, "an enum value this tool-call format cannot quote");
                    break;
                }
                put(b, "%s\"", n++ ? " | " : "");
                put_lit(b, gemma ? "<|\"|>" : dq ? "\"" : "'");
                put_lit(b, v->valuestring);
                put_lit(b, gemma ? "<|\"|>" : dq ? "\"" : "'");
                put(b, "\"");
            }
            put(b, "\n");
        } else if (is_string_type(pr)) {
            st = lit_string(b, pr, rule, gemma, dq, strict);
        } else { /* the property's schema, with the root's definitions for its refs */
            gbuf tmp = {0};
            st = put_prop_schema(&tmp, schema, pr, prefix, rule, o);
            if (st && !strict) { /* not strict: any JSON value */
                kiln_status_free(st);
                free(tmp.p);
                tmp = (gbuf){0};
                cJSON *any = cJSON_CreateObject();
                st = any ? put_schema_rule(&tmp, any, prefix, rule, o) : kiln_error(KILN_ENOMEM, "out of memory");
                cJSON_Delete(any);
            }
            put(b, "%s", tmp.p ? tmp.p : "");
            free(tmp.p);
        }
        if (st) {
            st = kiln_status_wrap(st, "properties.%s", pr->string);
            break;
        }
        bool required = is_required(req, pr->string);
        put(&seq, " (\"");
        if (j) put_lit(&seq, gemma ? "," : ", ");
        put_lit(&seq, pr->string);
        put_lit(&seq, gemma ? ":" : "=");
        put(&seq, "\" %s)%s", rule, required ? "" : "?");
        j++;
    }
    return end_params(b, k, &seq, st);
}

static kiln_status lit_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, const kgr_opts *o, gbuf *b) {
    bool gemma = f == KTC_GEMMA4, dq = f == KTC_PYTHONIC; /* Llama 4's calls quote with " (its prompt's examples) */
    gbuf alts = {0};
    kiln_status st = NULL;
    int k = 0;
    for (tool_it it = {NULL, -1, NULL, NULL}; !st && tool_next(tools, only, &it); k++) {
        if ((st = lit_params(b, it.fn, k, gemma, dq, o))) {
            st = kiln_status_wrap(st, "\"tools\"[%d].function.parameters", it.idx);
            break;
        }
        put(&alts, "%s\"%s", k ? " | " : "", gemma ? "call:" : "");
        put_lit(&alts, it.nm->valuestring);
        put(&alts, "%s\" tc-p%d \"%s\"", gemma ? "{" : "(", k, gemma ? "}" : ")");
    }
    if (!st && k == 0) st = kiln_error(KILN_EINVAL, "\"tool_choice\": no tool to call");
    if (!st && gemma) {
        st = put_not_containing(b, "tc-gs", "<|\"|>");
        put(b, "tc-str ::= \"<|\\\"|>\" tc-gs-0 \"<|\\\"|>\"\n");
    } else if (!st && dq) {
        put(b, "tc-str ::= \"\\\"\" ([^\"\\\\\\n] | \"\\\\\" [nt\"\\\\])* \"\\\"\"\n");
    } else if (!st) {
        put(b, "tc-str ::= \"'\" ([^'\\\\\\n] | \"\\\\\" [nt'\\\\])* \"'\"\n");
    }
    if (!st) {
        put(b, "tc-call ::= %s\n", alts.p ? alts.p : "");
        const char *more = parallel ? "*" : "{0}";
        if (gemma) put(b, "root ::= tc-call \"<tool_call|>\" (\"<|tool_call>\" tc-call \"<tool_call|>\")%s\n", more);
        else if (dq) put(b, "root ::= tc-call (\", \" tc-call)%s \"]\"\n", more); /* (after the prompt's "[") */
        else put(b, "root ::= \"[\" tc-call (\", \" tc-call)%s \"]<|tool_call_end|>\"\n", more);
    }
    if (alts.oom) b->oom = true;
    free(alts.p);
    return st;
}

kiln_status ktc_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, const ktok *tok, char **gbnf) {
    *gbnf = NULL;
    if (!ktc_grammar_supported(f))
        return kiln_error(KILN_EUNSUPPORTED, "the %s tool-call format has no grammar", ktc_format_name(f));
    bool json = f == KTC_HERMES || f == KTC_LLAMA3 || f == KTC_MISTRAL || f == KTC_GRANITE || f == KTC_COMMAND_R ||
                f == KTC_PHI4 || f == KTC_COMMAND_R_PLUS || f == KTC_FIREFUNCTION || f == KTC_APRIEL || f == KTC_MINIMAX_M1 ||
                f == KTC_NEMOTRON_V2 || f == KTC_GIGACHAT3 || f == KTC_GIGACHAT31 || f == KTC_APERTUS;
    if (json) return json_grammar(f, tools, only, parallel, gbnf);
    kgr_opts o;
    kgr_opts_default(&o);
    o.additional_properties = false; /* as the JSON formats' */
    gbuf b = {0};
    bool xml = f == KTC_QWEN3_CODER || f == KTC_SEED_OSS || f == KTC_MINIMAX_M2 || f == KTC_GLM45 || f == KTC_DSML || f == KTC_DSML_V4 ||
               f == KTC_MINICPM5 || f == KTC_HY3 || f == KTC_MINIMAX_M3 || f == KTC_KIMI_K3 || f == KTC_MUSE_GLIMMER;
    kiln_status st = xml                                 ? xml_grammar(f, tools, only, parallel, &o, &b)
                     : f == KTC_LFM2 || f == KTC_GEMMA4 || f == KTC_PYTHONIC ? lit_grammar(f, tools, only, parallel, &o, &b)
                                                        : marker_grammar(f, tools, only, parallel, tok, &o, &b);
    if (!st && b.oom) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (st) {
        free(b.p);
        return st;
    }
    *gbnf = b.p;
    return NULL;
}

/* A forced call after a thinking block the prompt opened: the grammar is
 * switched on at the block's close (the lazy trigger), so it takes a few
 * blanks, the format's trigger (the special token when tok has it as one)
 * and then gbnf's calls (its root renamed). */
kiln_status ktc_grammar_after_think(ktc_format f, const char *gbnf, const ktok *tok, char **out) {
    *out = NULL;
    const char *tr = ktc_trigger(f);
    if (!tr || !gbnf) return kiln_error(KILN_EINVAL, "the %s tool-call format has no trigger", ktc_format_name(f));
    gbuf b = {0};
    size_t roots = 0;
    for (const char *l = gbnf; *l;) { /* each line; the root rule's name changes */
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) + 1 : strlen(l);
        if (!strncmp(l, "root ::=", 8)) {
            put(&b, "tc-calls ::=");
            l += 8, n -= 8;
            roots++;
        }
        put(&b, "%.*s", (int)n, l);
        l += n;
    }
    if (roots != 1) {
        free(b.p);
        return kiln_error(KILN_EINVAL, "the %s tool-call grammar has %zu root rules", ktc_format_name(f), roots);
    }
    if (b.n && b.p[b.n - 1] != '\n') put(&b, "\n");
    put(&b, "root ::= [ \\t\\r\\n]{0,4}");
    put_tok(&b, tok, tr);
    put(&b, "tc-calls\n");
    if (b.oom) {
        free(b.p);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    *out = b.p;
    return NULL;
}
