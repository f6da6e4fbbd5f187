/* peak.h: the peak RSS a run of a model will reach, predicted before it
 * runs (`kiln info`), prefix kpeak_.
 *
 * A run here is one context of n_ctx tokens per sequence and `parallel`
 * sequences (kiln generate / chat: 1; kiln serve --parallel N; kiln bench
 * -p P --batch N): a prompt of n_prompt tokens in one step, then decoding
 * until the context is full, alone and `parallel` sequences together. Its
 * peak is the sum of
 *   base      what the process holds before it runs (the program, its
 *             libraries, the model's host structures: the caller measures
 *             it, kpeak_rss_now, after loading the model);
 *   weights   the checkpoint's tensors the steps read in full (mapped
 *             pages: every step reads them all); an embedding table that
 *             is only looked up counts whole too (lookups fault it in a
 *             page-cache folio at a time);
 *   repacked  with --int8-act, the repacked copies of the 4/8-bit
 *             linears (kk_prepare), which replace their sources: those
 *             leave `weights` (kk_int8_pack drops their pages as it
 *             copies them, and a tied embedding is looked up in the copy);
 *   kv        the KV cache of n_ctx * parallel tokens of its types and the
 *             recurrent state rows (ke_memory_ctx_bytes: a full context
 *             writes it all);
 *   arenas    the activation arena of every executable the run compiles
 *             (kept for the context's life, zeroed when made): the prompt
 *             step, and the decode steps for each power-of-two block-table
 *             width up to the context, for 1 and `parallel` sequences;
 *   scratch   the largest step's per-call buffers: the rotary tables and
 *             the kernels' thread scratch (the widest linear's input
 *             reordered, or quantized to int8).
 * See docs/performance.md ("Memory") for the measured error. */
#ifndef KILN_PEAK_H
#define KILN_PEAK_H

#include <stdint.h>

#include "base/status.h"
#include "engine/engine.h"

typedef struct {
    int64_t n_ctx;    /* tokens per sequence; 0: the model's default (ke_memory.default_n_ctx) */
    int64_t parallel; /* sequences; 0: 1 */
    int64_t n_prompt; /* tokens of the prompt step; 0: n_ctx; capped at n_ctx */
    int n_threads;    /* 0: one per CPU */
    kg_dtype cache_type_k, cache_type_v; /* the KV cache's types (-ctk / -ctv; 0: f32) */
} kpeak_params;

typedef struct {
    int64_t base, weights, repacked, kv, arenas, scratch;
    int64_t total;   /* their sum */
    int executables; /* compiled for the arenas */
} kpeak;

/* The prediction for m as this process is set up (kk_act_int8: --int8-act). */
kiln_status kpeak_predict(const ke_model *m, const kpeak_params *p, int64_t base, kpeak *out);
/* This process's resident bytes now (VmRSS), or -1 when /proc cannot be read. */
int64_t kpeak_rss_now(void);
/* Its peak so far (VmHWM), or -1. */
int64_t kpeak_rss_peak(void);

#endif
