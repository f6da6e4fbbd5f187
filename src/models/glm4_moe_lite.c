/* glm4_moe_lite.c: GLM-4.7-Flash (Glm4MoeLiteForCausalLM). DeepSeek-V3's
 * multi-head latent attention (km_deepseek_mla, rope_interleave) with
 * GLM-4.5's mixture of experts (DeepSeek-V3's sigmoid router with
 * e_score_correction_bias for the choice only, renormalised weights times
 * routed_scaling_factor, a shared expert) on the layers mlp_layer_types
 * marks "sparse" (default: all but the first). The checkpoint's
 * multi-token prediction layer (model.layers.<num_hidden_layers>) is
 * reported by `kiln info` and drafted with by --spec-mtp
 * (models/blocks_mtp.c). */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define MLP "model.layers.%d.mlp"
static const km_names names = {KM_MOE_LLAMA_NAMES(MLP), KM_MOE_DEEPSEEK_NAMES(MLP), KM_DEEPSEEK_MLA_NAMES("model.layers.%d.self_attn")};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_deepseek_mla(cfg, hp, false));
    KILN_TRY(km_deepseek_moe(cfg, hp, true));
    if (hp->n_experts && !ku_json_get(cfg, "mlp_layer_types"))
        for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = i > 0;
    double scale;
    KILN_TRY(ku_json_num(cfg, "routed_scaling_factor", 1.8, &scale));
    hp->moe_scale = (float)scale;
    return km_deepseek_mtp(cfg, hp);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"glm4_moe_lite", NULL};
const km_family km_family_glm4_moe_lite = {"glm4_moe_lite", types, &names, parse, emit};
