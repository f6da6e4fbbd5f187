/* jinja_lex.c: preprocessing and tokenizing, a port of @huggingface/jinja's
 * lexer.ts with its quirks (e.g. a tag ending the input is an error, `-`
 * after an operator starts a signed number). Every preprocessed byte keeps
 * its offset in the original text so errors point at the user's source. */
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

/* Text plus, per byte, its offset in the original template. */
typedef struct {
    char *s;
    uint32_t *pos;
    size_t n, cap;
    bool oom;
} pbuf;

static void pb_put(pbuf *b, char c, uint32_t pos) {
    if (b->oom) return;
    if (b->n + 1 >= b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        char *s = realloc(b->s, cap);
        if (s) b->s = s;
        uint32_t *p = s ? realloc(b->pos, cap * sizeof *p) : NULL;
        if (!s || !p) {
            b->oom = true;
            return;
        }
        b->pos = p;
        b->cap = cap;
    }
    b->s[b->n] = c;
    b->pos[b->n++] = pos;
    b->s[b->n] = 0;
}

static void pb_free(pbuf *b) {
    free(b->s);
    free(b->pos);
}

/* Byte length of the JavaScript whitespace character at s[i], or 0. */
static int space_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    uint32_t cp;
    int k = kj_utf8_dec(s, n, i, &cp);
    return kj_js_space(cp) ? k : 0;
}

/* Byte length of the JavaScript whitespace character ending at s[end), or 0. */
static int space_before(const char *s, size_t end) {
    for (int k = 1; k <= 3 && (size_t)k <= end; k++) {
        size_t i = end - (size_t)k;
        if (k > 1 && ((unsigned char)s[i] & 0xC0) == 0x80) continue;
        if (k > 1 && (unsigned char)s[i] < 0x80) return 0;
        uint32_t cp;
        int len = kj_utf8_dec(s, end, i, &cp);
        return len == k && kj_js_space(cp) ? k : 0;
    }
    return 0;
}

static bool line_break_before(const pbuf *b, size_t i) {
    if (i == 0) return true;
    char c = b->s[i - 1];
    if (c == '\n' || c == '\r') return true;
    /* U+2028 / U+2029 end lines for a JavaScript /m regex too */
    return i >= 3 && (unsigned char)b->s[i - 3] == 0xE2 && (unsigned char)b->s[i - 2] == 0x80 &&
           ((unsigned char)c == 0xA8 || (unsigned char)c == 0xA9);
}

/* template.replace(/^[ \t]*({[#%-])/gm, "$1") */
static void lstrip_blocks(const pbuf *in, pbuf *out) {
    for (size_t i = 0; i < in->n;) {
        if (line_break_before(in, i)) {
            size_t j = i;
            while (j < in->n && (in->s[j] == ' ' || in->s[j] == '\t')) j++;
            if (j + 1 < in->n && in->s[j] == '{' && strchr("#%-", in->s[j + 1]) && in->s[j + 1]) {
                pb_put(out, in->s[j], in->pos[j]);
                pb_put(out, in->s[j + 1], in->pos[j + 1]);
                i = j + 2;
                continue;
            }
        }
        pb_put(out, in->s[i], in->pos[i]);
        i++;
    }
}

/* template.replace(/([#%-]})\n/g, "$1") */
static void trim_blocks(const pbuf *in, pbuf *out) {
    for (size_t i = 0; i < in->n;) {
        if (i + 2 < in->n && in->s[i] && strchr("#%-", in->s[i]) && in->s[i + 1] == '}' &&
            in->s[i + 2] == '\n') {
            pb_put(out, in->s[i], in->pos[i]);
            pb_put(out, '}', in->pos[i + 1]);
            i += 3;
            continue;
        }
        pb_put(out, in->s[i], in->pos[i]);
        i++;
    }
}

static size_t skip_spaces(const char *s, size_t n, size_t i) {
    int k;
    while ((k = space_at(s, n, i)) > 0) i += (size_t)k;
    return i;
}

/* Length of a {% generation %} / {% endgeneration %} tag at s[i], or 0;
 * *lstrip / *rstrip say whether it carries `-` marks. */
static size_t generation_tag(const char *s, size_t n, size_t i, bool *lstrip, bool *rstrip) {
    if (i + 1 >= n || s[i] != '{' || s[i + 1] != '%') return 0;
    size_t j = i + 2;
    *lstrip = j < n && s[j] == '-';
    if (*lstrip) j++;
    j = skip_spaces(s, n, j);
    if (j + 3 <= n && memcmp(s + j, "end", 3) == 0 &&
        !(j + 10 <= n && memcmp(s + j, "generation", 10) == 0))
        j += 3;
    if (!(j + 10 <= n && memcmp(s + j, "generation", 10) == 0)) return 0;
    j = skip_spaces(s, n, j + 10);
    *rstrip = j < n && s[j] == '-';
    if (*rstrip) j++;
    if (!(j + 1 < n && s[j] == '%' && s[j + 1] == '}')) return 0;
    return j + 2 - i;
}

/* /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs: transformers' marker
 * for assistant masks; it renders nothing. */
static void strip_generation(const pbuf *in, pbuf *out) {
    size_t floor = 0; /* the previous match ends here in out */
    for (size_t i = 0; i < in->n;) {
        bool ls, rs;
        size_t tag = generation_tag(in->s, in->n, i, &ls, &rs);
        if (!tag) {
            pb_put(out, in->s[i], in->pos[i]);
            i++;
            continue;
        }
        if (ls) {
            int k;
            while (out->n > floor && (k = space_before(out->s, out->n)) > 0 &&
                   out->n - (size_t)k >= floor)
                out->n -= (size_t)k;
        }
        i += tag;
        size_t j = skip_spaces(in->s, in->n, i);
        if (!rs)
            for (; i < j; i++) pb_put(out, in->s[i], in->pos[i]);
        i = j;
        floor = out->n;
    }
}

/* ---- tokenizer -------------------------------------------------------- */

typedef struct {
    ku_arena *a;
    const char *s;
    const uint32_t *pos;
    size_t n, i;
    kj_tok *t;
    size_t nt, cap;
    kj_buf str;
    const uint32_t *lines;
    size_t nlines;
    kiln_status err;
} lexer;

static kiln_status lex_err(lexer *L, size_t at, const char *msg, const char *arg) {
    int line, col;
    uint32_t p = at < L->n ? L->pos[at] : (L->n ? L->pos[L->n - 1] + 1 : 0);
    kj_linecol(L->lines, L->nlines, p, &line, &col);
    return kiln_error(KILN_EINVAL, "line %d, column %d: %s%s", line, col, msg, arg ? arg : "");
}

static bool push(lexer *L, kj_tok_type type, const char *p, size_t len, size_t at) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        kj_tok *t = realloc(L->t, cap * sizeof *t);
        if (!t) return false;
        L->t = t;
        L->cap = cap;
    }
    char *copy = ku_arena_alloc(L->a, len + 1);
    if (!copy) return false;
    memcpy(copy, p, len);
    uint32_t pos = at < L->n ? L->pos[at] : (L->n ? L->pos[L->n - 1] + 1 : 0);
    L->t[L->nt++] = (kj_tok){type, {len, copy}, pos};
    return true;
}

static kj_tok *last(lexer *L) { return L->nt ? &L->t[L->nt - 1] : NULL; }

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

enum { C_SPACE, C_DIGIT, C_WORD, C_STRING };

/* consumeWhile(): appends the consumed characters (unescaped in strings) to
 * L->str. As in the original, consuming the last character of the input
 * is an error: no token may end the template. */
static bool consume(lexer *L, int mode, char quote) {
    L->str.n = 0;
    uint32_t hi = 0; /* a pending \uD800-\uDBFF escape */
    for (;;) {
        size_t i = L->i;
        bool ok;
        int step = 1;
        if (i >= L->n) ok = mode == C_STRING || mode == C_WORD; /* pred(undefined) */
        else if (mode == C_SPACE) ok = (step = space_at(L->s, L->n, i)) > 0;
        else if (mode == C_DIGIT) ok = is_digit(L->s[i]);
        else if (mode == C_WORD) ok = is_word(L->s[i]);
        else ok = L->s[i] != quote;
        if (!ok) break;
        if (i >= L->n) {
            L->err = lex_err(L, i, "unexpected end of input", NULL);
            return false;
        }
        if (mode == C_STRING && L->s[i] == '\\') {
            if (++L->i >= L->n) {
                L->err = lex_err(L, L->i, "unexpected end of input", NULL);
                return false;
            }
            char e = L->s[L->i++];
            uint32_t cp;
            if (e == 'x' || e == 'u') {
                int len = e == 'x' ? 2 : 4;
                cp = 0;
                for (int k = 0; k < len; k++) {
                    int h = L->i + (size_t)k < L->n ? hexval(L->s[L->i + (size_t)k]) : -1;
                    if (h < 0) {
                        L->err = lex_err(L, i, "invalid hexadecimal escape sequence", NULL);
                        return false;
                    }
                    cp = cp * 16 + (uint32_t)h;
                }
                L->i += (size_t)len;
            } else {
                static const char from[] = "ntrbfv'\"\\", to[] = "\n\t\r\b\f\v'\"\\";
                const char *f = strchr(from, e);
                if (!e || !f) {
                    char s[2] = {e, 0};
                    L->err = lex_err(L, i, "unexpected escaped character: ", s);
                    return false;
                }
                cp = (unsigned char)to[f - from];
            }
            if (hi && cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0x10000 + ((hi - 0xD800) << 10) + (cp - 0xDC00);
                hi = 0;
            } else if (hi) {
                kj_buf_put(&L->str, "\xEF\xBF\xBD", 3);
                hi = 0;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                hi = cp;
                continue;
            }
            char u[4];
            kj_buf_put(&L->str, u, (size_t)kj_utf8_enc(cp, u));
            continue;
        }
        if (hi) {
            kj_buf_put(&L->str, "\xEF\xBF\xBD", 3);
            hi = 0;
        }
        kj_buf_put(&L->str, L->s + i, (size_t)step);
        L->i += (size_t)step;
        if (L->i >= L->n) {
            L->err = lex_err(L, L->i, "unexpected end of input", NULL);
            return false;
        }
    }
    if (hi) kj_buf_put(&L->str, "\xEF\xBF\xBD", 3);
    if (L->str.oom) {
        L->err = kiln_error(KILN_ENOMEM, "out of memory");
        return false;
    }
    return true;
}

static void strip_trailing(lexer *L) {
    kj_tok *t = last(L);
    if (!t || t->type != KT_TEXT) return;
    int k;
    while (t->val.len && (k = space_before(t->val.p, t->val.len)) > 0) t->val.len -= (size_t)k;
    ((char *)t->val.p)[t->val.len] = 0;
    if (!t->val.len) L->nt--;
}

static const struct {
    const char *seq;
    kj_tok_type type;
} table[] = {
    {"{%", KT_OPEN_STMT}, {"%}", KT_CLOSE_STMT}, {"{{", KT_OPEN_EXPR}, {"}}", KT_CLOSE_EXPR},
    {"(", KT_LPAREN},     {")", KT_RPAREN},      {"{", KT_LBRACE},     {"}", KT_RBRACE},
    {"[", KT_LBRACKET},   {"]", KT_RBRACKET},    {",", KT_COMMA},      {".", KT_DOT},
    {":", KT_COLON},      {"|", KT_PIPE},        {"<=", KT_CMP},       {">=", KT_CMP},
    {"==", KT_CMP},       {"!=", KT_CMP},        {"<", KT_CMP},        {">", KT_CMP},
    {"+", KT_ADD},        {"-", KT_ADD},         {"~", KT_ADD},        {"**", KT_POW},
    {"*", KT_MUL},        {"//", KT_MUL},        {"/", KT_MUL},        {"%", KT_MUL},
    {"=", KT_EQUALS},
};

static bool at(lexer *L, const char *seq) {
    size_t k = strlen(seq);
    return L->i + k <= L->n && memcmp(L->s + L->i, seq, k) == 0;
}

#define PUSH(type, p, len, at)                                                 \
    do {                                                                       \
        if (!push(L, type, p, len, at)) goto oom;                              \
    } while (0)

static kiln_status tokenize(lexer *L) {
    int depth = 0; /* curly brackets open inside {{ }} */
    while (L->i < L->n) {
        kj_tok *lt = last(L);
        if (!lt || lt->type == KT_CLOSE_STMT || lt->type == KT_CLOSE_EXPR || lt->type == KT_COMMENT) {
            size_t j = L->i;
            while (j < L->n && !(L->s[j] == '{' && j + 1 < L->n &&
                                 (L->s[j + 1] == '%' || L->s[j + 1] == '{' || L->s[j + 1] == '#')))
                j++;
            if (j > L->i) {
                PUSH(KT_TEXT, L->s + L->i, j - L->i, L->i);
                L->i = j;
                continue;
            }
        }
        size_t start = L->i;
        if (at(L, "{#")) {
            L->i += 2;
            bool strip_before = L->i < L->n && L->s[L->i] == '-';
            if (strip_before) L->i++;
            size_t c0 = L->i;
            while (!(L->i + 1 < L->n && L->s[L->i] == '#' && L->s[L->i + 1] == '}')) {
                if (L->i + 2 >= L->n) return lex_err(L, start, "missing end of comment tag", NULL);
                L->i++;
            }
            size_t clen = L->i - c0;
            bool strip_after = clen && L->s[c0 + clen - 1] == '-';
            if (strip_after) clen--;
            if (strip_before) strip_trailing(L);
            PUSH(KT_COMMENT, L->s + c0, clen, start);
            L->i += 2;
            if (strip_after) L->i = skip_spaces(L->s, L->n, L->i);
            continue;
        }
        if (at(L, "{%-")) {
            strip_trailing(L);
            PUSH(KT_OPEN_STMT, "{%", 2, start);
            L->i += 3;
            continue;
        }
        if (at(L, "{{-")) {
            strip_trailing(L);
            PUSH(KT_OPEN_EXPR, "{{", 2, start);
            depth = 0;
            L->i += 3;
            continue;
        }
        if (!consume(L, C_SPACE, 0)) return L->err;
        start = L->i;
        if (at(L, "-%}")) {
            PUSH(KT_CLOSE_STMT, "%}", 2, start);
            L->i = skip_spaces(L->s, L->n, L->i + 3);
            continue;
        }
        if (at(L, "-}}")) {
            PUSH(KT_CLOSE_EXPR, "}}", 2, start);
            L->i = skip_spaces(L->s, L->n, L->i + 3);
            continue;
        }
        char ch = L->i < L->n ? L->s[L->i] : 0;
        if (ch == '-' || ch == '+') {
            lt = last(L);
            if (!lt || lt->type == KT_TEXT) return lex_err(L, start, "unexpected character: ", ch == '-' ? "-" : "+");
            kj_tok_type lty = lt->type;
            if (lty != KT_IDENT && lty != KT_NUM && lty != KT_STR && lty != KT_RPAREN && lty != KT_RBRACKET) {
                L->i++;
                if (!consume(L, C_DIGIT, 0)) return L->err;
                kj_buf num = {0};
                kj_buf_putc(&num, ch);
                kj_buf_put(&num, L->str.p, L->str.n);
                size_t ndig = L->str.n;
                if (ndig > 0 && L->i + 1 < L->n && L->s[L->i] == '.' && is_digit(L->s[L->i + 1])) {
                    L->i++;
                    if (!consume(L, C_DIGIT, 0)) {
                        free(num.p);
                        return L->err;
                    }
                    kj_buf_putc(&num, '.');
                    kj_buf_put(&num, L->str.p, L->str.n);
                }
                bool ok = !num.oom && push(L, ndig ? KT_NUM : KT_UNARY, num.p, num.n, start);
                free(num.p);
                if (!ok) goto oom;
                continue;
            }
        }
        bool matched = false;
        for (size_t k = 0; k < sizeof table / sizeof table[0]; k++) {
            if (table[k].type == KT_CLOSE_EXPR && depth > 0) continue;
            if (!at(L, table[k].seq)) continue;
            size_t len = strlen(table[k].seq);
            PUSH(table[k].type, table[k].seq, len, start);
            if (table[k].type == KT_OPEN_EXPR) depth = 0;
            else if (table[k].type == KT_LBRACE) depth++;
            else if (table[k].type == KT_RBRACE) depth--;
            L->i += len;
            matched = true;
            break;
        }
        if (matched) continue;
        if (ch == '\'' || ch == '"') {
            L->i++;
            if (!consume(L, C_STRING, ch)) return L->err;
            PUSH(KT_STR, L->str.p ? L->str.p : "", L->str.n, start);
            L->i++;
            continue;
        }
        if (is_digit(ch)) {
            if (!consume(L, C_DIGIT, 0)) return L->err;
            kj_buf num = {0};
            kj_buf_put(&num, L->str.p, L->str.n);
            lt = last(L);
            if ((!lt || lt->type != KT_DOT) && L->i + 1 < L->n && L->s[L->i] == '.' &&
                is_digit(L->s[L->i + 1])) {
                L->i++;
                if (!consume(L, C_DIGIT, 0)) {
                    free(num.p);
                    return L->err;
                }
                kj_buf_putc(&num, '.');
                kj_buf_put(&num, L->str.p, L->str.n);
            }
            bool ok = !num.oom && push(L, KT_NUM, num.p, num.n, start);
            free(num.p);
            if (!ok) goto oom;
            continue;
        }
        if (L->i >= L->n || is_word(ch)) {
            if (!consume(L, C_WORD, 0)) return L->err;
            PUSH(KT_IDENT, L->str.p, L->str.n, start);
            continue;
        }
        uint32_t cp;
        char u[5] = {0};
        kj_utf8_dec(L->s, L->n, L->i, &cp);
        kj_utf8_enc(cp, u);
        return lex_err(L, start, "unexpected character: ", u);
    }
    return NULL;
oom:
    return kiln_error(KILN_ENOMEM, "out of memory");
}

void kj_linecol(const uint32_t *lines, size_t nlines, uint32_t pos, int *line, int *col) {
    size_t lo = 0, hi = nlines;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (lines[mid] <= pos) lo = mid;
        else hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)(pos - (nlines ? lines[lo] : 0)) + 1;
}

kiln_status kj_lex(ku_arena *a, const char *src, size_t len, kj_toks *out) {
    memset(out, 0, sizeof *out);
    if (len > UINT32_MAX / 2) return kiln_error(KILN_ELIMIT, "template of %zu bytes is too large", len);
    size_t nl = 1;
    for (size_t i = 0; i < len; i++) nl += src[i] == '\n';
    uint32_t *lines = ku_arena_alloc(a, nl * sizeof *lines);
    if (!lines) return kiln_error(KILN_ENOMEM, "out of memory");
    nl = 1;
    for (size_t i = 0; i < len; i++)
        if (src[i] == '\n') lines[nl++] = (uint32_t)i + 1;

    pbuf p0 = {0}, p1 = {0}, p2 = {0}, p3 = {0};
    size_t n = len && src[len - 1] == '\n' ? len - 1 : len;
    for (size_t i = 0; i < n; i++) pb_put(&p0, src[i], (uint32_t)i);
    lstrip_blocks(&p0, &p1);
    trim_blocks(&p1, &p2);
    strip_generation(&p2, &p3);
    kiln_status st = NULL;
    if (p0.oom || p1.oom || p2.oom || p3.oom) st = kiln_error(KILN_ENOMEM, "out of memory");
    lexer L = {.a = a, .s = p3.s ? p3.s : "", .pos = p3.pos, .n = p3.n, .lines = lines, .nlines = nl};
    if (!st) st = tokenize(&L);
    pb_free(&p0);
    pb_free(&p1);
    pb_free(&p2);
    free(L.str.p);
    if (!st) {
        out->v = L.nt ? ku_arena_memdup(a, L.t, L.nt * sizeof *L.t) : ku_arena_alloc(a, sizeof *L.t);
        if (!out->v) st = kiln_error(KILN_ENOMEM, "out of memory");
        out->n = L.nt;
        out->lines = lines;
        out->nlines = nl;
    }
    pb_free(&p3);
    free(L.t);
    return st;
}
