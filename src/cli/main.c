/* main.c: the kiln command line. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/version.h"
#include "cli/cli.h"
#include "cli/cmd_pull.h"
#include "cli/cmd_template.h"
#include "cli/cmd_tokenize.h"
#include "kernels/kernels.h"
#include "runtime/dist.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"generate", kiln_cmd_generate, "generate from a prompt"},
    {"validate", kiln_cmd_validate, "check fixture folders against their transformers oracle"},
    {"info", kiln_cmd_info, "describe a checkpoint: family, shapes, weights, memory"},
    {"tokenize", kiln_cmd_tokenize, "text to token ids with a model's tokenizer"},
    {"detokenize", kiln_cmd_detokenize, "token ids to text"},
    {"template", kiln_cmd_template, "render a chat template for a list of messages"},
    {"export", kiln_cmd_export, "print a model's graph as StableHLO MLIR"},
    {"serve", kiln_cmd_serve, "OpenAI-compatible HTTP server with continuous batching"},
    {"bench-batch", kiln_cmd_bench_batch, "batched vs one-at-a-time throughput, checking equal outputs"},
    {"quantize", kiln_cmd_quantize, "write an MLX affine quantized copy of a checkpoint (2-8 bits)"},
    {"perplexity", kiln_cmd_perplexity, "perplexity of a text file, as llama.cpp's perplexity tool"},
    {"synth", kiln_cmd_synth, "write a checkpoint of a real model's shape with random weights"},
    {"bench", kiln_cmd_bench, "measure prompt and generation speed against the memory roofline"},
    {"grammar-bench", kiln_cmd_grammar_bench, "MaskBench files through the grammar engine (JSON Schema masks)"},
    {"chat", kiln_cmd_chat, "talk with a model in the terminal (multi-turn, streaming; scriptable from a pipe)"},
    {"pull", kiln_cmd_pull, "download a Hugging Face model into the Hugging Face cache"},
    {"embed", kiln_cmd_embed, "text embeddings (sentence-transformers pooling, Dense, Normalize)"},
    {"rerank", kiln_cmd_rerank, "relevance scores of documents for a query (cross-encoders, Qwen3-Reranker)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kiln <command> [options]    (kiln --version: the version)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`kiln <command> --help` describes each command.\n"
               "\noptions for every command that runs a model:\n"
               "  --int8-act   int8 activations for 4/8-bit weights (AVX2 or AVX-512): faster, slightly less\n"
               "               exact (docs/performance.md gives the measured error); default float32\n"
               "               (also KILN_INT8_ACT=1)\n"
               "  --tp N       tensor parallelism over the N processes of an MPI job:\n"
               "               mpirun -np N kiln CMD ... --tp N (each process holds 1/N of the\n"
               "               attention and MLP weights; rank 0 prints)\n"
               "  --enable-expert-parallel  with --tp: each process holds 1/N of every MoE\n"
               "               layer's experts, whole (else every process holds them all)\n"
               "  --pp P       pipeline parallelism: the layers split across P stages of --tp\n"
               "               processes each (mpirun -np TxP ... --tp T --pp P)\n"
               "  --pp-layers A,B,...  the layers of each stage (default: an even split)\n"
               "  --pp-micro M micro-batches per pipelined step, whole sequences each, so that\n"
               "               the stages overlap (default: P; 1: the step at once)\n");
}

/* Commands that run the same steps in every process of a --tp job, given
 * the same arguments (no standard input, no timing-driven loops around the
 * model), and serve and chat, whose rank 0 reads the requests or the turns
 * and leads the others through its steps (ke_ctx_lead). */
static bool tp_command(const char *name) {
    static const char *const ok[] = {"generate", "validate", "bench", "bench-batch", "perplexity", "export", "info", "serve", "chat", NULL};
    for (int i = 0; ok[i]; i++)
        if (!strcmp(name, ok[i])) return true;
    return false;
}

/* --pp-layers A,B,...: the layers of each stage, at most 256. */
static kiln_status pp_layers_parse(const char *v, int *layers, int *n) {
    *n = 0;
    if (!v) return kiln_error(KILN_EINVAL, "--pp-layers needs a value (the layers of each stage: A,B,...)");
    for (const char *p = v; *p;) {
        char *e;
        long x = strtol(p, &e, 10);
        if (e == p || x < 1 || x > 1 << 20 || (*e && *e != ',') || *n == 256)
            return kiln_error(KILN_EINVAL, "--pp-layers %s: want a comma-separated count of layers per stage, each >= 1", v);
        layers[(*n)++] = (int)x;
        p = *e ? e + 1 : e;
    }
    if (!*n) return kiln_error(KILN_EINVAL, "--pp-layers: empty");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))) {
        printf("kiln %s (commit %s)\n", KILN_VERSION, KILN_COMMIT);
        return 0;
    }
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    /* options of every command: taken out before the command parses */
    int n = 1, tp = 1, pp = 1, layers[256], n_layers = 0;
    bool dist = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--int8-act")) {
            if (!kk_set_act_int8(true)) {
                fprintf(stderr, "kiln: --int8-act needs a CPU with AVX2; this one has none (leave the option out)\n");
                return 1;
            }
            if (!kk_act_int8()) {
                fprintf(stderr, "kiln: --int8-act needs the AVX2 kernels, and KILN_ISA=%s turns them off (unset it, or "
                                "leave the option out)\n", kk_isa_name(kk_isa_level()));
                return 1;
            }
            continue;
        }
        if (!strcmp(argv[i], "--enable-expert-parallel")) { /* vLLM's name: MoE experts split whole across --tp */
            kd_set_expert_parallel(true);
            continue;
        }
        /* tensor and pipeline parallelism: mpirun -np T*P kiln CMD --tp T --pp P [--pp-layers A,B,..] */
        if (!strcmp(argv[i], "--pp-micro")) { /* micro-batches of a pipelined step (runtime/dist.h) */
            int64_t x = 1;
            kiln_status st = kiln_parse_int(argv[i], i + 1 < argc ? argv[i + 1] : NULL, 1, 4096, &x);
            if (st) return kiln_fail(st);
            kd_set_pp_micro((int)x);
            i++;
            continue;
        }
        if (!strcmp(argv[i], "--tp") || !strcmp(argv[i], "--pp") || !strcmp(argv[i], "--pp-layers")) {
            const char *v = i + 1 < argc ? argv[i + 1] : NULL;
            kiln_status st = NULL;
            int64_t x = 1;
            if (argv[i][4] == '-') st = pp_layers_parse(v, layers, &n_layers);
            else st = kiln_parse_int(argv[i], v, 1, argv[i][2] == 't' ? 4096 : 256, &x);
            if (!st && argv[i][2] == 't') tp = (int)x;
            else if (!st && argv[i][4] != '-') pp = (int)x;
            if (st) return kiln_fail(st);
            dist = true;
            i++;
            continue;
        }
        argv[n++] = argv[i];
    }
    argc = n;
    argv[argc] = NULL;
    if (dist) {
        kiln_status st = n_layers && n_layers != pp ? kiln_error(KILN_EINVAL, "--pp-layers: %d stages' layers for --pp %d", n_layers, pp)
                                                    : kd_init_pp(tp, pp, n_layers ? layers : NULL);
        if (st) {
            int rc = kiln_fail(st);
            if (kd_size() > 1) kd_abort(rc);
            kd_finalize();
            return rc;
        }
    }
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    /* -m ORG/NAME: the cached snapshot; -hf ORG/NAME: pulled first */
    if (strcmp(argv[1], "pull") && !kiln_resolve_model_args(argc - 1, argv + 1)) return 1;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            if (kd_size() > 1 && !tp_command(argv[1])) {
                fprintf(stderr, "kiln %s: --tp is not supported by this command yet (generate, validate, bench, "
                                "bench-batch, perplexity, export, info, serve and chat are)\n", argv[1]);
                kd_abort(1);
            }
            /* a job's processes all run the command; rank 0 prints */
            if (kd_rank() > 0 && !freopen("/dev/null", "w", stdout)) return kiln_fail(kiln_error(KILN_EIO, "/dev/null"));
            int rc = commands[i].fn(argc - 1, argv + 1);
            if (rc && kd_size() > 1) kd_abort(rc); /* the others may be waiting on this one */
            kd_finalize();
            return rc;
        }
    fprintf(stderr, "kiln: unknown command \"%s\"\n\n", argv[1]);
    usage(stderr);
    return 1;
}
