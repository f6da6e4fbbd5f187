/* minicpm3.c: MiniCPM3 (MiniCPM3ForCausalLM, remote code modeling_minicpm.py
 * of openbmb/MiniCPM3-4B). MiniCPM's muP-scaled decoder with multi-head
 * latent attention: q_b(rms(q_a(x))), kv_a_proj_with_mqa(x) = [latent |
 * shared rope key], kv_b(rms(latent)) = per head [k_nope | v]; the a-norms
 * use eps 1e-6 whatever rms_norm_eps says; v_head_dim is hidden / heads as
 * the model code computes it; rotary (half style) on the qk_rope_head_dim
 * dims with MiniCPM's longrope. */
#include "base/json.h"
#include "models/shared.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "model.embed_tokens",
    [KM_T_OUTPUT_NORM] = "model.norm",
    [KM_T_OUTPUT] = "lm_head",
    [KM_T_ATTN_NORM] = "model.layers.%d.input_layernorm",
    [KM_T_ATTN_Q] = "model.layers.%d.self_attn.q_proj",
    [KM_T_ATTN_Q_A] = "model.layers.%d.self_attn.q_a_proj",
    [KM_T_ATTN_Q_A_NORM] = "model.layers.%d.self_attn.q_a_layernorm",
    [KM_T_ATTN_Q_B] = "model.layers.%d.self_attn.q_b_proj",
    [KM_T_ATTN_KV_A] = "model.layers.%d.self_attn.kv_a_proj_with_mqa",
    [KM_T_ATTN_KV_A_NORM] = "model.layers.%d.self_attn.kv_a_layernorm",
    [KM_T_ATTN_KV_B] = "model.layers.%d.self_attn.kv_b_proj",
    [KM_T_ATTN_O] = "model.layers.%d.self_attn.o_proj",
    [KM_T_FFN_NORM] = "model.layers.%d.post_attention_layernorm",
    [KM_T_FFN_GATE] = "model.layers.%d.mlp.gate_proj",
    [KM_T_FFN_UP] = "model.layers.%d.mlp.up_proj",
    [KM_T_FFN_DOWN] = "model.layers.%d.mlp.down_proj",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_int(cfg, "q_lora_rank", 768, &hp->q_lora_rank));
    KILN_TRY(ku_json_int(cfg, "kv_lora_rank", 256, &hp->kv_lora_rank));
    KILN_TRY(ku_json_int(cfg, "qk_nope_head_dim", 64, &hp->qk_nope_dim));
    KILN_TRY(ku_json_int(cfg, "qk_rope_head_dim", 32, &hp->qk_rope_dim));
    if (hp->kv_lora_rank <= 0 || hp->qk_nope_dim <= 0 || hp->qk_rope_dim <= 0 || hp->q_lora_rank < 0)
        return kiln_error(KILN_EINVAL, "config.json: MLA ranks and head dims must be positive");
    hp->v_head_dim = hp->hidden / hp->n_heads;
    hp->head_dim = hp->qk_nope_dim + hp->qk_rope_dim;
    hp->n_kv_heads = hp->n_heads;
    return km_minicpm_common(cfg, hp, (int)hp->qk_rope_dim);
}

/* multi-head latent attention comes with the defaults (hp->kv_lora_rank) */
static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"minicpm3", NULL};
const km_family km_family_minicpm3 = {"minicpm3", types, &names, parse, emit};
