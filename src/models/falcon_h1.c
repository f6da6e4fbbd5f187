/* falcon_h1.c: Falcon-H1 (FalconH1ForCausalLM): every layer runs attention
 * and a Mamba-2 mixer side by side on one normed input (each with its muP
 * input/output multipliers; keys times key_multiplier), adds both to the
 * residual, then a gated MLP with gate/down multipliers. Embeddings and
 * logits carry their own multipliers; the mixer's projections are scaled by
 * ssm_multipliers per segment; its gated norm (optional) works per group. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

/* A float list of exactly n numbers (absent or null: all 1). */
static kiln_status floats(const cJSON *cfg, const char *key, float *out, int n) {
    const cJSON *a = ku_json_get(cfg, key);
    for (int i = 0; i < n; i++) out[i] = 1.0f;
    if (!a || cJSON_IsNull(a)) return NULL;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return kiln_error(KILN_EINVAL, "config.json: \"%s\" must list %d numbers", key, n);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must list %d numbers", key, n);
        out[i] = (float)e->valuedouble;
    }
    return NULL;
}

/* A multiplier: a number, or null / absent for 1. */
static kiln_status mult(const cJSON *cfg, const char *key, float *out) {
    const cJSON *v = ku_json_get(cfg, key);
    *out = 1.0f;
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsNumber(v)) return kiln_error(KILN_EINVAL, "config.json: \"%s\" must be a number", key);
    *out = (float)v->valuedouble;
    return NULL;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = false; /* FalconH1Config forces them off */
    KILN_TRY(km_mamba2_hybrid(cfg, hp, "mamba_"));
    const cJSON *dssm = ku_json_get(cfg, "mamba_d_ssm");
    if (!dssm) hp->ssm_inner = 1024;
    else if (cJSON_IsNumber(dssm)) hp->ssm_inner = (int64_t)dssm->valuedouble;
    else if (!cJSON_IsNull(dssm)) return kiln_error(KILN_EINVAL, "config.json: \"mamba_d_ssm\" must be an integer or null");
    const cJSON *dh = ku_json_get(cfg, "mamba_d_head");
    if (!dh || cJSON_IsString(dh)) hp->ssm_head_dim = hp->ssm_inner / hp->ssm_heads; /* "auto" */
    KILN_TRY(ku_json_bool(cfg, "mamba_norm_before_gate", true, &hp->ssm_norm_before_gate));
    bool rms;
    KILN_TRY(ku_json_bool(cfg, "mamba_rms_norm", false, &rms));
    hp->ssm_gate_only = !rms;
    hp->ssm_norm_groups = hp->ssm_groups;
    KILN_TRY(ku_json_bool(cfg, "projectors_bias", false, &hp->ssm_out_bias));
    float km, ain, aout, sin_, sout, mlp[2], emb, head;
    KILN_TRY(mult(cfg, "key_multiplier", &km));
    KILN_TRY(mult(cfg, "attention_in_multiplier", &ain));
    KILN_TRY(mult(cfg, "attention_out_multiplier", &aout));
    KILN_TRY(mult(cfg, "ssm_in_multiplier", &sin_));
    KILN_TRY(mult(cfg, "ssm_out_multiplier", &sout));
    KILN_TRY(mult(cfg, "embedding_multiplier", &emb));
    KILN_TRY(mult(cfg, "lm_head_multiplier", &head));
    KILN_TRY(floats(cfg, "mlp_multipliers", mlp, 2));
    KILN_TRY(floats(cfg, "ssm_multipliers", hp->ssm_mup, 5));
    hp->ssm_in_scale = sin_;
    hp->emb_scale = emb;
    hp->logit_scale = head;
    hp->fh1_key = km, hp->fh1_attn_in = ain, hp->fh1_attn_out = aout, hp->fh1_ssm_out = sout;
    hp->fh1_mlp_gate = mlp[0], hp->fh1_mlp_down = mlp[1];
    km_mamba2_features(hp, "in parallel with attention in every layer, muP multipliers");
    return NULL;
}

/* attention(x * in) * out + mamba2(x) * ssm_out */
static kg_node *mixer(kb_ctx *b, kg_node *x, int il) {
    const km_hparams *hp = b->hp;
    kb_layer_opts o;
    kb_layer_defaults(b, il, &o);
    o.attn.scale = (float)(1.0 / sqrt((double)hp->head_dim)) * hp->fh1_key; /* (k * m) . q */
    kg_node *a = kb_attention(b, kg_scale(b->g, x, hp->fh1_attn_in), il, &o.attn);
    kg_node *m = kb_mamba2(b, x, il);
    if (!a || !m) return NULL;
    return kg_add(b->g, kg_scale(b->g, m, hp->fh1_ssm_out), kg_scale(b->g, a, hp->fh1_attn_out));
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    (void)il;
    o->mixer = mixer;
    o->ffn.gate_scale = b->hp->fh1_mlp_gate;
    o->ffn.down_scale = b->hp->fh1_mlp_down;
}

static kg_node *emit(kb_ctx *b) { return kb_decoder(b, layer); }

static const char *const types[] = {"falcon_h1", NULL};
const km_family km_family_falcon_h1 = {"falcon_h1", types, &km_bamba_names, parse, emit};
