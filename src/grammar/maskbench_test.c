/* maskbench_test.c: the committed MaskBench files (tests/fixtures/maskbench:
 * 252 small schemas from every source, chosen to cover the feature list)
 * through kgr_bench_file with the outcome each must have (expected.txt:
 * "file outcome"). A compile error is an outcome too: it must stay one until
 * the keyword is honoured (then update the list). Each file runs again
 * with mask classes (kgr_mask_classes): the digest of every mask must be
 * the same, bit for bit, and again without member groups (kgr_mask_groups,
 * on by default): the same masks again. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "grammar/gr_int.h"
#include "grammar/grammar.h"
#include "kt.h"

KT_TEST(grammar_maskbench_committed) {
    if (!kt_shared()) {
        kt_skip("../shared absent (the Llama-3.1 tokenizer MaskBench uses)");
        return;
    }
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/tokenizers/llama3_1", kt_shared());
    ktok *tok;
    KT_CHECK(ktok_load(dir, &tok) == NULL);
    int32_t eos = ktok_eos_id(tok);
    kgr_vocab *v;
    KT_CHECK(kgr_vocab_create(tok, ktok_vocab_size(tok), &eos, 1, &v) == NULL);
    char *list;
    size_t len;
    KT_CHECK(ku_read_file(kt_path(path, sizeof path, "tests/fixtures/maskbench/expected.txt"), &list, &len) == NULL);
    int n = 0, bad = 0;
    int64_t hits = kgr_mask_class_hits(), ghits = kgr_mask_group_hits();
    for (char *line = strtok(list, "\n"); line; line = strtok(NULL, "\n")) {
        char file[256], want[32];
        if (sscanf(line, "%255s %31s", file, want) != 2) continue;
        char rel[400], *text;
        size_t tl;
        snprintf(rel, sizeof rel, "tests/fixtures/maskbench/%s", file);
        KT_CHECK(ku_read_file(kt_path(path, sizeof path, rel), &text, &tl) == NULL);
        kgr_bench_result r;
        kiln_status st = kgr_bench_file(text, tl, tok, v, &r);
        KT_CHECKF(!st, "%s: %s", file, kiln_status_msg(st));
        kgr_bench_result rc;
        kgr_mask_classes(true);
        st = kgr_bench_file(text, tl, tok, v, &rc);
        kgr_mask_classes(false);
        KT_CHECKF(!st, "%s (mask classes): %s", file, kiln_status_msg(st));
        KT_CHECKF(rc.digest == r.digest && rc.outcome == r.outcome && rc.n_tbm == r.n_tbm, "%s: the masks differ with mask classes", file);
        kgr_bench_result_free(&rc);
        kgr_mask_groups(false);
        st = kgr_bench_file(text, tl, tok, v, &rc);
        kgr_mask_groups(true);
        free(text);
        KT_CHECKF(!st, "%s (no member groups): %s", file, kiln_status_msg(st));
        KT_CHECKF(rc.digest == r.digest && rc.outcome == r.outcome && rc.n_tbm == r.n_tbm, "%s: the masks differ without member groups", file);
        kgr_bench_result_free(&rc);
        if (strcmp(kgr_outcome_name(r.outcome), want)) {
            fprintf(stderr, "  %s: %s, want %s (%s)\n", file, kgr_outcome_name(r.outcome), want, r.error);
            bad++;
        }
        KT_CHECKF(r.outcome != KGR_INVALIDATION_ERROR, "%s lets through an invalid instance: %s", file, r.error);
        kgr_bench_result_free(&r);
        n++;
    }
    free(list);
    kgr_vocab_free(v);
    ktok_free(tok);
    KT_CHECKF(n >= 200, "only %d files listed", n);
    KT_CHECKF(bad == 0, "%d of %d files changed outcome", bad, n);
    hits = kgr_mask_class_hits() - hits;
    KT_CHECKF(hits >= 50, "only %lld masks made from a class's: the classes are not exercised", (long long)hits);
    ghits = kgr_mask_group_hits() - ghits;
    KT_CHECKF(ghits >= 50, "only %lld masks made from member groups: they are not exercised", (long long)ghits);
}
