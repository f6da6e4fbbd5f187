/* kt_run.h: run the built kiln binary ($KILN_BIN, set by make test) as a
 * user would, with standard input from a string and its standard output and
 * error captured. */
#ifndef KILN_KT_RUN_H
#define KILN_KT_RUN_H

#include "kt.h"

typedef struct {
    int status;        /* exit status; -1 when it did not exit normally */
    char *out, *err;   /* NUL-terminated, malloc'ed (kt_run_free) */
} kt_proc;

/* The binary, or NULL when KILN_BIN is not set (the caller skips). */
const char *kt_kiln_bin(void);
/* In a test: skips it (and returns) when KILN_BIN is not set. */
#define KT_NEED_KILN_BIN()                                                                                             \
    do {                                                                                                               \
        if (!kt_kiln_bin()) {                                                                                          \
            kt_skip("KILN_BIN is not set (make test sets it)");                                                        \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

/* Runs "$KILN_BIN args" through /bin/sh (args is shell text) with input on
 * standard input (NULL: /dev/null). Returns 0, or -1 when it could not run. */
int kt_run_kiln(const char *args, const char *input, kt_proc *p);
/* The same with another binary (a copy of kiln elsewhere). */
int kt_run_bin(const char *bin, const char *args, const char *input, kt_proc *p);
void kt_run_free(kt_proc *p);

#endif
