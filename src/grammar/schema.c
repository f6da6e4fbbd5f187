/* schema.c: JSON Schema to GBNF, after llama.cpp's json-schema-to-grammar
 * (common/json-schema-to-grammar.cpp) with these choices:
 *  - a schema without "type" accepts every type, each constrained by the
 *    keywords that apply to it (the spec's semantics);
 *  - properties come in the schema's order (required ones mandatory);
 *    additional properties come after the listed ones, with keys that differ
 *    from every listed name; without additionalProperties they are allowed
 *    (the spec's default; opts.additional_properties = false refuses them);
 *  - whitespace runs are bounded (opts.max_ws);
 *  - integer bounds are exact digit automata; number bounds where they are
 *    integers; string formats as grammars (unknown formats are annotations);
 *  - a validation keyword it cannot honour is an error naming the keyword
 *    and its JSON pointer, never ignored. Unknown keywords are annotations. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gr_int.h"

#define MAX_DEPTH 128
#define MAX_REPEAT 100000

typedef struct memo {
    const cJSON *node;
    char name[48];
    struct memo *next;
} memo;

typedef struct {
    const cJSON *root;
    kgr_opts o;
    const char *prefix;
    kgr_buf out;
    int32_t n;
    memo *memo;
    cJSON **owned; /* merged schemas */
    int32_t n_owned, cap_owned;
    int depth;
    char err[1024];
    unsigned prims; /* bit per primitive emitted */
    bool ref_only;  /* drafts 3 to 7: keywords beside $ref are ignored */
} sc;

static bool fail(sc *c, const char *ptr, const char *fmt, ...) KILN_PRINTF(3, 4);
static bool fail(sc *c, const char *ptr, const char *fmt, ...) {
    if (!c->err[0]) {
        char m[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        snprintf(c->err, sizeof c->err, "json schema: %s at %.500s", m, ptr[0] ? ptr : "#");
    }
    return false;
}

static void rule(sc *c, const char *name, const char *body) {
    kgr_buf_printf(&c->out, "%s ::= ", name);
    kgr_buf_puts(&c->out, body);
    kgr_buf_puts(&c->out, "\n");
}

static void fresh(sc *c, char *name) { snprintf(name, 48, "%sr%d", c->prefix, c->n++); }

/* ---- primitives ---- */
enum { P_WS, P_VALUE, P_STRING, P_NUMBER, P_INTEGER, P_CHAR, P_BOOL, P_NULL, P_OBJECT, P_ARRAY, P_COUNT };
static const char *pname[P_COUNT] = {"ws", "value", "string", "number", "integer", "char", "boolean", "null", "object", "array"};

static const char *prim(sc *c, int p, char *buf) {
    snprintf(buf, 48, "%s%s", c->prefix, pname[p]);
    if (c->prims & (1u << p)) return buf;
    c->prims |= 1u << p;
    char a[48], b[48], d[48];
    kgr_buf body = {0};
    switch (p) {
    case P_WS:
        if (c->o.compact || c->o.max_ws <= 0) kgr_buf_puts(&body, "\"\"");
        else kgr_buf_printf(&body, "[ \\t\\n\\r]{0,%d}", c->o.max_ws);
        break;
    case P_CHAR: kgr_buf_puts(&body, "[^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})"); break;
    case P_STRING: kgr_buf_printf(&body, "\"\\\"\" %s* \"\\\"\"", prim(c, P_CHAR, a)); break;
    case P_INTEGER: kgr_buf_puts(&body, "\"-\"? (\"0\" | [1-9] [0-9]*)"); break;
    case P_NUMBER: kgr_buf_puts(&body, "\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?"); break;
    case P_BOOL: kgr_buf_puts(&body, "\"true\" | \"false\""); break;
    case P_NULL: kgr_buf_puts(&body, "\"null\""); break;
    case P_VALUE:
        kgr_buf_printf(&body, "%s | ", prim(c, P_OBJECT, a));
        kgr_buf_printf(&body, "%s | ", prim(c, P_ARRAY, a));
        kgr_buf_printf(&body, "%s | ", prim(c, P_STRING, a));
        kgr_buf_printf(&body, "%s | \"true\" | \"false\" | \"null\"", prim(c, P_NUMBER, a));
        break;
    case P_OBJECT:
        prim(c, P_STRING, a);
        prim(c, P_WS, b);
        prim(c, P_VALUE, d);
        kgr_buf_printf(&body, "\"{\" %s (%s %s \":\" %s %s %s (\",\" %s %s %s \":\" %s %s %s)*)? \"}\"", b, a, b, b, d, b, b, a,
                       b, b, d, b);
        break;
    case P_ARRAY:
        prim(c, P_WS, b);
        prim(c, P_VALUE, d);
        kgr_buf_printf(&body, "\"[\" %s (%s %s (\",\" %s %s %s)*)? \"]\"", b, d, b, b, d, b);
        break;
    }
    snprintf(buf, 48, "%s%s", c->prefix, pname[p]);
    rule(c, buf, body.p ? body.p : "\"\"");
    free(body.p);
    return buf;
}

/* ---- JSON text as Python's json.dumps writes it ---- */
static void py_string(kgr_buf *b, const char *s) {
    kgr_buf_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': kgr_buf_puts(b, "\\\""); break;
        case '\\': kgr_buf_puts(b, "\\\\"); break;
        case '\n': kgr_buf_puts(b, "\\n"); break;
        case '\r': kgr_buf_puts(b, "\\r"); break;
        case '\t': kgr_buf_puts(b, "\\t"); break;
        case '\b': kgr_buf_puts(b, "\\b"); break;
        case '\f': kgr_buf_puts(b, "\\f"); break;
        default:
            if (*p < 0x20) kgr_buf_printf(b, "\\u%04x", *p);
            else kgr_buf_put(b, (const char *)p, 1);
        }
    }
    kgr_buf_puts(b, "\"");
}

static void py_number(kgr_buf *b, double v) {
    if (v == floor(v) && fabs(v) < 1e16) kgr_buf_printf(b, "%.0f", v);
    else kgr_buf_printf(b, "%.17g", v);
}

/* repr(float(v)): the shortest digits that read back as v, fixed notation
 * (at least one fraction digit) for decimal exponents -4..15, else d.ddde+XX */
static void py_float(kgr_buf *b, double v) {
    if (isinf(v)) {
        kgr_buf_puts(b, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char t[40];
    for (int p = 0; p < 17; p++) {
        snprintf(t, sizeof t, "%.*e", p, v);
        if (strtod(t, NULL) == v) break;
    }
    char *e = strchr(t, 'e');
    int ex = atoi(e + 1);
    *e = 0;
    char dig[24];
    int nd = 0;
    bool neg = t[0] == '-';
    for (const char *q = t; *q; q++)
        if (*q >= '0' && *q <= '9') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) kgr_buf_puts(b, "-");
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            kgr_buf_puts(b, "0.");
            for (int i = -1; i > ex; i--) kgr_buf_puts(b, "0");
            kgr_buf_put(b, dig, (size_t)nd);
        } else {
            for (int i = 0; i <= ex; i++) kgr_buf_put(b, i < nd ? &dig[i] : "0", 1);
            kgr_buf_puts(b, ".");
            if (nd > ex + 1) kgr_buf_put(b, dig + ex + 1, (size_t)(nd - ex - 1));
            else kgr_buf_puts(b, "0");
        }
    } else {
        kgr_buf_put(b, dig, 1);
        if (nd > 1) kgr_buf_puts(b, "."), kgr_buf_put(b, dig + 1, (size_t)(nd - 1));
        kgr_buf_printf(b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

/* a number node's source text, when known: Python reads a literal with a
 * fraction or exponent as a float (repr), else as an exact int */
typedef struct {
    const char *(*lit)(void *ud, const cJSON *n, size_t *len);
    void *ud;
} py_lits;

static void py_lit_number(kgr_buf *b, const cJSON *v, const py_lits *L) {
    size_t n = 0;
    const char *s = L ? L->lit(L->ud, v, &n) : NULL;
    if (!s) {
        py_number(b, v->valuedouble);
        return;
    }
    if (memchr(s, '.', n) || memchr(s, 'e', n) || memchr(s, 'E', n)) py_float(b, v->valuedouble);
    else if (n == 2 && !memcmp(s, "-0", 2)) kgr_buf_puts(b, "0");
    else kgr_buf_put(b, s, n);
}

/* json.dumps' walk: text into t, each number through num (its text, or
 * for a GBNF value a group of its spellings) */
typedef struct py_walk {
    kgr_buf *t;
    void (*num)(struct py_walk *w, const cJSON *n);
    const py_lits *L;
    kgr_buf *g; /* lit_value: the GBNF being written */
} py_walk;

static void py_walk_value(py_walk *w, const cJSON *v) {
    kgr_buf *b = w->t;
    if (cJSON_IsString(v)) py_string(b, v->valuestring);
    else if (cJSON_IsNumber(v)) w->num(w, v);
    else if (cJSON_IsTrue(v)) kgr_buf_puts(b, "true");
    else if (cJSON_IsFalse(v)) kgr_buf_puts(b, "false");
    else if (cJSON_IsNull(v)) kgr_buf_puts(b, "null");
    else if (cJSON_IsArray(v)) {
        kgr_buf_puts(b, "[");
        for (const cJSON *e = v->child; e; e = e->next) {
            py_walk_value(w, e);
            if (e->next) kgr_buf_puts(b, ", ");
        }
        kgr_buf_puts(b, "]");
    } else if (cJSON_IsObject(v)) {
        kgr_buf_puts(b, "{");
        for (const cJSON *e = v->child; e; e = e->next) {
            py_string(b, e->string);
            kgr_buf_puts(b, ": ");
            py_walk_value(w, e);
            if (e->next) kgr_buf_puts(b, ", ");
        }
        kgr_buf_puts(b, "}");
    }
}

static void py_num_text(py_walk *w, const cJSON *n) { py_lit_number(w->t, n, w->L); }
static void py_dumps_l(kgr_buf *b, const cJSON *v, const py_lits *L) {
    py_walk w = {b, py_num_text, L, NULL};
    py_walk_value(&w, v);
}

/* v as GBNF: its json.dumps text, where a number may be written any way
 * JSON Schema counts as equal (5, 5.0, 5.00; 3.14, 3.140; -0) */
static void lit_flush(kgr_buf *b, kgr_buf *t) {
    if (!t->n) return;
    kgr_buf_literal(b, t->p, t->n);
    kgr_buf_puts(b, " ");
    t->n = 0;
}

static void lit_number(kgr_buf *b, double d) {
    kgr_buf_puts(b, "(");
    if (d == floor(d) && fabs(d) < 1e16) {
        kgr_buf_printf(b, "%s\"%.0f\" (\".\" \"0\"+)?", d == 0 ? "\"-\"? " : d < 0 ? "\"-\" " : "", fabs(d));
    } else {
        kgr_buf r = {0};
        py_float(&r, d);
        bool sci = r.p && strchr(r.p, 'e');
        kgr_buf_literal(b, r.p ? r.p : "", r.n);
        if (!sci) kgr_buf_puts(b, " \"0\"*");
        else if (d == floor(d) && fabs(d) < 1e300) kgr_buf_printf(b, " | \"%.0f\"", d); /* an int past 1e16 */
        free(r.p);
    }
    kgr_buf_puts(b, ") ");
}

static void lit_num(py_walk *w, const cJSON *n) {
    lit_flush(w->g, w->t);
    lit_number(w->g, n->valuedouble);
}

static void lit_value(kgr_buf *b, const cJSON *v) {
    kgr_buf t = {0};
    kgr_buf_puts(b, "(");
    py_walk w = {&t, lit_num, NULL, b};
    py_walk_value(&w, v);
    lit_flush(b, &t);
    kgr_buf_puts(b, ")");
    free(t.p);
}

/* ---- the walk ---- */
static bool gen(sc *c, const cJSON *s, const char *ptr, char *name);

static void child_ptr(char *out, const char *ptr, const char *a, const char *b) {
    /* JSON pointer escaping of b: ~ -> ~0, / -> ~1 */
    char e[256];
    size_t k = 0;
    for (const char *p = b ? b : ""; *p && k + 3 < sizeof e; p++) {
        if (*p == '~') e[k++] = '~', e[k++] = '0';
        else if (*p == '/') e[k++] = '~', e[k++] = '1';
        else e[k++] = *p;
    }
    e[k] = 0;
    snprintf(out, 512, "%s/%s%s%s", ptr[0] ? ptr : "#", a, b ? "/" : "", e);
}

static const cJSON *resolve(sc *c, const char *ref, const char *ptr) {
    if (ref[0] != '#') {
        fail(c, ptr, "'$ref' %s is not a local JSON pointer (#/...)", ref);
        return NULL;
    }
    if (ref[1] && ref[1] != '/') {
        fail(c, ptr, "'$ref' %s: anchors are not supported", ref);
        return NULL;
    }
    const cJSON *n = kgr_json_pointer(c->root, ref);
    if (!n) fail(c, ptr, "'$ref' %s does not resolve", ref);
    return n;
}

/* keywords that assert something; any other keyword is an annotation */
static const char *const handled[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "additionalItems",
    "minItems", "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "nullable",
    "$defs", "definitions", NULL};
static const char *const refused[] = {
    "uniqueItems", "contains", "minContains", "maxContains", "dependencies", "dependentRequired",
    "dependentSchemas", "propertyNames", "if", "then", "else", "not", "multipleOf", "minProperties",
    "maxProperties", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef",
    "patternProperties", NULL};

static bool in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return true;
    return false;
}

/* patternProperties where representable: one pattern, and either
 * additionalProperties false (keys must be listed or match the pattern,
 * and no listed name may match it, so each key has one schema) or, without
 * listed properties, a pattern every key matches (then it is
 * additionalProperties). 1: yes, with *pat and *val set; *all: the pattern
 * matches every key. */
static bool pattern_props(const cJSON *s, const char **pat, const cJSON **val, bool *all) {
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(s, "patternProperties");
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (!cJSON_IsObject(pp) || !pp->child || pp->child->next) return false;
    *pat = pp->child->string;
    *val = pp->child;
    *all = !strcmp(*pat, "") || !strcmp(*pat, ".*") || !strcmp(*pat, "^.*$") || !strcmp(*pat, "^.*") || !strcmp(*pat, "(.*)");
    if (cJSON_IsFalse(add)) {
        for (const cJSON *p = cJSON_IsObject(pr) ? pr->child : NULL; p; p = p->next)
            if (kgr_regex_search(*pat, p->string) != 0) return false;
        return true;
    }
    return !(pr && pr->child) && *all && (!add || cJSON_IsTrue(add));
}

/* multipleOf k of an integer-only schema, k a whole number in [1, 1000]
 * without bounds beside it (a residue automaton); 0: not such */
static int int_multiple(const cJSON *s) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, "multipleOf"), *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!cJSON_IsNumber(m) || !cJSON_IsString(t) || strcmp(t->valuestring, "integer")) return 0;
    if (m->valuedouble != floor(m->valuedouble) || m->valuedouble < 1 || m->valuedouble > 1000) return 0;
    static const char *const b[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    for (const char *const *k = b; *k; k++)
        if (cJSON_GetObjectItemCaseSensitive(s, *k) && m->valuedouble != 1) return 0;
    return (int)m->valuedouble;
}

static bool check_keywords(sc *c, const cJSON *s, const char *ptr) {
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!in_list(refused, k->string)) continue;
        /* harmless values */
        if (!strcmp(k->string, "uniqueItems") && cJSON_IsFalse(k)) continue;
        if (!strcmp(k->string, "patternProperties") && cJSON_IsObject(k) && !k->child) continue;
        const char *pat;
        const cJSON *val;
        bool all;
        if (!strcmp(k->string, "patternProperties") && pattern_props(s, &pat, &val, &all)) continue;
        if (!strcmp(k->string, "minProperties") && cJSON_IsNumber(k) && k->valuedouble <= 1) continue; /* gen_object */
        if (!strcmp(k->string, "multipleOf") && int_multiple(s) > 0) continue; /* gen_integer */
        if ((!strcmp(k->string, "minProperties") && cJSON_IsNumber(k) && k->valuedouble <= 0) ||
            (!strcmp(k->string, "minContains") && cJSON_IsNumber(k) && k->valuedouble <= 0))
            continue;
        return fail(c, ptr, "unsupported keyword '%s'", k->string);
    }
    return true;
}

static cJSON *own(sc *c, cJSON *j) {
    if (!j) return NULL;
    if (c->n_owned == c->cap_owned) {
        int32_t n = c->cap_owned ? c->cap_owned * 2 : 16;
        cJSON **q = realloc(c->owned, sizeof *q * (size_t)n);
        if (!q) {
            cJSON_Delete(j);
            return NULL;
        }
        c->owned = q;
        c->cap_owned = n;
    }
    c->owned[c->n_owned++] = j;
    return j;
}

/* Merges b into a (a is owned, b borrowed); false when they cannot be merged. */
static bool merge_into(sc *c, cJSON *a, const cJSON *b, const char *ptr, int depth) {
    if (depth > 32) return fail(c, ptr, "'%s' nests too deeply", "allOf");
    if (cJSON_IsTrue(b)) return true;
    if (!cJSON_IsObject(b)) return fail(c, ptr, "'%s' of a non-object schema", "allOf");
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(b, "$ref");
    if (cJSON_IsString(ref)) {
        const cJSON *t = resolve(c, ref->valuestring, ptr);
        if (!t || !merge_into(c, a, t, ptr, depth + 1)) return false;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(b, "allOf");
    if (cJSON_IsArray(all))
        for (const cJSON *e = all->child; e; e = e->next)
            if (!merge_into(c, a, e, ptr, depth + 1)) return false;
    for (const cJSON *k = b->child; k; k = k->next) {
        if (!strcmp(k->string, "$ref") || !strcmp(k->string, "allOf") || !strcmp(k->string, "$defs") ||
            !strcmp(k->string, "definitions"))
            continue;
        if (!in_list(handled, k->string) && !in_list(refused, k->string)) continue; /* an annotation */
        cJSON *have = cJSON_GetObjectItemCaseSensitive(a, k->string);
        if (!have) {
            cJSON_AddItemToObject(a, k->string, cJSON_Duplicate(k, true));
            continue;
        }
        if (!strcmp(k->string, "properties") && cJSON_IsObject(k) && cJSON_IsObject(have)) {
            for (const cJSON *p = k->child; p; p = p->next) {
                cJSON *hp = cJSON_GetObjectItemCaseSensitive(have, p->string);
                if (!hp) cJSON_AddItemToObject(have, p->string, cJSON_Duplicate(p, true));
                else { /* the same property twice: allOf of both */
                    cJSON *m = cJSON_CreateObject(), *l = cJSON_AddArrayToObject(m, "allOf");
                    cJSON_AddItemToArray(l, cJSON_Duplicate(hp, true));
                    cJSON_AddItemToArray(l, cJSON_Duplicate(p, true));
                    cJSON_ReplaceItemInObjectCaseSensitive(have, p->string, m);
                }
            }
        } else if (!strcmp(k->string, "required") && cJSON_IsArray(k) && cJSON_IsArray(have)) {
            for (const cJSON *r = k->child; r; r = r->next) {
                bool dup = false;
                for (const cJSON *h = have->child; h; h = h->next)
                    if (cJSON_IsString(h) && cJSON_IsString(r) && !strcmp(h->valuestring, r->valuestring)) dup = true;
                if (!dup) cJSON_AddItemToArray(have, cJSON_Duplicate(r, true));
            }
        } else if (!cJSON_Compare(have, k, true)) {
            if (!strcmp(k->string, "additionalProperties") && (cJSON_IsFalse(have) || cJSON_IsFalse(k))) {
                cJSON_ReplaceItemInObjectCaseSensitive(a, k->string, cJSON_CreateFalse());
                continue;
            }
            if ((!strcmp(k->string, "minimum") || !strcmp(k->string, "minLength") || !strcmp(k->string, "minItems")) &&
                cJSON_IsNumber(have) && cJSON_IsNumber(k)) {
                if (k->valuedouble > have->valuedouble) cJSON_SetNumberValue(have, k->valuedouble);
                continue;
            }
            if ((!strcmp(k->string, "maximum") || !strcmp(k->string, "maxLength") || !strcmp(k->string, "maxItems")) &&
                cJSON_IsNumber(have) && cJSON_IsNumber(k)) {
                if (k->valuedouble < have->valuedouble) cJSON_SetNumberValue(have, k->valuedouble);
                continue;
            }
            return fail(c, ptr, "'allOf' with conflicting '%s' it cannot merge", k->string);
        }
    }
    return true;
}

/* types */
enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOL = 32, T_NULL = 64, T_ALL = 127 };

static int type_bit(const char *t) {
    static const char *n[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, n[i])) return 1 << i;
    return 0;
}

static bool value_has_type(const cJSON *v, int types) {
    if (cJSON_IsObject(v)) return types & T_OBJECT;
    if (cJSON_IsArray(v)) return types & T_ARRAY;
    if (cJSON_IsString(v)) return types & T_STRING;
    if (cJSON_IsBool(v)) return types & T_BOOL;
    if (cJSON_IsNull(v)) return types & T_NULL;
    if (cJSON_IsNumber(v)) return (types & T_NUMBER) || ((types & T_INTEGER) && v->valuedouble == floor(v->valuedouble));
    return false;
}

/* ---- integers and numbers ---- */

/* decimal strings of length n in [x, y] (same length, digits) */
static void digits_range(kgr_buf *b, const char *x, const char *y, int n) {
    if (n == 0) {
        kgr_buf_puts(b, "\"\"");
        return;
    }
    if (x[0] == y[0]) {
        kgr_buf_printf(b, "\"%c\" (", x[0]);
        digits_range(b, x + 1, y + 1, n - 1);
        kgr_buf_puts(b, ")");
        return;
    }
    bool x0 = true, y9 = true;
    for (int i = 1; i < n; i++) {
        if (x[i] != '0') x0 = false;
        if (y[i] != '9') y9 = false;
    }
    kgr_buf_puts(b, "(");
    char lo = x[0], hi = y[0];
    bool first = true;
    if (!x0) {
        char nines[24];
        memset(nines, '9', sizeof nines);
        kgr_buf_printf(b, "\"%c\" (", x[0]);
        digits_range(b, x + 1, nines, n - 1);
        kgr_buf_puts(b, ")");
        lo++;
        first = false;
    }
    char top = y9 ? hi : (char)(hi - 1);
    if (lo <= top) {
        kgr_buf_printf(b, "%s[%c-%c]", first ? "" : " | ", lo, top);
        if (n > 1) kgr_buf_printf(b, " [0-9]{%d}", n - 1);
        first = false;
    }
    if (!y9) {
        char zeros[24];
        memset(zeros, '0', sizeof zeros);
        kgr_buf_printf(b, "%s\"%c\" (", first ? "" : " | ", y[0]);
        digits_range(b, zeros, y + 1, n - 1);
        kgr_buf_puts(b, ")");
    }
    kgr_buf_puts(b, ")");
}

/* non-negative integers in [a, b] (b < 0: unbounded), no leading zeros */
static void uint_range(kgr_buf *b, long long a, long long hi) {
    char sa[24], sb[24];
    int la = snprintf(sa, sizeof sa, "%lld", a);
    int lb = hi >= 0 ? snprintf(sb, sizeof sb, "%lld", hi) : 0;
    kgr_buf_puts(b, "(");
    bool first = true;
    int last = hi >= 0 ? lb : la;
    for (int L = la; L <= last; L++) {
        char lo_s[24], hi_s[24];
        if (L == la) memcpy(lo_s, sa, (size_t)la + 1);
        else {
            memset(lo_s, '0', (size_t)L);
            lo_s[0] = '1';
            lo_s[L] = 0;
        }
        if (hi >= 0 && L == lb) memcpy(hi_s, sb, (size_t)lb + 1);
        else {
            memset(hi_s, '9', (size_t)L);
            hi_s[L] = 0;
        }
        kgr_buf_puts(b, first ? "(" : " | (");
        digits_range(b, lo_s, hi_s, L);
        kgr_buf_puts(b, ")");
        first = false;
    }
    if (hi < 0) kgr_buf_printf(b, " | [1-9] [0-9]{%d,}", la);
    kgr_buf_puts(b, ")");
}

/* integers in [lo, hi]; has_lo/has_hi false: unbounded on that side */
static void int_range(kgr_buf *b, bool has_lo, long long lo, bool has_hi, long long hi) {
    bool first = true;
    kgr_buf_puts(b, "(");
    /* negative part: -m for m in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        long long mlo = has_hi ? (hi < 0 ? -hi : 1) : 1;
        long long mhi = has_lo ? -lo : -1;
        if (mhi < 0 || mlo <= mhi) {
            kgr_buf_puts(b, "\"-\" ");
            uint_range(b, mlo, mhi);
            first = false;
        }
    }
    if (!has_hi || hi >= 0) {
        long long plo = has_lo && lo > 0 ? lo : 0;
        kgr_buf_puts(b, first ? "" : " | ");
        uint_range(b, plo, has_hi ? hi : -1);
    }
    kgr_buf_puts(b, ")");
}

static bool get_bound(sc *c, const cJSON *s, const char *ptr, bool is_min, bool *has, double *v, bool *excl) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, is_min ? "minimum" : "maximum");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, is_min ? "exclusiveMinimum" : "exclusiveMaximum");
    *has = false;
    *excl = false;
    if (m && !cJSON_IsNumber(m)) return fail(c, ptr, "'%s' is not a number", is_min ? "minimum" : "maximum");
    if (cJSON_IsNumber(m)) *has = true, *v = m->valuedouble;
    if (cJSON_IsTrue(e)) { /* draft 4 */
        if (!*has) return fail(c, ptr, "'%s' without its bound", is_min ? "exclusiveMinimum" : "exclusiveMaximum");
        *excl = true;
    } else if (cJSON_IsNumber(e)) {
        if (!*has || (is_min ? e->valuedouble >= *v : e->valuedouble <= *v)) *v = e->valuedouble, *excl = true;
        *has = true;
    }
    return true;
}

/* Both bounds of s; without any, emits the unbounded primitive and sets *done. */
static bool bounds(sc *c, const cJSON *s, const char *ptr, int unbounded, kgr_buf *b, bool *hl, double *lo, bool *el,
                   bool *hh, double *hi, bool *eh, bool *done) {
    *lo = *hi = 0;
    *done = false;
    if (!get_bound(c, s, ptr, true, hl, lo, el) || !get_bound(c, s, ptr, false, hh, hi, eh)) return false;
    if (!*hl && !*hh) {
        char n[48];
        kgr_buf_puts(b, prim(c, unbounded, n));
        *done = true;
    }
    return true;
}

/* The integer bound a JSON number d gives (the least allowed for a minimum,
 * the most for a maximum). Past 2^53 the double is not the schema's literal,
 * which lies within half the gap to the next double: the bound taken is the
 * one surely inside it. false: past 9.2e18. */
static bool safe_int_bound(double d, bool is_min, bool excl, long long *out) {
    if (fabs(d) <= 9007199254740992.0) {
        *out = (long long)(is_min ? (excl ? floor(d) + 1 : ceil(d)) : (excl ? ceil(d) - 1 : floor(d)));
        return true;
    }
    if (!(fabs(d) <= 1e19)) return false;
    long double x = is_min ? (long double)d + (long double)(nextafter(d, INFINITY) - d) / 2 + (excl ? 1 : 0)
                           : (long double)d - (long double)(d - nextafter(d, -INFINITY)) / 2 - (excl ? 1 : 0);
    if (x > (long double)LLONG_MAX || x < (long double)LLONG_MIN) return false;
    *out = (long long)x;
    return true;
}

static bool gen_integer(sc *c, const cJSON *s, const char *ptr, kgr_buf *b) {
    int k = int_multiple(s);
    if (k > 1) { /* the digits' value mod k: rule r is "read so far = r (mod k)" */
        char (*r)[48] = calloc((size_t)k, sizeof *r);
        if (!r) return fail(c, ptr, "%s", "out of memory");
        for (int i = 0; i < k; i++) fresh(c, r[i]);
        for (int i = 0; i < k; i++) {
            kgr_buf body = {0};
            int alts = 0;
            for (int t = 0; t < k; t++) {
                char set[16];
                int n = 0;
                for (int d = 0; d < 10; d++)
                    if ((10 * i + d) % k == t) set[n++] = (char)('0' + d);
                if (!n) continue;
                set[n] = 0;
                kgr_buf_printf(&body, "%s[%s] %s", alts++ ? " | " : "", set, r[t]);
            }
            if (i == 0) kgr_buf_printf(&body, "%s\"\"", alts ? " | " : "");
            rule(c, r[i], body.p ? body.p : "\"\"");
            free(body.p);
        }
        kgr_buf_puts(b, "\"-\"? (\"0\"");
        for (int t = 0; t < k; t++) {
            char set[16];
            int n = 0;
            for (int d = 1; d < 10; d++)
                if (d % k == t) set[n++] = (char)('0' + d);
            set[n] = 0;
            if (n) kgr_buf_printf(b, " | [%s] %s", set, r[t]);
        }
        kgr_buf_puts(b, ")");
        free(r);
        return true;
    }
    bool hl, hh, el, eh, done;
    double lo, hi;
    if (!bounds(c, s, ptr, P_INTEGER, b, &hl, &lo, &el, &hh, &hi, &eh, &done)) return false;
    if (done) return true;
    long long l = 0, h = 0;
    if ((hl && !safe_int_bound(lo, true, el, &l)) || (hh && !safe_int_bound(hi, false, eh, &h)))
        return fail(c, ptr, "'%s' is too large", "minimum/maximum");
    if (hl && hh && l > h) {
        kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
        return true;
    }
    int_range(b, hl, l, hh, h);
    return true;
}

/* non-negative decimals in a range of integers: [a, b] with exclusive ends;
 * hb false: unbounded. No exponents (json.dumps writes one only below 1e-4
 * or from 1e16: such values are refused under bounds). */
static void unum_range(kgr_buf *b, long long a, bool ea, bool hb, long long hi, bool eb) {
    const char *frac = "(\".\" [0-9]+)?";
    const char *nz = "(\".\" [0-9]* [1-9] [0-9]*)";
    const char *zeros = "(\".\" \"0\"+)?";
    bool first = true;
    kgr_buf_puts(b, "(");
    /* integer part in [a + ea, b - 1] with any fraction */
    long long ilo = ea ? a + 1 : a;
    if (!hb || ilo <= hi - 1) {
        uint_range(b, ilo, hb ? hi - 1 : -1);
        kgr_buf_printf(b, " %s", frac);
        first = false;
    }
    if (ea && (!hb || a < hi)) { /* a itself with a non-zero fraction */
        kgr_buf_puts(b, first ? "" : " | ");
        uint_range(b, a, a);
        kgr_buf_printf(b, " %s", nz);
        first = false;
    }
    if (hb && !eb && hi >= a && !(ea && hi == a)) { /* b with a zero fraction */
        kgr_buf_puts(b, first ? "" : " | ");
        uint_range(b, hi, hi);
        kgr_buf_printf(b, " %s", zeros);
        first = false;
    }
    if (first) kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
    kgr_buf_puts(b, ")");
}

static bool gen_number(sc *c, const cJSON *s, const char *ptr, kgr_buf *b) {
    bool hl, hh, el, eh, done;
    double lo, hi;
    if (!bounds(c, s, ptr, P_NUMBER, b, &hl, &lo, &el, &hh, &hi, &eh, &done)) return false;
    if (done) return true;
    if ((hl && (lo != floor(lo) || fabs(lo) > 1e15)) || (hh && (hi != floor(hi) || fabs(hi) > 1e15)))
        return fail(c, ptr, "number bounds that are not integers ('%s')", hl && lo != floor(lo) ? "minimum" : "maximum");
    long long l = (long long)lo, h = (long long)hi;
    kgr_buf_puts(b, "(");
    bool first = true;
    /* non-negative part: [max(l,0), h] */
    if (!hh || h > 0 || (h == 0 && !eh)) {
        bool ea = hl && l >= 0 && el;
        long long a = hl && l > 0 ? l : 0;
        unum_range(b, a, ea, hh, h, eh);
        first = false;
    }
    /* negative part: -x, x in (0, -l] and x >= -h */
    if (!hl || l < 0) {
        kgr_buf_puts(b, first ? "\"-\" " : " | \"-\" ");
        /* x in [max(-h, 0), -l], excluding x == 0 (that is the non-negative part) */
        long long a = hh && h < 0 ? -h : 0;
        bool ea = hh && h < 0 ? eh : true;
        unum_range(b, a, ea, hl, -l, el);
    }
    kgr_buf_puts(b, ")");
    return true;
}

/* ---- strings ---- */
/* Dates are calendar dates (days per month, February 29 in leap years), as
 * Python's date.fromisoformat checks them. */
static const char *format_body(const char *f) {
    static const struct {
        const char *name, *body;
    } fm[] = {
        {"date", "([0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])) | ([0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [48] | [2468] [048] | [13579] [26]) \"00\") \"-02-29\")"},
        {"time", "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" ([0-5] [0-9] | \"60\") (\".\" [0-9]+)? ([Zz] | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
        {"date-time", "([0-9]{4} \"-\" ((\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" (\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8])) | ([0-9] [0-9] (\"0\" [48] | [2468] [048] | [13579] [26]) | (\"0\" [48] | [2468] [048] | [13579] [26]) \"00\") \"-02-29\") [Tt] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" ([0-5] [0-9] | \"60\") (\".\" [0-9]+)? ([Zz] | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
        {"uuid", "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}"},
        {"ipv4", "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]) (\".\" (\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])){3}"},
        {"hostname", "[a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])? (\".\" [a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?)*"},
        {"duration", "\"P\" ([0-9]+ \"W\" | ([0-9]+ \"Y\")? ([0-9]+ \"M\")? ([0-9]+ \"D\")? (\"T\" ([0-9]+ \"H\")? ([0-9]+ \"M\")? ([0-9]+ (\".\" [0-9]+)? \"S\")?)?)"},
        {"uri", "[a-zA-Z] [a-zA-Z0-9+.-]* \":\" [^\"\\\\\\x00-\\x20<>{}|^`]*"},
        {"ipv6", "(h16c){6} ls32 | \"::\" (h16c){5} ls32 | h16? \"::\" (h16c){4} ls32 | ((h16c)? h16)? \"::\" (h16c){3} ls32 | ((h16c){0,2} h16)? \"::\" (h16c){2} ls32 | ((h16c){0,3} h16)? \"::\" h16c ls32 | ((h16c){0,4} h16)? \"::\" ls32 | ((h16c){0,5} h16)? \"::\" h16 | ((h16c){0,6} h16)? \"::\""},
    };
    for (size_t i = 0; i < sizeof fm / sizeof *fm; i++)
        if (!strcmp(fm[i].name, f)) return fm[i].body;
    return NULL;
}

/* minLength / maxLength hold for every string of length [lo, hi] (hi -1: unbounded) */
static bool lengths_implied(const cJSON *mn, const cJSON *mx, int64_t lo, int64_t hi) {
    if (mn && !(cJSON_IsNumber(mn) && (double)lo >= mn->valuedouble)) return false;
    return !mx || (cJSON_IsNumber(mx) && hi >= 0 && (double)hi <= mx->valuedouble);
}

static bool gen_string(sc *c, const cJSON *s, const char *ptr, kgr_buf *b) {
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern"), *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    const char *fb = cJSON_IsString(fmt) ? format_body(fmt->valuestring) : NULL;
    if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "email")) fb = "email";
    /* The formats the JSON Schema drafts (3 to 2020-12) define assert
     * something: those it has no grammar for are refused. Any other name
     * (OpenAPI's int32 or byte, "url", "path") is an annotation, as the spec
     * says of formats it does not define (2020-12 section 7.2.3). */
    static const char *const defined[] = {"idn-email", "idn-hostname", "uri-reference", "iri", "iri-reference",
                                          "uri-template", "json-pointer", "relative-json-pointer", "regex",
                                          "color", "host-name", "ip-address", "utc-millisec", "style", "phone", NULL};
    if (cJSON_IsString(fmt) && !fb && in_list(defined, fmt->valuestring))
        return fail(c, ptr, "unsupported format '%s'", fmt->valuestring);
    bool lens = (mn && !(cJSON_IsNumber(mn) && mn->valuedouble <= 0)) || mx;
    if (cJSON_IsString(pat)) {
        int64_t rmin, rmax;
        if (lens && !(kgr_regex_lengths(pat->valuestring, &rmin, &rmax) && lengths_implied(mn, mx, rmin, rmax)))
            return fail(c, ptr, "'%s' together with minLength/maxLength", "pattern");
        if (fb) return fail(c, ptr, "'%s' together with a format", "pattern");
        char *body;
        kiln_status st = kgr_regex_to_gbnf(pat->valuestring, true, &body);
        if (st) {
            char p2[512];
            child_ptr(p2, ptr, "pattern", NULL);
            fail(c, p2, "'pattern' %s", kiln_status_msg(st));
            kiln_status_free(st);
            return false;
        }
        kgr_buf_puts(b, body);
        free(body);
        return true;
    }
    char ch[48];
    if (fb) {
        /* formats of bounded length (what the grammar above matches) */
        static const struct {
            const char *name;
            int64_t lo, hi;
        } flen[] = {{"date", 10, 10}, {"uuid", 36, 36}, {"ipv4", 7, 15}};
        bool implied = false;
        for (size_t i = 0; i < sizeof flen / sizeof *flen; i++)
            if (!strcmp(fmt->valuestring, flen[i].name)) implied = lengths_implied(mn, mx, flen[i].lo, flen[i].hi);
        if (lens && !implied) return fail(c, ptr, "'%s' together with minLength/maxLength", "format");
        if (!strcmp(fb, "email")) {
            /* as Python jsonschema's checker: the string contains an @ */
            prim(c, P_CHAR, ch);
            kgr_buf_printf(b, "\"\\\"\" %s* \"@\" %s* \"\\\"\"", ch, ch);
        } else if (!strcmp(fmt->valuestring, "ipv6")) {
            char h[48];
            fresh(c, h);
            kgr_buf r = {0};
            kgr_buf_printf(&r, "%sh16 ::= [0-9a-fA-F]{1,4}\n%sh16c ::= %sh16 \":\"\n%sls32 ::= %sh16c %sh16 | %s\n",
                           h, h, h, h, h, h, format_body("ipv4"));
            kgr_buf_puts(&c->out, r.p ? r.p : "");
            free(r.p);
            /* the body names h16/h16c/ls32: prefix them */
            kgr_buf body = {0};
            const char *f = format_body("ipv6");
            for (const char *q = f; *q;) {
                if (!strncmp(q, "h16c", 4) || !strncmp(q, "ls32", 4)) {
                    kgr_buf_printf(&body, "%s%.4s", h, q);
                    q += 4;
                } else if (!strncmp(q, "h16", 3)) {
                    kgr_buf_printf(&body, "%sh16", h);
                    q += 3;
                } else kgr_buf_put(&body, q++, 1);
            }
            kgr_buf_printf(b, "\"\\\"\" (%s) \"\\\"\"", body.p ? body.p : "");
            free(body.p);
        } else kgr_buf_printf(b, "\"\\\"\" (%s) \"\\\"\"", fb);
        return true;
    }
    prim(c, P_CHAR, ch);
    if (!lens) {
        kgr_buf_puts(b, prim(c, P_STRING, ch));
        return true;
    }
    if ((mn && !cJSON_IsNumber(mn)) || (mx && !cJSON_IsNumber(mx))) return fail(c, ptr, "'%s' is not a number", "minLength");
    double lo = mn ? mn->valuedouble : 0, hi = mx ? mx->valuedouble : -1;
    if (lo > MAX_REPEAT || hi > MAX_REPEAT) return fail(c, ptr, "'%s' over 100000", lo > MAX_REPEAT ? "minLength" : "maxLength");
    if (hi >= 0 && hi < lo) kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
    else if (hi < 0) kgr_buf_printf(b, "\"\\\"\" %s{%d,} \"\\\"\"", ch, (int)lo);
    else kgr_buf_printf(b, "\"\\\"\" %s{%d,%d} \"\\\"\"", ch, (int)lo, (int)hi);
    return true;
}

/* ---- objects ---- */

/* keys other than the listed ones (their JSON text), as a trie: N(node) ::=
 * (a char no key continues with) char* | c N(child) ... | "" (unless a key ends here) */
static bool other_key(sc *c, const char **keys, int32_t n, int32_t depth, char *name, const char *ptr) {
    char ch[48];
    prim(c, P_CHAR, ch);
    fresh(c, name);
    kgr_buf b = {0};
    char next[128];
    int nn = 0;
    bool ends = false;
    for (int32_t i = 0; i < n; i++) {
        unsigned char k = (unsigned char)keys[i][depth];
        if (!k) ends = true;
        else if (k >= 0x80 || k == '\\' || k == '"' || k < 0x20) {
            free(b.p);
            return fail(c, ptr, "additional properties beside a property name with %s", "non-ASCII or escaped characters");
        } else if (!memchr(next, k, (size_t)nn) && nn < 127) next[nn++] = (char)k;
    }
    /* a first char that no key continues with */
    kgr_buf_puts(&b, "([^\"\\\\\\x00-\\x1f");
    for (int i = 0; i < nn; i++) {
        char e = next[i];
        if (e == '-' || e == ']' || e == '^' || e == '[') kgr_buf_printf(&b, "\\%c", e);
        else kgr_buf_put(&b, &e, 1);
    }
    kgr_buf_printf(&b, "] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})) %s*", ch);
    for (int i = 0; i < nn; i++) {
        const char **sub = malloc(sizeof *sub * (size_t)n);
        if (!sub) {
            free(b.p);
            return fail(c, ptr, "%s", "out of memory");
        }
        int32_t m = 0;
        for (int32_t j = 0; j < n; j++)
            if ((unsigned char)keys[j][depth] == (unsigned char)next[i]) sub[m++] = keys[j];
        char cn[48];
        bool ok = other_key(c, sub, m, depth + 1, cn, ptr);
        free(sub);
        if (!ok) {
            free(b.p);
            return false;
        }
        char e[2] = {next[i], 0};
        kgr_buf_puts(&b, " | ");
        kgr_buf_literal(&b, e, 1);
        kgr_buf_printf(&b, " %s", cn);
    }
    if (!ends) kgr_buf_puts(&b, " | \"\"");
    rule(c, name, b.p);
    free(b.p);
    return true;
}

/* name ::= "key" ws ":" ws value ws (key: the key's JSON text) */
static void member(sc *c, const char *name, const kgr_buf *key, const char *ws, const char *vn) {
    kgr_buf body = {0};
    kgr_buf_literal(&body, key->p, key->n);
    kgr_buf_printf(&body, " %s \":\" %s %s %s", ws, ws, vn, ws);
    rule(c, name, body.p);
    free(body.p);
}

static bool gen_object(sc *c, const cJSON *s, const char *ptr, kgr_buf *b) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, ptr, "'%s' is not an object", "properties");
    if (req && !cJSON_IsArray(req)) return fail(c, ptr, "'%s' is not an array", "required");
    char ws[48], tmp[512];
    prim(c, P_WS, ws);
    int32_t n = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) n++;
    const char **keys = calloc((size_t)n + 1, sizeof *keys);
    char (*kv)[48] = calloc((size_t)n + 1, sizeof *kv);
    bool *must = calloc((size_t)n + 1, 1);
    char **keytext = calloc((size_t)n + 1, sizeof *keytext);
    bool ok = keys && kv && must && keytext;
    int32_t k = 0;
    for (const cJSON *p = props ? props->child : NULL; ok && p; p = p->next) {
        keys[k] = p->string;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) must[k] = true;
        child_ptr(tmp, ptr, "properties", p->string);
        char vn[48];
        ok = gen(c, p, tmp, vn);
        if (ok) {
            kgr_buf t = {0};
            py_string(&t, p->string);
            keytext[k] = t.p;
            fresh(c, kv[k]);
            member(c, kv[k], &t, ws, vn);
        }
        k++;
    }
    int32_t n_listed = k;
    /* required names that are not listed: any value */
    for (const cJSON *r = req ? req->child : NULL; ok && r; r = r->next) {
        if (!cJSON_IsString(r)) continue;
        bool listed = false;
        for (int32_t i = 0; i < k; i++)
            if (!strcmp(keys[i], r->valuestring)) listed = true;
        if (listed) continue;
        keys[k] = r->valuestring;
        must[k] = true;
        kgr_buf t = {0};
        py_string(&t, r->valuestring);
        keytext[k] = t.p;
        fresh(c, kv[k]);
        char vn[48];
        const char *pt;
        const cJSON *pv;
        bool pa;
        if (pattern_props(s, &pt, &pv, &pa)) { /* the pattern's schema, when it surely applies */
            if (!pa) ok = fail(c, ptr, "required property '%s' beside patternProperties", r->valuestring);
            else {
                child_ptr(tmp, ptr, "patternProperties", pt);
                ok = gen(c, pv, tmp, vn);
            }
        } else if (cJSON_IsObject(add)) { /* an unlisted property takes additionalProperties' schema */
            child_ptr(tmp, ptr, "additionalProperties", NULL);
            ok = gen(c, add, tmp, vn);
        } else if (cJSON_IsFalse(add) || (!add && !c->o.additional_properties)) {
            ok = fail(c, ptr, "required property '%s' that additionalProperties forbids", r->valuestring);
        } else prim(c, P_VALUE, vn);
        if (ok) member(c, kv[k], &t, ws, vn);
        k++;
    }
    n = k;
    /* additional properties */
    char akv[48] = "";
    const char *pat = NULL;
    const cJSON *pval = NULL;
    bool pall = false;
    if (ok && pattern_props(s, &pat, &pval, &pall)) { /* keys the pattern matches, values its schema */
        char vn[48], kn[48];
        child_ptr(tmp, ptr, "patternProperties", pat);
        ok = gen(c, pval, tmp, vn);
        char *kb = NULL;
        if (ok && !pall) {
            kiln_status rst = kgr_regex_to_gbnf(pat, true, &kb);
            if (rst) {
                ok = fail(c, tmp, "'patternProperties' %s", kiln_status_msg(rst));
                kiln_status_free(rst);
            }
        }
        if (ok) {
            if (kb) {
                fresh(c, kn);
                rule(c, kn, kb);
            } else prim(c, P_STRING, kn);
            fresh(c, akv);
            kgr_buf body = {0};
            kgr_buf_printf(&body, "%s %s \":\" %s %s %s", kn, ws, ws, vn, ws);
            rule(c, akv, body.p);
            free(body.p);
        }
        free(kb);
    } else if (ok && (cJSON_IsObject(add) || cJSON_IsTrue(add) || (!add && c->o.additional_properties))) {
        char vn[48], kn[48];
        if (cJSON_IsObject(add)) {
            child_ptr(tmp, ptr, "additionalProperties", NULL);
            ok = gen(c, add, tmp, vn);
        } else prim(c, P_VALUE, vn);
        if (ok) {
            /* key text without quotes */
            const char **inner = calloc((size_t)n + 1, sizeof *inner);
            char **own_k = calloc((size_t)n + 1, sizeof *own_k);
            ok = inner && own_k;
            for (int32_t i = 0; ok && i < n; i++) {
                size_t l = strlen(keytext[i]);
                own_k[i] = malloc(l);
                if (!own_k[i]) {
                    ok = false;
                    break;
                }
                memcpy(own_k[i], keytext[i] + 1, l - 2);
                own_k[i][l - 2] = 0;
                inner[i] = own_k[i];
            }
            if (ok) {
                if (n) ok = other_key(c, inner, n, 0, kn, ptr);
                else prim(c, P_CHAR, kn), strcat(kn, "*");
            }
            for (int32_t i = 0; own_k && i < n; i++) free(own_k[i]);
            free(own_k);
            free(inner);
            if (ok) {
                fresh(c, akv);
                kgr_buf body = {0};
                kgr_buf_printf(&body, "\"\\\"\" %s \"\\\"\" %s \":\" %s %s %s", kn, ws, ws, vn, ws);
                rule(c, akv, body.p);
                free(body.p);
            }
        }
    }
    kgr_buf tmp_sep = {0};
    const cJSON *minp = cJSON_GetObjectItemCaseSensitive(s, "minProperties");
    bool nonempty = cJSON_IsNumber(minp) && minp->valuedouble > 0; /* check_keywords: at most 1 */
    /* the members in any order, as the spec allows: a %perm (gr_int.h) */
    int32_t n_mem = akv[0] ? 1 : 0;
    for (int32_t i = 0; i < n; i++)
        if (must[i] || i >= n_listed || !cJSON_IsFalse(cJSON_GetArrayItem(props, i))) n_mem++;
    if (ok && n_mem && n_mem <= KGR_PERM_MAX) {
        char sep[48];
        fresh(c, sep);
        kgr_buf_printf(&tmp_sep, "\",\" %s", ws);
        rule(c, sep, tmp_sep.p);
        kgr_buf_printf(b, "\"{\" %s %%perm%s(%s,", ws, nonempty ? "1" : "", sep);
        for (int32_t i = 0; i < n; i++)
            if (must[i] || i >= n_listed || !cJSON_IsFalse(cJSON_GetArrayItem(props, i)))
                kgr_buf_printf(b, " %s%s", kv[i], must[i] ? "" : "?");
        if (akv[0]) kgr_buf_printf(b, " %s*", akv);
        kgr_buf_puts(b, ") \"}\"");
    } else if (ok) {
        /* over KGR_PERM_MAX members: in the schema's order.
         * H_i: nothing emitted yet; T_i: something emitted (members need a comma) */
        char (*H)[48] = calloc((size_t)n + 1, sizeof *H), (*T)[48] = calloc((size_t)n + 1, sizeof *T);
        ok = H && T;
        for (int32_t i = 0; ok && i <= n; i++) {
            fresh(c, H[i]);
            fresh(c, T[i]);
        }
        for (int32_t i = n; ok && i >= 0; i--) {
            kgr_buf h = {0}, t = {0};
            if (i == n) {
                /* minProperties 1: an object with nothing emitted is not done */
                const char *empty = nonempty ? "[^\\U00000000-\\U0010FFFF]" : "\"\"";
                if (akv[0]) {
                    kgr_buf_printf(&t, "\",\" %s %s %s | \"\"", ws, akv, T[n]);
                    kgr_buf_printf(&h, "%s %s | %s", akv, T[n], empty);
                } else {
                    kgr_buf_puts(&t, "\"\"");
                    kgr_buf_puts(&h, empty);
                }
            } else if (!must[i] && i < n_listed && cJSON_IsFalse(cJSON_GetArrayItem(props, i))) {
                /* an optional property whose schema is false: never there
                 * (its name still keeps additional keys apart) */
                kgr_buf_printf(&h, "%s", H[i + 1]);
                kgr_buf_printf(&t, "%s", T[i + 1]);
            } else {
                kgr_buf_printf(&h, "%s %s", kv[i], T[i + 1]);
                kgr_buf_printf(&t, "\",\" %s %s %s", ws, kv[i], T[i + 1]);
                if (!must[i]) {
                    kgr_buf_printf(&h, " | %s", H[i + 1]);
                    kgr_buf_printf(&t, " | %s", T[i + 1]);
                }
            }
            rule(c, H[i], h.p);
            rule(c, T[i], t.p);
            free(h.p);
            free(t.p);
        }
        if (ok) kgr_buf_printf(b, "\"{\" %s %s \"}\"", ws, H[0]);
        free(H);
        free(T);
    }
    free(tmp_sep.p);
    for (int32_t i = 0; keytext && i < n; i++) free(keytext[i]);
    free(keytext);
    free(keys);
    free(kv);
    free(must);
    return ok || fail(c, ptr, "%s", "out of memory");
}

/* ---- arrays ---- */
static bool gen_array(sc *c, const cJSON *s, const char *ptr, kgr_buf *b) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    const cJSON *addi = cJSON_GetObjectItemCaseSensitive(s, "additionalItems");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minItems"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maxItems");
    const cJSON *rest = items;
    char tmp[512], ws[48];
    prim(c, P_WS, ws);
    if (cJSON_IsArray(items)) { /* draft 4 tuples */
        prefix = items;
        rest = addi;
    } else if (prefix && !cJSON_IsArray(prefix)) return fail(c, ptr, "'%s' is not an array", "prefixItems");
    int32_t k = prefix ? cJSON_GetArraySize(prefix) : 0;
    long lo = cJSON_IsNumber(mn) ? (long)mn->valuedouble : 0, hi = cJSON_IsNumber(mx) ? (long)mx->valuedouble : -1;
    if (lo > MAX_REPEAT || hi > MAX_REPEAT) return fail(c, ptr, "'%s' over 100000", lo > MAX_REPEAT ? "minItems" : "maxItems");
    bool rest_ok = !cJSON_IsFalse(rest);
    if (!rest_ok && (hi < 0 || hi > k)) hi = k;
    if (hi >= 0 && hi < lo) {
        kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
        return true;
    }
    char rn[48] = "";
    if (rest_ok) {
        if (cJSON_IsObject(rest) || cJSON_IsTrue(rest)) {
            child_ptr(tmp, ptr, rest == addi ? "additionalItems" : "items", NULL);
            if (!gen(c, rest, tmp, rn)) return false;
        } else prim(c, P_VALUE, rn);
    }
    /* E_j ::= S_j ws C_{j+1};  C_j ::= "," ws E_j | "" (j >= lo); up to m = max(k, lo) explicit */
    long m = k > lo ? k : lo;
    if (hi >= 0 && m > hi) m = hi;
    char (*E)[48] = calloc((size_t)m + 2, sizeof *E), (*C)[48] = calloc((size_t)m + 2, sizeof *C);
    if (!E || !C) {
        free(E);
        free(C);
        return fail(c, ptr, "%s", "out of memory");
    }
    bool ok = true;
    for (long j = 0; j <= m; j++) {
        fresh(c, E[j]);
        fresh(c, C[j]);
    }
    for (long j = 0; ok && j <= m; j++) {
        char sn[48];
        if (j < k) {
            snprintf(sn, sizeof sn, "%d", (int)j);
            child_ptr(tmp, ptr, cJSON_IsArray(items) ? "items" : "prefixItems", sn);
            ok = gen(c, cJSON_GetArrayItem(prefix, (int)j), tmp, sn);
        } else memcpy(sn, rn, sizeof sn);
        kgr_buf e = {0}, t = {0};
        if (j < m) {
            kgr_buf_printf(&e, "%s %s %s", sn, ws, C[j + 1]);
        } else if (rest_ok || j < k) {
            /* the tail: element j onwards are all `rest` */
            long left = hi < 0 ? -1 : hi - j; /* elements still allowed, this one included */
            if (left == 0 || !rn[0]) kgr_buf_puts(&e, "[^\\U00000000-\\U0010FFFF]");
            else if (left < 0) kgr_buf_printf(&e, "%s %s (\",\" %s %s %s)*", rn, ws, ws, rn, ws);
            else kgr_buf_printf(&e, "%s %s (\",\" %s %s %s){0,%ld}", rn, ws, ws, rn, ws, left - 1);
        } else kgr_buf_puts(&e, "[^\\U00000000-\\U0010FFFF]");
        bool can_more = (hi < 0 || j < hi) && (j < k || rest_ok);
        if (can_more) kgr_buf_printf(&t, "\",\" %s %s", ws, E[j]);
        if (j >= lo) kgr_buf_printf(&t, "%s\"\"", can_more ? " | " : "");
        if (!t.p) kgr_buf_puts(&t, "[^\\U00000000-\\U0010FFFF]");
        rule(c, E[j], e.p);
        rule(c, C[j], t.p);
        free(e.p);
        free(t.p);
    }
    if (ok) {
        bool can_first = (hi < 0 || hi > 0) && (k > 0 || rest_ok);
        kgr_buf_printf(b, "\"[\" %s (", ws);
        if (can_first) kgr_buf_printf(b, "%s", E[0]);
        if (lo == 0) kgr_buf_printf(b, "%s\"\"", can_first ? " | " : "");
        kgr_buf_puts(b, ") \"]\"");
    }
    free(E);
    free(C);
    return ok;
}

/* ---- one schema ---- */
static bool gen_typed(sc *c, const cJSON *s, const char *ptr, int t, kgr_buf *b) {
    char n[48];
    switch (t) {
    case T_OBJECT: return gen_object(c, s, ptr, b);
    case T_ARRAY: return gen_array(c, s, ptr, b);
    case T_STRING: return gen_string(c, s, ptr, b);
    case T_NUMBER: return gen_number(c, s, ptr, b);
    case T_INTEGER: return gen_integer(c, s, ptr, b);
    case T_BOOL: kgr_buf_puts(b, prim(c, P_BOOL, n)); return true;
    case T_NULL: kgr_buf_puts(b, prim(c, P_NULL, n)); return true;
    }
    return false;
}

/* ---- oneOf: exactly one branch ---- */

static const cJSON *deref(sc *c, const cJSON *s) {
    for (int i = 0; i < 8 && cJSON_IsObject(s); i++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(s, "$ref");
        if (!cJSON_IsString(r)) break;
        /* resolve quietly: a bad $ref is reported when the branch compiles */
        const cJSON *t = kgr_json_pointer(c->root, r->valuestring);
        if (!t) break;
        s = t;
    }
    return s;
}

static int value_kind(const cJSON *v) {
    if (cJSON_IsObject(v)) return T_OBJECT;
    if (cJSON_IsArray(v)) return T_ARRAY;
    if (cJSON_IsString(v)) return T_STRING;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsNull(v)) return T_NULL;
    return v->valuedouble == floor(v->valuedouble) ? T_INTEGER | T_NUMBER : T_NUMBER;
}

/* the types a schema can accept (T_ALL when it cannot tell) */
static int kinds(const cJSON *s) {
    if (!cJSON_IsObject(s)) return cJSON_IsFalse(s) ? 0 : T_ALL;
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const"), *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cst) return value_kind(cst);
    if (cJSON_IsArray(en)) {
        int k = 0;
        for (const cJSON *e = en->child; e; e = e->next) k |= value_kind(e);
        return k;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "anyOf") || cJSON_GetObjectItemCaseSensitive(s, "oneOf") ||
        cJSON_GetObjectItemCaseSensitive(s, "allOf") || cJSON_GetObjectItemCaseSensitive(s, "$ref"))
        return T_ALL;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    int k = 0;
    if (cJSON_IsString(ty)) k = type_bit(ty->valuestring);
    else if (cJSON_IsArray(ty))
        for (const cJSON *e = ty->child; e; e = e->next) k |= cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
    else return T_ALL;
    if (k & T_NUMBER) k |= T_INTEGER;
    if (k & T_INTEGER) k |= T_NUMBER; /* 1 is both */
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) k |= T_NULL;
    return k;
}

/* the const/enum values of s as a list (NULL: any) */
static bool values_disjoint(const cJSON *a, const cJSON *b) {
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(a, "const"), *cb = cJSON_GetObjectItemCaseSensitive(b, "const");
    const cJSON *ea = cJSON_GetObjectItemCaseSensitive(a, "enum"), *eb = cJSON_GetObjectItemCaseSensitive(b, "enum");
    if (!(ca || cJSON_IsArray(ea)) || !(cb || cJSON_IsArray(eb))) return false;
    for (const cJSON *x = ca ? ca : ea->child; x; x = ca ? NULL : x->next)
        for (const cJSON *y = cb ? cb : eb->child; y; y = cb ? NULL : y->next)
            if (cJSON_Compare(x, y, true)) return false;
    return true;
}

static bool has_str(const cJSON *list, const char *k) {
    for (const cJSON *e = cJSON_IsArray(list) ? list->child : NULL; e; e = e->next)
        if (cJSON_IsString(e) && !strcmp(e->valuestring, k)) return true;
    return false;
}

/* an instance of a always has a key that b forbids */
static bool key_excludes(const cJSON *a, const cJSON *b) {
    bool closed = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(b, "additionalProperties"));
    const cJSON *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    const cJSON *ra = cJSON_GetObjectItemCaseSensitive(a, "required");
    for (const cJSON *r = cJSON_IsArray(ra) ? ra->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) continue;
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(pb, r->valuestring);
        if ((closed && !q) || cJSON_IsFalse(q)) return true;
    }
    return false;
}

/* Conservative: true only when no value can match both. */
static bool disjoint(sc *c, const cJSON *a, const cJSON *b) {
    a = deref(c, a);
    b = deref(c, b);
    int ka = kinds(a), kb = kinds(b);
    if (!(ka & kb)) return true;
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) return false;
    if (values_disjoint(a, b)) return true;
    if ((ka & kb) != T_OBJECT) return false; /* other shared types could match both */
    /* objects: a required property both define with disjoint values */
    const cJSON *pa = cJSON_GetObjectItemCaseSensitive(a, "properties"), *pb = cJSON_GetObjectItemCaseSensitive(b, "properties");
    for (const cJSON *p = cJSON_IsObject(pa) ? pa->child : NULL; p; p = p->next) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(pb, p->string);
        if (q && has_str(cJSON_GetObjectItemCaseSensitive(a, "required"), p->string) &&
            has_str(cJSON_GetObjectItemCaseSensitive(b, "required"), p->string) && disjoint(c, p, q))
            return true;
    }
    return key_excludes(a, b) || key_excludes(b, a);
}

/* The finite list of values s allows, if it has one: its const or enum, or
 * one of an allOf branch or a $ref target (the other keywords only remove
 * values). *one: the list is a single const value. */
static const cJSON *finite_values(sc *c, const cJSON *s, bool *one, int depth) {
    if (!cJSON_IsObject(s) || depth > 16) return NULL;
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (cst) {
        *one = true;
        return cst;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cJSON_IsArray(en)) {
        *one = false;
        return en->child ? en->child : en;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    for (const cJSON *e = cJSON_IsArray(all) ? all->child : NULL; e; e = e->next) {
        const cJSON *v = finite_values(c, e, one, depth + 1);
        if (v) return v;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (cJSON_IsString(ref)) return finite_values(c, kgr_json_pointer(c->root, ref->valuestring), one, depth + 1);
    return NULL;
}

/* A schema with a finite list of values is exactly the values that validate
 * against it (whatever else it says: not, if/then/else, uniqueItems, ...).
 * false: the validator cannot decide some value (the caller compiles the
 * schema the ordinary way, which refuses what it cannot honour). */
static bool gen_finite(sc *c, const cJSON *s, kgr_buf *b) {
    bool one = false;
    const cJSON *first = finite_values(c, s, &one, 0);
    if (!first) return false;
    kgr_buf t = {0};
    int kept = 0;
    kgr_buf_puts(&t, "(");
    /* an empty enum is the array itself (no values) */
    for (const cJSON *e = cJSON_IsArray(first) && !first->child && !one ? NULL : first; e; e = one ? NULL : e->next) {
        char err[200];
        int r = kgr_validate(c->root, s, e, err, sizeof err);
        if (r == KGR_V_UNSUPPORTED) {
            free(t.p);
            return false;
        }
        if (r != KGR_V_VALID) continue;
        if (kept++) kgr_buf_puts(&t, " | ");
        lit_value(&t, e);
    }
    if (!kept) kgr_buf_puts(&t, "[^\\U00000000-\\U0010FFFF]");
    kgr_buf_puts(&t, ")");
    if (t.oom) {
        free(t.p);
        return false;
    }
    kgr_buf_put(b, t.p, t.n);
    free(t.p);
    return true;
}

static bool gen_body(sc *c, const cJSON *s, const char *ptr, kgr_buf *b);

/* dependencies / dependentRequired / dependentSchemas, one name at a time: the object without
 * that name, or with it and what it needs (the names, or the schema merged
 * in through allOf), as anyOf of the two. Exact, and at most 2^8 variants. */
static bool gen_dependency(sc *c, const cJSON *s, const cJSON *deps, const char *ptr, kgr_buf *b) {
    const cJSON *d = deps->child;
    int n = cJSON_GetArraySize(deps);
    if (n > 8) return fail(c, ptr, "'%s' with over 8 names", deps->string);
    if (!cJSON_IsArray(d) && !cJSON_IsObject(d) && !cJSON_IsBool(d))
        return fail(c, ptr, "'%s' value is not an array or a schema", deps->string);
    cJSON *without = own(c, cJSON_Duplicate(s, true)), *with = own(c, cJSON_Duplicate(s, true));
    cJSON *alts = own(c, cJSON_CreateObject());
    if (!without || !with || !alts) return fail(c, ptr, "%s", "out of memory");
    for (cJSON *v = without; v; v = v == without ? with : NULL) { /* this name's entry goes from both */
        cJSON *dv = cJSON_GetObjectItemCaseSensitive(v, deps->string);
        cJSON_DeleteItemFromObjectCaseSensitive(dv, d->string);
        if (!dv->child) cJSON_DeleteItemFromObjectCaseSensitive(v, deps->string);
    }
    /* without: the name never appears (unless it is required: then no variant) */
    cJSON *pr = cJSON_GetObjectItemCaseSensitive(without, "properties");
    if (!pr) pr = cJSON_AddObjectToObject(without, "properties");
    if (!cJSON_IsObject(pr)) return fail(c, ptr, "'%s' is not an object", "properties");
    if (cJSON_GetObjectItemCaseSensitive(pr, d->string)) cJSON_ReplaceItemInObjectCaseSensitive(pr, d->string, cJSON_CreateFalse());
    else cJSON_AddItemToObject(pr, d->string, cJSON_CreateFalse());
    /* with: the name required, and its names required or its schema merged */
    cJSON *req = cJSON_GetObjectItemCaseSensitive(with, "required");
    if (!req) req = cJSON_AddArrayToObject(with, "required");
    if (!cJSON_IsArray(req)) return fail(c, ptr, "'%s' is not an array", "required");
    cJSON_AddItemToArray(req, cJSON_CreateString(d->string));
    if (cJSON_IsArray(d)) {
        for (const cJSON *r = d->child; r; r = r->next) {
            if (!cJSON_IsString(r)) return fail(c, ptr, "'%s' names that are not strings", deps->string);
            cJSON_AddItemToArray(req, cJSON_CreateString(r->valuestring));
        }
    } else { /* allOf [with, d]: merged in that order, so the properties keep s's order */
        cJSON *w = own(c, cJSON_CreateObject()), *all = w ? cJSON_AddArrayToObject(w, "allOf") : NULL;
        if (!all) return fail(c, ptr, "%s", "out of memory");
        cJSON_AddItemToArray(all, cJSON_Duplicate(with, true));
        cJSON_AddItemToArray(all, cJSON_Duplicate(d, true));
        with = w;
    }
    bool required = false;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(s, "required");
    for (const cJSON *r = cJSON_IsArray(rs) ? rs->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, d->string)) required = true;
    cJSON *l = cJSON_AddArrayToObject(alts, "anyOf");
    if (!l) return fail(c, ptr, "%s", "out of memory");
    if (!required) cJSON_AddItemToArray(l, cJSON_Duplicate(without, true));
    cJSON_AddItemToArray(l, cJSON_Duplicate(with, true));
    return gen_body(c, alts, ptr, b);
}

static bool gen_body(sc *c, const cJSON *s, const char *ptr, kgr_buf *b) {
    char n[48], tmp[512];
    if (cJSON_IsTrue(s) || (cJSON_IsObject(s) && !s->child)) {
        kgr_buf_puts(b, prim(c, P_VALUE, n));
        return true;
    }
    if (cJSON_IsFalse(s)) {
        kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
        return true;
    }
    if (!cJSON_IsObject(s)) return fail(c, ptr, "a schema must be an object or a boolean%s", "");
    const cJSON *ref0 = c->ref_only ? cJSON_GetObjectItemCaseSensitive(s, "$ref") : NULL;
    if (cJSON_IsString(ref0)) { /* the referenced schema alone, as those drafts say */
        const cJSON *t = resolve(c, ref0->valuestring, ptr);
        if (!t || !gen(c, t, ref0->valuestring, n)) return false;
        kgr_buf_puts(b, n);
        return true;
    }
    if (gen_finite(c, s, b)) return true;
    const cJSON *deps = cJSON_GetObjectItemCaseSensitive(s, "dependentRequired");
    if (!deps) deps = cJSON_GetObjectItemCaseSensitive(s, "dependentSchemas");
    if (!deps) deps = cJSON_GetObjectItemCaseSensitive(s, "dependencies");
    if (cJSON_IsObject(deps) && deps->child) return gen_dependency(c, s, deps, ptr, b);
    if (!check_keywords(c, s, ptr)) return false;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(s, "allOf");
    /* $ref beside other assertions, or allOf: merge into one schema */
    bool ref_alone = true;
    if (ref)
        for (const cJSON *k = s->child; k; k = k->next)
            if (strcmp(k->string, "$ref") && strcmp(k->string, "$defs") && strcmp(k->string, "definitions") &&
                in_list(handled, k->string))
                ref_alone = false;
    if (ref && !cJSON_IsString(ref)) return fail(c, ptr, "'%s' is not a string", "$ref");
    if (ref && ref_alone) {
        const cJSON *t = resolve(c, ref->valuestring, ptr);
        if (!t) return false;
        if (!gen(c, t, ref->valuestring, n)) return false;
        kgr_buf_puts(b, n);
        return true;
    }
    if (all || ref) {
        if (all && !cJSON_IsArray(all)) return fail(c, ptr, "'%s' is not an array", "allOf");
        cJSON *m = own(c, cJSON_CreateObject());
        if (!m) return fail(c, ptr, "%s", "out of memory");
        if (!merge_into(c, m, s, ptr, 0)) return false;
        cJSON_DeleteItemFromObjectCaseSensitive(m, "$ref");
        cJSON_DeleteItemFromObjectCaseSensitive(m, "allOf");
        if (cJSON_GetObjectItemCaseSensitive(m, "$ref") || cJSON_GetObjectItemCaseSensitive(m, "allOf"))
            return fail(c, ptr, "'%s' it cannot merge", "allOf");
        return gen_body(c, m, ptr, b);
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const cJSON *one = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
    if (any && one) return fail(c, ptr, "'%s' together with anyOf", "oneOf");
    const cJSON *alts = any ? any : one;
    if (alts) {
        if (!cJSON_IsArray(alts) || !alts->child) return fail(c, ptr, "'%s' is not a non-empty array", any ? "anyOf" : "oneOf");
        /* sibling assertions apply to every branch: merge them into each */
        bool siblings = false;
        for (const cJSON *k = s->child; k; k = k->next)
            if (k != alts && in_list(handled, k->string) && strcmp(k->string, "$defs") && strcmp(k->string, "definitions"))
                siblings = true;
        int nb = cJSON_GetArraySize(alts);
        const cJSON **br = calloc((size_t)nb, sizeof *br);
        bool *owned = calloc((size_t)nb, 1), *drop = calloc((size_t)nb, 1);
        if (!br || !owned || !drop) {
            free(br), free(owned), free(drop);
            return fail(c, ptr, "%s", "out of memory");
        }
        bool ok = true;
        int i = 0;
        for (const cJSON *e = alts->child; ok && e; e = e->next, i++) {
            br[i] = e;
            if (!siblings) continue;
            char idx[16];
            snprintf(idx, sizeof idx, "%d", i);
            child_ptr(tmp, ptr, any ? "anyOf" : "oneOf", idx);
            cJSON *m = own(c, cJSON_CreateObject());
            if (!m) ok = fail(c, ptr, "%s", "out of memory");
            for (const cJSON *k = s->child; ok && k; k = k->next)
                if (k != alts) cJSON_AddItemToObject(m, k->string, cJSON_Duplicate(k, true));
            if (ok) ok = merge_into(c, m, e, tmp, 0);
            if (ok) {
                cJSON_DeleteItemFromObjectCaseSensitive(m, "$ref");
                cJSON_DeleteItemFromObjectCaseSensitive(m, "allOf");
                br[i] = m;
            }
        }
        /* anyOf's grammar is exact for oneOf only when no value matches two
         * branches. Branch j that only lists required names (beside the
         * shared siblings) is excluded from branch i exactly by leaving out
         * its one name that i does not require; i is impossible when it
         * requires all of them. */
        const cJSON **orig = calloc((size_t)nb, sizeof *orig); /* the branches before refinement */
        if (!orig) ok = fail(c, ptr, "%s", "out of memory");
        for (int x = 0; ok && x < nb; x++) orig[x] = br[x];
        /* refined branch x must exclude every other original branch y */
        for (int x = 0; ok && one && x < nb; x++)
            for (int y = 0; ok && y < nb; y++) {
                if (x == y || drop[x] || disjoint(c, br[x], orig[y])) continue;
                const cJSON *oj = deref(c, cJSON_GetArrayItem(alts, y));
                const cJSON *rj = cJSON_IsObject(oj) ? cJSON_GetObjectItemCaseSensitive(oj, "required") : NULL;
                bool only_req = cJSON_IsArray(rj);
                for (const cJSON *k = cJSON_IsObject(oj) ? oj->child : NULL; k; k = k->next)
                    if (k != rj && in_list(handled, k->string)) only_req = false;
                if (!only_req || !cJSON_IsObject(br[x])) continue; /* y's turn may refine y against x */
                const cJSON *ri = cJSON_GetObjectItemCaseSensitive(br[x], "required");
                const char *miss = NULL;
                int n_miss = 0;
                for (const cJSON *r = rj->child; r; r = r->next)
                    if (cJSON_IsString(r) && !has_str(ri, r->valuestring)) miss = r->valuestring, n_miss++;
                if (n_miss == 0) {
                    drop[x] = true;
                    continue;
                }
                if (n_miss > 1) continue;
                if (!owned[x]) { /* refine a copy: orig[x] stays what x said */
                    cJSON *m = own(c, cJSON_Duplicate(br[x], true));
                    if (!m) ok = fail(c, ptr, "%s", "out of memory");
                    else br[x] = m, owned[x] = true;
                }
                if (!ok) break;
                cJSON *m = (cJSON *)br[x], *pr = cJSON_GetObjectItemCaseSensitive(m, "properties");
                if (!cJSON_IsObject(pr)) {
                    cJSON_DeleteItemFromObjectCaseSensitive(m, "properties");
                    pr = cJSON_AddObjectToObject(m, "properties");
                }
                if (pr) {
                    cJSON_DeleteItemFromObjectCaseSensitive(pr, miss);
                    cJSON_AddItemToObject(pr, miss, cJSON_CreateFalse());
                }
            }
        for (int x = 0; ok && one && x < nb; x++)
            for (int y = 0; ok && y < nb; y++)
                if (x != y && !drop[x] && !disjoint(c, br[x], orig[y]))
                    ok = fail(c, ptr, "'%s' whose branches may overlap (it would act as anyOf)", "oneOf");
        kgr_buf_puts(b, "(");
        int kept = 0;
        for (i = 0; ok && i < nb; i++) {
            if (drop[i]) continue;
            char idx[16];
            snprintf(idx, sizeof idx, "%d", i);
            child_ptr(tmp, ptr, any ? "anyOf" : "oneOf", idx);
            ok = gen(c, br[i], tmp, n);
            if (ok) kgr_buf_printf(b, "%s%s", kept++ ? " | " : "", n);
        }
        if (ok && !kept) kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
        free(br), free(owned), free(drop), free(orig);
        if (!ok) return false;
        kgr_buf_puts(b, ")");
        return true;
    }
    /* types */
    int types = 0;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(ty)) {
        types = type_bit(ty->valuestring);
        if (!types) return fail(c, ptr, "unknown type '%s'", ty->valuestring);
    } else if (cJSON_IsArray(ty)) {
        for (const cJSON *e = ty->child; e; e = e->next) {
            int t = cJSON_IsString(e) ? type_bit(e->valuestring) : 0;
            if (!t) return fail(c, ptr, "unknown type in '%s'", "type");
            types |= t;
        }
    } else if (ty) return fail(c, ptr, "'%s' is not a string or an array", "type");
    else types = T_ALL;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) types |= T_NULL;
    if (types & T_NUMBER) types &= ~T_INTEGER;
    const cJSON *cst = cJSON_GetObjectItemCaseSensitive(s, "const");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cst || en) {
        if (en && !cJSON_IsArray(en)) return fail(c, ptr, "'%s' is not an array", "enum");
        int kept = 0;
        kgr_buf_puts(b, "(");
        const cJSON *first = cst ? cst : en->child;
        for (const cJSON *e = first; e; e = cst ? NULL : e->next) {
            if (!value_has_type(e, types | (types & T_NUMBER ? T_INTEGER : 0))) continue;
            if (cst && en) { /* both: the const must be in the enum */
                bool found = false;
                for (const cJSON *x = en->child; x; x = x->next)
                    if (cJSON_Compare(x, cst, true)) found = true;
                if (!found) continue;
            }
            if (cJSON_IsObject(e) || cJSON_IsArray(e) || (cJSON_IsString(e) && (cJSON_GetObjectItemCaseSensitive(s, "pattern") ||
                                                                                  cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                                                                                  cJSON_GetObjectItemCaseSensitive(s, "maxLength")))) {
                /* the other keywords could exclude it: refuse rather than guess */
                if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "items") ||
                    cJSON_GetObjectItemCaseSensitive(s, "pattern") || cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                    cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
                    return fail(c, ptr, "'%s' together with other constraints", cst ? "const" : "enum");
            }
            if (kept++) kgr_buf_puts(b, " | ");
            lit_value(b, e);
        }
        if (!kept) kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]");
        kgr_buf_puts(b, ")");
        return true;
    }
    kgr_buf_puts(b, "(");
    int k = 0;
    for (int t = 1; t <= T_NULL; t <<= 1) {
        if (!(types & t)) continue;
        if (k++) kgr_buf_puts(b, " | ");
        if (!gen_typed(c, s, ptr, t, b)) return false;
    }
    kgr_buf_puts(b, ")");
    return true;
}

/* A rule for schema s; $ref targets and shared nodes get one rule each (so
 * recursion works: the name exists before the body). */
static bool gen(sc *c, const cJSON *s, const char *ptr, char *name) {
    for (memo *m = c->memo; m; m = m->next)
        if (m->node == s) {
            memcpy(name, m->name, 48);
            return true;
        }
    if (++c->depth > MAX_DEPTH) return fail(c, ptr, "schema nests deeper than %s levels", "128");
    memo *m = calloc(1, sizeof *m);
    if (!m) return fail(c, ptr, "%s", "out of memory");
    fresh(c, m->name);
    m->node = s;
    m->next = c->memo;
    c->memo = m;
    memcpy(name, m->name, 48);
    kgr_buf b = {0};
    bool ok = gen_body(c, s, ptr, &b);
    if (ok) rule(c, m->name, b.p ? b.p : "\"\"");
    free(b.p);
    c->depth--;
    return ok;
}

char *kgr_json_dumps(const cJSON *v) { return kgr_json_dumps_lits(v, NULL, NULL); }

char *kgr_json_dumps_lits(const cJSON *v, const char *(*lit)(void *ud, const cJSON *n, size_t *len), void *ud) {
    kgr_buf b = {0};
    py_lits L = {lit, ud};
    py_dumps_l(&b, v, lit ? &L : NULL);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p ? b.p : calloc(1, 1);
}

void kgr_opts_default(kgr_opts *o) { *o = (kgr_opts){.max_ws = 4, .additional_properties = true}; }

kiln_status kgr_schema_to_gbnf(const cJSON *schema, const kgr_opts *o, const char *prefix, char **gbnf) {
    *gbnf = NULL;
    sc c = {.root = schema, .prefix = prefix ? prefix : ""};
    const cJSON *draft = cJSON_GetObjectItemCaseSensitive(schema, "$schema");
    if (cJSON_IsString(draft))
        c.ref_only = strstr(draft->valuestring, "draft-03") || strstr(draft->valuestring, "draft-04") ||
                     strstr(draft->valuestring, "draft-06") || strstr(draft->valuestring, "draft-07");
    if (o) c.o = *o;
    else kgr_opts_default(&c.o);
    char top[48];
    bool ok = gen(&c, schema, "", top);
    if (ok) kgr_buf_printf(&c.out, "root ::= %s\n", top);
    for (memo *m = c.memo, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    for (int32_t i = 0; i < c.n_owned; i++) cJSON_Delete(c.owned[i]);
    free(c.owned);
    if (!ok || c.out.oom) {
        free(c.out.p);
        if (!ok) return kiln_error(KILN_EINVAL, "%s", c.err[0] ? c.err : "json schema: out of memory");
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    *gbnf = c.out.p;
    return NULL;
}

kiln_status kgr_from_schema(const cJSON *schema, const kgr_opts *o, kgr_grammar **out) {
    *out = NULL;
    char *g;
    KILN_TRY(kgr_schema_to_gbnf(schema, o, NULL, &g));
    kiln_status st = kgr_from_gbnf(g, strlen(g), out);
    free(g);
    return kiln_status_wrap(st, "json schema");
}

kiln_status kgr_from_json_schema(const char *text, size_t len, const kgr_opts *o, kgr_grammar **out) {
    *out = NULL;
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) return kiln_error(KILN_EINVAL, "json schema: not valid JSON");
    kiln_status st = kgr_from_schema(j, o, out);
    cJSON_Delete(j);
    return st;
}
