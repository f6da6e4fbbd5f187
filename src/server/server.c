/* server.c: the HTTP side of `kiln serve` (see server.h): the daemon,
 * request bodies, routing, authentication, the simple endpoints, model
 * loading in the background, and the scheduler's thread. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/json.h"
#include "runtime/dist.h"
#include "server/server_int.h"

/* A TCP connection, for the reaper (request deadlines, see reaper_main). */
typedef struct conn_watch {
    struct conn_watch *prev, *next;
    int fd;
    double t_wait; /* when the connection opened or its last response ended */
    bool busy;     /* a request is being answered */
    bool cut;      /* shut down by the reaper */
} conn_watch;

typedef struct {
    ksrv *s;
    struct MHD_Connection *conn;
    conn_watch *watch; /* NULL: not watched */
    ksrv_buf body;
    bool too_big, responded;
    bool counted; /* in s->in_flight (a completion request running) */
    bool close_after; /* the reply asks the client to close the connection */
    bool allow_post;  /* a 405's Allow header: POST (else GET) */
    ksrv_job *job; /* a streaming response's job (freed when the request completes) */
    double t0;
    char method[16];
    char url[128];
} conn_state;

/* ---------------------------------------------------------------- replies */


static void access_log(conn_state *cs, int status) {
    ksrv_metrics_http(cs->s->met, status);
    if (cs->s->p.quiet) return;
    char m[4 * sizeof cs->method + 1], u[4 * sizeof cs->url + 1];
    ksrv_log_escape(cs->method, m, sizeof m);
    ksrv_log_escape(cs->url, u, sizeof u);
    fprintf(stderr, "kiln: %s %s %d %.3fs\n", m, u, status, ksrv_now() - cs->t0);
}

static void set_busy(conn_state *cs, bool busy) {
    if (!cs->watch) return;
    pthread_mutex_lock(&cs->s->watch_mu);
    cs->watch->busy = busy;
    if (!busy) cs->watch->t_wait = ksrv_now();
    pthread_mutex_unlock(&cs->s->watch_mu);
}

static enum MHD_Result reply(conn_state *cs, int status, const char *ctype, ksrv_buf *b) {
    set_busy(cs, true);
    if (b->oom) {
        ksrv_buf_free(b);
        status = 500;
        ctype = "application/json";
        ksrv_buf_str(b, "{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\", \"code\": 500}}");
    }
    if (!b->p) ksrv_buf_add(b, "", 0);
    struct MHD_Response *r = MHD_create_response_from_buffer(b->len, b->p, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        ksrv_buf_free(b);
        return MHD_NO;
    }
    *b = (ksrv_buf){0}; /* MHD frees it */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 405) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, cs->allow_post ? "POST" : "GET");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (cs->close_after) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(cs->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    cs->responded = true;
    access_log(cs, status);
    return ret;
}

static enum MHD_Result reply_json(conn_state *cs, int status, ksrv_buf *b) {
    return reply(cs, status, "application/json", b);
}

/* An embedded file of the chat page (webui.c): no key needed to load it
 * (the page sends the key it is given with its API calls); it may only
 * talk to this server. */
static enum MHD_Result reply_page(conn_state *cs, const char *data, size_t len, const char *ctype) {
    set_busy(cs, true);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
    enum MHD_Result ret = MHD_queue_response(cs->conn, 200, r);
    MHD_destroy_response(r);
    cs->responded = true;
    access_log(cs, 200);
    return ret;
}

/* /v1/messages answers errors in Anthropic's shape */
static bool anthropic_url(const conn_state *cs) { return !strncmp(cs->url, "/v1/messages", 12); }

static enum MHD_Result reply_error(conn_state *cs, int status, const char *type, const char *code, const char *msg) {
    ksrv_buf b = {0};
    if (anthropic_url(cs)) ksrv_anthropic_error(&b, status, msg);
    else ksrv_error_json(&b, status, type, code, msg);
    return reply_json(cs, status, &b);
}

static enum MHD_Result reply_status(conn_state *cs, kiln_status st, const ksrv_err *e) {
    enum MHD_Result r = reply_error(cs, e->status, e->type, e->code, kiln_status_msg(st));
    kiln_status_free(st);
    return r;
}

/* ---------------------------------------------------------------- helpers */

static int state_of(ksrv *s, kiln_status *err_msg_holder) {
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    (void)err_msg_holder;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* The client hung up (the peer closed its side): its request is cancelled. */
static bool client_gone(conn_state *cs) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(cs->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (p.revents & POLLIN) { /* readable: data (a pipelined request) or end of stream */
        char c;
        ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0;
    }
    return false;
}

static bool key_ok(ksrv *s, struct MHD_Connection *conn) {
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h && strncasecmp(h, "Bearer ", 7) == 0) {
        h += 7;
        while (*h == ' ') h++;
    } else if (!(h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key"))) { /* Anthropic's header */
        return false;
    }
    size_t n = strlen(h), k = strlen(s->api_key);
    unsigned diff = (unsigned)(n ^ k);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)h[i] ^ (unsigned char)s->api_key[i % (k ? k : 1)];
    return diff == 0;
}

typedef struct {
    cJSON *item;
    int pos;
} keyed;

static const char *key_of(const cJSON *c) { return c->string ? c->string : ""; }

static int keyed_cmp(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    int c = strcmp(key_of(x->item), key_of(y->item));
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

/* Duplicate keys: the last one wins, as in most JSON parsers and gateways
 * (cJSON's lookups would find the first), in every object of the tree. */
static kiln_status dedup_keys(cJSON *j) {
    for (cJSON *c = j->child; c; c = c->next)
        if (cJSON_IsObject(c) || cJSON_IsArray(c)) KILN_TRY(dedup_keys(c));
    if (!cJSON_IsObject(j)) return NULL;
    int n = cJSON_GetArraySize(j), i = 0;
    if (n < 2) return NULL;
    keyed *v = malloc(sizeof *v * (size_t)n);
    if (!v) return kiln_error(KILN_ENOMEM, "out of memory");
    for (cJSON *c = j->child; c; c = c->next, i++) v[i] = (keyed){c, i};
    qsort(v, (size_t)n, sizeof *v, keyed_cmp); /* by key, then position */
    for (i = 0; i + 1 < n; i++)
        if (!strcmp(key_of(v[i].item), key_of(v[i + 1].item))) /* not the last of its key */
            cJSON_Delete(cJSON_DetachItemViaPointer(j, v[i].item));
    free(v);
    return NULL;
}

static kiln_status parse_json(conn_state *cs, cJSON **out) {
    const char *end = NULL;
    *out = NULL;
    const char *p = cs->body.p ? cs->body.p : "";
    /* cJSON ends a string at a \u0000 escape: refuse it rather than cut a prompt short */
    for (size_t i = 0; i + 6 <= cs->body.len; i++)
        if (p[i] == '\\') {
            if (!strncasecmp(p + i + 1, "u0000", 5))
                return kiln_error(KILN_EINVAL, "request body: a NUL character (\\u0000) at byte %zu: not supported in strings", i);
            i++; /* the escaped character */
        }
    *out = cJSON_ParseWithLengthOpts(p, cs->body.len, &end, 0);
    if (!*out) {
        size_t off = end && cs->body.p ? (size_t)(end - cs->body.p) : 0;
        return kiln_error(KILN_EINVAL, "request body: invalid JSON near byte %zu", off);
    }
    kiln_status st = dedup_keys(*out);
    if (st) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return st;
}

static const ksrv_err k_bad = {400, "invalid_request_error", NULL};

/* ---------------------------------------------------------------- endpoints */

static enum MHD_Result do_health(conn_state *cs) {
    ksrv *s = cs->s;
    pthread_mutex_lock(&s->mu);
    int st = s->state;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", st == KSRV_FAILED ? kiln_status_msg(s->load_err) : "Loading model");
    pthread_mutex_unlock(&s->mu);
    if (st != KSRV_READY) return reply_error(cs, 503, "unavailable_error", NULL, msg);
    /* load, for a balancer choosing between replicas (docs/serving.md):
     * slots as llama-server's /health?include_slots counts them, the queue,
     * and the share of KV blocks that running sequences hold */
    ksch_stats ks = {0};
    if (s->sch) ksch_get_stats(s->sch, &ks);
    int64_t busy = ks.running < s->p.parallel ? ks.running : s->p.parallel;
    double kv = ks.cache.n_blocks > 0 ? (double)ks.cache.n_used / (double)ks.cache.n_blocks : 0.0;
    ksrv_buf b = {0};
    ksrv_buf_printf(&b,
                    "{\"status\": \"ok\", \"slots_idle\": %lld, \"slots_processing\": %lld, "
                    "\"requests_running\": %lld, \"requests_waiting\": %lld, \"kv_cache_usage\": %.4f}",
                    (long long)(s->p.parallel - busy), (long long)busy, (long long)ks.running,
                    (long long)ks.waiting, kv);
    return reply_json(cs, 200, &b);
}

static enum MHD_Result do_metrics(conn_state *cs) {
    ksrv *s = cs->s;
    ksch_stats st = {0};
    bool ready = state_of(s, NULL) == KSRV_READY;
    if (ready && s->sch) ksch_get_stats(s->sch, &st);
    ksrv_buf b = {0};
    ksrv_metrics_render(s->met, &st, ready, &b);
    return reply(cs, 200, "text/plain; version=0.0.4; charset=utf-8", &b);
}

static void model_json(ksrv *s, ksrv_buf *b) {
    ksrv_buf_str(b, "{\"id\": ");
    ksrv_buf_json_str(b, s->model_id, strlen(s->model_id));
    ksrv_buf_printf(b, ", \"object\": \"model\", \"created\": %ld, \"owned_by\": \"kiln\", \"max_model_len\": %lld}",
                    s->created, (long long)ke_ctx_n_ctx(s->c));
}

static enum MHD_Result do_models(conn_state *cs, const char *id) {
    ksrv *s = cs->s;
    ksrv_buf b = {0};
    if (id) {
        if (strcmp(id, s->model_id) != 0) {
            char msg[300];
            snprintf(msg, sizeof msg, "the model \"%.200s\" does not exist", id);
            return reply_error(cs, 404, "invalid_request_error", "model_not_found", msg);
        }
        model_json(s, &b);
        return reply_json(cs, 200, &b);
    }
    ksrv_buf_str(&b, "{\"object\": \"list\", \"data\": [");
    model_json(s, &b);
    ksrv_buf_str(&b, "]}");
    return reply_json(cs, 200, &b);
}

static enum MHD_Result do_tokenize(conn_state *cs, const cJSON *body) {
    ksrv_buf b = {0};
    return reply_json(cs, ksrv_tokenize(cs->s, body, &b), &b);
}

static enum MHD_Result do_detokenize(conn_state *cs, const cJSON *body) {
    ksrv_buf b = {0};
    return reply_json(cs, ksrv_detokenize(cs->s, body, &b), &b);
}

static const char k_shutting_down[] = "the server is shutting down";

/* The event that ends a stream cut short, in the API's shape: OpenAI's
 * (and vLLM's) error object then [DONE], the Responses API's "error"
 * event, Anthropic's "error" event. */
static void stream_error(conn_state *cs, int status, const char *msg) {
    ksrv_job *j = cs->job;
    ksrv_buf *b = &j->out;
    if (anthropic_url(cs)) {
        ksrv_buf_str(b, "event: error\ndata: ");
        ksrv_anthropic_error(b, status, msg);
        ksrv_buf_str(b, "\n\n");
    } else if (j->agent) {
        ksrv_buf_str(b, "event: error\ndata: {\"type\": \"error\", \"code\": \"server_shutting_down\", \"message\": ");
        ksrv_buf_json_str(b, msg, strlen(msg));
        ksrv_buf_str(b, ", \"param\": null}\n\n");
    } else {
        ksrv_buf_str(b, "data: ");
        ksrv_error_json(b, status, "unavailable_error", NULL, msg);
        ksrv_buf_str(b, "\n\ndata: [DONE]\n\n");
    }
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn_state *cs = cls;
    ksrv_job *j = cs->job;
    for (;;) {
        if (j->out_off < j->out.len) {
            size_t n = j->out.len - j->out_off;
            if (n > max) n = max;
            memcpy(buf, j->out.p + j->out_off, n);
            j->out_off += n;
            if (j->out_off == j->out.len) j->out.len = j->out_off = 0;
            return (ssize_t)n;
        }
        if (j->done_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        ksrv_job_stream(j);
        if (j->out.oom) {
            ksrv_job_cancel_wait(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (j->out.len > 0 || j->done_sent) continue;
        if (client_gone(cs)) {
            ksrv_job_cancel_wait(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (atomic_load(&cs->s->stopping)) { /* the grace period is over: an error event ends the stream */
            ksrv_job_cancel_wait(j);
            stream_error(cs, 503, k_shutting_down);
            j->done_sent = true;
            continue;
        }
        ksrv_job_wait(j, 0.1);
    }
}

/* ---- llama-server's and vLLM's informational endpoints ---- */

#ifndef KILN_VERSION
#define KILN_VERSION "0.1.0"
#endif

/* /version (vLLM's): {"version": ...}. */
static enum MHD_Result do_version(conn_state *cs) {
    ksrv_buf b = {0};
    ksrv_buf_str(&b, "{\"version\": \"" KILN_VERSION "\", \"name\": \"kiln\"}");
    return reply_json(cs, 200, &b);
}

/* /props (llama-server's): the defaults, the slots, the model and its chat
 * template. */
static enum MHD_Result do_props(conn_state *cs) {
    ksrv *s = cs->s;
    const kgen_params *g = &s->defaults;
    ksrv_buf b = {0};
    ksrv_buf_printf(&b, "{\"default_generation_settings\": {\"n_ctx\": %lld, \"params\": {\"n_predict\": %d, "
                        "\"temperature\": %g, \"top_k\": %d, \"top_p\": %g, \"min_p\": %g, \"repeat_penalty\": %g}}, "
                        "\"total_slots\": %d, \"model_alias\": ",
                    (long long)ke_ctx_n_ctx(s->c), (int)g->n_predict, (double)g->temperature, (int)g->top_k, (double)g->top_p,
                    (double)g->min_p, (double)g->repeat_penalty, s->p.parallel);
    ksrv_buf_json_str(&b, s->model_id, strlen(s->model_id));
    ksrv_buf_str(&b, ", \"model_path\": ");
    ksrv_buf_json_str(&b, s->model_dir, strlen(s->model_dir));
    ksrv_buf_str(&b, ", \"chat_template\": ");
    const char *t = s->tmpl ? kchat_source(s->tmpl) : NULL;
    ksrv_buf_json_str(&b, t ? t : "", t ? strlen(t) : 0);
    ksrv_buf_printf(&b, ", \"modalities\": {\"vision\": %s}, \"media_marker\": \"" KSRV_MEDIA_MARKER "\", \"build_info\": \"kiln " KILN_VERSION "\"}",
                    ke_model_vision(s->m) ? "true" : "false");
    return reply_json(cs, 200, &b);
}

/* /slots (llama-server's): each of the --parallel places (ksch_slot_info):
 * whether a request runs on it, its latest request's id and prompt tokens,
 * the tokens it holds (what ?action=save would save of them is cached). */
static enum MHD_Result do_slots(conn_state *cs) {
    ksrv *s = cs->s;
    ksrv_buf b = {0};
    ksrv_buf_str(&b, "[");
    for (int i = 0; i < s->p.parallel; i++) {
        ksch_slot_info si = {0};
        if (s->sch) ksch_slot_get(s->sch, i, &si);
        ksrv_buf_printf(&b,
                        "%s{\"id\": %d, \"id_task\": %lld, \"n_ctx\": %lld, \"is_processing\": %s, "
                        "\"n_prompt_tokens\": %d, \"n_tokens\": %lld}",
                        i ? ", " : "", i, si.id_task ? (long long)si.id_task : -1ll, (long long)ke_ctx_n_ctx(s->c),
                        si.processing ? "true" : "false", (int)si.n_prompt, (long long)si.n_tokens);
    }
    ksrv_buf_str(&b, "]");
    return reply_json(cs, 200, &b);
}

/* /apply-template (llama-server's): {"messages": [...]} -> {"prompt": the
 * chat template's text}, through the chat request's own parsing. */
static enum MHD_Result do_apply_template(conn_state *cs, const cJSON *body) {
    cJSON *b = cJSON_IsObject(body) ? cJSON_Duplicate(body, true) : NULL;
    cJSON_DeleteItemFromObjectCaseSensitive(b, "stream");
    ksrv_job *j = NULL;
    ksrv_err e = k_bad;
    kiln_status st = b ? ksrv_job_parse(cs->s, b, true, &j, &e) : kiln_error(KILN_EINVAL, "request body: expected a JSON object");
    cJSON_Delete(b);
    if (st) return reply_status(cs, st, &e);
    ksrv_buf out = {0};
    ksrv_buf_str(&out, "{\"prompt\": ");
    ksrv_buf_json_str(&out, j->rendered ? j->rendered : "", j->rendered ? strlen(j->rendered) : 0);
    ksrv_buf_str(&out, "}");
    ksrv_job_free(j);
    return reply_json(cs, 200, &out);
}

/* /v1/messages/count_tokens: the prompt's tokens, nothing generated. */
static enum MHD_Result do_count_tokens(conn_state *cs, const cJSON *body) {
    cJSON *b = cJSON_IsObject(body) ? cJSON_Duplicate(body, true) : NULL;
    if (b && !cJSON_GetObjectItemCaseSensitive(b, "max_tokens")) cJSON_AddNumberToObject(b, "max_tokens", 1);
    cJSON_DeleteItemFromObjectCaseSensitive(b, "stream");
    ksrv_job *j = NULL;
    ksrv_err e = k_bad;
    kiln_status st = b ? ksrv_agent_parse(cs->s, b, KSRV_API_ANTHROPIC, &j, &e)
                       : kiln_error(KILN_EINVAL, "request body: expected a JSON object");
    cJSON_Delete(b);
    if (st) return reply_status(cs, st, &e);
    ksrv_buf out = {0};
    ksrv_buf_printf(&out, "{\"input_tokens\": %d}", (int)j->n_prompt[0]);
    ksrv_job_free(j);
    return reply_json(cs, 200, &out);
}

/* api 0: OpenAI completions (chat false) or chat; else an agent API. */
static enum MHD_Result do_completion(conn_state *cs, const cJSON *body, bool chat, ksrv_api api) {
    ksrv *s = cs->s;
    ksrv_job *j;
    ksrv_err e;
    /* llama-server's native endpoint: no length given is no limit there */
    bool llama = !chat && !api && !strcmp(cs->url, "/completion");
    cJSON *lb = NULL;
    if (llama && cJSON_IsObject(body) && !ku_json_get(body, "n_predict") && !ku_json_get(body, "max_tokens") &&
        (lb = cJSON_Duplicate(body, true)))
        cJSON_AddNumberToObject(lb, "n_predict", -1);
    kiln_status st = api ? ksrv_agent_parse(s, body, api, &j, &e) : ksrv_job_parse(s, lb ? lb : body, chat, &j, &e);
    cJSON_Delete(lb);
    if (!st && llama) {
        j->llama = true;
        st = ksrv_llama_check(j);
        if (st) ksrv_job_free(j), e = k_bad;
    }
    if (st) return reply_status(cs, st, &e);
    st = ksrv_job_submit(j, &e);
    if (st) {
        ksrv_job_free(j);
        return reply_status(cs, st, &e);
    }
    atomic_fetch_add(&s->in_flight, 1);
    cs->counted = true;
    if (j->stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, cs, NULL);
        if (!r) {
            ksrv_job_cancel_wait(j);
            ksrv_job_free(j);
            return MHD_NO;
        }
        cs->job = j;
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
        enum MHD_Result ret = MHD_queue_response(cs->conn, 200, r);
        MHD_destroy_response(r);
        cs->responded = true;
        access_log(cs, 200);
        return ret;
    }
    /* not streaming: wait here (this connection's own thread), watching for
     * the client leaving */
    enum MHD_Result ret = MHD_YES;
    bool done = false;
    while (!done && !(done = ksrv_job_finished(j))) {
        if (client_gone(cs)) {
            ret = MHD_NO;
            access_log(cs, 499);
            break;
        }
        if (atomic_load(&s->stopping)) { /* the grace period is over */
            cs->close_after = true;
            ret = reply_error(cs, 503, "unavailable_error", NULL, k_shutting_down);
            break;
        }
        ksrv_job_wait(j, 0.1);
    }
    if (done) {
        ksrv_buf b = {0};
        int status = ksrv_job_response(j, &b);
        ret = reply_json(cs, status, &b);
    } else {
        ksrv_job_cancel_wait(j);
    }
    ksrv_job_free(j);
    atomic_fetch_sub(&s->in_flight, 1);
    cs->counted = false;
    return ret;
}

/* ---------------------------------------------------------------- routing */

typedef enum {
    R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE,
    R_RESPONSES, R_MESSAGES, R_COUNT_TOKENS,
    R_VERSION, R_PROPS, R_SLOTS, R_APPLY_TEMPLATE, R_EMBEDDINGS, R_RERANK, R_EMBEDDING, R_POOLING, R_SLOT_ACTION
} route;

static route find_route(const char *url, bool *post) {
    static const struct {
        const char *path;
        route r;
        bool post;
    } t[] = {
        {"/health", R_HEALTH, false},          {"/v1/health", R_HEALTH, false},
        {"/metrics", R_METRICS, false},        {"/v1/models", R_MODELS, false},
        {"/models", R_MODELS, false},          {"/v1/completions", R_COMPLETIONS, true},
        {"/completions", R_COMPLETIONS, true}, {"/v1/chat/completions", R_CHAT, true},
        {"/chat/completions", R_CHAT, true},   {"/tokenize", R_TOKENIZE, true},
        {"/detokenize", R_DETOKENIZE, true},   {"/v1/responses", R_RESPONSES, true},
        {"/responses", R_RESPONSES, true},     {"/v1/messages", R_MESSAGES, true},
        {"/v1/messages/count_tokens", R_COUNT_TOKENS, true},
        {"/version", R_VERSION, false},
        {"/props", R_PROPS, false},
        {"/slots", R_SLOTS, false},
        {"/apply-template", R_APPLY_TEMPLATE, true},
        {"/completion", R_COMPLETIONS, true},
        {"/v1/embeddings", R_EMBEDDINGS, true}, {"/embeddings", R_EMBEDDINGS, true},
        {"/v1/rerank", R_RERANK, true},         {"/rerank", R_RERANK, true},         {"/v2/rerank", R_RERANK, true},
        {"/embedding", R_EMBEDDING, true},      {"/pooling", R_POOLING, true},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(url, t[i].path)) {
            *post = t[i].post;
            return t[i].r;
        }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *post = false;
        return R_MODEL;
    }
    if (!strncmp(url, "/slots/", 7) && url[7]) { /* llama-server's slot actions (slots.c) */
        *post = true;
        return R_SLOT_ACTION;
    }
    return R_NONE;
}

static enum MHD_Result dispatch(conn_state *cs, const char *url, const char *method) {
    ksrv *s = cs->s;
    set_busy(cs, true); /* the request is in: its deadline no longer applies */
    bool post = false;
    route r = find_route(url, &post);
    const char *page, *ctype;
    size_t page_len;
    if (r == R_NONE && !s->p.no_webui && ksrv_webui_asset(url, &page, &page_len, &ctype)) {
        if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
            char msg[256];
            snprintf(msg, sizeof msg, "%.200s takes GET, not %.16s", url, method);
            return reply_error(cs, 405, "invalid_request_error", NULL, msg);
        }
        return reply_page(cs, page, page_len, ctype);
    }
    if (r == R_NONE) {
        char msg[256];
        snprintf(msg, sizeof msg, "unknown endpoint %.16s %.200s", method, url);
        return reply_error(cs, 404, "not_found_error", NULL, msg);
    }
    if (strcmp(method, post ? "POST" : "GET") != 0 && !(!post && !strcmp(method, "HEAD"))) {
        char msg[256];
        snprintf(msg, sizeof msg, "%.200s takes %s, not %.16s", url, post ? "POST" : "GET", method);
        cs->allow_post = post;
        return reply_error(cs, 405, "invalid_request_error", NULL, msg);
    }
    if (atomic_load(&s->draining)) { /* ksrv_shutdown: no new work; /health says so */
        cs->close_after = true;
        if (r != R_METRICS) return reply_error(cs, 503, "unavailable_error", NULL, k_shutting_down);
    }
    if (r == R_HEALTH) return do_health(cs);
    if (r == R_METRICS) {
        if (!s->p.metrics)
            return reply_error(cs, 501, "not_supported_error", NULL,
                               "this server does not serve metrics (it was started with --no-metrics)");
        return do_metrics(cs);
    }
    if (!key_ok(s, cs->conn)) return reply_error(cs, 401, "authentication_error", "invalid_api_key", "invalid API key");
    if (cs->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %lld bytes", (long long)s->p.max_body);
        return reply_error(cs, 413, "invalid_request_error", "request_too_large", msg);
    }
    if (state_of(s, NULL) != KSRV_READY) return reply_error(cs, 503, "unavailable_error", NULL, "Loading model");
    if (r == R_VERSION) return do_version(cs);
    if (r == R_PROPS) return do_props(cs);
    if (r == R_SLOTS) return do_slots(cs);
    if (r == R_MODELS) return do_models(cs, NULL);
    if (r == R_MODEL) return do_models(cs, url + 11);
    cJSON *body = NULL;
    kiln_status st = r == R_SLOT_ACTION && !cs->body.len ? NULL : parse_json(cs, &body); /* erase takes no body */
    if (st) return reply_status(cs, st, &k_bad);
    enum MHD_Result ret;
    if (r == R_SLOT_ACTION && !s->emb) {
        ksrv_buf b = {0};
        const char *action = MHD_lookup_connection_value(cs->conn, MHD_GET_ARGUMENT_KIND, "action");
        ret = reply_json(cs, ksrv_slot_action(s, url + 7, action, body, &b), &b);
    } else if (r == R_EMBEDDINGS || r == R_RERANK || r == R_EMBEDDING || r == R_POOLING) {
        ksrv_buf b = {0};
        int code = r == R_RERANK ? ksrv_rerank(s, body, &b)
                                 : ksrv_embeddings(s, body, &b, r == R_EMBEDDING ? KSRV_EMBED_LLAMA : r == R_POOLING ? KSRV_EMBED_POOLING : KSRV_EMBED_OPENAI);
        ret = reply_json(cs, code, &b);
    } else if (s->emb && r != R_TOKENIZE && r != R_DETOKENIZE)
        ret = reply_error(cs, 400, "invalid_request_error", NULL,
                          "this server serves an embedding / reranking model: /v1/embeddings, /v1/rerank");
    else if (r == R_TOKENIZE) ret = do_tokenize(cs, body);
    else if (r == R_DETOKENIZE) ret = do_detokenize(cs, body);
    else if (r == R_COUNT_TOKENS) ret = do_count_tokens(cs, body);
    else if (r == R_APPLY_TEMPLATE) ret = do_apply_template(cs, body);
    else if (r == R_RESPONSES) ret = do_completion(cs, body, true, KSRV_API_RESPONSES);
    else if (r == R_MESSAGES) ret = do_completion(cs, body, true, KSRV_API_ANTHROPIC);
    else ret = do_completion(cs, body, r == R_CHAT, 0);
    cJSON_Delete(body);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ptr) {
    (void)version;
    ksrv *s = cls;
    conn_state *cs = *ptr;
    if (!cs) { /* headers are in; the body (if any) follows */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        cs->s = s;
        cs->conn = conn;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        cs->watch = ci ? ci->socket_context : NULL;
        cs->t0 = ksrv_now();
        snprintf(cs->method, sizeof cs->method, "%s", method);
        snprintf(cs->url, sizeof cs->url, "%s", url);
        *ptr = cs;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            errno = 0;
            char *end;
            unsigned long long n = strtoull(cl, &end, 10);
            if (errno || end == cl || n > (unsigned long long)s->p.max_body) {
                cs->too_big = true;
                bool post = false;
                if (find_route(url, &post) != R_NONE && key_ok(s, conn)) { /* refuse before reading it */
                    char msg[128];
                    snprintf(msg, sizeof msg, "the request body is larger than %lld bytes", (long long)s->p.max_body);
                    return reply_error(cs, 413, "invalid_request_error", "request_too_large", msg);
                }
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!cs->too_big && !cs->responded) {
            if (cs->body.len + *upload_size > (size_t)s->p.max_body) {
                cs->too_big = true;
                ksrv_buf_free(&cs->body);
            } else {
                ksrv_buf_add(&cs->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->responded) return MHD_YES;
    if (cs->body.oom) return reply_error(cs, 500, "server_error", NULL, "out of memory");
    return dispatch(cs, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **ptr, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)conn, (void)toe;
    conn_state *cs = *ptr;
    if (!cs) return;
    if (cs->job) {
        ksrv_job_cancel_wait(cs->job); /* no-op when it ended */
        ksrv_job_free(cs->job);
    }
    if (cs->counted) atomic_fetch_sub(&cs->s->in_flight, 1);
    set_busy(cs, false); /* the next request's deadline counts from here */
    ksrv_buf_free(&cs->body);
    free(cs);
    *ptr = NULL;
}

/* ---------------------------------------------------------------- slow clients */

/* MHD's own timeout is an idle timeout, which a client resets with a byte
 * every few seconds. The reaper bounds the time a request's headers and
 * body take to arrive instead: --request-timeout from the connection's
 * opening (or its previous response's end), and under pressure (more than
 * 3/4 of --max-conns open) KSRV_SHED_S, so a /health or /metrics request
 * (which arrives in one packet) still gets a place. A connection past its
 * deadline is shut down; MHD then closes it. */
#define KSRV_SHED_S 1.0

static void on_connection(void *cls, struct MHD_Connection *conn, void **ctx, enum MHD_ConnectionNotificationCode toe) {
    ksrv *s = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_watch *w = ci ? calloc(1, sizeof *w) : NULL;
        if (!w) return; /* not watched: MHD's idle timeout still applies */
        w->fd = ci->connect_fd;
        w->t_wait = ksrv_now();
        pthread_mutex_lock(&s->watch_mu);
        w->next = s->watch;
        if (s->watch) s->watch->prev = w;
        s->watch = w;
        s->n_conns++;
        pthread_mutex_unlock(&s->watch_mu);
        *ctx = w;
        return;
    }
    conn_watch *w = *ctx; /* closed: MHD closes the socket after this returns */
    if (!w) return;
    pthread_mutex_lock(&s->watch_mu);
    if (w->prev) w->prev->next = w->next;
    else s->watch = w->next;
    if (w->next) w->next->prev = w->prev;
    s->n_conns--;
    pthread_mutex_unlock(&s->watch_mu);
    free(w);
    *ctx = NULL;
}

static void *reaper_main(void *arg) {
    ksrv *s = arg;
    pthread_mutex_lock(&s->watch_mu);
    while (!s->reaper_stop) {
        double now = ksrv_now();
        bool pressure = s->n_conns * 4 > s->p.max_conns * 3;
        double limit = pressure && KSRV_SHED_S < s->p.request_timeout_s ? KSRV_SHED_S : s->p.request_timeout_s;
        for (conn_watch *w = s->watch; w; w = w->next)
            if (!w->busy && !w->cut && now - w->t_wait > limit) {
                shutdown(w->fd, SHUT_RDWR);
                w->cut = true;
                s->n_cut++;
            }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->reaper_cv, &s->watch_mu, &ts);
    }
    pthread_mutex_unlock(&s->watch_mu);
    return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

static void *step_main(void *arg) {
    ksrv *s = arg;
    while (ksch_wait(s->sch)) {
        ksch_step(s->sch);
        if (s->p.step_delay_us > 0) usleep((useconds_t)s->p.step_delay_us);
    }
    return NULL;
}

/* The context every process of the job creates alike (ksrv_follow). */
static ke_ctx_params ctx_params(const ksrv_params *p, const ke_model *m) {
    ke_ctx_params cp = {.n_ctx = p->ctx_size, .n_threads = p->threads, .block_size = p->block_size};
    if (cp.n_ctx <= 0) {
        int64_t mp = ke_model_hparams(m)->max_pos;
        cp.n_ctx = mp > 0 && mp < 4096 ? mp : 4096;
    }
    int parallel = p->parallel > 0 ? p->parallel : 8;
    cp.n_cache = p->kv_tokens > 0 ? p->kv_tokens : cp.n_ctx * parallel;
    cp.n_seq_max = parallel; /* recurrent state rows: one per running sequence */
    cp.state_cache_bytes = p->state_cache_bytes;
    cp.cache_dir = p->cache_dir;
    cp.cache_dir_bytes = p->cache_dir_bytes;
    cp.cache_type_k = (kg_dtype)p->cache_type_k, cp.cache_type_v = (kg_dtype)p->cache_type_v;
    return cp;
}

kiln_status ksrv_tp_supported(const ksrv_params *p) {
    const kspec_params *sp = p->spec;
    const char *what = p->embed_mode || p->pooling || ksrv_embed_folder(p->model_dir) ? "embedding and reranking models are"
                       : sp && sp->mtp                                          ? "--spec-mtp is"
                                                                                : NULL;
    return what ? kiln_error(KILN_EUNSUPPORTED, "serve --tp: %s not supported with tensor parallelism yet", what) : NULL;
}

kiln_status ksrv_follow(const ksrv_params *p) {
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    KILN_TRYF(ke_model_load(p->model_dir, &m), "loading %s", p->model_dir);
    ke_ctx_params cp = ctx_params(p, m);
    kiln_status st = ke_ctx_create(m, &cp, &c);
    if (!st) st = ke_ctx_follow(c);
    ke_ctx_free(c);
    ke_model_free(m);
    if (!st) { /* rank 0 ended the context (ksrv_tp_end): it waits for this one's disk tier to be written */
        char done = 1, *all = malloc((size_t)kd_size());
        if (all) kd_all_gather(&done, 1, all);
        free(all);
    }
    return st;
}

bool ksrv_tp_end(ksrv *s, int ms) {
    if (!s->stepper_started || !s->c) return false;
    ksch_stop(s->sch);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000, ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    if (pthread_timedjoin_np(s->stepper, NULL, &ts)) return false; /* a step that will not finish: a process is gone */
    s->stepper_started = false;
    ke_ctx_free(s->c); /* the followers return (and write their disk tiers), then this process writes its own */
    s->c = NULL;
    char done = 1, *all = malloc((size_t)kd_size());
    if (all) kd_all_gather(&done, 1, all); /* theirs written too (ksrv_follow): mpirun may kill them once this one exits */
    free(all);
    return true;
}

void ksrv_lost(ksrv *s) {
    atomic_store(&s->lost, true);
    atomic_store(&s->draining, true);
    atomic_store(&s->stopping, true);
}

static kiln_status load(ksrv *s) {
    if (s->p.embed_mode || ksrv_embed_folder(s->model_dir)) return ksrv_embed_load(s); /* embeddings / reranking (embed.c) */
    if (s->p.pooling)
        return kiln_error(KILN_EINVAL, "--pooling: %s is not an embedding folder (no modules.json); serve it with --embeddings", s->model_dir);
    KILN_TRY(ke_model_load(s->model_dir, &s->m));
    kiln_status st = ktok_load(s->model_dir, &s->tok);
    if (st && kiln_status_code(st) != KILN_ENOTFOUND) return st; /* a broken tokenizer is an error; none is fine */
    kiln_status_free(st);
    if (s->tok) {
        st = kchat_load(s->model_dir, &s->tmpl);
        if (st && kiln_status_code(st) != KILN_ENOTFOUND) return st;
        kiln_status_free(st);
    }
    KILN_TRY(kc_eos_ids(ke_model_checkpoint(s->m), s->eos, 16, &s->n_eos));
    ke_ctx_params cp = ctx_params(&s->p, s->m);
    KILN_TRY(ke_ctx_create(s->m, &cp, &s->c));
    ke_ctx_lead(s->c); /* --tp: the other processes follow this context (ksrv_follow) */
    /* --tp/--pp: the draft model is rank 0's alone, whole (its context solo:
     * engine.h); its guesses reach the others in the target's steps */
    st = NULL;
    if (kd_size() > 1) kd_solo_begin();
    if (s->p.spec && s->p.spec->draft) st = kspec_load_draft(s->p.spec->draft, s->m, s->model_dir, &s->draft);
    if (!st && s->p.spec && kspec_enabled(s->p.spec)) st = kspec_create(s->p.spec, s->c, s->draft, &s->spec);
    if (kd_size() > 1) kd_solo_end();
    if (st) return st;
    ksch_params sp = {.max_running = s->p.parallel,
                      .max_waiting = s->p.max_queue,
                      .step_tokens = s->p.step_tokens,
                      .prefix_cache = !s->p.no_prefix_cache,
                      .tok = s->tok,
                      .eos_ids = s->eos,
                      .n_eos = s->n_eos,
                      .spec = s->spec};
    KILN_TRY(ksch_create(s->c, &sp, &s->sch));
    if (pthread_create(&s->stepper, NULL, step_main, s)) return kiln_error(KILN_EIO, "cannot start the scheduler thread");
    s->stepper_started = true;
    return NULL;
}

static void *load_main(void *arg) {
    ksrv *s = arg;
    if (s->p.load_delay_ms > 0) usleep((useconds_t)s->p.load_delay_ms * 1000);
    kiln_status st = load(s);
    if (st) st = kiln_status_wrap(st, "loading %s", s->model_dir);
    pthread_mutex_lock(&s->mu);
    s->state = st ? KSRV_FAILED : KSRV_READY;
    s->load_err = st;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

/* the format attribute: clang's -Wformat-nonliteral (make fuzz) */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap) {
    ksrv *s = cls;
    if (s->p.quiet) return;
    fprintf(stderr, "kiln: http: ");
    vfprintf(stderr, fmt, ap);
}

kiln_status ksrv_start(const ksrv_params *p, ksrv **out) {
    *out = NULL;
    ksrv *s = calloc(1, sizeof *s);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    s->p = *p;
    if (s->p.parallel <= 0) s->p.parallel = 8;
    if (s->p.max_queue <= 0) s->p.max_queue = 256;
    if (s->p.max_body <= 0) s->p.max_body = 2 << 20;
    if (s->p.timeout_s <= 0) s->p.timeout_s = 60;
    if (s->p.max_choices <= 0) s->p.max_choices = 64;
    if (s->p.max_conns <= 0) s->p.max_conns = 1000;
    if (s->p.max_conns_per_ip == 0) s->p.max_conns_per_ip = 256;
    if (s->p.request_timeout_s <= 0) s->p.request_timeout_s = 30;
    if (s->p.max_image_pixels <= 0) s->p.max_image_pixels = 1ll << 26;
    if (s->p.max_request_pixels <= 0) s->p.max_request_pixels = 1ll << 28;
    if (s->p.max_image_bytes <= 0) s->p.max_image_bytes = 20 << 20;
    if (s->p.max_images == 0 || s->p.max_images > KSRV_MAX_IMAGES) s->p.max_images = KSRV_MAX_IMAGES;
    if (s->p.max_videos == 0 || s->p.max_videos > KSRV_MAX_IMAGES) s->p.max_videos = KSRV_MAX_IMAGES;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->watch_mu, NULL);
    pthread_mutex_init(&s->decode_mu, NULL);
    pthread_cond_init(&s->decode_cv, NULL);
    pthread_cond_init(&s->reaper_cv, NULL);
    pthread_mutex_init(&s->vis_mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->created = (long)time(NULL);
    s->model_dir = dup_or_null(p->model_dir);
    s->host = strdup(p->host ? p->host : "127.0.0.1");
    s->api_key = p->api_key && *p->api_key ? strdup(p->api_key) : NULL;
    const char *id = p->alias;
    if (!id && p->model_dir) {
        const char *slash = strrchr(p->model_dir, '/');
        id = slash && slash[1] ? slash + 1 : p->model_dir;
    }
    s->model_id = dup_or_null(id);
    s->met = ksrv_metrics_create();
    kiln_status st = kgen_params_init(&s->defaults);
    if (!st && p->defaults) {
        kgen_params_free(&s->defaults);
        st = kgen_params_copy(&s->defaults, p->defaults);
    }
    if (!st && (!s->model_dir || !s->host || !s->model_id || !s->met || (p->api_key && *p->api_key && !s->api_key)))
        st = kiln_error(KILN_ENOMEM, "out of memory");
    if (st) {
        ksrv_stop(s);
        return st;
    }
    /* the address */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai || !ai) {
        st = kiln_error(KILN_EINVAL, "--host %s: %s", s->host, gai ? gai_strerror(gai) : "no address");
        ksrv_stop(s);
        return st;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG |
                     MHD_USE_ITC; /* MHD_quiesce_daemon */
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)p->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
                            MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->p.timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)s->p.max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(s->p.max_conns_per_ip > 0 ? s->p.max_conns_per_ip : 0),
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        st = kiln_error(KILN_EIO, "cannot listen on %s:%d: %s", s->host, p->port, strerror(errno));
        ksrv_stop(s);
        return st;
    }
    if (pthread_create(&s->reaper, NULL, reaper_main, s)) {
        ksrv_stop(s);
        return kiln_error(KILN_EIO, "cannot start the connection reaper thread");
    }
    s->reaper_started = true;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : p->port;
    if (pthread_create(&s->loader, NULL, load_main, s)) {
        ksrv_stop(s);
        return kiln_error(KILN_EIO, "cannot start the loading thread");
    }
    s->loader_started = true;
    *out = s;
    return NULL;
}

int ksrv_port(const ksrv *s) { return s->port; }

bool ksrv_loading(ksrv *s) { return state_of(s, NULL) == KSRV_LOADING; }

kiln_status ksrv_wait_ready(ksrv *s) {
    pthread_mutex_lock(&s->mu);
    while (s->state == KSRV_LOADING) pthread_cond_wait(&s->cv, &s->mu);
    kiln_status st = s->state == KSRV_FAILED ? kiln_error(kiln_status_code(s->load_err), "%s", kiln_status_msg(s->load_err))
                                             : NULL;
    pthread_mutex_unlock(&s->mu);
    return st;
}

void ksrv_load(ksrv *s, int64_t *blocks_used, int64_t *requests) {
    *blocks_used = *requests = 0;
    if (state_of(s, NULL) != KSRV_READY || !s->sch) return;
    ksch_stats st;
    ksch_get_stats(s->sch, &st);
    *blocks_used = st.cache.n_used;
    *requests = st.running + st.waiting;
}

static void wait_in_flight(ksrv *s, double until) {
    while (atomic_load(&s->in_flight) > 0 && ksrv_now() < until) usleep(10000);
}

void ksrv_shutdown(ksrv *s, double grace_s) {
    if (!s || atomic_exchange(&s->draining, true)) return;
    if (s->d) { /* refuse new connections; the open ones get 503 */
        MHD_socket fd = MHD_quiesce_daemon(s->d);
        if (fd != MHD_INVALID_SOCKET) close(fd);
    }
    wait_in_flight(s, ksrv_now() + (grace_s > 0 ? grace_s : 0));
    /* the rest: streams end with an error event, the others get 503; the
     * connection threads write those within a step */
    atomic_store(&s->stopping, true);
    wait_in_flight(s, ksrv_now() + 2);
}

void ksrv_stop(ksrv *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    /* connections first: their requests are cancelled through the
     * scheduler, which still runs */
    if (s->reaper_started) {
        pthread_mutex_lock(&s->watch_mu);
        s->reaper_stop = true;
        pthread_cond_signal(&s->reaper_cv);
        pthread_mutex_unlock(&s->watch_mu);
        pthread_join(s->reaper, NULL);
    }
    if (s->d) MHD_stop_daemon(s->d);
    if (s->loader_started) pthread_join(s->loader, NULL);
    if (s->stepper_started) {
        ksch_stop(s->sch);
        pthread_join(s->stepper, NULL);
    }
    ksch_destroy(s->sch);
    kspec_destroy(s->spec);
    ke_model_free(s->draft);
    ke_ctx_free(s->c);
    kchat_free(s->tmpl);
    ksrv_embed_free(s);
    ktok_free(s->tok);
    ke_model_free(s->m);
    kiln_status_free(s->load_err);
    kgen_params_free(&s->defaults);
    ksrv_metrics_destroy(s->met);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->vis_mu);
    pthread_mutex_destroy(&s->watch_mu);
    pthread_mutex_destroy(&s->decode_mu);
    pthread_cond_destroy(&s->decode_cv);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->reaper_cv);
    free(s->model_dir), free(s->model_id), free(s->host), free(s->api_key);
    free(s);
}
