/* cmd_pull.h: `kiln pull`, a Hugging Face repository into the Hugging Face
 * cache, and -m ORG/NAME / -hf ORG/NAME for every command. */
#ifndef KILN_CMD_PULL_H
#define KILN_CMD_PULL_H

#include <stdbool.h>

/* argv[0] is "pull". Returns the process exit code. */
int kiln_cmd_pull(int argc, char **argv);

/* Rewrites a command's arguments in place: the value of -m/--model that is
 * no path but reads ORG/NAME[@REV] becomes its cached snapshot folder, and
 * -hf/--hf-repo ORG/NAME[@REV] pulls it (default files) and becomes -m
 * SNAPSHOT. Prints the error and returns false when one cannot be done. */
bool kiln_resolve_model_args(int argc, char **argv);

#endif
