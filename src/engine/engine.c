/* engine.c: model loading, the paged KV cache and the decode step. */
#include "engine/engine.h"
#include "engine/mirror.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <glob.h>
#include <sys/stat.h>

#include "base/file.h"
#include "kernels/kernels.h"
#include "kvdisk/kvdisk.h"
#include "models/blocks.h"
#include "mlir/kmlir.h"
#include "runtime/dist.h"
#include "runtime/exec.h"
#include "runtime/pool.h"
#include "vision/vision.h"

/* ---------------------------------------------------------------- model */

struct ke_model {
    kc_checkpoint *ck;
    const km_family *fam;
    km_hparams hp;
    kvis_model *vision; /* NULL: a text model */
};

/* fam and hp given (ke_model_load_as), else found and parsed */
static kiln_status model_load(const char *dir, bool hidden_out, bool state, const km_family *fam, const km_hparams *hp, ke_model **out) {
    *out = NULL;
    ke_model *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kc_open(dir, &m->ck);
    if (st) goto fail;
    const char *mt = kc_model_type(m->ck);
    m->fam = fam ? fam : km_family_find(mt);
    if (!m->fam) {
        char list[1024];
        st = kiln_error(KILN_EUNSUPPORTED, "%s/config.json: model_type \"%s\" is not supported (supported: %s)", dir, mt,
                        km_supported_list(list, sizeof list));
        goto fail;
    }
    if (hp) m->hp = *hp;
    else st = km_parse(m->fam, kc_config(m->ck), &m->hp);
    if (!st && hidden_out && m->hp.n_labels > 0)
        st = kiln_error(KILN_EUNSUPPORTED, "a sequence classification head (%lld labels) gives no hidden states",
                        (long long)m->hp.n_labels);
    if (hidden_out) m->hp.hidden_out = true, m->hp.mtp_state = state;
    if (!st && !hp) st = kvis_load(m->ck, &m->hp, &m->vision);
    if (st) {
        st = kiln_status_wrap(st, "%s", dir);
        goto fail;
    }
    /* build a one-token graph once: every weight is looked up and checked here */
    kb_shape shape = {1, 1, 1, 1, 16, 16, 1, false, false, {KG_F32, KG_F32}};
    kg_graph *g;
    kb_input *inputs;
    int n_inputs;
    kb_cache_spec *cache = calloc((size_t)m->hp.n_layers, sizeof *cache);
    if (!cache) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto fail;
    }
    st = kb_build(m->fam, &m->hp, m->ck, &shape, &g, &inputs, &n_inputs, cache);
    free(cache);
    if (st) {
        st = kiln_status_wrap(st, "%s", dir);
        goto fail;
    }
    kg_destroy(g);
    free(inputs);
    *out = m;
    return NULL;
fail:
    ke_model_free(m);
    return st;
}

kiln_status ke_model_load(const char *dir, ke_model **out) { return model_load(dir, false, false, NULL, NULL, out); }
kiln_status ke_model_load_hidden(const char *dir, ke_model **out) { return model_load(dir, true, false, NULL, NULL, out); }
kiln_status ke_model_load_mtp_state(const char *dir, ke_model **out) { return model_load(dir, true, true, NULL, NULL, out); }
kiln_status ke_model_load_as(const char *dir, const km_family *fam, const km_hparams *hp, ke_model **out) {
    return model_load(dir, false, false, fam, hp, out);
}

static int64_t default_n_ctx(const km_hparams *hp) { return hp->max_pos > 0 && hp->max_pos < 4096 ? hp->max_pos : 4096; }

kiln_status ke_model_memory(const ke_model *m, ke_memory *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < kc_tensor_count(m->ck); i++) out->weight_bytes += (int64_t)kc_tensor_at(m->ck, i)->nbytes;
    kb_shape shape = {1, 1, 1, 1, 16, 16, 1, false, false, {KG_F32, KG_F32}};
    kg_graph *g;
    kb_input *inputs;
    int n_inputs;
    kb_cache_spec *cache = calloc((size_t)m->hp.n_layers, sizeof *cache);
    if (!cache) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kb_build(m->fam, &m->hp, m->ck, &shape, &g, &inputs, &n_inputs, cache);
    if (!st) {
        kg_destroy(g);
        free(inputs);
        for (int64_t l = 0; l < m->hp.n_layers; l++) {
            const kb_cache_spec *cs = &cache[l];
            if (cs->heads) out->kv_layers++;
            out->k_elems_per_token += cs->heads * cs->dk;
            out->v_elems_per_token += cs->heads * cs->dv;
            if (cs->n_states) out->state_layers++;
            for (int k = 0; k < cs->n_states; k++) out->state_bytes_per_seq += cs->state_numel[k] * (int64_t)sizeof(float);
        }
    }
    free(cache);
    out->kv_bytes_per_token = ke_memory_kv_bytes_per_token(out, KG_F32, KG_F32);
    out->default_n_ctx = default_n_ctx(&m->hp);
    return st;
}

int64_t ke_cache_ram_default(void) {
    int64_t avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        long long kb;
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) avail = (int64_t)kb << 10;
    }
    if (f) fclose(f);
    return avail > 0 ? avail / KE_CACHE_RAM_DIVISOR : (int64_t)256 << 20;
}

/* Bytes of one cached row of d elements of type t (KG_U8: q8_0 blocks). */
static int64_t kv_row_bytes(kg_dtype t, int64_t d) {
    return t == KG_U8 ? d / KG_Q8_0_BLOCK * KG_Q8_0_BYTES : d * (int64_t)kg_dtype_size(t);
}

/* Every layer's rows are whole q8_0 blocks (ke_ctx_create refuses others),
 * so the sum over layers is the rows of the summed elements. */
int64_t ke_memory_kv_bytes_per_token(const ke_memory *mem, kg_dtype k, kg_dtype v) {
    return kv_row_bytes(k, mem->k_elems_per_token) + kv_row_bytes(v, mem->v_elems_per_token);
}

int64_t ke_memory_ctx_bytes(const ke_memory *mem, const ke_ctx_params *p) {
    int64_t n_ctx = p->n_ctx > 0 ? p->n_ctx : mem->default_n_ctx, bs = p->block_size > 0 ? p->block_size : 16;
    int64_t n_cache = p->n_cache > 0 ? p->n_cache : n_ctx;
    if (n_cache < n_ctx) n_cache = n_ctx;
    int64_t slots = (n_cache + bs - 1) / bs * bs;
    int64_t total = slots * ke_memory_kv_bytes_per_token(mem, p->cache_type_k, p->cache_type_v);
    if (mem->state_bytes_per_seq > 0) {
        total += (p->n_seq_max > 0 ? p->n_seq_max : 32) * mem->state_bytes_per_seq;
        int64_t budget = p->state_cache_bytes == 0 ? ke_cache_ram_default() : p->state_cache_bytes > 0 ? p->state_cache_bytes : 0;
        int64_t snaps = budget / mem->state_bytes_per_seq, blocks = slots / bs;
        total += (snaps < blocks ? snaps : blocks) * mem->state_bytes_per_seq;
    }
    return total;
}

void ke_model_free(ke_model *m) {
    if (!m) return;
    kvis_free(m->vision);
    kb_shards_release(m->ck); /* tensor-parallel copies of its weights */
    kc_close(m->ck);
    free(m);
}

const km_hparams *ke_model_hparams(const ke_model *m) { return &m->hp; }
const km_family *ke_model_family(const ke_model *m) { return m->fam; }
const kc_checkpoint *ke_model_checkpoint(const ke_model *m) { return m->ck; }
kvis_model *ke_model_vision(const ke_model *m) { return m->vision; }

/* ---------------------------------------------------------------- context */

static kiln_status disk_open(ke_ctx *c, const char *dir, int64_t max_bytes);
static void ram_rebalance(ke_ctx *c);

static int64_t pow2_at_least(int64_t x, int64_t cap) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p < cap ? p : cap;
}

typedef struct {
    bool open;
    int64_t len;     /* tokens in the cache */
    int32_t *blocks; /* [n_blocks]; -1: released (out of the sliding window) */
    int64_t n_blocks, cap_blocks;
    int32_t *toks;   /* [n_ctx] the tokens so far; only models with LongRoPE keep them (see ke_decode) */
    uint64_t *hash;    /* [cap_blocks] prefix hash of blocks [0, n_hashed) */
    int64_t n_hashed;  /* blocks hashed (ke_seq_publish, ke_seq_reuse_prefix) */
    int64_t n_trimmed; /* leading blocks released */
    int32_t state_slot; /* row of the recurrent state tensors; -1: none */
    int64_t rope_delta; /* M-RoPE models: a token given no positions sits at (i, i, i) + this, i its index */
    int64_t ckpt_len;   /* ke_seq_checkpoint: the length then; -1: none */
    float *ckpt_state;  /* [snap_numel] recurrent models: the state row then */
} seq_state;

typedef struct {
    int64_t T, S, MB, R;
    bool cross;
    int64_t width; /* of an output row (vocab, or hidden for hidden_out) */
    kr_exec *exec;
    kmlir_exec *mexec; /* instead of exec with compile.mlir */
    kb_input *inputs;
    int n_inputs;
    uint64_t last_use;
} exec_entry;

#define MAX_EXECS 64

struct ke_ctx {
    const ke_model *m;
    ke_ctx_params p;
    int64_t n_blocks, max_blocks_per_seq;
    int32_t *free_blocks; /* stack */
    int64_t n_free;
    /* block pool (see engine.h): reference counts, the LRU list of cached
     * blocks nobody uses (prev/next links, -1 ends), and the prefix table:
     * hash buckets chaining cached blocks, each with its hash, its parent's
     * hash and its tokens (compared on lookup, so a hash collision cannot
     * hand out the wrong keys) */
    int32_t *ref, *lru_prev, *lru_next, lru_head, lru_tail;
    int64_t n_lru;
    int32_t *bucket, *hnext; /* [n_bucket], [n_blocks] */
    int64_t n_bucket;
    uint64_t *bhash, *bparent;
    uint8_t *cached;
    int32_t *btok; /* [n_blocks, block_size] */
    int64_t window; /* see ke_ctx_window */
    int64_t prefix_queries, prefix_hits, evictions;
    kb_cache_spec *cache;
    void **kcache, **vcache; /* [n_layers] [slots, heads, dk|dv] of p.cache_type_k|v, NULL for layers without a cache */
    /* recurrent state: per layer l and state k, state[l * KB_MAX_STATES + k]
     * [n_state_slots, numel] f32; a free list of rows (see ke_seq_open) */
    float **state;
    bool recurrent;
    int64_t n_state_slots;
    int32_t *free_state;
    int64_t n_free_state;
    /* recurrent state snapshots for prefix caching (see ke_seq_publish): the
     * state of every layer right after a cached block's last token, one
     * buffer of snap_numel floats per block that has one, within snap_budget
     * bytes (least recently used dropped first) */
    float **snap;         /* [n_blocks]; NULL: none */
    uint64_t *snap_used;  /* [n_blocks] tick of last use */
    int64_t snap_numel, n_snaps, max_snaps;
    /* the tiers below the pool (see ke_ctx_cache_flush): a RAM tier of the
     * blocks the pool lets go, within ram_budget less the snapshots above,
     * over the optional disk tier; ondisk[b] says the tiers hold all block b
     * holds now; blob is a file's worth of scratch */
    kvd_store *disk;
    int64_t ram_budget;
    /* what a kept block or a saved slot is valid for; model_id is computed
     * only for what outlives the process (a --cache-dir, a slot file): its
     * samples of every tensor fault in (and read ahead) nearly the whole
     * checkpoint, every tensor on every --tp rank included */
    uint64_t model_id, layout_id;
    bool have_model_id;
    uint64_t tier_id; /* model_id for a --cache-dir, 0 for RAM alone: fixed while the tiers live */
    uint8_t *ondisk;
    int64_t kv_floats; /* per block, every layer's K and V */
    unsigned char *blob;
    int64_t disk_hits, disk_bad, ram_hits;
    seq_state *seqs;
    int n_seqs, cap_seqs;
    exec_entry execs[MAX_EXECS];
    int n_execs;
    uint64_t tick;
    kr_pool *pool;
    /* per-step scratch */
    int32_t *pos, *tseq, *slot, *rows, *seq_len, *btab, *batch_seqs, *sslot; /* [scratch_T] but btab */
    int32_t *embd_mask; /* [scratch_T] vision-language models: 1 where embd holds the token's row */
    int32_t *span;      /* [scratch_T, 2] bidirectional spans (hp.attn_span, hp.bidirectional) */
    int32_t *types;     /* [scratch_T] token type ids (hp.type_vocab) */
    float *embd;        /* [scratch_T, hidden] */
    int32_t *mpos;      /* [scratch_T, 3] M-RoPE positions (t, h, w) */
    float *embd_add;    /* [scratch_T, embd_add_layers * hidden] rows added to the first layers' outputs */
    float *cross;       /* [cross_cap, cross_rows, hidden] the step's new images' cross-attention states, per batch sequence */
    int32_t *cross_keys;/* [cross_cap, 2] (image token position, states attended); -1: none */
    int64_t cross_cap;
    float *cos[KM_MAX_ROPES], *sin[KM_MAX_ROPES];
    int64_t scratch_T, scratch_bt;
    /* per-step bookkeeping, grown on demand: a decode step allocates nothing */
    int32_t *row_of;          /* [scratch_seqs] */
    int64_t *added;           /* [scratch_seqs] */
    int64_t *run_delta;       /* [scratch_seqs] M-RoPE deltas as the step's tokens move them */
    int scratch_seqs;
    void **params;
    int cap_params;
    bool lead; /* ke_ctx_lead: calls that change it are broadcast (mirror.c) */
    /* the job's layout it was created in (runtime/dist.h): solo, made inside
     * kd_solo_begin (its calls run there again: the whole model, this
     * process alone); job, one context on each process of a job of several,
     * whose prefix-cache hits and slot files every process agrees on */
    bool solo, job;
    int tp_size, tp_rank, pp_size, pp_rank, pp_lo, pp_hi;
    /* --pp: a step's output rows, gathered from its micro-batches (pp_step) */
    float *pp_rows;
    int64_t pp_cap, out_width; /* floats; the last decode_step's row width */
};

const char *ke_cache_type_name(kg_dtype t) {
    return t == KG_F32 ? "f32" : t == KG_F16 ? "f16" : t == KG_BF16 ? "bf16" : t == KG_U8 ? "q8_0" : "?";
}

kiln_status ke_cache_type_parse(const char *flag, const char *s, kg_dtype *out) {
    static const kg_dtype types[] = {KG_F32, KG_F16, KG_BF16, KG_U8};
    for (size_t i = 0; s && i < sizeof types / sizeof *types; i++)
        if (!strcmp(s, ke_cache_type_name(types[i]))) return *out = types[i], NULL;
    return kiln_error(KILN_EINVAL, "%s: '%s' is not a KV cache type (f32, f16, bf16, q8_0)", flag, s ? s : "");
}

kiln_status ke_ctx_create(const ke_model *m, const ke_ctx_params *p, ke_ctx **out) {
    *out = NULL;
    if (!p->pooling && km_out_width(&m->hp) != m->hp.vocab) /* callers sample from vocab-wide rows */
        return kiln_error(KILN_EUNSUPPORTED, "%s: the model gives %s, not next-token logits (an embedding or reranking "
                          "model: kiln embed, kiln rerank, or kiln serve's /v1/embeddings, /v1/rerank)", m->fam->name,
                          m->hp.n_labels > 0 ? "classification labels" : "hidden states");
    for (int v = 0; v < 2; v++) {
        kg_dtype t = v ? p->cache_type_v : p->cache_type_k;
        if (t != KG_F32 && t != KG_F16 && t != KG_BF16 && t != KG_U8)
            return kiln_error(KILN_EINVAL, "--cache-type-%c: %s is not a KV cache type (f32, f16, bf16, q8_0)", v ? 'v' : 'k',
                              kg_dtype_name(t));
        if (t != KG_F32 && (p->block_size > 0 ? p->block_size : 16) % 2)
            return kiln_error(KILN_EINVAL, "--cache-type-%c %s needs an even block size, not %d", v ? 'v' : 'k',
                              ke_cache_type_name(t), p->block_size);
    }
    ke_ctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_error(KILN_ENOMEM, "out of memory");
    c->m = m;
    c->p = *p;
    const km_hparams *hp = &m->hp;
    c->solo = kd_solo();
    c->job = kd_size() > 1 && !c->solo;
    c->tp_size = kd_tp_size(), c->tp_rank = kd_tp_rank(), c->pp_size = kd_pp_size(), c->pp_rank = kd_pp_rank();
    kiln_status_free(kd_pp_split((int)hp->n_layers, c->pp_rank, &c->pp_lo, &c->pp_hi)); /* kb_build below reports it */
    if (c->p.block_size <= 0) c->p.block_size = 16;
    if (c->p.n_ctx <= 0) c->p.n_ctx = default_n_ctx(hp);
    if (c->p.n_cache <= 0) c->p.n_cache = c->p.n_ctx;
    int64_t bs = c->p.block_size;
    c->ram_budget = c->p.state_cache_bytes == 0 ? ke_cache_ram_default() : c->p.state_cache_bytes > 0 ? c->p.state_cache_bytes : 0;
    c->max_blocks_per_seq = (c->p.n_ctx + bs - 1) / bs;
    c->n_blocks = (c->p.n_cache + bs - 1) / bs;
    if (c->n_blocks < c->max_blocks_per_seq) c->n_blocks = c->max_blocks_per_seq;
    c->free_blocks = malloc(sizeof(int32_t) * (size_t)c->n_blocks);
    c->n_bucket = pow2_at_least(2 * c->n_blocks, INT64_MAX / 4);
    size_t nb = (size_t)c->n_blocks;
    c->ref = calloc(nb, sizeof(int32_t));
    c->lru_prev = malloc(nb * sizeof(int32_t));
    c->lru_next = malloc(nb * sizeof(int32_t));
    c->hnext = malloc(nb * sizeof(int32_t));
    c->bucket = malloc((size_t)c->n_bucket * sizeof(int32_t));
    c->bhash = calloc(nb, sizeof(uint64_t));
    c->bparent = calloc(nb, sizeof(uint64_t));
    c->cached = calloc(nb, 1);
    c->btok = malloc(nb * (size_t)bs * sizeof(int32_t));
    c->lru_head = c->lru_tail = -1;
    if (!c->ref || !c->lru_prev || !c->lru_next || !c->hnext || !c->bucket || !c->bhash || !c->bparent || !c->cached ||
        !c->btok)
        goto oom;
    for (int64_t i = 0; i < c->n_bucket; i++) c->bucket[i] = -1;
    c->cache = calloc((size_t)hp->n_layers, sizeof *c->cache);
    c->kcache = calloc((size_t)hp->n_layers, sizeof(float *));
    c->vcache = calloc((size_t)hp->n_layers, sizeof(float *));
    c->pool = kr_pool_create(c->p.n_threads);
    if (!c->free_blocks || !c->cache || !c->kcache || !c->vcache || !c->pool) goto oom;
    for (int64_t i = 0; i < c->n_blocks; i++) c->free_blocks[i] = (int32_t)(c->n_blocks - 1 - i);
    c->n_free = c->n_blocks;
    /* the cache layout comes from the model's graph */
    kb_shape shape = {1, 1, 1, 1, c->n_blocks * bs, (int)bs, 1, false, false, {c->p.cache_type_k, c->p.cache_type_v}};
    kg_graph *g;
    kb_input *inputs;
    int n_inputs;
    kiln_status st = kb_build(m->fam, hp, m->ck, &shape, &g, &inputs, &n_inputs, c->cache);
    if (st) {
        ke_ctx_free(c);
        return st;
    }
    kg_destroy(g);
    free(inputs);
    /* Blocks can be released before a sequence ends only when every layer
     * with a cache slides (blocks are shared by all layers). This mirrors
     * kb_layer_window, which every family uses for its attention window. */
    c->window = hp->sliding_window;
    for (int64_t l = 0; l < hp->n_layers; l++)
        if (c->cache[l].heads && !hp->layer_sliding[l]) c->window = 0;
    for (int64_t l = 0; l < hp->n_layers; l++)
        if (c->cache[l].n_states) c->recurrent = true;
    if (c->recurrent) {
        c->n_state_slots = c->p.n_seq_max > 0 ? c->p.n_seq_max : 32;
        c->state = calloc((size_t)(hp->n_layers * KB_MAX_STATES), sizeof(float *));
        c->free_state = malloc(sizeof(int32_t) * (size_t)c->n_state_slots);
        if (!c->state || !c->free_state) goto oom;
        for (int64_t i = 0; i < c->n_state_slots; i++) c->free_state[i] = (int32_t)(c->n_state_slots - 1 - i);
        c->n_free_state = c->n_state_slots;
        for (int64_t l = 0; l < hp->n_layers; l++)
            for (int k = 0; k < c->cache[l].n_states; k++) {
                float **sp = &c->state[l * KB_MAX_STATES + k];
                *sp = calloc((size_t)(c->n_state_slots * c->cache[l].state_numel[k]), sizeof(float));
                if (!*sp) {
                    ke_ctx_free(c);
                    return kiln_error(KILN_ENOMEM, "cannot allocate the recurrent state of %lld sequences",
                                      (long long)c->n_state_slots);
                }
                c->snap_numel += c->cache[l].state_numel[k];
            }
        int64_t budget = c->ram_budget;
        c->max_snaps = budget > 0 && c->snap_numel > 0 ? budget / (c->snap_numel * (int64_t)sizeof(float)) : 0;
        if (c->max_snaps > c->n_blocks) c->max_snaps = c->n_blocks;
        if (c->max_snaps > 0) {
            c->snap = calloc(nb, sizeof(float *));
            c->snap_used = calloc(nb, sizeof(uint64_t));
            if (!c->snap || !c->snap_used) goto oom;
        }
    }
    int64_t slots = c->n_blocks * bs;
    for (int64_t l = 0; l < hp->n_layers; l++) {
        const kb_cache_spec *cs = &c->cache[l];
        if (!cs->heads) continue;
        /* zeroed: the reference attention reads every slot (masked to 0 weight) */
        c->kcache[l] = calloc((size_t)(slots * cs->heads), (size_t)kv_row_bytes(c->p.cache_type_k, cs->dk));
        c->vcache[l] = calloc((size_t)(slots * cs->heads), (size_t)kv_row_bytes(c->p.cache_type_v, cs->dv));
        if (!c->kcache[l] || !c->vcache[l]) {
            ke_ctx_free(c);
            return kiln_error(KILN_ENOMEM, "cannot allocate the KV cache (%lld tokens): lower --ctx-size",
                              (long long)slots);
        }
        /* counted in 4-byte words: a half cache's block is an even number of halves (checked above) */
        c->kv_floats += bs * cs->heads * (kv_row_bytes(c->p.cache_type_k, cs->dk) + kv_row_bytes(c->p.cache_type_v, cs->dv)) /
                        (int64_t)sizeof(float);
    }
    bool dir = p->cache_dir && *p->cache_dir;
    if (dir || (c->ram_budget > 0 && !p->no_ram_tier)) {
        st = disk_open(c, dir ? p->cache_dir : NULL, p->cache_dir_bytes > 0 ? p->cache_dir_bytes : (int64_t)10 << 30);
        if (st) {
            ke_ctx_free(c);
            return st;
        }
    }
    *out = c;
    return NULL;
oom:
    ke_ctx_free(c);
    return kiln_error(KILN_ENOMEM, "out of memory");
}

void ke_ctx_free(ke_ctx *c) {
    if (!c) return;
    if (c->lead) kem_send(KEM_END, 0, 0, NULL, 0);
    if (c->disk && kvd_has_disk(c->disk)) ke_ctx_cache_flush(c);
    kvd_close(c->disk);
    free(c->ondisk), free(c->blob), free(c->pp_rows);
    for (int i = 0; i < c->n_execs; i++) {
        kr_exec_destroy(c->execs[i].exec);
        kmlir_exec_destroy(c->execs[i].mexec);
        free(c->execs[i].inputs);
    }
    if (c->kcache)
        for (int64_t l = 0; l < c->m->hp.n_layers; l++) free(c->kcache[l]), free(c->vcache[l]);
    if (c->state)
        for (int64_t i = 0; i < c->m->hp.n_layers * KB_MAX_STATES; i++) free(c->state[i]);
    free(c->state), free(c->free_state), free(c->sslot);
    if (c->snap)
        for (int64_t b = 0; b < c->n_blocks; b++) free(c->snap[b]);
    free(c->snap), free(c->snap_used);
    free(c->kcache);
    free(c->vcache);
    free(c->cache);
    for (int i = 0; i < c->n_seqs; i++)
        free(c->seqs[i].blocks), free(c->seqs[i].hash), free(c->seqs[i].toks), free(c->seqs[i].ckpt_state);
    free(c->seqs);
    free(c->free_blocks);
    free(c->ref), free(c->lru_prev), free(c->lru_next), free(c->hnext), free(c->bucket);
    free(c->bhash), free(c->bparent), free(c->cached), free(c->btok);
    free(c->pos), free(c->tseq), free(c->slot), free(c->rows), free(c->seq_len), free(c->btab);
    free(c->embd), free(c->embd_mask), free(c->span), free(c->types), free(c->mpos), free(c->embd_add), free(c->run_delta), free(c->cross), free(c->cross_keys);
    free(c->batch_seqs), free(c->row_of), free(c->added), free(c->params);
    for (int k = 0; k < KM_MAX_ROPES; k++) free(c->cos[k]), free(c->sin[k]);
    kr_pool_destroy(c->pool);
    free(c);
}

int64_t ke_ctx_n_ctx(const ke_ctx *c) { return c->p.n_ctx; }
const ke_model *ke_ctx_model(const ke_ctx *c) { return c->m; }
int64_t ke_ctx_free_blocks(const ke_ctx *c) { return c->n_free + c->n_lru; }
int ke_ctx_n_executables(const ke_ctx *c) { return c->n_execs; }
int ke_ctx_n_threads(const ke_ctx *c) { return kr_pool_size(c->pool); }
bool ke_ctx_recurrent(const ke_ctx *c) { return c->recurrent; }

/* ---------------------------------------------------------------- block pool */

static void lru_unlink(ke_ctx *c, int32_t b) {
    int32_t p = c->lru_prev[b], n = c->lru_next[b];
    if (p >= 0) c->lru_next[p] = n;
    else c->lru_head = n;
    if (n >= 0) c->lru_prev[n] = p;
    else c->lru_tail = p;
    c->n_lru--;
}

static void lru_push(ke_ctx *c, int32_t b) {
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_lru++;
}

static void snap_free(ke_ctx *c, int32_t b) {
    if (c->snap && c->snap[b]) {
        free(c->snap[b]);
        c->snap[b] = NULL;
        c->n_snaps--;
        ram_rebalance(c);
    }
}

static void unpublish(ke_ctx *c, int32_t b) {
    int32_t *pp = &c->bucket[c->bhash[b] & (uint64_t)(c->n_bucket - 1)];
    while (*pp != b) pp = &c->hnext[*pp];
    *pp = c->hnext[b];
    c->cached[b] = 0;
    if (c->ondisk) c->ondisk[b] = 0;
    snap_free(c, b);
}

/* Copies the recurrent state row `slot` into buf (to_row false) or buf into
 * the row (to_row true): every layer's states, in layer order. */
static void state_copy(ke_ctx *c, int32_t slot, float *buf, bool to_row) {
    const km_hparams *hp = &c->m->hp;
    for (int64_t l = 0; l < hp->n_layers; l++)
        for (int k = 0; k < c->cache[l].n_states; k++) {
            int64_t n = c->cache[l].state_numel[k];
            float *row = c->state[l * KB_MAX_STATES + k] + slot * n;
            if (to_row) memcpy(row, buf, sizeof(float) * (size_t)n);
            else memcpy(buf, row, sizeof(float) * (size_t)n);
            buf += n;
        }
}

static void disk_write(ke_ctx *c, int32_t b, bool evict);

/* A snapshot buffer for the cached block b (which has none), dropping the
 * least recently used snapshot (to disk first, when there is a disk tier)
 * when the budget is full; NULL when there is no room. */
static float *snap_take(ke_ctx *c, int32_t b) {
    if (c->n_snaps >= c->max_snaps) {
        int64_t old = -1;
        for (int64_t i = 0; i < c->n_blocks; i++)
            if (c->snap[i] && (old < 0 || c->snap_used[i] < c->snap_used[old])) old = i;
        if (old < 0) return NULL;
        disk_write(c, (int32_t)old, false);
        c->snap[b] = c->snap[old]; /* reuse its buffer */
        c->snap[old] = NULL;
    } else {
        c->snap[b] = malloc(sizeof(float) * (size_t)c->snap_numel);
        if (!c->snap[b]) return NULL;
        c->n_snaps++;
        ram_rebalance(c);
    }
    if (c->ondisk) c->ondisk[b] = 0; /* its file, if any, lacks the snapshot */
    c->snap_used[b] = ++c->tick;
    return c->snap[b];
}

/* Keeps seq q's state (after its first len tokens, len a multiple of the
 * block size) with the cached block b holding its last tokens. */
static void snapshot(ke_ctx *c, const seq_state *q, int32_t b) {
    if (!c->snap || c->snap[b] || q->state_slot < 0) return;
    float *buf = snap_take(c, b);
    if (buf) state_copy(c, q->state_slot, buf, false);
}

/* ---------------------------------------------------------------- disk tier */

/* A block file's payload: this header, the block's tokens, every cached
 * layer's K then V rows of its slots (layer order), then the snapshot. */
typedef struct {
    char magic[8];
    uint64_t model_id, layout_id, hash, parent;
    uint32_t block_size, has_snap;
    uint64_t kv_floats, snap_floats;
} disk_head;

#define DISK_MAGIC "kiln.kvb"

static uint64_t mix64(uint64_t x);

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, c + i, 8);
        h = mix64(h ^ w);
    }
    uint64_t t = n;
    for (size_t i = n & ~(size_t)7; i < n; i++) t = t << 8 | c[i];
    return mix64(h ^ t);
}

static uint64_t hash_str(uint64_t h, const char *s) { return hash_bytes(h, s ? s : "", s ? strlen(s) + 1 : 1); }

/* The model's identity: its family, config.json, and per tensor its name,
 * dtype, shape and 64 bytes at each of 65 places through its data (the
 * files are mapped: hashing every byte would read the whole checkpoint). */
static uint64_t model_identity(const ke_model *m) {
    uint64_t h = hash_str(0x6b696c6e6d6f646cull, m->fam->name);
    char *cfg = cJSON_PrintUnformatted(kc_root_config(m->ck));
    h = hash_str(h, cfg);
    free(cfg);
    for (int i = 0; i < kc_tensor_count(m->ck); i++) {
        const kc_tensor *t = kc_tensor_at(m->ck, i);
        h = hash_str(h, t->name);
        int64_t meta[2 + KC_MAX_RANK] = {t->dtype, t->rank};
        for (int k = 0; k < t->rank; k++) meta[2 + k] = t->shape[k];
        h = hash_bytes(h, meta, sizeof meta);
        h = hash_bytes(h, &t->nbytes, sizeof t->nbytes);
        size_t n = t->nbytes < 64 ? t->nbytes : 64;
        for (int k = 0; k <= 64 && n > 0; k++) h = hash_bytes(h, (const char *)t->data + (t->nbytes - n) / 64 * (size_t)k, n);
    }
    return h;
}

/* What else decides the bits of a cached block: the layout and the
 * arithmetic (kernels chosen by ISA, compile options). */
static uint64_t layout_identity(const ke_ctx *c) {
    const km_hparams *hp = &c->m->hp;
    int64_t v[6] = {3 /* format version */, c->p.block_size, hp->n_layers, (int64_t)sizeof(float), kk_isa_level(),
                    c->p.compile.decompose_all * 2 + c->p.compile.no_fusion};
    uint64_t h = hash_bytes(0x6b696c6e6c61796full, v, sizeof v);
    h = hash_str(h, c->p.compile.decompose_only);
    if (c->p.cache_type_k != KG_F32 || c->p.cache_type_v != KG_F32) { /* f32 keeps the identity it always had */
        int64_t t[2] = {c->p.cache_type_k, c->p.cache_type_v};
        h = hash_bytes(h, t, sizeof t);
    }
    for (int64_t l = 0; l < hp->n_layers; l++) {
        const kb_cache_spec *cs = &c->cache[l];
        int64_t w[4 + KB_MAX_STATES] = {cs->heads, cs->dk, cs->dv, cs->n_states};
        for (int k = 0; k < cs->n_states; k++) w[4 + k] = cs->state_numel[k];
        h = hash_bytes(h, w, sizeof w);
    }
    if (c->tp_size > 1 || c->pp_size > 1) { /* which shard of which stage (one process keeps the identity it had) */
        int64_t t[7] = {c->tp_size, c->tp_rank, c->pp_size, c->pp_rank, c->pp_lo, c->pp_hi, kd_expert_parallel()};
        h = hash_bytes(h, t, sizeof t);
    }
    return h;
}

/* Where process r of a --tp T --pp P job keeps its shard of the disk tier:
 * DIR/tpT-ppP-rankR (DIR itself for one process), so that the processes do
 * not count or evict each other's files. */
static kiln_status rank_dir(const ke_ctx *c, const char *dir, char *buf, size_t cap) {
    if (c->tp_size == 1 && c->pp_size == 1) return snprintf(buf, cap, "%s", dir) < (int)cap ? NULL : kiln_error(KILN_EINVAL, "--cache-dir: the path is too long");
    mkdir(dir, 0755); /* kvd_open makes the last level; an error shows there */
    if (snprintf(buf, cap, "%s/tp%d-pp%d-rank%d", dir, c->tp_size, c->pp_size, c->pp_rank * c->tp_size + c->tp_rank) >= (int)cap)
        return kiln_error(KILN_EINVAL, "--cache-dir: the path is too long");
    return NULL;
}

static kiln_status disk_open(ke_ctx *c, const char *dir, int64_t max_bytes) {
    char sub[4096];
    if (dir) {
        KILN_TRY(rank_dir(c, dir, sub, sizeof sub));
        dir = sub;
    }
    KILN_TRY(kvd_open(dir, max_bytes, &c->disk));
    if (dir) c->model_id = model_identity(c->m), c->have_model_id = true;
    c->tier_id = c->model_id;
    c->layout_id = layout_identity(c);
    size_t n = sizeof(disk_head) + sizeof(int32_t) * (size_t)c->p.block_size +
               sizeof(float) * (size_t)(c->kv_floats + c->snap_numel);
    c->ondisk = calloc((size_t)c->n_blocks, 1);
    c->blob = malloc(n);
    if (!c->ondisk || !c->blob) {
        kvd_close(c->disk);
        c->disk = NULL;
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    ram_rebalance(c);
    return NULL;
}

/* The RAM tier gets what the budget leaves after the pool's snapshots. */
static void ram_rebalance(ke_ctx *c) {
    if (c->disk && !c->p.no_ram_tier) kvd_set_ram(c->disk, c->ram_budget - c->n_snaps * c->snap_numel * (int64_t)sizeof(float));
}

/* The file of the block with prefix hash h: distinct per model and layout. */
static uint64_t disk_key(const ke_ctx *c, uint64_t h) { return mix64(mix64(h ^ c->tier_id) ^ c->layout_id); }

/* Copies block b's K and V rows of every layer into buf (to_cache false) or buf into them. */
static void kv_copy(ke_ctx *c, int32_t b, float *buf, bool to_cache) {
    int64_t bs = c->p.block_size;
    for (int64_t l = 0; l < c->m->hp.n_layers; l++) {
        const kb_cache_spec *cs = &c->cache[l];
        if (!cs->heads) continue;
        for (int v = 0; v < 2; v++) {
            size_t n = (size_t)(bs * cs->heads * (v ? kv_row_bytes(c->p.cache_type_v, cs->dv)
                                                     : kv_row_bytes(c->p.cache_type_k, cs->dk))); /* bytes */
            char *at = (char *)(v ? c->vcache[l] : c->kcache[l]) + (size_t)b * n;
            if (to_cache) memcpy(at, buf, n);
            else memcpy(buf, at, n);
            buf = (float *)((char *)buf + n);
        }
    }
}

/* Writes the published block b to the tiers unless they already hold it. A
 * model whose layers keep no keys and values writes only blocks with a
 * snapshot (there is nothing else to keep). evict: b is leaving the pool,
 * its snapshot freed first (its bytes count against the RAM tier's room). */
static void disk_write(ke_ctx *c, int32_t b, bool evict) {
    if (!c->disk || !c->cached[b] || (c->ondisk[b] && kvd_has(c->disk, disk_key(c, c->bhash[b]), NULL))) return;
    bool snap = c->snap && c->snap[b];
    if (!c->kv_floats && !snap) return;
    int64_t bs = c->p.block_size;
    disk_head hd = {.model_id = c->tier_id, .layout_id = c->layout_id, .hash = c->bhash[b], .parent = c->bparent[b],
                    .block_size = (uint32_t)bs, .has_snap = snap, .kv_floats = (uint64_t)c->kv_floats,
                    .snap_floats = (uint64_t)c->snap_numel};
    memcpy(hd.magic, DISK_MAGIC, 8);
    unsigned char *p = c->blob;
    memcpy(p, &hd, sizeof hd), p += sizeof hd;
    memcpy(p, c->btok + b * bs, sizeof(int32_t) * (size_t)bs), p += sizeof(int32_t) * (size_t)bs;
    kv_copy(c, b, (float *)p, false), p += sizeof(float) * (size_t)c->kv_floats;
    if (snap) memcpy(p, c->snap[b], sizeof(float) * (size_t)c->snap_numel), p += sizeof(float) * (size_t)c->snap_numel;
    if (evict) snap_free(c, b);
    if (kvd_put(c->disk, disk_key(c, c->bhash[b]), &(kvd_seg){c->blob, (size_t)(p - c->blob)}, 1)) c->ondisk[b] = 1;
}

void ke_ctx_cache_flush(ke_ctx *c) {
    if (!c->disk) return;
    for (int32_t b = 0; b < c->n_blocks; b++) disk_write(c, b, false);
}

static void local_cache_drop(ke_ctx *c, bool ram) {
    while (c->lru_head >= 0) {
        int32_t b = c->lru_head;
        lru_unlink(c, b);
        disk_write(c, b, true);
        unpublish(c, b);
        c->free_blocks[c->n_free++] = b;
    }
    if (ram && c->disk) {
        kvd_set_ram(c->disk, 0);
        ram_rebalance(c);
    }
}

/* Reads the file of the block with hash h (parent, tokens t) from the tiers
 * and checks it belongs here; returns its payload (malloc'ed, starting with
 * the header) or NULL (a miss: absent or not a match). want_snap: only a
 * file with a snapshot. take: a RAM tier blob leaves the tier (*from_ram). */
static disk_head *disk_read(ke_ctx *c, uint64_t h, uint64_t parent, const int32_t *t, bool want_snap, bool take,
                            bool *from_ram) {
    uint64_t key = disk_key(c, h);
    size_t len, bs = (size_t)c->p.block_size;
    size_t base = sizeof(disk_head) + sizeof(int32_t) * bs + sizeof(float) * (size_t)c->kv_floats;
    /* a whole file without a snapshot is skipped unread when one is wanted;
     * any other length is read, to be found bad (and removed) */
    if (!kvd_has(c->disk, key, &len) || (want_snap && len == base)) return NULL;
    void *buf;
    if (!kvd_get(c->disk, key, take, &buf, &len, from_ram)) return NULL;
    disk_head hd;
    bool ok = len >= sizeof hd;
    if (ok) memcpy(&hd, buf, sizeof hd);
    ok = ok && !memcmp(hd.magic, DISK_MAGIC, 8) && hd.model_id == c->tier_id && hd.layout_id == c->layout_id &&
         hd.hash == h && hd.parent == parent && hd.block_size == bs && hd.kv_floats == (uint64_t)c->kv_floats &&
         hd.snap_floats == (uint64_t)c->snap_numel && hd.has_snap <= 1 &&
         len == base + (hd.has_snap ? sizeof(float) * (size_t)c->snap_numel : 0) && (!want_snap || hd.has_snap) &&
         !memcmp((char *)buf + sizeof hd, t, sizeof(int32_t) * bs);
    if (!ok) {
        c->disk_bad++;
        free(buf);
        return NULL;
    }
    return buf; /* malloc'ed memory is aligned for the header and the floats after it */
}

/* The keys and values in a block file's payload, then its snapshot. */
static const float *file_kv(const ke_ctx *c, const disk_head *hd) {
    return (const float *)((const char *)hd + sizeof(disk_head) + sizeof(int32_t) * (size_t)c->p.block_size);
}

/* A block for new tokens (reference count 1): a free one, else the cached
 * block released longest ago. The caller checked that one exists. */
static int32_t take_block(ke_ctx *c) {
    int32_t b;
    if (c->n_free > 0) {
        b = c->free_blocks[--c->n_free];
    } else {
        KILN_ASSERT(c->lru_head >= 0);
        b = c->lru_head;
        lru_unlink(c, b);
        disk_write(c, b, true);
        unpublish(c, b);
        c->evictions++;
    }
    c->ref[b] = 1;
    return b;
}

static void drop_block(ke_ctx *c, int32_t b) {
    KILN_ASSERT(c->ref[b] > 0);
    if (--c->ref[b] > 0) return;
    if (c->cached[b]) lru_push(c, b);
    else c->free_blocks[c->n_free++] = b;
}

static bool seq_reserve(ke_ctx *c, seq_state *q) {
    size_t n = (size_t)c->max_blocks_per_seq;
    int32_t *p = realloc(q->blocks, sizeof(int32_t) * n);
    if (!p) return false;
    q->blocks = p;
    uint64_t *h = realloc(q->hash, sizeof(uint64_t) * n);
    if (!h) return false;
    q->hash = h;
    q->cap_blocks = c->max_blocks_per_seq;
    return true;
}

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#define HASH_ROOT 0x6b696c6e70726678ull /* the parent of a sequence's first block */

static uint64_t block_hash(uint64_t parent, const int32_t *t, int64_t n) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int64_t i = 0; i < n; i++) h = mix64(h ^ (uint32_t)t[i]);
    return h;
}

static int32_t find_cached(const ke_ctx *c, uint64_t h, uint64_t parent, const int32_t *t) {
    int64_t bs = c->p.block_size;
    for (int32_t b = c->bucket[h & (uint64_t)(c->n_bucket - 1)]; b >= 0; b = c->hnext[b])
        if (c->bhash[b] == h && c->bparent[b] == parent && !memcmp(c->btok + b * bs, t, sizeof(int32_t) * (size_t)bs))
            return b;
    return -1;
}

int ke_ctx_block_size(const ke_ctx *c) { return c->p.block_size; }
int64_t ke_ctx_n_blocks(const ke_ctx *c) { return c->n_blocks; }
int64_t ke_ctx_window(const ke_ctx *c) { return c->window; }

void ke_ctx_cache_stats(const ke_ctx *c, ke_cache_stats *out) {
    *out = (ke_cache_stats){.n_blocks = c->n_blocks,
                            .n_free = c->n_free,
                            .n_cached = c->n_lru,
                            .n_used = c->n_blocks - c->n_free - c->n_lru,
                            .prefix_queries = c->prefix_queries,
                            .prefix_hits = c->prefix_hits,
                            .evictions = c->evictions,
                            .disk_hits = c->disk_hits,
                            .disk_bad = c->disk_bad,
                            .ram_budget = c->ram_budget,
                            .ram_hits = c->ram_hits,
                            .ram_bytes = c->n_snaps * c->snap_numel * (int64_t)sizeof(float)};
    if (c->disk) {
        kvd_stats d;
        kvd_get_stats(c->disk, &d);
        out->ram_blocks = d.ram_blobs;
        out->ram_bytes += d.ram_bytes;
        out->ram_spills = d.ram_spills + d.ram_drops;
        out->disk_writes = d.writes;
        out->disk_bad += d.bad;
        out->disk_files = d.files;
        out->disk_bytes = d.bytes;
    }
}

static seq_state *open_seq(const ke_ctx *c, int seq) {
    return seq >= 0 && seq < c->n_seqs && c->seqs[seq].open ? &c->seqs[seq] : NULL;
}

int64_t ke_seq_blocks_needed(const ke_ctx *c, int seq, int64_t n) {
    const seq_state *q = open_seq(c, seq);
    if (!q) return 0;
    int64_t bs = c->p.block_size, nb = (q->len + n + bs - 1) / bs;
    return nb > q->n_blocks ? nb - q->n_blocks : 0;
}

static int64_t longrope_limit(const km_hparams *hp);

/* Publishes block b (holding tokens t, full) under hash h. */
static void publish(ke_ctx *c, int32_t b, uint64_t h, uint64_t parent, const int32_t *t) {
    int64_t bs = c->p.block_size;
    c->cached[b] = 1;
    c->bhash[b] = h;
    c->bparent[b] = parent;
    memcpy(c->btok + b * bs, t, sizeof(int32_t) * (size_t)bs);
    int32_t *head = &c->bucket[h & (uint64_t)(c->n_bucket - 1)];
    c->hnext[b] = *head;
    *head = b;
}

/* Fills the holes (-2) of seq q's chain [0, n) with the blocks the disk
 * holds (see ke_ctx_cache_flush), each in a block taken from the pool
 * (never one of the chain: those are referenced), published and referenced
 * by q; returns how long the chain stays (it ends at the first hole that
 * cannot be filled, the blocks after it dropped) and counts the blocks read
 * in *n_read. A model whose layers keep no keys and values writes no file
 * for a block without a snapshot: such a block is taken as it is (it holds
 * nothing). */
static int64_t disk_fill(ke_ctx *c, seq_state *q, const int32_t *tokens, int64_t n, int64_t *n_read, int64_t *n_ram) {
    int64_t bs = c->p.block_size, j = 0;
    int32_t last_file_snap = -1;
    for (; j < n; j++) {
        if (q->blocks[j] != -2) continue;
        if (c->n_free + c->n_lru == 0) break;
        const int32_t *t = tokens + j * bs;
        uint64_t parent = j ? q->hash[j - 1] : HASH_ROOT;
        /* without keys and values a block holds nothing to read: only the
         * snapshot snap_depth restores is (read there, one file) */
        bool ram = false;
        disk_head *hd = c->kv_floats ? disk_read(c, q->hash[j], parent, t, false, true, &ram) : NULL;
        if (!hd && c->kv_floats) break;
        int32_t b = take_block(c);
        if (hd) kv_copy(c, b, (float *)file_kv(c, hd), true);
        publish(c, b, q->hash[j], parent, t);
        /* a taken RAM blob's snapshot comes along (the tier no longer has
         * it); of the files' only the deepest is kept (the one a resume
         * restores; the files keep the others) */
        if (hd && hd->has_snap && c->snap) {
            float *buf = snap_take(c, b);
            if (buf) memcpy(buf, file_kv(c, hd) + c->kv_floats, sizeof(float) * (size_t)c->snap_numel);
            if (buf && !ram) {
                if (last_file_snap >= 0) snap_free(c, last_file_snap);
                last_file_snap = b;
            }
        }
        if (hd) c->ondisk[b] = !ram, ++*(ram ? n_ram : n_read);
        free(hd);
        q->blocks[j] = b;
    }
    for (int64_t k = j; k < n; k++)
        if (q->blocks[k] >= 0) drop_block(c, q->blocks[k]);
    return j;
}

/* The deepest block of seq q's chain [0, n) that has a state snapshot, read
 * from disk when only the disk holds it (a few tries: each reads a file);
 * returns the number of blocks up to it (0: none). */
static int64_t snap_depth(ke_ctx *c, seq_state *q, const int32_t *tokens, int64_t n, bool *from_disk, bool *from_ram) {
    int64_t bs = c->p.block_size;
    int tries = 0;
    *from_disk = *from_ram = false;
    for (int64_t j = n - 1; j >= q->n_trimmed; j--) {
        int32_t b = q->blocks[j];
        if (c->snap[b]) return j + 1;
        if (!c->disk || tries >= 8) continue;
        const int32_t *t = tokens + j * bs;
        uint64_t parent = j ? q->hash[j - 1] : HASH_ROOT;
        if (!kvd_has(c->disk, disk_key(c, q->hash[j]), NULL)) continue;
        tries++;
        bool ram = false;
        disk_head *hd = disk_read(c, q->hash[j], parent, t, true, true, &ram);
        if (!hd) continue;
        float *buf = snap_take(c, b);
        if (buf) memcpy(buf, file_kv(c, hd) + c->kv_floats, sizeof(float) * (size_t)c->snap_numel);
        if (buf && !ram) c->ondisk[b] = 1; /* the file holds it all */
        free(hd);
        if (!buf) return 0;
        *(ram ? from_ram : from_disk) = true;
        return j + 1;
    }
    return 0;
}

/* Leading blocks a sequence of u blocks no longer needs when every cached
 * layer slides within w tokens (w 0: none), as ke_seq_trim_window counts
 * them: the next token, at position u * bs, attends to [u * bs - w + 1, u * bs]. */
static int64_t window_trim(int64_t bs, int64_t w, int64_t u) {
    int64_t keep = u * bs - w + 1;
    return w > 0 && keep > 0 ? keep / bs : 0;
}

static int64_t local_reuse_prefix(ke_ctx *c, int seq, const int32_t *tokens, int64_t n) {
    seq_state *q = open_seq(c, seq);
    if (!q || q->len != 0 || q->n_blocks != 0 || n <= 0 || (c->recurrent && !c->snap)) return 0;
    int64_t bs = c->p.block_size, full = (n - 1) / bs;
    if (full > c->max_blocks_per_seq) full = c->max_blocks_per_seq;
    c->prefix_queries += n;
    if (full == 0 || (!q->cap_blocks && !seq_reserve(c, q))) return 0;
    /* the chain of cached blocks: in memory, else in the tiers (a hole,
     * -2, filled next). A model whose every cached layer slides resumes at
     * u blocks with only the blocks its window still needs, [ntrim(u), u):
     * those before it may be gone (-1, as ke_seq_trim_window leaves them). */
    bool hold = c->disk != NULL;
    int64_t w = c->kv_floats ? c->window : 0, start = 0; /* [start, j) all there */
    uint64_t parent = HASH_ROOT;
    int64_t found = 0, deepest = 0, n_read = 0, n_ram = 0;
    for (int64_t j = 0; j < full; j++) {
        uint64_t h = block_hash(parent, tokens + j * bs, bs);
        int32_t b = find_cached(c, h, parent, tokens + j * bs);
        q->blocks[j] = b >= 0 ? b : -2;
        q->hash[j] = h;
        parent = h;
        if (b < 0 && !(hold && (!c->kv_floats || kvd_has(c->disk, disk_key(c, h), NULL)))) {
            if (w <= 0) break;
            start = j + 1;
            continue;
        }
        if (window_trim(bs, w, j + 1) >= start) found = j + 1;
    }
    int64_t ntr = window_trim(bs, w, found);
    for (int64_t j = 0; j < found; j++) {
        if (j < ntr) q->blocks[j] = -1;
        /* held at once when there are tiers, so that taking blocks for theirs cannot recycle them */
        else if (q->blocks[j] >= 0 && hold && c->ref[q->blocks[j]]++ == 0) lru_unlink(c, q->blocks[j]);
        if (j >= ntr && (q->blocks[j] >= 0 || kvd_has(c->disk, disk_key(c, q->hash[j]), NULL))) deepest = j + 1;
    }
    q->n_trimmed = ntr;
    if (hold) { /* holes past the deepest block known to exist: none (no keys and values, no file) */
        for (int64_t j = deepest; j < found; j++)
            if (q->blocks[j] >= 0) drop_block(c, q->blocks[j]);
        found = disk_fill(c, q, tokens, deepest, &n_read, &n_ram);
    }
    /* blocks that can be used: all, or up to the last with a state snapshot */
    bool snap_from_disk = false, snap_from_ram = false;
    int64_t usable = c->recurrent ? snap_depth(c, q, tokens, found, &snap_from_disk, &snap_from_ram) : found;
    if (window_trim(bs, w, usable) < ntr) usable = 0; /* shorter than the window it holds: it lacks blocks */
    for (int64_t j = usable; hold && j < found; j++)
        if (q->blocks[j] >= 0) drop_block(c, q->blocks[j]);
    for (int64_t j = ntr; !hold && j < usable; j++)
        if (c->ref[q->blocks[j]]++ == 0) lru_unlink(c, q->blocks[j]);
    q->n_blocks = usable;
    if (!usable) q->n_trimmed = 0;
    if (c->recurrent && usable) {
        int32_t b = q->blocks[usable - 1];
        state_copy(c, q->state_slot, c->snap[b], true);
        c->snap_used[b] = ++c->tick;
    }
    q->n_hashed = q->n_blocks;
    q->len = q->n_blocks * bs;
    if (q->len && longrope_limit(&c->m->hp) >= 0) { /* ke_decode may need to feed them again */
        if (!q->toks) q->toks = malloc(sizeof(int32_t) * (size_t)c->p.n_ctx);
        if (!q->toks) { /* cannot keep them: give the blocks back */
            for (int64_t j = 0; j < q->n_blocks; j++)
                if (q->blocks[j] >= 0) drop_block(c, q->blocks[j]);
            q->n_blocks = q->n_hashed = q->n_trimmed = 0;
            q->len = 0;
            return 0;
        }
        memcpy(q->toks, tokens, sizeof(int32_t) * (size_t)q->len);
    }
    c->prefix_hits += q->len;
    if (n_read || snap_from_disk) c->disk_hits += q->len;
    else if (n_ram || snap_from_ram) c->ram_hits += q->len;
    return q->len;
}

static void local_publish(ke_ctx *c, int seq, const int32_t *tokens, int64_t n) {
    seq_state *q = open_seq(c, seq);
    if (!q) return;
    int64_t bs = c->p.block_size, full = (n < q->len ? n : q->len) / bs;
    for (int64_t j = q->n_hashed; j < full; j++) {
        const int32_t *t = tokens + j * bs;
        uint64_t parent = j ? q->hash[j - 1] : HASH_ROOT, h = block_hash(parent, t, bs);
        q->hash[j] = h;
        int32_t b = q->blocks[j];
        if (b < 0 || c->cached[b] || find_cached(c, h, parent, t) >= 0) continue;
        publish(c, b, h, parent, t);
    }
    if (full > q->n_hashed) q->n_hashed = full;
    /* the state row holds the state after q->len tokens: keep it with the
     * block it completes */
    if (c->snap && q->len > 0 && q->len % bs == 0 && q->len / bs <= full) {
        int64_t j = q->len / bs - 1;
        int32_t b = q->blocks[j];
        /* a block found already cached under another sequence: the snapshot goes with that one */
        if (b < 0 || !c->cached[b]) b = find_cached(c, q->hash[j], j ? q->hash[j - 1] : HASH_ROOT, tokens + j * bs);
        if (b >= 0) snapshot(c, q, b);
    }
}

static int64_t local_trim_window(ke_ctx *c, int seq) {
    seq_state *q = open_seq(c, seq);
    if (!q || c->window <= 0) return 0;
    /* the next token, at position len, attends to [len - window + 1, len] */
    int64_t keep = q->len - c->window + 1, n = keep > 0 ? keep / c->p.block_size : 0, freed = 0;
    if (n > q->n_blocks) n = q->n_blocks;
    for (int64_t j = q->n_trimmed; j < n; j++)
        if (q->blocks[j] >= 0) {
            drop_block(c, q->blocks[j]);
            q->blocks[j] = -1;
            freed++;
        }
    if (n > q->n_trimmed) q->n_trimmed = n;
    return freed;
}

/* A fresh row of recurrent state (zeros or the layer's initial values,
 * kb_state_init), or -1 for a model without state. Resetting here (not in
 * the kernels at position 0) keeps the composites free of positions. */
/* State row r as a new sequence starts it. */
static void state_fresh(ke_ctx *c, int32_t r) {
    const km_hparams *hp = &c->m->hp;
    for (int64_t l = 0; l < hp->n_layers; l++)
        for (int k = 0; k < c->cache[l].n_states; k++) {
            kb_state_fill_row(&c->cache[l], k, c->state[l * KB_MAX_STATES + k] + r * c->cache[l].state_numel[k]);
        }
}

static int32_t take_state(ke_ctx *c) {
    if (!c->recurrent) return -1;
    int32_t r = c->free_state[--c->n_free_state];
    state_fresh(c, r);
    return r;
}

static kiln_status local_seq_open(ke_ctx *c, int *seq) {
    if (c->recurrent && c->n_free_state == 0)
        return kiln_error(KILN_ELIMIT, "all %lld recurrent state rows are in use (sequences open at once)",
                          (long long)c->n_state_slots);
    for (int i = 0; i < c->n_seqs; i++)
        if (!c->seqs[i].open) {
            c->seqs[i].open = true;
            c->seqs[i].len = 0;
            c->seqs[i].n_blocks = 0;
            c->seqs[i].n_hashed = 0;
            c->seqs[i].n_trimmed = 0;
            c->seqs[i].state_slot = take_state(c);
            c->seqs[i].rope_delta = 0;
            c->seqs[i].ckpt_len = -1;
            *seq = i;
            return NULL;
        }
    if (c->n_seqs == c->cap_seqs) {
        int nc = c->cap_seqs ? c->cap_seqs * 2 : 8;
        seq_state *p = realloc(c->seqs, sizeof(seq_state) * (size_t)nc);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        c->seqs = p;
        c->cap_seqs = nc;
    }
    c->seqs[c->n_seqs] = (seq_state){.open = true, .state_slot = take_state(c), .ckpt_len = -1};
    *seq = c->n_seqs++;
    return NULL;
}

static void local_seq_close(ke_ctx *c, int seq) {
    if (seq < 0 || seq >= c->n_seqs || !c->seqs[seq].open) return;
    seq_state *s = &c->seqs[seq];
    for (int64_t i = 0; i < s->n_blocks; i++)
        if (s->blocks[i] >= 0) drop_block(c, s->blocks[i]);
    s->n_blocks = 0;
    s->len = 0;
    s->open = false;
    if (s->state_slot >= 0) c->free_state[c->n_free_state++] = s->state_slot;
    s->state_slot = -1;
}

int64_t ke_seq_len(const ke_ctx *c, int seq) {
    return seq >= 0 && seq < c->n_seqs && c->seqs[seq].open ? c->seqs[seq].len : -1;
}

/* ---------------------------------------------------------------- rollback */

static kiln_status local_checkpoint(ke_ctx *c, int seq) {
    seq_state *q = open_seq(c, seq);
    if (!q) return kiln_error(KILN_EINVAL, "checkpoint: sequence %d is not open", seq);
    if (q->state_slot >= 0) {
        if (!q->ckpt_state && !(q->ckpt_state = malloc(sizeof(float) * (size_t)c->snap_numel)))
            return kiln_error(KILN_ENOMEM, "out of memory");
        state_copy(c, q->state_slot, q->ckpt_state, false);
    }
    q->ckpt_len = q->len;
    return NULL;
}

static kiln_status local_truncate(ke_ctx *c, int seq, int64_t len) {
    seq_state *q = open_seq(c, seq);
    if (!q) return kiln_error(KILN_EINVAL, "truncate: sequence %d is not open", seq);
    if (len < 0 || len > q->len)
        return kiln_error(KILN_EINVAL, "truncate: sequence %d holds %lld tokens, cannot keep %lld", seq, (long long)q->len,
                          (long long)len);
    if (len == q->len) return NULL;
    if (q->state_slot >= 0 && len != q->ckpt_len)
        return kiln_error(KILN_EUNSUPPORTED,
                          "truncate: sequence %d has recurrent state, which can only go back to its checkpoint (%lld tokens), not to %lld",
                          seq, (long long)q->ckpt_len, (long long)len);
    int64_t bs = c->p.block_size, keep = (len + bs - 1) / bs;
    if (keep < q->n_trimmed || (c->window > 0 && len - c->window + 1 > 0 && (len - c->window + 1) / bs < q->n_trimmed))
        return kiln_error(KILN_EUNSUPPORTED, "truncate: sequence %d released blocks its first %lld tokens still need (sliding window)",
                          seq, (long long)len);
    int64_t lim = longrope_limit(&c->m->hp);
    if (lim >= 0 && q->len > lim && len <= lim)
        return kiln_error(KILN_EUNSUPPORTED, "truncate: sequence %d switched to LongRoPE's long factors at %lld tokens, cannot go back to %lld",
                          seq, (long long)lim, (long long)len);
    if (len % bs && keep <= q->n_blocks) { /* the last kept block will be written again */
        int32_t b = q->blocks[keep - 1];
        if (b >= 0 && c->ref[b] > 1)
            return kiln_error(KILN_EUNSUPPORTED, "truncate: sequence %d shares the block holding position %lld with another sequence", seq,
                              (long long)len - 1);
        if (b >= 0 && c->cached[b]) unpublish(c, b);
    }
    for (int64_t j = keep; j < q->n_blocks; j++)
        if (q->blocks[j] >= 0) drop_block(c, q->blocks[j]);
    if (q->n_blocks > keep) q->n_blocks = keep;
    if (q->n_hashed > len / bs) q->n_hashed = len / bs;
    if (q->state_slot >= 0) state_copy(c, q->state_slot, q->ckpt_state, true);
    q->len = len;
    return NULL;
}

/* ---------------------------------------------------------------- decode */

static exec_entry *get_exec(ke_ctx *c, int64_t T, int64_t S, int64_t MB, int64_t R, bool cross, kiln_status *st) {
    *st = NULL;
    c->tick++;
    for (int i = 0; i < c->n_execs; i++) {
        exec_entry *e = &c->execs[i];
        if (e->T == T && e->S == S && e->MB == MB && e->R == R && e->cross == cross) {
            e->last_use = c->tick;
            return e;
        }
    }
    kb_shape shape = {T, S, MB, R, c->n_blocks * c->p.block_size, c->p.block_size, c->n_state_slots, cross,
                      kd_pp_size() > 1 /* pp_step shares the rows once per step */, {c->p.cache_type_k, c->p.cache_type_v}};
    kg_graph *g;
    kb_input *inputs;
    int n_inputs;
    *st = kb_build(c->m->fam, &c->m->hp, c->m->ck, &shape, &g, &inputs, &n_inputs, c->cache);
    if (*st) return NULL;
    kg_node *out0 = kg_output(g, 0);
    int64_t width = out0->shape.d[out0->shape.rank - 1];
    kr_exec *ex = NULL;
    kmlir_exec *mx = NULL;
    if (c->p.compile.mlir) *st = kmlir_exec_create(g, c->p.compile.mlir_tosa ? KMLIR_TOSA : KMLIR_LINALG, &mx);
    else *st = kr_exec_create(g, &c->p.compile, &ex);
    if (*st) {
        free(inputs);
        return NULL;
    }
    exec_entry *e;
    if (c->n_execs < MAX_EXECS) {
        e = &c->execs[c->n_execs++];
    } else { /* evict the least recently used */
        e = &c->execs[0];
        for (int i = 1; i < c->n_execs; i++)
            if (c->execs[i].last_use < e->last_use) e = &c->execs[i];
        kr_exec_destroy(e->exec);
        kmlir_exec_destroy(e->mexec);
        free(e->inputs);
    }
    *e = (exec_entry){T, S, MB, R, cross, width, ex, mx, inputs, n_inputs, c->tick};
    return e;
}

static bool grow_seq_scratch(ke_ctx *c) {
    if (c->n_seqs + 1 <= c->scratch_seqs) return true;
    int n = c->cap_seqs + 1;
    int32_t *r = realloc(c->row_of, sizeof(int32_t) * (size_t)n);
    if (r) c->row_of = r;
    int64_t *a = realloc(c->added, sizeof(int64_t) * (size_t)n);
    if (a) c->added = a;
    int64_t *d = realloc(c->run_delta, sizeof(int64_t) * (size_t)n);
    if (d) c->run_delta = d;
    if (!r || !a || !d) return false;
    c->scratch_seqs = n;
    return true;
}

static bool grow_scratch(ke_ctx *c, int64_t T, int64_t bt) {
    if (T > c->scratch_T) {
        size_t n = (size_t)T;
        int32_t **arr[] = {&c->pos, &c->tseq, &c->slot, &c->rows, &c->seq_len, &c->batch_seqs, &c->sslot, &c->embd_mask, &c->types};
        for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
            int32_t *p = realloc(*arr[i], n * sizeof(int32_t));
            if (!p) return false;
            *arr[i] = p;
        }
        int32_t *mp = realloc(c->mpos, n * 3 * sizeof(int32_t));
        if (!mp) return false;
        c->mpos = mp;
        for (int k = 0; k < KM_MAX_ROPES; k++) {
            size_t half = KM_ROPE_MAX_HALF;
            float *a = realloc(c->cos[k], n * half * sizeof(float));
            if (!a) return false;
            c->cos[k] = a;
            float *b = realloc(c->sin[k], n * half * sizeof(float));
            if (!b) return false;
            c->sin[k] = b;
        }
        if (c->m->vision || c->m->hp.bidirectional) {
            int32_t *sp = realloc(c->span, n * 2 * sizeof(int32_t));
            if (!sp) return false;
            c->span = sp;
        }
        if (c->m->vision || c->m->hp.hidden_in) {
            float *e = realloc(c->embd, n * (size_t)km_state_width(&c->m->hp) * sizeof(float)); /* hidden_in: the state's width */
            if (!e) return false;
            c->embd = e;
            if (c->m->hp.embd_add_layers > 0) {
                float *ea = realloc(c->embd_add, n * (size_t)(c->m->hp.embd_add_layers * c->m->hp.hidden) * sizeof(float));
                if (!ea) return false;
                c->embd_add = ea;
            }
        }
        c->scratch_T = T;
    }
    if (bt > c->scratch_bt) {
        int32_t *p = realloc(c->btab, (size_t)bt * sizeof(int32_t));
        if (!p) return false;
        c->btab = p;
        c->scratch_bt = bt;
    }
    return true;
}

static kiln_status decode_step(ke_ctx *c, const ke_batch *b, const ke_inputs *x, const int32_t *types, const float **logits,
                               int *n_rows) {
    *logits = NULL;
    *n_rows = 0;
    const km_hparams *hp = &c->m->hp;
    int64_t T = b->n, bs = c->p.block_size;
    if (!types && x) types = x->types;
    if (T <= 0) return kiln_error(KILN_EINVAL, "empty batch");
    /* validate, and count each sequence's new tokens */
    kiln_status st = NULL;
    if (!grow_seq_scratch(c) || !grow_scratch(c, T, 0)) return kiln_error(KILN_ENOMEM, "out of memory");
    int32_t *batch_seqs = c->batch_seqs, *row_of = c->row_of; /* distinct sequences, by first appearance */
    int64_t *added = c->added;
    memset(added, 0, sizeof(int64_t) * (size_t)(c->n_seqs + 1));
    int S = 0;
    for (int64_t t = 0; t < T; t++) {
        int s = b->seq[t];
        if (s < 0 || s >= c->n_seqs || !c->seqs[s].open) {
            st = kiln_error(KILN_EINVAL, "token %lld: sequence %d is not open", (long long)t, s);
            goto done;
        }
        int64_t n_ids = hp->embd_rows > hp->vocab ? hp->embd_rows : hp->vocab;
        if (b->tokens[t] < 0 || b->tokens[t] >= n_ids) {
            st = kiln_error(KILN_EINVAL, "token id %d is out of range (the vocabulary has %lld tokens)", b->tokens[t],
                            (long long)n_ids);
            goto done;
        }
        if (hp->bidirectional && c->seqs[s].len > 0) {
            st = kiln_error(KILN_EINVAL, "token %lld: sequence %d already holds %lld tokens; an encoder (bidirectional "
                            "attention) takes a sequence's tokens in one step", (long long)t, s, (long long)c->seqs[s].len);
            goto done;
        }
        if (types && (types[t] < 0 || types[t] >= (hp->type_vocab > 0 ? hp->type_vocab : 1))) {
            st = kiln_error(KILN_EINVAL, "token %lld: token type %d is out of range (the model has %lld)", (long long)t,
                            types[t], (long long)(hp->type_vocab > 0 ? hp->type_vocab : 1));
            goto done;
        }
        if (!added[s]) row_of[s] = S, batch_seqs[S++] = s;
        added[s]++;
    }
    for (int64_t t = 0; x && x->span && t < T; t++) {
        int s = b->seq[t];
        int32_t lo = x->span[2 * t], hi = x->span[2 * t + 1];
        if (lo <= hi && (lo < 0 || hi >= c->seqs[s].len + added[s])) {
            st = kiln_error(KILN_EINVAL, "token %lld: span [%d, %d] reaches past sequence %d's %lld tokens", (long long)t, lo, hi, s,
                            (long long)(c->seqs[s].len + added[s]));
            goto done;
        }
    }
    int64_t need = 0, maxb = 1;
    for (int i = 0; i < S; i++) {
        seq_state *q = &c->seqs[batch_seqs[i]];
        int64_t len = q->len + added[batch_seqs[i]];
        if (len > c->p.n_ctx) {
            st = kiln_error(KILN_ELIMIT, "sequence %d would hold %lld tokens, more than the context size %lld",
                            batch_seqs[i], (long long)len, (long long)c->p.n_ctx);
            goto done;
        }
        int64_t nb = (len + bs - 1) / bs;
        if (nb > q->n_blocks) need += nb - q->n_blocks;
        if (nb > maxb) maxb = nb;
    }
    if (need > c->n_free + c->n_lru) {
        st = kiln_error(KILN_ELIMIT, "the KV cache is full (%lld blocks needed, %lld free)", (long long)need,
                        (long long)(c->n_free + c->n_lru));
        goto done;
    }
    /* allocate blocks (cannot fail now) */
    for (int i = 0; i < S; i++) {
        seq_state *q = &c->seqs[batch_seqs[i]];
        int64_t nb = (q->len + added[batch_seqs[i]] + bs - 1) / bs;
        if (nb > q->cap_blocks && !seq_reserve(c, q)) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            goto done;
        }
        while (q->n_blocks < nb) q->blocks[q->n_blocks++] = take_block(c);
    }
    int64_t MB = pow2_at_least(maxb, c->max_blocks_per_seq), Sb = S;
    if (!grow_scratch(c, T, Sb * MB)) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto done;
    }
    /* per-token metadata. Positions follow batch order within a sequence,
     * so a sequence's tokens are in position order: the recurrent
     * composites rely on it (they run each sequence's tokens in batch order). */
    int64_t R = 0;
    for (int i = 0; i < S; i++) added[batch_seqs[i]] = 0; /* reuse as a running count */
    for (int64_t t = 0; t < T; t++) {
        int s = b->seq[t];
        seq_state *q = &c->seqs[s];
        int64_t p = q->len + added[s]++;
        c->pos[t] = (int32_t)p;
        c->tseq[t] = row_of[s];
        c->slot[t] = (int32_t)(q->blocks[p / bs] * bs + p % bs);
    }
    for (int64_t t = 0; t < T; t++) {
        int s = b->seq[t];
        c->seq_len[t] = (int32_t)(c->seqs[s].len + added[s]);
        bool want = b->logits ? b->logits[t] : (c->pos[t] == c->seq_len[t] - 1);
        if (want) c->rows[R++] = (int32_t)t;
    }
    if (R == 0) {
        /* no logits wanted: still run (fills the cache) with one row */
        c->rows[0] = (int32_t)(T - 1);
    }
    for (int i = 0; i < S; i++) c->sslot[i] = c->seqs[batch_seqs[i]].state_slot;
    for (int i = 0; i < S; i++) {
        seq_state *q = &c->seqs[batch_seqs[i]];
        for (int64_t j = 0; j < MB; j++) c->btab[i * MB + j] = j < q->n_blocks && q->blocks[j] >= 0 ? q->blocks[j] : 0;
    }
    if (hp->hidden_in) { /* a row per token (zeros where none) */
        int64_t W = km_state_width(hp);
        for (int64_t t = 0; t < T; t++) {
            const float *row = x && x->embd ? x->embd[t] : NULL;
            if (row) memcpy(c->embd + t * W, row, sizeof(float) * (size_t)W);
            else memset(c->embd + t * W, 0, sizeof(float) * (size_t)W);
        }
    }
    if (c->m->vision)
        for (int64_t t = 0; t < T; t++) {
            const float *row = x && x->embd ? x->embd[t] : NULL;
            c->embd_mask[t] = row != NULL;
            if (row) memcpy(c->embd + t * hp->hidden, row, sizeof(float) * (size_t)hp->hidden);
            c->span[2 * t] = x && x->span ? x->span[2 * t] : 1;
            c->span[2 * t + 1] = x && x->span ? x->span[2 * t + 1] : 0;
            int64_t L = hp->embd_add_layers * hp->hidden;
            const float *add = x && x->embd_add ? x->embd_add[t] : NULL;
            if (L > 0 && add) memcpy(c->embd_add + t * L, add, sizeof(float) * (size_t)L);
            else if (L > 0) memset(c->embd_add + t * L, 0, sizeof(float) * (size_t)L);
        }
    if (hp->bidirectional) /* each token sees its whole sequence */
        for (int64_t t = 0; t < T; t++) c->span[2 * t] = 0, c->span[2 * t + 1] = c->seq_len[t] - 1;
    for (int64_t t = 0; t < T && hp->type_vocab > 0; t++) c->types[t] = types ? types[t] : 0;
    bool mrope = false;
    for (int k = 0; k < hp->n_ropes; k++) mrope |= km_rope_is_mrope(&hp->ropes[k]);
    if (mrope) {
        /* given positions move the sequence's delta: later tokens continue from their largest component */
        for (int i = 0; i < S; i++) c->run_delta[batch_seqs[i]] = c->seqs[batch_seqs[i]].rope_delta;
        for (int64_t t = 0; t < T; t++) {
            int s = b->seq[t];
            int32_t *mp = c->mpos + 3 * t;
            if (x && x->positions && x->positions[3 * t] >= 0) {
                memcpy(mp, x->positions + 3 * t, 3 * sizeof(int32_t));
                int32_t mx = mp[0] > mp[1] ? mp[0] : mp[1];
                c->run_delta[s] = (mx > mp[2] ? mx : mp[2]) - (int64_t)c->pos[t];
            } else {
                mp[0] = mp[1] = mp[2] = (int32_t)(c->pos[t] + c->run_delta[s]);
            }
        }
    }
    for (int k = 0; k < hp->n_ropes; k++) {
        if (km_rope_is_mrope(&hp->ropes[k])) km_rope_fill_mrope(&hp->ropes[k], T, c->mpos, c->cos[k], c->sin[k]);
        else km_rope_fill(&hp->ropes[k], T, c->pos, c->seq_len, c->cos[k], c->sin[k]);
    }
    /* images for cross-attention layers: each sequence's, once (the layers keep their keys and values) */
    bool cross = false;
    for (int64_t t = 0; x && x->cross && t < T; t++) cross |= x->cross[t] != NULL;
    if (cross) {
        int64_t N = hp->cross_rows, E = hp->hidden;
        if (N <= 0) {
            st = kiln_error(KILN_EUNSUPPORTED, "the model has no cross-attention layers for an image's states");
            goto done;
        }
        if (Sb > c->cross_cap) {
            float *cs = realloc(c->cross, sizeof(float) * (size_t)(Sb * N * E));
            if (cs) c->cross = cs;
            int32_t *ck = realloc(c->cross_keys, sizeof(int32_t) * 2 * (size_t)Sb);
            if (ck) c->cross_keys = ck;
            if (!cs || !ck) {
                st = kiln_error(KILN_ENOMEM, "out of memory");
                goto done;
            }
            c->cross_cap = Sb;
        }
        for (int64_t i = 0; i < Sb; i++) c->cross_keys[2 * i] = -1, c->cross_keys[2 * i + 1] = 0;
        memset(c->cross, 0, sizeof(float) * (size_t)(Sb * N * E));
        for (int64_t t = 0; t < T; t++) {
            if (!x->cross[t]) continue;
            int s = b->seq[t];
            int32_t r = row_of[s], keys = x->cross_keys ? x->cross_keys[t] : (int32_t)N;
            if (c->seqs[s].len > 0 || c->cross_keys[2 * r] >= 0) {
                st = kiln_error(KILN_EUNSUPPORTED, "token %lld: sequence %d takes one image, in its first step (the tokens before the "
                                "image attend to it too)", (long long)t, s);
                goto done;
            }
            if (keys <= 0 || keys > N) {
                st = kiln_error(KILN_EINVAL, "token %lld: %d of the image's %lld cross-attention states attended", (long long)t, keys, (long long)N);
                goto done;
            }
            c->cross_keys[2 * r] = c->pos[t], c->cross_keys[2 * r + 1] = keys;
            memcpy(c->cross + r * N * E, x->cross[t], sizeof(float) * (size_t)(N * E));
        }
    }
    exec_entry *e = get_exec(c, T, Sb, MB, R ? R : 1, cross, &st);
    if (!e) goto done;
    if (e->n_inputs > c->cap_params) {
        void **np = realloc(c->params, sizeof(void *) * (size_t)e->n_inputs);
        if (!np) {
            st = kiln_error(KILN_ENOMEM, "out of memory");
            goto done;
        }
        c->params = np;
        c->cap_params = e->n_inputs;
    }
    void **params = c->params;
    for (int i = 0; i < e->n_inputs; i++) {
        const kb_input *in = &e->inputs[i];
        switch (in->role) {
        case KB_IN_TOKENS: params[i] = (void *)b->tokens; break;
        case KB_IN_POS: params[i] = c->pos; break;
        case KB_IN_SEQ: params[i] = c->tseq; break;
        case KB_IN_SLOT: params[i] = c->slot; break;
        case KB_IN_BLOCKS: params[i] = c->btab; break;
        case KB_IN_ROWS: params[i] = c->rows; break;
        case KB_IN_COS: params[i] = c->cos[in->index]; break;
        case KB_IN_SIN: params[i] = c->sin[in->index]; break;
        case KB_IN_KCACHE: params[i] = c->kcache[in->index]; break;
        case KB_IN_VCACHE: params[i] = c->vcache[in->index]; break;
        case KB_IN_STATE_SLOT: params[i] = c->sslot; break;
        case KB_IN_STATE: params[i] = c->state[in->index * KB_MAX_STATES + in->sub]; break;
        case KB_IN_EMBD: params[i] = c->embd; break;
        case KB_IN_EMBD_MASK: params[i] = c->embd_mask; break;
        case KB_IN_SPAN: params[i] = c->span; break;
        case KB_IN_EMBD_ADD: params[i] = c->embd_add; break;
        case KB_IN_TYPES: params[i] = c->types; break;
        case KB_IN_CROSS: params[i] = c->cross; break;
        case KB_IN_CROSS_KEYS: params[i] = c->cross_keys; break;
        }
    }
    if (e->mexec) kmlir_exec_run(e->mexec, params);
    else kr_exec_run(e->exec, params, c->pool);
    for (int64_t t = 0; t < T; t++) {
        seq_state *q = &c->seqs[b->seq[t]];
        if (q->toks) q->toks[c->pos[t]] = b->tokens[t];
    }
    for (int i = 0; i < S; i++) c->seqs[batch_seqs[i]].len += added[batch_seqs[i]];
    if (mrope)
        for (int i = 0; i < S; i++) c->seqs[batch_seqs[i]].rope_delta = c->run_delta[batch_seqs[i]];
    *logits = e->mexec ? kmlir_exec_output(e->mexec, 0) : kr_exec_output(e->exec, 0);
    *n_rows = (int)R;
    c->out_width = e->width;
done:
    return st;
}

/* ---------------------------------------------------------------- pipeline micro-batches */

/* --pp P: a step is split into micro-batches of whole sequences, run one
 * after the other on every stage, so that stage s computes micro-batch m
 * while stage s + 1 computes m - 1 (GPipe's fill and drain within the step:
 * the hand-offs between stages are the only waits, and a stage's send does
 * not wait: runtime/dist.h, kd_send_recv); the last stage's rows of each
 * micro-batch are sent to the others while it computes the next
 * (kd_pp_share_begin), and the step waits for them at its end. A sequence's
 * tokens all fall in one micro-batch, in the same order, so decode_step
 * sees for it what the whole step would show it (positions, lengths, wanted
 * rows), and by batch invariance (docs/design.md) its rows are the whole
 * step's, bit for bit. Rows come out in batch order: the micro-batches are
 * consecutive ranges of the batch. */

enum { PP_MAX_MICRO = 64 };

/* True when the whole step passes decode_step's checks (open sequences,
 * token ids, context, free blocks), so that no micro-batch fails after an
 * earlier one ran: a step that fails then does so whole (pp_step runs it
 * unsplit), leaving every sequence as it was. added: [n_seqs] zeros (scratch). */
static bool pp_step_fits(const ke_ctx *c, const ke_batch *b, int64_t *added) {
    const km_hparams *hp = &c->m->hp;
    int64_t n_ids = hp->embd_rows > hp->vocab ? hp->embd_rows : hp->vocab, bs = c->p.block_size, need = 0;
    for (int64_t t = 0; t < b->n; t++) {
        int s = b->seq[t];
        if (s < 0 || s >= c->n_seqs || !c->seqs[s].open || b->tokens[t] < 0 || b->tokens[t] >= n_ids) return false;
        added[s]++;
    }
    for (int s = 0; s < c->n_seqs; s++) {
        if (!added[s]) continue;
        const seq_state *q = &c->seqs[s];
        int64_t len = q->len + added[s], nb = (len + bs - 1) / bs;
        if (len > c->p.n_ctx) return false;
        if (nb > q->n_blocks) need += nb - q->n_blocks;
    }
    return need <= c->n_free + c->n_lru;
}

/* The micro-batches of b: token ranges [cut[m], cut[m + 1]), about b->n / M
 * tokens each, cut only where no sequence has tokens on both sides. Returns
 * their count (1: the step whole), or -1 when out of memory. */
static int pp_cuts(const ke_ctx *c, const ke_batch *b, int M, int *cut) {
    cut[0] = 0, cut[1] = b->n;
    if (M <= 1 || b->n < 2 || c->m->hp.bidirectional) return 1;
    int64_t *scratch = calloc((size_t)c->n_seqs + 1, sizeof(int64_t));
    if (!scratch) return -1;
    int n = 1;
    if (pp_step_fits(c, b, scratch)) {
        /* scratch[s]: now the last token of sequence s */
        for (int t = 0; t < b->n; t++) scratch[b->seq[t]] = t;
        int64_t reach = 0; /* the last token of a sequence met before t */
        for (int t = 1; t < b->n && n < M; t++) {
            if (scratch[b->seq[t - 1]] > reach) reach = scratch[b->seq[t - 1]];
            if (reach < t && (int64_t)t * M >= (int64_t)b->n * n) cut[n++] = t;
        }
        cut[n] = b->n;
    }
    free(scratch);
    return n;
}

/* decode_step, under --pp one micro-batch after another (see above). The
 * per-token inputs x and types keep a step whole. */
static kiln_status pp_step(ke_ctx *c, const ke_batch *b, const ke_inputs *x, const int32_t *types, const float **logits,
                           int *n_rows) {
    if (kd_pp_size() <= 1) return decode_step(c, b, x, types, logits, n_rows);
    *logits = NULL, *n_rows = 0;
    int cut[PP_MAX_MICRO + 1], want = kd_pp_micro() < PP_MAX_MICRO ? kd_pp_micro() : PP_MAX_MICRO;
    int M = x || types ? (cut[0] = 0, cut[1] = b->n, 1) : pp_cuts(c, b, want, cut);
    if (M < 0) return kiln_error(KILN_ENOMEM, "out of memory");
    int64_t R = 0;
    for (int m = 0; m < M; m++) {
        ke_batch mb = {cut[m + 1] - cut[m], b->tokens + cut[m], b->seq + cut[m], b->logits ? b->logits + cut[m] : NULL};
        const float *out;
        int n;
        kiln_status st = decode_step(c, M > 1 ? &mb : b, x, types, &out, &n);
        if (st) return st; /* with M > 1 only out of memory (pp_step_fits) */
        size_t row = (size_t)c->out_width;
        if ((R + n) * (int64_t)row > c->pp_cap) {
            kd_pp_share_wait(); /* the earlier micro-batches' rows move */
            int64_t cap = (R + n) * (int64_t)row * 2;
            float *p = realloc(c->pp_rows, sizeof(float) * (size_t)cap);
            if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
            c->pp_rows = p, c->pp_cap = cap;
        }
        if (n) memcpy(c->pp_rows + (size_t)R * row, out, sizeof(float) * row * (size_t)n);
        /* on their way from the last stage while it computes the next micro-batch */
        kd_pp_share_begin(c->pp_rows + (size_t)R * row, sizeof(float) * row * (size_t)n);
        R += n;
    }
    kd_pp_share_wait();
    *logits = c->pp_rows, *n_rows = (int)R;
    return NULL;
}

/* LongRoPE (Phi-3): a sequence uses the short factors while it fits in
 * original_max_position_embeddings and the long ones for every position once
 * it outgrows it. transformers then recomputes the whole cache, since keys
 * and every later layer depend on the factors; so does kiln: such a sequence's
 * earlier tokens are fed again, ahead of its new ones, from position 0. */
static int64_t longrope_limit(const km_hparams *hp) {
    for (int k = 0; k < hp->n_ropes; k++)
        if (hp->ropes[k].type == KM_ROPE_LONGROPE) return hp->ropes[k].orig_max_pos;
    return -1;
}

static kiln_status local_decode(ke_ctx *c, const ke_batch *b, const float **logits, int *n_rows);
static kiln_status local_decode_ex(ke_ctx *c, const ke_batch *b, const ke_inputs *x, const float **logits, int *n_rows) {
    if (x && !x->embd && !x->span && !x->positions && !x->embd_add && !x->cross && !x->types) x = NULL;
    if (x && longrope_limit(&c->m->hp) >= 0) return kiln_error(KILN_EUNSUPPORTED, "per-token inputs with LongRoPE are not supported");
    return x ? pp_step(c, b, x, NULL, logits, n_rows) : local_decode(c, b, logits, n_rows);
}

static kiln_status local_decode_types(ke_ctx *c, const ke_batch *b, const int32_t *types, const float **logits, int *n_rows) {
    if (!types) return local_decode(c, b, logits, n_rows);
    if (longrope_limit(&c->m->hp) >= 0) return kiln_error(KILN_EUNSUPPORTED, "token types with LongRoPE are not supported");
    return pp_step(c, b, NULL, types, logits, n_rows);
}

static kiln_status local_decode(ke_ctx *c, const ke_batch *b, const float **logits, int *n_rows) {
    int64_t lim = longrope_limit(&c->m->hp);
    if (lim < 0 || b->n <= 0) return pp_step(c, b, NULL, NULL, logits, n_rows);
    *logits = NULL;
    *n_rows = 0;
    int64_t *added = calloc((size_t)c->n_seqs + 1, sizeof(int64_t));
    if (!added) return kiln_error(KILN_ENOMEM, "out of memory");
    int64_t extra = 0;
    for (int t = 0; t < b->n; t++) {
        int s = b->seq[t];
        if (s < 0 || s >= c->n_seqs || !c->seqs[s].open) continue; /* decode_step reports it */
        if (!c->seqs[s].toks && !(c->seqs[s].toks = malloc(sizeof(int32_t) * (size_t)c->p.n_ctx))) {
            free(added);
            return kiln_error(KILN_ENOMEM, "out of memory");
        }
        added[s]++;
    }
    for (int s = 0; s < c->n_seqs; s++) {
        int64_t len = c->seqs[s].len;
        if (added[s] && len > 0 && len <= lim && len + added[s] > lim) extra += len;
        else added[s] = 0; /* now: 1 if s is fed again from position 0 */
        if (added[s]) added[s] = 1;
    }
    if (!extra) {
        free(added);
        return pp_step(c, b, NULL, NULL, logits, n_rows);
    }
    int n2 = b->n + (int)extra;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n2);
    int *seq = malloc(sizeof(int) * (size_t)n2);
    bool *want = malloc(sizeof(bool) * (size_t)n2);
    int64_t *len = malloc(sizeof(int64_t) * ((size_t)c->n_seqs + 1));
    kiln_status st = NULL;
    if (!tok || !seq || !want || !len) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto done;
    }
    int k = 0;
    for (int t = 0; t < b->n; t++) {
        int s = b->seq[t];
        if (s >= 0 && s < c->n_seqs && added[s] == 1) { /* first token of a sequence fed again */
            for (int64_t p = 0; p < c->seqs[s].len; p++) tok[k] = c->seqs[s].toks[p], seq[k] = s, want[k] = false, k++;
            added[s] = 2;
        }
        tok[k] = b->tokens[t], seq[k] = s;
        want[k] = b->logits ? b->logits[t] : false;
        k++;
    }
    for (int s = 0; s < c->n_seqs; s++) {
        seq_state *q = &c->seqs[s];
        len[s] = q->len;
        if (!added[s]) continue;
        /* recomputed from position 0 into fresh blocks: its old ones may be
         * shared with other sequences through the prefix cache */
        for (int64_t i = 0; i < q->n_blocks; i++)
            if (q->blocks[i] >= 0) drop_block(c, q->blocks[i]);
        q->n_blocks = q->n_hashed = q->n_trimmed = 0;
        q->len = 0;
    }
    /* logits == NULL means each sequence's last token, which the inserted tokens never are */
    st = pp_step(c, &(ke_batch){n2, tok, seq, b->logits ? want : NULL}, NULL, NULL, logits, n_rows);
    /* on failure a recomputed sequence is left empty (its old blocks are gone);
     * the others are as they were */
    if (st)
        for (int s = 0; s < c->n_seqs; s++)
            if (!added[s]) c->seqs[s].len = len[s];
done:
    free(added), free(tok), free(seq), free(want), free(len);
    return st;
}

/* ---------------------------------------------------------------- slot files */

/* A slot file's payload (ke_ctx_prefix_save): this header, the tokens, then
 * per block a u32 pair (has_snap, 0), its keys and values (as in a block
 * file) and its snapshot when it has one. */
typedef struct {
    char magic[8];
    uint64_t model_id, layout_id;
    uint32_t block_size, pad;
    uint64_t kv_floats, snap_floats;
    int64_t n_blocks;
} slot_head;

#define SLOT_MAGIC "kiln.slt"

static void ensure_identity(ke_ctx *c) {
    if (c->have_model_id) return;
    c->model_id = model_identity(c->m);
    c->have_model_id = true;
    c->layout_id = layout_identity(c);
}

static kiln_status local_prefix_save(ke_ctx *c, const int32_t *tokens, int64_t n, const char *path, int64_t *n_saved,
                                     size_t *n_written) {
    ensure_identity(c);
    int64_t bs = c->p.block_size, full = n / bs;
    if (full > c->max_blocks_per_seq) full = c->max_blocks_per_seq;
    /* the chain of cached blocks (memory, else the disk tier); payload[j] is
     * a block file's payload (disk) or NULL (memory: blk[j]) */
    int32_t *blk = calloc((size_t)(full + 1), sizeof(int32_t));
    disk_head **fromdisk = calloc((size_t)(full + 1), sizeof(disk_head *));
    kiln_status st = NULL;
    if (!blk || !fromdisk) {
        free(blk), free(fromdisk);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    uint64_t parent = HASH_ROOT;
    int64_t found = 0, usable = 0;
    for (; found < full; found++) {
        const int32_t *t = tokens + found * bs;
        uint64_t h = block_hash(parent, t, bs);
        blk[found] = find_cached(c, h, parent, t);
        if (blk[found] < 0 && c->disk) fromdisk[found] = disk_read(c, h, parent, t, false, false, NULL);
        if (blk[found] < 0 && !fromdisk[found] && c->kv_floats) break; /* no keys and values: nothing to miss */
        bool snap = blk[found] >= 0 ? c->snap && c->snap[blk[found]] : fromdisk[found] && fromdisk[found]->has_snap;
        if (!c->recurrent || snap) usable = found + 1; /* a recurrent model resumes only at a snapshot */
        parent = h;
    }
    size_t len = sizeof(slot_head) + sizeof(int32_t) * (size_t)(usable * bs);
    for (int64_t j = 0; j < usable; j++) {
        bool snap = blk[j] >= 0 ? c->snap && c->snap[blk[j]] : fromdisk[j] && fromdisk[j]->has_snap;
        len += 8 + sizeof(float) * (size_t)(c->kv_floats + (snap ? c->snap_numel : 0));
    }
    unsigned char *buf = malloc(len), *p = buf;
    if (!buf) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
    } else {
        slot_head hd = {.model_id = c->model_id, .layout_id = c->layout_id, .block_size = (uint32_t)bs,
                        .kv_floats = (uint64_t)c->kv_floats, .snap_floats = (uint64_t)c->snap_numel, .n_blocks = usable};
        memcpy(hd.magic, SLOT_MAGIC, 8);
        memcpy(p, &hd, sizeof hd), p += sizeof hd;
        if (usable) memcpy(p, tokens, sizeof(int32_t) * (size_t)(usable * bs)), p += sizeof(int32_t) * (size_t)(usable * bs);
        for (int64_t j = 0; j < usable; j++) {
            int32_t b = blk[j];
            const float *snap = b >= 0 ? (c->snap ? c->snap[b] : NULL)
                                       : fromdisk[j] && fromdisk[j]->has_snap ? file_kv(c, fromdisk[j]) + c->kv_floats : NULL;
            uint32_t flags[2] = {snap != NULL, 0};
            memcpy(p, flags, 8), p += 8;
            if (b >= 0) kv_copy(c, b, (float *)p, false);
            else if (fromdisk[j]) memcpy(p, file_kv(c, fromdisk[j]), sizeof(float) * (size_t)c->kv_floats);
            else memset(p, 0, sizeof(float) * (size_t)c->kv_floats);
            p += sizeof(float) * (size_t)c->kv_floats;
            if (snap) memcpy(p, snap, sizeof(float) * (size_t)c->snap_numel), p += sizeof(float) * (size_t)c->snap_numel;
        }
        st = kvd_write_file(path, &(kvd_seg){buf, len}, 1, n_written);
    }
    for (int64_t j = 0; j <= full; j++) free(fromdisk[j]);
    free(fromdisk), free(blk), free(buf);
    if (!st) *n_saved = usable * bs;
    return st;
}

static kiln_status local_prefix_restore(ke_ctx *c, const char *path, int32_t **tokens, int64_t *n_restored,
                                        size_t *n_read) {
    *tokens = NULL;
    *n_restored = 0;
    ensure_identity(c);
    void *raw;
    size_t len;
    if (c->recurrent && !c->snap)
        return kiln_error(KILN_EUNSUPPORTED,
                          "this context keeps no state snapshots (--cache-ram 0), without which a model with recurrent "
                          "state cannot resume from a restored prefix");
    KILN_TRY(kvd_read_file(path, &raw, &len));
    *n_read = len;
    const unsigned char *p = raw, *end = p + len;
    slot_head hd;
    int64_t bs = c->p.block_size;
    kiln_status st = NULL;
    if (len < sizeof hd || (memcpy(&hd, p, sizeof hd), memcmp(hd.magic, SLOT_MAGIC, 8)))
        st = kiln_error(KILN_EINVAL, "%s is not a kiln slot file", path);
    else if (hd.model_id != c->model_id)
        st = kiln_error(KILN_EINVAL, "%s was saved by another model (its weights or config differ)", path);
    else if (hd.layout_id != c->layout_id || hd.block_size != (uint32_t)bs || hd.kv_floats != (uint64_t)c->kv_floats ||
             hd.snap_floats != (uint64_t)c->snap_numel)
        st = kiln_error(KILN_EINVAL, "%s was saved with another cache layout (block size, shapes, kernels or the --tp/--pp "
                        "shard differ)", path);
    else if (hd.n_blocks < 0 || hd.n_blocks > c->max_blocks_per_seq ||
             (size_t)(end - p - sizeof hd) < sizeof(int32_t) * (size_t)(hd.n_blocks * bs))
        st = kiln_error(KILN_EINVAL, "%s: %lld blocks do not fit this context or the file", path, (long long)hd.n_blocks);
    if (st) {
        free(raw);
        return st;
    }
    p += sizeof hd;
    const int32_t *t0 = (const int32_t *)p;
    p += sizeof(int32_t) * (size_t)(hd.n_blocks * bs);
    /* check the whole layout before touching the cache */
    const unsigned char *q = p;
    for (int64_t j = 0; j < hd.n_blocks && !st; j++) {
        uint32_t flags[2];
        if ((size_t)(end - q) < 8) break;
        memcpy(flags, q, 8);
        size_t need = 8 + sizeof(float) * (size_t)(c->kv_floats + (flags[0] ? c->snap_numel : 0));
        if (flags[0] > 1 || flags[1] || (size_t)(end - q) < need) break;
        q += need;
        if (j == hd.n_blocks - 1 && q == end) q = NULL; /* all well */
    }
    if (hd.n_blocks > 0 ? q != NULL : p != end) {
        free(raw);
        return kiln_error(KILN_EINVAL, "%s: its blocks do not match its header", path);
    }
    int32_t *held = malloc(sizeof(int32_t) * (size_t)(hd.n_blocks + 1));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(hd.n_blocks * bs + 1));
    if (!held || !tok) {
        free(held), free(tok), free(raw);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    memcpy(tok, t0, sizeof(int32_t) * (size_t)(hd.n_blocks * bs));
    /* each block held (referenced) until the end, so that taking a block for
     * the next cannot recycle it */
    uint64_t parent = HASH_ROOT;
    int64_t j = 0, usable = 0;
    for (; j < hd.n_blocks; j++) {
        const int32_t *t = t0 + j * bs;
        uint32_t flags[2];
        memcpy(flags, p, 8);
        const float *kv = (const float *)(p + 8), *snap = flags[0] ? kv + c->kv_floats : NULL;
        uint64_t h = block_hash(parent, t, bs);
        int32_t b = find_cached(c, h, parent, t);
        if (b >= 0) {
            if (c->ref[b]++ == 0) lru_unlink(c, b);
        } else {
            if (c->n_free + c->n_lru == 0) break;
            b = take_block(c);
            kv_copy(c, b, (float *)kv, true);
            publish(c, b, h, parent, t);
        }
        if (snap && c->snap && !c->snap[b]) {
            float *buf = snap_take(c, b);
            if (buf) memcpy(buf, snap, sizeof(float) * (size_t)c->snap_numel);
        }
        held[j] = b;
        if (!c->recurrent || c->snap[b]) usable = j + 1; /* a recurrent model resumes only at a snapshot */
        p += 8 + sizeof(float) * (size_t)(c->kv_floats + (snap ? c->snap_numel : 0));
        parent = h;
    }
    for (int64_t k = 0; k < j; k++) drop_block(c, held[k]);
    free(held), free(raw);
    *tokens = tok;
    *n_restored = usable * bs;
    return NULL;
}

/* ---------------------------------------------------------------- mirroring (mirror.c) */

void ke_ctx_lead(ke_ctx *c) { c->lead = c->job; }

/* Each call that changes the context, broadcast first when it leads, its
 * result after (the followers check theirs against it); a solo context's
 * in the layout it was made in. */
#define MIRRORED(c, send, result_expr, call)                                                                           \
    do {                                                                                                               \
        if (c->lead) send;                                                                                             \
        if (c->solo) kd_solo_begin();                                                                                  \
        call;                                                                                                          \
        if (c->solo) kd_solo_end();                                                                                    \
        if (c->lead) kem_result(result_expr);                                                                          \
    } while (0)

static int64_t st_result(kiln_status st, int64_t ok) { return st ? -(int64_t)kiln_status_code(st) - 1 : ok; }

/* ---- agreement across a job's processes (c->job). Each holds its shard
 * of the cache, with its own RAM and disk tiers, so one may hit where
 * another misses (another eviction order, a file lost): every call that
 * finds cached blocks or reads slot files ends with the processes agreeing
 * on the least any of them has (a miss on one is a miss for all), so that
 * their sequences stay alike and the steps that follow meet. */

/* Every process's v; *lo, *hi their least and greatest. */
static void job_range(int64_t v, int64_t *lo, int64_t *hi) {
    int n = kd_size();
    int64_t *all = malloc(sizeof(int64_t) * (size_t)n);
    if (!all) {
        fprintf(stderr, "kiln: rank %d: out of memory\n", kd_rank());
        kd_abort(70);
    }
    kd_all_gather(&v, sizeof v, all);
    *lo = *hi = all[0];
    for (int i = 1; i < n; i++) *lo = all[i] < *lo ? all[i] : *lo, *hi = all[i] > *hi ? all[i] : *hi;
    free(all);
}

/* Gives seq q's blocks back, as if it had just been opened. */
static void seq_reset(ke_ctx *c, seq_state *q) {
    for (int64_t j = 0; j < q->n_blocks; j++)
        if (q->blocks[j] >= 0) drop_block(c, q->blocks[j]);
    q->n_blocks = q->n_hashed = q->n_trimmed = q->len = 0;
    if (q->state_slot >= 0) state_fresh(c, q->state_slot);
}

/* local_reuse_prefix, then, in a job, down to the prefix every process
 * found: one that found more gives its blocks back and looks again for
 * that many tokens only (a model with recurrent state may then resume
 * shorter still, at an earlier snapshot: again until all agree; the blocks
 * it gave back stay cached, so the second look finds them in memory). */
static int64_t agreed_reuse_prefix(ke_ctx *c, int seq, const int32_t *tokens, int64_t n) {
    int64_t q0 = c->prefix_queries, h0 = c->prefix_hits, d0 = c->disk_hits, r0 = c->ram_hits;
    int64_t r = local_reuse_prefix(c, seq, tokens, n), lo, hi;
    bool disk = c->disk_hits > d0, ram = !disk && c->ram_hits > r0;
    while (c->job && (job_range(r, &lo, &hi), lo != hi)) {
        seq_state *q = open_seq(c, seq);
        if (r == lo || !q) continue;
        seq_reset(c, q);
        c->prefix_hits = h0, c->disk_hits = d0, c->ram_hits = r0;
        r = local_reuse_prefix(c, seq, tokens, lo + 1); /* (lo + 1 - 1) / bs blocks: lo tokens at most */
        c->prefix_queries = q0 + n;
        c->disk_hits = d0 + (disk ? r : 0), c->ram_hits = r0 + (ram ? r : 0); /* where the first look found them */
    }
    return r;
}

/* One process's outcome of a slot call (ke_ctx_prefix_save, _restore). */
typedef struct {
    int64_t code; /* 0: done */
    int64_t n, bytes;
    uint64_t tokens; /* a hash of the slot's tokens */
    char msg[232];
} slot_outcome;

/* The job's outcome of a slot call that st (NULL: done, with *n tokens and
 * *bytes of this process's file) ended on this process: the first process's
 * error, on every process (naming that process when it is another), else
 * the fewest tokens any has and the bytes of all the files. */
static kiln_status slot_agree(ke_ctx *c, kiln_status st, const int32_t *tokens, int64_t *n, size_t *bytes) {
    if (!c->job) return st;
    int np = kd_size();
    slot_outcome me = {.code = st ? kiln_status_code(st) : 0, .n = st ? 0 : *n, .bytes = st ? 0 : (int64_t)*bytes};
    int64_t lo, hi;
    job_range(me.n, &lo, &hi); /* the tokens all the files hold, to compare */
    me.tokens = st || !lo ? 0 : hash_bytes(0x6b696c6e736c6f74ull, tokens, sizeof(int32_t) * (size_t)lo);
    if (st) snprintf(me.msg, sizeof me.msg, "%s", kiln_status_msg(st));
    slot_outcome *all = malloc(sizeof *all * (size_t)np);
    if (!all) {
        fprintf(stderr, "kiln: rank %d: out of memory\n", kd_rank());
        kd_abort(70);
    }
    kd_all_gather(&me, sizeof me, all);
    kiln_status out = st;
    int64_t sum = 0;
    for (int i = 0; i < np && !out; i++) {
        if (all[i].code) out = kiln_error((kiln_code)all[i].code, "rank %d of %d: %s", i, np, all[i].msg);
        else if (all[i].tokens != all[0].tokens)
            out = kiln_error(KILN_EINVAL, "rank %d of %d: its slot file holds other tokens than rank 0's (files of different saves)", i, np);
        sum += all[i].bytes;
    }
    free(all);
    if (!out) *n = lo, *bytes = (size_t)sum;
    return out;
}

/* Process r of a --tp T --pp P job keeps its shard of slot file PATH at
 * PATH.tpT-ppP-rankR (one process: PATH), so that a file of another layout
 * is not found by its name. */
static kiln_status slot_path(const ke_ctx *c, const char *path, char *buf, size_t cap) {
    int n = c->tp_size == 1 && c->pp_size == 1
                ? snprintf(buf, cap, "%s", path)
                : snprintf(buf, cap, "%s.tp%d-pp%d-rank%d", path, c->tp_size, c->pp_size, c->pp_rank * c->tp_size + c->tp_rank);
    return n < (int)cap ? NULL : kiln_error(KILN_EINVAL, "%s: the path is too long", path);
}

/* Why the file p of slot file path is not there, when a file of another
 * layout is (NULL otherwise: the read names what it finds). */
static kiln_status slot_missing(const ke_ctx *c, const char *path, const char *p) {
    if (ku_file_exists(p)) return NULL;
    if (c->tp_size > 1 || c->pp_size > 1)
        return kiln_error(KILN_ENOTFOUND, "%s: no such file: under --tp %d --pp %d each process restores its own shard of "
                          "slot file %s, saved by a job of the same layout%s", p, c->tp_size, c->pp_size, path,
                          ku_file_exists(path) ? " (the file of that name is one process's)" : "");
    glob_t g;
    char pat[4200];
    snprintf(pat, sizeof pat, "%s.tp*-pp*-rank0", path);
    kiln_status st = NULL;
    if (glob(pat, GLOB_NOSORT, NULL, &g) == 0 && g.gl_pathc > 0)
        st = kiln_error(KILN_ENOTFOUND, "%s: no such file; %s is rank 0's shard of a --tp/--pp job's save: restore it under "
                        "the layout it was saved with", path, g.gl_pathv[0]);
    globfree(&g);
    return st;
}

kiln_status ke_ctx_prefix_save(ke_ctx *c, const int32_t *tokens, int64_t n, const char *path, int64_t *n_saved,
                               size_t *n_written) {
    kiln_status st;
    char p[4096];
    *n_saved = 0, *n_written = 0;
    MIRRORED(c, kem_send_path(KEM_SAVE, tokens, n, path), st_result(st, *n_saved),
             st = slot_path(c, path, p, sizeof p);
             if (!st) st = local_prefix_save(c, tokens, n, p, n_saved, n_written);
             st = slot_agree(c, st, tokens, n_saved, n_written));
    return st;
}

kiln_status ke_ctx_prefix_restore(ke_ctx *c, const char *path, int32_t **tokens, int64_t *n_restored, size_t *n_read) {
    kiln_status st;
    char p[4096];
    *tokens = NULL, *n_restored = 0, *n_read = 0;
    MIRRORED(c, kem_send_path(KEM_RESTORE, NULL, 0, path), st_result(st, *n_restored),
             st = slot_path(c, path, p, sizeof p);
             if (!st) st = slot_missing(c, path, p);
             if (!st) st = local_prefix_restore(c, p, tokens, n_restored, n_read);
             st = slot_agree(c, st, *tokens, n_restored, n_read));
    if (st) free(*tokens), *tokens = NULL;
    return st;
}


kiln_status ke_seq_open(ke_ctx *c, int *seq) {
    kiln_status st;
    MIRRORED(c, kem_send(KEM_OPEN, 0, 0, NULL, 0), st_result(st, *seq), st = local_seq_open(c, seq));
    return st;
}
void ke_seq_close(ke_ctx *c, int seq) { MIRRORED(c, kem_send(KEM_CLOSE, seq, 0, NULL, 0), 0, local_seq_close(c, seq)); }
int64_t ke_seq_reuse_prefix(ke_ctx *c, int seq, const int32_t *tokens, int64_t n) {
    int64_t r;
    MIRRORED(c, kem_send(KEM_REUSE, seq, 0, tokens, n), r, r = agreed_reuse_prefix(c, seq, tokens, n));
    return r;
}
void ke_seq_publish(ke_ctx *c, int seq, const int32_t *tokens, int64_t n) {
    MIRRORED(c, kem_send(KEM_PUBLISH, seq, 0, tokens, n), 0, local_publish(c, seq, tokens, n));
}
int64_t ke_seq_trim_window(ke_ctx *c, int seq) {
    int64_t r;
    MIRRORED(c, kem_send(KEM_TRIM, seq, 0, NULL, 0), r, r = local_trim_window(c, seq));
    return r;
}
kiln_status ke_seq_checkpoint(ke_ctx *c, int seq) {
    kiln_status st;
    MIRRORED(c, kem_send(KEM_CKPT, seq, 0, NULL, 0), st_result(st, 0), st = local_checkpoint(c, seq));
    return st;
}
kiln_status ke_seq_truncate(ke_ctx *c, int seq, int64_t len) {
    kiln_status st;
    MIRRORED(c, kem_send(KEM_TRUNC, seq, len, NULL, 0), st_result(st, 0), st = local_truncate(c, seq, len));
    return st;
}
void ke_ctx_cache_drop(ke_ctx *c, bool ram) {
    MIRRORED(c, kem_send(KEM_DROP, ram, 0, NULL, 0), 0, local_cache_drop(c, ram));
}
kiln_status ke_decode(ke_ctx *c, const ke_batch *b, const float **logits, int *n_rows) {
    kiln_status st;
    MIRRORED(c, kem_send_decode(KEM_DECODE, &c->m->hp, b, NULL, NULL), st_result(st, *n_rows),
             st = local_decode(c, b, logits, n_rows));
    return st;
}
kiln_status ke_decode_ex(ke_ctx *c, const ke_batch *b, const ke_inputs *x, const float **logits, int *n_rows) {
    kiln_status st;
    MIRRORED(c, kem_send_decode(KEM_DECODE_EX, &c->m->hp, b, x, NULL), st_result(st, *n_rows),
             st = local_decode_ex(c, b, x, logits, n_rows));
    return st;
}
kiln_status ke_decode_types(ke_ctx *c, const ke_batch *b, const int32_t *types, const float **logits, int *n_rows) {
    kiln_status st;
    MIRRORED(c, kem_send_decode(KEM_DECODE_TYPES, &c->m->hp, b, NULL, types), st_result(st, *n_rows),
             st = local_decode_types(c, b, types, logits, n_rows));
    return st;
}
