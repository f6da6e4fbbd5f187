/* llama4.c: Llama 4's text model (Llama4ForCausalLM, model_type
 * llama4_text). Llama's block with rotary on the layers no_rope_layers marks
 * 1 (interleaved pairs, llama3 scaling) and NoPE on the others; on rope
 * layers weightless L2 q/k norms (an RMSNorm without weight) after the
 * rotation (use_qk_norm), on NoPE layers the query temperature
 * 1 + attn_scale * log(1 + floor((pos + 1) / floor_scale))
 * (attn_temperature_tuning); "chunked_attention" layers attend within chunks
 * of attention_chunk_size. MoE layers (moe_layers, else every
 * interleave_moe_layer_step-th): top-k of the router logits, the sigmoid of
 * each chosen logit scaling that expert's input, experts' gate and up in
 * gate_up_proj [E, H, 2F] (x @ W, gate columns first), down_proj [E, F, H],
 * plus a shared expert; dense layers are intermediate_size_mlp wide. mlx-lm's
 * split experts.{gate,up,down}_proj serve too. */
#include <stdint.h>
#include <string.h>

#include "base/json.h"
#include "models/moe.h"

#define FF "model.layers.%d.feed_forward"
static const km_names names = {
    KM_MOE_LLAMA_NAMES(FF),
    KM_MOE_SHARED_NAMES(FF ".shared_expert"),
    [KM_T_MOE_ROUTER] = FF ".router",
    [KM_T_MOE_GATE] = FF ".experts.gate_proj",
    [KM_T_MOE_UP] = FF ".experts.up_proj",
    [KM_T_MOE_GATE_UP] = FF ".experts.gate_up_proj",
    [KM_T_MOE_DOWN] = FF ".experts.down_proj",
};

/* Layer il's NoPE flag: no_rope_layers lists 1 for a rotating layer, 0 for
 * NoPE; absent, null or empty, every interval-th layer is NoPE. */
static kiln_status nope_layers(const cJSON *cfg, km_hparams *hp) {
    const cJSON *l = ku_json_get(cfg, "no_rope_layers");
    int64_t interval;
    KILN_TRY(ku_json_int(cfg, "no_rope_layer_interval", 4, &interval));
    if (l && !cJSON_IsNull(l) && !cJSON_IsArray(l)) return kiln_error(KILN_EINVAL, "config.json: \"no_rope_layers\" must be a list");
    if (l && cJSON_IsArray(l) && cJSON_GetArraySize(l) > 0) {
        if (cJSON_GetArraySize(l) < hp->n_layers)
            return kiln_error(KILN_EINVAL, "config.json: \"no_rope_layers\" lists fewer than %lld layers", (long long)hp->n_layers);
        for (int64_t i = 0; i < hp->n_layers; i++) {
            const cJSON *e = cJSON_GetArrayItem(l, (int)i);
            if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: \"no_rope_layers\" must list 0 or 1 per layer");
            hp->layer_nope[i] = e->valuedouble == 0;
        }
        return NULL;
    }
    if (interval < 1) return kiln_error(KILN_EINVAL, "config.json: \"no_rope_layer_interval\" must be positive");
    for (int64_t i = 0; i < hp->n_layers; i++) hp->layer_nope[i] = (i + 1) % interval == 0;
    return NULL;
}

/* Chunked layers from layer_types (absent: the rotating ones), and the chunk. */
static kiln_status chunked_layers(const cJSON *cfg, km_hparams *hp) {
    const cJSON *types = ku_json_get(cfg, "layer_types");
    int chunked = 0;
    if (types && !cJSON_IsNull(types) && (!cJSON_IsArray(types) || cJSON_GetArraySize(types) < hp->n_layers))
        return kiln_error(KILN_EINVAL, "config.json: \"layer_types\" must list %lld layers", (long long)hp->n_layers);
    for (int64_t i = 0; i < hp->n_layers; i++) {
        if (types && cJSON_IsArray(types)) {
            const cJSON *t = cJSON_GetArrayItem(types, (int)i);
            const char *s = cJSON_IsString(t) ? t->valuestring : "";
            if (strcmp(s, "chunked_attention") && strcmp(s, "full_attention"))
                return kiln_error(KILN_EUNSUPPORTED, "config.json: layer_types[%lld] \"%s\" is not supported", (long long)i, s);
            hp->layer_chunked[i] = !strcmp(s, "chunked_attention");
        } else {
            hp->layer_chunked[i] = !hp->layer_nope[i];
        }
        chunked += hp->layer_chunked[i];
    }
    KILN_TRY(km_json_int_or_null(cfg, "attention_chunk_size", 8192, 0, &hp->attn_chunk));
    if (chunked && (hp->attn_chunk <= 0 || hp->attn_chunk > INT32_MAX))
        return kiln_error(KILN_EINVAL, "config.json: chunked_attention layers need a positive \"attention_chunk_size\"");
    return NULL;
}

/* moe_layers, when not null, replaces the interleave step (an empty list: no MoE layer). */
static kiln_status moe_layers(const cJSON *cfg, km_hparams *hp) {
    const cJSON *l = ku_json_get(cfg, "moe_layers"), *e;
    if (!l || cJSON_IsNull(l)) return NULL;
    if (!cJSON_IsArray(l)) return kiln_error(KILN_EINVAL, "config.json: \"moe_layers\" must be a list");
    memset(hp->layer_moe, 0, sizeof hp->layer_moe);
    cJSON_ArrayForEach(e, l) {
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: \"moe_layers\" must list layer numbers");
        if (e->valuedouble >= 0 && e->valuedouble < (double)hp->n_layers) hp->layer_moe[(int64_t)e->valuedouble] = 1;
    }
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    bool tuning;
    double attn_scale;
    int64_t floor_scale;
    KILN_TRY(ku_json_num(cfg, "rms_norm_eps", 1e-5, &hp->norm_eps));
    KILN_TRY(km_rope_default(cfg, hp, "rope_theta", 500000.0, &hp->rope_theta));
    KILN_TRY(km_json_int_or_null(cfg, "head_dim", 128, hp->hidden / hp->n_heads, &hp->head_dim));
    if (hp->head_dim <= 0) return kiln_error(KILN_EINVAL, "config.json: \"head_dim\" must be positive");
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    KILN_TRY(ku_json_int(cfg, "intermediate_size", 8192, &hp->ffn));
    hp->mlp_bias = false;
    KILN_TRY(km_moe_parse(cfg, hp,
                          &(km_moe_keys){.experts = "num_local_experts", .top_k = "num_experts_per_tok", .top_k_def = 1,
                                         .step = "interleave_moe_layer_step"}));
    if (!hp->n_experts) return kiln_error(KILN_EINVAL, "config.json: \"num_local_experts\" must be positive");
    hp->shared_ffn = hp->expert_ffn; /* the shared expert is intermediate_size wide */
    hp->moe_score = KM_MOE_TOPK_SIGMOID;
    hp->moe_norm_topk = false;
    KILN_TRY(ku_json_int(cfg, "intermediate_size_mlp", 16384, &hp->ffn));
    KILN_TRY(nope_layers(cfg, hp));
    KILN_TRY(chunked_layers(cfg, hp));
    KILN_TRY(moe_layers(cfg, hp));
    KILN_TRY(ku_json_bool(cfg, "use_qk_norm", true, &hp->qk_norm));
    /* attn_temperature_tuning was an integer in early configs: any non-zero value turns it on */
    const cJSON *tt = ku_json_get(cfg, "attn_temperature_tuning");
    tuning = !tt || cJSON_IsTrue(tt) || (cJSON_IsNumber(tt) && tt->valuedouble != 0);
    KILN_TRY(ku_json_num(cfg, "attn_scale", 0.1, &attn_scale));
    KILN_TRY(ku_json_int(cfg, "floor_scale", 8192, &floor_scale));
    if (tuning) {
        if (floor_scale <= 0) return kiln_error(KILN_EINVAL, "config.json: \"floor_scale\" must be positive");
        hp->q_temp_beta = (float)attn_scale;
        hp->q_temp_floor = floor_scale;
    }
    KILN_TRY(km_rope_one(hp, true));
    snprintf(hp->features, sizeof hp->features, "%s%sexperts' inputs scaled by the sigmoid router score",
             hp->qk_norm ? "L2 q/k norms on rope layers, " : "",
             tuning ? "query temperature on NoPE layers (position + 1), " : "");
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    bool rope = !b->hp->layer_nope[il];
    if (rope && b->hp->qk_norm) {
        o->attn.qk_norm = KB_QK_PER_HEAD;
        o->attn.qk_norm_kind = KB_NORM_RMS;
        o->attn.qk_norm_plain = true;
        o->attn.qk_norm_after_rope = true;
    }
    if (rope) o->attn.temp_beta = 0;
    o->attn.temp_offset = 1;
    o->moe.layout = KB_MOE_IN_OUT_HALVES;
    o->moe.scale_input = true;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"llama4_text", NULL};
const km_family km_family_llama4_text = {"llama4_text", types, &names, parse, emit};
