#include "engine/textio.h"

#include <stdlib.h>

static const char *piece(void *ud, int32_t id, size_t *len) {
    ke_text_vocab *v = ud;
    free(v->buf);
    v->buf = NULL;
    *len = 0;
    kiln_status st = ktok_decode(v->tok, &id, 1, false, &v->buf, len);
    if (st) {
        kiln_status_free(st);
        *len = 0;
        return NULL;
    }
    return v->buf;
}

static int tokenize(void *ud, const char *text, size_t len, int32_t *out, int cap) {
    ke_text_vocab *v = ud;
    int32_t *ids;
    size_t n;
    kiln_status st = ktok_encode(v->tok, text, len, false, &ids, &n);
    if (st) {
        kiln_status_free(st);
        return -1;
    }
    for (size_t i = 0; i < n && (int)i < cap; i++) out[i] = ids[i];
    free(ids);
    return (int)n;
}

void ke_text_vocab_init(ke_text_vocab *v, const ktok *tok, int32_t n_vocab) {
    *v = (ke_text_vocab){.tok = tok, .n_vocab = n_vocab};
}

kgen_vocab ke_text_vocab_get(ke_text_vocab *v) { return (kgen_vocab){v->n_vocab, piece, tokenize, v, NULL}; }

void ke_text_vocab_free(ke_text_vocab *v) {
    free(v->buf);
    v->buf = NULL;
}

static const char *push(void *ud, int32_t id, size_t *len) {
    ke_text_detok *d = ud;
    free(d->buf);
    d->buf = NULL;
    kiln_status st = ktok_stream_push(d->s, id, &d->buf, len);
    if (st) {
        kiln_status_free(st);
        *len = 0;
        return NULL;
    }
    return d->buf;
}

static const char *flush(void *ud, size_t *len) {
    ke_text_detok *d = ud;
    free(d->buf);
    d->buf = NULL;
    kiln_status st = ktok_stream_flush(d->s, &d->buf, len);
    if (st) {
        kiln_status_free(st);
        *len = 0;
        return NULL;
    }
    return d->buf;
}

kiln_status ke_text_detok_init(ke_text_detok *d, const ktok *tok, bool skip_special) {
    d->buf = NULL;
    d->s = ktok_stream_create(tok, skip_special);
    return d->s ? NULL : kiln_error(KILN_ENOMEM, "out of memory");
}

kgen_detok ke_text_detok_get(ke_text_detok *d) { return (kgen_detok){push, flush, d}; }

void ke_text_detok_free(ke_text_detok *d) {
    ktok_stream_destroy(d->s);
    free(d->buf);
    d->s = NULL;
    d->buf = NULL;
}
