/* server.h: the OpenAI-compatible HTTP server of `kiln serve` (prefix ksrv_).
 *
 * libmicrohttpd, one thread per connection; one scheduler thread runs the
 * continuous batch (batch/sched.h) that every request's sequences join.
 * Endpoints:
 *   POST /v1/completions, /v1/chat/completions   (also without /v1; chat with
 *        tools and reasoning: tools.c)
 *   POST /v1/responses (responses.c), /v1/messages and
 *        /v1/messages/count_tokens (anthropic.c; Anthropic's error shape,
 *        x-api-key accepted)
 *   GET  /v1/models, /health (503 while the model loads), /metrics
 *   POST /tokenize, /detokenize
 *   GET  /version, /props, /slots; POST /apply-template, /completion
 *        (llama-server's; llama.c)
 *   POST /v1/embeddings, /embedding, /pooling, /v1/rerank, /rerank,
 *        /v2/rerank for an embedding or reranking folder, or embed_mode
 *        (embed.c)
 *   GET  /, /webui/...: the browser chat page (webui.c; off with no_webui)
 * Streaming is SSE (`data: {json}` events, then `data: [DONE]`). Errors are
 * OpenAI error objects {"error": {message, type, param, code}} with the
 * HTTP status: 400 bad request (naming the field), 401 missing or wrong API
 * key, 404 unknown route or model, 405 wrong method, 413 body too large,
 * 503 loading or queue full. A client that disconnects cancels its
 * sequences, which frees their KV blocks.
 *
 * With an API key, every route but /health and /metrics needs
 * "Authorization: Bearer KEY". */
#ifndef KILN_SERVER_H
#define KILN_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "gen/params.h"
#include "spec/spec.h"

typedef struct {
    const char *model_dir;
    const char *alias;     /* model id in responses; NULL: the folder's name */
    bool any_model;        /* accept any "model" in requests (llama-server's behaviour) */
    const char *host;      /* NULL: 127.0.0.1 */
    int port;              /* 0: any free port (see ksrv_port) */
    int parallel;          /* sequences decoding at once; 0: 8 */
    int64_t ctx_size;      /* tokens per sequence; 0: the model's, at most 4096 */
    int64_t kv_tokens;     /* KV cache tokens shared by all sequences; 0: ctx_size * parallel */
    int64_t state_cache_bytes; /* recurrent-state snapshots for prefix caching (ke_ctx_params); 0: default, < 0: none */
    int block_size;        /* tokens per KV block; 0: 16 */
    int step_tokens;       /* tokens per engine step; 0: 256 */
    int max_queue;         /* waiting requests before 503; 0: 256 */
    int threads;           /* engine threads; 0: all CPUs */
    const char *api_key;   /* NULL: no key */
    bool metrics;          /* serve /metrics */
    bool no_webui;         /* --no-webui: no chat page at / (webui.c) */
    bool no_prefix_cache;
    int64_t max_body;      /* request body bytes; 0: 2 MiB */
    int timeout_s;         /* idle connection timeout; 0: 60 */
    int request_timeout_s; /* a request's headers and body arrive within this; 0: 30 */
    int max_conns;         /* open connections; 0: 1000 */
    int max_conns_per_ip;  /* open connections per client address; 0: 256, < 0: no limit */
    int max_choices;       /* prompts x n per request; 0: 64 */
    int64_t max_image_pixels; /* an image's declared width x height; 0: 2^26 (8192 x 8192) */
    int64_t max_request_pixels; /* the declared width x height of a request's images and video frames together; 0: 2^28 */
    int64_t max_image_bytes;  /* an image's (a frame's) encoded bytes, from its data URL; 0: 20 MiB */
    int max_images, max_videos; /* image / video parts per request (--limit-mm-per-prompt); 0: 16, < 0: none */
    const kgen_params *defaults; /* sampling defaults (NULL: llama.cpp's); copied */
    bool quiet;            /* no access log on stderr */
    bool reasoning_none;   /* --reasoning-format none: thinking blocks stay in content */
    bool no_thinking;      /* --reasoning-budget 0: templates get enable_thinking false */
    int32_t think_budget;  /* --reasoning-budget N > 0: thinking ends after N tokens; 0: no limit */
    int load_delay_ms;     /* tests: wait this long before loading (to see the loading state) */
    int step_delay_us;     /* tests: pause after each engine step (slow generations on tiny models) */
    const kspec_params *spec; /* speculative decoding for every request (borrowed), NULL or none enabled: off */
    int embed_mode;        /* 0: from the folder; KSRV_EMBEDDINGS / KSRV_RERANK: serve it as that (embed.c) */
    const char *pooling;   /* --pooling cls|mean|max|last|none of embeddings; NULL: the model's */
    const char *cache_dir; /* --cache-dir: the prefix cache's disk tier (ke_ctx_params); NULL: none */
    int64_t cache_dir_bytes; /* --cache-dir-size; 0: 10 GiB */
    int cache_type_k, cache_type_v; /* --cache-type-k/-v: the KV cache's kg_dtype (ke_ctx_params); 0: f32 */
    const char *slot_save_path; /* --slot-save-path: POST /slots/{id}?action=save|restore files; NULL: refused (501) */
} ksrv_params;

enum { KSRV_EMBEDDINGS = 1, KSRV_RERANK = 2 };

typedef struct ksrv ksrv;

/* Listens at once and loads the model in the background (/health answers
 * 503 until it is ready). Fails if the address cannot be bound. */
kiln_status ksrv_start(const ksrv_params *p, ksrv **out);
/* The port listened on. */
int ksrv_port(const ksrv *s);
/* Blocks until the model is loaded (NULL) or failed to load (the error;
 * the server keeps answering 503). */
kiln_status ksrv_wait_ready(ksrv *s);
/* Whether the model is still loading (does not block). */
bool ksrv_loading(ksrv *s);
/* Graceful stop (SIGTERM): refuses new connections and answers new requests
 * on open ones with 503, lets running requests finish for grace_s seconds,
 * then ends the remaining streams with an error event and answers the
 * other requests with 503. Returns when every request was answered (or 2 s
 * after the grace period). ksrv_stop still frees the server. */
void ksrv_shutdown(ksrv *s, double grace_s);
/* Stops listening, ends every request, frees everything. */
void ksrv_stop(ksrv *s);
/* Tensor parallelism (mpirun -np N kiln serve --tp N): the processes other
 * than rank 0 run this instead of a server: the model and the context
 * ksrv_start would create from p, following rank 0's (ke_ctx_follow) until
 * its context is freed. */
kiln_status ksrv_follow(const ksrv_params *p);
/* NULL when p can be served under --tp (a generating model without an MTP
 * head: what ksrv_follow mirrors), else the error naming what cannot. A
 * draft model runs whole on rank 0 alone; the disk tier and slot files are
 * kept per process, each its shard (engine.h). Every process checks alike. */
kiln_status ksrv_tp_supported(const ksrv_params *p);
/* The job lost a process (its steps will never finish): every request now
 * and in flight gets 503 without waiting on the scheduler, and the caller
 * exits; the server is not stopped or freed (its threads may be blocked). */
void ksrv_lost(ksrv *s);
/* Then, within ms milliseconds: the scheduler stopped after its step in
 * flight and the context freed, which ends the followers (ksrv_follow
 * returns) and writes every process's disk tier (--cache-dir); false,
 * leaving all as it was, when the step does not finish by then (a process
 * is gone). The caller exits either way. */
bool ksrv_tp_end(ksrv *s, int ms);

/* --limit-mm-per-prompt as vLLM takes it, {"image": N, "video": M} (a count
 * or {"count": N}), or image=N,video=M, into p->max_images / max_videos for
 * the keys given (0 becomes -1: none); counts above 16 and other
 * modalities (but with 0) are errors naming the key. */
kiln_status ksrv_mm_limits_parse(const char *v, int *images, int *videos);

/* KV blocks in use and requests running + waiting, for tests. */
void ksrv_load(ksrv *s, int64_t *blocks_used, int64_t *requests);

#endif
