/* Replays the fuzzers' seed corpora and every input they ever crashed on
 * (tests/data/ckpt/fuzz-*; the shard index's: fuzz/corpus_index,
 * fuzz/regress_index) through the harnesses themselves, so `make test`
 * and `make asan` keep those inputs fixed. */
#define LLVMFuzzerTestOneInput fuzz_st_input
#include "../../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_ck_input
#include "../../fuzz/fuzz_checkpoint.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_index_input
#include "../../fuzz/fuzz_index.c"
#undef LLVMFuzzerTestOneInput

#include "ckpt/ckpt_test.h"
#include "kt.h"

KT_TEST(fuzz_safetensors_corpus_replays) {
    int n = kt_replay("tests/data/ckpt/fuzz-seeds", fuzz_st_input) + kt_replay("tests/data/ckpt/fuzz-regress", fuzz_st_input);
    KT_CHECK(n > 0);
}

KT_TEST(fuzz_checkpoint_corpus_replays) {
    int n = kt_replay("tests/data/ckpt/fuzz-seeds-checkpoint", fuzz_ck_input) +
            kt_replay("tests/data/ckpt/fuzz-regress-checkpoint", fuzz_ck_input);
    if (fz_dir[0]) ckt_rmdir(fz_dir);
    fz_dir[0] = 0;
    KT_CHECK(n > 0);
}

KT_TEST(fuzz_index_corpus_replays) {
    int n = kt_replay("fuzz/corpus_index", fuzz_index_input), ok = fi_ok;
    kt_replay("fuzz/regress_index", fuzz_index_input);
    fi_cleanup();
    KT_CHECK(n >= 15);
    KT_CHECKF(ok == 3, "%d of the 3 good seed indexes opened", ok); /* full, partial, with_extra; the err_ ones are refused */
}
