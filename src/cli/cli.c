#include "cli/cli.h"

#include "base/file.h"
#include "engine/engine.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int kiln_fail(kiln_status st) {
    fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return 1;
}

bool kiln_flag_in(const char *a, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(a, *names)) return true;
    return false;
}

kiln_status kiln_option(const char *cmd, const char *a, const char *v, const char *const *valued,
                        const char *const *flags) {
    if (kiln_flag_in(a, valued)) return v ? NULL : kiln_error(KILN_EINVAL, "%s needs a value", a);
    if (flags && kiln_flag_in(a, flags)) return NULL;
    if (a[0] != '-') return kiln_error(KILN_EINVAL, "unexpected argument \"%s\": kiln %s takes options (see kiln %s --help)", a, cmd, cmd);
    return kiln_error(KILN_EINVAL, "unknown option %s (see kiln %s --help)", a, cmd);
}

void kiln_warn_ctx(const ke_model *m, int64_t n_ctx) {
    const km_hparams *hp = ke_model_hparams(m);
    if (hp->max_pos > 0 && n_ctx > hp->max_pos)
        fprintf(stderr, "kiln: warning: the context (%lld tokens) is longer than the %lld positions the model was trained on "
                        "(config.json max_position_embeddings): past them its output degrades (lower --ctx-size)\n",
                (long long)n_ctx, (long long)hp->max_pos);
}

const char *kiln_default_model(void) {
    static char path[PATH_MAX];
    const char *env = getenv("KILN_DEFAULT_MODEL");
    if (env && *env) return env;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "models/kiln-demo";
    exe[n] = 0;
    const char *d = dirname(exe);
    /* installed (PREFIX/bin/kiln, PREFIX/share/kiln/models), copied beside
     * the binary, or in the source tree (build/kiln, build/asan/kiln) */
    static const char *const rel[] = {"/../share/kiln/models/kiln-demo", "/models/kiln-demo", "/../models/kiln-demo",
                                      "/../../models/kiln-demo"};
    char cand[PATH_MAX + 64];
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        snprintf(cand, sizeof cand, "%s%s", d, rel[i]);
        if (ku_dir_exists(cand) && realpath(cand, path)) return path;
    }
    fprintf(stderr, "kiln: the bundled demo model is neither installed beside %s/ (../share/kiln/models/kiln-demo) nor in its "
                    "source tree: give -m DIR or set KILN_DEFAULT_MODEL\n", exe);
    snprintf(path, sizeof path, "%s/../share/kiln/models/kiln-demo", d);
    return path;
}

kiln_status kiln_parse_ids(const char *s, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    size_t cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return kiln_error(KILN_ENOMEM, "out of memory");
    const char *p = s;
    /* ids separated by one comma (with optional blanks around it) or by
     * blanks: "1,,2", ",1" and "1," are errors, not a skipped id */
    bool need_id = true;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        if (*p == ',') {
            if (need_id) {
                free(v);
                *n = 0;
                return kiln_error(KILN_EINVAL, "\"%s\": an empty entry in the list of token ids (e.g. 1,17,93)", s);
            }
            need_id = true;
            p++;
            continue;
        }
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
        need_id = false;
        p = end;
    }
    if (need_id && *n > 0) {
        free(v);
        *n = 0;
        return kiln_error(KILN_EINVAL, "\"%s\": the list of token ids ends with a comma", s);
    }
    *ids = v;
    return NULL;
}

kiln_status kiln_parse_double(const char *flag, const char *v, double lo, double hi, double *out) {
    if (!v) return kiln_error(KILN_EINVAL, "%s needs a value", flag);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !(x >= lo && x <= hi))
        return kiln_error(KILN_EINVAL, "%s: \"%s\" is not a number in [%g, %g]", flag, v, lo, hi);
    *out = x;
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

double kiln_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

bool kiln_cache_type_opt(const char *a, const char *v, int *k, int *v_type, kiln_status *st) {
    bool is_k = !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctk"), is_v = !strcmp(a, "--cache-type-v") || !strcmp(a, "-ctv");
    if (!is_k && !is_v) return false;
    kg_dtype t = KG_F32;
    *st = ke_cache_type_parse(a, v, &t);
    if (!*st) *(is_k ? k : v_type) = (int)t;
    return true;
}
