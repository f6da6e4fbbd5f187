/* zamba2.c: Zamba2 (Zamba2ForCausalLM): a stack of Mamba-2 layers, some of
 * them "hybrid": before their Mamba-2 block, a transformer block shared by
 * several layers (num_mem_blocks of them, used in turn) reads
 * rms([x | the token embeddings]), attends (heads of 2 * hidden / heads
 * dims, scores scaled by (head_dim / 2)^-0.5, rope with use_mem_rope), runs
 * an MLP whose fused gate/up projection gets the layer's own LoRA adapter,
 * and a per-layer linear adds the result to the Mamba-2 block's input (not
 * to its residual). The shared block's weights are stored under the first
 * hybrid layer that uses it. The mixers compute Mamba-2's recurrence
 * exactly, as the model's authors and transformers' CUDA path do; the
 * shared oracle fixture was made by transformers' CPU path, whose chunked
 * SSD carries states between chunks summed over the wrong axis
 * (tools/zamba2_reference.py reproduces it with --bug; kilnref_zamba2 is the
 * correct oracle). */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

#define ZAMBA2_NAMES(MAMBA)                                                                                            \
    [KM_T_TOK_EMBD] = "model.embed_tokens", [KM_T_OUTPUT_NORM] = "model.final_layernorm", [KM_T_OUTPUT] = "lm_head",    \
    [KM_T_ATTN_NORM] = "model.layers.%d." MAMBA "input_layernorm", [KM_T_SSM] = "model.layers.%d." MAMBA "mamba",        \
    [KM_T_SSM_IN] = "model.layers.%d." MAMBA "mamba.in_proj", [KM_T_SSM_CONV] = "model.layers.%d." MAMBA "mamba.conv1d", \
    [KM_T_SSM_NORM] = "model.layers.%d." MAMBA "mamba.norm", [KM_T_SSM_OUT] = "model.layers.%d." MAMBA "mamba.out_proj", \
    /* the shared transformer block (the layer index is the block's first hybrid layer) */                               \
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.shared_transformer.input_layernorm",                                        \
    [KM_T_ATTN_Q] = "model.layers.%d.shared_transformer.self_attn.q_proj",                                               \
    [KM_T_ATTN_K] = "model.layers.%d.shared_transformer.self_attn.k_proj",                                               \
    [KM_T_ATTN_V] = "model.layers.%d.shared_transformer.self_attn.v_proj",                                               \
    [KM_T_ATTN_O] = "model.layers.%d.shared_transformer.self_attn.o_proj",                                               \
    [KM_T_FFN_NORM] = "model.layers.%d.shared_transformer.pre_ff_layernorm",                                             \
    [KM_T_FFN_GATE_UP] = "model.layers.%d.shared_transformer.feed_forward.gate_up_proj",                                 \
    [KM_T_FFN_DOWN] = "model.layers.%d.shared_transformer.feed_forward.down_proj"

static const km_names names = {ZAMBA2_NAMES("")};
/* a hybrid layer's Mamba-2 block lives under mamba_decoder */
static const km_names hybrid_names = {ZAMBA2_NAMES("mamba_decoder.")};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    if (hp->ffn <= 0) hp->ffn = 4 * hp->hidden;
    hp->head_dim = 2 * hp->hidden / hp->n_heads; /* attention_head_dim: heads over [x | embeddings] */
    double expand, dt_min;
    KILN_TRY(ku_json_num(cfg, "mamba_expand", 2, &expand));
    KILN_TRY(ku_json_int(cfg, "mamba_d_state", 64, &hp->ssm_state));
    KILN_TRY(ku_json_int(cfg, "mamba_d_conv", 4, &hp->ssm_conv));
    KILN_TRY(ku_json_int(cfg, "mamba_ngroups", 1, &hp->ssm_groups));
    KILN_TRY(ku_json_int(cfg, "n_mamba_heads", 8, &hp->ssm_heads));
    KILN_TRY(ku_json_bool(cfg, "add_bias_linear", false, &hp->ssm_bias));
    KILN_TRY(ku_json_num(cfg, "time_step_min", 0.001, &dt_min));
    hp->ssm_inner = (int64_t)(expand * (double)hp->hidden);
    if (hp->ssm_heads <= 0 || hp->ssm_inner % hp->ssm_heads || hp->ssm_groups <= 0 || hp->ssm_heads % hp->ssm_groups ||
        hp->ssm_state <= 0 || hp->ssm_conv < 2)
        return kiln_error(KILN_EINVAL, "config.json: bad Mamba-2 shape (n_mamba_heads %lld, mamba_ngroups %lld)",
                          (long long)hp->ssm_heads, (long long)hp->ssm_groups);
    hp->ssm_head_dim = hp->ssm_inner / hp->ssm_heads;
    hp->ssm_out_bias = hp->ssm_bias;
    hp->ssm_conv_bias = true;                           /* Zamba2MambaMixer's conv always has one */
    hp->ssm_dt_min = dt_min, hp->ssm_dt_max = INFINITY; /* torch.clamp(dt, time_step_min) */
    hp->ssm_norm_groups = hp->ssm_groups;
    hp->ssm_norm_eps = 1e-5; /* Zamba2RMSNormGated(..., eps=1e-5) */
    hp->ssm_silu = true;     /* the mixer's activation is "silu"; hidden_act is the MLP's */
    hp->attn_qkv_bias = hp->attn_o_bias = false;
    bool rope, long_ctx;
    KILN_TRY(ku_json_bool(cfg, "use_mem_rope", false, &rope));
    KILN_TRY(ku_json_bool(cfg, "use_long_context", false, &long_ctx));
    KILN_TRY(ku_json_bool(cfg, "use_shared_attention_adapter", false, &hp->zamba_attn_adapter));
    KILN_TRY(ku_json_int(cfg, "adapter_rank", 128, &hp->zamba_adapter_rank));
    KILN_TRY(ku_json_int(cfg, "num_mem_blocks", 1, &hp->zamba_mem_blocks));
    if (hp->zamba_mem_blocks < 1 || hp->zamba_adapter_rank < 1)
        return kiln_error(KILN_EINVAL, "config.json: \"num_mem_blocks\" and \"adapter_rank\" must be positive");
    if (!rope) km_no_rope(hp);
    else if (long_ctx) hp->rope_theta *= pow(8.0, (double)hp->head_dim / (double)(hp->head_dim - 2));
    const cJSON *bt = ku_json_get(cfg, "layers_block_type"), *e;
    if (!bt || !cJSON_IsArray(bt) || cJSON_GetArraySize(bt) != hp->n_layers)
        return kiln_error(KILN_EINVAL, "config.json: \"layers_block_type\" must list %lld layers", (long long)hp->n_layers);
    int i = 0;
    cJSON_ArrayForEach(e, bt) {
        if (!cJSON_IsString(e) || (strcmp(e->valuestring, "mamba") && strcmp(e->valuestring, "hybrid")))
            return kiln_error(KILN_EUNSUPPORTED, "config.json: layers_block_type[%d] must be \"mamba\" or \"hybrid\"", i);
        hp->layer_recurrent[i] = 1;
        hp->zamba_hybrid[i] = !strcmp(e->valuestring, "hybrid");
        i++;
    }
    km_mamba2_features(hp, "a shared attention + MLP block with per-use LoRA adapters before the hybrid layers");
    return NULL;
}

/* LoRA adapter <module>.0 then .1 on x: [T, rows] */
static kg_node *adapter(kb_ctx *b, kg_node *x, const char *module, int64_t rows) {
    char n0[256], n1[256];
    snprintf(n0, sizeof n0, "%s.0", module);
    snprintf(n1, sizeof n1, "%s.1", module);
    return kb_linear_module(b, kb_linear_module(b, x, n0, b->hp->zamba_adapter_rank), n1, rows);
}

/* The shared block (stored under layer lb) for hybrid layer il, its j-th use: [T, hidden] for the Mamba-2 input. */
static kg_node *shared_block(kb_ctx *b, kg_node *x, kg_node *emb, int il, int j, int lb) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    int64_t H = hp->n_heads, Hkv = hp->n_kv_heads, D = hp->head_dim, F = hp->ffn;
    kb_norm_opts rms = {0};
    kg_node *h = kb_norm_ex(b, kg_concat(g, (kg_node *[]){x, emb}, 2, 1), KM_T_ATTN_POST_NORM, lb, &rms);
    kb_layer_opts o;
    kb_layer_defaults(b, il, &o);
    o.attn.scale = (float)(1.0 / sqrt((double)D / 2.0));
    char mod[256];
    kg_node *add[3] = {NULL, NULL, NULL};
    if (hp->zamba_attn_adapter) {
        const char *which[3] = {"q", "k", "v"};
        int64_t rows[3] = {H * D, Hkv * D, Hkv * D};
        for (int k = 0; k < 3; k++) {
            snprintf(mod, sizeof mod, "model.layers.%d.shared_transformer.self_attn.linear_%s_adapter_list.%d", lb, which[k], j);
            add[k] = adapter(b, h, mod, rows[k]);
        }
    }
    kg_node *a = kb_norm_ex(b, kb_tied_attention(b, h, il, lb, add, &o.attn), KM_T_FFN_NORM, lb, &rms);
    snprintf(mod, sizeof mod, "model.layers.%d.shared_transformer.feed_forward.gate_up_proj_adapter_list.%d", lb, j);
    kg_node *gu = kg_add(g, kb_linear(b, a, KM_T_FFN_GATE_UP, lb, 2 * F, false), adapter(b, a, mod, 2 * F));
    kg_node *f = kg_mul(g, kb_act(b, kb_slice_last(b, gu, 0, F), hp->act), kb_slice_last(b, gu, F, 2 * F));
    f = kb_linear(b, f, KM_T_FFN_DOWN, lb, hp->hidden, false);
    snprintf(mod, sizeof mod, "model.layers.%d.linear", il);
    return kg_name(kb_linear_module(b, f, mod, hp->hidden), "shared_block", il);
}

static const km_family hybrid_view;

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    kb_norm_opts rms = {0};
    kg_node *emb = kb_embed(b, NULL), *x = emb;
    int hybrid[KM_MAX_LAYERS], n_hybrid = 0;
    for (int il = 0; il < hp->n_layers; il++)
        if (hp->zamba_hybrid[il]) hybrid[n_hybrid++] = il;
    for (int il = 0, j = 0; il < hp->n_layers && x; il++) {
        kg_node *in = x;
        const km_family *fam = b->fam;
        if (hp->zamba_hybrid[il]) {
            in = kg_add(g, x, shared_block(b, x, emb, il, j, hybrid[j % hp->zamba_mem_blocks % n_hybrid]));
            b->fam = &hybrid_view; /* the layer's Mamba-2 block is under mamba_decoder */
            j++;
        }
        kg_node *m = kb_mamba2(b, kb_norm_ex(b, in, KM_T_ATTN_NORM, il, &rms), il);
        b->fam = fam;
        x = m ? kg_add(g, x, m) : NULL;
    }
    return x ? kb_output(b, x, &rms) : NULL;
}

static const char *const types[] = {"zamba2", NULL};
const km_family km_family_zamba2 = {"zamba2", types, &names, parse, emit};
static const km_family hybrid_view = {"zamba2", types, &hybrid_names, parse, emit};
