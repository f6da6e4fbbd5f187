/* stop_test.c: stop conditions, and the streaming stop-string matcher
 * checked against a non-streamed reference for random texts, random stop
 * sets and every chunking of the text. */
#include <stdlib.h>

#include "gen/stop.h"
#include "kt.h"

KT_TEST(gen_stop_limits) {
    const int32_t eos[2] = {2, 7};
    kgen_limits l = {eos, 2, false, 5, 100};
    KT_CHECK_EQ(kgen_check_start(&l, 10), KGEN_CONTINUE);
    KT_CHECK_EQ(kgen_check_start(&l, 100), KGEN_FINISH_CONTEXT);
    KT_CHECK_EQ(kgen_check_token(&l, 7, 1, 11), KGEN_FINISH_EOS);
    KT_CHECK_EQ(kgen_check_token(&l, 3, 4, 14), KGEN_CONTINUE);
    KT_CHECK_EQ(kgen_check_token(&l, 3, 5, 15), KGEN_FINISH_LENGTH);
    KT_CHECK_EQ(kgen_check_token(&l, 2, 5, 15), KGEN_FINISH_EOS); /* EOS first */
    KT_CHECK_EQ(kgen_check_token(&l, 3, 3, 100), KGEN_FINISH_CONTEXT);
    l.ignore_eos = true;
    KT_CHECK_EQ(kgen_check_token(&l, 7, 1, 11), KGEN_CONTINUE);
    l.n_predict = -1; /* no limit but the context */
    KT_CHECK_EQ(kgen_check_token(&l, 3, 1000, 99), KGEN_CONTINUE);
    KT_CHECK_EQ(kgen_check_token(&l, 3, 1000, 100), KGEN_FINISH_CONTEXT);
    l.n_predict = -2;
    KT_CHECK_EQ(kgen_check_token(&l, 3, 89, 99), KGEN_CONTINUE);
    KT_CHECK_EQ(kgen_check_token(&l, 3, 90, 100), KGEN_FINISH_CONTEXT);
    l.n_predict = 0;
    KT_CHECK_EQ(kgen_check_start(&l, 1), KGEN_FINISH_LENGTH);
    KT_CHECK_STR(kgen_finish_reason(KGEN_FINISH_EOS), "stop");
    KT_CHECK_STR(kgen_finish_reason(KGEN_FINISH_STOP_STRING), "stop");
    KT_CHECK_STR(kgen_finish_reason(KGEN_FINISH_LENGTH), "length");
    KT_CHECK_STR(kgen_finish_reason(KGEN_FINISH_CONTEXT), "length");
    KT_CHECK(kgen_finish_reason(KGEN_CONTINUE) == NULL);
    char buf[128];
    l.n_predict = -1;
    KT_CHECK_STR(kgen_finish_describe(KGEN_FINISH_CONTEXT, &l, 96, 100, buf, sizeof buf),
                 "context full: 100 tokens (prompt 4 + 96 generated) fill n_ctx = 100");
}

/* ---- reference ---- */

typedef struct {
    const char *s[4];
    int n;
} stopset;

/* Non-streamed: the occurrence ending first (ties: the longest). Returns
 * the output length, or -1 without a match; *which = stop index. */
static long ref_match(const char *t, size_t len, const stopset *ss, int *which) {
    for (size_t end = 1; end <= len; end++) {
        long best = -1;
        for (int k = 0; k < ss->n; k++) {
            size_t l = strlen(ss->s[k]);
            if (l == 0 || l > end || memcmp(t + end - l, ss->s[k], l) != 0) continue;
            if (best < 0 || (long)(end - l) < best) {
                best = (long)(end - l);
                *which = k;
            }
        }
        if (best >= 0) return best;
    }
    return -1;
}

static size_t char_len(unsigned char c) {
    return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
}

/* What may be shown after seeing t[0..len) without a match: up to the
 * longest suffix that is a proper prefix of a stop, cut back to the start
 * of a character that would not be complete. */
static size_t ref_safe(const char *t, size_t len, const stopset *ss) {
    size_t hold = len;
    for (int k = 0; k < ss->n; k++) {
        size_t l = strlen(ss->s[k]);
        for (size_t p = 1; p < l && p <= len; p++)
            if (memcmp(t + len - p, ss->s[k], p) == 0 && len - p < hold) hold = len - p;
    }
    for (size_t i = 0; i < hold;) {
        size_t cl = char_len((unsigned char)t[i]);
        if (i + cl > hold) return i;
        i += cl;
    }
    return hold;
}

/* Streams t cut at the positions whose bit is set in `cuts`; checks every
 * step against the reference. */
static int run_chunked(const char *t, size_t len, const stopset *ss, uint32_t cuts) {
    char *v[4];
    for (int k = 0; k < ss->n; k++) v[k] = (char *)ss->s[k];
    kgen_strs strs = {v, ss->n};
    kgen_stop *m = NULL;
    kiln_status st = kgen_stop_create(&strs, &m);
    if (st) {
        kiln_status_free(st);
        return 0;
    }
    char got[256];
    size_t n_got = 0, start = 0;
    int which = -1;
    long want = ref_match(t, len, ss, &which);
    bool stopped = false;
    int ok = 1;
    for (size_t i = 1; i <= len && !stopped && ok; i++) {
        if (i < len && !(cuts >> (i - 1) & 1)) continue;
        const char *o;
        size_t ol;
        stopped = kgen_stop_feed(m, t + start, i - start, &o, &ol);
        memcpy(got + n_got, o, ol);
        n_got += ol;
        if (!stopped) { /* maximal and safe: exactly the reference prefix */
            int w2 = -1;
            ok = ref_match(t, i, ss, &w2) < 0 && n_got == ref_safe(t, i, ss) &&
                 memcmp(got, t, n_got) == 0 && kgen_stop_held(m) == i - n_got;
        }
        start = i;
    }
    if (ok && !stopped) {
        const char *o;
        size_t ol;
        kgen_stop_flush(m, &o, &ol);
        memcpy(got + n_got, o, ol);
        n_got += ol;
    }
    if (ok) {
        if (want >= 0)
            ok = stopped && n_got == (size_t)want && memcmp(got, t, n_got) == 0 &&
                 kgen_stop_matched(m) == which;
        else
            ok = !stopped && n_got == len && memcmp(got, t, len) == 0 && kgen_stop_matched(m) == -1;
    }
    if (!ok)
        fprintf(stderr, "  text \"%.*s\" cuts %#x: got \"%.*s\" (want %ld, stop %d vs %d)\n", (int)len,
                t, cuts, (int)n_got, got, want, kgen_stop_matched(m), which);
    kgen_stop_destroy(m);
    return ok;
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static const char *const k_chars[] = {"a", "b", "a", "b", "c", "\xC3\xA9" /* é */,
                                      "\xE2\x82\xAC" /* € */, "\xF0\x9F\x98\x80" /* 😀 */};

static size_t random_text(char *out, size_t max_bytes, size_t n_chars, uint64_t *s) {
    size_t len = 0;
    for (size_t i = 0; i < n_chars; i++) {
        const char *c = k_chars[lcg(s) % 8];
        if (len + strlen(c) > max_bytes) break;
        memcpy(out + len, c, strlen(c));
        len += strlen(c);
    }
    out[len] = 0;
    return len;
}

KT_TEST(gen_stop_every_chunking) {
    uint64_t s = 5;
    char stops[4][16];
    char text[64];
    long runs = 0;
    for (int it = 0; it < 300; it++) {
        stopset ss = {{0}, 1 + (int)(lcg(&s) % 3)};
        for (int k = 0; k < ss.n; k++) {
            random_text(stops[k], 12, 1 + lcg(&s) % 3, &s);
            ss.s[k] = stops[k];
        }
        size_t len = random_text(text, 11, 1 + lcg(&s) % 9, &s);
        if (it % 3 == 0 && len + strlen(ss.s[0]) < 20) { /* make a match likely */
            size_t at = lcg(&s) % (len + 1);
            memmove(text + at + strlen(ss.s[0]), text + at, len - at + 1);
            memcpy(text + at, ss.s[0], strlen(ss.s[0]));
            len += strlen(ss.s[0]);
        }
        /* every chunking when short, a sample of them otherwise */
        uint32_t n_cuts = len > 1 ? (uint32_t)len - 1 : 0;
        uint32_t total = n_cuts < 12 ? 1u << n_cuts : 4096;
        for (uint32_t c = 0; c < total; c++) {
            uint32_t cuts = n_cuts < 12 ? c : (uint32_t)lcg(&s);
            KT_CHECKF(run_chunked(text, len, &ss, cuts), "iteration %d", it);
            runs++;
        }
    }
    KT_CHECK(runs > 10000);
}

static size_t feed_str(kgen_stop *m, const char *chunk, char *acc, size_t n, bool *stopped) {
    const char *o;
    size_t ol;
    *stopped = kgen_stop_feed(m, chunk, strlen(chunk), &o, &ol);
    memcpy(acc + n, o, ol);
    return n + ol;
}

KT_TEST(gen_stop_cases) {
    char *v[3] = {(char *)"abc", (char *)"b", (char *)""};
    kgen_strs strs = {v, 3};
    kgen_stop *m = NULL;
    KT_CHECK_OK(kgen_stop_create(&strs, &m));
    char acc[64];
    bool stopped;
    /* "b" ends before "abc" would: it wins whatever the chunking */
    size_t n = feed_str(m, "xa", acc, 0, &stopped);
    KT_CHECK(!stopped && n == 1 && acc[0] == 'x'); /* "a" may start "abc": held */
    KT_CHECK_EQ(kgen_stop_held(m), 1);
    n = feed_str(m, "bcdef", acc, n, &stopped);
    KT_CHECK(stopped && n == 2 && memcmp(acc, "xa", 2) == 0);
    KT_CHECK_EQ(kgen_stop_matched(m), 1);
    n = feed_str(m, "more", acc, n, &stopped); /* ignored after the stop */
    KT_CHECK(!stopped && n == 2);
    const char *o;
    size_t ol;
    kgen_stop_flush(m, &o, &ol);
    KT_CHECK_EQ(ol, 0);
    kgen_stop_destroy(m);

    /* a stop spanning three chunks; a partial stop flushed at the end */
    char *w[2] = {(char *)"<|end|>", (char *)"<|end|>"};
    kgen_strs s2 = {w, 2};
    KT_CHECK_OK(kgen_stop_create(&s2, &m));
    n = feed_str(m, "Hi <|", acc, 0, &stopped);
    n = feed_str(m, "en", acc, n, &stopped);
    KT_CHECK(!stopped && n == 3);
    n = feed_str(m, "d|> tail", acc, n, &stopped);
    KT_CHECK(stopped && n == 3 && memcmp(acc, "Hi ", 3) == 0);
    KT_CHECK_EQ(kgen_stop_matched(m), 0); /* the first of equal stops */
    kgen_stop_destroy(m);
    KT_CHECK_OK(kgen_stop_create(&s2, &m));
    n = feed_str(m, "x <|en", acc, 0, &stopped);
    KT_CHECK(!stopped && n == 2);
    kgen_stop_flush(m, &o, &ol);
    KT_CHECK(ol == 4 && memcmp(o, "<|en", 4) == 0 && kgen_stop_matched(m) == -1);
    kgen_stop_destroy(m);

    /* no stops: only incomplete UTF-8 characters are held */
    kgen_strs none = {NULL, 0};
    KT_CHECK_OK(kgen_stop_create(&none, &m));
    n = feed_str(m, "1\xE2\x82", acc, 0, &stopped);
    KT_CHECK(n == 1 && kgen_stop_held(m) == 2);
    n = feed_str(m, "\xAC" "2", acc, n, &stopped);
    KT_CHECK(n == 5 && memcmp(acc, "1\xE2\x82\xAC" "2", 5) == 0);
    n = feed_str(m, "\xF0\x9F", acc, n, &stopped); /* flushed as is at the end */
    kgen_stop_flush(m, &o, &ol);
    KT_CHECK(n == 5 && ol == 2);
    kgen_stop_destroy(m);

    /* limits */
    char big[KGEN_MAX_STOP_BYTES + 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    char *b[1] = {big};
    kgen_strs sb = {b, 1};
    KT_CHECK_ERR(kgen_stop_create(&sb, &m), "at most");
}
