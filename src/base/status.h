/* status.h: errors as values.
 *
 * A kiln_status is NULL on success, or an owned error carrying a code and a
 * message. Messages name the file, tensor or field at fault, e.g.
 *   "model.safetensors: layers.3.q_proj.weight: shape [4096,4095], want [4096,4096]".
 * Callers add context on the way up with kiln_status_wrap(), so the final
 * message reads outermost-first. Never exit() or abort() on bad input:
 * KILN_ASSERT is for programming bugs only.
 */
#ifndef KILN_STATUS_H
#define KILN_STATUS_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef enum {
    KILN_OK = 0,
    KILN_EINVAL,      /* malformed input: bad file, bad request, bad flag */
    KILN_EIO,         /* the OS refused: open, read, mmap */
    KILN_ENOMEM,      /* out of memory */
    KILN_ENOTFOUND,   /* a named thing does not exist */
    KILN_EUNSUPPORTED,/* well-formed but not supported (yet) */
    KILN_ELIMIT,      /* a limit was reached: context length, cache blocks */
    KILN_EINTERNAL,   /* a bug in kiln */
} kiln_code;

typedef struct kiln_err *kiln_status;

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define KILN_NODISCARD __attribute__((warn_unused_result))
#else
#define KILN_PRINTF(a, b)
#define KILN_NODISCARD
#endif

KILN_NODISCARD kiln_status kiln_error(kiln_code code, const char *fmt, ...) KILN_PRINTF(2, 3);
/* Prefixes "ctx: " to the message of st (consumed); returns NULL if st is NULL. */
KILN_NODISCARD kiln_status kiln_status_wrap(kiln_status st, const char *fmt, ...) KILN_PRINTF(2, 3);
kiln_code kiln_status_code(kiln_status st);
const char *kiln_status_msg(kiln_status st); /* "ok" for NULL; borrowed */
void kiln_status_free(kiln_status st);

#define KILN_TRY(expr)                                                         \
    do {                                                                       \
        kiln_status kiln_try_st_ = (expr);                                     \
        if (kiln_try_st_) return kiln_try_st_;                                 \
    } while (0)

#define KILN_TRYF(expr, ...)                                                   \
    do {                                                                       \
        kiln_status kiln_try_st_ = (expr);                                     \
        if (kiln_try_st_) return kiln_status_wrap(kiln_try_st_, __VA_ARGS__); \
    } while (0)

/* Bugs only: prints and aborts. Bad input must return a status instead. */
#define KILN_ASSERT(cond)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "kiln: internal error: %s:%d: %s\n", __FILE__,   \
                    __LINE__, #cond);                                          \
            abort();                                                           \
        }                                                                      \
    } while (0)

#endif
