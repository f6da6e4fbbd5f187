/* cmd_grammar_bench.c: `kiln grammar-bench DIR... -m TOKENIZER_DIR [--json FILE] [--cpu-time]`:
 * MaskBench files (../shared/maskbench/README.md) through the grammar engine,
 * one thread, printing the table the benchmark publishes. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "grammar/grammar.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static int cmp_s(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static const double pct[] = {25, 50, 75, 90, 95, 99, 99.9, 100};
static const char *pct_name[] = {"p25", "p50", "p75", "p90", "p95", "p99", "p99.9", "max"};

static double quantile(const double *v, size_t n, double p) {
    if (!n) return 0;
    size_t i = (size_t)((p / 100.0) * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static void json_pcts(FILE *f, const char *key, const double *v, size_t n) {
    fprintf(f, "\"%s\": {", key);
    for (int i = 0; i < 8; i++) fprintf(f, "%s\"%s\": %.1f", i ? ", " : "", pct_name[i], quantile(v, n, pct[i]));
    fprintf(f, "}");
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int kiln_cmd_grammar_bench(int argc, char **argv) {
    const char *tokdir = NULL, *json = NULL;
    char **files = NULL;
    size_t nf = 0, capf = 0;
    bool verbose = false, cpu = false;
    int repeat = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kiln grammar-bench DIR|FILE... -m TOKENIZER_DIR [--json FILE] [-v] [--cpu-time] [--repeat N] [--mask-classes] [--no-mask-groups]\n"
                   "  runs MaskBench files (schema + tests) through the grammar engine, one thread;\n"
                   "  -v prints each file's outcome; --cpu-time times with the thread's CPU clock\n"
                   "  (for a shared machine) instead of the wall clock; --repeat N runs each file N\n"
                   "  times from scratch and keeps each mask's least time (other processes' noise);\n"
                   "  --no-mask-groups walks each new state whole, not by %%perm member (the same masks)\n");
            return 0;
        }
        if ((!strcmp(a, "-m") || !strcmp(a, "--json") || !strcmp(a, "--repeat")) && i + 1 >= argc)
            return kiln_fail(kiln_error(KILN_EINVAL, "%s needs a value", a));
        if (!strcmp(a, "--repeat")) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 100) return kiln_fail(kiln_error(KILN_EINVAL, "--repeat: want 1 to 100, got '%s'", argv[i]));
            repeat = (int)n;
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--json")) {
            if (a[1] == 'm') tokdir = argv[++i];
            else json = argv[++i];
            continue;
        }
        if (!strcmp(a, "-v")) {
            verbose = true;
            continue;
        }
        if (!strcmp(a, "--cpu-time")) {
            kgr_bench_cpu_time(cpu = true);
            continue;
        }
        if (!strcmp(a, "--mask-classes")) {
            kgr_mask_classes(true);
            continue;
        }
        if (!strcmp(a, "--no-mask-groups")) {
            kgr_mask_groups(false);
            continue;
        }
        if (a[0] == '-') return kiln_fail(kiln_error(KILN_EINVAL, "grammar-bench: unknown flag %s", a));
        DIR *d = opendir(a);
        if (!d) { /* a file */
            if (nf == capf) files = realloc(files, sizeof *files * (capf = capf ? capf * 2 : 1024));
            files[nf++] = strdup(a);
            continue;
        }
        for (struct dirent *e; (e = readdir(d));) {
            size_t l = strlen(e->d_name);
            if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
            if (nf == capf) files = realloc(files, sizeof *files * (capf = capf ? capf * 2 : 1024));
            char *p = malloc(strlen(a) + l + 2);
            sprintf(p, "%s/%s", a, e->d_name);
            files[nf++] = p;
        }
        closedir(d);
    }
    if (!tokdir) return kiln_fail(kiln_error(KILN_EINVAL, "grammar-bench: -m TOKENIZER_DIR is required"));
    if (!nf) return kiln_fail(kiln_error(KILN_EINVAL, "grammar-bench: no .json files given"));
    qsort(files, nf, sizeof *files, cmp_s);
    ktok *tok;
    kiln_status st = ktok_load(tokdir, &tok);
    if (st) return kiln_fail(st);
    int32_t eos = ktok_eos_id(tok);
    kgr_vocab *v;
    st = kgr_vocab_create(tok, ktok_vocab_size(tok), &eos, eos >= 0 ? 1 : 0, &v);
    if (st) {
        ktok_free(tok);
        return kiln_fail(st);
    }
    FILE *jf = json ? fopen(json, "w") : NULL;
    if (json && !jf) fprintf(stderr, "kiln: cannot write %s\n", json);
    if (jf) fprintf(jf, "{\"files\": [\n");
    size_t counts[4] = {0}, ntbm = 0, captbm = 0;
    double *tbm = NULL, *ttfm = malloc(sizeof *ttfm * nf);
    int64_t tokens = 0;
    size_t ran = 0;
    uint64_t digest = 0; /* the files' mask digests folded in name order */
    double tbm_sum = 0;
    for (size_t i = 0; i < nf; i++) {
        char *text;
        size_t len;
        kgr_bench_result r;
        st = ku_read_file(files[i], &text, &len);
        if (!st) {
            st = kgr_bench_file(text, len, tok, v, &r);
            /* again from scratch (a new index): the same masks in the same
             * order, so each time is the least of the runs' */
            for (int k = 1; k < repeat && !st; k++) {
                kgr_bench_result r2;
                st = kgr_bench_file(text, len, tok, v, &r2);
                if (st) break;
                if (r2.n_tbm != r.n_tbm || r2.digest != r.digest) {
                    st = kiln_error(KILN_EINTERNAL, "a second run computed other masks");
                } else {
                    for (int64_t q = 0; q < r.n_tbm; q++)
                        if (r2.tbm_us[q] < r.tbm_us[q]) r.tbm_us[q] = r2.tbm_us[q];
                    if (r2.ttfm_us < r.ttfm_us) r.ttfm_us = r2.ttfm_us;
                }
                kgr_bench_result_free(&r2);
            }
            if (st) kgr_bench_result_free(&r);
            free(text);
        }
        if (st) {
            fprintf(stderr, "kiln: %s: %s\n", files[i], kiln_status_msg(st));
            kiln_status_free(st);
            continue;
        }
        counts[r.outcome]++;
        ttfm[ran++] = r.ttfm_us;
        tokens += r.tokens;
        if (ntbm + (size_t)r.n_tbm > captbm) {
            captbm = (ntbm + (size_t)r.n_tbm) * 2;
            tbm = realloc(tbm, sizeof *tbm * captbm);
        }
        if (r.n_tbm) memcpy(tbm + ntbm, r.tbm_us, sizeof *tbm * (size_t)r.n_tbm);
        ntbm += (size_t)r.n_tbm;
        for (int64_t k = 0; k < r.n_tbm; k++) tbm_sum += r.tbm_us[k];
        uint32_t fd[2] = {(uint32_t)r.digest, (uint32_t)(r.digest >> 32)};
        digest = kgr_mask_digest(digest, fd, 2);
        const char *base = strrchr(files[i], '/') ? strrchr(files[i], '/') + 1 : files[i];
        if (verbose) printf("%-20s %s %s\n", kgr_outcome_name(r.outcome), base, r.error);
        if (jf) {
            fprintf(jf, "%s  {\"file\": ", ran > 1 ? ",\n" : "");
            json_str(jf, base);
            fprintf(jf, ", \"outcome\": \"%s\", \"tests\": %d, \"ttfm_us\": %.1f, \"masks\": %lld, \"digest\": \"%016llx\", "
                        "\"error\": ",
                    kgr_outcome_name(r.outcome), r.tests, r.ttfm_us, (long long)r.n_tbm, (unsigned long long)r.digest);
            json_str(jf, r.error);
            fprintf(jf, "}");
        }
        kgr_bench_result_free(&r);
    }
    qsort(tbm, ntbm, sizeof *tbm, cmp_d);
    qsort(ttfm, ran, sizeof *ttfm, cmp_d);
    printf("| | kiln |\n|---|---|\n");
    printf("| schemas | %zu |\n", ran);
    printf("| passing schemas | %zu (%.1f%%) |\n", counts[KGR_PASS], ran ? 100.0 * (double)counts[KGR_PASS] / (double)ran : 0);
    printf("| compile errors | %zu |\n| validation errors | %zu |\n| invalidation errors | %zu |\n", counts[KGR_COMPILE_ERROR],
           counts[KGR_VALIDATION_ERROR], counts[KGR_INVALIDATION_ERROR]);
    printf("| TBM (us)");
    for (int i = 0; i < 8; i++) printf(" %s %.0f", pct_name[i], quantile(tbm, ntbm, pct[i]));
    printf(" |\n| TTFM (us)");
    for (int i = 0; i < 8; i++) printf(" %s %.0f", pct_name[i], quantile(ttfm, ran, pct[i]));
    size_t masks = ntbm + ran - counts[KGR_COMPILE_ERROR]; /* the first masks are in TTFM */
    double mean = ntbm ? tbm_sum / (double)ntbm : 0;
    printf(" |\n| TBM mean (us) | %.1f |\n| tokens | %lld |\n| masks | %zu |\n", mean, (long long)tokens, masks);
    printf("| mask digest | %016llx |\n| clock | %s%s |\n", (unsigned long long)digest,
           cpu ? "thread CPU time" : "wall time", repeat > 1 ? ", least of --repeat runs" : "");
    if (jf) {
        fprintf(jf, "\n], \"schemas\": %zu, \"passing\": %zu, \"compile_errors\": %zu, \"validation_errors\": %zu, "
                    "\"invalidation_errors\": %zu, \"tokens\": %lld, ",
                ran, counts[0], counts[1], counts[2], counts[3], (long long)tokens);
        fprintf(jf, "\"masks\": %zu, \"digest\": \"%016llx\", \"clock\": \"%s\", \"repeat\": %d, \"tbm_mean_us\": %.2f, ",
                masks, (unsigned long long)digest, cpu ? "cpu" : "wall", repeat, mean);
        json_pcts(jf, "tbm_us", tbm, ntbm);
        fprintf(jf, ", ");
        json_pcts(jf, "ttfm_us", ttfm, ran);
        fprintf(jf, "}\n");
        fclose(jf);
    }
    for (size_t i = 0; i < nf; i++) free(files[i]);
    free(files);
    free(tbm);
    free(ttfm);
    kgr_vocab_free(v);
    ktok_free(tok);
    return counts[KGR_INVALIDATION_ERROR] ? 2 : 0;
}
