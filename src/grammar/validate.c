/* validate.c: JSON Schema instance validation (drafts 4 to 2020-12), for
 * schemas whose values are a finite list (enum / const): the grammar is then
 * the list's values that validate against the whole schema, exact whatever
 * other keywords sit beside the list (not, if/then/else, uniqueItems, ...).
 *
 * Follows the spec's semantics (and Python jsonschema's, which MaskBench's
 * expectations come from): unknown keywords are annotations; an assertion
 * it cannot evaluate (format, unevaluated*, dynamic or remote refs) makes
 * the answer KGR_V_UNSUPPORTED, never a guess. Patterns are searches
 * (PCRE2, UTF mode; $ only at the very end, as in ECMAScript). $ref applies beside its siblings (2019-09 on). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <string.h>

#include "grammar/gr_int.h"

const cJSON *kgr_json_pointer(const cJSON *root, const char *ref) {
    if (ref[0] != '#' || (ref[1] && ref[1] != '/')) return NULL;
    const cJSON *n = root;
    const char *p = ref + 1;
    while (n && *p == '/') {
        p++;
        char tok[256];
        size_t k = 0;
        for (; *p && *p != '/' && k + 1 < sizeof tok; p++) {
            if (*p == '~' && p[1] == '0') tok[k++] = '~', p++;
            else if (*p == '~' && p[1] == '1') tok[k++] = '/', p++;
            else if (*p == '%' && p[1] && p[2]) {
                char h[3] = {p[1], p[2], 0};
                tok[k++] = (char)strtol(h, NULL, 16);
                p += 2;
            } else tok[k++] = *p;
        }
        tok[k] = 0;
        if (cJSON_IsArray(n)) {
            char *end;
            long i = strtol(tok, &end, 10);
            n = *end ? NULL : cJSON_GetArrayItem(n, (int)i);
        } else n = cJSON_IsObject(n) ? cJSON_GetObjectItemCaseSensitive(n, tok) : NULL;
    }
    return n;
}

typedef struct {
    const cJSON *root;
    char *err;
    size_t n_err;
    int depth;
} vc;

static int unsupported(vc *v, const char *what) {
    if (v->err && v->n_err && !v->err[0]) snprintf(v->err, v->n_err, "%s", what);
    return KGR_V_UNSUPPORTED;
}

static const cJSON *kw(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

/* JSON Schema equality: numbers by value (1 == 1.0), objects unordered */
static bool json_eq(const cJSON *a, const cJSON *b) { return cJSON_Compare(a, b, true); }

static bool is_int(const cJSON *x) {
    return cJSON_IsNumber(x) && isfinite(x->valuedouble) && x->valuedouble == floor(x->valuedouble);
}

static bool type_ok(const char *t, const cJSON *x) {
    if (!strcmp(t, "null")) return cJSON_IsNull(x);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(x);
    if (!strcmp(t, "number")) return cJSON_IsNumber(x);
    if (!strcmp(t, "integer")) return is_int(x);
    if (!strcmp(t, "string")) return cJSON_IsString(x);
    if (!strcmp(t, "array")) return cJSON_IsArray(x);
    if (!strcmp(t, "object")) return cJSON_IsObject(x);
    return false;
}

static int64_t cp_len(const char *s) {
    int64_t n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

int kgr_regex_search(const char *pat, const char *s) {
    int e;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &e, &off, NULL);
    if (!re) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int r = md ? pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return r >= 0 ? 1 : r == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

static int val(vc *v, const cJSON *s, const cJSON *x);

/* folds one result into the running one: unsupported wins, then invalid */
#define FOLD(acc, r)                                          \
    do {                                                      \
        int r_ = (r);                                         \
        if (r_ == KGR_V_UNSUPPORTED) return KGR_V_UNSUPPORTED; \
        if (r_ == KGR_V_INVALID) acc = KGR_V_INVALID;         \
    } while (0)

static int num_kw(vc *v, const cJSON *s, const cJSON *x) {
    double d = x->valuedouble;
    int acc = KGR_V_VALID;
    const cJSON *mn = kw(s, "minimum"), *mx = kw(s, "maximum");
    const cJSON *emn = kw(s, "exclusiveMinimum"), *emx = kw(s, "exclusiveMaximum");
    if (cJSON_IsNumber(mn) && (d < mn->valuedouble || (cJSON_IsTrue(emn) && d == mn->valuedouble))) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(mx) && (d > mx->valuedouble || (cJSON_IsTrue(emx) && d == mx->valuedouble))) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(emn) && d <= emn->valuedouble) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(emx) && d >= emx->valuedouble) acc = KGR_V_INVALID;
    const cJSON *mo = kw(s, "multipleOf");
    if (cJSON_IsNumber(mo)) {
        if (mo->valuedouble <= 0) return unsupported(v, "'multipleOf' that is not positive");
        double q = d / mo->valuedouble;
        if (!isfinite(q)) return unsupported(v, "'multipleOf' quotient out of range");
        if (q != trunc(q)) acc = KGR_V_INVALID;
    }
    return acc;
}

static int str_kw(vc *v, const cJSON *s, const cJSON *x) {
    int acc = KGR_V_VALID;
    int64_t n = cp_len(x->valuestring);
    const cJSON *mn = kw(s, "minLength"), *mx = kw(s, "maxLength"), *pat = kw(s, "pattern");
    if (cJSON_IsNumber(mn) && (double)n < mn->valuedouble) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(mx) && (double)n > mx->valuedouble) acc = KGR_V_INVALID;
    if (cJSON_IsString(pat)) {
        int r = kgr_regex_search(pat->valuestring, x->valuestring);
        if (r < 0) return unsupported(v, "a 'pattern' it cannot evaluate");
        if (!r) acc = KGR_V_INVALID;
    }
    if (kw(s, "format")) return unsupported(v, "'format' beside 'enum'/'const'");
    return acc;
}

static int arr_kw(vc *v, const cJSON *s, const cJSON *x) {
    int acc = KGR_V_VALID;
    int n = cJSON_GetArraySize(x);
    const cJSON *mn = kw(s, "minItems"), *mx = kw(s, "maxItems");
    if (cJSON_IsNumber(mn) && n < mn->valuedouble) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(mx) && n > mx->valuedouble) acc = KGR_V_INVALID;
    const cJSON *items = kw(s, "items"), *prefix = kw(s, "prefixItems"), *add = kw(s, "additionalItems");
    const cJSON *tuple = cJSON_IsArray(prefix) ? prefix : cJSON_IsArray(items) ? items : NULL;
    const cJSON *rest = cJSON_IsArray(prefix) ? items : cJSON_IsArray(items) ? add : items;
    int i = 0;
    const cJSON *t = tuple ? tuple->child : NULL;
    for (const cJSON *e = x->child; e; e = e->next, i++) {
        if (t) {
            FOLD(acc, val(v, t, e));
            t = t->next;
        } else if (rest && !cJSON_IsArray(rest)) FOLD(acc, val(v, rest, e));
    }
    if (cJSON_IsTrue(kw(s, "uniqueItems")))
        for (const cJSON *a = x->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (json_eq(a, b)) acc = KGR_V_INVALID;
    const cJSON *con = kw(s, "contains");
    if (con) {
        int hits = 0;
        for (const cJSON *e = x->child; e; e = e->next) {
            int r = val(v, con, e);
            if (r == KGR_V_UNSUPPORTED) return r;
            hits += r == KGR_V_VALID;
        }
        const cJSON *mnc = kw(s, "minContains"), *mxc = kw(s, "maxContains");
        double lo = cJSON_IsNumber(mnc) ? mnc->valuedouble : 1;
        if (hits < lo) acc = KGR_V_INVALID;
        if (cJSON_IsNumber(mxc) && hits > mxc->valuedouble) acc = KGR_V_INVALID;
    }
    return acc;
}

static int obj_kw(vc *v, const cJSON *s, const cJSON *x) {
    int acc = KGR_V_VALID;
    int n = cJSON_GetArraySize(x);
    const cJSON *mn = kw(s, "minProperties"), *mx = kw(s, "maxProperties");
    if (cJSON_IsNumber(mn) && n < mn->valuedouble) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(mx) && n > mx->valuedouble) acc = KGR_V_INVALID;
    const cJSON *req = kw(s, "required");
    for (const cJSON *r = cJSON_IsArray(req) ? req->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !kw(x, r->valuestring)) acc = KGR_V_INVALID;
    const cJSON *props = kw(s, "properties"), *pp = kw(s, "patternProperties"), *add = kw(s, "additionalProperties");
    const cJSON *names = kw(s, "propertyNames");
    for (const cJSON *m = x->child; m; m = m->next) {
        bool matched = false;
        const cJSON *p = cJSON_IsObject(props) ? kw(props, m->string) : NULL;
        if (p) {
            matched = true;
            FOLD(acc, val(v, p, m));
        }
        for (const cJSON *q = cJSON_IsObject(pp) ? pp->child : NULL; q; q = q->next) {
            int r = kgr_regex_search(q->string, m->string);
            if (r < 0) return unsupported(v, "a 'patternProperties' pattern it cannot evaluate");
            if (r) {
                matched = true;
                FOLD(acc, val(v, q, m));
            }
        }
        if (!matched && add) FOLD(acc, val(v, add, m));
        if (names) {
            cJSON *k = cJSON_CreateString(m->string);
            if (!k) return unsupported(v, "out of memory");
            int r = val(v, names, k);
            cJSON_Delete(k);
            FOLD(acc, r);
        }
    }
    /* dependencies (draft 4-7) and its 2019-09 split */
    const char *const dep_kw[] = {"dependencies", "dependentRequired", "dependentSchemas"};
    for (int i = 0; i < 3; i++) {
        const cJSON *deps = kw(s, dep_kw[i]);
        for (const cJSON *d = cJSON_IsObject(deps) ? deps->child : NULL; d; d = d->next) {
            if (!kw(x, d->string)) continue;
            if (cJSON_IsArray(d)) {
                for (const cJSON *r = d->child; r; r = r->next)
                    if (cJSON_IsString(r) && !kw(x, r->valuestring)) acc = KGR_V_INVALID;
            } else FOLD(acc, val(v, d, x));
        }
    }
    return acc;
}

static int val(vc *v, const cJSON *s, const cJSON *x) {
    if (cJSON_IsTrue(s)) return KGR_V_VALID;
    if (cJSON_IsFalse(s)) return KGR_V_INVALID;
    if (!cJSON_IsObject(s)) return unsupported(v, "a schema that is not an object or a boolean");
    if (++v->depth > 64) return unsupported(v, "schemas nested (or recursing) deeper than 64 levels");
    int acc = KGR_V_VALID;
    static const char *const refused[] = {"unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef", NULL};
    for (const char *const *k = refused; *k; k++)
        if (kw(s, *k)) {
            v->depth--;
            return unsupported(v, *k);
        }
    const cJSON *ref = kw(s, "$ref");
    if (cJSON_IsString(ref)) {
        const cJSON *t = kgr_json_pointer(v->root, ref->valuestring);
        if (!t) {
            v->depth--;
            return unsupported(v, "a '$ref' that is not a local JSON pointer");
        }
        FOLD(acc, val(v, t, x));
    }
    const cJSON *ty = kw(s, "type");
    bool typed = true;
    if (cJSON_IsString(ty)) typed = type_ok(ty->valuestring, x);
    if (cJSON_IsArray(ty)) {
        typed = false;
        for (const cJSON *e = ty->child; e; e = e->next) typed |= cJSON_IsString(e) && type_ok(e->valuestring, x);
    }
    if (!typed && !(cJSON_IsNull(x) && cJSON_IsTrue(kw(s, "nullable")))) acc = KGR_V_INVALID; /* OpenAPI's nullable */
    const cJSON *en = kw(s, "enum");
    if (cJSON_IsArray(en)) {
        bool found = false;
        for (const cJSON *e = en->child; e && !found; e = e->next) found = json_eq(e, x);
        if (!found) acc = KGR_V_INVALID;
    }
    const cJSON *cst = kw(s, "const");
    if (cst && !json_eq(cst, x)) acc = KGR_V_INVALID;
    if (cJSON_IsNumber(x)) FOLD(acc, num_kw(v, s, x));
    if (cJSON_IsString(x)) FOLD(acc, str_kw(v, s, x));
    if (cJSON_IsArray(x)) FOLD(acc, arr_kw(v, s, x));
    if (cJSON_IsObject(x)) FOLD(acc, obj_kw(v, s, x));
    const cJSON *all = kw(s, "allOf"), *any = kw(s, "anyOf"), *one = kw(s, "oneOf");
    for (const cJSON *e = cJSON_IsArray(all) ? all->child : NULL; e; e = e->next) FOLD(acc, val(v, e, x));
    if (cJSON_IsArray(any)) {
        bool ok = false;
        for (const cJSON *e = any->child; e; e = e->next) {
            int r = val(v, e, x);
            if (r == KGR_V_UNSUPPORTED) return r;
            ok |= r == KGR_V_VALID;
        }
        if (!ok) acc = KGR_V_INVALID;
    }
    if (cJSON_IsArray(one)) {
        int hits = 0;
        for (const cJSON *e = one->child; e; e = e->next) {
            int r = val(v, e, x);
            if (r == KGR_V_UNSUPPORTED) return r;
            hits += r == KGR_V_VALID;
        }
        if (hits != 1) acc = KGR_V_INVALID;
    }
    const cJSON *no = kw(s, "not");
    if (no) {
        int r = val(v, no, x);
        if (r == KGR_V_UNSUPPORTED) return r;
        if (r == KGR_V_VALID) acc = KGR_V_INVALID;
    }
    const cJSON *cond = kw(s, "if");
    if (cond) {
        int r = val(v, cond, x);
        if (r == KGR_V_UNSUPPORTED) return r;
        const cJSON *br = kw(s, r == KGR_V_VALID ? "then" : "else");
        if (br) FOLD(acc, val(v, br, x));
    }
    v->depth--;
    return acc;
}

int kgr_validate(const cJSON *root, const cJSON *schema, const cJSON *x, char *err, size_t n_err) {
    if (err && n_err) err[0] = 0;
    vc v = {.root = root, .err = err, .n_err = n_err};
    return val(&v, schema, x);
}
