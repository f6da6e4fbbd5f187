/* toolcall_test.c: round trips through the real chat templates
 * (tests/data/chat/templates and tests/data/tools/templates: an assistant turn with tool calls rendered by
 * kiln's Jinja engine, then parsed back to the same calls), streaming at
 * every split point equal to the whole parse, and hand-written outputs in
 * the cases of llama.cpp's tests/test-chat.cpp. */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "chat/chat.h"
#include "grammar/grammar.h"
#include "kt.h"
#include "tools/toolcall.h"

static const char *k_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"a city\"}, "
    "\"days\": {\"type\": \"integer\", \"description\": \"how many days\"}}, \"required\": [\"city\"]}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"description\": \"Local time\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"string\", \"description\": \"a time zone\"}}}}}]";

/* ---- streaming: the deltas, gathered ---- */
typedef struct {
    char content[4096], reasoning[4096];
    char name[8][64], args[8][1024];
    int n_calls;
    bool order_bad; /* a delta for a call not announced yet */
} gathered;

static void cat(char *dst, size_t cap, const char *s, size_t n) {
    size_t l = strlen(dst);
    if (l + n + 1 > cap) n = cap - l - 1;
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static kiln_status on_delta(void *ud, const ktc_delta *d) {
    gathered *g = ud;
    switch (d->kind) {
    case KTC_D_CONTENT: cat(g->content, sizeof g->content, d->text, d->len); break;
    case KTC_D_REASONING: cat(g->reasoning, sizeof g->reasoning, d->text, d->len); break;
    case KTC_D_CALL:
        if (d->index != g->n_calls || d->index >= 8) g->order_bad = true;
        else {
            snprintf(g->name[d->index], sizeof g->name[0], "%.*s", (int)d->len, d->text);
            g->n_calls++;
        }
        break;
    case KTC_D_ARGS:
        if (d->index >= g->n_calls) g->order_bad = true;
        else cat(g->args[d->index], sizeof g->args[0], d->text, d->len);
        break;
    }
    return NULL;
}

/* The deltas of text fed in the pieces cut at cuts[0..k) equal the parse of
 * the whole; returns a message naming the first difference, or NULL. */
static const char *stream_matches(const ktc_syntax *syn, const char *text, const size_t *cuts, int k, const ktc_msg *want,
                                  char *why, size_t cap) {
    ktc_stream *st = ktc_stream_create(syn);
    gathered *g = calloc(1, sizeof *g);
    size_t at = 0, n = strlen(text);
    kiln_status err = NULL;
    for (int i = 0; i <= k && !err; i++) {
        size_t to = i < k ? cuts[i] : n;
        err = ktc_stream_feed(st, text + at, to - at, i == k, on_delta, g);
        at = to;
    }
    const char *r = NULL;
    if (err) snprintf(why, cap, "feed: %s", kiln_status_msg(err)), r = why;
    else if (g->order_bad) snprintf(why, cap, "deltas out of order"), r = why;
    else if (strcmp(g->content, want->content)) snprintf(why, cap, "content %.200s != %.200s", g->content, want->content), r = why;
    else if (strcmp(g->reasoning, want->reasoning))
        snprintf(why, cap, "reasoning %.200s != %.200s", g->reasoning, want->reasoning), r = why;
    else if (g->n_calls != want->n_calls) snprintf(why, cap, "%d calls != %d", g->n_calls, want->n_calls), r = why;
    for (int i = 0; !r && i < g->n_calls; i++)
        if (strcmp(g->name[i], want->calls[i].name) || strcmp(g->args[i], want->calls[i].arguments))
            snprintf(why, cap, "call %d: %.60s(%.100s) != %.60s(%.100s)", i, g->name[i], g->args[i], want->calls[i].name,
                     want->calls[i].arguments),
                r = why;
    kiln_status_free(err);
    free(g);
    ktc_stream_destroy(st);
    return r;
}

/* Streaming at every single split point, and one character at a time. */
static const char *stream_all_splits(const ktc_syntax *syn, const char *text, char *why, size_t cap) {
    ktc_msg want;
    kiln_status st = ktc_parse(syn, text, strlen(text), false, &want);
    if (st) {
        kiln_status_free(st);
        return "parse failed";
    }
    size_t n = strlen(text);
    const char *r = NULL;
    for (size_t c = 0; c <= n && !r; c++) r = stream_matches(syn, text, &c, 1, &want, why, cap);
    size_t *cuts = malloc(sizeof *cuts * (n + 1));
    for (size_t c = 0; c < n; c++) cuts[c] = c + 1;
    if (!r) r = stream_matches(syn, text, cuts, (int)n, &want, why, cap);
    free(cuts);
    ktc_msg_free(&want);
    return r;
}

static bool args_equal(const char *a, const cJSON *b) {
    cJSON *x = cJSON_Parse(a);
    bool eq = x && cJSON_Compare(x, b, true);
    cJSON_Delete(x);
    return eq;
}

/* ---- round trips through the templates ---- */
typedef struct {
    const char *file;
    ktc_format format;
    const char *end; /* what ends the assistant turn (an EOS: not in the output) */
    int n_calls;     /* the template renders 1 (Llama 3.1, gpt-oss) or more */
    bool reasoning;  /* the template renders the turn's reasoning */
} rt_case;

static const rt_case k_rt[] = {
    {"Qwen-Qwen3-0.6B", KTC_HERMES, "<|im_end|>", 2, true},
    {"Qwen-Qwen2.5-7B-Instruct", KTC_HERMES, "<|im_end|>", 2, false},
    {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", KTC_HERMES, "<|im_end|>", 2, false},
    {"Qwen3-Coder", KTC_QWEN3_CODER, "<|im_end|>", 2, false},
    {"meta-llama-Llama-3.1-8B-Instruct", KTC_LLAMA3, "<|eot_id|>", 1, false},
    {"meta-llama-Llama-3.2-3B-Instruct", KTC_LLAMA3, "<|eot_id|>", 1, false},
    {"meta-llama-Llama-3.3-70B-Instruct", KTC_LLAMA3, "<|eot_id|>", 1, false},
    {"mistralai-Mistral-Nemo-Instruct-2407", KTC_MISTRAL, "</s>", 2, false},
    {"Mistral-Small-3.2-24B-Instruct-2506", KTC_MISTRAL_V11, "</s>", 2, false},
    {"unsloth-mistral-Devstral-Small-2507", KTC_MISTRAL_V11, "</s>", 2, false},
    {"mistralai-Ministral-3-14B-Reasoning-2512", KTC_MISTRAL_V11, "</s>", 2, false},
    {"openai-gpt-oss-120b", KTC_HARMONY, "<|call|>", 1, true},
    {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", KTC_DEEPSEEK, "<｜end▁of▁sentence｜>", 2, false},
    {"deepseek-ai-DeepSeek-V3.1", KTC_DEEPSEEK, "<｜end▁of▁sentence｜>", 2, false},
    {"GLM-4.6", KTC_GLM45, NULL, 2, true}, /* the turn ends at the next <|user|> */
    /* (Kimi-K2-Instruct.jinja calls list.append, which transformers' ImmutableSandboxedEnvironment refuses too (SecurityError; tools/jinja_python_oracle.py)) */
    {"moonshotai-Kimi-K2", KTC_KIMI_K2, "<|im_end|>", 2, false},
    {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", KTC_COMMAND_R, "<|END_OF_TURN_TOKEN|>", 2, true},
    /* (ByteDance-Seed-OSS.jinja: its cases are hand-written) */
    {"MiniMax-M2", KTC_MINIMAX_M2, "[e~[", 2, true},
    /* (the template appends its instructions after the last turn) */
    {"CohereForAI-c4ai-command-r-plus-tool_use", KTC_COMMAND_R_PLUS, "<|START_OF_TURN_TOKEN|>", 2, false},
    /* (DSML templates in thinking mode: without it the prompt writes <think></think>, a past turn only </think>) */
    {"deepseek-ai-DeepSeek-V3.2", KTC_DSML, "<｜end▁of▁sentence｜>", 2, true},
    {"deepseek-ai-DeepSeek-V4", KTC_DSML_V4, "<｜end▁of▁sentence｜>", 2, true},
    {"openbmb-MiniCPM5-1B", KTC_MINICPM5, "<|im_end|>", 2, false},
    /* (its prompt closes an empty thinking block, a past turn holds the reasoning: the output starts inside it) */
    {"tencent-Hy3", KTC_HY3, "<｜hy_eos:opensource｜>", 2, true},
};

static const char *k_call_args[2] = {"{\"city\": \"Paris\", \"days\": 3}", "{\"zone\": \"Asia/Tokyo\"}"};
static const char *k_call_names[2] = {"get_weather", "get_time"};

static cJSON *conversation_args(int n_calls, bool with_assistant, bool str_args);
static cJSON *conversation(int n_calls, bool with_assistant) { return conversation_args(n_calls, with_assistant, false); }

/* str_args: the calls' arguments as JSON text (templates that concatenate them) */
static cJSON *conversation_args(int n_calls, bool with_assistant, bool str_args) {
    cJSON *msgs = cJSON_CreateArray();
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", "What is the weather in Paris, and the time in Tokyo?");
    cJSON_AddItemToArray(msgs, u);
    if (!with_assistant) return msgs;
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "role", "assistant");
    cJSON_AddStringToObject(a, "content", "");
    cJSON_AddStringToObject(a, "reasoning_content", "The user wants two tools.");
    cJSON_AddStringToObject(a, "thinking", "The user wants two tools.");
    cJSON *tc = cJSON_AddArrayToObject(a, "tool_calls");
    for (int i = 0; i < n_calls; i++) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", i ? "call00002" : "call00001"); /* Mistral wants 9 characters */
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", k_call_names[i]);
        if (str_args) cJSON_AddStringToObject(f, "arguments", k_call_args[i]);
        else cJSON_AddItemToObject(f, "arguments", cJSON_Parse(k_call_args[i]));
        cJSON_AddItemToArray(tc, c);
    }
    cJSON_AddItemToArray(msgs, a);
    return msgs;
}

/* tests/data/chat/templates (the Jinja oracle's), then tests/data/tools/templates. */
static kiln_status load_template(const char *name, kchat_template **t, char **src) {
    char rel[256], path[4096];
    snprintf(rel, sizeof rel, "tests/data/chat/templates/%s.jinja", name);
    if (access(kt_path(path, sizeof path, rel), R_OK) != 0) snprintf(rel, sizeof rel, "tests/data/tools/templates/%s.jinja", name);
    KILN_TRY(ku_read_file(kt_path(path, sizeof path, rel), src, NULL));
    return kchat_parse(*src, t);
}

KT_TEST(toolcall_round_trip_real_templates) {
    cJSON *tools = cJSON_Parse(k_tools);
    for (size_t c = 0; c < sizeof k_rt / sizeof k_rt[0]; c++) {
        const rt_case *rc = &k_rt[c];
        kchat_template *t = NULL;
        char *src = NULL;
        KT_CHECK_OK(load_template(rc->file, &t, &src));
        KT_CHECKF(ktc_detect(src) == rc->format, "%s: detected %s, want %s", rc->file, ktc_format_name(ktc_detect(src)),
                  ktc_format_name(rc->format));
        cJSON *m0 = conversation(rc->n_calls, false), *m1 = conversation(rc->n_calls, true);
        cJSON *think = rc->format == KTC_DSML || rc->format == KTC_DSML_V4 ? cJSON_Parse("{\"thinking\": true}") : NULL;
        char *prompt = NULL, *full = NULL;
        kchat_input in0 = {.messages = m0, .tools = tools, .extra = think, .add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>"};
        kchat_input in1 = {.messages = m1, .tools = tools, .extra = think, .add_generation_prompt = false, .bos_token = "<s>", .eos_token = "</s>"};
        kiln_status st = kchat_render(t, &in0, &prompt);
        if (!st) st = kchat_render(t, &in1, &full);
        KT_CHECKF(!st, "%s: %s", rc->file, kiln_status_msg(st));
        /* the output: what the full conversation adds to the prompt (the
         * common prefix: R1 opens <think> in the prompt, dropped from past turns) */
        size_t k = 0;
        while (prompt[k] && prompt[k] == full[k]) k++;
        if (prompt[k])
            while (k > 0 && full[k - 1] != '>') k--; /* back to the end of the last tag */
        /* Command R+'s generation prompt follows its closing instructions, which
         * a past turn precedes: the output is the turn after its header */
        static const char hdr[] = "<|CHATBOT_TOKEN|>";
        if (!strncmp(full + k, hdr, sizeof hdr - 1)) k += sizeof hdr - 1;
        char *out = strdup(full + k);
        char *e = rc->end ? strstr(out, rc->end) : out + strlen(out);
        KT_CHECKF(e, "%s: no %s in %s", rc->file, rc->end, out);
        *e = 0;
        prompt[k] = 0;
        ktc_syntax syn = {rc->format, ktc_detect_reasoning(src), false, tools, NULL};
        syn.think_open = ktc_prompt_opens_think(syn.reasoning, prompt);
        ktc_msg m;
        KT_CHECK_OK(ktc_parse(&syn, out, strlen(out), false, &m));
        KT_CHECKF(m.n_calls == rc->n_calls, "%s: %d calls from %s", rc->file, m.n_calls, out);
        for (int i = 0; i < m.n_calls; i++) {
            cJSON *want = cJSON_Parse(k_call_args[i]);
            bool ok = !strcmp(m.calls[i].name, k_call_names[i]) && args_equal(m.calls[i].arguments, want);
            cJSON_Delete(want);
            KT_CHECKF(ok, "%s: call %d is %s(%s), from %s", rc->file, i, m.calls[i].name, m.calls[i].arguments, out);
        }
        KT_CHECKF(m.n_content == 0, "%s: content %s", rc->file, m.content);
        if (rc->reasoning)
            KT_CHECKF(!strcmp(m.reasoning, "The user wants two tools."), "%s: reasoning %s from %s", rc->file, m.reasoning, out);
        char why[512];
        const char *r = stream_all_splits(&syn, out, why, sizeof why);
        KT_CHECKF(!r, "%s: streaming %s: %s", rc->file, out, r);
        ktc_msg_free(&m);
        free(out), free(prompt), free(full), free(src);
        cJSON_Delete(m0), cJSON_Delete(m1), cJSON_Delete(think);
        kchat_free(t);
    }
    cJSON_Delete(tools);
}

/* The tool-call grammars (ktc_grammar, markers as text) take the calls the
 * real templates write: after the trigger, byte by byte, to the grammar's
 * end; what follows is the turn's end. */
KT_TEST(toolcall_grammar_takes_template_calls) {
    cJSON *tools = cJSON_Parse(k_tools);
    kgr_vocab *v = NULL;
    KT_CHECK_OK(kgr_vocab_bytes(&v));
    int tested = 0;
    for (size_t c = 0; v && c < sizeof k_rt / sizeof k_rt[0]; c++) {
        const rt_case *rc = &k_rt[c];
        ktc_format f = rc->format;
        if (f != KTC_HARMONY && f != KTC_DEEPSEEK && f != KTC_KIMI_K2 && f != KTC_MISTRAL_V11 && f != KTC_QWEN3_CODER &&
            f != KTC_GLM45 && f != KTC_SEED_OSS && f != KTC_MINIMAX_M2 && f != KTC_DSML && f != KTC_DSML_V4 &&
            f != KTC_MINICPM5 && f != KTC_HY3)
            continue;
        kchat_template *t = NULL;
        char *src = NULL, *full = NULL;
        KT_CHECK_OK(load_template(rc->file, &t, &src));
        cJSON *m1 = conversation(rc->n_calls, true);
        kchat_input in1 = {.messages = m1, .tools = tools, .add_generation_prompt = false, .bos_token = "<s>", .eos_token = "</s>"};
        KT_CHECK_OK(kchat_render(t, &in1, &full));
        char *g = NULL;
        KT_CHECK_OK(ktc_grammar(f, tools, NULL, rc->n_calls > 1, NULL, &g));
        kgr_grammar *gr = NULL;
        kgr_matcher *m = NULL;
        kiln_status st = g ? kgr_from_gbnf(g, strlen(g), &gr) : NULL;
        KT_CHECKF(!st, "%s: %s\n%s", rc->file, st ? kiln_status_msg(st) : "", g);
        kiln_status_free(st);
        if (gr) KT_CHECK_OK(kgr_matcher_create_owned(gr, v, &m));
        /* the last turn's calls: from the trigger's last occurrence before the first call's name */
        const char *tr = ktc_trigger(f), *at = NULL;
        for (const char *q = full; q && (q = strstr(q, tr)); q++)
            if (strstr(q, "Paris")) at = q;
        KT_CHECKF(at != NULL, "%s: no %s in %s", rc->file, tr, full);
        size_t i = 0;
        if (m && at) {
            const char *s = at + strlen(tr);
            for (; s[i] && !kgr_matcher_done(m); i++)
                if (!kgr_matcher_accept_bytes(m, s + i, 1)) break;
            KT_CHECKF(kgr_matcher_can_end(m), "%s: the grammar stops at byte %zu of %s\n%s", rc->file, i, s, g);
            const char *rest = s + i;
            while (*rest == ' ' || *rest == '\n') rest++;
            KT_CHECKF(!*rest || (rc->end && !strncmp(rest, rc->end, strlen(rc->end))) || !strncmp(rest, "<|user|>", 8) ||
                          !strncmp(rest, "</s>", 4) || !strncmp(rest, "<|im_end|>", 10) || !strncmp(rest, "</minimax", 9),
                      "%s: after the grammar: %s", rc->file, rest);
            tested++;
        }
        kgr_matcher_free(m);
        free(g), free(full), free(src);
        cJSON_Delete(m1);
        kchat_free(t);
    }
    KT_CHECK(tested >= 10);
    kgr_vocab_free(v);
    cJSON_Delete(tools);
}

/* ---- hand-written outputs (llama.cpp's test-chat.cpp cases, as data) ---- */
typedef struct {
    ktc_format format;
    ktc_reasoning reasoning;
    bool think_open;
    const char *text;
    const char *content, *reasoning_text;
    const char *calls; /* JSON: [[name, {args}], ...] */
} hw_case;

static const hw_case k_hw[] = {
    /* Hermes / Qwen: content before the call, a thinking block */
    {KTC_HERMES, KTC_THINK_TAGS, false, "<think>I'm\nthinking</think>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?",
     "I'm\nthinking", "[]"},
    {KTC_HERMES, KTC_THINK_TAGS, false,
     "<think>Plan.</think>\n\nSure.\n<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
     "Sure.", "Plan.", "[[\"special_function\", {\"arg1\": 1}]]"},
    {KTC_HERMES, KTC_THINK_NONE, false,
     "<tool_call>{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
     "", "", "[[\"f\", {\"a\": [1, {\"b\": \"}\"}]}], [\"g\", {}]]"},
    /* without thinking markers, <think> stays in content */
    {KTC_HERMES, KTC_THINK_NONE, false, "<think>x</think>y", "<think>x</think>y", "", "[]"},
    /* not a call: the text stays */
    {KTC_HERMES, KTC_THINK_NONE, false, "a <tool_call>not json</tool_call>", "a <tool_call>not json</tool_call>", "", "[]"},
    /* DeepSeek R1: the prompt opened the thinking block */
    {KTC_DEEPSEEK, KTC_THINK_TAGS, true,
     "I need the weather.</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "", "I need the weather.", "[[\"get_weather\", {\"city\": \"Paris\"}]]"},
    {KTC_DEEPSEEK, KTC_THINK_TAGS, false,
     "<think></think>Hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\": \"y\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "Hi", "", "[[\"f\", {\"x\": \"y\"}]]"},
    /* Llama 3.x: bare JSON, python_tag, and plain text that is not a call */
    {KTC_LLAMA3, KTC_THINK_NONE, false, "{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}", "", "",
     "[[\"special_function\", {\"arg1\": 1}]]"},
    {KTC_LLAMA3, KTC_THINK_NONE, false, "<|python_tag|>{\"type\": \"function\", \"name\": \"f\", \"parameters\": {}}", "", "",
     "[[\"f\", {}]]"},
    {KTC_LLAMA3, KTC_THINK_NONE, false, "{\"answer\": 42} is JSON", "{\"answer\": 42} is JSON", "", "[]"},
    /* Mistral v3 and v11 */
    {KTC_MISTRAL, KTC_THINK_NONE, false, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"123456789\"}]", "",
     "", "[[\"f\", {\"a\": 1}]]"},
    {KTC_MISTRAL_V11, KTC_THINK_MISTRAL, false, "[THINK]hmm[/THINK]ok[TOOL_CALLS]f[ARGS]{\"a\": 1}[TOOL_CALLS]g[ARGS]{}", "ok",
     "hmm", "[[\"f\", {\"a\": 1}], [\"g\", {}]]"},
    /* gpt-oss: analysis, a preamble-less call, a final answer */
    {KTC_HARMONY, KTC_THINK_NONE, false,
     "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     "<|constrain|>json<|message|>{\"city\": \"Tokyo\"}",
     "", "Think.", "[[\"get_weather\", {\"city\": \"Tokyo\"}]]"},
    {KTC_HARMONY, KTC_THINK_NONE, false,
     "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hello!", "Hello!", "Easy.", "[]"},
    /* Qwen3-Coder: typed by the schema (city is a string even when it looks like a number) */
    {KTC_QWEN3_CODER, KTC_THINK_NONE, false,
     "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
     "Let me check.", "", "[[\"get_weather\", {\"city\": \"1984\", \"days\": 2}]]"},
    /* GLM-4.5 */
    {KTC_GLM45, KTC_THINK_TAGS, false,
     "<think>w</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>", "", "w",
     "[[\"get_weather\", {\"city\": \"Paris\"}]]"},
    /* Kimi K2 */
    {KTC_KIMI_K2, KTC_THINK_TAGS, false,
     "<think>k</think>A<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"zone\": \"UTC\"}<|tool_call_end|><|tool_calls_section_end|>",
     "A", "k", "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    /* Granite 3.3 (its template renders no past calls: no round trip) */
    {KTC_GRANITE, KTC_THINK_TAGS, false,
     "<think>Need it.</think>Sure.<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"get_time\", \"arguments\": {}}]",
     "Sure.", "Need it.", "[[\"get_weather\", {\"city\": \"Rome\"}], [\"get_time\", {}]]"},
    /* Phi-4-mini (its template renders no past calls) */
    {KTC_PHI4, KTC_THINK_NONE, false,
     "Sure.<|tool_call|>[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]<|/tool_call|>", "Sure.", "",
     "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    /* Command R+: its directly-answer pseudo-tool is no call */
    {KTC_COMMAND_R_PLUS, KTC_THINK_NONE, false,
     "I'll check.\nAction: ```json\n[{\"tool_name\": \"directly-answer\", \"parameters\": {}}, {\"tool_name\": \"get_time\", "
     "\"parameters\": {}}]```", "I'll check.", "", "[[\"get_time\", {}]]"},
    /* MiniMax-M2: the prompt opened <think>; two invokes in one block */
    {KTC_MINIMAX_M2, KTC_THINK_TAGS, true,
     "Need both.</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Rome</parameter>\n"
     "<parameter name=\"days\">2</parameter>\n</invoke>\n<invoke name=\"get_time\">\n</invoke>\n</minimax:tool_call>",
     "", "Need both.", "[[\"get_weather\", {\"city\": \"Rome\", \"days\": 2}], [\"get_time\", {}]]"},
    /* Tencent Hy3: the prompt opened <think:opensource>; content before the block; values typed by the
     * schema (days an integer, city a string though it looks like one), a value's newlines kept */
    {KTC_HY3, KTC_THINK_HY3, true,
     "Both.</think:opensource>Checking.<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
     "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>1984</arg_value:opensource>\n"
     "<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>2</arg_value:opensource>\n</tool_call:opensource>\n"
     "<tool_call:opensource>get_time<tool_sep:opensource>\n<arg_key:opensource>zone</arg_key:opensource>\n"
     "<arg_value:opensource>a\nb</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
     "Checking.", "Both.", "[[\"get_weather\", {\"city\": \"1984\", \"days\": 2}], [\"get_time\", {\"zone\": \"a\\nb\"}]]"},
    /* Hy3 without thinking (no_think: the prompt closed an empty block), a call without arguments */
    {KTC_HY3, KTC_THINK_HY3, false,
     "<tool_calls:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>",
     "", "", "[[\"get_time\", {}]]"},
    /* ---- the formats of llama.cpp's common/parsers ---- */
    /* Apriel 1.6: the prompt opened the reasoning, [BEGIN FINAL RESPONSE] ends it */
    {KTC_APRIEL, KTC_THINK_APRIEL, true,
     "Let me see.\n[BEGIN FINAL RESPONSE]\nSure.\n<tool_calls>[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]</tool_calls>",
     "Sure.", "Let me see.", "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    /* MiniMax-M1: one object a line */
    {KTC_MINIMAX_M1, KTC_THINK_TAGS, false,
     "<think>t</think>\nOk.\n<tool_calls>\n{\"name\": \"get_time\", \"arguments\": {}}\n{\"name\": \"get_weather\", \"arguments\": "
     "{\"city\": \"Rome\"}}\n</tool_calls>",
     "Ok.", "t", "[[\"get_time\", {}], [\"get_weather\", {\"city\": \"Rome\"}]]"},
    {KTC_NEMOTRON_V2, KTC_THINK_TAGS, false,
     "<think>x</think><TOOLCALL>[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]</TOOLCALL>", "", "x",
     "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    {KTC_GIGACHAT31, KTC_THINK_NONE, false, "Checking.<|function_call|>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}",
     "Checking.", "", "[[\"get_weather\", {\"city\": \"Rome\"}]]"},
    {KTC_GIGACHAT3, KTC_THINK_NONE, false, "<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"get_time\", \"arguments\": {}}",
     "", "", "[[\"get_time\", {}]]"},
    /* Apertus: the name is the object's key */
    {KTC_APERTUS, KTC_THINK_NONE, false,
     "Sure.<|tools_prefix|>[{\"get_weather\": {\"city\": \"Rome\"}}, {\"get_time\": {}}]<|tools_suffix|>", "Sure.", "",
     "[[\"get_weather\", {\"city\": \"Rome\"}], [\"get_time\", {}]]"},
    {KTC_SOLAR, KTC_THINK_SOLAR, false,
     "<|think|>hm<|end|><|begin|>assistant<|tool_calls|><|tool_call:begin|>abc123<|tool_call:name|>get_time<|tool_call:args|>"
     "{\"zone\": \"UTC\"}<|tool_call:end|><|calls|>",
     "", "hm", "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    {KTC_FUNCTIONARY31, KTC_THINK_NONE, false, "Let me.<function=get_weather>{\"city\": \"Rome\"}</function><function=get_time>{}</function>",
     "Let me.", "", "[[\"get_weather\", {\"city\": \"Rome\"}], [\"get_time\", {}]]"},
    /* functionary v3.2: the output starts after the prompt's >>> */
    {KTC_FUNCTIONARY32, KTC_THINK_NONE, false, "all\nHello there>>>get_time\n{\"zone\": \"UTC\"}", "Hello there", "",
     "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    {KTC_FUNCTIONARY32, KTC_THINK_NONE, false, "get_weather\n{\"city\": \"Rome\"}>>>get_time\n{}", "", "",
     "[[\"get_weather\", {\"city\": \"Rome\"}], [\"get_time\", {}]]"},
    /* LFM2: Python literals; a string parameter written as a number is the string */
    {KTC_LFM2, KTC_THINK_TAGS, false,
     "<think>r</think>Ok<|tool_call_start|>[get_weather(city='Ro\\'me', days=2), get_time()]<|tool_call_end|>", "Ok", "r",
     "[[\"get_weather\", {\"city\": \"Ro'me\", \"days\": 2}], [\"get_time\", {}]]"},
    {KTC_LFM2, KTC_THINK_NONE, false,
     "<|tool_call_start|>[get_weather(city=1984), f(a=[1, \"b\"], b={'k': None, 'n': -2.5}, c=True, d=false)]<|tool_call_end|>", "",
     "", "[[\"get_weather\", {\"city\": \"1984\"}], [\"f\", {\"a\": [1, \"b\"], \"b\": {\"k\": null, \"n\": -2.5}, \"c\": true, \"d\": false}]]"},
    /* (llama.cpp's test_lfm2_parser cases: escapes decoded, a dotted name, markdown links stay content) */
    {KTC_LFM2, KTC_THINK_NONE, false,
     "<|tool_call_start|>[python(code=\"def hello():\\n    print('hey')\\tx \\\"q\\\"\"), Calendar.create_event(title=\"demo\", "
     "participants=[\"Alice\", \"Bob\"], metadata={\"priority\": \"high\", \"reminder\": true})]<|tool_call_end|>",
     "", "", "[[\"python\", {\"code\": \"def hello():\\n    print('hey')\\tx \\\"q\\\"\"}], [\"Calendar.create_event\", {\"title\": "
     "\"demo\", \"participants\": [\"Alice\", \"Bob\"], \"metadata\": {\"priority\": \"high\", \"reminder\": true}}]]"},
    {KTC_LFM2, KTC_THINK_TAGS, false, "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).",
     "Use this format: [link text](url). Example: [Wikipedia](https://www.wikipedia.org).", "", "[]"},
    /* (llama.cpp's Gemma 4 cases: an empty thought, lists, negative and decimal numbers) */
    {KTC_GEMMA4, KTC_THINK_GEMMA4, false, "<|channel>thought<channel|>Hello, world!\nWhat's up?", "Hello, world!\nWhat's up?", "", "[]"},
    {KTC_GEMMA4, KTC_THINK_GEMMA4, false,
     "<|tool_call>call:todo_list{todos:[<|\"|>buy milk<|\"|>,<|\"|>walk dog<|\"|>]}<tool_call|><|tool_call>call:special_function"
     "{arg1:-7,orig:3.14}<tool_call|><|tool_call>call:empty_args{}<tool_call|>",
     "", "", "[[\"todo_list\", {\"todos\": [\"buy milk\", \"walk dog\"]}], [\"special_function\", {\"arg1\": -7, \"orig\": 3.14}], "
     "[\"empty_args\", {}]]"},
    /* Gemma 4: <|"|> quotes strings (a string may hold , and }) */
    {KTC_GEMMA4, KTC_THINK_GEMMA4, false,
     "<|channel>thought\nplan<channel|>Sure<|tool_call>call:get_weather{city:<|\"|>Rome<|\"|>,days:2}<tool_call|>"
     "<|tool_call>call:get_time{zone:<|\"|>a,b}<|\"|>}<tool_call|>",
     "Sure", "plan", "[[\"get_weather\", {\"city\": \"Rome\", \"days\": 2}], [\"get_time\", {\"zone\": \"a,b}\"}]]"},
    {KTC_GEMMA4, KTC_THINK_GEMMA4, false, "<|tool_call>call:f{o:{k:[1,<|\"|>x<|\"|>,true]},n:null}<tool_call|>", "", "",
     "[[\"f\", {\"o\": {\"k\": [1, \"x\", true]}, \"n\": null}]]"},
    /* MiniMax-M3: values typed by the schema, nested tags an object (<item>s: a list) */
    {KTC_MINIMAX_M3, KTC_THINK_MM, false,
     "<mm:think>p</mm:think>]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">]<]minimax[>[<city>1984]<]minimax[>[</city>"
     "]<]minimax[>[<days>2]<]minimax[>[</days>]<]minimax[>[</invoke>\n]<]minimax[>[<invoke name=\"f\">]<]minimax[>[<o>]<]minimax[>[<a>1"
     "]<]minimax[>[</a>]<]minimax[>[<l>]<]minimax[>[<item>x]<]minimax[>[</item>]<]minimax[>[<item>2]<]minimax[>[</item>]<]minimax[>[</l>"
     "]<]minimax[>[</o>]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>",
     "", "p", "[[\"get_weather\", {\"city\": \"1984\", \"days\": 2}], [\"f\", {\"o\": {\"a\": 1, \"l\": [\"x\", 2]}}]]"},
    /* Kimi K3: the prompt opened the thinking channel; the response channel is content; a json block */
    {KTC_KIMI_K3, KTC_THINK_KIMI_K3, true,
     "p<|close|>think<|sep|><|open|>response<|sep|>Sure<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" "
     "index=\"1\"<|sep|><|open|>argument key=\"city\" type=\"string\"<|sep|>1984<|close|>argument<|sep|><|open|>argument key=\"days\" "
     "type=\"number\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|><|open|>call tool=\"get_time\" index=\"2\"<|sep|><|open|>json "
     "type=\"object\"<|sep|>{\"zone\": \"UTC\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
     "Sure", "p", "[[\"get_weather\", {\"city\": \"1984\", \"days\": 2}], [\"get_time\", {\"zone\": \"UTC\"}]]"},
    /* Muse Glimmer: to=self reasoning, to=user content, a tool's message its ATEM block (a forced call: no header) */
    {KTC_MUSE_GLIMMER, KTC_THINK_NONE, false, " to=self<|message|>Think.<|eom|><|start|>assistant to=user<|message|>Hello!<|eot|>",
     "Hello!", "Think.", "[]"},
    {KTC_MUSE_GLIMMER, KTC_THINK_NONE, false,
     " to=self<|message|>r<|eom|><|start|>assistant to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n"
     "<atem:parameter name=\"city\">1984</atem:parameter>\n<atem:parameter name=\"days\">2</atem:parameter>\n</atem:invoke>\n"
     "</atem:function_calls><|eom|><|start|>assistant to=get_time<|message|><atem:function_calls>\n<atem:invoke name=\"get_time\">\n"
     "</atem:invoke>\n</atem:function_calls><|eot|>",
     "", "r", "[[\"get_weather\", {\"city\": \"1984\", \"days\": 2}], [\"get_time\", {}]]"},
    {KTC_MUSE_GLIMMER, KTC_THINK_NONE, false,
     "<atem:function_calls>\n<atem:invoke name=\"get_time\">\n<atem:parameter name=\"zone\">UTC</atem:parameter>\n</atem:invoke>\n"
     "</atem:function_calls>",
     "", "", "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    /* pythonic (Llama 4): the output a list of calls from its start (" or ' strings, a string parameter written
     * as a number the string), <|python_start|>..<|python_end|> around it optional; else content */
    {KTC_PYTHONIC, KTC_THINK_NONE, false, "[get_weather(city=\"Ro\\\"me\", days=2), get_time()]", "", "",
     "[[\"get_weather\", {\"city\": \"Ro\\\"me\", \"days\": 2}], [\"get_time\", {}]]"},
    {KTC_PYTHONIC, KTC_THINK_NONE, false, " <|python_start|>[get_weather(city=1984), get_time(zone='UTC')]<|python_end|>", "", "",
     "[[\"get_weather\", {\"city\": \"1984\"}], [\"get_time\", {\"zone\": \"UTC\"}]]"},
    {KTC_PYTHONIC, KTC_THINK_NONE, false, "Use [Wikipedia](https://www.wikipedia.org), or [get_time()].",
     "Use [Wikipedia](https://www.wikipedia.org), or [get_time()].", "", "[]"},
    {KTC_PYTHONIC, KTC_THINK_NONE, false, "[1, 2] are numbers; [link](url)", "[1, 2] are numbers; [link](url)", "", "[]"},
    {KTC_PYTHONIC, KTC_THINK_NONE, false, "[Wikipedia](https://www.wikipedia.org)", "[Wikipedia](https://www.wikipedia.org)", "", "[]"},
    {KTC_PYTHONIC, KTC_THINK_NONE, false, "[get_time(zone=\"UTC\")]\nDone.", "Done.", "", "[[\"get_time\", {\"zone\": \"UTC\"}]]"},
    /* no format: everything is content */
    {KTC_NONE, KTC_THINK_TAGS, false, "<think>r</think><tool_call>{}</tool_call>", "<tool_call>{}</tool_call>", "r", "[]"},
};

KT_TEST(toolcall_parses_model_outputs) {
    cJSON *tools = cJSON_Parse(k_tools);
    for (size_t c = 0; c < sizeof k_hw / sizeof k_hw[0]; c++) {
        const hw_case *h = &k_hw[c];
        ktc_syntax syn = {h->format, h->reasoning, h->think_open, tools, NULL};
        ktc_msg m;
        KT_CHECK_OK(ktc_parse(&syn, h->text, strlen(h->text), false, &m));
        KT_CHECKF(!strcmp(m.content, h->content), "case %zu: content [%s], want [%s]", c, m.content, h->content);
        KT_CHECKF(!strcmp(m.reasoning, h->reasoning_text), "case %zu: reasoning [%s], want [%s]", c, m.reasoning,
                  h->reasoning_text);
        cJSON *want = cJSON_Parse(h->calls);
        KT_CHECKF(m.n_calls == cJSON_GetArraySize(want), "case %zu: %d calls", c, m.n_calls);
        for (int i = 0; i < m.n_calls; i++) {
            cJSON *w = cJSON_GetArrayItem(want, i);
            KT_CHECKF(!strcmp(m.calls[i].name, cJSON_GetArrayItem(w, 0)->valuestring) &&
                          args_equal(m.calls[i].arguments, cJSON_GetArrayItem(w, 1)),
                      "case %zu: call %d is %s(%s)", c, i, m.calls[i].name, m.calls[i].arguments);
        }
        cJSON_Delete(want);
        ktc_msg_free(&m);
        char why[512];
        const char *r = stream_all_splits(&syn, h->text, why, sizeof why);
        KT_CHECKF(!r, "case %zu: streaming: %s", c, r);
    }
    cJSON_Delete(tools);
}

/* A call cut short (max_tokens) is reported with the arguments written so
 * far; streaming holds back a partial marker and never shows it. */
KT_TEST(toolcall_partial_output) {
    ktc_syntax syn = {KTC_HERMES, KTC_THINK_TAGS, false, NULL, NULL};
    ktc_msg m;
    const char *t = "Hi <tool_";
    KT_CHECK_OK(ktc_parse(&syn, t, strlen(t), true, &m));
    KT_CHECK_STR(m.content, "Hi");
    ktc_msg_free(&m);
    t = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2";
    KT_CHECK_OK(ktc_parse(&syn, t, strlen(t), false, &m));
    KT_CHECK_EQ(m.n_calls, 1);
    KT_CHECK_STR(m.calls[0].arguments, "{\"a\": [1, 2");
    KT_CHECK_STR(m.content, "");
    ktc_msg_free(&m);
    t = "<think>still thinking</th";
    KT_CHECK_OK(ktc_parse(&syn, t, strlen(t), true, &m));
    KT_CHECK_STR(m.reasoning, "still thinking");
    KT_CHECK_STR(m.content, "");
    ktc_msg_free(&m);
}

/* An output that ends inside a marker (max_tokens cut "<|tool_call_be"):
 * the marker's start is trimmed from the whole parse and never streamed,
 * whatever the split points; a lone "<" stays text. */
KT_TEST(toolcall_output_cut_inside_marker) {
    static const struct {
        ktc_format f;
        ktc_reasoning r;
        const char *text, *content, *reasoning;
    } k_cut[] = {
        {KTC_KIMI_K2, KTC_THINK_TAGS, "<think>k</think>Sure.<|tool_calls_section_begin|><|tool_call_be", "Sure.", "k"},
        {KTC_KIMI_K2, KTC_THINK_TAGS, "Sure.<|tool_call_be", "Sure.", ""},
        {KTC_HERMES, KTC_THINK_TAGS, "Hi <tool_", "Hi", ""},
        {KTC_HERMES, KTC_THINK_TAGS, "<think>still thinking</th", "", "still thinking"},
        {KTC_LFM2, KTC_THINK_NONE, "Ok<|tool_call_st", "Ok", ""},
        {KTC_HARMONY, KTC_THINK_NONE, "<|channel|>final<|message|>Done<|en", "Done", ""},
        {KTC_HERMES, KTC_THINK_NONE, "a <", "a <", ""},
    };
    for (size_t c = 0; c < sizeof k_cut / sizeof *k_cut; c++) {
        ktc_syntax syn = {k_cut[c].f, k_cut[c].r, false, NULL, NULL};
        ktc_msg m;
        KT_CHECK_OK(ktc_parse(&syn, k_cut[c].text, strlen(k_cut[c].text), false, &m));
        KT_CHECKF(!strcmp(m.content, k_cut[c].content) && !strcmp(m.reasoning, k_cut[c].reasoning) && m.n_calls == 0,
                  "case %zu: content [%s] reasoning [%s], %d calls", c, m.content, m.reasoning, m.n_calls);
        ktc_msg_free(&m);
        char why[512];
        const char *r = stream_all_splits(&syn, k_cut[c].text, why, sizeof why);
        KT_CHECKF(!r, "case %zu: streaming: %s", c, r);
    }
    /* cut inside a section's or a call's end after its calls (DeepSeek-R1 under a forced call, Kimi K2, Gemma 4) */
    static const struct {
        ktc_format f;
        const char *text;
    } k_end[] = {{KTC_DEEPSEEK, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"UTC\"}\n```"
                                "<｜tool▁call▁end｜><｜tool▁calls▁end"},
                 {KTC_KIMI_K2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>"
                               "{\"zone\": \"UTC\"}<|tool_call_end|><|tool_calls_sec"},
                 /* the marker spelled in bytes, cut inside its "｜" (the detokenizer's U+FFFD at the end) */
                 {KTC_DEEPSEEK, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"zone\": \"UTC\"}\n```"
                                "<｜tool▁call▁end｜><｜tool▁calls▁end\xEF\xBF\xBD"},
                 /* cut inside a call's own end (Gemma 4, spelled in bytes under the grammar) */
                 {KTC_GEMMA4, "<|tool_call>call:get_time{zone:<|\"|>UTC<|\"|>}<tool_ca"},
                 {KTC_HERMES, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_"},
                 {KTC_QWEN3_CODER, "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</func"},
                 {KTC_QWEN3_CODER, "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool"},
                 {KTC_GLM45, "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n</tool_c"},
                 {KTC_MINIMAX_M2, "<minimax:tool_call>\n<invoke name=\"get_time\">\n<parameter name=\"zone\">UTC</parameter>\n</invoke>\n</minimax:tool"},
                 {KTC_LFM2, "<|tool_call_start|>[get_time(zone=\"UTC\")]<|tool_call_e"}};
    for (size_t c = 0; c < sizeof k_end / sizeof *k_end; c++) {
        ktc_syntax syn = {k_end[c].f, KTC_THINK_TAGS, false, NULL, NULL};
        ktc_msg m;
        KT_CHECK_OK(ktc_parse(&syn, k_end[c].text, strlen(k_end[c].text), false, &m));
        KT_CHECKF(!strcmp(m.content, "") && m.n_calls == 1 && !strcmp(m.calls[0].name, "get_time"), "%s: content [%s], %d calls",
                  ktc_format_name(k_end[c].f), m.content, m.n_calls);
        ktc_msg_free(&m);
        if (strstr(k_end[c].text, "\xEF\xBF\xBD")) continue; /* (never streamed a byte at a time: the detokenizer holds them) */
        char why[512];
        const char *r = stream_all_splits(&syn, k_end[c].text, why, sizeof why);
        KT_CHECKF(!r, "%s: streaming: %s", ktc_format_name(k_end[c].f), r);
    }
    /* content, then a marker cut inside a character: trimmed */
    ktc_syntax ds = {KTC_DEEPSEEK, KTC_THINK_TAGS, false, NULL, NULL};
    ktc_msg m;
    const char *t = "Sure.<｜tool▁calls▁begin\xEF\xBF\xBD";
    KT_CHECK_OK(ktc_parse(&ds, t, strlen(t), false, &m));
    KT_CHECKF(!strcmp(m.content, "Sure.") && m.n_calls == 0, "content [%s]", m.content);
    ktc_msg_free(&m);
    t = "Sure. a\xEF\xBF\xBD"; /* (text's own cut character stays) */
    KT_CHECK_OK(ktc_parse(&ds, t, strlen(t), false, &m));
    KT_CHECK_STR(m.content, t);
    ktc_msg_free(&m);
}

/* Every committed template: detection names a format or none, never a
 * wrong one for the families above (a smoke check that nothing crashes). */
KT_TEST(toolcall_detect_formats) {
    KT_CHECK_EQ(ktc_detect("{{ messages }}"), KTC_NONE);
    KT_CHECK_EQ(ktc_detect(NULL), KTC_NONE);
    KT_CHECK(ktc_prompt_opens_think(KTC_THINK_TAGS, "<｜Assistant｜><think>\n"));
    KT_CHECK(!ktc_prompt_opens_think(KTC_THINK_TAGS, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    KT_CHECK_STR(ktc_trigger(KTC_HERMES), "<tool_call>");
    char *src = NULL, path[4096];
    KT_CHECK_OK(ku_read_file(kt_path(path, sizeof path, "tests/data/chat/templates/ibm-granite-granite-3.3-2B-Instruct.jinja"), &src, NULL));
    KT_CHECK_EQ(ktc_detect(src), KTC_GRANITE);
    free(src);
    static const struct {
        const char *file;
        ktc_format f;
        ktc_reasoning r;
    } k_det[] = {{"ByteDance-Seed-OSS", KTC_SEED_OSS, KTC_THINK_SEED},
                 {"MiniMax-M2", KTC_MINIMAX_M2, KTC_THINK_TAGS},
                 {"CohereForAI-c4ai-command-r-plus-tool_use", KTC_COMMAND_R_PLUS, KTC_THINK_NONE},
                 {"fireworks-ai-llama-3-firefunction-v2", KTC_FIREFUNCTION, KTC_THINK_NONE},
                 {"deepseek-ai-DeepSeek-V3.2", KTC_DSML, KTC_THINK_TAGS},
                 {"deepseek-ai-DeepSeek-V4", KTC_DSML_V4, KTC_THINK_TAGS},
                 {"deepseek-ai-DeepSeek-V4-Flash-0731", KTC_DSML_V4, KTC_THINK_TAGS},
                 {"openbmb-MiniCPM5-1B", KTC_MINICPM5, KTC_THINK_TAGS},
                 {"tencent-Hy3", KTC_HY3, KTC_THINK_HY3},
                 {"google-gemma-4-31B-it", KTC_GEMMA4, KTC_THINK_GEMMA4},
                 {"MiniMax-M3", KTC_MINIMAX_M3, KTC_THINK_MM},
                 {"Kimi-K3", KTC_KIMI_K3, KTC_THINK_KIMI_K3},
                 {"Apriel-1.6-15b-Thinker-fixed", KTC_APRIEL, KTC_THINK_APRIEL},
                 {"upstage-Solar-Open-100B", KTC_SOLAR, KTC_THINK_SOLAR},
                 {"LFM2.5-8B-A1B", KTC_LFM2, KTC_THINK_TAGS},
                 {"LFM2-8B-A1B", KTC_LFM2, KTC_THINK_NONE},
                 {"meetkai-functionary-medium-v3.2", KTC_FUNCTIONARY32, KTC_THINK_NONE},
                 {"muse-glimmer", KTC_MUSE_GLIMMER, KTC_THINK_NONE},
                 {"llama4-pythonic", KTC_PYTHONIC, KTC_THINK_NONE},
                 {"microsoft-Phi-4-mini-instruct", KTC_PHI4, KTC_THINK_NONE},
                 {"llama-cpp-deepseek-r1", KTC_DEEPSEEK, KTC_THINK_TAGS},
                 {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", KTC_DEEPSEEK, KTC_THINK_TAGS},
                 {"ibm-granite-granite-3.3-2B-Instruct", KTC_GRANITE, KTC_THINK_TAGS},
                 {"CohereForAI-c4ai-command-r7b-12-2024-tool_use", KTC_COMMAND_R, KTC_THINK_COHERE},
                 {"CohereForAI-c4ai-command-r-plus-tool_use", KTC_COMMAND_R_PLUS, KTC_THINK_NONE}};
    for (size_t i = 0; i < sizeof k_det / sizeof *k_det; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/data/chat/templates/%s.jinja", k_det[i].file);
        KT_CHECK_OK(ku_read_file(kt_path(path, sizeof path, rel), &src, NULL));
        KT_CHECKF(ktc_detect(src) == k_det[i].f && ktc_detect_reasoning(src) == k_det[i].r, "%s: %s", k_det[i].file,
                  ktc_format_name(ktc_detect(src)));
        free(src);
    }
    /* Phi-4-mini-instruct's template (tools in the system turn) */
    KT_CHECK_EQ(ktc_detect("{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message %}{{ '<|' + "
                           "message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + "
                           "'<|end|>' }}{% endif %}{% endfor %}"),
                KTC_PHI4);
    /* Llama 4's own template (its headers, Llama 3's JSON calls) */
    KT_CHECK_EQ(ktc_detect("{{- '<|header_start|>assistant<|header_end|>\\n\\n' -}}{%- for tool_call in message.tool_calls %}"
                           "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}"
                           "{%- endfor %}"),
                KTC_LLAMA3);
    KT_CHECK(ktc_needs_special(KTC_HARMONY) && !ktc_needs_special(KTC_HERMES));
}

/* The arguments written so far of a call cut short, ends' whitespace aside. */
static bool same_text(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    while (na && (a[na - 1] == ' ' || a[na - 1] == '\n')) na--;
    while (nb && (b[nb - 1] == ' ' || b[nb - 1] == '\n')) nb--;
    return na == nb && !memcmp(a, b, na);
}

/* A check that reports and goes on (every failing case is shown). */
static bool KILN_PRINTF(3, 4) case_check(int line, bool cond, const char *fmt, ...) {
    if (cond) return true;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kt_fail(__FILE__, line, "%s", msg);
    return false;
}

/* llama.cpp's test-chat.cpp cases (tests/data/tools/llama_cpp_cases.json),
 * whole and streamed at every split point (the deltas add up to the whole
 * parse, so no markup reaches content on the way), and the format's call
 * trigger never in content unless the case's content holds it. A case
 * marked partial is a cut-short output: parsed as a prefix (a call's
 * expected arguments are then the text written so far, or null: none). */
KT_TEST(toolcall_llama_cpp_cases) {
    char path[4096];
    cJSON *d;
    KT_CHECK_OK(ku_json_load(kt_path(path, sizeof path, "tests/data/tools/llama_cpp_cases.json"), &d));
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(d, "tools"), *c;
    int n = 0, failed = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(d, "cases")) {
        const char *src = cJSON_GetObjectItemCaseSensitive(c, "source")->valuestring;
        const char *fmt = cJSON_GetObjectItemCaseSensitive(c, "format")->valuestring;
        const char *text = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        const char *think = cJSON_GetObjectItemCaseSensitive(c, "reasoning")->valuestring;
        const char *want_content = cJSON_GetObjectItemCaseSensitive(c, "content")->valuestring;
        const char *want_reasoning = cJSON_GetObjectItemCaseSensitive(c, "reasoning_content")->valuestring;
        bool partial = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "partial"));
        ktc_syntax syn = {KTC_NONE, !strcmp(think, "tags") ? KTC_THINK_TAGS : !strcmp(think, "mistral") ? KTC_THINK_MISTRAL
                                                  : !strcmp(think, "cohere") ? KTC_THINK_COHERE
                                                  : !strcmp(think, "seed")   ? KTC_THINK_SEED : KTC_THINK_NONE,
                          cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "think_open")), tools, NULL};
        for (int f = 0; f < KTC_N_FORMATS; f++)
            if (!strcmp(ktc_format_name((ktc_format)f), fmt)) syn.format = (ktc_format)f;
        KT_CHECKF(syn.format != KTC_NONE, "%s: format %s", src, fmt);
        /* a case named after a committed template: the format is the one detected from it */
        char rel[256], *tsrc = NULL;
        snprintf(rel, sizeof rel, "tests/data/chat/templates/%.*s.jinja", (int)strcspn(src, " "), src);
        if (access(kt_path(path, sizeof path, rel), R_OK) != 0)
            snprintf(rel, sizeof rel, "tests/data/tools/templates/%.*s.jinja", (int)strcspn(src, " "), src);
        if (access(kt_path(path, sizeof path, rel), R_OK) == 0) {
            KT_CHECK_OK(ku_read_file(path, &tsrc, NULL));
            KT_CHECKF(ktc_detect(tsrc) == syn.format, "%s: detected %s, the case says %s", src, ktc_format_name(ktc_detect(tsrc)), fmt);
            free(tsrc);
        }
        ktc_msg m;
        KT_CHECK_OK(ktc_parse(&syn, text, strlen(text), partial, &m));
        bool ok = true;
        const char *trig = ktc_trigger(syn.format);
        ok &= case_check(__LINE__, !strcmp(m.content, want_content), "case %d (%s): content [%s]", n, src, m.content);
        ok &= case_check(__LINE__, !trig || strstr(want_content, trig) || !strstr(m.content, trig), "case %d (%s): %s in content", n, src, trig);
        ok &= case_check(__LINE__, !strcmp(m.reasoning, want_reasoning), "case %d (%s): reasoning [%s]", n, src, m.reasoning);
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(c, "calls");
        ok &= case_check(__LINE__, m.n_calls == cJSON_GetArraySize(calls), "case %d (%s): %d calls", n, src, m.n_calls);
        for (int i = 0; ok && i < m.n_calls; i++) {
            const cJSON *w = cJSON_GetArrayItem(calls, i), *wa = cJSON_GetArrayItem(w, 1);
            bool args_ok = cJSON_IsNull(wa)     ? !m.calls[i].arguments[0]
                           : cJSON_IsString(wa) ? same_text(m.calls[i].arguments, wa->valuestring)
                                                : args_equal(m.calls[i].arguments, wa);
            ok &= case_check(__LINE__, !strcmp(m.calls[i].name, cJSON_GetArrayItem(w, 0)->valuestring) && args_ok,
                            "case %d (%s): call %d is %s(%s)", n, src, i, m.calls[i].name, m.calls[i].arguments);
        }
        ktc_msg_free(&m);
        if (ok && !partial) {
            char why[512];
            const char *r = stream_all_splits(&syn, text, why, sizeof why);
            ok &= case_check(__LINE__, !r, "case %d (%s): streaming: %s", n, src, r);
        }
        failed += !ok;
        n++;
    }
    fprintf(stderr, "  llama.cpp test-chat cases: %d, %d failed\n", n, failed);
    KT_CHECK(n >= 120);
    cJSON_Delete(d);
}

/* ---- every template of ../shared/chat-templates ---- */

/* Templates whose round trip cannot hold, and why. */
static const struct {
    const char *file, *why;
} k_rt_known[] = {
    {"Kimi-K2-Instruct", "calls list.append, which transformers' ImmutableSandboxedEnvironment refuses too (SecurityError; tools/jinja_python_oracle.py)"},
    {"Kimi-K2-Thinking", "calls list.append, which transformers' ImmutableSandboxedEnvironment refuses too (SecurityError; tools/jinja_python_oracle.py)"},
    {"ibm-granite-granite-3.3", "renders no past calls"},
    {"LFM2-8B-A1B", "renders no past calls"},
    {"LFM2.5-Instruct", "renders no past calls"},
};

/* What ends an assistant turn in the templates (EOS and end-of-turn
 * markers: not part of the model's output). */
static const char *const k_turn_ends[] = {
    "<|im_end|>", "<|eot_id|>", "</s>", "<|call|>", "<|end|>", "<｜end▁of▁sentence｜>", "<|END_OF_TURN_TOKEN|>", "[e~[",
    "<|user|>", "<｜hy_eos:opensource｜>", "<|START_OF_TURN_TOKEN|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<seed:eos>", "<SPECIAL_12>", "<|eot|>", "<|end_of_text|>", "<|role_end|>", "</assistant>", "<sep>",
};

/* The model's output in a rendered conversation: full minus the prompt
 * (back to the end of the last tag where they part), up to the turn's end
 * after the last call's last argument (last: "Tokyo" or "Paris"). NULL
 * when the template did not render the calls. */
static char *turn_output(const char *prompt, const char *full, const char *last, size_t *k_out) {
    size_t k = 0;
    while (prompt[k] && prompt[k] == full[k]) k++;
    if (prompt[k])
        while (k > 0 && full[k - 1] != '>' && full[k - 1] != '\n') k--;
    static const char hdr[] = "<|CHATBOT_TOKEN|>"; /* Command R+ (see toolcall_round_trip_real_templates) */
    if (!strncmp(full + k, hdr, sizeof hdr - 1)) k += sizeof hdr - 1;
    const char *l = NULL;
    for (const char *q = full + k; (q = strstr(q, last)); q++) l = q;
    if (!l) return NULL;
    const char *e = l + strlen(l);
    for (size_t i = 0; i < sizeof k_turn_ends / sizeof *k_turn_ends; i++) {
        const char *f = strstr(l, k_turn_ends[i]);
        if (f && f < e) e = f;
    }
    *k_out = k;
    return strndup(full + k, (size_t)(e - (full + k)));
}

/* One template: NULL (the round trip holds), or why not (why). */
static const char *shared_round_trip(const char *src, const cJSON *tools, ktc_format f, char *why, size_t cap, bool *thought) {
    kchat_template *t = NULL;
    kiln_status st = kchat_parse(src, &t);
    const char *r = NULL;
    char *prompt = NULL, *full = NULL, *out = NULL;
    cJSON *m0 = conversation(2, false), *m1 = NULL, *extra = cJSON_Parse("{\"thinking\": true, \"enable_thinking\": true}");
    kchat_input in = {.messages = m0, .tools = tools, .extra = extra, .add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>"};
    if (!st) st = kchat_render(t, &in, &prompt);
    /* two calls, else one (Llama 3.1 raises on more, gpt-oss renders the first); arguments as
     * objects, else as JSON text (functionary v3.2 concatenates them) */
    size_t k = 0;
    int n_calls = 0;
    for (int a = 0; !st && a < 4; a++) {
        n_calls = 2 - a % 2;
        m1 = conversation_args(n_calls, true, a >= 2);
        in.messages = m1, in.add_generation_prompt = false;
        st = kchat_render(t, &in, &full);
        if (!st && (out = turn_output(prompt, full, n_calls > 1 ? "Tokyo" : "Paris", &k))) break;
        if (a < 3) kiln_status_free(st), st = NULL, free(full), full = NULL;
        cJSON_Delete(m1), m1 = NULL;
    }
    if (st) snprintf(why, cap, "does not render: %.200s", kiln_status_msg(st)), r = why;
    else if (!out) snprintf(why, cap, "renders no past calls"), r = why;
    ktc_msg m = {0};
    if (!r) {
        /* the prompt opens the thinking block (R1, Apriel 1.6) where a past turn does not write the opener */
        ktc_syntax syn = {f, ktc_detect_reasoning(src), false, tools, NULL};
        const char *o, *c;
        ktc_think_markers(f, syn.reasoning, &o, &c);
        syn.think_open = ktc_prompt_opens_think(syn.reasoning, prompt) && o && strncmp(out, o, strlen(o));
        prompt[k] = 0;
        syn.think_open |= ktc_prompt_opens_think(syn.reasoning, prompt);
        kiln_status pst = ktc_parse(&syn, out, strlen(out), false, &m);
        bool think = strstr(out, "The user wants two tools.") != NULL &&
                     (syn.reasoning != KTC_THINK_NONE || f == KTC_HARMONY || f == KTC_MUSE_GLIMMER);
        if (thought) *thought = think;
        if (pst) snprintf(why, cap, "parse: %s", kiln_status_msg(pst)), r = why;
        else if (m.n_calls != n_calls) snprintf(why, cap, "%d calls of %d from %.900s", m.n_calls, n_calls, out), r = why;
        for (int i = 0; !r && i < m.n_calls; i++) {
            cJSON *want = cJSON_Parse(k_call_args[i]);
            if (strcmp(m.calls[i].name, k_call_names[i]) || !args_equal(m.calls[i].arguments, want))
                snprintf(why, cap, "call %d is %s(%s) from %.300s", i, m.calls[i].name, m.calls[i].arguments, out), r = why;
            cJSON_Delete(want);
        }
        if (!r && m.n_content) snprintf(why, cap, "content [%.100s] from %.300s", m.content, out), r = why;
        if (!r && think && strcmp(m.reasoning, "The user wants two tools."))
            snprintf(why, cap, "reasoning [%.100s] from %.300s", m.reasoning, out), r = why;
        if (!r) {
            char sw[512];
            const char *sr = stream_all_splits(&syn, out, sw, sizeof sw);
            if (sr) snprintf(why, cap, "streaming: %.300s", sr), r = why;
        }
        kiln_status_free(pst);
    }
    ktc_msg_free(&m);
    kiln_status_free(st);
    free(prompt), free(full), free(out);
    cJSON_Delete(m0), cJSON_Delete(m1), cJSON_Delete(extra);
    kchat_free(t);
    return r;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every template of ../shared/chat-templates that renders tools: the
 * format detected from it, and a round trip (an assistant turn with two
 * calls, or one where the template takes one, and reasoning, rendered and
 * parsed back: the same calls, no content, the reasoning split out where
 * the turn holds it, streaming at every split point as the whole). Prints
 * the templates with no format and those whose round trip does not hold;
 * every template with a format must hold, but those k_rt_known names (a
 * documented reason). */
KT_TEST(toolcall_round_trip_shared_templates) {
    const char *shared = kt_shared();
    if (!shared) {
        kt_skip("../shared absent (../shared/chat-templates)");
        return;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/chat-templates", shared);
    DIR *d = opendir(dir);
    if (!d) {
        kt_skip("no %s", dir);
        return;
    }
    char *names[256];
    int nn = 0;
    for (struct dirent *e; (e = readdir(d)) && nn < 256;) {
        size_t l = strlen(e->d_name);
        if (l > 6 && !strcmp(e->d_name + l - 6, ".jinja")) names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)nn, sizeof *names, cmp_name);
    cJSON *tools = cJSON_Parse(k_tools);
    int with_tools = 0, pass = 0, none = 0, failed = 0, with_think = 0;
    for (int i = 0; i < nn; i++) {
        char p[4400], *src = NULL, why[1024];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        KT_CHECK_OK(ku_read_file(p, &src, NULL));
        /* renders tools: the tool's name in a prompt rendered with them */
        kchat_template *t = NULL;
        char *prompt = NULL;
        cJSON *m0 = conversation(1, false);
        kchat_input in = {.messages = m0, .tools = tools, .add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>"};
        kiln_status st = kchat_parse(src, &t);
        if (!st) st = kchat_render(t, &in, &prompt);
        bool renders = !st && strstr(prompt, "get_weather");
        kiln_status_free(st);
        free(prompt);
        kchat_free(t);
        cJSON_Delete(m0);
        if (renders) {
            with_tools++;
            ktc_format f = ktc_detect(src);
            bool thought = false;
            const char *r = f == KTC_NONE ? "no format" : shared_round_trip(src, tools, f, why, sizeof why, &thought);
            with_think += !r && thought;
            bool known = false;
            for (size_t k = 0; r && f != KTC_NONE && k < sizeof k_rt_known / sizeof *k_rt_known; k++)
                known |= !strncmp(names[i], k_rt_known[k].file, strlen(k_rt_known[k].file));
            pass += !r, none += f == KTC_NONE, failed += r && f != KTC_NONE && !known;
            if (r) fprintf(stderr, "  %-48s %-14s %s%s\n", names[i], ktc_format_name(f), known ? "(known) " : "", r);
            else fprintf(stderr, "  %-48s %-14s round trip holds\n", names[i], ktc_format_name(f));
            case_check(__LINE__, !r || f == KTC_NONE || known, "%s (%s): round trip fails", names[i], ktc_format_name(f));
        }
        free(src);
        free(names[i]);
    }
    fprintf(stderr, "  shared templates: %d, %d render tools: %d round trips hold (%d with reasoning split out), %d have no format, %d fail\n",
            nn, with_tools, pass, with_think, none, failed);
    cJSON_Delete(tools);
}

/* The formats ported from llama.cpp's common/parsers, on their committed
 * templates (tests/data/chat/templates): detected, and the round trip of
 * toolcall_round_trip_shared_templates (no ../shared needed). */
static const struct {
    const char *file;
    ktc_format f;
} k_rt_more[] = {
    {"unsloth-Apriel-1.5", KTC_APRIEL},
    {"Apriel-1.6-15b-Thinker-fixed", KTC_APRIEL},
    {"MiniMax-M1", KTC_MINIMAX_M1},
    {"NVIDIA-Nemotron-Nano-v2", KTC_NEMOTRON_V2},
    {"GigaChat3-10B-A1.8B", KTC_GIGACHAT3},
    {"GigaChat3.1-10B-A1.8B", KTC_GIGACHAT31},
    {"Apertus-8B-Instruct", KTC_APERTUS},
    {"upstage-Solar-Open-100B", KTC_SOLAR},
    {"meetkai-functionary-medium-v3.1", KTC_FUNCTIONARY31},
    {"meetkai-functionary-medium-v3.2", KTC_FUNCTIONARY32},
    {"LFM2.5-8B-A1B", KTC_LFM2},
    {"google-gemma-4-31B-it", KTC_GEMMA4},
    {"google-gemma-4-31B-it-interleaved", KTC_GEMMA4},
    {"MiniMax-M3", KTC_MINIMAX_M3},
    {"Kimi-K3", KTC_KIMI_K3},
    {"muse-glimmer", KTC_MUSE_GLIMMER},
    {"llama4-pythonic", KTC_PYTHONIC},
};

static char *committed_template(const char *name) {
    char rel[256], path[4096], *src = NULL;
    snprintf(rel, sizeof rel, "tests/data/chat/templates/%s.jinja", name);
    kiln_status st = ku_read_file(kt_path(path, sizeof path, rel), &src, NULL);
    kiln_status_free(st);
    return st ? NULL : src;
}

KT_TEST(toolcall_round_trip_more_formats) {
    cJSON *tools = cJSON_Parse(k_tools);
    for (size_t c = 0; c < sizeof k_rt_more / sizeof *k_rt_more; c++) {
        char *src = committed_template(k_rt_more[c].file), why[1024];
        KT_CHECKF(src, "%s: not committed", k_rt_more[c].file);
        KT_CHECKF(ktc_detect(src) == k_rt_more[c].f, "%s: detected %s", k_rt_more[c].file, ktc_format_name(ktc_detect(src)));
        const char *r = shared_round_trip(src, tools, k_rt_more[c].f, why, sizeof why, NULL);
        KT_CHECKF(!r, "%s: %s", k_rt_more[c].file, r);
        free(src);
    }
    cJSON_Delete(tools);
}

/* Their grammars (markers as text) take the calls the templates write:
 * from the trigger, byte by byte, until the grammar ends or refuses; the
 * trigger and what it took parse to the first call at least. */
KT_TEST(toolcall_grammar_takes_more_formats) {
    cJSON *tools = cJSON_Parse(k_tools);
    kgr_vocab *v = NULL;
    KT_CHECK_OK(kgr_vocab_bytes(&v));
    int tested = 0;
    for (size_t c = 0; c < sizeof k_rt_more / sizeof *k_rt_more; c++) {
        ktc_format f = k_rt_more[c].f;
        if (!ktc_grammar_supported(f)) continue;
        char *src = committed_template(k_rt_more[c].file), *full = NULL, *g = NULL;
        kchat_template *t = NULL;
        KT_CHECK_OK(kchat_parse(src, &t));
        cJSON *m1 = NULL;
        kiln_status st = NULL;
        for (int a = 0; a < 4; a++) { /* as shared_round_trip */
            m1 = conversation_args(2 - a % 2, true, a >= 2);
            kchat_input in = {.messages = m1, .tools = tools, .add_generation_prompt = false, .bos_token = "<s>", .eos_token = "</s>"};
            kiln_status_free(st);
            st = kchat_render(t, &in, &full);
            if (!st && (strstr(full, "Asia/Tokyo") || strstr(full, "\"Paris\""))) break; /* the calls, not [object Map] */
            free(full), full = NULL;
            cJSON_Delete(m1), m1 = NULL;
        }
        KT_CHECKF(full, "%s: renders no calls", k_rt_more[c].file);
        KT_CHECK_OK(ktc_grammar(f, tools, NULL, true, NULL, &g));
        kgr_grammar *gr = NULL;
        kgr_matcher *m = NULL;
        st = kgr_from_gbnf(g, strlen(g), &gr);
        KT_CHECKF(!st, "%s: %s\n%s", k_rt_more[c].file, kiln_status_msg(st), g);
        KT_CHECK_OK(kgr_matcher_create_owned(gr, v, &m));
        const char *tr = ktc_trigger(f), *at = NULL;
        for (const char *q = full; (q = strstr(q, tr)); q++)
            if (strstr(q, "Paris")) at = q;
        KT_CHECKF(at, "%s: no %s in %s", k_rt_more[c].file, tr, full);
        const char *s = at + strlen(tr);
        size_t i = 0, ends = 0; /* where it last could end (a turn's end may begin as a next call does) */
        for (; s[i] && !kgr_matcher_done(m); i++) {
            if (!kgr_matcher_accept_bytes(m, s + i, 1)) break;
            if (kgr_matcher_can_end(m)) ends = i + 1;
        }
        KT_CHECKF(ends > 0, "%s: the grammar stops at byte %zu of %s\n%s", k_rt_more[c].file, i, s, g);
        i = ends;
        ktc_syntax syn = {f, KTC_THINK_NONE, false, tools, NULL};
        ktc_msg pm;
        size_t n = strlen(tr) + i;
        KT_CHECK_OK(ktc_parse(&syn, at, n, false, &pm));
        cJSON *want = cJSON_Parse(k_call_args[0]);
        KT_CHECKF(pm.n_calls >= 1 && !strcmp(pm.calls[0].name, "get_weather") && args_equal(pm.calls[0].arguments, want),
                  "%s: the grammar's text %.*s parses to %d calls", k_rt_more[c].file, (int)n, at, pm.n_calls);
        cJSON_Delete(want);
        ktc_msg_free(&pm);
        tested++;
        kgr_matcher_free(m);
        free(g), free(full), free(src);
        cJSON_Delete(m1);
        kchat_free(t);
    }
    KT_CHECK_EQ(tested, 17);
    kgr_vocab_free(v);
    cJSON_Delete(tools);
}

/* Formats that build the arguments from tags or literals stream them as
 * they are written: cut inside a string parameter's value, the streamed
 * arguments already hold the key and the value's text so far (a number
 * waits until it closes), a prefix of the final arguments; and the whole
 * streams at every split point as it parses. */
KT_TEST(toolcall_tag_arguments_stream_as_written) {
    static const struct {
        ktc_format f;
        const char *text;
    } k_inc[] = {
        {KTC_QWEN3_CODER, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
                          "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"},
        {KTC_GLM45, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>San Francisco</arg_value>\n"
                    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"},
        {KTC_MUSE_GLIMMER, "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">San "
                           "Francisco</atem:parameter>\n<atem:parameter name=\"days\">3</atem:parameter>\n</atem:invoke>\n"
                           "</atem:function_calls>"},
        {KTC_LFM2, "<|tool_call_start|>[get_weather(city='San Francisco', days=3)]<|tool_call_end|>"},
        {KTC_LFM2, "<|tool_call_start|>[get_weather(city=\"San Francisco\\u00e9\", days=3)]<|tool_call_end|>"},
        {KTC_GEMMA4, "<|tool_call>call:get_weather{city:<|\"|>San Francisco<|\"|>,days:3}<tool_call|>"},
        {KTC_MINIMAX_M3, "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">\n]<]minimax[>[<city>San "
                         "Francisco]<]minimax[>[</city>\n]<]minimax[>[<days>3]<]minimax[>[</days>\n]<]minimax[>[</invoke>\n"
                         "]<]minimax[>[</tool_call>"},
        {KTC_KIMI_K3, "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" "
                      "type=\"string\"<|sep|>San Francisco<|close|>argument<|sep|><|open|>argument key=\"days\" type=\"integer\"<|sep|>3"
                      "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"},
        {KTC_KIMI_K3, "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>"
                      "{\"city\": \"San Francisco\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"},
    };
    cJSON *tools = cJSON_Parse(k_tools);
    for (size_t c = 0; c < sizeof k_inc / sizeof *k_inc; c++) {
        ktc_syntax syn = {k_inc[c].f, KTC_THINK_NONE, false, tools, NULL};
        const char *t = k_inc[c].text, *cut = strstr(t, "Franc");
        ktc_msg whole;
        KT_CHECK_OK(ktc_parse(&syn, t, strlen(t), false, &whole));
        KT_CHECKF(whole.n_calls == 1 && !strcmp(whole.calls[0].name, "get_weather"), "case %zu: %d calls", c, whole.n_calls);
        cJSON *a = cJSON_Parse(whole.n_calls ? whole.calls[0].arguments : "");
        KT_CHECKF(cJSON_IsString(cJSON_GetObjectItem(a, "city")), "case %zu: %s", c, whole.calls[0].arguments);
        cJSON_Delete(a);
        ktc_stream *st = ktc_stream_create(&syn);
        gathered *g = calloc(1, sizeof *g);
        KT_CHECK_OK(ktc_stream_feed(st, t, (size_t)(cut - t), false, on_delta, g));
        KT_CHECKF(g->n_calls == 1 && strstr(g->args[0], "\"San ") &&
                      !strncmp(g->args[0], whole.calls[0].arguments, strlen(g->args[0])),
                  "case %zu: streamed [%s] before the value closes, final %s", c, g->args[0], whole.calls[0].arguments);
        const char *days = strstr(t, "3"); /* (the json block writes none) */
        if (!days) days = cut - 1;
        else KT_CHECK_OK(ktc_stream_feed(st, cut, (size_t)(days + 1 - cut), false, on_delta, g));
        KT_CHECKF(!strstr(g->args[0], "3") && !strncmp(g->args[0], whole.calls[0].arguments, strlen(g->args[0])),
                  "case %zu: a number shown before it closes: [%s]", c, g->args[0]);
        KT_CHECK_OK(ktc_stream_feed(st, days + 1, strlen(days + 1), true, on_delta, g));
        KT_CHECK_STR(g->args[0], whole.calls[0].arguments);
        free(g);
        ktc_stream_destroy(st);
        char why[512];
        const char *r = stream_all_splits(&syn, t, why, sizeof why);
        KT_CHECKF(!r, "case %zu: streaming: %s", c, r);
        ktc_msg_free(&whole);
    }
    cJSON_Delete(tools);
}

/* A start marker with no call after it stays text and the parse goes on
 * (functionary v3.1's "<function=" then no call looped forever: found by a
 * differential run over random marker texts). */
KT_TEST(toolcall_marker_without_call_terminates) {
    static const struct {
        ktc_format f;
        const char *text;
    } k[] = {
        {KTC_FUNCTIONARY31, "a <function=f\nb"},
        {KTC_FUNCTIONARY31, "</TOOLCALL>\n<function=f>x"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        ktc_syntax syn = {.format = k[i].f};
        size_t n = strlen(k[i].text);
        for (size_t l = 0; l <= n; l++) {
            ktc_msg m;
            KT_CHECK_OK(ktc_parse(&syn, k[i].text, l, l < n, &m));
            if (l == n) KT_CHECKF(!strcmp(m.content, k[i].text) && m.n_calls == 0, "%s: [%s] %d", k[i].text, m.content, m.n_calls);
            ktc_msg_free(&m);
        }
    }
    /* and a call after such a marker is still found */
    ktc_syntax syn = {.format = KTC_FUNCTIONARY31};
    ktc_msg m;
    const char *t = "<function=f\n x <function=g>{\"a\": 1}</function>";
    KT_CHECK_OK(ktc_parse(&syn, t, strlen(t), false, &m));
    KT_CHECKF(m.n_calls == 1 && !strcmp(m.calls[0].name, "g") && !strcmp(m.content, "<function=f\n x"), "[%s] %d", m.content, m.n_calls);
    ktc_msg_free(&m);
}
