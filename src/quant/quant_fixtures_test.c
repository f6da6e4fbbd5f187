/* kiln quantize against the oracle fixtures: the q4/q8 tensors it writes from
 * a fixture's float32 weights equal the fixture's (written by mlx-lm's
 * converter), its output passes the fixture's own q4/q8 gate, and at every
 * bit width its logits stay within a bound derived from the measured
 * quantization error. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/npy.h"
#include "ckpt/affine.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "engine/engine.h"
#include "engine/validate.h"
#include "kt.h"
#include "models/family.h"
#include "quant/quant.h"
#include "tokenizer/tokenizer.h"

/* snprintf into an array; truncation (never expected here) yields "". */
#define FMT(buf, ...) ((void)(snprintf(buf, sizeof buf, __VA_ARGS__) >= (int)sizeof buf && (buf[0] = 0)))

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Fixture folders under root (sorted) whose model_type kiln supports. */
static int list_fixtures(const char *root, char **out, int cap) {
    DIR *d = opendir(root);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    char p[4096];
    while ((e = readdir(d)) && n < cap) {
        if (e->d_name[0] == '.') continue;
        FMT(p, "%s/%s/config.json", root, e->d_name);
        cJSON *cfg = NULL;
        const char *mt = NULL;
        kiln_status st = ku_json_load(p, &cfg);
        if (!st) st = ku_json_str(cfg, "model_type", "", &mt);
        if (!st && km_family_find(mt)) {
            FMT(p, "%s/%s", root, e->d_name);
            out[n++] = strdup(p);
        }
        kiln_status_free(st);
        cJSON_Delete(cfg);
    }
    closedir(d);
    qsort(out, (size_t)n, sizeof out[0], cmp_str);
    return n;
}

typedef struct {
    int fixtures, tensors, differing_codes;
    int rule_float; /* modules an mlx-lm quant_predicate quantizes otherwise than the fixture */
    int64_t codes, ties, ties_away; /* .5 ties; those that rounding half away from zero would change */
} eq_stats;

/* Whether kiln quantized module X (a tensor name "X.weight") with a per-module
 * entry in its config's "quantization" object while the fixture keeps
 * X.weight float: a module the family's mlx-lm quant_predicate quantizes
 * with its own bits (MiniMax-M2's and Hy3's routers at 8 bits; the fixture
 * generator left every router float), which kiln follows. */
/* Modules mlx-lm quantizes with the model's bits (no per-module entry) that a
 * fixture's generator left float: transformers 5 builds ERNIE-4.5-MoE's
 * router (Ernie4_5_MoeTopKRouter) as a bare Parameter, not a Linear, while
 * mlx-lm's ernie4_5_moe.py makes it an nn.Linear that mlx_lm.convert
 * quantizes. */
static const char *const float_in_fixture[] = {".mlp.gate"};
static const char *const float_in_fixture_types[] = {"ernie4_5_moe"};

static bool listed_float(const char *model_type, const char *mod) {
    size_t ml = strlen(mod);
    for (size_t i = 0; i < sizeof float_in_fixture / sizeof float_in_fixture[0]; i++) {
        size_t sl = strlen(float_in_fixture[i]);
        if (!strcmp(model_type, float_in_fixture_types[i]) && ml >= sl && !strcmp(mod + ml - sl, float_in_fixture[i]))
            return true;
    }
    return false;
}

static bool rule_quantized(const kc_safetensors *g, const cJSON *qconf, const char *model_type, const kc_tensor *tw) {
    size_t len = strlen(tw->name);
    if (tw->dtype == KC_U32 || len < 8 || strcmp(tw->name + len - 7, ".weight")) return false;
    char mod[512], sc[520];
    FMT(mod, "%.*s", (int)(len - 7), tw->name);
    FMT(sc, "%s.scales", mod);
    return kc_st_find(g, sc) && (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(qconf, mod)) || listed_float(model_type, mod));
}

/* Whether tensor tw of a module the fixture quantized with the model's bits
 * belongs to one kiln quantized with other bits by a per-module entry of
 * its config (AFMoE's router at 8 bits in the q4 fixture's 4): the fixture
 * applied the generic rule, kiln mlx-lm's quant_predicate. */
static bool rule_rebits(const kc_safetensors *g, const cJSON *qconf, const kc_tensor *tw) {
    const char *dot = strrchr(tw->name, '.');
    if (!dot) return false;
    char mod[512], wn[520];
    FMT(mod, "%.*s", (int)(dot - tw->name), tw->name);
    FMT(wn, "%s.weight", mod);
    const kc_tensor *kw = kc_st_find(g, wn);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(qconf, mod), *b = cJSON_GetObjectItemCaseSensitive(e, "bits");
    const cJSON *gb = cJSON_GetObjectItemCaseSensitive(qconf, "bits");
    return kw && kw->dtype == KC_U32 && cJSON_IsNumber(b) && cJSON_IsNumber(gb) && b->valueint != gb->valueint;
}

/* Whether tensor tw (of the fixture) belongs to a module the fixture
 * quantized that kiln keeps float, as the family's mlx-lm quant_predicate
 * does (km_hparams.quant_float: Cohere2-MoE's attention). */
static bool rule_kept_float(const kc_safetensors *g, const km_hparams *hp, const kc_tensor *tw) {
    const char *dot = strrchr(tw->name, '.');
    if (!hp->quant_float || !dot || !strstr(tw->name, hp->quant_float)) return false;
    char wn[520];
    FMT(wn, "%.*s.weight", (int)(dot - tw->name), tw->name);
    const kc_tensor *kw = kc_st_find(g, wn);
    return kw && kw->dtype != KC_U32 && (strcmp(dot, ".weight") || tw->dtype == KC_U32);
}

/* Compares got (kiln's) with want (the fixture's) tensor by tensor. Codes may
 * differ only on exact .5 ties (recomputed from src's float weights); all
 * else must be bit-identical, but for modules the family's mlx-lm
 * quant_predicate treats otherwise than the fixture: quantized by kiln, float
 * in the fixture (rule_quantized: the fixture's float must equal the
 * source's), quantized with other bits (rule_rebits), float in kiln
 * (rule_kept_float: kiln's float must equal the source's). Returns a message
 * on failure, NULL when equal. */
static const char *compare(const char *src_dir, const char *got_dir, const char *want_dir, eq_stats *es, char *msg,
                           size_t cap) {
    char pg[4096], pw[4096];
    FMT(pg, "%s/model.safetensors", got_dir);
    FMT(pw, "%s/model.safetensors", want_dir);
    kc_safetensors *g = NULL, *w = NULL;
    kc_checkpoint *src = NULL;
    kiln_status st = kc_st_open(pg, &g);
    if (!st) st = kc_st_open(pw, &w);
    if (!st) st = kc_open(src_dir, &src);
    const char *fail = NULL;
    cJSON *gcfg = NULL;
    char pc[4096];
    FMT(pc, "%s/config.json", got_dir);
    if (!st) st = ku_json_load(pc, &gcfg);
    const cJSON *qconf = gcfg ? cJSON_GetObjectItemCaseSensitive(gcfg, "quantization") : NULL;
    const cJSON *mtj = gcfg ? cJSON_GetObjectItemCaseSensitive(gcfg, "model_type") : NULL;
    const char *mt = cJSON_IsString(mtj) ? mtj->valuestring : "";
    if (st) {
        snprintf(msg, cap, "%.500s", kiln_status_msg(st));
        fail = msg;
    }
    km_hparams *hp = calloc(1, sizeof *hp);
    const km_family *fam = src ? km_family_find(kc_model_type(src)) : NULL;
    kiln_status pst = fam && hp ? km_parse(fam, kc_config(src), hp) : NULL;
    if (!fail && (!fam || !hp || pst)) {
        snprintf(msg, cap, "%.200s: cannot parse its config", src_dir);
        fail = msg;
    }
    kiln_status_free(pst);
    int rule = 0, kept = 0;
    for (int i = 0; !fail && i < kc_st_count(w); i++) {
        const kc_tensor *tw = kc_st_at(w, i);
        size_t n = strlen(tw->name);
        rule += rule_quantized(g, qconf, mt, tw);
        kept += rule_kept_float(g, hp, tw) && n > 7 && !strcmp(tw->name + n - 7, ".weight");
    }
    if (!fail && kc_st_count(g) != kc_st_count(w) + 2 * rule - 2 * kept) {
        snprintf(msg, cap, "%.200s: %d tensors, the fixture has %d (%d modules quantized by mlx-lm's rule)", got_dir,
                 kc_st_count(g), kc_st_count(w), rule);
        fail = msg;
    }
    es->rule_float += rule;
    for (int i = 0; !fail && i < kc_st_count(w); i++) {
        const kc_tensor *tw = kc_st_at(w, i), *tg = kc_st_find(g, tw->name);
        if (rule_quantized(g, qconf, mt, tw)) {
            const kc_tensor *f = kc_find(src, tw->name);
            if (!f || f->dtype != tw->dtype || f->nbytes != tw->nbytes || memcmp(f->data, tw->data, tw->nbytes)) {
                snprintf(msg, cap, "%.200s: %.200s: the fixture's float weight is not the source's", want_dir, tw->name);
                fail = msg;
            }
            continue;
        }
        if (rule_kept_float(g, hp, tw)) {
            size_t n = strlen(tw->name);
            if (n > 7 && !strcmp(tw->name + n - 7, ".weight")) {
                const kc_tensor *f = kc_find(src, tw->name);
                es->rule_float++;
                if (!f || !tg || f->dtype != tg->dtype || f->nbytes != tg->nbytes || memcmp(f->data, tg->data, f->nbytes)) {
                    snprintf(msg, cap, "%.200s: %.200s: kept float, but not the source's weight", got_dir, tw->name);
                    fail = msg;
                }
            }
            continue;
        }
        if (rule_rebits(g, qconf, tw)) {
            size_t n = strlen(tw->name);
            es->rule_float += n > 7 && !strcmp(tw->name + n - 7, ".weight");
            continue;
        }
        if (!tg || tg->dtype != tw->dtype || tg->rank != tw->rank ||
            memcmp(tg->shape, tw->shape, sizeof(int64_t) * (size_t)tw->rank)) {
            snprintf(msg, cap, "%.200s: %.200s missing or of another dtype/shape", got_dir, tw->name);
            fail = msg;
            break;
        }
        es->tensors++;
        size_t len = strlen(tw->name);
        bool qweight = tw->dtype == KC_U32 && len > 7 && !strcmp(tw->name + len - 7, ".weight");
        if (qweight) {
            /* the source row and its groups, to find ties */
            const kc_tensor *f = kc_find(src, tw->name);
            char mod[512];
            FMT(mod, "%.*s", (int)(len - 7), tw->name);
            int64_t rows = tw->shape[0], cols = f ? f->shape[1] : 0;
            int bits = cols ? (int)(tw->shape[1] * 32 / cols) : 0;
            char sname[512];
            FMT(sname, "%s.scales", mod);
            const kc_tensor *sc = kc_st_find(w, sname);
            int gs = sc && sc->shape[1] ? (int)(cols / sc->shape[1]) : 0;
            if (!f || !bits || !gs) {
                snprintf(msg, cap, "%.200s: cannot relate %.200s to its float weight", got_dir, tw->name);
                fail = msg;
                break;
            }
            float *x = malloc(sizeof(float) * (size_t)cols);
            for (int64_t r = 0; r < rows && !fail; r++) {
                kc_to_f32(f->dtype, (const char *)f->data + (size_t)(r * cols) * kc_dtype_size(f->dtype), (size_t)cols, x);
                const uint32_t *rg = (const uint32_t *)tg->data + r * tw->shape[1];
                const uint32_t *rw = (const uint32_t *)tw->data + r * tw->shape[1];
                for (int64_t c0 = 0; c0 < cols && !fail; c0 += gs) {
                    float s, b;
                    kq_affine_group(x + c0, gs, bits, &s, &b);
                    for (int64_t c = c0; c < c0 + gs; c++) {
                        float v = (x[c] - b) / s;
                        bool tie = fabsf(v - truncf(v)) == 0.5f && v > -0.5f && v < (float)((1 << bits) - 1) + 0.5f;
                        es->codes++;
                        es->ties += tie;
                        es->ties_away += tie && rintf(v) != roundf(v);
                        uint32_t a = kc_affine_code(rg, c, bits), e = kc_affine_code(rw, c, bits);
                        if (a == e) continue;
                        es->differing_codes++;
                        if (!tie || (a > e ? a - e : e - a) != 1) {
                            snprintf(msg, cap, "%.200s: %.200s[%lld][%lld]: code %u, the fixture has %u (value %.9g, not a tie)",
                                     got_dir, tw->name, (long long)r, (long long)c, a, e, v);
                            fail = msg;
                            break;
                        }
                    }
                }
            }
            free(x);
        } else if (memcmp(tg->data, tw->data, tw->nbytes)) {
            snprintf(msg, cap, "%.200s: %.200s differs from the fixture's", got_dir, tw->name);
            fail = msg;
        }
    }
    kiln_status_free(st);
    free(hp);
    cJSON_Delete(gcfg);
    kc_st_close(g);
    kc_st_close(w);
    kc_close(src);
    return fail;
}

static void run_equality(const char *root, eq_stats *es, int *bad) {
    char *dirs[256];
    int n = list_fixtures(root, dirs, 256);
    char tmp[512], out[1024], want[4096], msg[1024];
    for (int i = 0; i < n; i++) {
        for (int bits = 4; bits <= 8; bits += 4) {
            FMT(want, "%s/q%d", dirs[i], bits);
            if (!ku_dir_exists(want)) continue;
            if (!ckt_tmpdir(tmp, sizeof tmp)) continue;
            FMT(out, "%s/q", tmp);
            kq_options o = {.bits = bits, .group_size = 64};
            kiln_status st = kq_quantize(dirs[i], out, &o, NULL);
            const char *fail = st ? kiln_status_msg(st) : compare(dirs[i], out, want, es, msg, sizeof msg);
            if (fail) {
                (*bad)++;
                fprintf(stderr, "  FAIL %s: %s\n", want, fail);
            }
            es->fixtures++;
            kiln_status_free(st);
            ckt_rmdir(out);
            ckt_rmdir(tmp);
        }
        free(dirs[i]);
    }
}

KT_TEST(quant_fixture_q4_q8_equal_mlx) {
    char root[4096];
    kt_path(root, sizeof root, "tests/fixtures/oracle");
    eq_stats es = {0};
    int bad = 0;
    run_equality(root, &es, &bad);
    const char *sh = kt_shared();
    int committed = es.fixtures;
    if (sh) {
        FMT(root, "%s/oracle/fixtures", sh);
        run_equality(root, &es, &bad);
    }
    fprintf(stderr,
            "  %d q4/q8 fixtures (%d committed), %d tensors: %d codes differ; %lld of %lld codes are exact .5 ties, "
            "%lld of which half-away-from-zero rounding would change; %d modules quantized by an mlx-lm quant_predicate "
            "otherwise than the fixture\n",
            es.fixtures, committed, es.tensors, es.differing_codes, (long long)es.ties, (long long)es.codes,
            (long long)es.ties_away, es.rule_float);
    KT_CHECKF(committed >= 24, "only %d committed q4/q8 fixtures", committed);
    KT_CHECKF(bad == 0, "%d of %d fixtures differ from kiln quantize beyond .5 ties", bad, es.fixtures);
}

/* kiln quantize's output, with the fixture's q4/q8 oracle.json and
 * logits.npy copied beside it, passes the gate. */
KT_TEST(quant_fixture_output_passes_gate) {
    /* an untied head, and a tied one over the quantized embedding (the other
     * fixtures' tensors are shown equal to their q4/q8 above); ERNIE-4.5-MoE
     * with its router quantized as mlx-lm does while the fixture keeps it
     * float (both load; its router is all zeros, so both compute the same) */
    static const char *const cases[] = {"llama", "llama_rope_llama3", "ernie4_5_moe"};
    static const int case_bits[] = {4, 8, 4};
    char rel[256], src[4096], want[4096], tmp[512], out[1024];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int bits = case_bits[i];
        FMT(rel, "tests/fixtures/oracle/%s", cases[i]);
        kt_path(src, sizeof src, rel);
        FMT(want, "%s/q%d", src, bits);
        KT_CHECK(ckt_tmpdir(tmp, sizeof tmp) != NULL);
        FMT(out, "%s/q", tmp);
        kq_options o = {.bits = bits, .group_size = 64};
        KT_CHECK_OK(kq_quantize(src, out, &o, NULL));
        char from[4096];
        FMT(from, "%s/oracle.json", want);
        KT_CHECK(ckt_copy(from, out, "oracle.json"));
        FMT(from, "%s/logits.npy", want);
        KT_CHECK(ckt_copy(from, out, "logits.npy"));
        kv_options vo = {0};
        kv_result r;
        kiln_status st = kv_validate(out, &vo, &r);
        ckt_rmdir(out);
        ckt_rmdir(tmp);
        KT_CHECK_OK(st);
        KT_CHECKF(r.pass, "%s q%d: %s", cases[i], bits, r.reason);
    }
}

/* Relative quantization error of a quantized checkpoint against its source:
 * sqrt(sum ||W^ - W||_F^2 / sum ||W||_F^2) over the quantized matrices. */
static kiln_status weight_error(const char *src_dir, const char *q_dir, double *eps) {
    kc_checkpoint *a = NULL, *b = NULL;
    kiln_status st = kc_open(src_dir, &a);
    if (!st) st = kc_open(q_dir, &b);
    double num = 0, den = 0;
    for (int i = 0; !st && i < kc_tensor_count(b); i++) {
        const kc_tensor *t = kc_tensor_at(b, i);
        size_t len = strlen(t->name);
        if (len < 7 || strcmp(t->name + len - 7, ".scales")) continue;
        char mod[512];
        FMT(mod, "%.*s", (int)(len - 7), t->name);
        kc_matrix mq, mf;
        st = kc_get_matrix(b, mod, -1, -1, &mq);
        if (!st) st = kc_get_matrix(a, mod, mq.rows, mq.cols, &mf);
        float *x = st ? NULL : malloc(sizeof(float) * (size_t)mq.cols * 2);
        for (int64_t r = 0; x && r < mq.rows; r++) {
            kc_matrix_row_f32(&mq, r, x);
            kc_matrix_row_f32(&mf, r, x + mq.cols);
            for (int64_t c = 0; c < mq.cols; c++) {
                double d = (double)x[c] - x[mq.cols + c];
                num += d * d;
                den += (double)x[mq.cols + c] * x[mq.cols + c];
            }
        }
        free(x);
    }
    kc_close(a);
    kc_close(b);
    *eps = den > 0 ? sqrt(num / den) : 0;
    return st;
}

/* Teacher-forced logits of dir over ids, rows from position from on. */
static kiln_status forced_logits(const char *dir, const int32_t *ids, int n, int from, float *out, int64_t vocab) {
    ke_model *m;
    KILN_TRY(ke_model_load(dir, &m));
    ke_ctx *c = NULL;
    ke_ctx_params p = {0};
    kiln_status st = ke_ctx_create(m, &p, &c);
    int seq, sq[64];
    bool want[64];
    if (!st) st = ke_seq_open(c, &seq);
    for (int i = 0; i < n; i++) sq[i] = seq, want[i] = i >= from;
    const float *lg;
    int nr;
    if (!st) st = ke_decode(c, &(ke_batch){n, ids, sq, want}, &lg, &nr);
    if (!st) memcpy(out, lg, sizeof(float) * (size_t)nr * (size_t)vocab);
    ke_ctx_free(c);
    ke_model_free(m);
    return st;
}

/* The bound: to first order the logits move linearly with the weight
 * errors; a relative error e in each matrix perturbs that matrix's output by
 * at most e (relative), and the deepest path through the model crosses
 * 2 + 4L quantized matrices in series (embedding, per layer q/k/v then o and
 * gate/up then down, head), whose relative errors add at most linearly. So
 * |dlogits| / |logits| <= (2 + 4L) * e, with e the measured relative
 * Frobenius error of the quantized weights. (Measured on the llama fixture:
 * 3.0 to 4.3 x e at every width and recipe.)
 *
 * Quantizes src at every width and recipe, and checks the teacher-forced
 * logits over ids (rows from position from on) against ref [rows, vocab].
 * Returns 1 when all pass; prints the reason otherwise. */
static int roundtrip_within_bound(const char *src, const int32_t *ids, int n, int from, const float *ref, int64_t rows,
                                  int64_t vocab, int64_t n_layers) {
    const double bound = (double)(2 + 4 * n_layers);
    double prev_eps = 0, prev_rel = 0;
    char tmp[512], out[1024];
    float *got = malloc(sizeof(float) * (size_t)(rows * vocab));
    static const struct { int bits; const char *mixed; } cases[] = {
        {8, NULL}, {6, NULL}, {5, NULL}, {4, NULL}, {3, NULL}, {2, NULL},
        {4, "mixed_2_6"}, {4, "mixed_3_4"}, {4, "mixed_3_6"}, {4, "mixed_4_6"}};
    int ok = got != NULL;
    for (size_t k = 0; ok && k < sizeof cases / sizeof cases[0]; k++) {
        const char *what = cases[k].mixed ? cases[k].mixed : "-";
        if (!ckt_tmpdir(tmp, sizeof tmp)) {
            ok = 0;
            break;
        }
        FMT(out, "%s/q", tmp);
        kq_options o = {.bits = cases[k].bits, .group_size = 64, .mixed = cases[k].mixed};
        kiln_status st = kq_quantize(src, out, &o, NULL);
        double eps = 0;
        if (!st) st = weight_error(src, out, &eps);
        if (!st) st = forced_logits(out, ids, n, from, got, vocab);
        ckt_rmdir(out);
        ckt_rmdir(tmp);
        if (st) {
            fprintf(stderr, "  %s bits %d: %s\n", what, cases[k].bits, kiln_status_msg(st));
            kiln_status_free(st);
            ok = 0;
            break;
        }
        double dn = 0, ln = 0, dmax = 0;
        for (int64_t i = 0; i < rows * vocab; i++) {
            double d = (double)got[i] - ref[i];
            dn += d * d, ln += (double)ref[i] * ref[i];
            dmax = fmax(dmax, fabs(d));
        }
        double rel = sqrt(dn / ln);
        if (getenv("KILN_TEST_VERBOSE"))
            fprintf(stderr, "  %-10s bits %d: weight error %.5f, logits error %.5f (ratio %.2f), max |diff| %.4f\n",
                    what, cases[k].bits, eps, rel, rel / eps, dmax);
        if (!(eps > 0 && rel <= bound * eps)) {
            fprintf(stderr, "  %s bits %d: logits error %.5f above %.0f x weight error %.5f\n", what, cases[k].bits, rel,
                    bound, eps);
            ok = 0;
        }
        /* fewer bits, more error */
        if (!cases[k].mixed) {
            if (!(eps > prev_eps && rel > prev_rel)) {
                fprintf(stderr, "  bits %d: errors %.5f/%.5f not above %.5f/%.5f at more bits\n", cases[k].bits, eps,
                        rel, prev_eps, prev_rel);
                ok = 0;
            }
            prev_eps = eps, prev_rel = rel;
        }
    }
    free(got);
    return ok;
}

KT_TEST(quant_roundtrip_logits_within_error_bound) {
    char src[4096], p[4096];
    kt_path(src, sizeof src, "tests/fixtures/oracle/llama");
    float *ref = NULL;
    int64_t rows, vocab;
    FMT(p, "%s/logits.npy", src);
    KT_CHECK_OK(ku_npy_read_f32(p, &ref, &rows, &vocab));
    /* the oracle's all_ids: prompt then generated */
    cJSON *orc = NULL;
    FMT(p, "%s/oracle.json", src);
    KT_CHECK_OK(ku_json_load(p, &orc));
    int32_t ids[64];
    int n = 0, n_prompt = cJSON_GetArraySize(ku_json_get(orc, "prompt_ids"));
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(orc, "all_ids")) if (n < 64) ids[n++] = (int32_t)e->valuedouble;
    cJSON_Delete(orc);
    int ok = roundtrip_within_bound(src, ids, n, n_prompt - 1, ref, rows, vocab, 2);
    free(ref);
    KT_CHECK(ok);
}

/* The same on the bundled demo model (once it is in the tree), over the
 * first 64 tokens of its held-out text, against its own float logits. */
KT_TEST(quant_roundtrip_demo_model) {
    char src[4096], p[4096];
    kt_path(src, sizeof src, "models/kiln-demo");
    FMT(p, "%s/model.safetensors", src);
    if (!ku_file_exists(p)) {
        kt_skip("models/kiln-demo has no model.safetensors yet");
        return;
    }
    ktok *tok;
    KT_CHECK_OK(ktok_load(src, &tok));
    char *text;
    size_t len;
    FMT(p, "%s/heldout.txt", src);
    KT_CHECK_OK(ku_read_file(p, &text, &len));
    int32_t *all;
    size_t n_all;
    kiln_status st = ktok_encode(tok, text, len < 2000 ? len : 2000, true, &all, &n_all);
    free(text);
    ktok_free(tok);
    KT_CHECK_OK(st);
    int n = n_all < 64 ? (int)n_all : 64;
    ke_model *m;
    KT_CHECK_OK(ke_model_load(src, &m));
    int64_t vocab = ke_model_hparams(m)->vocab, layers = ke_model_hparams(m)->n_layers;
    ke_model_free(m);
    float *ref = malloc(sizeof(float) * (size_t)(n * vocab));
    st = forced_logits(src, all, n, 0, ref, vocab);
    int ok = !st && roundtrip_within_bound(src, all, n, 0, ref, n, vocab, layers);
    free(ref);
    free(all);
    KT_CHECK_OK(st);
    KT_CHECK(ok);
}
