/* cmd_synth.c: `kiln synth`, random-weight checkpoints of real shapes. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "base/json.h"
#include "cli/synth.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln synth (--shape NAME | --config config.json) [--dtype f32|bf16|f16|q8|q4] [--seed N] --out DIR\n"
               "       [--arch TYPE] [--layers N]\n\n"
               "Writes a checkpoint of a real model's shape with seeded random weights (q8/q4: MLX affine,\n"
               "group size 64), for benchmarks. --config takes any text model's Hugging Face config.json\n"
               "(every tensor its family loads is written, of the shape the config gives; optional\n"
               "tensors such as biases are left out). --arch overrides the model_type, --layers the depth.\nshapes:\n");
    for (int i = 0; ks_shape_at(i); i++) {
        const ks_shape *s = ks_shape_at(i);
        fprintf(f, "  %-16s %-7s hidden %lld, %lld layers, %lld/%lld heads, ffn %lld, vocab %lld%s\n", s->name, s->arch,
                (long long)s->hidden, (long long)s->layers, (long long)s->heads, (long long)s->kv_heads,
                (long long)s->ffn, (long long)s->vocab, s->tied ? ", tied" : "");
    }
}

int kiln_cmd_synth(int argc, char **argv) {
    const char *shape = NULL, *config = NULL, *out = NULL, *dtype = "bf16", *arch = NULL;
    int64_t seed = 1, layers = 0;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        static const char *const valued[] = {"--shape", "--config", "--out", "-o", "--dtype", "--arch", "--seed",
                                             "--layers", NULL};
        if ((st = kiln_option("synth", a, v, valued, NULL))) break;
        i++;
        if (!strcmp(a, "--shape")) shape = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--arch")) arch = v;
        else if (!strcmp(a, "--seed")) st = kiln_parse_int(a, v, 0, INT64_MAX, &seed);
        else if (!strcmp(a, "--layers")) st = kiln_parse_int(a, v, 1, 512, &layers);
        else {
            fprintf(stderr, "kiln synth: unknown option %s\n\n", a);
            usage(stderr);
            return 1;
        }
    }
    if (st) return kiln_fail(st);
    if (!out || (!shape == !config)) {
        usage(stderr);
        return 1;
    }
    int dt = ks_dtype_parse(dtype);
    if (dt < 0) return kiln_fail(kiln_error(KILN_EINVAL, "--dtype: \"%s\" is not f32, bf16, f16, q8 or q4", dtype));
    if (shape) {
        const ks_shape *p = ks_shape_find(shape);
        if (!p) return kiln_fail(kiln_error(KILN_EINVAL, "--shape: unknown shape \"%s\" (see kiln synth --help)", shape));
        ks_shape sh = *p;
        if (arch) sh.arch = arch;
        if (layers) sh.layers = layers;
        st = ks_synth(&sh, (ks_dtype)dt, (uint64_t)seed, out);
        if (st) return kiln_fail(st);
        printf("wrote %s: %s (%s), %s\n", out, sh.name, sh.arch, dtype);
        return 0;
    }
    cJSON *cfg;
    if ((st = ku_json_load_py(config, &cfg))) return kiln_fail(st);
    cJSON *text = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
    if (!cJSON_IsObject(text)) text = cfg;
    if (arch) cJSON_DeleteItemFromObjectCaseSensitive(text, "model_type"), cJSON_AddStringToObject(text, "model_type", arch);
    if (layers)
        cJSON_DeleteItemFromObjectCaseSensitive(text, "num_hidden_layers"),
            cJSON_AddNumberToObject(text, "num_hidden_layers", (double)layers);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(text, "model_type");
    printf("kiln synth: %s (%s), %s...\n", config, cJSON_IsString(mt) ? mt->valuestring : "?", dtype);
    fflush(stdout);
    st = ks_synth_config(cfg, (ks_dtype)dt, (uint64_t)seed, out);
    cJSON_Delete(cfg);
    if (st) return kiln_fail(kiln_status_wrap(st, "%s", config));
    printf("wrote %s\n", out);
    return 0;
}
