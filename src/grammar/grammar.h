/* grammar.h: constrained decoding (prefix kgr_).
 *
 * A grammar is a context-free grammar over bytes. It comes from GBNF
 * (llama.cpp's format), a regular expression, a list of choices, or a JSON
 * Schema (compiled to GBNF first, which kgr_schema_to_gbnf shows). Paired
 * with a vocabulary it becomes an index: a pushdown recognizer determinized
 * lazily (each parser state is a hash-consed set of stacks, its transitions
 * are cached per byte class), and each state's token mask is computed once,
 * by walking a trie of the tokens' bytes, then cached.
 *
 *     kgr_grammar *g;  KILN_TRY(kgr_from_json_schema(text, len, NULL, &g));
 *     kgr_vocab *v;    KILN_TRY(kgr_vocab_create(tok, n_vocab, eos, n_eos, &v));
 *     kgr_index *ix;   KILN_TRY(kgr_index_create(g, v, &ix));   // g, v borrowed
 *     kgr_matcher *m;  KILN_TRY(kgr_matcher_create(ix, &m));    // one per sequence
 *     loop: kgr_matcher_mask(m, bits); ...sample...; kgr_matcher_accept(m, tok);
 *           kgr_matcher_prefetch(m);   // the next mask, while the forward pass runs
 *
 * An index may be shared by many matchers on many threads (it locks); a
 * matcher belongs to one sequence, so outputs never depend on neighbours. The
 * caches only change timing, never a mask.
 *
 * Whitespace in JSON is bounded (kgr_opts.max_ws), so a constrained model
 * cannot emit whitespace forever. Left-recursive grammars are refused. */
#ifndef KILN_GRAMMAR_H
#define KILN_GRAMMAR_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

typedef struct kgr_grammar kgr_grammar;

typedef struct {
    int32_t max_ws;       /* JSON: whitespace bytes allowed in a row (default 4); 0: none */
    bool compact;         /* JSON: no whitespace at all between tokens (overrides max_ws) */
    bool additional_properties; /* JSON Schema: an object without additionalProperties takes
                                 * unlisted keys (the spec's default: true) */
} kgr_opts;
void kgr_opts_default(kgr_opts *o);

/* ---- grammars (NULL opts: the defaults) ---- */
/* GBNF: `name ::= alternatives`, "literals", [classes], [^negated], ., groups,
 * * + ? {m} {m,} {m,n}, # comments; the start rule is `root`. Errors give the
 * line and column. */
kiln_status kgr_from_gbnf(const char *text, size_t len, kgr_grammar **out);
/* Special tokens as terminals, as llama.cpp's GBNF: <[id]> is token id, and
 * <TEXT> (with a vocabulary) the token whose text is "<TEXT>" (e.g.
 * <|channel|>). A special token matches only itself: no text spells it, and
 * its text as a "literal" does not match it. A reference to an ordinary
 * token matches its text. !<...> (any token but one) is refused.
 * kgr_from_gbnf takes <[id]> only; kgr_index_create refuses an id that is
 * not a special token of its vocabulary. */
struct kgr_vocab;
kiln_status kgr_from_gbnf_vocab(const char *text, size_t len, const struct kgr_vocab *v, kgr_grammar **out);
/* A whole-string match of an ECMAScript-style regex (no backreferences or
 * lookaround: those are errors). */
kiln_status kgr_from_regex(const char *re, kgr_grammar **out);
/* Exactly one of the strings. */
kiln_status kgr_from_choices(const char *const *v, int32_t n, kgr_grammar **out);
/* JSON Schema (drafts 4 to 2020-12). A keyword it cannot honour is an error
 * naming the keyword and its JSON pointer ("unsupported keyword
 * 'uniqueItems' at #/properties/tags"); so is a format a draft defines that it lacks
 * (other format names are annotations).
 * Properties must come in the schema's order. json_object: pass
 * {"type":"object","additionalProperties":true}. */
kiln_status kgr_from_json_schema(const char *text, size_t len, const kgr_opts *o, kgr_grammar **out);
kiln_status kgr_from_schema(const cJSON *schema, const kgr_opts *o, kgr_grammar **out);
/* The GBNF the schema compiles to (malloc'ed), for tools that embed a
 * schema in a larger grammar (e.g. tool-call arguments): the schema's root
 * rule is named `root`; its other rules are prefixed with prefix (may be "" or NULL). */
kiln_status kgr_schema_to_gbnf(const cJSON *schema, const kgr_opts *o, const char *prefix, char **gbnf);
/* regex -> GBNF rule body (malloc'ed); json_string: the body matches the
 * JSON string (quotes included) whose content the regex matches in full. */
kiln_status kgr_regex_to_gbnf(const char *re, bool json_string, char **body);
void kgr_grammar_free(kgr_grammar *g);
int32_t kgr_grammar_rules(const kgr_grammar *g);

/* ---- vocabulary: the tokens' bytes as a trie ---- */
typedef struct kgr_vocab kgr_vocab;
/* n_vocab: rows of the logits (may exceed the tokenizer's). Special tokens
 * are allowed only where the grammar names them (<[id]>, <|name|>), and the
 * eos ids where the grammar may end. */
kiln_status kgr_vocab_create(const ktok *tok, int32_t n_vocab, const int32_t *eos, int32_t n_eos,
                             kgr_vocab **out);
/* Tests: tokens given as byte strings (lens[i] bytes each). */
kiln_status kgr_vocab_from_strings(const char *const *tokens, const int32_t *lens, int32_t n,
                                   int32_t eos, kgr_vocab **out);
/* Tests: the 256 one-byte tokens (id = the byte) and an EOS (id 256). */
kiln_status kgr_vocab_bytes(kgr_vocab **out);
void kgr_vocab_free(kgr_vocab *v);
int32_t kgr_vocab_size(const kgr_vocab *v);

/* ---- index: grammar x vocabulary (borrows both) ---- */
typedef struct kgr_index kgr_index;
kiln_status kgr_index_create(const kgr_grammar *g, const kgr_vocab *v, kgr_index **out);
void kgr_index_free(kgr_index *ix);

/* ---- matcher: one sequence's position in the grammar ---- */
typedef struct kgr_matcher kgr_matcher;
kiln_status kgr_matcher_create(kgr_index *ix, kgr_matcher **out);
/* A matcher with its own index over g (taken over: freed with the matcher);
 * for one sequence that owns its grammar. */
kiln_status kgr_matcher_create_owned(kgr_grammar *g, const kgr_vocab *v, kgr_matcher **out);
void kgr_matcher_free(kgr_matcher *m);
/* Allowed tokens as bits: bits[id / 32] >> (id % 32) & 1, words =
 * ceil(n_vocab / 32). EOS ids are set only where the grammar may end.
 * An error (a grammar too ambiguous to track) leaves bits all clear. */
kiln_status kgr_matcher_mask(kgr_matcher *m, uint32_t *bits);
/* The same mask without a copy: *bits is borrowed (the index's cached mask,
 * or the matcher's own buffer), valid until the matcher's next call or
 * until it is freed; never written by anyone while valid. */
kiln_status kgr_matcher_mask_ref(kgr_matcher *m, const uint32_t **bits);
/* Starts computing the mask of the matcher's current state on a worker of
 * the process's prefetch pool (shared by every index, at most the spare
 * cores' count of threads, at least 1 and at most 8; started on demand,
 * joined when the last index that used it is freed), so that the
 * next kgr_matcher_mask / _mask_ref, which wait for it, find it done: call
 * it after kgr_matcher_accept, before the forward pass that the mask
 * waits for. The mask is the one computed without it, bit for bit (the
 * same function under the same lock, only earlier). Nothing when the mask
 * is cached already; without a thread, nothing either (the mask is then
 * computed when asked). Any later call on the matcher takes it back from
 * the worker; it ends the borrow of a _mask_ref mask. */
kiln_status kgr_matcher_prefetch(kgr_matcher *m);
/* Advances by a token; an EOS id ends the matcher. A token the mask forbids
 * is an error (the sequence must stop). */
kiln_status kgr_matcher_accept(kgr_matcher *m, int32_t tok);
/* Advances by raw bytes (a forced prefix, a trigger's text); false when the
 * grammar forbids them (the matcher is then unchanged). */
bool kgr_matcher_accept_bytes(kgr_matcher *m, const char *s, size_t n);
bool kgr_matcher_can_end(const kgr_matcher *m); /* the text so far is complete */
/* Nothing more is possible: complete and no byte may follow, or EOS seen. */
bool kgr_matcher_done(const kgr_matcher *m);

/* ---- MaskBench (../shared/maskbench/README.md) ---- */
/* v as Python's json.dumps(v, ensure_ascii=False) writes it (malloc'ed). */
char *kgr_json_dumps(const cJSON *v);
/* The same where lit gives a number node's source text (NULL: unknown): a
 * literal with a fraction or exponent is a Python float (12345.0 stays
 * 12345.0), others exact ints. */
char *kgr_json_dumps_lits(const cJSON *v, const char *(*lit)(void *ud, const cJSON *n, size_t *len), void *ud);

typedef enum { KGR_PASS, KGR_COMPILE_ERROR, KGR_VALIDATION_ERROR, KGR_INVALIDATION_ERROR } kgr_outcome;
const char *kgr_outcome_name(kgr_outcome o); /* "pass", "compile_error", ... */

typedef struct {
    kgr_outcome outcome;    /* the first failure (invalidation before validation) */
    int32_t tests, validation_errors, invalidation_errors;
    double ttfm_us;          /* compile + first mask */
    double *tbm_us;          /* [n_tbm] malloc'ed: every later mask */
    int64_t n_tbm, tokens;
    uint64_t digest;         /* of every mask computed, in order (kgr_mask_digest): equal
                              * digests, equal masks, whatever the engine's speed */
    char error[256];         /* the compile error, or the first failing test */
} kgr_bench_result;

/* Runs one MaskBench file (JSON text): compile the schema, then walk every
 * test's tokens (tok: no special tokens) checking the mask before each. */
kiln_status kgr_bench_file(const char *json, size_t len, const ktok *tok, const kgr_vocab *v,
                           kgr_bench_result *r);
void kgr_bench_result_free(kgr_bench_result *r);
/* h folded with the mask bits[0, words) (a 64-bit hash; order matters) */
uint64_t kgr_mask_digest(uint64_t h, const uint32_t *bits, size_t words);
/* Times with the thread's CPU clock instead of the wall clock (on a shared
 * machine, where other processes' time slices inflate wall-clock tails). */
void kgr_bench_cpu_time(bool on);
/* Whether indexes created from now on compute a new state's mask from its
 * mask class's (a cut of its stacks; the same masks bit for bit, see
 * engine.c). Off by default: on MaskBench it is no faster. */
void kgr_mask_classes(bool on);
/* Whether indexes created from now on compute a mask from the state's
 * member groups (its stacks split by their %perm frame, each cut there; the
 * same masks bit for bit, see engine.c). On by default. */
void kgr_mask_groups(bool on);

#endif
