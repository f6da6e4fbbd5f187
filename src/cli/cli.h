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
int kiln_cmd_grammar_bench(int argc, char **argv);

/* The bundled demo model (<binary>/../../models/kiln-demo, or
 * $KILN_DEFAULT_MODEL), used when -m is not given. */
const char *kiln_default_model(void);

/* "1,17,93" or "1 17 93" into a malloc'ed array. */
kiln_status kiln_parse_ids(const char *s, int32_t **ids, int *n);
/* Strict integer / float parsing of a flag value; errors name the flag. */
kiln_status kiln_parse_int(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);

/* Prints "kiln: <msg>" to stderr, frees st, returns 1. */
int kiln_fail(kiln_status st);

#endif
