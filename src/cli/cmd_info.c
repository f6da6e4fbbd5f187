/* cmd_info.c: `kiln info -m DIR`. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>


#include "cli/cli.h"
#include "cli/peak.h"
#include "engine/engine.h"
#include "kernels/kernels.h"
#include "models/blocks.h"
#include "vision/vision.h"

static double mib(int64_t b) { return (double)b / 1048576.0; }

/* What a run takes: the weights (mapped), the KV cache per token and at the
 * context, recurrent state; totals as generate / chat and serve allocate. */
static kiln_status print_memory(const ke_model *m, int64_t n_ctx, int64_t parallel, kg_dtype kt, kg_dtype vt) {
    ke_memory mem;
    KILN_TRY(ke_model_memory(m, &mem));
    int64_t ctx = n_ctx > 0 ? n_ctx : mem.default_n_ctx, per_token = ke_memory_kv_bytes_per_token(&mem, kt, vt);
    printf("memory       weights %.1f MiB (mapped from the files: the page cache holds them, nothing is copied)\n",
           mib(mem.weight_bytes));
    if (mem.kv_layers)
        printf("KV cache     %.2f MiB per 1k tokens (K %s and V %s of %d layers); %.1f MiB at %s context %lld\n",
               mib(per_token * 1024), ke_cache_type_name(kt), ke_cache_type_name(vt), mem.kv_layers, mib(per_token * ctx),
               n_ctx > 0 ? "the" : "the default", (long long)ctx);
    else printf("KV cache     none (no layer attends over a cache)\n");
    if (mem.state_layers)
        printf("state        %.2f MiB per sequence (%d recurrent layers); generate and chat keep 32 rows, serve one per "
               "--parallel; prefix-cache snapshots and evicted blocks take at most --cache-ram (default a quarter "
               "of MemAvailable)\n",
               mib(mem.state_bytes_per_seq), mem.state_layers);
    int64_t one = ke_memory_ctx_bytes(&mem, &(ke_ctx_params){.n_ctx = ctx, .cache_type_k = kt, .cache_type_v = vt});
    printf("total        %.1f MiB for kiln generate / chat -c %lld (weights + at most %.1f MiB allocated)\n", mib(mem.weight_bytes + one),
           (long long)ctx, mib(one));
    int64_t np = parallel > 0 ? parallel : 8;
    int64_t srv = ke_memory_ctx_bytes(
        &mem, &(ke_ctx_params){.n_ctx = ctx, .n_cache = ctx * np, .n_seq_max = (int)np, .cache_type_k = kt, .cache_type_v = vt});
    printf("             %.1f MiB for kiln serve -c %lld --parallel %lld%s (weights + at most %.1f MiB allocated)\n",
           mib(mem.weight_bytes + srv), (long long)ctx, (long long)np, parallel > 0 ? "" : " (its default)", mib(srv));
    if (n_ctx > 0) kiln_warn_ctx(m, n_ctx);
    return NULL;
}

/* The predicted peak RSS (cli/peak.h) of a run with these options; base:
 * this process's RSS with the model loaded, before any run. */
static kiln_status print_peak(const ke_model *m, const kpeak_params *p, int64_t base) {
    int64_t n_ctx = p->n_ctx, parallel = p->parallel, n_prompt = p->n_prompt;
    kpeak pk;
    KILN_TRY(kpeak_predict(m, p, base, &pk));
    ke_memory mem;
    KILN_TRY(ke_model_memory(m, &mem));
    int64_t ctx = n_ctx > 0 ? n_ctx : mem.default_n_ctx, prompt = n_prompt > 0 && n_prompt < ctx ? n_prompt : ctx;
    char types[64] = "";
    if (p->cache_type_k != KG_F32 || p->cache_type_v != KG_F32)
        snprintf(types, sizeof types, " -ctk %s -ctv %s", ke_cache_type_name(p->cache_type_k), ke_cache_type_name(p->cache_type_v));
    printf("peak RSS     %.1f MiB predicted for -c %lld --parallel %lld%s%s (a prompt of %lld tokens, then decoding to the "
           "context): program and model %.1f + weights read %.1f", mib(pk.total), (long long)ctx,
           (long long)(parallel > 0 ? parallel : 1), types, kk_act_int8() ? " --int8-act" : "", (long long)prompt, mib(pk.base),
           mib(pk.weights));
    if (pk.repacked) printf(" + repacked for int8 %.1f (their sources dropped)", mib(pk.repacked));
    printf(" + KV %.1f + arenas %.1f (%d executables) + scratch %.1f\n", mib(pk.kv), mib(pk.arenas), pk.executables,
           mib(pk.scratch));
    return NULL;
}

int kiln_cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    int64_t n_ctx = 0, parallel = 0, n_prompt = 0;
    int cache_k = KG_F32, cache_v = KG_F32;
    for (int i = 1; i < argc; i += 2) { /* each option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: kiln info [-m DIR] [-c N] [--parallel N] [-p N] [-ctk T] [-ctv T] [--int8-act]\n"
                   "  Describes a checkpoint: family, shapes, quantization, and the memory a run takes.\n"
                   "  -m, --model DIR    checkpoint folder (default: the bundled demo model)\n"
                   "  -c, --ctx-size N   the memory total for this context (default: the model's, at most 4096)\n"
                   "  -np, --parallel N  and as kiln serve --parallel N allocates it (KV for N contexts, N state rows)\n"
                   "  -p, --prompt-tokens N  the peak RSS predicted for a prompt of N tokens (default: the context)\n"
                   "  --int8-act         the peak with int8 activations (repacked weights)\n"
                   KILN_CACHE_TYPE_HELP);
            return 0;
        }
        static const char *const valued[] = {"-m", "--model", "-c", "--ctx-size", "-np", "--parallel", "-p", "--prompt-tokens",
                                             KILN_CACHE_TYPE_OPTS, NULL};
        kiln_status ost = kiln_option("info", a, v, valued, NULL);
        if (ost || kiln_cache_type_opt(a, v, &cache_k, &cache_v, &ost)) { /* a bad option, or -ctk / -ctv */
            if (ost) return kiln_fail(ost);
            continue;
        }
        if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) ost = kiln_parse_int(a, v, 1, 1 << 30, &n_ctx);
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt-tokens")) ost = kiln_parse_int(a, v, 1, 1 << 30, &n_prompt);
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) ost = kiln_parse_int(a, v, 1, 4096, &parallel);
        else dir = v;
        if (ost) return kiln_fail(ost);
    }
    if (!dir) dir = kiln_default_model();
    ke_model *m;
    kiln_status st = ke_model_load(dir, &m);
    if (st) return kiln_fail(st);
    int64_t base = kpeak_rss_now(); /* the program and the model's host structures, as a run holds them */
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
    int nope = 0;
    for (int64_t i = 0; i < hp->n_layers; i++) nope += hp->layer_nope[i];
    if (nope == hp->n_layers) printf("; no rotary embeddings\n");
    else if (km_rope_is_mrope(&hp->ropes[0]))
        printf("; rope theta %g (%d rotary dims), M-RoPE t/h/w pairs %d/%d/%d%s\n", hp->rope_theta, hp->ropes[0].dim, hp->ropes[0].mrope[0],
               hp->ropes[0].mrope[1], hp->ropes[0].mrope[2], hp->ropes[0].mrope_interleaved ? " interleaved" : "");
    else if (hp->n_ropes > 1) /* full layers rope 0, sliding ones rope 1 */
        printf("; rope theta %g (%d rotary dims), on sliding layers theta %g (%d rotary dims)\n", hp->ropes[0].theta,
               hp->ropes[0].dim, hp->ropes[1].theta, hp->ropes[1].dim);
    else printf("; rope theta %g (%d rotary dims)\n", hp->ropes[0].theta, hp->ropes[0].dim);
    int sliding = 0;
    for (int64_t i = 0; i < hp->n_layers; i++) sliding += hp->layer_sliding[i];
    if (sliding) printf("sliding      window %lld on %d of %lld layers\n", (long long)hp->sliding_window, sliding, (long long)hp->n_layers);
    if (hp->attn_softcap > 0 || hp->final_softcap > 0) printf("soft-caps    attention %g, final %g\n", hp->attn_softcap, hp->final_softcap);
    if (hp->layer_heads[0]) { /* widths that vary per layer (OpenELM) */
        int32_t lo[3] = {INT32_MAX, INT32_MAX, INT32_MAX}, hi[3] = {0, 0, 0};
        for (int64_t i = 0; i < hp->n_layers; i++) {
            const int32_t v[3] = {hp->layer_heads[i] ? hp->layer_heads[i] : (int32_t)hp->n_heads,
                                  hp->layer_kv_heads[i] ? hp->layer_kv_heads[i] : (int32_t)hp->n_kv_heads,
                                  hp->layer_ffn[i] ? hp->layer_ffn[i] : (int32_t)hp->ffn}; /* 0: the global width */
            for (int j = 0; j < 3; j++) lo[j] = v[j] < lo[j] ? v[j] : lo[j], hi[j] = v[j] > hi[j] ? v[j] : hi[j];
        }
        printf("per layer    heads %d..%d (kv %d..%d), ffn %d..%d\n", lo[0], hi[0], lo[1], hi[1], lo[2], hi[2]);
    }
    if (hp->kv_lora_rank)
        printf("attention    multi-head latent: q_lora %lld, kv_lora %lld, per head %lld nope + %lld rope, v %lld\n",
               (long long)hp->q_lora_rank, (long long)hp->kv_lora_rank, (long long)hp->qk_nope_dim,
               (long long)hp->qk_rope_dim, (long long)hp->v_head_dim);
    if (hp->n_experts) {
        int moe = 0;
        for (int64_t i = 0; i < hp->n_layers; i++) moe += hp->layer_moe[i];
        static const char *const score[] = {"softmax, top-k", "top-k, softmax", "sigmoid, top-k", "top-k, sigmoid",
                                            "sparsemixer", "sqrt-softplus, top-k"};
        printf("experts      %lld of %lld per token (width %lld) on %d of %lld layers; router %s%s%s", (long long)hp->n_experts_used,
               (long long)hp->n_experts, (long long)hp->expert_ffn, moe, (long long)hp->n_layers, score[hp->moe_score],
               hp->moe_router_bias ? " with choice bias" : "", hp->moe_norm_topk ? ", renormalised" : "");
        if (hp->moe_n_group > 1) printf(", %lld of %lld groups", (long long)hp->moe_topk_group, (long long)hp->moe_n_group);
        if (hp->moe_scale != 0 && hp->moe_scale != 1) printf(", scaled %g", hp->moe_scale);
        if (hp->shared_ffn) printf("; shared expert width %lld", (long long)hp->shared_ffn);
        printf("\n");
    }
    if (hp->attn_chunk > 0) {
        int chunked = 0;
        for (int64_t i = 0; i < hp->n_layers; i++) chunked += hp->layer_chunked[i];
        if (chunked)
            printf("attention    chunks of %lld positions on %d of %lld layers\n", (long long)hp->attn_chunk, chunked,
                   (long long)hp->n_layers);
    }
    if (ke_model_vision(m)) {
        char vb[512];
        printf("vision       %s\n", kvis_describe(ke_model_vision(m), vb, sizeof vb));
        if (hp->attn_span) printf("attention    bidirectional within image blocks / the prompt prefix\n");
    }
    if (hp->logn_len) printf("attention    logn query scaling from position %lld\n", (long long)hp->logn_len);
    if (hp->alibi) printf("positions    ALiBi\n");
    if (hp->n_ropes > 0) {
        const km_rope *r = &hp->ropes[0];
        const char *parts[3] = {r->interleaved ? "interleaved pairs" : NULL,
                                r->type == KM_ROPE_NTK_STEP ? "stepwise NTK base" : NULL, r->round_f16 ? "float16 tables" : NULL};
        char line[128] = "";
        for (int i = 0; i < 3; i++)
            if (parts[i]) snprintf(line + strlen(line), sizeof line - strlen(line), "%s%s", line[0] ? ", " : "", parts[i]);
        if (line[0]) printf("rope         %s\n", line);
    }
    if (hp->head_l2norm && !hp->tie_embeddings) printf("output head  rows L2-normalised (NormHead)\n");
    if (nope && nope < hp->n_layers) printf("NoPE         %d of %lld layers apply no rotary embedding\n", nope, (long long)hp->n_layers);
    if (hp->emb_scale != 0 || hp->attn_scale != 0 || hp->residual_scale != 0 || hp->logit_scale != 0) {
        char scale[32] = "head_dim^-0.5";
        if (hp->attn_scale != 0) snprintf(scale, sizeof scale, "%g", hp->attn_scale);
        printf("multipliers  embeddings %g, attention scale %s%s, residual branches %g, logits %g\n",
               hp->emb_scale != 0 ? hp->emb_scale : 1.0, scale, hp->attn_scale_by_layer ? " / (layer + 1)" : "",
               hp->residual_scale != 0 ? hp->residual_scale : 1.0, hp->logit_scale != 0 ? hp->logit_scale : 1.0);
    }
    if (hp->clip_qkv > 0) printf("clip_qkv     q, k, v clamped to +-%g\n", hp->clip_qkv);
    if (hp->q_temp_beta != 0)
        printf("temperature  queries times 1 + %g * log(1 + floor(pos / %lld))\n", hp->q_temp_beta, (long long)hp->q_temp_floor);
    if (hp->ropes[0].type == KM_ROPE_LONGROPE)
        printf("longrope     long factors past %lld positions (the sequence is recomputed when it crosses)\n",
               (long long)hp->ropes[0].orig_max_pos);
    printf("embeddings   %s\n", hp->tie_embeddings ? "tied to the output head" : "separate output head");
    if (hp->features[0]) printf("features     %s\n", hp->features);
    int mtp_layers;
    const char *mtp_first;
    int mtp = kb_mtp_tensors(ck, hp->n_layers, &mtp_layers, &mtp_first);
    if (mtp) { /* the head as --spec-mtp opens it, or why it does not */
        kb_mtp *head = NULL;
        kiln_status hs = kb_mtp_open(ke_model_family(m), hp, ck, &head);
        printf("mtp          %d multi-token prediction layer%s (%d tensors, e.g. %s): ", mtp_layers, mtp_layers == 1 ? "" : "s", mtp, mtp_first);
        if (hs) printf("kept in the checkpoint, not served: %s\n", kiln_status_msg(hs));
        else printf("guesses tokens with --spec-mtp, layout %s (%lld decoder layer%s)\n", kb_mtp_layout(head),
                    (long long)kb_mtp_decoder_layers(head), kb_mtp_decoder_layers(head) == 1 ? "" : "s");
        kiln_status_free(hs);
        kb_mtp_free(head);
    }
    if (q.bits) printf("quantized    MLX affine, %d bits, group size %d\n", q.bits, q.group_size);
    printf("tensors      %d, %lld stored elements, %.1f MiB of weights\n", kc_tensor_count(ck), (long long)params,
           (double)bytes / 1048576.0);
    st = print_memory(m, n_ctx, parallel, (kg_dtype)cache_k, (kg_dtype)cache_v);
    kpeak_params pp = {.n_ctx = n_ctx, .parallel = parallel, .n_prompt = n_prompt, .cache_type_k = (kg_dtype)cache_k,
                       .cache_type_v = (kg_dtype)cache_v};
    if (!st) st = print_peak(m, &pp, base);
    ke_model_free(m);
    return st ? kiln_fail(st) : 0;
}
