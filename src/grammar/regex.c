/* regex.c: ECMAScript regular expressions (the subset an automaton can
 * express: no backreferences, lookaround or word boundaries) written as a
 * GBNF rule body. In JSON-string mode each character of the regex matches
 * its JSON encoding: as itself, or escaped where JSON requires it (", \ and
 * the controls, in the forms Python's json.dumps writes) or allows it (\/). */
#include <stdlib.h>
#include <string.h>

#include "grammar/gr_int.h"

typedef struct {
    const char *s, *end, *start;
    bool json;
    kgr_buf out;
    char err[200];
} rx;

static bool rerr(rx *r, const char *msg) {
    if (!r->err[0]) snprintf(r->err, sizeof r->err, "regex: at offset %d: %s", (int)(r->s - r->start), msg);
    return false;
}

typedef struct {
    cprange *v;
    int32_t n, cap;
} rset;

static bool rset_add(rset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        int32_t c = s->cap ? s->cap * 2 : 8;
        cprange *q = realloc(s->v, sizeof *q * (size_t)c);
        if (!q) return false;
        s->v = q;
        s->cap = c;
    }
    s->v[s->n++] = (cprange){lo, hi};
    return true;
}

static void put_cp(kgr_buf *b, uint32_t c) {
    if (c > 0xFFFF) kgr_buf_printf(b, "\\U%08X", c);
    else if (c >= 0x30 && c <= 0x7a && ((c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')))
        kgr_buf_printf(b, "%c", (char)c);
    else kgr_buf_printf(b, "\\u%04X", c);
}

static void put_class(kgr_buf *b, const cprange *v, int32_t n) {
    kgr_buf_puts(b, "[");
    for (int32_t i = 0; i < n; i++) {
        put_cp(b, v[i].lo);
        if (v[i].hi != v[i].lo) {
            kgr_buf_puts(b, "-");
            put_cp(b, v[i].hi);
        }
    }
    kgr_buf_puts(b, "]");
}

static bool in(const cprange *v, int32_t n, uint32_t c) {
    for (int32_t i = 0; i < n; i++)
        if (c >= v[i].lo && c <= v[i].hi) return true;
    return false;
}

/* Emits one character from set s (consumed: freed) as a GBNF item. */
static bool emit_set(rx *r, rset *s, bool neg) {
    cprange *norm = malloc(sizeof *norm * (size_t)(s->n * 2 + 4));
    if (!norm) return rerr(r, "out of memory");
    int32_t m = kgr_ranges_normalize(s->v, s->n, neg, norm);
    free(s->v);
    *s = (rset){0};
    if (m < 0) return free(norm), rerr(r, "out of memory");
    kgr_buf *b = &r->out;
    if (m == 0) {
        kgr_buf_puts(b, "[^\\U00000000-\\U0010FFFF]"); /* matches nothing */
        free(norm);
        return true;
    }
    if (!r->json) {
        if (m == 1 && norm[0].lo == norm[0].hi && norm[0].lo < 0x80 && norm[0].lo >= 0x20) {
            kgr_buf_literal(b, (const char *)&(char){(char)norm[0].lo}, 1);
        } else put_class(b, norm, m);
        free(norm);
        return true;
    }
    /* JSON: the plain part (>= 0x20 without " and \), then escapes */
    cprange *plain = malloc(sizeof *plain * (size_t)(m + 4));
    if (!plain) return free(norm), rerr(r, "out of memory");
    int32_t k = 0;
    for (int32_t i = 0; i < m; i++) {
        uint32_t lo = norm[i].lo < 0x20 ? 0x20 : norm[i].lo, hi = norm[i].hi;
        if (lo > hi) continue;
        /* cut out " (0x22) and \ (0x5C) */
        uint32_t cut[2] = {0x22, 0x5C};
        for (int j = 0; j < 2; j++) {
            if (lo <= cut[j] && cut[j] <= hi) {
                if (lo < cut[j]) plain[k++] = (cprange){lo, cut[j] - 1};
                lo = cut[j] + 1;
            }
        }
        if (lo <= hi) plain[k++] = (cprange){lo, hi};
    }
    int parts = 0;
    kgr_buf_puts(b, "(");
    if (k) {
        put_class(b, plain, k);
        parts++;
    }
    static const struct {
        uint32_t c;
        const char *lit;
    } esc[] = {{'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'/', "\"\\\\/\""}, {'\n', "\"\\\\n\""},
               {'\r', "\"\\\\r\""},  {'\t', "\"\\\\t\""},    {'\b', "\"\\\\b\""}, {'\f', "\"\\\\f\""}};
    for (size_t j = 0; j < sizeof esc / sizeof *esc; j++)
        if (in(norm, m, esc[j].c)) {
            kgr_buf_puts(b, parts++ ? " | " : "");
            kgr_buf_puts(b, esc[j].lit);
        }
    for (uint32_t c = 0; c < 0x20; c++) {
        if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f' || !in(norm, m, c)) continue;
        kgr_buf_printf(b, "%s\"\\\\u%04x\"", parts++ ? " | " : "", c);
    }
    kgr_buf_puts(b, ")");
    free(plain);
    free(norm);
    return true;
}

static bool add_class_escape(rx *r, rset *s, char e, bool *handled) {
    *handled = true;
    switch (e) {
    case 'd': return rset_add(s, '0', '9');
    case 'w': return rset_add(s, '0', '9') && rset_add(s, 'A', 'Z') && rset_add(s, 'a', 'z') && rset_add(s, '_', '_');
    case 's':
        return rset_add(s, '\t', '\r') && rset_add(s, ' ', ' ') && rset_add(s, 0xA0, 0xA0) && rset_add(s, 0x1680, 0x1680) &&
               rset_add(s, 0x2000, 0x200A) && rset_add(s, 0x2028, 0x2029) && rset_add(s, 0x202F, 0x202F) &&
               rset_add(s, 0x205F, 0x205F) && rset_add(s, 0x3000, 0x3000) && rset_add(s, 0xFEFF, 0xFEFF);
    case 'D': case 'W': case 'S': {
        rset t = {0};
        bool h;
        if (!add_class_escape(r, &t, (char)(e + 32), &h)) return free(t.v), false;
        cprange *norm = malloc(sizeof *norm * (size_t)(t.n * 2 + 4));
        if (!norm) return free(t.v), false;
        int32_t m = kgr_ranges_normalize(t.v, t.n, true, norm);
        free(t.v);
        bool ok = m >= 0;
        for (int32_t i = 0; i < m && ok; i++) ok = rset_add(s, norm[i].lo, norm[i].hi);
        free(norm);
        return ok;
    }
    }
    *handled = false;
    return true;
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* one literal character (after a '\' or not) */
static bool lit_char(rx *r, uint32_t *cp, bool in_class) {
    unsigned char c = (unsigned char)*r->s;
    if (c == '\\') {
        r->s++;
        if (r->s >= r->end) return rerr(r, "trailing '\\'");
        char e = *r->s++;
        switch (e) {
        case 'n': *cp = '\n'; return true;
        case 'r': *cp = '\r'; return true;
        case 't': *cp = '\t'; return true;
        case 'f': *cp = '\f'; return true;
        case 'v': *cp = '\v'; return true;
        case '0': *cp = 0; return true;
        case 'b':
            if (in_class) {
                *cp = '\b';
                return true;
            }
            return rerr(r, "word boundaries (\\b) are not supported");
        case 'B': return rerr(r, "\\B is not supported");
        case 'x': case 'u': {
            int nd = e == 'x' ? 2 : 4;
            uint32_t v = 0;
            if (e == 'u' && r->s < r->end && *r->s == '{') {
                r->s++;
                while (r->s < r->end && *r->s != '}') {
                    int h = hexv(*r->s++);
                    if (h < 0 || v > 0x10FFFF) return rerr(r, "bad \\u{...} escape");
                    v = v * 16 + (uint32_t)h;
                }
                if (r->s >= r->end) return rerr(r, "bad \\u{...} escape");
                r->s++;
            } else {
                for (int i = 0; i < nd; i++) {
                    int h = r->s < r->end ? hexv(*r->s) : -1;
                    if (h < 0) return rerr(r, "bad hex escape");
                    v = v * 16 + (uint32_t)h;
                    r->s++;
                }
            }
            if (v > 0x10FFFF) return rerr(r, "code point out of range");
            *cp = v;
            return true;
        }
        case 'p': case 'P': return rerr(r, "Unicode property escapes (\\p{...}) are not supported");
        case 'c': return rerr(r, "control escapes (\\cX) are not supported");
        case 'k': return rerr(r, "named backreferences are not supported");
        default:
            if (e >= '1' && e <= '9') return rerr(r, "backreferences are not supported");
            if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return rerr(r, "unknown escape");
            *cp = (unsigned char)e; /* \. \\ \/ \- ... */
            if ((unsigned char)e >= 0x80) return rerr(r, "escaped non-ASCII character");
            return true;
        }
    }
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || r->s + n > r->end) return rerr(r, "invalid UTF-8");
    uint32_t v = n == 1 ? c : n == 2 ? (c & 31u) : n == 3 ? (c & 15u) : (c & 7u);
    for (int i = 1; i < n; i++) v = v << 6 | ((unsigned char)r->s[i] & 63u);
    r->s += n;
    *cp = v;
    return true;
}

static bool parse_class(rx *r) {
    r->s++; /* [ */
    bool neg = r->s < r->end && *r->s == '^';
    if (neg) r->s++;
    rset s = {0};
    bool first = true;
    while (r->s < r->end && (*r->s != ']' || (first && false))) {
        first = false;
        if (*r->s == '\\' && r->s + 1 < r->end) {
            bool h;
            const char *at = r->s;
            r->s++;
            char e = *r->s;
            r->s++;
            if (!add_class_escape(r, &s, e, &h)) return free(s.v), rerr(r, "out of memory");
            if (h) continue;
            r->s = at;
        }
        if (*r->s == '[' && r->s + 1 < r->end && r->s[1] == ':') return free(s.v), rerr(r, "POSIX classes are not supported");
        uint32_t lo, hi;
        if (!lit_char(r, &lo, true)) return free(s.v), false;
        hi = lo;
        if (r->s + 1 < r->end && *r->s == '-' && r->s[1] != ']') {
            r->s++;
            if (*r->s == '\\' && r->s + 1 < r->end && strchr("dwsDWS", r->s[1]))
                return free(s.v), rerr(r, "a class escape as a range end");
            if (!lit_char(r, &hi, true)) return free(s.v), false;
            if (hi < lo) return free(s.v), rerr(r, "range out of order");
        }
        if (!rset_add(&s, lo, hi)) return free(s.v), rerr(r, "out of memory");
    }
    if (r->s >= r->end) return free(s.v), rerr(r, "unterminated character class");
    r->s++;
    return emit_set(r, &s, neg);
}

static bool parse_alt(rx *r, int depth);

static bool parse_quant(rx *r) {
    if (r->s >= r->end) return true;
    char c = *r->s;
    if (c == '*' || c == '+' || c == '?') {
        kgr_buf_printf(&r->out, "%c", c);
        r->s++;
    } else if (c == '{') {
        const char *q = r->s + 1;
        long lo = 0, hi = -1;
        if (q >= r->end || *q < '0' || *q > '9') { /* a literal '{' in ECMA's annex B */
            return true;
        }
        while (q < r->end && *q >= '0' && *q <= '9') {
            lo = lo * 10 + (*q++ - '0');
            if (lo > 100000) return rerr(r, "repetition count too large");
        }
        bool comma = q < r->end && *q == ',';
        if (comma) {
            q++;
            if (q < r->end && *q >= '0' && *q <= '9') {
                hi = 0;
                while (q < r->end && *q >= '0' && *q <= '9') {
                    hi = hi * 10 + (*q++ - '0');
                    if (hi > 100000) return rerr(r, "repetition count too large");
                }
            }
        } else hi = lo;
        if (q >= r->end || *q != '}') return true; /* literal */
        if (hi >= 0 && hi < lo) return rerr(r, "repetition {m,n} with n < m");
        r->s = q + 1;
        if (hi < 0) kgr_buf_printf(&r->out, "{%ld,}", lo);
        else kgr_buf_printf(&r->out, "{%ld,%ld}", lo, hi);
    } else return true;
    if (r->s < r->end && *r->s == '?') r->s++; /* lazy: the same language */
    if (r->s < r->end && (*r->s == '*' || *r->s == '+' || *r->s == '?' || *r->s == '{'))
        return rerr(r, "nothing to repeat");
    return true;
}

static bool any_char(rx *r, bool dot) {
    rset s = {0};
    bool ok = dot ? rset_add(&s, '\n', '\n') && rset_add(&s, '\r', '\r') && rset_add(&s, 0x2028, 0x2029)
                  : true;
    if (!ok) return rerr(r, "out of memory");
    return emit_set(r, &s, true);
}

static bool parse_seq(rx *r, int depth) {
    kgr_buf_puts(&r->out, "(");
    bool empty = true;
    while (r->s < r->end && *r->s != '|' && *r->s != ')') {
        char c = *r->s;
        kgr_buf_puts(&r->out, " ");
        empty = false;
        if (c == '(') {
            r->s++;
            if (r->s < r->end && *r->s == '?') {
                r->s++;
                if (r->s < r->end && *r->s == ':') r->s++;
                else if (r->s + 1 < r->end && *r->s == '<' && r->s[1] != '=' && r->s[1] != '!') {
                    while (r->s < r->end && *r->s != '>') r->s++;
                    if (r->s >= r->end) return rerr(r, "unterminated group name");
                    r->s++;
                } else return rerr(r, "lookaround and inline flags are not supported");
            }
            if (depth > 200) return rerr(r, "groups nested too deeply");
            if (!parse_alt(r, depth + 1)) return false;
            if (r->s >= r->end || *r->s != ')') return rerr(r, "missing ')'");
            r->s++;
        } else if (c == '[') {
            if (!parse_class(r)) return false;
        } else if (c == '.') {
            r->s++;
            if (!any_char(r, true)) return false;
        } else if (c == '^' || c == '$') {
            return rerr(r, "anchors inside the pattern are not supported");
        } else if (c == '*' || c == '+' || c == '?') {
            return rerr(r, "nothing to repeat");
        } else {
            rset s = {0};
            if (c == '\\' && r->s + 1 < r->end) {
                bool h;
                if (!add_class_escape(r, &s, r->s[1], &h)) return free(s.v), rerr(r, "out of memory");
                if (h) {
                    r->s += 2;
                    if (!emit_set(r, &s, false)) return false;
                    if (!parse_quant(r)) return false;
                    continue;
                }
            }
            uint32_t cp;
            if (!lit_char(r, &cp, false)) return false;
            if (!rset_add(&s, cp, cp)) return rerr(r, "out of memory");
            if (!emit_set(r, &s, false)) return false;
        }
        if (!parse_quant(r)) return false;
    }
    if (empty) kgr_buf_puts(&r->out, " \"\"");
    kgr_buf_puts(&r->out, " )");
    return true;
}

static bool parse_alt(rx *r, int depth) {
    kgr_buf_puts(&r->out, "(");
    if (!parse_seq(r, depth)) return false;
    while (r->s < r->end && *r->s == '|') {
        r->s++;
        kgr_buf_puts(&r->out, " | ");
        if (!parse_seq(r, depth)) return false;
    }
    kgr_buf_puts(&r->out, ")");
    return true;
}

/* The top level: branches may carry their own anchors; with search, an
 * unanchored side matches anything there (JSON Schema's pattern is a
 * search, not a full match). */
static bool parse_top(rx *r, bool search) {
    kgr_buf_puts(&r->out, "(");
    for (bool first = true;; first = false) {
        if (!first) kgr_buf_puts(&r->out, " | ");
        bool a0 = r->s < r->end && *r->s == '^';
        if (a0) r->s++;
        /* find the branch's end at depth 0 to see whether it ends with '$' */
        const char *q = r->s;
        int d = 0;
        bool cls = false;
        for (; q < r->end; q++) {
            if (*q == '\\') {
                q++;
                continue;
            }
            if (cls) {
                if (*q == ']') cls = false;
                continue;
            }
            if (*q == '[') cls = true;
            else if (*q == '(') d++;
            else if (*q == ')') d--;
            else if (*q == '|' && d == 0) break;
        }
        bool a1 = q > r->s && q[-1] == '$' && (q - 1 == r->s || q[-2] != '\\');
        const char *save_end = r->end;
        r->end = a1 ? q - 1 : q;
        kgr_buf_puts(&r->out, "(");
        if (search && !a0) {
            if (!any_char(r, false)) return false;
            kgr_buf_puts(&r->out, "* ");
        }
        if (!parse_seq(r, 0)) return false;
        if (r->s < r->end) return r->end = save_end, rerr(r, "unbalanced ')'");
        if (search && !a1) {
            kgr_buf_puts(&r->out, " ");
            if (!any_char(r, false)) return false;
            kgr_buf_puts(&r->out, "*");
        }
        kgr_buf_puts(&r->out, ")");
        r->end = save_end;
        r->s = q;
        if (r->s >= r->end) break;
        r->s++; /* | */
    }
    kgr_buf_puts(&r->out, ")");
    return true;
}

static kiln_status regex_body(const char *re, bool json, bool search, char **body) {
    *body = NULL;
    rx r = {.s = re, .end = re + strlen(re), .start = re, .json = json};
    bool ok = parse_top(&r, search);
    if (!ok || r.out.oom) {
        free(r.out.p);
        if (r.out.oom) return kiln_error(KILN_ENOMEM, "out of memory");
        return kiln_error(KILN_EINVAL, "%s", r.err);
    }
    *body = r.out.p;
    return NULL;
}

kiln_status kgr_regex_to_gbnf(const char *re, bool json_string, char **body) {
    if (!json_string) return regex_body(re, false, false, body);
    char *b;
    KILN_TRY(regex_body(re, true, true, &b));
    kgr_buf o = {0};
    kgr_buf_printf(&o, "\"\\\"\" %s \"\\\"\"", b);
    free(b);
    if (o.oom) {
        free(o.p);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    *body = o.p;
    return NULL;
}

kiln_status kgr_from_regex(const char *re, kgr_grammar **out) {
    *out = NULL;
    char *b;
    KILN_TRY(regex_body(re, false, false, &b));
    kgr_buf o = {0};
    kgr_buf_printf(&o, "root ::= %s\n", b);
    free(b);
    if (o.oom) {
        free(o.p);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    kiln_status st = kgr_from_gbnf(o.p, o.n, out);
    free(o.p);
    return kiln_status_wrap(st, "regex");
}

/* ---- the lengths (in code points) of the strings a pattern matches ---- */
typedef struct {
    const char *s;
    bool bad;
} rl;

#define RL_INF INT64_MAX

static int64_t rl_add(int64_t a, int64_t b) { return a == RL_INF || b == RL_INF || a > RL_INF - b ? RL_INF : a + b; }
static int64_t rl_mul(int64_t a, int64_t k) { return a == RL_INF || (k && a > RL_INF / k) ? (a && k ? RL_INF : 0) : a * k; }

static void rl_alt(rl *r, int64_t *lo, int64_t *hi);

static int64_t rl_num(rl *r) {
    int64_t v = 0;
    if (*r->s < '0' || *r->s > '9') r->bad = true;
    for (; *r->s >= '0' && *r->s <= '9'; r->s++) v = v > 1000000000 ? v : v * 10 + (*r->s - '0');
    return v;
}

static void rl_atom(rl *r, int64_t *lo, int64_t *hi) {
    char c = *r->s;
    *lo = *hi = 1;
    if (c == '(') {
        r->s++;
        if (*r->s == '?') {
            if (r->s[1] != ':') {
                r->bad = true; /* lookaround, named groups, flags */
                return;
            }
            r->s += 2;
        }
        rl_alt(r, lo, hi);
        if (*r->s != ')') r->bad = true;
        else r->s++;
    } else if (c == '[') {
        r->s++;
        if (*r->s == '^') r->s++;
        if (*r->s == ']') { /* [] or [^]: refuse the oddities */
            r->bad = true;
            return;
        }
        for (; *r->s && *r->s != ']'; r->s++)
            if (*r->s == '\\' && r->s[1]) r->s++;
        if (*r->s != ']') r->bad = true;
        else r->s++;
    } else if (c == '\\') {
        char e = r->s[1];
        if (!e || (e >= '0' && e <= '9') || e == 'b' || e == 'B' || e == 'k') {
            r->bad = true; /* backreferences, word boundaries */
            return;
        }
        r->s += 2;
        if (e == 'u') {
            for (int i = 0; i < 4; i++, r->s++)
                if (!*r->s) r->bad = true;
        } else if (e == 'x') {
            for (int i = 0; i < 2; i++, r->s++)
                if (!*r->s) r->bad = true;
        } else if (e == 'c' && *r->s) r->s++;
    } else if (c == '^' || c == '$' || c == ')' || c == '|' || c == '*' || c == '+' || c == '?' || c == '{' || !c) {
        r->bad = true; /* anchors inside, or nothing to repeat */
    } else {
        r->s++;
        while (((unsigned char)*r->s & 0xC0) == 0x80) r->s++; /* one code point */
    }
}

static void rl_seq(rl *r, int64_t *lo, int64_t *hi, bool top) {
    *lo = *hi = 0;
    while (!r->bad && *r->s && *r->s != '|' && *r->s != ')') {
        if (top && *r->s == '$' && !r->s[1]) break; /* the end anchor */
        int64_t a, b;
        rl_atom(r, &a, &b);
        if (r->bad) return;
        char q = *r->s;
        if (q == '*' || q == '+' || q == '?') {
            r->s++;
            b = q == '?' ? b : RL_INF;
            a = q == '+' ? a : 0;
        } else if (q == '{') {
            r->s++;
            int64_t m = rl_num(r), n = m;
            if (*r->s == ',') {
                r->s++;
                n = *r->s == '}' ? RL_INF : rl_num(r);
            }
            if (*r->s != '}' || n < m) {
                r->bad = true;
                return;
            }
            r->s++;
            a = rl_mul(a, m);
            b = n == RL_INF ? (b ? RL_INF : 0) : rl_mul(b, n);
        }
        if (*r->s == '?' && (q == '*' || q == '+' || q == '?' || q == '{')) r->s++; /* lazy */
        *lo = rl_add(*lo, a);
        *hi = rl_add(*hi, b);
    }
}

static void rl_alt(rl *r, int64_t *lo, int64_t *hi) {
    rl_seq(r, lo, hi, false);
    while (!r->bad && *r->s == '|') {
        r->s++;
        int64_t a, b;
        rl_seq(r, &a, &b, false);
        if (a < *lo) *lo = a;
        if (b > *hi) *hi = b;
    }
}

bool kgr_regex_lengths(const char *re, int64_t *min, int64_t *max) {
    rl r = {re, false};
    bool start = *r.s == '^';
    if (start) r.s++;
    int64_t lo, hi;
    rl_seq(&r, &lo, &hi, true);
    if (r.bad) return false;
    bool end = *r.s == '$' && !r.s[1];
    if (*r.s && !end) return false; /* a top-level | (or anything else): not analysed */
    *min = lo;
    *max = start && end ? hi : -1; /* a search: any text around the match */
    return true;
}
