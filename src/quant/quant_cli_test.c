/* kiln quantize as a command: the folder it writes (files, config, index,
 * shards) and its errors on bad input, which leave nothing behind. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "ckpt/st_writer.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "kt.h"
#include "quant/quant.h"

#define FMT(buf, ...) ((void)(snprintf(buf, sizeof buf, __VA_ARGS__) >= (int)sizeof buf && (buf[0] = 0)))

/* Runs a kiln command with stdout and stderr sent to /dev/null. */
static int run_quiet(int (*cmd)(int, char **), int argc, char **argv) {
    fflush(stdout), fflush(stderr);
    int o = dup(1), e = dup(2), null = open("/dev/null", O_WRONLY);
    dup2(null, 1), dup2(null, 2);
    int rc = cmd(argc, argv);
    fflush(stdout), fflush(stderr);
    dup2(o, 1), dup2(e, 2);
    close(o), close(e), close(null);
    return rc;
}

/* A source folder: the llama fixture plus tokenizer-side files and others. */
static int make_source(char *dir, size_t cap) {
    if (!ckt_tmpdir(dir, cap)) return 0;
    char p[4096];
    kt_path(p, sizeof p, "tests/fixtures/oracle/llama/config.json");
    if (!ckt_copy(p, dir, "config.json")) return 0;
    kt_path(p, sizeof p, "tests/fixtures/oracle/llama/model.safetensors");
    if (!ckt_copy(p, dir, "model.safetensors")) return 0;
    kt_path(p, sizeof p, "tests/fixtures/oracle/llama/generation_config.json");
    if (!ckt_copy(p, dir, "generation_config.json")) return 0;
    return ckt_write_str(dir, "tokenizer.json", "{\"model\": {}}") &&
           ckt_write_str(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}") &&
           ckt_write_str(dir, "special_tokens_map.json", "{}") && ckt_write_str(dir, "chat_template.jinja", "{{ x }}") &&
           ckt_write_str(dir, "notes.txt", "not copied") && ckt_write_str(dir, "heldout.txt", "not copied");
}

/* Entries of dir whose name contains part. */
static int count_entries(const char *dir, const char *part) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strstr(e->d_name, part)) n++;
    closedir(d);
    return n;
}

static int exists(const char *dir, const char *name) {
    char p[4096];
    FMT(p, "%s/%s", dir, name);
    struct stat sb;
    return lstat(p, &sb) == 0;
}

KT_TEST(quant_cli_writes_mlx_folder) {
    char src[512], parent[512], out[1024];
    KT_CHECK(make_source(src, sizeof src));
    KT_CHECK(ckt_tmpdir(parent, sizeof parent) != NULL);
    FMT(out, "%s/q4", parent);
    char *argv[] = {"quantize", "-m", src, "--bits", "4", "--out", out};
    KT_CHECK_EQ(run_quiet(kiln_cmd_quantize, 7, argv), 0);
    static const char *const want[] = {"model.safetensors", "model.safetensors.index.json", "config.json",
                                       "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                       "chat_template.jinja", "generation_config.json"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) KT_CHECKF(exists(out, want[i]), "%s missing", want[i]);
    KT_CHECK(!exists(out, "notes.txt") && !exists(out, "heldout.txt"));
    KT_CHECK_EQ(count_entries(parent, "kiln-tmp"), 0);
    /* config.json: mlx-lm's objects, and it still loads and runs */
    char p[4096];
    FMT(p, "%s/config.json", out);
    cJSON *c = NULL;
    KT_CHECK_OK(ku_json_load(p, &c));
    const cJSON *q = ku_json_get(c, "quantization"), *qc = ku_json_get(c, "quantization_config");
    int64_t bits = 0, gs = 0;
    const char *mode = NULL;
    kiln_status st = ku_json_int(q, "bits", 0, &bits);
    if (!st) st = ku_json_int(q, "group_size", 0, &gs);
    if (!st) st = ku_json_str(q, "mode", "", &mode);
    bool same = cJSON_Compare(q, qc, 1);
    bool ok = !st && bits == 4 && gs == 64 && !strcmp(mode, "affine") && cJSON_GetArraySize(q) == 3;
    kiln_status_free(st);
    cJSON_Delete(c);
    KT_CHECK(ok && same);
    ke_model *m;
    KT_CHECK_OK(ke_model_load(out, &m));
    ke_model_free(m);
    /* quantizing it again is refused */
    char again[1024];
    FMT(again, "%s/again", parent);
    kq_options o = {.bits = 4, .group_size = 64};
    KT_CHECK_ERR(kq_quantize(out, again, &o, NULL), "already quantized");
    KT_CHECK(!exists(parent, "again"));
    ckt_rmdir(out);
    ckt_rmdir(parent);
    ckt_rmdir(src);
}

KT_TEST(quant_mixed_recipe_overrides) {
    char src[4096], parent[512], out[1024];
    kt_path(src, sizeof src, "tests/fixtures/oracle/llama");
    KT_CHECK(ckt_tmpdir(parent, sizeof parent) != NULL);
    FMT(out, "%s/m", parent);
    kq_options o = {.bits = 4, .group_size = 64, .mixed = "mixed_3_6"};
    kq_report r;
    KT_CHECK_OK(kq_quantize(src, out, &o, &r));
    /* 2 layers: layer 1 (>= 7*2/8) gets 6 bits on v_proj and down_proj, lm_head 6, the rest 3 */
    KT_CHECK_EQ(r.bits_used[6], 3);
    KT_CHECK_EQ(r.bits_used[3], 13);
    kc_checkpoint *ck;
    KT_CHECK_OK(kc_open(out, &ck));
    static const struct { const char *module; int bits; } want[] = {
        {"model.embed_tokens", 3}, {"lm_head", 6}, {"model.layers.0.self_attn.v_proj", 3},
        {"model.layers.0.mlp.down_proj", 3}, {"model.layers.1.self_attn.v_proj", 6},
        {"model.layers.1.mlp.down_proj", 6}, {"model.layers.1.self_attn.q_proj", 3}, {"model.layers.1.mlp.up_proj", 3}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        kc_quant q = kc_quant_for(ck, want[i].module);
        kc_matrix m;
        kiln_status st = kc_get_matrix(ck, want[i].module, -1, -1, &m);
        int got_bits = st ? 0 : m.bits;
        kiln_status_free(st);
        KT_CHECKF(q.bits == want[i].bits && got_bits == want[i].bits, "%s: config %d, tensors %d bits, want %d",
                  want[i].module, q.bits, got_bits, want[i].bits);
    }
    kc_close(ck);
    ke_model *m;
    KT_CHECK_OK(ke_model_load(out, &m));
    ke_model_free(m);
    ckt_rmdir(out);
    ckt_rmdir(parent);
}

/* Tiny shards: mlx-lm's model-0000i-of-0000n names and index; the tensors
 * equal the single-file output's. */
KT_TEST(quant_sharded_output) {
    char src[4096], parent[512], one[1024], many[1024];
    kt_path(src, sizeof src, "tests/fixtures/oracle/llama");
    KT_CHECK(ckt_tmpdir(parent, sizeof parent) != NULL);
    FMT(one, "%s/one", parent);
    FMT(many, "%s/many", parent);
    kq_options o = {.bits = 8, .group_size = 64};
    KT_CHECK_OK(kq_quantize(src, one, &o, NULL));
    o.shard_bytes = 40000;
    kq_report r;
    KT_CHECK_OK(kq_quantize(src, many, &o, &r));
    KT_CHECK(r.n_files >= 3);
    char name[64];
    FMT(name, "model-00001-of-%05d.safetensors", r.n_files);
    KT_CHECK(exists(many, name) && !exists(many, "model.safetensors") && exists(many, "model.safetensors.index.json"));
    kc_checkpoint *a, *b;
    KT_CHECK_OK(kc_open(one, &a));
    KT_CHECK_OK(kc_open(many, &b));
    KT_CHECK_EQ(kc_tensor_count(a), kc_tensor_count(b));
    for (int i = 0; i < kc_tensor_count(a); i++) {
        const kc_tensor *x = kc_tensor_at(a, i), *y = kc_find(b, x->name);
        KT_CHECKF(y && y->nbytes == x->nbytes && !memcmp(x->data, y->data, x->nbytes), "%s", x->name);
    }
    kc_close(a);
    kc_close(b);
    ckt_rmdir(one);
    ckt_rmdir(many);
    ckt_rmdir(parent);
}

/* A llama folder whose matrices are [rows, 48]: nothing divides by 32/64/128. */
static int make_indivisible(char *dir, size_t cap) {
    if (!ckt_tmpdir(dir, cap)) return 0;
    static float data[48 * 48];
    kc_tensor ts[3] = {
        {.name = "model.embed_tokens.weight", .dtype = KC_F32, .rank = 2, .shape = {48, 48}, .data = data},
        {.name = "model.layers.0.self_attn.q_proj.weight", .dtype = KC_F32, .rank = 2, .shape = {48, 48}, .data = data},
        {.name = "model.norm.weight", .dtype = KC_F32, .rank = 1, .shape = {48}, .data = data},
    };
    char p[4096];
    FMT(p, "%s/model.safetensors", dir);
    kiln_status st = kc_st_write(p, ts, 3, NULL);
    kiln_status_free(st);
    return !st && ckt_write_str(dir, "config.json",
                                "{\"model_type\": \"llama\", \"hidden_size\": 48, \"num_hidden_layers\": 1, "
                                "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 48}");
}

KT_TEST(quant_bad_inputs_leave_nothing) {
    char src[4096], parent[512], out[1024], p[1024];
    kt_path(src, sizeof src, "tests/fixtures/oracle/llama");
    KT_CHECK(ckt_tmpdir(parent, sizeof parent) != NULL);
    FMT(out, "%s/q", parent);
    kq_options o = {.bits = 7, .group_size = 64};
    KT_CHECK_ERR(kq_quantize(src, out, &o, NULL), "--bits 7");
    o = (kq_options){.bits = 4, .group_size = 48};
    KT_CHECK_ERR(kq_quantize(src, out, &o, NULL), "--group-size 48");
    o = (kq_options){.bits = 4, .group_size = 64, .mixed = "mixed_9_9"};
    KT_CHECK_ERR(kq_quantize(src, out, &o, NULL), "unknown mixed recipe");
    char *argv[] = {"quantize", "-m", src, "--bits", "3", "--group-size", "256", "--out", out};
    KT_CHECK_EQ(run_quiet(kiln_cmd_quantize, 9, argv), 1);
    char *argv2[] = {"quantize", "-m", src, "--bits", "4"};
    KT_CHECK_EQ(run_quiet(kiln_cmd_quantize, 5, argv2), 1); /* no --out */
    KT_CHECK_EQ(count_entries(parent, ""), 0);
    /* an existing output folder (even empty) is never touched */
    KT_CHECK(mkdir(out, 0755) == 0);
    KT_CHECK(ckt_write_str(out, "mine.txt", "keep"));
    o = (kq_options){.bits = 4, .group_size = 64};
    KT_CHECK_ERR(kq_quantize(src, out, &o, NULL), "already exists");
    KT_CHECK_EQ(count_entries(out, ""), 1);
    ckt_rmdir(out);
    /* a missing parent, a read-only place */
    FMT(p, "%s/no/such", parent);
    KT_CHECK_ERR(kq_quantize(src, p, &o, NULL), "does not exist");
    KT_CHECK_ERR(kq_quantize(src, "/proc/kiln-quantize-test", &o, NULL), "cannot create");
    if (geteuid() != 0) { /* root ignores permissions */
        KT_CHECK(chmod(parent, 0555) == 0);
        kiln_status st = kq_quantize(src, out, &o, NULL);
        chmod(parent, 0755);
        KT_CHECK_ERR(st, "cannot create");
    }
    /* no matrix divides by the group size */
    char bad[512];
    KT_CHECK(make_indivisible(bad, sizeof bad));
    KT_CHECK_ERR(kq_quantize(bad, out, &o, NULL), "no weight can be quantized");
    ckt_rmdir(bad);
    /* unsupported family */
    char odd[512];
    KT_CHECK(ckt_tmpdir(odd, sizeof odd) != NULL);
    KT_CHECK(ckt_write_str(odd, "config.json", "{\"model_type\": \"nosuchmodel\"}"));
    KT_CHECK(make_indivisible(bad, sizeof bad));
    FMT(p, "%s/model.safetensors", bad);
    KT_CHECK(ckt_copy(p, odd, "model.safetensors"));
    ckt_rmdir(bad);
    KT_CHECK_ERR(kq_quantize(odd, out, &o, NULL), "not supported");
    ckt_rmdir(odd);
    /* failures after the temporary folder exists: each file in turn */
    for (int f = 1; f <= 3; f++) {
        o = (kq_options){.bits = 4, .group_size = 64, .fault_at = f};
        KT_CHECK_ERR(kq_quantize(src, out, &o, NULL), "injected");
    }
    KT_CHECKF(count_entries(parent, "") == 0, "%d entries left in %s", count_entries(parent, ""), parent);
    rmdir(parent);
}

/* --dtype alone converts (mlx_lm.convert --dtype without -q): bfloat16
 * equals the fixture's bf16 weights (rounded to nearest even); with --bits
 * the scales and biases take that dtype. */
KT_TEST(quant_dtype_conversion) {
    char src[4096], want[4096], parent[512], out[1024], q[1024];
    kt_path(src, sizeof src, "tests/fixtures/oracle/llama");
    kt_path(want, sizeof want, "tests/fixtures/oracle/llama/bf16");
    KT_CHECK(ckt_tmpdir(parent, sizeof parent) != NULL);
    FMT(out, "%s/bf16", parent);
    char *argv[] = {"quantize", "-m", src, "--dtype", "bfloat16", "--out", out};
    KT_CHECK_EQ(run_quiet(kiln_cmd_quantize, 7, argv), 0);
    kc_checkpoint *a, *b;
    KT_CHECK_OK(kc_open(out, &a));
    KT_CHECK_OK(kc_open(want, &b));
    KT_CHECK(!ku_json_get(kc_root_config(a), "quantization"));
    KT_CHECK_EQ(kc_tensor_count(a), kc_tensor_count(b));
    for (int i = 0; i < kc_tensor_count(b); i++) {
        const kc_tensor *y = kc_tensor_at(b, i), *x = kc_find(a, y->name);
        KT_CHECKF(x && x->dtype == KC_BF16 && x->nbytes == y->nbytes && !memcmp(x->data, y->data, y->nbytes), "%s",
                  y->name);
    }
    kc_close(a);
    kc_close(b);
    FMT(q, "%s/q4bf16", parent);
    kq_options o = {.bits = 4, .group_size = 32, .dtype = "bfloat16"};
    KT_CHECK_OK(kq_quantize(src, q, &o, NULL));
    KT_CHECK_OK(kc_open(q, &a));
    const kc_tensor *s = kc_find(a, "model.layers.0.mlp.down_proj.scales");
    KT_CHECK(s && s->dtype == KC_BF16 && s->shape[1] == 128 / 32);
    kc_close(a);
    ke_model *m;
    KT_CHECK_OK(ke_model_load(q, &m));
    ke_model_free(m);
    o = (kq_options){.bits = 4, .group_size = 64, .dtype = "float8"};
    KT_CHECK_ERR(kq_quantize(src, out, &o, NULL), "--dtype float8");
    ckt_rmdir(q);
    ckt_rmdir(out);
    ckt_rmdir(parent);
}
