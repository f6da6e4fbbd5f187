/* cmd_tokenize.h: `kiln tokenize` and `kiln detokenize` (argv[0] is the
 * subcommand name). Both work on a folder that holds only tokenizer files.
 * They return the process exit status. */
#ifndef KILN_CMD_TOKENIZE_H
#define KILN_CMD_TOKENIZE_H

int kiln_cmd_tokenize(int argc, char **argv);
int kiln_cmd_detokenize(int argc, char **argv);

#endif
