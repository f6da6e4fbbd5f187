/* youtu.c: Youtu-LLM (YoutuForCausalLM). A dense decoder with DeepSeek's
 * multi-head latent attention (km_deepseek_mla: q_b(rms(q_a(x))),
 * kv_b(rms(latent)) = per head [k_nope | v], one shared rope key,
 * rope_interleave on the qk_rope_head_dim dims, a yarn mscale_all_dim in
 * the score scale), Llama's SwiGLU MLP on every layer, tied embeddings by
 * default. transformers sizes its rotary table by head_dim, which the
 * config aliases to qk_rope_head_dim. */
#include "base/json.h"
#include "models/moe.h"
#include "models/shared.h"

static const km_names names = {
    KM_MOE_LLAMA_NAMES("model.layers.%d.mlp"),
    KM_DEEPSEEK_MLA_NAMES("model.layers.%d.self_attn"),
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", true, &hp->tie_embeddings));
    hp->n_experts = 0;
    return km_deepseek_mla(cfg, hp, false);
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, NULL); }

static const char *const types[] = {"youtu", NULL};
const km_family km_family_youtu = {"youtu", types, &names, parse, emit};
