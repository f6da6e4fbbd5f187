/* cli.h: shared pieces of the kiln command line (subcommands in cmd_*.c). */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

/* Subcommands: argv[0] is the subcommand name. Return the exit status. */
int kiln_cmd_generate(int argc, char **argv);
int kiln_cmd_validate(int argc, char **argv);
int kiln_cmd_info(int argc, char **argv);
int kiln_cmd_export(int argc, char **argv);
int kiln_cmd_serve(int argc, char **argv);
int kiln_cmd_bench_batch(int argc, char **argv);
int kiln_cmd_quantize(int argc, char **argv);
int kiln_cmd_perplexity(int argc, char **argv);
int kiln_cmd_synth(int argc, char **argv);
int kiln_cmd_bench(int argc, char **argv);
/* kiln bench with --spec-ngram / --model-draft (cmd_bench_spec.c) */
int kiln_bench_spec(int argc, char **argv);
/* kiln bench --embed: embeddings per second (cmd_bench_embed.c). */
int kiln_bench_embed(int argc, char **argv);
/* kiln bench --multi-turn: time to first token of a chat's second turn, cold and cached (cmd_bench_turns.c). */
int kiln_bench_multi_turn(int argc, char **argv);
/* kiln bench --json-schema / --json-schema-file / --grammar-file (cmd_bench_grammar.c) */
int kiln_bench_grammar(int argc, char **argv);
int kiln_cmd_grammar_bench(int argc, char **argv);
int kiln_cmd_chat(int argc, char **argv);
int kiln_cmd_embed(int argc, char **argv);
int kiln_cmd_rerank(int argc, char **argv);

/* The bundled demo model, used when -m is not given: $KILN_DEFAULT_MODEL,
 * else the first folder that exists of <bin>/../share/kiln/models/kiln-demo
 * (make install), <bin>/models/kiln-demo (copied beside the binary),
 * <bin>/../models/kiln-demo and <bin>/../../models/kiln-demo (the source
 * tree's build/kiln and build/asan/kiln), where <bin> is the binary's
 * folder; when none exists it says so on stderr. */
const char *kiln_default_model(void);

/* "1,17,93" or "1 17 93" into a malloc'ed array. */
kiln_status kiln_parse_ids(const char *s, int32_t **ids, int *n);
/* Strict integer / float parsing of a flag value; errors name the flag. */
kiln_status kiln_parse_int(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);
kiln_status kiln_parse_double(const char *flag, const char *v, double lo, double hi, double *out);

/* A command's option a with the following argument v (NULL at the end):
 * an error when a is not an option of the command (valued: the options that
 * take a value, flags: those that take none; NULL-terminated) or when it
 * takes a value and v is NULL. cmd names the command for the message. */
kiln_status kiln_option(const char *cmd, const char *a, const char *v, const char *const *valued,
                        const char *const *flags);
/* The KV cache type options of every command that creates a context
 * (llama.cpp's spelling): list KILN_CACHE_TYPE_OPTS among the valued
 * options and print KILN_CACHE_TYPE_HELP. kiln_cache_type_opt: whether a is
 * one of them; if so its value v goes to *k or *v_type (ke_cache_type_parse,
 * kg_dtype values) and *st gets the error, if any. */
#define KILN_CACHE_TYPE_OPTS "--cache-type-k", "-ctk", "--cache-type-v", "-ctv"
#define KILN_CACHE_TYPE_HELP                                                                                  \
    "  -ctk, --cache-type-k T  KV cache type of the keys: f32 (default, exact), f16, bf16, q8_0 (docs/performance.md)\n" \
    "  -ctv, --cache-type-v T  KV cache type of the values: f32 (default), f16, bf16, q8_0\n"
bool kiln_cache_type_opt(const char *a, const char *v, int *k, int *v_type, kiln_status *st);

/* Whether a is one of the NULL-terminated names. */
bool kiln_flag_in(const char *a, const char *const *names);

/* Warns on stderr when n_ctx exceeds the positions the model was trained
 * on (max_position_embeddings): it runs, but past them output degrades. */
struct ke_model;
void kiln_warn_ctx(const struct ke_model *m, int64_t n_ctx);

/* Prints "kiln: <msg>" to stderr, frees st, returns 1. */
int kiln_fail(kiln_status st);
/* Seconds on the monotonic clock (for timing runs). */
double kiln_now_s(void);

#endif
