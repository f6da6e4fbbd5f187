/* kt.h: kiln's minimal test harness.
 *
 * Tests live beside the code they test (src/foo/bar_test.c) and register
 * themselves; build/kiln-tests runs them all, or those whose name contains
 * the first argument. A failed check ends the test; the run continues. */
#ifndef KILN_KT_H
#define KILN_KT_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/status.h"

typedef void (*kt_fn)(void);
void kt_register(const char *name, const char *file, kt_fn fn);
void kt_fail(const char *file, int line, const char *fmt, ...) KILN_PRINTF(3, 4);
/* Marks the current test skipped (e.g. ../shared absent); the caller returns. */
void kt_skip(const char *fmt, ...) KILN_PRINTF(1, 2);
/* Repository root (for committed fixtures) and the shared folder beside it. */
const char *kt_root(void);
const char *kt_shared(void); /* NULL when ../shared does not exist */
/* True in the sanitizer build (make asan), where long numeric checks that
 * exercise no code the others do not may skip themselves. */
static inline bool kt_sanitized(void) {
#if defined(__SANITIZE_ADDRESS__)
    return true;
#else
    return false;
#endif
}
/* Writes "root/rel" into buf and returns buf. */
const char *kt_path(char *buf, size_t cap, const char *rel);
/* Feeds every file of the folder root/rel (a fuzz corpus) to a libFuzzer
 * entry point, each in a buffer of its exact size (ASan sees any over-read).
 * Returns the number of files; 0 when the folder is absent. */
int kt_replay(const char *rel, int (*fn)(const uint8_t *, size_t));

#define KT_TEST(name)                                                          \
    static void name(void);                                                    \
    __attribute__((constructor)) static void kt_reg_##name(void) {             \
        kt_register(#name, __FILE__, name);                                    \
    }                                                                          \
    static void name(void)

#define KT_CHECK(cond)                                                         \
    do {                                                                       \
        if (!(cond)) {                                                         \
            kt_fail(__FILE__, __LINE__, "check failed: %s", #cond);            \
            return;                                                            \
        }                                                                      \
    } while (0)

#define KT_CHECKF(cond, ...)                                                   \
    do {                                                                       \
        if (!(cond)) {                                                         \
            kt_fail(__FILE__, __LINE__, __VA_ARGS__);                          \
            return;                                                            \
        }                                                                      \
    } while (0)

#define KT_CHECK_EQ(a, b)                                                      \
    do {                                                                       \
        long long kt_a_ = (long long)(a), kt_b_ = (long long)(b);              \
        if (kt_a_ != kt_b_) {                                                  \
            kt_fail(__FILE__, __LINE__, "%s == %s: %lld != %lld", #a, #b,      \
                    kt_a_, kt_b_);                                             \
            return;                                                            \
        }                                                                      \
    } while (0)

#define KT_CHECK_NEAR(a, b, tol)                                               \
    do {                                                                       \
        double kt_a_ = (double)(a), kt_b_ = (double)(b);                       \
        if (!(fabs(kt_a_ - kt_b_) <= (tol))) {                                 \
            kt_fail(__FILE__, __LINE__, "%s ~ %s: %.9g vs %.9g (tol %g)", #a,  \
                    #b, kt_a_, kt_b_, (double)(tol));                          \
            return;                                                            \
        }                                                                      \
    } while (0)

#define KT_CHECK_STR(a, b)                                                     \
    do {                                                                       \
        const char *kt_a_ = (a), *kt_b_ = (b);                                 \
        if (!kt_a_ || !kt_b_ || strcmp(kt_a_, kt_b_) != 0) {                   \
            kt_fail(__FILE__, __LINE__, "%s == %s: \"%s\" != \"%s\"", #a, #b,  \
                    kt_a_ ? kt_a_ : "(null)", kt_b_ ? kt_b_ : "(null)");       \
            return;                                                            \
        }                                                                      \
    } while (0)

/* Expects success; prints the error message otherwise. */
#define KT_CHECK_OK(expr)                                                      \
    do {                                                                       \
        kiln_status kt_st_ = (expr);                                           \
        if (kt_st_) {                                                          \
            kt_fail(__FILE__, __LINE__, "%s: %s", #expr,                       \
                    kiln_status_msg(kt_st_));                                  \
            kiln_status_free(kt_st_);                                          \
            return;                                                            \
        }                                                                      \
    } while (0)

/* Expects an error whose message contains substr (NULL: any message). */
#define KT_CHECK_ERR(expr, substr)                                             \
    do {                                                                       \
        kiln_status kt_st_ = (expr);                                           \
        const char *kt_sub_ = (substr);                                        \
        if (!kt_st_) {                                                         \
            kt_fail(__FILE__, __LINE__, "%s: expected an error", #expr);       \
            return;                                                            \
        }                                                                      \
        if (kt_sub_ && !strstr(kiln_status_msg(kt_st_), kt_sub_)) {            \
            kt_fail(__FILE__, __LINE__, "%s: error \"%s\" lacks \"%s\"",       \
                    #expr, kiln_status_msg(kt_st_), kt_sub_);                  \
            kiln_status_free(kt_st_);                                          \
            return;                                                            \
        }                                                                      \
        kiln_status_free(kt_st_);                                              \
    } while (0)

#endif
