/* embed.h: text embeddings and reranking scores (prefix kemb_).
 *
 * A kemb_model is a checkpoint folder as embedding repositories ship it:
 * the transformer (loaded to its last hidden states, ke_model_load_hidden,
 * or with its sequence classification head for cross-encoders), and the
 * sentence-transformers modules: modules.json, 1_Pooling/config.json (cls,
 * mean, max, last token), <k>_Dense (Linear + activation) and Normalize,
 * and the prompts of config_sentence_transformers.json. A folder without
 * modules.json pools as its model kind suggests (last token for decoders,
 * CLS for encoders) and normalises.
 *
 * Sequences run as one ragged engine step per batch (never padded), so an
 * input's vector does not depend on what it is batched with.
 */
#ifndef KILN_EMBED_H
#define KILN_EMBED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/engine.h"

typedef enum { KEMB_POOL_DEFAULT, KEMB_POOL_CLS, KEMB_POOL_MEAN, KEMB_POOL_MAX, KEMB_POOL_LAST, KEMB_POOL_NONE } kemb_pooling;

/* "cls", "mean", "max", "last" (also "lasttoken"), "none" (every token's hidden state). */
kiln_status kemb_pooling_parse(const char *s, kemb_pooling *out);
const char *kemb_pooling_name(kemb_pooling p);

/* Pooling of one sequence's hidden states H [n, d] into out [d] with
 * sentence-transformers' formulas (mean over all n tokens, max per dim, the
 * first or last row). NONE is not a pooling of one vector. */
void kemb_pool(kemb_pooling p, const float *H, int64_t n, int64_t d, float *out);
/* x / max(||x||_2, 1e-12) in place. */
void kemb_normalize(float *x, int64_t n);

typedef struct kemb_model kemb_model;

kiln_status kemb_load(const char *dir, kemb_model **out);
/* What a folder is loaded as: AUTO decides from the folder (modules.json:
 * embeddings; *ForSequenceClassification: a cross-encoder; another
 * *ForCausalLM without modules.json: a decoder reranker). EMBED takes the
 * last hidden states of any transformer (a bare encoder or decoder without
 * modules.json pools as kemb_load's doc says); RERANK takes a cross-encoder
 * or any causal LM (the yes/no rule). A folder that cannot be what is asked
 * is an error naming why. */
typedef enum { KEMB_AS_AUTO, KEMB_AS_EMBED, KEMB_AS_RERANK } kemb_as;
kiln_status kemb_load_as(const char *dir, kemb_as as, kemb_model **out);
void kemb_free(kemb_model *m);
const ke_model *kemb_engine_model(const kemb_model *m);
kemb_pooling kemb_model_pooling(const kemb_model *m);
bool kemb_model_normalizes(const kemb_model *m);
/* The vector's width after the Dense modules. */
int64_t kemb_dim(const kemb_model *m);
/* True for a cross-encoder (a sequence classification head). */
bool kemb_is_cross_encoder(const kemb_model *m);
/* True for a decoder reranker (a causal LM scored by logit(yes) - logit(no)). */
bool kemb_is_decoder_reranker(const kemb_model *m);
/* The prompt config_sentence_transformers.json names `name` ("query",
 * "document", ...), or NULL. Borrowed. */
const char *kemb_prompt(const kemb_model *m, const char *name);

typedef struct {
    kemb_pooling pooling; /* DEFAULT: the model's */
    int normalize;        /* -1: the model's (Normalize module), 0: no, 1: yes */
} kemb_opts;

/* Embeddings of n token sequences ids[i][0..lens[i]) into out [n, kemb_dim]
 * (o NULL: the model's pipeline). c (created with ke_ctx_params.pooling)
 * must hold the longest input; inputs run
 * in as few steps as the cache allows. */
kiln_status kemb_embed(const kemb_model *m, ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens,
                       const kemb_opts *o, float *out);

/* Every token's last hidden state (pooling none: llama.cpp's --pooling none,
 * sentence-transformers' token_embeddings; no Dense, no Normalize) of n
 * sequences into out [sum lens, hidden], the sequences one after another. */
kiln_status kemb_token_states(const kemb_model *m, ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens, float *out);

/* Raw relevance scores of n token sequences (each a whole pair already in
 * the model's template), types[i] their token types (NULL: 0). A
 * cross-encoder: the first label's logit at the first token. A causal LM
 * (Qwen3-Reranker): logit(yes) - logit(no) at the last token, yes_id and
 * no_id given. kemb_sigmoid turns either into a probability. */
kiln_status kemb_score(const kemb_model *m, ke_ctx *c, int n, const int32_t *const *ids, const int64_t *lens,
                       const int32_t *const *types, int32_t yes_id, int32_t no_id, float *scores);
float kemb_sigmoid(float x);
/* The relevance score sentence-transformers' CrossEncoder gives for a raw
 * score: the logit itself when config.json's sentence_transformers.activation_fn
 * is Identity (ms-marco cross-encoders), else its sigmoid (bge-reranker; and
 * P(yes) for a decoder reranker). */
float kemb_relevance(const kemb_model *m, float raw);
/* order[0..n): the indices of scores, best first (the lower index among equals). */
kiln_status kemb_rank(const float *scores, int n, int *order);

/* ---- text (text.c) */
struct ktok;
/* prompt + text through the tokenizer with its special tokens (the
 * post-processor: [CLS] ... [SEP], ... <|endoftext|>); *ids malloc'ed. */
kiln_status kemb_encode(const struct ktok *tok, const char *prompt, const char *text, int32_t **ids, int64_t *n);
/* A (query, document) pair as m scores it: a cross-encoder's pair template
 * (BERT: types 0 / 1; RoBERTa: one type), or Qwen3-Reranker's prompt with
 * instruction (NULL: its default). *ids, *types malloc'ed (*types NULL for
 * the decoder reranker). */
kiln_status kemb_encode_pair(const kemb_model *m, const struct ktok *tok, const char *instruction, const char *query,
                             const char *doc, int32_t **ids, int32_t **types, int64_t *n);
/* The ids of "yes" and "no" (a decoder reranker's score). */
kiln_status kemb_yes_no(const struct ktok *tok, int32_t *yes, int32_t *no);

#endif
