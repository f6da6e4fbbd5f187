/* params.c: defaults, validation, CLI flags and JSON request bodies. The
 * flag spellings, aliases and value quirks follow llama.cpp common/arg.cpp;
 * the JSON keys follow llama-server (tools/server/server-task.cpp
 * params_from_json_cmpl and server-common.cpp's OpenAI adapters). */
#include "gen/params.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

/* ---------------------------------------------------------------- names */

/* Canonical names and --sampler-seq letters, in enum order. */
static const char *const k_names[KGEN_SAMPLER_COUNT_] = {
    "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
};
static const char k_letters[KGEN_SAMPLER_COUNT_ + 1] = "edskypmxt";

static const struct {
    const char *name;
    kgen_sampler_type t;
} k_aliases[] = {
    {"top-k", KGEN_SAMPLER_TOP_K},         {"top-p", KGEN_SAMPLER_TOP_P},
    {"top-n-sigma", KGEN_SAMPLER_TOP_N_SIGMA}, {"nucleus", KGEN_SAMPLER_TOP_P},
    {"typical-p", KGEN_SAMPLER_TYPICAL_P}, {"typical", KGEN_SAMPLER_TYPICAL_P},
    {"typ-p", KGEN_SAMPLER_TYPICAL_P},     {"typ", KGEN_SAMPLER_TYPICAL_P},
    {"min-p", KGEN_SAMPLER_MIN_P},         {"temp", KGEN_SAMPLER_TEMPERATURE},
};

const char *kgen_sampler_name(kgen_sampler_type t) {
    return (unsigned)t < KGEN_SAMPLER_COUNT_ ? k_names[t] : "?";
}

static const char *k_known = "penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, "
                             "temperature";

static kiln_status sampler_by_name(const char *name, size_t len, kgen_sampler_type *t) {
    for (int i = 0; i < KGEN_SAMPLER_COUNT_; i++)
        if (strlen(k_names[i]) == len && memcmp(k_names[i], name, len) == 0) {
            *t = (kgen_sampler_type)i;
            return NULL;
        }
    for (size_t i = 0; i < sizeof k_aliases / sizeof k_aliases[0]; i++)
        if (strlen(k_aliases[i].name) == len && memcmp(k_aliases[i].name, name, len) == 0) {
            *t = k_aliases[i].t;
            return NULL;
        }
    return kiln_error(KILN_EINVAL, "unknown sampler \"%.*s\" (known: %s)", (int)len, name, k_known);
}

kiln_status kgen_parse_samplers(const char *list, char sep, kgen_sampler_type *out, int32_t *n) {
    int32_t k = 0;
    if (sep == 0) {
        for (const char *c = list; *c; c++) {
            const char *hit = strchr(k_letters, *c);
            if (!hit)
                return kiln_error(KILN_EINVAL, "unknown sampler letter '%c' (known: %s = %s)", *c,
                                  k_letters, k_known);
            if (k >= KGEN_MAX_SAMPLERS)
                return kiln_error(KILN_EINVAL, "more than %d samplers", KGEN_MAX_SAMPLERS);
            out[k++] = (kgen_sampler_type)(hit - k_letters);
        }
    } else {
        const char *s = list;
        for (;;) {
            const char *e = strchr(s, sep);
            size_t len = e ? (size_t)(e - s) : strlen(s);
            if (len > 0) { /* llama.cpp skips empty names too */
                if (k >= KGEN_MAX_SAMPLERS)
                    return kiln_error(KILN_EINVAL, "more than %d samplers", KGEN_MAX_SAMPLERS);
                KILN_TRY(sampler_by_name(s, len, &out[k]));
                k++;
            }
            if (!e) break;
            s = e + 1;
        }
    }
    *n = k;
    return NULL;
}

/* ---------------------------------------------------------- string lists */

static void strs_clear(kgen_strs *l) {
    for (int32_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static kiln_status strs_push(kgen_strs *l, const char *s, size_t len) {
    char **v = realloc(l->v, sizeof *v * (size_t)(l->n + 1));
    if (!v) return kiln_error(KILN_ENOMEM, "out of memory");
    l->v = v;
    char *c = malloc(len + 1);
    if (!c) return kiln_error(KILN_ENOMEM, "out of memory");
    memcpy(c, s, len);
    c[len] = 0;
    l->v[l->n++] = c;
    return NULL;
}

static kiln_status strs_copy(kgen_strs *dst, const kgen_strs *src) {
    dst->v = NULL;
    dst->n = 0;
    for (int32_t i = 0; i < src->n; i++) {
        kiln_status st = strs_push(dst, src->v[i], strlen(src->v[i]));
        if (st) {
            strs_clear(dst);
            return st;
        }
    }
    return NULL;
}

static kiln_status bias_push(kgen_params *p, int32_t token, float bias) {
    if (p->n_logit_bias >= KGEN_MAX_LOGIT_BIAS)
        return kiln_error(KILN_EINVAL, "more than %d logit-bias entries", KGEN_MAX_LOGIT_BIAS);
    kgen_logit_bias *b = realloc(p->logit_bias, sizeof *b * (size_t)(p->n_logit_bias + 1));
    if (!b) return kiln_error(KILN_ENOMEM, "out of memory");
    p->logit_bias = b;
    b[p->n_logit_bias++] = (kgen_logit_bias){token, bias};
    return NULL;
}

/* ---------------------------------------------------------- lifecycle */

kiln_status kgen_params_init(kgen_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->typical_p = 1.0f;
    p->top_n_sigma = -1.0f;
    p->xtc_probability = 0.0f;
    p->xtc_threshold = 0.1f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->dry_base = 1.75f;
    p->dry_allowed_length = 2;
    p->dry_penalty_last_n = -1;
    p->seed = KGEN_SEED_RANDOM;
    p->n_predict = -1;
    for (int i = 0; i < KGEN_SAMPLER_COUNT_; i++) p->samplers[i] = (kgen_sampler_type)i;
    p->n_samplers = KGEN_SAMPLER_COUNT_;
    static const char *const breakers[] = {"\n", ":", "\"", "*"};
    for (int i = 0; i < 4; i++) KILN_TRY(strs_push(&p->dry_breakers, breakers[i], strlen(breakers[i])));
    return NULL;
}

void kgen_params_free(kgen_params *p) {
    strs_clear(&p->dry_breakers);
    strs_clear(&p->stop);
    free(p->logit_bias);
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
    free(p->grammar);
    p->grammar = NULL;
    free(p->grammar_trigger);
    p->grammar_trigger = NULL;
    free(p->think_open);
    free(p->think_close);
    p->think_open = p->think_close = NULL;
}

kiln_status kgen_params_copy(kgen_params *dst, const kgen_params *src) {
    *dst = *src;
    dst->dry_breakers = (kgen_strs){0};
    dst->stop = (kgen_strs){0};
    dst->logit_bias = NULL;
    dst->n_logit_bias = 0;
    dst->grammar = NULL;
    dst->grammar_trigger = dst->think_open = dst->think_close = NULL;
    kiln_status st = strs_copy(&dst->dry_breakers, &src->dry_breakers);
    if (!st && src->grammar && !(dst->grammar = strdup(src->grammar))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && src->grammar_trigger && !(dst->grammar_trigger = strdup(src->grammar_trigger)))
        st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && src->think_open && !(dst->think_open = strdup(src->think_open))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && src->think_close && !(dst->think_close = strdup(src->think_close))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) st = strs_copy(&dst->stop, &src->stop);
    if (!st && src->n_logit_bias > 0) {
        dst->logit_bias = malloc(sizeof *dst->logit_bias * (size_t)src->n_logit_bias);
        if (!dst->logit_bias) st = kiln_error(KILN_ENOMEM, "out of memory");
        else {
            memcpy(dst->logit_bias, src->logit_bias, sizeof *dst->logit_bias * (size_t)src->n_logit_bias);
            dst->n_logit_bias = src->n_logit_bias;
        }
    }
    if (st) kgen_params_free(dst);
    return st;
}

/* ---------------------------------------------------------- validation */

static kiln_status check_range(const char *name, double v, double lo, double hi) {
    if (!(v >= lo && v <= hi)) /* also rejects NaN */
        return kiln_error(KILN_EINVAL, "%s = %g: must be in [%g, %g]", name, v, lo, hi);
    return NULL;
}

static kiln_status check_finite(const char *name, double v) {
    if (!isfinite(v)) return kiln_error(KILN_EINVAL, "%s = %g: must be a finite number", name, v);
    return NULL;
}

static kiln_status check_min(const char *name, long long v, long long lo, const char *meaning) {
    if (v < lo)
        return kiln_error(KILN_EINVAL, "%s = %lld: must be >= %lld%s", name, v, lo, meaning);
    return NULL;
}

kiln_status kgen_params_validate(const kgen_params *p) {
    KILN_TRY(check_finite("temperature", p->temperature));
    if (p->top_k < -1)
        return kiln_error(KILN_EINVAL,
                          "top_k = %d: must be >= 0 (0 or -1 disable top-k)", (int)p->top_k);
    KILN_TRY(check_range("top_p", p->top_p, 0, 1));
    KILN_TRY(check_range("min_p", p->min_p, 0, 1));
    KILN_TRY(check_range("typical_p", p->typical_p, 0, 1));
    KILN_TRY(check_finite("top_n_sigma", p->top_n_sigma));
    KILN_TRY(check_range("xtc_probability", p->xtc_probability, 0, 1));
    KILN_TRY(check_range("xtc_threshold", p->xtc_threshold, 0, 1));
    KILN_TRY(check_min("min_keep", p->min_keep, 0, ""));
    KILN_TRY(check_finite("repeat_penalty", p->repeat_penalty));
    if (!(p->repeat_penalty > 0))
        return kiln_error(KILN_EINVAL, "repeat_penalty = %g: must be > 0 (1 disables it)",
                          (double)p->repeat_penalty);
    KILN_TRY(check_min("repeat_last_n", p->repeat_last_n, -1, " (-1: whole context, 0: off)"));
    KILN_TRY(check_finite("presence_penalty", p->presence_penalty));
    KILN_TRY(check_finite("frequency_penalty", p->frequency_penalty));
    KILN_TRY(check_finite("dry_multiplier", p->dry_multiplier));
    if (p->dry_multiplier < 0)
        return kiln_error(KILN_EINVAL, "dry_multiplier = %g: must be >= 0 (0 disables DRY)",
                          (double)p->dry_multiplier);
    KILN_TRY(check_finite("dry_base", p->dry_base));
    if (p->dry_base < 1)
        return kiln_error(KILN_EINVAL, "dry_base = %g: must be >= 1", (double)p->dry_base);
    KILN_TRY(check_min("dry_allowed_length", p->dry_allowed_length, 0, ""));
    KILN_TRY(check_min("dry_penalty_last_n", p->dry_penalty_last_n, -1,
                       " (-1: whole context, 0: off)"));
    if (p->dry_breakers.n > KGEN_MAX_BREAKERS)
        return kiln_error(KILN_EINVAL, "dry_sequence_breakers: %d breakers, at most %d",
                          (int)p->dry_breakers.n, KGEN_MAX_BREAKERS);
    if (p->n_samplers < 0 || p->n_samplers > KGEN_MAX_SAMPLERS)
        return kiln_error(KILN_EINVAL, "samplers: %d entries, at most %d", (int)p->n_samplers,
                          KGEN_MAX_SAMPLERS);
    for (int32_t i = 0; i < p->n_samplers; i++)
        if ((unsigned)p->samplers[i] >= KGEN_SAMPLER_COUNT_)
            return kiln_error(KILN_EINVAL, "samplers[%d]: unknown sampler %d", (int)i,
                              (int)p->samplers[i]);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0)
            return kiln_error(KILN_EINVAL, "logit_bias[%d]: token id %d is negative", (int)i,
                              (int)p->logit_bias[i].token);
        if (isnan(p->logit_bias[i].bias))
            return kiln_error(KILN_EINVAL, "logit_bias[%d]: bias of token %d is NaN", (int)i,
                              (int)p->logit_bias[i].token);
    }
    KILN_TRY(check_min("min_tokens", p->min_tokens, 0, ""));
    KILN_TRY(check_min("n_predict", p->n_predict, -2, " (-1: no limit, -2: until the context is full)"));
    if (p->stop.n > KGEN_MAX_STOPS)
        return kiln_error(KILN_EINVAL, "stop: %d strings, at most %d", (int)p->stop.n, KGEN_MAX_STOPS);
    for (int32_t i = 0; i < p->stop.n; i++)
        if (strlen(p->stop.v[i]) > KGEN_MAX_STOP_BYTES)
            return kiln_error(KILN_EINVAL, "stop[%d]: %zu bytes, at most %d", (int)i,
                              strlen(p->stop.v[i]), KGEN_MAX_STOP_BYTES);
    if (p->n_probs < 0 || p->n_probs > KGEN_MAX_N_PROBS)
        return kiln_error(KILN_EINVAL, "n_probs = %d: must be in [0, %d]", (int)p->n_probs,
                          KGEN_MAX_N_PROBS);
    return NULL;
}

/* ---------------------------------------------------------- escapes */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

void kgen_unescape(char *s) {
    size_t o = 0, n = strlen(s);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            s[o++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case '\'': s[o++] = '\''; break;
        case '"': s[o++] = '"'; break;
        case '\\': s[o++] = '\\'; break;
        case 'x':
            if (i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
                char v = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
                i += 2;
                if (v == 0) { /* a NUL would cut the C string: keep it escaped */
                    s[o++] = '\\';
                    s[o++] = 'x';
                    s[o++] = '0';
                    s[o++] = '0';
                } else {
                    s[o++] = v;
                }
                break;
            }
            /* fall through */
        default:
            s[o++] = '\\';
            s[o++] = c;
            break;
        }
    }
    s[o] = 0;
}

/* ---------------------------------------------------------- CLI flags */

static kiln_status parse_f32(const char *flag, const char *v, bool allow_inf, float *out) {
    char *end;
    errno = 0;
    float f = strtof(v, &end);
    if (end == v || *end != 0 || isnan(f) || (!allow_inf && (isinf(f) || errno == ERANGE)))
        return kiln_error(KILN_EINVAL, "%s: \"%s\" is not a number", flag, v);
    *out = f;
    return NULL;
}

static kiln_status parse_i32(const char *flag, const char *v, int32_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end != 0 || errno == ERANGE || x < INT32_MIN || x > INT32_MAX)
        return kiln_error(KILN_EINVAL, "%s: \"%s\" is not an integer", flag, v);
    *out = (int32_t)x;
    return NULL;
}

static kiln_status parse_seed(const char *flag, const char *v, uint32_t *out) {
    if (strcmp(v, "-1") == 0) { /* std::stoul("-1") wraps to LLAMA_DEFAULT_SEED */
        *out = KGEN_SEED_RANDOM;
        return NULL;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end != 0 || errno == ERANGE || v[0] == '-' || x > 0xFFFFFFFFull)
        return kiln_error(KILN_EINVAL, "%s: \"%s\" is not a seed (0 .. 4294967295, or -1 for random)",
                          flag, v);
    *out = (uint32_t)x;
    return NULL;
}

/* "TOKEN_ID(+/-)BIAS", e.g. 15043+1, 15043-1.5, 2-inf. */
static kiln_status parse_logit_bias(kgen_params *p, const char *flag, const char *v) {
    const char *s = v;
    while (*s == ' ' || *s == '\t') s++;
    char *end;
    errno = 0;
    long long tok = strtoll(s, &end, 10);
    bool ok = end != s && errno != ERANGE && tok >= 0 && tok <= INT32_MAX &&
              (*end == '+' || *end == '-');
    float bias = 0;
    if (ok) {
        char *e2;
        bias = strtof(end + 1, &e2);
        ok = e2 != end + 1 && *e2 == 0 && !isnan(bias);
        if (*end == '-') bias = -bias;
    }
    if (!ok)
        return kiln_error(KILN_EINVAL,
                          "%s: \"%s\": expected TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf", flag, v);
    return bias_push(p, (int32_t)tok, bias);
}

enum {
    F_TEMP, F_TOP_K, F_TOP_P, F_MIN_P, F_TOP_N_SIGMA, F_TYPICAL, F_XTC_P, F_XTC_T, F_REP_PEN,
    F_REP_LAST_N, F_PRES_PEN, F_FREQ_PEN, F_DRY_MULT, F_DRY_BASE, F_DRY_LEN, F_DRY_LAST_N,
    F_DRY_BREAKER, F_SEED, F_SAMPLERS, F_SAMPLER_SEQ, F_LOGIT_BIAS, F_IGNORE_EOS, F_N_PREDICT,
    F_MIN_TOKENS, F_MIN_KEEP, F_STOP, F_N_PROBS,
};

static const struct {
    const char *names[3];
    int id;
    bool takes_value;
    const char *help;
} k_flags[] = {
    {{"--temp", "--temperature"}, F_TEMP, true, "N  temperature (default 0.8; 0 = greedy)"},
    {{"--top-k"}, F_TOP_K, true, "N  top-k sampling (default 40, 0 = disabled)"},
    {{"--top-p"}, F_TOP_P, true, "N  top-p sampling (default 0.95, 1.0 = disabled)"},
    {{"--min-p"}, F_MIN_P, true, "N  min-p sampling (default 0.05, 0.0 = disabled)"},
    {{"--top-nsigma", "--top-n-sigma"}, F_TOP_N_SIGMA, true, "N  top-n-sigma (default -1 = disabled)"},
    {{"--typical", "--typical-p"}, F_TYPICAL, true, "N  locally typical sampling p (default 1.0 = disabled)"},
    {{"--xtc-probability"}, F_XTC_P, true, "N  xtc probability (default 0.0 = disabled)"},
    {{"--xtc-threshold"}, F_XTC_T, true, "N  xtc threshold (default 0.1, > 0.5 = disabled)"},
    {{"--repeat-penalty"}, F_REP_PEN, true, "N  repetition penalty (default 1.0 = disabled)"},
    {{"--repeat-last-n"}, F_REP_LAST_N, true, "N  last n tokens to penalize (default 64, 0 = disabled, -1 = ctx size)"},
    {{"--presence-penalty"}, F_PRES_PEN, true, "N  presence penalty (default 0.0 = disabled)"},
    {{"--frequency-penalty"}, F_FREQ_PEN, true, "N  frequency penalty (default 0.0 = disabled)"},
    {{"--dry-multiplier"}, F_DRY_MULT, true, "N  DRY multiplier (default 0.0 = disabled)"},
    {{"--dry-base"}, F_DRY_BASE, true, "N  DRY base (default 1.75; values < 1 are ignored)"},
    {{"--dry-allowed-length"}, F_DRY_LEN, true, "N  DRY allowed length (default 2)"},
    {{"--dry-penalty-last-n"}, F_DRY_LAST_N, true, "N  DRY window (default -1 = ctx size, 0 = disabled)"},
    {{"--dry-sequence-breaker"}, F_DRY_BREAKER, true, "S  add a DRY breaker, clearing the defaults ('\\n', ':', '\"', '*'); \"none\" for none"},
    {{"-s", "--seed"}, F_SEED, true, "N  RNG seed (default -1 = random)"},
    {{"--samplers"}, F_SAMPLERS, true, "L  sampler order, ';'-separated (default penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature)"},
    {{"--sampler-seq", "--sampling-seq"}, F_SAMPLER_SEQ, true, "S  sampler order as letters (default edskypmxt)"},
    {{"-l", "--logit-bias"}, F_LOGIT_BIAS, true, "B  TOKEN_ID(+/-)BIAS, e.g. 15043+1 or 15043-inf"},
    {{"--ignore-eos"}, F_IGNORE_EOS, false, "   end-of-generation tokens do not stop generation (they may still be sampled; llama.cpp bans them)"},
    {{"-n", "--predict", "--n-predict"}, F_N_PREDICT, true, "N  tokens to predict (default -1 = no limit, -2 = until context full)"},
    {{"--min-tokens"}, F_MIN_TOKENS, true, "N  mask the end-of-generation tokens until N tokens are generated"},
    {{"--min-keep"}, F_MIN_KEEP, true, "N  truncating samplers keep at least N tokens (default 0)"},
    {{"--stop", "--reverse-prompt"}, F_STOP, true, "S  stop generating at this text (repeatable; not printed)"},
    {{"--n-probs"}, F_N_PROBS, true, "N  report each token's log-probability and the top N (kiln generate: in the --json output)"},
};

void kgen_print_flags(FILE *out) {
    for (size_t i = 0; i < sizeof k_flags / sizeof k_flags[0]; i++) {
        char names[64] = "";
        size_t no = 0;
        for (int j = 0; j < 3 && k_flags[i].names[j] && no < sizeof names; j++) {
            int w = snprintf(names + no, sizeof names - no, "%s%s", j ? ", " : "", k_flags[i].names[j]);
            no += w > 0 ? (size_t)w : 0;
        }
        fprintf(out, "  %-34s %s\n", names, k_flags[i].help);
    }
    kgen_grammar_print_flags(out);
}

kiln_status kgen_parse_flag(kgen_params *p, int argc, char **argv, int *i, bool *consumed) {
    *consumed = false;
    if (*i < 0 || *i >= argc || !argv[*i]) return NULL;
    KILN_TRY(kgen_grammar_flag(p, argc, argv, i, consumed));
    if (*consumed) return NULL;
    const char *arg = argv[*i];
    int id = -1;
    bool takes_value = false;
    for (size_t f = 0; f < sizeof k_flags / sizeof k_flags[0] && id < 0; f++)
        for (int j = 0; j < 3 && k_flags[f].names[j]; j++)
            if (strcmp(arg, k_flags[f].names[j]) == 0) {
                id = k_flags[f].id;
                takes_value = k_flags[f].takes_value;
                break;
            }
    if (id < 0) return NULL;
    *consumed = true;
    const char *v = NULL;
    if (takes_value) {
        if (*i + 1 >= argc || !argv[*i + 1])
            return kiln_error(KILN_EINVAL, "%s: missing value", arg);
        v = argv[*i + 1];
        *i += 2;
    } else {
        *i += 1;
    }
    float f;
    int32_t n;
    switch (id) {
    case F_TEMP:
        KILN_TRY(parse_f32(arg, v, false, &f));
        p->temperature = f < 0 ? 0 : f; /* as llama.cpp */
        return NULL;
    case F_TOP_K: KILN_TRY(parse_i32(arg, v, &p->top_k)); break;
    case F_TOP_P: KILN_TRY(parse_f32(arg, v, false, &p->top_p)); break;
    case F_MIN_P: KILN_TRY(parse_f32(arg, v, false, &p->min_p)); break;
    case F_TOP_N_SIGMA: KILN_TRY(parse_f32(arg, v, false, &p->top_n_sigma)); break;
    case F_TYPICAL: KILN_TRY(parse_f32(arg, v, false, &p->typical_p)); break;
    case F_XTC_P: KILN_TRY(parse_f32(arg, v, false, &p->xtc_probability)); break;
    case F_XTC_T: KILN_TRY(parse_f32(arg, v, false, &p->xtc_threshold)); break;
    case F_REP_PEN: KILN_TRY(parse_f32(arg, v, false, &p->repeat_penalty)); break;
    case F_REP_LAST_N: KILN_TRY(parse_i32(arg, v, &p->repeat_last_n)); break;
    case F_PRES_PEN: KILN_TRY(parse_f32(arg, v, false, &p->presence_penalty)); break;
    case F_FREQ_PEN: KILN_TRY(parse_f32(arg, v, false, &p->frequency_penalty)); break;
    case F_DRY_MULT: KILN_TRY(parse_f32(arg, v, false, &p->dry_multiplier)); break;
    case F_DRY_BASE:
        KILN_TRY(parse_f32(arg, v, false, &f));
        if (f >= 1.0f) p->dry_base = f; /* llama.cpp ignores bases below 1 */
        return NULL;
    case F_DRY_LEN: KILN_TRY(parse_i32(arg, v, &p->dry_allowed_length)); break;
    case F_DRY_LAST_N: KILN_TRY(parse_i32(arg, v, &p->dry_penalty_last_n)); break;
    case F_DRY_BREAKER: {
        if (!p->dry_breakers_from_cli) {
            strs_clear(&p->dry_breakers);
            p->dry_breakers_from_cli = true;
        }
        if (strcmp(v, "none") == 0) {
            strs_clear(&p->dry_breakers);
            return NULL;
        }
        KILN_TRY(strs_push(&p->dry_breakers, v, strlen(v)));
        kgen_unescape(p->dry_breakers.v[p->dry_breakers.n - 1]);
        break;
    }
    case F_SEED: KILN_TRY(parse_seed(arg, v, &p->seed)); break;
    case F_SAMPLERS:
        KILN_TRYF(kgen_parse_samplers(v, ';', p->samplers, &p->n_samplers), "%s", arg);
        break;
    case F_SAMPLER_SEQ:
        KILN_TRYF(kgen_parse_samplers(v, 0, p->samplers, &p->n_samplers), "%s", arg);
        break;
    case F_LOGIT_BIAS: KILN_TRY(parse_logit_bias(p, arg, v)); break;
    case F_IGNORE_EOS: p->ignore_eos = true; break;
    case F_N_PREDICT: KILN_TRY(parse_i32(arg, v, &p->n_predict)); break;
    case F_MIN_TOKENS: KILN_TRY(parse_i32(arg, v, &p->min_tokens)); break;
    case F_MIN_KEEP: KILN_TRY(parse_i32(arg, v, &p->min_keep)); break;
    case F_STOP:
        if (!*v) return NULL;
        KILN_TRY(strs_push(&p->stop, v, strlen(v)));
        kgen_unescape(p->stop.v[p->stop.n - 1]);
        break;
    case F_N_PROBS:
        KILN_TRY(parse_i32(arg, v, &n));
        p->n_probs = n;
        p->logprobs = n > 0;
        break;
    default: break;
    }
    /* Range errors at parse time, naming the flag (kgen_params_validate
     * names the field). */
    kiln_status st = kgen_params_validate(p);
    return st ? kiln_status_wrap(st, "%s %s", arg, v ? v : "") : NULL;
}

/* ---------------------------------------------------------- JSON */

static kiln_status json_f32(const cJSON *b, const char *key, float *v) {
    double d;
    KILN_TRY(ku_json_num(b, key, *v, &d));
    *v = (float)d;
    return NULL;
}

static kiln_status json_i32(const cJSON *b, const char *key, int32_t *v) {
    int64_t x;
    KILN_TRY(ku_json_int(b, key, *v, &x));
    if (x < INT32_MIN || x > INT32_MAX)
        return kiln_error(KILN_EINVAL, "\"%s\": %lld is out of range", key, (long long)x);
    *v = (int32_t)x;
    return NULL;
}

static kiln_status json_token_id(const cJSON *e, const char *ctx, const kgen_vocab *vocab, int32_t *out) {
    double d = e->valuedouble;
    if (!cJSON_IsNumber(e) || d != floor(d))
        return kiln_error(KILN_EINVAL, "%s: expected an integer token id", ctx);
    if (d < 0 || (vocab && d >= vocab->n_vocab) || d > INT32_MAX)
        return kiln_error(KILN_EINVAL, "%s: token id %.0f out of range [0, %d)", ctx, d,
                          vocab ? (int)vocab->n_vocab : INT32_MAX);
    *out = (int32_t)d;
    return NULL;
}

/* A bias is a number, or false to ban the token (llama-server). */
static kiln_status json_bias(const cJSON *v, const char *ctx, float *out) {
    if (cJSON_IsNumber(v)) {
        *out = (float)v->valuedouble;
        return NULL;
    }
    if (cJSON_IsFalse(v)) {
        *out = -INFINITY;
        return NULL;
    }
    return kiln_error(KILN_EINVAL, "%s: the bias must be a number or false", ctx);
}

/* Token text as a logit_bias key: every token of its tokenization gets the
 * bias (llama-server). */
static kiln_status bias_text(kgen_params *p, const char *text, float bias, const char *ctx,
                             const kgen_vocab *vocab) {
    if (!vocab || !vocab->tokenize)
        return kiln_error(KILN_EINVAL, "%s: \"%s\" is not a token id (token text needs a tokenizer)",
                          ctx, text);
    int32_t ids[256];
    int n = vocab->tokenize(vocab->ud, text, strlen(text), ids, 256);
    if (n < 0 || n > 256)
        return kiln_error(KILN_EINVAL, "%s: cannot tokenize \"%s\"", ctx, text);
    for (int k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= vocab->n_vocab)
            return kiln_error(KILN_EINTERNAL, "%s: tokenizer returned id %d", ctx, (int)ids[k]);
        KILN_TRY(bias_push(p, ids[k], bias));
    }
    return NULL;
}

static kiln_status json_logit_bias(kgen_params *p, const cJSON *lb, const kgen_vocab *vocab) {
    p->n_logit_bias = 0;
    char ctx[96];
    const cJSON *e;
    int idx = 0;
    if (cJSON_IsObject(lb)) {
        cJSON_ArrayForEach(e, lb) {
            snprintf(ctx, sizeof ctx, "logit_bias[\"%.40s\"]", e->string ? e->string : "");
            float bias = 0;
            KILN_TRY(json_bias(e, ctx, &bias));
            const char *key = e->string ? e->string : "";
            char *end;
            errno = 0;
            long long tok = strtoll(key, &end, 10);
            if (end != key && *end == 0) {
                if (errno == ERANGE || tok < 0 || tok > INT32_MAX || (vocab && tok >= vocab->n_vocab))
                    return kiln_error(KILN_EINVAL, "%s: token id out of range [0, %d)", ctx,
                                      vocab ? (int)vocab->n_vocab : INT32_MAX);
                KILN_TRY(bias_push(p, (int32_t)tok, bias));
            } else {
                KILN_TRY(bias_text(p, key, bias, ctx, vocab));
            }
        }
        return NULL;
    }
    if (!cJSON_IsArray(lb))
        return kiln_error(KILN_EINVAL,
                          "\"logit_bias\": expected an object {\"token_id\": bias} or a list [[token_id, bias], ...]");
    cJSON_ArrayForEach(e, lb) {
        snprintf(ctx, sizeof ctx, "logit_bias[%d]", idx++);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2)
            return kiln_error(KILN_EINVAL, "%s: expected a pair [token_id or text, bias]", ctx);
        const cJSON *k = cJSON_GetArrayItem(e, 0), *v = cJSON_GetArrayItem(e, 1);
        float bias = 0;
        KILN_TRY(json_bias(v, ctx, &bias));
        if (cJSON_IsString(k)) {
            KILN_TRY(bias_text(p, k->valuestring, bias, ctx, vocab));
        } else {
            int32_t tok = 0;
            KILN_TRY(json_token_id(k, ctx, vocab, &tok));
            KILN_TRY(bias_push(p, tok, bias));
        }
    }
    return NULL;
}

static kiln_status json_str_list(const cJSON *v, const char *key, bool skip_empty, kgen_strs *out) {
    strs_clear(out);
    if (cJSON_IsString(v)) {
        if (skip_empty && !*v->valuestring) return NULL;
        return strs_push(out, v->valuestring, strlen(v->valuestring));
    }
    if (!cJSON_IsArray(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected a string or a list of strings", key);
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsString(e))
            return kiln_error(KILN_EINVAL, "\"%s\"[%d]: expected a string", key, i);
        i++;
        if (skip_empty && !*e->valuestring) continue;
        KILN_TRY(strs_push(out, e->valuestring, strlen(e->valuestring)));
    }
    return NULL;
}

static kiln_status json_apply(kgen_params *p, const cJSON *b, const kgen_vocab *vocab) {
    KILN_TRY(json_f32(b, "temperature", &p->temperature));
    KILN_TRY(json_i32(b, "top_k", &p->top_k));
    KILN_TRY(json_f32(b, "top_p", &p->top_p));
    KILN_TRY(json_f32(b, "min_p", &p->min_p));
    KILN_TRY(json_f32(b, "typical_p", &p->typical_p));
    KILN_TRY(json_f32(b, "top_n_sigma", &p->top_n_sigma));
    KILN_TRY(json_i32(b, "min_keep", &p->min_keep));
    KILN_TRY(json_f32(b, "xtc_probability", &p->xtc_probability));
    KILN_TRY(json_f32(b, "xtc_threshold", &p->xtc_threshold));
    KILN_TRY(json_f32(b, "repeat_penalty", &p->repeat_penalty));
    KILN_TRY(json_i32(b, "repeat_last_n", &p->repeat_last_n));
    KILN_TRY(json_f32(b, "presence_penalty", &p->presence_penalty));
    KILN_TRY(json_f32(b, "frequency_penalty", &p->frequency_penalty));
    KILN_TRY(json_f32(b, "dry_multiplier", &p->dry_multiplier));
    float base = p->dry_base;
    KILN_TRY(json_f32(b, "dry_base", &base));
    p->dry_base = base < 1.0f ? 1.75f : base; /* llama-server resets it to the default */
    KILN_TRY(json_i32(b, "dry_allowed_length", &p->dry_allowed_length));
    KILN_TRY(json_i32(b, "dry_penalty_last_n", &p->dry_penalty_last_n));
    const cJSON *v = ku_json_get(b, "dry_sequence_breakers");
    if (v) {
        if (!cJSON_IsArray(v))
            return kiln_error(KILN_EINVAL, "\"dry_sequence_breakers\": expected a non-empty list of strings");
        KILN_TRY(json_str_list(v, "dry_sequence_breakers", false, &p->dry_breakers));
        if (p->dry_breakers.n == 0)
            return kiln_error(KILN_EINVAL, "\"dry_sequence_breakers\": must be a non-empty list of strings");
    }
    int64_t seed;
    KILN_TRY(ku_json_int(b, "seed", p->seed, &seed));
    if (seed == -1) seed = KGEN_SEED_RANDOM;
    if (seed < 0 || seed > 0xFFFFFFFFll)
        return kiln_error(KILN_EINVAL, "\"seed\": %lld is not a seed (0 .. 4294967295, or -1 for random)",
                          (long long)seed);
    p->seed = (uint32_t)seed;
    if ((v = ku_json_get(b, "samplers"))) {
        if (cJSON_IsString(v)) {
            KILN_TRYF(kgen_parse_samplers(v->valuestring, 0, p->samplers, &p->n_samplers), "\"samplers\"");
        } else if (cJSON_IsArray(v)) {
            const cJSON *e;
            int32_t n = 0;
            cJSON_ArrayForEach(e, v) {
                if (!cJSON_IsString(e))
                    return kiln_error(KILN_EINVAL, "\"samplers\"[%d]: expected a sampler name", (int)n);
                if (n >= KGEN_MAX_SAMPLERS)
                    return kiln_error(KILN_EINVAL, "\"samplers\": more than %d entries", KGEN_MAX_SAMPLERS);
                KILN_TRYF(sampler_by_name(e->valuestring, strlen(e->valuestring), &p->samplers[n]),
                          "\"samplers\"[%d]", (int)n);
                n++;
            }
            p->n_samplers = n;
        } else {
            return kiln_error(KILN_EINVAL, "\"samplers\": expected a list of names or a string of letters");
        }
    }
    if ((v = ku_json_get(b, "logit_bias"))) KILN_TRY(json_logit_bias(p, v, vocab));
    if ((v = ku_json_get(b, "stop"))) {
        kgen_strs stops = {0};
        kiln_status st = json_str_list(v, "stop", true, &stops);
        if (st) {
            strs_clear(&stops);
            return st;
        }
        if (stops.n > 0) { /* an empty list keeps the defaults, as llama-server */
            strs_clear(&p->stop);
            p->stop = stops;
        }
    }
    /* llama-server: n_predict, else max_completion_tokens, else max_tokens. */
    KILN_TRY(json_i32(b, "max_tokens", &p->n_predict));
    KILN_TRY(json_i32(b, "max_completion_tokens", &p->n_predict));
    KILN_TRY(json_i32(b, "n_predict", &p->n_predict));
    KILN_TRY(json_i32(b, "min_tokens", &p->min_tokens));
    KILN_TRY(ku_json_bool(b, "ignore_eos", p->ignore_eos, &p->ignore_eos));
    KILN_TRY(ku_json_bool(b, "post_sampling_probs", p->post_sampling_probs, &p->post_sampling_probs));

    /* Log-probabilities. n_probs (llama-server native) wins; otherwise
     * OpenAI: chat has logprobs: bool + top_logprobs: int (default 0, i.e.
     * only the chosen token), /v1/completions has logprobs: int. */
    const cJSON *np = ku_json_get(b, "n_probs");
    const cJSON *lp = ku_json_get(b, "logprobs");
    const cJSON *tlp = ku_json_get(b, "top_logprobs");
    if (np) {
        KILN_TRY(json_i32(b, "n_probs", &p->n_probs));
        p->logprobs = p->n_probs > 0;
    } else if (lp && cJSON_IsBool(lp)) {
        p->logprobs = cJSON_IsTrue(lp);
        p->n_probs = 0;
        if (tlp && !p->logprobs)
            return kiln_error(KILN_EINVAL, "\"top_logprobs\": requires \"logprobs\": true");
        if (tlp) KILN_TRY(json_i32(b, "top_logprobs", &p->n_probs));
        if (p->n_probs < 0 || p->n_probs > 20) /* OpenAI's range (llama.cpp's n_probs allows more) */
            return kiln_error(KILN_EINVAL, "\"top_logprobs\": %d is out of range [0, 20]", (int)p->n_probs);
    } else if (lp) {
        int32_t n = 0;
        KILN_TRY(json_i32(b, "logprobs", &n));
        if (n < 0 || n > 20) return kiln_error(KILN_EINVAL, "\"logprobs\": %d is out of range [0, 20]", (int)n);
        p->logprobs = true;
        p->n_probs = n;
    } else if (tlp) {
        return kiln_error(KILN_EINVAL, "\"top_logprobs\": requires \"logprobs\": true");
    }
    return kgen_grammar_from_json(p, b);
}

kiln_status kgen_params_from_json(kgen_params *p, const cJSON *body, const kgen_vocab *vocab) {
    if (!cJSON_IsObject(body)) return kiln_error(KILN_EINVAL, "request body: expected a JSON object");
    kgen_params tmp;
    KILN_TRY(kgen_params_copy(&tmp, p));
    kiln_status st = json_apply(&tmp, body, vocab);
    if (!st) st = kgen_params_validate(&tmp);
    if (!st && vocab)
        for (int32_t i = 0; i < tmp.n_logit_bias && !st; i++)
            if (tmp.logit_bias[i].token >= vocab->n_vocab)
                st = kiln_error(KILN_EINVAL, "logit_bias: token id %d out of range [0, %d)",
                                (int)tmp.logit_bias[i].token, (int)vocab->n_vocab);
    if (st) {
        kgen_params_free(&tmp);
        return st;
    }
    kgen_params_free(p);
    *p = tmp;
    return NULL;
}
