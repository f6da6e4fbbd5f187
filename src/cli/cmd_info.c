/* cmd_info.c: `kiln info -m DIR`. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/engine.h"

int kiln_cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kiln info [-m DIR]\n");
            return 0;
        } else {
            fprintf(stderr, "kiln info: unknown option %s\n", argv[i]);
            return 1;
        }
    }
    if (!dir) dir = kiln_default_model();
    ke_model *m;
    kiln_status st = ke_model_load(dir, &m);
    if (st) return kiln_fail(st);
    const km_hparams *hp = ke_model_hparams(m);
    const kc_checkpoint *ck = ke_model_checkpoint(m);
    int64_t params = 0, bytes = 0;
    for (int i = 0; i < kc_tensor_count(ck); i++) {
        const kc_tensor *t = kc_tensor_at(ck, i);
        int64_t n = 1;
        for (int d = 0; d < t->rank; d++) n *= t->shape[d];
        bytes += (int64_t)t->nbytes;
        params += n;
    }
    kc_quant q = kc_quant_for(ck, "");
    printf("model        %s\n", dir);
    printf("family       %s (model_type %s)\n", ke_model_family(m)->name, hp->model_type);
    printf("layers       %lld, hidden %lld, heads %lld (kv %lld), head_dim %lld, ffn %lld, vocab %lld\n",
           (long long)hp->n_layers, (long long)hp->hidden, (long long)hp->n_heads, (long long)hp->n_kv_heads,
           (long long)hp->head_dim, (long long)hp->ffn, (long long)hp->vocab);
    if (hp->max_pos > 0) printf("context      %lld positions", (long long)hp->max_pos);
    else printf("context      no limit in config.json");
    if (hp->no_rope) printf("; no rotary embeddings\n");
    else printf("; rope theta %g (%d rotary dims)\n", hp->rope_theta, hp->ropes[0].dim);
    int sliding = 0;
    for (int64_t i = 0; i < hp->n_layers; i++) sliding += hp->layer_sliding[i];
    if (sliding) printf("sliding      window %lld on %d of %lld layers\n", (long long)hp->sliding_window, sliding, (long long)hp->n_layers);
    if (hp->attn_softcap > 0 || hp->final_softcap > 0) printf("soft-caps    attention %g, final %g\n", hp->attn_softcap, hp->final_softcap);
    printf("embeddings   %s\n", hp->tie_embeddings ? "tied to the output head" : "separate output head");
    if (hp->features[0]) printf("features     %s\n", hp->features);
    if (q.bits) printf("quantized    MLX affine, %d bits, group size %d\n", q.bits, q.group_size);
    printf("tensors      %d, %lld stored elements, %.1f MiB of weights\n", kc_tensor_count(ck), (long long)params,
           (double)bytes / 1048576.0);
    ke_model_free(m);
    return 0;
}
