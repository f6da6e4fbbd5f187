/* dbrx.c: DBRX (DbrxForCausalLM), from Databricks' reference code and the
 * checkpoint's layout, as mlx-lm reads it. Pre-norm blocks with LayerNorms
 * without bias (norm_1, norm_2, norm_f; eps 1e-5), attention with one fused
 * Wqkv [q | k | v] clamped to attn_config.clip_qkv, rotary with
 * attn_config.rope_theta over the whole head (head_dim = d_model / n_heads);
 * every layer a mixture of experts: softmax router (ffn.router.layer),
 * top moe_top_k, the weights divided by their L1 norm when
 * moe_normalize_expert_weights is 1; experts act(x w1_e^T) * (x v1_e^T)
 * then @ w2_e, where w1, v1 and w2 are [E * F, hidden] and expert e owns rows
 * e*F .. (e+1)*F - 1 (so w2_e [F, hidden] is applied as x @ W: the
 * reference's `intermediate.matmul(expert_w2)`; mlx-lm stores it transposed
 * per expert as experts.<e>.w2.weight [hidden, F], which is read too).
 * transformers' current DBRX experts apply these weights transposed, so no
 * transformers oracle exists: conversions_test.c proves this family on the
 * mixtral fixture rewritten into DBRX's layout. */
#include "base/json.h"
#include "models/blocks.h"

#define BLK "transformer.blocks.%d."
#define EXPERT(w) BLK "ffn.experts.%e." w "|" BLK "ffn.experts.mlp." w
static const km_names names = {
    [KM_T_TOK_EMBD] = "transformer.wte",
    [KM_T_OUTPUT_NORM] = "transformer.norm_f",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = BLK "norm_attn_norm.norm_1",
    [KM_T_ATTN_QKV] = BLK "norm_attn_norm.attn.Wqkv",
    [KM_T_ATTN_O] = BLK "norm_attn_norm.attn.out_proj",
    [KM_T_FFN_NORM] = BLK "norm_attn_norm.norm_2",
    [KM_T_MOE_ROUTER] = BLK "ffn.router.layer",
    [KM_T_MOE_GATE] = EXPERT("w1"),
    [KM_T_MOE_UP] = EXPERT("v1"),
    [KM_T_MOE_DOWN] = EXPERT("w2"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const cJSON *attn = ku_json_get(cfg, "attn_config"), *ffn = ku_json_get(cfg, "ffn_config");
    if ((attn && !cJSON_IsObject(attn)) || (ffn && !cJSON_IsObject(ffn)))
        return kiln_error(KILN_EINVAL, "config.json: \"attn_config\" and \"ffn_config\" must be objects");
    double kv, clip, theta, width, experts, top_k, p;
    KILN_TRY(ku_json_num(attn, "kv_n_heads", 1, &kv));
    KILN_TRY(ku_json_num(attn, "clip_qkv", 0, &clip));
    KILN_TRY(ku_json_num(attn, "rope_theta", 10000.0, &theta));
    KILN_TRY(ku_json_num(ffn, "ffn_hidden_size", 3584, &width));
    KILN_TRY(ku_json_num(ffn, "moe_num_experts", 4, &experts));
    KILN_TRY(ku_json_num(ffn, "moe_top_k", 1, &top_k));
    /* null (no renormalisation) is not absence (1) here */
    const cJSON *norm = ffn ? cJSON_GetObjectItemCaseSensitive(ffn, "moe_normalize_expert_weights") : NULL;
    KILN_TRY(ku_json_num(ffn, "moe_normalize_expert_weights", 1, &p));
    const cJSON *act = ffn ? ku_json_get(ffn, "ffn_act_fn") : NULL, *an = act ? ku_json_get(act, "name") : NULL;
    hp->act = KM_ACT_SILU;
    if (an && cJSON_IsString(an)) KILN_TRYF(km_parse_act(an->valuestring, &hp->act), "config.json: ffn_config.ffn_act_fn");
    if (kv < 1 || (int64_t)kv != kv || hp->n_heads % (int64_t)kv || width < 1 || experts < 1 || top_k < 1 || top_k > experts ||
        clip < 0)
        return kiln_error(KILN_EINVAL, "config.json: bad DBRX shape (kv_n_heads %g, ffn_hidden_size %g, %g experts, top-%g, "
                                       "clip_qkv %g)", kv, width, experts, top_k, clip);
    if (norm && !cJSON_IsNull(norm) && p != 1)
        return kiln_error(KILN_EUNSUPPORTED, "config.json: moe_normalize_expert_weights %g (kiln renormalises by the L1 norm, 1, "
                                             "or not at all, null)", p);
    hp->n_kv_heads = (int64_t)kv;
    hp->head_dim = hp->hidden / hp->n_heads;
    hp->clip_qkv = (float)clip;
    if (!km_rope_params(hp, "full_attention")) hp->rope_theta = theta; /* transformers 5's rope_parameters win */
    hp->norm_eps = 1e-5; /* nn.LayerNorm's default */
    hp->ffn = hp->expert_ffn = (int64_t)width;
    hp->n_experts = (int64_t)experts;
    hp->n_experts_used = (int64_t)top_k;
    hp->moe_score = KM_MOE_SOFTMAX;
    hp->moe_norm_topk = !(norm && cJSON_IsNull(norm));
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = 1;
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false;
    hp->sliding_window = 0;
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm.kind = KB_NORM_LAYER;
    o->attn.qkv = KB_QKV_BLOCKS;
    o->moe.layout = KB_MOE_FLAT; /* the per-expert modules of mlx-lm's layout are used when present */
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"dbrx", NULL};
const km_family km_family_dbrx = {"dbrx", types, &names, parse, emit};
