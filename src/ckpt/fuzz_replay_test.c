/* Replays the fuzzers' seed corpora and every input they ever crashed on
 * (tests/data/ckpt/fuzz-*) through the harnesses themselves, so `make test`
 * and `make asan` keep those inputs fixed. */
#define LLVMFuzzerTestOneInput fuzz_st_input
#include "../../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_ck_input
#include "../../fuzz/fuzz_checkpoint.c"
#undef LLVMFuzzerTestOneInput

#include <dirent.h>

#include "base/file.h"
#include "ckpt/ckpt_test.h"
#include "kt.h"

static int replay(const char *rel, int (*fn)(const uint8_t *, size_t)) {
    char d[4096];
    kt_path(d, sizeof d, rel);
    DIR *dd = opendir(d);
    if (!dd) return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(dd))) {
        if (de->d_name[0] == '.') continue;
        char p[8192], *data;
        size_t len;
        snprintf(p, sizeof p, "%s/%s", d, de->d_name);
        kiln_status st = ku_read_file(p, &data, &len);
        if (st) {
            kiln_status_free(st);
            continue;
        }
        uint8_t *exact = malloc(len ? len : 1); /* exact size: ASan sees any over-read */
        memcpy(exact, data, len);
        free(data);
        fn(exact, len);
        free(exact);
        n++;
    }
    closedir(dd);
    return n;
}

KT_TEST(fuzz_safetensors_corpus_replays) {
    int n = replay("tests/data/ckpt/fuzz-seeds", fuzz_st_input) + replay("tests/data/ckpt/fuzz-regress", fuzz_st_input);
    KT_CHECK(n > 0);
}

KT_TEST(fuzz_checkpoint_corpus_replays) {
    int n = replay("tests/data/ckpt/fuzz-seeds-checkpoint", fuzz_ck_input) +
            replay("tests/data/ckpt/fuzz-regress-checkpoint", fuzz_ck_input);
    if (fz_dir[0]) ckt_rmdir(fz_dir);
    fz_dir[0] = 0;
    KT_CHECK(n > 0);
}
