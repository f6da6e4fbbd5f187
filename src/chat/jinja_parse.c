/* jinja_parse.c: tokens to syntax tree, a port of @huggingface/jinja's
 * parser.ts (same precedence, same accepted forms). Nesting is bounded so
 * hostile input cannot exhaust the stack. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

#define MAX_NEST 200

typedef struct {
    ku_arena *a;
    const kj_toks *t;
    size_t i;
    int depth;
    kiln_status err;
} parser;

static kj_node *fail(parser *P, size_t at, const char *fmt, ...) KILN_PRINTF(3, 4);
static kj_node *fail(parser *P, size_t at, const char *fmt, ...) {
    if (P->err) return NULL;
    int line, col;
    uint32_t pos;
    if (at < P->t->n) pos = P->t->v[at].pos;
    else if (P->t->n) pos = P->t->v[P->t->n - 1].pos + (uint32_t)P->t->v[P->t->n - 1].val.len;
    else pos = 0;
    kj_linecol(P->t->lines, P->t->nlines, pos, &line, &col);
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at >= P->t->n) P->err = kiln_error(KILN_EINVAL, "line %d, column %d: unexpected end of template: %s", line, col, msg);
    else P->err = kiln_error(KILN_EINVAL, "line %d, column %d: %s", line, col, msg);
    return NULL;
}

static kj_tok *tok(parser *P, size_t k) { return P->i + k < P->t->n ? &P->t->v[P->i + k] : NULL; }

static bool is(parser *P, kj_tok_type type) {
    kj_tok *t = tok(P, 0);
    return t && t->type == type;
}

static bool is_ident(parser *P, size_t k, const char *name) {
    kj_tok *t = tok(P, k);
    return t && t->type == KT_IDENT && strcmp(t->val.p, name) == 0;
}

/* {% name ... where name is one of the NULL-terminated list */
static bool is_stmt(parser *P, const char *const *names) {
    kj_tok *t = tok(P, 0);
    if (!t || t->type != KT_OPEN_STMT) return false;
    for (; *names; names++)
        if (is_ident(P, 1, *names)) return true;
    return false;
}

static bool expect(parser *P, kj_tok_type type, const char *what) {
    if (P->err) return false;
    kj_tok *t = tok(P, 0);
    if (!t || t->type != type) {
        fail(P, P->i, "expected %s", what);
        return false;
    }
    P->i++;
    return true;
}

static bool expect_ident(parser *P, const char *name) {
    if (P->err) return false;
    if (!is_ident(P, 0, name)) {
        fail(P, P->i, "expected '%s'", name);
        return false;
    }
    P->i++;
    return true;
}

static kj_node *node(parser *P, kj_kind kind, size_t at) {
    kj_node *n = ku_arena_alloc(P->a, sizeof *n);
    if (!n) {
        if (!P->err) P->err = kiln_error(KILN_ENOMEM, "out of memory");
        return NULL;
    }
    n->kind = kind;
    n->pos = at < P->t->n ? P->t->v[at].pos : (P->t->n ? P->t->v[P->t->n - 1].pos : 0);
    return n;
}

/* A growable list built on the heap, then copied into the arena. */
typedef struct {
    kj_node **v;
    int n, cap;
} vec;

static bool vpush(parser *P, vec *v, kj_node *n) {
    if (!n) return false;
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        kj_node **nv = realloc(v->v, (size_t)cap * sizeof *nv);
        if (!nv) {
            if (!P->err) P->err = kiln_error(KILN_ENOMEM, "out of memory");
            return false;
        }
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = n;
    return true;
}

static kj_list vfinish(parser *P, vec *v) {
    kj_list l = {0};
    if (v->n && !P->err) {
        l.v = ku_arena_memdup(P->a, v->v, (size_t)v->n * sizeof *v->v);
        if (!l.v) P->err = kiln_error(KILN_ENOMEM, "out of memory");
        else l.n = v->n;
    }
    free(v->v);
    v->v = NULL;
    return l;
}

static kj_node *parse_any(parser *P);
static kj_node *parse_expr(parser *P);
static kj_node *parse_primary(parser *P);
static kj_node *parse_member(parser *P, kj_node *obj);
static kj_node *parse_call(parser *P, kj_node *callee);
static bool parse_args(parser *P, bool params, kj_list *out);

/* Statements until one of names starts ({% name); the caller consumes it. */
static bool parse_body(parser *P, const char *const *names, kj_list *out) {
    vec v = {0};
    while (!P->err && !is_stmt(P, names)) {
        if (P->i >= P->t->n) {
            char what[64];
            snprintf(what, sizeof what, "{%% %s %%}", names[0]);
            fail(P, P->i, "expected %s", what);
            break;
        }
        vpush(P, &v, parse_any(P));
    }
    *out = vfinish(P, &v);
    return !P->err;
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const ENDFOR[] = {"endfor", NULL};
static const char *const ENDSET[] = {"endset", NULL};
static const char *const ENDMACRO[] = {"endmacro", NULL};
static const char *const ENDCALL[] = {"endcall", NULL};
static const char *const ENDFILTER[] = {"endfilter", NULL};

static kj_node *parse_if(parser *P, size_t at) {
    kj_node *n = node(P, KN_IF, at);
    if (!n) return NULL;
    n->a = parse_expr(P);
    if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
    if (!parse_body(P, END_IF, &n->list)) return NULL;
    if (is_stmt(P, (const char *const[]){"elif", NULL})) {
        size_t at2 = P->i;
        P->i += 2;
        if (++P->depth > MAX_NEST) return fail(P, at2, "too deeply nested");
        kj_node *e = parse_if(P, at2);
        P->depth--;
        if (!e) return NULL;
        kj_node **one = ku_arena_alloc(P->a, sizeof *one);
        if (!one) return fail(P, at2, "out of memory");
        one[0] = e;
        n->list2 = (kj_list){one, 1};
    } else if (is_stmt(P, (const char *const[]){"else", NULL})) {
        P->i += 2;
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
        if (!parse_body(P, ENDIF, &n->list2)) return NULL;
    }
    return n;
}

/* expr or expr, expr, ... (a tuple) */
static kj_node *parse_seq(parser *P, bool primary) {
    size_t at = P->i;
    kj_node *first = primary ? parse_primary(P) : parse_expr(P);
    if (!first || !is(P, KT_COMMA)) return first;
    vec v = {0};
    vpush(P, &v, first);
    while (!P->err) {
        P->i++;
        if (!vpush(P, &v, primary ? parse_primary(P) : parse_expr(P))) break;
        if (!is(P, KT_COMMA)) break;
    }
    kj_node *t = node(P, KN_TUPLE, at);
    kj_list l = vfinish(P, &v);
    if (!t || P->err) return NULL;
    t->list = l;
    return t;
}

static kj_node *parse_set(parser *P, size_t at) {
    kj_node *n = node(P, KN_SET, at);
    if (!n) return NULL;
    n->a = parse_seq(P, false);
    if (P->err) return NULL;
    if (is(P, KT_EQUALS)) {
        P->i++;
        n->b = parse_seq(P, false);
    } else {
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
        if (!parse_body(P, ENDSET, &n->list)) return NULL;
        if (!expect(P, KT_OPEN_STMT, "'{%'") || !expect_ident(P, "endset")) return NULL;
    }
    if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
    return n;
}

static kj_node *parse_for(parser *P, size_t at) {
    kj_node *n = node(P, KN_FOR, at);
    if (!n) return NULL;
    n->a = parse_seq(P, true);
    if (P->err) return NULL;
    if (n->a->kind != KN_IDENT && n->a->kind != KN_TUPLE)
        return fail(P, at, "expected an identifier or tuple for the loop variable");
    if (!is_ident(P, 0, "in")) return fail(P, P->i, "expected 'in' after the loop variable");
    P->i++;
    n->b = parse_expr(P);
    if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
    if (!parse_body(P, END_FOR, &n->list)) return NULL;
    if (is_stmt(P, (const char *const[]){"else", NULL})) {
        P->i += 2;
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
        if (!parse_body(P, ENDFOR, &n->list2)) return NULL;
    }
    return n;
}

static kj_node *parse_statement(parser *P) {
    size_t at = P->i;
    P->i++; /* {% */
    kj_tok *t = tok(P, 0);
    if (!t) return fail(P, P->i, "expected a statement name");
    if (t->type != KT_IDENT) return fail(P, P->i, "unknown statement");
    const char *name = t->val.p;
    kj_node *n = NULL;
    if (!strcmp(name, "set")) {
        P->i++;
        n = parse_set(P, at);
    } else if (!strcmp(name, "if")) {
        P->i++;
        n = parse_if(P, at);
        if (n && !(expect(P, KT_OPEN_STMT, "'{%'") && expect_ident(P, "endif") && expect(P, KT_CLOSE_STMT, "'%}'")))
            n = NULL;
    } else if (!strcmp(name, "macro")) {
        P->i++;
        n = node(P, KN_MACRO, at);
        if (!n) return NULL;
        kj_node *nm = parse_primary(P);
        if (!nm) return NULL;
        if (nm->kind != KN_IDENT) return fail(P, at, "expected an identifier after 'macro'");
        n->str = nm->str;
        if (!parse_args(P, true, &n->list2)) return NULL;
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
        if (!parse_body(P, ENDMACRO, &n->list)) return NULL;
        if (!(expect(P, KT_OPEN_STMT, "'{%'") && expect_ident(P, "endmacro") && expect(P, KT_CLOSE_STMT, "'%}'")))
            return NULL;
    } else if (!strcmp(name, "for")) {
        P->i++;
        n = parse_for(P, at);
        if (n && !(expect(P, KT_OPEN_STMT, "'{%'") && expect_ident(P, "endfor") && expect(P, KT_CLOSE_STMT, "'%}'")))
            n = NULL;
    } else if (!strcmp(name, "call")) {
        P->i++;
        n = node(P, KN_CALLSTMT, at);
        if (!n) return NULL;
        if (is(P, KT_LPAREN)) {
            n->has_params = true;
            if (!parse_args(P, true, &n->list2)) return NULL;
        }
        size_t cat = P->i;
        kj_node *callee = parse_primary(P);
        if (!callee) return NULL;
        if (callee->kind != KN_IDENT) return fail(P, cat, "expected an identifier after 'call'");
        kj_node *call = node(P, KN_CALL, cat);
        if (!call) return NULL;
        call->a = callee;
        if (!parse_args(P, false, &call->list)) return NULL;
        n->a = call;
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
        if (!parse_body(P, ENDCALL, &n->list)) return NULL;
        if (!(expect(P, KT_OPEN_STMT, "'{%'") && expect_ident(P, "endcall") && expect(P, KT_CLOSE_STMT, "'%}'")))
            return NULL;
    } else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
        P->i++;
        n = node(P, name[0] == 'b' ? KN_BREAK : KN_CONTINUE, at);
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
    } else if (!strcmp(name, "filter")) {
        P->i++;
        n = node(P, KN_FILTERSTMT, at);
        if (!n) return NULL;
        kj_node *f = parse_primary(P);
        if (!f) return NULL;
        if (f->kind == KN_IDENT && is(P, KT_LPAREN)) f = parse_call(P, f);
        n->a = f;
        if (!expect(P, KT_CLOSE_STMT, "'%}'")) return NULL;
        if (!parse_body(P, ENDFILTER, &n->list)) return NULL;
        if (!(expect(P, KT_OPEN_STMT, "'{%'") && expect_ident(P, "endfilter") && expect(P, KT_CLOSE_STMT, "'%}'")))
            return NULL;
    } else {
        return fail(P, P->i, "unknown statement '%s'", name);
    }
    return P->err ? NULL : n;
}

static kj_node *parse_any(parser *P) {
    kj_tok *t = tok(P, 0);
    if (!t) return fail(P, P->i, "expected a statement");
    if (++P->depth > MAX_NEST) return fail(P, P->i, "blocks nested too deeply");
    kj_node *n = NULL;
    switch (t->type) {
    case KT_COMMENT:
        n = node(P, KN_COMMENT, P->i++);
        break;
    case KT_TEXT:
        n = node(P, KN_TEXT, P->i);
        if (n) n->str = t->val;
        P->i++;
        break;
    case KT_OPEN_STMT:
        n = parse_statement(P);
        break;
    case KT_OPEN_EXPR:
        P->i++;
        n = parse_expr(P);
        if (n && !expect(P, KT_CLOSE_EXPR, "'}}'")) n = NULL;
        break;
    default:
        n = fail(P, P->i, "unexpected '%s'", t->val.p);
    }
    P->depth--;
    return n;
}

/* ---- expressions ------------------------------------------------------ */

static kj_node *binary(parser *P, kj_op op, kj_node *l, kj_node *r, size_t at) {
    if (!l || !r) return NULL;
    kj_node *n = node(P, KN_BINARY, at);
    if (!n) return NULL;
    n->op = op;
    n->a = l;
    n->b = r;
    return n;
}

static kj_node *parse_or(parser *P);

static kj_node *parse_expr(parser *P) {
    if (++P->depth > MAX_NEST) return fail(P, P->i, "expression nested too deeply");
    size_t at = P->i;
    kj_node *a = parse_or(P), *n = a;
    if (a && is_ident(P, 0, "if")) {
        P->i++;
        kj_node *test = parse_or(P);
        if (!test) n = NULL;
        else if (is_ident(P, 0, "else")) {
            P->i++;
            kj_node *f = parse_expr(P);
            n = node(P, KN_TERNARY, at);
            if (n) n->a = test, n->b = a, n->c = f;
            if (!f) n = NULL;
        } else {
            n = node(P, KN_SELECT, at);
            if (n) n->a = a, n->b = test;
        }
    }
    P->depth--;
    return P->err ? NULL : n;
}

static kj_node *parse_not(parser *P);
static kj_node *parse_and(parser *P);

static kj_node *parse_or(parser *P) {
    kj_node *l = parse_and(P);
    while (l && is_ident(P, 0, "or")) {
        size_t at = P->i++;
        l = binary(P, KO_OR, l, parse_and(P), at);
    }
    return l;
}

static kj_node *parse_and(parser *P) {
    kj_node *l = parse_not(P);
    while (l && is_ident(P, 0, "and")) {
        size_t at = P->i++;
        l = binary(P, KO_AND, l, parse_not(P), at);
    }
    return l;
}

static kj_node *parse_cmp(parser *P);

static kj_node *parse_not(parser *P) {
    if (is_ident(P, 0, "not")) {
        size_t at = P->i++;
        if (++P->depth > MAX_NEST) return fail(P, at, "expression nested too deeply");
        kj_node *arg = parse_not(P);
        P->depth--;
        if (!arg) return NULL;
        kj_node *n = node(P, KN_UNARY, at);
        if (n) n->op = KO_NOT, n->a = arg;
        return n;
    }
    return parse_cmp(P);
}

static kj_node *parse_add(parser *P);

static kj_node *parse_cmp(parser *P) {
    kj_node *l = parse_add(P);
    while (l) {
        size_t at = P->i;
        kj_op op;
        if (is_ident(P, 0, "not") && is_ident(P, 1, "in")) {
            op = KO_NOTIN;
            P->i += 2;
        } else if (is_ident(P, 0, "in")) {
            op = KO_IN;
            P->i++;
        } else if (is(P, KT_CMP)) {
            const char *s = tok(P, 0)->val.p;
            op = !strcmp(s, "==") ? KO_EQ : !strcmp(s, "!=") ? KO_NE : !strcmp(s, "<") ? KO_LT
               : !strcmp(s, ">") ? KO_GT : !strcmp(s, "<=") ? KO_LE : KO_GE;
            P->i++;
        } else {
            break;
        }
        l = binary(P, op, l, parse_add(P), at);
    }
    return l;
}

static kj_node *parse_mul(parser *P);

static kj_node *parse_add(parser *P) {
    kj_node *l = parse_mul(P);
    while (l && is(P, KT_ADD)) {
        size_t at = P->i;
        char c = tok(P, 0)->val.p[0];
        P->i++;
        l = binary(P, c == '+' ? KO_ADD : c == '-' ? KO_SUB : KO_CONCAT, l, parse_mul(P), at);
    }
    return l;
}

static kj_node *parse_pow(parser *P);

static kj_node *parse_mul(parser *P) {
    kj_node *l = parse_pow(P);
    while (l && is(P, KT_MUL)) {
        size_t at = P->i;
        const char *s = tok(P, 0)->val.p;
        kj_op op = !strcmp(s, "*") ? KO_MUL : !strcmp(s, "/") ? KO_DIV : !strcmp(s, "//") ? KO_FLOORDIV : KO_MOD;
        P->i++;
        l = binary(P, op, l, parse_pow(P), at);
    }
    return l;
}

static kj_node *parse_test(parser *P);

static kj_node *parse_pow(parser *P) {
    kj_node *l = parse_test(P);
    while (l && is(P, KT_POW)) {
        size_t at = P->i++;
        l = binary(P, KO_POW, l, parse_test(P), at);
    }
    return l;
}

static kj_node *parse_filter(parser *P);

static kj_node *parse_test(parser *P) {
    kj_node *l = parse_filter(P);
    while (l && is_ident(P, 0, "is")) {
        size_t at = P->i++;
        bool neg = is_ident(P, 0, "not");
        if (neg) P->i++;
        kj_node *name = parse_primary(P);
        if (!name) return NULL;
        if (name->kind != KN_IDENT) return fail(P, at, "expected an identifier for the test");
        kj_node *n = node(P, KN_TEST, at);
        if (!n) return NULL;
        n->a = l;
        n->negate = neg;
        n->str = name->str;
        l = n;
    }
    return l;
}

static kj_node *parse_unary(parser *P);

static kj_node *parse_filter(parser *P) {
    kj_node *l = parse_unary(P);
    while (l && is(P, KT_PIPE)) {
        size_t at = P->i++;
        kj_node *f = parse_primary(P);
        if (!f) return NULL;
        if (f->kind != KN_IDENT) return fail(P, at, "expected an identifier for the filter");
        if (is(P, KT_LPAREN)) f = parse_call(P, f);
        if (!f) return NULL;
        kj_node *n = node(P, KN_FILTER, at);
        if (!n) return NULL;
        n->a = l;
        n->b = f;
        l = n;
    }
    return l;
}

static kj_node *parse_unary(parser *P) {
    kj_tok *t = tok(P, 0);
    if (t && (t->type == KT_UNARY || t->type == KT_ADD) && (t->val.p[0] == '-' || t->val.p[0] == '+') && !t->val.p[1]) {
        size_t at = P->i++;
        if (++P->depth > MAX_NEST) return fail(P, at, "expression nested too deeply");
        kj_node *arg = parse_unary(P);
        P->depth--;
        if (!arg) return NULL;
        kj_node *n = node(P, KN_UNARY, at);
        if (n) n->op = t->val.p[0] == '-' ? KO_SUB : KO_ADD, n->a = arg;
        return n;
    }
    kj_node *m = parse_primary(P);
    if (m) m = parse_member(P, m);
    if (m && is(P, KT_LPAREN)) m = parse_call(P, m);
    return m;
}

static kj_node *parse_call(parser *P, kj_node *callee) {
    for (;;) {
        kj_node *n = node(P, KN_CALL, P->i);
        if (!n) return NULL;
        n->pos = callee->pos; /* errors point at the function's name */
        n->a = callee;
        if (!parse_args(P, false, &n->list)) return NULL;
        n = parse_member(P, n);
        if (!n || !is(P, KT_LPAREN)) return n;
        callee = n;
    }
}

static bool parse_args(parser *P, bool params, kj_list *out) {
    if (!expect(P, KT_LPAREN, "'('")) return false;
    vec v = {0};
    bool saw_kw = false, saw_spread = false;
    int nnames = 0;
    while (!P->err && !is(P, KT_RPAREN)) {
        size_t at = P->i;
        if (at >= P->t->n) {
            fail(P, at, "expected ')'");
            break;
        }
        bool kwspread = is(P, KT_POW);
        bool spread = is(P, KT_MUL) && !strcmp(tok(P, 0)->val.p, "*");
        if (params && (kwspread || spread)) {
            fail(P, at, "argument unpacking is not allowed in parameter declarations");
            break;
        }
        if (kwspread) {
            P->i++;
            kj_node *n = node(P, KN_KWSPREAD, at);
            if (n) n->a = parse_expr(P);
            if (!n || !n->a) break;
            vpush(P, &v, n);
            if (is(P, KT_COMMA)) P->i++;
            if (!is(P, KT_RPAREN)) fail(P, P->i, "expected ')': '**' must be the final argument");
            break;
        }
        kj_node *arg;
        if (spread) {
            if (saw_spread) {
                fail(P, at, "only one '*' argument unpacking is allowed");
                break;
            }
            saw_spread = true;
            P->i++;
            arg = node(P, KN_SPREAD, at);
            if (arg) arg->a = parse_expr(P);
            if (!arg || !arg->a) break;
        } else {
            arg = parse_expr(P);
            if (!arg) break;
            if (is(P, KT_EQUALS)) {
                P->i++;
                if (arg->kind != KN_IDENT) {
                    fail(P, at, params ? "expected an identifier for a parameter" : "expected an identifier for a keyword argument");
                    break;
                }
                kj_node *kw = node(P, KN_KWARG, at);
                if (!kw) break;
                kw->str = arg->str;
                kw->a = parse_expr(P);
                if (!kw->a) break;
                arg = kw;
            }
            if (params) {
                if (arg->kind != KN_IDENT && arg->kind != KN_KWARG) {
                    fail(P, at, "expected an identifier for a parameter");
                    break;
                }
                for (int k = 0; k < v.n; k++)
                    if (!strcmp(v.v[k]->str.p, arg->str.p)) {
                        fail(P, at, "duplicate parameter name: %s", arg->str.p);
                        break;
                    }
                nnames++;
            }
            if (arg->kind == KN_KWARG) saw_kw = true;
            else if (saw_kw) {
                fail(P, at, params ? "non-default argument follows default argument" : "positional arguments must come before keyword arguments");
                break;
            } else if (saw_spread) {
                fail(P, at, "positional arguments must not follow '*' argument unpacking");
                break;
            }
        }
        vpush(P, &v, arg);
        if (is(P, KT_COMMA)) P->i++;
    }
    *out = vfinish(P, &v);
    return !P->err && expect(P, KT_RPAREN, "')'");
}

static kj_node *parse_member(parser *P, kj_node *obj) {
    while (obj && (is(P, KT_DOT) || is(P, KT_LBRACKET))) {
        size_t at = P->i;
        bool computed = is(P, KT_LBRACKET);
        P->i++;
        kj_node *prop;
        if (computed) {
            kj_node *sl[4] = {0};
            int ns = 0;
            bool slice = false;
            while (!P->err && !is(P, KT_RBRACKET)) {
                if (P->i >= P->t->n) return fail(P, P->i, "expected ']'");
                if (ns >= 4) return fail(P, at, "expected 0-3 arguments for a slice");
                if (is(P, KT_COLON)) {
                    sl[ns++] = NULL;
                    P->i++;
                    slice = true;
                } else {
                    sl[ns++] = parse_expr(P);
                    if (!sl[ns - 1]) return NULL;
                    if (is(P, KT_COLON)) {
                        P->i++;
                        slice = true;
                    }
                }
            }
            if (P->err) return NULL;
            if (ns == 0) return fail(P, at, "expected at least one argument in '[]'");
            if (slice) {
                if (ns > 3) return fail(P, at, "expected 0-3 arguments for a slice");
                prop = node(P, KN_SLICE, at);
                if (!prop) return NULL;
                prop->a = sl[0], prop->b = sl[1], prop->c = sl[2];
            } else {
                prop = sl[0];
            }
            if (!expect(P, KT_RBRACKET, "']'")) return NULL;
        } else {
            prop = parse_primary(P);
            if (!prop) return NULL;
            if (prop->kind != KN_IDENT && prop->kind != KN_INT)
                return fail(P, at, "expected an identifier or integer after '.'");
        }
        kj_node *n = node(P, KN_MEMBER, at);
        if (!n) return NULL;
        n->a = obj;
        n->b = prop;
        n->computed = computed;
        obj = n;
    }
    return obj;
}

static kj_node *parse_primary(parser *P) {
    kj_tok *t = tok(P, 0);
    if (!t) return fail(P, P->i, "expected an expression");
    size_t at = P->i++;
    switch (t->type) {
    case KT_NUM: {
        bool fl = strchr(t->val.p, '.') != NULL;
        kj_node *n = node(P, fl ? KN_FLOAT : KN_INT, at);
        if (n) n->num = strtod(t->val.p, NULL);
        return n;
    }
    case KT_STR: {
        kj_node *n = node(P, KN_STR, at);
        if (!n) return NULL;
        n->str = t->val;
        if (is(P, KT_STR)) { /* adjacent literals concatenate */
            kj_buf b = {0};
            kj_buf_put(&b, t->val.p, t->val.len);
            while (is(P, KT_STR)) {
                kj_buf_put(&b, tok(P, 0)->val.p, tok(P, 0)->val.len);
                P->i++;
            }
            char *s = b.oom ? NULL : ku_arena_memdup(P->a, b.p, b.n + 1);
            size_t len = b.n;
            free(b.p);
            if (!s) return fail(P, at, "out of memory");
            n->str = (kj_str){len, s};
        }
        return n;
    }
    case KT_IDENT: {
        kj_node *n = node(P, KN_IDENT, at);
        if (n) n->str = t->val;
        return n;
    }
    case KT_LPAREN: {
        if (++P->depth > MAX_NEST) return fail(P, at, "expression nested too deeply");
        kj_node *e = parse_seq(P, false);
        P->depth--;
        if (!e || !expect(P, KT_RPAREN, "')'")) return NULL;
        return e;
    }
    case KT_LBRACKET: {
        if (++P->depth > MAX_NEST) return fail(P, at, "expression nested too deeply");
        vec v = {0};
        while (!P->err && !is(P, KT_RBRACKET)) {
            if (P->i >= P->t->n) {
                fail(P, P->i, "expected ']'");
                break;
            }
            if (!vpush(P, &v, parse_expr(P))) break;
            if (is(P, KT_COMMA)) P->i++;
        }
        P->depth--;
        kj_node *n = node(P, KN_ARRAY, at);
        kj_list l = vfinish(P, &v);
        if (!n || P->err) return NULL;
        n->list = l;
        P->i++;
        return n;
    }
    case KT_LBRACE: {
        if (++P->depth > MAX_NEST) return fail(P, at, "expression nested too deeply");
        vec k = {0}, v = {0};
        while (!P->err && !is(P, KT_RBRACE)) {
            if (P->i >= P->t->n) {
                fail(P, P->i, "expected '}'");
                break;
            }
            if (!vpush(P, &k, parse_expr(P))) break;
            if (!expect(P, KT_COLON, "':' between key and value")) break;
            if (!vpush(P, &v, parse_expr(P))) break;
            if (is(P, KT_COMMA)) P->i++;
        }
        P->depth--;
        kj_node *n = node(P, KN_OBJECT, at);
        kj_list lk = vfinish(P, &k), lv = vfinish(P, &v);
        if (!n || P->err) return NULL;
        n->list = lk;
        n->list2 = lv;
        P->i++;
        return n;
    }
    default:
        return fail(P, at, "unexpected '%s'", t->val.p);
    }
}

/* ---- macros: which of kwargs / varargs does a body read? ------------- */

typedef struct {
    uint8_t declared, accessed;
} special_scan;

static uint8_t special_bit(const kj_str *s) {
    if (!s->p) return 0;
    return !strcmp(s->p, "kwargs") ? 1 : !strcmp(s->p, "varargs") ? 2 : 0;
}

static void declare_target(special_scan *S, const kj_node *t) {
    if (!t) return;
    if (t->kind == KN_IDENT) S->declared |= special_bit(&t->str);
    else if (t->kind == KN_TUPLE)
        for (int i = 0; i < t->list.n; i++) declare_target(S, t->list.v[i]);
}

static void scan(special_scan *S, const kj_node *n, int depth);

static void scan_list(special_scan *S, const kj_list *l, int depth) {
    for (int i = 0; i < l->n; i++) scan(S, l->v[i], depth);
}

static void scan_params(special_scan *S, const kj_list *params, int depth) {
    for (int i = 0; i < params->n; i++) S->declared |= special_bit(&params->v[i]->str);
    for (int i = 0; i < params->n; i++)
        if (params->v[i]->kind == KN_KWARG) scan(S, params->v[i]->a, depth);
}

static void scan(special_scan *S, const kj_node *n, int depth) {
    if (!n || depth > 4 * MAX_NEST) return;
    depth++;
    switch (n->kind) {
    case KN_FOR:
        declare_target(S, n->a);
        if (n->b && n->b->kind == KN_SELECT) {
            scan(S, n->b->a, depth);
            scan_list(S, &n->list, depth);
            scan_list(S, &n->list2, depth);
            scan(S, n->b->b, depth);
            return;
        }
        scan(S, n->b, depth);
        scan_list(S, &n->list, depth);
        scan_list(S, &n->list2, depth);
        return;
    case KN_SET:
        declare_target(S, n->a);
        scan(S, n->b, depth);
        scan_list(S, &n->list, depth);
        return;
    case KN_MACRO:
        scan_params(S, &n->list2, depth);
        scan_list(S, &n->list, depth);
        return;
    case KN_CALLSTMT:
        scan(S, n->a, depth);
        scan_params(S, &n->list2, depth);
        scan_list(S, &n->list, depth);
        return;
    case KN_IDENT: {
        uint8_t bit = special_bit(&n->str);
        if (bit && !(S->declared & bit)) S->accessed |= bit;
        return;
    }
    case KN_MEMBER:
        scan(S, n->a, depth);
        if (n->computed) scan(S, n->b, depth);
        return;
    case KN_FILTER:
    case KN_FILTERSTMT:
        if (n->kind == KN_FILTERSTMT) scan_list(S, &n->list, depth);
        else scan(S, n->a, depth);
        if (n->kind == KN_FILTER ? n->b->kind == KN_CALL : n->a->kind == KN_CALL)
            scan_list(S, n->kind == KN_FILTER ? &n->b->list : &n->a->list, depth);
        return;
    case KN_TEST:
        scan(S, n->a, depth);
        return;
    case KN_SELECT:
        scan(S, n->b, depth);
        scan(S, n->a, depth);
        return;
    case KN_KWARG:
        scan(S, n->a, depth);
        return;
    default:
        scan(S, n->a, depth);
        scan(S, n->b, depth);
        scan(S, n->c, depth);
        scan_list(S, &n->list, depth);
        scan_list(S, &n->list2, depth);
    }
}

static void mark_specials(kj_node *n, int depth) {
    if (!n || depth > 4 * MAX_NEST) return;
    if (n->kind == KN_MACRO || n->kind == KN_CALLSTMT) {
        special_scan S = {0};
        for (int i = 0; i < n->list2.n; i++) S.declared |= special_bit(&n->list2.v[i]->str);
        scan_list(&S, &n->list, 0);
        n->special = S.accessed;
    }
    mark_specials(n->a, depth + 1);
    mark_specials(n->b, depth + 1);
    mark_specials(n->c, depth + 1);
    for (int i = 0; i < n->list.n; i++) mark_specials(n->list.v[i], depth + 1);
    for (int i = 0; i < n->list2.n; i++) mark_specials(n->list2.v[i], depth + 1);
}

kiln_status kj_parse_tokens(ku_arena *a, const kj_toks *t, kj_list *out) {
    parser P = {.a = a, .t = t};
    vec v = {0};
    while (!P.err && P.i < t->n) vpush(&P, &v, parse_any(&P));
    *out = vfinish(&P, &v);
    if (!P.err)
        for (int i = 0; i < out->n; i++) mark_specials(out->v[i], 0);
    return P.err;
}
