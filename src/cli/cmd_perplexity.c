/* cmd_perplexity.c: `kiln perplexity`, llama.cpp's perplexity tool on the
 * engine (the computation is in engine/perplexity.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "cli/progress.h"
#include "engine/engine.h"
#include "engine/perplexity.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln perplexity [-m DIR] -f FILE [--ctx N] [--stride N] [--batch N]\n"
               "  -m, --model DIR    checkpoint folder (default: the bundled demo model)\n"
               "  -f, --file FILE    the text to score\n"
               "  -c, --ctx N        tokens per chunk (default: 512, at most the model's context)\n"
               "  --stride N         strided mode (llama.cpp --ppl-stride): windows of --ctx tokens every N\n"
               "                     tokens, each scoring its last N; default: chunks of --ctx tokens, each\n"
               "                     scoring its second half\n"
               "  -b, --batch N      tokens per decode call (default --ctx; a multiple runs chunks side by side)\n"
               "  --chunks N         score only the first N chunks\n"
               "  -t, --threads N    threads (default: all CPUs)\n"
               KILN_CACHE_TYPE_HELP
               "  --json             print one JSON object instead of the text lines\n"
               "The text is tokenized with BOS as llama.cpp does; the result line is llama.cpp's\n"
               "\"Final estimate: PPL = P +/- E\" (E: the standard error).\n");
}

typedef struct {
    kiln_progress bar;
    bool tty;
} progress_ctx;

static void on_chunk(void *ud, int64_t done, int64_t total, double ppl) {
    progress_ctx *p = ud;
    if (p->bar.tty) {
        char note[64];
        snprintf(note, sizeof note, "chunk %lld/%lld  PPL %.4f", (long long)done, (long long)total, ppl);
        kiln_progress_update(&p->bar, (double)done / (double)total, note, done == total);
    } else {
        fprintf(stderr, "[%lld]%.4f,", (long long)done, ppl); /* llama.cpp's running values */
        if (done == total) fprintf(stderr, "\n");
    }
}

/* What the tokenizer's post-processor adds around a text: BOS is the one
 * token it puts first; llama.cpp's perplexity refuses vocabularies that add
 * EOS, and so does this. */
static kiln_status special_tokens(const ktok *tok, int32_t *bos) {
    int32_t *with = NULL, *without = NULL;
    size_t nw = 0, nwo = 0;
    kiln_status st = ktok_encode(tok, "a", 1, true, &with, &nw);
    if (!st) st = ktok_encode(tok, "a", 1, false, &without, &nwo);
    size_t k = 0;
    if (!st) {
        for (k = 0; k + nwo <= nw; k++)
            if (!memcmp(with + k, without, sizeof *with * nwo)) break;
        if (k + nwo > nw) st = kiln_error(KILN_EUNSUPPORTED, "tokenizer: cannot tell which special tokens it adds");
    }
    if (!st && nw - k - nwo > 0)
        st = kiln_error(KILN_EUNSUPPORTED, "the tokenizer appends %zu special token(s) after the text; llama.cpp's "
                                           "perplexity refuses such vocabularies (it scores text with BOS only)",
                        nw - k - nwo);
    if (!st && k > 1)
        st = kiln_error(KILN_EUNSUPPORTED, "the tokenizer puts %zu special tokens before the text; only BOS is supported", k);
    if (!st) *bos = k == 1 ? with[0] : -1;
    free(with), free(without);
    return st;
}

int kiln_cmd_perplexity(int argc, char **argv) {
    const char *dir = NULL, *file = NULL;
    int64_t ctx = 0, stride = 0, batch = 0, chunks = 0, threads = 0;
    int cache_k = KG_F32, cache_v = KG_F32;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        kiln_status st = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        static const char *const valued[] = {"-m", "--model", "-f", "--file", "-c", "--ctx", "--stride", "-b",
                                             "--batch", "--chunks", "-t", "--threads", KILN_CACHE_TYPE_OPTS, NULL};
        if ((st = kiln_option("perplexity", a, v, valued, NULL))) return kiln_fail(st);
        i++;
        if (kiln_cache_type_opt(a, v, &cache_k, &cache_v, &st)) {
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) st = kiln_parse_int(a, v, 4, 1 << 20, &ctx);
        else if (!strcmp(a, "--stride")) st = kiln_parse_int(a, v, 1, 1 << 20, &stride);
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch")) st = kiln_parse_int(a, v, 1, 1 << 24, &batch);
        else if (!strcmp(a, "--chunks")) st = kiln_parse_int(a, v, 1, 1 << 30, &chunks);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &threads);
        else {
            fprintf(stderr, "kiln perplexity: unknown option %s\n\n", a);
            usage(stderr);
            return 1;
        }
        if (st) return kiln_fail(st);
    }
    if (!file) {
        fprintf(stderr, "kiln perplexity: -f FILE is required\n\n");
        usage(stderr);
        return 1;
    }
    if (!dir) dir = kiln_default_model();

    ke_model *m = NULL;
    ktok *tok = NULL;
    ke_ctx *c = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    int32_t bos = -1;
    kiln_status st = ku_read_file(file, &text, &len);
    if (!st) st = ke_model_load(dir, &m);
    if (!st) st = ktok_load(dir, &tok);
    if (!st) st = special_tokens(tok, &bos);
    if (!st) st = ktok_encode(tok, text, len, true, &ids, &n);
    if (st) goto done;
    const km_hparams *hp = ke_model_hparams(m);
    if (!ctx) ctx = hp->max_pos > 0 && hp->max_pos < 512 ? hp->max_pos : 512;
    kiln_warn_ctx(m, ctx);
    int64_t n_seq = !stride && batch >= ctx ? batch / ctx : 1;
    if (n_seq > 64) n_seq = 64;
    ke_ctx_params cp = {.n_ctx = ctx, .n_cache = ctx * n_seq, .n_threads = (int)threads, .cache_type_k = cache_k,
                        .cache_type_v = cache_v};
    st = ke_ctx_create(m, &cp, &c);
    if (st) goto done;
    progress_ctx pc;
    kiln_progress_start(&pc.bar, "perplexity");
    ke_ppl_options o = {.n_ctx = ctx, .stride = stride, .n_batch = batch, .n_chunks = chunks,
                        .progress = on_chunk, .progress_ud = &pc};
    ke_ppl_result r;
    st = ke_perplexity(c, hp->vocab, ids, (int64_t)n, bos, &o, &r);
    kiln_progress_end(&pc.bar);
    if (st) goto done;
    double secs = kiln_progress_elapsed(&pc.bar);
    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", dir);
        cJSON_AddStringToObject(j, "file", file);
        cJSON_AddNumberToObject(j, "ppl", r.ppl);
        cJSON_AddNumberToObject(j, "ppl_se", r.ppl_se);
        cJSON_AddNumberToObject(j, "nll", r.nll);
        cJSON_AddNumberToObject(j, "n_tokens", (double)n);
        cJSON_AddNumberToObject(j, "n_ctx", (double)ctx);
        cJSON_AddNumberToObject(j, "stride", (double)stride);
        cJSON_AddNumberToObject(j, "n_chunks", (double)r.n_chunks);
        cJSON_AddNumberToObject(j, "n_scored", (double)r.n_scored);
        cJSON_AddNumberToObject(j, "seconds", secs);
        char *s = cJSON_PrintUnformatted(j);
        if (s) printf("%s\n", s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("%s: %zu tokens, %lld %s of %lld, %lld tokens scored (%s), %.1f s\n", file, n, (long long)r.n_chunks,
               stride ? "windows" : "chunks", (long long)ctx, (long long)r.n_scored,
               stride ? "the last --stride of each window" : "the second half of each chunk", secs);
        printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_se);
    }
done:
    ke_ctx_free(c);
    ke_model_free(m);
    ktok_free(tok);
    free(text);
    free(ids);
    return st ? kiln_fail(st) : 0;
}
