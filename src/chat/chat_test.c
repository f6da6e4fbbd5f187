/* chat_test.c: chat templates against @huggingface/jinja's renders
 * (tests/data/chat, made by tools/jinja_oracle.mjs) and the folder loader.
 * Where that package raises but Python's jinja2 (transformers, the reference
 * for chat templates) renders, tests/data/chat/expected_python/ holds
 * Python's render (tools/jinja_python_oracle.py) and wins: Seed-OSS's dict
 * with integer keys, Hermes-2-Pro's `description|trim` of a parameter
 * without a description (Undefined stringifies to ""). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "chat/chat.h"
#include "kt.h"

#define FIXED_NOW 1752582896 /* the oracle's frozen clock, 2025-07-15 12:34:56 UTC */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir ending in ext (malloc'ed array of malloc'ed names). */
static int list_dir(const char *dir, const char *ext, char ***out) {
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    char **v = NULL;
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), el = strlen(ext);
        if (l <= el || strcmp(e->d_name + l - el, ext) != 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            v = realloc(v, (size_t)cap * sizeof *v);
        }
        v[n++] = strndup(e->d_name, l - el);
    }
    closedir(d);
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: %.80s\n    got:  %.80s\n", i, want + from, got + from);
}

/* One input file's conversation (messages, tools, documents, kwargs,
 * add_generation_prompt) through the template, as the oracles render it. */
static kiln_status render_input(const kchat_template *ct, const cJSON *inp, const kjin_limits *lim, char **got) {
    kchat_input ki = {
        .messages = cJSON_GetObjectItemCaseSensitive(inp, "messages"),
        .tools = cJSON_GetObjectItemCaseSensitive(inp, "tools"),
        .documents = cJSON_GetObjectItemCaseSensitive(inp, "documents"),
        .extra = cJSON_GetObjectItemCaseSensitive(inp, "kwargs"),
        .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(inp, "add_generation_prompt")),
        .bos_token = "<s>",
        .eos_token = "</s>",
        .limits = lim,
    };
    return kchat_render(ct, &ki, got);
}

static void show_mismatch(const char *tmpl, const char *input, const cJSON *e, const cJSON *want, kiln_status st, const char *got) {
    fprintf(stderr, "  mismatch: %s x %s: ", tmpl, input);
    if (!want) fprintf(stderr, "expected an error (%s), got success\n", cJSON_GetObjectItemCaseSensitive(e, "error")->valuestring);
    else if (st) fprintf(stderr, "error %s\n", kiln_status_msg(st));
    else {
        fputc('\n', stderr);
        show_diff(want->valuestring, got);
    }
}

static int count_not_compared(const cJSON *pyexp) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, pyexp) n += cJSON_GetObjectItemCaseSensitive(e, "not_compared") != NULL;
    return n;
}

KT_TEST(chat_oracle_renders) {
    char tdir[4096], idir[4096], edir[4096], pdir[4096];
    kt_path(pdir, sizeof pdir, "tests/data/chat/expected_python");
    kt_path(tdir, sizeof tdir, "tests/data/chat/templates");
    kt_path(idir, sizeof idir, "tests/data/chat/inputs");
    kt_path(edir, sizeof edir, "tests/data/chat/expected");
    char **tn = NULL, **in = NULL;
    int nt = list_dir(tdir, ".jinja", &tn), ni = list_dir(idir, ".json", &in);
    KT_CHECKF(nt > 0 && ni > 0, "no templates or inputs under tests/data/chat");
    cJSON **inputs = calloc((size_t)ni, sizeof *inputs);
    for (int i = 0; i < ni; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s.json", idir, in[i]);
        KT_CHECK_OK(ku_json_load(p, &inputs[i]));
    }
    kjin_limits lim = kjin_limits_default();
    lim.now = FIXED_NOW;
    int pairs = 0, match = 0, raised = 0, shown = 0, tmpl_ok = 0, python = 0, not_compared = 0;
    for (int t = 0; t < nt; t++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s.jinja", tdir, tn[t]);
        char *src = NULL;
        KT_CHECK_OK(ku_read_file(p, &src, NULL));
        snprintf(p, sizeof p, "%s/%s.json", edir, tn[t]);
        cJSON *exp = NULL;
        KT_CHECK_OK(ku_json_load(p, &exp));
        snprintf(p, sizeof p, "%s/%s.json", pdir, tn[t]);
        cJSON *pyexp = NULL;
        if (access(p, F_OK) == 0) KT_CHECK_OK(ku_json_load(p, &pyexp));
        kchat_template *ct = NULL;
        kiln_status pst = kchat_parse(src, &ct);
        int tmatch = 0;
        for (int i = 0; i < ni; i++) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(exp, in[i]);
            if (!e) continue;
            const cJSON *pe = pyexp ? cJSON_GetObjectItemCaseSensitive(pyexp, in[i]) : NULL;
            if (pe) e = pe, python += cJSON_GetObjectItemCaseSensitive(pe, "out") != NULL;
            if (cJSON_GetObjectItemCaseSensitive(e, "not_compared")) { /* a documented difference */
                not_compared++;
                continue;
            }
            pairs++;
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(e, "out");
            char *got = NULL;
            kiln_status st = pst;
            if (!pst) {
                st = render_input(ct, inputs[i], &lim, &got);
            }
            bool ok;
            if (want) ok = !st && strcmp(got, want->valuestring) == 0;
            else ok = st != NULL;
            if (!want) raised++;
            if (ok) {
                match++;
                tmatch++;
            } else if (shown++ < 12) {
                show_mismatch(tn[t], in[i], e, want, st, got);
            }
            if (st != pst) kiln_status_free(st);
            free(got);
        }
        tmpl_ok += tmatch == cJSON_GetArraySize(exp) - (pyexp ? count_not_compared(pyexp) : 0);
        kiln_status_free(pst);
        kchat_free(ct);
        cJSON_Delete(exp);
        cJSON_Delete(pyexp);
        free(src);
    }
    fprintf(stderr, "  chat templates: %d/%d (template, input) pairs match @huggingface/jinja (%d of them errors); "
                    "%d/%d templates fully; %d pairs where Python's jinja2 renders and @huggingface/jinja raises "
                    "follow Python; %d not compared (expected_python/ lists why)\n", match, pairs, raised, tmpl_ok, nt, python, not_compared);
    for (int i = 0; i < ni; i++) cJSON_Delete(inputs[i]), free(in[i]);
    for (int t = 0; t < nt; t++) free(tn[t]);
    free(inputs);
    free(in);
    free(tn);
    KT_CHECK_EQ(match, pairs);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    fputs(text, f);
    fclose(f);
}

static char *make_dir(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/kiln-chat-test-XXXXXX");
    return mkdtemp(buf);
}

static void rm_dir(const char *dir) {
    const char *names[] = {"tokenizer_config.json", "chat_template.jinja", "chat_template.json"};
    for (size_t i = 0; i < 3; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        remove(p);
    }
    remove(dir);
}

KT_TEST(chat_load_finds_templates_and_tokens) {
    char dir[64];
    KT_CHECK(make_dir(dir, sizeof dir));
    kchat_template *t = NULL;
    KT_CHECK_ERR(kchat_load(dir, &t), "no chat template");
    write_file(dir, "tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"<|begin|>\", \"lstrip\": false}, \"eos_token\": \"<|end|>\","
               " \"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"},"
               " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}{{ enable_thinking }}\"}]}");
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\"}, {\"type\": \"function\"}]");
    cJSON *extra = cJSON_Parse("{\"enable_thinking\": false}");
    char *out = NULL;
    KT_CHECK_OK(kchat_load(dir, &t));
    KT_CHECK_STR(kchat_special_token(t, "bos_token"), "<|begin|>");
    kchat_input in = {.messages = msgs, .tools = tools, .extra = extra};
    KT_CHECK_OK(kchat_render(t, &in, &out));
    KT_CHECK_STR(out, "D<|begin|>hi<|end|>");
    free(out);
    kchat_free(t);
    KT_CHECK_OK(kchat_load_named(dir, "tool_use", &t));
    KT_CHECK_OK(kchat_render(t, &in, &out));
    KT_CHECK_STR(out, "T2false");
    free(out);
    kchat_free(t);
    KT_CHECK_ERR(kchat_load_named(dir, "rag", &t), "have: default, tool_use");
    /* chat_template.jinja wins over tokenizer_config.json */
    write_file(dir, "chat_template.jinja", "J{{ bos_token }}{% if add_generation_prompt %}>{% endif %}\n");
    KT_CHECK_OK(kchat_load(dir, &t));
    in.add_generation_prompt = true;
    in.bos_token = "<B>";
    KT_CHECK_OK(kchat_render(t, &in, &out));
    KT_CHECK_STR(out, "J<B>>");
    free(out);
    kchat_free(t);
    /* raise_exception comes back as an error with its message */
    KT_CHECK_OK(kchat_parse("{{ raise_exception('Only user and assistant roles are supported!') }}", &t));
    KT_CHECK_ERR(kchat_render(t, &in, &out), "Only user and assistant roles are supported!");
    kchat_free(t);
    write_file(dir, "chat_template.jinja", "{% if %}");
    KT_CHECK_ERR(kchat_load(dir, &t), "chat_template.jinja: chat template: line 1");
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(extra);
    rm_dir(dir);
}

KT_TEST(chat_real_tokenizer_configs) {
    const char *sh = kt_shared();
    if (!sh) {
        kt_skip("../shared absent");
        return;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", sh);
    kchat_template *t;
    KT_CHECK_OK(kchat_load(dir, &t));
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Hello\"}]");
    kchat_input in = {.messages = msgs, .add_generation_prompt = true};
    char *out;
    KT_CHECK_OK(kchat_render(t, &in, &out));
    KT_CHECK_STR(out, "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    kchat_free(t);
    snprintf(dir, sizeof dir, "%s/tokenizers/mistral-7b-v0.1", sh);
    KT_CHECK_ERR(kchat_load(dir, &t), "no chat template");
    cJSON_Delete(msgs);
}

/* Seed-OSS (a dict with integer keys picks the thinking budget's reflection
 * interval) and Hermes-2-Pro/3 tool use (`description|trim` of a parameter
 * without a description) rendered with tools, against Python's jinja2 as
 * transformers configures it (texts from tools/jinja_python_oracle.py's
 * environment; Hermes-3's template is Hermes-2-Pro's but for its name). */
static const char *const SEED_PY =
    "<seed:bos>system\n"
    "You are Doubao, a helpful AI assistant. You may call one or more functions to assist with the user query.\n"
    "\n"
    "Function:\n"
    "def f(a: int,b: str):\n"
    "    \"\"\"\n"
    "    Do f.\n"
    "\n"
    "    Args:\n"
    "    - a (int) [必填]: \n"
    "    - b (str) [选填]: B.\n"
    "\n"
    "    \"\"\"\n"
    "工具调用请遵循如下格式:\n"
    "<seed:tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>value_1</parameter>\n"
    "<parameter=example_parameter_2>This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines</parameter>\n"
    "</function>\n"
    "</seed:tool_call>\n"
    "<seed:eos><seed:bos>system\n"
    "You are an intelligent assistant with reflective ability. In the process of thinking and reasoning, you need to strictly follow the thinking budget, which is 1000. That is, you need to complete your thinking within 1000 tokens and start answering the user's questions. You will reflect on your thinking process every 256 tokens, stating how many tokens have been used and how many are left.\n"
    "<seed:eos><seed:bos>user\n"
    "hi<seed:eos><seed:bos>assistant\n";
static const char *const HERMES_PY =
    "<s><|im_start|>system\n"
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. You may call one or more functions to assist with the user query. Don't make assumptions about what values to plug into functions. Here are the available tools: <tools> {\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"f(a: int, b: str) - Do f.\n"
    "\n"
    "    Args:\n"
    "        a(int):         b(str): B.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\", \"description\": \"B.\"}}, \"required\": [\"a\"]}} </tools>Use the following pydantic model json schema for each tool call you will make: {\"properties\": {\"name\": {\"title\": \"Name\", \"type\": \"string\"}, \"arguments\": {\"title\": \"Arguments\", \"type\": \"object\"}}, \"required\": [\"name\", \"arguments\"], \"title\": \"FunctionCall\", \"type\": \"object\"}}\n"
    "For each function call return a json object with function name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-dict>}\n"
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "hi<|im_end|>\n"
    "<|im_start|>assistant\n";

KT_TEST(chat_tool_templates_render_as_python) {
    static const char *const names[] = {"ByteDance-Seed-OSS", "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"};
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hi\"}]");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"Do f.\", \"parameters\": "
                               "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\", "
                               "\"description\": \"B.\"}}, \"required\": [\"a\"]}}}]");
    cJSON *extra = cJSON_Parse("{\"thinking_budget\": 1000}");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char p[4096], rel[256];
        snprintf(rel, sizeof rel, "tests/data/chat/templates/%s.jinja", names[i]);
        char *src = NULL, *out = NULL;
        KT_CHECK_OK(ku_read_file(kt_path(p, sizeof p, rel), &src, NULL));
        kchat_template *t = NULL;
        KT_CHECK_OK(kchat_parse(src, &t));
        kchat_input in = {.messages = msgs, .tools = tools, .extra = extra, .add_generation_prompt = true,
                          .bos_token = "<s>", .eos_token = "</s>"};
        KT_CHECK_OK(kchat_render(t, &in, &out));
        const char *want = i == 0 ? SEED_PY : HERMES_PY;
        if (strcmp(out, want)) show_diff(want, out);
        KT_CHECK_STR(out, want);
        free(out);
        kchat_free(t);
        free(src);
    }
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(extra);
}

/* Every real template of ../shared/chat-templates (llama.cpp's test set)
 * rendered with agent conversations (tests/data/chat/agent/inputs.json:
 * tools, an assistant turn with reasoning_content and tool calls, tool
 * results, a later turn, parallel calls, thinking on and off) against
 * Python's jinja2 as transformers configures it (expected.json, made by
 * tools/jinja_python_oracle.py --agent). Prints the templates that fail to
 * render; where Python raises (the template's own raise_exception, a
 * variable only llama.cpp passes), kiln must raise too. Where kiln keeps
 * @huggingface/jinja's behaviour the pair is marked not_compared. */
KT_TEST(chat_renders_agent_conversations) {
    const char *shared = kt_shared();
    if (!shared) {
        kt_skip("../shared/chat-templates is absent (KILN_SHARED)");
        return;
    }
    char tdir[4096], p[4200];
    snprintf(tdir, sizeof tdir, "%s/chat-templates", shared);
    char **tn = NULL;
    int nt = list_dir(tdir, ".jinja", &tn);
    if (nt <= 0) {
        kt_skip("no templates under %s", tdir);
        return;
    }
    cJSON *inputs = NULL, *exp = NULL;
    KT_CHECK_OK(ku_json_load(kt_path(p, sizeof p, "tests/data/chat/agent/inputs.json"), &inputs));
    KT_CHECK_OK(ku_json_load(kt_path(p, sizeof p, "tests/data/chat/agent/expected.json"), &exp));
    kjin_limits lim = kjin_limits_default();
    lim.now = FIXED_NOW;
    int pairs = 0, rendered = 0, match = 0, raised = 0, shown = 0, not_compared = 0;
    for (int t = 0; t < nt; t++) {
        snprintf(p, sizeof p, "%s/%s.jinja", tdir, tn[t]);
        char *src = NULL;
        KT_CHECK_OK(ku_read_file(p, &src, NULL));
        const cJSON *te = cJSON_GetObjectItemCaseSensitive(exp, tn[t]), *inp;
        KT_CHECKF(te, "%s: not in tests/data/chat/agent/expected.json (rerun tools/jinja_python_oracle.py --agent)", tn[t]);
        kchat_template *ct = NULL;
        kiln_status pst = kchat_parse(src, &ct);
        int failed_here = 0; /* the first failing pair of each template is printed */
        cJSON_ArrayForEach(inp, inputs) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(te, inp->string);
            if (!e) continue;
            if (cJSON_GetObjectItemCaseSensitive(e, "not_compared")) { /* a documented difference */
                not_compared++;
                continue;
            }
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(e, "out");
            pairs++;
            char *got = NULL;
            kiln_status st = pst;
            if (!pst) st = render_input(ct, inp, &lim, &got);
            rendered += !st;
            raised += !want;
            if (st && !failed_here++) fprintf(stderr, "  does not render (%s): %s x %s: %.160s\n", want ? "a bug" : "Python raises too",
                                              tn[t], inp->string, kiln_status_msg(st));
            bool ok = want ? !st && !strcmp(got, want->valuestring) : st != NULL;
            match += ok;
            if (!ok && shown++ < 20) {
                show_mismatch(tn[t], inp->string, e, want, st, got);
            }
            if (st != pst) kiln_status_free(st);
            free(got);
        }
        kiln_status_free(pst);
        kchat_free(ct);
        free(src);
        free(tn[t]);
    }
    free(tn);
    fprintf(stderr, "  agent conversations: %d templates, %d (template, conversation) pairs: %d match Python's jinja2 "
                    "(%d rendered, %d raise as in Python); %d not compared (expected.json says why)\n", nt, pairs, match, rendered,
            raised, not_compared);
    cJSON_Delete(inputs);
    cJSON_Delete(exp);
    KT_CHECK_EQ(match, pairs);
}
