/* params_test.c: defaults, validation, CLI flags and JSON request bodies. */
#include <stdlib.h>

#include "gen/params.h"
#include "kt.h"

static kiln_status parse_argv(kgen_params *p, int argc, char **argv, int *n_unused) {
    *n_unused = 0;
    for (int i = 0; i < argc;) {
        bool consumed;
        KILN_TRY(kgen_parse_flag(p, argc, argv, &i, &consumed));
        if (!consumed) {
            (*n_unused)++;
            i++;
        }
    }
    return NULL;
}

/* Parses one flag (and value) on fresh defaults; returns the status. */
static kiln_status one_flag(const char *flag, const char *value) {
    kgen_params p;
    kiln_status st = kgen_params_init(&p);
    if (!st) {
        char *argv[2] = {(char *)flag, (char *)value};
        int unused;
        st = parse_argv(&p, value ? 2 : 1, argv, &unused);
    }
    kgen_params_free(&p);
    return st;
}

KT_TEST(gen_params_defaults) {
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    KT_CHECK(p.temperature == 0.8f && p.top_k == 40 && p.top_p == 0.95f && p.min_p == 0.05f);
    KT_CHECK(p.typical_p == 1.0f && p.top_n_sigma == -1.0f && p.xtc_probability == 0.0f &&
             p.xtc_threshold == 0.1f);
    KT_CHECK(p.repeat_penalty == 1.0f && p.repeat_last_n == 64 && p.presence_penalty == 0.0f &&
             p.frequency_penalty == 0.0f);
    KT_CHECK(p.dry_multiplier == 0.0f && p.dry_base == 1.75f && p.dry_allowed_length == 2 &&
             p.dry_penalty_last_n == -1);
    KT_CHECK_EQ(p.dry_breakers.n, 4);
    KT_CHECK_STR(p.dry_breakers.v[0], "\n");
    KT_CHECK_STR(p.dry_breakers.v[1], ":");
    KT_CHECK_STR(p.dry_breakers.v[2], "\"");
    KT_CHECK_STR(p.dry_breakers.v[3], "*");
    KT_CHECK(p.seed == KGEN_SEED_RANDOM && p.n_predict == -1 && !p.ignore_eos && p.min_tokens == 0);
    static const char *const order[] = {"penalties", "dry", "top_n_sigma", "top_k", "typ_p",
                                        "top_p", "min_p", "xtc", "temperature"};
    KT_CHECK_EQ(p.n_samplers, 9);
    for (int i = 0; i < 9; i++) KT_CHECK_STR(kgen_sampler_name(p.samplers[i]), order[i]);
    KT_CHECK_OK(kgen_params_validate(&p));
    kgen_params q;
    KT_CHECK_OK(kgen_params_copy(&q, &p));
    kgen_params_free(&p); /* the copy owns its own lists */
    KT_CHECK_STR(q.dry_breakers.v[3], "*");
    kgen_params_free(&q);
}

KT_TEST(gen_params_cli_flags) {
    char *argv[] = {
        "--temp", "0.5", "--top-k", "20", "--top-p", "0.9", "--min-p", "0.1", "--typical", "0.7",
        "--top-n-sigma", "1.5", "--xtc-probability", "0.3", "--xtc-threshold", "0.2",
        "--repeat-penalty", "1.1", "--repeat-last-n", "-1", "--presence-penalty", "0.5",
        "--frequency-penalty", "0.25", "--dry-multiplier", "0.8", "--dry-base", "2.0",
        "--dry-allowed-length", "3", "--dry-penalty-last-n", "128", "--dry-sequence-breaker", "\\n\\n",
        "--dry-sequence-breaker", "###", "-s", "42", "--samplers", "top_k;temp;typical;penalties",
        "-l", "15043+1", "--logit-bias", "2-inf", "--ignore-eos", "-n", "128", "--min-tokens", "4",
        "--stop", "User:", "--stop", "a\\tb", "--n-probs", "5", "--model", "x", "--min-keep", "2",
    };
    int argc = (int)(sizeof argv / sizeof argv[0]), unused;
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    KT_CHECK_OK(parse_argv(&p, argc, argv, &unused));
    KT_CHECK_EQ(unused, 2); /* --model x is the caller's */
    KT_CHECK(p.temperature == 0.5f && p.top_k == 20 && p.top_p == 0.9f && p.min_p == 0.1f);
    KT_CHECK(p.typical_p == 0.7f && p.top_n_sigma == 1.5f && p.xtc_probability == 0.3f &&
             p.xtc_threshold == 0.2f);
    KT_CHECK(p.repeat_penalty == 1.1f && p.repeat_last_n == -1 && p.presence_penalty == 0.5f &&
             p.frequency_penalty == 0.25f);
    KT_CHECK(p.dry_multiplier == 0.8f && p.dry_base == 2.0f && p.dry_allowed_length == 3 &&
             p.dry_penalty_last_n == 128);
    KT_CHECK_EQ(p.dry_breakers.n, 2); /* the defaults were cleared by the first one */
    KT_CHECK_STR(p.dry_breakers.v[0], "\n\n");
    KT_CHECK_STR(p.dry_breakers.v[1], "###");
    KT_CHECK(p.seed == 42);
    KT_CHECK_EQ(p.n_samplers, 4);
    KT_CHECK(p.samplers[0] == KGEN_SAMPLER_TOP_K && p.samplers[1] == KGEN_SAMPLER_TEMPERATURE &&
             p.samplers[2] == KGEN_SAMPLER_TYPICAL_P && p.samplers[3] == KGEN_SAMPLER_PENALTIES);
    KT_CHECK_EQ(p.n_logit_bias, 2);
    KT_CHECK(p.logit_bias[0].token == 15043 && p.logit_bias[0].bias == 1.0f);
    KT_CHECK(p.logit_bias[1].token == 2 && p.logit_bias[1].bias == -INFINITY);
    KT_CHECK(p.ignore_eos && p.n_predict == 128 && p.min_tokens == 4 && p.min_keep == 2);
    KT_CHECK_EQ(p.stop.n, 2);
    KT_CHECK_STR(p.stop.v[0], "User:");
    KT_CHECK_STR(p.stop.v[1], "a\tb");
    KT_CHECK(p.logprobs && p.n_probs == 5);

    /* llama.cpp quirks: negative temperature is 0, a base below 1 is ignored,
     * "none" clears the breakers, --seed -1 is random */
    char *quirks[] = {"--temp", "-3", "--dry-base", "0.5", "--dry-sequence-breaker", "none",
                      "--seed", "-1", "--sampler-seq", "kypmt"};
    KT_CHECK_OK(parse_argv(&p, 10, quirks, &unused));
    KT_CHECK(p.temperature == 0.0f && p.dry_base == 2.0f && p.dry_breakers.n == 0 &&
             p.seed == KGEN_SEED_RANDOM);
    KT_CHECK(p.n_samplers == 5 && p.samplers[1] == KGEN_SAMPLER_TYPICAL_P &&
             p.samplers[4] == KGEN_SAMPLER_TEMPERATURE);
    kgen_params_free(&p);

    /* escapes, as llama.cpp's string_process_escapes */
    char esc[] = "a\\nb\\x41\\q\\\\\\";
    kgen_unescape(esc);
    KT_CHECK_STR(esc, "a\nbA\\q\\\\");
    char help[8192] = "";
    FILE *f = fmemopen(help, sizeof help - 1, "w");
    KT_CHECK(f != NULL);
    kgen_print_flags(f);
    fclose(f);
    KT_CHECK(strstr(help, "--dry-sequence-breaker") != NULL && strstr(help, "-n, --predict, --n-predict") != NULL);
}

KT_TEST(gen_params_cli_errors) {
    KT_CHECK_ERR(one_flag("--temp", NULL), "--temp: missing value");
    KT_CHECK_ERR(one_flag("--temp", "hot"), "--temp: \"hot\" is not a number");
    KT_CHECK_ERR(one_flag("--top-k", "4.5"), "--top-k: \"4.5\" is not an integer");
    KT_CHECK_ERR(one_flag("--top-k", "-5"), "top_k = -5");
    KT_CHECK_OK(one_flag("--top-k", "-1")); /* disabled, like 0 */
    KT_CHECK_OK(one_flag("--top-k", "0"));
    KT_CHECK_ERR(one_flag("--top-p", "1.5"), "top_p = 1.5: must be in [0, 1]");
    KT_CHECK_ERR(one_flag("--top-p", "-0.1"), "top_p");
    KT_CHECK_ERR(one_flag("--min-p", "2"), "min_p");
    KT_CHECK_ERR(one_flag("--xtc-probability", "1.2"), "xtc_probability");
    KT_CHECK_ERR(one_flag("--repeat-last-n", "-2"), "repeat_last_n = -2: must be >= -1");
    KT_CHECK_ERR(one_flag("--dry-penalty-last-n", "-3"), "dry_penalty_last_n");
    KT_CHECK_ERR(one_flag("--repeat-penalty", "0"), "repeat_penalty");
    KT_CHECK_ERR(one_flag("--dry-multiplier", "-1"), "dry_multiplier");
    KT_CHECK_ERR(one_flag("--samplers", "top_k;bogus"), "unknown sampler \"bogus\"");
    KT_CHECK_ERR(one_flag("--sampler-seq", "kq"), "unknown sampler letter 'q'");
    KT_CHECK_ERR(one_flag("--logit-bias", "15043"), "expected TOKEN_ID(+/-)BIAS");
    KT_CHECK_ERR(one_flag("--logit-bias", "abc+1"), "expected TOKEN_ID(+/-)BIAS");
    KT_CHECK_ERR(one_flag("-l", "5*1"), "expected TOKEN_ID(+/-)BIAS");
    KT_CHECK_ERR(one_flag("-l", "5+x"), "expected TOKEN_ID(+/-)BIAS");
    KT_CHECK_ERR(one_flag("-l", "-5+1"), "expected TOKEN_ID(+/-)BIAS");
    KT_CHECK_ERR(one_flag("--seed", "abc"), "is not a seed");
    KT_CHECK_ERR(one_flag("--seed", "4294967296"), "is not a seed");
    KT_CHECK_ERR(one_flag("-n", "-3"), "n_predict");
    KT_CHECK_ERR(one_flag("--n-probs", "-1"), "n_probs");
    KT_CHECK_ERR(one_flag("--min-tokens", "-1"), "min_tokens");
    /* not ours: left alone */
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    char *argv[] = {"--prompt", "hi"};
    int i = 0;
    bool consumed = true;
    KT_CHECK_OK(kgen_parse_flag(&p, 2, argv, &i, &consumed));
    KT_CHECK(!consumed && i == 0);
    kgen_params_free(&p);
}

KT_TEST(gen_params_validate_names_field) {
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    p.temperature = NAN;
    KT_CHECK_ERR(kgen_params_validate(&p), "temperature");
    p.temperature = 1;
    p.typical_p = 1.5f;
    KT_CHECK_ERR(kgen_params_validate(&p), "typical_p");
    p.typical_p = 1;
    p.dry_base = 0.5f;
    KT_CHECK_ERR(kgen_params_validate(&p), "dry_base");
    p.dry_base = 1.75f;
    p.samplers[0] = (kgen_sampler_type)99;
    KT_CHECK_ERR(kgen_params_validate(&p), "samplers[0]");
    p.samplers[0] = KGEN_SAMPLER_TOP_K;
    kgen_logit_bias lb = {-4, 1.0f};
    p.logit_bias = &lb;
    p.n_logit_bias = 1;
    KT_CHECK_ERR(kgen_params_validate(&p), "logit_bias[0]: token id -4");
    lb = (kgen_logit_bias){4, NAN};
    KT_CHECK_ERR(kgen_params_validate(&p), "NaN");
    p.logit_bias = NULL;
    p.n_logit_bias = 0;
    kgen_params_free(&p);
}

static int fake_tokenize(void *ud, const char *text, size_t len, int32_t *out, int cap) {
    (void)ud;
    /* one token per byte: id = byte value */
    for (size_t i = 0; i < len && (int)i < cap; i++) out[i] = (unsigned char)text[i];
    return (int)len;
}

static kiln_status from_json(kgen_params *p, const char *text, const kgen_vocab *v) {
    cJSON *j = cJSON_Parse(text);
    if (!j) return kiln_error(KILN_EINVAL, "test: bad JSON");
    kiln_status st = kgen_params_from_json(p, j, v);
    cJSON_Delete(j);
    return st;
}

KT_TEST(gen_params_json) {
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    KT_CHECK_OK(from_json(&p,
        "{\"temperature\": 0.3, \"top_k\": 5, \"top_p\": 0.5, \"min_p\": 0.2, \"typical_p\": 0.9,"
        " \"top_n_sigma\": 2, \"min_keep\": 1, \"xtc_probability\": 0.5, \"xtc_threshold\": 0.3,"
        " \"repeat_penalty\": 1.2, \"repeat_last_n\": 32, \"presence_penalty\": 0.1,"
        " \"frequency_penalty\": 0.2, \"dry_multiplier\": 0.8, \"dry_base\": 1.5,"
        " \"dry_allowed_length\": 3, \"dry_penalty_last_n\": 100, \"dry_sequence_breakers\": [\"\\n\", \"User\"],"
        " \"seed\": 1234, \"samplers\": [\"top_k\", \"min_p\", \"temperature\"],"
        " \"logit_bias\": {\"15\": 2.5, \"7\": false}, \"stop\": \"###\", \"max_tokens\": 50,"
        " \"min_tokens\": 3, \"ignore_eos\": true, \"logprobs\": true, \"top_logprobs\": 4,"
        " \"messages\": [], \"model\": \"x\"}", NULL));
    KT_CHECK(p.temperature == 0.3f && p.top_k == 5 && p.top_p == 0.5f && p.min_p == 0.2f &&
             p.typical_p == 0.9f && p.top_n_sigma == 2.0f && p.min_keep == 1);
    KT_CHECK(p.xtc_probability == 0.5f && p.xtc_threshold == 0.3f && p.repeat_penalty == 1.2f &&
             p.repeat_last_n == 32 && p.presence_penalty == 0.1f && p.frequency_penalty == 0.2f);
    KT_CHECK(p.dry_multiplier == 0.8f && p.dry_base == 1.5f && p.dry_allowed_length == 3 &&
             p.dry_penalty_last_n == 100 && p.dry_breakers.n == 2);
    KT_CHECK_STR(p.dry_breakers.v[1], "User");
    KT_CHECK(p.seed == 1234 && p.n_samplers == 3 && p.samplers[1] == KGEN_SAMPLER_MIN_P);
    KT_CHECK(p.n_logit_bias == 2 && p.logit_bias[0].token == 15 && p.logit_bias[0].bias == 2.5f &&
             p.logit_bias[1].token == 7 && p.logit_bias[1].bias == -INFINITY);
    KT_CHECK(p.stop.n == 1 && p.n_predict == 50 && p.min_tokens == 3 && p.ignore_eos);
    KT_CHECK_STR(p.stop.v[0], "###");
    KT_CHECK(p.logprobs && p.n_probs == 4);

    /* the array form of logit_bias; the list form of stop; token precedence;
     * letters for samplers; dry_base below 1 resets to the default */
    KT_CHECK_OK(from_json(&p, "{\"logit_bias\": [[3, -1], [9, false]], \"stop\": [\"a\", \"\", \"b\"],"
                              " \"max_tokens\": 5, \"max_completion_tokens\": 6, \"n_predict\": 7,"
                              " \"samplers\": \"kt\", \"dry_base\": 0.5, \"seed\": -1}", NULL));
    KT_CHECK(p.n_logit_bias == 2 && p.logit_bias[0].token == 3 && p.logit_bias[0].bias == -1.0f &&
             p.logit_bias[1].bias == -INFINITY);
    KT_CHECK(p.stop.n == 2 && p.n_predict == 7 && p.n_samplers == 2 && p.dry_base == 1.75f &&
             p.seed == KGEN_SEED_RANDOM);
    KT_CHECK_OK(from_json(&p, "{\"max_tokens\": 5, \"max_completion_tokens\": 6}", NULL));
    KT_CHECK_EQ(p.n_predict, 6);
    KT_CHECK_OK(from_json(&p, "{\"stop\": []}", NULL)); /* empty: the previous stops stay */
    KT_CHECK_EQ(p.stop.n, 2);

    /* logprobs: /v1/completions int form; chat bool without top_logprobs;
     * llama-server n_probs wins */
    KT_CHECK_OK(from_json(&p, "{\"logprobs\": 3}", NULL));
    KT_CHECK(p.logprobs && p.n_probs == 3);
    KT_CHECK_OK(from_json(&p, "{\"logprobs\": true}", NULL));
    KT_CHECK(p.logprobs && p.n_probs == 0);
    KT_CHECK_OK(from_json(&p, "{\"logprobs\": false}", NULL));
    KT_CHECK(!p.logprobs);
    KT_CHECK_OK(from_json(&p, "{\"n_probs\": 2, \"logprobs\": 9, \"post_sampling_probs\": true}", NULL));
    KT_CHECK(p.logprobs && p.n_probs == 2 && p.post_sampling_probs);

    /* text keys need a tokenizer; ids are range-checked against the vocabulary */
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": {\"hi\": 1}}", NULL), "needs a tokenizer");
    kgen_vocab v = {256, NULL, fake_tokenize, NULL, NULL};
    KT_CHECK_OK(from_json(&p, "{\"logit_bias\": {\"hi\": 1}}", &v));
    KT_CHECK(p.n_logit_bias == 2 && p.logit_bias[0].token == 'h' && p.logit_bias[1].token == 'i');
    KT_CHECK_OK(from_json(&p, "{\"logit_bias\": [[\"a\", 2]]}", &v));
    KT_CHECK(p.n_logit_bias == 1 && p.logit_bias[0].token == 'a');
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": {\"300\": 1}}", &v), "out of range [0, 256)");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": [[300, 1]]}", &v), "out of range");
    KT_CHECK_EQ(p.n_logit_bias, 1); /* unchanged by the failed requests */
    kgen_params_free(&p);
}

KT_TEST(gen_params_json_errors) {
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    KT_CHECK_ERR(from_json(&p, "{\"temperature\": \"hot\"}", NULL), "\"temperature\": expected a number");
    KT_CHECK_ERR(from_json(&p, "{\"top_k\": 2.5}", NULL), "\"top_k\": expected an integer");
    KT_CHECK_ERR(from_json(&p, "{\"top_k\": -7}", NULL), "top_k = -7");
    KT_CHECK_ERR(from_json(&p, "{\"top_p\": 1.01}", NULL), "top_p = 1.01");
    KT_CHECK_ERR(from_json(&p, "{\"samplers\": [\"top_k\", \"nope\"]}", NULL), "\"samplers\"[1]: unknown sampler \"nope\"");
    KT_CHECK_ERR(from_json(&p, "{\"samplers\": 3}", NULL), "\"samplers\"");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": 5}", NULL), "\"logit_bias\": expected an object");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": [[1]]}", NULL), "logit_bias[0]: expected a pair");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": [[1, \"x\"]]}", NULL), "the bias must be a number or false");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": [[1.5, 1]]}", NULL), "expected an integer token id");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": {\"-3\": 1}}", NULL), "out of range");
    KT_CHECK_ERR(from_json(&p, "{\"logit_bias\": {\"3\": true}}", NULL), "number or false");
    KT_CHECK_ERR(from_json(&p, "{\"stop\": [\"a\", 3]}", NULL), "\"stop\"[1]: expected a string");
    KT_CHECK_ERR(from_json(&p, "{\"stop\": 3}", NULL), "\"stop\": expected a string or a list");
    KT_CHECK_ERR(from_json(&p, "{\"dry_sequence_breakers\": []}", NULL), "non-empty");
    KT_CHECK_ERR(from_json(&p, "{\"dry_sequence_breakers\": \"x\"}", NULL), "non-empty list");
    KT_CHECK_ERR(from_json(&p, "{\"top_logprobs\": 3}", NULL), "requires \"logprobs\": true");
    KT_CHECK_ERR(from_json(&p, "{\"logprobs\": false, \"top_logprobs\": 3}", NULL), "requires");
    KT_CHECK_ERR(from_json(&p, "{\"logprobs\": -1}", NULL), "\"logprobs\"");
    KT_CHECK_ERR(from_json(&p, "{\"seed\": 5000000000}", NULL), "\"seed\"");
    KT_CHECK_ERR(from_json(&p, "{\"repeat_last_n\": -5}", NULL), "repeat_last_n = -5");
    KT_CHECK_ERR(from_json(&p, "{\"max_tokens\": 1e12}", NULL), "out of range");
    KT_CHECK_ERR(from_json(&p, "{\"ignore_eos\": 1}", NULL), "\"ignore_eos\": expected true or false");
    KT_CHECK_ERR(from_json(&p, "[1]", NULL), "expected a JSON object");
    /* p is untouched by all of the above */
    KT_CHECK(p.top_k == 40 && p.top_p == 0.95f && p.n_logit_bias == 0 && p.stop.n == 0);
    kgen_params_free(&p);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Untrusted bodies: every known key with values of every type. Never a
 * crash; what is accepted validates. */
KT_TEST(gen_params_json_random_bodies) {
    static const char *const keys[] = {
        "temperature", "top_k", "top_p", "min_p", "typical_p", "top_n_sigma", "min_keep",
        "xtc_probability", "xtc_threshold", "repeat_penalty", "repeat_last_n", "presence_penalty",
        "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
        "dry_sequence_breakers", "seed", "samplers", "logit_bias", "stop", "max_tokens",
        "max_completion_tokens", "n_predict", "min_tokens", "ignore_eos", "logprobs", "top_logprobs",
        "n_probs", "post_sampling_probs",
    };
    static const char *const values[] = {
        "0", "1", "-1", "0.5", "-7.25", "1e9", "1e300", "40", "true", "false", "null", "\"\"",
        "\"top_k;min_p\"", "\"kpt\"", "\"x\"", "[]", "[1]", "[\"a\", \"b\"]", "[[1, 2]]",
        "[[\"a\", false]]", "[[1]]", "{}", "{\"5\": 1}", "{\"x\": false}", "{\"1\": \"y\"}",
        "[\"top_k\", \"temperature\"]", "[null]", "{\"a\": {}}",
    };
    uint64_t s = 77;
    kgen_vocab v = {256, NULL, fake_tokenize, NULL, NULL};
    int accepted = 0;
    for (int it = 0; it < 3000; it++) {
        char body[2048];
        size_t o = 0;
        o += (size_t)snprintf(body + o, sizeof body - o, "{");
        int n = 1 + (int)(lcg(&s) % 4);
        for (int k = 0; k < n; k++)
            o += (size_t)snprintf(body + o, sizeof body - o, "%s\"%s\": %s", k ? ", " : "",
                                  keys[lcg(&s) % (sizeof keys / sizeof keys[0])],
                                  values[lcg(&s) % (sizeof values / sizeof values[0])]);
        snprintf(body + o, sizeof body - o, "}");
        kgen_params p;
        KT_CHECK_OK(kgen_params_init(&p));
        kiln_status st = from_json(&p, body, it % 2 ? &v : NULL);
        if (!st) {
            accepted++;
            KT_CHECKF(!kgen_params_validate(&p), "accepted but invalid: %s", body);
        } else {
            KT_CHECK(strlen(kiln_status_msg(st)) > 0);
            kiln_status_free(st);
        }
        kgen_params_free(&p);
    }
    KT_CHECK(accepted > 100);
}
