/* rope.c: rotary frequency tables (see rope.h). */
#include "models/rope.h"

#include <math.h>
#include <string.h>

#include "base/half.h"
#include "base/json.h"

/* 1 / base^(2i/dim) in float32, as torch computes it. */
static void default_freqs(double base, int dim, float *out) {
    for (int i = 0; i < dim / 2; i++) {
        float e = (float)(2 * i) / (float)dim;
        out[i] = (float)(1.0 / pow(base, (double)e));
    }
}

static double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

static kiln_status init_yarn(km_rope *r, const cJSON *rs) {
    double attn, mscale, mscale_all, beta_fast, beta_slow;
    int64_t orig;
    bool truncate;
    KILN_TRY(ku_json_num(rs, "attention_factor", -1, &attn));
    KILN_TRY(ku_json_num(rs, "mscale", 0, &mscale));
    KILN_TRY(ku_json_num(rs, "mscale_all_dim", 0, &mscale_all));
    KILN_TRY(ku_json_num(rs, "beta_fast", 32, &beta_fast));
    KILN_TRY(ku_json_num(rs, "beta_slow", 1, &beta_slow));
    KILN_TRY(ku_json_int(rs, "original_max_position_embeddings", 0, &orig));
    KILN_TRY(ku_json_bool(rs, "truncate", true, &truncate));
    if (beta_fast == 0) beta_fast = 32; /* `or 32` in transformers */
    if (beta_slow == 0) beta_slow = 1;
    double factor = r->factor;
    if (orig > 0) {
        /* transformers derives the factor from the two lengths when both exist */
        factor = (double)r->max_pos / (double)orig;
    } else {
        orig = r->max_pos;
    }
    r->orig_max_pos = orig;
    if (attn < 0) {
        if (mscale != 0 && mscale_all != 0) attn = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all);
        else attn = yarn_mscale(factor, 1);
    }
    r->attention_factor = (float)attn;
    int dim = r->dim;
    double base = r->theta;
    double lo = (dim * log((double)orig / (beta_fast * 2 * M_PI))) / (2 * log(base));
    double hi = (dim * log((double)orig / (beta_slow * 2 * M_PI))) / (2 * log(base));
    if (truncate) {
        lo = floor(lo);
        hi = ceil(hi);
    }
    if (lo < 0) lo = 0;
    if (hi > dim - 1) hi = dim - 1;
    if (lo == hi) hi += 0.001;
    for (int i = 0; i < dim / 2; i++) {
        float pos_freq = (float)pow(base, (double)((float)(2 * i) / (float)dim));
        float extra = 1.0f / pos_freq, inter = 1.0f / ((float)factor * pos_freq);
        float ramp = (float)(((double)i - lo) / (hi - lo));
        if (ramp < 0) ramp = 0;
        if (ramp > 1) ramp = 1;
        float ef = 1.0f - ramp; /* extrapolation factor */
        r->inv_freq[i] = inter * (1.0f - ef) + extra * ef;
    }
    return NULL;
}

static kiln_status init_llama3(km_rope *r, const cJSON *rs) {
    double lff, hff;
    int64_t orig;
    KILN_TRY(ku_json_num(rs, "low_freq_factor", 1, &lff));
    KILN_TRY(ku_json_num(rs, "high_freq_factor", 4, &hff));
    KILN_TRY(ku_json_int(rs, "original_max_position_embeddings", 8192, &orig));
    if (hff == lff) return kiln_error(KILN_EINVAL, "rope_scaling: high_freq_factor must differ from low_freq_factor");
    r->orig_max_pos = orig;
    float factor = (float)r->factor;
    double low_wl = (double)orig / lff, high_wl = (double)orig / hff;
    for (int i = 0; i < r->dim / 2; i++) {
        float f = r->inv_freq[i];
        float wl = (float)(2 * M_PI) / f;
        float v = wl > low_wl ? f / factor : f;
        if (!(wl < high_wl) && !(wl > low_wl)) {
            float smooth = ((float)orig / wl - (float)lff) / (float)(hff - lff);
            v = (1 - smooth) * v / factor + smooth * v;
        }
        r->inv_freq[i] = v;
    }
    return NULL;
}

static kiln_status read_factors(const cJSON *rs, const char *key, int n, float *out) {
    const cJSON *a = ku_json_get(rs, key);
    if (!a || !cJSON_IsArray(a) || cJSON_GetArraySize(a) != n)
        return kiln_error(KILN_EINVAL, "rope_scaling.%s: expected a list of %d numbers", key, n);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "rope_scaling.%s: expected numbers", key);
        out[i++] = (float)e->valuedouble;
    }
    return NULL;
}

static kiln_status init_longrope(km_rope *r, const cJSON *rs, int64_t orig) {
    float sf[KM_ROPE_MAX_HALF], lf[KM_ROPE_MAX_HALF];
    int half = r->dim / 2;
    KILN_TRY(read_factors(rs, "short_factor", half, sf));
    KILN_TRY(read_factors(rs, "long_factor", half, lf));
    double attn;
    KILN_TRY(ku_json_num(rs, "attention_factor", -1, &attn));
    double factor = r->factor;
    if (orig > 0) factor = (double)r->max_pos / (double)orig;
    else orig = r->max_pos;
    r->orig_max_pos = orig;
    if (attn < 0) attn = factor <= 1 ? 1.0 : sqrt(1 + log(factor) / log((double)orig));
    r->attention_factor = r->long_attention_factor = (float)attn;
    for (int i = 0; i < half; i++) {
        float base = (float)pow(r->theta, (double)((float)(2 * i) / (float)r->dim));
        r->inv_freq[i] = 1.0f / (sf[i] * base);
        r->long_inv_freq[i] = 1.0f / (lf[i] * base);
    }
    return NULL;
}

kiln_status km_rope_init(km_rope *r, const cJSON *rs, double theta, int dim, int64_t max_pos) {
    memset(r, 0, sizeof *r);
    if (dim <= 0 || dim % 2 || dim / 2 > KM_ROPE_MAX_HALF) return kiln_error(KILN_EUNSUPPORTED, "rotary dims %d", dim);
    if (!(theta > 0)) return kiln_error(KILN_EINVAL, "rope_theta must be positive");
    r->dim = dim;
    r->theta = theta;
    r->max_pos = max_pos;
    r->factor = 1;
    r->attention_factor = 1;
    default_freqs(theta, dim, r->inv_freq);
    if (!rs || !cJSON_IsObject(rs)) return NULL;
    const char *type = NULL;
    KILN_TRY(ku_json_str(rs, "rope_type", NULL, &type));
    if (!type) KILN_TRY(ku_json_str(rs, "type", "default", &type));
    KILN_TRY(ku_json_num(rs, "factor", 1, &r->factor));
    int64_t orig;
    KILN_TRY(ku_json_int(rs, "original_max_position_embeddings", 0, &orig));
    if (!strcmp(type, "default") || !strcmp(type, "mrope")) return NULL; /* Qwen2-VL's "mrope": default frequencies */
    if (!(r->factor > 0)) return kiln_error(KILN_EINVAL, "rope_scaling.factor must be positive");
    if (!strcmp(type, "linear")) {
        r->type = KM_ROPE_LINEAR;
        for (int i = 0; i < dim / 2; i++) r->inv_freq[i] /= (float)r->factor;
        return NULL;
    }
    if (!strcmp(type, "dynamic")) {
        r->type = KM_ROPE_DYNAMIC;
        return NULL;
    }
    if (!strcmp(type, "llama3")) {
        r->type = KM_ROPE_LLAMA3;
        return init_llama3(r, rs);
    }
    if (!strcmp(type, "yarn")) {
        r->type = KM_ROPE_YARN;
        return init_yarn(r, rs);
    }
    if (!strcmp(type, "proportional")) {
        /* _compute_proportional_rope_parameters: exponents over the whole
         * dim, int(partial_rotary_factor * dim // 2) rotating pairs */
        double prf;
        KILN_TRY(ku_json_num(rs, "partial_rotary_factor", 1.0, &prf));
        if (!(prf >= 0 && prf <= 1)) return kiln_error(KILN_EINVAL, "rope_parameters.partial_rotary_factor must be in [0, 1]");
        r->type = KM_ROPE_PROPORTIONAL;
        int angles = (int)floor(prf * dim / 2);
        for (int i = 0; i < dim / 2; i++) r->inv_freq[i] = i < angles ? r->inv_freq[i] / (float)r->factor : 0.0f;
        return NULL;
    }
    if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
        r->type = KM_ROPE_LONGROPE;
        return init_longrope(r, rs, orig);
    }
    return kiln_error(KILN_EUNSUPPORTED, "rope_scaling type \"%s\" is not supported (supported: default, linear, "
                                         "dynamic, llama3, yarn, longrope, proportional)", type);
}

void km_rope_ntk_step(km_rope *r, int64_t step_len, int64_t min_len, int64_t mscale_len) {
    r->type = KM_ROPE_NTK_STEP;
    r->ntk_step_len = step_len > 0 ? step_len : 1;
    r->ntk_min_len = min_len;
    r->ntk_mscale_len = mscale_len;
}

/* NTK_STEP frequencies and attention factor for a sequence of length L. */
static void ntk_step(const km_rope *r, int64_t L, float *f, float *af) {
    double Lp = (double)(L > r->ntk_min_len ? L : r->ntk_min_len);
    double alpha = pow(2.0, ceil(log2(Lp / (double)r->ntk_step_len) + 1)) - 1;
    if (alpha < 1) alpha = 1;
    default_freqs(r->theta * pow(alpha, (double)r->dim / (r->dim - 2)), r->dim, f);
    *af = r->attention_factor;
    if (r->ntk_mscale_len > 0 && Lp > (double)r->ntk_mscale_len)
        *af *= (float)(0.1 * log(Lp / (double)r->ntk_mscale_len) + 1.0);
}

static float round_f16(float x) { return ku_f16_to_f32(ku_f32_to_f16(x)); }

void km_rope_fill(const km_rope *r, int64_t n, const int32_t *pos, const int32_t *seq_len, float *cos, float *sin) {
    int half = r->dim / 2;
    float dyn[KM_ROPE_MAX_HALF], step_af = 1;
    int64_t step_L = -1; /* the length dyn holds NTK_STEP frequencies for */
    for (int64_t t = 0; t < n; t++) {
        const float *f = r->inv_freq;
        float af = r->attention_factor;
        if (r->type == KM_ROPE_NTK_STEP) {
            if (seq_len[t] != step_L) ntk_step(r, step_L = seq_len[t], dyn, &step_af);
            f = dyn;
            af = step_af;
        } else if (r->type == KM_ROPE_DYNAMIC && seq_len[t] > r->max_pos) {
            double L = seq_len[t];
            double base = r->theta * pow(r->factor * L / (double)r->max_pos - (r->factor - 1), (double)r->dim / (r->dim - 2));
            default_freqs(base, r->dim, dyn);
            f = dyn;
        } else if (r->type == KM_ROPE_LONGROPE && seq_len[t] > r->orig_max_pos) {
            f = r->long_inv_freq;
            af = r->long_attention_factor;
        }
        float p = (float)pos[t];
        if (r->round_f16) {
            for (int i = 0; i < half; i++) {
                float a = p * f[i];
                cos[t * half + i] = round_f16(round_f16(cosf(a)) * af);
                sin[t * half + i] = round_f16(round_f16(sinf(a)) * af);
            }
            continue;
        }
        for (int i = 0; i < half; i++) {
            float a = p * f[i];
            cos[t * half + i] = cosf(a) * af;
            sin[t * half + i] = sinf(a) * af;
        }
    }
    if (r->reversed)
        for (int64_t i = 0; i < n * half; i++) sin[i] = -sin[i];
}

/* ---------------------------------------------------------------- M-RoPE */

kiln_status km_rope_mrope(km_rope *r, const cJSON *rs) {
    const cJSON *sec = rs ? ku_json_get(rs, "mrope_section") : NULL;
    if (!sec || cJSON_IsNull(sec)) return NULL;
    if (!cJSON_IsArray(sec) || cJSON_GetArraySize(sec) != 3)
        return kiln_error(KILN_EUNSUPPORTED, "rope_scaling.mrope_section must be 3 counts (t, h, w)");
    int sum = 0;
    for (int i = 0; i < 3; i++) {
        const cJSON *e = cJSON_GetArrayItem(sec, i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > KM_ROPE_MAX_HALF)
            return kiln_error(KILN_EINVAL, "rope_scaling.mrope_section[%d] must be a count", i);
        r->mrope[i] = (int)e->valuedouble;
        sum += r->mrope[i];
    }
    KILN_TRY(ku_json_bool(rs, "mrope_interleaved", false, &r->mrope_interleaved));
    if (sum != r->dim / 2)
        return kiln_error(KILN_EINVAL, "rope_scaling.mrope_section sums to %d, the rotary pairs are %d", sum, r->dim / 2);
    if (r->type != KM_ROPE_DEFAULT && r->type != KM_ROPE_LINEAR)
        return kiln_error(KILN_EUNSUPPORTED, "M-RoPE with a rope_scaling type other than default or linear");
    return NULL;
}

/* The position component (0 t, 1 h, 2 w) rotary pair i follows. */
static int mrope_component(const km_rope *r, int i) {
    if (r->mrope_interleaved) {
        if (i % 3 == 1 && i < 3 * r->mrope[1]) return 1;
        if (i % 3 == 2 && i < 3 * r->mrope[2]) return 2;
        return 0;
    }
    return i < r->mrope[0] ? 0 : i < r->mrope[0] + r->mrope[1] ? 1 : 2;
}

void km_rope_fill_mrope(const km_rope *r, int64_t n, const int32_t *pos3, float *cos, float *sin) {
    int half = r->dim / 2;
    for (int64_t t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)pos3[3 * t + mrope_component(r, i)] * r->inv_freq[i];
            cos[t * half + i] = cosf(a) * r->attention_factor;
            sin[t * half + i] = sinf(a) * r->attention_factor;
        }
}
