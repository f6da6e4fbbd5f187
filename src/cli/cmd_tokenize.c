/* cmd_tokenize.c: text <-> ids from the command line.
 *
 *   kiln tokenize -m DIR [--add-special] [--json] [-p TEXT | < stdin]
 *   kiln detokenize -m DIR [--skip-special] IDS...   (ids as args and/or comma-separated) */
#include "cli/cmd_tokenize.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(kiln_status st) {
    fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return 1;
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    *len = n;
    return buf;
}

int kiln_cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    bool add_special = false, json = false, bench = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(argv[i], "--add-special")) add_special = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--bench")) bench = true; /* timings on stderr, no ids */
        else {
            fprintf(stderr, "usage: kiln tokenize -m DIR [--add-special] [--json] [-p TEXT | < stdin]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "kiln tokenize: -m DIR is required\n");
        return 2;
    }
    ktok *t;
    double t0 = now_s();
    kiln_status st = ktok_load(dir, &t);
    double t_load = now_s() - t0;
    if (st) return fail(st);
    size_t len;
    char *owned = NULL;
    if (text) {
        len = strlen(text);
    } else {
        owned = read_stdin(&len);
        if (!owned) {
            ktok_free(t);
            fprintf(stderr, "kiln tokenize: cannot read stdin\n");
            return 1;
        }
        text = owned;
    }
    int32_t *ids;
    size_t n;
    t0 = now_s();
    st = ktok_encode(t, text, len, add_special, &ids, &n);
    double t_enc = now_s() - t0;
    if (!st && bench) {
        fprintf(stderr, "load %.1f ms, encode %zu bytes -> %zu ids in %.1f ms: %.2f MB/s\n", 1e3 * t_load, len, n,
                1e3 * t_enc, (double)len / 1e6 / t_enc);
        free(owned);
        free(ids);
        ktok_free(t);
        return 0;
    }
    free(owned);
    ktok_free(t);
    if (st) return fail(st);
    fputs(json ? "{\"ids\": [" : "", stdout);
    for (size_t i = 0; i < n; i++) printf(i ? (json ? ", %d" : " %d") : "%d", ids[i]);
    fputs(json ? "]}\n" : "\n", stdout);
    free(ids);
    return 0;
}

int kiln_cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL;
    bool skip = false;
    int32_t *ids = malloc((size_t)argc * sizeof *ids + 1);
    size_t n = 0, cap = (size_t)argc;
    if (!ids) return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            dir = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--skip-special")) {
            skip = true;
            continue;
        }
        for (char *p = argv[i]; *p;) { /* "1,2, 3" and "1 2" both work */
            if (*p == ',' || *p == ' ') {
                p++;
                continue;
            }
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX) {
                fprintf(stderr, "kiln detokenize: bad id \"%s\"\n", argv[i]);
                free(ids);
                return 2;
            }
            if (n == cap) {
                int32_t *nv = realloc(ids, (cap *= 2) * sizeof *ids);
                if (!nv) {
                    free(ids);
                    return 1;
                }
                ids = nv;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: kiln detokenize -m DIR [--skip-special] IDS...\n");
        free(ids);
        return 2;
    }
    ktok *t;
    kiln_status st = ktok_load(dir, &t);
    if (st) {
        free(ids);
        return fail(st);
    }
    char *text;
    size_t len;
    st = ktok_decode(t, ids, n, skip, &text, &len);
    free(ids);
    ktok_free(t);
    if (st) return fail(st);
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    free(text);
    return 0;
}
