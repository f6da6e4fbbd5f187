/* tools_test.c: function calling and reasoning in /v1/chat/completions.
 *
 * The output side with model outputs written by hand (a random-weight model
 * does not write tool calls; constrained generation will, once the grammar
 * engine lands): a job's events turned into OpenAI's SSE chunks and into
 * the non-streamed message, for real templates (Qwen2.5 Hermes, Qwen3 with
 * thinking, gpt-oss Harmony, Mistral Small 3.2), the chunks reassembled as
 * the openai client does and equal to the message. The request side end
 * to end over loopback: tools rendered through the template, a whole tool
 * round trip (call, tool result) accepted, and the errors. */
#include <curl/curl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/ckpt_test.h"
#include "cli/synth.h"
#include "grammar/gr_int.h"
#include "kt.h"
#include "server/server.h"
#include "server/server_int.h"

static const char *k_tools_json =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"a city\"}}, "
    "\"required\": [\"city\"]}}}]";

static char *template_text(const char *name) {
    char rel[256], path[PATH_MAX];
    snprintf(rel, sizeof rel, "tests/data/chat/templates/%s.jinja", name);
    if (access(kt_path(path, sizeof path, rel), R_OK) != 0) snprintf(rel, sizeof rel, "tests/data/tools/templates/%s.jinja", name);
    char *t = NULL;
    kiln_status st = ku_read_file(kt_path(path, sizeof path, rel), &t, NULL);
    kiln_status_free(st);
    return t;
}

/* ---------------------------------------------------------------- the output side */

typedef struct {
    char content[2048], reasoning[2048], name[4][64], args[4][1024], id[4][16], finish[16];
    int n_calls, n_chunks;
    bool bad; /* a chunk that does not parse, or a call delta out of order */
} assembled;

/* Reassembles the SSE chunks as the openai client's ChatCompletionStream does. */
static void assemble(const char *sse, assembled *a) {
    memset(a, 0, sizeof *a);
    for (const char *p = sse; (p = strstr(p, "data: "));) {
        p += 6;
        const char *e = strstr(p, "\n\n");
        if (!e || !strncmp(p, "[DONE]", 6)) break;
        cJSON *j = cJSON_ParseWithLength(p, (size_t)(e - p));
        p = e;
        if (!j) {
            a->bad = true;
            continue;
        }
        a->n_chunks++;
        const cJSON *ch = cJSON_GetArrayItem(ku_json_get(j, "choices"), 0), *d = ku_json_get(ch, "delta");
        const cJSON *c = ku_json_get(d, "content"), *r = ku_json_get(d, "reasoning_content"), *f = ku_json_get(ch, "finish_reason");
        if (cJSON_IsString(c)) strncat(a->content, c->valuestring, sizeof a->content - strlen(a->content) - 1);
        if (cJSON_IsString(r)) strncat(a->reasoning, r->valuestring, sizeof a->reasoning - strlen(a->reasoning) - 1);
        if (cJSON_IsString(f)) snprintf(a->finish, sizeof a->finish, "%s", f->valuestring);
        const cJSON *tc;
        cJSON_ArrayForEach(tc, ku_json_get(d, "tool_calls")) {
            int i = (int)ku_json_get(tc, "index")->valuedouble;
            const cJSON *id = ku_json_get(tc, "id"), *fn = ku_json_get(tc, "function");
            const cJSON *nm = ku_json_get(fn, "name"), *ar = ku_json_get(fn, "arguments");
            if (id) { /* a new call: id, type, name first */
                if (i != a->n_calls || i >= 4 || !cJSON_IsString(nm)) {
                    a->bad = true;
                    continue;
                }
                snprintf(a->id[i], sizeof a->id[i], "%s", id->valuestring);
                snprintf(a->name[i], sizeof a->name[i], "%s", nm->valuestring);
                a->n_calls++;
            } else if (i >= a->n_calls || nm) {
                a->bad = true;
                continue;
            }
            if (cJSON_IsString(ar)) strncat(a->args[i], ar->valuestring, sizeof a->args[i] - strlen(a->args[i]) - 1);
        }
        cJSON_Delete(j);
    }
}

typedef struct {
    const char *tmpl;
    const char *extra; /* more request fields */
    const char *pieces[12]; /* the model's output, as the scheduler's text events */
    const char *content, *reasoning;
    const char *name, *args; /* the one call, or NULL */
} out_case;

static const out_case k_out[] = {
    {"Qwen-Qwen2.5-7B-Instruct", "",
     {"Let me look.", "\n<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"ci", "ty\": \"Par", "is\"}}\n</tool_call>"},
     "Let me look.", "", "get_weather", "{\"city\": \"Paris\"}"},
    {"Qwen-Qwen3-0.6B", "",
     {"<thi", "nk>\nThe user asks.", "\n</think>\n\n", "<tool_call>\n{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Oslo\"}}", "\n</tool_call>"},
     "", "The user asks.", "get_weather", "{\"city\": \"Oslo\"}"},
    {"Qwen-Qwen3-0.6B", ", \"reasoning_format\": \"none\"", {"<think>\nhm\n</think>\n\nHello"}, "<think>\nhm\n</think>\n\nHello", "",
     NULL, NULL},
    {"Qwen-Qwen3-0.6B", ", \"tool_choice\": \"none\"", {"<think>x</think>Plain <tool_call>"}, "Plain <tool_call>", "x", NULL, NULL},
    {"openai-gpt-oss-120b", ", \"reasoning_effort\": \"low\"",
     {"<|channel|>analysis<|message|>Need weather.", "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather ",
      "<|constrain|>json<|message|>{\"city\":", " \"Rome\"}"},
     "", "Need weather.", "get_weather", "{\"city\": \"Rome\"}"},
    {"Mistral-Small-3.2-24B-Instruct-2506", "", {"[TOOL_CALLS]get_", "weather[ARGS]{\"city\": ", "\"Lima\"}"}, "", "", "get_weather",
     "{\"city\": \"Lima\"}"},
    {"deepseek-ai-DeepSeek-V3.2", "",
     {"Let me check.", "\n\n<｜DSML｜func", "tion_calls>\n<｜DSML｜invoke name=\"get_weather\">\n",
      "<｜DSML｜parameter name=\"city\" string=\"true\">Par", "is</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>"},
     "Let me check.", "", "get_weather", "{\"city\": \"Paris\"}"},
};

static ksrv *fake_server(const char *tmpl_src) {
    ksrv *s = calloc(1, sizeof *s);
    s->model_id = strdup("m");
    kiln_status st = kchat_parse(tmpl_src, &s->tmpl);
    kiln_status_free(st);
    return s;
}

static void free_fake(ksrv *s) {
    kchat_free(s->tmpl);
    free(s->model_id);
    free(s);
}

/* A job of one choice with the request's tools; *err: the parse error. */
static ksrv_job *fake_job(ksrv *s, const char *extra, kiln_status *err) {
    char body[2048];
    snprintf(body, sizeof body, "{\"messages\": [], \"tools\": %s%s}", k_tools_json, extra);
    cJSON *b = cJSON_Parse(body);
    ksrv_job *j = calloc(1, sizeof *j);
    j->srv = s;
    j->chat = j->stream = true;
    j->n_choices = 1;
    j->ch = calloc(1, sizeof *j->ch);
    snprintf(j->id, sizeof j->id, "chatcmpl-test");
    const cJSON *tools;
    cJSON *kw = NULL;
    *err = ksrv_tools_parse(s, b, &j->gp, &j->tools, &tools, &kw);
    cJSON_Delete(kw);
    cJSON_Delete(b);
    return j;
}

static void free_job(ksrv_job *j) {
    ksrv_tools_free(j->tools);
    kgen_params_free(&j->gp);
    ksrv_buf_free(&j->out);
    free(j->ch);
    free(j);
}

KT_TEST(server_tools_output_streamed_and_not) {
    for (size_t c = 0; c < sizeof k_out / sizeof k_out[0]; c++) {
        const out_case *oc = &k_out[c];
        char *src = template_text(oc->tmpl);
        KT_CHECKF(src, "%s: no template", oc->tmpl);
        ksrv *s = fake_server(src);
        free(src);
        kiln_status st;
        ksrv_job *j = fake_job(s, oc->extra, &st);
        KT_CHECKF(!st && j->tools, "case %zu: %s", c, kiln_status_msg(st));
        char *prompt = strdup("<|im_start|>assistant\n");
        KT_CHECK_OK(ksrv_tools_set_prompt(j->tools, &prompt, &j->gp));
        free(prompt);
        /* streamed: the events, the last one with the finish reason */
        ksrv_buf all = {0};
        int n = 0;
        while (n < 12 && oc->pieces[n]) n++;
        for (int k = 0; k < n; k++) {
            ksrv_ev ev = {.choice = 0, .text = (char *)oc->pieces[k], .len = strlen(oc->pieces[k]),
                          .finish = k == n - 1 ? KGEN_FINISH_EOS : KGEN_CONTINUE};
            ksrv_tools_stream_event(j, &ev, k == n - 1 ? "stop" : NULL);
            ksrv_buf_str(&all, oc->pieces[k]);
        }
        KT_CHECK(!j->out.oom);
        assembled a;
        assemble(j->out.p ? j->out.p : "", &a);
        KT_CHECKF(!a.bad, "case %zu: malformed chunks:\n%s", c, j->out.p);
        KT_CHECKF(!strcmp(a.content, oc->content), "case %zu: streamed content [%s]", c, a.content);
        KT_CHECKF(!strcmp(a.reasoning, oc->reasoning), "case %zu: streamed reasoning [%s]", c, a.reasoning);
        KT_CHECKF(a.n_calls == (oc->name ? 1 : 0), "case %zu: %d calls:\n%s", c, a.n_calls, j->out.p);
        KT_CHECKF(!strcmp(a.finish, oc->name ? "tool_calls" : "stop"), "case %zu: finish %s", c, a.finish);
        if (oc->name) {
            cJSON *x = cJSON_Parse(a.args[0]), *y = cJSON_Parse(oc->args);
            bool eq = x && cJSON_Compare(x, y, true);
            cJSON_Delete(x), cJSON_Delete(y);
            KT_CHECKF(!strcmp(a.name[0], oc->name) && eq && strlen(a.id[0]) == 9, "case %zu: %s %s(%s)", c, a.id[0], a.name[0],
                      a.args[0]);
        }
        /* not streamed: the same message */
        j->ch[0].finish = KGEN_FINISH_EOS;
        ksrv_buf b = {0};
        ksrv_buf_str(&b, "{");
        const char *fin = "stop";
        ksrv_tools_message(j, 0, all.p, all.len, &b, &fin);
        ksrv_buf_str(&b, "}");
        cJSON *m = cJSON_Parse(b.p);
        KT_CHECKF(m, "case %zu: %s", c, b.p);
        const cJSON *msg = ku_json_get(m, "message"), *tc = cJSON_GetArrayItem(ku_json_get(msg, "tool_calls"), 0);
        const cJSON *content = ku_json_get(msg, "content"), *rc = ku_json_get(msg, "reasoning_content");
        KT_CHECKF(!strcmp(content ? content->valuestring : "", a.content), "case %zu: content %s", c, b.p);
        KT_CHECKF(!strcmp(rc ? rc->valuestring : "", a.reasoning), "case %zu: reasoning %s", c, b.p);
        KT_CHECKF(oc->name ? tc && !strcmp(ku_json_get(ku_json_get(tc, "function"), "arguments")->valuestring, a.args[0]) &&
                                 !strcmp(ku_json_get(tc, "id")->valuestring, a.id[0]) && !strcmp(fin, "tool_calls")
                           : !tc && !strcmp(fin, "stop"),
                  "case %zu: %s", c, b.p);
        KT_CHECKF(!oc->name || *oc->content || !content, "case %zu: content should be null beside a call: %s", c, b.p);
        cJSON_Delete(m);
        ksrv_buf_free(&b), ksrv_buf_free(&all);
        free_job(j);
        free_fake(s);
    }
}

KT_TEST(server_tools_request_errors) {
    static const struct {
        const char *tmpl, *extra, *want;
    } k_err[] = {
        {"llama3", "", "no format kiln knows"}, /* a template without tool calls */
        {"Qwen-Qwen2.5-7B-Instruct", ", \"tool_choice\": \"sometimes\"", "\"tool_choice\": \"sometimes\""},
        {"Qwen-Qwen2.5-7B-Instruct", ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}",
         "\"nope\" is not in \"tools\""},
        {"Qwen-Qwen2.5-7B-Instruct", ", \"reasoning_format\": \"loud\"", "\"reasoning_format\""},
        {"Qwen-Qwen2.5-7B-Instruct", ", \"parallel_tool_calls\": 3", "parallel_tool_calls"},
        {"Qwen-Qwen3-0.6B", ", \"reasoning_budget\": -5", "\"reasoning_budget\": -5 is out of range"},
    };
    for (size_t c = 0; c < sizeof k_err / sizeof k_err[0]; c++) {
        char *src = template_text(k_err[c].tmpl);
        KT_CHECKF(src, "%s: no template", k_err[c].tmpl);
        ksrv *s = fake_server(src);
        free(src);
        kiln_status st;
        ksrv_job *j = fake_job(s, k_err[c].extra, &st);
        KT_CHECKF(st && strstr(kiln_status_msg(st), k_err[c].want), "case %zu: %s", c, kiln_status_msg(st));
        kiln_status_free(st);
        free_job(j);
        free_fake(s);
    }
    kgen_params gp = {0};
    /* reasoning_budget 0: the template's enable_thinking false; a positive
     * budget: the session's closing text, and whether the prompt opened the block */
    static const struct {
        const char *tmpl, *prompt, *close;
        int budget;
        bool in;
    } k_b[] = {{"Qwen-Qwen3-0.6B", "<|im_start|>assistant\n", NULL, 0, false},
               {"Qwen-Qwen3-0.6B", "<|im_start|>assistant\n", "</think>", 5, false},
               {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "<｜Assistant｜><think>\n", "</think>", 5, true},
               {"openai-gpt-oss-120b", "<|start|>assistant", "<|end|>", 5, false}};
    for (size_t c = 0; c < sizeof k_b / sizeof *k_b; c++) {
        char req[64];
        snprintf(req, sizeof req, "{\"reasoning_budget\": %d}", k_b[c].budget);
        cJSON *rb = cJSON_Parse(req);
        char *src = template_text(k_b[c].tmpl);
        ksrv *q = fake_server(src);
        free(src);
        ksrv_tools *t = NULL;
        const cJSON *tt;
        cJSON *kw = NULL;
        KT_CHECK_OK(ksrv_tools_parse(q, rb, &gp, &t, &tt, &kw));
        char *prompt = strdup(k_b[c].prompt);
        KT_CHECK_OK(ksrv_tools_set_prompt(t, &prompt, &gp));
        if (!k_b[c].close) KT_CHECK(cJSON_IsFalse(ku_json_get(kw, "enable_thinking")) && !gp.think_close);
        else
            KT_CHECKF(gp.think_close && !strcmp(gp.think_close, k_b[c].close) && gp.think_in_prompt == k_b[c].in &&
                          gp.reasoning_budget == 5,
                      "%s: %s", k_b[c].tmpl, gp.think_close);
        free(prompt);
        kgen_params_free(&gp);
        ksrv_tools_free(t);
        cJSON_Delete(kw), cJSON_Delete(rb);
        free_fake(q);
    }
    /* bad tools and messages */
    cJSON *b = cJSON_Parse("{\"tools\": [{\"type\": \"function\", \"function\": {}}]}");
    ksrv *s = fake_server("{{ messages }}");
    ksrv_tools *t = NULL;
    const cJSON *tt;
    cJSON *kw = NULL;
    kiln_status st = ksrv_tools_parse(s, b, &gp, &t, &tt, &kw);
    KT_CHECKF(st && strstr(kiln_status_msg(st), "\"tools\"[0].function.name"), "%s", kiln_status_msg(st));
    kgen_params_free(&gp);
    kiln_status_free(st);
    cJSON_Delete(b);
    free_fake(s);
    cJSON *msgs = cJSON_Parse("[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]");
    st = ksrv_tools_fix_messages(msgs);
    KT_CHECKF(st && strstr(kiln_status_msg(st), "tool_calls[0].function.name"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    cJSON_Delete(msgs);
    /* arguments strings become objects, null content "", reasoning copied for gpt-oss */
    msgs = cJSON_Parse("[{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"r\", \"tool_calls\": [{\"function\": "
                       "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}}]}]");
    KT_CHECK_OK(ksrv_tools_fix_messages(msgs));
    const cJSON *m0 = cJSON_GetArrayItem(msgs, 0);
    const cJSON *args = ku_json_get(ku_json_get(cJSON_GetArrayItem(ku_json_get(m0, "tool_calls"), 0), "function"), "arguments");
    KT_CHECK(cJSON_IsObject(args) && ku_json_get(args, "a")->valuedouble == 1);
    KT_CHECK_STR(ku_json_get(m0, "content")->valuestring, "");
    KT_CHECK_STR(ku_json_get(m0, "thinking")->valuestring, "r");
    cJSON_Delete(msgs);
}

/* ---------------------------------------------------------------- end to end */

static size_t sink(char *p, size_t sz, size_t n, void *ud) {
    ksrv_buf_add(ud, p, sz * n);
    return sz * n;
}

static long post_to(int port, const char *path, const char *hdr, const char *body, ksrv_buf *out) {
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    CURL *c = curl_easy_init();
    struct curl_slist *h = curl_slist_append(NULL, hdr ? hdr : "Authorization: Bearer k");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    long status = -1;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    ksrv_buf_add(out, "", 0);
    return status;
}

static long post(int port, const char *body, ksrv_buf *out) { return post_to(port, "/v1/chat/completions", NULL, body, out); }

static int prompt_tokens(const char *body) {
    cJSON *j = cJSON_Parse(body);
    const cJSON *u = ku_json_get(ku_json_get(j, "usage"), "prompt_tokens");
    int n = u ? (int)u->valuedouble : -1;
    cJSON_Delete(j);
    return n;
}

/* kiln serve over the tiny model with a chat template of tests/data/chat/templates, in dir */
static void start_tiny(const char *tmpl, char *dir, ksrv **s) {
    char root[PATH_MAX], from[PATH_MAX * 2], tpath[256], abs[PATH_MAX * 2];
    KT_CHECK(mkdtemp(dir) && realpath(kt_root(), root));
    snprintf(tpath, sizeof tpath, "tests/data/chat/templates/%s.jinja", tmpl);
    snprintf(abs, sizeof abs, "%s/%s", root, tpath);
    if (access(abs, R_OK) != 0) snprintf(tpath, sizeof tpath, "tests/data/tools/templates/%s.jinja", tmpl);
    const char *files[][2] = {{"tests/fixtures/oracle/llama/config.json", "config.json"},
                              {"tests/fixtures/oracle/llama/model.safetensors", "model.safetensors"},
                              {"tests/data/server/tok512/tokenizer.json", "tokenizer.json"},
                              {"tests/data/server/tok512/tokenizer_config.json", "tokenizer_config.json"},
                              {tpath, "chat_template.jinja"}};
    for (int i = 0; i < 5; i++) {
        snprintf(from, sizeof from, "%s/%s", root, files[i][0]);
        KT_CHECK(ckt_copy(from, dir, files[i][1])); /* weights must lie in the folder */
    }
    /* (Command R7B's instructions take 3.4k tokens of the tiny vocabulary) */
    ksrv_params p = {.model_dir = dir, .alias = "tiny", .parallel = 2, .ctx_size = 4096, .threads = 1, .quiet = true, .api_key = "k"};
    KT_CHECK_OK(ksrv_start(&p, s));
    KT_CHECK_OK(ksrv_wait_ready(*s));
}

/* A reasoning budget end to end: DeepSeek-R1's prompt opens the block; after
 * 3 tokens the session spells </think>, the rest is content. */
KT_TEST(server_tools_reasoning_budget) {
    char dir[] = "/tmp/kiln-tools-XXXXXX";
    ksrv *s;
    start_tiny("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", dir, &s);
    ksrv_buf r = {0}, r2 = {0};
    long st = post(ksrv_port(s), "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 40, "
                                 "\"reasoning_budget\": 3, \"seed\": 1, \"chat_template_kwargs\": {\"enable_thinking\": true}}", &r);
    long st2 = post(ksrv_port(s), "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 40, \"seed\": 1, \"chat_template_kwargs\": {\"enable_thinking\": true}}", &r2);
    ksrv_stop(s);
    ckt_rmdir(dir);
    KT_CHECKF(st == 200 && st2 == 200, "%ld %s", st, r.p);
    cJSON *a = cJSON_Parse(r.p), *b = cJSON_Parse(r2.p);
    const cJSON *m = ku_json_get(cJSON_GetArrayItem(ku_json_get(a, "choices"), 0), "message");
    const cJSON *m2 = ku_json_get(cJSON_GetArrayItem(ku_json_get(b, "choices"), 0), "message");
    const cJSON *rc = ku_json_get(m, "reasoning_content"), *c = ku_json_get(m, "content");
    /* 3 tokens of the tiny vocabulary are a few bytes; without the budget all 40 are reasoning */
    KT_CHECKF(cJSON_IsString(rc) && strlen(rc->valuestring) < 40 && cJSON_IsString(c) && *c->valuestring, "%s", r.p);
    KT_CHECKF(!cJSON_IsString(ku_json_get(m2, "content")) || !*ku_json_get(m2, "content")->valuestring, "%s", r2.p);
    cJSON_Delete(a), cJSON_Delete(b);
    ksrv_buf_free(&r), ksrv_buf_free(&r2);
}

/* llama.cpp's tools/server/tests/unit/test_tool_call.py, where it fits the
 * tiny random model: tool_choice required gives exactly one call of the
 * tool, with its argument, and no content (test_completion_with_required_tool_tiny,
 * its TEST_TOOL cases: PYTHON_TOOL's free string need not end within the
 * token limit, as llama.cpp found with its tiny model), streamed and not,
 * for each template whose format is constrained; and no call without tools
 * or with tool_choice none (test_completion_without_tool_call_fast).
 * (Hermes-2-Pro's and Hermes-3's templates trim a parameter's missing
 * description, which kiln's Jinja refuses where Python's renders "": left
 * out; Qwen2.5's Hermes format instead.) */
static void call_of(const char *resp, bool stream, int *n, char *name, size_t cap, ksrv_buf *args, bool *content) {
    *n = 0, *content = false;
    name[0] = 0;
    if (!stream) {
        cJSON *j = cJSON_Parse(resp);
        const cJSON *m = ku_json_get(cJSON_GetArrayItem(ku_json_get(j, "choices"), 0), "message");
        const cJSON *tc = ku_json_get(m, "tool_calls"), *c = ku_json_get(m, "content");
        *n = cJSON_GetArraySize(tc);
        *content = cJSON_IsString(c) && *c->valuestring;
        const cJSON *f = ku_json_get(cJSON_GetArrayItem(tc, 0), "function");
        if (cJSON_IsString(ku_json_get(f, "name"))) snprintf(name, cap, "%s", ku_json_get(f, "name")->valuestring);
        if (cJSON_IsString(ku_json_get(f, "arguments"))) ksrv_buf_str(args, ku_json_get(f, "arguments")->valuestring);
        cJSON_Delete(j);
        return;
    }
    for (const char *q = resp; (q = strstr(q, "data: {")); q++) {
        const char *e = strstr(q, "\n\n");
        cJSON *ev = cJSON_ParseWithLength(q + 6, e ? (size_t)(e - q - 6) : strlen(q + 6));
        const cJSON *d = ku_json_get(cJSON_GetArrayItem(ku_json_get(ev, "choices"), 0), "delta");
        const cJSON *c = ku_json_get(d, "content"), *tc = cJSON_GetArrayItem(ku_json_get(d, "tool_calls"), 0);
        if (cJSON_IsString(c) && *c->valuestring) *content = true;
        const cJSON *f = ku_json_get(tc, "function");
        if (cJSON_IsString(ku_json_get(f, "name"))) {
            (*n)++;
            snprintf(name, cap, "%s", ku_json_get(f, "name")->valuestring);
        }
        if (cJSON_IsString(ku_json_get(f, "arguments"))) ksrv_buf_str(args, ku_json_get(f, "arguments")->valuestring);
        cJSON_Delete(ev);
    }
}

/* POSTs a chat body and reads its calls (call_of): the first's arguments
 * parsed (NULL: none or not JSON; the caller frees them), r the reply. */
static cJSON *post_call(int port, const char *body, bool stream, long *st, int *n, char *name, size_t cap, bool *content,
                        ksrv_buf *r) {
    ksrv_buf args = {0};
    *st = post(port, body, r);
    call_of(r->p ? r->p : "", stream, n, name, cap, &args, content);
    cJSON *a = cJSON_Parse(args.p ? args.p : "");
    ksrv_buf_free(&args);
    return a;
}

KT_TEST(server_tools_llama_cpp_required_tool) {
    static const char *const tmpls[] = {"meta-llama-Llama-3.3-70B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                        "meta-llama-Llama-3.2-3B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407",
                                        "fireworks-ai-llama-3-firefunction-v2", "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
                                        /* the special-token and XML formats (kiln's own cases; the tiny
                                         * vocabulary spells their markers as text) */
                                        "openai-gpt-oss-120b", "deepseek-ai-DeepSeek-V3.1", "Qwen3-Coder", "GLM-4.6",
                                        "moonshotai-Kimi-K2", "Mistral-Small-3.2-24B-Instruct-2506", "ByteDance-Seed-OSS",
                                        "deepseek-ai-DeepSeek-V3.2", "deepseek-ai-DeepSeek-V4", "tencent-Hy3",
                                        /* prompts that open a thinking block: the model thinks first,
                                         * and where the block closes the grammar forces the format's
                                         * trigger and the call; a reasoning budget closes it here, as
                                         * random weights would not */
                                        "MiniMax-M2", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "openbmb-MiniCPM5-1B",
                                        /* Hy3 thinks with reasoning_effort high (its prompt then opens <think:opensource>) */
                                        "tencent-Hy3+think",
                                        /* the formats of llama.cpp's common/parsers */
                                        "unsloth-Apriel-1.5", "MiniMax-M1", "NVIDIA-Nemotron-Nano-v2", "GigaChat3-10B-A1.8B",
                                        "GigaChat3.1-10B-A1.8B", "Apertus-8B-Instruct", "upstage-Solar-Open-100B",
                                        "meetkai-functionary-medium-v3.1", "meetkai-functionary-medium-v3.2", "LFM2.5-8B-A1B",
                                        "google-gemma-4-31B-it", "MiniMax-M3", "Kimi-K3", "muse-glimmer",
                                        /* Llama 4 pythonic, Phi-4-mini, Granite 3.3 */
                                        "llama4-pythonic", "microsoft-Phi-4-mini-instruct", "ibm-granite-granite-3.3-2B-Instruct"};
    static const char *test_tool = "[{\"type\": \"function\", \"function\": {\"name\": \"test\", \"description\": \"\", "
                                   "\"parameters\": {\"type\": \"object\", \"properties\": {\"success\": {\"type\": \"boolean\", "
                                   "\"const\": true}}, \"required\": [\"success\"]}}}]";
    for (size_t t = 0; t < sizeof tmpls / sizeof *tmpls; t++) {
        char dir[] = "/tmp/kiln-tools-XXXXXX", body[2048], file[128];
        ksrv *s;
        bool hy3_think = !strcmp(tmpls[t], "tencent-Hy3+think");
        snprintf(file, sizeof file, "%.*s", (int)strcspn(tmpls[t], "+"), tmpls[t]);
        start_tiny(file, dir, &s);
        /* passes 2 and 3: parallel_tool_calls true (not streamed, streamed),
         * where the grammar takes one call or more and the output still
         * ends where it completes (no free text after the calls) */
        for (int pass = 0; pass < 4; pass++) {
            int stream = pass & 1;
            bool parallel = pass >= 2;
            snprintf(body, sizeof body,
                     "{\"max_tokens\": 512, \"messages\": [{\"role\": \"system\", \"content\": \"You are a coding assistant.\"}, "
                     "{\"role\": \"user\", \"content\": \"Write an example\"}], \"tool_choice\": \"required\", \"tools\": %s, "
                     "\"parallel_tool_calls\": %s, \"stream\": %s, \"temperature\": 0.0, \"top_k\": 1, \"top_p\": 1.0%s}",
                     test_tool, parallel ? "true" : "false", stream ? "true" : "false",
                     strstr(tmpls[t], "MiniMax") || strstr(tmpls[t], "-R1-") || strstr(tmpls[t], "MiniCPM5") || strstr(tmpls[t], "Nemotron") ||
                             strstr(tmpls[t], "Kimi-K3")
                         ? ", \"reasoning_budget\": 6"
                     : hy3_think ? ", \"reasoning_budget\": 6, \"reasoning_effort\": \"high\"" : "");
            ksrv_buf r = {0};
            long st;
            int n;
            char name[64];
            bool content;
            cJSON *a = post_call(ksrv_port(s), body, stream, &st, &n, name, sizeof name, &content, &r);
            /* (a model that repeats calls is cut by max_tokens, maybe inside a
             * marker, whose start is trimmed unless a lone character: only then
             * may content show, a marker's start (no blank, under 40 bytes);
             * free text after the calls would run to max_tokens) */
            bool cut = false;
            if (parallel && r.p && strstr(r.p, "\"length\"")) {
                cJSON *j = cJSON_Parse(r.p);
                const cJSON *c = ku_json_get(cJSON_GetArrayItem(ku_json_get(j, "choices"), 0), "message");
                c = ku_json_get(c, "content");
                cut = !cJSON_IsString(c) || (strlen(c->valuestring) < 40 && !strpbrk(c->valuestring, " \n"));
                cJSON_Delete(j);
            }
            KT_CHECKF(st == 200 && (parallel ? n >= 1 : n == 1) && !strcmp(name, "test") && (!content || cut) &&
                          cJSON_IsTrue(ku_json_get(a, "success")) && (!parallel || strstr(r.p, "\"tool_calls\"")),
                      "%s (stream %d, parallel %d): %ld %s", tmpls[t], stream, parallel, st, r.p);
            KT_CHECKF(!hy3_think || strstr(r.p, "\"reasoning_content\""), "%s: no reasoning: %s", tmpls[t], r.p);
            cJSON_Delete(a);
            ksrv_buf_free(&r);
            /* without tools, and with tool_choice none: no call */
            snprintf(body, sizeof body,
                     "{\"max_tokens\": 16, \"messages\": [{\"role\": \"user\", \"content\": \"say hello world with python\"}]%s%s, "
                     "\"stream\": %s}",
                     stream ? ", \"tool_choice\": \"none\", \"tools\": " : "", stream ? test_tool : "", stream ? "true" : "false");
            st = post(ksrv_port(s), body, &r);
            KT_CHECKF(st == 200 && !strstr(r.p, "tool_calls\""), "%s: %ld %s", tmpls[t], st, r.p);
            ksrv_buf_free(&r);
        }
        ksrv_stop(s);
        ckt_rmdir(dir);
    }
}

/* A fake server of a committed template and its job of extra's request
 * (*err: the request's error). */
static ksrv_job *template_job(const char *tmpl, const char *extra, ksrv **s, kiln_status *err) {
    char *src = template_text(tmpl);
    *s = fake_server(src ? src : "");
    free(src);
    return fake_job(*s, extra, err);
}

/* Pythonic calls (Llama 4) are the output from its start: with tool_choice
 * auto no lazy grammar (its trigger "[" anywhere in text would force a
 * call there); a forced call ends the prompt with "[" and the grammar is
 * on from there. */
KT_TEST(server_tools_pythonic_forced_only) {
    ksrv *s;
    kiln_status err;
    ksrv_job *j = template_job("llama4-pythonic", "", &s, &err);
    KT_CHECK_OK(err);
    KT_CHECK(j->tools && !j->gp.grammar);
    free_job(j);
    j = fake_job(s, ", \"tool_choice\": \"required\"", &err);
    KT_CHECK_OK(err);
    KT_CHECK(j->tools && j->gp.grammar);
    char *prompt = strdup("<|header_start|>assistant<|header_end|>\n\n");
    KT_CHECK_OK(ksrv_tools_set_prompt(j->tools, &prompt, &j->gp));
    KT_CHECK_STR(prompt, "<|header_start|>assistant<|header_end|>\n\n[");
    KT_CHECK(!j->gp.grammar_lazy && j->gp.grammar_once);
    free(prompt);
    free_job(j);
    free_fake(s);
}

/* Phi-4-mini's template reads tools only from a system message's "tools"
 * text (its model card's usage): the functions go there, into the leading
 * system message or a new empty one; a client's own "tools" stay; other
 * formats' messages are not touched. */
KT_TEST(server_tools_phi4_system_tools) {
    static const char *fn = "[{\"name\":\"get_weather\",\"description\":\"Weather of a city\",\"parameters\":{\"type\":\"object\","
                            "\"properties\":{\"city\":{\"type\":\"string\",\"description\":\"a city\"}},\"required\":[\"city\"]}}]";
    static const struct {
        const char *tmpl, *msgs, *want;
    } k[] = {
        {"microsoft-Phi-4-mini-instruct", "[{\"role\": \"user\", \"content\": \"hi\"}]", "<|system|><|tool|>@<|/tool|><|end|><|user|>hi<|end|><|assistant|>"},
        {"microsoft-Phi-4-mini-instruct", "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"hi\"}]",
         "<|system|>Be brief.<|tool|>@<|/tool|><|end|><|user|>hi<|end|><|assistant|>"},
        {"microsoft-Phi-4-mini-instruct", "[{\"role\": \"system\", \"content\": \"S\", \"tools\": \"[mine]\"}]",
         "<|system|>S<|tool|>[mine]<|/tool|><|end|><|assistant|>"},
        {"Qwen-Qwen2.5-7B-Instruct", "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL},
    };
    for (size_t c = 0; c < sizeof k / sizeof *k; c++) {
        ksrv *s;
        kiln_status err;
        ksrv_job *j = template_job(k[c].tmpl, "", &s, &err);
        KT_CHECK_OK(err);
        cJSON *tools = cJSON_Parse(k_tools_json), *msgs = cJSON_Parse(k[c].msgs);
        char *before = cJSON_PrintUnformatted(msgs);
        KT_CHECK_OK(ksrv_tools_phi4_system(j->tools, msgs, tools));
        if (!k[c].want) {
            char *after = cJSON_PrintUnformatted(msgs);
            KT_CHECK_STR(after, before);
            free(after);
        } else {
            kchat_input in = {.messages = msgs, .tools = tools, .add_generation_prompt = true};
            char *text = NULL, want[1024];
            KT_CHECK_OK(kchat_render(s->tmpl, &in, &text));
            const char *at = strchr(k[c].want, '@'); /* (the functions' text there) */
            if (at) snprintf(want, sizeof want, "%.*s%s%s", (int)(at - k[c].want), k[c].want, fn, at + 1);
            else snprintf(want, sizeof want, "%s", k[c].want);
            KT_CHECK_STR(text, want);
            free(text);
        }
        free(before);
        cJSON_Delete(msgs), cJSON_Delete(tools);
        free_job(j);
        free_fake(s);
    }
}

/* Special-token formats end to end, on random weights (kiln synth's tiny
 * shape) with real tokenizers: gpt-oss's (Harmony's markers are its special
 * tokens, generated as tokens under the grammar) and DeepSeek-V3's.
 * tool_choice required at temperature 1 gives one call whose arguments
 * validate against the schema, streamed and not. */
KT_TEST(server_tools_special_token_vocab) {
    static const struct {
        const char *tok, *tmpl;
    } k[] = {{"gptoss", "openai-gpt-oss-120b"}, {"deepseek3", "deepseek-ai-DeepSeek-V3.1"}};
    static const char *tool = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", \"strict\": true, "
                              "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", "
                              "\"maxLength\": 6}, \"days\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 9}}, "
                              "\"required\": [\"city\", \"days\"], \"additionalProperties\": false}}}]";
    cJSON *tools = cJSON_Parse(tool);
    const cJSON *schema = ku_json_get(ku_json_get(cJSON_GetArrayItem(tools, 0), "function"), "parameters");
    for (size_t c = 0; c < sizeof k / sizeof *k; c++) {
        char dir[] = "/tmp/kiln-tools-XXXXXX", root[PATH_MAX], from[PATH_MAX * 2], body[2048];
        KT_CHECK(mkdtemp(dir) && realpath(kt_root(), root));
        snprintf(from, sizeof from, "%s/tests/data/tokenizer/%s", root, k[c].tok);
        ktok *tok = NULL;
        KT_CHECK_OK(ktok_load(from, &tok));
        if (!tok) continue;
        ks_shape sh = *ks_shape_find("tiny");
        sh.vocab = ktok_vocab_size(tok);
        ktok_free(tok);
        KT_CHECK_OK(ks_synth(&sh, KS_BF16, 7, dir));
        const char *files[][2] = {{"tokenizer.json", "tokenizer.json"}, {"tokenizer_config.json", "tokenizer_config.json"}};
        for (int i = 0; i < 2; i++) {
            snprintf(from, sizeof from, "%s/tests/data/tokenizer/%s/%s", root, k[c].tok, files[i][0]);
            KT_CHECK(ckt_copy(from, dir, files[i][1]));
        }
        snprintf(from, sizeof from, "%s/tests/data/chat/templates/%s.jinja", root, k[c].tmpl);
        KT_CHECK(ckt_copy(from, dir, "chat_template.jinja"));
        ksrv_params p = {.model_dir = dir, .alias = "tiny", .parallel = 1, .ctx_size = 2048, .threads = 1, .quiet = true};
        ksrv *s = NULL;
        KT_CHECK_OK(ksrv_start(&p, &s));
        if (!s) continue;
        KT_CHECK_OK(ksrv_wait_ready(s));
        for (int stream = 0; stream < 2; stream++) {
            snprintf(body, sizeof body,
                     "{\"max_tokens\": 200, \"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], "
                     "\"tool_choice\": \"required\", \"parallel_tool_calls\": false, \"tools\": %s, \"stream\": %s, "
                     "\"temperature\": 1.0, \"seed\": %d}",
                     tool, stream ? "true" : "false", 1 + stream);
            ksrv_buf r = {0};
            long st;
            int n;
            char name[64], err[256] = "";
            bool content;
            cJSON *a = post_call(ksrv_port(s), body, stream, &st, &n, name, sizeof name, &content, &r);
            bool valid = a && kgr_validate(schema, schema, a, err, sizeof err) == KGR_V_VALID;
            KT_CHECKF(st == 200 && n == 1 && !strcmp(name, "get_weather") && valid && !content, "%s (stream %d): %ld %s %s",
                      k[c].tmpl, stream, st, err, r.p);
            cJSON_Delete(a);
            ksrv_buf_free(&r);
        }
        ksrv_stop(s);
        ckt_rmdir(dir);
    }
    cJSON_Delete(tools);
}

/* The events of an SSE body (their data objects, in order). */
static cJSON *sse_events(const char *body) {
    cJSON *l = cJSON_CreateArray();
    for (const char *q = body; (q = strstr(q, "data: {")); q++) {
        const char *e = strstr(q, "\n\n");
        cJSON *ev = cJSON_ParseWithLength(q + 6, e ? (size_t)(e - q - 6) : strlen(q + 6));
        if (ev) cJSON_AddItemToArray(l, ev);
    }
    return l;
}

/* POST body to path; the reply's events (*st its status, r its text). */
static cJSON *post_sse(int port, const char *path, const char *body, ksrv_buf *r, long *st) {
    *st = post_to(port, path, NULL, body, r);
    return sse_events(r->p ? r->p : "");
}

static const cJSON *first_event(const cJSON *evs, const char *type) {
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const cJSON *t = ku_json_get(e, "type");
        if (cJSON_IsString(t) && !strcmp(t->valuestring, type)) return e;
    }
    return NULL;
}

static bool is_int(const cJSON *v) { return cJSON_IsNumber(v) && v->valuedouble == (double)(int64_t)v->valuedouble; }

/* llama.cpp's tools/server/tests/unit/test_compat_anthropic.py and
 * test_compat_oai_responses.py, the cases that need neither a network nor a
 * vision model nor llama.cpp's own fields (timings, prompt_progress), over
 * the tiny model with Qwen2.5's template. Their "model" is the served one
 * ("tiny"): llama-server takes any name, kiln answers another with a 404. */
KT_TEST(server_tools_llama_cpp_compat) {
    char dir[] = "/tmp/kiln-tools-XXXXXX";
    ksrv *s;
    start_tiny("Qwen-Qwen2.5-7B-Instruct", dir, &s);
    int port = ksrv_port(s);
    static const char *weather = "[{\"name\": \"get_weather\", \"description\": \"Get the current weather in a location\", "
                                 "\"input_schema\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", "
                                 "\"description\": \"City name\"}}, \"required\": [\"location\"]}}]";
    static const char *tool_turns =
        "{\"role\": \"user\", \"content\": \"What's the weather?\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", "
        "\"id\": \"test123\", \"name\": \"get_weather\", \"input\": {\"location\": \"Paris\"}}]}";
    char body[4096];
    /* Anthropic: basic, with system, multipart content, a conversation */
    static const char *const plain[] = {
        "{\"model\": \"tiny\", \"max_tokens\": 50, \"messages\": [{\"role\": \"user\", \"content\": \"Say hello\"}]}",
        "{\"model\": \"tiny\", \"max_tokens\": 50, \"system\": \"You are a helpful assistant.\", \"messages\": [{\"role\": \"user\", "
        "\"content\": \"Hello\"}]}",
        "{\"model\": \"tiny\", \"max_tokens\": 50, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
        "\"What is\"}, {\"type\": \"text\", \"text\": \" the answer?\"}]}]}",
        "{\"model\": \"tiny\", \"max_tokens\": 50, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}, {\"role\": \"assistant\", "
        "\"content\": \"Hi there!\"}, {\"role\": \"user\", \"content\": \"How are you?\"}]}",
    };
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++) {
        ksrv_buf r = {0};
        long st = post_to(port, "/v1/messages", NULL, plain[i], &r);
        cJSON *b = cJSON_Parse(r.p);
        const cJSON *u = ku_json_get(b, "usage"), *c0 = cJSON_GetArrayItem(ku_json_get(b, "content"), 0);
        const cJSON *sr = ku_json_get(b, "stop_reason");
        KT_CHECKF(st == 200 && !strcmp(ku_json_get(b, "type")->valuestring, "message") &&
                      !strcmp(ku_json_get(b, "role")->valuestring, "assistant") && c0 &&
                      !strcmp(ku_json_get(c0, "type")->valuestring, "text") && cJSON_IsString(ku_json_get(c0, "text")) &&
                      cJSON_IsString(sr) && (!strcmp(sr->valuestring, "end_turn") || !strcmp(sr->valuestring, "max_tokens")) &&
                      is_int(ku_json_get(u, "cache_read_input_tokens")) && is_int(ku_json_get(u, "input_tokens")) &&
                      is_int(ku_json_get(u, "output_tokens")) && ku_json_get(u, "output_tokens")->valuedouble > 0 &&
                      !ku_json_get(b, "timings"),
                  "case %zu: %ld %s", i, st, r.p);
        cJSON_Delete(b);
        ksrv_buf_free(&r);
    }
    /* Anthropic streaming: the event sequence and its fields */
    {
        ksrv_buf r = {0};
        long st;
        cJSON *evs = post_sse(port, "/v1/messages",
                              "{\"model\": \"tiny\", \"max_tokens\": 30, \"messages\": [{\"role\": \"user\", \"content\": "
                              "\"Say hello\"}], \"stream\": true}",
                              &r, &st);
        const cJSON *ms = first_event(evs, "message_start"), *bs = first_event(evs, "content_block_start");
        const cJSON *bd = first_event(evs, "content_block_stop"), *md = first_event(evs, "message_delta");
        const cJSON *stop = first_event(evs, "message_stop"), *msg = ku_json_get(ms, "message");
        KT_CHECKF(st == 200 && ms && bs && bd && md && stop && first_event(evs, "content_block_delta"), "%ld %s", st, r.p);
        KT_CHECKF(!strcmp(ku_json_get(msg, "type")->valuestring, "message") && cJSON_IsArray(ku_json_get(msg, "content")) &&
                      cJSON_GetArraySize(ku_json_get(msg, "content")) == 0 &&
                      ku_json_get(ku_json_get(msg, "usage"), "input_tokens")->valuedouble > 0,
                  "%s", r.p);
        KT_CHECKF(ku_json_get(bs, "index")->valuedouble == 0 &&
                      !strcmp(ku_json_get(ku_json_get(bs, "content_block"), "type")->valuestring, "text") &&
                      ku_json_get(bd, "index")->valuedouble == 0,
                  "%s", r.p);
        const cJSON *e;
        cJSON_ArrayForEach(e, evs) {
            if (strcmp(ku_json_get(e, "type")->valuestring, "content_block_delta")) continue;
            KT_CHECKF(!strcmp(ku_json_get(ku_json_get(e, "delta"), "type")->valuestring, "text_delta") &&
                          cJSON_IsString(ku_json_get(ku_json_get(e, "delta"), "text")),
                      "%s", r.p);
        }
        const cJSON *sr = ku_json_get(ku_json_get(md, "delta"), "stop_reason");
        KT_CHECKF((!strcmp(sr->valuestring, "end_turn") || !strcmp(sr->valuestring, "max_tokens")) &&
                      ku_json_get(ku_json_get(md, "usage"), "output_tokens")->valuedouble > 0 && !ku_json_get(stop, "timings"),
                  "%s", r.p);
        cJSON_Delete(evs);
        ksrv_buf_free(&r);
    }
    /* count_tokens: input_tokens only, max_tokens not needed */
    static const char *const counts[] = {
        "{\"model\": \"tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello world\"}]}",
        "{\"model\": \"tiny\", \"system\": \"You are a helpful assistant.\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}",
    };
    for (size_t i = 0; i < 2; i++) {
        ksrv_buf r = {0};
        long st = post_to(port, "/v1/messages/count_tokens", NULL, counts[i], &r);
        cJSON *b = cJSON_Parse(r.p);
        KT_CHECKF(st == 200 && is_int(ku_json_get(b, "input_tokens")) && ku_json_get(b, "input_tokens")->valuedouble > 0 &&
                      !ku_json_get(b, "output_tokens"),
                  "%ld %s", st, r.p);
        cJSON_Delete(b);
        ksrv_buf_free(&r);
    }
    /* tool use: a tool_use block (if any) with stop_reason tool_use and an object input; tool results back */
    snprintf(body, sizeof body,
             "{\"model\": \"tiny\", \"max_tokens\": 200, \"tools\": %s, \"messages\": [{\"role\": \"user\", \"content\": \"What's the "
             "weather in Paris?\"}]}",
             weather);
    static const char *const results[] = {
        "[{\"type\": \"tool_result\", \"tool_use_id\": \"test123\", \"content\": \"The weather is sunny, 25\u00b0C\"}]",
        "[{\"type\": \"text\", \"text\": \"Here are the results:\"}, {\"type\": \"tool_result\", \"tool_use_id\": \"test123\", "
        "\"content\": \"Sunny, 25\u00b0C\"}]",
        "[{\"type\": \"tool_result\", \"tool_use_id\": \"test123\", \"is_error\": true, \"content\": \"City not found\"}]",
    };
    for (int i = -1; i < 3; i++) {
        char rb[2048];
        if (i >= 0)
            snprintf(rb, sizeof rb, "{\"model\": \"tiny\", \"max_tokens\": 100, \"messages\": [%s, {\"role\": \"user\", \"content\": %s}]}",
                     tool_turns, results[i]);
        ksrv_buf r = {0};
        long st = post_to(port, "/v1/messages", NULL, i < 0 ? body : rb, &r);
        cJSON *b = cJSON_Parse(r.p);
        const cJSON *content = ku_json_get(b, "content"), *blk;
        KT_CHECKF(st == 200 && !strcmp(ku_json_get(b, "type")->valuestring, "message") && cJSON_GetArraySize(content) > 0,
                  "case %d: %ld %s", i, st, r.p);
        cJSON_ArrayForEach(blk, content) {
            if (strcmp(ku_json_get(blk, "type")->valuestring, "tool_use")) continue;
            KT_CHECKF(!strcmp(ku_json_get(b, "stop_reason")->valuestring, "tool_use") && cJSON_IsString(ku_json_get(blk, "id")) &&
                          !strcmp(ku_json_get(blk, "name")->valuestring, "get_weather") && cJSON_IsObject(ku_json_get(blk, "input")),
                      "%s", r.p);
        }
        if (i == 0) KT_CHECKF(!strcmp(ku_json_get(cJSON_GetArrayItem(content, 0), "type")->valuestring, "text"), "%s", r.p);
        cJSON_Delete(b);
        ksrv_buf_free(&r);
    }
    /* Responses: text.format (json_schema const, json_object, text; json_schema without a schema is a 400) */
    static const struct {
        const char *format;
        int n, status;
        const char *text; /* the message's text starts with it */
    } k_fmt[] = {{"{\"type\": \"json_schema\", \"name\": \"test\", \"schema\": {\"const\": \"foooooo\"}}", 10, 200, "\"foooooo\""},
                 {"{\"type\": \"json_object\"}", 10, 200, "{"},
                 {"{\"type\": \"text\"}", 10, 200, ""},
                 {"{\"type\": \"json_schema\", \"name\": \"test\"}", 0, 400, NULL}};
    for (size_t i = 0; i < sizeof k_fmt / sizeof *k_fmt; i++) {
        snprintf(body, sizeof body, "{\"input\": \"Write an example\", \"max_output_tokens\": %d, \"text\": {\"format\": %s}}",
                 k_fmt[i].n ? k_fmt[i].n : 1, k_fmt[i].format);
        ksrv_buf r = {0};
        long st = post_to(port, "/v1/responses", NULL, body, &r);
        cJSON *b = cJSON_Parse(r.p);
        KT_CHECKF(st == k_fmt[i].status && (st == 200 || ku_json_get(b, "error")), "case %zu: %ld %s", i, st, r.p);
        if (k_fmt[i].text) {
            const cJSON *o, *msg = NULL;
            cJSON_ArrayForEach(o, ku_json_get(b, "output")) if (!strcmp(ku_json_get(o, "type")->valuestring, "message")) msg = o;
            const cJSON *t = ku_json_get(cJSON_GetArrayItem(ku_json_get(msg, "content"), 0), "text");
            KT_CHECKF(cJSON_IsString(t) && !strncmp(t->valuestring, k_fmt[i].text, strlen(k_fmt[i].text)), "case %zu: %s", i, r.p);
        }
        cJSON_Delete(b);
        ksrv_buf_free(&r);
    }
    /* Responses streamed: resp_ and msg_ ids, item ids kept, the deltas add up to the completed text */
    {
        ksrv_buf r = {0};
        long st;
        cJSON *evs = post_sse(port, "/v1/responses",
                              "{\"model\": \"tiny\", \"input\": [{\"role\": \"system\", \"content\": \"Book\"}, {\"role\": "
                              "\"user\", \"content\": \"What is the best book\"}], \"max_output_tokens\": 8, \"temperature\": 0.8, "
                              "\"stream\": true}",
                              &r, &st);
        const cJSON *e;
        char resp_id[64] = "", msg_id[64] = "";
        ksrv_buf text = {0};
        const cJSON *done = NULL;
        cJSON_ArrayForEach(e, evs) {
            const char *t = ku_json_get(e, "type")->valuestring;
            const cJSON *item = ku_json_get(e, "item"), *iid = ku_json_get(e, "item_id");
            if (!strcmp(t, "response.created")) snprintf(resp_id, sizeof resp_id, "%s", ku_json_get(ku_json_get(e, "response"), "id")->valuestring);
            if (!strcmp(t, "response.in_progress")) KT_CHECK_STR(ku_json_get(ku_json_get(e, "response"), "id")->valuestring, resp_id);
            if (!strcmp(t, "response.output_item.added")) snprintf(msg_id, sizeof msg_id, "%s", ku_json_get(item, "id")->valuestring);
            if (!strncmp(t, "response.content_part.", 22) || !strncmp(t, "response.output_text.", 21))
                KT_CHECKF(cJSON_IsString(iid) && !strcmp(iid->valuestring, msg_id), "%s", t);
            if (!strcmp(t, "response.output_item.done")) KT_CHECK_STR(ku_json_get(item, "id")->valuestring, msg_id);
            if (!strcmp(t, "response.output_text.delta")) ksrv_buf_str(&text, ku_json_get(e, "delta")->valuestring);
            if (!strcmp(t, "response.completed") || !strcmp(t, "response.incomplete")) done = ku_json_get(e, "response");
        }
        const cJSON *m0 = cJSON_GetArrayItem(ku_json_get(done, "output"), 0);
        const cJSON *t0 = ku_json_get(cJSON_GetArrayItem(ku_json_get(m0, "content"), 0), "text");
        KT_CHECKF(st == 200 && !strncmp(resp_id, "resp_", 5) && !strncmp(msg_id, "msg_", 4) && done &&
                      !strcmp(ku_json_get(m0, "id")->valuestring, msg_id) && cJSON_IsString(t0) &&
                      !strcmp(t0->valuestring, text.p ? text.p : ""),
                  "%ld %s", st, r.p);
        ksrv_buf_free(&text);
        cJSON_Delete(evs);
        ksrv_buf_free(&r);
    }
    ksrv_stop(s);
    ckt_rmdir(dir);
}

/* POST an Anthropic body; whether it is a 200 message (r: the reply). */
static bool anthropic_ok(int port, const char *body, ksrv_buf *r) {
    *r = (ksrv_buf){0};
    long st = post_to(port, "/v1/messages", NULL, body, r);
    cJSON *b = cJSON_Parse(r->p);
    const cJSON *t = ku_json_get(b, "type");
    bool ok = st == 200 && cJSON_IsString(t) && !strcmp(t->valuestring, "message");
    cJSON_Delete(b);
    return ok;
}

/* The rest of test_compat_anthropic.py (sampling fields, metadata,
 * thinking, errors, images on a text-only model, streamed block indices
 * with a tool, the OpenAI and Anthropic shapes side by side, thinking
 * history in count_tokens and in the template) and test_compat_oai_responses.py's
 * non-streamed ids, over the tiny model with Qwen3's template. Where kiln
 * differs on purpose: an empty "messages" is a 400 (Anthropic's API
 * refuses it; llama-server fills in defaults), and an image for a
 * text-only model is a 400 naming the block (llama-server: a 500). */
KT_TEST(server_tools_llama_cpp_compat_rest) {
    char dir[] = "/tmp/kiln-tools-XXXXXX";
    ksrv *s;
    start_tiny("Qwen-Qwen3-0.6B", dir, &s);
    int port = ksrv_port(s);
    ksrv_buf r;
    static const char *const fields[] = {"\"stop_sequences\": [\"\\n\", \"END\"]", "\"temperature\": 0.5", "\"top_p\": 0.9",
                                         "\"top_k\": 40", "\"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 50}",
                                         "\"metadata\": {\"user_id\": \"test_user_123\"}"};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\": \"tiny\", \"max_tokens\": 50, %s, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}",
                 fields[i]);
        KT_CHECKF(anthropic_ok(port, body, &r), "%s: %s", fields[i], r.p);
        ksrv_buf_free(&r);
    }
    /* errors, in Anthropic's shape */
    static const char *const bad[][2] = {
        {"{\"model\": \"tiny\", \"max_tokens\": 50}", "messages\\\": expected a non-empty list"},
        {"{\"model\": \"tiny\", \"max_tokens\": 50, \"messages\": []}", "messages\\\": expected a non-empty list"},
        {"{\"model\": \"tiny\", \"max_tokens\": 10, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"source\": "
         "{\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": \"iVBORw0KGgo=\"}}, {\"type\": \"text\", \"text\": \"What is this?\"}]}]}",
         "takes text only"},
        /* an image in a tool_result reaches the model (it was refused as "expected a text block") */
        {"{\"model\": \"tiny\", \"max_tokens\": 100, \"messages\": [{\"role\": \"user\", \"content\": \"What is in this image?\"}, {\"role\": "
         "\"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"tool_1\", \"name\": \"read\", \"input\": {\"file\": \"test.png\"}}]}, "
         "{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"tool_1\", \"content\": [{\"type\": \"text\", "
         "\"text\": \"File: test.png\"}, {\"type\": \"image\", \"source\": {\"type\": \"base64\", \"media_type\": \"image/png\", \"data\": "
         "\"iVBORw0KGgo=\"}}]}]}]}",
         "messages\\\"[2].content[1]: the model \\\"tiny\\\" takes text only"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = (ksrv_buf){0};
        long st = post_to(port, "/v1/messages", NULL, bad[i][0], &r);
        KT_CHECKF(st == 400 && strstr(r.p, "{\"type\": \"error\", \"error\": {\"type\": \"invalid_request_error\"") && strstr(r.p, bad[i][1]),
                  "case %zu: %ld %s", i, st, r.p);
        ksrv_buf_free(&r);
    }
    /* streamed with a tool (tool_choice any, so a tool_use block comes): indices 0, 1, ..., each stopped */
    {
        long st;
        cJSON *evs = post_sse(port, "/v1/messages",
                              "{\"model\": \"tiny\", \"max_tokens\": 400, \"stream\": true, \"tool_choice\": {\"type\": \"any\"}, "
                              "\"tools\": [{\"name\": \"test_tool\", \"description\": \"A test tool\", \"input_schema\": {\"type\": "
                              "\"object\", \"properties\": {\"param\": {\"type\": \"string\"}}, \"required\": [\"param\"]}}], "
                              "\"messages\": [{\"role\": \"user\", \"content\": \"Use the test tool\"}]}",
                              &r, &st);
        int starts = 0, stops = 0, tool = -1;
        const cJSON *e;
        cJSON_ArrayForEach(e, evs) {
            const char *t = ku_json_get(e, "type")->valuestring;
            const cJSON *idx = ku_json_get(e, "index"), *cb = ku_json_get(e, "content_block");
            if (!strcmp(t, "content_block_start")) {
                KT_CHECKF(is_int(idx) && idx->valuedouble == starts, "start %d: %s", starts, r.p);
                if (!strcmp(ku_json_get(cb, "type")->valuestring, "tool_use")) {
                    tool = starts;
                    KT_CHECKF(cJSON_IsString(ku_json_get(cb, "name")) && !strcmp(ku_json_get(cb, "name")->valuestring, "test_tool") &&
                                  cJSON_IsString(ku_json_get(cb, "id")),
                              "%s", r.p);
                }
                starts++;
            }
            if (!strcmp(t, "content_block_stop")) {
                KT_CHECKF(is_int(idx) && idx->valuedouble == stops && stops < starts, "stop %d: %s", stops, r.p);
                stops++;
            }
        }
        KT_CHECKF(st == 200 && starts == stops && tool >= 0 && first_event(evs, "message_start") && first_event(evs, "message_stop"),
                  "%ld %d/%d %s", st, starts, stops, r.p);
        cJSON_Delete(evs);
        ksrv_buf_free(&r);
    }
    /* the two shapes side by side */
    {
        ksrv_buf o = {0};
        long st = post(port, "{\"model\": \"tiny\", \"max_tokens\": 50, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}", &o);
        KT_CHECK(anthropic_ok(port, "{\"model\": \"tiny\", \"max_tokens\": 50, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}", &r));
        cJSON *a = cJSON_Parse(o.p), *b = cJSON_Parse(r.p);
        const cJSON *ua = ku_json_get(a, "usage"), *ub = ku_json_get(b, "usage");
        KT_CHECKF(st == 200 && !strcmp(ku_json_get(a, "object")->valuestring, "chat.completion") && ku_json_get(a, "choices") &&
                      !ku_json_get(a, "content") && ku_json_get(b, "content") && !ku_json_get(b, "choices") && !ku_json_get(b, "object") &&
                      ku_json_get(ua, "prompt_tokens") && ku_json_get(ua, "completion_tokens") && ku_json_get(ub, "input_tokens") &&
                      ku_json_get(ub, "output_tokens") && !ku_json_get(ub, "prompt_tokens"),
                  "%s\n%s", o.p, r.p);
        cJSON_Delete(a), cJSON_Delete(b);
        ksrv_buf_free(&o), ksrv_buf_free(&r);
    }
    /* thinking blocks of the history count (count_tokens) and render (/apply-template) */
    {
        static const char *tool = "{\"name\": \"list_files\", \"description\": \"List files\", \"input_schema\": {\"type\": \"object\", "
                                  "\"properties\": {\"path\": {\"type\": \"string\"}}, \"required\": [\"path\"]}}";
        int n[2];
        for (int with = 0; with < 2; with++) {
            char body[2048];
            snprintf(body, sizeof body,
                     "{\"model\": \"tiny\", \"tools\": [%s], \"messages\": [{\"role\": \"user\", \"content\": \"Fix the bug\"}, {\"role\": "
                     "\"assistant\", \"content\": [%s{\"type\": \"tool_use\", \"id\": \"call_1\", \"name\": \"list_files\", \"input\": "
                     "{\"path\": \".\"}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"call_1\", "
                     "\"content\": \"main.py\"}]}]}",
                     tool, with ? "{\"type\": \"thinking\", \"thinking\": \"I should check the project structure first to understand "
                                  "the codebase layout.\"}, "
                                : "");
            r = (ksrv_buf){0};
            long st = post_to(port, "/v1/messages/count_tokens", NULL, body, &r);
            cJSON *b = cJSON_Parse(r.p);
            n[with] = st == 200 && is_int(ku_json_get(b, "input_tokens")) ? (int)ku_json_get(b, "input_tokens")->valuedouble : -1;
            cJSON_Delete(b);
            KT_CHECKF(n[with] > 0, "%ld %s", st, r.p);
            ksrv_buf_free(&r);
        }
        KT_CHECKF(n[1] > n[0], "with thinking %d, without %d", n[1], n[0]);
        r = (ksrv_buf){0};
        long st = post_to(
            port, "/apply-template", NULL,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Fix the bug in main.py\"}, {\"role\": \"assistant\", \"content\": \"\", "
            "\"reasoning_content\": \"I should check the project structure first.\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": "
            "\"function\", \"function\": {\"name\": \"list_files\", \"arguments\": \"{\\\"path\\\": \\\".\\\"}\"}}]}, {\"role\": \"tool\", "
            "\"tool_call_id\": \"call_1\", \"content\": \"main.py\\nutils.py\"}, {\"role\": \"assistant\", \"content\": \"\", "
            "\"reasoning_content\": \"Now I need to read the main file.\", \"tool_calls\": [{\"id\": \"call_2\", \"type\": \"function\", "
            "\"function\": {\"name\": \"read_file\", \"arguments\": \"{\\\"path\\\": \\\"main.py\\\"}\"}}]}, {\"role\": \"tool\", "
            "\"tool_call_id\": \"call_2\", \"content\": \"print('hello')\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
            "\"list_files\", \"description\": \"List files\", \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": "
            "\"string\"}}, \"required\": [\"path\"]}}}]}",
            &r);
        cJSON *b = cJSON_Parse(r.p);
        const cJSON *pr = ku_json_get(b, "prompt");
        const char *p = cJSON_IsString(pr) ? pr->valuestring : "";
        int thinks = 0;
        for (const char *q = p; (q = strstr(q, "<think>")); q++) thinks++;
        KT_CHECKF(st == 200 && strstr(p, "I should check the project structure first.") && strstr(p, "Now I need to read the main file.") &&
                      thinks >= 2,
                  "%ld %s", st, r.p);
        cJSON_Delete(b);
        ksrv_buf_free(&r);
    }
    /* Responses, not streamed: resp_ and msg_ ids */
    {
        r = (ksrv_buf){0};
        long st = post_to(port, "/v1/responses", NULL,
                          "{\"model\": \"tiny\", \"input\": [{\"role\": \"system\", \"content\": \"Book\"}, {\"role\": \"user\", "
                          "\"content\": \"What is the best book\"}], \"max_output_tokens\": 8, \"temperature\": 0.8}",
                          &r);
        cJSON *b = cJSON_Parse(r.p);
        const cJSON *o0 = cJSON_GetArrayItem(ku_json_get(b, "output"), 0), *id = ku_json_get(b, "id"), *oid = ku_json_get(o0, "id");
        KT_CHECKF(st == 200 && cJSON_IsString(id) && !strncmp(id->valuestring, "resp_", 5) && cJSON_IsString(oid) &&
                      !strncmp(oid->valuestring, "msg_", 4),
                  "%ld %s", st, r.p);
        cJSON_Delete(b);
        ksrv_buf_free(&r);
    }
    ksrv_stop(s);
    ckt_rmdir(dir);
}

/* The llama oracle fixture, the 512-id tokenizer, and Qwen2.5's template
 * (chat_template.jinja comes before tokenizer_config.json's). */
KT_TEST(server_tools_end_to_end) {
    char dir[] = "/tmp/kiln-tools-XXXXXX";
    ksrv *s;
    start_tiny("Qwen-Qwen2.5-7B-Instruct", dir, &s);
    int port = ksrv_port(s);
    char body[4096];
    ksrv_buf r0 = {0}, r1 = {0}, r2 = {0}, r3 = {0};
    long st0 = post(port, "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"max_tokens\": 4}", &r0);
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": %s, \"max_tokens\": 4}",
             k_tools_json);
    long st1 = post(port, body, &r1);
    /* a whole round trip: the call (arguments as a string, content null) and its result */
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": "
             "null, \"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
             "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"abcdefghi\", "
             "\"content\": \"sunny\"}], \"tools\": %s, \"max_tokens\": 4, \"stream\": true}",
             k_tools_json);
    long st2 = post(port, body, &r2);
    long st3 = post(port, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": 3}", &r3);
    /* the agent APIs: Responses, Anthropic Messages (x-api-key), count_tokens, Anthropic's errors */
    ksrv_buf r4 = {0}, r5 = {0}, r6 = {0}, r7 = {0}, r8 = {0}, r9 = {0};
    snprintf(body, sizeof body,
             "{\"input\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"type\": \"function_call\", \"call_id\": "
             "\"abcdefghi\", \"name\": \"get_weather\", \"arguments\": \"{}\"}, {\"type\": \"function_call_output\", \"call_id\": "
             "\"abcdefghi\", \"output\": \"sunny\"}], \"tools\": [{\"type\": \"function\", \"name\": \"get_weather\", "
             "\"parameters\": {\"type\": \"object\"}}], \"max_output_tokens\": 3, \"stream\": true}");
    long st4 = post_to(port, "/v1/responses", NULL, body, &r4);
    const char *msg = "{\"max_tokens\": 3, \"system\": \"Be brief\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}";
    long st5 = post_to(port, "/v1/messages", "x-api-key: k", msg, &r5);
    long st6 = post_to(port, "/v1/messages/count_tokens", "x-api-key: k", msg, &r6);
    long st7 = post_to(port, "/v1/messages", "x-api-key: k", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}", &r7);
    long st8 = post_to(port, "/v1/messages", "x-api-key: wrong", msg, &r8);
    long st9 = post_to(port, "/v1/responses", NULL, "{\"input\": \"Hi\", \"max_output_tokens\": 2}", &r9);
    /* constrained calls: tool_choice required (whole) and a named function (streamed) give valid arguments */
    static const char *strict_tool =
        "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"strict\": true, \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"city\": {\"enum\": [\"Paris\", \"Rome\"]}, \"metric\": {\"type\": "
        "\"boolean\"}}, \"required\": [\"city\", \"metric\"], \"additionalProperties\": false}}}, {\"type\": \"function\", "
        "\"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", \"properties\": {}, "
        "\"additionalProperties\": false}}}]";
    ksrv_buf r10 = {0}, r11 = {0};
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": %s, \"tool_choice\": "
             "\"required\", \"parallel_tool_calls\": false, \"max_tokens\": 300, \"seed\": 3}",
             strict_tool);
    long st10 = post(port, body, &r10);
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": %s, \"tool_choice\": "
             "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, \"parallel_tool_calls\": false, \"max_tokens\": 300, \"stream\": true}",
             strict_tool);
    long st11 = post(port, body, &r11);
    ksrv_stop(s);
    ckt_rmdir(dir);
    KT_CHECKF(st0 == 200 && st1 == 200, "%ld %s / %ld %s", st0, r0.p, st1, r1.p);
    /* the tools are in the prompt */
    KT_CHECKF(prompt_tokens(r1.p) > prompt_tokens(r0.p) + 20, "%s vs %s", r1.p, r0.p);
    KT_CHECKF(st2 == 200 && strstr(r2.p, "data: [DONE]"), "%ld %s", st2, r2.p);
    KT_CHECKF(st3 == 400 && strstr(r3.p, "expected a list of tools"), "%ld %s", st3, r3.p);
    KT_CHECKF(st4 == 200 && strstr(r4.p, "event: response.created\n") && strstr(r4.p, "event: response.incomplete\n"), "%ld %s", st4, r4.p);
    KT_CHECKF(st5 == 200 && strstr(r5.p, "\"type\": \"message\"") && strstr(r5.p, "\"stop_reason\": \"max_tokens\""), "%ld %s", st5, r5.p);
    KT_CHECKF(st6 == 200 && prompt_tokens(r5.p) < 0 && strstr(r6.p, "\"input_tokens\": "), "%ld %s", st6, r6.p);
    KT_CHECKF(st7 == 400 && strstr(r7.p, "{\"type\": \"error\", \"error\": {\"type\": \"invalid_request_error\""), "%ld %s", st7, r7.p);
    KT_CHECKF(st8 == 401 && strstr(r8.p, "authentication_error"), "%ld %s", st8, r8.p);
    KT_CHECKF(st9 == 200 && strstr(r9.p, "\"object\": \"response\""), "%ld %s", st9, r9.p);
    KT_CHECKF(st10 == 200, "%ld %s", st10, r10.p);
    cJSON *c10 = cJSON_Parse(r10.p);
    const cJSON *m10 = ku_json_get(cJSON_GetArrayItem(ku_json_get(c10, "choices"), 0), "message");
    const cJSON *f10 = ku_json_get(cJSON_GetArrayItem(ku_json_get(m10, "tool_calls"), 0), "function");
    const cJSON *n10 = ku_json_get(f10, "name"), *a10 = ku_json_get(f10, "arguments");
    KT_CHECKF(cJSON_IsString(n10) && cJSON_IsString(a10), "%s", r10.p);
    cJSON *args = cJSON_Parse(a10 ? a10->valuestring : "");
    if (!strcmp(n10->valuestring, "get_weather")) {
        const cJSON *city = ku_json_get(args, "city");
        KT_CHECKF(cJSON_IsString(city) && (!strcmp(city->valuestring, "Paris") || !strcmp(city->valuestring, "Rome")) &&
                      cJSON_IsBool(ku_json_get(args, "metric")) && cJSON_GetArraySize(args) == 2,
                  "%s", r10.p);
    } else {
        KT_CHECKF(!strcmp(n10->valuestring, "get_time") && cJSON_IsObject(args) && !args->child, "%s", r10.p);
    }
    KT_CHECKF(strstr(r10.p, "\"finish_reason\": \"tool_calls\""), "%s", r10.p);
    cJSON_Delete(args), cJSON_Delete(c10);
    /* streamed: the name first, then argument fragments that join into the schema's object */
    KT_CHECKF(st11 == 200 && strstr(r11.p, "\"name\": \"get_weather\"") && strstr(r11.p, "\"finish_reason\": \"tool_calls\""),
              "%ld %s", st11, r11.p);
    ksrv_buf joined = {0};
    for (const char *q = r11.p; (q = strstr(q, "data: {")); q++) {
        const char *e = strstr(q, "\n\n");
        cJSON *ev = cJSON_ParseWithLength(q + 6, e ? (size_t)(e - q - 6) : strlen(q + 6));
        const cJSON *tc = cJSON_GetArrayItem(ku_json_get(ku_json_get(cJSON_GetArrayItem(ku_json_get(ev, "choices"), 0), "delta"), "tool_calls"), 0);
        const cJSON *frag = ku_json_get(ku_json_get(tc, "function"), "arguments");
        if (cJSON_IsString(frag)) ksrv_buf_str(&joined, frag->valuestring);
        cJSON_Delete(ev);
    }
    args = cJSON_Parse(joined.p ? joined.p : "");
    KT_CHECKF(cJSON_IsString(ku_json_get(args, "city")) && cJSON_IsBool(ku_json_get(args, "metric")), "%s", joined.p);
    cJSON_Delete(args);
    ksrv_buf_free(&joined), ksrv_buf_free(&r10), ksrv_buf_free(&r11);
    ksrv_buf_free(&r0), ksrv_buf_free(&r1), ksrv_buf_free(&r2), ksrv_buf_free(&r3);
    ksrv_buf_free(&r4), ksrv_buf_free(&r5), ksrv_buf_free(&r6), ksrv_buf_free(&r7), ksrv_buf_free(&r8), ksrv_buf_free(&r9);
}

/* Mistral's templates refuse tool-call ids other than 9 characters; ids of
 * other servers (OpenAI's call_..., Anthropic's toolu_..., kiln's own
 * toolu_ + 9) are fitted to 9 alphanumerics, a call and its result alike
 * (found by tests/e2e/agent_families.mjs: a Messages tool_result turn on
 * Mistral Nemo was a 400). */
KT_TEST(server_tools_mistral_fits_foreign_ids) {
    cJSON *m = cJSON_Parse("[{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"toolu_abcdefghi\"}, {\"id\": \"c1\"}, "
                           "{\"id\": \"Az0123456\"}, {\"id\": \"call_9x_Y-z\"}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\"}, "
                           "{\"role\": \"tool\", \"tool_call_id\": \"toolu_abcdefghi\"}]");
    KT_CHECK_OK(ksrv_tools_fit_ids(m));
    const cJSON *tc = ku_json_get(cJSON_GetArrayItem(m, 0), "tool_calls");
    const char *c1 = ku_json_get(cJSON_GetArrayItem(tc, 1), "id")->valuestring;
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(tc, 0), "id")->valuestring, "abcdefghi"); /* its last 9 alphanumerics */
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(tc, 2), "id")->valuestring, "Az0123456"); /* kept */
    KT_CHECKF(strlen(c1) == 9 && strspn(c1, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 9, "%s", c1);
    const char *c3 = ku_json_get(cJSON_GetArrayItem(tc, 3), "id")->valuestring; /* 8 alphanumerics: a hash */
    KT_CHECKF(strlen(c3) == 9 && strspn(c3, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == 9 && strcmp(c3, c1), "%s", c3);
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(m, 1), "tool_call_id")->valuestring, c1);
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(m, 2), "tool_call_id")->valuestring, "abcdefghi");
    cJSON_Delete(m);
    /* over loopback: chat with OpenAI-style ids, Messages with Anthropic's */
    char dir[] = "/tmp/kiln-tools-XXXXXX", body[4096];
    ksrv *s;
    start_tiny("mistralai-Mistral-Nemo-Instruct-2407", dir, &s);
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": "
             "null, \"tool_calls\": [{\"id\": \"call_Yx2q8R1fZ0aB\", \"type\": \"function\", \"function\": {\"name\": "
             "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
             "\"call_Yx2q8R1fZ0aB\", \"content\": \"sunny\"}], \"tools\": %s, \"max_tokens\": 2}",
             k_tools_json);
    ksrv_buf r0 = {0}, r1 = {0};
    long st0 = post(ksrv_port(s), body, &r0);
    long st1 = post_to(ksrv_port(s), "/v1/messages", "x-api-key: k",
                       "{\"max_tokens\": 2, \"tools\": [{\"name\": \"get_weather\", \"input_schema\": {\"type\": \"object\"}}], "
                       "\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": "
                       "[{\"type\": \"tool_use\", \"id\": \"toolu_01A09q90qw90lq917835lq9\", \"name\": \"get_weather\", \"input\": "
                       "{\"city\": \"Paris\"}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": "
                       "\"toolu_01A09q90qw90lq917835lq9\", \"content\": \"sunny\"}]}]}",
                       &r1);
    ksrv_stop(s);
    ckt_rmdir(dir);
    KT_CHECKF(st0 == 200 && st1 == 200, "%ld %s / %ld %s", st0, r0.p, st1, r1.p);
    ksrv_buf_free(&r0), ksrv_buf_free(&r1);
}

/* ---------------------------------------------------------------- the agent APIs */

#include "server/agent.h"

/* A Responses or Messages job of one choice over the fake server, its
 * events already produced (all ended). */
static ksrv_job *agent_job(ksrv *s, ksrv_api api, bool stream, const char *const *pieces, kgen_finish fin) {
    kiln_status st;
    ksrv_job *j = fake_job(s, "", &st);
    kiln_status_free(st);
    j->stream = stream;
    pthread_mutex_init(&j->mu, NULL);
    ksrv_agent *a = calloc(1, sizeof *a);
    a->api = api;
    a->fn = api == KSRV_API_RESPONSES ? &ksrv_responses_api : &ksrv_anthropic_api;
    a->open = -1;
    a->req = cJSON_Parse(k_tools_json);
    ktc_syntax syn = ksrv_tools_syntax(j->tools);
    a->st = ktc_stream_create(&syn);
    snprintf(a->id, sizeof a->id, "%s", api == KSRV_API_RESPONSES ? "resp_x" : "msg_x");
    j->agent = a;
    int n = 0;
    while (pieces[n]) n++;
    j->ev = calloc((size_t)n + 1, sizeof *j->ev);
    for (int k = 0; k < n; k++)
        j->ev[k] = (ksrv_ev){.text = (char *)pieces[k], .len = strlen(pieces[k]), .finish = k == n - 1 ? fin : KGEN_CONTINUE};
    j->ev[n] = (ksrv_ev){.end = true, .n_generated = 7};
    j->n_ev = n + 1;
    j->n_submitted = j->n_ended = 1;
    j->ch[0] = (ksrv_choice){.job = j, .finish = fin, .n_generated = 7};
    j->n_prompts = 1;
    j->n_prompt = calloc(1, sizeof *j->n_prompt);
    j->n_prompt[0] = 11;
    return j;
}

static void free_agent_job(ksrv_job *j) {
    ksrv_agent_free(j->agent);
    free(j->ev);
    free(j->n_prompt);
    pthread_mutex_destroy(&j->mu);
    free_job(j);
}

/* The data of the stream's events named type, in order (cJSON array). */
static cJSON *events(const char *sse, const char *type) {
    cJSON *out = cJSON_CreateArray();
    char want[96];
    snprintf(want, sizeof want, "event: %s\ndata: ", type);
    for (const char *p = sse; (p = strstr(p, want));) {
        p += strlen(want);
        const char *e = strstr(p, "\n\n");
        cJSON_AddItemToArray(out, cJSON_ParseWithLength(p, (size_t)(e - p)));
        p = e;
    }
    return out;
}

/* The same output streamed (js) and whole (jn, its body in *body). */
static bool both_ways(ksrv *s, ksrv_api api, ksrv_job **js, ksrv_job **jn, ksrv_buf *body);

static const char *k_agent_out[] = {"<think>Plan", " it.</think>\n\nChecking.", "\n<tool_call>\n{\"name\": \"get_weather\", ",
                                    "\"arguments\": {\"city\": ", "\"Paris\"}}\n</tool_call>", NULL};

static bool both_ways(ksrv *s, ksrv_api api, ksrv_job **js, ksrv_job **jn, ksrv_buf *body) {
    *js = agent_job(s, api, true, k_agent_out, KGEN_FINISH_EOS);
    ksrv_agent_stream(*js);
    *jn = agent_job(s, api, false, k_agent_out, KGEN_FINISH_EOS);
    *body = (ksrv_buf){0};
    return (*js)->done_sent && !(*js)->out.oom && ksrv_agent_response(*jn, body) == 200;
}

static ksrv *qwen3_server(void) {
    char *src = template_text("Qwen-Qwen3-0.6B");
    ksrv *s = fake_server(src ? src : "");
    free(src);
    return s;
}

KT_TEST(server_responses_output_items_and_events) {
    ksrv *s = qwen3_server();
    ksrv_job *js, *jn;
    ksrv_buf body;
    KT_CHECK(both_ways(s, KSRV_API_RESPONSES, &js, &jn, &body));
    cJSON *whole = cJSON_Parse(body.p), *done = events(js->out.p, "response.completed");
    KT_CHECKF(whole && cJSON_GetArraySize(done) == 1, "%s", js->out.p);
    const cJSON *streamed = ku_json_get(cJSON_GetArrayItem(done, 0), "response");
    /* the items: reasoning, message, function_call; the same streamed or not */
    const cJSON *out = ku_json_get(whole, "output");
    KT_CHECKF(cJSON_GetArraySize(out) == 3, "%s", body.p);
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(out, 0), "type")->valuestring, "reasoning");
    const cJSON *msg = cJSON_GetArrayItem(out, 1), *fc = cJSON_GetArrayItem(out, 2);
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(ku_json_get(msg, "content"), 0), "text")->valuestring, "Checking.");
    KT_CHECK_STR(ku_json_get(fc, "name")->valuestring, "get_weather");
    KT_CHECK_STR(ku_json_get(fc, "arguments")->valuestring, "{\"city\": \"Paris\"}");
    const cJSON *sout = ku_json_get(streamed, "output");
    KT_CHECK(strlen(ku_json_get(fc, "call_id")->valuestring) == 9); /* (each job draws its own ids) */
    cJSON_DeleteItemFromObject(cJSON_GetArrayItem(out, 2), "call_id");
    cJSON_DeleteItemFromObject(cJSON_GetArrayItem(sout, 2), "call_id");
    KT_CHECKF(cJSON_Compare(out, sout, true), "%s\n%s", body.p, js->out.p);
    KT_CHECK_STR(ku_json_get(whole, "status")->valuestring, "completed");
    KT_CHECK_EQ(ku_json_get(ku_json_get(whole, "usage"), "input_tokens")->valuedouble, 11);
    /* the typed events: sequence numbers 0, 1, ...; deltas add up */
    int seq = 0;
    for (const char *p = js->out.p; (p = strstr(p, "\"sequence_number\": "));) {
        p += 19;
        KT_CHECKF(atoi(p) == seq, "sequence number %d, want %d", atoi(p), seq);
        seq++;
    }
    KT_CHECKF(seq > 10, "%d events", seq);
    static const char *const order[] = {"response.created", "response.in_progress", "response.output_item.added",
                                        "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done",
                                        "response.content_part.done", "response.output_item.done", "response.content_part.added",
                                        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
                                        "response.function_call_arguments.delta", "response.function_call_arguments.done",
                                        "response.completed"};
    const char *at = js->out.p;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        char ev[96];
        snprintf(ev, sizeof ev, "event: %s\n", order[i]);
        const char *f = strstr(at, ev);
        KT_CHECKF(f, "no %s after the earlier events:\n%s", order[i], js->out.p);
        at = f;
    }
    cJSON *ad = events(js->out.p, "response.function_call_arguments.delta");
    ksrv_buf args = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, ad) ksrv_buf_str(&args, ku_json_get(e, "delta")->valuestring);
    KT_CHECK_STR(args.p, "{\"city\": \"Paris\"}");
    ksrv_buf_free(&args);
    cJSON_Delete(ad), cJSON_Delete(whole), cJSON_Delete(done);
    ksrv_buf_free(&body);
    free_agent_job(js), free_agent_job(jn);
    /* cut short: incomplete, max_output_tokens */
    static const char *const cut[] = {"Hello", NULL};
    jn = agent_job(s, KSRV_API_RESPONSES, false, cut, KGEN_FINISH_LENGTH);
    KT_CHECK_EQ(ksrv_agent_response(jn, &body), 200);
    KT_CHECKF(strstr(body.p, "\"status\": \"incomplete\"") && strstr(body.p, "max_output_tokens"), "%s", body.p);
    cJSON *cw = cJSON_Parse(body.p);
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(ku_json_get(cw, "output"), 0), "status")->valuestring, "incomplete");
    cJSON_Delete(cw);
    ksrv_buf_free(&body);
    free_agent_job(jn);
    free_fake(s);
}

KT_TEST(server_anthropic_content_blocks_and_events) {
    ksrv *s = qwen3_server();
    ksrv_job *js, *jn;
    ksrv_buf body;
    KT_CHECK(both_ways(s, KSRV_API_ANTHROPIC, &js, &jn, &body));
    cJSON *whole = cJSON_Parse(body.p);
    const cJSON *content = ku_json_get(whole, "content");
    KT_CHECKF(cJSON_GetArraySize(content) == 3, "%s", body.p);
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(content, 0), "thinking")->valuestring, "Plan it.");
    KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(content, 1), "text")->valuestring, "Checking.");
    const cJSON *tu = cJSON_GetArrayItem(content, 2);
    KT_CHECK_STR(ku_json_get(tu, "type")->valuestring, "tool_use");
    KT_CHECK_STR(ku_json_get(ku_json_get(tu, "input"), "city")->valuestring, "Paris");
    KT_CHECK_STR(ku_json_get(whole, "stop_reason")->valuestring, "tool_use");
    /* the stream's blocks rebuilt from its deltas equal the whole message */
    cJSON *starts = events(js->out.p, "content_block_start"), *deltas = events(js->out.p, "content_block_delta");
    KT_CHECK_EQ(cJSON_GetArraySize(starts), 3);
    ksrv_buf acc[3] = {{0}};
    const cJSON *e;
    cJSON_ArrayForEach(e, deltas) {
        int i = (int)ku_json_get(e, "index")->valuedouble;
        const cJSON *d = ku_json_get(e, "delta");
        const char *ty = ku_json_get(d, "type")->valuestring;
        const cJSON *v = ku_json_get(d, !strcmp(ty, "text_delta") ? "text" : !strcmp(ty, "thinking_delta") ? "thinking" : "partial_json");
        if (v && i >= 0 && i < 3) ksrv_buf_str(&acc[i], v->valuestring);
    }
    KT_CHECK_STR(acc[0].p, "Plan it.");
    KT_CHECK_STR(acc[1].p, "Checking.");
    cJSON *in = cJSON_Parse(acc[2].p);
    KT_CHECK(cJSON_Compare(in, ku_json_get(tu, "input"), true));
    KT_CHECK_STR(ku_json_get(ku_json_get(cJSON_GetArrayItem(starts, 2), "content_block"), "id")->valuestring,
                 ku_json_get(tu, "id")->valuestring);
    cJSON *md = events(js->out.p, "message_delta");
    KT_CHECK_STR(ku_json_get(ku_json_get(cJSON_GetArrayItem(md, 0), "delta"), "stop_reason")->valuestring, "tool_use");
    KT_CHECK(strstr(js->out.p, "event: message_start\n") == js->out.p && strstr(js->out.p, "event: message_stop\n"));
    cJSON_Delete(in), cJSON_Delete(md), cJSON_Delete(starts), cJSON_Delete(deltas), cJSON_Delete(whole);
    for (int i = 0; i < 3; i++) ksrv_buf_free(&acc[i]);
    ksrv_buf_free(&body);
    free_agent_job(js), free_agent_job(jn);
    free_fake(s);
}

/* Messages' sampling fields reach the chat body: Anthropic's, and kiln's
 * seed (as on the OpenAI routes), so that a sampled message can be
 * reproduced; without one the chat body has none either. */
KT_TEST(server_anthropic_sampling_fields_and_seed) {
    cJSON *body = cJSON_Parse("{\"model\": \"m\", \"max_tokens\": 9, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                              "\"temperature\": 0.5, \"top_k\": 4, \"seed\": 7}");
    cJSON *chat = cJSON_CreateObject();
    KT_CHECK_OK(ksrv_anthropic_fill(body, chat));
    const cJSON *seed = ku_json_get(chat, "seed"), *tk = ku_json_get(chat, "top_k"), *t = ku_json_get(chat, "temperature");
    KT_CHECK(cJSON_IsNumber(seed) && seed->valuedouble == 7);
    KT_CHECK(cJSON_IsNumber(tk) && tk->valuedouble == 4 && cJSON_IsNumber(t) && t->valuedouble == 0.5);
    cJSON_Delete(chat), cJSON_Delete(body);
    body = cJSON_Parse("{\"model\": \"m\", \"max_tokens\": 9, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}");
    chat = cJSON_CreateObject();
    KT_CHECK_OK(ksrv_anthropic_fill(body, chat));
    KT_CHECK(!ku_json_get(chat, "seed"));
    cJSON_Delete(chat), cJSON_Delete(body);
}

/* Tag formats (Qwen3-Coder's <function=..><parameter=..>, GLM-4.5's
 * <arg_key>/<arg_value>), cut inside the tags and the values: in Responses
 * and Messages the streamed argument fragments (several: a value streams as
 * it is written) join to the final arguments, the reasoning (GLM's <think>)
 * streams in its own item / block, and the whole response has the same. */
static const struct {
    const char *tmpl, *pieces[8], *reasoning, *text;
} k_tag_out[] = {
    {"Qwen3-Coder",
     {"Let me see.\n<tool", "_call>\n<function=get_weather>\n<param", "eter=city>\nPa", "ris and Ly", "on\n</parameter>\n</fun",
      "ction>\n</tool_call>", NULL},
     "", "Let me see."},
    {"GLM-4.7-Flash",
     {"<think>Need the", " weather.</think>Checking.<tool_call>get_weather<arg_", "key>ci", "ty</arg_key><arg_value>Pa", "ris and Ly",
      "on</arg_value></tool_call>", NULL},
     "Need the weather.", "Checking."},
};

/* The concatenated strings at key of the objects at path (NULL: the events
 * themselves) of the events of type whose index field (NULL: any) is idx. */
static char *joined(const char *sse, const char *type, const char *path, const char *key, const char *ikey, int idx) {
    cJSON *ev = events(sse, type);
    ksrv_buf b = {0};
    ksrv_buf_str(&b, "");
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        if (ikey && ku_json_get(e, ikey)->valuedouble != idx) continue;
        const cJSON *v = ku_json_get(path ? ku_json_get(e, path) : e, key);
        if (cJSON_IsString(v)) ksrv_buf_str(&b, v->valuestring);
    }
    cJSON_Delete(ev);
    return b.p;
}

KT_TEST(server_agent_tag_format_arguments_stream) {
    cJSON *want = cJSON_Parse("{\"city\": \"Paris and Lyon\"}");
    for (size_t t = 0; t < sizeof k_tag_out / sizeof *k_tag_out; t++) {
        char *src = template_text(k_tag_out[t].tmpl);
        KT_CHECKF(src, "%s", k_tag_out[t].tmpl);
        ksrv *s = fake_server(src ? src : "");
        free(src);
        bool think = *k_tag_out[t].reasoning;
        /* Responses */
        ksrv_job *js = agent_job(s, KSRV_API_RESPONSES, true, k_tag_out[t].pieces, KGEN_FINISH_EOS);
        ksrv_agent_stream(js);
        ksrv_job *jn = agent_job(s, KSRV_API_RESPONSES, false, k_tag_out[t].pieces, KGEN_FINISH_EOS);
        ksrv_buf body = {0};
        KT_CHECK(js->done_sent && !js->out.oom && ksrv_agent_response(jn, &body) == 200);
        cJSON *whole = cJSON_Parse(body.p);
        const cJSON *out = ku_json_get(whole, "output"), *fc = cJSON_GetArrayItem(out, cJSON_GetArraySize(out) - 1);
        KT_CHECKF(cJSON_GetArraySize(out) == (think ? 3 : 2) && !strcmp(ku_json_get(fc, "type")->valuestring, "function_call") &&
                      !strcmp(ku_json_get(fc, "name")->valuestring, "get_weather"),
                  "%s: %s", k_tag_out[t].tmpl, body.p);
        const char *args = ku_json_get(fc, "arguments")->valuestring;
        cJSON *a = cJSON_Parse(args);
        KT_CHECKF(cJSON_Compare(a, want, true), "%s: %s", k_tag_out[t].tmpl, args);
        cJSON_Delete(a);
        cJSON *deltas = events(js->out.p, "response.function_call_arguments.delta");
        KT_CHECKF(cJSON_GetArraySize(deltas) > 1, "%s: %d argument deltas", k_tag_out[t].tmpl, cJSON_GetArraySize(deltas));
        cJSON_Delete(deltas);
        char *d = joined(js->out.p, "response.function_call_arguments.delta", NULL, "delta", NULL, 0);
        char *done = joined(js->out.p, "response.function_call_arguments.done", NULL, "arguments", NULL, 0);
        KT_CHECKF(!strcmp(d, args) && !strcmp(done, args), "%s: %s / %s / %s", k_tag_out[t].tmpl, d, done, args);
        free(d), free(done);
        char *r = joined(js->out.p, "response.reasoning_text.delta", NULL, "delta", NULL, 0);
        char *rpart = joined(js->out.p, "response.content_part.done", "part", "text", NULL, 0);
        char *text = joined(js->out.p, "response.output_text.delta", NULL, "delta", NULL, 0);
        KT_CHECK_STR(r, k_tag_out[t].reasoning);
        KT_CHECK_STR(text, k_tag_out[t].text);
        /* each text (reasoning, message) opens and closes its content part */
        char both[256];
        snprintf(both, sizeof both, "%s%s", k_tag_out[t].reasoning, k_tag_out[t].text);
        KT_CHECK_STR(rpart, both);
        free(r), free(rpart), free(text);
        if (think) {
            const char *ra = strstr(js->out.p, "\"type\": \"reasoning_text\", \"text\": \"\"}");
            KT_CHECKF(ra && ra < strstr(js->out.p, "event: response.reasoning_text.delta"), "%s", js->out.p);
        }
        cJSON_Delete(whole);
        ksrv_buf_free(&body);
        free_agent_job(js), free_agent_job(jn);
        /* Messages */
        js = agent_job(s, KSRV_API_ANTHROPIC, true, k_tag_out[t].pieces, KGEN_FINISH_EOS);
        ksrv_agent_stream(js);
        jn = agent_job(s, KSRV_API_ANTHROPIC, false, k_tag_out[t].pieces, KGEN_FINISH_EOS);
        body = (ksrv_buf){0};
        KT_CHECK(js->done_sent && !js->out.oom && ksrv_agent_response(jn, &body) == 200);
        whole = cJSON_Parse(body.p);
        const cJSON *content = ku_json_get(whole, "content");
        int n = cJSON_GetArraySize(content);
        const cJSON *tu = cJSON_GetArrayItem(content, n - 1);
        KT_CHECKF(n == (think ? 3 : 2) && !strcmp(ku_json_get(tu, "type")->valuestring, "tool_use") &&
                      cJSON_Compare(ku_json_get(tu, "input"), want, true) &&
                      !strcmp(ku_json_get(whole, "stop_reason")->valuestring, "tool_use"),
                  "%s: %s", k_tag_out[t].tmpl, body.p);
        char *pj = joined(js->out.p, "content_block_delta", "delta", "partial_json", "index", n - 1);
        cJSON *in = cJSON_Parse(pj);
        KT_CHECKF(cJSON_Compare(in, ku_json_get(tu, "input"), true), "%s: %s", k_tag_out[t].tmpl, pj);
        cJSON_Delete(in);
        free(pj);
        if (think) {
            char *th = joined(js->out.p, "content_block_delta", "delta", "thinking", "index", 0);
            KT_CHECK_STR(th, k_tag_out[t].reasoning);
            KT_CHECK_STR(ku_json_get(cJSON_GetArrayItem(content, 0), "thinking")->valuestring, k_tag_out[t].reasoning);
            free(th);
        }
        char *tx = joined(js->out.p, "content_block_delta", "delta", "text", "index", think ? 1 : 0);
        KT_CHECK_STR(tx, k_tag_out[t].text);
        free(tx);
        cJSON_Delete(whole);
        ksrv_buf_free(&body);
        free_agent_job(js), free_agent_job(jn);
        free_fake(s);
    }
    cJSON_Delete(want);
}

/* The requests as chat bodies. */
KT_TEST(server_agent_requests_to_chat) {
    cJSON *b = cJSON_Parse(
        "{\"instructions\": \"Be brief\", \"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"Hi\"}]}, "
        "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{}\"}, {\"type\": \"function_call_output\", "
        "\"call_id\": \"c1\", \"output\": \"ok\"}], \"tools\": [{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}], "
        "\"tool_choice\": {\"type\": \"function\", \"name\": \"f\"}, \"max_output_tokens\": 9, \"reasoning\": {\"effort\": \"low\"}}");
    cJSON *c;
    KT_CHECK_OK(ksrv_agent_to_chat(KSRV_API_RESPONSES, b, &c));
    char *t = cJSON_PrintUnformatted(c);
    KT_CHECKF(strstr(t, "{\"role\":\"system\",\"content\":\"Be brief\"}") && strstr(t, "\"tool_calls\":[{\"id\":\"c1\"") &&
                  strstr(t, "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}") &&
                  strstr(t, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"") && strstr(t, "\"max_tokens\":9") &&
                  strstr(t, "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}") &&
                  strstr(t, "\"reasoning_effort\":\"low\""),
              "%s", t);
    free(t);
    cJSON_Delete(c), cJSON_Delete(b);
    b = cJSON_Parse("{\"max_tokens\": 5, \"system\": [{\"type\": \"text\", \"text\": \"S\"}], \"messages\": [{\"role\": \"user\", \"content\": "
                    "\"Hi\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"hm\"}, {\"type\": \"tool_use\", "
                    "\"id\": \"t1\", \"name\": \"f\", \"input\": {\"a\": 1}}]}, {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", "
                    "\"tool_use_id\": \"t1\", \"content\": [{\"type\": \"text\", \"text\": \"done\"}]}]}], \"tools\": [{\"name\": \"f\", "
                    "\"input_schema\": {\"type\": \"object\"}}], \"tool_choice\": {\"type\": \"any\"}, \"thinking\": {\"type\": \"disabled\"}, "
                    "\"stop_sequences\": [\"END\"]}");
    KT_CHECK_OK(ksrv_agent_to_chat(KSRV_API_ANTHROPIC, b, &c));
    t = cJSON_PrintUnformatted(c);
    KT_CHECKF(strstr(t, "{\"role\":\"system\",\"content\":\"S\"}") && strstr(t, "\"reasoning_content\":\"hm\"") &&
                  strstr(t, "\"arguments\":{\"a\":1}") && strstr(t, "{\"role\":\"tool\",\"tool_call_id\":\"t1\",\"content\":\"done\"}") &&
                  strstr(t, "\"parameters\":{\"type\":\"object\"}") && strstr(t, "\"tool_choice\":\"required\"") &&
                  strstr(t, "\"enable_thinking\":false") && strstr(t, "\"stop\":[\"END\"]"),
              "%s", t);
    free(t);
    cJSON_Delete(c), cJSON_Delete(b);
    /* thinking's budget_tokens: the reasoning budget; a bad one is a 400 naming it */
    b = cJSON_Parse("{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"thinking\": "
                    "{\"type\": \"enabled\", \"budget_tokens\": 1024}}");
    KT_CHECK_OK(ksrv_agent_to_chat(KSRV_API_ANTHROPIC, b, &c));
    t = cJSON_PrintUnformatted(c);
    KT_CHECKF(strstr(t, "\"reasoning_budget\":1024") && strstr(t, "\"enable_thinking\":true"), "%s", t);
    free(t);
    cJSON_Delete(c), cJSON_Delete(b);
    b = cJSON_Parse("{\"max_tokens\": 5, \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": 0.5}}");
    kiln_status bst = ksrv_agent_to_chat(KSRV_API_ANTHROPIC, b, &c);
    KT_CHECKF(bst && strstr(kiln_status_msg(bst), "thinking.budget_tokens"), "%s", kiln_status_msg(bst));
    kiln_status_free(bst);
    cJSON_Delete(b);
    /* a developer message in the middle joins the leading system message */
    b = cJSON_Parse("{\"instructions\": \"A\", \"input\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"developer\", "
                    "\"content\": [{\"type\": \"input_text\", \"text\": \"B\"}]}, {\"role\": \"user\", \"content\": \"Go\"}]}");
    KT_CHECK_OK(ksrv_agent_to_chat(KSRV_API_RESPONSES, b, &c));
    t = cJSON_PrintUnformatted(ku_json_get(c, "messages"));
    KT_CHECKF(!strcmp(t, "[{\"role\":\"system\",\"content\":\"A\\n\\nB\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                         "{\"role\":\"user\",\"content\":\"Go\"}]"),
              "%s", t);
    free(t);
    cJSON_Delete(c), cJSON_Delete(b);
    /* errors */
    static const char *const bad[][2] = {
        {"{\"input\": \"x\", \"previous_response_id\": \"r\"}", "does not store responses"},
        {"{\"input\": [{\"type\": \"web_search_call\"}]}", "not supported"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"web_search\"}]}", "only function tools"},
        {"{}", "\"input\": required"},
    };
    for (size_t i = 0; i < 4; i++) {
        b = cJSON_Parse(bad[i][0]);
        kiln_status st = ksrv_agent_to_chat(KSRV_API_RESPONSES, b, &c);
        KT_CHECKF(st && strstr(kiln_status_msg(st), bad[i][1]), "%s: %s", bad[i][0], kiln_status_msg(st));
        kiln_status_free(st);
        cJSON_Delete(b);
    }
    b = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}");
    kiln_status st = ksrv_agent_to_chat(KSRV_API_ANTHROPIC, b, &c);
    KT_CHECKF(st && strstr(kiln_status_msg(st), "\"max_tokens\": required"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    cJSON_Delete(b);
}
