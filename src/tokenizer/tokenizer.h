/* tokenizer.h: Hugging Face tokenizers in C.
 *
 * Loads tokenizer.json (or the legacy vocab.json + merges.txt pair) and
 * encodes text to exactly the ids the Rust `tokenizers` crate produces:
 * BPE (byte-level and SentencePiece-style), Unigram, WordPiece, WordLevel,
 * with their normalizers, pre-tokenizers, post-processors, added tokens and
 * decoders. Decoding streams one id at a time.
 *
 * A ktok is immutable once loaded: encode/decode on one ktok may run from
 * many threads at once. A ktok_stream belongs to one thread.
 *
 * Text in is UTF-8; invalid bytes are replaced by U+FFFD first (maximal
 * subparts, as Python's errors="replace" does before HF sees the string). */
#ifndef KILN_TOKENIZER_H
#define KILN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct ktok ktok;

/* dir holds tokenizer.json, or vocab.json + merges.txt (also found as
 * encoder.json + vocab.bpe); tokenizer_config.json is read when present (bos,
 * eos, add_bos_token/add_eos_token, additional_special_tokens). */
kiln_status ktok_load(const char *dir, ktok **out);
/* tokenizer.json text (len bytes); config_json may be NULL. `what` names the
 * source in error messages. */
kiln_status ktok_load_json(const char *json, size_t len, const char *config_json,
                           size_t config_len, const char *what, ktok **out);
void ktok_free(ktok *t);

/* *ids is malloc'ed (free it; NULL when *n is 0). add_special runs the
 * post-processor (BOS/EOS and the like). */
kiln_status ktok_encode(const ktok *t, const char *text, size_t len, bool add_special,
                        int32_t **ids, size_t *n);
/* *text is malloc'ed and NUL-terminated; *len excludes the NUL. Unknown ids
 * are skipped, as HF does. */
kiln_status ktok_decode(const ktok *t, const int32_t *ids, size_t n, bool skip_special,
                        char **text, size_t *len);

int32_t ktok_vocab_size(const ktok *t);            /* 1 + the largest id */
const char *ktok_token_str(const ktok *t, int32_t id); /* raw vocab string; NULL if none; borrowed */
int32_t ktok_token_id(const ktok *t, const char *s);   /* -1 if absent */
bool ktok_is_special(const ktok *t, int32_t id);
/* The bytes a token stands for in the middle of a text (byte-level BPE's
 * char map undone, SentencePiece's U+2581 as a space, <0xAB> byte tokens);
 * special tokens give their text. Writes at most cap bytes to buf and returns
 * the full length, or -1 for an unknown id. */
int32_t ktok_token_bytes(const ktok *t, int32_t id, char *buf, int32_t cap);
int32_t ktok_bos_id(const ktok *t); /* -1 if none */
int32_t ktok_eos_id(const ktok *t); /* -1 if none */

/* Streaming detokenization: push ids one at a time and get back only
 * complete UTF-8. The pieces plus the final flush concatenate to exactly
 * ktok_decode of all pushed ids. Pieces are malloc'ed (possibly empty, never
 * NULL on success). */
typedef struct ktok_stream ktok_stream;
ktok_stream *ktok_stream_create(const ktok *t, bool skip_special); /* NULL: out of memory */
kiln_status ktok_stream_push(ktok_stream *s, int32_t id, char **piece, size_t *len);
kiln_status ktok_stream_flush(ktok_stream *s, char **piece, size_t *len);
void ktok_stream_destroy(ktok_stream *s);

#endif
