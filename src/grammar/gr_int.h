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

/* Special tokens as terminals (<[id]>, <|name|>): in the vocabulary a
 * special token's bytes are a marker no text can hold, 0xFF (never in
 * UTF-8, and every other element of a grammar matches UTF-8 only) and the
 * id in 4 bytes of 6 bits each (0x80..0xBF); a token reference is that
 * marker as 5 byte elements. Ordinary tokens holding 0xFF, which no grammar
 * could take anyway, are dropped, so only the token itself spells it. */
#define KGR_MARKER_LEN 5
#define KGR_MAX_TOKEN_ID 0xFFFFFF
static inline void kgr_token_marker(int32_t id, unsigned char out[KGR_MARKER_LEN]) {
    out[0] = 0xFF;
    for (int i = 0; i < 4; i++) out[1 + i] = (unsigned char)(0x80 | ((uint32_t)id >> (18 - 6 * i) & 63));
}

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
    int32_t *tok_refs; /* the special tokens referenced, checked against the vocabulary by kgr_index_create */
    int32_t n_tok_refs;
};

/* engine.c: the token whose text is s[0..n): a special token's id
 * (*special true), else an ordinary token's with exactly these bytes; -1 none */
int32_t kgr_vocab_lookup(const kgr_vocab *v, const char *s, size_t n, bool *special);
/* token id's bytes (an ordinary token's text) into buf (cap): the length, -1 no such id */
int32_t kgr_vocab_token_text(const kgr_vocab *v, int32_t id, char *buf, int32_t cap);
/* whether id is one of v's special tokens */
bool kgr_vocab_is_special(const kgr_vocab *v, int32_t id);

/* engine.c: the prefetch pool's threads now (tests) */
int kgr_pool_threads(void);
/* engine.c: masks made from a mask class's so far (tests) */
int64_t kgr_mask_class_hits(void);
/* engine.c: masks made from member groups so far (tests) */
int64_t kgr_mask_group_hits(void);

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
