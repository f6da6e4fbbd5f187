/* cmd_generate.c: `kiln generate`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/npy.h"
#include "cli/cli.h"
#include "engine/engine.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: kiln generate [-m DIR] --prompt-ids IDS [-n N] [options]\n"
               "  -m, --model DIR       checkpoint folder (default: the bundled demo model)\n"
               "  --prompt-ids IDS      prompt token ids, e.g. 1,17,93\n"
               "  -n, --n-predict N     tokens to generate (default 32)\n"
               "  --temp T              temperature; 0 = greedy (default 0)\n"
               "  --ignore-eos          do not stop at end-of-sequence tokens\n"
               "  --force-ids IDS       teacher forcing: feed these ids instead of choosing\n"
               "  --logits-out FILE     write the logits rows as float32 .npy [rows, vocab]\n"
               "  -c, --ctx-size N      context size (default: the model's, at most 4096)\n"
               "  -t, --threads N       threads (default: all CPUs)\n"
               "  --json                print one JSON object with the ids and timings\n");
}

static int argmax(const float *x, int64_t n) {
    int best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

int kiln_cmd_generate(int argc, char **argv) {
    const char *dir = NULL, *logits_out = NULL;
    int32_t *prompt = NULL, *forced = NULL;
    int n_prompt = 0, n_forced = 0;
    int64_t n_predict = 32, n_ctx = 0, threads = 0;
    bool json = false, ignore_eos = false;
    double temp = 0;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!v) st = kiln_error(KILN_EINVAL, "%s needs a folder", a);
            dir = v, i++;
        } else if (!strcmp(a, "--prompt-ids")) {
            if (!v) st = kiln_error(KILN_EINVAL, "%s needs ids", a);
            else st = kiln_parse_ids(v, &prompt, &n_prompt), i++;
        } else if (!strcmp(a, "--force-ids")) {
            if (!v) st = kiln_error(KILN_EINVAL, "%s needs ids", a);
            else st = kiln_parse_ids(v, &forced, &n_forced), i++;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            st = kiln_parse_int(a, v, -1, 1 << 30, &n_predict), i++;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            st = kiln_parse_int(a, v, 0, 1 << 30, &n_ctx), i++;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            st = kiln_parse_int(a, v, 0, 1024, &threads), i++;
        } else if (!strcmp(a, "--temp")) {
            if (!v) st = kiln_error(KILN_EINVAL, "--temp needs a value");
            else temp = atof(v), i++;
        } else if (!strcmp(a, "--logits-out")) {
            if (!v) st = kiln_error(KILN_EINVAL, "--logits-out needs a file");
            logits_out = v, i++;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = true;
        } else {
            st = kiln_error(KILN_EINVAL, "unknown option %s (see kiln generate --help)", a);
        }
    }
    if (!st && temp != 0) st = kiln_error(KILN_EUNSUPPORTED, "--temp: only greedy decoding (--temp 0) is available in this build");
    if (!st && !prompt) st = kiln_error(KILN_EINVAL, "give a prompt with --prompt-ids (see kiln generate --help)");
    if (!st && n_prompt == 0) st = kiln_error(KILN_EINVAL, "--prompt-ids: the prompt is empty");
    if (st) {
        free(prompt), free(forced);
        return kiln_fail(st);
    }
    if (n_forced) n_predict = n_forced;
    if (n_predict < 0) n_predict = 1 << 30;
    if (!dir) dir = kiln_default_model();

    ke_model *m = NULL;
    ke_ctx *c = NULL;
    double t0 = now();
    st = ke_model_load(dir, &m);
    if (!st) st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = n_ctx, .n_threads = (int)threads}, &c);
    double t_load = now() - t0;
    if (st) goto out;
    const km_hparams *hp = ke_model_hparams(m);
    int32_t eos[16];
    int n_eos = 0;
    if (!ignore_eos) st = kc_eos_ids(ke_model_checkpoint(m), eos, 16, &n_eos);
    if (st) goto out;
    int64_t room = ke_ctx_n_ctx(c) - n_prompt;
    if (room < 0) {
        st = kiln_error(KILN_ELIMIT, "the prompt has %d tokens, more than the context size %lld (raise --ctx-size)",
                        n_prompt, (long long)ke_ctx_n_ctx(c));
        goto out;
    }
    const char *finish = "length";
    if (n_predict > room) n_predict = room;
    int32_t *gen = malloc(sizeof(int32_t) * (size_t)(n_predict + 1));
    float *rows = logits_out ? malloc(sizeof(float) * (size_t)(n_predict + 1) * (size_t)hp->vocab) : NULL;
    if (!gen || (logits_out && !rows)) {
        free(gen), free(rows);
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto out;
    }
    int seq;
    st = ke_seq_open(c, &seq);
    int *seqs = calloc((size_t)n_prompt, sizeof(int));
    for (int i = 0; seqs && i < n_prompt; i++) seqs[i] = seq;
    const float *lg;
    int nr;
    double t1 = now();
    if (!st) st = ke_decode(c, &(ke_batch){n_prompt, prompt, seqs, NULL}, &lg, &nr);
    free(seqs);
    double t_prompt = now() - t1, t2 = now();
    int64_t n_gen = 0, n_rows = 0;
    while (!st) {
        if (rows) memcpy(rows + n_rows++ * hp->vocab, lg, sizeof(float) * (size_t)hp->vocab);
        if (n_gen >= n_predict) break;
        int32_t next = n_forced ? forced[n_gen] : argmax(lg, hp->vocab);
        gen[n_gen++] = next;
        bool stop = false;
        for (int e = 0; e < n_eos && !n_forced; e++) stop |= next == eos[e];
        if (!json) {
            printf("%d ", next);
            fflush(stdout);
        }
        if (stop) {
            finish = "stop";
            break;
        }
        st = ke_decode(c, &(ke_batch){1, &next, &seq, NULL}, &lg, &nr);
    }
    double t_gen = now() - t2;
    if (!st && rows) st = ku_npy_write_f32(logits_out, rows, n_rows, hp->vocab);
    if (!st) {
        if (json) {
            printf("{\"model\": \"%s\", \"prompt_ids\": [", dir);
            for (int i = 0; i < n_prompt; i++) printf("%s%d", i ? ", " : "", prompt[i]);
            printf("], \"generated_ids\": [");
            for (int64_t i = 0; i < n_gen; i++) printf("%s%d", i ? ", " : "", gen[i]);
            printf("], \"finish_reason\": \"%s\", \"timings\": {\"load_s\": %.4f, \"prompt_s\": %.4f, \"generate_s\": %.4f, "
                   "\"prompt_tok_s\": %.2f, \"generate_tok_s\": %.2f}}\n",
                   finish, t_load, t_prompt, t_gen, t_prompt > 0 ? n_prompt / t_prompt : 0,
                   t_gen > 0 && n_gen > 1 ? (double)(n_gen - 1) / t_gen : 0);
        } else {
            printf("\n");
            fprintf(stderr, "kiln: %d prompt tokens in %.3f s (%.1f tok/s), %lld generated in %.3f s (%.1f tok/s), %s\n",
                    n_prompt, t_prompt, n_prompt / (t_prompt > 0 ? t_prompt : 1), (long long)n_gen, t_gen,
                    t_gen > 0 ? (double)n_gen / t_gen : 0, finish);
        }
    }
    free(gen), free(rows);
out:
    ke_ctx_free(c);
    ke_model_free(m);
    free(prompt), free(forced);
    return st ? kiln_fail(st) : 0;
}
