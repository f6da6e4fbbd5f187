/* constrain_test.c: constrained generation with each next mask prefetched
 * (computed on the grammar index's worker while the forward pass runs, as
 * kgen_session does after every token) gives the tokens of the synchronous
 * path bit for bit: greedy and seeded, alone and in a batch beside
 * unconstrained and other constrained requests (the scheduler).
 *
 * The model is the llama oracle fixture (vocab 512, random weights) with the
 * byte-level BPE tokenizer cut to its 512 ids (tests/data/server/tok512). */
#include <stdlib.h>
#include <string.h>

#include "batch/sched.h"
#include "engine/engine.h"
#include "engine/textio.h"
#include "gen/gen_int.h"
#include "gen/params.h"
#include "gen/session.h"
#include "grammar/grammar.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"

#define MAX_GEN 64

typedef struct {
    int32_t ids[MAX_GEN];
    int n;
    kgen_finish finish;
    bool ended;
    kiln_status err;
} result;

typedef struct {
    ke_model *m;
    ktok *tok;
    kgr_vocab *gv;
    int32_t eos[16];
    int n_eos;
    int64_t vocab;
} fixture;

static bool fixture_open(fixture *f) {
    memset(f, 0, sizeof *f);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/oracle/llama", kt_root());
    kiln_status st = ke_model_load(dir, &f->m);
    snprintf(dir, sizeof dir, "%s/tests/data/server/tok512", kt_root());
    if (!st) st = ktok_load(dir, &f->tok);
    if (!st) st = kc_eos_ids(ke_model_checkpoint(f->m), f->eos, 16, &f->n_eos);
    if (!st) f->vocab = ke_model_hparams(f->m)->vocab;
    if (!st) st = kgr_vocab_create(f->tok, (int32_t)f->vocab, f->eos, f->n_eos, &f->gv);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    return true;
}

static void fixture_close(fixture *f) {
    kgr_vocab_free(f->gv);
    ktok_free(f->tok);
    ke_model_free(f->m);
}

/* The sequence alone in its own context, one token per decode; sync: each
 * mask computed when the step asks for it (no prefetch). */
static kiln_status run_alone(const fixture *f, const int32_t *prompt, int n_prompt, const kgen_params *gp, bool sync,
                             result *r) {
    memset(r, 0, sizeof *r);
    ke_ctx *c;
    KILN_TRY(ke_ctx_create(f->m, &(ke_ctx_params){.n_ctx = 128, .n_threads = 1}, &c));
    ke_text_vocab tv;
    ke_text_vocab_init(&tv, f->tok, (int32_t)f->vocab);
    kgen_vocab v = ke_text_vocab_get(&tv);
    v.grammar = f->gv;
    kgen_session *g = NULL;
    kiln_status st = kgen_session_create(gp, &v, (int32_t)ke_ctx_n_ctx(c), f->eos, f->n_eos, prompt, n_prompt, &g);
    if (!st) kgen_session_sync_masks(g, sync);
    int seq = 0;
    if (!st) st = ke_seq_open(c, &seq);
    int seqs[128];
    for (int i = 0; i < 128; i++) seqs[i] = seq;
    /* the prompt, then each token drawn, one decode each */
    const int32_t *feed = prompt;
    int n_feed = n_prompt;
    int32_t last = -1;
    r->finish = g ? kgen_session_start(g) : KGEN_CONTINUE;
    while (!st && r->finish == KGEN_CONTINUE) {
        const float *lg;
        int nr;
        kgen_step s;
        st = ke_decode(c, &(ke_batch){n_feed, feed, seqs, NULL}, &lg, &nr);
        if (!st) st = kgen_session_step(g, lg, &s);
        if (st) break;
        last = s.token, feed = &last, n_feed = 1;
        if (r->n < MAX_GEN) r->ids[r->n] = last;
        r->n++;
        r->finish = s.finish;
    }
    r->ended = true;
    kgen_session_destroy(g);
    ke_text_vocab_free(&tv);
    ke_ctx_free(c);
    return st;
}

static bool same(const result *a, const result *b) {
    size_t n = (size_t)(a->n < MAX_GEN ? a->n : MAX_GEN);
    return a->n == b->n && a->finish == b->finish && !memcmp(a->ids, b->ids, sizeof(int32_t) * n);
}

typedef struct {
    const char *what;
    const char *schema, *regex; /* one constraint, or neither */
    float temperature;          /* 0: greedy */
    uint32_t seed;
    int n_predict;
} job_spec;

static const job_spec k_jobs[] = {
    {"schema, greedy",
     "{\"type\":\"object\",\"properties\":{\"k\":{\"enum\":[\"x\",\"yy\",\"zzz\"]},\"n\":{\"type\":\"integer\",\"minimum\":-5,"
     "\"maximum\":9999},\"s\":{\"type\":\"string\",\"pattern\":\"^[a-f]{2,6}$\"}},\"required\":[\"k\",\"n\",\"s\"],"
     "\"additionalProperties\":false}",
     NULL, 0, 0, 48},
    {"unconstrained, seeded", NULL, NULL, 1.0f, 3, 30},
    {"json_object, seeded", "{\"type\":\"object\"}", NULL, 1.0f, 7, 48},
    {"regex, seeded", NULL, "[a-z ]+(, [a-z]+)*\\.", 0.9f, 11, 40},
    {"unconstrained, greedy", NULL, NULL, 0, 0, 25},
    {"short regex, seeded", NULL, "(yes|no|maybe)( [0-9])?", 1.0f, 5, 20},
    {"short regex, greedy", NULL, "[0-9]{1,3}(\\.[0-9])?", 0, 0, 20},
    {"array schema, seeded",
     "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"ok\":{\"type\":"
     "\"boolean\"}},\"required\":[\"id\",\"ok\"]},\"maxItems\":3}",
     NULL, 1.0f, 1234, 56},
};
enum { N_JOBS = sizeof k_jobs / sizeof *k_jobs };

static bool job_params(const job_spec *j, kgen_params *p) {
    kiln_status st = kgen_params_init(p);
    if (!st) {
        p->n_predict = j->n_predict;
        p->temperature = j->temperature;
        p->seed = j->seed;
        const char *flag = j->schema ? "--json-schema" : "--regex";
        char *argv[] = {(char *)flag, (char *)(j->schema ? j->schema : j->regex)};
        int i = 0;
        bool used;
        if (j->schema || j->regex) st = kgen_grammar_flag(p, 2, argv, &i, &used);
    }
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s: %s", j->what, kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    return true;
}

static int32_t k_prompt[] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 58, 32};

/* Alone: prefetched and synchronous masks give the same tokens. */
KT_TEST(constrain_prefetch_alone_equals_sync) {
    fixture f;
    if (!fixture_open(&f)) return;
    int n_prompt = (int)(sizeof k_prompt / sizeof *k_prompt), grammar_ends = 0, tokens = 0;
    for (int k = 0; k < N_JOBS; k++) {
        if (!k_jobs[k].schema && !k_jobs[k].regex) continue;
        kgen_params p;
        if (!job_params(&k_jobs[k], &p)) break;
        result want, got;
        KT_CHECK_OK(run_alone(&f, k_prompt, n_prompt, &p, true, &want));
        KT_CHECK_OK(run_alone(&f, k_prompt, n_prompt, &p, false, &got));
        KT_CHECKF(same(&got, &want), "%s: prefetched masks gave other tokens (%d vs %d)", k_jobs[k].what, got.n, want.n);
        grammar_ends += want.finish == KGEN_FINISH_GRAMMAR || want.finish == KGEN_FINISH_EOS;
        tokens += want.n;
        kgen_params_free(&p);
    }
    KT_CHECKF(tokens >= 60, "only %d constrained tokens", tokens);
    KT_CHECKF(grammar_ends >= 1, "no constrained run ended where its grammar did");
    fixture_close(&f);
}

static void on_event(const ksch_event *e) {
    result *r = e->ud;
    switch (e->kind) {
    case KSCH_TOKEN:
        r->ids[r->n < MAX_GEN ? r->n : MAX_GEN - 1] = r->n < MAX_GEN ? e->token : r->ids[MAX_GEN - 1];
        r->n++;
        break;
    case KSCH_END:
        r->ended = true;
        r->finish = e->finish;
        r->err = e->error ? kiln_error(kiln_status_code(e->error), "%s", kiln_status_msg(e->error)) : NULL;
        break;
    default:
        break;
    }
}

/* Batched: each request (constrained ones prefetching their masks in the
 * scheduler, beside unconstrained ones) gives the tokens of its
 * single-sequence run with synchronous masks; with room for all at once,
 * and with two running at a time (requests join and leave mid-batch). */
KT_TEST(constrain_prefetch_batched_equals_alone_sync) {
    fixture f;
    if (!fixture_open(&f)) return;
    int n_prompt = (int)(sizeof k_prompt / sizeof *k_prompt);
    kgen_params p[N_JOBS];
    result want[N_JOBS], got[N_JOBS];
    int np = 0;
    for (; np < N_JOBS; np++)
        if (!job_params(&k_jobs[np], &p[np])) break;
    for (int k = 0; k < np; k++) KT_CHECK_OK(run_alone(&f, k_prompt + k % 3, n_prompt - k % 3, &p[k], true, &want[k]));
    static const int running[] = {N_JOBS, 2};
    for (int r = 0; np == N_JOBS && r < 2; r++) {
        ke_ctx *c = NULL;
        ksch *s = NULL;
        KT_CHECK_OK(ke_ctx_create(f.m, &(ke_ctx_params){.n_ctx = 128, .n_cache = 1024, .n_threads = 1, .block_size = 4}, &c));
        KT_CHECK_OK(ksch_create(c, &(ksch_params){.max_running = running[r], .step_tokens = 32, .tok = f.tok, .eos_ids = f.eos,
                                                  .n_eos = f.n_eos},
                                &s));
        memset(got, 0, sizeof got);
        for (int k = 0; k < N_JOBS; k++) {
            uint64_t id;
            KT_CHECK_OK(ksch_submit(s, &(ksch_request){k_prompt + k % 3, n_prompt - k % 3, &p[k], 0, on_event, &got[k], NULL, false, false},
                                    &id));
        }
        for (int steps = 0; ksch_step(s) && steps < 10000; steps++) {}
        for (int k = 0; k < N_JOBS; k++) {
            KT_CHECKF(!got[k].err, "%s: %s", k_jobs[k].what, got[k].err ? kiln_status_msg(got[k].err) : "");
            kiln_status_free(got[k].err);
            KT_CHECKF(got[k].ended && same(&got[k], &want[k]), "%s, %d running: batched tokens differ from alone (%d vs %d)",
                      k_jobs[k].what, running[r], got[k].n, want[k].n);
        }
        ksch_destroy(s);
        ke_ctx_free(c);
    }
    for (int k = 0; k < np; k++) kgen_params_free(&p[k]);
    fixture_close(&f);
}
