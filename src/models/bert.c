/* bert.c: BERT (BertModel, BertForSequenceClassification) and XLM-RoBERTa /
 * RoBERTa (XLMRobertaModel, ...ForSequenceClassification): bidirectional
 * encoders with post-LN layers, n(x + f(x)), LayerNorms with bias, learned
 * absolute positions and token type embeddings added to the token
 * embeddings and LayerNorm'ed, biases on every projection, an ungated
 * GELU (erf) MLP, no final norm. The graph ends at the last hidden states,
 * or, for the classification checkpoints, at the head on the first token:
 * BERT's pooler (tanh) + classifier, RoBERTa's classifier.dense (tanh) +
 * classifier.out_proj (modeling_bert.py, modeling_xlm_roberta.py).
 * RoBERTa numbers positions from padding_idx + 1 (create_position_ids_from_input_ids:
 * a sequence without padding tokens sits at pad + 1 + index). */
#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "models/blocks.h"

/* transformers saves the bare model without a prefix and the classifier's
 * encoder under "bert." / "roberta." */
#define ENCODER_NAMES(P)                                                                                               \
    [KM_T_TOK_EMBD] = P "embeddings.word_embeddings|embeddings.word_embeddings",                                        \
    [KM_T_POS_EMBD] = P "embeddings.position_embeddings|embeddings.position_embeddings",                                \
    [KM_T_TYPE_EMBD] = P "embeddings.token_type_embeddings|embeddings.token_type_embeddings",                           \
    [KM_T_TOK_EMBD_NORM] = P "embeddings.LayerNorm|embeddings.LayerNorm",                                               \
    [KM_T_ATTN_Q] = P "encoder.layer.%d.attention.self.query|encoder.layer.%d.attention.self.query",                   \
    [KM_T_ATTN_K] = P "encoder.layer.%d.attention.self.key|encoder.layer.%d.attention.self.key",                       \
    [KM_T_ATTN_V] = P "encoder.layer.%d.attention.self.value|encoder.layer.%d.attention.self.value",                   \
    [KM_T_ATTN_O] = P "encoder.layer.%d.attention.output.dense|encoder.layer.%d.attention.output.dense",               \
    [KM_T_ATTN_NORM] = P "encoder.layer.%d.attention.output.LayerNorm|encoder.layer.%d.attention.output.LayerNorm",     \
    [KM_T_FFN_UP] = P "encoder.layer.%d.intermediate.dense|encoder.layer.%d.intermediate.dense",                       \
    [KM_T_FFN_DOWN] = P "encoder.layer.%d.output.dense|encoder.layer.%d.output.dense",                                 \
    [KM_T_FFN_NORM] = P "encoder.layer.%d.output.LayerNorm|encoder.layer.%d.output.LayerNorm"

static const km_names bert_names = {
    ENCODER_NAMES("bert."),
    [KM_T_POOLER] = "bert.pooler.dense|pooler.dense",
    [KM_T_CLASSIFIER] = "classifier",
};

static const km_names roberta_names = {
    ENCODER_NAMES("roberta."),
    [KM_T_POOLER] = "classifier.dense",
    [KM_T_CLASSIFIER] = "classifier.out_proj",
};

static bool is_classifier(const cJSON *cfg) {
    const cJSON *a = ku_json_get(cfg, "architectures"), *it;
    cJSON_ArrayForEach(it, a) {
        const char *s = cJSON_GetStringValue(it);
        if (s && strstr(s, "ForSequenceClassification")) return true;
    }
    return false;
}

static kiln_status parse(const cJSON *cfg, km_hparams *hp) {
    const char *pet;
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-12, &hp->norm_eps));
    KILN_TRY(ku_json_int(cfg, "type_vocab_size", 2, &hp->type_vocab));
    KILN_TRY(ku_json_str(cfg, "position_embedding_type", "absolute", &pet));
    if (strcmp(pet, "absolute"))
        return kiln_error(KILN_EUNSUPPORTED, "config.json: position_embedding_type \"%s\" (kiln: absolute)", pet);
    hp->attn_qkv_bias = hp->attn_o_bias = hp->mlp_bias = true;
    hp->bidirectional = true;
    hp->no_final_norm = true;
    km_no_rope(hp);
    if (is_classifier(cfg)) { /* num_labels is not saved; id2label has one entry per label */
        const cJSON *l = ku_json_get(cfg, "id2label");
        hp->n_labels = cJSON_IsObject(l) ? cJSON_GetArraySize(l) : 2;
        if (hp->n_labels <= 0) return kiln_error(KILN_EINVAL, "config.json: id2label is empty");
    } else {
        hp->hidden_out = true;
    }
    snprintf(hp->features, sizeof hp->features, "encoder, post-LN, learned positions, token types%s",
             hp->n_labels ? ", classification head" : "");
    return NULL;
}

static kiln_status parse_roberta(const cJSON *cfg, km_hparams *hp) {
    KILN_TRY(parse(cfg, hp));
    KILN_TRY(ku_json_num(cfg, "layer_norm_eps", 1e-5, &hp->norm_eps));
    int64_t pad;
    KILN_TRY(ku_json_int(cfg, "pad_token_id", 1, &pad));
    if (pad < 0 || pad > 1000) return kiln_error(KILN_EINVAL, "config.json: pad_token_id %lld", (long long)pad);
    hp->pos_offset = (int)pad + 1;
    hp->max_pos -= hp->pos_offset; /* the table's first rows are not positions */
    return NULL;
}

static void layer(const kb_ctx *b, int il, kb_layer_opts *o) {
    o->norm_place = KB_NORM_RESIDUAL;
    o->norm.kind = KB_NORM_LAYER;
    o->ffn.gated = false;
}

static kg_node *emit(kb_ctx *b) {
    const km_hparams *hp = b->hp;
    kb_embed_opts eo = {.positions = true, .pos_offset = hp->pos_offset, .norm = true, .norm_kind = KB_NORM_LAYER};
    kg_node *x = kb_layers(b, kb_embed(b, &eo), layer, NULL);
    return hp->n_labels > 0 ? kb_classifier(b, x) : kb_output(b, x, NULL);
}

static const char *const bert_types[] = {"bert", NULL};
const km_family km_family_bert = {"bert", bert_types, &bert_names, parse, emit};
static const char *const roberta_types[] = {"xlm-roberta", "roberta", NULL};
const km_family km_family_xlm_roberta = {"xlm-roberta", roberta_types, &roberta_names, parse_roberta, emit};
