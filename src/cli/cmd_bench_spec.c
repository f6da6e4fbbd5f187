/* cmd_bench_spec.c: `kiln bench --spec-ngram | --model-draft DIR | --spec-mtp`: one
 * prompt generated plainly and with speculation, alternately, in the same
 * process (after one warm-up of each, which also compiles the executables);
 * reports generation tok/s of both (median of -r runs), the speedup, how many
 * guesses were kept, and checks that both produced the same tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/textio.h"
#include "spec/spec.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int32_t *ids;
    int n, cap;
} ids_out;

static kiln_status keep(void *ud, int i, const kgen_step *st) {
    (void)i;
    ids_out *o = ud;
    if (o->n == o->cap) {
        int nc = o->cap ? o->cap * 2 : 256;
        int32_t *p = realloc(o->ids, sizeof(int32_t) * (size_t)nc);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        o->ids = p, o->cap = nc;
    }
    o->ids[o->n++] = st->token;
    return NULL;
}

typedef struct {
    ke_ctx *c;
    kgen_params gp;
    kgen_vocab v;
    int32_t eos[16];
    int n_eos;
    const int32_t *prompt;
    int n_prompt;
    /* --force-ids: the output, cycled (a logit above every other on the token due) */
    const int32_t *forced;
    int n_forced;
    int64_t vocab;
    const ids_out *cur; /* the run's tokens so far */
    float *row;         /* plain runs: the changed copy of a row */
} job;

static void force_row(void *ud, int i, float *row) {
    (void)i;
    const job *j = ud;
    float mx = row[0];
    for (int64_t v = 1; v < j->vocab; v++) mx = row[v] > mx ? row[v] : mx;
    row[j->forced[j->cur->n % j->n_forced]] = mx + 1.0f;
}

/* One generation; s NULL: plain, one token per step. Returns the seconds
 * spent generating (after the prompt). */
static double cpu_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* secs: wall seconds, cpu: CPU seconds of the process (all its threads) */
static kiln_status gen_once(job *j, kspec *s, ids_out *o, kspec_stats *stats, double *secs, double *cpu) {
    o->n = 0;
    kgen_session *g = NULL;
    kspec_seq *q = NULL;
    int seq = -1, nr;
    const float *lg;
    kiln_status st = kgen_session_create(&j->gp, &j->v, (int32_t)ke_ctx_n_ctx(j->c), j->eos, j->n_eos, j->prompt, j->n_prompt, &g);
    if (!st) st = ke_seq_open(j->c, &seq);
    int *seqs = calloc((size_t)j->n_prompt, sizeof(int));
    if (!st && !seqs) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; !st && i < j->n_prompt; i++) seqs[i] = seq;
    if (!st) st = ke_decode(j->c, &(ke_batch){j->n_prompt, j->prompt, seqs, NULL}, &lg, &nr);
    free(seqs);
    j->cur = o;
    double t0 = kiln_now_s(), c0 = cpu_now_s();
    kgen_finish f = KGEN_CONTINUE;
    if (!st && s) {
        st = kspec_seq_create(s, seq, j->prompt, j->n_prompt, &q);
        if (!st) st = kspec_generate(s, q, g, lg, keep, o, &f);
        if (q) kspec_seq_stats(q, stats);
    } else if (!st) {
        f = kgen_session_start(g);
        while (!st && f == KGEN_CONTINUE) {
            kgen_step x;
            if (j->forced) memcpy(j->row, lg, sizeof(float) * (size_t)j->vocab), force_row(j, 0, j->row), lg = j->row;
            st = kgen_session_step(g, lg, &x);
            if (!st) st = keep(o, 0, &x), f = x.finish;
            if (!st && f == KGEN_CONTINUE && ke_seq_len(j->c, seq) >= ke_ctx_n_ctx(j->c)) break;
            if (!st && f == KGEN_CONTINUE) st = ke_decode(j->c, &(ke_batch){1, &x.token, &seq, NULL}, &lg, &nr);
        }
    }
    *secs = kiln_now_s() - t0;
    *cpu = cpu_now_s() - c0;
    kspec_seq_destroy(q);
    if (seq >= 0) ke_seq_close(j->c, seq);
    kgen_session_destroy(g);
    return st;
}

static const char *no_text(void *ud, int32_t id, size_t *len) {
    (void)ud, (void)id;
    *len = 0;
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int kiln_bench_spec(int argc, char **argv) {
    const char *dir = NULL, *file = NULL, *text = NULL;
    int64_t N = 128, T = 0, reps = 3, n_ctx = 0;
    bool json = false;
    kspec_params sp;
    kspec_params_init(&sp);
    job j = {0};
    int32_t *prompt = NULL, *forced = NULL; /* --prompt-ids, else the text's; --force-ids */
    size_t n_prompt = 0;
    kiln_status st = kgen_params_init(&j.gp);
    j.gp.temperature = 0.0f; /* greedy unless --temp says otherwise */
    for (int i = 1; i < argc && !st;) {
        bool used;
        st = kspec_parse_flag(&sp, argc, argv, &i, &used);
        if (st || used) continue;
        st = kgen_parse_flag(&j.gp, argc, argv, &i, &used);
        if (st || used) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = true, i++;
            continue;
        }
        if (!v) {
            st = kiln_error(KILN_EINVAL, "%s needs a value", a);
            break;
        }
        i += 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--prompt")) text = v;
        else if (!strcmp(a, "--force-ids")) {
            free(forced);
            st = kiln_parse_ids(v, &forced, &j.n_forced);
        }
        else if (!strcmp(a, "--prompt-ids")) {
            free(prompt);
            int n = 0;
            st = kiln_parse_ids(v, &prompt, &n);
            n_prompt = (size_t)n;
        }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &T);
        else if (!strcmp(a, "-r")) st = kiln_parse_int(a, v, 1, 64, &reps);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) st = kiln_parse_int(a, v, 0, 1 << 30, &n_ctx);
        else if (strcmp(a, "-n")) st = kiln_error(KILN_EINVAL, "unknown option %s with --spec-ngram / --model-draft / --spec-mtp (see kiln bench --help)", a);
    }
    /* -n is also a sampling flag (n_predict): take it from there */
    if (!st && j.gp.n_predict > 0) N = j.gp.n_predict;
    j.gp.n_predict = (int32_t)N;
    j.gp.ignore_eos = true; /* every run generates N tokens */
    if (j.gp.seed == KGEN_SEED_RANDOM) j.gp.seed = 1; /* both runs draw the same */
    if (!st && !!file + !!text + !!prompt != 1)
        st = kiln_error(KILN_EINVAL, "kiln bench with speculation: give the prompt as one of -f FILE, --prompt TEXT, --prompt-ids IDS");
    if (!st) st = kgen_params_validate(&j.gp);
    if (!st && forced && j.gp.temperature > 0) st = kiln_error(KILN_EINVAL, "--force-ids: greedy only (leave out --temp)");
    if (!dir) dir = kiln_default_model();
    ke_model *m = NULL, *draft = NULL;
    ktok *tok = NULL;
    ke_ctx *c = NULL;
    kspec *s = NULL;
    ke_text_vocab tv = {0};
    char *buf = NULL;
    size_t len = 0;
    ids_out o[2] = {0};
    if (!st) st = ke_model_load(dir, &m);
    if (!st && !prompt) st = ktok_load(dir, &tok);
    if (!st && file) st = ku_read_file(file, &buf, &len);
    if (!st && text && !(buf = strdup(text))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && text) len = strlen(text);
    if (!st && !prompt) st = ktok_encode(tok, buf, len, true, &prompt, &n_prompt);
    if (!st && n_prompt == 0) st = kiln_error(KILN_EINVAL, "the prompt is empty after tokenization");
    if (!st) st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = n_ctx, .n_threads = (int)T}, &c);
    if (!st && (int64_t)n_prompt + N > ke_ctx_n_ctx(c))
        st = kiln_error(KILN_ELIMIT, "%zu prompt tokens + %lld generated exceed the context size %lld (shorten the prompt or -n, or raise -c)",
                        n_prompt, (long long)N, (long long)ke_ctx_n_ctx(c));
    if (!st && sp.draft) st = kspec_load_draft(sp.draft, m, dir, &draft);
    if (!st) st = kspec_create(&sp, c, draft, &s);
    for (int k = 0; !st && forced && k < j.n_forced; k++)
        if (forced[k] < 0 || forced[k] >= ke_model_hparams(m)->vocab)
            st = kiln_error(KILN_EINVAL, "--force-ids: id %d is not in the vocabulary (%lld tokens)", forced[k],
                            (long long)ke_model_hparams(m)->vocab);
    if (!st && forced) {
        j.forced = forced, j.vocab = ke_model_hparams(m)->vocab;
        if (!(j.row = malloc(sizeof(float) * (size_t)j.vocab))) st = kiln_error(KILN_ENOMEM, "out of memory");
        else kspec_set_logits_fn(s, force_row, &j);
    }
    if (!st) st = kc_eos_ids(ke_model_checkpoint(m), j.eos, 16, &j.n_eos);
    if (!st) {
        j.v = (kgen_vocab){(int32_t)ke_model_hparams(m)->vocab, no_text, NULL, NULL, NULL};
        if (tok) ke_text_vocab_init(&tv, tok, (int32_t)ke_model_hparams(m)->vocab), j.v = ke_text_vocab_get(&tv);
        j.c = c, j.prompt = prompt, j.n_prompt = (int)n_prompt;
    }
    /* tok/s plain, speculative, their ratio per pair; CPU seconds plain, speculative, their ratio */
    double *ts[6];
    for (int k = 0; k < 6; k++) ts[k] = calloc((size_t)reps, sizeof(double));
    kspec_stats stats = {0};
    bool same = true;
    for (int r = -1; !st && r < reps; r++) /* r = -1: the warm-up */
        for (int x = 0; !st && x < 2; x++) {
            int k = r & 1 ? 1 - x : x; /* odd runs speculate first: neither always runs second */
            double secs, cpu;
            st = gen_once(&j, k ? s : NULL, &o[k], &stats, &secs, &cpu);
            if (r >= 0 && ts[k]) ts[k][r] = (double)o[k].n / secs;
            if (r >= 0 && ts[3 + k]) ts[3 + k][r] = cpu;
            if (!st && x) same = same && o[0].n == o[1].n && !memcmp(o[0].ids, o[1].ids, sizeof(int32_t) * (size_t)o[0].n);
        }
    if (!st && (!ts[0] || !ts[1] || !ts[2] || !ts[3] || !ts[4] || !ts[5])) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && !same) st = kiln_error(KILN_EINTERNAL, "speculative decoding changed the output (a bug: please report it)");
    if (!st) {
        /* each run's ratio to the plain run beside it: robust to load that changes between runs */
        /* and the plain run's CPU time over the speculative one's: less sensitive to other processes still */
        for (int r = 0; r < reps; r++) ts[2][r] = ts[1][r] / ts[0][r], ts[5][r] = ts[3][r] / ts[4][r];
        for (int k = 0; k < 6; k++) qsort(ts[k], (size_t)reps, sizeof(double), cmp_double);
        double plain = ts[0][reps / 2], spec = ts[1][reps / 2], pair = ts[2][reps / 2], cpair = ts[5][reps / 2];
        double acc = stats.drafted ? (double)stats.accepted / (double)stats.drafted : 0;
        char how[32]; /* the proposers in the order they are tried */
        snprintf(how, sizeof how, "%s%s%s%s%s", sp.ngram ? "ngram" : "", sp.ngram && draft ? "+" : "", draft ? "draft" : "",
                 sp.mtp && (sp.ngram || draft) ? "+" : "", sp.mtp ? "mtp" : "");
        if (json)
            printf("{\"model\": \"%s\", \"proposer\": \"%s\", \"prompt_tokens\": %zu, \"tokens\": %d, \"threads\": %d, "
                   "\"plain_tps\": %.3f, \"spec_tps\": %.3f, \"speedup\": %.4f, \"draft_n\": %lld, \"draft_n_accepted\": %lld, "
                   "\"acceptance\": %.4f, \"target_steps\": %lld, \"speedup_pairs\": [%.4f, %.4f, %.4f], \"cpu_speedup_pairs\": [%.4f, %.4f, %.4f], "
                   "\"identical\": true}\n",
                   dir, how, n_prompt, o[1].n, ke_ctx_n_threads(c), plain, spec, plain > 0 ? spec / plain : 0,
                   (long long)stats.drafted, (long long)stats.accepted, acc, (long long)stats.rounds, ts[2][0], pair,
                   ts[2][reps - 1], ts[5][0], cpair, ts[5][reps - 1]);
        else
            printf("model      %s, %zu prompt tokens, %d generated, %d threads\n"
                   "plain      %10.2f tok/s  [%.2f, %.2f]\n"
                   "%-10s %10.2f tok/s  [%.2f, %.2f]  %.2fx plain\n"
                   "pairs      %10.3fx         [%.3f, %.3f]  median of the %d runs' ratios to the plain run beside them\n"
                   "cpu pairs  %10.3fx         [%.3f, %.3f]  the same with CPU seconds (plain / speculative)\n"
                   "guesses    %lld, kept %lld (%.1f%%), %lld target steps for %d tokens; output identical\n",
                   dir, n_prompt, o[1].n, ke_ctx_n_threads(c), plain, ts[0][0], ts[0][reps - 1], how, spec, ts[1][0],
                   ts[1][reps - 1], plain > 0 ? spec / plain : 0, pair, ts[2][0], ts[2][reps - 1], (int)reps, cpair, ts[5][0],
                   ts[5][reps - 1],
                   (long long)stats.drafted, (long long)stats.accepted,
                   100 * acc, (long long)stats.rounds, o[1].n);
    }
    for (int k = 0; k < 6; k++) free(ts[k]);
    free(o[0].ids), free(o[1].ids), free(prompt), free(forced), free(j.row), free(buf);
    ke_text_vocab_free(&tv);
    kspec_destroy(s);
    ke_ctx_free(c);
    ke_model_free(draft);
    ktok_free(tok);
    ke_model_free(m);
    kgen_params_free(&j.gp);
    return st ? kiln_fail(st) : 0;
}
