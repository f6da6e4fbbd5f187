/* session.h: one sequence's generation loop around the sampler, the stop
 * conditions and the stop-string matcher, so the CLI and the server share
 * it. Per token the engine calls kgen_session_step with the logits and gets
 * the token to feed back, the text to show now and whether to stop:
 *
 *     kgen_session *g;
 *     KILN_TRY(kgen_session_create(&params, &vocab, n_ctx, eos, n_eos,
 *                                  prompt, n_prompt, &g));
 *     kgen_finish f = kgen_session_start(g);      // n_predict 0, prompt too long
 *     while (f == KGEN_CONTINUE) {
 *         const float *logits = forward(...);       // last position
 *         kgen_step st;
 *         KILN_TRY(kgen_session_step(g, logits, &st));
 *         fwrite(st.text, 1, st.text_len, stdout);  // streaming-safe
 *         f = st.finish;                            // else decode st.token
 *     }
 *     // kgen_finish_reason(f): "stop" / "length"
 */
#ifndef KILN_GEN_SESSION_H
#define KILN_GEN_SESSION_H

#include "gen/sampler.h"
#include "gen/stop.h"

typedef struct kgen_session kgen_session;

typedef struct {
    int32_t token;     /* the sampled token (not to be decoded when finish != CONTINUE) */
    const char *text;  /* text to show now; borrowed until the next call */
    size_t text_len;
    kgen_finish finish;
    kgen_sample sample; /* logprobs, when requested */
} kgen_step;

/* The vocabulary's piece callback gives each token's text (it must be set).
 * The prompt goes into the penalty/DRY history. */
kiln_status kgen_session_create(const kgen_params *p, const kgen_vocab *v, int32_t n_ctx,
                                const int32_t *eos_ids, int32_t n_eos, const int32_t *prompt,
                                int32_t n_prompt, kgen_session **out);
void kgen_session_destroy(kgen_session *g);
/* A stateful detokenizer for this sequence (e.g. ktok_stream): push gives
 * the text a token completes (complete UTF-8 only), flush what is left at
 * the end. When set, it replaces vocab.piece for the output text, so the
 * streamed text equals decoding all generated ids at once. */
typedef struct {
    const char *(*push)(void *ud, int32_t id, size_t *len);
    const char *(*flush)(void *ud, size_t *len);
    void *ud;
} kgen_detok;
void kgen_session_set_detok(kgen_session *g, const kgen_detok *d);
/* Whether anything can be generated at all. */
kgen_finish kgen_session_start(const kgen_session *g);
/* Samples, accepts and decodes one token; on the last one the text includes
 * everything held back (except a matched stop string and what follows it). */
kiln_status kgen_session_step(kgen_session *g, const float *logits, kgen_step *out);
/* With params.grammar (vocab.grammar must be set), the sequence owns a
 * grammar matcher: its mask is applied to the logits before the sampler
 * chain (EOS only where the grammar may end), and generation ends with
 * KGEN_FINISH_GRAMMAR once the grammar is complete and nothing may follow. */
kgen_sampler *kgen_session_sampler(kgen_session *g);
int32_t kgen_session_generated(const kgen_session *g);
/* The stop string that ended generation (index into params.stop), or -1. */
int32_t kgen_session_stop_index(const kgen_session *g);
/* A sentence on why generation ended (see kgen_finish_describe). */
const char *kgen_session_describe(const kgen_session *g, kgen_finish f, char *buf, size_t cap);

#endif
