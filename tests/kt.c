/* kt.c: the test runner (see kt.h). */
#include "kt.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

#define KT_MAX 4096

typedef struct {
    const char *name, *file;
    kt_fn fn;
} kt_case;
static kt_case tests[KT_MAX];
static int n_tests;
static int cur_failed, cur_skipped;

void kt_register(const char *name, const char *file, kt_fn fn) {
    if (n_tests < KT_MAX) tests[n_tests++] = (kt_case){name, file, fn};
}

void kt_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cur_failed = 1;
}

void kt_skip(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  skipped: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    cur_skipped = 1;
}

const char *kt_root(void) {
    const char *r = getenv("KILN_ROOT");
    return r && *r ? r : ".";
}

const char *kt_shared(void) {
    static char buf[4096];
    const char *s = getenv("KILN_SHARED");
    if (s && !*s) return NULL; /* KILN_SHARED= disables the shared fixtures */
    if (!s) {
        snprintf(buf, sizeof buf, "%s/../shared", kt_root());
        s = buf;
    }
    struct stat st;
    return stat(s, &st) == 0 && S_ISDIR(st.st_mode) ? s : NULL;
}

const char *kt_path(char *buf, size_t cap, const char *rel) {
    snprintf(buf, cap, "%s/%s", kt_root(), rel);
    return buf;
}

int kt_replay(const char *rel, int (*fn)(const uint8_t *, size_t)) {
    char d[4096];
    kt_path(d, sizeof d, rel);
    DIR *dd = opendir(d);
    if (!dd) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dd))) {
        if (de->d_name[0] == '.') continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", d, de->d_name);
        FILE *f = fopen(p, "rb");
        if (!f) continue;
        uint8_t *data = NULL;
        size_t len = 0;
        if (!fseek(f, 0, SEEK_END)) {
            long l = ftell(f);
            if (l >= 0 && !fseek(f, 0, SEEK_SET) && (data = malloc((size_t)l ? (size_t)l : 1))) {
                len = fread(data, 1, (size_t)l, f);
                if (len == (size_t)l) fn(data, len), n++;
            }
        }
        free(data);
        fclose(f);
    }
    closedir(dd);
    return n;
}

static int cmp_tests(const void *a, const void *b) {
    const kt_case *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : strcmp(x->name, y->name);
}

static const char usage[] =
    "usage: kiln-tests [SUBSTRING]   (make test [T=SUBSTRING])\n"
    "  Runs the tests whose name or file contains SUBSTRING (all without it); each prints ok,\n"
    "  FAIL (with the failed check) or SKIP (with the reason it could not run).\n"
    "environment:\n"
    "  KILN_ROOT=DIR    the repository (default: the current folder), for tests/fixtures and models\n"
    "  KILN_BIN=FILE    the built kiln binary, for the tests that run it (make test sets it)\n"
    "  KILN_SHARED=DIR  the shared fixtures folder (oracle fixtures, tokenizers, chat templates,\n"
    "                   maskbench); default ../shared beside the repository; KILN_SHARED= (empty)\n"
    "                   turns it off. Tests that need it SKIP when it is absent.\n";

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return 0;
    }
    const char *filter = argc > 1 ? argv[1] : NULL;
    qsort(tests, (size_t)n_tests, sizeof tests[0], cmp_tests);
    int run = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        if (filter && !strstr(tests[i].name, filter) && !strstr(tests[i].file, filter)) continue;
        cur_failed = cur_skipped = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        run++;
        const char *verdict = cur_failed ? "FAIL" : cur_skipped ? "SKIP" : "ok";
        failed += cur_failed;
        skipped += cur_skipped && !cur_failed;
        printf("%-4s %-48s %8.1f ms  (%s)\n", verdict, tests[i].name, ms, tests[i].file);
        fflush(stdout);
    }
    printf("\n%d tests, %d failed, %d skipped\n", run, failed, skipped);
    if (skipped) {
        const char *sh = kt_shared();
        printf("shared fixtures: %s\n", sh ? sh : "not found (KILN_SHARED=DIR or ../shared; kiln-tests --help)");
    }
    return failed ? 1 : 0;
}
