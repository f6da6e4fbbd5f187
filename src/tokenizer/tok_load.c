/* tok_load.c: tokenizer.json (and vocab.json + merges.txt) into a ktok.
 *
 * Every error names the field at fault, e.g.
 *   "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: ...". */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "tokenizer/tok_int.h"

#define OOM kiln_error(KILN_ENOMEM, "out of memory")
#define MAX_ID (1 << 24) /* ids beyond this are taken as corrupt input */

static kiln_status bad(const char *path, const char *what) {
    return kiln_error(KILN_EINVAL, "%s: %s", path, what);
}

static const cJSON *get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static kiln_status get_str(const cJSON *o, const char *path, const char *key, const char *def, const char **out) {
    const cJSON *v = get(o, key);
    *out = def;
    if (!v) return NULL;
    if (!cJSON_IsString(v)) return kiln_error(KILN_EINVAL, "%s.%s: expected a string", path, key);
    *out = v->valuestring;
    return NULL;
}

static kiln_status get_bool(const cJSON *o, const char *path, const char *key, bool def, bool *out) {
    const cJSON *v = get(o, key);
    *out = def;
    if (!v) return NULL;
    if (!cJSON_IsBool(v)) return kiln_error(KILN_EINVAL, "%s.%s: expected true or false", path, key);
    *out = cJSON_IsTrue(v);
    return NULL;
}

static kiln_status get_int(const cJSON *o, const char *path, const char *key, int64_t def, int64_t lo, int64_t hi,
                           int64_t *out) {
    const cJSON *v = get(o, key);
    *out = def;
    if (!v) return NULL;
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0.5;
    if (!cJSON_IsNumber(v) || d != (double)(int64_t)d || d < (double)lo || d > (double)hi)
        return kiln_error(KILN_EINVAL, "%s.%s: expected an integer in [%lld, %lld]", path, key, (long long)lo,
                          (long long)hi);
    *out = (int64_t)d;
    return NULL;
}

/* A single code point string (e.g. a Metaspace replacement). */
static kiln_status get_char(const cJSON *o, const char *path, const char *key, uint32_t def, uint32_t *out) {
    const char *s;
    KILN_TRY(get_str(o, path, key, NULL, &s));
    *out = def;
    if (!s) return NULL;
    size_t n = strlen(s);
    if (n == 0 || tk_utf8_valid_prefix(s, n) != n || (size_t)tk_utf8_len((unsigned char)s[0]) != n)
        return kiln_error(KILN_EINVAL, "%s.%s: expected a single character", path, key);
    tk_utf8_dec(s, n, out);
    return NULL;
}

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static kiln_status load_pattern(const cJSON *o, const char *path, tk_pattern *pat) {
    const cJSON *p = get(o, "pattern");
    if (!p || !cJSON_IsObject(p)) return kiln_error(KILN_EINVAL, "%s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", path);
    const cJSON *s = get(p, "String"), *r = get(p, "Regex");
    if (s && cJSON_IsString(s)) {
        pat->is_regex = false;
        pat->lit_len = strlen(s->valuestring);
        pat->lit = dup_n(s->valuestring, pat->lit_len);
        if (!pat->lit) return OOM;
        if (pat->lit_len == 0) { /* an empty literal matches everywhere, as onig's "" */
            return tk_regex_compile("", 0, &pat->re);
        }
        return NULL;
    }
    if (r && cJSON_IsString(r)) {
        pat->is_regex = true;
        kiln_status st = tk_regex_compile(r->valuestring, strlen(r->valuestring), &pat->re);
        return st ? kiln_status_wrap(st, "%s.pattern.Regex", path) : NULL;
    }
    return kiln_error(KILN_EINVAL, "%s.pattern: expected {\"String\": ...} or {\"Regex\": ...}", path);
}

static kiln_status get_list(const cJSON *o, const char *path, const char *key, const cJSON **out, int *n) {
    const cJSON *v = get(o, key);
    *out = NULL;
    *n = 0;
    if (!v) return NULL;
    if (!cJSON_IsArray(v)) return kiln_error(KILN_EINVAL, "%s.%s: expected a list", path, key);
    *out = v;
    *n = cJSON_GetArraySize(v);
    if (*n > 4096) return kiln_error(KILN_EINVAL, "%s.%s: too many entries", path, key);
    return NULL;
}

static kiln_status get_type(const cJSON *o, const char *path, const char **type) {
    if (!cJSON_IsObject(o)) return kiln_error(KILN_EINVAL, "%s: expected an object", path);
    KILN_TRY(get_str(o, path, "type", NULL, type));
    if (!*type) return kiln_error(KILN_EINVAL, "%s.type: missing", path);
    return NULL;
}

/* ---- normalizers ------------------------------------------------------------ */

static bool b64val(unsigned char c, int *v) {
    if (c >= 'A' && c <= 'Z') *v = c - 'A';
    else if (c >= 'a' && c <= 'z') *v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') *v = c - '0' + 52;
    else if (c == '+') *v = 62;
    else if (c == '/') *v = 63;
    else return false;
    return true;
}

static kiln_status base64(const char *s, const char *path, unsigned char **out, size_t *n) {
    size_t len = strlen(s);
    unsigned char *p = malloc(len / 4 * 3 + 4);
    if (!p) return OOM;
    size_t k = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v;
        if (s[i] == '=') break;
        if (!b64val((unsigned char)s[i], &v)) {
            free(p);
            return kiln_error(KILN_EINVAL, "%s: invalid base64 at byte %zu", path, i);
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            p[k++] = (unsigned char)(acc >> bits);
        }
    }
    *out = p;
    *n = k;
    return NULL;
}

static kiln_status load_precompiled(const cJSON *o, const char *path, tk_norm *nm) {
    const char *b64;
    KILN_TRY(get_str(o, path, "precompiled_charsmap", NULL, &b64));
    if (!b64 || !*b64) return NULL; /* empty map: identity */
    unsigned char *raw = NULL;
    size_t n = 0;
    char sub[512];
    snprintf(sub, sizeof sub, "%.400s.precompiled_charsmap", path);
    KILN_TRY(base64(b64, sub, &raw, &n));
    kiln_status st = NULL;
    uint32_t trie_bytes = 0;
    if (n < 4) st = bad(sub, "too short");
    else {
        trie_bytes = (uint32_t)raw[0] | (uint32_t)raw[1] << 8 | (uint32_t)raw[2] << 16 | (uint32_t)raw[3] << 24;
        if (trie_bytes > n - 4 || trie_bytes % 4) st = bad(sub, "trie size out of range");
    }
    if (!st) {
        nm->trie_n = trie_bytes / 4;
        nm->trie = malloc(nm->trie_n * 4 + 4);
        nm->norm_len = n - 4 - trie_bytes;
        nm->norm_blob = malloc(nm->norm_len + 1);
        if (!nm->trie || !nm->norm_blob) st = OOM;
    }
    if (!st) {
        for (size_t i = 0; i < nm->trie_n; i++) {
            const unsigned char *q = raw + 4 + 4 * i;
            nm->trie[i] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
        }
        memcpy(nm->norm_blob, raw + 4 + trie_bytes, nm->norm_len);
        nm->norm_blob[nm->norm_len] = 0;
        if (tk_utf8_valid_prefix(nm->norm_blob, nm->norm_len) != nm->norm_len) st = bad(sub, "replacements are not UTF-8");
    }
    free(raw);
    return st;
}

static kiln_status load_norm(const cJSON *o, const char *path, tk_norm *nm, int depth) {
    const char *type;
    if (depth > 16) return bad(path, "nested too deeply");
    KILN_TRY(get_type(o, path, &type));
    char sub[512];
    if (!strcmp(type, "Sequence")) {
        const cJSON *l, *e;
        int n, i = 0;
        nm->type = TN_SEQ;
        KILN_TRY(get_list(o, path, "normalizers", &l, &n));
        if (!l) return kiln_error(KILN_EINVAL, "%s.normalizers: missing", path);
        nm->subs = calloc((size_t)n + 1, sizeof *nm->subs);
        if (!nm->subs) return OOM;
        cJSON_ArrayForEach(e, l) {
            snprintf(sub, sizeof sub, "%.400s.normalizers[%d]", path, i);
            nm->n_subs = i + 1;
            KILN_TRY(load_norm(e, sub, &nm->subs[i], depth + 1));
            i++;
        }
        return NULL;
    }
    if (!strcmp(type, "NFC")) { nm->type = TN_NFC; return NULL; }
    if (!strcmp(type, "NFD")) { nm->type = TN_NFD; return NULL; }
    if (!strcmp(type, "NFKC")) { nm->type = TN_NFKC; return NULL; }
    if (!strcmp(type, "NFKD")) { nm->type = TN_NFKD; return NULL; }
    if (!strcmp(type, "Lowercase")) { nm->type = TN_LOWER; return NULL; }
    if (!strcmp(type, "StripAccents")) { nm->type = TN_STRIP_ACCENTS; return NULL; }
    if (!strcmp(type, "Nmt")) { nm->type = TN_NMT; return NULL; }
    if (!strcmp(type, "ByteLevel")) { nm->type = TN_BYTELEVEL; return NULL; }
    if (!strcmp(type, "Strip")) {
        nm->type = TN_STRIP;
        KILN_TRY(get_bool(o, path, "strip_left", true, &nm->left));
        return get_bool(o, path, "strip_right", true, &nm->right);
    }
    if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
        const char *content;
        bool rep = type[0] == 'R';
        nm->type = rep ? TN_REPLACE : TN_PREPEND;
        KILN_TRY(get_str(o, path, rep ? "content" : "prepend", NULL, &content));
        if (!content) return kiln_error(KILN_EINVAL, "%s.%s: missing", path, rep ? "content" : "prepend");
        nm->content_len = strlen(content);
        nm->content = dup_n(content, nm->content_len);
        if (!nm->content) return OOM;
        return rep ? load_pattern(o, path, &nm->pat) : NULL;
    }
    if (!strcmp(type, "Precompiled")) {
        nm->type = TN_PRECOMPILED;
        return load_precompiled(o, path, nm);
    }
    if (!strcmp(type, "BertNormalizer")) {
        nm->type = TN_BERT;
        KILN_TRY(get_bool(o, path, "clean_text", true, &nm->clean_text));
        KILN_TRY(get_bool(o, path, "handle_chinese_chars", true, &nm->chinese_chars));
        KILN_TRY(get_bool(o, path, "lowercase", true, &nm->lowercase));
        return get_bool(o, path, "strip_accents", nm->lowercase, &nm->strip_accents);
    }
    return kiln_error(KILN_EUNSUPPORTED, "%s.type: unknown normalizer \"%s\"", path, type);
}

/* ---- pre-tokenizers --------------------------------------------------------- */

static kiln_status get_behavior(const cJSON *o, const char *path, tb_behavior def, tb_behavior *out) {
    const char *b;
    KILN_TRY(get_str(o, path, "behavior", NULL, &b));
    *out = def;
    if (!b) return NULL;
    if (!strcmp(b, "Removed")) *out = TB_REMOVED;
    else if (!strcmp(b, "Isolated")) *out = TB_ISOLATED;
    else if (!strcmp(b, "MergedWithPrevious")) *out = TB_MERGED_PREV;
    else if (!strcmp(b, "MergedWithNext")) *out = TB_MERGED_NEXT;
    else if (!strcmp(b, "Contiguous")) *out = TB_CONTIGUOUS;
    else return kiln_error(KILN_EINVAL, "%s.behavior: unknown \"%s\"", path, b);
    return NULL;
}

static kiln_status get_scheme(const cJSON *o, const char *path, tm_scheme *out) {
    const char *s;
    bool aps;
    KILN_TRY(get_str(o, path, "prepend_scheme", NULL, &s));
    KILN_TRY(get_bool(o, path, "add_prefix_space", true, &aps));
    *out = aps ? TM_ALWAYS : TM_NEVER;
    if (!s) return NULL;
    if (!strcmp(s, "always")) *out = TM_ALWAYS;
    else if (!strcmp(s, "first")) *out = TM_FIRST;
    else if (!strcmp(s, "never")) *out = TM_NEVER;
    else return kiln_error(KILN_EINVAL, "%s.prepend_scheme: unknown \"%s\"", path, s);
    if (!aps) *out = TM_NEVER;
    return NULL;
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static kiln_status load_pretok(const cJSON *o, const char *path, tk_pretok *pt, int depth) {
    const char *type;
    if (depth > 16) return bad(path, "nested too deeply");
    KILN_TRY(get_type(o, path, &type));
    char sub[512];
    if (!strcmp(type, "Sequence")) {
        const cJSON *l, *e;
        int n, i = 0;
        pt->type = TP_SEQ;
        KILN_TRY(get_list(o, path, "pretokenizers", &l, &n));
        if (!l) return kiln_error(KILN_EINVAL, "%s.pretokenizers: missing", path);
        pt->subs = calloc((size_t)n + 1, sizeof *pt->subs);
        if (!pt->subs) return OOM;
        cJSON_ArrayForEach(e, l) {
            snprintf(sub, sizeof sub, "%.400s.pretokenizers[%d]", path, i);
            pt->n_subs = i + 1;
            KILN_TRY(load_pretok(e, sub, &pt->subs[i], depth + 1));
            if (pt->subs[i].type == TP_SEQ) return bad(sub, "a Sequence inside a Sequence is not supported");
            i++;
        }
        return NULL;
    }
    if (!strcmp(type, "ByteLevel")) {
        pt->type = TP_BYTELEVEL;
        KILN_TRY(get_bool(o, path, "add_prefix_space", true, &pt->add_prefix_space));
        KILN_TRY(get_bool(o, path, "use_regex", true, &pt->use_regex));
        if (pt->use_regex) {
            pt->pat.is_regex = true;
            KILN_TRY(tk_regex_compile(GPT2_RE, sizeof GPT2_RE - 1, &pt->pat.re));
        }
        return NULL;
    }
    if (!strcmp(type, "Split")) {
        pt->type = TP_SPLIT;
        KILN_TRY(get_behavior(o, path, TB_ISOLATED, &pt->behavior));
        KILN_TRY(get_bool(o, path, "invert", false, &pt->invert));
        if (!get(o, "behavior")) return kiln_error(KILN_EINVAL, "%s.behavior: missing", path);
        return load_pattern(o, path, &pt->pat);
    }
    if (!strcmp(type, "Metaspace")) {
        pt->type = TP_METASPACE;
        KILN_TRY(get_char(o, path, "replacement", 0x2581, &pt->repl));
        KILN_TRY(get_bool(o, path, "split", true, &pt->split));
        return get_scheme(o, path, &pt->scheme);
    }
    if (!strcmp(type, "Whitespace")) {
        pt->type = TP_WHITESPACE;
        /* Rust regex \w+|[^\w\s]+ (Unicode \w, no Oniguruma quirks) */
        static const char re[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]+|"
                                 "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\p{White_Space}]+";
        pt->pat.is_regex = true;
        return tk_regex_compile(re, sizeof re - 1, &pt->pat.re);
    }
    if (!strcmp(type, "WhitespaceSplit")) { pt->type = TP_WHITESPACE_SPLIT; return NULL; }
    if (!strcmp(type, "BertPreTokenizer")) { pt->type = TP_BERT; return NULL; }
    if (!strcmp(type, "Digits")) {
        pt->type = TP_DIGITS;
        return get_bool(o, path, "individual_digits", false, &pt->individual);
    }
    if (!strcmp(type, "Punctuation")) {
        pt->type = TP_PUNCT;
        return get_behavior(o, path, TB_ISOLATED, &pt->behavior);
    }
    if (!strcmp(type, "CharDelimiterSplit")) {
        pt->type = TP_CHAR_DELIM;
        KILN_TRY(get_char(o, path, "delimiter", 0, &pt->repl));
        if (!get(o, "delimiter")) return kiln_error(KILN_EINVAL, "%s.delimiter: missing", path);
        return NULL;
    }
    return kiln_error(KILN_EUNSUPPORTED, "%s.type: unknown pre-tokenizer \"%s\"", path, type);
}

/* ---- decoders ---------------------------------------------------------------- */

static kiln_status set_content(char **dst, size_t *len, const char *s) {
    *len = strlen(s);
    *dst = dup_n(s, *len);
    return *dst ? NULL : OOM;
}

static kiln_status load_dec(const cJSON *o, const char *path, tk_dec *d, int depth) {
    const char *type, *s;
    int64_t v;
    if (depth > 16) return bad(path, "nested too deeply");
    KILN_TRY(get_type(o, path, &type));
    char sub[512];
    if (!strcmp(type, "Sequence")) {
        const cJSON *l, *e;
        int n, i = 0;
        d->type = TD_SEQ;
        KILN_TRY(get_list(o, path, "decoders", &l, &n));
        if (!l) return kiln_error(KILN_EINVAL, "%s.decoders: missing", path);
        d->subs = calloc((size_t)n + 1, sizeof *d->subs);
        if (!d->subs) return OOM;
        cJSON_ArrayForEach(e, l) {
            snprintf(sub, sizeof sub, "%.400s.decoders[%d]", path, i);
            d->n_subs = i + 1;
            KILN_TRY(load_dec(e, sub, &d->subs[i], depth + 1));
            if (d->subs[i].type == TD_SEQ) return bad(sub, "a Sequence inside a Sequence is not supported");
            i++;
        }
        return NULL;
    }
    if (!strcmp(type, "ByteLevel")) { d->type = TD_BYTELEVEL; return NULL; }
    if (!strcmp(type, "ByteFallback")) { d->type = TD_BYTEFALLBACK; return NULL; }
    if (!strcmp(type, "Fuse")) { d->type = TD_FUSE; return NULL; }
    if (!strcmp(type, "Metaspace")) {
        d->type = TD_METASPACE;
        KILN_TRY(get_char(o, path, "replacement", 0x2581, &d->repl));
        return get_scheme(o, path, &d->scheme);
    }
    if (!strcmp(type, "Strip")) {
        d->type = TD_STRIP;
        KILN_TRY(get_char(o, path, "content", ' ', &d->repl));
        KILN_TRY(get_int(o, path, "start", 0, 0, 1 << 20, &v));
        d->start = (int)v;
        KILN_TRY(get_int(o, path, "stop", 0, 0, 1 << 20, &v));
        d->stop = (int)v;
        return NULL;
    }
    if (!strcmp(type, "Replace")) {
        d->type = TD_REPLACE;
        KILN_TRY(get_str(o, path, "content", NULL, &s));
        if (!s) return kiln_error(KILN_EINVAL, "%s.content: missing", path);
        KILN_TRY(set_content(&d->content, &d->content_len, s));
        return load_pattern(o, path, &d->pat);
    }
    if (!strcmp(type, "WordPiece")) {
        d->type = TD_WORDPIECE;
        KILN_TRY(get_str(o, path, "prefix", "##", &s));
        KILN_TRY(set_content(&d->content, &d->content_len, s));
        return get_bool(o, path, "cleanup", true, &d->cleanup);
    }
    if (!strcmp(type, "BPEDecoder")) {
        d->type = TD_BPE;
        KILN_TRY(get_str(o, path, "suffix", "</w>", &s));
        return set_content(&d->content, &d->content_len, s);
    }
    if (!strcmp(type, "CTC")) {
        d->type = TD_CTC;
        KILN_TRY(get_str(o, path, "pad_token", "<pad>", &s));
        KILN_TRY(set_content(&d->content, &d->content_len, s));
        KILN_TRY(get_str(o, path, "word_delimiter_token", "|", &s));
        size_t n;
        KILN_TRY(set_content(&d->word_delim, &n, s));
        return get_bool(o, path, "cleanup", true, &d->cleanup);
    }
    return kiln_error(KILN_EUNSUPPORTED, "%s.type: unknown decoder \"%s\"", path, type);
}

/* ---- vocabulary --------------------------------------------------------------- */

static kiln_status grow_ids(ktok *t, int64_t id) {
    if (id < t->cap_ids) {
        if (id >= t->n_ids) t->n_ids = (int32_t)id + 1;
        return NULL;
    }
    if (id >= MAX_ID) return kiln_error(KILN_EINVAL, "token id %lld is too large", (long long)id);
    int32_t n = t->cap_ids ? t->cap_ids : 1024;
    while (n <= id) n *= 2;
    const char **s = realloc(t->id_str, (size_t)n * sizeof *s);
    if (s) t->id_str = s;
    uint32_t *l = realloc(t->id_len, (size_t)n * sizeof *l);
    if (l) t->id_len = l;
    uint8_t *sp = realloc(t->special, (size_t)n);
    if (sp) t->special = sp;
    uint8_t *ad = realloc(t->is_added, (size_t)n);
    if (ad) t->is_added = ad;
    if (!s || !l || !sp || !ad) return OOM;
    for (int32_t i = t->cap_ids; i < n; i++) {
        t->id_str[i] = NULL;
        t->id_len[i] = 0;
        t->special[i] = 0;
        t->is_added[i] = 0;
    }
    t->cap_ids = n;
    t->n_ids = (int32_t)id + 1;
    return NULL;
}

/* Registers a model token: vocab map and id -> string. */
static kiln_status add_vocab(ktok *t, const char *s, size_t n, int64_t id) {
    if (id < 0) return kiln_error(KILN_EINVAL, "negative token id");
    KILN_TRY(grow_ids(t, id));
    char *k = ku_arena_memdup(t->arena, s, n + 1);
    if (!k || !tk_strmap_put(&t->vocab, k, n, (int32_t)id)) return OOM;
    t->id_str[id] = k;
    t->id_len[id] = (uint32_t)n;
    if (id + 1 > t->n_model) t->n_model = (int32_t)id + 1;
    return NULL;
}

static kiln_status load_vocab_obj(ktok *t, const cJSON *v, const char *path) {
    if (!cJSON_IsObject(v)) return kiln_error(KILN_EINVAL, "%s: expected an object of token: id", path);
    int n = cJSON_GetArraySize(v);
    if (!tk_strmap_init(&t->vocab, (size_t)n + 16)) return OOM;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int64_t)d || d < 0 || d >= MAX_ID)
            return kiln_error(KILN_EINVAL, "%s[\"%.40s\"]: expected a token id", path, e->string);
        size_t len = strlen(e->string);
        if (tk_utf8_valid_prefix(e->string, len) != len)
            return kiln_error(KILN_EINVAL, "%s: token %d is not UTF-8", path, (int)d);
        KILN_TRY(add_vocab(t, e->string, len, (int64_t)d));
    }
    return NULL;
}

static kiln_status add_merge(ktok *t, const char *a, size_t al, const char *b, size_t bl, int32_t rank,
                             const char *path, tk_buf *tmp) {
    tk_model *m = &t->model;
    int32_t ia = tk_strmap_get(&t->vocab, a, al), ib = tk_strmap_get(&t->vocab, b, bl);
    if (ia < 0) return kiln_error(KILN_EINVAL, "%s[%d]: token \"%.*s\" is not in the vocabulary", path, rank, (int)al, a);
    if (ib < 0) return kiln_error(KILN_EINVAL, "%s[%d]: token \"%.*s\" is not in the vocabulary", path, rank, (int)bl, b);
    size_t skip = m->prefix_len;
    if (skip > bl) return kiln_error(KILN_EINVAL, "%s[%d]: \"%.*s\" is shorter than the subword prefix", path, rank, (int)bl, b);
    tmp->n = 0;
    if (!tk_buf_put(tmp, a, al) || !tk_buf_put(tmp, b + skip, bl - skip)) return OOM;
    int32_t im = tk_strmap_get(&t->vocab, tmp->p, tmp->n);
    if (im < 0)
        return kiln_error(KILN_EINVAL, "%s[%d]: merged token \"%.*s\" is not in the vocabulary", path, rank, (int)tmp->n, tmp->p);
    uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
    return tk_u64map_put(&m->merges, key, rank, im) ? NULL : OOM; /* a later duplicate wins, as HF's collect */
}

static kiln_status load_merges(ktok *t, const cJSON *l, const char *path) {
    if (!cJSON_IsArray(l)) return kiln_error(KILN_EINVAL, "%s: expected a list", path);
    int n = cJSON_GetArraySize(l);
    if (!tk_u64map_init(&t->model.merges, (size_t)n + 16)) return OOM;
    tk_buf tmp = {0};
    kiln_status st = NULL;
    int32_t rank = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, l) {
        if (cJSON_IsString(e)) {
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp) {
                st = kiln_error(KILN_EINVAL, "%s[%d]: expected \"a b\"", path, rank);
                break;
            }
            st = add_merge(t, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), rank, path, &tmp);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next)) {
            const char *a = e->child->valuestring, *b = e->child->next->valuestring;
            st = add_merge(t, a, strlen(a), b, strlen(b), rank, path, &tmp);
        } else {
            st = kiln_error(KILN_EINVAL, "%s[%d]: expected \"a b\" or [\"a\", \"b\"]", path, rank);
        }
        if (st) break;
        rank++;
    }
    tk_buf_free(&tmp);
    return st;
}

static kiln_status set_affix(const cJSON *o, const char *path, const char *key, const char *def, char **out, size_t *len) {
    const char *s;
    KILN_TRY(get_str(o, path, key, def, &s));
    *out = NULL;
    *len = 0;
    if (!s || !*s) return NULL; /* "" adds nothing: same as none */
    return set_content(out, len, s);
}

static void byte_ids(ktok *t) {
    for (int b = 0; b < 256; b++) {
        char k[8];
        snprintf(k, sizeof k, "<0x%02X>", b);
        t->model.byte_ids[b] = tk_strmap_get(&t->vocab, k, 6);
    }
}

static kiln_status unk_of(ktok *t, const cJSON *o, const char *path, const char *def) {
    const char *unk;
    KILN_TRY(get_str(o, path, "unk_token", def, &unk));
    t->model.unk_id = -1;
    if (unk) {
        t->model.unk_id = tk_strmap_get(&t->vocab, unk, strlen(unk));
        if (t->model.unk_id < 0) t->model.unk_id = -2; /* named but missing: an error once needed */
    }
    return NULL;
}

static kiln_status load_model(ktok *t, const cJSON *o, const char *path) {
    if (!o) return kiln_error(KILN_EINVAL, "%s: missing", path);
    if (!cJSON_IsObject(o)) return kiln_error(KILN_EINVAL, "%s: expected an object", path);
    const char *type;
    KILN_TRY(get_str(o, path, "type", NULL, &type));
    const cJSON *vocab = get(o, "vocab");
    char sub[512];
    snprintf(sub, sizeof sub, "%.400s.vocab", path);
    if (!vocab) return kiln_error(KILN_EINVAL, "%s: missing", sub);
    if (!type) { /* old files: infer it */
        if (get(o, "merges")) type = "BPE";
        else if (cJSON_IsArray(vocab)) type = "Unigram";
        else if (get(o, "continuing_subword_prefix") || get(o, "max_input_chars_per_word")) type = "WordPiece";
        else type = "WordLevel";
    }
    tk_model *m = &t->model;
    if (!strcmp(type, "BPE")) {
        m->type = TM_BPE;
        KILN_TRY(load_vocab_obj(t, vocab, sub));
        KILN_TRY(set_affix(o, path, "continuing_subword_prefix", NULL, &m->prefix, &m->prefix_len));
        KILN_TRY(set_affix(o, path, "end_of_word_suffix", NULL, &m->suffix, &m->suffix_len));
        KILN_TRY(get_bool(o, path, "byte_fallback", false, &m->byte_fallback));
        KILN_TRY(get_bool(o, path, "fuse_unk", false, &m->fuse_unk));
        KILN_TRY(get_bool(o, path, "ignore_merges", false, &m->ignore_merges));
        KILN_TRY(unk_of(t, o, path, NULL));
        const cJSON *merges = get(o, "merges");
        snprintf(sub, sizeof sub, "%.400s.merges", path);
        if (!merges) return kiln_error(KILN_EINVAL, "%s: missing", sub);
        KILN_TRY(load_merges(t, merges, sub));
        byte_ids(t);
        return NULL;
    }
    if (!strcmp(type, "Unigram")) {
        m->type = TM_UNIGRAM;
        if (!cJSON_IsArray(vocab)) return kiln_error(KILN_EINVAL, "%s: expected a list of [piece, score]", sub);
        int n = cJSON_GetArraySize(vocab);
        if (n >= MAX_ID) return bad(sub, "too many entries");
        m->scores = malloc(((size_t)n + 1) * sizeof *m->scores);
        if (!m->scores || !tk_strmap_init(&t->vocab, (size_t)n + 16) || !tk_strmap_init(&m->prefixes, (size_t)n * 4 + 16))
            return OOM;
        m->min_score = 1e300;
        int i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, vocab) {
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(e->child) ||
                !cJSON_IsNumber(e->child->next))
                return kiln_error(KILN_EINVAL, "%s[%d]: expected [piece, score]", sub, i);
            const char *s = e->child->valuestring;
            size_t len = strlen(s);
            if (tk_utf8_valid_prefix(s, len) != len) return kiln_error(KILN_EINVAL, "%s[%d]: not UTF-8", sub, i);
            KILN_TRY(add_vocab(t, s, len, i));
            m->scores[i] = e->child->next->valuedouble;
            if (m->scores[i] < m->min_score) m->min_score = m->scores[i];
            const char *k = t->id_str[i];
            for (size_t p = 0; p < len;) { /* every char-boundary prefix, the piece included */
                p += (size_t)tk_utf8_len((unsigned char)k[p]);
                if (p > len) p = len;
                if (!tk_strmap_put(&m->prefixes, k, p, 0)) return OOM;
            }
            if (len > m->max_piece_len) m->max_piece_len = len;
            i++;
        }
        t->n_model = n;
        int64_t unk;
        KILN_TRY(get_int(o, path, "unk_id", -1, 0, n ? n - 1 : 0, &unk));
        if (get(o, "unk_id") && n == 0) return kiln_error(KILN_EINVAL, "%s: the vocabulary is empty", sub);
        m->unk_id = (int32_t)unk;
        KILN_TRY(get_bool(o, path, "byte_fallback", false, &m->byte_fallback));
        byte_ids(t);
        return NULL;
    }
    if (!strcmp(type, "WordPiece")) {
        int64_t mx;
        m->type = TM_WORDPIECE;
        KILN_TRY(load_vocab_obj(t, vocab, sub));
        KILN_TRY(get_str(o, path, "continuing_subword_prefix", "##", (const char **)&type));
        KILN_TRY(set_content(&m->prefix, &m->prefix_len, type));
        KILN_TRY(get_int(o, path, "max_input_chars_per_word", 100, 0, INT32_MAX, &mx));
        m->max_input_chars = (size_t)mx;
        KILN_TRY(unk_of(t, o, path, "[UNK]"));
        if (m->unk_id == -2) m->unk_id = -1;
        return NULL;
    }
    if (!strcmp(type, "WordLevel")) {
        m->type = TM_WORDLEVEL;
        KILN_TRY(load_vocab_obj(t, vocab, sub));
        KILN_TRY(unk_of(t, o, path, NULL));
        if (m->unk_id == -2) m->unk_id = -1;
        return NULL;
    }
    return kiln_error(KILN_EUNSUPPORTED, "%s.type: unknown model \"%s\"", path, type);
}

/* ---- post-processors ----------------------------------------------------------- */

static kiln_status tmpl_special(ktok *t, const cJSON *specials, const char *name, const char *path, tk_ids *out) {
    const cJSON *sp = get(specials, name);
    if (!sp) {
        /* no entry: the token itself, when it exists */
        int32_t id = ktok_token_id(t, name);
        if (id < 0) return kiln_error(KILN_EINVAL, "%s: special token \"%s\" is not defined", path, name);
        return tk_ids_push(out, id) ? NULL : OOM;
    }
    const cJSON *ids = get(sp, "ids"), *e;
    if (!ids || !cJSON_IsArray(ids)) return kiln_error(KILN_EINVAL, "%s.special_tokens[\"%s\"].ids: expected a list", path, name);
    cJSON_ArrayForEach(e, ids) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int64_t)d || d < 0 || d >= MAX_ID)
            return kiln_error(KILN_EINVAL, "%s.special_tokens[\"%s\"].ids: expected token ids", path, name);
        if (!tk_ids_push(out, (int32_t)d)) return OOM;
    }
    return NULL;
}

static kiln_status load_template(ktok *t, const cJSON *o, const char *path, tk_post *pp) {
    const cJSON *single = get(o, "single"), *specials = get(o, "special_tokens"), *e;
    if (!single || !cJSON_IsArray(single)) return kiln_error(KILN_EINVAL, "%s.single: expected a list", path);
    if (specials && !cJSON_IsObject(specials)) return kiln_error(KILN_EINVAL, "%s.special_tokens: expected an object", path);
    tk_ids ids = {0};
    kiln_status st = NULL;
    int i = 0;
    cJSON_ArrayForEach(e, single) {
        char sub[512];
        snprintf(sub, sizeof sub, "%.400s.single[%d]", path, i++);
        const cJSON *tok = get(e, "SpecialToken"), *seq = get(e, "Sequence");
        if (tok) {
            const char *id;
            if ((st = get_str(tok, sub, "id", NULL, &id))) break;
            if (!id) { st = kiln_error(KILN_EINVAL, "%s.SpecialToken.id: missing", sub); break; }
            if ((st = tmpl_special(t, specials, id, path, &ids))) break;
        } else if (seq) {
            const char *id;
            if ((st = get_str(seq, sub, "id", "A", &id))) break;
            if (!strcmp(id, "A") && !tk_ids_push(&ids, -1)) { st = OOM; break; }
        } else if (cJSON_IsString(e)) { /* "$A", "$A:0", "[CLS]", "[CLS]:0" */
            char name[256];
            snprintf(name, sizeof name, "%s", e->valuestring);
            char *colon = strrchr(name, ':');
            if (colon && colon != name) *colon = 0;
            if (name[0] == '$') {
                if ((name[1] == 0 || name[1] == 'A') && !tk_ids_push(&ids, -1)) { st = OOM; break; }
            } else if ((st = tmpl_special(t, specials, name, path, &ids))) {
                break;
            }
        } else {
            st = kiln_error(KILN_EINVAL, "%s: expected {\"SpecialToken\": ...} or {\"Sequence\": ...}", sub);
            break;
        }
    }
    if (st) {
        free(ids.v);
        return st;
    }
    pp->tmpl = ids.v;
    pp->n_tmpl = (int)ids.n;
    return NULL;
}

static kiln_status token_pair(const cJSON *o, const char *path, const char *key, int32_t *id) {
    const cJSON *v = get(o, key);
    if (!v || !cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(v->child->next))
        return kiln_error(KILN_EINVAL, "%s.%s: expected [token, id]", path, key);
    double d = v->child->next->valuedouble;
    if (d != (double)(int64_t)d || d < 0 || d >= MAX_ID) return kiln_error(KILN_EINVAL, "%s.%s: bad id", path, key);
    *id = (int32_t)d;
    return NULL;
}

static kiln_status load_post(ktok *t, const cJSON *o, const char *path, tk_post *pp, int depth) {
    const char *type;
    if (depth > 16) return bad(path, "nested too deeply");
    KILN_TRY(get_type(o, path, &type));
    if (!strcmp(type, "Sequence")) {
        const cJSON *l, *e;
        int n, i = 0;
        pp->type = TPP_SEQ;
        KILN_TRY(get_list(o, path, "processors", &l, &n));
        if (!l) return kiln_error(KILN_EINVAL, "%s.processors: missing", path);
        pp->subs = calloc((size_t)n + 1, sizeof *pp->subs);
        if (!pp->subs) return OOM;
        cJSON_ArrayForEach(e, l) {
            char sub[512];
            snprintf(sub, sizeof sub, "%.400s.processors[%d]", path, i);
            pp->n_subs = i + 1;
            KILN_TRY(load_post(t, e, sub, &pp->subs[i], depth + 1));
            i++;
        }
        return NULL;
    }
    if (!strcmp(type, "ByteLevel")) { pp->type = TPP_BYTELEVEL; return NULL; }
    if (!strcmp(type, "TemplateProcessing")) {
        pp->type = TPP_TEMPLATE;
        return load_template(t, o, path, pp);
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        pp->type = type[0] == 'B' ? TPP_BERT : TPP_ROBERTA;
        KILN_TRY(token_pair(o, path, "cls", &pp->cls));
        return token_pair(o, path, "sep", &pp->sep);
    }
    return kiln_error(KILN_EUNSUPPORTED, "%s.type: unknown post-processor \"%s\"", path, type);
}

/* ---- added tokens -------------------------------------------------------------- */

static kiln_status load_added(ktok *t, const cJSON *l, const char *what) {
    if (!l) return NULL;
    if (!cJSON_IsArray(l)) return kiln_error(KILN_EINVAL, "%s: added_tokens: expected a list", what);
    int n = cJSON_GetArraySize(l), i = 0;
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added || !tk_strmap_init(&t->added_map, (size_t)n + 16)) return OOM;
    const cJSON *e;
    cJSON_ArrayForEach(e, l) {
        char path[256];
        snprintf(path, sizeof path, "%.200s: added_tokens[%d]", what, i);
        if (!cJSON_IsObject(e)) return kiln_error(KILN_EINVAL, "%s: expected an object", path);
        const char *content;
        int64_t id;
        tk_added *a = &t->added[i];
        KILN_TRY(get_str(e, path, "content", NULL, &content));
        if (!content) return kiln_error(KILN_EINVAL, "%s.content: missing", path);
        if (!get(e, "id")) return kiln_error(KILN_EINVAL, "%s.id: missing", path);
        KILN_TRY(get_int(e, path, "id", 0, 0, MAX_ID - 1, &id));
        size_t len = strlen(content);
        if (tk_utf8_valid_prefix(content, len) != len) return kiln_error(KILN_EINVAL, "%s.content: not UTF-8", path);
        KILN_TRY(get_bool(e, path, "special", false, &a->special));
        KILN_TRY(get_bool(e, path, "lstrip", false, &a->lstrip));
        KILN_TRY(get_bool(e, path, "rstrip", false, &a->rstrip));
        KILN_TRY(get_bool(e, path, "single_word", false, &a->single_word));
        KILN_TRY(get_bool(e, path, "normalized", !a->special, &a->normalized));
        KILN_TRY(grow_ids(t, id));
        a->content = ku_arena_memdup(t->arena, content, len + 1);
        if (!a->content) return OOM;
        a->len = (uint32_t)len;
        a->id = (int32_t)id;
        if (len && !tk_strmap_put(&t->added_map, a->content, len, a->id)) return OOM;
        t->id_str[id] = a->content;
        t->id_len[id] = (uint32_t)len;
        t->is_added[id] = 1;
        if (a->special) t->special[id] = 1;
        i++;
        t->n_added = i;
    }
    return NULL;
}

/* ---- tokenizer_config.json -------------------------------------------------------- */

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static const char *token_name(const cJSON *cfg, const char *key) {
    const cJSON *v = get(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = get(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static kiln_status apply_config(ktok *t, const cJSON *cfg, bool legacy, const char *what) {
    const char *bos = token_name(cfg, "bos_token"), *eos = token_name(cfg, "eos_token");
    if (legacy && !cfg) bos = eos = "<|endoftext|>"; /* GPT-2's defaults */
    t->bos_id = bos ? ktok_token_id(t, bos) : -1;
    t->eos_id = eos ? ktok_token_id(t, eos) : -1;
    /* additional_special_tokens count as special for skip_special, as in transformers */
    const cJSON *extra = get(cfg, "additional_special_tokens"), *e;
    if (cJSON_IsArray(extra)) {
        cJSON_ArrayForEach(e, extra) {
            const char *s = cJSON_IsString(e) ? e->valuestring : cJSON_IsString(get(e, "content")) ? get(e, "content")->valuestring : NULL;
            int32_t id = s ? ktok_token_id(t, s) : -1;
            if (id >= 0) t->special[id] = 1;
        }
    }
    /* transformers' Llama/Gemma fast tokenizers rebuild the post-processor
     * from add_bos_token/add_eos_token; so do legacy (slow) tokenizers */
    const char *cls = NULL;
    const cJSON *c = get(cfg, "tokenizer_class");
    if (cJSON_IsString(c)) cls = c->valuestring;
    bool rebuild = legacy || (cls && (!strncmp(cls, "LlamaTokenizer", 14) || !strncmp(cls, "GemmaTokenizer", 14) ||
                                      !strncmp(cls, "CodeLlamaTokenizer", 18)));
    if (!rebuild) return NULL;
    bool add_bos, add_eos;
    KILN_TRY(get_bool(cfg, what, "add_bos_token", !legacy, &add_bos));
    KILN_TRY(get_bool(cfg, what, "add_eos_token", false, &add_eos));
    if (add_bos && t->bos_id < 0) add_bos = false;
    if (add_eos && t->eos_id < 0) add_eos = false;
    tk_post_free(&t->post);
    t->post.type = TPP_TEMPLATE;
    t->post.tmpl = malloc(3 * sizeof *t->post.tmpl);
    if (!t->post.tmpl) return OOM;
    int n = 0;
    if (add_bos) t->post.tmpl[n++] = t->bos_id;
    t->post.tmpl[n++] = -1;
    if (add_eos) t->post.tmpl[n++] = t->eos_id;
    t->post.n_tmpl = n;
    return NULL;
}

/* Special tokens named in the config become added tokens when they are in
 * the vocabulary (what a slow tokenizer's conversion does). */
static kiln_status legacy_specials(ktok *t, const cJSON *cfg) {
    static const char *keys[] = {"bos_token", "eos_token", "unk_token", "pad_token"};
    const char *names[4];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        const char *s = cfg ? token_name(cfg, keys[i]) : (i < 3 ? "<|endoftext|>" : NULL);
        if (!s || tk_strmap_get(&t->vocab, s, strlen(s)) < 0) continue;
        bool dup = false;
        for (int j = 0; j < n; j++) dup |= !strcmp(names[j], s);
        if (!dup) names[n++] = s;
    }
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added || !tk_strmap_init(&t->added_map, 16)) return OOM;
    for (int i = 0; i < n; i++) {
        int32_t id = tk_strmap_get(&t->vocab, names[i], strlen(names[i]));
        tk_added *a = &t->added[i];
        a->content = t->id_str[id];
        a->len = t->id_len[id];
        a->id = id;
        a->special = true;
        if (!tk_strmap_put(&t->added_map, a->content, a->len, id)) return OOM;
        t->special[id] = t->is_added[id] = 1;
    }
    t->n_added = n;
    return NULL;
}

/* ---- entry points ------------------------------------------------------------------ */

static kiln_status parse(const char *json, size_t len, const char *what, cJSON **out) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!*out) {
        size_t off = end ? (size_t)(end - json) : 0;
        return kiln_error(KILN_EINVAL, "%s: invalid JSON near byte %zu", what, off);
    }
    return NULL;
}

static kiln_status init(ktok **out) {
    ktok *t = calloc(1, sizeof *t);
    if (!t) return OOM;
    t->arena = ku_arena_create();
    if (!t->arena) {
        free(t);
        return OOM;
    }
    t->bos_id = t->eos_id = -1;
    t->model.unk_id = -1;
    tk_byte_tables(t->byte_char);
    *out = t;
    return NULL;
}

static kiln_status build(ktok *t, const cJSON *root, const cJSON *cfg, const char *what) {
    char path[256];
    if (!cJSON_IsObject(root)) return kiln_error(KILN_EINVAL, "%s: expected a JSON object", what);
    snprintf(path, sizeof path, "%.200s: model", what);
    KILN_TRY(load_model(t, get(root, "model"), path));
    KILN_TRY(load_added(t, get(root, "added_tokens"), what));
    const cJSON *o;
    if ((o = get(root, "normalizer"))) {
        snprintf(path, sizeof path, "%.200s: normalizer", what);
        t->norm = calloc(1, sizeof *t->norm);
        if (!t->norm) return OOM;
        KILN_TRY(load_norm(o, path, t->norm, 0));
    }
    if ((o = get(root, "pre_tokenizer"))) {
        snprintf(path, sizeof path, "%.200s: pre_tokenizer", what);
        t->pretok = calloc(1, sizeof *t->pretok);
        if (!t->pretok) return OOM;
        KILN_TRY(load_pretok(o, path, t->pretok, 0));
    }
    if ((o = get(root, "post_processor"))) {
        snprintf(path, sizeof path, "%.200s: post_processor", what);
        KILN_TRY(load_post(t, o, path, &t->post, 0));
    }
    if ((o = get(root, "decoder"))) {
        snprintf(path, sizeof path, "%.200s: decoder", what);
        t->dec = calloc(1, sizeof *t->dec);
        if (!t->dec) return OOM;
        KILN_TRY(load_dec(o, path, t->dec, 0));
    }
    KILN_TRY(tk_added_finish(t));
    return apply_config(t, cfg, false, "tokenizer_config.json");
}

kiln_status ktok_load_json(const char *json, size_t len, const char *config_json, size_t config_len, const char *what,
                           ktok **out) {
    *out = NULL;
    if (!what) what = "tokenizer.json";
    cJSON *root, *cfg = NULL;
    KILN_TRY(parse(json, len, what, &root));
    if (config_json) {
        kiln_status st = parse(config_json, config_len, "tokenizer_config.json", &cfg);
        if (st) {
            cJSON_Delete(root);
            return st;
        }
    }
    ktok *t = NULL;
    kiln_status st = init(&t);
    if (!st) st = build(t, root, cfg, what);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (st) {
        ktok_free(t);
        return st;
    }
    *out = t;
    return NULL;
}

/* merges.txt: "#version" lines and blank lines skipped, "a b" per line. */
static kiln_status load_merges_txt(ktok *t, const char *txt, size_t len, const char *what) {
    if (!tk_u64map_init(&t->model.merges, len / 8 + 16)) return OOM;
    tk_buf tmp = {0};
    kiln_status st = NULL;
    int32_t rank = 0;
    int line = 0;
    for (size_t i = 0; i < len && !st;) {
        const char *s = txt + i, *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + 1;
        line++;
        if (n && s[n - 1] == '\r') n--;
        if (n == 0 || (n >= 8 && !memcmp(s, "#version", 8))) continue;
        const char *sp = memchr(s, ' ', n);
        if (!sp) {
            st = kiln_error(KILN_EINVAL, "%s: line %d: expected \"a b\"", what, line);
            break;
        }
        char path[256];
        snprintf(path, sizeof path, "%.200s: line %d: merges", what, line);
        st = add_merge(t, s, (size_t)(sp - s), sp + 1, n - (size_t)(sp - s) - 1, rank++, path, &tmp);
    }
    tk_buf_free(&tmp);
    return st;
}

static kiln_status load_legacy(const char *vocab_path, const char *merges_path, const cJSON *cfg, ktok **out) {
    cJSON *vocab;
    KILN_TRY(ku_json_load(vocab_path, &vocab));
    char *merges = NULL;
    size_t mlen = 0;
    ktok *t = NULL;
    kiln_status st = ku_read_file(merges_path, &merges, &mlen);
    if (!st) st = init(&t);
    if (!st) {
        t->model.type = TM_BPE;
        t->model.unk_id = -1;
        st = load_vocab_obj(t, vocab, vocab_path);
    }
    if (!st) st = load_merges_txt(t, merges, mlen, merges_path);
    if (!st) {
        byte_ids(t);
        bool aps = false;
        st = get_bool(cfg, "tokenizer_config.json", "add_prefix_space", false, &aps);
        t->pretok = calloc(1, sizeof *t->pretok);
        t->dec = calloc(1, sizeof *t->dec);
        if (!st && (!t->pretok || !t->dec)) st = OOM;
        if (!st) {
            t->pretok->type = TP_BYTELEVEL;
            t->pretok->add_prefix_space = aps;
            t->pretok->use_regex = true;
            t->pretok->pat.is_regex = true;
            t->dec->type = TD_BYTELEVEL;
            st = tk_regex_compile(GPT2_RE, sizeof GPT2_RE - 1, &t->pretok->pat.re);
        }
    }
    if (!st) st = legacy_specials(t, cfg);
    if (!st) st = tk_added_finish(t);
    if (!st) st = apply_config(t, cfg, true, "tokenizer_config.json");
    cJSON_Delete(vocab);
    free(merges);
    if (st) {
        ktok_free(t);
        return st;
    }
    *out = t;
    return NULL;
}

kiln_status ktok_load(const char *dir, ktok **out) {
    *out = NULL;
    char p[4096], p2[4096];
    cJSON *cfg = NULL;
    KILN_TRY(ku_check_model_dir(dir));
    KILN_TRY(ku_path_join(p, sizeof p, dir, "tokenizer_config.json"));
    if (ku_file_exists(p)) KILN_TRY(ku_json_load(p, &cfg));
    kiln_status st = NULL;
    KILN_TRY(ku_path_join(p, sizeof p, dir, "tokenizer.json"));
    if (ku_file_exists(p)) {
        char *json;
        size_t len;
        st = ku_read_file(p, &json, &len);
        if (!st) {
            ktok *t = NULL;
            st = init(&t);
            cJSON *root = NULL;
            if (!st) st = parse(json, len, p, &root);
            free(json);
            if (!st) st = build(t, root, cfg, p);
            cJSON_Delete(root);
            if (st) ktok_free(t);
            else *out = t;
        }
        cJSON_Delete(cfg);
        return st;
    }
    static const char *pairs[][2] = {{"vocab.json", "merges.txt"}, {"encoder.json", "vocab.bpe"}};
    for (int i = 0; i < 2; i++) {
        if ((st = ku_path_join(p, sizeof p, dir, pairs[i][0])) || (st = ku_path_join(p2, sizeof p2, dir, pairs[i][1])))
            break;
        if (ku_file_exists(p) && ku_file_exists(p2)) {
            st = load_legacy(p, p2, cfg, out);
            cJSON_Delete(cfg);
            return st;
        }
    }
    cJSON_Delete(cfg);
    if (st) return st;
    return kiln_error(KILN_ENOTFOUND, "%s: no tokenizer.json (nor vocab.json + merges.txt)", dir);
}
