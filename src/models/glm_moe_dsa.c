/* glm_moe_dsa.c: GLM-5 (GlmMoeDsaForCausalLM). DeepSeek-V3's multi-head
 * latent attention (km_deepseek_mla; interleaved rope whatever
 * rope_interleave says, as GlmMoeDsaAttention rotates) with DeepSeek sparse
 * attention: a lightning indexer of index_n_heads heads of index_head_dim
 * dims (interleaved rope on its first qk_rope_head_dim dims) picks the
 * index_topk keys each query attends to (kb_dsa_opts); layers that
 * indexer_types marks "shared" reuse the previous indexer's choice. GLM-4.5's
 * mixture of experts on the mlp_layer_types "sparse" layers (default: from
 * first_k_dense_replace, 3). The multi-token prediction layers are reported
 * by `kiln info` and drafted with by --spec-mtp (models/blocks_mtp.c). */
#include <string.h>

#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

#define MLP "model.layers.%d.mlp"
#define IDX "model.layers.%d.self_attn.indexer"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(MLP),
    KM_MOE_DEEPSEEK_NAMES(MLP),
    KM_DEEPSEEK_MLA_NAMES("model.layers.%d.self_attn"),
    [KM_T_IDX_Q_B] = IDX ".wq_b",
    [KM_T_IDX_K] = IDX ".wk",
    [KM_T_IDX_K_NORM] = IDX ".k_norm",
    [KM_T_IDX_W] = IDX ".weights_proj",
};

/* indexer_types, else index_topk_pattern ("FSS..."), else "full" where
 * max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0, as
 * GlmMoeDsaConfig derives it. */
static kiln_status indexer_types(const cJSON *cfg, km_hparams *hp) {
    const cJSON *l = ku_json_get(cfg, "indexer_types"), *e;
    const char *pat = NULL;
    if (l && !cJSON_IsNull(l)) {
        if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"indexer_types\" must list one type per layer (%lld)", (long long)hp->n_layers);
        int i = 0;
        cJSON_ArrayForEach(e, l) {
            if (!cJSON_IsString(e) || (strcmp(e->valuestring, "full") && strcmp(e->valuestring, "shared")))
                return kiln_error(KILN_EINVAL, "config.json: indexer_types[%d] must be \"full\" or \"shared\"", i);
            hp->layer_dsa_shared[i++] = !strcmp(e->valuestring, "shared");
        }
    } else if (ku_json_get(cfg, "index_topk_pattern")) {
        KILN_TRY(ku_json_str(cfg, "index_topk_pattern", "", &pat));
        if ((int64_t)strlen(pat) != hp->n_layers || strspn(pat, "FS") != strlen(pat))
            return kiln_error(KILN_EINVAL, "config.json: index_topk_pattern \"%s\" must be one F or S per layer", pat);
        for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_dsa_shared[i] = pat[i] == 'S';
    } else {
        int64_t freq, off;
        KILN_TRY(ku_json_int(cfg, "index_topk_freq", 1, &freq));
        KILN_TRY(ku_json_int(cfg, "index_skip_topk_offset", 2, &off));
        if (freq < 1) freq = 1;
        for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_dsa_shared[i] = ((i - off + 1 > 0 ? i - off + 1 : 0) % freq) != 0;
    }
    if (hp->n_layers && hp->layer_dsa_shared[0])
        return kiln_error(KILN_EINVAL, "config.json: the first layer must run the indexer (indexer_types \"full\")");
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(km_deepseek_mla(cfg, hp, true));
    if (hp->q_lora_rank <= 0) return kiln_error(KILN_EINVAL, "config.json: glm_moe_dsa needs q_lora_rank (its indexer reads the query latent)");
    KILN_TRY(km_deepseek_moe(cfg, hp, true));
    if (hp->n_experts && !ku_json_get(cfg, "mlp_layer_types") && !ku_json_get(cfg, "first_k_dense_replace"))
        for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_moe[i] = i >= 3;
    double scale;
    KILN_TRY(ku_json_num(cfg, "routed_scaling_factor", 2.5, &scale));
    hp->moe_scale = (float)scale;
    KILN_TRY(ku_json_int(cfg, "index_topk", 2048, &hp->dsa_topk));
    KILN_TRY(ku_json_int(cfg, "index_n_heads", 32, &hp->dsa_heads));
    KILN_TRY(ku_json_int(cfg, "index_head_dim", 128, &hp->dsa_dim));
    if (hp->dsa_topk < 1 || hp->dsa_heads < 1 || hp->dsa_dim < hp->qk_rope_dim)
        return kiln_error(KILN_EINVAL, "config.json: index_topk and index_n_heads must be positive, index_head_dim at least "
                                       "qk_rope_head_dim (%lld)", (long long)hp->qk_rope_dim);
    hp->dsa_interleaved = true;
    KILN_TRY(indexer_types(cfg, hp));
    snprintf(hp->features, sizeof hp->features, "sparse attention: lightning indexer (%lld heads of %lld) picks %lld keys per query",
             (long long)hp->dsa_heads, (long long)hp->dsa_dim, (long long)hp->dsa_topk);
    return km_deepseek_mtp(cfg, hp);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"glm_moe_dsa", NULL};
const km_family km_family_glm_moe_dsa = {"glm_moe_dsa", types, &names, parse, emit};
