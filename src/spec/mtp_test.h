/* mtp_test.h: checkpoints with a multi-token-prediction layer for tests
 * (defined in mtp_test.c; no fixture carries MTP weights): an oracle fixture
 * with random MTP weights in one of the layouts kiln serves, its decoder
 * layer shaped as one of the fixture's own layers. */
#ifndef KILN_SPEC_MTP_TEST_H
#define KILN_SPEC_MTP_TEST_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    KSPEC_TEST_MIMO,       /* qwen2 as MiMo, model.mtp_layers.0.* */
    KSPEC_TEST_GLM,        /* glm4_moe with a nextn layer model.layers.2.* (a mixture of experts) */
    KSPEC_TEST_QWEN35,     /* qwen3_5_text with mtp.* (dense MLP, tied head) */
    KSPEC_TEST_DEEPSEEK,   /* deepseek_v3 with a nextn layer (MLA, experts) and its own shared_head.head */
    KSPEC_TEST_QWEN3_NEXT, /* qwen3_next with mtp.* (experts with a shared one) */
    KSPEC_TEST_NEMOTRON_H, /* nemotron_h with mtp.layers.0 (attention) and .1 (relu^2 experts) */
    KSPEC_TEST_EXAONE_MOE, /* exaone_moe with mtp.* (sliding qk-norm attention, the dense MLP) */
    KSPEC_TEST_GLM5,       /* glm_moe_dsa with a nextn layer (MLA with the lightning indexer's top 4 keys, experts) */
    KSPEC_TEST_GLM4_LITE,  /* glm4_moe_lite with a nextn layer (MLA, experts) */
    KSPEC_TEST_QWEN35_MOE, /* qwen3_5_moe_text with mtp.* (experts with a gated shared one) */
    KSPEC_TEST_DEEPSEEK_V4, /* deepseek_v4 with mtp.0.* (hyper-connections, sliding attention with sinks, experts) */
    KSPEC_TEST_N
} kspec_test_layout;

/* The fixture it is made from ("qwen2", ...). */
const char *kspec_test_mtp_fixture(kspec_test_layout which);
/* Writes it into a new temporary folder (dir); the caller removes it with
 * ckt_rmdir. False (test failed) when it cannot. */
bool kspec_test_mtp_model(kspec_test_layout which, char *dir, size_t cap);

#endif
