/* Every checkpoint of ../shared/oracle opens; quantized and bf16 variants
 * agree with their float32 parent. Skipped when ../shared is absent. */
#include "ckpt/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/half.h"
#include "ckpt/affine.h"
#include "kt.h"

typedef struct {
    int folders, tensors, matrices;
    double worst_q_ratio; /* max |dequantized - f32| / |scale| over q4/q8: < 1 (MLX clips one group end) */
    char worst_where[256];
} fx_stats;

static kiln_status check_variant(const kc_checkpoint *parent, const kc_checkpoint *v, const char *variant,
                                 fx_stats *stats, char *why, size_t cap) {
    float *row = NULL, *ref = NULL;
    size_t rcap = 0;
    for (int i = 0; i < kc_tensor_count(v); i++) {
        const kc_tensor *t = kc_tensor_at(v, i);
        char module[512];
        size_t nl = strlen(t->name);
        int quant = nl > 7 && strcmp(t->name + nl - 7, ".scales") == 0;
        int bf16 = strcmp(variant, "bf16") == 0 && t->rank == 2 && nl > 7 && strcmp(t->name + nl - 7, ".weight") == 0;
        if (!quant && !bf16) continue;
        snprintf(module, sizeof module, "%.*s", (int)(nl - 7), t->name);
        char wn[600];
        snprintf(wn, sizeof wn, "%s.weight", module);
        const kc_tensor *pw = kc_find(parent, wn);
        int64_t rows = pw && pw->rank == 2 ? pw->shape[0] : -1, cols = pw && pw->rank == 2 ? pw->shape[1] : -1;
        kc_matrix m, pm;
        KILN_TRY(kc_get_matrix(v, module, rows, cols, &m));
        stats->matrices++;
        if (rows < 0) continue; /* no float parent (e.g. a head tied in the parent only) */
        KILN_TRY(kc_get_matrix(parent, module, rows, cols, &pm));
        if ((size_t)cols > rcap) {
            rcap = (size_t)cols;
            free(row);
            free(ref);
            row = malloc(rcap * sizeof *row);
            ref = malloc(rcap * sizeof *ref);
        }
        for (int64_t r = 0; r < rows; r++) {
            kc_matrix_row_f32(&m, r, row);
            kc_matrix_row_f32(&pm, r, ref);
            for (int64_t k = 0; k < cols; k++) {
                if (bf16) {
                    float want = ku_bf16_to_f32(ku_f32_to_bf16(ref[k]));
                    if (row[k] != want) {
                        snprintf(why, cap, "%.300s[%lld,%lld] = %g, want bf16(%g) = %g", wn, (long long)r, (long long)k,
                                 row[k], ref[k], want);
                        goto fail;
                    }
                    continue;
                }
                int64_t g = r * (m.cols / m.group_size) + k / m.group_size;
                float s = kc_load_f32(m.sb_dtype, m.scales, g), b = kc_load_f32(m.sb_dtype, m.biases, g);
                double ratio = fabs((double)row[k] - ref[k]) / (s != 0 ? fabs(s) : 1e-30);
                if (ratio > stats->worst_q_ratio) {
                    stats->worst_q_ratio = ratio;
                    snprintf(stats->worst_where, sizeof stats->worst_where, "%s/%.200s [%lld,%lld]", variant, wn,
                             (long long)r, (long long)k);
                }
                /* The code behind row[k] must be the level nearest to the weight
                 * within [0, 2^bits-1]: MLX makes one group edge exact, so the
                 * other end may clip and err by up to a whole step. */
                double top = (double)((1 << m.bits) - 1), code = s != 0 ? round(((double)row[k] - b) / s) : 0;
                double ideal = s != 0 ? ((double)ref[k] - b) / s : 0;
                ideal = ideal < 0 ? 0 : ideal > top ? top : ideal;
                if (code < 0 || code > top || fabs(code - ideal) > 0.5 + 1e-3) {
                    snprintf(why, cap, "%.300s[%lld,%lld] = %g (code %g), f32 parent %g (level %g): not the nearest level",
                             wn, (long long)r, (long long)k, row[k], code, ref[k], ideal);
                    goto fail;
                }
            }
        }
    }
    free(row);
    free(ref);
    return NULL;
fail:
    free(row);
    free(ref);
    return kiln_error(KILN_EINVAL, "%s", why);
}

static void check_case(const char *dir, fx_stats *stats) {
    kc_checkpoint *parent;
    kiln_status st = kc_open(dir, &parent);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
        return;
    }
    stats->folders++;
    stats->tensors += kc_tensor_count(parent);
    static const char *const variants[] = {"bf16", "q8", "q4"};
    for (int i = 0; i < 3; i++) {
        char vd[8300];
        snprintf(vd, sizeof vd, "%s/%s", dir, variants[i]);
        if (!ku_dir_exists(vd)) continue;
        kc_checkpoint *v;
        if ((st = kc_open(vd, &v))) break;
        stats->folders++;
        stats->tensors += kc_tensor_count(v);
        char why[512] = "";
        st = check_variant(parent, v, variants[i], stats, why, sizeof why);
        st = kiln_status_wrap(st, "%s", vd);
        kc_close(v);
        if (st) break;
    }
    kc_close(parent);
    if (st) {
        kt_fail(__FILE__, __LINE__, "%s", kiln_status_msg(st));
        kiln_status_free(st);
    }
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

KT_TEST(ckpt_every_oracle_fixture_opens_and_dequantizes) {
    const char *shared = kt_shared();
    if (!shared) {
        kt_skip("../shared absent");
        return;
    }
    static const char *const roots[] = {"oracle/fixtures", "oracle/fixtures-remote", "oracle/fixtures-vlm"};
    fx_stats stats = {0};
    for (int r = 0; r < 3; r++) {
        char root[4096];
        snprintf(root, sizeof root, "%s/%s", shared, roots[r]);
        DIR *d = opendir(root);
        if (!d) continue;
        char *names[512];
        int n = 0;
        struct dirent *de;
        while ((de = readdir(d)) && n < 512) {
            char p[8192];
            snprintf(p, sizeof p, "%s/%s/config.json", root, de->d_name);
            if (de->d_name[0] != '.' && ku_file_exists(p)) names[n++] = strdup(de->d_name);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_name);
        for (int i = 0; i < n; i++) {
            char p[8192];
            snprintf(p, sizeof p, "%s/%s", root, names[i]);
            check_case(p, &stats);
            free(names[i]);
        }
    }
    if (stats.folders == 0) {
        kt_skip("no fixtures under %s/oracle", shared);
        return;
    }
    printf("     %d checkpoints, %d tensors, %d quantized/bf16 matrices; worst |deq-f32|/scale %.4f at %s\n",
           stats.folders, stats.tensors, stats.matrices, stats.worst_q_ratio, stats.worst_where);
}
