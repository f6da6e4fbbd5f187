/* deepseek.c: DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM,
 * DeepseekV3ForCausalLM). Multi-head latent attention (kb_mla_opts, as
 * MiniCPM3) with interleaved rotary pairs on the qk_rope_head_dim trailing
 * dims of each head, and a mixture of experts from layer
 * first_k_dense_replace on, with n_shared_experts shared experts.
 * V2 routes by softmax, greedy or group-limited by each group's best score,
 * weights times routed_scaling_factor without renormalisation; V3 by sigmoid,
 * with e_score_correction_bias added to the scores for the choice of experts
 * only (the weights are the unbiased sigmoid scores, as transformers 5's
 * DeepseekV3MoE.route_tokens_to_experts gathers them), groups scored by their
 * best two, weights renormalised (norm_topk_prob) then scaled. A yarn
 * rope_scaling with mscale_all_dim also scales the attention scores by
 * mscale(factor, mscale_all_dim)^2. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_DEEPSEEK_NAMES(MLP),
    KM_DEEPSEEK_MLA_NAMES("model.layers.%d.self_attn"),
};

kiln_status km_deepseek_moe(const cJSON *cfg, km_hparams *hp, bool v3) {
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "n_routed_experts", .top_k = "num_experts_per_tok", .expert_ffn = "moe_intermediate_size",
                                         .n_shared = "n_shared_experts", .first_dense = "first_k_dense_replace",
                                         .freq = "moe_layer_freq", .type_list = "mlp_layer_types", .norm_topk = v3, .top_k_def = 8}));
    hp->moe_score = v3 ? KM_MOE_SIGMOID : KM_MOE_SOFTMAX;
    hp->moe_router_bias = v3;
    return NULL;
}

kiln_status km_deepseek_mla(const cJSON *cfg, km_hparams *hp, bool interleave) {
    bool inter;
    KILN_TRY(km_json_int_or_null(cfg, "q_lora_rank", 1536, 0, &hp->q_lora_rank));
    KILN_TRY(ku_json_int(cfg, "kv_lora_rank", 512, &hp->kv_lora_rank));
    KILN_TRY(ku_json_int(cfg, "qk_nope_head_dim", 128, &hp->qk_nope_dim));
    KILN_TRY(ku_json_int(cfg, "qk_rope_head_dim", 64, &hp->qk_rope_dim));
    KILN_TRY(ku_json_int(cfg, "v_head_dim", 128, &hp->v_head_dim));
    KILN_TRY(ku_json_bool(cfg, "rope_interleave", true, &inter));
    if (hp->kv_lora_rank <= 0 || hp->qk_nope_dim <= 0 || hp->qk_rope_dim <= 0 || hp->v_head_dim <= 0 || hp->q_lora_rank < 0)
        return kiln_error(KILN_EINVAL, "config.json: MLA ranks and head dims must be positive");
    hp->head_dim = hp->qk_nope_dim + hp->qk_rope_dim;
    hp->n_kv_heads = hp->n_heads;
    hp->sliding_window = 0;
    /* the rotary dims of each head: interleaved pairs (V2's complex numbers) or rope_interleave */
    KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, (int)hp->qk_rope_dim, hp->max_pos), "config.json");
    hp->ropes[0].interleaved = interleave || inter;
    hp->n_ropes = 1;
    double mall = 0, factor = 1;
    KILN_TRY(ku_json_num(hp->rope_scaling, "mscale_all_dim", 0, &mall));
    KILN_TRY(ku_json_num(hp->rope_scaling, "factor", 1, &factor));
    if (mall != 0 && factor > 1) {
        double m = 0.1 * mall * log(factor) + 1.0;
        hp->attn_scale = (float)(m * m / sqrt((double)hp->head_dim));
    }
    return NULL;
}

kiln_status km_deepseek_mtp(const cJSON *cfg, km_hparams *hp) {
    int64_t n;
    KILN_TRY(ku_json_int(cfg, "num_nextn_predict_layers", 0, &n));
    if (n < 0) return kiln_error(KILN_EINVAL, "config.json: num_nextn_predict_layers must not be negative");
    size_t o = strlen(hp->features);
    if (n > 0)
        snprintf(hp->features + o, sizeof hp->features - o,
                 "%s%lld multi-token prediction layer%s (model.layers.%lld%s: --spec-mtp drafts with the first)", o ? "; " : "", (long long)n, n > 1 ? "s" : "", (long long)hp->n_layers, n > 1 ? "..." : "");
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool v3 = !strcmp(hp->model_type, "deepseek_v3");
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_deepseek_mla(cfg, hp, !v3));
    KILN_TRY(km_deepseek_moe(cfg, hp, v3));
    if (!v3) {
        const char *method;
        KILN_TRY(ku_json_str(cfg, "topk_method", "greedy", &method));
        if (!strcmp(method, "greedy")) hp->moe_n_group = 1;
        else if (strcmp(method, "group_limited_greedy"))
            return kiln_error(KILN_EUNSUPPORTED, "config.json: deepseek_v2 topk_method \"%s\" is not supported", method);
        hp->moe_norm_topk = false;
    }
    double scale;
    KILN_TRY(ku_json_num(cfg, "routed_scaling_factor", v3 ? 2.5 : 1.0, &scale));
    hp->moe_scale = (float)scale;
    return km_deepseek_mtp(cfg, hp);
}

/* V2's group-limited greedy scores a group by its best expert */
static void layer(const kb_ctx *b, int il, kb_layer_opts *o) { o->moe.group_by_max = !strcmp(b->hp->model_type, "deepseek_v2"); }

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"deepseek_v2", "deepseek_v3", NULL};
const km_family km_family_deepseek = {"deepseek", types, &names, parse, emit};
