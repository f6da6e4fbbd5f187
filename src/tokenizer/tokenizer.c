/* tokenizer.c: the encode pipeline (added tokens, normalizer, pre-tokenizer,
 * model, post-processor), decode, and streaming decode.
 *
 * encode follows TokenizerImpl::encode_single_sequence + post_process:
 *   1. added tokens whose `normalized` is false are matched in the raw text
 *      (leftmost-longest, with lstrip/rstrip/single_word);
 *   2. every other section is normalized, then added tokens with `normalized`
 *      true are matched in the normalized text;
 *   3. the remaining sections are pre-tokenized and each piece goes through
 *      the model;
 *   4. with add_special, the post-processor adds its special tokens. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")

/* ---- added-token trie ------------------------------------------------------ */

static bool trie_node(tk_trie *tr, int32_t *out) {
    if (tr->n_nodes == tr->cap_nodes) {
        size_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 64;
        int32_t *t = realloc(tr->term, cap * sizeof *t);
        if (!t) return false;
        tr->term = t;
        tr->cap_nodes = cap;
    }
    tr->term[tr->n_nodes] = -1;
    *out = (int32_t)tr->n_nodes++;
    return true;
}

static bool trie_add(tk_trie *tr, const char *s, size_t n, int32_t val) {
    int32_t node = 0, child, dummy;
    if (tr->n_nodes == 0 && (!trie_node(tr, &node) || !tk_u64map_init(&tr->edges, 64))) return false;
    node = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = ((uint64_t)(uint32_t)node << 8) | (unsigned char)s[i];
        if (!tk_u64map_get(&tr->edges, key, &child, &dummy)) {
            if (!trie_node(tr, &child) || !tk_u64map_put(&tr->edges, key, child, 0)) return false;
        }
        node = child;
    }
    tr->first[(unsigned char)s[0]] = true;
    if (tr->term[node] < 0) tr->term[node] = val; /* the first pattern wins ties */
    return true;
}

static void trie_free(tk_trie *tr) {
    tk_u64map_free(&tr->edges);
    free(tr->term);
    *tr = (tk_trie){0};
}

/* Longest pattern starting at s[i]; returns its end, or 0 with *idx = -1. */
static size_t trie_longest(const tk_trie *tr, const char *s, size_t n, size_t i, int32_t *idx) {
    int32_t node = 0, child, dummy;
    size_t best = 0;
    *idx = -1;
    for (size_t j = i; j < n; j++) {
        uint64_t key = ((uint64_t)(uint32_t)node << 8) | (unsigned char)s[j];
        if (!tk_u64map_get(&tr->edges, key, &child, &dummy)) break;
        node = child;
        if (tr->term[node] >= 0) {
            best = j + 1;
            *idx = tr->term[node];
        }
    }
    return best;
}

/* Rust regex's Unicode \w: Alphabetic, marks, Nd, Pc, Join_Control. */
static bool is_word_cp(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return true;
    if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
        (cp >= 0x1F170 && cp <= 0x1F189))
        return true; /* Other_Alphabetic symbols */
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

static uint32_t last_cp(const char *s, size_t n) {
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    tk_utf8_dec(s + k, n - k, &cp);
    return cp;
}

typedef struct {
    uint32_t start, end;
    int32_t id; /* -1: not an added token */
} tk_split;

typedef struct {
    tk_split *v;
    size_t n, cap;
} tk_splits;

static bool splits_push(tk_splits *s, size_t a, size_t b, int32_t id) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        tk_split *v = realloc(s->v, cap * sizeof *v);
        if (!v) return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (tk_split){(uint32_t)a, (uint32_t)b, id};
    return true;
}

/* AddedVocabulary::find_matches */
static bool find_added(const ktok *t, const tk_trie *tr, const char *s, size_t n, tk_splits *out) {
    out->n = 0;
    if (n == 0 || tr->n_nodes == 0) return n == 0 ? splits_push(out, 0, 0, -1) : splits_push(out, 0, n, -1);
    size_t start_offset = 0, i = 0;
    while (i < n) {
        if (!tr->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        int32_t idx;
        size_t stop = trie_longest(tr, s, n, i, &idx);
        if (idx < 0) {
            i++;
            continue;
        }
        size_t start = i;
        i = stop; /* the match is consumed even when single_word discards it */
        const tk_added *a = &t->added[idx];
        if (a->single_word) {
            bool start_space = start == 0 || !is_word_cp(last_cp(s, start));
            uint32_t nx = 0;
            if (stop < n) tk_utf8_dec(s + stop, n - stop, &nx);
            bool stop_space = stop == n || !is_word_cp(nx);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = ns - 1;
                while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                uint32_t cp;
                tk_utf8_dec(s + k, ns - k, &cp);
                if (!tk_is_whitespace(cp)) break;
                ns = k;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                uint32_t cp;
                int k = tk_utf8_dec(s + stop, n - stop, &cp);
                if (!tk_is_whitespace(cp)) break;
                stop += (size_t)k;
            }
            i = stop;
        }
        int32_t id = tk_strmap_get(&t->added_map, a->content, a->len);
        if (id < 0) id = a->id;
        if (start_offset < start && !splits_push(out, start_offset, start, -1)) return false;
        if (!splits_push(out, start, stop, id)) return false;
        start_offset = stop;
    }
    if (start_offset != n && !splits_push(out, start_offset, n, -1)) return false;
    return true;
}

kiln_status tk_added_finish(ktok *t) {
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
    if (!t->norm_content && t->n_added) {
        t->norm_content = ku_arena_alloc(t->arena, (size_t)t->n_added * sizeof *t->norm_content);
        if (!t->norm_content) return OOM;
    }
    tk_ctx c;
    if (!tk_ctx_init(&c)) return OOM;
    tk_buf nb = {0};
    kiln_status st = NULL;
    /* special tokens first, then the others (refresh_added_tokens) */
    for (int pass = 0; pass < 2 && !st; pass++) {
        for (int i = 0; i < t->n_added && !st; i++) {
            tk_added *a = &t->added[i];
            if (a->special != (pass == 0) || a->len == 0) continue;
            if (!a->normalized) {
                if (!trie_add(&t->trie_raw, a->content, a->len, i)) st = OOM;
                continue;
            }
            const char *s = a->content;
            size_t n = a->len;
            if (t->norm) {
                bool at0 = true;
                st = tk_normalize(t->norm, &c, a->content, a->len, &nb, &at0);
                if (st) break;
                s = nb.p ? nb.p : "";
                n = nb.n;
            }
            t->norm_content[i] = ku_arena_memdup(t->arena, s, n + 1);
            if (!t->norm_content[i]) st = OOM;
            else if (n && !trie_add(&t->trie_norm, t->norm_content[i], n, i)) st = OOM;
        }
    }
    tk_buf_free(&nb);
    tk_ctx_free(&c);
    return st;
}

/* ---- encode ---------------------------------------------------------------- */

/* Words repeat: a cache of piece -> ids for the length of one encode call
 * (HF's BPE keeps one per tokenizer; per call needs no lock). */
#define CACHE_MAX_WORDS 65536
#define CACHE_MAX_LEN 256

typedef struct {
    tk_ctx c;
    tk_pieces p, tmp;
    tk_buf norm;
    tk_splits sp1, sp2;
    tk_strmap cache;   /* piece -> entry */
    ku_arena *keys;    /* cached piece strings */
    tk_ids cached;     /* ids of all entries */
    uint32_t *ent_off, *ent_len;
    size_t n_ent;
} enc_state;

static kiln_status tokenize_piece(const ktok *t, enc_state *e, const char *s, size_t n, tk_ids *out) {
    if (n > CACHE_MAX_LEN) return tk_model_tokenize(t, &e->c, s, n, out);
    int32_t hit = tk_strmap_get(&e->cache, s, n);
    if (hit >= 0) {
        for (uint32_t k = 0; k < e->ent_len[hit]; k++)
            if (!tk_ids_push(out, e->cached.v[e->ent_off[hit] + k])) return OOM;
        return NULL;
    }
    size_t mark = out->n;
    KILN_TRY(tk_model_tokenize(t, &e->c, s, n, out));
    if (e->n_ent >= CACHE_MAX_WORDS) return NULL;
    if (!e->keys) {
        e->keys = ku_arena_create();
        e->ent_off = malloc(CACHE_MAX_WORDS * sizeof *e->ent_off);
        e->ent_len = malloc(CACHE_MAX_WORDS * sizeof *e->ent_len);
        if (!e->keys || !e->ent_off || !e->ent_len || !tk_strmap_init(&e->cache, 1024)) return OOM;
    }
    char *k = ku_arena_memdup(e->keys, s, n);
    if (!k) return OOM;
    e->ent_off[e->n_ent] = (uint32_t)e->cached.n;
    e->ent_len[e->n_ent] = (uint32_t)(out->n - mark);
    for (size_t i = mark; i < out->n; i++)
        if (!tk_ids_push(&e->cached, out->v[i])) return OOM;
    if (!tk_strmap_put(&e->cache, k, n, (int32_t)e->n_ent)) return OOM;
    e->n_ent++;
    return NULL;
}

static kiln_status encode_section(const ktok *t, enc_state *e, const char *s, size_t n, uint32_t flags, tk_ids *out) {
    tk_pieces_clear(&e->p);
    if (!tk_pieces_add(&e->p, s, n, flags)) return OOM;
    if (t->pretok) KILN_TRY(tk_pretokenize(t->pretok, t, &e->c, &e->p, &e->tmp));
    for (size_t i = 0; i < e->p.n; i++) KILN_TRY(tokenize_piece(t, e, tk_piece_str(&e->p, i), e->p.v[i].len, out));
    return NULL;
}

static kiln_status encode_text(const ktok *t, enc_state *e, const char *text, size_t len, tk_ids *out) {
    if (!find_added(t, &t->trie_raw, text, len, &e->sp1)) return OOM;
    for (size_t i = 0; i < e->sp1.n; i++) {
        tk_split s1 = e->sp1.v[i];
        if (s1.end == s1.start) continue;
        if (s1.id >= 0) {
            if (!tk_ids_push(out, s1.id)) return OOM;
            continue;
        }
        const char *s = text + s1.start;
        size_t n = s1.end - s1.start;
        bool at0 = s1.start == 0;
        if (t->norm) {
            KILN_TRY(tk_normalize(t->norm, &e->c, s, n, &e->norm, &at0));
            s = e->norm.p ? e->norm.p : "";
            n = e->norm.n;
        }
        if (!find_added(t, &t->trie_norm, s, n, &e->sp2)) return OOM;
        for (size_t j = 0; j < e->sp2.n; j++) {
            tk_split s2 = e->sp2.v[j];
            if (s2.end == s2.start) continue;
            if (s2.id >= 0) {
                if (!tk_ids_push(out, s2.id)) return OOM;
                continue;
            }
            uint32_t flags = (at0 && s2.start == 0) ? TK_AT0 : 0;
            KILN_TRY(encode_section(t, e, s + s2.start, s2.end - s2.start, flags, out));
        }
    }
    return NULL;
}

static kiln_status post_process(const tk_post *pp, tk_ids *ids) {
    switch (pp->type) {
    case TPP_NONE:
    case TPP_BYTELEVEL: return NULL;
    case TPP_SEQ:
        for (int i = 0; i < pp->n_subs; i++) KILN_TRY(post_process(&pp->subs[i], ids));
        return NULL;
    case TPP_TEMPLATE:
    case TPP_BERT:
    case TPP_ROBERTA: {
        tk_ids outv = {0};
        bool ok = true;
        if (pp->type == TPP_TEMPLATE) {
            for (int i = 0; i < pp->n_tmpl && ok; i++) {
                if (pp->tmpl[i] >= 0) {
                    ok = tk_ids_push(&outv, pp->tmpl[i]);
                } else {
                    for (size_t k = 0; k < ids->n && ok; k++) ok = tk_ids_push(&outv, ids->v[k]);
                }
            }
        } else {
            ok = tk_ids_push(&outv, pp->cls);
            for (size_t k = 0; k < ids->n && ok; k++) ok = tk_ids_push(&outv, ids->v[k]);
            ok = ok && tk_ids_push(&outv, pp->sep);
        }
        if (!ok) {
            free(outv.v);
            return OOM;
        }
        free(ids->v);
        *ids = outv;
        return NULL;
    }
    }
    return NULL;
}

kiln_status ktok_encode(const ktok *t, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!text && len) return kiln_error(KILN_EINVAL, "encode: NULL text");
    if (len > UINT32_MAX / 4) return kiln_error(KILN_ELIMIT, "encode: text of %zu bytes is too long", len);
    enc_state e = {0};
    if (!tk_ctx_init(&e.c)) return OOM;
    tk_buf clean = {0};
    kiln_status st = NULL;
    if (len && tk_utf8_valid_prefix(text, len) != len) { /* what HF sees: U+FFFD for bad bytes */
        if (!tk_utf8_lossy(&clean, text, len)) st = OOM;
        text = clean.p;
        len = clean.n;
    }
    tk_ids out = {0};
    if (!st) st = encode_text(t, &e, text ? text : "", len, &out);
    if (!st && add_special) st = post_process(&t->post, &out);
    tk_buf_free(&clean);
    tk_ctx_free(&e.c);
    tk_pieces_free(&e.p);
    tk_pieces_free(&e.tmp);
    tk_buf_free(&e.norm);
    free(e.sp1.v);
    free(e.sp2.v);
    tk_strmap_free(&e.cache);
    ku_arena_destroy(e.keys);
    free(e.cached.v);
    free(e.ent_off);
    free(e.ent_len);
    if (st) {
        free(out.v);
        return st;
    }
    *ids = out.v;
    *n = out.n;
    return NULL;
}

/* ---- decode ---------------------------------------------------------------- */

/* ids -> text (out), reporting whether the end may still change. */
static kiln_status decode_into(const ktok *t, tk_ctx *c, tk_pieces *p, tk_pieces *tmp, const int32_t *ids, size_t n,
                               bool skip_special, tk_buf *out, bool *unstable) {
    tk_pieces_clear(p);
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_str[id]) continue;
        if (skip_special && t->special[id]) continue;
        if (!tk_pieces_add(p, t->id_str[id], t->id_len[id], 0)) return OOM;
    }
    return tk_decode_tokens(t->dec, c, p, tmp, out, unstable);
}

kiln_status ktok_decode(const ktok *t, const int32_t *ids, size_t n, bool skip_special, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    tk_ctx c;
    if (!tk_ctx_init(&c)) return OOM;
    tk_pieces p = {0}, tmp = {0};
    tk_buf out = {0};
    bool unstable;
    kiln_status st = decode_into(t, &c, &p, &tmp, ids, n, skip_special, &out, &unstable);
    tk_ctx_free(&c);
    tk_pieces_free(&p);
    tk_pieces_free(&tmp);
    if (st) {
        tk_buf_free(&out);
        return st;
    }
    *text = out.p;
    *len = out.n;
    return NULL;
}

/* ---- streaming decode ------------------------------------------------------ */

/* The window scheme of text-generation-inference: decode ids[prefix:] and
 * emit what it adds to ids[prefix:read]; the window restarts where text was
 * emitted, so decoders that look at the first token (Metaspace, Strip) see
 * the same context in both decodes. Text is held while its end is unstable. */
struct ktok_stream {
    const ktok *t;
    bool skip_special;
    tk_ids ids;
    size_t prefix, read;
    size_t emitted; /* bytes emitted so far */
    tk_buf prefix_text, text;
    tk_ctx c;
    tk_pieces p, tmp;
};

ktok_stream *ktok_stream_create(const ktok *t, bool skip_special) {
    ktok_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (!tk_ctx_init(&s->c)) {
        free(s);
        return NULL;
    }
    s->t = t;
    s->skip_special = skip_special;
    return s;
}

void ktok_stream_destroy(ktok_stream *s) {
    if (!s) return;
    free(s->ids.v);
    tk_buf_free(&s->prefix_text);
    tk_buf_free(&s->text);
    tk_ctx_free(&s->c);
    tk_pieces_free(&s->p);
    tk_pieces_free(&s->tmp);
    free(s);
}

static kiln_status give(const char *src, size_t n, char **piece, size_t *len) {
    char *p = malloc(n + 1);
    if (!p) return OOM;
    if (n) memcpy(p, src, n);
    p[n] = 0;
    *piece = p;
    *len = n;
    return NULL;
}

kiln_status ktok_stream_push(ktok_stream *s, int32_t id, char **piece, size_t *len) {
    *piece = NULL;
    *len = 0;
    const ktok *t = s->t;
    bool drop = id < 0 || id >= t->n_ids || !t->id_str[id] || (s->skip_special && t->special[id]);
    if (drop) return give("", 0, piece, len); /* decode would skip it too */
    if (!tk_ids_push(&s->ids, id)) return OOM;
    bool unstable;
    KILN_TRY(decode_into(t, &s->c, &s->p, &s->tmp, s->ids.v + s->prefix, s->ids.n - s->prefix, false, &s->text,
                         &unstable));
    size_t pl = s->prefix_text.n;
    if (unstable || s->text.n <= pl || memcmp(s->text.p, s->prefix_text.p ? s->prefix_text.p : "", pl) != 0)
        return give("", 0, piece, len);
    /* the new text must end on a char boundary: it is whole UTF-8 by construction */
    KILN_TRY(give(s->text.p + pl, s->text.n - pl, piece, len));
    s->emitted += s->text.n - pl;
    s->prefix = s->read;
    s->read = s->ids.n;
    bool u2;
    kiln_status st = decode_into(t, &s->c, &s->p, &s->tmp, s->ids.v + s->prefix, s->read - s->prefix, false,
                                 &s->prefix_text, &u2);
    if (st) {
        free(*piece);
        *piece = NULL;
        *len = 0;
    }
    return st;
}

kiln_status ktok_stream_flush(ktok_stream *s, char **piece, size_t *len) {
    *piece = NULL;
    *len = 0;
    /* the whole decode, less what was emitted: exact even if a decoder is not
     * prefix-stable */
    bool unstable;
    KILN_TRY(decode_into(s->t, &s->c, &s->p, &s->tmp, s->ids.v, s->ids.n, false, &s->text, &unstable));
    size_t from = s->emitted < s->text.n ? s->emitted : s->text.n;
    while (from < s->text.n && ((unsigned char)s->text.p[from] & 0xC0) == 0x80) from++;
    KILN_TRY(give(s->text.p ? s->text.p + from : "", s->text.n - from, piece, len));
    s->emitted += s->text.n - from;
    return NULL;
}

/* ---- accessors ------------------------------------------------------------- */

static bool has_dec(const tk_dec *d, td_type ty) {
    if (!d) return false;
    if (d->type == ty) return true;
    for (int i = 0; i < d->n_subs; i++)
        if (d->subs[i].type == ty) return true;
    return false;
}

static int hex1(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int32_t ktok_token_bytes(const ktok *t, int32_t id, char *buf, int32_t cap) {
    if (id < 0 || id >= t->n_ids || !t->id_str[id]) return -1;
    const char *s = t->id_str[id];
    size_t n = t->id_len[id];
    int32_t k = 0;
#define PUT(c) do { if (k < cap) buf[k] = (char)(c); k++; } while (0)
    if (t->special[id]) {
        for (size_t i = 0; i < n; i++) PUT(s[i]);
        return k;
    }
    if (has_dec(t->dec, TD_BYTELEVEL)) {
        uint32_t cp;
        for (size_t j = 0; j < n;) {
            j += (size_t)tk_utf8_dec(s + j, n - j, &cp);
            int b = tk_char_byte(cp);
            if (b < 0) { /* outside the byte map: the token passes as is */
                k = 0;
                for (size_t i = 0; i < n; i++) PUT(s[i]);
                return k;
            }
            PUT(b);
        }
        return k;
    }
    if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>' && hex1(s[3]) >= 0 && hex1(s[4]) >= 0) {
        PUT(hex1(s[3]) * 16 + hex1(s[4]));
        return k;
    }
    for (size_t i = 0; i < n; i++) { /* SentencePiece: U+2581 is a space */
        if (i + 3 <= n && memcmp(s + i, "\xE2\x96\x81", 3) == 0) {
            PUT(' ');
            i += 2;
        } else PUT(s[i]);
    }
#undef PUT
    return k;
}

int32_t ktok_vocab_size(const ktok *t) { return t->n_ids; }

const char *ktok_token_str(const ktok *t, int32_t id) {
    return (id >= 0 && id < t->n_ids) ? t->id_str[id] : NULL;
}

int32_t ktok_token_id(const ktok *t, const char *s) {
    if (!s) return -1;
    size_t n = strlen(s);
    int32_t id = tk_strmap_get(&t->added_map, s, n);
    return id >= 0 ? id : tk_strmap_get(&t->vocab, s, n);
}

bool ktok_is_special(const ktok *t, int32_t id) { return id >= 0 && id < t->n_ids && t->special[id]; }
int32_t ktok_bos_id(const ktok *t) { return t->bos_id; }
int32_t ktok_eos_id(const ktok *t) { return t->eos_id; }

void ktok_free(ktok *t) {
    if (!t) return;
    tk_strmap_free(&t->vocab);
    tk_strmap_free(&t->added_map);
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
    if (t->norm) tk_norm_free(t->norm);
    free(t->norm);
    if (t->pretok) tk_pretok_free(t->pretok);
    free(t->pretok);
    tk_u64map_free(&t->model.merges);
    tk_strmap_free(&t->model.prefixes);
    free(t->model.scores);
    free(t->model.prefix);
    free(t->model.suffix);
    tk_post_free(&t->post);
    if (t->dec) tk_dec_free(t->dec);
    free(t->dec);
    free(t->id_str);
    free(t->id_len);
    free(t->special);
    free(t->is_added);
    free(t->added);
    ku_arena_destroy(t->arena);
    free(t);
}

void tk_post_free(tk_post *pp) {
    for (int i = 0; i < pp->n_subs; i++) tk_post_free(&pp->subs[i]);
    free(pp->subs);
    free(pp->tmpl);
    *pp = (tk_post){0};
}
