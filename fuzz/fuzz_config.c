/* fuzz_config.c: libFuzzer harness for config.json into hyper-parameters.
 * Input: one byte, then the text of a config.json, opened as the engine
 * does (kc_open of a folder with it and a one-tensor model.safetensors: its
 * Python-style JSON, its text_config). The family is the one serving the
 * model_type when it names one, else the byte picks a registered model_type
 * (every family is reachable). km_parse must return a status and never
 * crash, whatever the text; so must kvis_load on a config with a
 * vision_config (its hyper-parameters are read before any tower weight,
 * which the one-tensor folder lacks). Build: make fuzz-config. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"
#include "models/family.h"
#include "vision/vision.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every registered model_type, from km_supported_list's "a, b, c". */
static char fz_types_buf[8192];
static const char *fz_types[512];
static int fz_n_types;
static int fz_ok;  /* inputs that parsed (the replaying test checks the seeds do) */
static int fz_vis; /* inputs whose vision_config went to kvis_load */

static void fz_types_init(void) {
    km_supported_list(fz_types_buf, sizeof fz_types_buf);
    for (char *p = fz_types_buf; *p && fz_n_types < 512;) {
        fz_types[fz_n_types++] = p;
        char *c = strstr(p, ", ");
        if (!c) break;
        *c = 0;
        p = c + 2;
    }
}

/* One folder per process, rewritten by every input (the replaying unit test removes it). */
static char fz_dir[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static km_hparams hp; /* large (per-layer arrays): not on the stack */
    if (!fz_n_types) fz_types_init();
    if (size < 1 || !fz_n_types) return 0;
    if (!fz_dir[0]) {
        snprintf(fz_dir, sizeof fz_dir, "/tmp/kiln-fuzz-config-XXXXXX");
        if (!mkdtemp(fz_dir)) abort();
        size_t sl;
        uint8_t *w = ckt_raw("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", NULL, 4, &sl);
        if (!ckt_write(fz_dir, "model.safetensors", w, sl)) abort();
        free(w);
    }
    if (!ckt_write(fz_dir, "config.json", data + 1, size - 1)) abort();
    kc_checkpoint *c = NULL;
    kiln_status st = kc_open(fz_dir, &c);
    if (st) {
        if (c) abort();
        kiln_status_free(st);
        return 0;
    }
    const km_family *f = km_family_find(kc_model_type(c));
    if (!f) f = km_family_find(fz_types[data[0] % fz_n_types]);
    if (!f) abort(); /* a listed model_type must resolve */
    memset(&hp, 0, sizeof hp);
    st = km_parse(f, kc_config(c), &hp);
    fz_ok += !st;
    if (st && getenv("KILN_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s\n", kiln_status_msg(st));
    if (!st && ku_json_get(kc_root_config(c), "vision_config")) {
        kvis_model *vm = NULL;
        st = kvis_load(c, &hp, &vm);
        if (st && vm) abort(); /* an error leaves no model */
        kvis_free(vm);
        fz_vis++;
    }
    kiln_status_free(st);
    kc_close(c);
    return 0;
}
