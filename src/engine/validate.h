/* validate.h: the oracle gate (prefix kv_), as ../shared/oracle/README.md
 * defines it, on one fixture folder (config, weights, oracle.json,
 * logits.npy):
 *   1. teacher-forced logits: all_ids in one prefill, the 25 rows compared
 *      with logits.npy (max |diff| <= tolerance);
 *   2. the same through the decode path: prompt prefill, then one forced id
 *      per step;
 *   3. the same through the batched path: the fixture's sequence in chunks of
 *      5 tokens, batched with two other sequences of other lengths that are
 *      prefilled and decoded alongside;
 *   4. free-running greedy ids equal generated_ids up to the first near-tie
 *      (top1_top2_gap below the tolerance).
 */
#ifndef KILN_VALIDATE_H
#define KILN_VALIDATE_H

#include <stdbool.h>

#include "base/status.h"
#include "passes/passes.h"

typedef struct {
    double tolerance;   /* 0: 1e-3 */
    int n_threads;      /* 0: all CPUs */
    kp_options compile; /* e.g. decompose_all to run the reference decompositions */
    bool skip_batched;
    const char *oracle_dir; /* oracle.json and logits.npy from here (default: the model folder) */
} kv_options;

typedef struct {
    bool pass;
    double diff_prefill, diff_decode, diff_batched; /* max |logit - oracle| per path */
    int greedy_ok, greedy_total;                    /* ids checked equal / generated */
    int first_tie;                                  /* first near-tie step, or greedy_total */
    char reason[512];                               /* why it failed */
    /* vision-language fixtures (a vision_config): the stages before the text */
    bool vision;
    double diff_pixels;   /* image.png preprocessed vs pixel_values.npy; -1: no image.png */
    double diff_features; /* tower + projector on pixel_values.npy vs image_features.npy */
    int prompt_diff_at;   /* oracle.json's prompt_text with kiln's image block (kvis_expand_prompt of the
                           * preprocessed image.png) vs prompt_ids: the first position that differs; -1:
                           * equal or nothing to check (no prompt_text) */
    bool prompt_checked;  /* prompt_text was expanded and compared */
} kv_result;

/* Runs the gate on dir. An error status means the fixture could not be
 * evaluated (unreadable oracle, model failed to load); a failed gate is a
 * successful call with r->pass false. */
kiln_status kv_validate(const char *dir, const kv_options *o, kv_result *r);

#endif
