/* jinja_pyfmt.c: the Python pieces that real chat templates call where
 * @huggingface/jinja has none: str.format ("<think{}>".format(tag), tencent
 * Hy3) and the min / max filters ([a, b]|min, MiniCPM5), as Python's jinja2
 * (transformers' renderer, the reference) runs them.
 *
 * str.format follows Python's format-string syntax: "{{" and "}}" escapes,
 * automatic ({}), numbered ({0}) and named ({name}) fields, attribute and
 * index chains ({0.name}, {0[1]}: looked up as jinja2's sandbox does, as
 * items of a dict), conversions (!s, !r, !a) and the format-spec
 * mini-language ([[fill]align][sign][#][0][width][,|_][.precision][type]),
 * nested fields in a spec ({:{w}}) one level deep. Values print as Python's
 * str() prints them (True, None, 1.5, ['a']). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_rt.h"

/* ---- min / max ------------------------------------------------------------ */

static kj_val kw_or(const kj_val *pos, size_t npos, size_t i, const kj_obj *kw, const char *key, kj_val def) {
    if (i < npos && pos[i].t != V_JSUNDEF) return pos[i];
    kj_val *v = kw ? kj_obj_get(kw, key, strlen(key)) : NULL;
    return v && v->t != V_JSUNDEF ? *v : def;
}

kj_val kj_min_max(kj_ctx *c, const kj_node *at, kj_val v, const kj_val *pos, size_t npos, const kj_obj *kw, bool max) {
    const char *nm = max ? "max" : "min";
    kj_val cs = kw_or(pos, npos, 0, kw, "case_sensitive", kj_bool(false));
    kj_val attr = kw_or(pos, npos, 1, kw, "attribute", KJ_NULLV);
    if (cs.t != V_BOOL) return kj_fail(c, at, "%s: case_sensitive must be a boolean", nm);
    if (attr.t != V_STR && attr.t != V_INT && attr.t != V_NULL && attr.t != V_UNDEF)
        return kj_fail(c, at, "%s: attribute must be a string or an integer", nm);
    const kj_str *path = attr.t == V_STR ? attr.s : NULL;
    if (attr.t == V_INT) {
        char tmp[40];
        snprintf(tmp, sizeof tmp, "%.0f", attr.d);
        kj_val s = kj_mkstr(c, tmp, strlen(tmp));
        if (c->err) return KJ_UNDEF;
        path = s.s;
    }
    /* what iter(value) yields: a list's items, a string's characters, a
     * dict's keys; Undefined iterates as empty */
    kj_val items;
    if (kj_is_arr(v)) {
        items = v;
    } else if (kj_is_obj(v) || v.t == V_NS) {
        items = kj_mkarr(c, V_ARR, v.o->n);
        for (size_t i = 0; !c->err && i < v.o->n; i++) items.a->v[i] = kj_obj_key(v.o, i);
    } else if (v.t == V_STR) {
        items = kj_mkarr(c, V_ARR, v.s->len);
        size_t k = 0;
        for (size_t i = 0; !c->err && i < v.s->len;) {
            uint32_t cp;
            int l = kj_utf8_dec(v.s->p, v.s->len, i, &cp);
            items.a->v[k++] = kj_mkstr(c, v.s->p + i, (size_t)l);
            i += (size_t)l;
        }
        if (!c->err) items.a->n = k;
    } else if (v.t == V_UNDEF) {
        return KJ_UNDEF;
    } else {
        return kj_fail(c, at, "%s: '%s' object is not iterable", nm, kj_typename(v));
    }
    if (c->err) return KJ_UNDEF;
    if (!items.a->n) return KJ_UNDEF; /* "No aggregated item, sequence was empty." */
    size_t best = 0;
    kj_val bkey = path ? kj_attr_path(items.a->v[0], path) : items.a->v[0];
    for (size_t i = 1; i < items.a->n; i++) {
        kj_val key = path ? kj_attr_path(items.a->v[i], path) : items.a->v[i];
        int r;
        if (key.t == V_UNDEF || bkey.t == V_UNDEF) /* Undefined's comparisons raise in jinja2 */
            return kj_fail(c, at, "%s: cannot compare an undefined value (no attribute %.*s)", nm,
                          path ? (int)path->len : 0, path ? path->p : "");
        if (!kj_step(c, at, 1) || !kj_compare(c, at, key, bkey, cs.b, &r)) return KJ_UNDEF;
        if (max ? r > 0 : r < 0) best = i, bkey = key;
    }
    return items.a->v[best];
}

/* ---- str.format ------------------------------------------------------------ */

typedef struct {
    kj_ctx *c;
    const kj_node *at;
    const kj_val *args;
    size_t nargs;
    const kj_obj *kw;
    int auto_next; /* -1: manual numbering in use */
    bool manual;
} fmt_state;

typedef struct {
    char fill[5];
    size_t fill_len;
    bool fill_given;
    char align, sign, group, type;
    bool alt, zero;
    bool zero_align; /* '=' only from the '0' flag (a string then pads on the right) */
    long width, prec; /* -1: none */
} fmt_spec;

#define FMT_FAIL(f, ...) (kj_fail((f)->c, (f)->at, __VA_ARGS__), false)

static bool parse_spec(fmt_state *f, const char *s, size_t n, fmt_spec *o) {
    *o = (fmt_spec){.fill = " ", .fill_len = 1, .width = -1, .prec = -1};
    size_t i = 0;
    uint32_t cp;
    int l = n ? kj_utf8_dec(s, n, 0, &cp) : 0;
    if (n > (size_t)l && s[l] && strchr("<>=^", s[l])) {
        memcpy(o->fill, s, (size_t)l);
        o->fill[l] = 0;
        o->fill_len = (size_t)l;
        o->fill_given = true;
        o->align = s[l];
        i = (size_t)l + 1;
    } else if (n && s[0] && strchr("<>=^", s[0])) {
        o->align = s[0];
        i = 1;
    }
    if (i < n && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) o->sign = s[i++];
    if (i < n && s[i] == 'z') i++; /* negative zero coerced: rare, printed as is */
    if (i < n && s[i] == '#') o->alt = true, i++;
    if (i < n && s[i] == '0') o->zero = true, i++;
    if (i < n && s[i] >= '0' && s[i] <= '9') {
        o->width = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            if ((o->width = o->width * 10 + (s[i++] - '0')) > 1000000) return FMT_FAIL(f, "str.format: width too large");
    }
    if (i < n && (s[i] == ',' || s[i] == '_')) o->group = s[i++];
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return FMT_FAIL(f, "str.format: Format specifier missing precision");
        o->prec = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            if ((o->prec = o->prec * 10 + (s[i++] - '0')) > 1000) return FMT_FAIL(f, "str.format: precision too large");
    }
    if (i < n) o->type = s[i++];
    if (i < n) return FMT_FAIL(f, "str.format: Invalid format specifier '%s'", s);
    if (o->zero) { /* the '0' flag: zeros fill (unless a fill is given), sign-aware unless aligned */
        if (!o->fill_given) o->fill[0] = '0';
        if (!o->align) o->align = '=', o->zero_align = true;
    }
    return true;
}

static size_t cp_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Pads head+body (head: sign and prefix, kept before '=' padding) to the width. */
static bool pad_out(fmt_state *f, kj_buf *out, const fmt_spec *o, char def_align, const char *head, size_t nh,
                    const char *body, size_t nb) {
    size_t w = cp_count(head, nh) + cp_count(body, nb);
    size_t padn = o->width > 0 && (size_t)o->width > w ? (size_t)o->width - w : 0;
    char a = o->align ? o->align : def_align;
    size_t left = a == '>' || a == '=' ? padn : a == '^' ? padn / 2 : 0, right = padn - left;
    if (a == '=' && !kj_emit(f->c, f->at, out, head, nh)) return false;
    for (size_t i = 0; i < left; i++)
        if (!kj_emit(f->c, f->at, out, o->fill, o->fill_len)) return false;
    if (a != '=' && !kj_emit(f->c, f->at, out, head, nh)) return false;
    if (!kj_emit(f->c, f->at, out, body, nb)) return false;
    for (size_t i = 0; i < right; i++)
        if (!kj_emit(f->c, f->at, out, o->fill, o->fill_len)) return false;
    return true;
}

static bool format_str(fmt_state *f, kj_buf *out, const fmt_spec *o, const char *s, size_t n) {
    if (o->type && o->type != 's') {
        char t[2] = {o->type, 0};
        return FMT_FAIL(f, "str.format: Unknown format code '%s' for object of type 'str'", t);
    }
    fmt_spec so = *o;
    if (so.zero_align) so.align = 0; /* format('ab', '05'): 'ab000' */
    o = &so;
    if (o->sign || o->alt || o->group || o->align == '=')
        return FMT_FAIL(f, "str.format: %s not allowed in string format specifier",
                        o->align == '=' ? "'=' alignment" : o->sign ? "Sign" : o->alt ? "Alternate form (#)" : "Grouping");
    size_t nb = n;
    if (o->prec >= 0) { /* the first prec characters */
        size_t k = 0;
        for (nb = 0; nb < n; nb++) {
            if (((unsigned char)s[nb] & 0xC0) != 0x80 && k++ == (size_t)o->prec) break;
        }
    }
    return pad_out(f, out, o, '<', "", 0, s, nb);
}

/* The digits (nd of them, the integer part) grouped, then rest; with
 * zeros as the '=' fill, grouped zeros pad the digits to the width (as
 * Python's format(255, '09_'): '0_000_255'). nh: the sign and prefix. */
static size_t number_body(const fmt_spec *o, size_t nh, const char *dg, size_t nd, int every, const char *rest, char *out) {
    size_t nr = strlen(rest), k = 0;
    size_t want = nd;
    if (o->align == '=' && o->fill_len == 1 && o->fill[0] == '0' && o->width > 0 && (size_t)o->width > nh + nr) {
        size_t w = (size_t)o->width - nh - nr;
        if (w > 1000) w = 1000;
        while ((o->group ? want + (want - 1) / (size_t)every : want) < w) want++;
    }
    for (size_t i = 0; i < want; i++) {
        if (o->group && i && (want - i) % (size_t)every == 0) out[k++] = o->group;
        out[k++] = i < want - nd ? '0' : dg[i - (want - nd)];
    }
    memcpy(out + k, rest, nr);
    return k + nr;
}

/* A float's text, its sign aside, as format(a, spec) writes it. */
static bool float_text(fmt_state *f, const fmt_spec *o, char type, double a, char *t, size_t cap) {
    int prec = o->prec >= 0 ? (int)o->prec : 6;
    if (type == 'n') type = 'g';
    if (!isfinite(a)) {
        snprintf(t, cap, "%s%s", isnan(a) ? "nan" : "inf", type == '%' ? "%" : "");
        if (type && strchr("EFG", type))
            for (char *p = t; *p >= 'a' && *p <= 'z'; p++) *p = (char)(*p - 32);
        return true;
    }
    switch (type) {
    case 0: break;
    case '%': snprintf(t, cap, o->alt ? "%#.*f%%" : "%.*f%%", prec, a * 100); return true;
    case 'e': snprintf(t, cap, o->alt ? "%#.*e" : "%.*e", prec, a); return true;
    case 'E': snprintf(t, cap, o->alt ? "%#.*E" : "%.*E", prec, a); return true;
    case 'f': snprintf(t, cap, o->alt ? "%#.*f" : "%.*f", prec, a); return true;
    case 'F': snprintf(t, cap, o->alt ? "%#.*F" : "%.*F", prec, a); return true;
    case 'g': snprintf(t, cap, o->alt ? "%#.*g" : "%.*g", prec ? prec : 1, a); return true;
    default: snprintf(t, cap, o->alt ? "%#.*G" : "%.*G", prec ? prec : 1, a); return true;
    }
    if (o->prec < 0) { /* repr(); '#' keeps a point */
        kj_buf b = {0};
        if (!kj_py_repr(f->c, f->at, kj_num(V_FLOAT, a), &b, 0)) {
            free(b.p);
            return false;
        }
        snprintf(t, cap, "%.*s", (int)b.n, b.p);
        free(b.p);
        char *e = strchr(t, 'e');
        if (o->alt && !strchr(t, '.') && e && strlen(t) + 2 < cap) {
            memmove(e + 1, e, strlen(e) + 1);
            *e = '.';
        }
        return true;
    }
    /* no type, a precision: 'g' that keeps a digit after the point and
     * goes to exponents from exp >= p - 1 */
    int p = prec ? prec : 1;
    char sci[64];
    snprintf(sci, sizeof sci, "%.*e", p - 1, a);
    int ex = atoi(strchr(sci, 'e') + 1);
    if (ex >= -4 && ex < p - 1) {
        snprintf(t, cap, "%.*f", p - 1 - ex, a);
        if (!o->alt && strchr(t, '.')) {
            size_t n = strlen(t);
            while (t[n - 1] == '0') t[--n] = 0;
            if (t[n - 1] == '.') t[n] = '0', t[n + 1] = 0;
        } else if (!strchr(t, '.')) {
            strcat(t, o->alt ? "." : ".0");
        }
    } else {
        snprintf(t, cap, o->alt ? "%#.*e" : "%.*e", p - 1, a);
        char *dot = strchr(t, '.');
        if (!o->alt && dot) { /* the mantissa's trailing zeros go */
            char *e = strchr(t, 'e'), *q = e;
            while (q > t && q[-1] == '0') q--;
            if (q > t && q[-1] == '.') q--;
            memmove(q, e, strlen(e) + 1);
        }
    }
    return true;
}

static bool format_num(fmt_state *f, kj_buf *out, const fmt_spec *o, double d, bool is_int) {
    char type = o->type;
    if (is_int && type && strchr("eEfFgG%", type)) is_int = false;
    if (!is_int && type && strchr("bcdoxX", type)) {
        char t[2] = {type, 0};
        return FMT_FAIL(f, "str.format: Unknown format code '%s' for object of type 'float'", t);
    }
    if (type && !strchr("bcdoxXneEfFgG%", type)) {
        char t[2] = {type, 0};
        return FMT_FAIL(f, "str.format: Unknown format code '%s' for a number", t);
    }
    if (is_int && o->prec >= 0) return FMT_FAIL(f, "str.format: Precision not allowed in integer format specifier");
    char body[4096], digits[1400], head[8] = {0}; /* body: up to 1000 padded digits, their separators and a float's rest */
    size_t nh = 0, nb = 0;
    bool neg = signbit(d) && !(is_int && d == 0);
    double a = fabs(d);
    if (neg) head[nh++] = '-';
    else if (o->sign == '+') head[nh++] = '+';
    else if (o->sign == ' ') head[nh++] = ' ';
    if (is_int && type == 'c') {
        if (o->sign) return FMT_FAIL(f, "str.format: Sign not allowed with integer format specifier 'c'");
        if (d < 0 || d > 0x10FFFF) return FMT_FAIL(f, "str.format: %%c arg not in range(0x110000)");
        nb = (size_t)kj_utf8_enc((uint32_t)d, body);
        return pad_out(f, out, o, '>', "", 0, body, nb);
    }
    if (is_int) {
        if (a >= 1e300) return FMT_FAIL(f, "str.format: integer too large");
        int base = type == 'b' ? 2 : type == 'o' ? 8 : type == 'x' || type == 'X' ? 16 : 10;
        if (o->alt && base != 10) {
            head[nh++] = '0';
            head[nh++] = base == 2 ? 'b' : base == 8 ? 'o' : type == 'X' ? 'X' : 'x';
        }
        size_t nd = 0;
        double r = floor(a);
        do {
            double q = floor(r / base);
            int dig = (int)(r - q * base);
            digits[nd++] = "0123456789abcdef"[dig];
            r = q;
        } while (r > 0 && nd < sizeof digits - 1);
        for (size_t i = 0; i < nd / 2; i++) {
            char t = digits[i];
            digits[i] = digits[nd - 1 - i];
            digits[nd - 1 - i] = t;
        }
        if (type == 'X')
            for (size_t i = 0; i < nd; i++)
                if (digits[i] >= 'a') digits[i] = (char)(digits[i] - 32);
        nb = number_body(o, nh, digits, nd, base == 10 ? 3 : 4, "", body);
    } else {
        char t[1400]; /* 309 integer digits, a point and 1000 decimals at most */
        if (!float_text(f, o, type, a, t, sizeof t)) return false;
        size_t ni = strspn(t, "0123456789");
        memcpy(digits, t, ni);
        nb = number_body(o, nh, digits, ni, 3, t + ni, body);
    }
    return pad_out(f, out, o, '>', head, nh, body, nb);
}

/* str(v) or repr(v) (conv 'r' / 'a') as Python writes it. */
static bool py_text(fmt_state *f, kj_val v, char conv, kj_buf *b) {
    if (v.t == V_STR && conv != 'r' && conv != 'a') return kj_emit(f->c, f->at, b, v.s->p, v.s->len);
    if (v.t == V_FN) return FMT_FAIL(f, "str.format: cannot format a function");
    return kj_py_repr(f->c, f->at, v, b, 0);
}

static bool format_value(fmt_state *f, kj_buf *out, kj_val v, char conv, const char *spec, size_t nspec) {
    fmt_spec o;
    if (!parse_spec(f, spec, nspec, &o)) return false;
    bool numeric = (v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL) && !conv;
    if (numeric && (nspec || v.t != V_BOOL)) {
        if (!nspec && v.t == V_FLOAT) return py_text(f, v, 0, out);
        double d = v.t == V_BOOL ? (double)v.b : v.d;
        return format_num(f, out, &o, d, v.t != V_FLOAT);
    }
    if (nspec && !conv && v.t != V_STR)
        return FMT_FAIL(f, "str.format: unsupported format string passed to %s.__format__", kj_typename(v));
    kj_buf b = {0};
    bool ok = py_text(f, v, conv, &b) && format_str(f, out, &o, b.p ? b.p : "", b.n);
    free(b.p);
    return ok;
}

/* Looks up one item of a chain (.name or [key]), as jinja2's sandbox does:
 * a dict's item, a list's index; Undefined when missing. */
static kj_val lookup(fmt_state *f, kj_val obj, const char *k, size_t n, bool index) {
    bool digits = n > 0 && strspn(k, "0123456789") >= n;
    if (kj_is_arr(obj)) {
        if (!digits) return KJ_UNDEF;
        double i = strtod(k, NULL);
        return i < (double)obj.a->n ? obj.a->v[(size_t)i] : KJ_UNDEF;
    }
    if (kj_is_obj(obj) || obj.t == V_NS) {
        kj_val *v = NULL;
        if (index && digits) v = kj_obj_getv(obj.o, kj_num(V_INT, strtod(k, NULL)));
        if (!v) v = kj_obj_get(obj.o, k, n);
        return v && v->t != V_JSUNDEF ? *v : KJ_UNDEF;
    }
    if (obj.t == V_STR && index && digits) {
        double i = strtod(k, NULL);
        return i < (double)obj.s->len ? kj_mkstr(f->c, obj.s->p + (size_t)i, 1) : KJ_UNDEF;
    }
    return KJ_UNDEF;
}

static bool render_fmt(fmt_state *f, const char *s, size_t n, kj_buf *out, int depth);

/* One replacement field's text between its braces. */
static bool render_field(fmt_state *f, const char *s, size_t n, kj_buf *out, int depth) {
    size_t i = 0, br = 0;
    while (i < n && (br || (s[i] != '!' && s[i] != ':'))) {
        if (s[i] == '[') br++;
        else if (s[i] == ']' && br) br--;
        i++;
    }
    size_t name_end = i, an = strcspn(s, ".[");
    if (an > name_end) an = name_end;
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(an < 200 ? an : 200), s);
    kj_val v;
    if (an == 0 || strspn(s, "0123456789") >= an) {
        size_t idx;
        if (an == 0) {
            if (f->manual) return FMT_FAIL(f, "str.format: cannot switch from manual field specification to automatic field numbering");
            idx = (size_t)f->auto_next++;
        } else {
            if (f->auto_next > 0) return FMT_FAIL(f, "str.format: cannot switch from automatic field numbering to manual field specification");
            f->manual = true;
            idx = (size_t)strtod(tmp, NULL);
        }
        if (idx >= f->nargs) {
            snprintf(tmp, sizeof tmp, "%zu", idx);
            return FMT_FAIL(f, "str.format: Replacement index %s out of range for positional args tuple", tmp);
        }
        v = f->args[idx];
    } else {
        kj_val *p = f->kw ? kj_obj_get(f->kw, s, an) : NULL;
        if (!p) return FMT_FAIL(f, "str.format: KeyError: '%s'", tmp);
        v = *p;
    }
    if (an == 0 && name_end > 0) /* "{[1]}": jinja2's formatter numbers only a bare {} */
        return FMT_FAIL(f, "str.format: KeyError: ''");
    for (size_t j = an; j < name_end;) {
        if (v.t == V_UNDEF) return FMT_FAIL(f, "str.format: an attribute of an undefined value");
        bool index = s[j] == '[';
        size_t k = ++j;
        if (index) {
            while (k < name_end && s[k] != ']') k++;
            if (k >= name_end) return FMT_FAIL(f, "str.format: Missing ']' in format string");
        } else {
            while (k < name_end && s[k] != '.' && s[k] != '[') k++;
        }
        if (k == j) return FMT_FAIL(f, "str.format: Empty attribute in format string");
        v = lookup(f, v, s + j, k - j, index);
        if (f->c->err) return false;
        j = k + index;
        if (index && j < name_end && s[j] != '.' && s[j] != '[')
            return FMT_FAIL(f, "str.format: Only '.' or '[' may follow ']' in format field specifier");
    }
    char conv = 0;
    if (i < n && s[i] == '!') {
        if (i + 1 >= n) return FMT_FAIL(f, "str.format: end of string while looking for conversion specifier");
        conv = s[i + 1];
        if (conv != 's' && conv != 'r' && conv != 'a') {
            char t[2] = {conv, 0};
            return FMT_FAIL(f, "str.format: Unknown conversion specifier %s", t);
        }
        i += 2;
        if (i < n && s[i] != ':') return FMT_FAIL(f, "str.format: expected ':' after conversion specifier");
    }
    const char *spec = i < n ? s + i + 1 : "";
    size_t nspec = i < n ? n - i - 1 : 0;
    kj_buf sb = {0};
    if (memchr(spec, '{', nspec)) { /* nested fields in the spec */
        if (depth >= 1) return FMT_FAIL(f, "str.format: Max string recursion exceeded");
        if (!render_fmt(f, spec, nspec, &sb, depth + 1)) {
            free(sb.p);
            return false;
        }
    } else if (!kj_emit(f->c, f->at, &sb, spec, nspec)) {
        free(sb.p);
        return false;
    }
    size_t ns = sb.n;
    bool ok = kj_emit(f->c, f->at, &sb, "", 1) && /* NUL-terminated: parse_spec's messages print it */
              format_value(f, out, v, conv, sb.p, ns);
    free(sb.p);
    return ok;
}

static bool render_fmt(fmt_state *f, const char *s, size_t n, kj_buf *out, int depth) {
    for (size_t i = 0; i < n;) {
        if (!kj_step(f->c, f->at, 1)) return false;
        if (s[i] == '{') {
            if (i + 1 < n && s[i + 1] == '{') {
                if (!kj_emit(f->c, f->at, out, "{", 1)) return false;
                i += 2;
                continue;
            }
            size_t j = i + 1, d = 1, br = 0;
            for (; j < n; j++) {
                if (s[j] == '[') br++;
                else if (s[j] == ']' && br) br--;
                else if (!br && s[j] == '{') d++;
                else if (!br && s[j] == '}' && --d == 0) break;
            }
            if (j >= n) return FMT_FAIL(f, "str.format: expected '}' before end of string");
            if (!render_field(f, s + i + 1, j - i - 1, out, depth)) return false;
            i = j + 1;
        } else if (s[i] == '}') {
            if (i + 1 >= n || s[i + 1] != '}') return FMT_FAIL(f, "str.format: Single '}' encountered in format string");
            if (!kj_emit(f->c, f->at, out, "}", 1)) return false;
            i += 2;
        } else {
            size_t j = i;
            while (j < n && s[j] != '{' && s[j] != '}') j++;
            if (!kj_emit(f->c, f->at, out, s + i, j - i)) return false;
            i = j;
        }
    }
    return true;
}

kj_val kj_str_format(kj_ctx *c, const kj_node *at, const kj_str *s, const kj_val *args, size_t nargs, const kj_obj *kw) {
    fmt_state f = {c, at, args, nargs, kw, 0, false};
    kj_buf b = {0};
    if (!render_fmt(&f, s->p, s->len, &b, 0)) {
        free(b.p);
        return KJ_UNDEF;
    }
    return kj_buf_str(c, at, &b);
}
