/* The scheduler against the single-sequence path and the oracle fixtures:
 * prompts of different lengths together, chunked prefill, shared prefixes,
 * preemption forced by a small KV cache, sliding windows, cancellation. */
#include <dirent.h>
#include <pthread.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "batch/sched.h"
#include "ckpt/ckpt_test.h"
#include "engine/fixture_test.h"
#include "kt.h"
#include "models/family.h"
#include "spec/mtp_test.h"
#include "spec/spec.h"
#include "vision/vision.h"

#define MAX_GEN 96

typedef struct {
    int32_t ids[MAX_GEN];
    int n;
    bool ended, cancelled;
    kgen_finish finish;
    int32_t n_cached, n_preempted;
    kiln_status err;
} result;

static void on_event(const ksch_event *e) {
    result *r = e->ud;
    if (e->kind == KSCH_TOKEN) {
        if (r->n < MAX_GEN) r->ids[r->n] = e->token;
        r->n++;
        return;
    }
    r->ended = true;
    r->cancelled = e->cancelled;
    r->finish = e->finish;
    r->n_cached = e->n_cached;
    r->n_preempted = e->n_preempted;
    if (e->error) r->err = kiln_error(kiln_status_code(e->error), "%s", kiln_status_msg(e->error));
}

static const char *no_text(void *ud, int32_t id, size_t *len) {
    (void)ud, (void)id;
    *len = 0;
    return NULL;
}

/* The reference: the sequence alone, prefilled at once then decoded one
 * token per call, in its own context (as kiln generate runs it). */
static kiln_status run_alone(const ke_model *m, const int32_t *prompt, int n_prompt, const kgen_params *gp, const ke_inputs *x,
                             result *r) {
    memset(r, 0, sizeof *r);
    ke_ctx *c;
    KILN_TRY(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 128, .n_threads = 1}, &c));
    int32_t eos[16];
    int n_eos = 0;
    kiln_status st = kc_eos_ids(ke_model_checkpoint(m), eos, 16, &n_eos);
    kgen_session *g = NULL;
    kgen_vocab v = {(int32_t)ke_model_hparams(m)->vocab, no_text, NULL, NULL, NULL};
    if (!st) st = kgen_session_create(gp, &v, (int32_t)ke_ctx_n_ctx(c), eos, n_eos, prompt, n_prompt, &g);
    int seq = 0;
    if (!st) st = ke_seq_open(c, &seq);
    int seqs[128];
    for (int i = 0; i < 128; i++) seqs[i] = seq;
    const float *lg;
    int nr;
    if (!st) st = ke_decode_ex(c, &(ke_batch){n_prompt, prompt, seqs, NULL}, x, &lg, &nr);
    kgen_finish f = g ? kgen_session_start(g) : KGEN_CONTINUE;
    while (!st && f == KGEN_CONTINUE) {
        kgen_step s;
        st = kgen_session_step(g, lg, &s);
        if (st) break;
        if (r->n < MAX_GEN) r->ids[r->n] = s.token;
        r->n++;
        f = s.finish;
        if (f == KGEN_CONTINUE) st = ke_decode(c, &(ke_batch){1, &s.token, &seq, NULL}, &lg, &nr);
    }
    r->finish = f;
    r->ended = true;
    kgen_session_destroy(g);
    ke_ctx_free(c);
    return st;
}

static bool same(const result *a, const result *b) {
    if (a->n != b->n || a->finish != b->finish) return false;
    for (int i = 0; i < a->n && i < MAX_GEN; i++)
        if (a->ids[i] != b->ids[i]) return false;
    return true;
}

/* Steps until idle (bounded). */
static int drain(ksch *s) {
    int steps = 0;
    while (ksch_step(s) && steps < 100000) steps++;
    return steps;
}

typedef struct {
    int32_t prompt[96];
    int n_prompt;
    kgen_params gp;
    result got, want;
    uint64_t id, after;
    const ke_inputs *x; /* the prompt's per-token inputs (image requests), NULL: none */
} job;

static void job_init(job *j, const int32_t *prompt, int n, bool greedy, uint32_t seed, int n_predict) {
    memset(j, 0, sizeof *j);
    memcpy(j->prompt, prompt, sizeof(int32_t) * (size_t)n);
    j->n_prompt = n;
    kiln_status st = kgen_params_init(&j->gp);
    KILN_ASSERT(!st);
    j->gp.ignore_eos = true;
    j->gp.n_predict = n_predict;
    if (greedy) j->gp.temperature = 0;
    j->gp.seed = seed;
}

typedef struct {
    int max_running, step_tokens, block_size;
    int64_t n_cache;
    bool prefix_cache;
    int64_t window; /* out: ke_ctx_window */
    int n_seq_max;  /* recurrent state rows; 0: the engine's default */
    int64_t n_ctx;  /* 0: 128 (the cache holds at least one context) */
    const kspec_params *spec; /* speculative decoding, NULL: none */
    const ke_model *draft;
} setup;

/* Runs jobs through one scheduler (all submitted at once) and each alone;
 * fails the test on any difference. Returns the scheduler's stats. */
static bool run_jobs(const ke_model *m, setup *su, job *jobs, int n, ksch_stats *stats, const char *what) {
    ke_ctx *c;
    kiln_status st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = su->n_ctx > 0 ? su->n_ctx : 128, .n_cache = su->n_cache, .n_threads = 1, .block_size = su->block_size,
                                                        .n_seq_max = su->n_seq_max}, &c);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s: %s", what, kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    su->window = ke_ctx_window(c);
    int32_t eos[16];
    int n_eos = 0;
    kiln_status_free(kc_eos_ids(ke_model_checkpoint(m), eos, 16, &n_eos));
    ksch *s = NULL;
    kspec *sp = NULL;
    if (su->spec) st = kspec_create(su->spec, c, su->draft, &sp);
    if (!st)
        st = ksch_create(c, &(ksch_params){.max_running = su->max_running, .step_tokens = su->step_tokens,
                                           .prefix_cache = su->prefix_cache, .eos_ids = eos, .n_eos = n_eos, .spec = sp}, &s);
    bool ok = !st;
    for (int i = 0; ok && i < n; i++) {
        uint64_t after = jobs[i].after ? jobs[jobs[i].after - 1].id : 0;
        st = ksch_submit(s, &(ksch_request){jobs[i].prompt, jobs[i].n_prompt, &jobs[i].gp, after, on_event, &jobs[i].got, jobs[i].x, false, false},
                         &jobs[i].id);
        ok = !st;
    }
    if (ok) drain(s);
    if (ok) ksch_get_stats(s, stats);
    for (int i = 0; ok && i < n; i++) {
        if (!jobs[i].want.ended) st = run_alone(m, jobs[i].prompt, jobs[i].n_prompt, &jobs[i].gp, jobs[i].x, &jobs[i].want);
        if (st) ok = false;
        else if (jobs[i].got.err) ok = false, st = jobs[i].got.err, jobs[i].got.err = NULL;
        else if (!jobs[i].got.ended || !same(&jobs[i].got, &jobs[i].want)) {
            kt_fail(__FILE__, __LINE__, "%s: job %d (prompt %d tokens) differs from its single-sequence run (%d vs %d tokens)",
                    what, i, jobs[i].n_prompt, jobs[i].got.n, jobs[i].want.n);
            ok = false;
            break;
        }
    }
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s: %s", what, kiln_status_msg(st));
        kiln_status_free(st);
    }
    if (ok && stats->cache.n_used != 0) {
        kt_fail(__FILE__, __LINE__, "%s: %lld KV blocks still in use", what, (long long)stats->cache.n_used);
        ok = false;
    }
    ksch_destroy(s);
    kspec_destroy(sp);
    ke_ctx_free(c);
    return ok;
}

static void jobs_free(job *jobs, int n) {
    for (int i = 0; i < n; i++) kgen_params_free(&jobs[i].gp);
}

static int32_t tok_at(int i, int64_t vocab) { return (int32_t)((i * 37 + 11) % (vocab - 3)) + 3; }

/* The oracle's prompt beside prompts of other lengths (one sharing its
 * first 8 tokens), greedy and seeded; greedy ids must equal the oracle's. */
static bool check_fixture(const char *dir, bool oracle_greedy, int *n_checked) {
    cJSON *o = NULL;
    char p[4096];
    snprintf(p, sizeof p, "%s/oracle.json", dir);
    kiln_status st = ku_json_load(p, &o);
    ke_model *m = NULL;
    if (!st) st = ke_model_load(dir, &m);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s: %s", dir, kiln_status_msg(st));
        kiln_status_free(st);
        cJSON_Delete(o);
        return false;
    }
    int64_t V = ke_model_hparams(m)->vocab;
    int32_t prompt[64], gen[64];
    int np = 0, ng = 0, first_tie = 1 << 30;
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(o, "prompt_ids")) if (np < 64) prompt[np++] = (int32_t)e->valuedouble;
    cJSON_ArrayForEach(e, ku_json_get(o, "generated_ids")) if (ng < 64) gen[ng++] = (int32_t)e->valuedouble;
    int k = 0;
    cJSON_ArrayForEach(e, ku_json_get(o, "top1_top2_gap")) {
        if (e->valuedouble < 1e-3 && k < first_tie) first_tie = k;
        k++;
    }
    cJSON_Delete(o);
    enum { N = 6 };
    job jobs[N];
    int32_t other[96];
    for (int i = 0; i < 96; i++) other[i] = tok_at(i, V);
    job_init(&jobs[0], prompt, np, true, 0, ng);
    job_init(&jobs[1], other, 3, true, 0, 30);
    job_init(&jobs[2], other + 5, 41, false, 7, 20);
    int32_t shared[40];
    memcpy(shared, prompt, sizeof(int32_t) * 8);
    memcpy(shared + 8, other, sizeof(int32_t) * 32);
    job_init(&jobs[3], shared, 40, true, 0, 12);
    job_init(&jobs[4], other + 2, 17, false, 1234, 25);
    job_init(&jobs[5], prompt, np, false, 99, 16);
    bool ok = true;
    /* roomy cache, small chunks, prefix cache on */
    setup a = {.max_running = 4, .step_tokens = 16, .block_size = 4, .n_cache = 1024, .prefix_cache = true};
    ksch_stats stats;
    ok = run_jobs(m, &a, jobs, N, &stats, dir);
    if (ok && oracle_greedy)
        for (int i = 0; i < ng && i < first_tie; i++)
            if (jobs[0].got.ids[i] != gen[i]) {
                kt_fail(__FILE__, __LINE__, "%s: batched greedy id %d at step %d, oracle %d", dir, jobs[0].got.ids[i], i, gen[i]);
                ok = false;
                break;
            }
    /* a cache of 128 tokens for 6 sequences of up to 65: preemptions */
    setup b = {.max_running = 6, .step_tokens = 64, .block_size = 4, .n_cache = 128, .prefix_cache = false};
    for (int i = 0; ok && i < N; i++) memset(&jobs[i].got, 0, sizeof jobs[i].got);
    if (ok) ok = run_jobs(m, &b, jobs, N, &stats, dir);
    /* (a model whose every layer slides keeps only its window: it fits) */
    if (ok && stats.preemptions == 0 && !b.window) {
        kt_fail(__FILE__, __LINE__, "%s: no preemption with a 128-token cache", dir);
        ok = false;
    }
    jobs_free(jobs, N);
    ke_model_free(m);
    (*n_checked)++;
    return ok;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

KT_TEST(sched_matches_single_sequence_and_oracle_every_fixture) {
    char root[4096];
    kt_path(root, sizeof root, "tests/fixtures/oracle");
    DIR *d = opendir(root);
    KT_CHECK(d);
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256)
        if (e->d_name[0] != '.') {
            char p[8192];
            snprintf(p, sizeof p, "%s/%s/oracle.json", root, e->d_name);
            if (ku_file_exists(p)) names[n++] = strdup(e->d_name);
        }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    int checked = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        char dir[8192];
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        if (!check_fixture(dir, true, &checked)) bad++;
        /* the quantized variants: batched equals single (no oracle ids: ties) */
        const char *variants[] = {"q4"};
        for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
            char vd[8300];
            snprintf(vd, sizeof vd, "%s/%s", dir, variants[k]);
            if (ku_dir_exists(vd) && !check_fixture(vd, false, &checked)) bad++;
        }
        free(names[i]);
    }
    KT_CHECKF(bad == 0, "%d fixtures fail", bad);
    KT_CHECKF(checked >= 12, "only %d fixtures checked", checked);
}

/* Mamba (recurrent state rows): more requests than rows wait for one, and
 * prefix caching resumes from state snapshots at block boundaries with the
 * single-sequence outputs (run_jobs compares them). */
KT_TEST(sched_recurrent_state_rows) {
    ke_model *m = ke_test_load_fixture("mamba");
    if (!m) return;
    enum { N = 5 };
    job jobs[N];
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = tok_at(i, ke_model_hparams(m)->vocab);
    for (int i = 0; i < N; i++) job_init(&jobs[i], toks + (i % 2) * 4, 20, i % 2 == 0, (uint32_t)i, 10 + i);
    setup su = {.max_running = 4, .step_tokens = 8, .block_size = 4, .n_cache = 512, .prefix_cache = true, .n_seq_max = 2};
    ksch_stats stats;
    KT_CHECK(run_jobs(m, &su, jobs, N, &stats, "mamba, 2 state rows"));
    KT_CHECK(stats.cache.prefix_hits > 0);
    jobs_free(jobs, N);
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_threads = 1, .n_seq_max = 1}, &c));
    int a, b;
    KT_CHECK(ke_ctx_recurrent(c));
    KT_CHECK_OK(ke_seq_open(c, &a));
    KT_CHECK_ERR(ke_seq_open(c, &b), "recurrent state rows");
    KT_CHECK_EQ(ke_seq_reuse_prefix(c, a, toks, 40), 0);
    ke_seq_close(c, a);
    KT_CHECK_OK(ke_seq_open(c, &b));
    ke_ctx_free(c);
    ke_model_free(m);
}

KT_TEST(sched_shared_prefixes_hit_the_cache) {
    ke_model *m = ke_test_load_fixture("llama");
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    int32_t base[64];
    for (int i = 0; i < 64; i++) base[i] = tok_at(i * 3, V);
    enum { N = 5 };
    job jobs[N];
    /* three choices of one prompt (the 2nd and 3rd wait for the first's
     * prefill), and two prompts sharing 32 tokens with it */
    job_init(&jobs[0], base, 45, false, 1, 10);
    job_init(&jobs[1], base, 45, false, 2, 10);
    job_init(&jobs[2], base, 45, false, 3, 10);
    jobs[1].after = jobs[2].after = 1;
    int32_t p2[64];
    memcpy(p2, base, sizeof p2);
    p2[33] = 7;
    job_init(&jobs[3], p2, 50, true, 0, 10);
    job_init(&jobs[4], p2, 38, true, 0, 10);
    setup su = {.max_running = 8, .step_tokens = 32, .block_size = 4, .n_cache = 1024, .prefix_cache = true};
    ksch_stats st;
    bool ok = run_jobs(m, &su, jobs, N, &st, "llama");
    if (ok) {
        KT_CHECK_EQ(jobs[1].got.n_cached, 44);
        KT_CHECK_EQ(jobs[2].got.n_cached, 44);
        KT_CHECK(st.cache.prefix_hits >= 44 * 2 + 32);
        KT_CHECK_EQ(st.prompt_tokens, 45 * 3 + 50 + 38);
    }
    jobs_free(jobs, N);
    ke_model_free(m);
}

KT_TEST(sched_sliding_window_long_generation) {
    ke_model *m = ke_test_load_fixture("mistral"); /* window 8: blocks are released as it goes */
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    int32_t base[64];
    for (int i = 0; i < 64; i++) base[i] = tok_at(i * 5, V);
    enum { N = 4 };
    job jobs[N];
    job_init(&jobs[0], base, 30, true, 0, 90);
    job_init(&jobs[1], base + 3, 20, false, 5, 90);
    job_init(&jobs[2], base + 9, 50, true, 0, 70);
    job_init(&jobs[3], base, 30, false, 6, 80);
    /* 32 blocks of 4 tokens: without releasing, four sequences of 110-120
     * tokens would need 115 blocks */
    setup su = {.max_running = 4, .step_tokens = 16, .block_size = 4, .n_cache = 128, .prefix_cache = true};
    ksch_stats st;
    if (run_jobs(m, &su, jobs, N, &st, "mistral")) KT_CHECK_EQ(st.preemptions, 0);
    jobs_free(jobs, N);
    ke_model_free(m);
}

typedef struct {
    ksch *s;
    uint64_t cancel_id;
    int after_tokens;
    result r;
} canceller;

static void on_event_cancel(const ksch_event *e) {
    canceller *k = e->ud;
    on_event(&(ksch_event){.kind = e->kind, .token = e->token, .finish = e->finish, .cancelled = e->cancelled,
                           .error = e->error, .ud = &k->r});
    if (e->kind == KSCH_TOKEN && k->r.n == k->after_tokens) ksch_cancel(k->s, k->cancel_id);
}

KT_TEST(sched_cancel_queue_limit_and_end_at_start) {
    ke_model *m = ke_test_load_fixture("qwen3");
    if (!m) return;
    ke_ctx *c;
    KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 64, .n_cache = 256, .n_threads = 1, .block_size = 4}, &c));
    ksch *s;
    KT_CHECK_OK(ksch_create(c, &(ksch_params){.max_running = 2, .max_waiting = 3, .prefix_cache = true}, &s));
    int32_t prompt[80];
    for (int i = 0; i < 80; i++) prompt[i] = tok_at(i, 512);
    kgen_params gp;
    KT_CHECK_OK(kgen_params_init(&gp));
    gp.ignore_eos = true;
    gp.n_predict = 40;
    canceller k[3] = {{.s = s, .after_tokens = 5}, {.s = s, .after_tokens = -1}, {.s = s, .after_tokens = -1}};
    KT_CHECK_OK(ksch_submit(s, &(ksch_request){prompt, 10, &gp, 0, on_event_cancel, &k[0], NULL, false, false}, &k[0].cancel_id));
    KT_CHECK_OK(ksch_submit(s, &(ksch_request){prompt, 12, &gp, 0, on_event_cancel, &k[1], NULL, false, false}, &k[1].cancel_id));
    gp.n_predict = 0; /* ends before its first token: finish "length" */
    KT_CHECK_OK(ksch_submit(s, &(ksch_request){prompt, 12, &gp, 0, on_event_cancel, &k[2], NULL, false, false}, &k[2].cancel_id));
    uint64_t id;
    KT_CHECK_ERR(ksch_submit(s, &(ksch_request){prompt, 12, &gp, 0, on_event_cancel, &k[2], NULL, false, false}, &id), "queue is full");
    KT_CHECK_ERR(ksch_submit(s, &(ksch_request){prompt, 0, &gp, 0, on_event_cancel, &k[2], NULL, false, false}, &id), "empty");
    prompt[3] = 100000;
    KT_CHECK_ERR(ksch_submit(s, &(ksch_request){prompt, 5, &gp, 0, on_event_cancel, &k[2], NULL, false, false}, &id), "out of range");
    prompt[3] = 5;
    gp.n_predict = 40;
    ksch_step(s);
    ksch_stats st;
    ksch_get_stats(s, &st);
    KT_CHECK_EQ(st.running, 2);
    KT_CHECK_EQ(st.waiting, 0);
    ksch_cancel(s, k[1].cancel_id); /* cancelled while running, before its 2nd step */
    ksch_cancel(s, 9999);           /* unknown: ignored */
    drain(s);
    KT_CHECK(k[0].r.ended && k[0].r.cancelled);
    KT_CHECK_EQ(k[0].r.n, 5);
    KT_CHECK(k[1].r.ended && k[1].r.cancelled);
    KT_CHECK(k[2].r.ended && !k[2].r.cancelled);
    KT_CHECK_EQ(k[2].r.finish, KGEN_FINISH_LENGTH);
    KT_CHECK_EQ(k[2].r.n, 0);
    ksch_get_stats(s, &st);
    KT_CHECK_EQ(st.cache.n_used, 0);
    KT_CHECK_EQ(st.running + st.waiting, 0);
    /* a request still queued when the scheduler goes away ends cancelled */
    canceller late = {.s = s, .after_tokens = -1};
    KT_CHECK_OK(ksch_submit(s, &(ksch_request){prompt, 8, &gp, 0, on_event_cancel, &late, NULL, false, false}, &id));
    ksch_destroy(s);
    KT_CHECK(late.r.ended && late.r.cancelled);
    kgen_params_free(&gp);
    ke_ctx_free(c);
    ke_model_free(m);
}

/* An image request's per-token inputs as kiln generate builds them: the
 * oracle's prompt (image tokens in place) and the fixture's image.png. */
typedef struct {
    int32_t prompt[128];
    int n;
    float *feat, *deep;
    kvis_inputs vx;
    ke_inputs x;
    int max_span; /* longest bidirectional block */
} vlm_input;

static kiln_status vlm_input_load(const char *dir, const ke_model *m, vlm_input *v) {
    memset(v, 0, sizeof *v);
    char p[4200];
    cJSON *o;
    snprintf(p, sizeof p, "%s/oracle.json", dir);
    KILN_TRY(ku_json_load(p, &o));
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(o, "prompt_ids")) if (v->n < 128) v->prompt[v->n++] = (int32_t)e->valuedouble;
    cJSON_Delete(o);
    const kvis_model *vm = ke_model_vision(m);
    if (!vm) return kiln_error(KILN_EINVAL, "%s: no vision tower", dir);
    kimg_image img;
    kvis_pixels px = {0};
    snprintf(p, sizeof p, "%s/image.png", dir);
    KILN_TRY(kimg_load_png(p, &img));
    kiln_status st = kvis_pixels_from_image(vm, &img, &px);
    kimg_free(&img);
    int64_t n_feat = 0;
    if (!st) st = kvis_encode(vm, &px, 1, &v->feat, &v->deep, &n_feat);
    if (!st) st = kvis_inputs_build(vm, &px, 1, v->feat, v->deep, n_feat, ke_model_hparams(m)->hidden, v->prompt, v->n, &v->vx);
    kvis_pixels_free(&px);
    v->x = (ke_inputs){v->vx.embd, v->vx.span, v->vx.pos3, v->vx.embd_add, v->vx.cross, v->vx.cross_keys, v->vx.types};
    for (int i = 0; !st && v->vx.span && i < v->n; i++)
        if (v->vx.span[2 * i + 1] - v->vx.span[2 * i] + 1 > v->max_span) v->max_span = v->vx.span[2 * i + 1] - v->vx.span[2 * i] + 1;
    return st;
}

static void vlm_input_free(vlm_input *v) {
    free(v->feat), free(v->deep);
    kvis_inputs_free(&v->vx);
}

/* Image requests (the VLM oracle fixtures) batched with text-only ones and
 * each other, in small chunks, as n > 1 seeded choices, and preempted: each
 * equals its single-sequence run (the oracle's greedy ids too), and no
 * prefix block is shared from or with an image prompt. */
KT_TEST(sched_image_requests_every_vlm_fixture) {
    const char *names[] = {"llava", "paligemma", "gemma3", "smolvlm", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3", "pixtral", "llava_next", "llava_onevision", "internvl", "aya_vision", "glm4v", "qwen2_5_omni", "mllama", "kosmos2_5"};
    for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
        char dir[4096];
        kt_path(dir, sizeof dir, "tests/fixtures/vlm");
        size_t l = strlen(dir);
        snprintf(dir + l, sizeof dir - l, "/%s", names[f]);
        ke_model *m = NULL;
        vlm_input v;
        kiln_status st = ke_model_load(dir, &m);
        if (!st) st = vlm_input_load(dir, m, &v);
        if (st) {
            kt_fail(__FILE__, __LINE__, "%s: %s", dir, kiln_status_msg(st));
            kiln_status_free(st);
            ke_model_free(m);
            continue;
        }
        enum { N = 5 };
        job jobs[N];
        int32_t other[40];
        for (int i = 0; i < 40; i++) other[i] = tok_at(i, 500);
        job_init(&jobs[0], v.prompt, v.n, true, 0, 20);
        job_init(&jobs[1], other, 5, true, 0, 16);
        job_init(&jobs[2], v.prompt, v.n, false, 5, 20);
        job_init(&jobs[3], v.prompt, v.n, false, 6, 20);
        job_init(&jobs[4], v.prompt, 9, true, 0, 8); /* the image prompt's text start, as text (no inputs) */
        jobs[0].x = jobs[2].x = jobs[3].x = &v.x;
        jobs[3].after = 3; /* as the second choice of an n = 2 request */
        /* small chunks (a bidirectional block whole), prefix cache on */
        int step = v.max_span > 8 ? v.max_span : 8;
        setup a = {.max_running = 4, .step_tokens = step, .block_size = 4, .n_cache = 512, .prefix_cache = true};
        ksch_stats stats;
        bool ok = run_jobs(m, &a, jobs, N, &stats, dir);
        KT_CHECKF(!ok || stats.cache.prefix_hits == 0, "%s: %lld prefix hits", names[f], (long long)stats.cache.prefix_hits);
        /* a cache too small for all: preemptions, re-prefill with the same inputs */
        /* (the context no longer than the longest job, so that the cache is that small too) */
        setup b = {.max_running = 5, .step_tokens = 64, .block_size = 4, .n_cache = (v.n + 24 + 3) / 4 * 4, .prefix_cache = true,
                   .n_ctx = (v.n + 24 + 3) / 4 * 4};
        for (int i = 0; ok && i < N; i++) memset(&jobs[i].got, 0, sizeof jobs[i].got);
        if (ok) ok = run_jobs(m, &b, jobs, N, &stats, dir);
        KT_CHECKF(!ok || stats.preemptions > 0 || b.window, "%s: no preemption", names[f]);
        jobs_free(jobs, N);
        vlm_input_free(&v);
        ke_model_free(m);
    }
}

/* A chat's second turn (the first turn's prompt and reply, then more) on
 * every committed model with recurrent state: it resumes from the state
 * kept at the last block boundary of what it shares, and its tokens equal a
 * cold single-sequence run; with no room for snapshots nothing is reused. */
static bool two_turns(const ke_model *m, int64_t state_bytes, const char *dir, int32_t *n_cached) {
    ke_ctx *c;
    kiln_status st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 128, .n_threads = 1, .block_size = 4, .state_cache_bytes = state_bytes}, &c);
    ksch *s = NULL;
    if (!st) st = ksch_create(c, &(ksch_params){.max_running = 2, .step_tokens = 16, .prefix_cache = true}, &s);
    int64_t V = ke_model_hparams(m)->vocab;
    job a, b;
    int32_t p1[96];
    for (int i = 0; i < 96; i++) p1[i] = tok_at(i * 5 + 1, V);
    job_init(&a, p1, 23, true, 0, 14);
    uint64_t id;
    if (!st) st = ksch_submit(s, &(ksch_request){a.prompt, a.n_prompt, &a.gp, 0, on_event, &a.got, NULL, false, false}, &id);
    if (!st) drain(s);
    /* turn 2: prompt 1, its reply, 6 more tokens */
    int n2 = 23 + a.got.n;
    memcpy(p1 + 23, a.got.ids, sizeof(int32_t) * (size_t)a.got.n);
    for (int i = 0; i < 6; i++) p1[n2 + i] = tok_at(i + 50, V);
    job_init(&b, p1, n2 + 6, false, 5, 12);
    if (!st) st = ksch_submit(s, &(ksch_request){b.prompt, b.n_prompt, &b.gp, 0, on_event, &b.got, NULL, false, false}, &id);
    if (!st) drain(s);
    if (!st) st = run_alone(m, b.prompt, b.n_prompt, &b.gp, NULL, &b.want);
    bool ok = !st && b.got.ended && !b.got.err && same(&b.got, &b.want);
    if (st) kt_fail(__FILE__, __LINE__, "%s: %s", dir, kiln_status_msg(st));
    else if (!ok) kt_fail(__FILE__, __LINE__, "%s: the second turn differs from a cold run", dir);
    *n_cached = b.got.n_cached;
    kiln_status_free(st);
    kiln_status_free(b.got.err);
    jobs_free(&a, 1);
    jobs_free(&b, 1);
    ksch_destroy(s);
    ke_ctx_free(c);
    return ok;
}

KT_TEST(sched_recurrent_prefix_cache_second_turn_exact) {
    char root[4096];
    kt_path(root, sizeof root, "tests/fixtures/oracle");
    DIR *d = opendir(root);
    KT_CHECK(d);
    struct dirent *e;
    int checked = 0, bad = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char dir[8192];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        ke_model *m = NULL;
        kiln_status st = ke_model_load(dir, &m);
        if (st) {
            kiln_status_free(st);
            continue;
        }
        ke_ctx *c = NULL;
        st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 32, .n_threads = 1}, &c);
        bool rec = !st && ke_ctx_recurrent(c);
        kiln_status_free(st);
        ke_ctx_free(c);
        if (rec) {
            int32_t hit = 0, none = 0;
            if (!two_turns(m, 0, dir, &hit) || !two_turns(m, -1, dir, &none)) bad++;
            else if (hit < 20 || none != 0) {
                kt_fail(__FILE__, __LINE__, "%s: %d cached tokens with snapshots (want >= 20), %d without", dir, hit, none);
                bad++;
            }
            fprintf(stderr, "  %s: second turn resumed at %d tokens\n", e->d_name, hit);
            checked++;
        }
        ke_model_free(m);
    }
    closedir(d);
    KT_CHECKF(bad == 0, "%d of %d recurrent fixtures fail", bad, checked);
    KT_CHECKF(checked >= 10, "only %d fixtures with recurrent state", checked);
}

/* Speculative decoding inside continuous batching: four requests (greedy and
 * seeded, prompts that repeat themselves) decode with guesses from prompt
 * lookup and from the model as its own draft, with and without the prefix
 * cache, in a cache too small for all four (preemptions happen); every
 * stream must equal its plain single-sequence run. */
static void check_spec_model(ke_model *m, const char *fixture, bool mtp) {
    int64_t V = ke_model_hparams(m)->vocab;
    for (int variant = 0; variant < 3; variant++) {
        kspec_params sp;
        kspec_params_init(&sp);
        sp.ngram = variant != 1;
        sp.draft_p_min = 0;
        sp.draft_max = 4;
        if (mtp) /* the MTP head instead of a draft model: alone (one guess, three) or after prompt lookup */
            sp.mtp = true, sp.mtp_max = variant == 0 ? 1 : 3, sp.ngram = variant == 2;
        job jobs[4];
        for (int i = 0; i < 4; i++) {
            int32_t prompt[40];
            int n = 12 + 7 * i;
            for (int k = 0; k < n; k++) prompt[k] = tok_at((k % (5 + i)) + 3 * i, V);
            job_init(&jobs[i], prompt, n, i % 2 == 0, 100 + (uint32_t)i, 24 + 4 * i);
            jobs[i].gp.repeat_penalty = i == 3 ? 1.2f : 1.0f;
        }
        setup su = {.max_running = 4, .step_tokens = 64, .block_size = 4, .prefix_cache = variant == 2,
                    .n_cache = variant == 2 ? 96 : 0, .spec = &sp, .draft = variant == 0 || mtp ? NULL : m};
        ksch_stats st;
        char what[128];
        snprintf(what, sizeof what, "%s, speculation variant %d", fixture, variant);
        if (run_jobs(m, &su, jobs, 4, &st, what)) {
            KT_CHECKF(st.spec_draft_tokens > 0, "%s: nothing guessed", what);
            if (variant == 1 && !mtp) KT_CHECKF(st.spec_accepted_tokens > 0, "%s: the model as its own draft kept nothing", what);
            KT_CHECK(st.spec_accepted_tokens <= st.spec_draft_tokens);
            KT_CHECKF(st.preemptions > 0, "%s: no preemption", what);
        }
        jobs_free(jobs, 4);
    }
}

static void check_spec(const char *fixture) {
    ke_model *m = ke_test_load_fixture(fixture);
    if (!m) return;
    check_spec_model(m, fixture, false);
    ke_model_free(m);
}

static void check_spec_mtp(kspec_test_layout which, const char *what) {
    char dir[512];
    if (!kspec_test_mtp_model(which, dir, sizeof dir)) return;
    ke_model *m = NULL;
    KT_CHECK_OK(ke_model_load(dir, &m));
    if (m) check_spec_model(m, what, true);
    ke_model_free(m);
    ckt_rmdir(dir);
}

KT_TEST(sched_spec_mtp) { check_spec_mtp(KSPEC_TEST_MIMO, "qwen2 as MiMo with an MTP layer"); }
KT_TEST(sched_spec_mtp_nextn) { check_spec_mtp(KSPEC_TEST_DEEPSEEK, "deepseek_v3 with a nextn layer"); }
KT_TEST(sched_spec_mtp_nemotron_h) { check_spec_mtp(KSPEC_TEST_NEMOTRON_H, "nemotron_h (Mamba-2 target) with two MTP layers"); }
KT_TEST(sched_spec_mtp_deepseek_v4) { check_spec_mtp(KSPEC_TEST_DEEPSEEK_V4, "deepseek_v4 with an MTP layer over its hyper-connection streams"); }

KT_TEST(sched_spec_dense) { check_spec("llama"); }
KT_TEST(sched_spec_moe) { check_spec("mixtral"); }
KT_TEST(sched_spec_ssm) { check_spec("mamba2"); }
KT_TEST(sched_spec_hybrid) { check_spec("qwen3_next"); }

static void *run_thread(void *p) {
    ksch_run(p);
    return NULL;
}

static kiln_status call_counts(ksch *s, void *ud) {
    (void)s;
    ++*(int *)ud;
    return NULL;
}

/* Slots: requests take the lowest free slot and leave their tokens there;
 * ksch_call runs on the stepping thread; a slot saved from one context is
 * restored into another's prefix cache; unknown slots and calls after
 * ksch_stop are errors. */
KT_TEST(sched_slots_and_calls) {
    ke_model *m = ke_test_load_fixture("llama");
    if (!m) return;
    int64_t V = ke_model_hparams(m)->vocab;
    int32_t pa[40], pb[40];
    for (int i = 0; i < 40; i++) pa[i] = tok_at(i, V), pb[i] = tok_at(i * 5 + 1, V);
    char path[] = "/tmp/kiln-sched-slot-XXXXXX";
    int fd = mkstemp(path);
    KT_CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    int64_t saved = -1;
    for (int round = 0; round < 2; round++) {
        ke_ctx *c;
        KT_CHECK_OK(ke_ctx_create(m, &(ke_ctx_params){.n_ctx = 128, .n_cache = 512, .n_threads = 1, .block_size = 4}, &c));
        ksch *s;
        KT_CHECK_OK(ksch_create(c, &(ksch_params){.max_running = 2, .step_tokens = 32, .prefix_cache = true}, &s));
        KT_CHECK_EQ(ksch_n_slots(s), 2);
        ksch_slot_info si;
        KT_CHECK(!ksch_slot_get(s, 2, &si));
        if (round == 0) {
            job ja, jb;
            job_init(&ja, pa, 37, true, 0, 6);
            job_init(&jb, pb, 30, true, 0, 5);
            uint64_t id;
            KT_CHECK_OK(ksch_submit(s, &(ksch_request){ja.prompt, ja.n_prompt, &ja.gp, 0, on_event, &ja.got, NULL, false, false}, &id));
            KT_CHECK_OK(ksch_submit(s, &(ksch_request){jb.prompt, jb.n_prompt, &jb.gp, 0, on_event, &jb.got, NULL, false, false}, &id));
            drain(s);
            KT_CHECK(ksch_slot_get(s, 0, &si));
            /* prompt and reply, but the last token sampled: it ended the request and never entered the sequence */
            KT_CHECKF(!si.processing && si.id_task == 1 && si.n_prompt == 37 && si.n_tokens == 37 + 5, "%d %llu %d %lld",
                      si.processing, (unsigned long long)si.id_task, si.n_prompt, (long long)si.n_tokens);
            KT_CHECK(ksch_slot_get(s, 1, &si));
            KT_CHECK(!si.processing && si.id_task == 2 && si.n_prompt == 30 && si.n_tokens == 30 + 4);
            jobs_free(&ja, 1);
            jobs_free(&jb, 1);
        }
        pthread_t th;
        KT_CHECK(pthread_create(&th, NULL, run_thread, s) == 0);
        int calls = 0;
        KT_CHECK_OK(ksch_call(s, call_counts, &calls));
        KT_CHECK_EQ(calls, 1);
        int64_t n = 0;
        size_t bytes = 0;
        kiln_status st = ksch_slot_save(s, 7, path, &n, &bytes);
        KT_CHECK(st && kiln_status_code(st) == KILN_ENOTFOUND && strstr(kiln_status_msg(st), "unknown slot id 7"));
        kiln_status_free(st);
        if (round == 0) {
            KT_CHECK_OK(ksch_slot_save(s, 0, path, &saved, &bytes));
            /* of the 42 tokens, the 41 in the cache (the last is not) make 10 full blocks */
            KT_CHECK_EQ(saved, 40);
            KT_CHECK(bytes > 0);
            KT_CHECK_OK(ksch_slot_erase(s, 0, &n));
            KT_CHECK_EQ(n, 42);
            KT_CHECK(ksch_slot_get(s, 0, &si) && si.n_tokens == 0);
            char empty[] = "/tmp/kiln-sched-slot-XXXXXX"; /* an empty slot saves an empty file */
            int efd = mkstemp(empty);
            KT_CHECK(efd >= 0);
            if (efd >= 0) close(efd);
            KT_CHECK_OK(ksch_slot_save(s, 0, empty, &n, &bytes));
            KT_CHECK_EQ(n, 0);
            unlink(empty);
        } else {
            KT_CHECK_OK(ksch_slot_restore(s, 1, path, &n, &bytes));
            KT_CHECK_EQ(n, saved);
            KT_CHECK(ksch_slot_get(s, 1, &si) && si.n_tokens == saved);
            ke_cache_stats cs;
            ke_ctx_cache_stats(c, &cs); /* the scheduler is idle: its thread does not touch the context now */
            KT_CHECK_EQ(cs.n_cached, saved / 4);
        }
        ksch_stop(s);
        pthread_join(th, NULL);
        calls = 0;
        st = ksch_call(s, call_counts, &calls);
        KT_CHECK(st && calls == 0);
        kiln_status_free(st);
        ksch_destroy(s);
        ke_ctx_free(c);
    }
    unlink(path);
    ke_model_free(m);
}
