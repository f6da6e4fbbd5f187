/* blocks_shard.c: tensor parallelism in the shared blocks (see blocks.h).
 *
 * The GSPMD idea, kept to what the blocks need: a block that can split
 * asks for its shard of a weight instead of the whole, and an all_reduce
 * joins the partial sums after a row-parallel projection. Column-parallel
 * projections (q, k, v, gate, up) read a range of output rows: for the
 * usual [out, in] layout (and MLX's affine triple) that is a pointer into
 * the mapped file, so a process touches only its rows. Row-parallel ones
 * (o, down) read a range of input columns, copied once per process into a
 * shard kept for the process's life (shared by every graph of the model).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "models/blocks.h"
#include "runtime/dist.h"

/* ---------------------------------------------------------------- head split */

bool kb_shard_heads(const kb_ctx *b, int64_t H, int64_t Hkv, kb_head_shard *s) {
    int n = b->tp_size, r = b->tp_rank;
    *s = (kb_head_shard){.on = false, .q_lo = 0, .H = H, .kv_lo = 0, .Hkv = Hkv};
    if (n <= 1 || H <= 0 || Hkv <= 0 || H % n || H % Hkv) return false;
    int64_t g = H / Hkv, hl = H / n, q_lo = r * hl;
    int64_t kv_lo = q_lo / g, kv_hi = (q_lo + hl - 1) / g + 1;
    /* a process's query heads are whole KV groups, or lie in one group
     * whose KV head the processes sharing it each keep (replicated) */
    if (!((hl % g == 0 && q_lo % g == 0) || kv_hi - kv_lo == 1)) return false;
    *s = (kb_head_shard){.on = true, .q_lo = q_lo, .H = hl, .kv_lo = kv_lo, .Hkv = kv_hi - kv_lo};
    return true;
}

bool kb_shard_range(const kb_ctx *b, int64_t n_items, int64_t *lo, int64_t *hi) {
    *lo = 0, *hi = n_items;
    if (b->tp_size <= 1 || n_items % b->tp_size) return false;
    *lo = n_items / b->tp_size * b->tp_rank;
    *hi = *lo + n_items / b->tp_size;
    return true;
}

/* This stage's processes (rank = stage * tp + tensor rank), NULL for a
 * single stage (StableHLO's one group of 0 .. tp-1). */
static const int *stage_group(const kb_ctx *b, int *buf) {
    if (b->pp_size <= 1) return NULL;
    for (int i = 0; i < b->tp_size; i++) buf[i] = b->pp_rank * b->tp_size + i;
    return buf;
}

enum { MAX_GROUP = 4096 }; /* main.c's --tp and --pp limits */

kg_node *kb_all_reduce(kb_ctx *b, kg_node *x) {
    if (!x || b->tp_size <= 1) return x;
    int buf[MAX_GROUP];
    return kg_all_reduce(b->g, x, 1, b->tp_size, stage_group(b, buf));
}

kg_node *kb_tp_all_gather(kb_ctx *b, kg_node *x, int dim) {
    if (!x || b->tp_size <= 1) return x;
    int buf[MAX_GROUP];
    return kg_all_gather(b->g, x, dim, 1, b->tp_size, stage_group(b, buf));
}

/* ---------------------------------------------------------------- pipeline stages */

bool kb_pp_runs(const kb_ctx *b, int il) { return b->pp_size <= 1 || (il >= b->pp_lo && il < b->pp_hi); }

bool kb_pp_last(const kb_ctx *b) { return b->pp_size <= 1 || b->pp_rank == b->pp_size - 1; }

kg_node *kb_pp_enter(kb_ctx *b, kg_node *x, int il) {
    if (!x || b->pp_size <= 1 || il == 0) return x;
    /* the stage that begins at il, if one does (every stage knows the split) */
    int stage = -1;
    for (int s = 1; s < b->pp_size && stage < 0; s++) {
        int lo, hi;
        kiln_status st = kd_pp_split((int)b->hp->n_layers, s, &lo, &hi);
        if (st) return kb_fail(b, st);
        if (lo == il) stage = s;
    }
    if (stage < 0) return x;
    int pairs[2 * MAX_GROUP];
    for (int t = 0; t < b->tp_size; t++)
        pairs[2 * t] = (stage - 1) * b->tp_size + t, pairs[2 * t + 1] = stage * b->tp_size + t;
    return kg_name(kg_collective_permute(b->g, x, b->tp_size, pairs), "pp_handoff", il);
}

kg_node *kb_pp_output(kb_ctx *b, kg_node *out) {
    if (!out || b->pp_size <= 1 || b->shape.pp_local_output) return out;
    /* every stage's rows gathered (stages in order) across the processes of
     * this tensor rank; the last stage's are the output, bit for bit */
    int groups[MAX_GROUP];
    for (int t = 0; t < b->tp_size; t++)
        for (int s = 0; s < b->pp_size; s++) groups[t * b->pp_size + s] = s * b->tp_size + t;
    kg_node *all = kg_all_gather(b->g, out, 0, b->tp_size, b->pp_size, groups);
    if (!all) return NULL;
    int64_t R = out->shape.d[0], start[2] = {R * (b->pp_size - 1), 0}, limit[2] = {R * b->pp_size, out->shape.d[1]},
            stride[2] = {1, 1};
    return kg_slice(b->g, all, start, limit, stride);
}

/* ---------------------------------------------------------------- column copies */

/* Copied shards, one per (checkpoint, source, range), kept until the
 * checkpoint's model is freed (kb_shards_release: a later mapping may reuse
 * the addresses). */
typedef struct shard {
    const kc_checkpoint *ck;
    const void *src;
    int64_t lo, hi, rows;
    void *data;
    struct shard *next;
} shard;
static shard *shards;
static pthread_mutex_t shards_lock = PTHREAD_MUTEX_INITIALIZER;

/* Columns [lo, hi) of each of `rows` rows of `row_bytes` bytes, element
 * size es: a [rows, (hi - lo)] copy. NULL when out of memory. */
static const void *copy_cols(const kc_checkpoint *ck, const void *src, int64_t rows, size_t row_bytes, size_t es, int64_t lo,
                             int64_t hi) {
    pthread_mutex_lock(&shards_lock);
    for (shard *s = shards; s; s = s->next)
        if (s->ck == ck && s->src == src && s->lo == lo && s->hi == hi && s->rows == rows) {
            pthread_mutex_unlock(&shards_lock);
            return s->data;
        }
    size_t w = (size_t)(hi - lo) * es;
    shard *s = malloc(sizeof *s);
    void *d = aligned_alloc(64, ((size_t)rows * w + 63) / 64 * 64);
    if (!s || !d) {
        free(s), free(d);
        pthread_mutex_unlock(&shards_lock);
        return NULL;
    }
    for (int64_t i = 0; i < rows; i++) memcpy((char *)d + (size_t)i * w, (const char *)src + (size_t)i * row_bytes + (size_t)lo * es, w);
    /* the rows' other columns are other processes' shards: let the kernel
     * drop the pages this process read (the mapping is read-only, so a
     * later read would fault them in again from the file, unchanged) */
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)src + pg - 1) / pg * pg,
              e = ((uintptr_t)src + (size_t)rows * row_bytes) / pg * pg;
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    *s = (shard){ck, src, lo, hi, rows, d, shards};
    shards = s;
    pthread_mutex_unlock(&shards_lock);
    return d;
}

void kb_shards_release(const kc_checkpoint *ck) {
    pthread_mutex_lock(&shards_lock);
    for (shard **p = &shards; *p;) {
        shard *s = *p;
        if (s->ck != ck) {
            p = &s->next;
            continue;
        }
        *p = s->next;
        free(s->data);
        free(s);
    }
    pthread_mutex_unlock(&shards_lock);
}

static kg_dtype float_dtype(kc_wfmt f) { return f == KC_W_F32 ? KG_F32 : f == KC_W_F16 ? KG_F16 : KG_BF16; }
static kg_wfmt graph_fmt(kc_wfmt f) { return f == KC_W_F32 ? KG_WF_F32 : f == KC_W_F16 ? KG_WF_F16 : f == KC_W_BF16 ? KG_WF_BF16 : KG_WF_AFFINE; }

static kg_dtype sb_dtype(kc_dtype t) { return t == KC_F32 ? KG_F32 : t == KC_F16 ? KG_F16 : KG_BF16; }

static kg_node *no_memory(kb_ctx *b) { return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory for a weight shard")); }

/* x @ W'^T where W' is the sub-matrix [r0, r1) x [c0, c1) of m (one of the
 * two ranges whole): row ranges are views of the mapping, column ranges
 * copies; a transposed ([in, out]) weight the other way round. */
static kg_node *sub_linear(kb_ctx *b, kg_node *x, const kc_matrix *m, bool transposed, int64_t r0, int64_t r1, int64_t c0,
                           int64_t c1) {
    kg_graph *g = b->g;
    kg_wattr wa = {.fmt = graph_fmt(m->fmt), .rows = r1 - r0, .cols = c1 - c0, .transposed = transposed};
    if (m->fmt != KC_W_AFFINE) {
        size_t es = m->fmt == KC_W_F32 ? 4 : 2;
        /* storage rows: out features, or in features when transposed */
        int64_t scols = transposed ? m->rows : m->cols;
        int64_t s0 = transposed ? c0 : r0, s1 = transposed ? c1 : r1; /* storage row range */
        int64_t k0 = transposed ? r0 : c0, k1 = transposed ? r1 : c1; /* storage column range */
        const void *p = (const char *)m->data + (size_t)s0 * (size_t)scols * es;
        if (k0 != 0 || k1 != scols) {
            p = copy_cols(b->ck, p, s1 - s0, (size_t)scols * es, es, k0, k1);
            if (!p) return no_memory(b);
        }
        kg_node *w = kg_weight(g, float_dtype(m->fmt), KG_SHAPE(s1 - s0, k1 - k0), p, m->name);
        return kg_linear(g, x, w, NULL, NULL, &wa);
    }
    if (transposed) return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: a quantized weight stored [in, out]", m->name));
    int gs = m->group_size, bits = m->bits;
    if (c0 % gs || c1 % gs || (c0 * bits) % 32 || (c1 * bits) % 32)
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "%s: --tp splits its %lld inputs off its %d-wide quantization groups",
                                     m->name, (long long)m->cols, gs));
    wa.bits = bits, wa.group_size = gs;
    size_t sbe = kc_dtype_size(m->sb_dtype);
    int64_t ng = m->cols / gs;
    const void *codes = (const uint32_t *)m->data + r0 * m->packed_cols;
    const void *sc = (const char *)m->scales + (size_t)(r0 * ng) * sbe, *bi = (const char *)m->biases + (size_t)(r0 * ng) * sbe;
    int64_t pc = m->packed_cols;
    if (c0 != 0 || c1 != m->cols) {
        codes = copy_cols(b->ck, codes, r1 - r0, (size_t)m->packed_cols * 4, 4, c0 * bits / 32, c1 * bits / 32);
        sc = copy_cols(b->ck, sc, r1 - r0, (size_t)ng * sbe, sbe, c0 / gs, c1 / gs);
        bi = copy_cols(b->ck, bi, r1 - r0, (size_t)ng * sbe, sbe, c0 / gs, c1 / gs);
        if (!codes || !sc || !bi) return no_memory(b);
        pc = (c1 - c0) * bits / 32;
    }
    kg_node *w = kg_weight(g, KG_U32, KG_SHAPE(r1 - r0, pc), codes, m->name);
    kg_node *s = kg_weight(g, sb_dtype(m->sb_dtype), KG_SHAPE(r1 - r0, (c1 - c0) / gs), sc, m->name);
    kg_node *bb = kg_weight(g, sb_dtype(m->sb_dtype), KG_SHAPE(r1 - r0, (c1 - c0) / gs), bi, m->name);
    return kg_linear(g, x, w, s, bb, &wa);
}

/* The role's matrix, rows x cols as kb_linear checks it. */
static bool role_matrix(kb_ctx *b, km_tensor t, int il, int64_t rows, int64_t cols, kc_matrix *m, bool *transposed) {
    char name[256];
    kb_name(b, t, il, name, sizeof name);
    *transposed = t < 64 && (b->transposed_roles >> t) & 1;
    kiln_status st = *transposed ? kc_get_matrix(b->ck, name, cols, rows, m) : kc_get_matrix(b->ck, name, rows, cols, m);
    if (st) return kb_fail(b, st), false;
    if (*transposed) { /* stored [in, out]: the matrix's rows are the inputs */
        int64_t r = m->rows;
        m->rows = m->cols, m->cols = r;
    }
    return true;
}

static kg_node *bias_range(kb_ctx *b, kg_node *y, km_tensor t, int il, int64_t rows, int64_t lo, int64_t hi) {
    if (!y) return NULL;
    kg_node *v = kg_convert(b->g, kb_vector(b, t, il, ".bias", rows), KG_F32);
    if (v && (lo != 0 || hi != rows)) v = kg_slice(b->g, v, (int64_t[]){lo}, (int64_t[]){hi}, NULL);
    return kg_add(b->g, y, v);
}

kg_node *kb_linear_rows(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, int64_t lo, int64_t hi, bool bias) {
    if (!x) return NULL;
    if (lo == 0 && hi == rows) return kb_linear(b, x, t, il, rows, bias);
    kc_matrix m;
    bool tr;
    if (!role_matrix(b, t, il, rows, x->shape.d[x->shape.rank - 1], &m, &tr)) return NULL;
    kg_node *y = sub_linear(b, x, &m, tr, lo, hi, 0, m.cols);
    return bias ? bias_range(b, y, t, il, rows, lo, hi) : y;
}

kg_node *kb_linear_cols(kb_ctx *b, kg_node *x, km_tensor t, int il, int64_t rows, int64_t cols, int64_t lo, int64_t hi,
                        bool bias) {
    if (!x) return NULL;
    if (lo == 0 && hi == cols) return kb_linear(b, x, t, il, rows, bias);
    if (x->shape.d[x->shape.rank - 1] != hi - lo)
        return kb_fail(b, kiln_error(KILN_EINTERNAL, "a row-parallel projection of %lld inputs given %lld", (long long)(hi - lo),
                                     (long long)x->shape.d[x->shape.rank - 1]));
    kc_matrix m;
    bool tr;
    if (!role_matrix(b, t, il, rows, cols, &m, &tr)) return NULL;
    if (m.fmt == KC_W_AFFINE && (lo % m.group_size || hi % m.group_size || (lo * m.bits) % 32 || (hi * m.bits) % 32)) {
        /* the split is not on quantization groups: gather the inputs (the
         * processes hold consecutive ranges in rank order) and project
         * them whole, every process alike */
        int last = x->shape.rank - 1;
        if ((hi - lo) * b->tp_size != cols || lo != (hi - lo) * b->tp_rank)
            return kb_fail(b, kiln_error(KILN_EINTERNAL, "%s: a row-parallel split that is not even", m.name));
        kg_node *whole = kb_tp_all_gather(b, x, last);
        return kb_linear(b, whole, t, il, rows, bias);
    }
    kg_node *y = kb_all_reduce(b, sub_linear(b, x, &m, tr, 0, m.rows, lo, hi));
    return bias ? bias_range(b, y, t, il, rows, 0, rows) : y; /* once, after the sum */
}
