/* cmd_quantize.c: `kiln quantize`, a checkpoint to the MLX affine format
 * (the work is in quant/quant.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/progress.h"
#include "quant/quant.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln quantize -m DIR --out DIR [--bits N] [--group-size N] [--mixed RECIPE] [--dtype DT]\n"
               "  -m, --model DIR      the checkpoint to quantize (default: the bundled demo model)\n"
               "  -o, --out DIR        the new folder to write (must not exist)\n"
               "  -b, --bits N         2, 3, 4, 5, 6 or 8 (default 4)\n"
               "  -g, --group-size N   32, 64 or 128 consecutive inputs per scale and bias (default 64)\n"
               "  --mixed RECIPE       mlx-lm's mixed precision: mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6\n"
               "                       (more bits for lm_head and for some layers' v_proj and down_proj)\n"
               "  --dtype DT           float32, float16 or bfloat16: cast the float weights first (default:\n"
               "                       config.json's torch_dtype); with --dtype and no --bits, only cast\n"
               "Writes what mlx_lm.convert -q writes: MLX affine weights, config.json with \"quantization\",\n"
               "the tokenizer files. Linear and embedding weights whose input size is not a multiple of\n"
               "the group size stay float.\n");
}

static void on_progress(void *ud, int64_t done, int64_t total, const char *tensor) {
    kiln_progress_update(ud, total ? (double)done / (double)total : 1, tensor, done == total);
}

int kiln_cmd_quantize(int argc, char **argv) {
    const char *dir = NULL, *out = NULL;
    kq_options o = {.bits = 4, .group_size = 64};
    bool bits_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        int64_t x;
        static const char *const valued[] = {"-m", "--model", "-o", "--out", "--mixed", "--dtype", "-b", "--bits",
                                             "-g", "--group-size", NULL};
        kiln_status ost = kiln_option("quantize", a, v, valued, NULL);
        if (ost) return kiln_fail(ost);
        i++;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--mixed")) o.mixed = v;
        else if (!strcmp(a, "--dtype")) o.dtype = v;
        else if (!strcmp(a, "-b") || !strcmp(a, "--bits") || !strcmp(a, "-g") || !strcmp(a, "--group-size")) {
            kiln_status st = kiln_parse_int(a, v, 1, 1 << 20, &x);
            if (st) return kiln_fail(st);
            if (!strcmp(a, "-b") || !strcmp(a, "--bits")) o.bits = (int)x, bits_given = true;
            else o.group_size = (int)x;
        } else {
            fprintf(stderr, "kiln quantize: unknown option %s\n\n", a);
            usage(stderr);
            return 1;
        }
    }
    if (!out) {
        fprintf(stderr, "kiln quantize: --out DIR is required\n\n");
        usage(stderr);
        return 1;
    }
    if (!dir) dir = kiln_default_model();
    if (o.dtype && !bits_given && !o.mixed) o.bits = 0; /* a plain dtype conversion */
    kiln_progress p;
    kiln_progress_start(&p, "quantizing");
    o.progress = on_progress;
    o.progress_ud = &p;
    kq_report r;
    kiln_status st = kq_quantize(dir, out, &o, &r);
    kiln_progress_end(&p);
    if (st) return kiln_fail(st);
    printf("%s -> %s\n", dir, out);
    if (!o.bits) {
        printf("converted    to %s, %.2f MiB, %lld parameters, %.2f s\n", o.dtype, (double)r.bytes / 1048576.0,
               (long long)r.n_params, kiln_progress_elapsed(&p));
        return 0;
    }
    printf("quantized    %d matrices (MLX affine, group size %d):", r.n_quantized, o.group_size);
    for (int b = 2; b <= 8; b++)
        if (r.bits_used[b]) printf(" %d at %d bits", r.bits_used[b], b);
    printf("\n");
    if (r.n_float) printf("left float   %d (input size not a multiple of %d)\n", r.n_float, o.group_size);
    printf("size         %.2f MiB in %d file%s, %.3f bits per weight, %lld parameters\n", (double)r.bytes / 1048576.0,
           r.n_files, r.n_files == 1 ? "" : "s", r.bits_per_weight, (long long)r.n_params);
    printf("ties         %lld of %lld codes fell exactly on .5 (rounded half to even, as MLX on the CPU)\n",
           (long long)r.n_ties, (long long)r.n_codes);
    printf("time         %.2f s\n", kiln_progress_elapsed(&p));
    return 0;
}
