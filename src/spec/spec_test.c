/* spec_test.c: speculative decoding gives exactly the tokens of plain
 * decoding, greedy and seeded (penalties, DRY), with prompt lookup, the model
 * as its own draft and another fixture as draft, on dense, MoE, SSM and
 * hybrid fixtures, one sequence and two in the same steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_test.h"
#include "engine/fixture_test.h"
#include "kt.h"
#include "spec/mtp_test.h"
#include "spec/spec.h"

enum { NP = 24, NGEN = 40, MAXGEN = 64 };

static const char *piece(void *ud, int32_t id, size_t *len) {
    static char buf[16];
    (void)ud;
    *len = (size_t)snprintf(buf, sizeof buf, "t%d ", id);
    return buf;
}

/* A prompt that repeats itself, so prompt lookup finds guesses. */
static void make_prompt(int32_t *p, int salt) {
    for (int i = 0; i < NP; i++) p[i] = (int32_t)(((i % 8) * 37 + 11 + salt * 5) % 500) + 3;
}

static kiln_status make_params(kgen_params *p, bool seeded) {
    KILN_TRY(kgen_params_init(p));
    p->n_predict = NGEN;
    p->ignore_eos = true;
    if (seeded) {
        p->temperature = 1.0f;
        p->top_k = 0;
        p->top_p = 1.0f;
        p->min_p = 0.0f;
        p->repeat_penalty = 1.2f;
        p->dry_multiplier = 0.8f;
        p->seed = 1234;
    } else {
        p->temperature = 0.0f;
    }
    return NULL;
}

typedef struct {
    int32_t ids[2][MAXGEN];
    int n[2];
} out_ids;

static kiln_status keep(void *ud, int i, const kgen_step *st) {
    out_ids *o = ud;
    if (o->n[i] < MAXGEN) o->ids[i][o->n[i]++] = st->token;
    return NULL;
}

static kiln_status session(const kgen_params *p, const int32_t *prompt, kgen_session **g) {
    kgen_vocab v = {512, piece, NULL, NULL, NULL};
    const int32_t eos[1] = {2};
    return kgen_session_create(p, &v, 256, eos, 1, prompt, NP, g);
}

/* Plain decoding, one token per step. */
static kiln_status plain(ke_model *m, bool seeded, const int32_t *prompt, out_ids *o, int slot) {
    kgen_params p;
    KILN_TRY(make_params(&p, seeded));
    ke_ctx *c = NULL;
    kgen_session *g = NULL;
    kiln_status st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 256, .n_threads = 2}, &c);
    int seq = 0, seqs[NP] = {0}, nr;
    const float *lg;
    if (!st) st = session(&p, prompt, &g);
    if (!st) st = ke_seq_open(c, &seq);
    if (!st) st = ke_decode(c, &(ke_batch){NP, prompt, seqs, NULL}, &lg, &nr);
    for (kgen_finish f = KGEN_CONTINUE; !st && f == KGEN_CONTINUE;) {
        kgen_step s;
        st = kgen_session_step(g, lg, &s);
        if (!st) st = keep(o, slot, &s), f = s.finish;
        if (!st && f == KGEN_CONTINUE) st = ke_decode(c, &(ke_batch){1, &s.token, &seq, NULL}, &lg, &nr);
    }
    kgen_session_destroy(g);
    ke_ctx_free(c);
    kgen_params_free(&p);
    return st;
}

/* Plain decoding of both prompts (salts 0, 1). */
static kiln_status plain_both(ke_model *m, bool seeded, out_ids *o) {
    for (int i = 0; i < 2; i++) {
        int32_t prompt[NP];
        make_prompt(prompt, i);
        KILN_TRY(plain(m, seeded, prompt, o, i));
    }
    return NULL;
}

/* When set, the target's step times speculative() runs with (kspec_set_cost_fn). */
static kspec_cost_fn test_cost;

/* With speculation: n_seq sequences (prompts with salts 0, 1) in the same steps. */
static kiln_status speculative(ke_model *m, ke_model *draft, const kspec_params *sp, bool seeded, int n_seq,
                               out_ids *o, kspec_stats *stats) {
    kgen_params p;
    KILN_TRY(make_params(&p, seeded));
    ke_ctx *c = NULL;
    kspec *s = NULL;
    kgen_session *g[2] = {0};
    kspec_seq *q[2] = {0};
    int32_t prompt[2][NP], pending[2];
    kgen_finish fin[2] = {KGEN_CONTINUE, KGEN_CONTINUE};
    kiln_status st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 256, .n_threads = 2}, &c);
    if (!st) st = kspec_create(sp, c, draft, &s);
    if (!st && test_cost) kspec_set_cost_fn(s, test_cost, NULL);
    for (int i = 0; !st && i < n_seq; i++) {
        make_prompt(prompt[i], i);
        int seq = 0, seqs[NP];
        const float *lg;
        int nr;
        st = session(&p, prompt[i], &g[i]);
        if (!st) st = ke_seq_open(c, &seq);
        for (int j = 0; j < NP; j++) seqs[j] = seq;
        if (!st) st = kspec_seq_create(s, seq, prompt[i], NP, &q[i]);
        if (!st) st = ke_decode(c, &(ke_batch){NP, prompt[i], seqs, NULL}, &lg, &nr);
        kgen_step first;
        if (!st) st = kgen_session_step(g[i], lg, &first);
        if (!st) st = keep(o, i, &first), pending[i] = first.token, fin[i] = first.finish;
    }
    while (!st && (fin[0] == KGEN_CONTINUE || (n_seq > 1 && fin[1] == KGEN_CONTINUE))) {
        /* the round takes the sequences still going, in order */
        int idx[2], k = 0;
        kspec_seq *rq[2];
        kgen_session *rg[2];
        int32_t rp[2];
        kgen_finish rf[2];
        for (int i = 0; i < n_seq; i++)
            if (fin[i] == KGEN_CONTINUE) idx[k] = i, rq[k] = q[i], rg[k] = g[i], rp[k] = pending[i], rf[k++] = fin[i];
        out_ids tmp = {0};
        st = kspec_round(s, k, rq, rg, rp, rf, keep, &tmp);
        for (int j = 0; !st && j < k; j++) {
            int i = idx[j];
            for (int t = 0; t < tmp.n[j] && o->n[i] < MAXGEN; t++) o->ids[i][o->n[i]++] = tmp.ids[j][t];
            pending[i] = rp[j], fin[i] = rf[j];
        }
    }
    *stats = (kspec_stats){0};
    for (int i = 0; i < n_seq; i++) {
        kspec_stats one = {0};
        if (q[i]) kspec_seq_stats(q[i], &one);
        stats->rounds += one.rounds, stats->drafted += one.drafted, stats->accepted += one.accepted;
        kspec_seq_destroy(q[i]);
        kgen_session_destroy(g[i]);
    }
    kspec_destroy(s);
    ke_ctx_free(c);
    kgen_params_free(&p);
    return st;
}

static void check_family(const char *fixture, const char *other) {
    ke_model *m = ke_test_load_fixture(fixture), *d2 = other ? ke_test_load_fixture(other) : NULL;
    if (!m || (other && !d2)) goto out;
    for (int seeded = 0; seeded < 2; seeded++) {
        out_ids ref = {0};
        KT_CHECK_OK(plain_both(m, seeded, &ref));
        KT_CHECK_EQ(ref.n[0], NGEN);
        for (int mode = 0; mode < 4; mode++) { /* prompt lookup, self draft, other draft, both */
            kspec_params sp;
            kspec_params_init(&sp);
            sp.ngram = mode == 0 || mode == 3;
            sp.draft_p_min = 0.0f;
            sp.draft_max = 5;
            ke_model *draft = mode == 1 || mode == 3 ? m : mode == 2 ? d2 : NULL;
            if (mode == 2 && !d2) continue;
            for (int n_seq = 1; n_seq <= 2; n_seq++) {
                out_ids got = {0};
                kspec_stats stats;
                KT_CHECK_OK(speculative(m, draft, &sp, seeded, n_seq, &got, &stats));
                for (int i = 0; i < n_seq; i++) {
                    KT_CHECK_EQ(got.n[i], ref.n[i]);
                    KT_CHECKF(!memcmp(got.ids[i], ref.ids[i], sizeof(int32_t) * (size_t)ref.n[i]),
                              "%s: %s, proposer %d, %d sequences: sequence %d differs from plain decoding", fixture,
                              seeded ? "seeded" : "greedy", mode, n_seq, i);
                }
                if (mode > 0) KT_CHECKF(stats.drafted > 0, "%s: proposer %d guessed nothing", fixture, mode);
                /* fewer steps than tokens: guesses were kept */
                if (mode == 1 && !seeded) KT_CHECKF(stats.accepted > 0 && stats.rounds < NGEN * n_seq, "%s: self draft kept %lld of %lld", fixture, (long long)stats.accepted, (long long)stats.drafted);
            }
        }
    }
out:
    ke_model_free(m);
    ke_model_free(d2);
}

KT_TEST(spec_identical_dense) { check_family("llama", "mistral"); }
KT_TEST(spec_identical_moe) { check_family("mixtral", "qwen3_moe"); }
KT_TEST(spec_identical_ssm) { check_family("mamba2", "llama"); }
KT_TEST(spec_identical_hybrid) { check_family("qwen3_next", "mamba2"); }

/* Prompt lookup on a target whose guessed rows cost nothing (a step of T
 * rows: 1 ms + 1 us per row), so that it guesses whatever it finds: the
 * output is still plain decoding's, greedy and seeded, one sequence and two,
 * dense and hybrid (rollback by checkpoint). */
static double free_rows(void *ud, int64_t rows, double secs) {
    (void)ud, (void)secs;
    return 1e-3 + 1e-6 * (double)rows;
}

static void check_ngram_free_rows(const char *fixture) {
    ke_model *m = ke_test_load_fixture(fixture);
    if (!m) return;
    for (int seeded = 0; seeded < 2; seeded++) {
        out_ids ref = {0};
        KT_CHECK_OK(plain_both(m, seeded, &ref));
        kspec_params sp;
        kspec_params_init(&sp);
        sp.ngram = true;
        for (int n_seq = 1; n_seq <= 2; n_seq++) {
            out_ids got = {0};
            kspec_stats stats;
            test_cost = free_rows;
            KT_CHECK_OK(speculative(m, NULL, &sp, seeded, n_seq, &got, &stats));
            test_cost = NULL;
            for (int i = 0; i < n_seq; i++)
                KT_CHECKF(got.n[i] == ref.n[i] && !memcmp(got.ids[i], ref.ids[i], sizeof(int32_t) * (size_t)ref.n[i]),
                          "%s: %s, %d sequences: sequence %d differs from plain decoding", fixture, seeded ? "seeded" : "greedy", n_seq, i);
            /* (seeded, the penalties and DRY keep the random model from repeating a token: nothing to look up) */
            if (!seeded) KT_CHECKF(stats.drafted > 0, "%s: %d sequences: free rows, prompt lookup guessed nothing", fixture, n_seq);
        }
    }
    ke_model_free(m);
}

KT_TEST(spec_identical_ngram_free_rows) {
    check_ngram_free_rows("llama");
    check_ngram_free_rows("qwen3_next");
}

/* Prompt lookup's choice (kspec_seq_guess / kspec_seq_settle, the steps'
 * times given with kspec_note_step): rounds of a sequence whose tokens
 * either continue the prompt's loop (every guess kept) or are random (none
 * kept). *rows: the rows guessed; *last: the last round's guess count. */
static void lookup_rounds(ke_ctx *c, double row_ms, bool copy, int rounds, int64_t *rows, int32_t *last) {
    kspec_params sp;
    kspec_params_init(&sp);
    sp.ngram = true;
    kspec *s = NULL;
    kspec_seq *q = NULL;
    *rows = 0;
    *last = -1;
    KT_CHECK_OK(kspec_create(&sp, c, NULL, &s));
    for (int i = 0; s && i < 8; i++) /* steps of 1 .. 11 rows timed */
        for (int64_t T = 1; T <= 11; T++) kspec_note_step(s, T, 1e-3 * (1 + row_ms * (double)(T - 1)));
    int32_t hist[4096];
    make_prompt(hist, 0);
    int64_t n = NP;
    uint64_t rng = 11;
    if (s) KT_CHECK_OK(kspec_seq_create(s, 0, hist, NP - 1, &q));
    for (int r = 0; q && r < rounds && n + 16 < 4096; r++) {
        const int32_t *g;
        int32_t k = 0, acc = 0;
        KT_CHECK_OK(kspec_seq_guess(q, hist, n, 64, &g, &k));
        *rows += k;
        *last = k;
        /* what the target samples after the pending token: the loop goes on, or anything */
        for (int64_t j = 0; j <= k; j++)
            hist[n + j] = copy ? hist[n + j - 8] : (int32_t)(ckt_next(&rng) % 500) + 3;
        while (acc < k && g[acc] == hist[n + acc]) acc++;
        n += acc + 1;
        KT_CHECK_OK(kspec_seq_settle(q, acc));
    }
    kspec_seq_destroy(q);
    kspec_destroy(s);
}

KT_TEST(spec_ngram_guesses_what_pays) {
    ke_model *m = ke_test_load_fixture("llama");
    ke_ctx *c = NULL;
    if (m) KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 256, .n_threads = 1}, &c));
    if (!c) goto out;
    int32_t last;
    int64_t rows;
    /* rows nearly free (1% of a step), every guess kept: the whole lookahead */
    lookup_rounds(c, 0.01, true, 20, &rows, &last);
    KT_CHECK_EQ(last, 10);
    /* rows at half a step, every guess kept: still the whole lookahead (11 tokens for 6 steps' time) */
    lookup_rounds(c, 0.5, true, 20, &rows, &last);
    KT_CHECK_EQ(last, 10);
    /* rows at 40% of a step, nothing kept: (almost) never a guess; a first one at most */
    lookup_rounds(c, 0.4, false, 200, &rows, &last);
    KT_CHECKF(rows <= 2 && last == 0, "dear rows, nothing kept: %lld rows guessed in 200 rounds, the last round %d", (long long)rows, last);
    /* rows nearly free, nothing kept: guesses cost next to nothing, yet stop paying; far fewer rows than the lookahead each round */
    lookup_rounds(c, 0.01, false, 200, &rows, &last);
    KT_CHECKF(rows < 200, "free rows, nothing kept: %lld rows guessed in 200 rounds", (long long)rows);
out:
    ke_ctx_free(c);
    ke_model_free(m);
}

/* The checkpoint's MTP head (a fixture with a random MTP layer in one of
 * the layouts): one guess and chains of three, alone and after prompt
 * lookup; the acceptance printed as kiln bench reports it. It proves the
 * verified output is plain decoding's, bit for bit, whatever the head
 * guesses; its random head guesses badly, so the acceptance says nothing
 * of a trained head's (mtp_test.c checks the head's own arithmetic). */
static void check_mtp(kspec_test_layout which) {
    char dir[512];
    if (!kspec_test_mtp_model(which, dir, sizeof dir)) return;
    ke_model *m = NULL;
    KT_CHECK_OK(ke_model_load(dir, &m));
    for (int seeded = 0; m && seeded < 2; seeded++) {
        out_ids ref = {0};
        KT_CHECK_OK(plain_both(m, seeded, &ref));
        for (int mode = 0; mode < 3; mode++) { /* one guess, three, prompt lookup then three */
            kspec_params sp;
            kspec_params_init(&sp);
            sp.mtp = true;
            sp.mtp_max = mode == 0 ? 1 : 3;
            sp.ngram = mode == 2;
            for (int n_seq = 1; n_seq <= 2; n_seq++) {
                out_ids got = {0};
                kspec_stats stats;
                KT_CHECK_OK(speculative(m, NULL, &sp, seeded, n_seq, &got, &stats));
                for (int i = 0; i < n_seq; i++) {
                    KT_CHECK_EQ(got.n[i], ref.n[i]);
                    KT_CHECKF(!memcmp(got.ids[i], ref.ids[i], sizeof(int32_t) * (size_t)ref.n[i]),
                              "MTP %s: %s, mode %d, %d sequences: sequence %d differs from plain decoding",
                              kspec_test_mtp_fixture(which), seeded ? "seeded" : "greedy", mode, n_seq, i);
                }
                KT_CHECKF(stats.drafted > 0, "MTP %s mode %d guessed nothing", kspec_test_mtp_fixture(which), mode);
                if (mode < 2) KT_CHECK(stats.drafted <= stats.rounds * sp.mtp_max);
                fprintf(stderr, "  MTP %s %s mode %d, %d seq: %lld of %lld guesses kept (%.0f%%) in %lld steps\n",
                        kspec_test_mtp_fixture(which), seeded ? "seeded" : "greedy", mode, n_seq, (long long)stats.accepted,
                        (long long)stats.drafted, stats.drafted ? 100.0 * (double)stats.accepted / (double)stats.drafted : 0.0,
                        (long long)stats.rounds);
            }
        }
    }
    ke_model_free(m);
    ckt_rmdir(dir);
}

KT_TEST(spec_identical_mtp) { check_mtp(KSPEC_TEST_MIMO); }
KT_TEST(spec_identical_mtp_glm_nextn) { check_mtp(KSPEC_TEST_GLM); }
KT_TEST(spec_identical_mtp_deepseek_nextn) { check_mtp(KSPEC_TEST_DEEPSEEK); }
KT_TEST(spec_identical_mtp_qwen35) { check_mtp(KSPEC_TEST_QWEN35); }
KT_TEST(spec_identical_mtp_qwen3_next) { check_mtp(KSPEC_TEST_QWEN3_NEXT); }
KT_TEST(spec_identical_mtp_nemotron_h) { check_mtp(KSPEC_TEST_NEMOTRON_H); }
KT_TEST(spec_identical_mtp_exaone_moe) { check_mtp(KSPEC_TEST_EXAONE_MOE); }
KT_TEST(spec_identical_mtp_glm5) { check_mtp(KSPEC_TEST_GLM5); }
KT_TEST(spec_identical_mtp_glm4_lite) { check_mtp(KSPEC_TEST_GLM4_LITE); }
KT_TEST(spec_identical_mtp_qwen35_moe) { check_mtp(KSPEC_TEST_QWEN35_MOE); }
KT_TEST(spec_identical_mtp_deepseek_v4) { check_mtp(KSPEC_TEST_DEEPSEEK_V4); }

/* The head's cache kept across rounds (rows cut back to the kept tokens,
 * hidden states fed in pieces) gives the guesses a fresh sequence given the
 * whole history at once gives, bit for bit. */
static void check_mtp_cache(kspec_test_layout which) {
    char dir[512];
    if (!kspec_test_mtp_model(which, dir, sizeof dir)) return;
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    kspec *s = NULL;
    kspec_seq *q = NULL;
    KT_CHECK_OK(ke_model_load(dir, &m));
    if (m) KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 256, .n_threads = 1}, &c));
    kspec_params sp;
    kspec_params_init(&sp);
    sp.mtp = true;
    sp.mtp_max = 3;
    if (c) KT_CHECK_OK(kspec_create(&sp, c, NULL, &s));
    int32_t hist[128];
    make_prompt(hist, 0);
    if (s) KT_CHECK_OK(kspec_seq_create(s, 0, hist, NP, &q));
    uint64_t rng = 7;
    int64_t n = NP, rounds = 0;
    while (q && n < 100) {
        int64_t add = 1 + (int64_t)(ckt_next(&rng) % 4); /* the pending token and what was kept of the guesses */
        for (int64_t i = 0; i < add; i++) hist[n + i] = (int32_t)(ckt_next(&rng) % 500) + 3;
        n += add;
        const int32_t *g;
        int32_t k, want[3];
        KT_CHECK_OK(kspec_seq_guess(q, hist, n, 3, &g, &k));
        if (k != 3) break;
        memcpy(want, g, sizeof want);
        KT_CHECK_OK(kspec_seq_settle(q, (int32_t)(add - 1 < 3 ? add - 1 : 3)));
        kspec_seq *f = NULL; /* a fresh sequence with the whole history */
        KT_CHECK_OK(kspec_seq_create(s, 0, hist, (int32_t)(n - 1), &f));
        if (f) KT_CHECK_OK(kspec_seq_guess(f, hist, n, 3, &g, &k));
        KT_CHECKF(f && k == 3 && !memcmp(g, want, sizeof want), "MTP %s: round %lld: guesses %d %d %d, a fresh sequence's %d %d %d",
                  kspec_test_mtp_fixture(which), (long long)rounds, want[0], want[1], want[2], f ? g[0] : -1, f ? g[1] : -1, f ? g[2] : -1);
        kspec_seq_destroy(f);
        rounds++;
    }
    KT_CHECKF(rounds >= 20, "MTP %s: %lld rounds", kspec_test_mtp_fixture(which), (long long)rounds);
    kspec_seq_destroy(q);
    kspec_destroy(s);
    ke_ctx_free(c);
    ke_model_free(m);
    ckt_rmdir(dir);
}

KT_TEST(spec_mtp_cache_kept_across_rounds) {
    check_mtp_cache(KSPEC_TEST_GLM);
    check_mtp_cache(KSPEC_TEST_QWEN3_NEXT);
    check_mtp_cache(KSPEC_TEST_NEMOTRON_H); /* two decoder layers, two caches */
    check_mtp_cache(KSPEC_TEST_DEEPSEEK_V4); /* hidden states of several streams, a sliding window */
}

KT_TEST(spec_flags) {
    kspec_params p;
    kspec_params_init(&p);
    char *argv[] = {"kiln", "--spec-ngram", "--spec-ngram-n", "4", "--draft-max", "8", "--draft-p-min", "0.5", "--draft-p-min", "2", "--spec-lookahead"};
    int i = 1;
    bool used;
    KT_CHECK_OK(kspec_parse_flag(&p, 11, argv, &i, &used));
    KT_CHECK(used && p.ngram && i == 2);
    KT_CHECK_OK(kspec_parse_flag(&p, 11, argv, &i, &used));
    KT_CHECK_EQ(p.ngram_n, 4);
    KT_CHECK_OK(kspec_parse_flag(&p, 11, argv, &i, &used));
    KT_CHECK_EQ(p.draft_max, 8);
    KT_CHECK_OK(kspec_parse_flag(&p, 11, argv, &i, &used));
    KT_CHECK(p.draft_p_min == 0.5f);
    KT_CHECK_ERR(kspec_parse_flag(&p, 11, argv, &i, &used), "not a probability");
    i = 10;
    KT_CHECK_ERR(kspec_parse_flag(&p, 11, argv, &i, &used), "needs a value");
    char *mtp[] = {"kiln", "--spec-mtp", "--spec-mtp-max", "3", "--spec-mtp-max", "17"};
    i = 1;
    KT_CHECK_OK(kspec_parse_flag(&p, 6, mtp, &i, &used));
    KT_CHECK(used && p.mtp && kspec_enabled(&p));
    KT_CHECK_OK(kspec_parse_flag(&p, 6, mtp, &i, &used));
    KT_CHECK_EQ(p.mtp_max, 3);
    KT_CHECK_ERR(kspec_parse_flag(&p, 6, mtp, &i, &used), "not an integer");
    char *other[] = {"kiln", "--temp"};
    i = 1;
    KT_CHECK_OK(kspec_parse_flag(&p, 2, other, &i, &used));
    KT_CHECK(!used && i == 1);
}

KT_TEST(spec_draft_tokenizer_checked) {
    ke_model *m = ke_test_load_fixture("llama");
    if (!m) return;
    char dir[512], tdir[4096], p[4096];
    kt_path(tdir, sizeof tdir, "tests/fixtures/oracle/llama");
    ke_model *d = NULL;
    kt_path(p, sizeof p, "tests/fixtures/oracle/mistral");
    KT_CHECK_OK(kspec_load_draft(p, m, tdir, &d)); /* same vocabulary, neither has a tokenizer */
    ke_model_free(d);
    /* the draft has a tokenizer.json the model lacks (here a broken one): refused, naming the flag */
    KT_CHECK(ckt_tmpdir(dir, sizeof dir) != NULL);
    KT_CHECK(ckt_copy(kt_path(p, sizeof p, "tests/fixtures/oracle/mistral/config.json"), dir, "config.json"));
    KT_CHECK(ckt_copy(kt_path(p, sizeof p, "tests/fixtures/oracle/mistral/model.safetensors"), dir, "model.safetensors"));
    KT_CHECK(ckt_write_str(dir, "tokenizer.json", "{}"));
    kiln_status st = kspec_load_draft(dir, m, tdir, &d);
    KT_CHECK(st != NULL && strstr(kiln_status_msg(st), "--model-draft") != NULL);
    kiln_status_free(st);
    ckt_rmdir(dir);
    ke_model_free(m);
}

/* kiln generate on the demo model (a real tokenizer): the same ids and text
 * with each proposer, greedy, seeded with penalties and DRY, with a grammar
 * and a stop string. */
static bool run_json(const char *bin, const char *args, char *out, size_t cap) {
    char cmd[8192], model[4096];
    kt_path(model, sizeof model, "models/kiln-demo");
    snprintf(cmd, sizeof cmd, "%s generate -m %s -t 2 --json %s 2>&1", bin, model, args);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    pclose(p);
    /* the timings differ: keep what comes before them */
    char *t = strstr(out, "\"timings\"");
    if (t) *t = 0;
    return n > 0;
}

KT_TEST(spec_generate_cli_identical) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) {
        kt_skip("KILN_BIN is not set (make test sets it)");
        return;
    }
    static const char *const cases[] = {
        "-p 'The meaning of life is' -n 80 --temp 0 --ignore-eos",
        "-p 'Once upon a time, once upon a time' -n 80 --temp 0.9 --seed 7 --repeat-penalty 1.1 --dry-multiplier 0.5 --ignore-eos",
        "-p 'The answer:' -n 60 --temp 0.7 --seed 3 --regex '[a-z ]{1,40}\\.'",
        "-p 'The world is' -n 80 --temp 0 --stop 'man who is a g'",
    };
    static const char *const spec[] = {"--spec-ngram", "--model-draft models/kiln-demo --draft-p-min 0",
                                       "--spec-ngram --spec-ngram-n 2 --spec-lookahead 3 --model-draft models/kiln-demo --draft-max 4"};
    static char ref[1 << 16], got[1 << 16];
    char root[4096];
    kt_path(root, sizeof root, ".");
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        KT_CHECK(run_json(bin, cases[c], ref, sizeof ref));
        KT_CHECKF(strstr(ref, "\"generated_ids\": [") != NULL, "no output: %s", ref);
        for (size_t s = 0; s < sizeof spec / sizeof *spec; s++) {
            char args[2048], sp[1024];
            snprintf(sp, sizeof sp, "%s", spec[s]);
            char *md = strstr(sp, "models/kiln-demo");
            if (md) { /* the draft's path from the repository root */
                char tail[1024];
                snprintf(tail, sizeof tail, "%s", md + strlen("models/kiln-demo"));
                snprintf(md, sizeof sp - (size_t)(md - sp), "%s/models/kiln-demo%s", root, tail);
            }
            snprintf(args, sizeof args, "%s %s", cases[c], sp);
            KT_CHECK(run_json(bin, args, got, sizeof got));
            KT_CHECKF(!strcmp(ref, got), "kiln generate %s:\n%s\nwithout speculation:\n%s", args, got, ref);
        }
    }
}

/* The committed trained draft (tools/train_demo.py --draft): the demo model's
 * output with it is the output without it, greedy and seeded. */
KT_TEST(spec_generate_cli_demo_draft) {
    const char *bin = getenv("KILN_BIN");
    char draft[4096];
    kt_path(draft, sizeof draft, "models/kiln-demo-draft");
    if (!bin || access(draft, F_OK) != 0) {
        kt_skip(!bin ? "KILN_BIN is not set (make test sets it)" : "models/kiln-demo-draft is missing");
        return;
    }
    static const char *const cases[] = {"-p 'The secret of success is' -n 80 --temp 0 --ignore-eos",
                                        "-p 'Tell me a fortune.' -n 80 --temp 0.8 --seed 5 --repeat-penalty 1.1 --ignore-eos"};
    static char ref[1 << 16], got[1 << 16];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char args[8192];
        KT_CHECK(run_json(bin, cases[c], ref, sizeof ref));
        KT_CHECKF(strstr(ref, "\"generated_ids\": [") != NULL, "no output: %s", ref);
        snprintf(args, sizeof args, "%s --model-draft %s --draft-max 6 --draft-p-min 0.3", cases[c], draft);
        KT_CHECK(run_json(bin, args, got, sizeof got));
        KT_CHECKF(!strcmp(ref, got), "kiln generate %s:\n%s\nwithout speculation:\n%s", args, got, ref);
    }
}

/* kiln info on the checkpoints with MTP layers of the 2026 families: the
 * layout --spec-mtp opens and its decoder layers. */
KT_TEST(spec_info_cli_mtp_layouts) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) {
        kt_skip("KILN_BIN is not set (make test sets it)");
        return;
    }
    static const struct {
        kspec_test_layout which;
        const char *want;
    } cases[] = {
        {KSPEC_TEST_NEMOTRON_H, "guesses tokens with --spec-mtp, layout Nemotron-H (mtp.layers.<i>.*) (2 decoder layers)"},
        {KSPEC_TEST_EXAONE_MOE, "guesses tokens with --spec-mtp, layout EXAONE-MoE (mtp.*) (1 decoder layer)"},
        {KSPEC_TEST_GLM5, "guesses tokens with --spec-mtp, layout DeepSeek-V3 / GLM nextn (model.layers.<n>.*) (1 decoder layer)"},
        {KSPEC_TEST_DEEPSEEK_V4, "guesses tokens with --spec-mtp, layout DeepSeek-V4 (mtp.<i>.*) (1 decoder layer)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[512], cmd[8192], out[8192];
        if (!kspec_test_mtp_model(cases[i].which, dir, sizeof dir)) continue;
        snprintf(cmd, sizeof cmd, "%s info -m %s 2>&1", bin, dir);
        FILE *p = popen(cmd, "r");
        KT_CHECK(p != NULL);
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        KT_CHECKF(p && pclose(p) == 0 && strstr(out, cases[i].want) != NULL, "%s: %s", kspec_test_mtp_fixture(cases[i].which), out);
        ckt_rmdir(dir);
    }
}

/* kiln generate --spec-mtp on a checkpoint with an MTP layer: the same ids,
 * greedy and seeded; a checkpoint without one is refused by name. */
KT_TEST(spec_generate_cli_mtp) {
    const char *bin = getenv("KILN_BIN");
    if (!bin) {
        kt_skip("KILN_BIN is not set (make test sets it)");
        return;
    }
    char dir[512];
    if (!kspec_test_mtp_model(KSPEC_TEST_GLM, dir, sizeof dir)) return;
    { /* kiln info names the layout */
        char cmd[8192], out[8192];
        snprintf(cmd, sizeof cmd, "%s info -m %s 2>&1", bin, dir);
        FILE *p = popen(cmd, "r");
        KT_CHECK(p != NULL);
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        if (p) pclose(p);
        KT_CHECKF(strstr(out, "guesses tokens with --spec-mtp, layout DeepSeek-V3 / GLM nextn") != NULL, "%s", out);
    }
    static const char *const cases[] = {"--temp 0", "--temp 0.8 --seed 3 --repeat-penalty 1.1"};
    static const char *const spec[] = {"", "--spec-mtp", "--spec-mtp --spec-mtp-max 3 --spec-ngram"};
    static char ref[1 << 14], got[1 << 14];
    for (size_t c = 0; c < 2; c++)
        for (size_t s = 0; s < 3; s++) {
            char cmd[8192];
            snprintf(cmd, sizeof cmd, "%s generate -m %s -t 1 --json --prompt-ids 5,6,7,8,9,10,11,12,5,6,7,8 -n 40 --ignore-eos %s %s 2>&1",
                     bin, dir, cases[c], spec[s]);
            FILE *p = popen(cmd, "r");
            KT_CHECK(p != NULL);
            if (!p) break;
            char *out = s ? got : ref;
            size_t n = fread(out, 1, sizeof ref - 1, p);
            out[n] = 0;
            pclose(p);
            char *t = strstr(out, "\"timings\"");
            if (t) *t = 0;
            KT_CHECKF(strstr(out, "\"generated_ids\": [") != NULL, "%s: %s", cmd, out);
            if (s) KT_CHECKF(!strcmp(ref, got), "%s:\n%s\nwithout speculation:\n%s", cmd, got, ref);
        }
    ckt_rmdir(dir);
    char cmd[8192], q2[4096];
    snprintf(cmd, sizeof cmd, "%s generate -m %s --prompt-ids 5,6 -n 4 --spec-mtp 2>&1", bin,
             kt_path(q2, sizeof q2, "tests/fixtures/oracle/qwen2"));
    FILE *p = popen(cmd, "r");
    KT_CHECK(p != NULL);
    if (!p) return;
    size_t n = fread(got, 1, sizeof got - 1, p);
    got[n] = 0;
    KT_CHECKF(pclose(p) != 0 && strstr(got, "--spec-mtp: the checkpoint has no multi-token prediction layers"), "%s", got);
}
