/* textio.h: the bridge between the tokenizer and the generation library
 * (prefix ke_text_), shared by the CLI and the server.
 *
 * ke_text_vocab: token text for the sampler (DRY sequence breakers, logit
 * bias keys): a stateless decode of one token, and tokenization without
 * special tokens. ke_text_detok: one sequence's streaming detokenizer, so
 * that the text a session streams equals decoding every generated id at
 * once. Neither is thread-safe: use one per sequence. */
#ifndef KILN_TEXTIO_H
#define KILN_TEXTIO_H

#include "gen/session.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const ktok *tok;
    char *buf; /* the last piece returned */
    int32_t n_vocab;
} ke_text_vocab;

/* vocab size: the model's (rows of logits), which may exceed the tokenizer's */
void ke_text_vocab_init(ke_text_vocab *v, const ktok *tok, int32_t n_vocab);
kgen_vocab ke_text_vocab_get(ke_text_vocab *v);
void ke_text_vocab_free(ke_text_vocab *v);

typedef struct {
    ktok_stream *s;
    char *buf;
} ke_text_detok;

kiln_status ke_text_detok_init(ke_text_detok *d, const ktok *tok, bool skip_special);
kgen_detok ke_text_detok_get(ke_text_detok *d);
void ke_text_detok_free(ke_text_detok *d);

#endif
