/* params.h: generation controls, with llama.cpp's names, defaults and
 * meanings (common/common.h common_params_sampling, common/arg.cpp), their
 * validation, and the two front ends that fill them: CLI flags spelled as in
 * llama.cpp, and an OpenAI / llama-server JSON request body.
 *
 * A kgen_params owns its lists (stop strings, DRY breakers, logit biases):
 * init it with kgen_params_init, release it with kgen_params_free. A server
 * keeps one filled from the CLI as the defaults and copies it per request
 * (kgen_params_copy) before applying the request body, as llama-server does. */
#ifndef KILN_GEN_PARAMS_H
#define KILN_GEN_PARAMS_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

#define KGEN_SEED_RANDOM 0xFFFFFFFFu /* LLAMA_DEFAULT_SEED: a fresh seed per sampler */
#define KGEN_MAX_SAMPLERS 32
#define KGEN_MAX_STOPS 64         /* stop strings per request */
#define KGEN_MAX_STOP_BYTES 1024  /* bytes per stop string */
#define KGEN_MAX_BREAKERS 64      /* DRY sequence breakers */
#define KGEN_MAX_LOGIT_BIAS 65536 /* logit-bias entries */
#define KGEN_MAX_N_PROBS 1024     /* top alternatives reported per token */

/* The chain stages llama.cpp's --samplers names (logit bias always runs
 * first, the draw always last; neither is listed). Values are append-only. */
typedef enum {
    KGEN_SAMPLER_PENALTIES,
    KGEN_SAMPLER_DRY,
    KGEN_SAMPLER_TOP_N_SIGMA,
    KGEN_SAMPLER_TOP_K,
    KGEN_SAMPLER_TYPICAL_P,
    KGEN_SAMPLER_TOP_P,
    KGEN_SAMPLER_MIN_P,
    KGEN_SAMPLER_XTC,
    KGEN_SAMPLER_TEMPERATURE,
    KGEN_SAMPLER_COUNT_
} kgen_sampler_type;

const char *kgen_sampler_name(kgen_sampler_type t); /* canonical: "top_k", "typ_p", ... */

typedef struct {
    int32_t token;
    float bias; /* added to the logit; -INFINITY bans the token */
} kgen_logit_bias;

typedef struct {
    char **v; /* each NUL-terminated; may contain any byte but NUL */
    int32_t n;
} kgen_strs;

typedef struct {
    /* sampler chain (defaults as llama.cpp) */
    float temperature;       /* 0.8; <= 0 greedy (argmax, ties to the lowest id) */
    int32_t top_k;           /* 40; 0 (or -1) disables */
    float top_p;             /* 0.95; 1 disables */
    float min_p;             /* 0.05; 0 disables */
    float typical_p;         /* 1.0 disables */
    float top_n_sigma;       /* -1 disables */
    float xtc_probability;   /* 0 disables */
    float xtc_threshold;     /* 0.1; > 0.5 disables */
    int32_t min_keep;        /* 0: truncating samplers keep at least this many */
    float repeat_penalty;    /* 1.0 disables */
    int32_t repeat_last_n;   /* 64; 0 off, -1 the whole context */
    float presence_penalty;  /* 0 */
    float frequency_penalty; /* 0 */
    float dry_multiplier;    /* 0 disables DRY */
    float dry_base;          /* 1.75 */
    int32_t dry_allowed_length; /* 2 */
    int32_t dry_penalty_last_n; /* -1: the whole context; 0 off */
    kgen_strs dry_breakers;  /* "\n", ":", "\"", "*" */
    bool dry_breakers_from_cli; /* the first --dry-sequence-breaker clears the defaults */
    uint32_t seed;           /* KGEN_SEED_RANDOM */
    kgen_sampler_type samplers[KGEN_MAX_SAMPLERS]; /* order; default as llama.cpp */
    int32_t n_samplers;
    kgen_logit_bias *logit_bias; /* applied first, in order; repeats add up */
    int32_t n_logit_bias;

    /* stopping */
    int32_t min_tokens;      /* 0: EOS ids are masked until this many tokens are generated */
    bool ignore_eos;         /* EOS does not stop generation (not banned: unlike llama.cpp) */
    int32_t n_predict;       /* -1: no limit; -2: until the context is full */
    kgen_strs stop;          /* stop strings (not part of the returned text) */

    /* log-probabilities (see sampler.h for which distribution) */
    bool logprobs;           /* report the chosen token's log-probability */
    int32_t n_probs;         /* and this many top alternatives */
    bool post_sampling_probs; /* llama-server's switch: report after the chain */

    /* constrained decoding (gen/constrain.c): GBNF that every flag and
     * request field (grammar, JSON Schema, regex, choices) compiles to;
     * NULL: none. Owned. */
    char *grammar;
    /* With a trigger the grammar is a tool call's (src/tools): once it is
     * complete it switches off, and on again where the trigger next appears
     * in the output (the matcher takes the text after it). grammar_lazy: it
     * starts off (llama.cpp's lazy grammars); else on (the prompt ends with
     * the trigger). Owned; NULL: the grammar is the whole output's. */
    char *grammar_trigger;
    bool grammar_lazy;
    bool grammar_once; /* with a trigger: the output ends where the grammar completes (forced calls) */

    /* reasoning budget (with think_close set): once the thinking block has
     * taken reasoning_budget tokens, the next ones are forced to spell
     * think_close. The block opens where think_open appears in the output,
     * or at the start with think_in_prompt; only the first block counts.
     * Owned; NULL: no budget. */
    char *think_open, *think_close;
    bool think_in_prompt;
    int32_t reasoning_budget;
} kgen_params;

/* Fills p with the defaults. On error p is left freeable. */
kiln_status kgen_params_init(kgen_params *p);
void kgen_params_free(kgen_params *p);
/* Deep copy; dst is overwritten (not freed first). */
kiln_status kgen_params_copy(kgen_params *dst, const kgen_params *src);

/* Checks every value; the message names the field and the allowed range. */
kiln_status kgen_params_validate(const kgen_params *p);

/* The vocabulary as the generation library sees it: a size and callbacks
 * that the tokenizer provides. */
typedef const char *(*kgen_piece_fn)(void *ud, int32_t id, size_t *len);
typedef int (*kgen_tokenize_fn)(void *ud, const char *text, size_t len, int32_t *out, int cap);
struct kgr_vocab;
typedef struct {
    int32_t n_vocab;
    /* Text of one token: bytes (not NUL-terminated), special tokens rendered
     * as their text (llama.cpp's detokenize(..., special = true)); NULL or
     * *len = 0 for no text. The pointer need only live until the next call.
     * Needed by DRY's sequence breakers. */
    kgen_piece_fn piece;
    /* Optional: tokenizes text without BOS or special-token parsing, writes
     * at most cap ids, returns the count (may exceed cap) or -1. Used for
     * DRY breakers that span tokens and for logit_bias keys given as text.
     * Without it, a breaker's tail is tokenized greedily (longest piece). */
    kgen_tokenize_fn tokenize;
    void *ud;
    /* The tokens' bytes as grammar/grammar.h's trie (borrowed); needed when
     * params.grammar is set. */
    const struct kgr_vocab *grammar;
} kgen_vocab;

/* Constraint flags (--grammar, --grammar-file, --json-schema,
 * --json-schema-file, --regex) and request fields (response_format,
 * json_schema, grammar, structured_outputs, guided_json / guided_regex /
 * guided_choice / guided_grammar) to p->grammar; errors start with the
 * field's name in quotes (the server's "param"). */
kiln_status kgen_grammar_flag(kgen_params *p, int argc, char **argv, int *i, bool *consumed);
kiln_status kgen_grammar_from_json(kgen_params *p, const cJSON *body);
void kgen_grammar_print_flags(FILE *out);

/* CLI: if argv[*i] is one of our flags, applies it (and its value) to p,
 * advances *i past what it used and sets *consumed; otherwise leaves *i and
 * sets *consumed = false, so the caller tries its own flags. Values follow
 * llama.cpp: --temp < 0 becomes 0, --dry-base < 1 is ignored, --stop and
 * --dry-sequence-breaker values have \n \t \\ \" \xHH escapes processed.
 * Errors name the flag and the bad value. */
kiln_status kgen_parse_flag(kgen_params *p, int argc, char **argv, int *i, bool *consumed);
/* One line per flag, for --help. */
void kgen_print_flags(FILE *out);

/* llama.cpp's escape processing (\n \r \t \' \" \\ \xHH), in place. */
void kgen_unescape(char *s);

/* Parses a --samplers list ("penalties;dry;top_k;...", llama.cpp names and
 * aliases, separated by sep) or, with sep == 0, a --sampler-seq string of
 * letters ("edskypmxt"). */
kiln_status kgen_parse_samplers(const char *list, char sep, kgen_sampler_type *out, int32_t *n);

/* Request body (OpenAI /v1/completions, /v1/chat/completions or
 * llama-server /completion): fields present override p; absent or null
 * fields keep p's values. Accepts temperature, top_k, top_p, min_p,
 * typical_p, top_n_sigma, min_keep, xtc_probability, xtc_threshold,
 * repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty,
 * dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
 * dry_sequence_breakers, seed (-1 random), samplers (array of names or a
 * letter string), logit_bias ({"id": bias} or [[id, bias], ...], bias
 * false bans), stop (string or list), max_tokens / max_completion_tokens /
 * n_predict (that precedence, as llama-server), min_tokens, ignore_eos,
 * logprobs (bool with top_logprobs, or an int as in /v1/completions),
 * n_probs, post_sampling_probs. Other keys are ignored. vocab may be NULL;
 * with it, token ids are range-checked and text keys of logit_bias are
 * tokenized (needs vocab->tokenize). The result is validated. */
kiln_status kgen_params_from_json(kgen_params *p, const cJSON *body, const kgen_vocab *vocab);

#endif
