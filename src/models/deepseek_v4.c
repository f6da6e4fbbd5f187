/* deepseek_v4.c: DeepSeek-V4 (DeepseekV4ForCausalLM). Every layer keeps
 * hc_mult residual streams mixed by manifold-constrained hyper-connections
 * (kb_hc_collapse / kb_hc_expand around attention and the MLP, kb_hc_head
 * before the final norm). Attention (kb_v4_attention): queries from
 * q_lora, one shared key/value head, interleaved rope on the trailing
 * qk_rope_head_dim dims ("main" rope on sliding layers, "compress" on the
 * others), a sliding window, and by layer_types compressed entries:
 * heavily compressed (HCA, non-overlapping windows) or compressed sparse
 * (CSA, overlapping windows, the lightning indexer's top index_topk);
 * per-head sinks; the grouped low-rank output projection. MoE on every
 * layer: sqrt(softplus) router scores, experts chosen by token id (tid2eid)
 * on the "hash_moe" layers, else top-k with e_score_correction_bias,
 * renormalised times routed_scaling_factor, clamped SwiGLU experts and a
 * shared expert; the head is `head.weight`. The state an MTP head reads
 * (mtp_state) is the hc_mult streams before hc_head: the MTP layer (mtp.<i>.*,
 * not used for plain decoding) reads: `kiln info` reports it and --spec-mtp
 * drafts with it, this emitter building the head (models/blocks_mtp.c). */
#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "models/moe.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    KM_MOE_EXPERT_NAMES(MLP, "w1", "w3", "w2"),
    KM_MOE_SHARED_NAMES(MLP ".shared_experts"),
    [KM_T_MOE_ROUTER] = MLP ".gate",
    [KM_T_MOE_ROUTER_BIAS] = MLP ".gate.e_score_correction_bias",
};

/* layer_types and mlp_layer_types: one entry per layer. */
static kiln_status layer_list(const cJSON *cfg, km_hparams *hp, const char *key, const cJSON **out) {
    const cJSON *l = ku_json_get(cfg, key);
    if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != hp->n_layers)
        return kiln_error(KILN_EINVAL, "config.json: \"%s\" must list one type per layer (%lld)", key, (long long)hp->n_layers);
    *out = l;
    return NULL;
}

static kiln_status ropes(const cJSON *cfg, km_hparams *hp, int dim) {
    static const char *const kinds[] = {"main", "compress"};
    for (int i = 0; i < 2; i++) {
        const cJSON *rp = km_rope_params(hp, kinds[i]);
        double theta;
        KILN_TRY(ku_json_num(cfg, i ? "compress_rope_theta" : "rope_theta", i ? 160000.0 : 10000.0, &theta));
        KILN_TRY(ku_json_num(rp, "rope_theta", theta, &theta));
        KILN_TRYF(km_rope_init(&hp->ropes[i], rp, theta, dim, hp->max_pos), "config.json: rope_parameters.%s", kinds[i]);
        hp->ropes[i].interleaved = true;
    }
    hp->n_ropes = 2;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps));
    KILN_TRY(ku_json_int(cfg, "q_lora_rank", 1024, &hp->q_lora_rank));
    KILN_TRY(ku_json_int(cfg, "qk_rope_head_dim", 64, &hp->qk_rope_dim));
    KILN_TRY(ku_json_int(cfg, "o_groups", 8, &hp->o_groups));
    KILN_TRY(ku_json_int(cfg, "o_lora_rank", 1024, &hp->o_lora_rank));
    KILN_TRY(ku_json_int(cfg, "hc_mult", 4, &hp->hc_mult));
    KILN_TRY(ku_json_int(cfg, "hc_sinkhorn_iters", 20, &hp->hc_iters));
    double e;
    KILN_TRY(ku_json_num(cfg, "hc_eps", 1e-6, &e));
    hp->hc_eps = (float)e;
    KILN_TRY(ku_json_int(cfg, "index_topk", 512, &hp->dsa_topk));
    KILN_TRY(ku_json_int(cfg, "index_n_heads", 64, &hp->dsa_heads));
    KILN_TRY(ku_json_int(cfg, "index_head_dim", 128, &hp->dsa_dim));
    if (hp->q_lora_rank < 1 || hp->o_groups < 1 || hp->o_lora_rank < 1 || hp->hc_mult < 1 || hp->hc_iters < 1 || hp->dsa_topk < 1 ||
        hp->dsa_heads < 1 || hp->qk_rope_dim < 2 || hp->qk_rope_dim > hp->head_dim || hp->qk_rope_dim > hp->dsa_dim)
        return kiln_error(KILN_EINVAL, "config.json: deepseek_v4 ranks, groups, hc_mult and index sizes must be positive, "
                                       "qk_rope_head_dim within head_dim and index_head_dim");
    /* attention by layer_types, with compress_rates */
    int64_t csa = 4, hca = 128;
    const cJSON *rates = ku_json_get(cfg, "compress_rates"), *l, *t;
    KILN_TRY(ku_json_int(rates, "compressed_sparse_attention", 4, &csa));
    KILN_TRY(ku_json_int(rates, "heavily_compressed_attention", 128, &hca));
    if (csa < 1 || hca < 1 || csa > 255 || hca > 255) return kiln_error(KILN_EUNSUPPORTED, "config.json: compress_rates must be 1 to 255");
    KILN_TRY(layer_list(cfg, hp, "layer_types", &l));
    int i = 0;
    cJSON_ArrayForEach(t, l) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "";
        hp->layer_csa[i] = !strcmp(s, "compressed_sparse_attention");
        hp->layer_compress[i] = hp->layer_csa[i] ? (unsigned char)csa : !strcmp(s, "heavily_compressed_attention") ? (unsigned char)hca : 0;
        if (!hp->layer_compress[i] && strcmp(s, "sliding_attention"))
            return kiln_error(KILN_EINVAL, "config.json: layer_types[%d] \"%s\" is not a DeepSeek-V4 attention", i, s);
        i++;
    }
    KILN_TRY(ku_json_int(cfg, "sliding_window", 128, &hp->sliding_window));
    if (hp->sliding_window < 1) return kiln_error(KILN_EINVAL, "config.json: sliding_window must be positive");
    KILN_TRY(ropes(cfg, hp, (int)hp->qk_rope_dim));
    /* the experts */
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "n_routed_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .n_shared = "n_shared_experts", .type_list = "mlp_layer_types", .norm_topk = true, .top_k_def = 6}));
    const char *score;
    KILN_TRY(ku_json_str(cfg, "scoring_func", "sqrtsoftplus", &score));
    if (strcmp(score, "sqrtsoftplus")) return kiln_error(KILN_EUNSUPPORTED, "config.json: deepseek_v4 scoring_func \"%s\"", score);
    hp->moe_score = KM_MOE_SQRT_SOFTPLUS;
    hp->moe_router_bias = true;
    hp->moe_norm_topk = true;
    double v;
    KILN_TRY(ku_json_num(cfg, "swiglu_limit", 10.0, &v));
    hp->moe_swiglu_limit = (float)v;
    KILN_TRY(layer_list(cfg, hp, "mlp_layer_types", &l));
    i = 0;
    cJSON_ArrayForEach(t, l) {
        const char *s = cJSON_IsString(t) ? t->valuestring : "";
        if (strcmp(s, "hash_moe") && strcmp(s, "moe"))
            return kiln_error(KILN_EUNSUPPORTED, "config.json: mlp_layer_types[%d] \"%s\" (want hash_moe or moe)", i, s);
        hp->layer_hash[i++] = !strcmp(s, "hash_moe");
    }
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: deepseek_v4 needs n_routed_experts");
    if (hp->ffn <= 0) hp->ffn = hp->expert_ffn; /* every MLP is a mixture: the config sizes its experts only */
    int64_t mtp;
    KILN_TRY(ku_json_int(cfg, "num_nextn_predict_layers", 0, &mtp));
    snprintf(hp->features, sizeof hp->features, "mHC x%lld; window %lld + compressed KV (CSA /%lld, top-%lld; HCA /%lld); hash routing%s",
             (long long)hp->hc_mult, (long long)hp->sliding_window, (long long)csa, (long long)hp->dsa_topk, (long long)hca,
             mtp > 0 ? "; MTP layers (mtp.*) for --spec-mtp" : "");
    return NULL;
}

/* tid2eid [vocab, top_k] (integers) under layer prefix pre at the batch's tokens: [T, top_k] i32. */
static kg_node *hash_experts(kb_ctx *b, const char *pre) {
    char name[256];
    snprintf(name, sizeof name, "%smlp.gate.tid2eid", pre);
    const kc_tensor *t = kc_find(b->ck, name);
    int64_t V = b->hp->vocab, K = b->hp->n_experts_used, E = b->hp->n_experts;
    if (!t || t->rank != 2 || t->shape[0] != V || t->shape[1] != K || (t->dtype != KC_I64 && t->dtype != KC_I32))
        return kb_fail(b, kiln_error(KILN_EINVAL, "%s: want an integer tensor [%lld, %lld]", name, (long long)V, (long long)K));
    int32_t *ids = kg_alloc(b->g, sizeof(int32_t) * (size_t)(V * K));
    if (!ids) return kb_fail(b, kiln_error(KILN_ENOMEM, "out of memory"));
    for (int64_t i = 0; i < V * K; i++) {
        int64_t e = t->dtype == KC_I64 ? ((const int64_t *)t->data)[i] : ((const int32_t *)t->data)[i];
        if (e < 0 || e >= E) return kb_fail(b, kiln_error(KILN_EINVAL, "%s: expert %lld out of range", name, (long long)e));
        ids[i] = (int32_t)e;
    }
    return kg_take_rows(b->g, kg_const(b->g, KG_I32, KG_SHAPE(V, K), ids), b->tokens);
}

/* Decoder layer il over the streams X [T, N, D], its modules under pre
 * ("model.layers.<il>.", or the MTP layer's "mtp.0."; the name table's
 * per-layer roles are already the MTP layer's in its head). */
static kg_node *layer(kb_ctx *b, kg_node *X, int il, const char *pre) {
    const km_hparams *hp = b->hp;
    kg_node *post, *comb;
    char mod[128], am[128];
    snprintf(mod, sizeof mod, "%sattn_hc", pre);
    kg_node *c = kb_hc_collapse(b, X, mod, (int)hp->hc_iters, hp->hc_eps, &post, &comb);
    snprintf(am, sizeof am, "%sself_attn", pre);
    kb_v4_attn_opts ao = {.module = am, .heads = hp->n_heads, .head_dim = hp->head_dim, .rope_dim = hp->qk_rope_dim,
                          .q_lora_rank = hp->q_lora_rank, .o_groups = hp->o_groups, .o_lora_rank = hp->o_lora_rank,
                          .rope = hp->layer_compress[il] ? 1 : 0, .window = (int)hp->sliding_window,
                          .compress = hp->layer_compress[il], .overlap = hp->layer_csa[il], .index_heads = hp->dsa_heads,
                          .index_dim = hp->dsa_dim, .index_topk = hp->dsa_topk};
    kg_node *a = kb_v4_attention(b, c ? kb_norm(b, c, KM_T_ATTN_NORM, il, KB_NORM_RMS) : NULL, il, &ao);
    X = kb_hc_expand(b, X, a, post, comb);
    snprintf(mod, sizeof mod, "%sffn_hc", pre);
    c = kb_hc_collapse(b, X, mod, (int)hp->hc_iters, hp->hc_eps, &post, &comb);
    kb_moe_opts mo;
    kb_moe_defaults(b, il, &mo);
    mo.swiglu_oai = false, mo.silu_clamp = true, mo.limit = hp->moe_swiglu_limit, mo.norm_eps = 1e-20f;
    if (hp->layer_hash[il]) {
        mo.choice_bias = false;
        mo.hash_idx = hash_experts(b, pre);
        if (!mo.hash_idx) return NULL;
    }
    kg_node *y = kb_moe(b, c ? kb_norm(b, c, KM_T_FFN_NORM, il, KB_NORM_RMS) : NULL, il, &mo);
    return kb_hc_expand(b, X, y, post, comb);
}

/* The streams' rows the output wants, flattened: [R, N * D]. */
static kg_node *stream_rows(kb_ctx *b, kg_node *X) {
    if (!X) return NULL;
    return kg_take_rows(b->g, kg_reshape(b->g, X, KG_SHAPE(X->shape.d[0], X->shape.d[1] * X->shape.d[2])), b->rows);
}

/* The MTP head (DeepSeek's MTPBlock): the main model's streams h [T, N, D]
 * and the next token's embedding e, x_n = e_proj(enorm(e)) + h_proj(hnorm(h_n)),
 * the decoder layer, logits head(norm(hc_head(x))) with the head's own
 * hc_head; the chained state is x before it. */
static kg_node *mtp_head(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    const char *pre = kb_mtp_prefix(b->mtp);
    int il = kb_mtp_layer(b->mtp);
    int64_t T = b->shape.T, N = hp->hc_mult, D = hp->hidden;
    char name[128];
    kg_node *e = kb_embed(b, NULL), *h = kb_mtp_hidden(b);
    snprintf(name, sizeof name, "%senorm.weight", pre);
    kg_node *en = kb_tensor_named(b, name, 1, (int64_t[]){D});
    snprintf(name, sizeof name, "%shnorm.weight", pre);
    kg_node *hn = kb_tensor_named(b, name, 1, (int64_t[]){D});
    if (!e || !h || !en || !hn) return NULL;
    float eps = (float)hp->norm_eps;
    e = kg_rms_norm(g, e, en, eps, 0);
    h = kg_rms_norm(g, kg_reshape(g, h, KG_SHAPE(T, N, D)), hn, eps, 0);
    snprintf(name, sizeof name, "%se_proj", pre);
    e = kb_linear_module(b, e, name, D);
    snprintf(name, sizeof name, "%sh_proj", pre);
    h = kb_linear_module(b, h, name, D);
    if (!e || !h) return NULL;
    kg_node *X = layer(b, kg_add(g, kg_broadcast_in_dim(g, e, h->shape, (int[]){0, 2}), h), il, pre);
    snprintf(name, sizeof name, "%shc_head", pre);
    kg_node *logits = kb_output(b, kb_hc_head(b, X, name, hp->hc_eps), NULL);
    return kb_mtp_out(b, logits, stream_rows(b, X));
}

/* The model; with hp->mtp_state the rows are the residual streams before
 * hc_head (km_state_width: what the MTP head reads); the MTP head when
 * b->mtp is set (models/blocks_mtp.c). */
static kg_node *emit(kb_ctx *b) {
    if (b->mtp) return mtp_head(b);
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t T = b->shape.T, N = hp->hc_mult, D = hp->hidden;
    kg_node *x = kb_embed(b, NULL);
    if (!x) return NULL;
    kg_node *X = kg_broadcast_in_dim(g, x, KG_SHAPE(T, N, D), (int[]){0, 2});
    char pre[64];
    for (int il = 0; il < hp->n_layers && X; il++) {
        snprintf(pre, sizeof pre, "model.layers.%d.", il);
        X = layer(b, X, il, pre);
    }
    if (hp->hidden_out && hp->mtp_state) return kg_name(stream_rows(b, X), "hidden", -1);
    return kb_output(b, kb_hc_head(b, X, "model.hc_head", hp->hc_eps), NULL);
}

static const char *const types[] = {"deepseek_v4", NULL};
const km_family km_family_deepseek_v4 = {"deepseek_v4", types, &names, parse, emit};
