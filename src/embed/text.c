/* text.c: texts and (query, document) pairs to the token ids an embedding
 * model or a reranker takes (see embed.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed/embed.h"
#include "tokenizer/tokenizer.h"

kiln_status kemb_encode(const ktok *tok, const char *prompt, const char *text, int32_t **ids, int64_t *n) {
    size_t lp = prompt ? strlen(prompt) : 0, lt = strlen(text), k;
    char *s = malloc(lp + lt + 1);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    memcpy(s, prompt ? prompt : "", lp), memcpy(s + lp, text, lt + 1);
    kiln_status st = ktok_encode(tok, s, lp + lt, true, ids, &k);
    free(s);
    *n = (int64_t)k;
    if (!st && k == 0) st = kiln_error(KILN_EINVAL, "the input gives no tokens");
    return st;
}

/* ids of text with the post-processor's prefix and suffix counted: *pre
 * tokens come before the content, *post after it. An empty text (no
 * content tokens) is split as the frame of a one-letter text is. */
static kiln_status framed(const ktok *tok, const char *text, int32_t **ids, size_t *n, size_t *pre, size_t *post) {
    int32_t *bare;
    size_t nb;
    KILN_TRY(ktok_encode(tok, text, strlen(text), false, &bare, &nb));
    kiln_status st = ktok_encode(tok, text, strlen(text), true, ids, n);
    if (!st && nb == 0 && !strcmp(text, "a")) {
        st = kiln_error(KILN_EUNSUPPORTED, "the tokenizer gives the text \"a\" no tokens");
    } else if (!st && nb == 0) {
        int32_t *probe;
        size_t np;
        st = framed(tok, "a", &probe, &np, pre, post);
        free(probe);
        if (!st && *pre + *post != *n) st = kiln_error(KILN_EUNSUPPORTED, "the tokenizer's post-processor frames an empty text unlike others");
    } else if (!st) {
        size_t p = 0;
        while (p < *n && (p + nb > *n || memcmp(*ids + p, bare, nb * sizeof(int32_t)))) p++;
        if (p + nb > *n) st = kiln_error(KILN_EUNSUPPORTED, "the tokenizer's post-processor changes the text's tokens");
        *pre = p, *post = *n - p - nb;
    }
    free(bare);
    if (st) {
        free(*ids);
        *ids = NULL;
    }
    return st;
}

kiln_status kemb_encode_pair(const kemb_model *m, const ktok *tok, const char *instruction, const char *query,
                             const char *doc, int32_t **ids, int32_t **types, int64_t *n) {
    *ids = *types = NULL;
    *n = 0;
    if (!kemb_is_cross_encoder(m)) { /* Qwen3-Reranker's prompt (its model card) */
        static const char pre[] = "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
                                  "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                                  "<|im_start|>user\n";
        static const char suf[] = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
        const char *ins = instruction ? instruction : "Given a web search query, retrieve relevant passages that answer the query";
        size_t len = sizeof pre + sizeof suf + strlen(ins) + strlen(query) + strlen(doc) + 64;
        char *s = malloc(len);
        if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
        snprintf(s, len, "%s<Instruct>: %s\n<Query>: %s\n<Document>: %s%s", pre, ins, query, doc, suf);
        size_t k;
        kiln_status st = ktok_encode(tok, s, strlen(s), false, ids, &k);
        free(s);
        *n = (int64_t)k;
        return st;
    }
    /* a cross-encoder: the single-text template around each part, as
     * transformers builds pairs: BERT [CLS] q [SEP] d [SEP] with types 0 then
     * 1; RoBERTa (one token type) <s> q </s></s> d </s> */
    int32_t *a, *b;
    size_t na, nb, pa, sa, pb, sb;
    KILN_TRY(framed(tok, query, &a, &na, &pa, &sa));
    kiln_status st = framed(tok, doc, &b, &nb, &pb, &sb);
    if (st) {
        free(a);
        return st;
    }
    bool two_types = ke_model_hparams(kemb_engine_model(m))->type_vocab >= 2;
    size_t db = nb - pb - sb, total = na + (two_types ? 0 : sa) + db + sb;
    if (total == 0) {
        free(a), free(b);
        return kiln_error(KILN_EINVAL, "the query and the document give no tokens");
    }
    *ids = malloc(sizeof(int32_t) * total), *types = malloc(sizeof(int32_t) * total);
    if (!*ids || !*types) st = kiln_error(KILN_ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; !st && i < na; i++) (*ids)[k] = a[i], (*types)[k++] = 0;
    for (size_t i = 0; !st && !two_types && i < sa; i++) (*ids)[k] = a[na - sa + i], (*types)[k++] = 0;
    for (size_t i = 0; !st && i < db + sb; i++) (*ids)[k] = b[pb + i], (*types)[k++] = two_types ? 1 : 0;
    free(a), free(b);
    if (st) {
        free(*ids), free(*types);
        *ids = *types = NULL;
        return st;
    }
    *n = (int64_t)k;
    return NULL;
}

kiln_status kemb_yes_no(const ktok *tok, int32_t *yes, int32_t *no) {
    *yes = ktok_token_id(tok, "yes"), *no = ktok_token_id(tok, "no");
    if (*yes < 0 || *no < 0) return kiln_error(KILN_EUNSUPPORTED, "the tokenizer has no \"yes\" / \"no\" tokens (a decoder reranker scores them)");
    return NULL;
}
