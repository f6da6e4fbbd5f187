/* mtp.h: a checkpoint's multi-token-prediction head as a proposer (part of
 * src/spec, prefix kspec_mtp_).
 *
 * The head is a model of its own (models/blocks.h, "multi-token prediction
 * heads": DeepSeek-V3 / GLM-4.5 / GLM-5 nextn layers, Qwen3-Next / Qwen3.5
 * / EXAONE-MoE mtp.*, MiMo model.mtp_layers.*, Nemotron-H mtp.layers.<i>.*,
 * DeepSeek-V4 mtp.<i>.*),
 * its decoder layers built by the family's blocks
 * and compiled like any model's graph, with its own paged KV cache (a
 * ke_ctx). Its row at position p joins the main model's last hidden state h_p
 * (after the final norm; DeepSeek-V4's residual streams before hc_head;
 * km_state_width floats given per token through ke_inputs.embd) with the
 * token t_{p+1}, and reads [vocab + km_state_width]: logits guessing
 * t_{p+2}, then the state a chained guess is fed as its h. */
#ifndef KILN_SPEC_MTP_H
#define KILN_SPEC_MTP_H

#include "engine/engine.h"

typedef struct kspec_mtp kspec_mtp;
/* The head of target's checkpoint; errors name --spec-mtp and the problem
 * (no MTP layers, a layout kiln does not serve). */
kiln_status kspec_mtp_load(const ke_model *target, kspec_mtp **out);
void kspec_mtp_free(kspec_mtp *m);
/* The head as a model (borrowed): ke_ctx_create with .pooling = true. */
const ke_model *kspec_mtp_model(const kspec_mtp *m);
/* "DeepSeek-V3 / GLM nextn (model.layers.<n>.*)", ... */
const char *kspec_mtp_layout(const kspec_mtp *m);

#endif
