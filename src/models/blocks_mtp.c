/* blocks_mtp.c: a checkpoint's multi-token prediction (MTP) head as a model
 * of its own, its decoder layer built by the family's own blocks (see
 * blocks.h, "multi-token prediction heads").
 *
 * Every layout computes, for the main model's last hidden state h_p at
 * position p (after its final norm) and the token t_{p+1} that follows:
 *   e = embed(t_{p+1}) (zero at p = 0 where the layout says so)
 *   x = proj([norm_e(e), norm_h(h_p)])  (MiMo: [norm_h(h_p), norm_e(e)])
 *   x = decoder layer(x) at position p, with its own KV cache
 *   logits = head(final_norm(x)), a guess for t_{p+2}
 * and a chained guess feeds the head's own state back as h (vLLM's
 * deepseek_mtp.py, qwen3_next_mtp.py, mimo_mtp.py; llama.cpp's nextn
 * tensors of GLM-4.5). The layouts differ in names, the concat order, the
 * zeroed first embedding, which state chains, and which layer's settings
 * the decoder layer takes:
 *   DeepSeek-V3 / GLM-4.5: model.layers.<n>.{enorm, hnorm, eh_proj,
 *     shared_head.norm, shared_head.head?, embed_tokens?} beside the decoder
 *     layer model.layers.<n>.* (n = num_hidden_layers), which is layer n of
 *     the model (first_k_dense_replace decides its MLP); the embedding and
 *     head are the main model's unless the layer carries its own; the chained
 *     state is the one before shared_head.norm (vLLM applies that norm in
 *     compute_logits only); embedding zeroed at position 0. GLM-4.7-Flash
 *     (glm4_moe_lite) and GLM-5 (glm_moe_dsa) take this layout; GLM-5's
 *     layer runs its own lightning indexer (the head has no earlier layer
 *     whose choice a "shared" layer could reuse: one without indexer
 *     weights is refused).
 *   Qwen3-Next / Qwen3.5: mtp.{pre_fc_norm_embedding, pre_fc_norm_hidden,
 *     fc, norm} and mtp.layers.0.*, a full-attention layer with layer 0's
 *     MLP choice (vLLM builds it with layer_type "full_attention" and index
 *     0); the (1 + w) norms of the family; the main model's embedding and
 *     lm_head; the chained state is after mtp.norm; no zeroing.
 *   EXAONE-MoE: the Qwen names (mtp.fc ...; vLLM's exaone_moe_mtp.py), the
 *     decoder layer layer 0's attention unless mtp_layer_types[0] says
 *     sliding_attention / full_attention (full layers are NoPE where the
 *     model slides), always the dense MLP of intermediate_size.
 *   MiMo: model.mtp_layers.0.{token_layernorm, hidden_layernorm,
 *     input_proj, final_layernorm} and the Qwen 2 layer under the same
 *     prefix; hidden state first in the concat; the chained state after
 *     final_layernorm; embedding zeroed at position 0.
 *   Nemotron-H: several decoder layers, mtp.layers.<i>.* for the i-th
 *     character of mtp_hybrid_override_pattern (or mtp_layers_block_type:
 *     "*E" / attention then moe in the released checkpoints; vLLM's
 *     nemotron_h_mtp.py): enorm, hnorm and eh_proj under mtp.layers.0,
 *     final_layernorm under the last; the head model is those layers alone;
 *     the main model's embedding and lm_head; the chained state after
 *     final_layernorm; no zeroing.
 *   DeepSeek-V4: mtp.<i>.{enorm, hnorm, e_proj, h_proj, hc_head, norm} and
 *     a decoder layer under mtp.<i>. named as transformers names the model's
 *     (self_attn.*, attn_hc, mlp.*; DeepSeek's own names, attn.wq_a ...,
 *     are refused by name); its input is the main model's hc_mult residual
 *     streams before hc_head (km_state_width floats; the model's mtp_state
 *     gives them): x_n = e_proj(enorm(e)) + h_proj(hnorm(h_n)) per stream,
 *     the layer (hyper-connections, attention with a compressor where the
 *     layer has one, experts), then logits = head(norm(mtp.hc_head(x)));
 *     the chained state is the streams before mtp.hc_head; no zeroing
 *     (DeepSeek's MTPBlock). The family's emitter builds it (kb_mtp_prefix,
 *     kb_mtp_hidden, kb_mtp_out), not kb_decoder.
 * Only the first MTP step is used (vLLM's chained drafting with one). */
#include "models/blocks.h"
#include "models/blocks_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

typedef struct kb_mtp kb_mtp;
typedef struct mtp_layout mtp_layout;
struct mtp_layout {
    const char *name;
    const char *model_type; /* only for checkpoints of this model_type (NULL: any) */
    const char *probe;   /* a tensor only this layout has; "%d": the main model's layer count */
    const char *head;    /* prefix of the head's own modules ("%d" as probe) */
    const char *layer;   /* prefix of its decoder layer's modules ("%d" as probe; with base_layer: each layer's index) */
    const char *emb_norm, *hid_norm, *proj, *final_norm; /* under head */
    const char *embed, *lm_head;                         /* its own embedding and output, when present (under head) */
    bool hidden_first;   /* [norm_h(h), norm_e(e)] instead of [norm_e(e), norm_h(h)] */
    bool zero_first;     /* the embedding is zero at position 0 */
    bool chain_prenorm;  /* a chained guess is fed the state before final_norm */
    bool layer_as_first; /* the decoder layer takes layer 0's settings as full attention, not layer n's */
    /* the head's own hyper-parameters from the checkpoint (several layers:
     * Nemotron-H), or adjustments of the ones made; NULL: none */
    kiln_status (*setup)(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck);
    const char *base_layer; /* the family's layer prefix its names carry (NULL: "model.layers.%d.") */
    const char *final_at;   /* prefix of final_norm ("%d": the last decoder layer's index); NULL: head */
};

static kiln_status dsa_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck);
static kiln_status exaone_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck);
static kiln_status nemotron_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck);
static kiln_status v4_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck);

static const mtp_layout layouts[] = {
    {"DeepSeek-V3 / GLM nextn (model.layers.<n>.*)", NULL, "model.layers.%d.eh_proj.weight", "model.layers.%d.", "model.layers.%d.",
     "enorm", "hnorm", "eh_proj", "shared_head.norm", "embed_tokens", "shared_head.head", false, true, true, false, dsa_setup, NULL, NULL},
    {"EXAONE-MoE (mtp.*)", "exaone_moe", "mtp.fc.weight", "mtp.", "mtp.layers.0.", "pre_fc_norm_embedding", "pre_fc_norm_hidden",
     "fc", "norm", NULL, NULL, false, false, false, true, exaone_setup, NULL, NULL},
    {"Qwen3-Next / Qwen3.5 (mtp.*)", NULL, "mtp.fc.weight", "mtp.", "mtp.layers.0.", "pre_fc_norm_embedding", "pre_fc_norm_hidden",
     "fc", "norm", NULL, NULL, false, false, false, true, NULL, NULL, NULL},
    {"MiMo (model.mtp_layers.*)", NULL, "model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.", "model.mtp_layers.0.",
     "token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm", NULL, NULL, true, true, false, true, NULL, NULL, NULL},
    {"Nemotron-H (mtp.layers.<i>.*)", "nemotron_h", "mtp.layers.0.eh_proj.weight", "mtp.layers.0.", "mtp.layers.%d.", "enorm",
     "hnorm", "eh_proj", "final_layernorm", NULL, NULL, false, false, false, false, nemotron_setup, "backbone.layers.%d.",
     "mtp.layers.%d."},
    {"DeepSeek-V4 (mtp.<i>.*)", "deepseek_v4", "mtp.0.e_proj.weight", "mtp.0.", "mtp.0.", "enorm", "hnorm", "e_proj", "norm", NULL,
     NULL, false, false, true, false, v4_setup, NULL, NULL},
};
enum { N_LAYOUTS = sizeof layouts / sizeof *layouts };

static kg_node *mtp_emit(kb_ctx *b);

struct kb_mtp {
    km_family fam; /* first: the emitter reaches the rest through b->fam */
    km_names names;
    char *owned[KM_T_COUNT];
    const km_family *base;
    const mtp_layout *lay;
    km_hparams hp;
    cJSON *cfg;        /* the config hp was parsed from (hp borrows from it); NULL: the main model's */
    int il, n;         /* the decoder layers: il .. il + n - 1 of hp (the last n) */
    char head[64], layer[64];
};

/* pat with its "%d" (if any) replaced by n */
static void fill(char *buf, size_t cap, const char *pat, int64_t n) {
    const char *d = strstr(pat, "%d");
    if (d) snprintf(buf, cap, "%.*s%lld%s", (int)(d - pat), pat, (long long)n, d + 2);
    else snprintf(buf, cap, "%s", pat);
}

static const mtp_layout *find_layout(const kc_checkpoint *ck, int64_t n_layers) {
    const char *type = NULL;
    kiln_status_free(ku_json_str(kc_config(ck), "model_type", "", &type));
    for (size_t i = 0; i < N_LAYOUTS; i++) {
        char probe[256];
        fill(probe, sizeof probe, layouts[i].probe, n_layers);
        if ((!layouts[i].model_type || (type && !strcmp(type, layouts[i].model_type))) && kc_has(ck, probe)) return &layouts[i];
    }
    return NULL;
}

/* Every tensor of an MTP layer, whatever its layout (see blocks.h). */
int kb_mtp_tensors(const kc_checkpoint *ck, int64_t n_layers, int *layers, const char **first) {
    int n = 0;
    long hi = -1;
    *first = NULL;
    for (int i = 0; i < kc_tensor_count(ck); i++) {
        const char *name = kc_tensor_at(ck, i)->name;
        long l = -1;
        bool mtp = !strncmp(name, "mtp.", 4) || !strncmp(name, "model.mtp.", 10) || !strncmp(name, "model.mtp_layers.", 17);
        if (!strncmp(name, "model.layers.", 13)) {
            char *end;
            l = strtol(name + 13, &end, 10);
            mtp = end != name + 13 && *end == '.' && l >= n_layers;
        }
        if (!mtp) continue;
        if (!*first) *first = name;
        if (l >= n_layers && l - n_layers > hi) hi = l - (long)n_layers;
        n++;
    }
    int64_t declared = 0;
    kiln_status_free(ku_json_int(kc_config(ck), "num_nextn_predict_layers", 0, &declared));
    *layers = declared > 0 ? (int)declared : hi >= 0 ? (int)hi + 1 : n > 0;
    return n;
}

void kb_mtp_free(kb_mtp *m) {
    if (!m) return;
    for (int t = 0; t < KM_T_COUNT; t++) free(m->owned[t]);
    cJSON_Delete(m->cfg);
    free(m);
}

const km_family *kb_mtp_family(const kb_mtp *m) { return &m->fam; }
const km_hparams *kb_mtp_hparams(const kb_mtp *m) { return &m->hp; }
const char *kb_mtp_layout(const kb_mtp *m) { return m->lay->name; }
int kb_mtp_decoder_layers(const kb_mtp *m) { return m->n; }
const char *kb_mtp_prefix(const kb_mtp *m) { return m->head; }
int kb_mtp_layer(const kb_mtp *m) { return m->il; }

/* pat with every key ("model.layers.%d.") replaced by the decoder layer's prefix */
static char *rename_layer(const char *pat, const char *key, const char *layer) {
    size_t n = strlen(pat) + 1, k = strlen(key);
    for (const char *p = strstr(pat, key); p; p = strstr(p + k, key)) n += strlen(layer);
    char *out = malloc(n), *o = out;
    if (!out) return NULL;
    for (const char *p = pat; *p;) {
        if (!strncmp(p, key, k)) {
            o += sprintf(o, "%s", layer);
            p += k;
        } else *o++ = *p++;
    }
    *o = 0;
    return out;
}

static bool set_name(kb_mtp *m, km_tensor t, const char *prefix, const char *name) {
    free(m->owned[t]);
    size_t n = strlen(prefix) + strlen(name) + 1;
    m->owned[t] = malloc(n);
    if (!m->owned[t]) return false;
    snprintf(m->owned[t], n, "%s%s", prefix, name);
    m->names[t] = m->owned[t];
    return true;
}

/* The per-layer settings of layer `from` also for layer `to`. */
static void copy_layer(km_hparams *hp, int from, int to) {
#define C(f) hp->f[to] = hp->f[from]
    C(layer_heads), C(layer_kv_heads), C(layer_ffn), C(layer_sliding), C(layer_dsa_shared), C(layer_compress), C(layer_csa);
    C(layer_hash), C(layer_nope), C(layer_moe), C(layer_chunked), C(layer_recurrent), C(layer_ffn_only), C(zamba_hybrid);
    C(cross_layer), C(layer_head_dim), C(layer_kv_from), C(layer_k_eq_v), C(layer_act_sparsity);
#undef C
}

/* hp for a model of n + 1 layers whose last is the head's decoder layer */
static kiln_status mtp_hparams(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck) {
    int64_t n = thp->n_layers;
    if (n + 1 > KM_MAX_LAYERS) return kiln_error(KILN_EUNSUPPORTED, "%lld layers and an MTP layer (kiln supports up to %d)", (long long)n, KM_MAX_LAYERS);
    bool parsed = false;
    if (!m->lay->layer_as_first) { /* layer n as config.json's rules make it (first_k_dense_replace, ...) */
        cJSON *c = cJSON_Duplicate(kc_config(ck), true);
        const char *key = c ? km_config_key(c, "num_hidden_layers") : NULL;
        cJSON *nl = key ? cJSON_GetObjectItemCaseSensitive(c, key) : NULL;
        if (nl && cJSON_IsNumber(nl)) {
            cJSON_SetNumberValue(nl, (double)(n + 1));
            kiln_status st = km_parse(m->base, c, &m->hp);
            if (!st && m->hp.n_layers == n + 1 && m->hp.hidden == thp->hidden && m->hp.vocab == thp->vocab) parsed = true;
            kiln_status_free(st);
        }
        if (parsed) m->cfg = c;
        else cJSON_Delete(c);
    }
    if (!parsed) { /* lists of n layers (layer_types): the layer takes layer 0's settings, or the last one's */
        m->hp = *thp;
        m->hp.n_layers = n + 1;
        copy_layer(&m->hp, m->lay->layer_as_first ? 0 : (int)n - 1, (int)n);
    }
    if (m->lay->layer_as_first) m->hp.layer_recurrent[n] = 0, m->hp.layer_ffn_only[n] = 0;
    m->il = (int)n;
    m->n = 1;
    return NULL;
}

/* The settings of a head model the graph needs whatever the layout. */
static void head_model(km_hparams *hp) {
    hp->hidden_out = hp->mtp_state = false;
    hp->n_labels = 0;
    hp->hidden_in = true;
    hp->out_extra = km_state_width(hp);
    hp->embd_in = false;
    hp->embd_add_layers = 0;
}

/* GLM-5 (glm_moe_dsa): a layer that reuses the previous indexer's choice
 * ("shared") has none to reuse in a head of its own; one with its own
 * indexer weights runs them. */
static kiln_status dsa_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck) {
    (void)thp;
    if (m->hp.dsa_topk <= 0 || !m->hp.layer_dsa_shared[m->il]) return NULL;
    char name[300];
    snprintf(name, sizeof name, "%sself_attn.indexer.wk.weight", m->layer);
    if (!kc_has(ck, name))
        return kiln_error(KILN_EUNSUPPORTED, "the MTP layer %s* reuses an earlier layer's indexer choice (indexer_types \"shared\") and "
                          "has no indexer of its own (%s): a head of its own has no earlier layer to take it from", m->layer, name);
    m->hp.layer_dsa_shared[m->il] = 0;
    return NULL;
}

/* EXAONE-MoE (vLLM's ExaoneMoeDecoderLayer with is_mtp): the dense MLP, the
 * attention mtp_layer_types[0] names (else layer 0's), NoPE on a full layer
 * of a sliding model. */
static kiln_status exaone_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck) {
    int il = m->il;
    const cJSON *t = ku_json_get(kc_config(ck), "mtp_layer_types");
    if (t && !cJSON_IsNull(t)) {
        const cJSON *e = cJSON_IsArray(t) ? cJSON_GetArrayItem(t, 0) : NULL;
        bool sl = e && cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention");
        if (!sl && !(e && cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention")))
            return kiln_error(KILN_EINVAL, "config.json: mtp_layer_types[0] must be \"sliding_attention\" or \"full_attention\"");
        m->hp.layer_sliding[il] = sl && thp->sliding_window > 0;
    }
    m->hp.layer_nope[il] = thp->sliding_window > 0 && !m->hp.layer_sliding[il];
    m->hp.layer_moe[il] = 0;
    return NULL;
}

/* Nemotron-H: a model of the MTP layers alone, their types from
 * mtp_hybrid_override_pattern or mtp_layers_block_type (the family's parser
 * reads them as the model's own pattern). */
static kiln_status nemotron_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck) {
    const cJSON *cfg = kc_config(ck), *lt = ku_json_get(cfg, "mtp_layers_block_type"), *p = ku_json_get(cfg, "mtp_hybrid_override_pattern");
    bool list = lt && cJSON_IsArray(lt);
    if (!list && !(p && cJSON_IsString(p)))
        return kiln_error(KILN_EINVAL, "config.json: the MTP layers' types are in neither \"mtp_hybrid_override_pattern\" nor "
                          "\"mtp_layers_block_type\"");
    cJSON *c = cJSON_Duplicate(cfg, true);
    if (!c) return kiln_error(KILN_ENOMEM, "out of memory");
    static const char *const drop[] = {"layers_block_type", "layer_types", "hybrid_override_pattern", "num_hidden_layers"};
    for (size_t i = 0; i < sizeof drop / sizeof *drop; i++) cJSON_DeleteItemFromObjectCaseSensitive(c, drop[i]);
    cJSON *v = list ? cJSON_Duplicate(lt, true) : cJSON_CreateString(p->valuestring);
    if (!v || !cJSON_AddItemToObject(c, list ? "layers_block_type" : "hybrid_override_pattern", v)) {
        cJSON_Delete(v), cJSON_Delete(c);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    kiln_status st = km_parse(m->base, c, &m->hp);
    if (st) {
        cJSON_Delete(c);
        return kiln_status_wrap(st, "the MTP layers (mtp_hybrid_override_pattern)");
    }
    m->cfg = c;
    if (m->hp.hidden != thp->hidden || m->hp.vocab != thp->vocab)
        return kiln_error(KILN_EINTERNAL, "the MTP layers' hyper-parameters differ from the model's");
    for (int i = 0; i < m->hp.n_layers; i++)
        if (m->hp.layer_recurrent[i])
            return kiln_error(KILN_EUNSUPPORTED, "MTP layer %d is a Mamba-2 layer (kiln's MTP heads serve attention, MLP and MoE layers)", i);
    m->il = 0;
    m->n = (int)m->hp.n_layers;
    return NULL;
}

/* DeepSeek-V4: the layer's attention (a compressor, with an indexer, makes
 * it HCA or CSA at the config's compress_rates; else sliding, as in the
 * released checkpoints) and its routing (tid2eid: by token id) from its
 * tensors: the config lists no type for it. */
static kiln_status v4_setup(kb_mtp *m, const km_hparams *thp, const kc_checkpoint *ck) {
    (void)thp;
    char name[300];
    static const char *const own[] = {"attn_norm.weight", "attn.wq_a.weight", "hc_attn_fn"};
    for (size_t i = 0; i < sizeof own / sizeof *own; i++) {
        snprintf(name, sizeof name, "%s%s", m->layer, own[i]);
        if (kc_has(ck, name))
            return kiln_error(KILN_EUNSUPPORTED, "the MTP layer's tensors are in DeepSeek's own names (%s): kiln reads DeepSeek-V4 "
                              "checkpoints in transformers' names, the MTP layer's as a decoder layer's under %s (%sself_attn.q_a_proj, "
                              "%sattn_hc.fn, %shc_head.hc_fn ...)", name, m->layer, m->layer, m->layer, m->layer);
    }
    int il = m->il;
    int64_t csa = 4, hca = 128;
    const cJSON *rates = ku_json_get(kc_config(ck), "compress_rates");
    KILN_TRY(ku_json_int(rates, "compressed_sparse_attention", 4, &csa));
    KILN_TRY(ku_json_int(rates, "heavily_compressed_attention", 128, &hca));
    snprintf(name, sizeof name, "%sself_attn.compressor.kv_proj.weight", m->layer);
    bool comp = kc_has(ck, name);
    snprintf(name, sizeof name, "%sself_attn.compressor.indexer.kv_proj.weight", m->layer);
    bool idx = comp && kc_has(ck, name);
    m->hp.layer_csa[il] = idx;
    m->hp.layer_compress[il] = (unsigned char)(!comp ? 0 : idx ? csa : hca);
    snprintf(name, sizeof name, "%smlp.gate.tid2eid", m->layer);
    m->hp.layer_hash[il] = kc_has(ck, name);
    return NULL;
}

kiln_status kb_mtp_open(const km_family *fam, const km_hparams *hp, const kc_checkpoint *ck, kb_mtp **out) {
    *out = NULL;
    int layers;
    const char *first;
    if (kb_mtp_tensors(ck, hp->n_layers, &layers, &first) == 0)
        return kiln_error(KILN_EINVAL, "the checkpoint has no multi-token prediction layers");
    const mtp_layout *lay = find_layout(ck, hp->n_layers);
    if (!lay) {
        char names[1024];
        size_t o = 0;
        for (int i = 0; i < N_LAYOUTS && o < sizeof names; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", layouts[i].name);
        return kiln_error(KILN_EUNSUPPORTED, "the checkpoint's MTP layers (e.g. %s) are in no layout kiln serves (%s)", first, names);
    }
    kb_mtp *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    m->base = fam;
    m->lay = lay;
    fill(m->head, sizeof m->head, lay->head, hp->n_layers);
    if (lay->base_layer) snprintf(m->layer, sizeof m->layer, "%s", lay->layer); /* each layer's own index */
    else fill(m->layer, sizeof m->layer, lay->layer, hp->n_layers);
    kiln_status st = lay->base_layer ? NULL : mtp_hparams(m, hp, ck);
    if (!st && lay->setup) st = lay->setup(m, hp, ck);
    if (st) {
        kb_mtp_free(m);
        return st;
    }
    head_model(&m->hp);
    bool ok = true;
    const char *key = lay->base_layer ? lay->base_layer : "model.layers.%d.";
    for (int t = 0; ok && t < KM_T_COUNT; t++) {
        const char *p = (*fam->names)[t];
        if (!p || !strstr(p, key)) m->names[t] = p;
        else ok = (m->names[t] = m->owned[t] = rename_layer(p, key, m->layer)) != NULL;
    }
    char own[300], at[64];
    /* one output head, KM_T_OUTPUT: the layer's own, else the main model's (tied: its embedding) */
    snprintf(own, sizeof own, "%s%s.weight", m->head, lay->lm_head ? lay->lm_head : "");
    if (ok && lay->lm_head && kc_has(ck, own)) ok = set_name(m, KM_T_OUTPUT, m->head, lay->lm_head);
    else if (ok && m->hp.tie_embeddings) m->names[KM_T_OUTPUT] = (*fam->names)[KM_T_TOK_EMBD];
    m->hp.tie_embeddings = false;
    snprintf(own, sizeof own, "%s%s.weight", m->head, lay->embed ? lay->embed : "");
    if (ok && lay->embed && kc_has(ck, own)) ok = set_name(m, KM_T_TOK_EMBD, m->head, lay->embed);
    if (lay->final_at) fill(at, sizeof at, lay->final_at, m->il + m->n - 1);
    if (ok) ok = set_name(m, KM_T_OUTPUT_NORM, lay->final_at ? at : m->head, lay->final_norm);
    if (!ok) {
        kb_mtp_free(m);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    m->fam = (km_family){fam->name, fam->model_types, &m->names, fam->parse, mtp_emit};
    *out = m;
    return NULL;
}

/* ---------------------------------------------------------------- the head's graph */

static kg_node *norm_named(kb_ctx *b, kg_node *x, const char *prefix, const char *name) {
    char full[300];
    snprintf(full, sizeof full, "%s%s.weight", prefix, name);
    kg_node *w = x ? kb_tensor_named(b, full, 1, (int64_t[]){x->shape.d[x->shape.rank - 1]}) : NULL;
    if (!w) return NULL;
    return kg_rms_norm(b->g, x, w, (float)b->hp->norm_eps, b->norm_offset_stored ? 0.0f : b->hp->norm_offset);
}

/* [R, vocab + hidden]: the logits, then the state a chained guess is fed. */
kg_node *kb_mtp_decoder(kb_ctx *b, kb_layer_opts_fn family) {
    const kb_mtp *m = b->mtp;
    const mtp_layout *lay = m->lay;
    b->mtp = NULL; /* built (mtp_emit checks) */
    kg_graph *g = b->g;
    int64_t T = b->shape.T, H = b->hp->hidden;
    kg_node *e = kb_embed(b, NULL);
    if (e && lay->zero_first) {
        kg_node *keep = kg_compare(g, KG_CMP_NE, b->pos, kg_broadcast_like(g, kg_scalar(g, KG_I32, 0), b->pos));
        keep = kg_broadcast_in_dim(g, keep, KG_SHAPE(T, H), (int[]){0});
        e = kg_select(g, keep, e, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), e));
    }
    kg_node *h = kb_mtp_hidden(b);
    e = norm_named(b, e, m->head, lay->emb_norm);
    h = norm_named(b, h, m->head, lay->hid_norm);
    if (!e || !h) return NULL;
    kg_node *parts[2] = {lay->hidden_first ? h : e, lay->hidden_first ? e : h};
    char proj[300];
    snprintf(proj, sizeof proj, "%s%s", m->head, lay->proj);
    kg_node *x = kb_linear_module(b, kg_concat(g, parts, 2, 1), proj, H);
    kb_layer_opts o;
    for (int il = m->il; x && il < m->il + m->n; il++) {
        kb_layer_defaults(b, il, &o);
        if (family) family(b, il, &o);
        x = kb_layer(b, x, il, &o);
    }
    if (!x) return NULL;
    kg_node *logits = kb_output(b, x, &o.norm);
    kg_node *last = kg_take_rows(g, x, b->rows);
    kg_node *chain = lay->chain_prenorm ? last : kb_norm_ex(b, last, KM_T_OUTPUT_NORM, -1, &o.norm);
    return kb_mtp_out(b, logits, chain);
}

kg_node *kb_mtp_hidden(kb_ctx *b) {
    return kb_input_param(b, KG_F32, KG_SHAPE(b->shape.T, km_state_width(b->hp)), "mtp_hidden", KB_IN_EMBD, 0, 0, false);
}

kg_node *kb_mtp_out(kb_ctx *b, kg_node *logits, kg_node *chain) {
    b->mtp = NULL; /* built (mtp_emit checks) */
    if (!logits || !chain) return NULL;
    if (chain->shape.rank != 2 || chain->shape.d[1] != km_state_width(b->hp))
        return kb_fail(b, kiln_error(KILN_EINTERNAL, "the MTP head's chained state is not [rows, %lld]", (long long)km_state_width(b->hp)));
    return kg_name(kg_concat(b->g, (kg_node *[]){logits, chain}, 2, 1), "mtp_out", -1);
}

/* The family's emitter, whose kb_decoder builds the head. */
static kg_node *mtp_emit(kb_ctx *b) {
    const kb_mtp *m = (const kb_mtp *)b->fam;
    b->mtp = m;
    kg_node *out = m->base->emit(b);
    if (b->mtp && !b->err) /* the family builds its layers some other way */
        return kb_fail(b, kiln_error(KILN_EUNSUPPORTED, "the MTP layer of a %s model is not served: its emitter does not build "
                                     "its layers with kb_decoder", m->base->name));
    return out;
}
