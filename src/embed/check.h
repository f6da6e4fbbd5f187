/* check.h: embedding / reranking oracle folders (fixtures-embed) against
 * kiln, the README's gate per run and variant (prefix kemb_). */
#ifndef KILN_EMBED_CHECK_H
#define KILN_EMBED_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* True when dir/oracle.json is an embedding, cross-encoder or decoder
 * reranker oracle ("kind" embed, cross_encoder, decoder_rerank). */
bool kemb_is_fixture(const char *dir);
/* Runs dir: every run of its oracle.json ("single", "batch", "batchright")
 * against its arrays. Appends a title line and one line per run (PASS/FAIL
 * with the figures) to rep; *pass: all passed. An error means the folder
 * could not be run. */
kiln_status kemb_check(const char *dir, char *rep, size_t cap, bool *pass);
/* kemb_check on dir and its f16/, bf16/, q8/ variants. */
kiln_status kemb_check_tree(const char *dir, char *rep, size_t cap, bool *pass);

#endif
