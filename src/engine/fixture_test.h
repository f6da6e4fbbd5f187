/* fixture_test.h: helpers shared by the engine's and the scheduler's tests
 * (defined in blocks_test.c). */
#ifndef KILN_ENGINE_FIXTURE_TEST_H
#define KILN_ENGINE_FIXTURE_TEST_H

#include "engine/engine.h"

/* Loads tests/fixtures/oracle/<name>; on failure fails the test (kt_fail)
 * and returns NULL. */
ke_model *ke_test_load_fixture(const char *name);

#endif
