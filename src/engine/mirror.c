/* mirror.c: a server's context mirrored across a tensor-parallel job (see
 * engine.h, ke_ctx_lead / ke_ctx_follow).
 *
 * Rank 0 runs the scheduler; each call that changes its context (a
 * sequence opened, a prefix reused or published, a step) is broadcast as
 * a header and a payload before it runs, and its result after. Each other
 * rank runs the same call on its own context (its shard of the weights and
 * of the KV cache), so that the collectives inside a step meet, and checks
 * that it got the leader's result: the engine is deterministic, so a
 * mismatch is a bug, reported and ending the job rather than a silent
 * divergence. The header waits in kd_broadcast_idle, so an idle follower
 * naps instead of spinning on a core.
 */
#include "engine/mirror.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dist.h"

typedef struct {
    int32_t op, seq;
    int64_t a, n, bytes; /* a: an argument or (steps) which inputs follow; n: tokens; bytes: payload */
} kem_header;

/* step inputs present (kem_header.a bits) */
enum { IN_LOGITS = 1, IN_EMBD = 2, IN_SPAN = 4, IN_POS = 8, IN_EMBD_ADD = 16, IN_CROSS = 32, IN_CROSS_KEYS = 64, IN_TYPES = 128 };

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "kiln: rank %d: out of memory for a step's broadcast\n", kd_rank());
            kd_abort(70);
        }
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, d, n);
    b->len += n;
}

/* [n] per-token rows of `row` floats or NULL: a presence byte each, then the rows */
static void put_rows(buf *b, const float *const *rows, int64_t n, int64_t row) {
    for (int64_t t = 0; t < n; t++) put(b, &(unsigned char){rows[t] != NULL}, 1);
    for (int64_t t = 0; t < n; t++)
        if (rows[t]) put(b, rows[t], sizeof(float) * (size_t)row);
}

static buf out; /* the leader's payload (one context leads per process) */

static void send(const kem_header *h, const void *payload) {
    kem_header hh = *h;
    kd_broadcast_idle(&hh, sizeof hh, 0);
    if (h->bytes) kd_broadcast((void *)payload, (size_t)h->bytes, 0);
}

void kem_send(kem_op op, int seq, int64_t a, const int32_t *tokens, int64_t n) {
    send(&(kem_header){op, seq, a, tokens ? n : 0, tokens ? (int64_t)sizeof(int32_t) * n : 0}, tokens);
}

void kem_send_path(kem_op op, const int32_t *tokens, int64_t n, const char *path) {
    size_t k = strlen(path);
    if (!tokens) n = 0;
    out.len = 0;
    put(&out, tokens, sizeof(int32_t) * (size_t)n);
    put(&out, path, k);
    send(&(kem_header){op, 0, (int64_t)k, n, (int64_t)out.len}, out.p);
}

void kem_send_decode(kem_op op, const km_hparams *hp, const ke_batch *b, const ke_inputs *x, const int32_t *types) {
    int64_t n = b->n > 0 ? b->n : 0, in = 0;
    out.len = 0;
    put(&out, b->tokens, sizeof(int32_t) * (size_t)n);
    put(&out, b->seq, sizeof(int32_t) * (size_t)n);
    if (b->logits) in |= IN_LOGITS, put(&out, b->logits, sizeof(bool) * (size_t)n);
    if (x && x->embd) in |= IN_EMBD, put_rows(&out, x->embd, n, hp->hidden);
    if (x && x->span) in |= IN_SPAN, put(&out, x->span, sizeof(int32_t) * 2 * (size_t)n);
    if (x && x->positions) in |= IN_POS, put(&out, x->positions, sizeof(int32_t) * 3 * (size_t)n);
    if (x && x->embd_add) in |= IN_EMBD_ADD, put_rows(&out, x->embd_add, n, hp->embd_add_layers * hp->hidden);
    if (x && x->cross) in |= IN_CROSS, put_rows(&out, x->cross, n, hp->cross_rows * hp->hidden);
    if (x && x->cross_keys) in |= IN_CROSS_KEYS, put(&out, x->cross_keys, sizeof(int32_t) * (size_t)n);
    if (x && x->types) in |= IN_TYPES, put(&out, x->types, sizeof(int32_t) * (size_t)n);
    if (types) in |= IN_TYPES, put(&out, types, sizeof(int32_t) * (size_t)n);
    send(&(kem_header){op, 0, in, n, (int64_t)out.len}, out.p);
}

void kem_result(int64_t r) { kd_broadcast(&r, sizeof r, 0); }

/* ---------------------------------------------------------------- follower */

typedef struct {
    const unsigned char *p, *end;
} reader;

static const void *take(reader *r, size_t n) {
    if ((size_t)(r->end - r->p) < n) return NULL;
    const void *d = r->p;
    r->p += n;
    return d;
}

/* rows written by put_rows: pointers into the payload, in ptrs [n] */
static bool take_rows(reader *r, int64_t n, int64_t row, const float **ptrs) {
    const unsigned char *has = take(r, (size_t)n);
    if (!has) return false;
    for (int64_t t = 0; t < n; t++)
        if (!(ptrs[t] = has[t] ? take(r, sizeof(float) * (size_t)row) : NULL) && has[t]) return false;
    return true;
}

static const char *op_name(int op) {
    static const char *const names[] = {"?", "end", "open", "close", "reuse_prefix", "publish", "trim_window",
                                        "checkpoint", "truncate", "decode", "decode_ex", "decode_types", "cache_drop", "prefix_save", "prefix_restore"};
    return op > 0 && op <= KEM_RESTORE ? names[op] : "?";
}

static int64_t status_result(kiln_status st, int64_t ok) {
    int64_t r = st ? -(int64_t)kiln_status_code(st) - 1 : ok;
    kiln_status_free(st);
    return r;
}

/* One step from the payload; its result as the leader computes it. */
static kiln_status replay_decode(ke_ctx *c, const kem_header *h, const unsigned char *pay, const float ***rows, int64_t *cap,
                                 int64_t *res) {
    const km_hparams *hp = ke_model_hparams(ke_ctx_model(c));
    int64_t n = h->n, in = h->a;
    if (n > *cap) {
        const float **p = realloc(*rows, sizeof(float *) * 3 * (size_t)n);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory for a step");
        *rows = p, *cap = n;
    }
    const float **embd = *rows, **add = *rows + n, **cross = *rows + 2 * n;
    reader r = {pay, pay + h->bytes};
    ke_batch b = {.n = (int)n, .tokens = take(&r, sizeof(int32_t) * (size_t)n), .seq = take(&r, sizeof(int32_t) * (size_t)n)};
    ke_inputs x = {0};
    bool ok = b.tokens && b.seq;
    if (in & IN_LOGITS) ok &= (b.logits = take(&r, sizeof(bool) * (size_t)n)) != NULL;
    if (in & IN_EMBD) ok &= take_rows(&r, n, hp->hidden, embd), x.embd = embd;
    if (in & IN_SPAN) ok &= (x.span = take(&r, sizeof(int32_t) * 2 * (size_t)n)) != NULL;
    if (in & IN_POS) ok &= (x.positions = take(&r, sizeof(int32_t) * 3 * (size_t)n)) != NULL;
    if (in & IN_EMBD_ADD) ok &= take_rows(&r, n, hp->embd_add_layers * hp->hidden, add), x.embd_add = add;
    if (in & IN_CROSS) ok &= take_rows(&r, n, hp->cross_rows * hp->hidden, cross), x.cross = cross;
    if (in & IN_CROSS_KEYS) ok &= (x.cross_keys = take(&r, sizeof(int32_t) * (size_t)n)) != NULL;
    if (in & IN_TYPES) ok &= (x.types = take(&r, sizeof(int32_t) * (size_t)n)) != NULL;
    if (!ok || r.p != r.end) return kiln_error(KILN_EINVAL, "a step's broadcast is malformed (%lld bytes)", (long long)h->bytes);
    const float *lg;
    int nr = 0;
    kiln_status st = h->op == KEM_DECODE         ? ke_decode(c, &b, &lg, &nr)
                     : h->op == KEM_DECODE_TYPES ? ke_decode_types(c, &b, x.types, &lg, &nr)
                                                 : ke_decode_ex(c, &b, &x, &lg, &nr);
    *res = status_result(st, nr);
    return NULL;
}

/* A slot save or restore from the payload (each process its own file: engine.c). */
static int64_t replay_file(ke_ctx *c, const kem_header *h, const unsigned char *pay) {
    char path[4096];
    memcpy(path, pay + h->n * (int64_t)sizeof(int32_t), (size_t)h->a);
    path[h->a] = 0;
    int64_t n = 0;
    size_t bytes = 0;
    int32_t *t = NULL;
    kiln_status st = h->op == KEM_SAVE ? ke_ctx_prefix_save(c, (const int32_t *)pay, h->n, path, &n, &bytes)
                                       : ke_ctx_prefix_restore(c, path, &t, &n, &bytes);
    free(t);
    return status_result(st, n); /* after the call, which sets n */
}

kiln_status ke_ctx_follow(ke_ctx *c) {
    unsigned char *pay = NULL;
    size_t cap = 0;
    const float **rows = NULL;
    int64_t rows_cap = 0;
    kiln_status err = NULL;
    for (;;) {
        kem_header h;
        kd_broadcast_idle(&h, sizeof h, 0);
        if (h.op == KEM_END) break;
        if (h.bytes < 0 || h.n < 0 || h.op < KEM_END || h.op > KEM_RESTORE) {
            err = kiln_error(KILN_EINVAL, "rank %d: a malformed call from rank 0 (op %d)", kd_rank(), h.op);
            break;
        }
        if ((size_t)h.bytes > cap) {
            unsigned char *p = realloc(pay, (size_t)h.bytes);
            if (!p) {
                err = kiln_error(KILN_ENOMEM, "rank %d: out of memory for a step's broadcast", kd_rank());
                break;
            }
            pay = p, cap = (size_t)h.bytes;
        }
        if (h.bytes) kd_broadcast(pay, (size_t)h.bytes, 0);
        const int32_t *tok = (const int32_t *)pay;
        bool file = h.op == KEM_SAVE || h.op == KEM_RESTORE; /* tokens, then a path of h.a bytes */
        if (h.op != KEM_DECODE && h.op != KEM_DECODE_EX && h.op != KEM_DECODE_TYPES &&
            (h.bytes != h.n * (int64_t)sizeof(int32_t) + (file ? h.a : 0) || (file && (h.a <= 0 || h.a >= 4096)))) {
            err = kiln_error(KILN_EINVAL, "rank %d: a malformed %s from rank 0", kd_rank(), op_name(h.op));
            break;
        }
        int64_t mine = 0, theirs;
        int seq = -1;
        switch (h.op) {
        case KEM_OPEN: mine = status_result(ke_seq_open(c, &seq), 0), mine = mine ? mine : seq; break;
        case KEM_CLOSE: ke_seq_close(c, h.seq); break;
        case KEM_REUSE: mine = ke_seq_reuse_prefix(c, h.seq, tok, h.n); break;
        case KEM_PUBLISH: ke_seq_publish(c, h.seq, tok, h.n); break;
        case KEM_TRIM: mine = ke_seq_trim_window(c, h.seq); break;
        case KEM_CKPT: mine = status_result(ke_seq_checkpoint(c, h.seq), 0); break;
        case KEM_TRUNC: mine = status_result(ke_seq_truncate(c, h.seq, h.a), 0); break;
        case KEM_DROP: ke_ctx_cache_drop(c, h.seq != 0); break;
        case KEM_SAVE:
        case KEM_RESTORE: mine = replay_file(c, &h, pay); break;
        default: err = replay_decode(c, &h, pay, &rows, &rows_cap, &mine);
        }
        if (err) break;
        kd_broadcast(&theirs, sizeof theirs, 0);
        if (mine != theirs) {
            err = kiln_error(KILN_EIO, "rank %d: %s gave %lld where rank 0 got %lld (the processes diverged)", kd_rank(),
                             op_name(h.op), (long long)mine, (long long)theirs);
            break;
        }
    }
    free(pay);
    free(rows);
    return err;
}
