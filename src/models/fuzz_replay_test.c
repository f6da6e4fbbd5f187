/* Replays the config fuzzer's seeds (fuzz/corpus_config: every oracle
 * fixture's config.json, vlm_*: the vision-language ones) and every input it crashed on (fuzz/regress_config)
 * through the harness itself, so `make test` and `make asan` keep them fixed. */
#define LLVMFuzzerTestOneInput fuzz_config_input
#include "../../fuzz/fuzz_config.c"
#undef LLVMFuzzerTestOneInput

#include "kt.h"

KT_TEST(fuzz_config_corpus_replays) {
    int n = kt_replay("fuzz/corpus_config", fuzz_config_input), ok = fz_ok;
    kt_replay("fuzz/regress_config", fuzz_config_input);
    if (fz_dir[0]) ckt_rmdir(fz_dir);
    fz_dir[0] = 0;
    KT_CHECK(n > 100);
    KT_CHECKF(ok == n, "%d of %d seed configs parse", ok, n); /* the seeds are the oracle fixtures' configs: each parses */
    KT_CHECK(fz_n_types > 100); /* every registered model_type was listed */
    KT_CHECKF(fz_vis >= 18, "%d seeds reached kvis_load", fz_vis); /* the vision-language seeds (vlm_*.json) */
}
