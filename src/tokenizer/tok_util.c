/* tok_util.c: buffers, hash maps, UTF-8 and Unicode helpers for the tokenizer. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_int.h"

/* ---- buffers -------------------------------------------------------------- */

bool tk_buf_reserve(tk_buf *b, size_t extra) {
    if (b->cap - b->n > extra) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n <= extra) {
        if (cap > SIZE_MAX / 2) return false;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (!tk_buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0; /* reserve keeps one spare byte */
    return true;
}

bool tk_buf_putc(tk_buf *b, char c) { return tk_buf_put(b, &c, 1); }

bool tk_buf_put_cp(tk_buf *b, uint32_t cp) {
    char u[4];
    return tk_buf_put(b, u, (size_t)tk_utf8_enc(cp, u));
}

void tk_buf_free(tk_buf *b) {
    free(b->p);
    *b = (tk_buf){0};
}

bool tk_pieces_add_ref(tk_pieces *p, size_t off, size_t n, uint32_t flags) {
    if (off > UINT32_MAX || n > UINT32_MAX) return false;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        tk_slice *v = realloc(p->v, cap * sizeof *v);
        if (!v) return false;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = (tk_slice){(uint32_t)off, (uint32_t)n, flags};
    return true;
}

bool tk_pieces_add(tk_pieces *p, const char *s, size_t n, uint32_t flags) {
    size_t off = p->text.n;
    return tk_buf_put(&p->text, s, n) && tk_pieces_add_ref(p, off, n, flags);
}

void tk_pieces_clear(tk_pieces *p) {
    p->n = 0;
    p->text.n = 0;
}

void tk_pieces_free(tk_pieces *p) {
    tk_buf_free(&p->text);
    free(p->v);
    *p = (tk_pieces){0};
}

bool tk_ids_push(tk_ids *a, int32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

/* ---- hashing -------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ mix64(w)) * 0x100000001b3ULL;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return mix64(h ^ w ^ ((uint64_t)n << 56));
}

static uint32_t table_size(size_t expected) {
    uint32_t cap = 16;
    while (cap < expected * 2 && cap < (1u << 30)) cap <<= 1;
    return cap;
}

bool tk_strmap_init(tk_strmap *m, size_t expected) {
    uint32_t cap = table_size(expected);
    m->slots = calloc(cap, sizeof *m->slots);
    m->mask = cap - 1;
    m->count = 0;
    return m->slots != NULL;
}

static bool strmap_grow(tk_strmap *m) {
    tk_strmap n;
    if (!tk_strmap_init(&n, (size_t)(m->mask + 1))) return false;
    for (uint32_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key) tk_strmap_put(&n, m->slots[i].key, m->slots[i].len, m->slots[i].val);
    free(m->slots);
    *m = n;
    return true;
}

bool tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val) {
    if (!m->slots && !tk_strmap_init(m, 16)) return false;
    if ((m->count + 1) * 2 > m->mask + 1 && !strmap_grow(m)) return false;
    uint32_t i = (uint32_t)tk_hash(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        struct tk_sm_slot *s = &m->slots[i];
        if (!s->key) {
            *s = (struct tk_sm_slot){key, (uint32_t)len, val};
            m->count++;
            return true;
        }
        if (s->len == len && memcmp(s->key, key, len) == 0) {
            s->val = val;
            return true;
        }
    }
}

int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    uint32_t i = (uint32_t)tk_hash(key, len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        const struct tk_sm_slot *s = &m->slots[i];
        if (!s->key) return -1;
        if (s->len == len && memcmp(s->key, key, len) == 0) return s->val;
    }
}

void tk_strmap_free(tk_strmap *m) {
    free(m->slots);
    *m = (tk_strmap){0};
}

bool tk_u64map_init(tk_u64map *m, size_t expected) {
    uint32_t cap = table_size(expected);
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return false;
    for (uint32_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    m->count = 0;
    return true;
}

static bool u64map_grow(tk_u64map *m) {
    tk_u64map n;
    if (!tk_u64map_init(&n, (size_t)(m->mask + 1))) return false;
    for (uint32_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key != UINT64_MAX) tk_u64map_put(&n, m->slots[i].key, m->slots[i].a, m->slots[i].b);
    free(m->slots);
    *m = n;
    return true;
}

bool tk_u64map_put(tk_u64map *m, uint64_t key, int32_t a, int32_t b) {
    if (!m->slots && !tk_u64map_init(m, 16)) return false;
    if ((m->count + 1) * 2 > m->mask + 1 && !u64map_grow(m)) return false;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        struct tk_u64_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) {
            *s = (struct tk_u64_slot){key, a, b};
            m->count++;
            return true;
        }
        if (s->key == key) {
            s->a = a;
            s->b = b;
            return true;
        }
    }
}

bool tk_u64map_get(const tk_u64map *m, uint64_t key, int32_t *a, int32_t *b) {
    if (!m->slots) return false;
    uint32_t i = (uint32_t)mix64(key) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        const struct tk_u64_slot *s = &m->slots[i];
        if (s->key == UINT64_MAX) return false;
        if (s->key == key) {
            *a = s->a;
            if (b) *b = s->b;
            return true;
        }
    }
}

void tk_u64map_free(tk_u64map *m) {
    free(m->slots);
    *m = (tk_u64map){0};
}

/* ---- UTF-8 ---------------------------------------------------------------- */

int tk_utf8_enc(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid sequence at s (1..4), or -k where k (>= 1) is the
 * length of the maximal invalid subpart to replace by one U+FFFD. When the
 * input ends inside a sequence that could still be valid, *incomplete is set. */
static int utf8_step(const unsigned char *s, size_t n, bool *incomplete) {
    *incomplete = false;
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else return -1;
    for (int k = 1; k <= need; k++) {
        if ((size_t)k >= n) {
            *incomplete = true;
            return -k;
        }
        unsigned char d = s[k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return -k;
    }
    return need + 1;
}

size_t tk_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool inc;
        int k = utf8_step(u + i, n - i, &inc);
        if (k < 0) return i;
        i += (size_t)k;
    }
    return n;
}

bool tk_utf8_lossy(tk_buf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    if (!tk_buf_reserve(out, n)) return false;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        bool inc;
        int k = utf8_step(u + i, n - i, &inc);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        if (!tk_buf_put(out, s + run, i - run) || !tk_buf_put(out, "\xEF\xBF\xBD", 3)) return false;
        i += (size_t)-k;
        run = i;
    }
    return tk_buf_put(out, s + run, n - run);
}

size_t tk_utf8_incomplete_tail(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = u[n - back];
        if (c < 0x80) return 0;
        if (c >= 0xC0) { /* a lead byte: is the rest a valid, unfinished prefix? */
            bool inc;
            int k = utf8_step(u + n - back, back, &inc);
            return (k < 0 && inc) ? back : 0;
        }
    }
    return 0;
}

/* ---- Unicode properties ---------------------------------------------------- */

bool tk_is_whitespace(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool tk_is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool tk_is_ascii_punct(uint32_t cp) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
}

bool tk_is_punct(uint32_t cp) {
    if (cp < 0x80) return tk_is_ascii_punct(cp);
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* ---- GPT-2 byte <-> char tables ------------------------------------------- */

void tk_byte_tables(uint16_t byte_char[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_char[b] = printable ? (uint16_t)b : (uint16_t)(256 + n++);
    }
}

int tk_char_byte(uint32_t cp) {
    if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    /* the n-th non-printable byte maps to 256 + n: 0x00-0x20, 0x7F-0xA0, 0xAD */
    int n = (int)cp - 256;
    if (n < 33) return n;
    if (n < 67) return 0x7F + (n - 33);
    return 0xAD;
}

/* ---- per-call scratch ----------------------------------------------------- */

bool tk_ctx_init(tk_ctx *c) {
    *c = (tk_ctx){0};
    c->md = pcre2_match_data_create(4, NULL);
    return c->md != NULL;
}

void *tk_scratch(tk_ctx *c, int i, size_t n) {
    if (c->scr_cap[i] < n) {
        size_t cap = c->scr_cap[i] ? c->scr_cap[i] : 256;
        while (cap < n) cap *= 2;
        void *p = realloc(c->scr[i], cap);
        if (!p) return NULL;
        c->scr[i] = p;
        c->scr_cap[i] = cap;
    }
    return c->scr[i];
}

void tk_ctx_free(tk_ctx *c) {
    for (int i = 0; i < 3; i++) free(c->scr[i]);
    pcre2_match_data_free(c->md);
    free(c->segs.v);
    tk_buf_free(&c->tmp);
    tk_buf_free(&c->tmp2);
    *c = (tk_ctx){0};
}
