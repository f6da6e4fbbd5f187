/* validate.c: the oracle gate (see validate.h). */
#include "engine/validate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/npy.h"
#include "engine/engine.h"
#include "vision/vision.h"

typedef struct {
    int32_t *prompt, *gen, *all;
    int n_prompt, n_gen, n_all;
    double *gap;
    int n_gap;
    float *logits;
    int64_t rows, cols;
    /* vision-language fixtures */
    int32_t *img_pos;           /* image_token_positions */
    int n_img;
    float *feat;                /* kiln's image features [n_img, hidden] */
    const float **embd;         /* [n_all] the feature row of each position of all_ids, or NULL */
    int32_t *span;              /* [n_all, 2] bidirectional spans (models with attn_span), or NULL */
    int32_t *pos3;              /* [n_all, 3] M-RoPE positions (kvis_mrope), or NULL */
    float *deep;                /* kiln's deepstack rows [n_img, L * hidden], or NULL */
    const float **embd_add;     /* [n_all] the deepstack row of each position, or NULL */
    const float **cross;        /* [n_all] the image's cross-attention states at its token (kvis_cross), or NULL */
    int32_t *cross_keys;        /* [n_all] the states attended from the image on */
    int32_t *types;             /* [n_all] segment ids (kvis_segments: Kosmos-2.5), or NULL */
    int32_t *pos_mask;          /* extra_inputs.image_embeds_position_mask [n_pos_mask], or NULL */
    int n_pos_mask;
} oracle;

static void oracle_free(oracle *o) {
    free(o->prompt), free(o->gen), free(o->all), free(o->gap), free(o->logits);
    free(o->img_pos), free(o->feat), free(o->embd), free(o->span), free(o->pos3), free(o->deep), free(o->embd_add), free(o->cross), free(o->cross_keys);
    free(o->types), free(o->pos_mask);
}

static kiln_status read_ids(const cJSON *j, const char *key, int32_t **out, int *n) {
    const cJSON *a = ku_json_get(j, key);
    if (!a || !cJSON_IsArray(a)) return kiln_error(KILN_EINVAL, "oracle.json: \"%s\" must be a list", key);
    *n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int32_t) * (size_t)(*n + 1));
    if (!*out) return kiln_error(KILN_ENOMEM, "out of memory");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        if (!cJSON_IsNumber(e)) return kiln_error(KILN_EINVAL, "oracle.json: \"%s\" must hold numbers", key);
        (*out)[i++] = (int32_t)e->valuedouble;
    }
    return NULL;
}

static kiln_status oracle_load(const char *dir, oracle *o) {
    memset(o, 0, sizeof *o);
    char path[4096];
    cJSON *j;
    KILN_TRY(ku_path_join(path, sizeof path, dir, "oracle.json"));
    KILN_TRY(ku_json_load(path, &j));
    kiln_status st = read_ids(j, "prompt_ids", &o->prompt, &o->n_prompt);
    if (!st) st = read_ids(j, "generated_ids", &o->gen, &o->n_gen);
    if (!st) st = read_ids(j, "all_ids", &o->all, &o->n_all);
    const cJSON *g = ku_json_get(j, "top1_top2_gap");
    if (!st && g && cJSON_IsArray(g)) {
        o->n_gap = cJSON_GetArraySize(g);
        o->gap = calloc((size_t)o->n_gap + 1, sizeof(double));
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, g) o->gap[i++] = cJSON_IsNumber(e) ? e->valuedouble : 0;
    }
    if (!st && ku_json_get(j, "image_token_positions")) st = read_ids(j, "image_token_positions", &o->img_pos, &o->n_img);
    const cJSON *extra = ku_json_get(j, "extra_inputs");
    if (!st && ku_json_get(extra, "image_embeds_position_mask")) st = read_ids(extra, "image_embeds_position_mask", &o->pos_mask, &o->n_pos_mask);
    cJSON_Delete(j);
    if (st) return kiln_status_wrap(st, "%s", dir);
    if (o->n_prompt < 1 || o->n_all != o->n_prompt + o->n_gen)
        return kiln_error(KILN_EINVAL, "%s/oracle.json: all_ids must be prompt_ids followed by generated_ids", dir);
    KILN_TRY(ku_path_join(path, sizeof path, dir, "logits.npy"));
    KILN_TRY(ku_npy_read_f32(path, &o->logits, &o->rows, &o->cols));
    if (o->rows != o->n_gen + 1)
        return kiln_error(KILN_EINVAL, "%s: logits.npy has %lld rows, want %d", path, (long long)o->rows, o->n_gen + 1);
    return NULL;
}

/* max |a - oracle row| over rows [0, n) */
static double diff_rows(const oracle *o, const float *got, int64_t row0, int64_t n) {
    double m = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t v = 0; v < o->cols; v++) {
            double d = fabs((double)got[r * o->cols + v] - o->logits[(row0 + r) * o->cols + v]);
            if (!(d <= m)) m = d; /* NaN wins */
        }
    return m;
}

static int argmax(const float *x, int64_t n) {
    int best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

static kiln_status new_ctx(const ke_model *m, const kv_options *vo, int64_t n_cache, ke_ctx **c) {
    ke_ctx_params p = {.n_ctx = 0, .n_cache = n_cache, .n_threads = vo->n_threads, .compile = vo->compile};
    return ke_ctx_create(m, &p, c);
}

/* 1: everything in one prefill, logits at positions prompt-1 .. end */
static kiln_status path_prefill(const ke_model *m, const kv_options *vo, const oracle *o, double *diff) {
    ke_ctx *c;
    KILN_TRY(new_ctx(m, vo, 0, &c));
    int seq;
    int *seqs = calloc((size_t)o->n_all, sizeof(int));
    bool *want = calloc((size_t)o->n_all, sizeof(bool));
    kiln_status st = seqs && want ? ke_seq_open(c, &seq) : kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) {
        for (int i = 0; i < o->n_all; i++) seqs[i] = seq, want[i] = i >= o->n_prompt - 1;
        const float *lg;
        int nr;
        st = ke_decode_ex(c, &(ke_batch){o->n_all, o->all, seqs, want}, &(ke_inputs){o->embd, o->span, o->pos3, o->embd_add, o->cross, o->cross_keys, o->types}, &lg, &nr);
        if (!st) *diff = diff_rows(o, lg, 0, nr);
    }
    free(seqs), free(want);
    ke_ctx_free(c);
    return st;
}

/* 2 and 4: prompt prefill, then forced (or greedy) ids one at a time */
static kiln_status path_decode(const ke_model *m, const kv_options *vo, const oracle *o, bool greedy, double *diff,
                               int32_t *ids) {
    ke_ctx *c;
    KILN_TRY(new_ctx(m, vo, 0, &c));
    int seq;
    kiln_status st = ke_seq_open(c, &seq);
    int *seqs = calloc((size_t)o->n_prompt, sizeof(int));
    if (!seqs) st = kiln_error(KILN_ENOMEM, "out of memory");
    *diff = 0;
    if (!st) {
        for (int i = 0; i < o->n_prompt; i++) seqs[i] = seq;
        const float *lg;
        int nr;
        /* the prompt's positions only: decoded tokens continue from the rope delta */
        st = ke_decode_ex(c, &(ke_batch){o->n_prompt, o->prompt, seqs, NULL}, &(ke_inputs){o->embd, o->span, o->pos3, o->embd_add, o->cross, o->cross_keys, o->types}, &lg,
                          &nr);
        for (int step = 0; !st && step <= o->n_gen; step++) {
            double d = diff_rows(o, lg, step, 1);
            if (!(d <= *diff)) *diff = d;
            if (step == o->n_gen) break;
            int32_t next = greedy ? argmax(lg, o->cols) : o->gen[step];
            if (ids) ids[step] = next;
            st = ke_decode(c, &(ke_batch){1, &next, &seq, NULL}, &lg, &nr);
        }
    }
    free(seqs);
    ke_ctx_free(c);
    return st;
}

/* 3: the fixture's sequence in chunks, alongside two other sequences */
static kiln_status path_batched(const ke_model *m, const kv_options *vo, const oracle *o, double *diff) {
    ke_ctx *c;
    int64_t vocab = o->cols;
    KILN_TRY(new_ctx(m, vo, 4 * 4096, &c));
    int sa, sb, sc;
    kiln_status st = ke_seq_open(c, &sa);
    if (!st) st = ke_seq_open(c, &sb);
    if (!st) st = ke_seq_open(c, &sc);
    /* B: a 19-token prompt fed 8 at a time, then decodes; C: 7 tokens at once, then decodes */
    int32_t other[64];
    for (int i = 0; i < 64; i++) other[i] = (int32_t)((i * 37 + 11) % vocab);
    int32_t tok[256], span[512], pos3[768];
    int seqs[256];
    bool want[256];
    const float *embd[256], *add[256], *cross[256];
    int32_t ckeys[256], types[256];
    float *got = calloc((size_t)(o->n_gen + 1) * (size_t)vocab, sizeof(float));
    if (!got && !st) st = kiln_error(KILN_ENOMEM, "out of memory");
    int a = 0, b = 0, cc = 0, have = 0;
    for (int step = 0; !st && a < o->n_all; step++) {
        int n = 0;
        /* chunks of 5, longer where a bidirectional span would be cut */
        for (int k = 0; a < o->n_all && n < 200 && (k < 5 || (o->span && o->span[2 * a - 2] <= o->span[2 * a - 1] && o->span[2 * a - 1] >= a)); k++, a++) {
            tok[n] = o->all[a], seqs[n] = sa, want[n] = a >= o->n_prompt - 1;
            embd[n] = o->embd ? o->embd[a] : NULL;
            add[n] = o->embd_add ? o->embd_add[a] : NULL;
            cross[n] = o->cross ? o->cross[a] : NULL, ckeys[n] = o->cross_keys ? o->cross_keys[a] : 0;
            types[n] = o->types ? o->types[a] : 0;
            span[2 * n] = o->span ? o->span[2 * a] : 1, span[2 * n + 1] = o->span ? o->span[2 * a + 1] : 0;
            /* M-RoPE: the prompt's positions given, the generated tokens' left to the rope delta */
            pos3[3 * n] = o->pos3 && a < o->n_prompt ? o->pos3[3 * a] : -1;
            pos3[3 * n + 1] = o->pos3 && a < o->n_prompt ? o->pos3[3 * a + 1] : -1;
            pos3[3 * n + 2] = o->pos3 && a < o->n_prompt ? o->pos3[3 * a + 2] : -1;
            n++;
        }
        int n_a = n;
        int nb = b < 19 ? 8 : 1;
        for (int k = 0; k < nb && b < 40; k++, b++) tok[n] = other[b], seqs[n] = sb, want[n] = true, n++;
        if (step >= 1 && cc < 30) {
            int nc = cc == 0 ? 7 : 1;
            for (int k = 0; k < nc; k++, cc++) tok[n] = other[63 - cc], seqs[n] = sc, want[n] = k == nc - 1, n++;
        }
        for (int i = n_a; i < n; i++) embd[i] = add[i] = cross[i] = NULL, ckeys[i] = 0, types[i] = 0, span[2 * i] = 1, span[2 * i + 1] = 0, pos3[3 * i] = -1;
        const float *lg;
        int nr;
        st = ke_decode_ex(c, &(ke_batch){n, tok, seqs, want},
                          o->embd ? &(ke_inputs){embd, o->span ? span : NULL, o->pos3 ? pos3 : NULL, o->embd_add ? add : NULL,
                                                 o->cross ? cross : NULL, ckeys, o->types ? types : NULL} : NULL, &lg,
                          &nr);
        int r = 0;
        for (int i = 0; !st && i < n; i++) {
            if (!want[i]) continue;
            if (seqs[i] == sa) memcpy(got + (int64_t)have++ * vocab, lg + (int64_t)r * vocab, sizeof(float) * (size_t)vocab);
            r++;
        }
    }
    if (!st) *diff = diff_rows(o, got, 0, have);
    if (!st && have != o->n_gen + 1) st = kiln_error(KILN_EINTERNAL, "batched path produced %d rows", have);
    free(got);
    ke_ctx_free(c);
    return st;
}

/* An array file of the fixture: in dir, else in its parent (a q4/ variant
 * shares its parent's image and pixel values). */
static kiln_status fixture_file(const char *dir, const char *name, char *path, size_t cap) {
    KILN_TRY(ku_path_join(path, cap, dir, name));
    if (ku_file_exists(path)) return NULL;
    char parent[4096];
    KILN_TRY(ku_path_join(parent, sizeof parent, dir, ".."));
    KILN_TRY(ku_path_join(path, cap, parent, name));
    if (ku_file_exists(path)) return NULL;
    return kiln_error(KILN_ENOTFOUND, "%s: no %s (nor in its parent folder)", dir, name);
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

/* oracle.json's special_tokens: an object, or its Python repr as a string. */
static cJSON *special_tokens(const cJSON *j) {
    const cJSON *sp = ku_json_get(j, "special_tokens");
    if (cJSON_IsObject(sp)) return cJSON_Duplicate(sp, 1);
    if (!cJSON_IsString(sp)) return NULL;
    char *t = strdup(sp->valuestring);
    if (!t) return NULL;
    for (char *c = t; *c; c++)
        if (*c == '\'') *c = '"';
    cJSON *o = cJSON_Parse(t);
    free(t);
    return o;
}

/* prompt_text (<tN> for id N, special strings by special_tokens) with the
 * image placeholder expanded by kiln (px: kiln's own preprocessing of
 * image.png) against prompt_ids, as the family's processor expanded it. */
static kiln_status expansion_check(const kvis_model *vm, const kvis_pixels *px, const char *odir, int32_t bos, const oracle *o,
                                   kv_result *r) {
    char path[4096];
    cJSON *j;
    KILN_TRY(ku_path_join(path, sizeof path, odir, "oracle.json"));
    KILN_TRY(ku_json_load(path, &j));
    const cJSON *pt = ku_json_get(j, "prompt_text");
    cJSON *sp = special_tokens(j), *pc = NULL;
    /* the processor's placeholder text (processor_config.json's image_token)
     * is the id kiln expands: the folders have no tokenizer.json to say */
    const char *ph = NULL;
    if (!ku_path_join(path, sizeof path, odir, "processor_config.json") && ku_file_exists(path) && !ku_json_load(path, &pc)) {
        const cJSON *it = ku_json_get(pc, "image_token");
        if (cJSON_IsString(it)) ph = it->valuestring;
    }
    kiln_status st = NULL;
    int n = 0, n_out = 0;
    int32_t *ids = NULL, *out = NULL;
    if (cJSON_IsString(pt) && !(ids = malloc(sizeof(int32_t) * (strlen(pt->valuestring) + 1)))) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (const char *c = ids ? pt->valuestring : ""; !st && *c;) {
        int id, len = 0;
        if (sscanf(c, "<t%d>%n", &id, &len) == 1 && len > 0) {
            ids[n++] = id, c += len;
            continue;
        }
        if (ph && ph[0] && !strncmp(c, ph, strlen(ph))) {
            ids[n++] = kvis_placeholder_token(vm), c += strlen(ph);
            continue;
        }
        const cJSON *e, *best = NULL;
        cJSON_ArrayForEach(e, sp) /* the longest special string here */
            if (cJSON_IsNumber(e) && !strncmp(c, e->string, strlen(e->string)) && (!best || strlen(e->string) > strlen(best->string))) best = e;
        if (!best) st = kiln_error(KILN_EINVAL, "%s: prompt_text: no special token at \"%.20s\"", path, c);
        else ids[n++] = (int32_t)best->valuedouble, c += strlen(best->string);
    }
    r->prompt_diff_at = -1;
    if (!st && ids) st = kvis_expand_prompt(vm, px, ids, n, bos, &out, &n_out);
    if (!st && ids) {
        r->prompt_checked = true;
        int i = 0;
        while (i < n_out && i < o->n_prompt && out[i] == o->prompt[i]) i++;
        if (i < n_out || i < o->n_prompt) r->prompt_diff_at = i;
    }
    free(ids), free(out);
    cJSON_Delete(sp), cJSON_Delete(pc);
    cJSON_Delete(j);
    return st;
}

/* The vision stages: preprocessing image.png against pixel_values.npy, the
 * tower on pixel_values.npy against image_features.npy; then the feature rows
 * for the image positions of all_ids. */
static kiln_status vision_stages(const char *dir, const char *odir, const ke_model *m, const kv_options *vo, oracle *o,
                                 kv_result *r) {
    kvis_model *vm = ke_model_vision(m);
    char path[4096];
    float *pv = NULL, *ref = NULL;
    int rank;
    int64_t shape[KU_NPY_MAX_RANK], rows, cols;
    kiln_status absent = fixture_file(dir, "flattened_patches.npy", path, sizeof path);
    bool flat = !absent;
    kiln_status_free(absent);
    if (!flat) KILN_TRY(fixture_file(dir, "pixel_values.npy", path, sizeof path));
    KILN_TRY(ku_npy_read_f32_nd(path, &pv, &rank, shape, &rows, &cols));
    kiln_status st = NULL;
    kvis_pixels px = {.data = pv, .c = 3, .h = rank >= 3 ? shape[rank - 2] : 0, .w = shape[rank - 1], .n = 1};
    if (flat) { /* Pix2Struct (Kosmos-2.5): [1, max_patches, 2 + 3 P P], the resized image's size from height.npy / width.npy */
        const char *dims[2] = {"height.npy", "width.npy"};
        int64_t hw[2] = {0, 0};
        for (int i = 0; i < 2 && !st; i++) {
            float *d = NULL;
            int64_t dr, dc;
            st = fixture_file(dir, dims[i], path, sizeof path);
            if (!st) st = ku_npy_read_f32(path, &d, &dr, &dc);
            if (!st && dr * dc != 1) st = kiln_error(KILN_EUNSUPPORTED, "%s: one image expected", path);
            if (!st) hw[i] = (int64_t)d[0];
            free(d);
        }
        px.h = hw[0], px.w = hw[1], px.flat_rows = rows;
    } else if (kvis_mrope(vm)) { /* Qwen-VL: flattened patches [N, 3 * T * P * P], the image's size from image_grid_thw */
        float *grid = NULL;
        int64_t gr, gc, P = 0;
        st = fixture_file(dir, "image_grid_thw.npy", path, sizeof path);
        if (!st) st = ku_npy_read_f32(path, &grid, &gr, &gc);
        if (!st && (gr != 1 || gc != 3 || grid[0] != 1))
            st = kiln_error(KILN_EUNSUPPORTED, "%s: one still image (grid t = 1) expected", path);
        if (!st) {
            for (P = 1; P * P * 6 < cols; P++) {}
            px.h = (int64_t)grid[1] * P, px.w = (int64_t)grid[2] * P;
            if (rank != 2 || (int64_t)grid[1] * (int64_t)grid[2] != rows)
                st = kiln_error(KILN_EINVAL, "%s: pixel_values [%lld, %lld] for grid %gx%g", path, (long long)rows, (long long)cols, grid[1], grid[2]);
        }
        free(grid);
    } else if (rank < 3 || shape[rank - 3] != 3 || (rows * cols) % (3 * px.h * px.w))
        st = kiln_error(KILN_EUNSUPPORTED, "%s: pixel_values of %d dims (one image's crops [.., 3, H, W] expected)", path, rank);
    else
        px.n = rows * cols / (3 * px.h * px.w); /* [1, crops, 3, H, W], [crops, 3, H, W] or [1, 3, H, W] */
    absent = st ? NULL : fixture_file(dir, "aspect_ratio_ids.npy", path, sizeof path);
    bool have = !st && !absent;
    kiln_status_free(absent);
    if (have) { /* Mllama: the tile canvas */
        float *ar = NULL;
        int64_t ar_r, ar_c;
        st = ku_npy_read_f32(path, &ar, &ar_r, &ar_c);
        if (!st && ar_r * ar_c != 1) st = kiln_error(KILN_EUNSUPPORTED, "%s: one image expected", path);
        if (!st) st = kvis_pixels_aspect(vm, (int64_t)ar[0], &px);
        free(ar);
    }
    absent = st ? NULL : fixture_file(dir, "image_sizes.npy", path, sizeof path);
    have = !st && !absent;
    kiln_status_free(absent);
    if (have) { /* the image's size: LLaVA-NeXT's tile grid and unpadding */
        float *sz = NULL;
        int64_t sr, sc;
        st = ku_npy_read_f32(path, &sz, &sr, &sc);
        if (!st && sr * sc == 2) st = kvis_pixels_layout(vm, (int64_t)sz[0], (int64_t)sz[1], &px);
        free(sz);
    }
    /* 1: preprocessing (and the prompt expansion of that image) */
    r->diff_pixels = -1;
    r->prompt_diff_at = -1;
    kimg_image im = {0};
    absent = st ? NULL : fixture_file(dir, "image.png", path, sizeof path);
    have = !st && !absent;
    kiln_status_free(absent);
    if (have) {
        kvis_pixels mine;
        st = kimg_load_png(path, &im);
        if (!st) st = kvis_pixels_from_image(vm, &im, &mine);
        if (!st) {
            bool same = mine.h == px.h && mine.w == px.w && (mine.n > 0 ? mine.n : 1) == px.n && mine.flat_rows == px.flat_rows &&
                        (!kvis_cross(vm) || (mine.rows == px.rows && mine.cols == px.cols));
            r->diff_pixels = same ? max_diff(mine.data, pv, rows * cols) : INFINITY;
            st = expansion_check(vm, &mine, odir, kc_bos_id(ke_model_checkpoint(m)), o, r);
            kvis_pixels_free(&mine);
        }
        kimg_free(&im);
    }
    /* 2: tower + projector */
    int64_t n_tok = 0, E = ke_model_hparams(m)->hidden;
    int64_t L = kvis_deepstack_layers(vm);
    if (!st) st = kvis_encode(vm, &px, vo->n_threads, &o->feat, &o->deep, &n_tok);
    if (!st) st = ku_path_join(path, sizeof path, odir, "image_features.npy");
    if (!st) st = ku_npy_read_f32(path, &ref, &rows, &cols);
    if (!st && (rows != n_tok || cols != E))
        st = kiln_error(KILN_EINVAL, "%s: [%lld, %lld], kiln's features [%lld, %lld]", path, (long long)rows, (long long)cols,
                        (long long)n_tok, (long long)E);
    if (!st) r->diff_features = max_diff(o->feat, ref, n_tok * E);
    if (!st && L > 0) { /* deepstack_features.npy [L, n_tok, E]; kiln's rows [n_tok, L * E] */
        float *dref = NULL;
        int drank;
        int64_t dshape[KU_NPY_MAX_RANK], dr, dc;
        st = fixture_file(odir, "deepstack_features.npy", path, sizeof path);
        if (!st) st = ku_npy_read_f32_nd(path, &dref, &drank, dshape, &dr, &dc);
        if (!st && (dr != L * n_tok || dc != E))
            st = kiln_error(KILN_EINVAL, "%s: not %lld layers of [%lld, %lld]", path, (long long)L, (long long)n_tok, (long long)E);
        for (int64_t l = 0; !st && l < L; l++)
            for (int64_t t = 0; t < n_tok; t++) {
                double d = max_diff(o->deep + (t * L + l) * E, dref + (l * n_tok + t) * E, E);
                if (!(d <= r->diff_features)) r->diff_features = d;
            }
        free(dref);
    }
    if (!st && kvis_cross(vm)) { /* Mllama: the states enter at the image token; its embedding stays */
        if (o->n_img != 1) st = kiln_error(KILN_EUNSUPPORTED, "%s: %d image positions (one image expected)", odir, o->n_img);
        else if (!(o->embd = calloc((size_t)o->n_all, sizeof *o->embd)) || !(o->cross = calloc((size_t)o->n_all, sizeof *o->cross)) ||
                 !(o->cross_keys = calloc((size_t)o->n_all, sizeof *o->cross_keys)))
            st = kiln_error(KILN_ENOMEM, "out of memory");
        else if (o->img_pos[0] < 0 || o->img_pos[0] >= o->n_prompt || o->all[o->img_pos[0]] != kvis_image_token(vm))
            st = kiln_error(KILN_EINVAL, "%s: image position %d does not hold the image token %d", odir, o->img_pos[0], kvis_image_token(vm));
        else o->cross[o->img_pos[0]] = o->feat, o->cross_keys[o->img_pos[0]] = kvis_cross_keys(vm, &px);
        free(pv), free(ref);
        return st;
    }
    if (!st && n_tok != o->n_img)
        st = kiln_error(KILN_EINVAL, "%s: %d image positions for %lld feature rows", odir, o->n_img, (long long)n_tok);
    /* 3: the rows that replace the placeholders */
    if (!st && !(o->embd = calloc((size_t)o->n_all, sizeof *o->embd))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st && ke_model_hparams(m)->attn_span) {
        if (!(o->span = malloc(sizeof(int32_t) * 2 * (size_t)o->n_all))) st = kiln_error(KILN_ENOMEM, "out of memory");
        else kvis_spans(vm, o->all, o->n_prompt, o->n_all, o->span);
    }
    if (!st && L > 0 && !(o->embd_add = calloc((size_t)o->n_all, sizeof *o->embd_add))) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; !st && i < o->n_img; i++) {
        if (o->img_pos[i] < 0 || o->img_pos[i] >= o->n_prompt) st = kiln_error(KILN_EINVAL, "%s: image position %d", odir, o->img_pos[i]);
        else if (o->all[o->img_pos[i]] != kvis_image_token(vm)) /* kiln's positions and spans find the image by its token */
            st = kiln_error(KILN_EINVAL, "%s: the prompt has id %d at image position %d, kiln's image token is %d", odir,
                            o->all[o->img_pos[i]], o->img_pos[i], kvis_image_token(vm));
        else o->embd[o->img_pos[i]] = o->feat + (int64_t)i * E;
        if (!st && L > 0) o->embd_add[o->img_pos[i]] = o->deep + (int64_t)i * L * E;
    }
    if (!st && kvis_segments(vm)) { /* kiln's segment ids, checked against the processor's image_embeds_position_mask */
        if (!(o->types = malloc(sizeof(int32_t) * (size_t)o->n_all))) st = kiln_error(KILN_ENOMEM, "out of memory");
        else kvis_types(vm, o->all, o->n_prompt, o->n_all, o->types);
        for (int i = 0; !st && o->pos_mask && i < o->n_pos_mask && i < o->n_all; i++)
            if (o->types[i] != (o->pos_mask[i] != 0))
                st = kiln_error(KILN_EINVAL, "%s: kiln's segment id %d at position %d, image_embeds_position_mask %d", odir, o->types[i], i,
                                o->pos_mask[i]);
    }
    if (!st && kvis_mrope(vm)) { /* positions of all_ids as get_rope_index gives them */
        if (!(o->pos3 = malloc(sizeof(int32_t) * 3 * (size_t)o->n_all))) st = kiln_error(KILN_ENOMEM, "out of memory");
        else st = kvis_positions(vm, &px, 1, o->all, o->n_all, o->pos3);
    }
    free(pv), free(ref);
    return st;
}

kiln_status kv_validate(const char *dir, const kv_options *vo, kv_result *r) {
    memset(r, 0, sizeof *r);
    kv_options o = *vo;
    if (o.tolerance <= 0) o.tolerance = 1e-3;
    oracle orc;
    kiln_status st = oracle_load(o.oracle_dir ? o.oracle_dir : dir, &orc);
    ke_model *m = NULL;
    if (!st) st = ke_model_load(dir, &m);
    if (!st && ke_model_hparams(m)->vocab != orc.cols)
        st = kiln_error(KILN_EINVAL, "%s: logits.npy has %lld columns, the model's vocabulary %lld", dir, (long long)orc.cols,
                        (long long)ke_model_hparams(m)->vocab);
    int32_t *ids = calloc((size_t)orc.n_gen + 1, sizeof(int32_t));
    if (!st && !ids) st = kiln_error(KILN_ENOMEM, "out of memory");
    double dg = 0;
    r->vision = !st && ke_model_vision(m) != NULL;
    if (r->vision) st = vision_stages(dir, o.oracle_dir ? o.oracle_dir : dir, m, &o, &orc, r);
    if (!st) st = path_prefill(m, &o, &orc, &r->diff_prefill);
    if (!st) st = path_decode(m, &o, &orc, false, &r->diff_decode, NULL);
    if (!st && !o.skip_batched) st = path_batched(m, &o, &orc, &r->diff_batched);
    if (!st) st = path_decode(m, &o, &orc, true, &dg, ids);
    if (!st) {
        r->greedy_total = orc.n_gen;
        r->first_tie = orc.n_gen;
        for (int i = 0; i < orc.n_gap && i < orc.n_gen; i++)
            if (orc.gap[i] < o.tolerance) {
                r->first_tie = i;
                break;
            }
        int i = 0;
        while (i < orc.n_gen && ids[i] == orc.gen[i]) i++;
        r->greedy_ok = i;
        double worst = r->diff_prefill;
        if (r->diff_decode > worst || r->diff_decode != r->diff_decode) worst = r->diff_decode;
        if (r->diff_batched > worst || r->diff_batched != r->diff_batched) worst = r->diff_batched;
        r->pass = true;
        if (r->vision && !(r->diff_pixels <= 1e-5)) { /* -1: no image.png to check */
            r->pass = false;
            snprintf(r->reason, sizeof r->reason, "preprocessed pixels differ by %.3g (tolerance 1e-5)", r->diff_pixels);
        } else if (r->vision && r->prompt_diff_at >= 0) {
            r->pass = false;
            snprintf(r->reason, sizeof r->reason, "kiln's prompt expansion differs from prompt_ids at position %d", r->prompt_diff_at);
        } else if (r->vision && !(r->diff_features <= 1e-4)) {
            r->pass = false;
            snprintf(r->reason, sizeof r->reason, "image features differ by %.3g (tolerance 1e-4)", r->diff_features);
        } else if (!(worst <= o.tolerance)) {
            r->pass = false;
            snprintf(r->reason, sizeof r->reason, "logits differ by %.3g (tolerance %.3g)", worst, o.tolerance);
        } else if (i < orc.n_gen && i < r->first_tie) {
            r->pass = false;
            snprintf(r->reason, sizeof r->reason, "greedy id %d at step %d, oracle %d (no near-tie before it)", ids[i], i,
                     orc.gen[i]);
        }
    }
    free(ids);
    ke_model_free(m);
    oracle_free(&orc);
    return st;
}
