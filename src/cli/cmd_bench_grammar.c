/* cmd_bench_grammar.c: `kiln bench --json-schema SCHEMA | --json-schema-file
 * FILE | --grammar-file FILE`: decode throughput with and without the
 * constraint, alternately in the same process (after one warm-up of each,
 * which also compiles the executables), at batch 1 and at --batch B.
 *
 * Each run decodes N steps of one token per sequence and picks each next
 * token by argmax over the logits. A constrained run gives each sequence
 * its own index, made fresh for the run (as a request's session does), so
 * every state's first mask is computed as it would be for a new request;
 * per step it takes the sequence's mask, the argmax over the allowed
 * tokens, advances the matcher (a fresh one when the grammar is done or EOS
 * is chosen) and prefetches the next mask, which the index's worker
 * computes while the forward pass runs (kgr_matcher_prefetch, as
 * kgen_session does). --sync adds a third run, alternated with the two,
 * that computes each mask on the decode thread when it is needed. The
 * decode thread's time in the grammar per step is reported too (mask wait,
 * masked argmax, accept, prefetch): the cost of the masks without the
 * noise of the forward pass. */
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
    const kgr_grammar *g;
    const kgr_vocab *gv;
} gjob;

enum { PLAIN, PREFETCH, SYNC };

/* the argmax of lg[0, n) over the ids bits allows (NULL: all); ties: the
 * lowest id. A mask's clear words are skipped, so it costs what it allows. */
static int32_t argmax(const float *lg, int64_t n, const uint32_t *bits) {
    int32_t best = -1;
    float bv = -FLT_MAX;
    if (!bits) {
        for (int64_t i = 0; i < n; i++)
            if (best < 0 || lg[i] > bv) best = (int32_t)i, bv = lg[i];
        return best;
    }
    for (int64_t k = 0; k * 32 < n; k++)
        for (uint32_t w = bits[k]; w; w &= w - 1) {
            int64_t i = k * 32 + __builtin_ctz(w);
            if (i < n && (best < 0 || lg[i] > bv)) best = (int32_t)i, bv = lg[i];
        }
    return best;
}

/* B sequences, N steps; *secs the time of the steps, *post the decode
 * thread's part of it after the forward passes, *mask the part of that in
 * kgr_matcher_mask_ref (computing a mask, or waiting for the worker's) */
static kiln_status run_once(gjob *j, int B, int N, int mode, double *secs, double *post, double *mask) {
    int *seqs = calloc((size_t)B, sizeof(int));
    int32_t *tok = calloc((size_t)B, sizeof(int32_t));
    kgr_matcher **m = calloc((size_t)B, sizeof *m);
    kgr_index **ix = calloc((size_t)B, sizeof *ix);
    int32_t nv = kgr_vocab_size(j->gv);
    kiln_status st = seqs && tok && m && ix ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
    int opened = 0;
    for (; !st && opened < B; opened++) st = ke_seq_open(j->c, &seqs[opened]);
    if (st) opened--;
    for (int i = 0; !st && i < B; i++) {
        tok[i] = (int32_t)((1000003u * (unsigned)(i + 1)) % (unsigned)nv);
        if (mode != PLAIN) st = kgr_index_create(j->g, j->gv, &ix[i]);
        if (!st && mode != PLAIN) st = kgr_matcher_create(ix[i], &m[i]);
    }
    double t0 = kiln_now_s(), tp = 0, tm = 0;
    for (int s = 0; !st && s < N; s++) {
        const float *lg;
        int rows;
        st = ke_decode(j->c, &(ke_batch){B, tok, seqs, NULL}, &lg, &rows);
        double p0 = kiln_now_s();
        for (int i = 0; !st && i < B; i++) {
            const float *row = lg + (size_t)i * (size_t)j->vocab;
            if (mode == PLAIN) {
                tok[i] = argmax(row, nv < j->vocab ? nv : j->vocab, NULL);
                continue;
            }
            const uint32_t *bits;
            double m0 = kiln_now_s();
            st = kgr_matcher_mask_ref(m[i], &bits);
            tm += kiln_now_s() - m0;
            int32_t t = st ? -1 : argmax(row, nv < j->vocab ? nv : j->vocab, bits);
            if (!st && t < 0) st = kiln_error(KILN_EINTERNAL, "grammar: the mask allows no token");
            if (!st) st = kgr_matcher_accept(m[i], t);
            if (!st && kgr_matcher_done(m[i])) { /* a fresh value */
                kgr_matcher_free(m[i]);
                m[i] = NULL;
                st = kgr_matcher_create(ix[i], &m[i]);
            }
            if (!st && mode == PREFETCH) st = kgr_matcher_prefetch(m[i]);
            tok[i] = t;
        }
        tp += kiln_now_s() - p0;
    }
    *secs = kiln_now_s() - t0;
    *post = tp, *mask = tm;
    for (int i = 0; i < opened; i++) ke_seq_close(j->c, seqs[i]);
    for (int i = 0; m && i < B; i++) kgr_matcher_free(m[i]);
    for (int i = 0; ix && i < B; i++) kgr_index_free(ix[i]);
    free(seqs), free(tok), free(m), free(ix);
    return st;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int kiln_bench_grammar(int argc, char **argv) {
    const char *dir = NULL, *schema = NULL, *schema_file = NULL, *gbnf_file = NULL;
    int64_t N = 128, T = 0, B = 8, reps = 5;
    bool json = false, sync = false;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json") || !strcmp(a, "--sync")) {
            *(a[2] == 'j' ? &json : &sync) = true;
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
    if (!st) { /* the grammar is checked against the vocabulary once, before the runs */
        kgr_index *ix;
        st = kgr_index_create(g, gv, &ix);
        kgr_index_free(ix);
    }
    int bmax = B > 1 ? (int)B : 1;
    if (!st) st = ke_ctx_create(mdl, &(ke_ctx_params){.n_ctx = N + 16, .n_cache = (N + 16) * bmax, .n_threads = (int)T}, &c);
    int nk = sync ? 3 : 2;
    /* per batch size and mode: tok/s, ms per step after the forward pass,
     * ms per step in the masks, and (not plain) the ratio to the plain run
     * of the same round */
    double *ts = calloc((size_t)reps * 2 * 3 * 4, sizeof(double));
    if (!st && !ts) st = kiln_error(KILN_ENOMEM, "out of memory");
#define AT(b, k, what) (ts + (((size_t)(b) * 3 + (size_t)(k)) * 4 + (size_t)(what)) * (size_t)reps)
    gjob j = {c, vocab, g, gv};
    int batches[2] = {1, bmax};
    double med[2][3][4] = {{{0}}};
    for (int b = 0; !st && b < (bmax > 1 ? 2 : 1); b++) {
        for (int r = -1; !st && r < reps; r++) /* r = -1: the warm-up */
            for (int k = 0; !st && k < nk; k++) {
                double secs, post, mask;
                st = run_once(&j, batches[b], (int)N, k, &secs, &post, &mask);
                if (st || r < 0) continue;
                AT(b, k, 0)[r] = (double)batches[b] * (double)N / secs;
                AT(b, k, 1)[r] = 1e3 * post / (double)N;
                AT(b, k, 2)[r] = 1e3 * mask / (double)N;
                if (k > 0) AT(b, k, 3)[r] = AT(b, k, 0)[r] / AT(b, 0, 0)[r];
            }
        for (int k = 0; !st && k < nk; k++)
            for (int w = 0; w < 4; w++) {
                double *v = AT(b, k, w);
                qsort(v, (size_t)reps, sizeof(double), cmp_d);
                med[b][k][w] = reps % 2 ? v[reps / 2] : 0.5 * (v[reps / 2 - 1] + v[reps / 2]);
            }
    }
#undef AT
    if (!st) {
        static const char *const mname[3] = {"", "constrained_", "sync_"};
        if (json) {
            printf("{\"model\": \"%s\", \"threads\": %d, \"tokens\": %lld", dir, ke_ctx_n_threads(c), (long long)N);
            for (int b = 0; b < (bmax > 1 ? 2 : 1); b++) {
                const char *pre = b ? "batch" : "tg";
                if (b) printf(", \"batch_size\": %d", bmax);
                printf(", \"%s_ratio\": %.4f", pre, med[b][0][0] > 0 ? med[b][1][0] / med[b][0][0] : 0);
                for (int k = 0; k < nk; k++) {
                    printf(", \"%s_%stps\": %.3f, \"%s_%spost_ms\": %.4f", pre, mname[k], med[b][k][0], pre, mname[k], med[b][k][1]);
                    if (k) printf(", \"%s_%smask_ms\": %.4f, \"%s_%spair_ratio\": %.4f", pre, mname[k], med[b][k][2], pre, mname[k],
                                  med[b][k][3]);
                }
            }
            printf("}\n");
        } else {
            printf("model      %s, %d threads, %lld steps, argmax, median of %lld alternated runs\n", dir, ke_ctx_n_threads(c),
                   (long long)N, (long long)reps);
            printf("           %%: each round's tok/s over its plain run's; post: the decode thread's ms per step after the\n"
                   "           forward pass; mask: the part of it computing or waiting for masks\n");
            for (int b = 0; b < (bmax > 1 ? 2 : 1); b++) {
                printf("batch %-4d %8.2f tok/s plain (post %.2f)  %8.2f constrained (%.1f%%, post %.2f, mask %.3f)", batches[b],
                       med[b][0][0], med[b][0][1], med[b][1][0], 100 * med[b][1][3], med[b][1][1], med[b][1][2]);
                if (sync)
                    printf("  %8.2f sync (%.1f%%, post %.2f, mask %.3f)", med[b][2][0], 100 * med[b][2][3], med[b][2][1], med[b][2][2]);
                printf("\n");
            }
        }
    }
    free(ts);
    free(text);
    ke_ctx_free(c);
    kgr_grammar_free(g);
    kgr_vocab_free(gv);
    ktok_free(tok);
    ke_model_free(mdl);
    return st ? kiln_fail(st) : 0;
}
