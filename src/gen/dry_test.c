/* dry_test.c: DRY against llama.cpp's test vectors, a brute-force
 * reference on random histories, and breakers processed from a fake
 * vocabulary (including one that spans two tokens). */
#include <stdlib.h>

#include "gen/gen_int.h"
#include "kt.h"

/* ---- a fake vocabulary ---- */
static const char *const k_vocab[] = {
    "a", "b", "c", "\n", "x:", ":y", "d", "#", "##", "e#", "#f", "ab", "\"", "*", "hello world", "e##",
};
enum { A, B, C, NL, XCOLON, COLONY, D, HASH, HASH2, EHASH, HASHF, AB, QUOTE, STAR, HELLO, EHASH2, NV };

static const char *piece(void *ud, int32_t id, size_t *len) {
    (void)ud;
    if (id < 0 || id >= NV) return NULL;
    *len = strlen(k_vocab[id]);
    return k_vocab[id];
}

/* Greedy longest match: enough for a tokenizer in these tests. */
static int tokenize(void *ud, const char *text, size_t len, int32_t *out, int cap) {
    (void)ud;
    int n = 0;
    for (size_t i = 0; i < len;) {
        int best = -1;
        size_t best_len = 0;
        for (int id = 0; id < NV; id++) {
            size_t l = strlen(k_vocab[id]);
            if (l > best_len && l <= len - i && memcmp(text + i, k_vocab[id], l) == 0) {
                best = id;
                best_len = l;
            }
        }
        if (best < 0) return -1;
        if (n < cap) out[n] = best;
        n++;
        i += best_len;
    }
    return n;
}

static kgen_vocab vocab(bool with_tokenizer) {
    return (kgen_vocab){NV, piece, with_tokenizer ? tokenize : NULL, NULL, NULL};
}

static kgen_dry *dry_from(const char *const *breakers, int n, bool with_tokenizer) {
    char *v[8];
    for (int i = 0; i < n; i++) v[i] = (char *)breakers[i];
    kgen_strs s = {v, n};
    kgen_vocab voc = vocab(with_tokenizer);
    kgen_dry *d = NULL;
    kiln_status st = kgen_dry_create(&voc, &s, &d);
    if (st) {
        fprintf(stderr, "  %s\n", kiln_status_msg(st));
        kiln_status_free(st);
    }
    return d;
}

/* Penalty of token t (0 if none). */
static float pen_of(const kgen_dry *d, const int32_t *hist, int32_t n, float mult, float base,
                    int32_t allowed, int32_t t) {
    int32_t rc[64];
    kgen_dry_pen out[64];
    int32_t np = kgen_dry_penalties(d, hist, n, mult, base, allowed, rc, out);
    for (int32_t i = 0; i < np; i++)
        if (out[i].token == t) return out[i].penalty;
    return 0.0f;
}

/* llama.cpp tests/test-sampling.cpp "dry": probs after DRY and dist. */
KT_TEST(gen_dry_llama_vectors) {
    static const struct {
        int n_vocab;
        int32_t last[8];
        int n_last;
        float want[5];
        float mult, base;
        int allowed, last_n;
        int breaker; /* -1: none, else a one-token breaker */
    } cases[] = {
        {4, {0, 1}, 2, {0.25f, 0.25f, 0.25f, 0.25f}, 1.0f, 1.1f, 2, 4, -1},
        {4, {0, 1, 2, 0, 1}, 5, {0.296923f, 0.296923f, 0.109232f, 0.296923f}, 1.0f, 1.1f, 2, 5, -1},
        {5, {0, 1, 3, 4, 0, 1}, 6, {0.2f, 0.2f, 0.2f, 0.2f, 0.2f}, 1.0f, 1.1f, 2, 6, 3},
        {5, {0, 1, 2, 0, 1}, 5, {0.241818f, 0.241818f, 0.032727f, 0.241818f, 0.241818f}, 2.0f, 1.1f, 2, 5, -1},
        {5, {0, 1, 2, 3, 4, 0, 1}, 7, {0.2f, 0.2f, 0.2f, 0.2f, 0.2f}, 1.0f, 1.1f, 4, 7, -1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int32_t one[1] = {cases[k].breaker};
        const int32_t *seqs[1] = {one};
        const int32_t lens[1] = {1};
        kgen_dry *d = NULL;
        KT_CHECK_OK(kgen_dry_create_from_tokens(seqs, lens, cases[k].breaker >= 0 ? 1 : 0, &d));
        int32_t n = cases[k].n_last < cases[k].last_n ? cases[k].n_last : cases[k].last_n;
        const int32_t *h = cases[k].last + (cases[k].n_last - n);
        int32_t rc[8];
        kgen_dry_pen pens[8];
        int32_t np = kgen_dry_penalties(d, h, n, cases[k].mult, cases[k].base, cases[k].allowed, rc, pens);
        kgen_cand cand[5];
        for (int i = 0; i < cases[k].n_vocab; i++) {
            cand[i] = (kgen_cand){i, logf(1.0f / (float)cases[k].n_vocab), 0};
            for (int32_t j = 0; j < np; j++)
                if (pens[j].token == i) cand[i].logit -= pens[j].penalty;
        }
        kgen_cands c = {cand, (size_t)cases[k].n_vocab, false};
        kgen_draw(&c, 0.0);
        for (int i = 0; i < cases[k].n_vocab; i++)
            KT_CHECKF(fabsf(cand[i].p - cases[k].want[i]) < 1e-5f, "case %zu token %d: %g want %g", k,
                      i, (double)cand[i].p, (double)cases[k].want[i]);
        kgen_dry_destroy(d);
    }
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The definition, spelled out: a breaker (head, tail...) occurs when the head
 * is i tokens from the end and the tail follows it; the nearest such limits
 * repeats to the tokens after it. A repeat ending at e is the longest common
 * suffix of hist[0..e] and hist; the token after it gets the penalty. */
KT_TEST(gen_dry_matches_brute_force) {
    uint64_t s = 11;
    for (int it = 0; it < 3000; it++) {
        int32_t n = 1 + (int32_t)(lcg(&s) % 40), hist[40];
        int alphabet = 2 + (int)(lcg(&s) % 4);
        for (int32_t i = 0; i < n; i++) hist[i] = (int32_t)(lcg(&s) % (uint64_t)alphabet);
        /* up to 2 breakers of 1-3 tokens */
        int nb = (int)(lcg(&s) % 3);
        int32_t bseq[2][3], blen[2];
        const int32_t *seqs[2] = {bseq[0], bseq[1]};
        for (int b = 0; b < nb; b++) {
            blen[b] = 1 + (int32_t)(lcg(&s) % 3);
            for (int j = 0; j < blen[b]; j++) bseq[b][j] = (int32_t)(lcg(&s) % (uint64_t)(alphabet + 1));
        }
        kgen_dry *d = NULL;
        KT_CHECK_OK(kgen_dry_create_from_tokens(seqs, blen, nb, &d));
        float mult = 0.5f + (float)(lcg(&s) % 4), base = 1.0f + (float)(lcg(&s) % 5) * 0.25f;
        int32_t allowed = (int32_t)(lcg(&s) % 4);

#define RAT(i) hist[n - 1 - (i)]
        int32_t rep_limit = n;
        for (int32_t i = 0; i < n; i++) {
            int32_t longest = -1;
            for (int b = 0; b < nb; b++) {
                int32_t tl = blen[b] - 1;
                if (RAT(i) != bseq[b][0] || tl > i) continue;
                bool ok = true;
                for (int32_t o = 0; o < tl; o++) ok &= bseq[b][1 + o] == RAT(i - 1 - o);
                if (ok && tl > longest) longest = tl;
            }
            if (longest >= 0) {
                rep_limit = i - longest;
                break;
            }
        }
#undef RAT
        float want[8] = {0};
        bool single[8] = {false};
        for (int b = 0; b < nb; b++)
            if (blen[b] == 1) single[bseq[b][0]] = true;
        if (n > allowed && rep_limit >= allowed) {
            int32_t maxlen[8];
            for (int t = 0; t < 8; t++) maxlen[t] = -1;
            for (int32_t e = 0; e + 1 < n; e++) {
                int32_t m = 0;
                while (m <= e && hist[e - m] == hist[n - 1 - m]) m++;
                if (m > rep_limit) m = rep_limit;
                if (m >= allowed && m > maxlen[hist[e + 1]]) maxlen[hist[e + 1]] = m;
            }
            int max_exp = base > 1.000001f ? (int)(88.7228391f / logf(base)) : 0;
            for (int t = 0; t < 8; t++) {
                if (maxlen[t] < 0 || single[t]) continue;
                int ex = maxlen[t] - allowed;
                if (max_exp > 0 && ex > max_exp) ex = max_exp;
                want[t] = (float)((double)mult * pow((double)base, (double)ex));
            }
        }
        for (int t = 0; t < 8; t++)
            KT_CHECKF(pen_of(d, hist, n, mult, base, allowed, t) == want[t],
                      "iteration %d token %d: %g want %g", it, t,
                      (double)pen_of(d, hist, n, mult, base, allowed, t), (double)want[t]);
        kgen_dry_destroy(d);
    }
}

KT_TEST(gen_dry_exponent_clamp) {
    /* 0..99 then 0..98: a repeat of 99 tokens that token 99 would extend;
     * base 3: 3^97 overflows a float, so the exponent is clamped to
     * (int)(88.72 / ln 3) = 80 */
    int32_t hist[199];
    for (int i = 0; i < 199; i++) hist[i] = i % 100;
    kgen_dry *d = NULL;
    KT_CHECK_OK(kgen_dry_create_from_tokens(NULL, NULL, 0, &d));
    int32_t rc[199];
    kgen_dry_pen out[199];
    int32_t np = kgen_dry_penalties(d, hist, 199, 1.0f, 3.0f, 2, rc, out);
    kgen_dry_destroy(d);
    KT_CHECK_EQ(np, 1);
    KT_CHECK_EQ(out[0].token, 99);
    KT_CHECK(isfinite(out[0].penalty) && out[0].penalty == (float)pow(3.0, 80.0));
}

KT_TEST(gen_dry_breakers_from_vocab) {
    for (int tok = 0; tok < 2; tok++) { /* with a tokenizer, then the greedy fallback */
        const char *const colon[] = {":"};
        const char *const hashes[] = {"##"};
        kgen_dry *none = dry_from(NULL, 0, tok), *dc = dry_from(colon, 1, tok), *dh = dry_from(hashes, 1, tok);
        KT_CHECK(none && dc && dh);

        /* "c x: a b c x: a b": the repeat "c x: a b" (4) would continue with c;
         * the breaker inside "x:" limits it to "a b" (2) */
        int32_t h1[] = {C, XCOLON, A, B, C, XCOLON, A, B};
        KT_CHECK(pen_of(none, h1, 8, 1.0f, 2.0f, 2, C) == 4.0f);
        KT_CHECK(pen_of(dc, h1, 8, 1.0f, 2.0f, 2, C) == 1.0f);
        /* ":y" contains the breaker too: it breaks alone and is never penalized */
        int32_t h2[] = {A, B, COLONY, D, A, B};
        KT_CHECK(pen_of(none, h2, 6, 1.0f, 2.0f, 2, COLONY) == 1.0f);
        KT_CHECK(pen_of(dc, h2, 6, 1.0f, 2.0f, 2, COLONY) == 0.0f);

        /* "##" spanning tokens: "e#" is a head whose tail is tokenize("#") =
         * ["#"], so "e#" then "#" is the breaker */
        int32_t h3[] = {C, EHASH, HASH, A, B, C, EHASH, HASH, A, B};
        KT_CHECK(pen_of(none, h3, 10, 1.0f, 2.0f, 2, C) == 8.0f);
        KT_CHECK(pen_of(dh, h3, 10, 1.0f, 2.0f, 2, C) == 1.0f);
        /* as in llama.cpp, the tail is matched by tokens: "e#" then "#f" also
         * spells "##" but is not the tokenization of the tail */
        int32_t h4[] = {C, EHASH, HASHF, A, B, C, EHASH, HASHF, A, B};
        KT_CHECK(pen_of(dh, h4, 10, 1.0f, 2.0f, 2, C) == 8.0f);
        /* "##" and "e##" contain the breaker: single-token breakers */
        int32_t h5[] = {A, B, HASH2, C, A, B};
        KT_CHECK(pen_of(dh, h5, 6, 1.0f, 2.0f, 2, HASH2) == 0.0f);
        /* a head alone, without its tail, breaks nothing */
        int32_t h6[] = {C, EHASH, A, B, C, EHASH, A, B};
        KT_CHECK(pen_of(dh, h6, 8, 1.0f, 2.0f, 2, C) == 4.0f);
        kgen_dry_destroy(none);
        kgen_dry_destroy(dc);
        kgen_dry_destroy(dh);
    }
    /* breakers are cut to 40 bytes; empty breakers are skipped */
    const char *const long_one[] = {"hello world and a great many more words than forty bytes", ""};
    kgen_dry *dl = dry_from(long_one, 2, true);
    KT_CHECK(dl != NULL);
    kgen_dry_destroy(dl);
    /* breakers without token text are an error */
    kgen_vocab nopiece = {NV, NULL, NULL, NULL, NULL};
    char *v[1] = {(char *)":"};
    kgen_strs s = {v, 1};
    kgen_dry *d = NULL;
    KT_CHECK_ERR(kgen_dry_create(&nopiece, &s, &d), "token text");
}
