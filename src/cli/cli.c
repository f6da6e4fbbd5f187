#include "cli/cli.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kiln_fail(kiln_status st) {
    fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return 1;
}

const char *kiln_default_model(void) {
    static char path[PATH_MAX];
    const char *env = getenv("KILN_DEFAULT_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "models/kiln-demo";
    exe[n] = 0;
    /* build/kiln -> <repo>/models/kiln-demo */
    char *d = dirname(exe);
    snprintf(path, sizeof path, "%s/../models/kiln-demo", d);
    return path;
}

kiln_status kiln_parse_ids(const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return kiln_error(KILN_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\t')) {
            free(v);
            return kiln_error(KILN_EINVAL, "\"%s\" is not a list of token ids (e.g. 1,17,93)", s);
        }
        if ((size_t)*n == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return kiln_error(KILN_ENOMEM, "out of memory");
            }
            v = nv;
        }
        v[(*n)++] = (int32_t)x;
        p = end;
    }
    *ids = v;
    return NULL;
}

kiln_status kiln_parse_int(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!v) return kiln_error(KILN_EINVAL, "%s needs a value", flag);
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return kiln_error(KILN_EINVAL, "%s: \"%s\" is not an integer in [%lld, %lld]", flag, v, (long long)lo, (long long)hi);
    *out = x;
    return NULL;
}
