/* libFuzzer harness: a whole checkpoint folder from arbitrary bytes.
 * Input: 2-byte little-endian length L, L bytes of config.json, then the
 * bytes of model.safetensors. kc_open, then every lookup a model makes
 * (kc_get_matrix on every module, row dequantization, ids, quantization
 * settings) must return a status and never crash. Build and run:
 * make fuzz-checkpoint. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void try_module(const kc_checkpoint *c, const char *module, float *row) {
    kc_matrix m;
    kc_quant q = kc_quant_for(c, module);
    (void)q;
    kiln_status st = kc_get_matrix(c, module, -1, -1, &m);
    if (st) {
        kiln_status_free(st);
        return;
    }
    /* a model checks rows and cols against its config; bound the work here */
    if (m.cols <= 0 || m.cols > 4096 || m.rows > 4096) return;
    for (int64_t r = 0; r < m.rows; r++) kc_matrix_row_f32(&m, r, row);
    /* with the column count a model would pass */
    st = kc_get_matrix(c, module, m.rows, m.cols, &m);
    if (st) abort(); /* what it returned once must resolve again */
}

/* One folder per process, rewritten by every input (the unit test that
 * replays the corpus removes it). */
static char fz_dir[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static float row[4096];
    if (!fz_dir[0]) {
        snprintf(fz_dir, sizeof fz_dir, "/tmp/kiln-fuzz-ckpt-XXXXXX");
        if (!mkdtemp(fz_dir)) abort();
    }
    if (size < 2) return 0;
    size_t L = (size_t)data[0] | (size_t)data[1] << 8;
    if (L > size - 2) L = size - 2;
    if (!ckt_write(fz_dir, "config.json", data + 2, L) || !ckt_write(fz_dir, "model.safetensors", data + 2 + L, size - 2 - L))
        abort();
    kc_checkpoint *c = NULL;
    kiln_status st = kc_open(fz_dir, &c);
    if (st) {
        if (c) abort();
        kiln_status_free(st);
        return 0;
    }
    int32_t ids[4];
    int n;
    kiln_status_free(kc_eos_ids(c, ids, 4, &n));
    (void)kc_bos_id(c);
    for (int i = 0; i < kc_tensor_count(c); i++) {
        const kc_tensor *t = kc_tensor_at(c, i);
        if (!t) continue;
        size_t nl = strlen(t->name);
        char module[256];
        if (nl > 7 && nl - 7 < sizeof module &&
            (strcmp(t->name + nl - 7, ".weight") == 0 || strcmp(t->name + nl - 7, ".scales") == 0)) {
            memcpy(module, t->name, nl - 7);
            module[nl - 7] = 0;
            try_module(c, module, row);
        }
        const kc_tensor *g;
        st = kc_get_tensor(c, t->name, t->rank, t->shape, &g);
        if (!st && g != t) abort();
        kiln_status_free(st);
    }
    kc_close(c);
    return 0;
}
