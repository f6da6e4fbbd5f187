/* gr_int.h: the grammar module's internals.
 *
 * A compiled grammar is llama.cpp's flat layout over bytes: rule r's
 * elements start at el[start[r]]: sequences of KE_BYTES (a 256-bit set) and
 * KE_REF (a rule) separated by KE_ALT and closed by KE_END. Code points are
 * lowered to UTF-8 byte sequences at parse time. */
#ifndef KILN_GR_INT_H
#define KILN_GR_INT_H

#include "grammar/grammar.h"

enum { KE_END, KE_ALT, KE_REF, KE_BYTES, KE_PERM };

/* KE_PERM (GBNF `%perm(SEP, a b? c*)`, val: an index into perms): the
 * members in any order, each at most once (`?`: optional, `*`: any number of
 * times, else required), SEP between two; `%perm1` needs at least one. The
 * engine tracks the members used in its stack frames, so the language is
 * exact without a rule per subset (JSON object properties in any order). */
#define KGR_PERM_MAX 63
typedef struct {
    int32_t sep, n;
    int32_t member[KGR_PERM_MAX];
    uint64_t req, rep;
    bool nonempty;
} kgr_perm;

typedef struct {
    int32_t type;
    int32_t val; /* KE_REF: rule; KE_BYTES: set index */
} kgr_elem;

typedef struct {
    uint64_t w[4];
} kgr_set;

static inline bool kgr_set_has(const kgr_set *s, unsigned b) { return (s->w[b >> 6] >> (b & 63)) & 1; }

struct kgr_grammar {
    kgr_elem *el;
    int32_t n_el;
    int32_t *start; /* [n_rules] */
    char **name;    /* [n_rules] */
    int32_t n_rules;
    kgr_set *sets;
    int32_t n_sets;
    kgr_perm *perms;
    int32_t n_perms;
    int32_t root;
};

/* code point ranges [lo, hi] */
typedef struct {
    uint32_t lo, hi;
} cprange;
/* Sorts and merges v (n ranges) into out (room for 2n + 4), complemented
 * over U+0000..U+10FFFF with neg, surrogates removed; -1: out of memory. */
int32_t kgr_ranges_normalize(cprange *v, int32_t n, bool neg, cprange *out);

/* The lengths in code points of the strings a search for regex re can match
 * ([*min, *max], *max -1: unbounded); false: a pattern it does not analyse
 * (lookaround, backreferences, a top-level |, anchors inside). */
bool kgr_regex_lengths(const char *re, int64_t *min, int64_t *max);

/* a growable string */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} kgr_buf;
void kgr_buf_put(kgr_buf *b, const char *s, size_t n);
void kgr_buf_puts(kgr_buf *b, const char *s);
void kgr_buf_printf(kgr_buf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
/* s as a GBNF literal, quotes included */
void kgr_buf_literal(kgr_buf *b, const char *s, size_t n);

/* ---- validate.c: JSON Schema instance validation ---- */
/* The node a local JSON pointer ("#", "#/a/b~1c") names under root; NULL
 * when it does not resolve or is not local. */
const cJSON *kgr_json_pointer(const cJSON *root, const char *ref);
enum { KGR_V_INVALID = 0, KGR_V_VALID = 1, KGR_V_UNSUPPORTED = -1 };
/* Whether x validates against schema (refs resolve under root); UNSUPPORTED,
 * with err naming the keyword, where the answer would be a guess. */
/* 1: the ECMAScript pattern matches somewhere in s (PCRE2); 0: not; -1: a
 * pattern PCRE2 does not take */
int kgr_regex_search(const char *pat, const char *s);
int kgr_validate(const cJSON *root, const cJSON *schema, const cJSON *x, char *err, size_t n_err);

#endif
