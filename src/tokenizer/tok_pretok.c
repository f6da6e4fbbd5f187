/* tok_pretok.c: pre-tokenizers (HF pre_tokenizers/).
 *
 * A pre-tokenizer maps each piece to sub-pieces; empty pieces are dropped, as
 * PreTokenizedString::split does. Splitting follows NormalizedString::split:
 * the pattern yields (range, is_match) segments covering the piece, and the
 * delimiter behavior decides what becomes a piece. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")

typedef bool (*char_pred)(uint32_t cp, uint32_t arg);

static bool segs_push(tk_segs *o, size_t a, size_t b, bool m) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 32;
        tk_seg *v = realloc(o->v, cap * sizeof *v);
        if (!v) return false;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (tk_seg){(uint32_t)a, (uint32_t)b, m};
    return true;
}

/* Pattern::find_matches for a char predicate: each matching char is a match. */
static bool pred_segments(const char *s, size_t n, char_pred pred, uint32_t arg, tk_segs *out) {
    out->n = 0;
    if (n == 0) return segs_push(out, 0, 0, false);
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = (size_t)tk_utf8_dec(s + i, n - i, &cp);
        if (pred(cp, arg)) {
            if (last < i && !segs_push(out, last, i, false)) return false;
            if (!segs_push(out, i, i + k, true)) return false;
            last = i + k;
        }
        i += k;
    }
    if (last < n && !segs_push(out, last, n, false)) return false;
    return true;
}

/* Applies a delimiter behavior to segs of s and appends the non-empty pieces. */
static bool split_emit(const tk_segs *segs, tb_behavior bh, const char *s, uint32_t flags, tk_pieces *out) {
    size_t n = segs->n;
    tk_seg *v = segs->v;
#define EMIT(a, b)                                                                                    \
    do {                                                                                              \
        size_t a_ = (a), b_ = (b);                                                                    \
        if (b_ > a_ && !tk_pieces_add(out, s + a_, b_ - a_, (a_ == 0) ? (flags & TK_AT0) : 0)) return false; \
    } while (0)
    switch (bh) {
    case TB_ISOLATED:
        for (size_t i = 0; i < n; i++) EMIT(v[i].start, v[i].end);
        return true;
    case TB_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!v[i].match) EMIT(v[i].start, v[i].end);
        return true;
    case TB_CONTIGUOUS:
    case TB_MERGED_PREV: {
        bool prev = false, have = false;
        size_t a = 0, b = 0;
        for (size_t i = 0; i < n; i++) {
            bool extend = bh == TB_CONTIGUOUS ? v[i].match == prev : (v[i].match && !prev);
            if (extend && have) {
                b = v[i].end;
            } else {
                if (have) EMIT(a, b);
                a = v[i].start;
                b = v[i].end;
                have = true;
            }
            prev = v[i].match;
        }
        if (have) EMIT(a, b);
        return true;
    }
    case TB_MERGED_NEXT: {
        /* walk backwards, then emit in order */
        size_t *starts = malloc((n + 1) * sizeof *starts), *ends = malloc((n + 1) * sizeof *ends);
        if (!starts || !ends) {
            free(starts);
            free(ends);
            return false;
        }
        size_t m = 0;
        bool prev = false;
        for (size_t j = n; j-- > 0;) {
            if (v[j].match && !prev && m > 0) {
                starts[m - 1] = v[j].start;
            } else {
                starts[m] = v[j].start;
                ends[m] = v[j].end;
                m++;
            }
            prev = v[j].match;
        }
        bool ok = true;
        for (size_t k = m; k-- > 0 && ok;) {
            size_t a = starts[k], b = ends[k];
            if (b > a) ok = tk_pieces_add(out, s + a, b - a, a == 0 ? (flags & TK_AT0) : 0);
        }
        free(starts);
        free(ends);
        return ok;
    }
    }
#undef EMIT
    return true;
}

static bool is_ws(uint32_t cp, uint32_t arg) { (void)arg; return tk_is_whitespace(cp); }
static bool is_num(uint32_t cp, uint32_t arg) { (void)arg; return tk_is_numeric(cp); }
static bool is_pun(uint32_t cp, uint32_t arg) { (void)arg; return tk_is_punct(cp); }
static bool is_chr(uint32_t cp, uint32_t arg) { return cp == arg; }

static bool byte_map(const ktok *t, const char *s, size_t n, uint32_t flags, tk_pieces *out) {
    size_t off = out->text.n;
    if (!tk_buf_reserve(&out->text, 2 * n)) return false;
    for (size_t i = 0; i < n; i++)
        if (!tk_buf_put_cp(&out->text, t->byte_char[(unsigned char)s[i]])) return false;
    return tk_pieces_add_ref(out, off, out->text.n - off, flags);
}

/* One pre-tokenizer on one piece s (flags), appending to out. */
static kiln_status pretok_piece(const tk_pretok *pt, const ktok *t, tk_ctx *c, const char *s, size_t n,
                                uint32_t flags, tk_pieces *out) {
    tk_segs *segs = &c->segs;
    switch (pt->type) {
    case TP_SEQ: return kiln_error(KILN_EINTERNAL, "nested sequence");
    case TP_BYTELEVEL: {
        tk_buf *b = &c->tmp;
        b->n = 0;
        if (pt->add_prefix_space && (n == 0 || s[0] != ' ') && !tk_buf_putc(b, ' ')) return OOM;
        if (!tk_buf_put(b, s, n)) return OOM;
        if (!pt->use_regex) return byte_map(t, b->p, b->n, flags, out) ? NULL : OOM;
        if (!tk_find_segments(&pt->pat, c->md, b->p, b->n, segs))
            return kiln_error(KILN_EINVAL, "ByteLevel: regex match failed");
        for (size_t i = 0; i < segs->n; i++) {
            size_t a = segs->v[i].start, e = segs->v[i].end;
            if (e > a && !byte_map(t, b->p + a, e - a, a == 0 ? (flags & TK_AT0) : 0, out)) return OOM;
        }
        return NULL;
    }
    case TP_SPLIT:
    case TP_WHITESPACE:
        if (!tk_find_segments(&pt->pat, c->md, s, n, segs)) return kiln_error(KILN_EINVAL, "Split: regex match failed");
        if (pt->invert || pt->type == TP_WHITESPACE)
            for (size_t i = 0; i < segs->n; i++) segs->v[i].match = !segs->v[i].match;
        return split_emit(segs, pt->type == TP_WHITESPACE ? TB_REMOVED : pt->behavior, s, flags, out) ? NULL : OOM;
    case TP_METASPACE: {
        tk_buf *b = &c->tmp;
        b->n = 0;
        char rep[4];
        int rl = tk_utf8_enc(pt->repl, rep);
        for (size_t i = 0; i < n; i++) {
            bool ok = s[i] == ' ' ? tk_buf_put(b, rep, (size_t)rl) : tk_buf_putc(b, s[i]);
            if (!ok) return OOM;
        }
        bool starts = b->n >= (size_t)rl && memcmp(b->p, rep, (size_t)rl) == 0;
        if (!starts && n > 0 && (pt->scheme == TM_ALWAYS || (pt->scheme == TM_FIRST && (flags & TK_AT0)))) {
            if (!tk_buf_put(b, rep, (size_t)rl)) return OOM; /* make room, then shift */
            memmove(b->p + rl, b->p, b->n - (size_t)rl);
            memcpy(b->p, rep, (size_t)rl);
        }
        if (!pt->split) return b->n && !tk_pieces_add(out, b->p, b->n, flags) ? OOM : NULL;
        if (!pred_segments(b->p, b->n, is_chr, pt->repl, segs)) return OOM;
        return split_emit(segs, TB_MERGED_NEXT, b->p, flags, out) ? NULL : OOM;
    }
    case TP_WHITESPACE_SPLIT:
        if (!pred_segments(s, n, is_ws, 0, segs)) return OOM;
        return split_emit(segs, TB_REMOVED, s, flags, out) ? NULL : OOM;
    case TP_CHAR_DELIM:
        if (!pred_segments(s, n, is_chr, pt->repl, segs)) return OOM;
        return split_emit(segs, TB_REMOVED, s, flags, out) ? NULL : OOM;
    case TP_DIGITS:
        if (!pred_segments(s, n, is_num, 0, segs)) return OOM;
        return split_emit(segs, pt->individual ? TB_ISOLATED : TB_CONTIGUOUS, s, flags, out) ? NULL : OOM;
    case TP_PUNCT:
        if (!pred_segments(s, n, is_pun, 0, segs)) return OOM;
        return split_emit(segs, pt->behavior, s, flags, out) ? NULL : OOM;
    case TP_BERT: {
        /* whitespace (removed), then punctuation (isolated), piece by piece */
        tk_pieces words = {0};
        kiln_status st = NULL;
        if (!pred_segments(s, n, is_ws, 0, segs) || !split_emit(segs, TB_REMOVED, s, flags, &words)) st = OOM;
        for (size_t i = 0; !st && i < words.n; i++) {
            const char *w = tk_piece_str(&words, i);
            if (!pred_segments(w, words.v[i].len, is_pun, 0, segs) ||
                !split_emit(segs, TB_ISOLATED, w, words.v[i].flags, out))
                st = OOM;
        }
        tk_pieces_free(&words);
        return st;
    }
    }
    return kiln_error(KILN_EINTERNAL, "pre-tokenizer: bad type");
}

kiln_status tk_pretokenize(const tk_pretok *pt, const ktok *t, tk_ctx *c, tk_pieces *p, tk_pieces *tmp) {
    if (pt->type == TP_SEQ) {
        for (int i = 0; i < pt->n_subs; i++) KILN_TRY(tk_pretokenize(&pt->subs[i], t, c, p, tmp));
        return NULL;
    }
    tk_pieces_clear(tmp);
    for (size_t i = 0; i < p->n; i++)
        KILN_TRY(pretok_piece(pt, t, c, tk_piece_str(p, i), p->v[i].len, p->v[i].flags, tmp));
    tk_pieces sw = *p;
    *p = *tmp;
    *tmp = sw;
    return NULL;
}

void tk_pretok_free(tk_pretok *pt) {
    if (!pt) return;
    for (int i = 0; i < pt->n_subs; i++) tk_pretok_free(&pt->subs[i]);
    free(pt->subs);
    tk_pattern_free(&pt->pat);
}
