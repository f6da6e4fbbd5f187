/* registry.c: the table of model families. A new family adds one line here
 * and one file models/<family>.c. */
#include <string.h>

#include "base/json.h"
#include "models/family.h"

const km_names km_llama_names = {
    KM_LLAMA_NAMES,
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
};

const km_names km_sandwich_names = {
    KM_LLAMA_NAMES,
    [KM_T_ATTN_POST_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_NORM] = "model.layers.%d.pre_feedforward_layernorm",
    [KM_T_FFN_POST_NORM] = "model.layers.%d.post_feedforward_layernorm",
};

/* One line per family; the first family listing a model_type serves it. */
#define FAMILIES(X)                                                                                                  \
    X(llama) X(qwen2) X(qwen3) X(gemma) X(gemma2) X(gemma3)                                                          \
    X(cohere) X(cohere2) X(stablelm) X(glm) X(glm4) X(ernie4_5) X(apertus) X(bitnet) X(nemotron)                     \
    X(xverse) X(aquila) X(orion) X(openelm) X(plamo)                                                                 \
    X(internlm2) X(internlm3) X(exaone) X(minicpm) X(minicpm3) X(chatglm) X(telechat) X(baichuan) X(qwen)         \
    X(phi3) X(granite) X(olmo) X(olmo2) X(olmo3) X(smollm3) X(exaone4) X(helium) X(seed_oss) X(arcee) X(hunyuan)     \
    X(mimo) X(ministral) X(ministral3)                                                                               \
    X(gpt2) X(gpt_bigcode) X(gpt_neox) X(gptj) X(falcon) X(mpt) X(bloom) X(opt) X(phi) X(starcoder2)             \
    X(qwen2_moe) X(qwen3_moe) X(mixtral) X(olmoe) X(deepseek) X(dots1) X(glm4_moe) X(granitemoe) X(hunyuan_moe) X(ernie4_5_moe) X(gpt_oss) \
    X(llama4_text) X(phimoe) X(jetmoe) X(mllama) \
    X(mamba) X(mamba2) X(lfm2) X(bamba) X(falcon_h1) X(rwkv) X(recurrent_gemma) \
    X(jamba) X(granitemoehybrid) X(qwen3_next) X(minimax) X(zamba2) \
    X(qwen2_vl_text) X(qwen3_vl_text) X(glm4v_text) \
    X(cwm) X(jais2) X(hyperclovax) X(nanochat) X(hrm_text) X(dbrx) \
    X(solar_open) X(hy_v3) X(exaone_moe) X(minimax_m2) X(cohere2_moe) X(mellum) X(afmoe) X(laguna) \
    X(gemma4) X(gemma3n) \
    X(youtu) X(glm4_moe_lite) X(glm_moe_dsa) X(deepseek_v4) \
    X(qwen3_5_text) X(qwen3_5_moe_text) X(olmo_hybrid) X(nemotron_h) X(lfm2_moe) \
    X(bert) X(xlm_roberta) X(modernbert) \
    X(kosmos2_5)

#define DECLARE(f) extern const km_family km_family_##f;
FAMILIES(DECLARE)
#define LIST(f) &km_family_##f,
static const km_family *const families[] = {FAMILIES(LIST)};

/* Families whose configs name even the common fields their own way
 * (OpenELM's model_dim, num_transformer_layers): their parse hook reads
 * everything, from a zeroed km_hparams. */
static const km_family *const parse_all[] = {&km_family_openelm, &km_family_mamba, &km_family_mamba2, &km_family_rwkv,
                                             &km_family_nemotron_h, &km_family_kosmos2_5};

static bool parses_all(const km_family *f) {
    for (size_t i = 0; i < sizeof parse_all / sizeof parse_all[0]; i++)
        if (parse_all[i] == f) return true;
    return false;
}

const km_family *km_family_find(const char *model_type) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        for (const char *const *t = families[i]->model_types; *t; t++)
            if (!strcmp(*t, model_type)) return families[i];
    return NULL;
}

const char *km_supported_list(char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        for (const char *const *t = families[i]->model_types; *t; t++) {
            int n = snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", *t);
            if (n < 0 || (size_t)n >= cap - o) return buf;
            o += (size_t)n;
        }
    return buf;
}

kiln_status km_parse(const km_family *f, const cJSON *cfg, km_hparams *hp) {
    if (parses_all(f)) memset(hp, 0, sizeof *hp);
    else KILN_TRY(km_hparams_parse(cfg, hp));
    KILN_TRY(f->parse(cfg, hp));
    if (hp->ffn <= 0) return kiln_error(KILN_EINVAL, "config.json: \"intermediate_size\" is missing or not positive");
    return hp->n_ropes == 0 ? km_rope_one(hp, false) : NULL;
}
