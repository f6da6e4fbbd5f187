/* metrics.c: the server's Prometheus metrics, text exposition format 0.0.4.
 *
 * Names follow vLLM's (num_requests_running, time_to_first_token_seconds,
 * ...) with the prefix "kiln_" instead of "vllm:", since `promtool check
 * metrics` rejects names containing ':'. Counters end in _total, times are
 * in seconds, every metric has HELP and TYPE lines. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_int.h"

#define MAX_BUCKETS 24

typedef struct {
    const double *le; /* upper bounds, ascending; +Inf implied */
    int n;
    int64_t count[MAX_BUCKETS + 1]; /* per bucket (not cumulative); [n] = above the last */
    double sum;
    int64_t total;
} histo;

static const double k_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
static const double k_itl[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                               0.3,   0.4,    0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0};
static const double k_e2e[] = {0.01, 0.05, 0.1,  0.3,  0.5,  0.8,  1.0,   1.5,   2.0,   2.5,  5.0,
                               10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0};
static const double k_tokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};

struct ksrv_metrics {
    pthread_mutex_t mu;
    histo ttft, itl, e2e, req_prompt, req_gen;
    int64_t success[2]; /* stop, length */
    int64_t aborted, failed;
    int64_t http[6]; /* 2xx..5xx by first digit; [0] other */
};

static void histo_init(histo *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n = n;
}

static void histo_add(histo *h, double v) {
    int b = 0;
    while (b < h->n && v > h->le[b]) b++;
    h->count[b]++;
    h->sum += v;
    h->total++;
}

ksrv_metrics *ksrv_metrics_create(void) {
    ksrv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    histo_init(&m->ttft, k_ttft, (int)(sizeof k_ttft / sizeof k_ttft[0]));
    histo_init(&m->itl, k_itl, (int)(sizeof k_itl / sizeof k_itl[0]));
    histo_init(&m->e2e, k_e2e, (int)(sizeof k_e2e / sizeof k_e2e[0]));
    histo_init(&m->req_prompt, k_tokens, (int)(sizeof k_tokens / sizeof k_tokens[0]));
    histo_init(&m->req_gen, k_tokens, (int)(sizeof k_tokens / sizeof k_tokens[0]));
    return m;
}

void ksrv_metrics_destroy(ksrv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void ksrv_metrics_first_token(ksrv_metrics *m, double ttft) {
    pthread_mutex_lock(&m->mu);
    histo_add(&m->ttft, ttft);
    pthread_mutex_unlock(&m->mu);
}

void ksrv_metrics_token(ksrv_metrics *m, double itl) {
    pthread_mutex_lock(&m->mu);
    histo_add(&m->itl, itl);
    pthread_mutex_unlock(&m->mu);
}

void ksrv_metrics_end(ksrv_metrics *m, const char *reason, bool cancelled, double e2e, int32_t n_prompt,
                      int32_t n_generated) {
    pthread_mutex_lock(&m->mu);
    if (reason) {
        m->success[strcmp(reason, "stop") ? 1 : 0]++;
        histo_add(&m->e2e, e2e);
        histo_add(&m->req_prompt, n_prompt);
        histo_add(&m->req_gen, n_generated);
    } else if (cancelled) {
        m->aborted++;
    } else {
        m->failed++;
    }
    pthread_mutex_unlock(&m->mu);
}

void ksrv_metrics_http(ksrv_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int k = status / 100;
    m->http[k >= 2 && k <= 5 ? k : 0]++;
    pthread_mutex_unlock(&m->mu);
}

static void head(ksrv_buf *b, const char *name, const char *type, const char *help) {
    ksrv_buf_printf(b, "# HELP kiln_%s %s\n# TYPE kiln_%s %s\n", name, help, name, type);
}

static void scalar(ksrv_buf *b, const char *name, const char *type, const char *help, double v) {
    head(b, name, type, help);
    ksrv_buf_printf(b, "kiln_%s %.17g\n", name, v);
}

static void le_str(char *buf, size_t cap, double v) { snprintf(buf, cap, "%.6g", v); }

static void histogram(ksrv_buf *b, const char *name, const char *help, const double *le, int n, const int64_t *count,
                      double sum, int64_t total) {
    head(b, name, "histogram", help);
    int64_t cum = 0;
    char l[32];
    for (int i = 0; i < n; i++) {
        cum += count[i];
        le_str(l, sizeof l, le[i]);
        ksrv_buf_printf(b, "kiln_%s_bucket{le=\"%s\"} %lld\n", name, l, (long long)cum);
    }
    ksrv_buf_printf(b, "kiln_%s_bucket{le=\"+Inf\"} %lld\n", name, (long long)total);
    ksrv_buf_printf(b, "kiln_%s_sum %.17g\nkiln_%s_count %lld\n", name, sum, name, (long long)total);
}

static void histo_out(ksrv_buf *b, const char *name, const char *help, const histo *h) {
    histogram(b, name, help, h->le, h->n, h->count, h->sum, h->total);
}

void ksrv_metrics_render(ksrv_metrics *m, const ksch_stats *st, bool ready, ksrv_buf *b) {
    pthread_mutex_lock(&m->mu);
    scalar(b, "ready", "gauge", "1 when the model is loaded and requests are served.", ready);
    scalar(b, "num_requests_running", "gauge", "Sequences in the running batch.", (double)st->running);
    scalar(b, "num_requests_waiting", "gauge", "Sequences waiting to be admitted.", (double)st->waiting);
    double usage = st->cache.n_blocks ? (double)st->cache.n_used / (double)st->cache.n_blocks : 0;
    scalar(b, "kv_cache_usage_ratio", "gauge", "Fraction of KV cache blocks in use (1 = full).", usage);
    scalar(b, "kv_cache_blocks", "gauge", "KV cache blocks in total.", (double)st->cache.n_blocks);
    scalar(b, "kv_cache_cached_blocks", "gauge", "Unused KV blocks that hold a reusable prefix.",
           (double)st->cache.n_cached);
    scalar(b, "prompt_tokens_total", "counter", "Prompt tokens of admitted requests (cached ones included).",
           (double)st->prompt_tokens);
    scalar(b, "generation_tokens_total", "counter", "Tokens generated.", (double)st->generated_tokens);
    scalar(b, "prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           (double)st->cache.prefix_queries);
    scalar(b, "prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
           (double)st->cache.prefix_hits);
    scalar(b, "kv_cache_evictions_total", "counter", "Cached KV blocks recycled for new tokens.",
           (double)st->cache.evictions);
    scalar(b, "prefix_cache_disk_hits_total", "counter",
           "Prompt tokens of cached prefixes restored with blocks or state snapshots read from --cache-dir.",
           (double)st->cache.disk_hits);
    scalar(b, "prefix_cache_disk_writes_total", "counter", "KV blocks written to --cache-dir.",
           (double)st->cache.disk_writes);
    scalar(b, "prefix_cache_disk_bad_files_total", "counter",
           "Files in --cache-dir found corrupt, truncated or of another model (read as misses).",
           (double)st->cache.disk_bad);
    scalar(b, "prefix_cache_disk_bytes", "gauge", "Bytes of the files in --cache-dir.", (double)st->cache.disk_bytes);
    scalar(b, "prefix_cache_ram_hits_total", "counter",
           "Prompt tokens of cached prefixes restored from the RAM tier (--cache-ram), none from --cache-dir.",
           (double)st->cache.ram_hits);
    scalar(b, "prefix_cache_ram_blocks", "gauge", "KV blocks in the RAM tier (--cache-ram).", (double)st->cache.ram_blocks);
    scalar(b, "prefix_cache_ram_bytes", "gauge", "Bytes of the RAM tier's blocks and the state snapshots (--cache-ram).",
           (double)st->cache.ram_bytes);
    scalar(b, "prefix_cache_ram_budget_bytes", "gauge", "The --cache-ram bound in bytes.", (double)st->cache.ram_budget);
    scalar(b, "num_preemptions_total", "counter", "Sequences preempted (KV blocks released, prefilled again later).",
           (double)st->preemptions);
    scalar(b, "spec_decode_num_draft_tokens_total", "counter", "Speculative decoding: guessed tokens verified.",
           (double)st->spec_draft_tokens);
    scalar(b, "spec_decode_num_accepted_tokens_total", "counter", "Speculative decoding: guessed tokens kept.",
           (double)st->spec_accepted_tokens);
    scalar(b, "spec_decode_num_drafts_total", "counter", "Speculative decoding: drafts verified (sequence steps with guesses).",
           (double)st->spec_drafts);
    head(b, "request_success_total", "counter", "Sequences finished, by finish reason.");
    ksrv_buf_printf(b, "kiln_request_success_total{finished_reason=\"stop\"} %lld\n", (long long)m->success[0]);
    ksrv_buf_printf(b, "kiln_request_success_total{finished_reason=\"length\"} %lld\n", (long long)m->success[1]);
    scalar(b, "request_aborted_total", "counter", "Sequences cancelled (client gone or server stopping).",
           (double)m->aborted);
    scalar(b, "request_failed_total", "counter", "Sequences ended by an internal error.", (double)m->failed);
    head(b, "http_responses_total", "counter", "HTTP responses by status class.");
    static const char *const cls[] = {"other", "", "2xx", "3xx", "4xx", "5xx"};
    for (int k = 0; k < 6; k++)
        if (k != 1) ksrv_buf_printf(b, "kiln_http_responses_total{status=\"%s\"} %lld\n", cls[k], (long long)m->http[k]);
    histo_out(b, "time_to_first_token_seconds", "Time from arrival to the first generated token.", &m->ttft);
    histo_out(b, "inter_token_latency_seconds", "Time between two tokens of a sequence.", &m->itl);
    histo_out(b, "e2e_request_latency_seconds", "Time from arrival to the end of a finished sequence.", &m->e2e);
    histo_out(b, "request_prompt_tokens", "Prompt tokens per finished sequence.", &m->req_prompt);
    histo_out(b, "request_generation_tokens", "Generated tokens per finished sequence.", &m->req_gen);
    pthread_mutex_unlock(&m->mu);
    /* tokens per engine step (the batch size) */
    double le[11];
    int64_t count[12];
    for (int i = 0; i < 11; i++) le[i] = (double)ksch_batch_buckets[i];
    memcpy(count, st->batch_hist, sizeof count);
    histogram(b, "iteration_tokens", "Tokens decoded per engine step (batch size).", le, 11, count,
              (double)st->batch_tokens, st->steps);
    /* speculation: guesses kept per round that had guesses (vLLM's acceptance length less one) */
    double sle[KSCH_SPEC_BUCKETS - 1];
    for (int i = 0; i < KSCH_SPEC_BUCKETS - 1; i++) sle[i] = (double)ksch_spec_buckets[i];
    histogram(b, "spec_decode_accepted_tokens_per_draft", "Speculative decoding: guessed tokens kept per verified draft.", sle,
              KSCH_SPEC_BUCKETS - 1, st->spec_accept_hist, (double)st->spec_accepted_tokens, st->spec_drafts);
}
