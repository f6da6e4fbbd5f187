/* kosmos2_5.c: Kosmos-2.5 (Kosmos2_5ForConditionalGeneration, see
 * vision_int.h; its text decoder is models/kosmos2_5.c).
 *
 * Image: Pix2Struct's flattened patches (kimg_preprocess_flat: per-image
 * standardisation, torch's antialiased bilinear resize to at most
 * max_patches patches, 1-based row / column ids, zero rows after).
 * Tower (Kosmos2_5VisionModel): patch_projection (+ bias) plus the row and
 * column embedders' rows at those ids; T5-style layers (RMSNorm without
 * bias, q/k/v/output without biases, attention scaled by 1/sqrt(head_dim)
 * over the patches whose row is not all zero, a gated-GELU (tanh) MLP
 * wi_0/wi_1/wo), a final RMSNorm. Every row goes on, the padding ones too:
 * the features are L2-normalised (F.normalize), projected by `dense` and
 * attended by latent_query_num learned queries over [dense rows; queries]
 * (image_to_text_projection.x_attn: biased q/k/v/out_proj, the text
 * model's heads). Block: <s> <image> <s> x latent_query_num </image>,
 * opening the prompt (Kosmos2_5Processor writes it before the text); the
 * features replace the <s> rows inside <image> ... </image> before the text
 * model's embedding scale, and the segment ids are 1 over that block. */
#include <math.h>
#include <string.h>

#include "base/json.h"
#include "vision/vision_int.h"

static kiln_status parse(kvis_model *m, const cJSON *root, const cJSON *vc, km_hparams *hp) {
    km_hparams *v = &m->vhp;
    const cJSON *tc = ku_json_get(root, "text_config");
    const char *act;
    int64_t nl, pe, q, bos;
    /* Kosmos2_5VisionConfig's defaults */
    KILN_TRY(ku_json_int(vc, "hidden_size", 1536, &v->hidden));
    KILN_TRY(ku_json_int(vc, "num_attention_heads", 24, &v->n_heads));
    KILN_TRY(ku_json_int(vc, "head_dim", 64, &v->head_dim));
    KILN_TRY(ku_json_int(vc, "intermediate_size", 3968, &v->ffn));
    KILN_TRY(ku_json_int(vc, "num_hidden_layers", 18, &nl));
    KILN_TRY(ku_json_int(vc, "patch_embed_hidden_size", 768, &pe));
    KILN_TRY(ku_json_int(vc, "max_num_patches", 4096, &m->pos_rows));
    KILN_TRY(ku_json_num(vc, "layer_norm_eps", 1e-6, &v->norm_eps));
    KILN_TRY(ku_json_str(vc, "dense_act_fn", "gelu_new", &act));
    KILN_TRY(km_parse_act(act, &v->act));
    KILN_TRY(ku_json_int(root, "latent_query_num", 2048, &q));
    KILN_TRY(ku_json_int(tc, "attention_heads", 16, &m->text_heads));
    KILN_TRY(ku_json_int(tc, "bos_token_id", 0, &bos));
    m->patch = (int64_t)llround(sqrt((double)pe / 3.0));
    if (v->n_heads <= 0 || v->head_dim <= 0 || v->hidden <= 0 || v->ffn <= 0 || nl <= 0 || nl > KM_MAX_LAYERS || m->pos_rows < 2 ||
        m->pos_rows > (1 << 20) || 3 * m->patch * m->patch != pe)
        return kiln_error(KILN_EINVAL, "config.json: vision_config: bad shape (hidden %lld, heads %lld x %lld, layers %lld, patch width %lld)",
                          (long long)v->hidden, (long long)v->n_heads, (long long)v->head_dim, (long long)nl, (long long)pe);
    if (q <= 0 || q > (1 << 16) || m->text_heads <= 0 || hp->hidden % m->text_heads)
        return kiln_error(KILN_EINVAL, "config.json: latent_query_num %lld with %lld text heads", (long long)q, (long long)m->text_heads);
    v->n_layers = nl, v->n_kv_heads = v->n_heads;
    snprintf(v->model_type, sizeof v->model_type, "%s", m->tower_type);
    m->text_hidden = hp->hidden;
    m->tokens_per_image = q;
    m->run_layers = (int)nl;
    m->image_size = 0;
    hp->embd_in = true;
    hp->embd_in_unscaled = true; /* inputs_embeds[mask == 1] = image_embeds, then * embed_scale */
    snprintf(m->tower, sizeof m->tower, "vision_model.");
    snprintf(m->proj, sizeof m->proj, "image_to_text_projection.");
    if (!kc_has(m->ck, "vision_model.embeddings.patch_projection.weight"))
        return kiln_error(KILN_ENOTFOUND, "no vision tower tensor \"vision_model.embeddings.patch_projection.weight\"");
    kvis_set_name(m, KM_T_ATTN_NORM, "encoder.layer.%d.pre_attention_layer_norm");
    kvis_set_name(m, KM_T_ATTN_Q, "encoder.layer.%d.attention.query");
    kvis_set_name(m, KM_T_ATTN_K, "encoder.layer.%d.attention.key");
    kvis_set_name(m, KM_T_ATTN_V, "encoder.layer.%d.attention.value");
    kvis_set_name(m, KM_T_ATTN_O, "encoder.layer.%d.attention.output");
    kvis_set_name(m, KM_T_FFN_NORM, "encoder.layer.%d.pre_mlp_layer_norm");
    kvis_set_name(m, KM_T_FFN_GATE, "encoder.layer.%d.mlp.wi_0");
    kvis_set_name(m, KM_T_FFN_UP, "encoder.layer.%d.mlp.wi_1");
    kvis_set_name(m, KM_T_FFN_DOWN, "encoder.layer.%d.mlp.wo");
    kvis_set_name(m, KM_T_OUTPUT_NORM, "layernorm");
    /* the tokenizer's image_token "<s>" (its bos), boi "<image>", eoi "</image>"; without a
     * tokenizer.json: the text bos and, as the oracle fixtures lay them out, the last two ids */
    static const char *const text[3] = {"<s>", "<image>", "</image>"};
    int32_t ids[3];
    kiln_status st;
    if (kvis_token_ids(m->ck, text, 3, ids, &st)) {
        if (st) return st;
        for (int i = 0; i < 3; i++)
            if (ids[i] < 0) snprintf(m->missing_marker, sizeof m->missing_marker, "%s", text[i]);
        m->image_token = ids[0] >= 0 ? ids[0] : (int32_t)bos, m->boi_token = ids[1], m->eoi_token = ids[2];
    } else {
        m->image_token = (int32_t)bos, m->boi_token = (int32_t)(hp->vocab - 2), m->eoi_token = (int32_t)(hp->vocab - 1);
        m->markers_guessed = true;
    }
    m->placeholder = m->boi_token; /* an <image> the prompt names itself; else the block opens it */
    m->global_token = m->fake_token = -1;
    return NULL;
}

/* The processor's patches must fit the embedders (ids up to max_num_patches - 1). */
static kiln_status pixels(const kvis_model *m, kvis_pixels *px) {
    if (px->rows < m->pos_rows && px->cols < m->pos_rows) return NULL;
    kiln_status st = kiln_error(KILN_EINVAL, "%s: %lldx%lld patches, more rows or columns than max_num_patches %lld allows", m->model_type,
                                (long long)px->rows, (long long)px->cols, (long long)m->pos_rows);
    kvis_pixels_free(px);
    return st;
}

/* The rows of table "<tower><module>.weight" [pos_rows, D] at column c of px [N, K], ids clamped to the table. */
static kg_node *id_rows(kb_ctx *b, const kvis_model *m, kg_node *px, int c, const char *module) {
    kg_graph *g = b->g;
    int64_t N = px->shape.d[0], D = m->vhp.hidden, S = m->pos_rows;
    kg_node *t = kvis_tensor_as(b, m->tower, module, 2, (int64_t[]){S, D}, KG_SHAPE(S, D));
    kg_node *ids = kg_convert(g, kg_reshape(g, kg_slice(g, px, (int64_t[]){0, c}, (int64_t[]){N, c + 1}, NULL), KG_SHAPE(N)), KG_I32);
    ids = kg_clamp(g, kg_scalar(g, KG_I32, 0), ids, kg_scalar(g, KG_I32, (double)(S - 1)));
    return t ? kg_take_rows(g, t, ids) : NULL;
}

/* [N, H, hd] of x through a projection of the tower (il) or of x_attn (module, with bias). */
static kg_node *heads(kb_ctx *b, kg_node *x, int64_t H, int64_t hd, km_tensor t, int il, const char *prefix, const char *module) {
    kg_node *y = module ? kvis_linear_mod(b, x, prefix, module, H * hd, true) : kb_linear(b, x, t, il, H * hd, false);
    return y ? kg_reshape(b->g, y, KG_SHAPE(x->shape.d[0], H, hd)) : NULL;
}

static kg_node *emit(kb_ctx *b, const kvis_model *m, kg_node *px, int64_t gh, int64_t gw, kg_node **deep) {
    kg_graph *g = b->g;
    int64_t N = px->shape.d[0], K = px->shape.d[1], D = m->vhp.hidden, H = m->vhp.n_heads, hd = m->vhp.head_dim;
    int64_t E = m->text_hidden, Q = m->tokens_per_image, Ht = m->text_heads;
    /* embeddings: patch_projection(patches) + row_embedder[row] + column_embedder[col] */
    kg_node *x = kvis_linear_mod(b, kg_slice(g, px, (int64_t[]){0, 2}, (int64_t[]){N, K}, NULL), m->tower, "embeddings.patch_projection", D, true);
    x = kg_add(g, x, id_rows(b, m, px, 0, "embeddings.row_embedder.weight"));
    x = kg_add(g, x, id_rows(b, m, px, 1, "embeddings.column_embedder.weight"));
    /* keys of all-zero rows (padding) masked with finfo(float32).min, as _expand_mask */
    kg_node *sum = kg_reduce(g, px, KG_REDUCE_SUM, (int[]){1}, 1);
    kg_node *valid = kg_compare(g, KG_CMP_NE, sum, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), sum));
    kg_node *madd = kg_select(g, valid, kg_broadcast_like(g, kg_scalar(g, KG_F32, 0), sum), kg_broadcast_like(g, kg_scalar(g, KG_F32, -3.4028234663852886e38), sum));
    kg_node *mask = kg_broadcast_in_dim(g, madd, KG_SHAPE(N, N), (int[]){1});
    kb_ffn_opts ffn = {.gated = true, .act = m->vhp.act};
    for (int il = 0; il < m->run_layers && x; il++) {
        kg_node *h = kb_norm(b, x, KM_T_ATTN_NORM, il, KB_NORM_RMS);
        kg_node *q = heads(b, h, H, hd, KM_T_ATTN_Q, il, NULL, NULL), *k = heads(b, h, H, hd, KM_T_ATTN_K, il, NULL, NULL);
        kg_node *v = heads(b, h, H, hd, KM_T_ATTN_V, il, NULL, NULL);
        if (!q || !k || !v) return NULL;
        x = kg_add(g, kb_linear(b, kvis_attend_rows(b, q, k, v, NULL, NULL, mask), KM_T_ATTN_O, il, D, false), x);
        x = kg_add(g, kb_ffn(b, kb_norm(b, x, KM_T_FFN_NORM, il, KB_NORM_RMS), il, &ffn), x);
    }
    x = kb_norm(b, x, KM_T_OUTPUT_NORM, -1, KB_NORM_RMS);
    if (!x) return NULL;
    /* F.normalize(dim=-1): x / max(|x|, 1e-12) */
    kg_node *nrm = kg_unary(g, KG_OP_SQRT, kg_reduce(g, kg_mul(g, x, x), KG_REDUCE_SUM, (int[]){1}, 1));
    nrm = kg_binary(g, KG_OP_MAX, nrm, kg_broadcast_like(g, kg_scalar(g, KG_F32, 1e-12), nrm));
    x = kg_binary(g, KG_OP_DIV, x, kg_broadcast_in_dim(g, nrm, KG_SHAPE(N, D), (int[]){0}));
    /* image_to_text_projection: the latent queries attend over [dense(x); queries] */
    kg_node *h = kvis_linear_mod(b, x, m->proj, "dense", E, true);
    kg_node *lq = kvis_tensor_as(b, m->proj, "latent_query", 2, (int64_t[]){Q, E}, KG_SHAPE(Q, E));
    if (!h || !lq) return NULL;
    kg_node *kv = kg_concat(g, (kg_node *[]){h, lq}, 2, 0);
    kg_node *q = heads(b, lq, Ht, E / Ht, 0, -1, m->proj, "x_attn.q_proj");
    kg_node *k = heads(b, kv, Ht, E / Ht, 0, -1, m->proj, "x_attn.k_proj"), *v = heads(b, kv, Ht, E / Ht, 0, -1, m->proj, "x_attn.v_proj");
    if (!q || !k || !v) return NULL;
    return kvis_linear_mod(b, kvis_attend_rows(b, q, k, v, NULL, NULL, NULL), m->proj, "x_attn.out_proj", E, true);
}

/* <s> <image> <s> x latent_query_num </image> */
static kiln_status image_tokens(const kvis_model *m, const kvis_pixels *px, int64_t gh, int64_t gw, int32_t *ids, int cap, int *n) {
    int32_t pre[2] = {m->image_token, m->boi_token};
    return kvis_block(m, pre, 2, m->tokens_per_image, &m->eoi_token, 1, ids, cap, n);
}

const kvis_family kvis_family_kosmos2_5 = {
    .model_types = {"kosmos-2.5", "kosmos2_5"},
    .projector = "L2 norm + latent-query attention projection",
    .flags = KVIS_F_FLAT | KVIS_F_SEGMENT,
    .parse = parse,
    .pixels = pixels,
    .emit = emit,
    .image_tokens = image_tokens,
};
