/* tok_decode.c: decoders (HF decoders/ in Rust). Each maps a list of token
 * strings to a list of strings (decode_chain); the result is their
 * concatenation. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")

static bool hexval(char c, int *v) {
    if (c >= '0' && c <= '9') *v = c - '0';
    else if (c >= 'a' && c <= 'f') *v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') *v = c - 'A' + 10;
    else return false;
    return true;
}

/* "<0xAB>" -> byte, as HF's u8::from_str_radix(&token[3..5], 16) (which also
 * takes "+A"). */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int a, b;
    if (s[3] == '+' && hexval(s[4], &b)) return b;
    if (hexval(s[3], &a) && hexval(s[4], &b)) return a * 16 + b;
    return -1;
}

/* WordPiece cleanup, applied to one token */
static bool cleanup(tk_buf *b) {
    static const char *const pat[][2] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    tk_buf t = {0};
    for (size_t k = 0; k < sizeof pat / sizeof pat[0]; k++) {
        size_t pl = strlen(pat[k][0]), rl = strlen(pat[k][1]);
        if (b->n < pl || !memmem(b->p, b->n, pat[k][0], pl)) continue;
        t.n = 0;
        size_t i = 0;
        while (i < b->n) {
            const char *f = memmem(b->p + i, b->n - i, pat[k][0], pl);
            size_t e = f ? (size_t)(f - b->p) : b->n;
            if (!tk_buf_put(&t, b->p + i, e - i)) goto oom;
            if (!f) break;
            if (!tk_buf_put(&t, pat[k][1], rl)) goto oom;
            i = e + pl;
        }
        b->n = 0;
        if (!tk_buf_put(b, t.p, t.n)) goto oom;
    }
    tk_buf_free(&t);
    return true;
oom:
    tk_buf_free(&t);
    return false;
}

static bool replace_all(tk_buf *b, const char *from, size_t fl, const char *to, size_t tl, tk_buf *scratch) {
    if (!fl || b->n < fl || !memmem(b->p, b->n, from, fl)) return true;
    scratch->n = 0;
    size_t i = 0;
    while (i < b->n) {
        const char *f = memmem(b->p + i, b->n - i, from, fl);
        size_t e = f ? (size_t)(f - b->p) : b->n;
        if (!tk_buf_put(scratch, b->p + i, e - i)) return false;
        if (!f) break;
        if (!tk_buf_put(scratch, to, tl)) return false;
        i = e + fl;
    }
    b->n = 0;
    return tk_buf_put(b, scratch->p, scratch->n);
}

typedef struct {
    tk_buf *out;
    const char *s;
    size_t prev;
    const tk_dec *d;
} drepl;

static bool drepl_cb(size_t a, size_t b, void *user) {
    drepl *r = user;
    bool ok = tk_buf_put(r->out, r->s + r->prev, a - r->prev) && tk_buf_put(r->out, r->d->content, r->d->content_len);
    r->prev = b;
    return ok;
}

static kiln_status flush_bytes(tk_buf *bytes, tk_pieces *out) {
    if (!bytes->n) return NULL;
    bool ok;
    if (tk_utf8_valid_prefix(bytes->p, bytes->n) == bytes->n) {
        ok = tk_pieces_add(out, bytes->p, bytes->n, 0);
    } else {
        ok = true;
        for (size_t i = 0; i < bytes->n && ok; i++) ok = tk_pieces_add(out, "\xEF\xBF\xBD", 3, 0);
    }
    bytes->n = 0;
    return ok ? NULL : OOM;
}

/* One decoder: p -> out (cleared). */
static kiln_status dec_one(const tk_dec *d, tk_ctx *c, const tk_pieces *p, tk_pieces *out, bool *unstable) {
    tk_pieces_clear(out);
    tk_buf *b = &c->tmp, *b2 = &c->tmp2;
    uint32_t cp;
    switch (d->type) {
    case TD_SEQ: return kiln_error(KILN_EINTERNAL, "nested decoder sequence");
    case TD_BYTELEVEL: {
        b->n = 0;
        for (size_t i = 0; i < p->n; i++) {
            const char *s = tk_piece_str(p, i);
            size_t n = p->v[i].len, mark = b->n;
            bool all = true;
            for (size_t j = 0; j < n && all;) {
                j += (size_t)tk_utf8_dec(s + j, n - j, &cp);
                int byte = tk_char_byte(cp);
                if (byte < 0) all = false;
                else if (!tk_buf_putc(b, (char)byte)) return OOM;
            }
            if (!all) {
                b->n = mark; /* a char outside the byte map: the token passes as is */
                if (!tk_buf_put(b, s, n)) return OOM;
            }
        }
        if (tk_utf8_incomplete_tail(b->p, b->n)) *unstable = true;
        b2->n = 0;
        if (!tk_utf8_lossy(b2, b->p ? b->p : "", b->n)) return OOM;
        return tk_pieces_add(out, b2->p ? b2->p : "", b2->n, 0) ? NULL : OOM;
    }
    case TD_METASPACE:
        for (size_t i = 0; i < p->n; i++) {
            const char *s = tk_piece_str(p, i);
            size_t n = p->v[i].len, off = out->text.n;
            for (size_t j = 0; j < n;) {
                int k = tk_utf8_dec(s + j, n - j, &cp);
                bool ok = true;
                if (cp == d->repl) {
                    if (!(i == 0 && d->scheme != TM_NEVER)) ok = tk_buf_putc(&out->text, ' ');
                } else {
                    ok = tk_buf_put(&out->text, s + j, (size_t)k);
                }
                if (!ok) return OOM;
                j += (size_t)k;
            }
            if (!tk_pieces_add_ref(out, off, out->text.n - off, 0)) return OOM;
        }
        return NULL;
    case TD_BYTEFALLBACK: {
        b->n = 0;
        for (size_t i = 0; i < p->n; i++) {
            int byte = byte_token(tk_piece_str(p, i), p->v[i].len);
            if (byte >= 0) {
                if (!tk_buf_putc(b, (char)byte)) return OOM;
                if (i + 1 == p->n) *unstable = true; /* the run may go on */
                continue;
            }
            KILN_TRY(flush_bytes(b, out));
            if (!tk_pieces_add(out, tk_piece_str(p, i), p->v[i].len, 0)) return OOM;
        }
        return flush_bytes(b, out);
    }
    case TD_FUSE:
        b->n = 0;
        for (size_t i = 0; i < p->n; i++)
            if (!tk_buf_put(b, tk_piece_str(p, i), p->v[i].len)) return OOM;
        return tk_pieces_add(out, b->p ? b->p : "", b->n, 0) ? NULL : OOM;
    case TD_STRIP:
        for (size_t i = 0; i < p->n; i++) {
            const char *s = tk_piece_str(p, i);
            size_t n = p->v[i].len, a = 0, e = n;
            for (int k = 0; k < d->start && a < n; k++) {
                int l = tk_utf8_dec(s + a, n - a, &cp);
                if (cp != d->repl) break;
                a += (size_t)l;
            }
            for (int k = 0; k < d->stop && e > a; k++) {
                size_t j = e - 1;
                while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
                tk_utf8_dec(s + j, e - j, &cp);
                if (cp != d->repl) break;
                e = j;
            }
            if (!tk_pieces_add(out, s + a, e > a ? e - a : 0, 0)) return OOM;
        }
        return NULL;
    case TD_REPLACE:
        for (size_t i = 0; i < p->n; i++) {
            const char *s = tk_piece_str(p, i);
            size_t n = p->v[i].len;
            b->n = 0;
            drepl r = {b, s, 0, d};
            if (!tk_pattern_find(&d->pat, c->md, s, n, drepl_cb, &r))
                return kiln_error(KILN_EINVAL, "Replace decoder: regex match failed");
            if (!tk_buf_put(b, s + r.prev, n - r.prev) || !tk_pieces_add(out, b->p, b->n, 0)) return OOM;
        }
        return NULL;
    case TD_WORDPIECE:
        for (size_t i = 0; i < p->n; i++) {
            const char *s = tk_piece_str(p, i);
            size_t n = p->v[i].len;
            b->n = 0;
            bool ok = true;
            if (i != 0) {
                if (n >= d->content_len && memcmp(s, d->content, d->content_len) == 0) {
                    ok = tk_buf_put(b, s + d->content_len, n - d->content_len);
                } else {
                    /* replacen(prefix, "", 1) removes the first occurrence anywhere */
                    ok = tk_buf_putc(b, ' ') && tk_buf_put(b, s, n);
                }
            } else {
                ok = tk_buf_put(b, s, n);
            }
            if (ok && d->cleanup) ok = cleanup(b);
            if (!ok || !tk_pieces_add(out, b->p ? b->p : "", b->n, 0)) return OOM;
        }
        return NULL;
    case TD_BPE:
        for (size_t i = 0; i < p->n; i++) {
            b->n = 0;
            bool last = i + 1 == p->n;
            if (!tk_buf_put(b, tk_piece_str(p, i), p->v[i].len) ||
                !replace_all(b, d->content, d->content_len, last ? "" : " ", last ? 0 : 1, b2) ||
                !tk_pieces_add(out, b->p ? b->p : "", b->n, 0))
                return OOM;
        }
        return NULL;
    case TD_CTC:
        for (size_t i = 0; i < p->n; i++) {
            const char *s = tk_piece_str(p, i);
            size_t n = p->v[i].len;
            if (i > 0 && p->v[i - 1].len == n && memcmp(tk_piece_str(p, i - 1), s, n) == 0) continue; /* dedup */
            b->n = 0;
            if (!tk_buf_put(b, s, n) || !replace_all(b, d->content, d->content_len, "", 0, b2)) return OOM;
            if (d->cleanup) {
                size_t wl = strlen(d->word_delim);
                if (!cleanup(b) || !replace_all(b, d->word_delim, wl, " ", 1, b2)) return OOM;
            }
            if (b->n && !tk_pieces_add(out, b->p, b->n, 0)) return OOM;
        }
        return NULL;
    }
    return kiln_error(KILN_EINTERNAL, "decoder: bad type");
}

static kiln_status dec_chain(const tk_dec *d, tk_ctx *c, tk_pieces *p, tk_pieces *tmp, bool *unstable) {
    if (d->type == TD_SEQ) {
        for (int i = 0; i < d->n_subs; i++) KILN_TRY(dec_chain(&d->subs[i], c, p, tmp, unstable));
        return NULL;
    }
    KILN_TRY(dec_one(d, c, p, tmp, unstable));
    tk_pieces sw = *p;
    *p = *tmp;
    *tmp = sw;
    return NULL;
}

kiln_status tk_decode_tokens(const tk_dec *d, tk_ctx *c, tk_pieces *p, tk_pieces *tmp, tk_buf *out, bool *unstable) {
    *unstable = false;
    out->n = 0;
    if (!tk_buf_reserve(out, 16)) return OOM;
    out->p[0] = 0;
    if (!d) { /* no decoder: tokens joined by spaces */
        for (size_t i = 0; i < p->n; i++)
            if ((i && !tk_buf_putc(out, ' ')) || !tk_buf_put(out, tk_piece_str(p, i), p->v[i].len)) return OOM;
        return NULL;
    }
    KILN_TRY(dec_chain(d, c, p, tmp, unstable));
    for (size_t i = 0; i < p->n; i++)
        if (!tk_buf_put(out, tk_piece_str(p, i), p->v[i].len)) return OOM;
    return NULL;
}

void tk_dec_free(tk_dec *d) {
    if (!d) return;
    for (int i = 0; i < d->n_subs; i++) tk_dec_free(&d->subs[i]);
    free(d->subs);
    tk_pattern_free(&d->pat);
    free(d->content);
    free(d->word_delim);
}
