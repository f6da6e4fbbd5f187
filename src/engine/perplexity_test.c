/* kiln perplexity checked against a direct computation from
 * `kiln generate --prompt-ids ... --force-ids ... --logits-out`, on the
 * llama oracle fixture with a byte-level tokenizer made here (one token per
 * byte, BOS "<s>" added by the post-processor). */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "base/npy.h"
#include "ckpt/ckpt_test.h"
#include "cli/cli.h"
#include "engine/perplexity.h"
#include "kt.h"
#include "tokenizer/tokenizer.h"

#define FMT(buf, ...) ((void)(snprintf(buf, sizeof buf, __VA_ARGS__) >= (int)sizeof buf && (buf[0] = 0)))

enum { BOS = 256 };

/* GPT-2's byte-to-character map (bytes_to_unicode) as UTF-8, into out[4]. */
static void byte_char(int b, char *out) {
    int cp = b;
    bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xc0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

static int write_tokenizer(const char *dir) {
    cJSON *vocab = cJSON_CreateObject();
    char ch[4];
    for (int b = 0; b < 256; b++) {
        byte_char(b, ch);
        cJSON_AddNumberToObject(vocab, ch, b);
    }
    cJSON_AddNumberToObject(vocab, "<s>", BOS);
    char *v = cJSON_PrintUnformatted(vocab);
    cJSON_Delete(vocab);
    char *json = malloc(strlen(v) + 2048);
    sprintf(json,
            "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": %d, \"content\": \"<s>\", \"single_word\": false, "
            "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": true}], \"normalizer\": null, "
            "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
            "\"use_regex\": true}, \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
            "{\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": "
            "[{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
            "\"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [%d], \"tokens\": [\"<s>\"]}}}, \"decoder\": "
            "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, \"use_regex\": true}, "
            "\"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
            "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"vocab\": %s, \"merges\": []}}",
            BOS, BOS, v);
    int ok = ckt_write_str(dir, "tokenizer.json", json) &&
             ckt_write_str(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\", \"add_bos_token\": true}");
    free(v), free(json);
    return ok;
}

/* 64 bytes: 65 tokens with BOS, 4 chunks of 16 */
static const char TEXT[] = "The quick brown fox jumps over the lazy dog; all that glitters!!";

/* A model folder (the llama fixture + the byte tokenizer) and the text file. */
static int setup(char *dir, size_t cap, char *text_path, size_t tcap) {
    if (!ckt_tmpdir(dir, cap)) return 0;
    char p[4096];
    kt_path(p, sizeof p, "tests/fixtures/oracle/llama/config.json");
    if (!ckt_copy(p, dir, "config.json")) return 0;
    kt_path(p, sizeof p, "tests/fixtures/oracle/llama/model.safetensors");
    if (!ckt_copy(p, dir, "model.safetensors")) return 0;
    if (!write_tokenizer(dir) || !ckt_write_str(dir, "text.txt", TEXT)) return 0;
    return snprintf(text_path, tcap, "%s/text.txt", dir) < (int)tcap;
}

/* Runs a kiln command with stdout into out_path and stderr to /dev/null. */
static int run_to(int (*cmd)(int, char **), int argc, char **argv, const char *out_path) {
    fflush(stdout), fflush(stderr);
    int o = dup(1), e = dup(2), f = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644), null = open("/dev/null", O_WRONLY);
    dup2(f, 1), dup2(null, 2);
    int rc = cmd(argc, argv);
    fflush(stdout), fflush(stderr);
    dup2(o, 1), dup2(e, 2);
    close(o), close(e), close(f), close(null);
    return rc;
}

/* The id list "a,b,c" of ids[0..n). */
static void ids_str(const int32_t *ids, int n, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? "," : "", ids[i]);
}

/* -log softmax in double, written independently of ke_ppl_nll */
static double nll_direct(const float *l, int64_t vocab, int32_t tok) {
    double m = l[0], s = 0;
    for (int64_t i = 1; i < vocab; i++) m = fmax(m, l[i]);
    for (int64_t i = 0; i < vocab; i++) s += exp((double)l[i] - m);
    return -((double)l[tok] - m - log(s));
}

/* PPL and its standard error by llama.cpp's formula from nll values. */
static void ppl_of(const double *v, int n, double *ppl, double *se) {
    double a = 0, b = 0;
    for (int i = 0; i < n; i++) a += v[i], b += v[i] * v[i];
    a /= n, b /= n;
    *ppl = exp(a);
    *se = sqrt((b - a * a) / (n - 1)) * *ppl;
}

/* Runs kiln perplexity with extra flags; returns the parsed JSON's ppl and se. */
static int cli_ppl(const char *dir, const char *text, const char *scratch, const char *ctx, const char *extra_flag,
                   const char *extra_val, double *ppl, double *se, int64_t *scored) {
    char *argv[12] = {"perplexity", "-m", (char *)dir, "-f", (char *)text, "--ctx", (char *)ctx, "--json"};
    int argc = 8;
    if (extra_flag) argv[argc++] = (char *)extra_flag, argv[argc++] = (char *)extra_val;
    if (run_to(kiln_cmd_perplexity, argc, argv, scratch) != 0) return 0;
    cJSON *j = NULL;
    kiln_status st = ku_json_load(scratch, &j);
    if (!st) st = ku_json_num(j, "ppl", 0, ppl);
    if (!st) st = ku_json_num(j, "ppl_se", 0, se);
    if (!st) st = ku_json_int(j, "n_scored", 0, scored);
    cJSON_Delete(j);
    int ok = !st;
    kiln_status_free(st);
    return ok;
}

KT_TEST(perplexity_matches_generate_logits) {
    char dir[512], text[1024], scratch[1024], npy[1024];
    KT_CHECK(setup(dir, sizeof dir, text, sizeof text));
    FMT(scratch, "%s/out.json", dir);
    FMT(npy, "%s/l.npy", dir);
    ktok *tok;
    KT_CHECK_OK(ktok_load(dir, &tok));
    int32_t *ids;
    size_t n;
    KT_CHECK_OK(ktok_encode(tok, TEXT, strlen(TEXT), true, &ids, &n));
    ktok_free(tok);
    KT_CHECK(n == strlen(TEXT) + 1 && ids[0] == BOS);

    enum { C = 16 };
    double vals[512];
    char pids[1024], fids[1024];
    /* default mode: chunks of C, first token BOS, the second half scored */
    int nv = 0, first = C / 2;
    for (int64_t k = 0; k + C <= (int64_t)n; k += C) {
        int32_t chunk[C];
        memcpy(chunk, ids + k, sizeof chunk);
        chunk[0] = BOS;
        ids_str(chunk, first + 1, pids, sizeof pids);
        ids_str(chunk + first + 1, C - 1 - first, fids, sizeof fids);
        char *argv[] = {"generate", "-m", dir, "--prompt-ids", pids, "--force-ids", fids, "--logits-out", npy};
        KT_CHECK_EQ(run_to(kiln_cmd_generate, 9, argv, scratch), 0);
        float *l;
        int64_t rows, vocab;
        KT_CHECK_OK(ku_npy_read_f32(npy, &l, &rows, &vocab));
        KT_CHECK_EQ(rows, C - first);
        for (int j = 0; j < C - 1 - first; j++) vals[nv++] = nll_direct(l + (int64_t)j * vocab, vocab, chunk[first + 1 + j]);
        free(l);
    }
    double want, want_se, got, got_se;
    int64_t scored;
    ppl_of(vals, nv, &want, &want_se);
    KT_CHECK(cli_ppl(dir, text, scratch, "16", NULL, NULL, &got, &got_se, &scored));
    KT_CHECK_EQ(scored, nv);
    KT_CHECK_NEAR(got / want, 1.0, 1e-5);
    KT_CHECK_NEAR(got_se / want_se, 1.0, 1e-4);
    /* the same chunks two at a time in one decode, or half a chunk per call */
    double g2, s2;
    KT_CHECK(cli_ppl(dir, text, scratch, "16", "--batch", "32", &g2, &s2, &scored));
    KT_CHECK_NEAR(g2 / got, 1.0, 1e-6);
    KT_CHECK(cli_ppl(dir, text, scratch, "16", "--batch", "8", &g2, &s2, &scored));
    KT_CHECK_NEAR(g2 / got, 1.0, 1e-6);

    /* strided: windows of C every S tokens, the last S of each scored, no BOS written */
    enum { S = 8 };
    nv = 0;
    int64_t n_win = ((int64_t)n - C + S - 1) / S;
    for (int64_t w = 0; w < n_win; w++) {
        const int32_t *win = ids + w * S;
        int from = C - S - 1;
        ids_str(win, from + 1, pids, sizeof pids);
        ids_str(win + from + 1, S, fids, sizeof fids);
        char *argv[] = {"generate", "-m", dir, "--prompt-ids", pids, "--force-ids", fids, "--logits-out", npy};
        KT_CHECK_EQ(run_to(kiln_cmd_generate, 9, argv, scratch), 0);
        float *l;
        int64_t rows, vocab;
        KT_CHECK_OK(ku_npy_read_f32(npy, &l, &rows, &vocab));
        for (int j = 0; j < S; j++) vals[nv++] = nll_direct(l + (int64_t)j * vocab, vocab, win[from + 1 + j]);
        free(l);
    }
    ppl_of(vals, nv, &want, &want_se);
    KT_CHECK(cli_ppl(dir, text, scratch, "16", "--stride", "8", &got, &got_se, &scored));
    KT_CHECK_EQ(scored, nv);
    KT_CHECK_NEAR(got / want, 1.0, 1e-5);
    KT_CHECK_NEAR(got_se / want_se, 1.0, 1e-3);
    free(ids);
    ckt_rmdir(dir);
}

KT_TEST(perplexity_errors) {
    char dir[512], text[1024], scratch[1024];
    KT_CHECK(setup(dir, sizeof dir, text, sizeof text));
    FMT(scratch, "%s/out.json", dir);
    double p, s;
    int64_t k;
    KT_CHECK(!cli_ppl(dir, text, scratch, "40", NULL, NULL, &p, &s, &k));             /* 65 tokens < 2*40 */
    KT_CHECK(!cli_ppl(dir, text, scratch, "16", "--stride", "16", &p, &s, &k));      /* stride must be < ctx */
    KT_CHECK(!cli_ppl(dir, text, scratch, "16", "--batch", "24", &p, &s, &k));       /* neither < ctx nor a multiple */
    ke_ppl_options o = {.n_ctx = 64};
    ke_ppl_result r;
    int32_t ids[100] = {0};
    KT_CHECK_ERR(ke_perplexity(NULL, 512, ids, 100, -1, &o, &r), "needs at least 128");
    /* llama.cpp's log-softmax */
    float l[4] = {1, 2, 3, 4};
    double want = -(1.0 - 4 - log(exp(-3.0) + exp(-2.0) + exp(-1.0) + 1));
    KT_CHECK_NEAR(ke_ppl_nll(l, 4, 0), want, 1e-6);
    KT_CHECK_NEAR(ke_ppl_nll_v2(l, 4, 0), want, 1e-5);
    ckt_rmdir(dir);
}

/* The bundled demo model's held-out perplexity against the figures its
 * training script computed with PyTorch (tests/data/demo/perplexity.json),
 * once both are in the tree. */
KT_TEST(perplexity_demo_matches_pytorch_reference) {
    char dir[4096], text[4096], ref[4096], p[4096], tmp[512], scratch[1024];
    kt_path(dir, sizeof dir, "models/kiln-demo");
    kt_path(ref, sizeof ref, "tests/data/demo/perplexity.json");
    FMT(p, "%s/model.safetensors", dir);
    if (!ku_file_exists(p) || !ku_file_exists(ref)) {
        kt_skip("models/kiln-demo or tests/data/demo/perplexity.json is not in the tree yet");
        return;
    }
    if (kt_sanitized()) { /* 33k tokens through the sanitizer build take minutes; the same path runs in perplexity_matches_generate_logits */
        kt_skip("the numeric reference check runs in the plain build");
        return;
    }
    FMT(text, "%s/heldout.txt", dir);
    cJSON *j = NULL;
    KT_CHECK_OK(ku_json_load(ref, &j));
    /* the n_ctx 256 entry (the default context of the 256-position model) */
    double want = 0, want_se = 0;
    int64_t want_scored = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(j, "results")) {
        int64_t ctx = 0;
        kiln_status st = ku_json_int(e, "n_ctx", 0, &ctx);
        if (!st && ctx == 256) {
            st = ku_json_num(e, "ppl", 0, &want);
            if (!st) st = ku_json_num(e, "stderr", 0, &want_se);
            if (!st) st = ku_json_int(e, "n_scored", 0, &want_scored);
        }
        kiln_status_free(st);
    }
    cJSON_Delete(j);
    KT_CHECK(want > 0);
    KT_CHECK(ckt_tmpdir(tmp, sizeof tmp) != NULL);
    FMT(scratch, "%s/out.json", tmp);
    double got, got_se;
    int64_t scored;
    int ok = cli_ppl(dir, text, scratch, "256", "--batch", "1024", &got, &got_se, &scored);
    ckt_rmdir(tmp);
    KT_CHECK(ok);
    KT_CHECK_EQ(scored, want_scored);
    KT_CHECK_NEAR(got / want, 1.0, 2e-5);
    KT_CHECK_NEAR(got_se / want_se, 1.0, 2e-4);
}
