/* gbnf.c: llama.cpp's GBNF (grammars/README.md there) parsed into the flat
 * byte grammar of gr_int.h. Repetitions expand as llama.cpp's parser does
 * (x* to a right-recursive rule, x{m,n} to m copies and nested options);
 * code point classes become alternatives of UTF-8 byte-range sequences. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gr_int.h"

#define GR_MAX_RULES 200000
#define GR_MAX_ELEMS 4000000
#define GR_MAX_REPEAT 100000

/* ---- strings ---- */
void kgr_buf_put(kgr_buf *b, const char *s, size_t n) {
    if (b->oom || (!n && b->p)) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
void kgr_buf_puts(kgr_buf *b, const char *s) { kgr_buf_put(b, s, strlen(s)); }
void kgr_buf_printf(kgr_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        kgr_buf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kgr_buf_put(b, big, (size_t)n);
    free(big);
}
void kgr_buf_literal(kgr_buf *b, const char *s, size_t n) {
    kgr_buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            kgr_buf_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) kgr_buf_printf(b, "\\x%02X", c);
        else kgr_buf_put(b, (const char *)&c, 1);
    }
    kgr_buf_put(b, "\"", 1);
}

/* ---- the builder ---- */
typedef struct {
    kgr_elem *v;
    int32_t n, cap;
    char *name;
    bool defined;
    uint64_t hash; /* helpers: of the body, for sharing identical ones */
    bool helper;
} rule;

typedef struct {
    const char *s, *end, *line0;
    int line;
    rule *r;
    int32_t n_rules, cap_rules;
    kgr_set *sets;
    int32_t n_sets, cap_sets;
    kgr_perm *perms;
    int32_t n_perms, cap_perms;
    int64_t n_elems;
    int32_t *names; /* open addressing: named rules by name */
    uint32_t names_cap, n_names;
    const kgr_vocab *vocab; /* resolves <|name|> references (NULL: only <[id]>) */
    int32_t *tok_refs, n_tok_refs, cap_tok_refs;
    kiln_status err;
} parser;

static kiln_status perr(parser *p, const char *fmt, ...) KILN_PRINTF(2, 3);
static kiln_status perr(parser *p, const char *fmt, ...) {
    if (p->err) return p->err;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->err = kiln_error(KILN_EINVAL, "grammar: line %d column %d: %s", p->line, (int)(p->s - p->line0) + 1, msg);
    return p->err;
}

static bool push(parser *p, int32_t r, int32_t type, int32_t val) {
    rule *x = &p->r[r];
    if (++p->n_elems > GR_MAX_ELEMS) {
        perr(p, "the grammar is too large (over %d elements)", GR_MAX_ELEMS);
        return false;
    }
    if (x->n == x->cap) {
        int32_t c = x->cap ? x->cap * 2 : 8;
        kgr_elem *q = realloc(x->v, sizeof *q * (size_t)c);
        if (!q) {
            perr(p, "out of memory");
            return false;
        }
        x->v = q;
        x->cap = c;
    }
    x->v[x->n++] = (kgr_elem){type, val};
    return true;
}

static int32_t new_rule(parser *p, const char *name, size_t nl, bool helper) {
    if (p->n_rules >= GR_MAX_RULES) {
        perr(p, "too many rules (over %d)", GR_MAX_RULES);
        return -1;
    }
    if (p->n_rules == p->cap_rules) {
        int32_t c = p->cap_rules ? p->cap_rules * 2 : 64;
        rule *q = realloc(p->r, sizeof *q * (size_t)c);
        if (!q) {
            perr(p, "out of memory");
            return -1;
        }
        p->r = q;
        p->cap_rules = c;
    }
    rule *x = &p->r[p->n_rules];
    memset(x, 0, sizeof *x);
    x->name = malloc(nl + 1);
    if (!x->name) {
        perr(p, "out of memory");
        return -1;
    }
    memcpy(x->name, name, nl);
    x->name[nl] = 0;
    x->helper = helper;
    return p->n_rules++;
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int32_t find_rule(parser *p, const char *name, size_t nl) {
    if ((p->n_names + 1) * 2 > p->names_cap) { /* grow and rehash */
        uint32_t nc = p->names_cap ? p->names_cap * 2 : 256;
        int32_t *t = malloc(sizeof *t * nc);
        if (!t) return perr(p, "out of memory"), -1;
        memset(t, 0xff, sizeof *t * nc);
        for (uint32_t i = 0; i < p->names_cap; i++)
            if (p->names[i] >= 0) {
                const char *q = p->r[p->names[i]].name;
                uint32_t j = name_hash(q, strlen(q)) & (nc - 1);
                while (t[j] >= 0) j = (j + 1) & (nc - 1);
                t[j] = p->names[i];
            }
        free(p->names);
        p->names = t;
        p->names_cap = nc;
    }
    uint32_t m = p->names_cap - 1, h = name_hash(name, nl) & m;
    for (; p->names[h] >= 0; h = (h + 1) & m) {
        const char *q = p->r[p->names[h]].name;
        if (strlen(q) == nl && !memcmp(q, name, nl)) return p->names[h];
    }
    int32_t r = new_rule(p, name, nl, false);
    if (r >= 0) {
        p->names[h] = r;
        p->n_names++;
    }
    return r;
}

static int32_t helper(parser *p, int32_t parent) {
    char nm[64];
    snprintf(nm, sizeof nm, "%s_%d", parent >= 0 ? p->r[parent].name : "h", p->n_rules);
    return new_rule(p, nm, strlen(nm), true);
}

static int32_t set_index(parser *p, const kgr_set *s) {
    for (int32_t i = p->n_sets - 1; i >= 0 && i >= p->n_sets - 64; i--)
        if (!memcmp(&p->sets[i], s, sizeof *s)) return i;
    if (p->n_sets == p->cap_sets) {
        int32_t c = p->cap_sets ? p->cap_sets * 2 : 64;
        kgr_set *q = realloc(p->sets, sizeof *q * (size_t)c);
        if (!q) {
            perr(p, "out of memory");
            return -1;
        }
        p->sets = q;
        p->cap_sets = c;
    }
    p->sets[p->n_sets] = *s;
    return p->n_sets++;
}

static bool grow_refs(parser *p) {
    if (p->n_tok_refs < p->cap_tok_refs) return true;
    int32_t c = p->cap_tok_refs ? p->cap_tok_refs * 2 : 8;
    int32_t *q = realloc(p->tok_refs, sizeof *q * (size_t)c);
    if (!q) return perr(p, "out of memory"), false;
    p->tok_refs = q;
    p->cap_tok_refs = c;
    return true;
}

static bool push_byte_range(parser *p, int32_t r, unsigned lo, unsigned hi) {
    kgr_set s = {{0}};
    for (unsigned b = lo; b <= hi; b++) s.w[b >> 6] |= 1ull << (b & 63);
    int32_t i = set_index(p, &s);
    return i >= 0 && push(p, r, KE_BYTES, i);
}

static int utf8_enc(uint32_t c, unsigned char *o) {
    if (c < 0x80) return o[0] = (unsigned char)c, 1;
    if (c < 0x800) return o[0] = (unsigned char)(0xC0 | c >> 6), o[1] = (unsigned char)(0x80 | (c & 63)), 2;
    if (c < 0x10000)
        return o[0] = (unsigned char)(0xE0 | c >> 12), o[1] = (unsigned char)(0x80 | (c >> 6 & 63)),
               o[2] = (unsigned char)(0x80 | (c & 63)), 3;
    o[0] = (unsigned char)(0xF0 | c >> 18);
    o[1] = (unsigned char)(0x80 | (c >> 12 & 63));
    o[2] = (unsigned char)(0x80 | (c >> 6 & 63));
    o[3] = (unsigned char)(0x80 | (c & 63));
    return 4;
}

/* Appends the alternatives matching code points [lo, hi] to rule r (each
 * alternative preceded by KE_ALT except the first; *first tracks that). The
 * split is the classic one (as Rust's utf8-ranges): cut at encoding-length
 * boundaries, then where continuation bytes do not span their full range. */
static bool utf8_alts(parser *p, int32_t r, uint32_t lo, uint32_t hi, bool *first) {
    static const uint32_t bound[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i])
            return utf8_alts(p, r, lo, bound[i], first) && utf8_alts(p, r, bound[i] + 1, hi, first);
    unsigned char a[4], b[4];
    int n = utf8_enc(lo, a);
    utf8_enc(hi, b);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) return utf8_alts(p, r, lo, lo | m, first) && utf8_alts(p, r, (lo | m) + 1, hi, first);
            if ((hi & m) != m) return utf8_alts(p, r, lo, (hi & ~m) - 1, first) && utf8_alts(p, r, hi & ~m, hi, first);
        }
    }
    if (!*first && !push(p, r, KE_ALT, 0)) return false;
    *first = false;
    for (int i = 0; i < n; i++)
        if (!push_byte_range(p, r, a[i], b[i])) return false;
    return true;
}

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sorts and merges; with neg, complements over the Unicode scalar values. */
int32_t kgr_ranges_normalize(cprange *v, int32_t n, bool neg, cprange *out) {
    if (n > 1) qsort(v, (size_t)n, sizeof *v, cmp_range);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (m && v[i].lo <= out[m - 1].hi + 1) {
            if (v[i].hi > out[m - 1].hi) out[m - 1].hi = v[i].hi;
        } else out[m++] = v[i];
    }
    cprange *tmp = malloc(sizeof *tmp * (size_t)(m * 2 + 4));
    if (!tmp) return -1;
    if (neg) {
        int32_t k = 0;
        uint32_t at = 0;
        for (int32_t i = 0; i < m; i++) {
            if (out[i].lo > at) tmp[k++] = (cprange){at, out[i].lo - 1};
            at = out[i].hi + 1;
        }
        if (at <= 0x10FFFF) tmp[k++] = (cprange){at, 0x10FFFF};
        memcpy(out, tmp, sizeof *tmp * (size_t)k);
        m = k;
    }
    /* no surrogates: they are not encodable */
    int32_t k = 0;
    for (int32_t i = 0; i < m; i++) {
        cprange x = out[i];
        if (x.hi > 0x10FFFF) x.hi = 0x10FFFF;
        if (x.lo > x.hi) continue;
        if (x.lo < 0xD800 && x.hi > 0xDFFF) {
            tmp[k++] = (cprange){x.lo, 0xD7FF};
            tmp[k++] = (cprange){0xE000, x.hi};
        } else if (x.lo >= 0xD800 && x.hi <= 0xDFFF) continue;
        else if (x.lo >= 0xD800 && x.lo <= 0xDFFF) tmp[k++] = (cprange){0xE000, x.hi};
        else if (x.hi >= 0xD800 && x.hi <= 0xDFFF) tmp[k++] = (cprange){x.lo, 0xD7FF};
        else tmp[k++] = x;
    }
    memcpy(out, tmp, sizeof *tmp * (size_t)k);
    free(tmp);
    return k;
}

/* Emits a code point class into rule r: one KE_BYTES when all ASCII, else a
 * reference to a helper rule of UTF-8 alternatives. */
static bool emit_class(parser *p, int32_t r, cprange *v, int32_t n, bool neg) {
    cprange *norm = malloc(sizeof *norm * (size_t)(n * 2 + 4));
    if (!norm) return perr(p, "out of memory"), false;
    int32_t m = kgr_ranges_normalize(v, n, neg, norm);
    bool ok = true;
    if (m < 0) {
        perr(p, "out of memory");
        ok = false;
    }
    else if (m == 0) {
        /* an empty class matches nothing: a set with no bytes */
        kgr_set s = {{0}};
        int32_t i = set_index(p, &s);
        ok = i >= 0 && push(p, r, KE_BYTES, i);
    } else if (norm[m - 1].hi < 0x80) {
        kgr_set s = {{0}};
        for (int32_t i = 0; i < m; i++)
            for (uint32_t c = norm[i].lo; c <= norm[i].hi; c++) s.w[c >> 6] |= 1ull << (c & 63);
        int32_t i = set_index(p, &s);
        ok = i >= 0 && push(p, r, KE_BYTES, i);
    } else {
        int32_t h = helper(p, r);
        ok = h >= 0;
        bool first = true;
        /* the ASCII part as one set */
        kgr_set s = {{0}};
        bool any = false;
        for (int32_t i = 0; i < m && ok; i++)
            for (uint32_t c = norm[i].lo; c <= norm[i].hi && c < 0x80; c++) s.w[c >> 6] |= 1ull << (c & 63), any = true;
        if (ok && any) {
            int32_t si = set_index(p, &s);
            ok = si >= 0 && push(p, h, KE_BYTES, si);
            first = false;
        }
        for (int32_t i = 0; i < m && ok; i++) {
            uint32_t lo = norm[i].lo < 0x80 ? 0x80 : norm[i].lo;
            if (lo <= norm[i].hi) ok = utf8_alts(p, h, lo, norm[i].hi, &first);
        }
        ok = ok && push(p, h, KE_END, 0) && push(p, r, KE_REF, h);
        if (ok) p->r[h].defined = true;
    }
    free(norm);
    return ok;
}

/* ---- the GBNF text ---- */
static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static void skip_space(parser *p, bool newlines) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == '#') {
            while (p->s < p->end && *p->s != '\n' && *p->s != '\r') p->s++;
        } else if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newlines)) {
            if (c == '\n') {
                p->line++;
                p->line0 = p->s + 1;
            }
            p->s++;
        } else break;
    }
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* one (possibly escaped) character of a literal or class */
static bool parse_char(parser *p, uint32_t *cp) {
    if (p->s >= p->end) return perr(p, "unexpected end of input"), false;
    unsigned char c = (unsigned char)*p->s;
    if (c == '\\') {
        p->s++;
        if (p->s >= p->end) return perr(p, "unexpected end of input after '\\'"), false;
        char e = *p->s++;
        int nd = 0;
        switch (e) {
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        case 't': *cp = '\t'; return true;
        case 'r': *cp = '\r'; return true;
        case 'n': *cp = '\n'; return true;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'': *cp = (uint32_t)e; return true;
        default: p->s--; return perr(p, "unknown escape '\\%c'", e), false;
        }
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            int h = p->s < p->end ? hexv(*p->s) : -1;
            if (h < 0) return perr(p, "expected %d hex digits after '\\%c'", nd, e), false;
            v = v * 16 + (uint32_t)h;
            p->s++;
        }
        if (v > 0x10FFFF) return perr(p, "code point U+%X is out of range", v), false;
        *cp = v;
        return true;
    }
    /* UTF-8 in the grammar text */
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || p->s + n > p->end) return perr(p, "invalid UTF-8 in the grammar"), false;
    uint32_t v = n == 1 ? c : n == 2 ? (c & 31u) : n == 3 ? (c & 15u) : (c & 7u);
    for (int i = 1; i < n; i++) {
        unsigned char d = (unsigned char)p->s[i];
        if ((d & 0xC0) != 0x80) return perr(p, "invalid UTF-8 in the grammar"), false;
        v = v << 6 | (d & 63u);
    }
    p->s += n;
    *cp = v;
    return true;
}

static bool parse_alternates(parser *p, int32_t r, bool nested);

/* A token reference at p->s ('<'): <[id]> or <TEXT> (the token whose text
 * is "<TEXT>", as llama.cpp's GBNF): a special token's marker (gr_int.h),
 * or an ordinary token's text as a literal. */
static bool parse_token_ref(parser *p, int32_t r) {
    const char *s0 = p->s;
    int32_t id = -1;
    bool special = true;
    if (p->s + 1 < p->end && p->s[1] == '[') {
        p->s += 2;
        int64_t v = 0;
        if (p->s >= p->end || *p->s < '0' || *p->s > '9') return perr(p, "expected a token id after '<['"), false;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
            v = v * 10 + (*p->s++ - '0');
            if (v > KGR_MAX_TOKEN_ID) return perr(p, "token id over %d", KGR_MAX_TOKEN_ID), false;
        }
        if (p->end - p->s < 2 || p->s[0] != ']' || p->s[1] != '>') return perr(p, "expected ']>' after the token id"), false;
        p->s += 2;
        id = (int32_t)v;
        if (p->vocab && !kgr_vocab_is_special(p->vocab, id)) {
            if (id >= kgr_vocab_size(p->vocab)) return perr(p, "token <[%d]> is beyond the vocabulary", id), false;
            special = false;
        }
    } else {
        const char *e = memchr(p->s, '>', (size_t)(p->end - p->s));
        const char *nl = memchr(p->s, '\n', (size_t)(p->end - p->s));
        if (!e || (nl && nl < e)) return perr(p, "unterminated token reference (expected '>')"), false;
        p->s = e + 1;
        int ln = (int)(p->s - s0) > 64 ? 64 : (int)(p->s - s0);
        if (!p->vocab) return perr(p, "the token reference %.*s needs the model's vocabulary (or write <[id]>)", ln, s0), false;
        id = kgr_vocab_lookup(p->vocab, s0, (size_t)(p->s - s0), &special);
        if (id < 0) return perr(p, "%.*s is not a token of the model's vocabulary", ln, s0), false;
    }
    if (!special) { /* an ordinary token: its text */
        char buf[256];
        int32_t n = kgr_vocab_token_text(p->vocab, id, buf, sizeof buf);
        if (n <= 0 || n > (int32_t)sizeof buf) return perr(p, "token <[%d]> has no text a grammar can match", id), false;
        for (int32_t i = 0; i < n; i++)
            if (!push_byte_range(p, r, (unsigned char)buf[i], (unsigned char)buf[i])) return false;
        return true;
    }
    if (!grow_refs(p)) return false;
    p->tok_refs[p->n_tok_refs++] = id;
    unsigned char m[KGR_MARKER_LEN];
    kgr_token_marker(id, m);
    for (int i = 0; i < KGR_MARKER_LEN; i++)
        if (!push_byte_range(p, r, m[i], m[i])) return false;
    return true;
}

/* Wraps r's elements [from, n) into a helper rule, leaving one KE_REF. */
static int32_t wrap(parser *p, int32_t r, int32_t from) {
    int32_t h = helper(p, r);
    if (h < 0) return -1;
    rule *x = &p->r[r];
    for (int32_t i = from; i < x->n; i++)
        if (!push(p, h, p->r[r].v[i].type, p->r[r].v[i].val)) return -1;
    if (!push(p, h, KE_END, 0)) return -1;
    p->r[h].defined = true;
    p->r[r].n = from;
    return h;
}

/* x{min,max} on r's elements [from, n); max < 0: unbounded. */
static bool repeat(parser *p, int32_t r, int32_t from, int64_t min, int64_t max) {
    if (max >= 0 && max < min) return perr(p, "repetition {%lld,%lld}: max < min", (long long)min, (long long)max), false;
    if (min > GR_MAX_REPEAT || max > GR_MAX_REPEAT) return perr(p, "repetition count over %d", GR_MAX_REPEAT), false;
    int32_t x = from == p->r[r].n - 1 && p->r[r].v[from].type == KE_REF ? p->r[r].v[from].val : -1;
    if (x < 0 || p->r[r].n - from != 1) {
        x = wrap(p, r, from);
        if (x < 0) return false;
    } else p->r[r].n = from;
    for (int64_t i = 0; i < min; i++)
        if (!push(p, r, KE_REF, x)) return false;
    if (max < 0) { /* x*: S ::= x S | "" */
        int32_t s = helper(p, r);
        if (s < 0) return false;
        if (!push(p, s, KE_REF, x) || !push(p, s, KE_REF, s) || !push(p, s, KE_ALT, 0) || !push(p, s, KE_END, 0)) return false;
        p->r[s].defined = true;
        return push(p, r, KE_REF, s);
    }
    if (max == min) return true;
    /* (x (x (x)?)?)?: O_k ::= x O_{k-1} | "", built from the innermost */
    int32_t inner = -1;
    for (int64_t k = 0; k < max - min; k++) {
        int32_t o = helper(p, r);
        if (o < 0) return false;
        if (!push(p, o, KE_REF, x) || (inner >= 0 && !push(p, o, KE_REF, inner)) || !push(p, o, KE_ALT, 0) ||
            !push(p, o, KE_END, 0))
            return false;
        p->r[o].defined = true;
        inner = o;
    }
    return push(p, r, KE_REF, inner);
}

static bool parse_int(parser *p, int64_t *v) {
    if (p->s >= p->end || *p->s < '0' || *p->s > '9') return perr(p, "expected a number"), false;
    *v = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        *v = *v * 10 + (*p->s++ - '0');
        if (*v > GR_MAX_REPEAT) return perr(p, "repetition count over %d", GR_MAX_REPEAT), false;
    }
    return true;
}

/* `%perm(SEP, a b? c*)` or `%perm1(...)` (see KE_PERM), p->s after the '%' */
static bool parse_perm(parser *p, int32_t r) {
    kgr_perm q = {.sep = -1};
    if (p->end - p->s >= 6 && !memcmp(p->s, "perm1(", 6)) q.nonempty = true, p->s += 6;
    else if (p->end - p->s >= 5 && !memcmp(p->s, "perm(", 5)) p->s += 5;
    else return perr(p, "expected '%%perm(' or '%%perm1('"), false;
    for (;;) {
        skip_space(p, true);
        if (p->s < p->end && *p->s == ')') break;
        const char *w = p->s;
        while (p->s < p->end && is_word(*p->s)) p->s++;
        if (p->s == w) return perr(p, "%%perm: expected a rule name"), false;
        int32_t ref = find_rule(p, w, (size_t)(p->s - w));
        if (ref < 0) return false;
        if (q.sep < 0) {
            q.sep = ref;
            skip_space(p, true);
            if (p->s >= p->end || *p->s != ',') return perr(p, "%%perm: expected ',' after the separator"), false;
            p->s++;
            continue;
        }
        if (q.n == KGR_PERM_MAX) return perr(p, "%%perm: over %d members", KGR_PERM_MAX), false;
        uint64_t bit = 1ull << q.n;
        if (p->s < p->end && *p->s == '*') q.rep |= bit, p->s++;
        else if (p->s < p->end && *p->s == '?') p->s++;
        else q.req |= bit;
        q.member[q.n++] = ref;
    }
    p->s++;
    if (q.sep < 0 || !q.n) return perr(p, "%%perm: expected a separator and members"), false;
    if (p->n_perms == p->cap_perms) {
        int32_t c = p->cap_perms ? p->cap_perms * 2 : 8;
        kgr_perm *t = realloc(p->perms, sizeof *t * (size_t)c);
        if (!t) return perr(p, "out of memory"), false;
        p->perms = t;
        p->cap_perms = c;
    }
    p->perms[p->n_perms] = q;
    return push(p, r, KE_PERM, p->n_perms++);
}

static bool parse_sequence(parser *p, int32_t r, bool nested) {
    int32_t last = -1; /* start of the last symbol, for the postfix operators */
    for (;;) {
        skip_space(p, nested);
        if (p->s >= p->end) return true;
        char c = *p->s;
        if (c == '"') {
            p->s++;
            last = p->r[r].n;
            while (p->s < p->end && *p->s != '"') {
                uint32_t cp;
                if (!parse_char(p, &cp)) return false;
                unsigned char b[4];
                int n = utf8_enc(cp, b);
                for (int i = 0; i < n; i++)
                    if (!push_byte_range(p, r, b[i], b[i])) return false;
            }
            if (p->s >= p->end) return perr(p, "unterminated literal"), false;
            p->s++;
            if (p->r[r].n == last) last = -1; /* "" is nothing */
        } else if (c == '[') {
            p->s++;
            bool neg = p->s < p->end && *p->s == '^';
            if (neg) p->s++;
            int32_t n = 0, cap = 16;
            cprange *v = malloc(sizeof *v * (size_t)cap);
            if (!v) return perr(p, "out of memory"), false;
            while (p->s < p->end && *p->s != ']') {
                uint32_t lo, hi;
                if (!parse_char(p, &lo)) return free(v), false;
                hi = lo;
                if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
                    p->s++;
                    if (!parse_char(p, &hi)) return free(v), false;
                    if (hi < lo) return free(v), perr(p, "character range is out of order"), false;
                }
                if (n == cap) {
                    cap *= 2;
                    cprange *q = realloc(v, sizeof *v * (size_t)cap);
                    if (!q) return free(v), perr(p, "out of memory"), false;
                    v = q;
                }
                v[n++] = (cprange){lo, hi};
            }
            if (p->s >= p->end) return free(v), perr(p, "unterminated character class"), false;
            p->s++;
            last = p->r[r].n;
            bool ok = emit_class(p, r, v, n, neg);
            free(v);
            if (!ok) return false;
        } else if (c == '.') {
            p->s++;
            last = p->r[r].n;
            cprange all = {0, 0x10FFFF};
            if (!emit_class(p, r, &all, 1, false)) return false;
        } else if (is_word(c)) {
            const char *w = p->s;
            while (p->s < p->end && is_word(*p->s)) p->s++;
            /* the next rule's "name ::=" ends this one (llama.cpp allows it) */
            const char *q = p->s;
            while (q < p->end && (*q == ' ' || *q == '\t')) q++;
            if (q + 2 < p->end && !memcmp(q, "::=", 3)) {
                p->s = w;
                return true;
            }
            int32_t ref = find_rule(p, w, (size_t)(p->s - w));
            if (ref < 0) return false;
            last = p->r[r].n;
            if (!push(p, r, KE_REF, ref)) return false;
        } else if (c == '(') {
            p->s++;
            int32_t h = helper(p, r);
            if (h < 0 || !parse_alternates(p, h, true)) return false;
            skip_space(p, true);
            if (p->s >= p->end || *p->s != ')') return perr(p, "expected ')'"), false;
            p->s++;
            p->r[h].defined = true;
            last = p->r[r].n;
            if (!push(p, r, KE_REF, h)) return false;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) return perr(p, "'%c' follows nothing", c), false;
            p->s++;
            int64_t lo = 0, hi = -1;
            if (c == '+') lo = 1;
            else if (c == '?') hi = 1;
            else if (c == '{') {
                skip_space(p, false);
                if (!parse_int(p, &lo)) return false;
                skip_space(p, false);
                hi = lo;
                if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, false);
                    hi = -1;
                    if (p->s < p->end && *p->s != '}' && !parse_int(p, &hi)) return false;
                    skip_space(p, false);
                }
                if (p->s >= p->end || *p->s != '}') return perr(p, "expected '}'"), false;
                p->s++;
            }
            if (!repeat(p, r, last, lo, hi)) return false;
            last = -1;
        } else if (c == '|' || c == ')' || c == '\n' || c == '\r') {
            return true;
        } else if (c == '%') {
            p->s++;
            last = p->r[r].n;
            if (!parse_perm(p, r)) return false;
        } else if (c == '<') {
            last = p->r[r].n;
            if (!parse_token_ref(p, r)) return false;
        } else if (c == '!' && p->s + 1 < p->end && p->s[1] == '<') {
            return perr(p, "negated token references (!<...>) are not supported"), false;
        } else {
            return perr(p, "unexpected '%c'", c), false;
        }
    }
}

static bool parse_alternates(parser *p, int32_t r, bool nested) {
    if (!parse_sequence(p, r, nested)) return false;
    while (p->s < p->end && *p->s == '|') {
        p->s++;
        if (!push(p, r, KE_ALT, 0) || !parse_sequence(p, r, nested)) return false;
    }
    return push(p, r, KE_END, 0);
}

/* ---- checks ---- */

/* Left recursion loops the pushdown recognizer: refused, as llama.cpp does.
 * A rule is nullable when some alternative has only nullable elements; an
 * edge r -> s joins r to each rule reachable at the left of one of its
 * alternatives through nullable prefixes. */
/* a perm is nullable when its required members all are (nonempty ignored:
 * more nullable only finds more left recursion) */
static bool perm_nullable(const kgr_grammar *g, int32_t i, const bool *nul) {
    const kgr_perm *q = &g->perms[i];
    for (int32_t k = 0; k < q->n; k++)
        if ((q->req >> k & 1) && !nul[q->member[k]]) return false;
    return true;
}

static kiln_status check_left_recursion(const kgr_grammar *g) {
    int32_t n = g->n_rules;
    bool *nul = calloc((size_t)n, 1);
    int8_t *mark = calloc((size_t)n, 1);
    int64_t n_adj = g->n_el + 1;
    for (int32_t i = 0; i < g->n_el; i++)
        if (g->el[i].type == KE_PERM) n_adj += g->perms[g->el[i].val].n + 1;
    int32_t *off = calloc((size_t)n + 1, sizeof *off), *adj = malloc(sizeof *adj * (size_t)n_adj);
    int32_t *stk = malloc(sizeof *stk * (size_t)n * 2 + 8);
    kiln_status st = NULL;
    if (!nul || !mark || !off || !adj || !stk) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto done;
    }
    for (bool ch = true; ch;) {
        ch = false;
        for (int32_t r = 0; r < n; r++) {
            if (nul[r]) continue;
            bool alt_ok = true;
            for (const kgr_elem *e = g->el + g->start[r];; e++) {
                if (e->type == KE_END || e->type == KE_ALT) {
                    if (alt_ok) {
                        nul[r] = ch = true;
                        break;
                    }
                    if (e->type == KE_END) break;
                    alt_ok = true;
                } else if (e->type == KE_BYTES || (e->type == KE_REF && !nul[e->val]) ||
                           (e->type == KE_PERM && !perm_nullable(g, e->val, nul)))
                    alt_ok = false;
            }
        }
    }
    int32_t na = 0;
    for (int32_t r = 0; r < n; r++) {
        off[r] = na;
        bool left = true;
        for (const kgr_elem *e = g->el + g->start[r]; e->type != KE_END; e++) {
            if (e->type == KE_ALT) left = true;
            else if (!left) continue;
            else if (e->type == KE_BYTES) left = false;
            else if (e->type == KE_PERM) { /* any member may come first, the separator after a nullable one */
                const kgr_perm *q = &g->perms[e->val];
                for (int32_t i = 0; i < q->n; i++) adj[na++] = q->member[i];
                adj[na++] = q->sep;
                if (!perm_nullable(g, e->val, nul)) left = false;
            } else {
                adj[na++] = e->val;
                if (!nul[e->val]) left = false;
            }
        }
    }
    off[n] = na;
    /* iterative DFS: mark 1 = on the path, 2 = finished; stk holds (rule, next edge) */
    for (int32_t r0 = 0; r0 < n && !st; r0++) {
        if (mark[r0]) continue;
        int32_t sp = 0;
        stk[sp++] = r0;
        stk[sp++] = off[r0];
        mark[r0] = 1;
        while (sp && !st) {
            int32_t r = stk[sp - 2];
            if (stk[sp - 1] == off[r + 1]) {
                mark[r] = 2;
                sp -= 2;
                continue;
            }
            int32_t next = adj[stk[sp - 1]++];
            if (mark[next] == 1) st = kiln_error(KILN_EINVAL, "grammar: rule '%s' is left-recursive", g->name[next]);
            else if (mark[next] == 0) {
                mark[next] = 1;
                stk[sp++] = next;
                stk[sp++] = off[next];
            }
        }
    }
done:
    free(nul);
    free(mark);
    free(off);
    free(adj);
    free(stk);
    return st;
}

void kgr_grammar_free(kgr_grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_rules; i++) free(g->name[i]);
    free(g->name);
    free(g->start);
    free(g->el);
    free(g->sets);
    free(g->tok_refs);
    free(g->perms);
    free(g);
}

int32_t kgr_grammar_rules(const kgr_grammar *g) { return g->n_rules; }

kiln_status kgr_from_gbnf(const char *text, size_t len, kgr_grammar **out) { return kgr_from_gbnf_vocab(text, len, NULL, out); }

kiln_status kgr_from_gbnf_vocab(const char *text, size_t len, const kgr_vocab *vocab, kgr_grammar **out) {
    *out = NULL;
    parser p = {.s = text, .end = text + len, .line0 = text, .line = 1, .vocab = vocab};
    for (;;) {
        skip_space(&p, true);
        if (p.s >= p.end) break;
        const char *w = p.s;
        while (p.s < p.end && is_word(*p.s)) p.s++;
        if (p.s == w) {
            perr(&p, "expected a rule name");
            break;
        }
        int32_t r = find_rule(&p, w, (size_t)(p.s - w));
        if (r < 0) break;
        skip_space(&p, false);
        if (p.end - p.s < 3 || memcmp(p.s, "::=", 3) != 0) {
            perr(&p, "expected '::=' after '%.*s'", (int)(p.s - w) > 64 ? 64 : (int)(p.s - w), w);
            break;
        }
        p.s += 3;
        if (p.r[r].defined) {
            perr(&p, "rule '%s' is defined twice", p.r[r].name);
            break;
        }
        p.r[r].defined = true;
        if (!parse_alternates(&p, r, false)) break;
        skip_space(&p, false);
        if (p.s < p.end && *p.s != '\n' && *p.s != '\r' && !is_word(*p.s)) {
            perr(&p, "unexpected '%c'", *p.s);
            break;
        }
    }
    int32_t root = -1;
    for (int32_t i = 0; !p.err && i < p.n_rules; i++) {
        if (!p.r[i].defined) perr(&p, "rule '%s' is not defined", p.r[i].name);
        if (!p.r[i].helper && !strcmp(p.r[i].name, "root")) root = i;
    }
    if (!p.err && root < 0) p.err = kiln_error(KILN_EINVAL, "grammar: no 'root' rule");
    kgr_grammar *g = NULL;
    if (!p.err) {
        g = calloc(1, sizeof *g);
        if (g) {
            g->el = malloc(sizeof *g->el * (size_t)(p.n_elems + 1));
            g->start = malloc(sizeof *g->start * (size_t)p.n_rules);
            g->name = calloc((size_t)p.n_rules, sizeof *g->name);
        }
        if (!g || !g->el || !g->start || !g->name) p.err = kiln_error(KILN_ENOMEM, "out of memory");
    }
    if (!p.err) {
        for (int32_t i = 0; i < p.n_rules; i++) {
            g->start[i] = g->n_el;
            memcpy(g->el + g->n_el, p.r[i].v, sizeof *g->el * (size_t)p.r[i].n);
            g->n_el += p.r[i].n;
            g->name[i] = p.r[i].name;
            p.r[i].name = NULL;
        }
        g->n_rules = p.n_rules;
        g->sets = p.sets;
        p.sets = NULL;
        g->n_sets = p.n_sets;
        g->perms = p.perms;
        p.perms = NULL;
        g->n_perms = p.n_perms;
        g->root = root;
        g->tok_refs = p.tok_refs;
        g->n_tok_refs = p.n_tok_refs;
        p.tok_refs = NULL;
        p.err = check_left_recursion(g);
    }
    for (int32_t i = 0; i < p.n_rules; i++) {
        free(p.r[i].v);
        free(p.r[i].name);
    }
    free(p.r);
    free(p.sets);
    free(p.perms);
    free(p.names);
    free(p.tok_refs);
    if (p.err) {
        kgr_grammar_free(g);
        return p.err;
    }
    *out = g;
    return NULL;
}

kiln_status kgr_from_choices(const char *const *v, int32_t n, kgr_grammar **out) {
    *out = NULL;
    if (n <= 0) return kiln_error(KILN_EINVAL, "choices: the list is empty");
    kgr_buf b = {0};
    kgr_buf_puts(&b, "root ::= ");
    for (int32_t i = 0; i < n; i++) {
        if (i) kgr_buf_puts(&b, " | ");
        kgr_buf_literal(&b, v[i], strlen(v[i]));
    }
    kgr_buf_puts(&b, "\n");
    if (b.oom) {
        free(b.p);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    kiln_status st = kgr_from_gbnf(b.p, b.n, out);
    free(b.p);
    return st;
}
