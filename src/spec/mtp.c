/* mtp.c: the multi-token-prediction head (see mtp.h). */
#include "spec/mtp.h"

#include <stdlib.h>

#include "models/blocks.h"

struct kspec_mtp {
    kb_mtp *head;   /* its family and hyper-parameters (the model borrows them) */
    ke_model *model;
};

void kspec_mtp_free(kspec_mtp *m) {
    if (!m) return;
    ke_model_free(m->model);
    kb_mtp_free(m->head);
    free(m);
}

kiln_status kspec_mtp_load(const ke_model *target, kspec_mtp **out) {
    *out = NULL;
    const kc_checkpoint *ck = ke_model_checkpoint(target);
    kspec_mtp *m = calloc(1, sizeof *m);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kb_mtp_open(ke_model_family(target), ke_model_hparams(target), ck, &m->head);
    if (!st) st = ke_model_load_as(kc_dir(ck), kb_mtp_family(m->head), kb_mtp_hparams(m->head), &m->model);
    if (st) {
        kspec_mtp_free(m);
        return kiln_status_wrap(st, "--spec-mtp");
    }
    *out = m;
    return NULL;
}

const ke_model *kspec_mtp_model(const kspec_mtp *m) { return m->model; }
const char *kspec_mtp_layout(const kspec_mtp *m) { return kb_mtp_layout(m->head); }
