/* registry.c: the table of model families. A new family adds one line here
 * and one file models/<family>.c. */
#include <string.h>

#include "base/json.h"
#include "models/family.h"

const km_names km_llama_names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_K] = "model.layers.%d.self_attn.k_proj",
    [KM_T_ATTN_V] = "model.layers.%d.self_attn.v_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_ATTN_Q_NORM] = "model.layers.%d.self_attn.q_norm",
    [KM_T_ATTN_K_NORM] = "model.layers.%d.self_attn.k_norm",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

extern const km_family km_family_llama, km_family_qwen2, km_family_qwen3, km_family_gemma, km_family_gemma2,
    km_family_gemma3;
extern const km_family km_family_gpt2, km_family_gpt_bigcode, km_family_gpt_neox, km_family_gptj, km_family_falcon, km_family_mpt, km_family_bloom, km_family_opt, km_family_phi, km_family_starcoder2; /* fam-gpt */

static const km_family *const families[] = {
    &km_family_llama, &km_family_qwen2, &km_family_qwen3, &km_family_gemma, &km_family_gemma2, &km_family_gemma3,
    &km_family_gpt2, &km_family_gpt_bigcode, &km_family_gpt_neox, &km_family_gptj, &km_family_falcon, &km_family_mpt, &km_family_bloom, &km_family_opt, &km_family_phi, &km_family_starcoder2,
};

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
    KILN_TRY(km_hparams_parse(cfg, hp));
    KILN_TRY(f->parse(cfg, hp));
    if (hp->ffn <= 0) return kiln_error(KILN_EINVAL, "config.json: \"intermediate_size\" is missing or not positive");
    if (hp->n_ropes == 0) {
        int dim = (int)((double)hp->head_dim * hp->partial_rotary);
        KILN_TRYF(km_rope_init(&hp->ropes[0], hp->rope_scaling, hp->rope_theta, dim, hp->max_pos), "config.json");
        hp->n_ropes = 1;
    }
    return NULL;
}
