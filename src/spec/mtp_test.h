/* mtp_test.h: a checkpoint with a multi-token-prediction layer for tests
 * (defined in mtp_test.c): the qwen2 oracle fixture as MiMo with random
 * model.mtp_layers.0.* weights (no fixture carries MTP weights). */
#ifndef KILN_SPEC_MTP_TEST_H
#define KILN_SPEC_MTP_TEST_H

#include <stdbool.h>
#include <stddef.h>

/* Writes it into a new temporary folder (dir); the caller removes it with
 * ckt_rmdir. False (test failed) when it cannot. */
bool kspec_test_mtp_model(char *dir, size_t cap);

#endif
