/* constrain.c: the constraint flags and request fields, all compiled to
 * GBNF in params.grammar (checked here, so a bad grammar is a 400 naming its
 * field), and the per-sequence mask (kgen_session uses it). */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "gen/params.h"
#include "grammar/grammar.h"

static kiln_status set(kgen_params *p, char *gbnf, const char *field) {
    kgr_grammar *g;
    kiln_status st = kgr_from_gbnf(gbnf, strlen(gbnf), &g);
    if (st) {
        free(gbnf);
        return kiln_status_wrap(st, "\"%s\"", field);
    }
    kgr_grammar_free(g);
    free(p->grammar);
    p->grammar = gbnf;
    return NULL;
}

static kiln_status from_schema(kgen_params *p, const cJSON *schema, const char *field) {
    cJSON *parsed = NULL;
    if (cJSON_IsString(schema)) { /* vLLM takes the schema as text too */
        parsed = cJSON_Parse(schema->valuestring);
        if (!parsed) return kiln_error(KILN_EINVAL, "\"%s\": the schema is not valid JSON", field);
        schema = parsed;
    }
    char *g;
    kiln_status st = kgr_schema_to_gbnf(schema, NULL, NULL, &g);
    cJSON_Delete(parsed);
    if (st) return kiln_status_wrap(st, "\"%s\"", field);
    return set(p, g, field);
}

static kiln_status from_regex(kgen_params *p, const char *re, const char *field) {
    char *b;
    kiln_status st = kgr_regex_to_gbnf(re, false, &b);
    if (st) return kiln_status_wrap(st, "\"%s\"", field);
    size_t n = strlen(b) + 16;
    char *g = malloc(n);
    if (!g) {
        free(b);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    snprintf(g, n, "root ::= %s\n", b);
    free(b);
    return set(p, g, field);
}

static kiln_status from_choices(kgen_params *p, const cJSON *list, const char *field) {
    if (!cJSON_IsArray(list) || !list->child) return kiln_error(KILN_EINVAL, "\"%s\": expected a non-empty array of strings", field);
    int n = cJSON_GetArraySize(list), k = 0;
    const char **v = malloc(sizeof *v * (size_t)n);
    if (!v) return kiln_error(KILN_ENOMEM, "out of memory");
    for (const cJSON *e = list->child; e; e = e->next) {
        if (!cJSON_IsString(e)) {
            free(v);
            return kiln_error(KILN_EINVAL, "\"%s\": expected a non-empty array of strings", field);
        }
        v[k++] = e->valuestring;
    }
    /* as GBNF alternatives of literals */
    size_t cap = 16;
    for (int i = 0; i < n; i++) cap += strlen(v[i]) * 4 + 8;
    char *g = malloc(cap);
    if (!g) {
        free(v);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    size_t o = (size_t)snprintf(g, cap, "root ::= ");
    for (int i = 0; i < n; i++) {
        o += (size_t)snprintf(g + o, cap - o, "%s\"", i ? " | " : "");
        for (const unsigned char *c = (const unsigned char *)v[i]; *c; c++) {
            if (*c == '"' || *c == '\\') o += (size_t)snprintf(g + o, cap - o, "\\%c", *c);
            else if (*c < 0x20) o += (size_t)snprintf(g + o, cap - o, "\\x%02X", *c);
            else g[o++] = (char)*c;
        }
        g[o++] = '"';
        g[o] = 0;
    }
    snprintf(g + o, cap - o, "\n");
    free(v);
    return set(p, g, field);
}

static kiln_status from_string(kgen_params *p, const cJSON *v, const char *field,
                               kiln_status (*f)(kgen_params *, const char *, const char *)) {
    if (!cJSON_IsString(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected a string", field);
    return f(p, v->valuestring, field);
}

static kiln_status gbnf_text(kgen_params *p, const char *text, const char *field) {
    char *g = strdup(text);
    if (!g) return kiln_error(KILN_ENOMEM, "out of memory");
    return set(p, g, field);
}

static const cJSON *field(const cJSON *b, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static kiln_status response_format(kgen_params *p, const cJSON *rf) {
    const char *F = "response_format";
    if (!cJSON_IsObject(rf)) return kiln_error(KILN_EINVAL, "\"%s\": expected an object", F);
    const cJSON *t = field(rf, "type");
    if (!cJSON_IsString(t)) return kiln_error(KILN_EINVAL, "\"%s\": \"type\" must be text, json_object or json_schema", F);
    if (!strcmp(t->valuestring, "text")) return NULL;
    if (!strcmp(t->valuestring, "json_object")) {
        const cJSON *s = field(rf, "schema"); /* llama-server's extension */
        if (s) return from_schema(p, s, F);
        cJSON *o = cJSON_Parse("{\"type\": \"object\"}");
        kiln_status st = from_schema(p, o, F);
        cJSON_Delete(o);
        return st;
    }
    if (!strcmp(t->valuestring, "json_schema")) {
        const cJSON *js = field(rf, "json_schema");
        const cJSON *s = js ? field(js, "schema") : field(rf, "schema");
        if (!s) return kiln_error(KILN_EINVAL, "\"%s\": json_schema.schema is required", F);
        return from_schema(p, s, F);
    }
    return kiln_error(KILN_EINVAL, "\"%s\": unknown type \"%s\" (text, json_object or json_schema)", F, t->valuestring);
}

kiln_status kgen_grammar_from_json(kgen_params *p, const cJSON *b) {
    static const char *const names[] = {"response_format", "json_schema",  "grammar",      "structured_outputs",
                                        "guided_json",     "guided_regex", "guided_choice", "guided_grammar"};
    const char *given = NULL;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const cJSON *v = field(b, names[i]);
        if (!v) continue;
        if (!strcmp(names[i], "response_format") && cJSON_IsObject(v) && cJSON_IsString(field(v, "type")) &&
            !strcmp(field(v, "type")->valuestring, "text"))
            continue;
        if (given)
            return kiln_error(KILN_EINVAL, "\"%s\": only one constraint may be given (also \"%s\")", names[i], given);
        given = names[i];
    }
    if (!given) return NULL;
    const cJSON *v = field(b, given);
    if (!strcmp(given, "response_format")) return response_format(p, v);
    if (!strcmp(given, "json_schema") || !strcmp(given, "guided_json")) return from_schema(p, v, given);
    if (!strcmp(given, "grammar") || !strcmp(given, "guided_grammar")) return from_string(p, v, given, gbnf_text);
    if (!strcmp(given, "guided_regex")) return from_string(p, v, given, from_regex);
    if (!strcmp(given, "guided_choice")) return from_choices(p, v, given);
    /* vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object */
    const char *F = "structured_outputs";
    if (!cJSON_IsObject(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected an object", F);
    if (field(v, "json")) return from_schema(p, field(v, "json"), F);
    if (field(v, "regex")) return from_string(p, field(v, "regex"), F, from_regex);
    if (field(v, "choice")) return from_choices(p, field(v, "choice"), F);
    if (field(v, "grammar")) return from_string(p, field(v, "grammar"), F, gbnf_text);
    if (cJSON_IsTrue(field(v, "json_object"))) {
        cJSON *o = cJSON_Parse("{\"type\": \"object\"}");
        kiln_status st = from_schema(p, o, F);
        cJSON_Delete(o);
        return st;
    }
    return kiln_error(KILN_EINVAL, "\"%s\": expected one of json, regex, choice, grammar, json_object", F);
}

kiln_status kgen_grammar_flag(kgen_params *p, int argc, char **argv, int *i, bool *consumed) {
    *consumed = false;
    static const char *const flags[] = {"--grammar", "--grammar-file", "--json-schema", "--json-schema-file", "--regex"};
    const char *a = argv[*i];
    int f = -1;
    for (int k = 0; k < 5; k++)
        if (!strcmp(a, flags[k])) f = k;
    if (f < 0) return NULL;
    *consumed = true;
    if (*i + 1 >= argc) return kiln_error(KILN_EINVAL, "%s: missing value", a);
    const char *v = argv[*i + 1];
    *i += 2;
    char *text = NULL;
    size_t len;
    if (f == 1 || f == 3) {
        KILN_TRY(ku_read_file(v, &text, &len));
        v = text;
    }
    kiln_status st;
    if (f <= 1) st = gbnf_text(p, v, a);
    else if (f == 4) st = from_regex(p, v, a);
    else {
        cJSON *j = cJSON_Parse(v);
        st = j ? from_schema(p, j, a) : kiln_error(KILN_EINVAL, "%s: not valid JSON", a);
        cJSON_Delete(j);
    }
    free(text);
    return st;
}

void kgen_grammar_print_flags(FILE *out) {
    fprintf(out, "  %-34s %s\n", "--grammar GBNF", "constrain the output to a GBNF grammar (llama.cpp's format)");
    fprintf(out, "  %-34s %s\n", "--grammar-file FILE", "  the same, read from a file");
    fprintf(out, "  %-34s %s\n", "--json-schema SCHEMA", "constrain the output to JSON that the schema accepts");
    fprintf(out, "  %-34s %s\n", "--json-schema-file FILE", "  the same, read from a file");
    fprintf(out, "  %-34s %s\n", "--regex RE", "constrain the output to match the regular expression whole");
}
