/* tok_int.h: internals of the tokenizer module, shared by its .c files.
 *
 * The pipeline mirrors Hugging Face `tokenizers` (the Rust crate), stage by
 * stage, but carries only what decides the ids: strings, no offsets. The one
 * piece of offset information that changes ids (Metaspace's
 * prepend_scheme "first" asks whether a piece starts at byte 0 of the
 * original input) travels as a flag on each piece (TK_AT0).
 *
 * Everything owned by a ktok is immutable after loading, so encode/decode may
 * run on one ktok from many threads; per-call scratch (buffers, PCRE2 match
 * data) lives in a tk_ctx on the caller's stack. */
#ifndef KILN_TOK_INT_H
#define KILN_TOK_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/status.h"
#include "tokenizer/tokenizer.h"

/* ---- growable byte buffer ------------------------------------------------ */

typedef struct {
    char *p;
    size_t n, cap;
} tk_buf;

bool tk_buf_reserve(tk_buf *b, size_t extra); /* false: out of memory */
bool tk_buf_put(tk_buf *b, const void *s, size_t n);
bool tk_buf_putc(tk_buf *b, char c);
bool tk_buf_put_cp(tk_buf *b, uint32_t cp); /* UTF-8 encodes cp */
void tk_buf_free(tk_buf *b);

/* ---- pieces: slices of one buffer ---------------------------------------- */

enum { TK_AT0 = 1 }; /* piece starts at byte 0 of the original input */

typedef struct {
    uint32_t off, len;
    uint32_t flags;
} tk_slice;

typedef struct {
    tk_buf text;
    tk_slice *v;
    size_t n, cap;
} tk_pieces;

bool tk_pieces_add(tk_pieces *p, const char *s, size_t n, uint32_t flags); /* copies s */
/* Adds a slice of p->text itself (no copy). */
bool tk_pieces_add_ref(tk_pieces *p, size_t off, size_t n, uint32_t flags);
void tk_pieces_clear(tk_pieces *p);
void tk_pieces_free(tk_pieces *p);
/* "" when every piece so far is empty (the text buffer is still NULL: no
 * offset may be added to it) */
static inline const char *tk_piece_str(const tk_pieces *p, size_t i) { return p->text.p ? p->text.p + p->v[i].off : ""; }

/* ---- int32 vectors -------------------------------------------------------- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} tk_ids;

bool tk_ids_push(tk_ids *a, int32_t x);

/* ---- hash maps ------------------------------------------------------------ */

uint64_t tk_hash(const void *p, size_t n);

/* String -> int32. Keys are borrowed (they live in the ktok arena). */
typedef struct {
    struct tk_sm_slot {
        const char *key;
        uint32_t len;
        int32_t val;
    } *slots;
    uint32_t mask, count;
} tk_strmap;

bool tk_strmap_init(tk_strmap *m, size_t expected);
/* Inserts or overwrites; false on out of memory. */
bool tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val);
/* -1 if absent. */
int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len);
void tk_strmap_free(tk_strmap *m);

/* uint64 -> two int32 (e.g. merge pair -> rank, new id). Key UINT64_MAX is reserved. */
typedef struct {
    struct tk_u64_slot {
        uint64_t key;
        int32_t a, b;
    } *slots;
    uint32_t mask, count;
} tk_u64map;

bool tk_u64map_init(tk_u64map *m, size_t expected);
bool tk_u64map_put(tk_u64map *m, uint64_t key, int32_t a, int32_t b);
bool tk_u64map_get(const tk_u64map *m, uint64_t key, int32_t *a, int32_t *b);
void tk_u64map_free(tk_u64map *m);

/* ---- UTF-8 and Unicode ---------------------------------------------------- */

/* Decodes one code point of valid UTF-8 at s[0..n); returns its length (>= 1). */
static inline int tk_utf8_dec(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) { *cp = u[0]; return 1; }
    if (u[0] < 0xE0) { *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); return 2; }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) { *cp = u[0]; return 1; }
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
          ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}
static inline int tk_utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
int tk_utf8_enc(uint32_t cp, char out[4]);

/* Length of the longest prefix of s that is valid UTF-8. */
size_t tk_utf8_valid_prefix(const char *s, size_t n);
/* Appends s with every maximal invalid subsequence replaced by U+FFFD (Rust's
 * String::from_utf8_lossy, Python's errors="replace"). */
bool tk_utf8_lossy(tk_buf *out, const char *s, size_t n);
/* Bytes at the end of s that form an incomplete but still completable UTF-8
 * sequence (0..3). */
size_t tk_utf8_incomplete_tail(const char *s, size_t n);

bool tk_is_whitespace(uint32_t cp);  /* Unicode White_Space (Rust char::is_whitespace) */
bool tk_is_numeric(uint32_t cp);     /* general category N* (char::is_numeric) */
bool tk_is_punct(uint32_t cp);       /* ASCII punctuation or category P* */
bool tk_is_ascii_punct(uint32_t cp);

/* ---- regexes (Oniguruma syntax, run by PCRE2) ----------------------------- */

typedef struct {
    bool is_regex;
    char *lit; /* the literal (String pattern) */
    size_t lit_len;
    pcre2_code *re; /* regex, or the literal when it is empty */
} tk_pattern;

/* Translates an Oniguruma pattern (as HF writes them) into PCRE2 and compiles
 * it with JIT. Errors name the position in the original pattern. */
kiln_status tk_regex_compile(const char *onig, size_t len, pcre2_code **out);
/* Matches of pat in s[0..n), non-overlapping, left to right, with the rules of
 * the onig crate's find_iter (an empty match right after a match is skipped).
 * Calls fn(start, end, user) for each; a false return stops (out of memory). */
typedef bool (*tk_match_fn)(size_t start, size_t end, void *user);
bool tk_pattern_find(const tk_pattern *pat, pcre2_match_data *md, const char *s, size_t n,
                     tk_match_fn fn, void *user);
void tk_pattern_free(tk_pattern *p);

/* (start, end, is_match) segments covering s, as HF's Pattern::find_matches. */
typedef struct {
    uint32_t start, end;
    bool match;
} tk_seg;
typedef struct {
    tk_seg *v;
    size_t n, cap;
} tk_segs;
bool tk_find_segments(const tk_pattern *pat, pcre2_match_data *md, const char *s, size_t n,
                      tk_segs *out);

/* ---- per-call scratch ----------------------------------------------------- */

typedef struct {
    pcre2_match_data *md; /* enough for one pair; every pattern uses pair 0 only */
    tk_segs segs;
    tk_buf tmp, tmp2;
    void *scr[3]; /* model scratch arrays (see tk_scratch) */
    size_t scr_cap[3];
} tk_ctx;

/* c->scr[i] with room for n bytes; NULL when out of memory. */
void *tk_scratch(tk_ctx *c, int i, size_t n);

bool tk_ctx_init(tk_ctx *c);
void tk_ctx_free(tk_ctx *c);

/* ---- normalizers ---------------------------------------------------------- */

typedef enum {
    TN_SEQ, TN_NFC, TN_NFD, TN_NFKC, TN_NFKD, TN_LOWER, TN_STRIP, TN_STRIP_ACCENTS,
    TN_REPLACE, TN_PREPEND, TN_PRECOMPILED, TN_BERT, TN_BYTELEVEL, TN_NMT,
} tn_type;

typedef struct tk_norm {
    tn_type type;
    struct tk_norm *subs; /* TN_SEQ */
    int n_subs;
    bool left, right;     /* TN_STRIP */
    tk_pattern pat;       /* TN_REPLACE */
    char *content;        /* TN_REPLACE content, TN_PREPEND prepend */
    size_t content_len;
    /* TN_PRECOMPILED: darts-clone double array and the replacement strings */
    uint32_t *trie;
    size_t trie_n;
    char *norm_blob;
    size_t norm_len;
    /* TN_BERT */
    bool clean_text, chinese_chars, strip_accents, lowercase;
} tk_norm;

/* Normalizes s into out (cleared first). *at0 is and-ed with "the first output
 * char still comes from the first input char" (see TK_AT0). */
kiln_status tk_normalize(const tk_norm *nm, tk_ctx *c, const char *s, size_t n, tk_buf *out,
                         bool *at0);
void tk_norm_free(tk_norm *nm);

/* ---- pre-tokenizers ------------------------------------------------------- */

typedef enum {
    TP_SEQ, TP_BYTELEVEL, TP_SPLIT, TP_METASPACE, TP_WHITESPACE, TP_WHITESPACE_SPLIT,
    TP_DIGITS, TP_PUNCT, TP_BERT, TP_CHAR_DELIM,
} tp_type;

typedef enum { TB_REMOVED, TB_ISOLATED, TB_MERGED_PREV, TB_MERGED_NEXT, TB_CONTIGUOUS } tb_behavior;
typedef enum { TM_ALWAYS, TM_FIRST, TM_NEVER } tm_scheme;

typedef struct tk_pretok {
    tp_type type;
    struct tk_pretok *subs; /* TP_SEQ */
    int n_subs;
    bool add_prefix_space, use_regex; /* TP_BYTELEVEL */
    tk_pattern pat;                   /* TP_SPLIT, TP_WHITESPACE (built in) */
    tb_behavior behavior;             /* TP_SPLIT, TP_PUNCT */
    bool invert;                      /* TP_SPLIT */
    uint32_t repl;                    /* TP_METASPACE replacement, TP_CHAR_DELIM delimiter */
    tm_scheme scheme;                 /* TP_METASPACE */
    bool split;                       /* TP_METASPACE */
    bool individual;                  /* TP_DIGITS */
} tk_pretok;

/* Replaces *p with the pre-tokenized pieces (tmp receives the old ones). */
kiln_status tk_pretokenize(const tk_pretok *pt, const ktok *t, tk_ctx *c, tk_pieces *p,
                           tk_pieces *tmp);
void tk_pretok_free(tk_pretok *pt);

/* ---- models --------------------------------------------------------------- */

typedef enum { TM_BPE, TM_UNIGRAM, TM_WORDPIECE, TM_WORDLEVEL } tm_type;

typedef struct {
    tm_type type;
    /* BPE */
    tk_u64map merges; /* (left id << 32 | right id) -> (rank, merged id) */
    char *prefix, *suffix; /* continuing_subword_prefix / end_of_word_suffix (NULL: none) */
    size_t prefix_len, suffix_len;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;      /* -1: none */
    int32_t byte_ids[256]; /* "<0xXX>" ids for byte fallback, -1 if absent */
    /* Unigram */
    double *scores;      /* [n_model] */
    double min_score;
    tk_strmap prefixes;  /* every proper prefix of a piece (value unused) */
    size_t max_piece_len;
    /* WordPiece */
    size_t max_input_chars;
} tk_model;

/* Appends the ids of one pre-token. */
kiln_status tk_model_tokenize(const ktok *t, tk_ctx *c, const char *s, size_t n, tk_ids *out);

/* ---- post-processors ------------------------------------------------------ */

typedef enum { TPP_NONE, TPP_TEMPLATE, TPP_BERT, TPP_ROBERTA, TPP_BYTELEVEL, TPP_SEQ } tpp_type;

typedef struct tk_post {
    tpp_type type;
    struct tk_post *subs;
    int n_subs;
    /* TPP_TEMPLATE: the single template; -1 entries stand for the sequence */
    int32_t *tmpl;
    int n_tmpl;
    /* TPP_BERT / TPP_ROBERTA */
    int32_t cls, sep;
} tk_post;

void tk_post_free(tk_post *pp);

/* ---- decoders ------------------------------------------------------------- */

typedef enum {
    TD_SEQ, TD_BYTELEVEL, TD_METASPACE, TD_BYTEFALLBACK, TD_FUSE, TD_STRIP, TD_REPLACE,
    TD_WORDPIECE, TD_BPE, TD_CTC,
} td_type;

typedef struct tk_dec {
    td_type type;
    struct tk_dec *subs;
    int n_subs;
    uint32_t repl;      /* TD_METASPACE replacement, TD_STRIP content */
    tm_scheme scheme;   /* TD_METASPACE */
    int start, stop;    /* TD_STRIP */
    tk_pattern pat;     /* TD_REPLACE */
    char *content;      /* TD_REPLACE content, TD_WORDPIECE prefix, TD_BPE suffix, TD_CTC pad */
    size_t content_len;
    char *word_delim;   /* TD_CTC */
    bool cleanup;       /* TD_WORDPIECE, TD_CTC */
} tk_dec;

/* Decodes a list of token strings (in p) into one string. *unstable is set
 * when the end of the text may still change with more tokens (an incomplete
 * UTF-8 sequence, a byte-fallback run). */
kiln_status tk_decode_tokens(const tk_dec *d, tk_ctx *c, tk_pieces *p, tk_pieces *tmp,
                             tk_buf *out, bool *unstable);
void tk_dec_free(tk_dec *d);

/* ---- added tokens --------------------------------------------------------- */

typedef struct {
    const char *content;
    uint32_t len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} tk_added;

/* A byte trie for leftmost-longest matching. */
typedef struct {
    tk_u64map edges;   /* (node << 8 | byte) -> (child, -) */
    int32_t *term;     /* node -> index into ktok.added (or -1) */
    size_t n_nodes, cap_nodes;
    bool first[256];
} tk_trie;

/* ---- the tokenizer -------------------------------------------------------- */

struct ktok {
    ku_arena *arena;
    /* id -> string; NULL where no token has this id */
    const char **id_str;
    uint32_t *id_len;
    int32_t n_ids;       /* 1 + largest id */
    int32_t cap_ids;     /* allocated entries of the id arrays */
    int32_t n_model;     /* ids of the model vocabulary are < n_model... mostly */
    tk_strmap vocab;     /* model vocabulary: string -> id */
    tk_strmap added_map; /* added tokens: content -> id (wins over vocab) */
    uint8_t *special;    /* [n_ids] 1 if special */
    uint8_t *is_added;   /* [n_ids] 1 if an added token */
    tk_added *added;
    int n_added;
    tk_trie trie_raw, trie_norm; /* non-normalized / normalized contents */
    char **norm_content;         /* normalized content of each added token (trie_norm) */
    pcre2_code *word_start, *word_end; /* for single_word: ^\w and \w$ */

    tk_norm *norm;      /* NULL: none */
    tk_pretok *pretok;  /* NULL: none */
    tk_model model;
    tk_post post;
    tk_dec *dec;        /* NULL: none (tokens joined with spaces) */

    int32_t bos_id, eos_id;
    /* ByteLevel byte <-> char tables */
    uint16_t byte_char[256];
};

kiln_status tk_load_json_obj(ktok *t, const void *root /* cJSON */, const char *what);
kiln_status tk_added_finish(ktok *t); /* builds the tries once normalizer + tokens are set */
void tk_byte_tables(uint16_t byte_char[256]);
/* byte for a ByteLevel char, -1 if cp is not one */
int tk_char_byte(uint32_t cp);

#endif
