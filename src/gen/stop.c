/* stop.c: stop conditions and the streaming stop-string matcher.
 *
 * The matcher is an Aho-Corasick automaton over the stop strings' bytes.
 * After each byte its state is the longest suffix of the text that is a
 * prefix of some stop string: exactly the text that must be held back.
 * A stop string ends at the first byte whose state (or a state on its
 * dictionary-suffix chain) is a whole stop string; the deepest such is the
 * longest match ending there. So the work per fed byte is amortized O(1),
 * whatever the number and length of the stop strings. */
#include "gen/stop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------- limits */

const char *kgen_finish_reason(kgen_finish f) {
    switch (f) {
    case KGEN_FINISH_EOS:
    case KGEN_FINISH_STOP_STRING:
    case KGEN_FINISH_GRAMMAR: return "stop";
    case KGEN_FINISH_LENGTH:
    case KGEN_FINISH_CONTEXT: return "length";
    default: return NULL;
    }
}

kgen_finish kgen_check_start(const kgen_limits *l, int32_t n_prompt) {
    if (l->n_predict == 0) return KGEN_FINISH_LENGTH;
    if (n_prompt >= l->n_ctx) return KGEN_FINISH_CONTEXT;
    return KGEN_CONTINUE;
}

kgen_finish kgen_check_token(const kgen_limits *l, int32_t token, int32_t n_generated,
                             int32_t n_past) {
    if (!l->ignore_eos)
        for (int32_t i = 0; i < l->n_eos; i++)
            if (l->eos_ids[i] == token) return KGEN_FINISH_EOS;
    if (l->n_predict >= 0 && n_generated >= l->n_predict) return KGEN_FINISH_LENGTH;
    if (n_past >= l->n_ctx) return KGEN_FINISH_CONTEXT;
    return KGEN_CONTINUE;
}

const char *kgen_finish_describe(kgen_finish f, const kgen_limits *l, int32_t n_generated,
                                 int32_t n_past, char *buf, size_t cap) {
    if (cap == 0) return buf;
    switch (f) {
    case KGEN_CONTINUE: snprintf(buf, cap, "not finished"); break;
    case KGEN_FINISH_EOS: snprintf(buf, cap, "end-of-generation token after %d tokens", (int)n_generated); break;
    case KGEN_FINISH_STOP_STRING: snprintf(buf, cap, "stop string after %d tokens", (int)n_generated); break;
    case KGEN_FINISH_GRAMMAR: snprintf(buf, cap, "grammar complete after %d tokens", (int)n_generated); break;
    case KGEN_FINISH_LENGTH:
        snprintf(buf, cap, "length limit: %d tokens generated (n_predict = %d)", (int)n_generated,
                 (int)l->n_predict);
        break;
    case KGEN_FINISH_CONTEXT:
        snprintf(buf, cap, "context full: %d tokens (prompt %d + %d generated) fill n_ctx = %d",
                 (int)n_past, (int)(n_past - n_generated), (int)n_generated, (int)l->n_ctx);
        break;
    }
    return buf;
}

/* ---------------------------------------------------------- matcher */

typedef struct {
    int32_t first, next; /* first child, next sibling (-1: none) */
    int32_t fail;        /* longest proper suffix that is a trie node */
    int32_t dict;        /* nearest node on the fail chain that ends a stop, or -1 */
    int32_t out;         /* index of the stop string equal to this node, or -1 */
    int32_t depth;
    uint8_t byte;
} ac_node;

struct kgen_stop {
    ac_node *nodes;
    int32_t n_nodes;
    int32_t root_next[256]; /* root's children, dense */
    int32_t state;
    char *buf; /* held text; buf[0..drop) was returned by the last call */
    size_t len, cap, drop;
    int32_t matched;
    bool done;
};

static int32_t child(const kgen_stop *s, int32_t n, uint8_t b) {
    if (n == 0) return s->root_next[b];
    for (int32_t c = s->nodes[n].first; c >= 0; c = s->nodes[c].next)
        if (s->nodes[c].byte == b) return c;
    return -1;
}

static int32_t step(const kgen_stop *s, int32_t n, uint8_t b) {
    for (;;) {
        int32_t c = child(s, n, b);
        if (c >= 0) return c;
        if (n == 0) return 0;
        n = s->nodes[n].fail;
    }
}

void kgen_stop_destroy(kgen_stop *s) {
    if (!s) return;
    free(s->nodes);
    free(s->buf);
    free(s);
}

static kiln_status build(kgen_stop *s, const kgen_strs *stops) {
    size_t total = 1;
    for (int32_t i = 0; i < stops->n; i++) total += strlen(stops->v[i]);
    if (stops->n > KGEN_MAX_STOPS) return kiln_error(KILN_EINVAL, "stop: %d strings, at most %d", (int)stops->n, KGEN_MAX_STOPS);
    for (int32_t i = 0; i < stops->n; i++)
        if (strlen(stops->v[i]) > KGEN_MAX_STOP_BYTES)
            return kiln_error(KILN_EINVAL, "stop[%d]: %zu bytes, at most %d", (int)i,
                              strlen(stops->v[i]), KGEN_MAX_STOP_BYTES);
    s->nodes = malloc(sizeof *s->nodes * total);
    if (!s->nodes) return kiln_error(KILN_ENOMEM, "out of memory");
    s->nodes[0] = (ac_node){-1, -1, 0, -1, -1, 0, 0};
    s->n_nodes = 1;
    for (int i = 0; i < 256; i++) s->root_next[i] = -1;
    for (int32_t i = 0; i < stops->n; i++) {
        const uint8_t *w = (const uint8_t *)stops->v[i];
        int32_t n = 0;
        for (size_t k = 0; w[k]; k++) {
            int32_t c = child(s, n, w[k]);
            if (c < 0) {
                c = s->n_nodes++;
                s->nodes[c] = (ac_node){-1, -1, 0, -1, -1, s->nodes[n].depth + 1, w[k]};
                if (n == 0) s->root_next[w[k]] = c;
                else {
                    s->nodes[c].next = s->nodes[n].first;
                    s->nodes[n].first = c;
                }
            }
            n = c;
        }
        if (n > 0 && s->nodes[n].out < 0) s->nodes[n].out = i; /* first of equal stops */
    }
    /* Breadth-first: failure and dictionary links. */
    int32_t *queue = malloc(sizeof *queue * (size_t)s->n_nodes);
    if (!queue) return kiln_error(KILN_ENOMEM, "out of memory");
    int32_t qh = 0, qt = 0;
    for (int b = 0; b < 256; b++)
        if (s->root_next[b] >= 0) queue[qt++] = s->root_next[b]; /* fail = root */
    while (qh < qt) {
        int32_t u = queue[qh++];
        for (int32_t v = s->nodes[u].first; v >= 0; v = s->nodes[v].next) {
            int32_t f = s->nodes[u].fail;
            int32_t g = step(s, f, s->nodes[v].byte);
            s->nodes[v].fail = g == v ? 0 : g;
            int32_t fv = s->nodes[v].fail;
            s->nodes[v].dict = s->nodes[fv].out >= 0 ? fv : s->nodes[fv].dict;
            queue[qt++] = v;
        }
    }
    free(queue);
    return NULL;
}

kiln_status kgen_stop_create(const kgen_strs *stops, kgen_stop **out) {
    *out = NULL;
    kgen_stop *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    s->matched = -1;
    kiln_status st = build(s, stops);
    if (st) {
        kgen_stop_destroy(s);
        return st;
    }
    *out = s;
    return NULL;
}

static bool reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* Returns buf[0..n); it is dropped at the start of the next call, so the
 * pointer stays valid until then. */
static void emit(kgen_stop *s, size_t n, const char **out, size_t *out_len) {
    *out = s->buf ? s->buf : "";
    *out_len = n;
    s->drop = n;
}

static void drop_emitted(kgen_stop *s) {
    if (s->drop == 0) return;
    memmove(s->buf, s->buf + s->drop, s->len - s->drop);
    s->len -= s->drop;
    s->drop = 0;
}

/* Largest cut <= h such that buf[0..cut) does not end inside a UTF-8
 * character: a lead byte whose sequence would run past h moves the cut
 * before it. */
static size_t utf8_cut(const char *b, size_t h) {
    size_t j = h;
    for (int k = 0; k < 4 && j > 0; k++) {
        uint8_t c = (uint8_t)b[--j];
        if ((c & 0xC0) == 0x80) continue; /* continuation: keep looking for the lead */
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                 : (c & 0xF8) == 0xF0 ? 4 : 1;
        return j + need > h ? j : h;
    }
    return h;
}

bool kgen_stop_feed(kgen_stop *s, const char *chunk, size_t len, const char **out,
                    size_t *out_len) {
    *out = "";
    *out_len = 0;
    drop_emitted(s);
    if (s->done) return false;
    if (!reserve(&s->buf, &s->cap, s->len + len)) {
        /* Out of memory: pass the chunk through rather than lose text. */
        *out = chunk;
        *out_len = len;
        return false;
    }
    size_t base = s->len;
    if (len > 0) memcpy(s->buf + s->len, chunk, len);
    s->len += len;
    for (size_t k = 0; k < len; k++) {
        s->state = step(s, s->state, (uint8_t)chunk[k]);
        const ac_node *n = &s->nodes[s->state];
        int32_t m = n->out >= 0 ? s->state : n->dict;
        if (m >= 0) {
            size_t end = base + k + 1;
            s->matched = s->nodes[m].out;
            s->done = true;
            s->len = end - (size_t)s->nodes[m].depth; /* the stop and what follows go */
            emit(s, s->len, out, out_len);
            return true;
        }
    }
    size_t hold_from = s->len - (size_t)s->nodes[s->state].depth;
    emit(s, utf8_cut(s->buf, hold_from), out, out_len);
    return false;
}

void kgen_stop_flush(kgen_stop *s, const char **out, size_t *out_len) {
    drop_emitted(s);
    if (s->done) s->len = 0;
    emit(s, s->len, out, out_len);
    s->state = 0;
    s->done = true;
}

int32_t kgen_stop_matched(const kgen_stop *s) { return s->matched; }
size_t kgen_stop_held(const kgen_stop *s) { return s->len - s->drop; }
