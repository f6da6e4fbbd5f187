/* grammar_test.c: the tool-call grammars (ktc_grammar): calls as the
 * formats write them match, wrong arguments do not; and generation under the
 * lazy grammar (kgen_session with a trigger) turns a model's invalid
 * arguments into valid ones. */
#include <stdlib.h>
#include <string.h>

#include "engine/textio.h"
#include "gen/session.h"
#include "grammar/gr_int.h"
#include "grammar/grammar.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"
#include "tools/toolcall.h"

static const char *k_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"strict\": true, \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}}, \"required\": "
    "[\"city\"], \"additionalProperties\": false}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_time\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"string\"}}}}}]";

/* 256 byte tokens and an EOS (256) */
enum { EOS = 256, NV = 257 };
static char k_bytes[256];

static kgr_vocab *byte_vocab(void) {
    const char *t[NV];
    int32_t l[NV];
    for (int i = 0; i < 256; i++) k_bytes[i] = (char)i, t[i] = &k_bytes[i], l[i] = 1;
    t[EOS] = "", l[EOS] = 0;
    kgr_vocab *v = NULL;
    kiln_status st = kgr_vocab_from_strings(t, l, NV, EOS, &v);
    kiln_status_free(st);
    return v;
}

/* 1: g takes s whole; 0: it refuses it (or s is incomplete) */
static int takes(const char *gbnf, const kgr_vocab *v, const char *s) {
    kgr_grammar *g;
    kiln_status st = kgr_from_gbnf(gbnf, strlen(gbnf), &g);
    if (st) {
        kiln_status_free(st);
        return -1;
    }
    kgr_matcher *m;
    st = kgr_matcher_create_owned(g, v, &m);
    if (st) {
        kiln_status_free(st);
        return -1;
    }
    int r = kgr_matcher_accept_bytes(m, s, strlen(s)) && kgr_matcher_done(m);
    kgr_matcher_free(m);
    return r;
}

KT_TEST(tools_grammar_formats) {
    cJSON *tools = cJSON_Parse(k_tools);
    kgr_vocab *v = byte_vocab();
    KT_CHECK(tools && v);
    static const struct {
        ktc_format f;
        const char *good, *bad; /* the text after the trigger */
    } k[] = {
        {KTC_HERMES, "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}",
         "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}"},
        {KTC_LLAMA3, ": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}",
         ": \"get_time\", \"parameters\": {\"zone\": \"CET\", \"other\": [1]}}"}, /* no keys beyond the schema's */
        {KTC_MISTRAL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}, \"id\": \"abcDEF123\"}, "
                      "{\"name\": \"get_time\", \"arguments\": {}}]",
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"x\": 1}}]"},
        {KTC_GRANITE, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
         "[{\"name\": \"get_wether\", \"arguments\": {}}]"},
        {KTC_COMMAND_R, "[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n]",
         "[{\"tool_call_id\": \"0\", \"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\", \"days\": 1.5}}]"},
        {KTC_PHI4, "[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]", "[{\"name\": \"get_time\", \"parameters\": {}}]"},
        {KTC_FIREFUNCTION, "[{\"name\": \"get_time\", \"arguments\": {}}]", "{\"name\": \"get_time\", \"arguments\": {}}"},
        {KTC_COMMAND_R_PLUS, "\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        \"parameters\": {\n            \"city\": \"Oslo\"\n        }\n    }\n]",
         "\n```json\n[{\"tool_name\": \"get_weather\", \"parameters\": {}}]"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char *g = NULL;
        KT_CHECK_OK(ktc_grammar(k[i].f, tools, NULL, true, NULL, &g));
        KT_CHECKF(takes(g, v, k[i].good) == 1, "%s: refuses %s\n%s", ktc_format_name(k[i].f), k[i].good, g);
        KT_CHECKF(takes(g, v, k[i].bad) == 0, "%s: takes %s", ktc_format_name(k[i].f), k[i].bad);
        free(g);
    }
    /* a named function only; one call when not parallel */
    char *g = NULL;
    KT_CHECK_OK(ktc_grammar(KTC_GRANITE, tools, "get_time", false, NULL, &g));
    KT_CHECK(takes(g, v, "[{\"name\": \"get_time\", \"arguments\": {}}]") == 1);
    KT_CHECK(takes(g, v, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]") == 0);
    KT_CHECK(takes(g, v, "[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]") == 0);
    free(g);
    /* a strict tool whose schema the engine cannot honour: an error naming it; formats without a grammar */
    cJSON *bad = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": "
                             "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", \"uniqueItems\": true}}}}}]");
    kiln_status st = ktc_grammar(KTC_HERMES, bad, NULL, true, NULL, &g);
    KT_CHECKF(st && strstr(kiln_status_msg(st), "\"tools\"[0].function.parameters") && strstr(kiln_status_msg(st), "uniqueItems"),
              "%s", kiln_status_msg(st));
    kiln_status_free(st);
    cJSON *lax = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(bad, 0), "function");
    cJSON_ReplaceItemInObjectCaseSensitive(lax, "strict", cJSON_CreateFalse());
    KT_CHECK_OK(ktc_grammar(KTC_HERMES, bad, NULL, true, NULL, &g)); /* not strict: any object */
    KT_CHECK(takes(g, v, "{\"name\": \"f\", \"arguments\": {\"a\": [1, 1]}}") == 1);
    free(g);
    st = ktc_grammar(KTC_NONE, tools, NULL, true, NULL, &g);
    KT_CHECK(st && kiln_status_code(st) == KILN_EUNSUPPORTED && !ktc_grammar_supported(KTC_NONE));
    kiln_status_free(st);
    cJSON_Delete(bad);
    cJSON_Delete(tools);
    kgr_vocab_free(v);
}

/* The pythonic formats (LFM2, Gemma 4) honour a string parameter's
 * minLength/maxLength in their own quotes (an LFM2 escape is one
 * character); another string keyword of a strict tool is refused, and
 * not checked in a tool that is not strict. */
KT_TEST(tools_grammar_pythonic_string_lengths) {
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": true, \"parameters\": "
                               "{\"type\": \"object\", \"properties\": {\"c\": {\"type\": \"string\", \"minLength\": 2, "
                               "\"maxLength\": 4, \"description\": \"d\"}}, \"required\": [\"c\"]}}}]");
    kgr_vocab *v = byte_vocab();
    KT_CHECK(tools && v);
    static const struct {
        ktc_format f;
        const char *good[2], *bad[3];
    } k[] = {
        {KTC_LFM2, {"[f(c='ab')]<|tool_call_end|>", "[f(c='a\\'cd')]<|tool_call_end|>"},
         {"[f(c='a')]<|tool_call_end|>", "[f(c='abcde')]<|tool_call_end|>", "[f(c='a\\'cde')]<|tool_call_end|>"}},
        {KTC_PYTHONIC, {"f(c=\"ab\")]", "f(c=\"a\\\"cd\")]"}, {"f(c=\"a\")]", "f(c=\"abcde\")]", "f(c='ab')]"}},
        {KTC_GEMMA4, {"call:f{c:<|\"|>ab<|\"|>}<tool_call|>", "call:f{c:<|\"|>abcd<|\"|>}<tool_call|>"},
         {"call:f{c:<|\"|>a<|\"|>}<tool_call|>", "call:f{c:<|\"|>abcde<|\"|>}<tool_call|>", "call:f{c:<|\"|>a<b<|\"|>}<tool_call|>"}},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char *g = NULL;
        KT_CHECK_OK(ktc_grammar(k[i].f, tools, NULL, false, NULL, &g));
        for (int j = 0; j < 2; j++) KT_CHECKF(takes(g, v, k[i].good[j]) == 1, "%s: refuses %s\n%s", ktc_format_name(k[i].f), k[i].good[j], g);
        for (int j = 0; j < 3; j++) KT_CHECKF(takes(g, v, k[i].bad[j]) == 0, "%s: takes %s\n%s", ktc_format_name(k[i].f), k[i].bad[j], g);
        free(g);
    }
    /* "format" (or "pattern"): refused when strict, not checked when not */
    cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tools, 0), "function");
    cJSON *c = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"), "properties"), "c");
    cJSON_AddStringToObject(c, "format", "date");
    char *g = NULL;
    kiln_status st = ktc_grammar(KTC_GEMMA4, tools, NULL, false, NULL, &g);
    KT_CHECKF(st && strstr(kiln_status_msg(st), "properties.c") && strstr(kiln_status_msg(st), "\"format\""), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    cJSON_ReplaceItemInObjectCaseSensitive(fn, "strict", cJSON_CreateFalse());
    KT_CHECK_OK(ktc_grammar(KTC_LFM2, tools, NULL, false, NULL, &g));
    KT_CHECK(takes(g, v, "[f(c='abcd')]<|tool_call_end|>") == 1); /* (its lengths still hold) */
    KT_CHECK(takes(g, v, "[f(c='abcde')]<|tool_call_end|>") == 0);
    free(g);
    cJSON_Delete(tools);
    kgr_vocab_free(v);
}

/* A forced call after a thinking block the prompt opened (MiniMax-M2,
 * Qwen3 thinking): the grammar from the block's close takes a few blanks,
 * the format's trigger and one call, and nothing else first. */
KT_TEST(tools_grammar_after_think) {
    cJSON *tools = cJSON_Parse(k_tools);
    kgr_vocab *v = byte_vocab();
    KT_CHECK(tools && v);
    static const struct {
        ktc_format f;
        const char *call; /* the trigger and a call */
    } k[] = {
        {KTC_MINIMAX_M2, "<minimax:tool_call>\n<invoke name=\"get_time\">\n<parameter name=\"zone\">UTC</parameter>\n</invoke>\n"
                         "</minimax:tool_call>"},
        {KTC_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}"},
        {KTC_QWEN3_CODER, "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"},
        {KTC_DEEPSEEK, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"zone\": \"UTC\"}<｜tool▁call▁end｜>"
                       "<｜tool▁calls▁end｜>"},
        {KTC_HY3, "<tool_calls:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n<arg_key:opensource>zone"
                  "</arg_key:opensource>\n<arg_value:opensource>UTC</arg_value:opensource>\n</tool_call:opensource>\n"
                  "</tool_calls:opensource>"},
    };
    for (size_t i = 0; i < sizeof k / sizeof *k; i++) {
        char *g = NULL, *a = NULL, text[512];
        KT_CHECK_OK(ktc_grammar(k[i].f, tools, NULL, false, NULL, &g));
        KT_CHECK_OK(ktc_grammar_after_think(k[i].f, g, NULL, &a));
        snprintf(text, sizeof text, "\n\n%s", k[i].call);
        KT_CHECKF(takes(a, v, text) == 1, "%s: refuses %s\n%s", ktc_format_name(k[i].f), text, a);
        KT_CHECKF(takes(a, v, k[i].call) == 1, "%s: refuses the call without blanks", ktc_format_name(k[i].f));
        snprintf(text, sizeof text, "\nSure! %s", k[i].call);
        KT_CHECKF(takes(a, v, text) == 0, "%s: takes text before the call", ktc_format_name(k[i].f));
        KT_CHECKF(takes(a, v, "\n\n") == 0, "%s: takes no call", ktc_format_name(k[i].f));
        free(g), free(a);
    }
    for (int f = KTC_NONE + 1; f < KTC_N_FORMATS; f++) { /* every format's grammar has one root to rename */
        if (!ktc_grammar_supported((ktc_format)f)) continue;
        char *g = NULL, *a = NULL;
        KT_CHECK_OK(ktc_grammar((ktc_format)f, tools, NULL, true, NULL, &g));
        kiln_status st = ktc_grammar_after_think((ktc_format)f, g, NULL, &a);
        KT_CHECKF(!st, "%s: %s", ktc_format_name((ktc_format)f), kiln_status_msg(st));
        kgr_grammar *gr = NULL;
        KT_CHECK_OK(kgr_from_gbnf(a, strlen(a), &gr));
        kgr_grammar_free(gr);
        free(g), free(a);
    }
    char *a = NULL;
    kiln_status st = ktc_grammar_after_think(KTC_NONE, "root ::= \"x\"\n", NULL, &a);
    KT_CHECK(st && !a);
    kiln_status_free(st);
    st = ktc_grammar_after_think(KTC_HERMES, "a ::= \"x\"\n", NULL, &a);
    KT_CHECKF(st && strstr(kiln_status_msg(st), "root"), "%s", kiln_status_msg(st));
    kiln_status_free(st);
    cJSON_Delete(tools);
    kgr_vocab_free(v);
}

/* ---- generation: a scripted model under the lazy grammar ---- */

static const char *piece(void *ud, int32_t id, size_t *len) {
    (void)ud;
    *len = id < 256 ? 1 : 0;
    return id < 256 ? &k_bytes[id] : "";
}

/* Greedy over logits that want script[step] (10), then EOS (4) once the
 * script is spent, else '"' (3), '}' (2), whitespace last (-5). */
static kiln_status run(const char *script, bool constrain, char *out, size_t cap) {
    kgen_params p;
    KILN_TRY(kgen_params_init(&p));
    p.temperature = 0.0f;
    p.n_predict = 200;
    kgr_vocab *gv = byte_vocab();
    kiln_status st = NULL;
    if (constrain) {
        cJSON *tools = cJSON_Parse(k_tools);
        st = ktc_grammar(KTC_HERMES, tools, NULL, true, NULL, &p.grammar);
        cJSON_Delete(tools);
        p.grammar_trigger = strdup(ktc_trigger(KTC_HERMES));
        p.grammar_lazy = true;
    }
    kgen_vocab v = {NV, piece, NULL, NULL, gv};
    const int32_t eos[1] = {EOS}, prompt[1] = {'x'};
    kgen_session *g = NULL;
    if (!st) st = kgen_session_create(&p, &v, 4096, eos, 1, prompt, 1, &g);
    float logits[NV];
    size_t n = 0, len = strlen(script);
    for (int step = 0; !st; step++) {
        for (int i = 0; i < NV; i++) logits[i] = 0;
        logits[' '] = logits['\n'] = logits['\t'] = -5;
        logits['"'] = 3, logits['}'] = 2;
        if ((size_t)step < len) logits[(unsigned char)script[step]] = 10;
        else logits[EOS] = 4;
        kgen_step s;
        if ((st = kgen_session_step(g, logits, &s))) break;
        if (n + s.text_len < cap) memcpy(out + n, s.text, s.text_len), n += s.text_len;
        if (s.finish != KGEN_CONTINUE) break;
    }
    out[n] = 0;
    kgen_session_destroy(g);
    kgen_params_free(&p);
    kgr_vocab_free(gv);
    return st;
}

KT_TEST(tools_grammar_lazy_generation) {
    /* the model calls with a number for a string, then chats on */
    const char *script = "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}\n</tool_call>";
    char free_out[512], con[512];
    KT_CHECK_OK(run(script, false, free_out, sizeof free_out));
    KT_CHECKF(!strcmp(free_out, script), "%s", free_out);
    KT_CHECK_OK(run(script, true, con, sizeof con));
    /* the text before the trigger is the model's; the arguments are valid */
    KT_CHECKF(!strncmp(con, "Let me look. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"", 72), "%s", con);
    ktc_syntax syn = {.format = KTC_HERMES};
    ktc_msg m;
    KT_CHECK_OK(ktc_parse(&syn, con, strlen(con), false, &m));
    KT_CHECKF(m.n_calls == 1 && !strcmp(m.calls[0].name, "get_weather"), "%s", con);
    cJSON *a = m.n_calls ? cJSON_Parse(m.calls[0].arguments) : NULL;
    KT_CHECKF(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(a, "city")) && cJSON_GetArraySize(a) == 1, "%s", con);
    cJSON_Delete(a);
    ktc_msg_free(&m);
    /* and the unconstrained call's arguments fail the schema */
    KT_CHECK_OK(ktc_parse(&syn, free_out, strlen(free_out), false, &m));
    a = m.n_calls ? cJSON_Parse(m.calls[0].arguments) : NULL;
    KT_CHECK(m.n_calls == 1 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(a, "city")));
    cJSON_Delete(a);
    ktc_msg_free(&m);
}

/* ---- special-token and XML formats: forced calls sampled at temperature 1 ---- */

/* bounded values, so that a random walk ends */
static const char *k_bounded_tools =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"strict\": true, \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"city\": {\"type\": \"string\", \"maxLength\": 8}, \"days\": {\"type\": \"integer\", "
    "\"minimum\": 1, \"maximum\": 30}, \"unit\": {\"enum\": [\"c\", \"f\"]}, \"kind\": {\"type\": \"string\", \"enum\": "
    "[\"rain\", \"sun\"]}}, \"required\": [\"city\", \"days\"], \"additionalProperties\": false}}}, {\"type\": \"function\", "
    "\"function\": {\"name\": \"get_time\", \"strict\": true, \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"utc\": {\"type\": \"boolean\"}}, \"required\": [\"utc\"], \"additionalProperties\": false}}}]";

static uint64_t k_rng;
static float frand(void) { /* xorshift64*, [-4, 4) */
    k_rng ^= k_rng >> 12, k_rng ^= k_rng << 25, k_rng ^= k_rng >> 27;
    return (float)((k_rng * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 24) * 8.0f - 4.0f;
}

/* One forced call of format f (the prompt ended with the trigger) sampled
 * at temperature 1 from random logits over tok's vocabulary; its text into out. */
static kiln_status sample_call(ktc_format f, const ktok *tok, const kgr_vocab *gv, const cJSON *tools, bool parallel, uint32_t seed,
                               char **out) {
    *out = NULL;
    kgen_params p;
    KILN_TRY(kgen_params_init(&p));
    p.temperature = 1.0f;
    p.seed = seed;
    p.n_predict = 600;
    kiln_status st = ktc_grammar(f, tools, NULL, parallel, tok, &p.grammar);
    if (!st && !(p.grammar_trigger = strdup(ktc_trigger(f)))) st = kiln_error(KILN_ENOMEM, "out of memory");
    p.grammar_lazy = false;
    p.grammar_once = true;
    int32_t n = ktok_vocab_size(tok);
    ke_text_vocab tv;
    ke_text_vocab_init(&tv, tok, n);
    kgen_vocab v = ke_text_vocab_get(&tv);
    v.grammar = gv;
    int32_t eos[2] = {ktok_eos_id(tok), ktok_token_id(tok, "<|call|>")};
    const int32_t prompt[1] = {0};
    kgen_session *g = NULL;
    if (!st) st = kgen_session_create(&p, &v, 4096, eos, eos[1] >= 0 ? 2 : 1, prompt, 1, &g);
    float *logits = malloc(sizeof *logits * (size_t)n);
    size_t len = 0, cap = 4096;
    int32_t *ids = malloc(sizeof *ids * cap);
    char *text = NULL;
    if (!st && (!logits || !ids)) st = kiln_error(KILN_ENOMEM, "out of memory");
    k_rng = 0x9E3779B97F4A7C15ull ^ seed;
    kgen_finish fin = KGEN_CONTINUE;
    while (!st && fin == KGEN_CONTINUE) {
        for (int32_t i = 0; i < n; i++) logits[i] = frand();
        kgen_step s;
        if ((st = kgen_session_step(g, logits, &s))) break;
        if (s.finish != KGEN_FINISH_EOS && len < cap) ids[len++] = s.token;
        fin = s.finish;
    }
    size_t tn = 0; /* the text with special tokens (what the server's parser sees) */
    if (!st) st = ktok_decode(tok, ids, len, false, &text, &tn);
    free(ids);
    if (!st && fin != KGEN_FINISH_GRAMMAR && fin != KGEN_FINISH_EOS)
        st = kiln_error(KILN_EINVAL, "%s: the call did not end (%s)", ktc_format_name(f), kgen_finish_reason(fin));
    kgen_session_destroy(g);
    kgen_params_free(&p);
    ke_text_vocab_free(&tv);
    free(logits);
    if (st) free(text);
    else *out = text;
    return st;
}

/* Every call parses, names a tool and validates against its schema. */
static bool calls_valid(ktc_format f, const cJSON *tools, const char *text, int *n_calls, char *why, size_t cap) {
    ktc_syntax syn = {.format = f, .tools = tools, .prefix = ktc_trigger(f)};
    ktc_msg m;
    kiln_status st = ktc_parse(&syn, text, strlen(text), false, &m);
    if (st) {
        snprintf(why, cap, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return false;
    }
    bool ok = m.n_calls > 0;
    if (!ok) snprintf(why, cap, "no call");
    for (int i = 0; ok && i < m.n_calls; i++) {
        const cJSON *t, *schema = NULL;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, m.calls[i].name))
                schema = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        }
        cJSON *a = cJSON_Parse(m.calls[i].arguments);
        char err[256] = "";
        ok = schema && a && kgr_validate(schema, schema, a, err, sizeof err) == KGR_V_VALID;
        if (!ok) snprintf(why, cap, "call %d %s(%s): %s", i, m.calls[i].name, m.calls[i].arguments, schema ? err : "no such tool");
        cJSON_Delete(a);
    }
    *n_calls = m.n_calls;
    ktc_msg_free(&m);
    return ok;
}

KT_TEST(tools_grammar_sampled_special_formats) {
    static const struct {
        ktc_format f;
        const char *tok; /* tests/data/tokenizer/... */
        const char *marker; /* a special token the format's grammar names (NULL: text markers) */
    } k[] = {
        {KTC_HARMONY, "gptoss", "<|message|>"},
        {KTC_KIMI_K2, "gptoss", NULL}, /* (no Kimi tokenizer here: its markers as text) */
        {KTC_DEEPSEEK, "deepseek3", NULL}, /* its tool markers are added tokens, not special: text */
        {KTC_QWEN3_CODER, "qwen3", NULL},
        {KTC_GLM45, "qwen3", NULL},
        {KTC_SEED_OSS, "qwen3", NULL},
        {KTC_MINIMAX_M2, "qwen3", NULL},
        {KTC_HY3, "qwen3", NULL},
        {KTC_MISTRAL_V11, "mistral", NULL},
    };
    ktok *tok = NULL;
    kgr_vocab *gv = NULL;
    cJSON *tools = cJSON_Parse(k_bounded_tools);
    KT_CHECK(tools != NULL);
    int total = 0;
    for (size_t c = 0; c < sizeof k / sizeof *k; c++) {
        if (!c || strcmp(k[c].tok, k[c - 1].tok)) { /* one vocabulary per tokenizer */
            kgr_vocab_free(gv), ktok_free(tok);
            gv = NULL, tok = NULL;
            char dir[1024];
            snprintf(dir, sizeof dir, "%s/tests/data/tokenizer/%s", kt_root(), k[c].tok);
            KT_CHECK_OK(ktok_load(dir, &tok));
            int32_t eos[2] = {tok ? ktok_eos_id(tok) : -1, tok ? ktok_token_id(tok, "<|call|>") : -1};
            if (tok) KT_CHECK_OK(kgr_vocab_create(tok, ktok_vocab_size(tok), eos, eos[1] >= 0 ? 2 : 1, &gv));
        }
        if (!gv) continue;
        if (k[c].marker) { /* the grammar names the special token, not its text */
            char *g = NULL;
            KT_CHECK_OK(ktc_grammar(k[c].f, tools, NULL, true, tok, &g));
            char ref[32];
            snprintf(ref, sizeof ref, "<[%d]>", ktok_token_id(tok, k[c].marker));
            KT_CHECKF(g && strstr(g, ref) && !strstr(g, k[c].marker), "%s: %s", ktc_format_name(k[c].f), g);
            free(g);
        }
        for (uint32_t seed = 1; seed <= 3; seed++) {
            char *text = NULL;
            kiln_status st = sample_call(k[c].f, tok, gv, tools, seed % 2 == 0, seed, &text);
            KT_CHECKF(!st, "%s seed %u: %s", ktc_format_name(k[c].f), seed, st ? kiln_status_msg(st) : "");
            kiln_status_free(st);
            if (!text) continue;
            char why[512] = "";
            int nc = 0;
            KT_CHECKF(calls_valid(k[c].f, tools, text, &nc, why, sizeof why), "%s seed %u: %s\n%s%s", ktc_format_name(k[c].f), seed,
                      why, ktc_trigger(k[c].f), text);
            total += nc;
            free(text);
        }
    }
    kgr_vocab_free(gv);
    ktok_free(tok);
    KT_CHECK(total >= 24);
    cJSON_Delete(tools);
}
