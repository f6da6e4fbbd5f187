/* tok_model.c: the models (HF models/): BPE, Unigram, WordPiece, WordLevel.
 * Each turns one pre-token into ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")

/* ---- BPE ------------------------------------------------------------------ */

typedef struct {
    int32_t id;
    int32_t prev, next; /* -1: none */
    uint32_t len;       /* bytes of the word it covers; 0 once merged away */
} bpe_sym;

typedef struct {
    int32_t rank, pos, new_id;
} bpe_merge;

/* min-heap on (rank, pos): the merge HF's BinaryHeap pops first */
static inline bool merge_less(const bpe_merge *a, const bpe_merge *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(bpe_merge *h, size_t *n, bpe_merge m) {
    size_t i = (*n)++;
    h[i] = m;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&h[i], &h[p])) break;
        bpe_merge t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

static bpe_merge heap_pop(bpe_merge *h, size_t *n) {
    bpe_merge top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && merge_less(&h[l], &h[m])) m = l;
        if (r < *n && merge_less(&h[r], &h[m])) m = r;
        if (m == i) break;
        bpe_merge t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
    return top;
}

static inline bool merge_get(const tk_model *m, int32_t a, int32_t b, int32_t *rank, int32_t *new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    return tk_u64map_get(&m->merges, key, rank, new_id);
}

/* Word::merge_all: merges by rank (then position) until none applies. */
static size_t bpe_merge_all(const tk_model *m, bpe_sym *sy, size_t ns, bpe_merge *heap) {
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        int32_t rank, nid;
        if (merge_get(m, sy[i].id, sy[i + 1].id, &rank, &nid)) heap_push(heap, &nh, (bpe_merge){rank, (int32_t)i, nid});
    }
    while (nh) {
        bpe_merge top = heap_pop(heap, &nh);
        bpe_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        bpe_sym *right = &sy[cur->next];
        int32_t rank, nid;
        if (!merge_get(m, cur->id, right->id, &rank, &nid) || nid != top.new_id) continue; /* stale */
        cur->id = top.new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0) sy[cur->next].prev = top.pos;
        if (cur->prev >= 0 && merge_get(m, sy[cur->prev].id, cur->id, &rank, &nid))
            heap_push(heap, &nh, (bpe_merge){rank, cur->prev, nid});
        if (cur->next >= 0 && merge_get(m, cur->id, sy[cur->next].id, &rank, &nid))
            heap_push(heap, &nh, (bpe_merge){rank, top.pos, nid});
    }
    return ns;
}

static kiln_status bpe_tokenize(const ktok *t, tk_ctx *c, const char *s, size_t n, tk_ids *out) {
    const tk_model *m = &t->model;
    if (n == 0) return NULL;
    if (m->ignore_merges) {
        int32_t id = tk_strmap_get(&t->vocab, s, n);
        if (id >= 0) return tk_ids_push(out, id) ? NULL : OOM;
    }
    /* at most n chars, and byte fallback adds up to 4 symbols per char (+affixes) */
    size_t cap = 4 * n + 4 * (m->prefix_len + m->suffix_len) + 8;
    bpe_sym *sy = tk_scratch(c, 0, cap * sizeof *sy);
    if (!sy) return OOM;
    size_t ns = 0;
    int32_t unk_id = -1;
    uint32_t unk_len = 0;
    bool have_unk = false;
    tk_buf *key = &c->tmp2;
    for (size_t i = 0; i < n;) {
        size_t k = (size_t)tk_utf8_len((unsigned char)s[i]);
        if (i + k > n) k = n - i;
        bool first = i == 0, last = i + k >= n;
        const char *ks = s + i;
        size_t kn = k;
        if ((!first && m->prefix) || (last && m->suffix)) {
            key->n = 0;
            if (!first && m->prefix && !tk_buf_put(key, m->prefix, m->prefix_len)) return OOM;
            if (!tk_buf_put(key, s + i, k)) return OOM;
            if (last && m->suffix && !tk_buf_put(key, m->suffix, m->suffix_len)) return OOM;
            ks = key->p;
            kn = key->n;
        }
        int32_t id = tk_strmap_get(&t->vocab, ks, kn);
        if (id >= 0) {
            if (have_unk) {
                sy[ns] = (bpe_sym){unk_id, (int32_t)ns - 1, (int32_t)ns + 1, unk_len};
                ns++;
                have_unk = false;
            }
            sy[ns] = (bpe_sym){id, (int32_t)ns - 1, (int32_t)ns + 1, (uint32_t)k};
            ns++;
        } else {
            bool done = false;
            if (m->byte_fallback) {
                bool all = true;
                for (size_t j = 0; j < kn && all; j++) all = m->byte_ids[(unsigned char)ks[j]] >= 0;
                if (all) {
                    /* HF adds the bytes without flushing a pending unk first */
                    for (size_t j = 0; j < kn; j++) {
                        if (ns >= cap) return kiln_error(KILN_EINTERNAL, "BPE: scratch overflow");
                        sy[ns] = (bpe_sym){m->byte_ids[(unsigned char)ks[j]], (int32_t)ns - 1, (int32_t)ns + 1, 1};
                        ns++;
                    }
                    done = true;
                }
            }
            if (!done && m->unk_id == -2)
                return kiln_error(KILN_EINVAL, "BPE: unk_token is not in the vocabulary");
            if (!done && m->unk_id >= 0) {
                if (have_unk && m->fuse_unk) {
                    unk_len += (uint32_t)k;
                } else {
                    if (have_unk) {
                        sy[ns] = (bpe_sym){unk_id, (int32_t)ns - 1, (int32_t)ns + 1, unk_len};
                        ns++;
                    }
                    unk_id = m->unk_id;
                    unk_len = (uint32_t)k;
                    have_unk = true;
                }
            }
        }
        if (ns + 8 > cap) return kiln_error(KILN_EINTERNAL, "BPE: scratch overflow");
        i += k;
    }
    if (have_unk) {
        sy[ns] = (bpe_sym){unk_id, (int32_t)ns - 1, (int32_t)ns + 1, unk_len};
        ns++;
    }
    if (ns == 0) return NULL;
    sy[ns - 1].next = -1;
    /* each merge pushes at most two entries: the heap never exceeds ns + 2 * merges */
    bpe_merge *heap = tk_scratch(c, 1, (3 * ns + 8) * sizeof *heap);
    if (!heap) return OOM;
    bpe_merge_all(m, sy, ns, heap);
    for (int32_t i = 0; i >= 0; i = sy[i].next)
        if (!tk_ids_push(out, sy[i].id)) return OOM;
    return NULL;
}

/* ---- Unigram -------------------------------------------------------------- */

typedef struct {
    int32_t id;
    int32_t start; /* -1: none */
    double score;
} uni_node;

static kiln_status unigram_tokenize(const ktok *t, tk_ctx *c, const char *s, size_t n, tk_ids *out) {
    const tk_model *m = &t->model;
    if (n == 0) return NULL;
    uni_node *best = tk_scratch(c, 0, (n + 1) * sizeof *best);
    if (!best) return OOM;
    for (size_t i = 0; i <= n; i++) best[i] = (uni_node){0, -1, 0.0};
    double unk_score = m->min_score - 10.0;
    for (size_t st = 0; st < n;) {
        double base = best[st].score;
        size_t mblen = (size_t)tk_utf8_len((unsigned char)s[st]);
        if (st + mblen > n) mblen = n - st;
        bool single = false;
        for (size_t e = st + mblen; e <= n && e - st <= m->max_piece_len;) {
            if (tk_strmap_get(&m->prefixes, s + st, e - st) < 0) break;
            int32_t id = tk_strmap_get(&t->vocab, s + st, e - st);
            if (id >= 0 && id < t->n_model) {
                double cand = m->scores[id] + base;
                if (best[e].start < 0 || cand > best[e].score) best[e] = (uni_node){id, (int32_t)st, cand};
                if (e - st == mblen) single = true;
            }
            if (e >= n) break;
            e += (size_t)tk_utf8_len((unsigned char)s[e]);
            if (e > n) break;
        }
        if (!single) {
            if (m->unk_id < 0) return kiln_error(KILN_EINVAL, "Unigram: an unknown piece but no unk_id");
            double cand = unk_score + base;
            uni_node *tn = &best[st + mblen];
            if (tn->start < 0 || cand > tn->score) *tn = (uni_node){m->unk_id, (int32_t)st, cand};
        }
        st += mblen;
    }
    /* backtrack into (start, end) pieces, fusing consecutive unks */
    size_t *cut = tk_scratch(c, 1, (n + 2) * 2 * sizeof *cut);
    if (!cut) return OOM;
    size_t nc = 0, end = n, fuse_end = 0;
    bool fusing = false;
    while (end > 0) {
        size_t st = (size_t)best[end].start;
        if (best[end].id == m->unk_id) {
            if (!fusing) fuse_end = end;
            fusing = true;
        } else {
            if (fusing) {
                cut[2 * nc] = end;
                cut[2 * nc + 1] = fuse_end;
                nc++;
                fusing = false;
            }
            cut[2 * nc] = st;
            cut[2 * nc + 1] = end;
            nc++;
        }
        end = st;
    }
    if (fusing) {
        cut[2 * nc] = 0;
        cut[2 * nc + 1] = fuse_end;
        nc++;
    }
    for (size_t k = nc; k-- > 0;) {
        size_t a = cut[2 * k], b = cut[2 * k + 1];
        int32_t id = tk_strmap_get(&t->vocab, s + a, b - a);
        if (id < 0) {
            if (m->byte_fallback) {
                bool all = true;
                for (size_t j = a; j < b && all; j++) all = m->byte_ids[(unsigned char)s[j]] >= 0;
                if (all) {
                    for (size_t j = a; j < b; j++)
                        if (!tk_ids_push(out, m->byte_ids[(unsigned char)s[j]])) return OOM;
                    continue;
                }
            }
            if (m->unk_id < 0) return kiln_error(KILN_EINVAL, "Unigram: an unknown piece but no unk_id");
            id = m->unk_id;
        }
        if (!tk_ids_push(out, id)) return OOM;
    }
    return NULL;
}

/* ---- WordPiece and WordLevel ---------------------------------------------- */

static kiln_status wordpiece_tokenize(const ktok *t, tk_ctx *c, const char *s, size_t n, tk_ids *out) {
    const tk_model *m = &t->model;
    size_t chars = 0;
    for (size_t i = 0; i < n; i += (size_t)tk_utf8_len((unsigned char)s[i])) chars++;
    size_t mark = out->n;
    if (chars <= m->max_input_chars) {
        tk_buf *key = &c->tmp2;
        size_t st = 0;
        bool bad = false;
        while (st < n) {
            size_t e = n;
            int32_t found = -1;
            while (st < e) {
                key->n = 0;
                if (st > 0 && !tk_buf_put(key, m->prefix, m->prefix_len)) return OOM;
                if (!tk_buf_put(key, s + st, e - st)) return OOM;
                int32_t id = tk_strmap_get(&t->vocab, key->p, key->n);
                if (id >= 0) {
                    found = id;
                    break;
                }
                /* drop the last char of the substring */
                size_t k = e - 1;
                while (k > st && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                e = k;
            }
            if (found < 0) {
                bad = true;
                break;
            }
            if (!tk_ids_push(out, found)) return OOM;
            st = e;
        }
        if (!bad) return NULL;
    }
    out->n = mark;
    if (m->unk_id < 0) return kiln_error(KILN_EINVAL, "WordPiece: unk_token is not in the vocabulary");
    return tk_ids_push(out, m->unk_id) ? NULL : OOM;
}

static kiln_status wordlevel_tokenize(const ktok *t, const char *s, size_t n, tk_ids *out) {
    int32_t id = tk_strmap_get(&t->vocab, s, n);
    if (id < 0) id = t->model.unk_id;
    if (id < 0) return kiln_error(KILN_EINVAL, "WordLevel: unk_token is not in the vocabulary");
    return tk_ids_push(out, id) ? NULL : OOM;
}

kiln_status tk_model_tokenize(const ktok *t, tk_ctx *c, const char *s, size_t n, tk_ids *out) {
    switch (t->model.type) {
    case TM_BPE: return bpe_tokenize(t, c, s, n, out);
    case TM_UNIGRAM: return unigram_tokenize(t, c, s, n, out);
    case TM_WORDPIECE: return wordpiece_tokenize(t, c, s, n, out);
    case TM_WORDLEVEL: return wordlevel_tokenize(t, s, n, out);
    }
    return kiln_error(KILN_EINTERNAL, "model: bad type");
}
