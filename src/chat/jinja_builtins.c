/* jinja_builtins.c: filters, tests, string and object methods, and the
 * JSON and string conversions, each as @huggingface/jinja 0.5.11 has them
 * (e.g. `title` only upper-cases ASCII word starts, `strip` ignores its
 * argument, `tojson` defaults to Python's ", " / ": " separators). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "chat/jinja_rt.h"

/* ---- string forms ------------------------------------------------------ */

static bool emit_num(kj_ctx *c, const kj_node *n, double d, kj_buf *b) {
    char tmp[40];
    kj_js_num(d, tmp);
    return kj_emit(c, n, b, tmp, strlen(tmp));
}

/* FloatValue.toString(): integral floats keep one decimal ("2.0"). */
static bool emit_float(kj_ctx *c, const kj_node *n, double d, kj_buf *b) {
    char tmp[400];
    if (d == 0 && signbit(d)) return kj_emit(c, n, b, "-0.0", 4);
    if (isfinite(d) && d == floor(d) && fabs(d) < 1e21) {
        snprintf(tmp, sizeof tmp, "%.1f", d);
        return kj_emit(c, n, b, tmp, strlen(tmp));
    }
    return emit_num(c, n, d, b);
}

static bool no_json(kj_ctx *c, const kj_node *n, kj_val v) {
    if (v.t == V_JSUNDEF) kj_fail(c, n, "cannot read properties of undefined");
    else kj_fail(c, n, "cannot convert to JSON: %s", kj_typename(v));
    return false;
}

bool kj_display(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth) {
    switch (v.t) {
    case V_UNDEF:
    case V_NULL: /* NullValue's value is a JavaScript undefined too */
        return kj_emit(c, n, b, "undefined", 9);
    case V_BOOL: return v.b ? kj_emit(c, n, b, "true", 4) : kj_emit(c, n, b, "false", 5);
    case V_INT: return emit_num(c, n, v.d, b);
    case V_FLOAT: return emit_float(c, n, v.d, b);
    case V_STR: return kj_emit(c, n, b, v.s->p, v.s->len);
    case V_ARR:
    case V_OBJ:
    case V_NS: return kj_tojson(c, n, v, &(kj_json_opts){0}, depth, false, b);
    case V_FN: kj_fail(c, n, "cannot print a function"); return false;
    default: return no_json(c, n, v);
    }
}

bool kj_rawstr(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth) {
    if (depth > KJ_MAX_VALUE_DEPTH) {
        kj_fail(c, n, "value nested too deeply");
        return false;
    }
    switch (v.t) {
    case V_UNDEF:
    case V_JSUNDEF:
    case V_NULL: return true;
    case V_FLOAT:
    case V_INT: return emit_num(c, n, v.d, b);
    case V_ARR:
    case V_TUPLE:
        for (size_t i = 0; i < v.a->n; i++) {
            if (i && !kj_emit(c, n, b, ",", 1)) return false;
            if (v.a->v[i].t != V_JSUNDEF && !kj_display(c, n, v.a->v[i], b, depth + 1)) return false;
        }
        return true;
    case V_OBJ:
    case V_KWARGS:
    case V_NS: return kj_emit(c, n, b, "[object Map]", 12);
    case V_FN: kj_fail(c, n, "cannot convert a function to a string"); return false;
    default: return kj_display(c, n, v, b, depth);
    }
}

static bool json_string(kj_ctx *c, const kj_node *n, const kj_str *s, bool ascii, kj_buf *b) {
    if (!kj_emit(c, n, b, "\"", 1)) return false;
    size_t run = 0; /* bytes copied verbatim, flushed in one go */
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        int k = kj_utf8_dec(s->p, s->len, i, &cp);
        char esc[16];
        const char *e = NULL;
        switch (cp) {
        case '"': e = "\\\""; break;
        case '\\': e = "\\\\"; break;
        case '\b': e = "\\b"; break;
        case '\f': e = "\\f"; break;
        case '\n': e = "\\n"; break;
        case '\r': e = "\\r"; break;
        case '\t': e = "\\t"; break;
        default:
            if (cp < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", cp);
                e = esc;
            } else if (ascii && cp >= 0x7f) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", cp);
                }
                e = esc;
            }
        }
        if (e) {
            if (run && !kj_emit(c, n, b, s->p + i - run, run)) return false;
            run = 0;
            if (!kj_emit(c, n, b, e, strlen(e))) return false;
        } else {
            run += (size_t)k;
        }
        i += (size_t)k;
    }
    if (run && !kj_emit(c, n, b, s->p + s->len - run, run)) return false;
    return kj_emit(c, n, b, "\"", 1);
}

/* An approximation of String.prototype.localeCompare for sort_keys:
 * case-insensitive first, lower case before upper on ties. */
static int locale_cmp(const kj_str *a, const kj_str *b) {
    size_t n = a->len < b->len ? a->len : b->len;
    for (size_t i = 0; i < n; i++) {
        int x = (unsigned char)a->p[i], y = (unsigned char)b->p[i];
        int lx = x >= 'A' && x <= 'Z' ? x + 32 : x, ly = y >= 'A' && y <= 'Z' ? y + 32 : y;
        if (lx != ly) return lx < ly ? -1 : 1;
    }
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    for (size_t i = 0; i < n; i++)
        if (a->p[i] != b->p[i]) return (unsigned char)a->p[i] > (unsigned char)b->p[i] ? -1 : 1;
    return 0;
}

static bool pad(kj_ctx *c, const kj_node *n, kj_buf *b, int indent, int depth) {
    if (!kj_emit(c, n, b, "\n", 1)) return false;
    for (int i = 0; i < depth * indent; i++)
        if (!kj_emit(c, n, b, " ", 1)) return false;
    return true;
}

bool kj_tojson(kj_ctx *c, const kj_node *n, kj_val v, const kj_json_opts *o, int depth, bool undef_null, kj_buf *b) {
    if (depth > KJ_MAX_VALUE_DEPTH) {
        kj_fail(c, n, "value nested too deeply for JSON");
        return false;
    }
    static const kj_str comma_sp = {2, ", "}, comma = {1, ","}, colon_sp = {2, ": "};
    const kj_str *isep = o->item_sep ? o->item_sep : o->indent ? &comma : &comma_sp;
    const kj_str *ksep = o->key_sep ? o->key_sep : &colon_sp;
    switch (v.t) {
    case V_NULL: return kj_emit(c, n, b, "null", 4);
    case V_UNDEF: return undef_null ? kj_emit(c, n, b, "null", 4) : kj_emit(c, n, b, "undefined", 9);
    case V_INT:
    case V_FLOAT: return isfinite(v.d) ? emit_num(c, n, v.d, b) : kj_emit(c, n, b, "null", 4);
    case V_BOOL: return v.b ? kj_emit(c, n, b, "true", 4) : kj_emit(c, n, b, "false", 5);
    case V_STR: return json_string(c, n, v.s, o->ensure_ascii, b);
    case V_ARR:
        if (!kj_emit(c, n, b, "[", 1)) return false;
        for (size_t i = 0; i < v.a->n; i++) {
            if (i && !kj_emit(c, n, b, isep->p, isep->len)) return false;
            if (o->indent && !pad(c, n, b, o->indent, depth + 1)) return false;
            if (!kj_tojson(c, n, v.a->v[i], o, depth + 1, undef_null, b)) return false;
        }
        if (o->indent && v.a->n && !pad(c, n, b, o->indent, depth)) return false;
        return kj_emit(c, n, b, "]", 1);
    case V_OBJ:
    case V_NS: {
        size_t cnt = v.o->n;
        size_t *order = cnt ? kj_alloc(c, cnt * sizeof *order) : NULL;
        if (cnt && !order) return false;
        for (size_t i = 0; i < cnt; i++) order[i] = i;
        if (o->sort_keys) /* insertion sort: stable, and objects are small */
            for (size_t i = 1; i < cnt; i++)
                for (size_t j = i; j > 0 && locale_cmp(v.o->k[order[j - 1]], v.o->k[order[j]]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        if (!kj_emit(c, n, b, "{", 1)) return false;
        for (size_t i = 0; i < cnt; i++) {
            if (i && !kj_emit(c, n, b, isep->p, isep->len)) return false;
            if (o->indent && !pad(c, n, b, o->indent, depth + 1)) return false;
            if (!json_string(c, n, v.o->k[order[i]], o->ensure_ascii, b)) return false;
            if (!kj_emit(c, n, b, ksep->p, ksep->len)) return false;
            if (!kj_tojson(c, n, v.o->v[order[i]], o, depth + 1, undef_null, b)) return false;
        }
        if (o->indent && cnt && !pad(c, n, b, o->indent, depth)) return false;
        return kj_emit(c, n, b, "}", 1);
    }
    default: return no_json(c, n, v);
    }
}

/* ---- comparisons -------------------------------------------------------- */

bool kj_strict_eq(kj_val a, kj_val b) {
    if (a.t == V_JSUNDEF || b.t == V_JSUNDEF) return false;
    if (kj_is_num(a) && kj_is_num(b)) return a.d == b.d;
    if (kj_is_arr(a) && kj_is_arr(b)) return a.a == b.a;
    bool ao = kj_is_obj(a) || a.t == V_NS, bo = kj_is_obj(b) || b.t == V_NS;
    if (ao && bo) return a.o == b.o;
    if ((a.t == V_NULL || a.t == V_UNDEF) && (b.t == V_NULL || b.t == V_UNDEF)) return true; /* both hold undefined */
    if (a.t != b.t) return false;
    switch (a.t) {
    case V_UNDEF:
    case V_NULL: return true;
    case V_BOOL: return a.b == b.b;
    case V_STR: return a.s->len == b.s->len && memcmp(a.s->p, b.s->p, a.s->len) == 0;
    case V_FN: return a.f == b.f;
    default: return false;
    }
}

/* Map.prototype.has / Set semantics (SameValueZero: NaN equals NaN). */
static bool same_value_zero(kj_val a, kj_val b) {
    if (kj_is_num(a) && kj_is_num(b) && isnan(a.d) && isnan(b.d)) return true;
    return kj_strict_eq(a, b);
}

static kj_val js_case(kj_ctx *c, const kj_str *s, bool upper);

bool kj_compare(kj_ctx *c, const kj_node *n, kj_val a, kj_val b, bool cs, int *out) {
    *out = 0;
    if (a.t == V_JSUNDEF || b.t == V_JSUNDEF) {
        kj_fail(c, n, "cannot read properties of undefined");
        return false;
    }
    if (a.t == V_NULL && b.t == V_NULL) return true;
    if (a.t == V_NULL || b.t == V_NULL || ((a.t == V_UNDEF) != (b.t == V_UNDEF))) {
        kj_fail(c, n, "cannot compare %s with %s", kj_typename(a), kj_typename(b));
        return false;
    }
    if (a.t == V_UNDEF) return true;
    bool an = kj_is_num(a) || a.t == V_BOOL, bn = kj_is_num(b) || b.t == V_BOOL;
    if (an && bn) {
        double x = a.t == V_BOOL ? a.b : a.d, y = b.t == V_BOOL ? b.b : b.d;
        *out = x < y ? -1 : x > y ? 1 : 0;
        return true;
    }
    if (a.t != b.t) {
        kj_fail(c, n, "cannot compare different types: %s and %s", kj_typename(a), kj_typename(b));
        return false;
    }
    if (a.t != V_STR) {
        kj_fail(c, n, "cannot compare type: %s", kj_typename(a));
        return false;
    }
    const kj_str *x = a.s, *y = b.s;
    if (!cs) {
        kj_val lx = js_case(c, x, false), ly = js_case(c, y, false);
        if (c->err) return false;
        x = lx.s;
        y = ly.s;
    }
    size_t m = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->p, y->p, m);
    *out = r < 0 ? -1 : r > 0 ? 1 : x->len < y->len ? -1 : x->len > y->len ? 1 : 0;
    return true;
}

/* Stable merge sort with a comparator that may fail (as Array.sort's). */
typedef struct {
    kj_ctx *c;
    const kj_node *n;
    bool cs, reverse;
    const kj_str *attr; /* compare items' attribute paths */
    int by;             /* dictsort: -1 none, 0 key, 1 value */
} sort_opts;

static kj_val sort_key(const sort_opts *o, kj_val v) {
    if (o->by >= 0) return v.a->v[o->by];
    if (o->attr) return kj_attr_path(v, o->attr);
    return v;
}

static bool sort_vals(const sort_opts *o, kj_val *v, size_t n) {
    if (n < 2) return true;
    kj_val *tmp = kj_alloc(o->c, n * sizeof *tmp);
    if (!tmp) return false;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int r;
                if (!kj_step(o->c, o->n, 1) || !kj_compare(o->c, o->n, sort_key(o, v[j]), sort_key(o, v[i]), o->cs, &r))
                    return false;
                if (o->reverse) r = -r;
                tmp[k++] = r < 0 ? v[j++] : v[i++];
            }
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof *v);
    }
    return true;
}

/* ---- JavaScript string functions --------------------------------------- */

static bool is_word(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_';
}

static kj_val js_case(kj_ctx *c, const kj_str *s, bool upper) {
    kj_buf b = {0};
    for (size_t i = 0; i < s->len;) {
        uint32_t cp;
        int k = kj_utf8_dec(s->p, s->len, i, &cp);
        if (cp < 0x80) {
            char ch = (char)cp;
            if (upper && ch >= 'a' && ch <= 'z') ch = (char)(ch - 32);
            if (!upper && ch >= 'A' && ch <= 'Z') ch = (char)(ch + 32);
            if (!kj_emit(c, NULL, &b, &ch, 1)) break;
        } else {
            char u[4];
            int32_t m = upper ? utf8proc_toupper((int32_t)cp) : utf8proc_tolower((int32_t)cp);
            if (!kj_emit(c, NULL, &b, u, (size_t)kj_utf8_enc((uint32_t)m, u))) break;
        }
        i += (size_t)k;
    }
    return kj_buf_str(c, NULL, &b);
}

static size_t lead_space(const kj_str *s) {
    size_t i = 0;
    while (i < s->len) {
        uint32_t cp;
        int k = kj_utf8_dec(s->p, s->len, i, &cp);
        if (!kj_js_space(cp)) break;
        i += (size_t)k;
    }
    return i;
}

static size_t trail_end(const kj_str *s, size_t from) {
    size_t n = s->len;
    while (n > from) {
        size_t j = n - 1;
        while (j > from && ((unsigned char)s->p[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        kj_utf8_dec(s->p, n, j, &cp);
        if (!kj_js_space(cp)) break;
        n = j;
    }
    return n;
}

static kj_val js_trim(kj_ctx *c, const kj_str *s, bool left, bool right) {
    size_t a = left ? lead_space(s) : 0;
    size_t b = right ? trail_end(s, a) : s->len;
    return kj_mkstr(c, s->p + a, b - a);
}

/* parseInt(s, 10); NaN when no digits. */
static double js_parse_int(const kj_str *s) {
    size_t i = lead_space(s);
    double sign = 1;
    if (i < s->len && (s->p[i] == '+' || s->p[i] == '-')) sign = s->p[i++] == '-' ? -1 : 1;
    size_t d0 = i;
    double v = 0;
    while (i < s->len && s->p[i] >= '0' && s->p[i] <= '9') v = v * 10 + (s->p[i++] - '0');
    if (i == d0) return NAN;
    if (i - d0 > 15) { /* exact decimal conversion for long digit runs */
        char buf[512];
        size_t len = i - d0 < sizeof buf - 1 ? i - d0 : sizeof buf - 1;
        memcpy(buf, s->p + d0, len);
        buf[len] = 0;
        v = strtod(buf, NULL);
    }
    return sign * v;
}

/* parseFloat(s): the longest decimal-literal prefix. */
static double js_parse_float(const kj_str *s) {
    size_t i = lead_space(s), st = i;
    const char *p = s->p;
    size_t n = s->len;
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    if (n - i >= 8 && memcmp(p + i, "Infinity", 8) == 0) return p[st] == '-' ? -INFINITY : INFINITY;
    size_t digits = 0;
    while (i < n && p[i] >= '0' && p[i] <= '9') i++, digits++;
    if (i < n && p[i] == '.') {
        size_t j = i + 1, fd = 0;
        while (j < n && p[j] >= '0' && p[j] <= '9') j++, fd++;
        if (fd || digits) {
            i = j;
            digits += fd;
        }
    }
    if (!digits) return NAN;
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (p[j] == '+' || p[j] == '-')) j++;
        size_t ed = 0;
        while (j < n && p[j] >= '0' && p[j] <= '9') j++, ed++;
        if (ed) i = j;
    }
    char buf[512];
    size_t len = i - st < sizeof buf - 1 ? i - st : sizeof buf - 1;
    memcpy(buf, p + st, len);
    buf[len] = 0;
    return strtod(buf, NULL);
}

/* JavaScript's str.replace(/old/gu, new) limited to count replacements. */
static kj_val js_replace(kj_ctx *c, const kj_node *n, const kj_str *s, const kj_str *old, const kj_str *new,
                         double count) {
    if (count == 0) return (kj_val){.t = V_STR, .s = s};
    double left = count < 0 || isnan(count) ? INFINITY : count;
    kj_buf b = {0};
    size_t i = 0;
    if (old->len == 0) { /* matches at every code point boundary */
        for (;;) {
            if (left > 0) {
                left--;
                if (!kj_emit(c, n, &b, new->p, new->len)) break;
            }
            if (i >= s->len) break;
            uint32_t cp;
            int k = kj_utf8_dec(s->p, s->len, i, &cp);
            if (!kj_emit(c, n, &b, s->p + i, (size_t)k)) break;
            i += (size_t)k;
        }
        return kj_buf_str(c, n, &b);
    }
    while (i < s->len) {
        const char *hit = left > 0 && s->len - i >= old->len ? memmem(s->p + i, s->len - i, old->p, old->len) : NULL;
        if (!hit) break;
        size_t at = (size_t)(hit - s->p);
        if (!kj_emit(c, n, &b, s->p + i, at - i) || !kj_emit(c, n, &b, new->p, new->len)) break;
        i = at + old->len;
        left--;
    }
    kj_emit(c, n, &b, s->p + i, s->len - i);
    return kj_buf_str(c, n, &b);
}

static bool str_eq(const kj_str *a, const char *b) { return a->len == strlen(b) && memcmp(a->p, b, a->len) == 0; }

static bool starts(const kj_str *s, const kj_str *p) { return p->len <= s->len && memcmp(s->p, p->p, p->len) == 0; }
static bool ends(const kj_str *s, const kj_str *p) {
    return p->len <= s->len && memcmp(s->p + s->len - p->len, p->p, p->len) == 0;
}

static kj_val push_piece(kj_ctx *c, kj_val arr, size_t *cap, const char *p, size_t len) {
    if (c->err) return KJ_UNDEF;
    if (arr.a->n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        kj_val *nv = kj_alloc(c, ncap * sizeof *nv);
        if (!nv) return KJ_UNDEF;
        if (arr.a->n) memcpy(nv, arr.a->v, arr.a->n * sizeof *nv);
        arr.a->v = nv;
        *cap = ncap;
    }
    kj_val s = kj_mkstr(c, p, len);
    if (c->err) return KJ_UNDEF;
    arr.a->v[arr.a->n++] = s;
    return arr;
}

static kj_val js_split(kj_ctx *c, const kj_node *n, const kj_str *s, kj_val sep, kj_val maxv) {
    if (sep.t != V_STR && sep.t != V_NULL) return kj_fail(c, n, "sep argument must be a string or null");
    if (maxv.t != V_INT) return kj_fail(c, n, "maxsplit argument must be a number");
    double max = maxv.d;
    kj_val out = kj_mkarr(c, V_ARR, 0);
    if (c->err) return KJ_UNDEF;
    size_t cap = 0;
    if (sep.t == V_NULL) {
        size_t i = lead_space(s);
        while (i < s->len && !c->err) {
            size_t j = i;
            while (j < s->len) { /* \S+ */
                uint32_t cp;
                int k = kj_utf8_dec(s->p, s->len, j, &cp);
                if (kj_js_space(cp)) break;
                j += (size_t)k;
            }
            if (max != -1 && (double)out.a->n >= max) {
                push_piece(c, out, &cap, s->p + i, s->len - i);
                break;
            }
            push_piece(c, out, &cap, s->p + i, j - i);
            i = j;
            while (i < s->len) {
                uint32_t cp;
                int k = kj_utf8_dec(s->p, s->len, i, &cp);
                if (!kj_js_space(cp)) break;
                i += (size_t)k;
            }
        }
        return c->err ? KJ_UNDEF : out;
    }
    const kj_str *d = sep.s;
    if (d->len == 0) return kj_fail(c, n, "empty separator");
    size_t i = 0;
    for (;;) {
        const char *hit = s->len - i >= d->len ? memmem(s->p + i, s->len - i, d->p, d->len) : NULL;
        if (!hit) {
            push_piece(c, out, &cap, s->p + i, s->len - i);
            break;
        }
        push_piece(c, out, &cap, s->p + i, (size_t)(hit - s->p) - i);
        i = (size_t)(hit - s->p) + d->len;
        if (c->err || !kj_step(c, n, 1)) return KJ_UNDEF;
    }
    if (c->err) return KJ_UNDEF;
    if (max != -1 && (double)out.a->n > max) {
        /* result.push(result.splice(max).join(sep)) */
        double len = (double)out.a->n;
        double start = max < 0 ? fmax(len + max, 0) : fmin(max, len);
        size_t st = (size_t)start;
        kj_buf b = {0};
        for (size_t k = st; k < out.a->n; k++) {
            if (k > st) kj_emit(c, n, &b, d->p, d->len);
            kj_emit(c, n, &b, out.a->v[k].s->p, out.a->v[k].s->len);
        }
        out.a->n = st;
        kj_val joined = kj_buf_str(c, n, &b);
        if (c->err) return KJ_UNDEF;
        out.a->v[out.a->n++] = joined;
    }
    return out;
}

static kj_val indent_str(kj_ctx *c, const kj_node *n, const kj_str *s, double width, bool first, bool blank) {
    kj_buf b = {0};
    size_t i = 0, line = 0;
    for (;;) {
        const char *nl = memchr(s->p + i, '\n', s->len - i);
        size_t end = nl ? (size_t)(nl - s->p) : s->len;
        bool empty = end == i;
        if (!((!first && line == 0) || (!blank && empty)))
            for (double w = 0; w < width; w++)
                if (!kj_emit(c, n, &b, " ", 1)) break;
        kj_emit(c, n, &b, s->p + i, end - i);
        if (!nl) break;
        kj_emit(c, n, &b, "\n", 1);
        i = end + 1;
        line++;
    }
    return kj_buf_str(c, n, &b);
}

static kj_val capitalize(kj_ctx *c, const kj_str *s) {
    if (!s->len) return (kj_val){.t = V_STR, .s = s};
    uint32_t cp;
    int k = kj_utf8_dec(s->p, s->len, 0, &cp);
    kj_str first = {(size_t)k, s->p};
    kj_val up = js_case(c, &first, true);
    if (c->err) return KJ_UNDEF;
    kj_buf b = {0};
    kj_emit(c, NULL, &b, up.s->p, up.s->len);
    kj_emit(c, NULL, &b, s->p + k, s->len - (size_t)k);
    return kj_buf_str(c, NULL, &b);
}

static kj_val title(kj_ctx *c, const kj_str *s) {
    kj_val v = kj_mkstr(c, s->p, s->len);
    if (c->err) return KJ_UNDEF;
    char *p = (char *)v.s->p;
    for (size_t i = 0; i < s->len; i++)
        if (is_word((unsigned char)p[i]) && (i == 0 || !is_word((unsigned char)p[i - 1])) && p[i] >= 'a' && p[i] <= 'z')
            p[i] = (char)(p[i] - 32);
    return v;
}

/* ---- methods ------------------------------------------------------------ */

static const struct {
    const char *name;
    kj_method m;
} STR_METHODS[] = {
    {"upper", M_UPPER},   {"lower", M_LOWER},           {"strip", M_STRIP},     {"title", M_TITLE},
    {"capitalize", M_CAPITALIZE}, {"rstrip", M_RSTRIP}, {"lstrip", M_LSTRIP},   {"startswith", M_STARTSWITH},
    {"endswith", M_ENDSWITH}, {"split", M_SPLIT},       {"replace", M_REPLACE},   {"format", M_FORMAT},
}, OBJ_METHODS[] = {
    {"get", M_GET}, {"items", M_ITEMS}, {"keys", M_KEYS}, {"values", M_VALUES}, {"dictsort", M_DICTSORT},
};

static kj_val bound(kj_ctx *c, kj_val self, kj_method m) {
    kj_fn *f = kj_alloc(c, sizeof *f);
    if (!f) return KJ_UNDEF;
    f->kind = F_METHOD;
    f->method = m;
    f->self = self;
    return (kj_val){.t = V_FN, .f = f};
}

kj_val kj_builtin_attr(kj_ctx *c, kj_val obj, const kj_str *name) {
    if (obj.t == V_STR) {
        if (str_eq(name, "length")) return kj_num(V_INT, (double)kj_utf16_len(obj.s->p, obj.s->len));
        for (size_t i = 0; i < sizeof STR_METHODS / sizeof STR_METHODS[0]; i++)
            if (str_eq(name, STR_METHODS[i].name)) return bound(c, obj, STR_METHODS[i].m);
    } else if (kj_is_arr(obj)) {
        if (str_eq(name, "length")) return kj_num(V_INT, (double)obj.a->n);
    } else if (kj_is_obj(obj)) {
        for (size_t i = 0; i < sizeof OBJ_METHODS / sizeof OBJ_METHODS[0]; i++)
            if (str_eq(name, OBJ_METHODS[i].name)) return bound(c, obj, OBJ_METHODS[i].m);
    }
    return KJ_UNDEF;
}

static kj_val obj_items(kj_ctx *c, const kj_obj *o, int which) {
    kj_val out = kj_mkarr(c, V_ARR, o->n);
    for (size_t i = 0; !c->err && i < o->n; i++) {
        kj_val key = kj_obj_key(o, i);
        if (which == 0) {
            kj_val pair = kj_mkarr(c, V_ARR, 2);
            if (c->err) break;
            pair.a->v[0] = key;
            pair.a->v[1] = o->v[i];
            out.a->v[i] = pair;
        } else {
            out.a->v[i] = which == 1 ? key : o->v[i];
        }
    }
    return c->err ? KJ_UNDEF : out;
}

/* Splits a trailing keyword-arguments value off a method's arguments. */
static const kj_obj *take_kwargs(kj_val *args, size_t *nargs) {
    static const kj_obj empty;
    for (size_t i = 0; i < *nargs; i++)
        if (args[i].t == V_KWARGS) {
            const kj_obj *kw = args[i].o;
            memmove(args + i, args + i + 1, (*nargs - i - 1) * sizeof *args);
            (*nargs)--;
            return kw;
        }
    return &empty;
}

static kj_val kwget(const kj_obj *kw, const char *k) {
    kj_val *v = kj_obj_get(kw, k, strlen(k));
    return v ? *v : (kj_val){.t = V_JSUNDEF};
}

static kj_val dictsort(kj_ctx *c, const kj_node *at, const kj_obj *o, kj_val *args, size_t nargs) {
    const kj_obj *kw = take_kwargs(args, &nargs);
    kj_val cs = nargs > 0 ? args[0] : kwget(kw, "case_sensitive");
    if (cs.t == V_JSUNDEF) cs = kj_bool(false);
    if (cs.t != V_BOOL) return kj_fail(c, at, "case_sensitive must be a boolean");
    kj_val by = nargs > 1 ? args[1] : kwget(kw, "by");
    static const kj_str key = {3, "key"};
    if (by.t == V_JSUNDEF) by = (kj_val){.t = V_STR, .s = &key};
    if (by.t != V_STR) return kj_fail(c, at, "by must be a string");
    if (!str_eq(by.s, "key") && !str_eq(by.s, "value")) return kj_fail(c, at, "by must be either 'key' or 'value'");
    kj_val rev = nargs > 2 ? args[2] : kwget(kw, "reverse");
    if (rev.t == V_JSUNDEF) rev = kj_bool(false);
    if (rev.t != V_BOOL) return kj_fail(c, at, "reverse must be a boolean");
    kj_val items = obj_items(c, o, 0);
    if (c->err) return KJ_UNDEF;
    sort_opts so = {c, at, cs.b, rev.b, NULL, str_eq(by.s, "key") ? 0 : 1};
    return sort_vals(&so, items.a->v, items.a->n) ? items : KJ_UNDEF;
}

kj_val kj_call_method(kj_ctx *c, const kj_node *at, const kj_fn *f, kj_val *args, size_t nargs) {
    kj_val self = f->self;
    if (self.t == V_STR) {
        const kj_str *s = self.s;
        switch (f->method) {
        case M_UPPER: return js_case(c, s, true);
        case M_LOWER: return js_case(c, s, false);
        case M_STRIP: return js_trim(c, s, true, true);
        case M_LSTRIP: return js_trim(c, s, true, false);
        case M_RSTRIP: return js_trim(c, s, false, true);
        case M_TITLE: return title(c, s);
        case M_CAPITALIZE: return capitalize(c, s);
        case M_STARTSWITH:
        case M_ENDSWITH: {
            const char *nm = f->method == M_STARTSWITH ? "startswith" : "endswith";
            if (!nargs) return kj_fail(c, at, "%s() requires at least one argument", nm);
            bool (*fn)(const kj_str *, const kj_str *) = f->method == M_STARTSWITH ? starts : ends;
            if (args[0].t == V_STR) return kj_bool(fn(s, args[0].s));
            if (kj_is_arr(args[0])) {
                for (size_t i = 0; i < args[0].a->n; i++) {
                    if (args[0].a->v[i].t != V_STR) return kj_fail(c, at, "%s() tuple elements must be strings", nm);
                    if (fn(s, args[0].a->v[i].s)) return kj_bool(true);
                }
                return kj_bool(false);
            }
            return kj_fail(c, at, "%s() argument must be a string or tuple of strings", nm);
        }
        case M_FORMAT: {
            const kj_obj *kw = take_kwargs(args, &nargs);
            return kj_str_format(c, at, s, args, nargs, kw);
        }
        case M_SPLIT:
            return js_split(c, at, s, nargs > 0 && args[0].t != V_JSUNDEF ? args[0] : KJ_NULLV,
                            nargs > 1 && args[1].t != V_JSUNDEF ? args[1] : kj_num(V_INT, -1));
        case M_REPLACE: {
            if (nargs < 2) return kj_fail(c, at, "replace() requires at least two arguments");
            if (args[0].t != V_STR || args[1].t != V_STR) return kj_fail(c, at, "replace() arguments must be strings");
            kj_val count = KJ_NULLV;
            if (nargs > 2) {
                if (args[2].t == V_KWARGS) {
                    kj_val *cv = kj_obj_get(args[2].o, "count", 5);
                    if (cv) count = *cv;
                } else {
                    count = args[2];
                }
            }
            if (count.t != V_INT && count.t != V_NULL) return kj_fail(c, at, "replace() count argument must be a number or null");
            return js_replace(c, at, s, args[0].s, args[1].s, count.t == V_INT ? count.d : -1);
        }
        default: break;
        }
    } else if (kj_is_obj(self)) {
        const kj_obj *o = self.o;
        switch (f->method) {
        case M_GET: {
            if (!nargs || !kj_hashable(args[0]))
                return kj_fail(c, at, "unhashable object key: %s", nargs ? kj_typename(args[0]) : "undefined");
            kj_val *v = kj_obj_getv(o, args[0]);
            if (v && v->t != V_JSUNDEF) return *v;
            return nargs > 1 && args[1].t != V_JSUNDEF ? args[1] : KJ_NULLV;
        }
        case M_ITEMS: return obj_items(c, o, 0);
        case M_KEYS: return obj_items(c, o, 1);
        case M_VALUES: return obj_items(c, o, 2);
        case M_DICTSORT: return dictsort(c, at, o, args, nargs);
        default: break;
        }
    }
    return kj_fail(c, at, "internal error: bad method");
}

/* ---- tests ------------------------------------------------------------- */

bool kj_run_test(kj_ctx *c, const kj_node *at, const char *name, kj_val v, const kj_val *arg, bool *out) {
    bool r = false;
    bool undef_ok = !strcmp(name, "callable") || !strcmp(name, "number") || !strcmp(name, "integer") ||
                    !strcmp(name, "mapping") || !strcmp(name, "sequence");
    static const char *const known[] = {"boolean", "callable", "odd", "even", "false", "true", "none",
                                        "string", "number", "integer", "iterable", "mapping", "sequence",
                                        "lower", "upper", "defined", "undefined", "equalto", "eq", NULL};
    bool found = false;
    for (int i = 0; known[i]; i++) found |= !strcmp(known[i], name);
    if (!found) {
        kj_fail(c, at, "unknown test: %s", name);
        return false;
    }
    if (v.t == V_JSUNDEF && !undef_ok) {
        kj_fail(c, at, "cannot read properties of undefined");
        return false;
    }
    if (!strcmp(name, "boolean")) r = v.t == V_BOOL;
    else if (!strcmp(name, "callable")) r = v.t == V_FN;
    else if (!strcmp(name, "odd") || !strcmp(name, "even")) {
        if (v.t != V_INT) {
            kj_fail(c, at, "cannot %s on %s", name, kj_typename(v));
            return false;
        }
        double m = fmod(v.d, 2);
        r = name[0] == 'o' ? m != 0 : m == 0;
    } else if (!strcmp(name, "false")) r = v.t == V_BOOL && !v.b;
    else if (!strcmp(name, "true")) r = v.t == V_BOOL && v.b;
    else if (!strcmp(name, "none")) r = v.t == V_NULL;
    else if (!strcmp(name, "string")) r = v.t == V_STR;
    else if (!strcmp(name, "number")) r = kj_is_num(v);
    else if (!strcmp(name, "integer")) r = v.t == V_INT;
    else if (!strcmp(name, "iterable")) r = v.t == V_ARR || v.t == V_STR;
    else if (!strcmp(name, "mapping")) r = kj_is_obj(v);
    else if (!strcmp(name, "sequence")) r = kj_is_arr(v) || kj_is_obj(v) || v.t == V_STR;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        if (v.t == V_STR) {
            kj_val x = js_case(c, v.s, name[0] == 'u');
            if (c->err) return false;
            r = x.s->len == v.s->len && memcmp(x.s->p, v.s->p, x.s->len) == 0;
        }
    } else if (!strcmp(name, "defined")) r = v.t != V_UNDEF;
    else if (!strcmp(name, "undefined")) r = v.t == V_UNDEF;
    else { /* equalto, eq: a.value === b.value */
        if (!arg || arg->t == V_JSUNDEF) {
            kj_fail(c, at, "cannot read properties of undefined");
            return false;
        }
        r = kj_strict_eq(v, *arg);
    }
    *out = r;
    return true;
}

/* ---- filters ------------------------------------------------------------ */

kj_val kj_attr_path(kj_val item, const kj_str *path) {
    kj_val v = item;
    size_t i = 0;
    for (;;) {
        const char *dot = memchr(path->p + i, '.', path->len - i);
        size_t end = dot ? (size_t)(dot - path->p) : path->len;
        if (kj_is_obj(v) || v.t == V_NS) {
            kj_val *p = kj_obj_get(v.o, path->p + i, end - i);
            v = p ? *p : KJ_UNDEF;
        } else if (kj_is_arr(v)) {
            kj_str part = {end - i, path->p + i};
            double idx = js_parse_int(&part);
            if (!isnan(idx) && idx >= 0 && idx < (double)v.a->n) v = v.a->v[(size_t)idx];
            else return KJ_UNDEF;
        } else {
            return KJ_UNDEF;
        }
        if (!dot) break;
        i = end + 1;
    }
    return v;
}

static double jmin(double a, double b) { return isnan(a) || isnan(b) ? NAN : a < b ? a : b; }
static double jmax(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

kj_val kj_slice(kj_ctx *c, const kj_node *n, kj_val obj, kj_val start, kj_val stop, kj_val step) {
    if (!kj_is_arr(obj) && obj.t != V_STR) return kj_fail(c, n, "slice object must be an array or string");
    if ((start.t != V_INT && start.t != V_UNDEF) || (stop.t != V_INT && stop.t != V_UNDEF) ||
        (step.t != V_INT && step.t != V_UNDEF))
        return kj_fail(c, n, "slice indices must be integers or undefined");
    /* code point offsets of a string, so both cases index an array */
    size_t len;
    size_t *offs = NULL;
    if (obj.t == V_STR) {
        len = 0;
        for (size_t i = 0; i < obj.s->len; len++) {
            uint32_t cp;
            i += (size_t)kj_utf8_dec(obj.s->p, obj.s->len, i, &cp);
        }
        offs = kj_alloc(c, (len + 1) * sizeof *offs);
        if (!offs) return KJ_UNDEF;
        size_t k = 0;
        for (size_t i = 0; i < obj.s->len; k++) {
            uint32_t cp;
            offs[k] = i;
            i += (size_t)kj_utf8_dec(obj.s->p, obj.s->len, i, &cp);
        }
        offs[len] = obj.s->len;
    } else {
        len = obj.a->n;
    }
    double L = (double)len;
    double st = step.t == V_INT ? step.d : 1;
    double dir = st > 0 ? 1 : st < 0 ? -1 : (isnan(st) ? NAN : 0);
    double a, b;
    if (!(dir < 0)) {
        a = start.t == V_INT ? start.d : 0;
        a = a < 0 ? jmax(L + a, 0) : jmin(a, L);
        b = stop.t == V_INT ? stop.d : L;
        b = b < 0 ? jmax(L + b, 0) : jmin(b, L);
    } else {
        a = start.t == V_INT ? start.d : L - 1;
        a = a < 0 ? jmax(L + a, -1) : jmin(a, L - 1);
        b = stop.t == V_INT ? stop.d : -1;
        b = b < -1 ? jmax(L + b, -1) : jmin(b, L - 1);
    }
    kj_buf sb = {0};
    kj_val out = obj.t == V_STR ? KJ_UNDEF : kj_mkarr(c, V_ARR, 0);
    size_t cap = 0;
    for (double i = a; !c->err && dir * i < dir * b; i += st) {
        if (!kj_step(c, n, 1)) break;
        size_t k = (size_t)i;
        if (obj.t == V_STR) {
            kj_emit(c, n, &sb, obj.s->p + offs[k], offs[k + 1] - offs[k]);
        } else {
            if (out.a->n == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                kj_val *nv = kj_alloc(c, ncap * sizeof *nv);
                if (!nv) break;
                if (out.a->n) memcpy(nv, out.a->v, out.a->n * sizeof *nv);
                out.a->v = nv;
                cap = ncap;
            }
            out.a->v[out.a->n++] = obj.a->v[k];
        }
    }
    if (obj.t == V_STR) return kj_buf_str(c, n, &sb);
    return c->err ? KJ_UNDEF : out;
}

static kj_val join(kj_ctx *c, const kj_node *n, kj_val v, const kj_str *sep) {
    kj_buf b = {0};
    if (v.t == V_STR) { /* Array.from(string).join(sep) */
        for (size_t i = 0; i < v.s->len && !c->err;) {
            uint32_t cp;
            int k = kj_utf8_dec(v.s->p, v.s->len, i, &cp);
            if (i) kj_emit(c, n, &b, sep->p, sep->len);
            kj_emit(c, n, &b, v.s->p + i, (size_t)k);
            i += (size_t)k;
        }
    } else {
        for (size_t i = 0; i < v.a->n && !c->err; i++) {
            if (i) kj_emit(c, n, &b, sep->p, sep->len);
            kj_rawstr(c, n, v.a->v[i], &b, 1);
        }
    }
    if (c->err) {
        free(b.p);
        return KJ_UNDEF;
    }
    return kj_buf_str(c, n, &b);
}

static kj_val to_json_value(kj_ctx *c, const kj_node *n, kj_val v, const kj_json_opts *o, bool undef_null) {
    kj_buf b = {0};
    if (!kj_tojson(c, n, v, o, 0, undef_null, &b)) {
        free(b.p);
        return KJ_UNDEF;
    }
    return kj_buf_str(c, n, &b);
}

static kj_val unique(kj_ctx *c, const kj_node *n, kj_val v) {
    kj_val out = kj_mkarr(c, V_ARR, v.a->n);
    if (c->err) return KJ_UNDEF;
    size_t k = 0;
    for (size_t i = 0; i < v.a->n; i++) {
        bool seen = false;
        if (!kj_step(c, n, k + 1)) return KJ_UNDEF;
        for (size_t j = 0; j < k && !seen; j++) seen = same_value_zero(out.a->v[j], v.a->v[i]);
        if (!seen) out.a->v[k++] = v.a->v[i];
    }
    out.a->n = k;
    return out;
}

/* ---- Python's str() of none, lists and dicts ---- */

/* repr(float) as Python writes it: the shortest digits that read back,
 * fixed notation for exponents -4..15, else d.ddde+XX */
static void py_float(double d, char *out, size_t cap) {
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    char t[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, d);
        if (strtod(t, NULL) == d) break;
    }
    char dg[24];
    int nd = 0;
    const char *q = t;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9' && nd < 20) dg[nd++] = *q;
    int e = atoi(q + (*q == 'e'));
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (e >= 16 || e < -4) {
        out[o++] = dg[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = dg[i];
        }
        snprintf(out + o, cap - o, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        return;
    }
    if (e < 0) {
        out[o++] = '0', out[o++] = '.';
        for (int i = 0; i < -e - 1; i++) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = dg[i];
    } else {
        for (int i = 0; i <= e; i++) out[o++] = i < nd ? dg[i] : '0';
        out[o++] = '.';
        if (nd > e + 1)
            for (int i = e + 1; i < nd; i++) out[o++] = dg[i];
        else out[o++] = '0';
    }
    out[o] = 0;
}

/* repr(s): single quotes unless s holds ' and no " */
static bool py_str_repr(kj_ctx *c, const kj_node *n, const kj_str *s, kj_buf *b) {
    char qc = memchr(s->p, '\'', s->len) && !memchr(s->p, '"', s->len) ? '"' : '\'';
    if (!kj_emit(c, n, b, &qc, 1)) return false;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->p[i];
        char e[8];
        const char *w = (const char *)&s->p[i];
        size_t wl = 1;
        if (ch == '\\' || ch == (unsigned char)qc) e[0] = '\\', e[1] = (char)ch, w = e, wl = 2;
        else if (ch == '\n') w = "\\n", wl = 2;
        else if (ch == '\r') w = "\\r", wl = 2;
        else if (ch == '\t') w = "\\t", wl = 2;
        else if (ch < 0x20 || ch == 0x7f) snprintf(e, sizeof e, "\\x%02x", ch), w = e, wl = 4;
        if (!kj_emit(c, n, b, w, wl)) return false;
    }
    return kj_emit(c, n, b, &qc, 1);
}

/* repr(v), as str() of a list or dict writes its items */
static bool py_repr(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth) {
    if (depth > KJ_MAX_VALUE_DEPTH) {
        kj_fail(c, n, "value nested too deeply");
        return false;
    }
    char t[48];
    switch (v.t) {
    case V_UNDEF:
    case V_JSUNDEF: return true; /* str(Undefined) */
    case V_NULL: return kj_emit(c, n, b, "None", 4);
    case V_BOOL: return v.b ? kj_emit(c, n, b, "True", 4) : kj_emit(c, n, b, "False", 5);
    case V_INT: return emit_num(c, n, v.d, b);
    case V_FLOAT: py_float(v.d, t, sizeof t); return kj_emit(c, n, b, t, strlen(t));
    case V_STR: return py_str_repr(c, n, v.s, b);
    case V_ARR:
    case V_TUPLE: {
        bool tuple = v.t == V_TUPLE;
        if (!kj_emit(c, n, b, tuple ? "(" : "[", 1)) return false;
        for (size_t i = 0; i < v.a->n; i++)
            if ((i && !kj_emit(c, n, b, ", ", 2)) || !py_repr(c, n, v.a->v[i], b, depth + 1)) return false;
        if (tuple && v.a->n == 1 && !kj_emit(c, n, b, ",", 1)) return false;
        return kj_emit(c, n, b, tuple ? ")" : "]", 1);
    }
    case V_OBJ:
    case V_KWARGS:
    case V_NS: {
        if (!kj_emit(c, n, b, "{", 1)) return false;
        for (size_t i = 0; i < v.o->n; i++) {
            if (i && !kj_emit(c, n, b, ", ", 2)) return false;
            bool ok = v.o->kv ? py_repr(c, n, v.o->kv[i], b, depth + 1) : py_str_repr(c, n, v.o->k[i], b);
            if (!ok || !kj_emit(c, n, b, ": ", 2) || !py_repr(c, n, v.o->v[i], b, depth + 1)) return false;
        }
        return kj_emit(c, n, b, "}", 1);
    }
    default: return kj_display(c, n, v, b, depth);
    }
}

bool kj_py_repr(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth) { return py_repr(c, n, v, b, depth); }

/* The filters that take str(x) first, on none, a list or a dict where
 * @huggingface/jinja raises (none|trim, list|trim, dict|string): x as
 * Python's str() writes it ("None", "['a', 'b']", "{'k': 'v'}"). A list's
 * |string stays @huggingface/jinja's (it does not raise). */
static kj_val py_str_arg(kj_ctx *c, const kj_node *at, kj_val v, const kj_str *name) {
    static const char *const names[] = {"upper", "lower", "title", "capitalize", "trim", "string"};
    if (v.t != V_NULL && !kj_is_arr(v) && !kj_is_obj(v)) return v;
    if (kj_is_arr(v) && str_eq(name, "string")) return v;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (str_eq(name, names[i])) {
            kj_buf b = {0};
            if (!py_repr(c, at, v, &b, 0)) {
                free(b.p);
                return KJ_UNDEF;
            }
            return kj_buf_str(c, at, &b);
        }
    return v;
}

/* Python's Undefined stringifies to "": the filters that convert their
 * input with str() first (and length: len(Undefined) is 0) see an
 * undefined value as the empty string, where @huggingface/jinja raises.
 * indent does not (Undefined + "\n" raises in Python too). */
static kj_val undef_as_str(kj_val v, const kj_str *name) {
    static const char *const names[] = {"upper", "lower", "title", "capitalize", "trim", "replace", "string", "length"};
    static const kj_str empty = {0, ""};
    if (v.t != V_UNDEF) return v;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (str_eq(name, names[i])) return (kj_val){.t = V_STR, .s = &empty};
    return v;
}

static kj_val simple_filter(kj_ctx *c, kj_val v, const kj_str *name, kj_env *e, const kj_node *at) {
    (void)e;
    if (str_eq(name, "min") || str_eq(name, "max")) return kj_min_max(c, at, v, NULL, 0, NULL, name->p[1] == 'a');
    v = undef_as_str(v, name);
    v = py_str_arg(c, at, v, name);
    if (c->err) return KJ_UNDEF;
    if (str_eq(name, "safe")) return v;
    if (str_eq(name, "tojson")) return to_json_value(c, at, v, &(kj_json_opts){0}, true);
    if (kj_is_arr(v)) {
        if (str_eq(name, "list")) return v;
        if (str_eq(name, "first")) return v.a->n ? v.a->v[0] : (kj_val){.t = V_JSUNDEF};
        if (str_eq(name, "last")) return v.a->n ? v.a->v[v.a->n - 1] : (kj_val){.t = V_JSUNDEF};
        if (str_eq(name, "length")) return kj_num(V_INT, (double)v.a->n);
        if (str_eq(name, "reverse")) {
            kj_val out = kj_mkarr(c, V_ARR, v.a->n);
            for (size_t i = 0; !c->err && i < v.a->n; i++) out.a->v[i] = v.a->v[v.a->n - 1 - i];
            return c->err ? KJ_UNDEF : out;
        }
        if (str_eq(name, "sort")) {
            kj_val out = kj_mkarr(c, V_ARR, v.a->n);
            if (c->err) return KJ_UNDEF;
            if (v.a->n) memcpy(out.a->v, v.a->v, v.a->n * sizeof(kj_val));
            sort_opts so = {c, at, false, false, NULL, -1};
            return sort_vals(&so, out.a->v, out.a->n) ? out : KJ_UNDEF;
        }
        if (str_eq(name, "join")) return join(c, at, v, &(const kj_str){0, ""});
        if (str_eq(name, "string")) return to_json_value(c, at, v, &(kj_json_opts){0}, false);
        if (str_eq(name, "unique")) return unique(c, at, v);
        return kj_fail(c, at, "unknown ArrayValue filter: %s", name->p);
    }
    if (v.t == V_STR) {
        if (str_eq(name, "length")) return kj_num(V_INT, (double)kj_utf16_len(v.s->p, v.s->len));
        if (str_eq(name, "upper")) return js_case(c, v.s, true);
        if (str_eq(name, "lower")) return js_case(c, v.s, false);
        if (str_eq(name, "title")) return title(c, v.s);
        if (str_eq(name, "capitalize")) return capitalize(c, v.s);
        if (str_eq(name, "trim")) return js_trim(c, v.s, true, true);
        if (str_eq(name, "indent")) return indent_str(c, at, v.s, 4, false, false);
        if (str_eq(name, "join") || str_eq(name, "string")) return v;
        if (str_eq(name, "int")) {
            double d = js_parse_int(v.s);
            return kj_num(V_INT, isnan(d) ? 0 : d);
        }
        if (str_eq(name, "float")) {
            double d = js_parse_float(v.s);
            return kj_num(V_FLOAT, isnan(d) ? 0 : d);
        }
        return kj_fail(c, at, "unknown StringValue filter: %s", name->p);
    }
    if (kj_is_num(v)) {
        if (str_eq(name, "abs")) return kj_num(v.t, fabs(v.d));
        if (str_eq(name, "int")) return kj_num(V_INT, floor(v.d));
        if (str_eq(name, "float")) return kj_num(V_FLOAT, v.d);
        if (str_eq(name, "string")) {
            kj_buf b = {0};
            if (!kj_display(c, at, v, &b, 0)) {
                free(b.p);
                return KJ_UNDEF;
            }
            return kj_buf_str(c, at, &b);
        }
        return kj_fail(c, at, "unknown NumericValue filter: %s", name->p);
    }
    if (kj_is_obj(v)) {
        if (str_eq(name, "items")) return obj_items(c, v.o, 0);
        if (str_eq(name, "length")) return kj_num(V_INT, (double)v.o->n);
        kj_val fn = kj_builtin_attr(c, v, name);
        if (fn.t == V_FN) return kj_call_method(c, at, fn.f, NULL, 0);
        return kj_fail(c, at, "unknown ObjectValue filter: %s", name->p);
    }
    if (v.t == V_BOOL) {
        if (str_eq(name, "bool")) return v;
        if (str_eq(name, "int")) return kj_num(V_INT, v.b);
        if (str_eq(name, "float")) return kj_num(V_FLOAT, v.b);
        if (str_eq(name, "string")) return kj_mkstr(c, v.b ? "true" : "false", v.b ? 4 : 5);
        return kj_fail(c, at, "unknown BooleanValue filter: %s", name->p);
    }
    if (v.t == V_JSUNDEF) return kj_fail(c, at, "cannot read properties of undefined");
    return kj_fail(c, at, "cannot apply filter \"%s\" to type: %s", name->p, kj_typename(v));
}

static kj_val arg_or(const kj_val *pos, size_t npos, size_t i, const kj_obj *kw, const char *key, kj_val def) {
    if (i < npos && pos[i].t != V_JSUNDEF) return pos[i];
    kj_val v = kwget(kw, key);
    return v.t != V_JSUNDEF ? v : def;
}

static kj_val filter_tojson(kj_ctx *c, kj_val v, const kj_obj *kw, const kj_node *at) {
    kj_val indent = kwget(kw, "indent"), ea = kwget(kw, "ensure_ascii"), sk = kwget(kw, "sort_keys"),
           seps = kwget(kw, "separators");
    if (indent.t == V_JSUNDEF) indent = KJ_NULLV;
    if (indent.t != V_INT && indent.t != V_NULL) return kj_fail(c, at, "if set, indent must be a number");
    if (ea.t == V_JSUNDEF) ea = kj_bool(false);
    if (ea.t != V_BOOL) return kj_fail(c, at, "if set, ensure_ascii must be a boolean");
    if (sk.t == V_JSUNDEF) sk = kj_bool(false);
    if (sk.t != V_BOOL) return kj_fail(c, at, "if set, sort_keys must be a boolean");
    kj_json_opts o = {0};
    if (seps.t != V_JSUNDEF && seps.t != V_NULL) {
        if (!kj_is_arr(seps)) return kj_fail(c, at, "if set, separators must be a tuple of two strings");
        if (seps.a->n != 2 || seps.a->v[0].t != V_STR || seps.a->v[1].t != V_STR)
            return kj_fail(c, at, "separators must be a tuple of two strings");
        o.item_sep = seps.a->v[0].s;
        o.key_sep = seps.a->v[1].s;
    }
    if (indent.t == V_INT) {
        if (indent.d < 0) return kj_fail(c, at, "invalid count value: %g", indent.d);
        if (indent.d > 1e6) return kj_fail(c, at, "indent %g is too large", indent.d);
        o.indent = (int)indent.d;
    }
    o.ensure_ascii = ea.b;
    o.sort_keys = sk.b;
    return to_json_value(c, at, v, &o, true);
}

static kj_val select_attr(kj_ctx *c, kj_val v, const kj_node *f, kj_env *e, const kj_node *at, bool select) {
    const char *nm = select ? "selectattr" : "rejectattr";
    for (size_t i = 0; i < v.a->n; i++)
        if (!kj_is_obj(v.a->v[i]) && v.a->v[i].t != V_NS)
            return kj_fail(c, at, "`%s` can only be applied to array of objects", nm);
    for (int i = 0; i < f->list.n; i++)
        if (f->list.v[i]->kind != KN_STR) return kj_fail(c, at, "arguments of `%s` must be strings", nm);
    kj_val args[3];
    for (int i = 0; i < 3; i++) args[i] = (kj_val){.t = V_JSUNDEF};
    for (int i = 0; i < f->list.n && i < 3; i++) args[i] = kj_eval(c, f->list.v[i], e);
    if (c->err) return KJ_UNDEF;
    if (args[0].t != V_STR) return kj_fail(c, at, "cannot read properties of undefined");
    kj_val out = kj_mkarr(c, V_ARR, v.a->n);
    if (c->err) return KJ_UNDEF;
    size_t k = 0;
    for (size_t i = 0; i < v.a->n; i++) {
        kj_val *a = kj_obj_get(v.a->v[i].o, args[0].s->p, args[0].s->len);
        bool r = false;
        if (a && a->t != V_JSUNDEF) {
            if (args[1].t == V_STR) {
                if (!kj_run_test(c, at, args[1].s->p, *a, &args[2], &r)) return KJ_UNDEF;
            } else {
                r = kj_truthy(c, at, *a);
            }
        } else if (args[1].t == V_STR && !kj_run_test(c, at, args[1].s->p, KJ_NULLV, &args[2], &(bool){0})) {
            return KJ_UNDEF; /* an unknown test fails even when unused */
        }
        if (c->err) return KJ_UNDEF;
        if (select ? r : !r) out.a->v[k++] = v.a->v[i];
    }
    out.a->n = k;
    return out;
}

kj_val kj_apply_filter(kj_ctx *c, kj_val v, const kj_node *f, kj_env *e, const kj_node *at) {
    if (f->kind == KN_IDENT) return simple_filter(c, v, &f->str, e, at);
    if (f->kind != KN_CALL || f->a->kind != KN_IDENT) return kj_fail(c, at, "unknown filter");
    const kj_str *name = &f->a->str;
    v = undef_as_str(v, name);
    /* Python's select/reject/map start with `if seq:`, so none gives nothing
     * (functionary's `tools | selectattr(..)` without tools), where
     * @huggingface/jinja raises */
    if (v.t == V_NULL && (str_eq(name, "selectattr") || str_eq(name, "rejectattr") || str_eq(name, "map") ||
                          str_eq(name, "select") || str_eq(name, "reject")))
        return kj_mkarr(c, V_ARR, 0);
    kj_val *pos = NULL;
    size_t npos = 0;
    kj_obj *kw = NULL;
    bool need_args = !((str_eq(name, "selectattr") || str_eq(name, "rejectattr")) && kj_is_arr(v));
    if (need_args && !kj_eval_args(c, &f->list, e, &pos, &npos, &kw)) return KJ_UNDEF;
    if (str_eq(name, "tojson")) return filter_tojson(c, v, kw, at);
    if (str_eq(name, "min") || str_eq(name, "max")) return kj_min_max(c, at, v, pos, npos, kw, name->p[1] == 'a');
    if (str_eq(name, "join")) {
        if (v.t != V_STR && !kj_is_arr(v)) return kj_fail(c, at, "cannot apply filter \"join\" to type: %s", kj_typename(v));
        kj_val sep = arg_or(pos, npos, 0, kw, "separator", (kj_val){.t = V_STR, .s = &(const kj_str){0, ""}});
        if (sep.t != V_STR) return kj_fail(c, at, "separator must be a string");
        return join(c, at, v, sep.s);
    }
    if (str_eq(name, "int") || str_eq(name, "float")) {
        bool isint = name->p[0] == 'i';
        kj_val def = arg_or(pos, npos, 0, kw, "default", kj_num(isint ? V_INT : V_FLOAT, 0));
        if (v.t == V_STR) {
            double d = isint ? js_parse_int(v.s) : js_parse_float(v.s);
            return isnan(d) ? def : kj_num(isint ? V_INT : V_FLOAT, d);
        }
        if (kj_is_num(v)) return v;
        if (v.t == V_BOOL) return kj_num(isint ? V_INT : V_FLOAT, v.b);
        return kj_fail(c, at, "cannot apply filter \"%s\" to type: %s", name->p, kj_typename(v));
    }
    if (str_eq(name, "default")) {
        kj_val def = npos > 0 ? pos[0] : (kj_val){.t = V_STR, .s = &(const kj_str){0, ""}};
        kj_val boolean = arg_or(pos, npos, 1, kw, "boolean", kj_bool(false));
        if (boolean.t != V_BOOL) return kj_fail(c, at, "`default` filter flag must be a boolean");
        if (v.t == V_UNDEF) return def;
        if (boolean.b) {
            bool t = kj_truthy(c, at, v);
            if (c->err) return KJ_UNDEF;
            if (!t) return def;
        }
        return v;
    }
    if (kj_is_arr(v)) {
        if (str_eq(name, "sort")) {
            kj_val rev = arg_or(pos, npos, 0, kw, "reverse", kj_bool(false));
            if (rev.t != V_BOOL) return kj_fail(c, at, "reverse must be a boolean");
            kj_val cs = arg_or(pos, npos, 1, kw, "case_sensitive", kj_bool(false));
            if (cs.t != V_BOOL) return kj_fail(c, at, "case_sensitive must be a boolean");
            kj_val attr = arg_or(pos, npos, 2, kw, "attribute", KJ_NULLV);
            if (attr.t != V_STR && attr.t != V_INT && attr.t != V_NULL)
                return kj_fail(c, at, "attribute must be a string, integer, or null");
            const kj_str *path = NULL;
            if (attr.t == V_STR) path = attr.s;
            else if (attr.t == V_INT) {
                char tmp[40];
                kj_js_num(attr.d, tmp);
                kj_val s = kj_mkstr(c, tmp, strlen(tmp));
                if (c->err) return KJ_UNDEF;
                path = s.s;
            }
            kj_val out = kj_mkarr(c, V_ARR, v.a->n);
            if (c->err) return KJ_UNDEF;
            if (v.a->n) memcpy(out.a->v, v.a->v, v.a->n * sizeof(kj_val));
            sort_opts so = {c, at, cs.b, rev.b, path, -1};
            return sort_vals(&so, out.a->v, out.a->n) ? out : KJ_UNDEF;
        }
        if (str_eq(name, "selectattr") || str_eq(name, "rejectattr"))
            return select_attr(c, v, f, e, at, name->p[0] == 's');
        if (str_eq(name, "map")) {
            kj_val *attr = kj_obj_get(kw, "attribute", 9);
            if (!attr) return kj_fail(c, at, "`map` expressions without `attribute` set are not currently supported");
            if (attr->t != V_STR) return kj_fail(c, at, "attribute must be a string");
            kj_val *def = kj_obj_get(kw, "default", 7);
            kj_val out = kj_mkarr(c, V_ARR, v.a->n);
            for (size_t i = 0; !c->err && i < v.a->n; i++) {
                kj_val it = v.a->v[i];
                if (!kj_is_obj(it) && it.t != V_NS) return kj_fail(c, at, "items in map must be an object");
                kj_val x = kj_attr_path(it, attr->s);
                out.a->v[i] = x.t == V_UNDEF && def ? *def : x;
            }
            return c->err ? KJ_UNDEF : out;
        }
        return kj_fail(c, at, "unknown ArrayValue filter: %s", name->p);
    }
    if (v.t == V_STR) {
        if (str_eq(name, "indent")) {
            kj_val w = arg_or(pos, npos, 0, kw, "width", kj_num(V_INT, 4));
            if (w.t != V_INT) return kj_fail(c, at, "width must be a number");
            kj_val first = arg_or(pos, npos, 1, kw, "first", kj_bool(false));
            kj_val blank = arg_or(pos, npos, 2, kw, "blank", kj_bool(false));
            bool fb = kj_truthy(c, at, first), bb = kj_truthy(c, at, blank);
            if (c->err) return KJ_UNDEF;
            if (w.d > 1e6) return kj_fail(c, at, "indent width %g is too large", w.d);
            return indent_str(c, at, v.s, w.d, fb, bb);
        }
        if (str_eq(name, "replace")) {
            kj_val *args = kj_alloc(c, (npos + 1) * sizeof *args);
            if (!args) return KJ_UNDEF;
            if (npos) memcpy(args, pos, npos * sizeof *args);
            args[npos] = (kj_val){.t = V_KWARGS, .o = kw};
            kj_fn fn = {.kind = F_METHOD, .method = M_REPLACE, .self = v};
            return kj_call_method(c, at, &fn, args, npos + 1);
        }
        return kj_fail(c, at, "unknown StringValue filter: %s", name->p);
    }
    if (kj_is_obj(v)) {
        kj_val fn = kj_builtin_attr(c, v, name);
        if (fn.t == V_FN) {
            kj_val *args = kj_alloc(c, (npos + 1) * sizeof *args);
            if (!args) return KJ_UNDEF;
            if (npos) memcpy(args, pos, npos * sizeof *args);
            if (kw->n) args[npos++] = (kj_val){.t = V_KWARGS, .o = kw};
            return kj_call_method(c, at, fn.f, args, npos);
        }
        return kj_fail(c, at, "unknown ObjectValue filter: %s", name->p);
    }
    if (v.t == V_JSUNDEF) return kj_fail(c, at, "cannot read properties of undefined");
    return kj_fail(c, at, "cannot apply filter \"%s\" to type: %s", name->p, kj_typename(v));
}
