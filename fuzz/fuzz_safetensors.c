/* libFuzzer harness: kc_st_parse on arbitrary bytes must return a status and
 * never crash, leak or read out of bounds; on success every tensor's bytes
 * must be readable and aligned. Build and run: make fuzz-safetensors. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kc_safetensors *s = NULL;
    kiln_status st = kc_st_parse(data, size, "fuzz.safetensors", &s);
    if (st) {
        if (s || !kiln_status_msg(st)[0]) abort();
        kiln_status_free(st);
        return 0;
    }
    volatile uint8_t acc = 0; /* keeps the reads */
    for (int i = 0; i < kc_st_count(s); i++) {
        const kc_tensor *t = kc_st_at(s, i);
        size_t es = kc_dtype_size(t->dtype);
        if (!t->data || !es || (uintptr_t)t->data % es || kc_st_find(s, t->name) != t) abort();
        if ((size_t)kc_tensor_numel(t) * es != t->nbytes) abort();
        for (size_t k = 0; k < t->nbytes; k++) acc ^= ((const uint8_t *)t->data)[k];
    }
    kc_st_close(s);
    return 0;
}
