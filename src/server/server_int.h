/* server_int.h: internals shared by the server's files (see server.h). */
#ifndef KILN_SERVER_INT_H
#define KILN_SERVER_INT_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>

#include "batch/sched.h"
#include "chat/chat.h"
#include "engine/engine.h"
#include "server/server.h"
#include "tokenizer/tokenizer.h"
#include "tools/toolcall.h"
#include "vision/vision.h"

/* log-probability entries a non-streamed response may hold (choices x tokens x
 * (1 + alternatives)): ~100 bytes of JSON each */
#define KSRV_MAX_LOGPROB_ENTRIES (1 << 20)

/* ---- a growable byte buffer; out of memory sticks in .oom ---- */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} ksrv_buf;
void ksrv_buf_add(ksrv_buf *b, const char *s, size_t n);
void ksrv_buf_str(ksrv_buf *b, const char *s);
void ksrv_buf_printf(ksrv_buf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
/* s as a JSON string literal (quotes included). */
void ksrv_buf_json_str(ksrv_buf *b, const char *s, size_t n);
void ksrv_buf_free(ksrv_buf *b);

/* Length of the longest prefix of s[0..n) that is valid UTF-8. */
size_t ksrv_utf8_valid_prefix(const char *s, size_t n);

double ksrv_now(void); /* monotonic seconds */

/* s for a log line (out: cap bytes, cut to fit): control characters, ' ',
 * '\\' and non-ASCII bytes as \xNN, so that a client cannot forge lines
 * (MHD percent-decodes the URL). */
void ksrv_log_escape(const char *s, char *out, size_t cap);

/* ---- metrics (metrics.c) ---- */
typedef struct ksrv_metrics ksrv_metrics;
ksrv_metrics *ksrv_metrics_create(void);
void ksrv_metrics_destroy(ksrv_metrics *m);
void ksrv_metrics_first_token(ksrv_metrics *m, double ttft);
void ksrv_metrics_token(ksrv_metrics *m, double itl);
/* A sequence ended: finish reason ("stop", "length") or NULL when cancelled
 * (aborted) or failed. */
void ksrv_metrics_end(ksrv_metrics *m, const char *reason, bool cancelled, double e2e, int32_t n_prompt,
                      int32_t n_generated);
void ksrv_metrics_http(ksrv_metrics *m, int status);
/* The Prometheus text exposition (format 0.0.4). */
void ksrv_metrics_render(ksrv_metrics *m, const ksch_stats *st, bool ready, ksrv_buf *out);

/* ---- the server ---- */
enum { KSRV_LOADING, KSRV_READY, KSRV_FAILED };

struct ksrv {
    ksrv_params p;
    char *model_dir, *model_id, *host, *api_key;
    struct MHD_Daemon *d;
    int port;
    pthread_t loader, stepper;
    bool loader_started, stepper_started;
    pthread_mutex_t mu; /* state, load_err */
    pthread_mutex_t vis_mu; /* one vision tower run at a time */
    pthread_mutex_t decode_mu; /* n_decoding */
    pthread_cond_t decode_cv;
    int n_decoding; /* images being decoded (at most KSRV_DECODE_SLOTS) */
    pthread_cond_t cv;
    int state;
    kiln_status load_err;
    atomic_bool stopping;  /* ksrv_stop, or ksrv_shutdown's grace period is over */
    atomic_bool draining;  /* ksrv_shutdown: no new requests */
    atomic_bool lost;      /* ksrv_lost: a process of the job is gone; steps never end, nothing waits for them */
    atomic_int in_flight;  /* completion requests submitted and not yet answered */
    /* open connections, for the reaper (server.c, slow clients) */
    pthread_mutex_t watch_mu; /* watch, n_conns, n_cut, reaper_stop */
    pthread_cond_t reaper_cv;
    struct conn_watch *watch;
    int n_conns;
    int64_t n_cut; /* connections shut down for missing a deadline */
    bool reaper_stop, reaper_started;
    pthread_t reaper;
    ke_model *m;
    ke_ctx *c;
    ke_model *draft;    /* --model-draft, NULL: none */
    struct kspec *spec; /* speculative decoding (ksrv_params.spec), NULL: none */
    ktok *tok;             /* NULL: no tokenizer (token ids only) */
    kchat_template *tmpl;  /* NULL: no chat template */
    ksch *sch;
    int32_t eos[16];
    int n_eos;
    kgen_params defaults;
    ksrv_metrics *met;
    long created; /* unix time the server started */
    /* an embedding / reranking folder (embed.c): served instead of generation (m, c, sch NULL) */
    struct kemb_model *emb;
    ke_ctx *emb_c;
    pthread_mutex_t emb_mu; /* one request on emb_c at a time */
    int emb_pooling;        /* a kemb_pooling: --pooling, else KEMB_POOL_DEFAULT (the model's) */
    int32_t emb_yes, emb_no; /* a decoder reranker's "yes" / "no" ids */
};

/* ---- /v1/embeddings, /v1/rerank (embed.c) */
/* True for a folder of an embedding model (modules.json) or a cross-encoder. */
bool ksrv_embed_folder(const char *dir);
kiln_status ksrv_embed_load(ksrv *s);
void ksrv_embed_free(ksrv *s);
/* Each answers a request body: the HTTP status, the JSON (or the error) in out. */
/* The API whose shape an embeddings request and reply take: OpenAI's
 * /v1/embeddings, llama.cpp's /embedding (content, embd_normalize; a list of
 * {index, embedding: [[...]]}), vLLM's /pooling ({data: [{object: pooling,
 * data}]}). With --pooling none, /embedding and /pooling give every token's
 * vector. */
typedef enum { KSRV_EMBED_OPENAI, KSRV_EMBED_LLAMA, KSRV_EMBED_POOLING } ksrv_embed_api;
int ksrv_embeddings(ksrv *s, const cJSON *body, ksrv_buf *out, ksrv_embed_api api);
/* POST /slots/{id_str}?action= (slots.c): the answer in *out, returns the HTTP status. */
int ksrv_slot_action(ksrv *s, const char *id_str, const char *action, const cJSON *body, ksrv_buf *out);
int ksrv_rerank(ksrv *s, const cJSON *body, ksrv_buf *out);
/* POST /tokenize and /detokenize (tokenize.c): the answer in *out, returns the HTTP status. */
int ksrv_tokenize(ksrv *s, const cJSON *body, ksrv_buf *out);
int ksrv_detokenize(ksrv *s, const cJSON *body, ksrv_buf *out);

/* ---- images in chat messages (image.c) ---- */
enum { KSRV_MAX_IMAGES = 16, KSRV_DECODE_SLOTS = 2 /* images decoded at once */, KSRV_MAX_FRAMES = 128 /* of one video */ };
typedef struct {
    int n, n_images, n_videos; /* px's entries; of them images, videos (--limit-mm-per-prompt) */
    int64_t pixels;            /* declared width x height of every image and frame so far (--max-request-pixels) */
    kvis_pixels px[KSRV_MAX_IMAGES];
    float *feat, *deep; /* the towers' rows, concatenated */
    kvis_inputs vx;
    ke_inputs x; /* the prompt's per-token inputs (ksch_request.inputs) */
} ksrv_images;
/* RFC 4648 base64 ('-' '_' too; whitespace ignored). *out malloc'ed. */
kiln_status ksrv_base64_decode(const char *s, size_t n, uint8_t **out, size_t *n_out);
/* A data URL u[n] of a PNG, JPEG, WebP or GIF image in base64
 * (data:image/png;base64,...): *payload the base64 text within u (borrowed),
 * else an error naming w (another scheme or media type, a video file, no
 * ;base64). */
kiln_status ksrv_data_url_parse(const char *u, size_t n, const char *w, const char **payload, size_t *n_payload);
/* An {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}
 * part (what names it in errors): decoded and preprocessed into im. */
kiln_status ksrv_images_add(ksrv *s, ksrv_images *im, const cJSON *part, const char *what);
/* A video part (Qwen2-VL / 2.5-VL), its frames as image data URLs:
 * {"type": "video", "video": [urls]} or {"type": "video_url", "video_url":
 * {"url": [urls]}}; a video file (data:video/mp4) is an error naming that form. */
kiln_status ksrv_videos_add(ksrv *s, ksrv_images *im, const cJSON *part, const char *what);
/* The rendered prompt *ids[*n] (replaced): placeholders expanded, the
 * vision tower run per image, im->x filled. */
kiln_status ksrv_images_apply(ksrv *s, ksrv_images *im, const char *what, int32_t **ids, int32_t *n);
/* llama-server's multimodal_data item (what names it): an image file in
 * base64 (a data: URL is taken too), decoded and preprocessed into im. */
kiln_status ksrv_images_add_base64(ksrv *s, ksrv_images *im, const char *data, const char *what);
/* The marker a multimodal prompt_string holds per multimodal_data item (llama.cpp's mtmd_default_marker). */
#define KSRV_MEDIA_MARKER "<__media__>"
void ksrv_images_free(ksrv_images *im); /* and im itself (calloc'ed) */

/* ---- OpenAI requests (oai.c) ---- */

/* One event of one choice, copied out of the scheduler's callback. */
typedef struct {
    int choice;
    bool end;
    int32_t token;
    char *text;
    size_t len;
    kgen_finish finish;
    bool has_lp;
    float logprob;
    kgen_logprob *top;
    int n_top;
    bool cancelled;
    char *error;
    int32_t n_generated, n_cached;
    bool prompt; /* a prompt token's log-probability (echo with logprobs), before the choice's tokens */
} ksrv_ev;

typedef struct ksrv_job ksrv_job;
typedef struct ksrv_tools ksrv_tools;
typedef struct ksrv_agent ksrv_agent;

typedef struct {
    ksrv_job *job;
    int index, prompt;
    uint64_t id; /* the scheduler's */
    bool submitted, ended, got_first, sent_first;
    double t_arrive, t_last;
    int32_t n_generated, n_cached;
    double prompt_s, gen_s;      /* ksch_event's, at the end */
    int32_t n_draft, n_accepted;
    kgen_finish finish;
    size_t text_off; /* streaming: logprobs' text_offset of the next token */
} ksrv_choice;

struct ksrv_job {
    ksrv *srv;
    bool chat, stream, echo, return_tokens, include_usage, want_logprobs;
    bool prompt_lp; /* echo with logprobs: the prompt tokens' log-probabilities too */
    int n_top;
    int n_prompts;
    int32_t **prompts;
    int32_t *n_prompt;
    char **prompt_str; /* the prompt as given when it was text (for echo), else NULL */
    char *rendered;    /* chat: the chat template's output (/apply-template) */
    ksrv_images *images; /* chat with images: the prompt's per-token inputs; NULL: none */
    ksrv_tools *tools;   /* chat whose output is parsed (tool calls, reasoning); NULL: plain text */
    ksrv_agent *agent;   /* a /v1/responses or /v1/messages request (agent.c); NULL: OpenAI chat/completions */
    bool llama;          /* llama-server's /completion (llama.c) */
    int n_choices;
    ksrv_choice *ch;
    kgen_params gp;
    char id[48];
    long created;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ksrv_ev *ev; /* [n_ev] produced, [ev_off..n_ev) not yet consumed */
    int n_ev, cap_ev, ev_off;
    int n_submitted, n_ended;
    bool failed; /* an event could not be recorded (out of memory) */
    /* streaming: what has been written */
    bool started, done_sent;
    ksrv_buf out;
    size_t out_off;
};

typedef struct {
    int status;      /* HTTP status of the error */
    const char *type, *code;
} ksrv_err;

/* Parses a /v1/completions (chat false) or /v1/chat/completions body into a
 * job (not yet submitted). On error: the status, the OpenAI error type and
 * code go to *e and the message to the returned status. */
kiln_status ksrv_job_parse(ksrv *s, const cJSON *body, bool chat, ksrv_job **out, ksrv_err *e);
/* Submits every choice. On a full queue the submitted ones are cancelled
 * and the error's status is 503. */
kiln_status ksrv_job_submit(ksrv_job *j, ksrv_err *e);
/* Cancels the choices still running and waits for their ends. */
void ksrv_job_cancel_wait(ksrv_job *j);
void ksrv_job_free(ksrv_job *j);
/* Waits (at most timeout seconds) for events; returns true when all
 * choices ended and every event was consumed. Call with nothing locked. */
void ksrv_job_wait(ksrv_job *j, double timeout);
bool ksrv_job_finished(ksrv_job *j);
/* Streaming: turns new events into SSE chunks appended to j->out, and the
 * final usage chunk and [DONE] once every choice ended. */
void ksrv_job_stream(ksrv_job *j);
/* Non-streaming: the whole response body (after ksrv_job_finished).
 * Returns the HTTP status (200, or 500 when a choice failed). */
int ksrv_job_response(ksrv_job *j, ksrv_buf *out);

/* Streaming: takes the events not yet consumed, [*from, *to); returns
 * whether every choice had ended. ksrv_job_ev: a copy of event k (< *to). */
bool ksrv_job_take(ksrv_job *j, int *from, int *to);
ksrv_ev ksrv_job_ev(ksrv_job *j, int k);
/* "data: {id, object, created, model, "choices": [" of a streamed chunk. */
void ksrv_chunk_head(ksrv_job *j, ksrv_buf *b);
/* llama-server's "timings" object of the job's first choice (after it ended) */
void ksrv_timings_json(const ksrv_job *j, ksrv_buf *b);

/* ---- tool calls and reasoning in chat (tools.c) ---- */
/* Assistant tool_calls' arguments to objects, reasoning_content copied to
 * "thinking", for the templates (msgs modified). */
kiln_status ksrv_tools_fix_messages(cJSON *msgs);
/* For templates that refuse tool-call ids other than 9 characters (Mistral
 * Nemo, Small 3.2): assistant tool_calls[].id and tool messages'
 * tool_call_id made 9 alphanumerics, the same id always the same (its last
 * 9 alphanumerics, as vLLM truncates them; fewer: a hash), so ids of other
 * servers (OpenAI's call_..., Anthropic's toolu_...) still pair up. */
kiln_status ksrv_tools_fit_ids(cJSON *msgs);
/* t's format is Phi-4-mini's, whose template reads tools only as the text
 * of a system message's "tools" (its model card's usage), not `tools`: the
 * tools' functions (name, description, parameters) as JSON text there, a
 * leading empty system message added when there is none, unless a message
 * has "tools" already. Else nothing. */
kiln_status ksrv_tools_phi4_system(const ksrv_tools *t, cJSON *msgs, const cJSON *tools);
/* tools, tool_choice, parallel_tool_calls, reasoning_format,
 * reasoning_effort of a chat body: *out (NULL when the output is plain
 * text), the tools to render (*tmpl_tools, borrowed from body; NULL: none),
 * reasoning_effort added to *extra (the template's kwargs, created if NULL).
 * A template without a known tool-call format and tools: KILN_EUNSUPPORTED. */
kiln_status ksrv_tools_parse(ksrv *s, const cJSON *body, kgen_params *gp, ksrv_tools **out, const cJSON **tmpl_tools,
                             cJSON **extra);
/* The rendered prompt: does it open the thinking block? A forced call
 * (tool_choice required / named) appends the trigger to it (*prompt
 * reallocated) and switches gp's grammar on from the start. */
kiln_status ksrv_tools_set_prompt(ksrv_tools *t, char **prompt, kgen_params *gp);
bool ksrv_tools_keep_special(const ksrv_tools *t);
/* Streaming: a token event of a choice (fin: its finish reason, on the last)
 * as content / reasoning_content / tool_calls delta chunks in j->out. */
void ksrv_tools_stream_event(ksrv_job *j, const ksrv_ev *ev, const char *fin);
/* Not streaming: choice i's "message": {...} from its text, and its finish reason. */
void ksrv_tools_message(ksrv_job *j, int i, const char *text, size_t len, ksrv_buf *b, const char **finish);
void ksrv_tools_free(ksrv_tools *t);
/* The output's syntax (NULL t: plain text). */
ktc_syntax ksrv_tools_syntax(const ksrv_tools *t);
/* Call k of choice i's id: 9 alphanumerics. */
void ksrv_tools_call_id(const ksrv_tools *t, int i, int k, char out[10]);

/* ---- the agent APIs: OpenAI Responses and Anthropic Messages (agent.c,
 * responses.c, anthropic.c) ---- */
typedef enum { KSRV_API_RESPONSES = 1, KSRV_API_ANTHROPIC } ksrv_api;
/* A /v1/responses or /v1/messages body as a job (not yet submitted), by way
 * of the equivalent chat body. count_only: /v1/messages/count_tokens. */
kiln_status ksrv_agent_parse(ksrv *s, const cJSON *body, ksrv_api api, ksrv_job **out, ksrv_err *e);
void ksrv_agent_stream(ksrv_job *j);
int ksrv_agent_response(ksrv_job *j, ksrv_buf *b);
void ksrv_agent_free(ksrv_agent *a);
/* A request body as a chat completions body (*out: a new object). */
kiln_status ksrv_agent_to_chat(ksrv_api api, const cJSON *body, cJSON **out);
/* Anthropic's error object {"type": "error", "error": {type, message}}. */
void ksrv_anthropic_error(ksrv_buf *b, int status, const char *msg);

/* ---- llama-server's /completion (llama.c) ---- */
/* A parsed /v1/completions job as /completion takes it (one choice). */
kiln_status ksrv_llama_check(const ksrv_job *j);
void ksrv_llama_stream(ksrv_job *j);
int ksrv_llama_response(ksrv_job *j, ksrv_buf *b);

/* ---- the browser chat page (webui.c) ---- */
/* The embedded file served at url (/, /index.html, /webui/...): its bytes
 * (static), length and content type; false when url is none of them. */
bool ksrv_webui_asset(const char *url, const char **data, size_t *len, const char **ctype);

/* {"error": {...}} for a status. */
void ksrv_error_json(ksrv_buf *b, int status, const char *type, const char *code, const char *msg);

#endif
