/* tok_regex.c: Oniguruma patterns (as Hugging Face writes them) run by PCRE2.
 *
 * HF compiles Split/Replace patterns with the onig crate (Oniguruma syntax,
 * Unicode). PCRE2 with UTF|UCP agrees on nearly everything; the translation
 * below rewrites what differs:
 *   \s \S    Unicode White_Space in Oniguruma; PCRE2's \s adds U+180E  -> \p{White_Space}
 *   \w \W \b \B  Oniguruma's word set (Alphabetic, marks, Nd, Pc, Join_Control,
 *            plus its Latin-1 quirk: superscripts and fractions)       -> explicit class
 *   \h \H    hex digit in Oniguruma, horizontal space in PCRE2         -> [0-9A-Fa-f]
 *   \v       vertical tab in Oniguruma, a class in PCRE2               -> \x{0B}
 *   \uHHHH   code point                                                -> \x{HHHH}
 *   (?m)     dot-all in Oniguruma                                      -> (?s)
 *   ^ $      always line anchors in Oniguruma                          -> PCRE2_MULTILINE
 *   [a[bc]]  nested union                                               -> flattened
 * Class intersection (&&) and negated nested classes are refused with an
 * error rather than guessed. */
#include <string.h>
#include <strings.h>

#include "tokenizer/tok_int.h"

#define WORD_SET "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"

typedef struct {
    const char *s;
    size_t n, i;
    tk_buf out;
    kiln_status err;
} tr_state;

static void tr_fail(tr_state *t, const char *what) {
    if (!t->err) t->err = kiln_error(KILN_EUNSUPPORTED, "regex \"%.*s\": %s at byte %zu", (int)(t->n > 200 ? 200 : t->n), t->s, what, t->i);
}

static void emit(tr_state *t, const char *s, size_t n) {
    if (!t->err && !tk_buf_put(&t->out, s, n)) t->err = kiln_error(KILN_ENOMEM, "out of memory");
}
static void emits(tr_state *t, const char *s) { emit(t, s, strlen(s)); }

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* Copies the character at t->i (one UTF-8 sequence) and advances. */
static void copy_char(tr_state *t) {
    size_t k = (size_t)tk_utf8_len((unsigned char)t->s[t->i]);
    if (t->i + k > t->n) k = t->n - t->i;
    emit(t, t->s + t->i, k);
    t->i += k;
}

/* \p{Name} / \p{^Name} / \P{Name}: is Name "Word"? Sets *neg. Leaves t->i
 * after the closing brace when it returns true. */
static bool is_word_prop(tr_state *t, bool *neg) {
    const char *s = t->s + t->i; /* at 'p' or 'P' */
    size_t rest = t->n - t->i;
    if (rest < 3 || s[1] != '{') return false;
    const char *close = memchr(s + 2, '}', rest - 2);
    if (!close) return false;
    const char *name = s + 2;
    bool caret = *name == '^';
    if (caret) name++;
    size_t len = (size_t)(close - name);
    if (!((len == 4 && strncasecmp(name, "word", 4) == 0))) return false;
    *neg = (s[0] == 'P') != caret;
    t->i += (size_t)(close - s) + 1;
    return true;
}

/* An escape at t->i (just after the backslash). in_class: inside [...]. */
static void tr_escape(tr_state *t, bool in_class) {
    if (t->i >= t->n) {
        tr_fail(t, "trailing backslash");
        return;
    }
    char c = t->s[t->i];
    bool neg;
    switch (c) {
    case 's': emits(t, "\\p{White_Space}"); t->i++; return;
    case 'S': emits(t, "\\P{White_Space}"); t->i++; return;
    case 'h': emits(t, in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]"); t->i++; return;
    case 'H':
        if (in_class) { tr_fail(t, "\\H inside a class is not supported"); return; }
        emits(t, "[^0-9A-Fa-f]"); t->i++; return;
    case 'w': emits(t, in_class ? WORD_SET : "[" WORD_SET "]"); t->i++; return;
    case 'W':
        if (in_class) { tr_fail(t, "\\W inside a class is not supported"); return; }
        emits(t, "[^" WORD_SET "]"); t->i++; return;
    case 'v': emits(t, "\\x{0B}"); t->i++; return;
    case 'b':
        if (in_class) break; /* backspace in both */
        emits(t, "(?:(?<![" WORD_SET "])(?=[" WORD_SET "])|(?<=[" WORD_SET "])(?![" WORD_SET "]))");
        t->i++;
        return;
    case 'B':
        if (in_class) { tr_fail(t, "\\B inside a class"); return; }
        emits(t, "(?:(?<![" WORD_SET "])(?![" WORD_SET "])|(?<=[" WORD_SET "])(?=[" WORD_SET "]))");
        t->i++;
        return;
    case 'u':
        if (t->i + 4 < t->n + 0 && is_hex(t->s[t->i + 1]) && is_hex(t->s[t->i + 2]) && is_hex(t->s[t->i + 3]) &&
            is_hex(t->s[t->i + 4])) {
            emits(t, "\\x{");
            emit(t, t->s + t->i + 1, 4);
            emits(t, "}");
            t->i += 5;
            return;
        }
        tr_fail(t, "\\u needs four hex digits");
        return;
    case 'p':
    case 'P':
        if (is_word_prop(t, &neg)) {
            if (in_class) {
                if (neg) { tr_fail(t, "negated \\p{Word} inside a class"); return; }
                emits(t, WORD_SET);
            } else {
                emits(t, neg ? "[^" WORD_SET "]" : "[" WORD_SET "]");
            }
            return;
        }
        break;
    default: break;
    }
    emit(t, "\\", 1);
    copy_char(t);
}

/* A class starting at t->i (just after '['). nested: inside another class,
 * where only the contents are emitted (union). */
static void tr_class(tr_state *t, bool nested, int depth) {
    if (depth > 64) {
        tr_fail(t, "classes nested too deeply");
        return;
    }
    if (!nested) emit(t, "[", 1);
    if (t->i < t->n && t->s[t->i] == '^') {
        if (nested) {
            tr_fail(t, "a negated class inside a class is not supported");
            return;
        }
        emit(t, "^", 1);
        t->i++;
    }
    bool first = true;
    while (!t->err) {
        if (t->i >= t->n) {
            tr_fail(t, "unterminated character class");
            return;
        }
        char c = t->s[t->i];
        if (c == ']' && !first) {
            t->i++;
            break;
        }
        first = false;
        if (c == '\\') {
            t->i++;
            tr_escape(t, true);
        } else if (c == '[' && t->i + 1 < t->n && t->s[t->i + 1] == ':') {
            const char *close = NULL;
            for (size_t k = t->i + 2; k + 1 < t->n; k++)
                if (t->s[k] == ':' && t->s[k + 1] == ']') {
                    close = t->s + k;
                    break;
                }
            if (!close) {
                tr_fail(t, "unterminated POSIX class");
                return;
            }
            size_t len = (size_t)(close - (t->s + t->i)) + 2;
            emit(t, t->s + t->i, len);
            t->i += len;
        } else if (c == '[') {
            t->i++;
            tr_class(t, true, depth + 1);
        } else if (c == '&' && t->i + 1 < t->n && t->s[t->i + 1] == '&') {
            tr_fail(t, "class intersection (&&) is not supported");
            return;
        } else {
            copy_char(t);
        }
    }
    if (!nested) emit(t, "]", 1);
}

static void tr_group_options(tr_state *t) {
    /* at "(?" followed by option letters: translate m -> s */
    size_t k = t->i + 2;
    while (k < t->n && (t->s[k] == 'i' || t->s[k] == 'm' || t->s[k] == 'x' || t->s[k] == '-')) k++;
    if (k < t->n && (t->s[k] == ':' || t->s[k] == ')') && k > t->i + 2) {
        emits(t, "(?");
        for (size_t j = t->i + 2; j < k; j++) emit(t, t->s[j] == 'm' ? "s" : t->s + j, 1);
        t->i = k;
        return;
    }
    emits(t, "(?");
    t->i += 2;
}

kiln_status tk_regex_compile(const char *onig, size_t len, pcre2_code **out) {
    *out = NULL;
    tr_state t = {onig, len, 0, {0}, NULL};
    if (tk_utf8_valid_prefix(onig, len) != len) return kiln_error(KILN_EINVAL, "regex: not valid UTF-8");
    while (t.i < t.n && !t.err) {
        char c = onig[t.i];
        if (c == '\\') {
            t.i++;
            tr_escape(&t, false);
        } else if (c == '[') {
            t.i++;
            tr_class(&t, false, 0);
        } else if (c == '(' && t.i + 1 < t.n && onig[t.i + 1] == '?') {
            tr_group_options(&t);
        } else {
            copy_char(&t);
        }
    }
    if (!t.err && !tk_buf_putc(&t.out, 0)) t.err = kiln_error(KILN_ENOMEM, "out of memory");
    if (t.err) {
        tk_buf_free(&t.out);
        return t.err;
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (cc) pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)t.out.p, t.out.n - 1, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &ec, &eo, cc);
    pcre2_compile_context_free(cc);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        kiln_status st = kiln_error(KILN_EINVAL, "regex \"%.*s\": %s", (int)(len > 200 ? 200 : len), onig, (char *)msg);
        tk_buf_free(&t.out);
        return st;
    }
    tk_buf_free(&t.out);
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    *out = re;
    return NULL;
}

void tk_pattern_free(tk_pattern *p) {
    free(p->lit);
    pcre2_code_free(p->re);
    *p = (tk_pattern){0};
}

/* The onig crate's FindMatches: an empty match that ends where the previous
 * match ended is skipped by advancing one character. Returns 0, -1 (out of
 * memory from fn) or a PCRE2 error. */
static int regex_find(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, tk_match_fn fn,
                      void *user) {
    size_t last_end = 0;
    bool have_last = false;
    size_t last_match = 0;
    while (last_end <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) return rc;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms) me = ms; /* \K can do this; treat as empty */
        if (me == ms && have_last && last_match == me) {
            if (last_end >= n) return 0;
            last_end += (size_t)tk_utf8_len((unsigned char)s[last_end]);
            continue;
        }
        last_end = me;
        have_last = true;
        last_match = me;
        if (!fn(ms, me, user)) return -1;
    }
    return 0;
}

bool tk_pattern_find(const tk_pattern *pat, pcre2_match_data *md, const char *s, size_t n, tk_match_fn fn,
                     void *user) {
    if (!pat->re && pat->lit_len) {
        size_t i = 0;
        while (i + pat->lit_len <= n) {
            const char *f = memmem(s + i, n - i, pat->lit, pat->lit_len);
            if (!f) break;
            size_t st = (size_t)(f - s);
            if (!fn(st, st + pat->lit_len, user)) return false;
            i = st + pat->lit_len;
        }
        return true;
    }
    if (!pat->re) return true;
    return regex_find(pat->re, md, s, n, fn, user) == 0;
}

typedef struct {
    tk_segs *out;
    size_t prev;
} seg_state;

static bool seg_push(tk_segs *o, size_t a, size_t b, bool m) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 32;
        tk_seg *v = realloc(o->v, cap * sizeof *v);
        if (!v) return false;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = (tk_seg){(uint32_t)a, (uint32_t)b, m};
    return true;
}

static bool seg_cb(size_t a, size_t b, void *user) {
    seg_state *st = user;
    if (st->prev != a && !seg_push(st->out, st->prev, a, false)) return false;
    st->prev = b;
    return seg_push(st->out, a, b, true);
}

bool tk_find_segments(const tk_pattern *pat, pcre2_match_data *md, const char *s, size_t n, tk_segs *out) {
    out->n = 0;
    if (n == 0) return seg_push(out, 0, 0, false);
    seg_state st = {out, 0};
    if (!tk_pattern_find(pat, md, s, n, seg_cb, &st)) return false;
    if (st.prev != n && !seg_push(out, st.prev, n, false)) return false;
    return true;
}
