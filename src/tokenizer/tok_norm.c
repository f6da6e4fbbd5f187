/* tok_norm.c: normalizers (HF normalizers/), on plain strings.
 *
 * Each step maps a string to a string. Offsets are not tracked; only the
 * TK_AT0 fact ("the output still starts at original byte 0") is kept, because
 * Metaspace's prepend_scheme "first" depends on it. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

static kiln_status unicode_form(const char *s, size_t n, int opts, tk_buf *out) {
    if (all_ascii(s, n)) return tk_buf_put(out, s, n) ? NULL : OOM;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)(UTF8PROC_STABLE | opts));
    if (r < 0) {
        free(dst);
        return r == UTF8PROC_ERROR_NOMEM ? OOM : kiln_error(KILN_EINVAL, "normalizer: %s", utf8proc_errmsg(r));
    }
    bool ok = tk_buf_put(out, dst, (size_t)r);
    free(dst);
    return ok ? NULL : OOM;
}

static bool lower_cp(tk_buf *out, uint32_t cp) {
    if (cp < 0x80) return tk_buf_putc(out, (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    if (cp == 0x130) return tk_buf_put(out, "i\xCC\x87", 3); /* the one multi-char lowercase */
    return tk_buf_put_cp(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
}

static bool is_mark(uint32_t cp, bool nonspacing_only) {
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    if (nonspacing_only) return c == UTF8PROC_CATEGORY_MN;
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}

static bool is_chinese(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) ||
           (cp >= 0x2B920 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

static bool bert_is_control(uint32_t cp) {
    if (cp == '\t' || cp == '\n' || cp == '\r') return false;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CN ||
           c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CS;
}

/* ---- Precompiled (SentencePiece charsmap, as the spm_precompiled crate) ---- */

static inline uint32_t da_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

/* First (shortest) match of a prefix of key, as spm_precompiled's transform:
 * returns its replacement in *rep, or false. */
static bool pc_transform(const tk_norm *nm, const char *key, size_t n, const char **rep, size_t *rep_len) {
    const uint32_t *a = nm->trie;
    size_t sz = nm->trie_n;
    if (!sz) return false;
    size_t pos = da_offset(a[0]);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c == 0) return false;
        pos ^= c;
        if (pos >= sz) return false;
        uint32_t u = a[pos];
        if ((u & (0x80000000u | 0xFF)) != c) return false;
        pos ^= da_offset(u);
        if ((u >> 8) & 1) {
            if (pos >= sz) return false;
            size_t idx = a[pos] & 0x7FFFFFFFu;
            if (idx > nm->norm_len) return false;
            const char *e = memchr(nm->norm_blob + idx, 0, nm->norm_len - idx);
            size_t len = e ? (size_t)(e - (nm->norm_blob + idx)) : nm->norm_len - idx;
            /* the crate would panic on a slice off a char boundary; take it as no match */
            if (tk_utf8_valid_prefix(nm->norm_blob + idx, len) != len) return false;
            *rep = nm->norm_blob + idx;
            *rep_len = len;
            return true;
        }
    }
    return false;
}

static kiln_status pc_grapheme(const tk_norm *nm, const char *g, size_t n, tk_buf *out) {
    const char *rep;
    size_t rl;
    if (n < 6 && pc_transform(nm, g, n, &rep, &rl)) return tk_buf_put(out, rep, rl) ? NULL : OOM;
    for (size_t i = 0; i < n;) {
        size_t k = (size_t)tk_utf8_len((unsigned char)g[i]);
        bool ok = pc_transform(nm, g + i, k, &rep, &rl) ? tk_buf_put(out, rep, rl) : tk_buf_put(out, g + i, k);
        if (!ok) return OOM;
        i += k;
    }
    return NULL;
}

/* Graphemes (UAX #29, as unicode-segmentation) of under 6 bytes are looked up
 * whole, longer ones char by char: HF's Precompiled normalizer. */
static kiln_status precompiled(const tk_norm *nm, const char *s, size_t n, tk_buf *out) {
    utf8proc_int32_t state = 0, prev = -1;
    size_t g0 = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tk_utf8_dec(s + i, n - i, &cp);
        if (prev >= 0 && utf8proc_grapheme_break_stateful(prev, (utf8proc_int32_t)cp, &state)) {
            KILN_TRY(pc_grapheme(nm, s + g0, i - g0, out));
            g0 = i;
        }
        prev = (utf8proc_int32_t)cp;
        i += (size_t)k;
    }
    if (g0 < n) KILN_TRY(pc_grapheme(nm, s + g0, n - g0, out));
    return NULL;
}

/* ---- one normalizer ------------------------------------------------------- */

typedef struct {
    tk_buf *out;
    const char *s;
    size_t prev;
    const tk_norm *nm;
    bool first_removed;
} repl_state;

static bool repl_cb(size_t a, size_t b, void *user) {
    repl_state *r = user;
    if (a == 0 && b > 0) {
        /* HF aligns the replacement to the last removed char: it still starts
         * at 0 only when exactly one char was replaced by a non-empty content */
        size_t first = (size_t)tk_utf8_len((unsigned char)r->s[0]);
        r->first_removed = r->nm->content_len == 0 || b != first;
    }
    return tk_buf_put(r->out, r->s + r->prev, a - r->prev) && tk_buf_put(r->out, r->nm->content, r->nm->content_len) &&
           ((r->prev = b), true);
}

static kiln_status norm_one(const tk_norm *nm, tk_ctx *c, const char *s, size_t n, tk_buf *out, bool *at0) {
    out->n = 0;
    if (!tk_buf_reserve(out, n + 8)) return OOM;
    out->p[0] = 0;
    uint32_t cp;
    switch (nm->type) {
    case TN_SEQ: {
        tk_buf a = {0}, b = {0};
        if (!tk_buf_put(&a, s, n)) return OOM;
        for (int i = 0; i < nm->n_subs; i++) {
            kiln_status st = norm_one(&nm->subs[i], c, a.p, a.n, &b, at0);
            if (st) {
                tk_buf_free(&a);
                tk_buf_free(&b);
                return st;
            }
            tk_buf t = a;
            a = b;
            b = t;
        }
        bool ok = tk_buf_put(out, a.p, a.n);
        tk_buf_free(&a);
        tk_buf_free(&b);
        return ok ? NULL : OOM;
    }
    case TN_NFC: return unicode_form(s, n, UTF8PROC_COMPOSE, out);
    case TN_NFD: return unicode_form(s, n, UTF8PROC_DECOMPOSE, out);
    case TN_NFKC: return unicode_form(s, n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case TN_NFKD: return unicode_form(s, n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case TN_LOWER:
        for (size_t i = 0; i < n;) {
            i += (size_t)tk_utf8_dec(s + i, n - i, &cp);
            if (!lower_cp(out, cp)) return OOM;
        }
        return NULL;
    case TN_STRIP: {
        size_t a = 0, b = n;
        if (nm->left)
            while (a < b) {
                int k = tk_utf8_dec(s + a, b - a, &cp);
                if (!tk_is_whitespace(cp)) break;
                a += (size_t)k;
            }
        if (nm->right)
            while (b > a) {
                size_t k = b - 1;
                while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                tk_utf8_dec(s + k, b - k, &cp);
                if (!tk_is_whitespace(cp)) break;
                b = k;
            }
        if (a > 0 && b > a) *at0 = false;
        return tk_buf_put(out, s + a, b - a) ? NULL : OOM;
    }
    case TN_STRIP_ACCENTS:
        for (size_t i = 0; i < n;) {
            int k = tk_utf8_dec(s + i, n - i, &cp);
            if (is_mark(cp, false)) {
                if (i == 0) *at0 = false;
            } else if (!tk_buf_put(out, s + i, (size_t)k)) {
                return OOM;
            }
            i += (size_t)k;
        }
        return NULL;
    case TN_REPLACE: {
        repl_state r = {out, s, 0, nm, false};
        if (!tk_pattern_find(&nm->pat, c->md, s, n, repl_cb, &r))
            return kiln_error(KILN_EINVAL, "Replace normalizer: regex match failed");
        if (!tk_buf_put(out, s + r.prev, n - r.prev)) return OOM;
        if (r.first_removed && out->n) *at0 = false;
        return NULL;
    }
    case TN_PREPEND:
        if (n == 0) return NULL;
        return tk_buf_put(out, nm->content, nm->content_len) && tk_buf_put(out, s, n) ? NULL : OOM;
    case TN_PRECOMPILED: return precompiled(nm, s, n, out);
    case TN_NMT:
        for (size_t i = 0; i < n;) {
            int k = tk_utf8_dec(s + i, n - i, &cp);
            i += (size_t)k;
            if ((cp >= 1 && cp <= 8) || cp == 0x0B || (cp >= 0x0E && cp <= 0x1F) || cp == 0x7F || cp == 0x8F ||
                cp == 0x9F) {
                if (i == (size_t)k) *at0 = false;
                continue;
            }
            if (cp == 9 || cp == 0x0A || cp == 0x0C || cp == 0x0D || cp == 0x1680 || (cp >= 0x200B && cp <= 0x200F) ||
                cp == 0x2028 || cp == 0x2029 || cp == 0x2581 || cp == 0xFEFF || cp == 0xFFFD)
                cp = ' ';
            if (!tk_buf_put_cp(out, cp)) return OOM;
        }
        return NULL;
    case TN_BYTELEVEL: {
        uint16_t tab[256];
        tk_byte_tables(tab);
        for (size_t i = 0; i < n; i++)
            if (!tk_buf_put_cp(out, tab[(unsigned char)s[i]])) return OOM;
        return NULL;
    }
    case TN_BERT: {
        tk_buf a = {0}, b = {0};
        kiln_status st = NULL;
        bool ok = true;
        for (size_t i = 0; i < n && ok;) { /* clean_text + chinese chars */
            int k = tk_utf8_dec(s + i, n - i, &cp);
            bool first = i == 0;
            i += (size_t)k;
            if (nm->clean_text) {
                if (cp == 0 || cp == 0xFFFD || bert_is_control(cp)) {
                    if (first) *at0 = false;
                    continue;
                }
                if (cp == '\t' || cp == '\n' || cp == '\r' || tk_is_whitespace(cp)) cp = ' ';
            }
            if (nm->chinese_chars && is_chinese(cp)) ok = tk_buf_putc(&a, ' ') && tk_buf_put_cp(&a, cp) && tk_buf_putc(&a, ' ');
            else ok = tk_buf_put_cp(&a, cp);
        }
        if (ok && nm->strip_accents) {
            b.n = 0;
            st = unicode_form(a.p ? a.p : "", a.n, UTF8PROC_DECOMPOSE, &b);
            if (!st) {
                a.n = 0;
                for (size_t i = 0; i < b.n && ok;) {
                    int k = tk_utf8_dec(b.p + i, b.n - i, &cp);
                    if (!is_mark(cp, true)) ok = tk_buf_put(&a, b.p + i, (size_t)k);
                    else if (i == 0) *at0 = false;
                    i += (size_t)k;
                }
            }
        }
        if (ok && !st) {
            if (nm->lowercase) {
                for (size_t i = 0; i < a.n && ok;) {
                    i += (size_t)tk_utf8_dec(a.p + i, a.n - i, &cp);
                    ok = lower_cp(out, cp);
                }
            } else {
                ok = tk_buf_put(out, a.p, a.n);
            }
        }
        tk_buf_free(&a);
        tk_buf_free(&b);
        if (st) return st;
        return ok ? NULL : OOM;
    }
    }
    return kiln_error(KILN_EINTERNAL, "normalizer: bad type");
}

kiln_status tk_normalize(const tk_norm *nm, tk_ctx *c, const char *s, size_t n, tk_buf *out, bool *at0) {
    return norm_one(nm, c, s, n, out, at0);
}

void tk_norm_free(tk_norm *nm) {
    if (!nm) return;
    for (int i = 0; i < nm->n_subs; i++) tk_norm_free(&nm->subs[i]);
    free(nm->subs);
    tk_pattern_free(&nm->pat);
    free(nm->content);
    free(nm->trie);
    free(nm->norm_blob);
}
