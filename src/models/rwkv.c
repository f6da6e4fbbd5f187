/* rwkv.c: RWKV-4 (RwkvForCausalLM): LayerNorm pre-norm blocks of time mix
 * (token shift + WKV, kb_rwkv4_time_mix) and channel mix, a pre_ln on the
 * embeddings at block 0, ln_out and an untied head. With rescale_every > 0
 * transformers halves the hidden state after every rescale_every blocks and
 * divides the blocks' output weights to match (at inference); kiln scales
 * the branch outputs by the same powers of two, which is exact. */
#include <string.h>

#include "base/json.h"
#include "models/shared.h"

static const km_names names = {
    [KM_T_TOK_EMBD] = "rwkv.embeddings", [KM_T_TOK_EMBD_NORM] = "rwkv.blocks.0.pre_ln",
    [KM_T_OUTPUT_NORM] = "rwkv.ln_out", [KM_T_OUTPUT] = "head",
    [KM_T_ATTN_NORM] = "rwkv.blocks.%d.ln1", [KM_T_FFN_NORM] = "rwkv.blocks.%d.ln2",
    [KM_T_SSM] = "rwkv.blocks.%d.attention", [KM_T_ATTN_K] = "rwkv.blocks.%d.attention.key",
    [KM_T_ATTN_V] = "rwkv.blocks.%d.attention.value", [KM_T_ATTN_Q] = "rwkv.blocks.%d.attention.receptance",
    [KM_T_ATTN_O] = "rwkv.blocks.%d.attention.output",
    [KM_T_CMIX] = "rwkv.blocks.%d.feed_forward", [KM_T_FFN_UP] = "rwkv.blocks.%d.feed_forward.key",
    [KM_T_FFN_DOWN] = "rwkv.blocks.%d.feed_forward.value", [KM_T_FFN_GATE] = "rwkv.blocks.%d.feed_forward.receptance",
};

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *mt;
    KILN_TRY(ku_json_str(cfg, "model_type", "", &mt));
    snprintf(hp->model_type, sizeof hp->model_type, "%s", mt);
    KILN_TRY(ku_json_int(cfg, "hidden_size", 4096, &hp->hidden));
    KILN_TRY(ku_json_int(cfg, "num_hidden_layers", 32, &hp->n_layers));
    KILN_TRY(ku_json_int(cfg, "vocab_size", 50277, &hp->vocab));
    if (hp->hidden <= 0 || hp->n_layers <= 0 || hp->n_layers > KM_MAX_LAYERS || hp->vocab <= 0)
        return kiln_error(KILN_EINVAL, "config.json: hidden_size, num_hidden_layers (<= %d) and vocab_size must be positive",
                          KM_MAX_LAYERS);
    KILN_TRY(ku_json_int(cfg, "context_length", 1024, &hp->max_pos));
    KILN_TRY(ku_json_num(cfg, "layer_norm_epsilon", 1e-5, &hp->norm_eps));
    KILN_TRY(ku_json_bool(cfg, "tie_word_embeddings", false, &hp->tie_embeddings));
    const cJSON *a = ku_json_get(cfg, "attention_hidden_size"), *f = ku_json_get(cfg, "intermediate_size");
    hp->ssm_inner = a && cJSON_IsNumber(a) ? (int64_t)a->valuedouble : hp->hidden;
    hp->ffn = f && cJSON_IsNumber(f) ? (int64_t)f->valuedouble : 4 * hp->hidden;
    KILN_TRY(ku_json_int(cfg, "rescale_every", 6, &hp->rwkv_rescale_every));
    if (hp->ssm_inner <= 0 || hp->ffn <= 0 || hp->rwkv_rescale_every < 0)
        return kiln_error(KILN_EINVAL, "config.json: attention_hidden_size, intermediate_size and rescale_every must be "
                                       "positive (rescale_every may be 0)");
    hp->n_heads = hp->n_kv_heads = 1;
    hp->head_dim = hp->hidden;
    hp->partial_rotary = 1, hp->rope_theta = 10000;
    km_no_rope(hp);
    memset(hp->layer_recurrent, 1, sizeof hp->layer_recurrent);
    snprintf(hp->features, sizeof hp->features, "RWKV-4 time mix (WKV over %lld channels) and channel mix, token shift%s",
             (long long)hp->ssm_inner, hp->rwkv_rescale_every ? ", rescaled every few blocks" : "");
    return NULL;
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kg_graph *g = b->g;
    kb_norm_opts ln = {.kind = KB_NORM_LAYER};
    kg_node *x = kb_norm_ex(b, kb_embed(b, NULL), KM_T_TOK_EMBD_NORM, -1, &ln);
    int64_t re = hp->rwkv_rescale_every;
    for (int il = 0; il < hp->n_layers && x; il++) {
        double s = re > 0 ? 1.0 / (double)(1ll << (il / re > 62 ? 62 : il / re)) : 1.0;
        kg_node *a = kb_rwkv4_time_mix(b, kb_norm_ex(b, x, KM_T_ATTN_NORM, il, &ln), il);
        x = a ? kg_add(g, x, s != 1 ? kg_scale(g, a, s) : a) : NULL;
        kg_node *f = x ? kb_rwkv4_channel_mix(b, kb_norm_ex(b, x, KM_T_FFN_NORM, il, &ln), il) : NULL;
        x = f ? kg_add(g, x, s != 1 ? kg_scale(g, f, s) : f) : NULL;
        if (x && re > 0 && (il + 1) % re == 0) x = kg_scale(g, x, 0.5);
    }
    return x ? kb_output(b, x, &ln) : NULL;
}

static const char *const types[] = {"rwkv", NULL};
const km_family km_family_rwkv = {"rwkv", types, &names, parse, emit};
