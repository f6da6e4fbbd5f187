/* engine.c: the vocabulary trie, the lazily determinized recognizer and the
 * token masks (see grammar.h).
 *
 * Recognizer: llama.cpp's pushdown design (llama-grammar.cpp: a parse is a
 * set of stacks whose tops are byte-set elements), with three changes:
 *  - stacks are hash-consed nodes (pos, parent), so equal stacks are one id
 *    and a set of stacks is a sorted id array, interned as a state;
 *  - a return into the end of an alternative is a tail call (no frame), so
 *    x* and right recursion do not grow the stacks;
 *  - the expansion of one step visits each (pos, parent) once, so ambiguous
 *    grammars stay polynomial per step.
 * A state's transition on each byte class is computed once and kept in a
 * table (a DFA built on demand), and a state's mask once: a walk of the
 * token trie in preorder, skipping a subtree where the state dies, as
 * llguidance's toktrie does. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grammar/gr_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")
#define MAX_TOPS 100000          /* stacks in one state */
#define MAX_NODES (1 << 24)      /* stack nodes of one index */
#define MAX_STATES (1 << 19)     /* states of one index (the transition table is states x byte classes) */
#define MAX_MASK_BYTES (512u << 20) /* cached masks of one index */

/* ---- vocabulary ---- */
struct kgr_vocab {
    int32_t n_vocab;
    char *bytes;          /* all tokens' bytes */
    int64_t *off;         /* [n_vocab + 1]: token i is bytes[off[i], off[i+1]); empty: never allowed */
    int32_t *eos;
    int32_t n_eos;
    /* special tokens' texts, for <|name|> references: sp_text[sp_off[k],
     * sp_off[k+1]) is token sp_id[k]'s (its bytes above are its marker) */
    char *sp_text;
    int64_t *sp_off;
    int32_t *sp_id, n_sp;
    /* the trie in preorder (the root excluded); the arrays below are the
     * build's, freed once packed into node[] */
    int32_t n_nodes, max_depth;
    uint8_t *byte;
    int32_t *depth;   /* 1 for the root's children */
    int32_t *next;    /* the node after this one's subtree */
    int32_t *tok_head; /* a token ending here, -1 if none */
    int32_t *tok_next; /* [n_vocab]: the next token with the same bytes */
    struct tnode {       /* the same, packed for the mask walk */
        int32_t next, tok;
        uint16_t depth;
        uint8_t byte;
        uint8_t flags; /* TN_MORE: tok is not the only token here (tok_next);
                        * TN_WHOLE (node[]): the prefix ends a UTF-8 character */
    } *node;
    /* String interiors: a plain token is printable ASCII but " and \ and
     * whole UTF-8 characters from U+0080 (plain[] its bits); rest[] is the
     * trie of the other tokens. From a state every plain token leads back
     * to, each is allowed and only rest[] is walked (a JSON string's mask:
     * some 5k tokens of Llama 3's 128k). */
    uint32_t *plain;
    struct tnode *rest;
    int32_t n_rest;
    /* per first byte: the subtree's root in node[] and rest[] (-1: none),
     * and (plain first bytes) the plain tokens that start with it */
    int32_t root_node[256], root_rest[256];
    uint32_t *plain_first[128];
    uint32_t *plain_ascii; /* the union of plain_first */
    /* Per node of node[], for a subtree whose prefix leads into a string
     * interior: its plain tokens are plain_ids[plain_lo[i], plain_lo[next])
     * (plain_ids: the plain tokens in trie order), its other tokens the
     * subtree of rest[rest_of[i]] (-1: none), the node of the same prefix. */
    int32_t *plain_lo; /* [n_nodes + 1] */
    int32_t *plain_ids, *rest_of;
    uint16_t *plain_more; /* [n_nodes]: the most characters a plain token below adds to the prefix */
};

enum { TN_MORE = 1, TN_WHOLE = 2 };

static bool plain_byte(unsigned b) { return b >= 0x20 && b < 0x7f && b != '"' && b != '\\'; }

/* UTF-8 (RFC 3629): the length of the sequence lead starts (0: not a lead
 * byte) and the range of its second byte */
static int utf8_lead(unsigned lead, unsigned *lo, unsigned *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead == 0xE0) *lo = 0xA0;
    if (lead == 0xED) *hi = 0x9F;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead == 0xF0) *lo = 0x90;
    if (lead == 0xF4) *hi = 0x8F;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;
}

/* a plain token: plain ASCII bytes and whole UTF-8 characters from U+0080 */
static bool plain_token(const kgr_vocab *v, int32_t id) {
    const uint8_t *b = (const uint8_t *)v->bytes + v->off[id];
    int64_t n = v->off[id + 1] - v->off[id];
    if (!n) return false;
    for (int64_t i = 0; i < n;) {
        if (plain_byte(b[i])) {
            i++;
            continue;
        }
        unsigned lo, hi;
        int l = utf8_lead(b[i], &lo, &hi);
        if (!l || i + l > n || b[i + 1] < lo || b[i + 1] > hi) return false;
        for (int k = 2; k < l; k++)
            if (b[i + k] < 0x80 || b[i + k] > 0xBF) return false;
        i += l;
    }
    return true;
}

void kgr_vocab_free(kgr_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->off);
    free(v->eos);
    free(v->sp_text);
    free(v->sp_off);
    free(v->sp_id);
    free(v->byte);
    free(v->depth);
    free(v->next);
    free(v->tok_head);
    free(v->tok_next);
    free(v->node);
    free(v->plain);
    free(v->rest);
    for (int b = 0; b < 128; b++) free(v->plain_first[b]);
    free(v->plain_ascii);
    free(v->plain_lo);
    free(v->plain_ids);
    free(v->rest_of);
    free(v->plain_more);
    free(v);
}

int32_t kgr_vocab_size(const kgr_vocab *v) { return v->n_vocab; }

bool kgr_vocab_is_special(const kgr_vocab *v, int32_t id) {
    unsigned char m[KGR_MARKER_LEN];
    if (id < 0 || id >= v->n_vocab || id > KGR_MAX_TOKEN_ID || v->off[id + 1] - v->off[id] != KGR_MARKER_LEN) return false;
    kgr_token_marker(id, m);
    return !memcmp(v->bytes + v->off[id], m, KGR_MARKER_LEN);
}

int32_t kgr_vocab_token_text(const kgr_vocab *v, int32_t id, char *buf, int32_t cap) {
    if (id < 0 || id >= v->n_vocab) return -1;
    int64_t n = v->off[id + 1] - v->off[id];
    if (n <= cap) memcpy(buf, v->bytes + v->off[id], (size_t)n);
    return (int32_t)n;
}

int32_t kgr_vocab_lookup(const kgr_vocab *v, const char *s, size_t n, bool *special) {
    *special = true;
    for (int32_t k = 0; k < v->n_sp; k++)
        if ((size_t)(v->sp_off[k + 1] - v->sp_off[k]) == n && !memcmp(v->sp_text + v->sp_off[k], s, n)) return v->sp_id[k];
    *special = false;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if ((size_t)(v->off[i + 1] - v->off[i]) == n && !memcmp(v->bytes + v->off[i], s, n) && !kgr_vocab_is_special(v, i))
            return i;
    return -1;
}

static const kgr_vocab *sort_vocab; /* qsort has no context argument; guarded by sort_mu */
static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const kgr_vocab *v = sort_vocab;
    int64_t nx = v->off[x + 1] - v->off[x], ny = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(nx < ny ? nx : ny));
    if (c) return c;
    if (nx != ny) return nx < ny ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Builds the trie from off/bytes (already filled): of every token, or
 * (rest) of the tokens that are not plain, into *out. */
static kiln_status build_trie(kgr_vocab *v, bool rest, struct tnode **out, int32_t *n_out) {
    int32_t n = v->n_vocab, m = 0;
    int32_t *ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
    if (!ids) return OOM;
    for (int32_t i = 0; i < n; i++)
        if (v->off[i + 1] > v->off[i] && !(rest && plain_token(v, i))) ids[m++] = i;
    pthread_mutex_lock(&sort_mu);
    sort_vocab = v;
    qsort(ids, (size_t)m, sizeof *ids, cmp_tok);
    pthread_mutex_unlock(&sort_mu);
    int64_t total = v->off[n];
    v->byte = malloc((size_t)total + 1);
    v->depth = malloc(sizeof *v->depth * (size_t)(total + 1));
    v->next = malloc(sizeof *v->next * (size_t)(total + 1));
    v->tok_head = malloc(sizeof *v->tok_head * (size_t)(total + 1));
    if (!v->tok_next) v->tok_next = malloc(sizeof *v->tok_next * (size_t)(n ? n : 1));
    int32_t maxlen = 0;
    for (int32_t i = 0; i < m; i++) {
        int64_t l = v->off[ids[i] + 1] - v->off[ids[i]];
        if (l > maxlen) maxlen = (int32_t)l;
    }
    int32_t *path = malloc(sizeof *path * (size_t)(maxlen + 2)); /* node at each depth on the current path */
    if (!v->byte || !v->depth || !v->next || !v->tok_head || !v->tok_next || !path) {
        free(ids);
        free(path);
        return OOM;
    }
    for (int32_t k = 0; k < m; k++) v->tok_next[ids[k]] = -1; /* the same chains in both tries */
    int32_t nn = 0, plen = 0; /* plen: depth of the path */
    const char *prev = NULL;
    int64_t prevn = 0;
    for (int32_t k = 0; k < m; k++) {
        int32_t id = ids[k];
        const char *s = v->bytes + v->off[id];
        int64_t l = v->off[id + 1] - v->off[id];
        int64_t lcp = 0;
        while (prev && lcp < l && lcp < prevn && s[lcp] == prev[lcp]) lcp++;
        /* close the subtrees deeper than lcp */
        for (; plen > lcp; plen--) v->next[path[plen]] = nn;
        for (int64_t d = lcp; d < l; d++) {
            v->byte[nn] = (uint8_t)s[d];
            v->depth[nn] = (int32_t)d + 1;
            v->tok_head[nn] = -1;
            path[++plen] = nn++;
        }
        /* same bytes as the previous token: chain it */
        int32_t at = path[l];
        v->tok_next[id] = v->tok_head[at];
        v->tok_head[at] = id;
        prev = s;
        prevn = l;
    }
    for (; plen > 0; plen--) v->next[path[plen]] = nn;
    *n_out = nn;
    if (!rest) v->max_depth = maxlen;
    free(path);
    free(ids);
    if (maxlen >= 65535) return kiln_error(KILN_EUNSUPPORTED, "grammar: a token of %d bytes (at most 65534)", maxlen);
    if (!(*out = malloc(sizeof **out * (size_t)(nn ? nn : 1)))) return OOM;
    for (int32_t i = 0; i < nn; i++) {
        int32_t k = v->tok_head[i];
        uint8_t f = k >= 0 && v->tok_next[k] >= 0 ? TN_MORE : 0;
        (*out)[i] = (struct tnode){v->next[i], k, (uint16_t)v->depth[i], v->byte[i], f};
    }
    /* the walk reads only the packed nodes */
    free(v->byte), free(v->depth), free(v->next), free(v->tok_head);
    v->byte = NULL, v->depth = v->next = v->tok_head = NULL;
    return NULL;
}

/* plain_lo, plain_ids and rest_of (see kgr_vocab). rest[] is node[]
 * without the plain tokens, both in preorder of the same byte order, so
 * rest's prefixes come in node[]'s order: one merge pairs them. */
static kiln_status subtree_tables(kgr_vocab *v) {
    int32_t nn = v->n_nodes;
    v->plain_lo = malloc(sizeof *v->plain_lo * ((size_t)nn + 1));
    v->plain_ids = malloc(sizeof *v->plain_ids * ((size_t)v->n_vocab + 1));
    v->rest_of = malloc(sizeof *v->rest_of * ((size_t)nn + 1));
    int32_t *path = malloc(sizeof *path * ((size_t)v->max_depth + 2)); /* rest node at each depth of the path, -1 none */
    int8_t *need = malloc((size_t)v->max_depth + 2); /* continuation bytes the prefix still needs, -1 not UTF-8 */
    int32_t *chars = malloc(sizeof *chars * ((size_t)v->max_depth + 2)); /* whole characters in the prefix */
    int32_t *up = malloc(sizeof *up * ((size_t)nn + 1));     /* each node's parent, -1 the root */
    int32_t *most = malloc(sizeof *most * ((size_t)nn + 1)); /* characters of the longest plain token below */
    int32_t *anc = malloc(sizeof *anc * ((size_t)v->max_depth + 2));
    v->plain_more = malloc(sizeof *v->plain_more * ((size_t)nn + 1));
    if (!v->plain_lo || !v->plain_ids || !v->rest_of || !path || !need || !chars || !up || !most || !anc || !v->plain_more) {
        free(path), free(need), free(chars), free(up), free(most), free(anc);
        return OOM;
    }
    chars[0] = 0;
    int32_t np = 0, j = 0;
    path[0] = 0; /* the roots match */
    need[0] = 0;
    for (int32_t i = 0; i < nn; i++) {
        struct tnode *x = &v->node[i];
        int8_t nd = need[x->depth - 1];
        unsigned lo, hi;
        if (nd > 0) nd = x->byte >= 0x80 && x->byte <= 0xBF ? nd - 1 : -1; /* the lead's ranges are plain_token's */
        else if (nd == 0) nd = x->byte < 0x80 ? 0 : utf8_lead(x->byte, &lo, &hi) ? (int8_t)(utf8_lead(x->byte, &lo, &hi) - 1) : -1;
        need[x->depth] = nd;
        if (nd == 0) x->flags |= TN_WHOLE;
        chars[x->depth] = chars[x->depth - 1] + (nd == 0);
        v->plain_more[i] = (uint16_t)chars[x->depth];
        anc[x->depth] = i;
        up[i] = x->depth > 1 ? anc[x->depth - 1] : -1;
        most[i] = -1;
        v->plain_lo[i] = np;
        for (int32_t k = x->tok; k >= 0; k = v->tok_next[k])
            if (plain_token(v, k)) v->plain_ids[np++] = k, most[i] = chars[x->depth];
        int32_t r = -1;
        if (path[x->depth - 1] >= 0 && j < v->n_rest && v->rest[j].depth == x->depth && v->rest[j].byte == x->byte) r = j++;
        v->rest_of[i] = r;
        path[x->depth] = r;
    }
    v->plain_lo[nn] = np;
    /* back to front, a node's subtree is done when it is reached (plain_more
     * holds its prefix's characters till then) */
    for (int32_t i = nn - 1; i >= 0; i--) {
        if (up[i] >= 0 && most[i] > most[up[i]]) most[up[i]] = most[i];
        v->plain_more[i] = (uint16_t)(most[i] < 0 ? 0 : most[i] - v->plain_more[i]);
    }
    free(path), free(need), free(chars), free(up), free(most), free(anc);
    if (j != v->n_rest) return kiln_error(KILN_EINTERNAL, "grammar: the vocabulary's tries disagree");
    return NULL;
}

static kiln_status vocab_finish(kgr_vocab *v, const int32_t *eos, int32_t n_eos) {
    if (n_eos > 0) {
        v->eos = malloc(sizeof *v->eos * (size_t)n_eos);
        if (!v->eos) return OOM;
        memcpy(v->eos, eos, sizeof *eos * (size_t)n_eos);
        v->n_eos = n_eos;
    }
    kiln_status st = build_trie(v, false, &v->node, &v->n_nodes);
    if (!st) st = build_trie(v, true, &v->rest, &v->n_rest);
    if (st) return st;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (!(v->plain = calloc(words ? words : 1, 4))) return OOM;
    for (int b = 0; b < 256; b++) v->root_node[b] = v->root_rest[b] = -1;
    for (int32_t i = 0; i < v->n_nodes; i = v->node[i].next) v->root_node[v->node[i].byte] = i;
    for (int32_t i = 0; i < v->n_rest; i = v->rest[i].next) v->root_rest[v->rest[i].byte] = i;
    for (unsigned b = 0; b < 128; b++)
        if (plain_byte(b) && !(v->plain_first[b] = calloc(words ? words : 1, 4))) return OOM;
    if (!(v->plain_ascii = calloc(words ? words : 1, 4))) return OOM;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (plain_token(v, i)) {
            v->plain[i >> 5] |= 1u << (i & 31);
            uint8_t b0 = (uint8_t)v->bytes[v->off[i]]; /* or a UTF-8 lead byte: walked */
            if (b0 < 128) v->plain_first[b0][i >> 5] |= 1u << (i & 31), v->plain_ascii[i >> 5] |= 1u << (i & 31);
        }
    return subtree_tables(v);
}

/* an ordinary token holding 0xFF: no grammar takes it, and it must not spell a marker */
static bool has_ff(const char *b, int64_t n) { return memchr(b, 0xFF, (size_t)n) != NULL; }

kiln_status kgr_vocab_create(const ktok *tok, int32_t n_vocab, const int32_t *eos, int32_t n_eos, kgr_vocab **out) {
    *out = NULL;
    kgr_vocab *v = calloc(1, sizeof *v);
    if (!v) return OOM;
    v->n_vocab = n_vocab;
    v->off = calloc((size_t)n_vocab + 1, sizeof *v->off);
    if (!v->off) {
        kgr_vocab_free(v);
        return OOM;
    }
    int32_t nt = ktok_vocab_size(tok);
    int64_t total = 0, sp_total = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        int32_t l = i < nt ? ktok_token_bytes(tok, i, NULL, 0) : 0;
        if (l > 0 && ktok_is_special(tok, i)) {
            sp_total += l, v->n_sp++;
            l = i <= KGR_MAX_TOKEN_ID ? KGR_MARKER_LEN : 0;
        }
        total += l > 0 ? l : 0;
        v->off[i + 1] = total;
    }
    v->bytes = malloc((size_t)total + 1);
    v->sp_text = malloc((size_t)sp_total + 1);
    v->sp_off = malloc(sizeof *v->sp_off * ((size_t)v->n_sp + 1));
    v->sp_id = malloc(sizeof *v->sp_id * ((size_t)v->n_sp + 1));
    if (!v->bytes || !v->sp_text || !v->sp_off || !v->sp_id) {
        kgr_vocab_free(v);
        return OOM;
    }
    int32_t k = 0;
    v->sp_off[0] = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        int64_t l = v->off[i + 1] - v->off[i];
        char *b = v->bytes + v->off[i];
        if (i < nt && ktok_is_special(tok, i)) {
            int32_t tl = ktok_token_bytes(tok, i, NULL, 0);
            if (tl <= 0) continue;
            ktok_token_bytes(tok, i, v->sp_text + v->sp_off[k], tl);
            v->sp_id[k] = i;
            v->sp_off[k + 1] = v->sp_off[k] + tl;
            k++;
            if (l) kgr_token_marker(i, (unsigned char *)b);
        } else if (l) {
            ktok_token_bytes(tok, i, b, (int32_t)l);
        }
    }
    /* drop the ordinary tokens holding 0xFF (their bytes packed out) */
    int64_t w = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        int64_t a = v->off[i], l = v->off[i + 1] - a;
        bool sp = i < nt && ktok_is_special(tok, i);
        if (!sp && has_ff(v->bytes + a, l)) l = 0;
        memmove(v->bytes + w, v->bytes + a, (size_t)l);
        v->off[i] = w;
        w += l;
    }
    v->off[n_vocab] = w;
    kiln_status st = vocab_finish(v, eos, n_eos);
    if (st) {
        kgr_vocab_free(v);
        return st;
    }
    *out = v;
    return NULL;
}

kiln_status kgr_vocab_from_strings(const char *const *tokens, const int32_t *lens, int32_t n, int32_t eos,
                                   kgr_vocab **out) {
    *out = NULL;
    kgr_vocab *v = calloc(1, sizeof *v);
    if (!v) return OOM;
    v->n_vocab = n;
    v->off = calloc((size_t)n + 1, sizeof *v->off);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += i == eos || has_ff(tokens[i], lens[i]) ? 0 : lens[i];
    v->bytes = malloc((size_t)total + 1);
    if (!v->off || !v->bytes) {
        kgr_vocab_free(v);
        return OOM;
    }
    total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (i != eos && !has_ff(tokens[i], lens[i])) {
            memcpy(v->bytes + total, tokens[i], (size_t)lens[i]);
            total += lens[i];
        }
        v->off[i + 1] = total;
    }
    kiln_status st = vocab_finish(v, &eos, eos >= 0 ? 1 : 0);
    if (st) {
        kgr_vocab_free(v);
        return st;
    }
    *out = v;
    return NULL;
}

kiln_status kgr_vocab_bytes(kgr_vocab **out) {
    static const unsigned char b[256] = {
#define R16(x) x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7, x + 8, x + 9, x + 10, x + 11, x + 12, x + 13, x + 14, x + 15
        R16(0), R16(16), R16(32), R16(48), R16(64), R16(80), R16(96), R16(112),
        R16(128), R16(144), R16(160), R16(176), R16(192), R16(208), R16(224), R16(240)
#undef R16
    };
    const char *t[257];
    int32_t l[257];
    for (int i = 0; i < 256; i++) t[i] = (const char *)&b[i], l[i] = 1;
    t[256] = "", l[256] = 0;
    return kgr_vocab_from_strings(t, l, 257, 256, out);
}

/* ---- index ---- */
typedef struct {
    int32_t pos, parent;
} snode;

/* A state's transitions: a byte row (n_cls bytes in ix->tr8: TR_NONE not
 * computed, 0 dead, k the target tg[k - 1]) while it has at most TG_INLINE
 * distinct targets, then a row of its own in ix->rows (row >= 0). Most
 * states are trie prefixes first met in one mask's walk, with one or two
 * live targets: a byte row is a quarter of the memory an int32 row takes
 * (first touches of new memory were most of a new state's cost). */
#define TG_INLINE 3
#define TR_NONE 0xFF
typedef struct {
    int32_t *tops; /* sorted node ids (in ix->arena, or malloc'd where own_tops) */
    int32_t n;
    int32_t row;   /* its int32 row in ix->rows; -1: the byte row */
    uint32_t hash; /* state_hash of tops and accept */
    int32_t tg[TG_INLINE];
    uint8_t n_tg;
    bool own_tops;
    bool accept;
    bool seen; /* a truncated state's: a state of its class was walked already */
    bool esc; /* a truncated state's: a stack returned past the cut (see mask classes) */
    int32_t uni; /* plain_next's answer: -2 not yet known */
    uint32_t *mask; /* a truncated state's: its class's base mask */
    struct mclass *cls; /* a truncated state's escapes; NULL: not walked yet */
} gstate;

/* Mask classes. A state's mask depends on its stacks only as deep as its
 * tokens return: the string interior of a property's value yields the same
 * mask whichever %perm members were taken below it, and at whatever depth
 * it is nested. A state S is cut to its class C: each stack kept CUT_DEPTH
 * frames deep, the rest replaced by the ESC frame (pos ESC_POS). A return
 * into ESC makes the ESC top, which takes no byte; a state holding it is
 * an escape. Walking the trie from C, a token whose path meets no escape
 * is allowed from C exactly when from S (below the cut S's stacks do the
 * same as C's; C never reaches the bottom, where S would accept), and a
 * subtree whose first state is an escape is recorded, not walked. C's
 * walk is done once; S's mask is C's base mask, plus each escape's subtree
 * walked from S's own state at that prefix. Only choices that allow are
 * made from truncated states (plain_next refuses a chain through an
 * escape), so the masks are the uncut ones bit for bit. A class is
 * walked on its second state (most are seen once), and not used where its
 * escapes' subtrees are over half the walk. Off by default
 * (kgr_mask_classes): on MaskBench few states share a class (a file's
 * uncached states are mostly at positions of their own), and a hit's
 * escapes build the same new states the plain walk would. */
#define ESC_POS INT32_MAX
#define CUT_DEPTH 3
struct mclass {
    int32_t n;      /* escapes */
    bool useless;   /* its escapes cover most of the walk: S is walked as is */
    struct mesc {
        int32_t node; /* in node[] (rest false) or rest[] */
        bool rest;
        uint16_t len; /* of the prefix, bytes[off, off + len): the path to the node's parent */
        int32_t off;
    } *e;
    uint8_t *bytes;
    /* the base mask's nonzero words (index, bits), where they are few (then
     * the state keeps no full mask) */
    uint32_t *nz;
    int32_t n_nz;
};

struct kgr_index {
    const kgr_grammar *g;
    const kgr_vocab *v;
    pthread_mutex_t mu;
    uint8_t cls[256], rep[256];
    int32_t n_cls;
    /* stack nodes, interned */
    snode *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t *node_ht;
    uint32_t node_ht_cap;
    /* states, interned */
    gstate *st;
    int32_t n_st, cap_st;
    int32_t *st_ht;
    uint32_t st_ht_cap;
    uint8_t *tr8;   /* [cap_st * n_cls]: the byte rows (see gstate) */
    int32_t *rows;  /* [n_rows * n_cls]: the int32 rows, -1 not computed */
    int32_t n_rows, cap_rows;
    /* the states' tops, packed: blocks of TOPS_BLOCK ids, never moved */
    int32_t **arena;
    int32_t n_arena, cap_arena, arena_used;
    uint64_t (*set_cls)[4]; /* [n_sets]: the byte classes each set holds */
    /* %perm frames, interned: a stack position at or past g->n_el is one */
    struct vperm {
        uint64_t used; /* members taken (repeatable ones never) */
        int32_t perm, pending; /* pending -1: a member or the end may follow; -2: a member (after SEP) */
        bool emitted;
    } *vp;
    int32_t n_vp, cap_vp;
    int32_t *vp_ht;
    uint32_t vp_ht_cap;
    /* scratch of one step */
    int32_t *work, n_work, cap_work;
    int32_t *tops, n_tops, cap_tops;
    uint64_t *seen; /* (pos, parent) keys visited, open addressing */
    uint32_t seen_cap, n_seen;
    uint32_t *seen_slots; /* [seen_cap / 2]: the slots in use, to clear only those */
    bool accept;
    int32_t *walk; /* [max_depth + 1] */
    uint32_t *pf_acc; /* [mask words]: walk_full's scratch */
    size_t mask_bytes;
    kiln_status err; /* sticky: a limit was passed */
    int32_t init;
    int32_t esc; /* the ESC node (mask classes) */
    bool classes; /* mask classes on (kgr_mask_classes at creation) */
    /* a class walk's escapes being recorded (NULL: a walk of S itself) */
    struct erec {
        struct mesc *e;
        uint8_t *bytes;
        int32_t n, cap, nb, cap_b;
        int64_t nodes; /* the escapes' subtrees' nodes */
    } *rec;
    uint8_t *path; /* [max_depth + 1]: the walk's prefix bytes by depth */
    bool groups; /* member groups on (kgr_mask_groups at creation) */
    /* member groups: each node's stack cut at its nearest %perm frame
     * (cut_id; -2 not known yet) and that frame's node (cut_key; -1 none) */
    int32_t *cut_id, *cut_key, cap_cut;
    int32_t *chain, cap_chain;
    uint64_t *grp; /* group_mask's scratch */
    int32_t cap_grp;
    uint32_t *gtmp; /* [mask words]: group_mask's scratch mask */
    /* kgr_matcher_prefetch: this index holds a reference on the shared pool (under pool.mu) */
    bool pf_user;
};

static inline uint32_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static bool grow(void **p, int32_t *cap, int32_t need, size_t elem) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, elem * (size_t)c);
    if (!q) return false;
    *p = q;
    *cap = (int32_t)c;
    return true;
}

static void set_err(kgr_index *ix, kiln_status st) {
    if (!ix->err) ix->err = st;
    else kiln_status_free(st);
}

static uint32_t node_hash(const kgr_index *ix, int32_t i) {
    return mix((uint64_t)(uint32_t)ix->nodes[i].pos << 32 | (uint32_t)ix->nodes[i].parent);
}
static uint32_t st_hash(const kgr_index *ix, int32_t i) {
    return ix->st[i].hash;
}

/* Doubles an open-addressing table of ids 0..n-1 (kept as is when out of memory). */
static void rehash(kgr_index *ix, int32_t **ht, uint32_t *cap, int32_t n, uint32_t (*hash)(const kgr_index *, int32_t)) {
    uint32_t nc = *cap * 2;
    int32_t *t = malloc(sizeof *t * nc);
    if (!t) {
        set_err(ix, OOM);
        return;
    }
    memset(t, 0xff, sizeof *t * nc);
    for (int32_t i = 0; i < n; i++) {
        uint32_t j = hash(ix, i) & (nc - 1);
        while (t[j] >= 0) j = (j + 1) & (nc - 1);
        t[j] = i;
    }
    free(*ht);
    *ht = t;
    *cap = nc;
}

/* the node (pos, parent); -1 on a limit */
static int32_t node_get(kgr_index *ix, int32_t pos, int32_t parent) {
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    uint32_t mask = ix->node_ht_cap - 1, h = mix(key) & mask;
    for (;; h = (h + 1) & mask) {
        int32_t id = ix->node_ht[h];
        if (id < 0) break;
        if (ix->nodes[id].pos == pos && ix->nodes[id].parent == parent) return id;
    }
    if (ix->n_nodes >= MAX_NODES) {
        set_err(ix, kiln_error(KILN_ELIMIT, "grammar: over %d parser stacks (the grammar is too ambiguous)", MAX_NODES));
        return -1;
    }
    if (!grow((void **)&ix->nodes, &ix->cap_nodes, ix->n_nodes + 1, sizeof *ix->nodes)) {
        set_err(ix, OOM);
        return -1;
    }
    int32_t id = ix->n_nodes++;
    ix->nodes[id] = (snode){pos, parent};
    ix->node_ht[h] = id;
    if ((uint32_t)ix->n_nodes * 2 > ix->node_ht_cap) rehash(ix, &ix->node_ht, &ix->node_ht_cap, ix->n_nodes, node_hash);
    return id;
}

static uint32_t vperm_hash(const struct vperm *v) {
    return mix(v->used * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(uint32_t)v->perm << 24) ^ ((uint64_t)(uint32_t)(v->pending + 2) << 1) ^ v->emitted);
}
static uint32_t vp_hash(const kgr_index *ix, int32_t i) { return vperm_hash(&ix->vp[i]); }

/* the stack position of the %perm frame (perm, used, emitted, pending); -1 on a limit */
static int32_t vperm_pos(kgr_index *ix, int32_t perm, uint64_t used, bool emitted, int32_t pending) {
    struct vperm key = {used, perm, pending, emitted};
    if (!ix->vp_ht) {
        ix->vp_ht_cap = 64;
        if (!(ix->vp_ht = malloc(sizeof *ix->vp_ht * ix->vp_ht_cap))) {
            set_err(ix, OOM);
            return -1;
        }
        memset(ix->vp_ht, 0xff, sizeof *ix->vp_ht * ix->vp_ht_cap);
    }
    int32_t n = ix->n_vp;
    uint32_t m = ix->vp_ht_cap - 1, h = vperm_hash(&key) & m;
    for (;; h = (h + 1) & m) {
        int32_t id = ix->vp_ht[h];
        if (id < 0) break;
        const struct vperm *v = &ix->vp[id];
        if (v->used == used && v->perm == perm && v->pending == pending && v->emitted == emitted) return ix->g->n_el + id;
    }
    if (n >= MAX_NODES || ix->g->n_el > INT32_MAX - MAX_NODES) {
        set_err(ix, kiln_error(KILN_ELIMIT, "grammar: over %d %%perm frames", MAX_NODES));
        return -1;
    }
    if (!grow((void **)&ix->vp, &ix->cap_vp, n + 1, sizeof *ix->vp)) {
        set_err(ix, OOM);
        return -1;
    }
    ix->vp[n] = key;
    ix->vp_ht[h] = n;
    ix->n_vp++;
    if ((uint32_t)ix->n_vp * 2 > ix->vp_ht_cap) rehash(ix, &ix->vp_ht, &ix->vp_ht_cap, ix->n_vp, vp_hash);
    return ix->g->n_el + n;
}

static void seen_clear(kgr_index *ix) {
    for (uint32_t i = 0; i < ix->n_seen; i++) ix->seen[ix->seen_slots[i]] = UINT64_MAX;
    ix->n_seen = 0;
}

/* true when (pos, parent) was not visited in this step (and marks it) */
static bool seen_add(kgr_index *ix, int32_t pos, int32_t parent) {
    if ((ix->n_seen + 1) * 2 > ix->seen_cap) {
        uint32_t nc = ix->seen_cap * 2;
        uint64_t *t = malloc(sizeof *t * nc);
        uint32_t *sl = malloc(sizeof *sl * (nc / 2 + 1));
        if (!t || !sl) {
            free(t);
            free(sl);
            set_err(ix, OOM);
            return false;
        }
        memset(t, 0xff, sizeof *t * nc);
        for (uint32_t i = 0; i < ix->n_seen; i++) {
            uint64_t k = ix->seen[ix->seen_slots[i]];
            uint32_t j = mix(k) & (nc - 1);
            while (t[j] != UINT64_MAX) j = (j + 1) & (nc - 1);
            t[j] = k;
            sl[i] = j;
        }
        free(ix->seen);
        free(ix->seen_slots);
        ix->seen = t;
        ix->seen_slots = sl;
        ix->seen_cap = nc;
    }
    uint64_t key = (uint64_t)(uint32_t)pos << 32 | (uint32_t)parent;
    uint32_t m = ix->seen_cap - 1, h = mix(key) & m;
    for (;; h = (h + 1) & m) {
        if (ix->seen[h] == key) return false;
        if (ix->seen[h] == UINT64_MAX) break;
    }
    ix->seen[h] = key;
    ix->seen_slots[ix->n_seen++] = h;
    return true;
}

static void work_push(kgr_index *ix, int32_t pos, int32_t parent) {
    if (!grow((void **)&ix->work, &ix->cap_work, ix->n_work + 2, sizeof *ix->work)) {
        set_err(ix, OOM);
        return;
    }
    ix->work[ix->n_work++] = pos;
    ix->work[ix->n_work++] = parent;
}

/* rule r's alternatives, each returning to node ret */
static void push_rule(kgr_index *ix, int32_t r, int32_t ret) {
    const kgr_elem *el = ix->g->el;
    int32_t s = ix->g->start[r];
    work_push(ix, s, ret);
    for (int32_t i = s; el[i].type != KE_END; i++)
        if (el[i].type == KE_ALT) work_push(ix, i + 1, ret);
}

/* returns from a rule (or %perm) whose frame's parent is parent */
static void ret_from(kgr_index *ix, int32_t parent) {
    if (parent == 0) ix->accept = true;
    else work_push(ix, ix->nodes[parent].pos, ix->nodes[parent].parent);
}

/* Expands the %perm frame vp[id] below parent: the end where the required
 * members are all there, SEP before another member once one was emitted,
 * or each member not yet taken, returning into the frame that marks it. */
static void perm_expand(kgr_index *ix, int32_t id, int32_t parent) {
    struct vperm v = ix->vp[id];
    const kgr_perm *q = &ix->g->perms[v.perm];
    if (v.pending == -1) {
        if (!(q->req & ~v.used) && (!q->nonempty || v.emitted)) ret_from(ix, parent);
        uint64_t left = ~v.used & (q->n == 64 ? ~0ull : (1ull << q->n) - 1);
        if (v.emitted) {
            if (!left) return; /* nothing may follow SEP */
            int32_t vp = vperm_pos(ix, v.perm, v.used, true, -2);
            int32_t ret = vp < 0 ? -1 : node_get(ix, vp, parent);
            if (ret >= 0) push_rule(ix, q->sep, ret);
            return;
        }
    }
    for (int32_t i = 0; i < q->n && !ix->err; i++) {
        uint64_t bit = 1ull << i;
        if (v.used & bit) continue;
        int32_t vp = vperm_pos(ix, v.perm, v.used | (q->rep & bit ? 0 : bit), true, -1);
        int32_t ret = vp < 0 ? -1 : node_get(ix, vp, parent);
        if (ret >= 0) push_rule(ix, q->member[i], ret);
    }
}

/* Expands the work list into ix->tops (stacks whose top is a byte set) and
 * ix->accept (the root rule can complete). */
static void expand(kgr_index *ix) {
    const kgr_elem *el = ix->g->el;
    while (ix->n_work && !ix->err) {
        int32_t parent = ix->work[--ix->n_work], pos = ix->work[--ix->n_work];
        if (!seen_add(ix, pos, parent)) continue;
        if (pos == ESC_POS) { /* a return past the cut */
            if (!grow((void **)&ix->tops, &ix->cap_tops, ix->n_tops + 1, sizeof *ix->tops)) {
                set_err(ix, OOM);
                return;
            }
            ix->tops[ix->n_tops++] = ix->esc;
            continue;
        }
        if (pos >= ix->g->n_el) {
            perm_expand(ix, pos - ix->g->n_el, parent);
            continue;
        }
        const kgr_elem *e = &el[pos];
        switch (e->type) {
        case KE_END:
        case KE_ALT:
            ret_from(ix, parent);
            break;
        case KE_BYTES: {
            int32_t id = node_get(ix, pos, parent);
            if (id < 0) return;
            if (ix->n_tops >= MAX_TOPS) {
                set_err(ix, kiln_error(KILN_ELIMIT, "grammar: over %d parses at once (the grammar is too ambiguous)", MAX_TOPS));
                return;
            }
            if (!grow((void **)&ix->tops, &ix->cap_tops, ix->n_tops + 1, sizeof *ix->tops)) {
                set_err(ix, OOM);
                return;
            }
            ix->tops[ix->n_tops++] = id;
            break;
        }
        case KE_REF: {
            int32_t nt = el[pos + 1].type;
            int32_t ret = nt == KE_END || nt == KE_ALT ? parent : node_get(ix, pos + 1, parent);
            if (ret < 0) return;
            push_rule(ix, e->val, ret);
            break;
        }
        case KE_PERM: {
            int32_t nt = el[pos + 1].type;
            int32_t ret = nt == KE_END || nt == KE_ALT ? parent : node_get(ix, pos + 1, parent);
            int32_t vp = ret < 0 ? -1 : vperm_pos(ix, e->val, 0, false, -1);
            if (vp < 0) return;
            work_push(ix, vp, ret);
            break;
        }
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t state_hash(const int32_t *t, int32_t n, bool acc) {
    uint64_t h = acc ? 0x9e3779b97f4a7c15ull : 0x12345;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)t[i]) * 0x100000001b3ull + (h >> 29);
    return mix(h);
}

/* room for n tops: in the arena's last block (a new one where it is full),
 * or a block of their own when they are many; NULL: out of memory */
#define TOPS_BLOCK 16384
static int32_t *tops_alloc(kgr_index *ix, int32_t n) {
    if (n > TOPS_BLOCK / 4) return malloc(sizeof(int32_t) * (size_t)n);
    if (!ix->n_arena || ix->arena_used + n > TOPS_BLOCK) {
        int32_t *b = malloc(sizeof *b * TOPS_BLOCK);
        if (!b || !grow((void **)&ix->arena, &ix->cap_arena, ix->n_arena + 1, sizeof *ix->arena)) {
            free(b);
            return NULL;
        }
        ix->arena[ix->n_arena++] = b;
        ix->arena_used = 0;
    }
    int32_t *p = ix->arena[ix->n_arena - 1] + ix->arena_used;
    ix->arena_used += n;
    return p;
}

/* Interns ix->tops/accept as a state (sorting tops); -1 on error. */
static int32_t state_intern(kgr_index *ix) {
    if (ix->err) return -1;
    if (ix->n_tops > 32) qsort(ix->tops, (size_t)ix->n_tops, sizeof *ix->tops, cmp_i32);
    else /* most states have a few tops: insertion sort, no call per compare */
        for (int32_t i = 1; i < ix->n_tops; i++) {
            int32_t x = ix->tops[i], j = i;
            for (; j > 0 && ix->tops[j - 1] > x; j--) ix->tops[j] = ix->tops[j - 1];
            ix->tops[j] = x;
        }
    int32_t n = 0; /* unique (seen_add already dedups, but keep it safe) */
    for (int32_t i = 0; i < ix->n_tops; i++)
        if (!n || ix->tops[n - 1] != ix->tops[i]) ix->tops[n++] = ix->tops[i];
    ix->n_tops = n;
    uint32_t hash = state_hash(ix->tops, n, ix->accept), m = ix->st_ht_cap - 1, h = hash & m;
    for (;; h = (h + 1) & m) {
        int32_t id = ix->st_ht[h];
        if (id < 0) break;
        const gstate *s = &ix->st[id];
        if (s->hash == hash && s->n == n && s->accept == ix->accept && !memcmp(s->tops, ix->tops, sizeof *s->tops * (size_t)n)) return id;
    }
    if (ix->n_st >= MAX_STATES) {
        set_err(ix, kiln_error(KILN_ELIMIT, "grammar: over %d parser states", MAX_STATES));
        return -1;
    }
    int32_t cap = ix->cap_st;
    if (!grow((void **)&ix->st, &ix->cap_st, ix->n_st + 1, sizeof *ix->st)) {
        set_err(ix, OOM);
        return -1;
    }
    if (ix->cap_st != cap) {
        uint8_t *t = realloc(ix->tr8, (size_t)ix->cap_st * (size_t)ix->n_cls);
        if (!t) {
            set_err(ix, OOM);
            return -1;
        }
        ix->tr8 = t;
    }
    int32_t *tops = tops_alloc(ix, n);
    if (!tops) {
        set_err(ix, OOM);
        return -1;
    }
    int32_t id = ix->n_st++;
    gstate *s = &ix->st[id];
    s->n = n;
    s->tops = tops;
    s->own_tops = n > TOPS_BLOCK / 4;
    s->row = -1;
    s->hash = hash;
    s->n_tg = 0;
    s->accept = ix->accept;
    s->uni = -2;
    s->mask = NULL;
    s->cls = NULL;
    s->seen = s->esc = false;
    for (int32_t i = 0; i < n && ix->esc > 0; i++) s->esc |= ix->tops[i] == ix->esc;
    memcpy(s->tops, ix->tops, sizeof *s->tops * (size_t)n);
    memset(&ix->tr8[(size_t)id * (size_t)ix->n_cls], TR_NONE, (size_t)ix->n_cls);
    ix->st_ht[h] = id;
    if ((uint32_t)ix->n_st * 2 > ix->st_ht_cap) rehash(ix, &ix->st_ht, &ix->st_ht_cap, ix->n_st, st_hash);
    return id;
}

static void step_begin(kgr_index *ix) {
    ix->n_work = ix->n_tops = 0;
    ix->accept = false;
    seen_clear(ix);
}

static int set_trans(kgr_index *ix, int32_t s, const uint64_t e[4], int32_t t);
/* the state after byte class c from state s (0: dead); -1 on error */
static int32_t compute(kgr_index *ix, int32_t s, int32_t c) {
    step_begin(ix);
    unsigned b = ix->rep[c];
    const gstate *gs = &ix->st[s];
    for (int32_t i = 0; i < gs->n; i++) {
        const snode *nd = &ix->nodes[gs->tops[i]];
        if (nd->pos == ESC_POS) continue; /* takes no byte */
        if (kgr_set_has(&ix->g->sets[ix->g->el[nd->pos].val], b)) work_push(ix, nd->pos + 1, nd->parent);
    }
    expand(ix);
    int32_t t = state_intern(ix);
    if (t < 0) return t;
    /* the step depends only on which tops take the byte: every class that
     * the same tops take (and the others refuse) leads to t too */
    uint64_t e[4] = {~0ull, ~0ull, ~0ull, ~0ull};
    gs = &ix->st[s]; /* state_intern may have moved the states */
    for (int32_t i = 0; i < gs->n; i++) {
        if (gs->tops[i] == ix->esc) continue;
        const uint64_t *k = ix->set_cls[ix->g->el[ix->nodes[gs->tops[i]].pos].val];
        bool in = (k[c >> 6] >> (c & 63)) & 1;
        for (int w = 0; w < 4; w++) e[w] &= in ? k[w] : ~k[w];
    }
    if (set_trans(ix, s, e, t) < 0) return -1;
    return t;
}

/* s's transitions on the classes of e lead to t; -1 out of memory */
static int set_trans(kgr_index *ix, int32_t s, const uint64_t e[4], int32_t t) {
    gstate *gs = &ix->st[s];
    size_t nc = (size_t)ix->n_cls;
    uint8_t k = 0;
    if (gs->row < 0 && t > 0) {
        while (k < gs->n_tg && gs->tg[k] != t) k++;
        if (k == gs->n_tg && k < TG_INLINE) gs->tg[gs->n_tg++] = t;
        if (k == TG_INLINE) { /* a fourth target: s gets an int32 row */
            if (!grow((void **)&ix->rows, &ix->cap_rows, ix->n_rows + 1, sizeof *ix->rows * nc)) {
                set_err(ix, OOM);
                return -1;
            }
            gs->row = ix->n_rows++;
            int32_t *row = &ix->rows[(size_t)gs->row * nc];
            const uint8_t *b = &ix->tr8[(size_t)s * nc];
            for (size_t c = 0; c < nc; c++) row[c] = b[c] == TR_NONE ? -1 : b[c] ? gs->tg[b[c] - 1] : 0;
        }
        k++;
    }
    for (int w = 0; w < 4; w++)
        for (uint64_t m = e[w]; m; m &= m - 1) {
            int32_t d = w * 64 + __builtin_ctzll(m);
            if (d >= ix->n_cls) break;
            if (gs->row >= 0) ix->rows[(size_t)gs->row * nc + (size_t)d] = t;
            else ix->tr8[(size_t)s * nc + (size_t)d] = k;
        }
    return 0;
}

static inline int32_t next_state(kgr_index *ix, int32_t s, uint8_t byte) {
    int32_t c = ix->cls[byte];
    const gstate *gs = &ix->st[s];
    int32_t t;
    if (gs->row >= 0) t = ix->rows[(size_t)gs->row * (size_t)ix->n_cls + (size_t)c];
    else {
        uint8_t k = ix->tr8[(size_t)s * (size_t)ix->n_cls + (size_t)c];
        t = k == TR_NONE ? -1 : k ? gs->tg[k - 1] : 0;
    }
    return t >= 0 ? t : compute(ix, s, c);
}

/* Whether every UTF-8 character from U+0080 leads from at to to: each
 * continuation byte is tried once per byte class. 1 yes, 0 no, -1 error. */
static int utf8_to(kgr_index *ix, int32_t at, int32_t to, int left, unsigned lo, unsigned hi) {
    uint64_t seen[4] = {0};
    for (unsigned b = lo; b <= hi; b++) {
        unsigned c = ix->cls[b];
        if ((seen[c >> 6] >> (c & 63)) & 1) continue;
        seen[c >> 6] |= 1ull << (c & 63);
        int32_t t = next_state(ix, at, (uint8_t)b);
        if (t < 0) return -1;
        if (left == 1 ? t != to : t == 0 || ix->st[t].esc) return 0;
        if (left > 1) {
            int r = utf8_to(ix, t, to, left - 1, 0x80, 0xBF);
            if (r != 1) return r;
        }
    }
    return 1;
}

/* The state every plain character (plain_byte, or a whole UTF-8 character
 * from U+0080) leads to from s, where they all lead to one live state; 0
 * where they do not; -1 on error. s is a string interior (plain_closed)
 * when that state is s itself. */
static int32_t plain_next_compute(kgr_index *ix, int32_t s) {
    if (s == 0) return 0;
    int32_t u = -1;
    uint64_t seen[4] = {0};
    for (unsigned b = 0x20; b < 0x7f; b++) {
        unsigned c = ix->cls[b];
        if (!plain_byte(b) || ((seen[c >> 6] >> (c & 63)) & 1)) continue;
        seen[c >> 6] |= 1ull << (c & 63);
        int32_t t = next_state(ix, s, (uint8_t)b);
        if (t <= 0) return t;
        if (ix->st[t].esc) return 0; /* (see mask classes) */
        if (u < 0) u = t;
        else if (t != u) return 0;
    }
    uint64_t lseen[64] = {0};
    for (unsigned lead = 0xC2; lead <= 0xF4; lead++) {
        unsigned lo, hi;
        int l = utf8_lead(lead, &lo, &hi);
        /* leads of one class, length and second-byte range behave alike */
        unsigned key = ix->cls[lead] * 16u + (unsigned)l * 4u + (lo == 0x80) * 2u + (hi == 0xBF);
        if ((lseen[key >> 6] >> (key & 63)) & 1) continue;
        lseen[key >> 6] |= 1ull << (key & 63);
        int32_t t = next_state(ix, s, (uint8_t)lead);
        if (t <= 0) return t;
        if (ix->st[t].esc) return 0;
        int r = utf8_to(ix, t, u, l - 1, lo, hi);
        if (r != 1) return r;
    }
    return u;
}

static int32_t plain_next(kgr_index *ix, int32_t s) {
    if (ix->st[s].uni >= 0) return ix->st[s].uni;
    int32_t r = plain_next_compute(ix, s);
    if (r >= 0) ix->st[s].uni = r;
    return r;
}

/* Whether s is a string interior: every plain token leads back to it. 1 yes, 0 no, -1 error. */
static int plain_closed(kgr_index *ix, int32_t s) {
    int32_t u = plain_next(ix, s);
    return u < 0 ? -1 : u == s;
}

/* Whether every string of at most need plain characters leads from s to a
 * live state (a bounded string's interior, e.g. maxLength): 1 yes, 0 no
 * (or not found within CHAIN_MAX steps), -1 error. */
#define CHAIN_MAX 64
static int plain_lives(kgr_index *ix, int32_t s, int32_t need) {
    for (int32_t k = 0; k < need; k++) {
        int32_t u = plain_next(ix, s);
        if (u <= 0) return u;
        if (u == s) return 1; /* a string interior: every length */
        if (k == CHAIN_MAX) return 0;
        s = u;
    }
    return 1;
}

/* Byte classes: bytes no set tells apart share a class (and a column of the
 * transition table). */
static void byte_classes(kgr_index *ix) {
    memset(ix->cls, 0, sizeof ix->cls);
    int32_t n = 1;
    int32_t map[512];
    for (int32_t k = 0; k < ix->g->n_sets; k++) {
        for (int32_t i = 0; i < 2 * n; i++) map[i] = -1;
        int32_t m = 0;
        for (int b = 0; b < 256; b++) {
            int32_t key = ix->cls[b] * 2 + kgr_set_has(&ix->g->sets[k], (unsigned)b);
            if (map[key] < 0) map[key] = m++;
            ix->cls[b] = (uint8_t)map[key];
        }
        n = m;
        if (n >= 256) break;
    }
    ix->n_cls = n;
    for (int b = 255; b >= 0; b--) ix->rep[ix->cls[b]] = (uint8_t)b;
}

/* set_cls: the classes refine every set, so a class's representative
 * answers for the class */
static bool set_classes(kgr_index *ix) {
    ix->set_cls = calloc((size_t)(ix->g->n_sets ? ix->g->n_sets : 1), sizeof *ix->set_cls);
    if (!ix->set_cls) return false;
    for (int32_t k = 0; k < ix->g->n_sets; k++)
        for (int32_t c = 0; c < ix->n_cls; c++)
            if (kgr_set_has(&ix->g->sets[k], ix->rep[c])) ix->set_cls[k][c >> 6] |= 1ull << (c & 63);
    return true;
}

static void pf_stop(kgr_index *ix);

static bool classes_on; /* off by default: see docs/grammar.md (exact, but no faster on MaskBench) */
void kgr_mask_classes(bool on) { __atomic_store_n(&classes_on, on, __ATOMIC_RELAXED); }
static int64_t class_hits; /* masks made from a class's (tests) */
int64_t kgr_mask_class_hits(void) { return __atomic_load_n(&class_hits, __ATOMIC_RELAXED); }
static bool groups_on = true; /* member groups (see group_mask) */
void kgr_mask_groups(bool on) { __atomic_store_n(&groups_on, on, __ATOMIC_RELAXED); }
static int64_t group_hits; /* masks made from member groups (tests) */
int64_t kgr_mask_group_hits(void) { return __atomic_load_n(&group_hits, __ATOMIC_RELAXED); }

void kgr_index_free(kgr_index *ix) {
    if (!ix) return;
    pf_stop(ix); /* (its matchers, freed first, are off its queue) */
    for (int32_t i = 0; i < ix->n_st; i++) {
        if (ix->st[i].own_tops) free(ix->st[i].tops);
        free(ix->st[i].mask);
        if (ix->st[i].cls) free(ix->st[i].cls->e), free(ix->st[i].cls->bytes), free(ix->st[i].cls->nz), free(ix->st[i].cls);
    }
    free(ix->st);
    free(ix->st_ht);
    free(ix->tr8);
    free(ix->rows);
    for (int32_t i = 0; i < ix->n_arena; i++) free(ix->arena[i]);
    free(ix->arena);
    free(ix->set_cls);
    free(ix->nodes);
    free(ix->node_ht);
    free(ix->work);
    free(ix->tops);
    free(ix->seen);
    free(ix->seen_slots);
    free(ix->walk);
    free(ix->path);
    free(ix->pf_acc);
    free(ix->vp);
    free(ix->vp_ht);
    free(ix->cut_id);
    free(ix->cut_key);
    free(ix->chain);
    free(ix->grp);
    free(ix->gtmp);
    kiln_status_free(ix->err);
    pthread_mutex_destroy(&ix->mu);
    free(ix);
}

kiln_status kgr_index_create(const kgr_grammar *g, const kgr_vocab *v, kgr_index **out) {
    *out = NULL;
    kgr_index *ix = calloc(1, sizeof *ix);
    if (!ix) return OOM;
    pthread_mutex_init(&ix->mu, NULL);
    ix->g = g;
    ix->v = v;
    for (int32_t i = 0; i < g->n_tok_refs; i++)
        if (!kgr_vocab_is_special(v, g->tok_refs[i])) {
            int32_t id = g->tok_refs[i];
            kgr_index_free(ix);
            return kiln_error(KILN_EINVAL, "grammar: token <[%d]> is not a special token of the model's vocabulary "
                                           "(an ordinary token is matched by its text: write it as a literal)", id);
        }
    byte_classes(ix);
    if (!set_classes(ix)) {
        kgr_index_free(ix);
        return OOM;
    }
    ix->node_ht_cap = 1024;
    ix->st_ht_cap = 256;
    ix->seen_cap = 256;
    ix->node_ht = malloc(sizeof *ix->node_ht * ix->node_ht_cap);
    ix->st_ht = malloc(sizeof *ix->st_ht * ix->st_ht_cap);
    ix->seen = malloc(sizeof *ix->seen * ix->seen_cap);
    ix->seen_slots = malloc(sizeof *ix->seen_slots * (ix->seen_cap / 2 + 1));
    ix->walk = malloc(sizeof *ix->walk * (size_t)(v->max_depth + 2));
    ix->path = malloc((size_t)v->max_depth + 2);
    ix->pf_acc = malloc(((size_t)v->n_vocab + 31) / 32 * 4 + 4);
    ix->cap_tops = 64;
    ix->tops = malloc(sizeof *ix->tops * (size_t)ix->cap_tops); /* never NULL: memcmp/memcpy of 0 tops */
    if (!ix->tops || !ix->node_ht || !ix->st_ht || !ix->seen || !ix->seen_slots || !ix->walk || !ix->path || !ix->pf_acc) {
        kgr_index_free(ix);
        return OOM;
    }
    memset(ix->node_ht, 0xff, sizeof *ix->node_ht * ix->node_ht_cap);
    memset(ix->st_ht, 0xff, sizeof *ix->st_ht * ix->st_ht_cap);
    memset(ix->seen, 0xff, sizeof *ix->seen * ix->seen_cap);
    node_get(ix, -1, -1); /* node 0: the bottom of every stack */
    ix->esc = node_get(ix, ESC_POS, -1);
    ix->classes = __atomic_load_n(&classes_on, __ATOMIC_RELAXED);
    ix->groups = __atomic_load_n(&groups_on, __ATOMIC_RELAXED);
    step_begin(ix);       /* state 0: dead */
    int32_t dead = state_intern(ix);
    step_begin(ix);
    work_push(ix, g->start[g->root], 0);
    for (int32_t i = g->start[g->root]; g->el[i].type != KE_END; i++)
        if (g->el[i].type == KE_ALT) work_push(ix, i + 1, 0);
    expand(ix);
    ix->init = state_intern(ix);
    if (ix->err || dead != 0) {
        kiln_status st = ix->err ? ix->err : kiln_error(KILN_EINTERNAL, "grammar: dead state is not 0");
        ix->err = NULL;
        kgr_index_free(ix);
        return st;
    }
    if (ix->init == 0) {
        kgr_index_free(ix);
        return kiln_error(KILN_EINVAL, "grammar: it matches nothing");
    }
    *out = ix;
    return NULL;
}

/* the tokens ending at node x into bits (tok_next read only where there are several) */
static inline void set_tokens(const kgr_vocab *v, const struct tnode *x, uint32_t *bits) {
    int32_t k = x->tok;
    if (k < 0) return;
    bits[k >> 5] |= 1u << (k & 31);
    if (x->flags & TN_MORE)
        for (k = v->tok_next[k]; k >= 0; k = v->tok_next[k]) bits[k >> 5] |= 1u << (k & 31);
}

/* A class walk (ix->rec) met an escape at node i of nd (the prefix to its
 * parent in ix->path): recorded, its subtree left to each state's walk. */
static void rec_escape(kgr_index *ix, const struct tnode *nd, int32_t i) {
    struct erec *r = ix->rec;
    int32_t len = nd[i].depth - 1;
    if (!grow((void **)&r->e, &r->cap, r->n + 1, sizeof *r->e) || !grow((void **)&r->bytes, &r->cap_b, r->nb + len + 1, 1)) {
        set_err(ix, OOM);
        return;
    }
    r->e[r->n++] = (struct mesc){i, nd == ix->v->rest, (uint16_t)len, r->nb};
    memcpy(r->bytes + r->nb, ix->path, (size_t)len);
    r->nb += len;
    r->nodes += nd[i].next - i;
}

/* Sets the bits of the tokens in nd[from, to) (one subtree's nodes, the
 * first at depth d, entered from state s at depth d - 1) that s allows; -1 on error. */
static int walk_trie(kgr_index *ix, const struct tnode *nd, int32_t from, int32_t to, int32_t s, uint32_t *bits) {
    const kgr_vocab *v = ix->v;
    int32_t *stk = ix->walk;
    if (from >= to) return 0;
    stk[nd[from].depth - 1] = s;
    for (int32_t i = from; i < to;) {
        const struct tnode *x = &nd[i];
        int32_t t = next_state(ix, stk[x->depth - 1], x->byte);
        if (t < 0) return -1;
        if (t == 0) {
            i = x->next;
            continue;
        }
        if (ix->rec) {
            if (ix->st[t].esc) {
                rec_escape(ix, nd, i);
                i = x->next;
                continue;
            }
            ix->path[x->depth - 1] = x->byte;
        }
        stk[x->depth] = t;
        set_tokens(v, x, bits);
        i++;
    }
    return ix->err ? -1 : 0;
}


/* 32 bytes at a time (GCC's vector extension: SSE2 pairs on baseline
 * x86-64; -O2 leaves the plain loop scalar) */
typedef uint32_t v8u32 __attribute__((vector_size(32)));
/* dst |= src (andnot: dst &= ~src) over words */
static void combine_bits(uint32_t *restrict dst, const uint32_t *restrict src, size_t words, bool andnot) {
    size_t k = 0;
    for (; k + 8 <= words; k += 8) {
        v8u32 a, b;
        memcpy(&a, dst + k, sizeof a);
        memcpy(&b, src + k, sizeof b);
        a = andnot ? a & ~b : a | b;
        memcpy(dst + k, &a, sizeof a);
    }
    for (; k < words; k++) dst[k] = andnot ? dst[k] & ~src[k] : dst[k] | src[k];
}

/* Below a subtree of this many nodes, walking it costs less than asking
 * whether its prefix leads into a string interior, unless that is known
 * already (and above SHORTCUT_KNOWN nodes). */
#define SHORTCUT_NODES 256
#define SHORTCUT_KNOWN 4

/* walk_trie over node[] (the whole vocabulary), where a large subtree
 * whose prefix leads into a string interior (plain_closed) is not walked:
 * its plain tokens are all allowed (plain_first or plain_ids) and only its
 * other tokens (rest[]) are walked. -1 on error. */
static int walk_full(kgr_index *ix, int32_t from, int32_t to, int32_t s, uint32_t *bits) {
    const kgr_vocab *v = ix->v;
    const struct tnode *nd = v->node;
    int32_t *stk = ix->walk;
    uint64_t pf[2] = {0, 0}; /* first bytes whose plain_first is allowed */
    if (from >= to) return 0;
    stk[nd[from].depth - 1] = s;
    for (int32_t i = from; i < to;) {
        const struct tnode *x = &nd[i];
        int32_t t = next_state(ix, stk[x->depth - 1], x->byte);
        if (t < 0) return -1;
        if (t == 0) {
            i = x->next;
            continue;
        }
        if (ix->rec) {
            if (ix->st[t].esc) {
                rec_escape(ix, nd, i);
                if (ix->err) return -1;
                i = x->next;
                continue;
            }
            ix->path[x->depth - 1] = x->byte;
        }
        /* the prefix ends a character: the rest of a plain token below is
         * whole characters, which a string interior takes */
        int32_t size = x->next - i;
        if ((x->flags & TN_WHOLE) && size >= SHORTCUT_KNOWN && (size >= SHORTCUT_NODES || ix->st[t].uni == t)) {
            int pc = plain_lives(ix, t, v->plain_more[i]);
            if (pc < 0) return -1;
            if (pc == 1) {
                if (x->depth == 1 && v->plain_first[x->byte])
                    pf[x->byte >> 6] |= 1ull << (x->byte & 63); /* at the end */
                else
                    for (int32_t k = v->plain_lo[i]; k < v->plain_lo[x->next]; k++)
                        bits[v->plain_ids[k] >> 5] |= 1u << (v->plain_ids[k] & 31);
                int32_t r = v->rest_of[i];
                if (r >= 0) {
                    set_tokens(v, &v->rest[r], bits);
                    if (walk_trie(ix, v->rest, r + 1, v->rest[r].next, t, bits) < 0) return -1;
                }
                i = x->next;
                continue;
            }
        }
        stk[x->depth] = t;
        set_tokens(v, x, bits);
        i++;
    }
    /* the plain_first sets are disjoint and make up plain_ascii: where most
     * are allowed, plain_ascii without the others is fewer passes */
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    int n = __builtin_popcountll(pf[0]) + __builtin_popcountll(pf[1]), n_all = 0;
    for (int b = 0; b < 128; b++) n_all += v->plain_first[b] != NULL;
    if (n * 2 <= n_all) {
        for (int b = 0; b < 128; b++)
            if ((pf[b >> 6] >> (b & 63)) & 1) combine_bits(bits, v->plain_first[b], words, false);
    } else {
        uint32_t *acc = ix->pf_acc;
        memcpy(acc, v->plain_ascii, words * 4);
        for (int b = 0; b < 128; b++)
            if (v->plain_first[b] && !((pf[b >> 6] >> (b & 63)) & 1)) combine_bits(acc, v->plain_first[b], words, true);
        combine_bits(bits, acc, words, false);
    }
    return 0;
}

static kiln_status mask_fail(kgr_index *ix, uint32_t *bits, size_t words) {
    memset(bits, 0, words * 4);
    return kiln_error(kiln_status_code(ix->err), "%s", kiln_status_msg(ix->err));
}

/* s's tokens into bits (cleared first): the plain tokens at once where
 * every one leads back to s, else the whole trie (the same way below a
 * prefix that leads into such a state); -1 on error. With ix->rec, escapes
 * are recorded; *nodes: the trie walked (for a class's worth). */
static int walk_state(kgr_index *ix, int32_t s, uint32_t *bits, int64_t *nodes) {
    const kgr_vocab *v = ix->v;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    memset(bits, 0, words * 4);
    int pc = plain_closed(ix, s);
    if (pc < 0) return -1;
    if (pc == 1) {
        memcpy(bits, v->plain, words * 4);
        *nodes = v->n_rest;
        return walk_trie(ix, v->rest, 0, v->n_rest, s, bits);
    }
    *nodes = v->n_nodes;
    return walk_full(ix, 0, v->n_nodes, s, bits);
}

/* node id's stack kept CUT_DEPTH frames below its top, the rest ESC
 * (*cut set where anything was cut); -1 on a limit */
static int32_t cut_node(kgr_index *ix, int32_t id, bool *cut) {
    int32_t chain[CUT_DEPTH + 1];
    int k = 0;
    while (id != 0 && k <= CUT_DEPTH) chain[k++] = id, id = ix->nodes[id].parent;
    int32_t below = 0;
    if (id != 0) below = ix->esc, *cut = true;
    while (k-- > 0 && below >= 0) below = node_get(ix, ix->nodes[chain[k]].pos, below);
    return below;
}

/* s's class: s cut (see mask classes), or s itself where nothing is cut; -1 on error */
static int32_t class_of(kgr_index *ix, int32_t s) {
    step_begin(ix);
    bool cut = false;
    for (int32_t i = 0; i < ix->st[s].n; i++) {
        int32_t t = cut_node(ix, ix->st[s].tops[i], &cut);
        if (t < 0 || !grow((void **)&ix->tops, &ix->cap_tops, ix->n_tops + 1, sizeof *ix->tops)) {
            if (t >= 0) set_err(ix, OOM);
            return -1;
        }
        ix->tops[ix->n_tops++] = t;
    }
    return cut ? state_intern(ix) : s;
}

/* class c's base mask and escapes, walked once (into bits, scratch); -1 on error */
static int class_walk(kgr_index *ix, int32_t c, uint32_t *bits, size_t words) {
    struct erec r = {0};
    int64_t walked = 0;
    ix->rec = &r;
    int rc = walk_state(ix, c, bits, &walked);
    ix->rec = NULL;
    struct mclass *k = calloc(1, sizeof *k);
    bool kept = false;
    if (rc >= 0 && k && !(k->useless = r.nodes * 2 > walked)) {
        int32_t nz = 0;
        for (size_t w = 0; w < words; w++) nz += bits[w] != 0;
        if ((size_t)nz * 8 <= words) { /* few words: kept sparse */
            if ((k->nz = malloc(sizeof *k->nz * (size_t)(2 * nz + 1)))) {
                for (size_t w = 0; w < words; w++)
                    if (bits[w]) k->nz[2 * k->n_nz] = (uint32_t)w, k->nz[2 * k->n_nz + 1] = bits[w], k->n_nz++;
                kept = true;
            }
        } else if (ix->mask_bytes + words * 4 <= MAX_MASK_BYTES && (ix->st[c].mask = malloc(words * 4))) {
            memcpy(ix->st[c].mask, bits, words * 4);
            ix->mask_bytes += words * 4;
            kept = true;
        }
    }
    if (k) k->useless |= !kept, k->n = r.n, k->e = r.e, k->bytes = r.bytes;
    else free(r.e), free(r.bytes), set_err(ix, OOM);
    ix->st[c].cls = k;
    return rc < 0 || !k ? -1 : 0;
}

/* bits |= class c's base mask */
static void class_base(kgr_index *ix, int32_t c, uint32_t *bits, size_t words) {
    const struct mclass *k = ix->st[c].cls;
    if (ix->st[c].mask) combine_bits(bits, ix->st[c].mask, words, false);
    else
        for (int32_t i = 0; i < k->n_nz; i++) bits[k->nz[2 * i]] |= k->nz[2 * i + 1];
}

/* s's mask from its class's (kgr_index.classes): 1 done, 0 the class does
 * not help (walk s itself), -1 on error */
static int class_mask(kgr_index *ix, int32_t s, uint32_t *bits, size_t words) {
    const kgr_vocab *v = ix->v;
    int32_t c = class_of(ix, s);
    if (c < 0) return -1;
    if (c == s || c == 0) return 0;
    if (!ix->st[c].cls && !ix->st[c].seen) { /* a class seen once is not worth a walk of its own */
        ix->st[c].seen = true;
        return 0;
    }
    if (!ix->st[c].cls && class_walk(ix, c, bits, words) < 0) return -1;
    const struct mclass *k = ix->st[c].cls;
    if (k->useless) return 0;
    __atomic_add_fetch(&class_hits, 1, __ATOMIC_RELAXED);
    class_base(ix, c, bits, words); /* (bits cleared by state_mask) */
    for (int32_t i = 0; i < k->n; i++) {
        const struct mesc *e = &k->e[i];
        int32_t p = s;
        for (int32_t j = 0; j < e->len && p > 0; j++) p = next_state(ix, p, k->bytes[e->off + j]);
        if (p < 0) return -1;
        if (p == 0) continue; /* (cannot be: the class lives there) */
        int rc = e->rest ? walk_trie(ix, v->rest, e->node, v->rest[e->node].next, p, bits)
                         : walk_full(ix, e->node, v->node[e->node].next, p, bits);
        if (rc < 0) return -1;
        k = ix->st[c].cls; /* (the states may have moved; the class did not) */
    }
    return 1;
}

/* Member groups. Below a %perm frame a stack's tokens depend on the frame
 * (the members taken) only where they return into it, past the member's
 * value: a key's letters, a value's interior do not. So a state is split
 * by the %perm frame nearest each top (the member it is in), each group
 * cut there (the frame and below one ESC frame, as mask classes do): the
 * group's cut state is the same whichever members were taken before, in
 * every object of that type, and its walk (base mask and escapes) is made
 * once. A state's mask is the union of its groups' (a token is allowed
 * where one of the parses takes it), each a cut state's base mask, plus
 * every escape's subtree walked from the state itself at that prefix;
 * tops under no %perm frame are a group of their own, uncut. Exact, bit
 * for bit, as mask classes are; what it saves is the building of new
 * states for each set of members taken (an object's key after each comma
 * was a full walk that built a state for every prefix of every key). */

/* cut_id and cut_key cover every node (new ones not known yet); false out of memory */
static bool cut_room(kgr_index *ix) {
    if (ix->cap_cut >= ix->n_nodes) return true;
    int32_t old = ix->cap_cut, c2 = old;
    if (!grow((void **)&ix->cut_id, &c2, ix->n_nodes, sizeof *ix->cut_id) ||
        !grow((void **)&ix->cut_key, &ix->cap_cut, ix->n_nodes, sizeof *ix->cut_key) || c2 != ix->cap_cut) {
        set_err(ix, OOM);
        return false;
    }
    for (int32_t i = old; i < ix->cap_cut; i++) ix->cut_id[i] = -2;
    return true;
}

/* node id's stack cut at its nearest %perm frame into *cut, that frame's
 * node into *key (-1: none, *cut is id); -1 on a limit */
static int perm_cut(kgr_index *ix, int32_t id, int32_t *cut, int32_t *key) {
    if (!cut_room(ix)) return -1;
    int32_t n = 0, x = id;
    for (;;) { /* up to a known node, a %perm frame or the bottom */
        if (ix->cut_id[x] != -2) break;
        int32_t pos = ix->nodes[x].pos;
        if (x == 0) {
            ix->cut_id[0] = 0, ix->cut_key[0] = -1;
            break;
        }
        if (pos >= ix->g->n_el && pos != ESC_POS) {
            ix->cut_id[x] = ix->esc, ix->cut_key[x] = x;
            break;
        }
        if (!grow((void **)&ix->chain, &ix->cap_chain, n + 1, sizeof *ix->chain)) {
            set_err(ix, OOM);
            return -1;
        }
        ix->chain[n++] = x;
        x = ix->nodes[x].parent;
    }
    while (n-- > 0) {
        int32_t y = ix->chain[n], p = ix->nodes[y].parent;
        int32_t k = ix->cut_key[p], c = k < 0 ? y : node_get(ix, ix->nodes[y].pos, ix->cut_id[p]);
        if (c < 0) return -1;
        if (!cut_room(ix)) return -1; /* (node_get made nodes) */
        ix->cut_id[y] = c, ix->cut_key[y] = k;
    }
    *cut = ix->cut_id[id], *key = ix->cut_key[id];
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* keeps a copy of bits as s's mask, within the index's bound (else none) */
static void keep_mask(kgr_index *ix, int32_t s, const uint32_t *bits, size_t words) {
    if (ix->mask_bytes + words * 4 > MAX_MASK_BYTES) return;
    uint32_t *c = malloc(words * 4);
    if (!c) return;
    memcpy(c, bits, words * 4);
    ix->st[s].mask = c;
    ix->mask_bytes += words * 4;
}

/* s's plain walk's mask, cached (a group's state: no EOS, it never accepts); NULL on error */
static const uint32_t *plain_mask(kgr_index *ix, int32_t s, uint32_t *scratch, size_t words) {
    if (ix->st[s].mask) return ix->st[s].mask;
    int64_t walked;
    if (walk_state(ix, s, scratch, &walked) < 0) return NULL;
    keep_mask(ix, s, scratch, words);
    return scratch;
}

/* s's mask from its member groups into bits (cleared): 1 done, 0 s has no
 * %perm frame (walk it), -1 on error */
static int group_mask(kgr_index *ix, int32_t s, uint32_t *bits, size_t words) {
    const kgr_vocab *v = ix->v;
    int32_t n = ix->st[s].n;
    if (!grow((void **)&ix->grp, &ix->cap_grp, n + 1, sizeof *ix->grp)) {
        set_err(ix, OOM);
        return -1;
    }
    bool any = false;
    for (int32_t i = 0; i < n; i++) {
        int32_t cut, key;
        if (perm_cut(ix, ix->st[s].tops[i], &cut, &key) < 0) return -1;
        any |= key >= 0;
        /* by group (key + 1), the uncut top kept beside: (key + 1) << 32 | i */
        ix->grp[i] = (uint64_t)(uint32_t)(key + 1) << 32 | (uint32_t)i;
    }
    if (!any) return 0;
    qsort(ix->grp, (size_t)n, sizeof *ix->grp, cmp_u64);
    if (!ix->gtmp && !(ix->gtmp = malloc(words * 4))) {
        set_err(ix, OOM);
        return -1;
    }
    uint32_t *tmp = ix->gtmp;
    int32_t rc = 0;
    for (int32_t a = 0; a < n && rc >= 0;) {
        int32_t b = a, key = (int32_t)(ix->grp[a] >> 32) - 1;
        while (b < n && (int32_t)(ix->grp[b] >> 32) - 1 == key) b++;
        /* the group's cut state (uncut where no frame) */
        step_begin(ix);
        for (int32_t j = a; j < b && rc >= 0; j++) {
            int32_t top = ix->st[s].tops[(uint32_t)ix->grp[j]];
            if (!grow((void **)&ix->tops, &ix->cap_tops, ix->n_tops + 1, sizeof *ix->tops)) set_err(ix, OOM), rc = -1;
            else ix->tops[ix->n_tops++] = key < 0 ? top : ix->cut_id[top];
        }
        int32_t c = rc < 0 ? -1 : state_intern(ix);
        if (c < 0) {
            rc = -1;
            break;
        }
        if (key >= 0 && !ix->st[c].cls && class_walk(ix, c, tmp, words) < 0) {
            rc = -1;
            break;
        }
        if (key >= 0 && !ix->st[c].cls->useless) {
            class_base(ix, c, bits, words);
            for (int32_t e = 0; e < ix->st[c].cls->n && rc >= 0; e++) {
                const struct mclass *k = ix->st[c].cls; /* (the states may move; the class does not) */
                const struct mesc *x = &k->e[e];
                int32_t p = s;
                for (int32_t j = 0; j < x->len && p > 0; j++) p = next_state(ix, p, k->bytes[x->off + j]);
                if (p < 0) rc = -1;
                else if (p > 0 && (x->rest ? walk_trie(ix, v->rest, x->node, v->rest[x->node].next, p, bits)
                                           : walk_full(ix, x->node, v->node[x->node].next, p, bits)) < 0)
                    rc = -1;
            }
            if (rc < 0) break;
        } else {
            if (key >= 0) { /* the cut does not help: the group uncut */
                step_begin(ix);
                for (int32_t j = a; j < b; j++) {
                    if (!grow((void **)&ix->tops, &ix->cap_tops, ix->n_tops + 1, sizeof *ix->tops)) {
                        set_err(ix, OOM);
                        rc = -1;
                        break;
                    }
                    ix->tops[ix->n_tops++] = ix->st[s].tops[(uint32_t)ix->grp[j]];
                }
                c = rc < 0 ? -1 : state_intern(ix);
                if (c < 0) {
                    rc = -1;
                    break;
                }
            }
            const uint32_t *m = c == s ? NULL : plain_mask(ix, c, tmp, words);
            if (c == s) return 0; /* one group, uncut: s itself */
            if (!m) {
                rc = -1;
                break;
            }
            combine_bits(bits, m, words, false);
        }
        a = b;
    }
    if (rc < 0 || ix->err) return -1;
    __atomic_add_fetch(&group_hits, 1, __ATOMIC_RELAXED);
    return 1;
}

/* mask of state s into bits (ix->mu held) */
static kiln_status state_mask(kgr_index *ix, int32_t s, uint32_t *bits) {
    const kgr_vocab *v = ix->v;
    size_t words = ((size_t)v->n_vocab + 31) / 32;
    if (ix->st[s].mask) {
        memcpy(bits, ix->st[s].mask, words * 4);
        return NULL;
    }
    memset(bits, 0, words * 4);
    if (ix->err) return kiln_error(kiln_status_code(ix->err), "%s", kiln_status_msg(ix->err));
    int done = ix->classes ? class_mask(ix, s, bits, words) : ix->groups ? group_mask(ix, s, bits, words) : 0;
    int64_t walked;
    if (done < 0 || (!done && walk_state(ix, s, bits, &walked) < 0)) return mask_fail(ix, bits, words);
    if (ix->st[s].accept)
        for (int32_t k = 0; k < v->n_eos; k++)
            if (v->eos[k] >= 0 && v->eos[k] < v->n_vocab) bits[v->eos[k] >> 5] |= 1u << (v->eos[k] & 31);
    keep_mask(ix, s, bits, words);
    return NULL;
}

/* ---- matcher ---- */
enum { PF_IDLE, PF_QUEUED, PF_RUNNING };

struct kgr_matcher {
    kgr_index *ix;
    int32_t state;
    bool ended; /* EOS accepted */
    /* st[state].accept, and whether no stack is left: copied under mu, so
     * that can_end and done read no index state (a worker may be growing
     * ix->st meanwhile) */
    bool accept, closed;
    kgr_grammar *own_g; /* kgr_matcher_create_owned: freed with the matcher */
    kgr_index *own_ix;
    uint32_t *buf;     /* kgr_matcher_mask_ref's mask where the index keeps none */
    int32_t buf_state; /* the state whose mask buf holds; -1: none */
    /* kgr_matcher_prefetch: pf (PF_*) and pf_next under pool.mu; pf_used
     * (the owner's) once the matcher has been handed to the worker */
    int pf;
    bool pf_used;
    struct kgr_matcher *pf_next;
};

/* mu held */
static void set_state(kgr_matcher *m, int32_t s) {
    m->state = s;
    m->accept = m->ix->st[s].accept;
    m->closed = m->ix->st[s].n == 0;
}

/* The mask of m's state (mu held, m->buf allocated): the index's cached
 * one, the one buf already holds, or computed into buf. *bits borrowed. */
static kiln_status fill(kgr_matcher *m, const uint32_t **bits) {
    kgr_index *ix = m->ix;
    const uint32_t *c = ix->st[m->state].mask;
    if (!c && m->buf_state == m->state) c = m->buf;
    kiln_status st = NULL;
    if (!c) {
        m->buf_state = -1;
        st = state_mask(ix, m->state, m->buf);
        if (!st) m->buf_state = m->state;
        c = ix->st[m->state].mask; /* kept now (unless over the cache's bound) */
    }
    *bits = c && !st ? c : m->buf;
    return st;
}

/* The prefetch pool: a few worker threads shared by every index of the
 * process (a server with many constrained sequences runs at most
 * pool_max() of them, not one per sequence), started on demand and joined
 * when the last index that used them is freed. It is the module's one
 * piece of global state: kgr_matcher_prefetch takes no pool argument, and
 * its callers (the scheduler, the tool-call path) share one bound. pool.mu
 * guards the queue, the counts and each matcher's pf and pf_next; it is
 * never held while an index's mu is taken, so there is no lock order. */
#define POOL_MAX 8
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    kgr_matcher *head, *tail;
    pthread_t th[POOL_MAX];
    int n_th, n_idle, n_queued, users;
    bool quit;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

/* spare cores (one is the caller's forward pass), at least 1, at most POOL_MAX */
static int pool_max(void) {
    static int n;
    int k = __atomic_load_n(&n, __ATOMIC_RELAXED);
    if (!k) {
        long c = sysconf(_SC_NPROCESSORS_ONLN) - 1;
        k = c < 1 ? 1 : c > POOL_MAX ? POOL_MAX : (int)c;
        __atomic_store_n(&n, k, __ATOMIC_RELAXED);
    }
    return k;
}

int kgr_pool_threads(void) {
    pthread_mutex_lock(&pool.mu);
    int n = pool.n_th;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

/* A worker: computes the queued matchers' masks (of any index), one at a
 * time, under that index's mu as any caller would, so the masks are the
 * same, only computed earlier. */
static void *pf_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&pool.mu);
    for (;;) {
        while (!pool.head && !pool.quit) {
            pool.n_idle++;
            pthread_cond_wait(&pool.work, &pool.mu);
            pool.n_idle--;
        }
        if (pool.quit) break;
        kgr_matcher *m = pool.head;
        pool.head = m->pf_next;
        if (!pool.head) pool.tail = NULL;
        pool.n_queued--;
        m->pf = PF_RUNNING;
        pthread_mutex_unlock(&pool.mu);
        kgr_index *ix = m->ix;
        const uint32_t *bits;
        pthread_mutex_lock(&ix->mu);
        kiln_status_free(fill(m, &bits)); /* an error is sticky: the owner's call gives it again */
        pthread_mutex_unlock(&ix->mu);
        pthread_mutex_lock(&pool.mu);
        m->pf = PF_IDLE;
        pthread_cond_broadcast(&pool.done);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

/* Takes m back from the pool: off the queue, or its mask waited for. */
static void pf_join(kgr_matcher *m) {
    if (!m->pf_used) return;
    pthread_mutex_lock(&pool.mu);
    if (m->pf == PF_QUEUED) {
        kgr_matcher **pp = &pool.head, *prev = NULL;
        while (*pp != m) prev = *pp, pp = &(*pp)->pf_next;
        *pp = m->pf_next;
        if (pool.tail == m) pool.tail = prev;
        pool.n_queued--;
        m->pf = PF_IDLE;
    }
    while (m->pf == PF_RUNNING) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
}

/* ix is freed (its matchers, freed first, have no job left): the last
 * user's release stops and joins the workers. */
static void pf_stop(kgr_index *ix) {
    pthread_t th[POOL_MAX];
    int n = 0;
    pthread_mutex_lock(&pool.mu);
    if (ix->pf_user && --pool.users == 0 && pool.n_th) {
        pool.quit = true; /* no thread starts till they are joined */
        pthread_cond_broadcast(&pool.work);
        n = pool.n_th;
        memcpy(th, pool.th, sizeof *th * (size_t)n);
        pool.n_th = 0;
    }
    pthread_mutex_unlock(&pool.mu);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    if (n) {
        pthread_mutex_lock(&pool.mu);
        pool.quit = false;
        if (pool.head) pthread_cond_broadcast(&pool.work); /* (none: no user was left) */
        pthread_mutex_unlock(&pool.mu);
    }
}

kiln_status kgr_matcher_prefetch(kgr_matcher *m) {
    kgr_index *ix = m->ix;
    if (m->ended) return NULL;
    if (!m->buf && !(m->buf = malloc(((size_t)ix->v->n_vocab + 31) / 32 * 4))) return OOM;
    if (!pthread_mutex_trylock(&ix->mu)) { /* (busy: the worker sees for itself) */
        bool have = ix->st[m->state].mask || m->buf_state == m->state || ix->err;
        pthread_mutex_unlock(&ix->mu);
        if (have) return NULL;
    }
    pthread_mutex_lock(&pool.mu);
    if (!ix->pf_user) ix->pf_user = true, pool.users++;
    if (m->pf == PF_IDLE) {
        m->pf = PF_QUEUED;
        m->pf_next = NULL;
        if (pool.tail) pool.tail->pf_next = m;
        else pool.head = m;
        pool.tail = m;
        pool.n_queued++;
        m->pf_used = true;
        /* a worker for it: an idle one not yet woken for another job, else a
         * new one while under the bound, else the next free one (none at
         * all: the owner computes it when asked, as without prefetch) */
        if (pool.n_idle >= pool.n_queued) pthread_cond_signal(&pool.work);
        else if (!pool.quit && pool.n_th < pool_max() && !pthread_create(&pool.th[pool.n_th], NULL, pf_main, NULL))
            pool.n_th++;
        else if (pool.n_idle) pthread_cond_signal(&pool.work);
    }
    pthread_mutex_unlock(&pool.mu);
    return NULL;
}

kiln_status kgr_matcher_create(kgr_index *ix, kgr_matcher **out) {
    kgr_matcher *m = *out = calloc(1, sizeof **out);
    if (!m) return OOM;
    m->ix = ix;
    m->buf_state = -1;
    pthread_mutex_lock(&ix->mu);
    set_state(m, ix->init);
    pthread_mutex_unlock(&ix->mu);
    return NULL;
}

kiln_status kgr_matcher_create_owned(kgr_grammar *g, const kgr_vocab *v, kgr_matcher **out) {
    *out = NULL;
    kgr_index *ix;
    kiln_status st = kgr_index_create(g, v, &ix);
    if (st) {
        kgr_grammar_free(g);
        return st;
    }
    st = kgr_matcher_create(ix, out);
    if (st) {
        kgr_index_free(ix);
        kgr_grammar_free(g);
        return st;
    }
    (*out)->own_g = g;
    (*out)->own_ix = ix;
    return NULL;
}

void kgr_matcher_free(kgr_matcher *m) {
    if (!m) return;
    pf_join(m);
    kgr_index_free(m->own_ix);
    kgr_grammar_free(m->own_g);
    free(m->buf);
    free(m);
}

kiln_status kgr_matcher_mask(kgr_matcher *m, uint32_t *bits) {
    kgr_index *ix = m->ix;
    size_t words = ((size_t)ix->v->n_vocab + 31) / 32;
    pf_join(m);
    if (m->ended) {
        memset(bits, 0, words * 4);
        return NULL;
    }
    pthread_mutex_lock(&ix->mu);
    kiln_status st;
    if (!ix->st[m->state].mask && m->buf_state == m->state) { /* prefetched, over the cache's bound */
        memcpy(bits, m->buf, words * 4);
        st = NULL;
    } else {
        st = state_mask(ix, m->state, bits);
    }
    pthread_mutex_unlock(&ix->mu);
    return st;
}

kiln_status kgr_matcher_mask_ref(kgr_matcher *m, const uint32_t **bits) {
    kgr_index *ix = m->ix;
    size_t words = ((size_t)ix->v->n_vocab + 31) / 32;
    *bits = NULL;
    pf_join(m);
    if (!m->buf && !(m->buf = malloc(words * 4))) return OOM;
    if (m->ended) {
        memset(m->buf, 0, words * 4);
        m->buf_state = -1;
        *bits = m->buf;
        return NULL;
    }
    pthread_mutex_lock(&ix->mu); /* another matcher may be growing ix->st */
    kiln_status st = fill(m, bits);
    pthread_mutex_unlock(&ix->mu);
    return st;
}

static bool is_eos(const kgr_vocab *v, int32_t tok) {
    for (int32_t k = 0; k < v->n_eos; k++)
        if (v->eos[k] == tok) return true;
    return false;
}

/* the state after bytes s from state at (0: dead, -1: error); mu held */
static int32_t walk_bytes(kgr_index *ix, int32_t at, const char *s, size_t n) {
    for (size_t i = 0; i < n && at > 0; i++) at = next_state(ix, at, (uint8_t)s[i]);
    return at;
}

kiln_status kgr_matcher_accept(kgr_matcher *m, int32_t tok) {
    kgr_index *ix = m->ix;
    const kgr_vocab *v = ix->v;
    if (m->ended) return kiln_error(KILN_EINVAL, "grammar: token %d after the end", tok);
    if (tok < 0 || tok >= v->n_vocab) return kiln_error(KILN_EINVAL, "grammar: token %d is out of range", tok);
    pf_join(m);
    pthread_mutex_lock(&ix->mu);
    kiln_status st = NULL;
    /* an EOS id the grammar references (a special token terminal) is taken as a token first */
    int32_t ref = is_eos(v, tok) && v->off[tok + 1] > v->off[tok]
                      ? walk_bytes(ix, m->state, v->bytes + v->off[tok], (size_t)(v->off[tok + 1] - v->off[tok]))
                      : 0;
    if (ref > 0) {
        set_state(m, ref);
    } else if (ref < 0) {
        st = kiln_error(kiln_status_code(ix->err), "%s", kiln_status_msg(ix->err));
    } else if (is_eos(v, tok)) {
        if (ix->st[m->state].accept) m->ended = true;
        else st = kiln_error(KILN_EINVAL, "grammar: end of text where the grammar cannot end");
    } else if (v->off[tok + 1] == v->off[tok]) {
        st = kiln_error(KILN_EINVAL, "grammar: token %d has no text the grammar can match", tok);
    } else {
        int32_t t = walk_bytes(ix, m->state, v->bytes + v->off[tok], (size_t)(v->off[tok + 1] - v->off[tok]));
        if (t < 0) st = kiln_error(kiln_status_code(ix->err), "%s", kiln_status_msg(ix->err));
        else if (t == 0) st = kiln_error(KILN_EINVAL, "grammar: token %d is not allowed here", tok);
        else set_state(m, t);
    }
    pthread_mutex_unlock(&ix->mu);
    return st;
}

bool kgr_matcher_accept_bytes(kgr_matcher *m, const char *s, size_t n) {
    if (m->ended) return n == 0;
    if (n && memchr(s, 0xFF, n)) return false; /* text never spells a special token's marker */
    kgr_index *ix = m->ix;
    pf_join(m);
    pthread_mutex_lock(&ix->mu);
    int32_t t = walk_bytes(ix, m->state, s, n);
    if (t > 0) set_state(m, t);
    pthread_mutex_unlock(&ix->mu);
    return t > 0;
}

bool kgr_matcher_can_end(const kgr_matcher *m) { return m->ended || m->accept; }

bool kgr_matcher_done(const kgr_matcher *m) { return m->ended || (m->accept && m->closed); }
