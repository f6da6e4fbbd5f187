/* agent.h: what the agent APIs share (server internals; see server_int.h).
 *
 * A /v1/responses or /v1/messages request runs as a chat job of one choice
 * (its body translated to a chat body). Its output is a list of blocks
 * (reasoning, text, a function call), built from the streamed deltas of the
 * tool-call parser, or from the whole output's parse, and written by each
 * API's hooks: Responses' output items and typed events, Anthropic's
 * content blocks and events. */
#ifndef KILN_SERVER_AGENT_H
#define KILN_SERVER_AGENT_H

#include "server/server_int.h"

typedef enum { KA_REASONING, KA_TEXT, KA_CALL } ka_kind;

typedef struct {
    ka_kind kind;
    ksrv_buf text; /* reasoning, text, or the call's arguments */
    char *name;    /* KA_CALL */
    int call;      /* KA_CALL: the parser's call index */
    char id[48];   /* item / tool-use id */
} ka_block;

typedef struct {
    void (*start)(ksrv_job *j);                                   /* the stream's first events */
    void (*open)(ksrv_job *j, int b);                             /* block b begins */
    void (*delta)(ksrv_job *j, int b, const char *t, size_t n);   /* block b grows */
    void (*close)(ksrv_job *j, int b);                            /* block b is complete */
    void (*finish)(ksrv_job *j);                                  /* the stream's last events */
    void (*body)(ksrv_job *j, ksrv_buf *b);                       /* the whole response object */
    void (*error)(ksrv_job *j, ksrv_buf *b, int status, const char *msg); /* an error (body or stream event) */
} ka_api;

struct ksrv_agent {
    ksrv_api api;
    const ka_api *fn;
    cJSON *req; /* the request as given (fields echoed back) */
    char id[48];
    ktc_stream *st;
    ka_block *b;
    int n, cap;
    int open; /* the block being streamed; -1: none */
    int seq;  /* Responses' sequence_number */
    bool started, fed_final, failed;
};

extern const ka_api ksrv_responses_api, ksrv_anthropic_api;

/* Each API's request fields into the chat body. */
kiln_status ksrv_responses_fill(const cJSON *body, cJSON *chat);
kiln_status ksrv_anthropic_fill(const cJSON *body, cJSON *chat);
/* from[key], copied into to[as] when present. */
kiln_status ksrv_agent_copy(const cJSON *from, const char *key, cJSON *to, const char *as);

/* A function tool {name, description, SCHEMA, strict} appended to a chat
 * body's tools as {"type": "function", "function": {..., "parameters"}}. */
kiln_status ksrv_agent_chat_tool(cJSON *tools, const cJSON *t, const char *schema);

/* {"id", "type": "function", "function": {name, arguments}} appended to a
 * chat message's tool_calls (args taken: an object or a JSON string). */
void ksrv_agent_chat_call(cJSON *calls, const char *id, const char *name, cJSON *args);

/* System messages after the first other message folded into one leading
 * system message (their text joined by blank lines). */
kiln_status ksrv_agent_fold_system(cJSON *msgs);

/* Prompt and generated tokens of the job's choice. */
void ksrv_agent_usage(const ksrv_job *j, int64_t *in, int64_t *out);

#endif
