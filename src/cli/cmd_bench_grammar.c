/* cmd_bench_grammar.c: `kiln bench --json-schema SCHEMA | --json-schema-file
 * FILE | --grammar-file FILE`: decode throughput with and without the
 * constraint, alternately in the same process (after one warm-up of each,
 * which also compiles the executables), at batch 1 and at --batch B.
 *
 * Each run decodes N steps of one token per sequence and picks each next
 * token by argmax over the logits; the constrained run first computes the
 * sequence's mask (kgr_matcher_mask, on the decode thread), takes the argmax
 * over the allowed tokens and advances the matcher, starting a fresh one when
 * the grammar is done or EOS is chosen. The difference between the two is the
 * cost of the masks per step. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    ke_ctx *c;
    int64_t vocab;
    kgr_index *ix; /* NULL: unconstrained */
    const kgr_vocab *gv;
} gjob;

static int32_t argmax(const float *lg, int64_t n, const uint32_t *bits) {
    int32_t best = -1;
    float bv = -FLT_MAX;
    for (int64_t i = 0; i < n; i++)
        if ((!bits || ((bits[i >> 5] >> (i & 31)) & 1)) && (best < 0 || lg[i] > bv)) best = (int32_t)i, bv = lg[i];
    return best;
}

/* B sequences, N steps; *secs the time of the steps */
static kiln_status run_once(gjob *j, int B, int N, bool constrained, double *secs) {
    int *seqs = calloc((size_t)B, sizeof(int));
    int32_t *tok = calloc((size_t)B, sizeof(int32_t));
    kgr_matcher **m = calloc((size_t)B, sizeof *m);
    int32_t nv = kgr_vocab_size(j->gv);
    uint32_t *bits = malloc(((size_t)nv + 31) / 32 * 4);
    kiln_status st = seqs && tok && m && bits ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    int opened = 0;
    for (; !st && opened < B; opened++) st = ke_seq_open(j->c, &seqs[opened]);
    if (st) opened--;
    for (int i = 0; !st && i < B; i++) {
        tok[i] = (int32_t)((1000003u * (unsigned)(i + 1)) % (unsigned)nv);
        if (constrained) st = kgr_matcher_create(j->ix, &m[i]);
    }
    double t0 = kiln_now_s();
    for (int s = 0; !st && s < N; s++) {
        const float *lg;
        int rows;
        st = ke_decode(j->c, &(ke_batch){B, tok, seqs, NULL}, &lg, &rows);
        for (int i = 0; !st && i < B; i++) {
            const float *row = lg + (size_t)i * (size_t)j->vocab;
            if (!constrained) {
                tok[i] = argmax(row, nv < j->vocab ? nv : j->vocab, NULL);
                continue;
            }
            st = kgr_matcher_mask(m[i], bits);
            int32_t t = st ? -1 : argmax(row, nv < j->vocab ? nv : j->vocab, bits);
            if (!st && t < 0) st = kiln_error(KILN_EINTERNAL, "grammar: the mask allows no token");
            if (!st) st = kgr_matcher_accept(m[i], t);
            if (!st && kgr_matcher_done(m[i])) { /* a fresh value */
                kgr_matcher_free(m[i]);
                m[i] = NULL;
                st = kgr_matcher_create(j->ix, &m[i]);
            }
            tok[i] = t;
        }
    }
    *secs = kiln_now_s() - t0;
    for (int i = 0; i < opened; i++) ke_seq_close(j->c, seqs[i]);
    for (int i = 0; m && i < B; i++) kgr_matcher_free(m[i]);
    free(seqs), free(tok), free(m), free(bits);
    return st;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int kiln_bench_grammar(int argc, char **argv) {
    const char *dir = NULL, *schema = NULL, *schema_file = NULL, *gbnf_file = NULL;
    int64_t N = 128, T = 0, B = 8, reps = 5;
    bool json = false;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        if (!v) {
            st = kiln_error(KILN_EINVAL, "%s needs a value", a);
            break;
        }
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "--json-schema")) schema = v;
        else if (!strcmp(a, "--json-schema-file")) schema_file = v;
        else if (!strcmp(a, "--grammar-file")) gbnf_file = v;
        else if (!strcmp(a, "-n")) st = kiln_parse_int(a, v, 1, 1 << 20, &N);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &T);
        else if (!strcmp(a, "--batch")) st = kiln_parse_int(a, v, 0, 4096, &B);
        else if (!strcmp(a, "-r")) st = kiln_parse_int(a, v, 1, 64, &reps);
        else st = kiln_error(KILN_EINVAL, "unknown option %s with a constraint (see kiln bench --help)", a);
    }
    if (!st && !!schema + !!schema_file + !!gbnf_file != 1)
        st = kiln_error(KILN_EINVAL, "kiln bench: give one of --json-schema, --json-schema-file, --grammar-file");
    if (!dir) dir = kiln_default_model();
    char *text = NULL;
    size_t len = 0;
    ke_model *mdl = NULL;
    ke_ctx *c = NULL;
    ktok *tok = NULL;
    kgr_vocab *gv = NULL;
    kgr_grammar *g = NULL;
    kgr_index *ix = NULL;
    int32_t eos[16];
    int n_eos = 0;
    if (!st && (schema_file || gbnf_file)) st = ku_read_file(schema_file ? schema_file : gbnf_file, &text, &len);
    if (!st && schema && !(text = strdup(schema))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && schema) len = strlen(text);
    if (!st) st = gbnf_file ? kgr_from_gbnf(text, len, &g) : kgr_from_json_schema(text, len, NULL, &g);
    if (!st) st = ke_model_load(dir, &mdl);
    if (!st) st = ktok_load(dir, &tok);
    if (!st) st = kc_eos_ids(ke_model_checkpoint(mdl), eos, 16, &n_eos);
    int64_t vocab = mdl ? ke_model_hparams(mdl)->vocab : 0;
    if (!st) st = kgr_vocab_create(tok, (int32_t)vocab, eos, n_eos, &gv);
    if (!st) st = kgr_index_create(g, gv, &ix);
    int bmax = B > 1 ? (int)B : 1;
    if (!st) st = ke_ctx_create(mdl, &(ke_ctx_params){.n_ctx = N + 16, .n_cache = (N + 16) * bmax, .n_threads = (int)T}, &c);
    double *ts = calloc((size_t)reps * 4, sizeof(double));
    if (!st && !ts) st = kiln_error(KILN_ENOMEM, "out of memory");
    gjob j = {c, vocab, ix, gv};
    int batches[2] = {1, bmax};
    double med[4] = {0};
    for (int b = 0; !st && b < (bmax > 1 ? 2 : 1); b++) {
        for (int r = -1; !st && r < reps; r++) /* r = -1: the warm-up */
            for (int k = 0; !st && k < 2; k++) {
                double secs;
                st = run_once(&j, batches[b], (int)N, k == 1, &secs);
                if (!st && r >= 0) ts[(b * 2 + k) * reps + r] = (double)batches[b] * (double)N / secs;
            }
        for (int k = 0; !st && k < 2; k++) {
            double *v = ts + (b * 2 + k) * reps;
            qsort(v, (size_t)reps, sizeof(double), cmp_d);
            med[b * 2 + k] = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
        }
    }
    if (!st) {
        if (json) {
            printf("{\"model\": \"%s\", \"threads\": %d, \"tokens\": %lld, \"tg_tps\": %.3f, \"tg_constrained_tps\": %.3f, "
                   "\"tg_ratio\": %.4f",
                   dir, ke_ctx_n_threads(c), (long long)N, med[0], med[1], med[0] > 0 ? med[1] / med[0] : 0);
            if (bmax > 1)
                printf(", \"batch_size\": %d, \"batch_tps\": %.3f, \"batch_constrained_tps\": %.3f, \"batch_ratio\": %.4f", bmax,
                       med[2], med[3], med[2] > 0 ? med[3] / med[2] : 0);
            printf("}\n");
        } else {
            printf("model      %s, %d threads, %lld steps, argmax, median of %lld alternated runs\n", dir, ke_ctx_n_threads(c),
                   (long long)N, (long long)reps);
            printf("batch 1    %10.2f tok/s plain  %10.2f tok/s constrained  (%.1f%%)\n", med[0], med[1],
                   med[0] > 0 ? 100 * med[1] / med[0] : 0);
            if (bmax > 1)
                printf("batch %-4d %10.2f tok/s plain  %10.2f tok/s constrained  (%.1f%%)\n", bmax, med[2], med[3],
                       med[2] > 0 ? 100 * med[3] / med[2] : 0);
        }
    }
    free(ts);
    free(text);
    ke_ctx_free(c);
    kgr_index_free(ix);
    kgr_grammar_free(g);
    kgr_vocab_free(gv);
    ktok_free(tok);
    ke_model_free(mdl);
    return st ? kiln_fail(st) : 0;
}
