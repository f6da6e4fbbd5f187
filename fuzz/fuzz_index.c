/* fuzz_index.c: libFuzzer harness for a sharded checkpoint's
 * model.safetensors.index.json. Input: the index's bytes, written into a
 * folder that holds a fixed config.json, two shards
 * (model-00001-of-00002.safetensors: model.embed_tokens.weight and
 * model.norm.weight; model-00002-of-00002.safetensors: lm_head.weight), a
 * third file extra.safetensors (x), a file that is not safetensors
 * (notes.safetensors), a folder (sub.safetensors) and a symbolic link out of
 * the folder (link.safetensors -> /etc/hostname). kc_open must give a
 * checkpoint or an error (never a crash); a checkpoint must find each of
 * its tensors by name, and every weight_map entry must name a tensor it
 * has, in the shard the index says. Build: make fuzz-index. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One folder per process, its index rewritten by every input (the
 * replaying unit test removes it with fi_cleanup). */
static char fi_dir[64];

static void fi_shard(const char *name, const char *header, size_t n_floats) {
    static const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t len;
    uint8_t *b = ckt_raw(header, v, n_floats * sizeof(float), &len);
    if (!b || !ckt_write(fi_dir, name, b, len)) abort();
    free(b);
}

static void fi_setup(void) {
    snprintf(fi_dir, sizeof fi_dir, "/tmp/kiln-fuzz-index-XXXXXX");
    if (!mkdtemp(fi_dir)) abort();
    if (!ckt_write_str(fi_dir, "config.json", "{\"model_type\": \"llama\", \"hidden_size\": 2, \"vocab_size\": 2, \"eos_token_id\": 1}"))
        abort();
    fi_shard("model-00001-of-00002.safetensors",
             "{\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
             "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}",
             6);
    fi_shard("model-00002-of-00002.safetensors", "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 4);
    fi_shard("extra.safetensors", "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"__metadata__\":{\"format\":\"pt\"}}", 1);
    if (!ckt_write_str(fi_dir, "notes.safetensors", "not a safetensors file")) abort();
    char p[128];
    snprintf(p, sizeof p, "%s/sub.safetensors", fi_dir);
    if (mkdir(p, 0700)) abort();
    snprintf(p, sizeof p, "%s/link.safetensors", fi_dir);
    if (symlink("/etc/hostname", p)) abort();
}

__attribute__((unused)) static void fi_cleanup(void) {
    if (!fi_dir[0]) return;
    char p[128];
    snprintf(p, sizeof p, "%s/sub.safetensors", fi_dir);
    rmdir(p);
    ckt_rmdir(fi_dir); /* unlinks the files and the link */
    fi_dir[0] = 0;
}

static int fi_ok; /* indexes that opened (the replaying test checks the seeds do) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fi_dir[0]) fi_setup();
    if (!ckt_write(fi_dir, "model.safetensors.index.json", data, size)) abort();
    kc_checkpoint *c = NULL;
    kiln_status st = kc_open(fi_dir, &c);
    if (st) {
        if (c) abort();
        if (!kiln_status_msg(st)[0]) abort(); /* an error says what is wrong */
        if (getenv("KILN_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 0;
    }
    fi_ok++;
    for (int i = 0; i < kc_tensor_count(c); i++) {
        const kc_tensor *t = kc_tensor_at(c, i);
        if (!t || kc_find(c, t->name) != t) abort();
    }
    /* every entry of the index names a tensor of the shard it says */
    cJSON *idx = cJSON_ParseWithLength((const char *)data, size);
    const cJSON *e;
    cJSON_ArrayForEach(e, ku_json_get(idx, "weight_map")) {
        const kc_tensor *t = kc_find(c, e->string);
        if (!t || !cJSON_IsString(e) || strcmp(t->file, e->valuestring) != 0) abort();
    }
    cJSON_Delete(idx);
    kc_matrix m;
    static float row[2];
    st = kc_get_matrix(c, "lm_head", -1, -1, &m);
    if (!st && m.rows == 2 && m.cols == 2) {
        kc_matrix_row_f32(&m, 1, row);
        if (row[0] != 3 || row[1] != 4) abort();
    }
    kiln_status_free(st);
    kc_close(c);
    return 0;
}
