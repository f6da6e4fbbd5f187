/* session_test.c: the generation loop on a scripted fake model. */
#include "gen/session.h"
#include "kt.h"

static const char *const k_words[] = {
    "<eos>", "Hello", ",", " wor", "ld", "<|", "end", "|>", " more", "\xE2\x82", "\xAC",
};
enum { EOS, HELLO, COMMA, WOR, LD, LT, END, GT, MORE, EURO1, EURO2, NV };

static const char *piece(void *ud, int32_t id, size_t *len) {
    (void)ud;
    *len = strlen(k_words[id]);
    return k_words[id];
}

typedef struct {
    char text[256];
    size_t len;
    kgen_finish finish;
    int steps;
} result;

/* Greedy over one-hot logits that follow `script`. */
static kiln_status run(const char *stop, int32_t n_predict, int32_t n_ctx, const int32_t *script,
                       int n, result *r) {
    kgen_params p;
    KILN_TRY(kgen_params_init(&p));
    p.temperature = 0.0f;
    p.n_predict = n_predict;
    char *stops[1] = {(char *)stop};
    kgen_strs saved = p.stop;
    if (stop) p.stop = (kgen_strs){stops, 1};
    kgen_vocab v = {NV, piece, NULL, NULL, NULL};
    const int32_t eos[1] = {EOS}, prompt[2] = {HELLO, COMMA};
    kgen_session *g = NULL;
    kiln_status st = kgen_session_create(&p, &v, n_ctx, eos, 1, prompt, 2, &g);
    p.stop = saved;
    kgen_params_free(&p);
    if (st) return st;
    memset(r, 0, sizeof *r);
    r->finish = kgen_session_start(g);
    for (int i = 0; i < n && r->finish == KGEN_CONTINUE && !st; i++) {
        float logits[NV] = {0};
        logits[script[i]] = 10.0f;
        kgen_step s;
        st = kgen_session_step(g, logits, &s);
        if (st) break;
        if (s.token != script[i]) st = kiln_error(KILN_EINTERNAL, "step %d: token %d", i, s.token);
        memcpy(r->text + r->len, s.text, s.text_len);
        r->len += s.text_len;
        r->finish = s.finish;
        r->steps++;
    }
    if (!st && r->finish != KGEN_CONTINUE) {
        float logits[NV] = {0};
        kgen_step s;
        kiln_status again = kgen_session_step(g, logits, &s);
        if (!again) st = kiln_error(KILN_EINTERNAL, "a step after the end succeeded");
        kiln_status_free(again);
    }
    kgen_session_destroy(g);
    return st;
}

KT_TEST(gen_session_loop) {
    result r;
    const int32_t s1[] = {HELLO, COMMA, WOR, LD, LT, END, GT, MORE, EOS};
    KT_CHECK_OK(run("<|end|>", -1, 100, s1, 9, &r));
    KT_CHECK(r.finish == KGEN_FINISH_STOP_STRING && r.steps == 7);
    KT_CHECK(r.len == 12 && memcmp(r.text, "Hello, world", 12) == 0);

    const int32_t s2[] = {HELLO, LT, EOS};
    KT_CHECK_OK(run("<|end|>", -1, 100, s2, 3, &r)); /* a held partial stop is flushed at EOS */
    KT_CHECK(r.finish == KGEN_FINISH_EOS && r.len == 7 && memcmp(r.text, "Hello<|", 7) == 0);

    const int32_t s3[] = {HELLO, COMMA, LT, END};
    KT_CHECK_OK(run("<|end|>", 3, 100, s3, 4, &r)); /* ... and at the length limit */
    KT_CHECK(r.finish == KGEN_FINISH_LENGTH && r.steps == 3);
    KT_CHECK(r.len == 8 && memcmp(r.text, "Hello,<|", 8) == 0);

    KT_CHECK_OK(run(NULL, -1, 4, s1, 9, &r)); /* prompt 2 + 2 fill n_ctx = 4 */
    KT_CHECK(r.finish == KGEN_FINISH_CONTEXT && r.steps == 2 && r.len == 6);

    const int32_t s4[] = {EURO1, EURO2, EOS};
    KT_CHECK_OK(run(NULL, -1, 100, s4, 3, &r));
    KT_CHECK(r.finish == KGEN_FINISH_EOS && r.len == 3 && memcmp(r.text, "\xE2\x82\xAC", 3) == 0);

    KT_CHECK_OK(run(NULL, 0, 100, s1, 9, &r));
    KT_CHECK(r.finish == KGEN_FINISH_LENGTH && r.steps == 0);
    KT_CHECK_OK(run(NULL, -1, 2, s1, 9, &r));
    KT_CHECK(r.finish == KGEN_FINISH_CONTEXT && r.steps == 0);

    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    kgen_vocab nopiece = {NV, NULL, NULL, NULL, NULL};
    kgen_session *g = NULL;
    KT_CHECK_ERR(kgen_session_create(&p, &nopiece, 10, NULL, 0, NULL, 0, &g), "no token text");
    kgen_params_free(&p);
}

/* The reasoning budget: after N tokens of the thinking block the closing
 * marker is forced (one token that spells it, or the tokenizer's split). */
static const char *const k_think[] = {"<eos>", "<think>", "a", "</think>", "ok", "</", "think>"};
static const char *think_piece(void *ud, int32_t id, size_t *len) {
    if (id == *(int *)ud) return *len = 0, NULL;
    *len = strlen(k_think[id]);
    return k_think[id];
}
static int think_tokenize(void *ud, const char *text, size_t len, int32_t *out, int cap) {
    (void)ud;
    if (len != 8 || memcmp(text, "</think>", 8)) return -1;
    if (cap >= 2) out[0] = 5, out[1] = 6;
    return 2;
}

static void think_run(int hide, bool in_prompt, int32_t budget, const int32_t *script, int n, char *text) {
    kgen_params p;
    KT_CHECK_OK(kgen_params_init(&p));
    p.temperature = 0.0f;
    p.think_open = strdup("<think>");
    p.think_close = strdup("</think>");
    p.think_in_prompt = in_prompt;
    p.reasoning_budget = budget;
    int nv = hide;
    kgen_vocab v = {7, think_piece, think_tokenize, &nv, NULL};
    const int32_t eos[1] = {0}, prompt[1] = {4};
    kgen_session *g = NULL;
    KT_CHECK_OK(kgen_session_create(&p, &v, 100, eos, 1, prompt, 1, &g));
    text[0] = 0;
    for (int i = 0; i < 40; i++) {
        float logits[7] = {0};
        logits[script[i < n ? i : n - 1]] = 10;
        kgen_step s;
        KT_CHECK_OK(kgen_session_step(g, logits, &s));
        strncat(text, s.text, s.text_len);
        if (s.finish != KGEN_CONTINUE) break;
    }
    kgen_session_destroy(g);
    kgen_params_free(&p);
}

KT_TEST(session_reasoning_budget) {
    enum { E, O, A, C, K };
    const int32_t s1[] = {O, A, A, A, A, A, A, K, E};
    char t[256];
    think_run(7, false, 3, s1, 9, t); /* three tokens of thinking, then </think> */
    KT_CHECKF(!strcmp(t, "<think>aaa</think>aaok"), "%s", t);
    think_run(7, false, 100, s1, 9, t); /* within the budget: untouched */
    KT_CHECKF(!strcmp(t, "<think>aaaaaaok"), "%s", t);
    const int32_t s2[] = {A, A, C, A, A, K, E};
    think_run(7, false, 1, s2, 7, t); /* no block opened: untouched */
    KT_CHECKF(!strcmp(t, "aa</think>aaok"), "%s", t);
    think_run(7, true, 1, s2, 7, t); /* the prompt opened it (the model writes its own close later) */
    KT_CHECKF(!strcmp(t, "a</think></think>aaok"), "%s", t);
    think_run(7, true, 5, s2, 7, t); /* closed by the model before the budget */
    KT_CHECKF(!strcmp(t, "aa</think>aaok"), "%s", t);
    const int32_t s3[] = {A, A, A, K, E};
    think_run(C, true, 0, s3, 5, t); /* budget 0, no token that is </think>: the tokenizer's split, at once */
    KT_CHECKF(!strcmp(t, "</think>aok"), "%s", t);
    const int32_t s4[] = {A, O, A, A, K, E};
    think_run(7, false, 0, s4, 6, t);
    KT_CHECKF(!strcmp(t, "a<think></think>aok"), "%s", t);
}
