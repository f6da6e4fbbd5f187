/* stop.h: when generation ends, and a streaming-safe stop-string matcher.
 *
 * Stop strings are matched on the decoded text. The matcher is fed text
 * chunks as tokens are decoded and returns what may be shown now: text that
 * can no longer become part of a stop string, cut on a UTF-8 character
 * boundary. The match it reports is, over the whole text, the one that ends
 * first (ties: the longest, i.e. the one starting first); the returned text
 * stops right before it and the stop text itself is never returned. So the
 * concatenation of the streamed pieces equals the non-streamed result for
 * any chunking. (llama-server picks the earliest start among the matches in
 * its search window, which can depend on how the text was chunked.) */
#ifndef KILN_GEN_STOP_H
#define KILN_GEN_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "gen/params.h"

typedef enum {
    KGEN_CONTINUE = 0,
    KGEN_FINISH_EOS,         /* an end-of-generation token: "stop" */
    KGEN_FINISH_STOP_STRING, /* a stop string matched: "stop" */
    KGEN_FINISH_LENGTH,      /* n_predict tokens generated: "length" */
    KGEN_FINISH_CONTEXT,     /* the context is full: "length" */
    KGEN_FINISH_GRAMMAR,     /* the grammar is complete and nothing may follow: "stop" */
} kgen_finish;

/* OpenAI finish_reason: "stop" or "length"; NULL for KGEN_CONTINUE. */
const char *kgen_finish_reason(kgen_finish f);

typedef struct {
    const int32_t *eos_ids; /* from generation_config.json / config.json (borrowed) */
    int32_t n_eos;
    bool ignore_eos;
    int32_t n_predict; /* -1 no limit; -2 until the context is full; >= 0 a limit */
    int32_t n_ctx;     /* the sequence's context length */
} kgen_limits;

/* Before generating: LENGTH when n_predict is 0, CONTEXT when the prompt
 * (n_prompt tokens) leaves no room for a token. */
kgen_finish kgen_check_start(const kgen_limits *l, int32_t n_prompt);
/* After generating `token`: n_generated counts it, n_past is the sequence
 * length including it. EOS first (the EOS token's text is not output), then
 * n_predict, then the context. */
kgen_finish kgen_check_token(const kgen_limits *l, int32_t token, int32_t n_generated,
                             int32_t n_past);
/* A sentence for logs and errors, e.g. "context full: 4096 tokens (prompt
 * 4000 + 96 generated) fill n_ctx = 4096". Returns buf. */
const char *kgen_finish_describe(kgen_finish f, const kgen_limits *l, int32_t n_generated,
                                 int32_t n_past, char *buf, size_t cap);

typedef struct kgen_stop kgen_stop;
/* Empty strings in stops are skipped. Zero stops is allowed (the matcher
 * then only holds back incomplete UTF-8 characters). */
kiln_status kgen_stop_create(const kgen_strs *stops, kgen_stop **out);
void kgen_stop_destroy(kgen_stop *s);
/* Feeds one chunk. *out / *out_len: the text to emit now (borrowed until the
 * next call; may be empty). Returns true when a stop string matched: *out
 * is then the last text before it and generation should end; later feeds
 * return nothing. */
bool kgen_stop_feed(kgen_stop *s, const char *chunk, size_t len, const char **out,
                    size_t *out_len);
/* Generation ended for another reason: returns all held-back text. */
void kgen_stop_flush(kgen_stop *s, const char **out, size_t *out_len);
/* Index (into the stops given to create, counting empty ones) of the stop
 * string that matched, or -1. */
int32_t kgen_stop_matched(const kgen_stop *s);
/* Bytes held back right now (a possible stop prefix or a partial character). */
size_t kgen_stop_held(const kgen_stop *s);

#endif
