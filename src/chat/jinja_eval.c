/* jinja_eval.c: the interpreter, a port of @huggingface/jinja's runtime.ts.
 * Statements write into one output buffer; blocks whose text becomes a
 * value (macro bodies, set blocks, filter blocks) render into their own.
 * break/continue travel up as return codes: an iteration cut short drops
 * its partial output, as the original drops the block's string. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/jinja_rt.h"

enum { R_OK, R_BREAK, R_CONT, R_ERR };

/* ---- context, allocation, errors -------------------------------------- */

kj_val kj_fail(kj_ctx *c, const kj_node *n, const char *fmt, ...) {
    if (c->err) return KJ_UNDEF;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = 0, col = 0;
    if (n) kj_linecol(c->t->lines, c->t->nlines, n->pos, &line, &col);
    if (n) c->err = kiln_error(KILN_EINVAL, "line %d, column %d: %s", line, col, msg);
    else c->err = kiln_error(KILN_EINVAL, "%s", msg);
    return KJ_UNDEF;
}

static void fail_limit(kj_ctx *c, const kj_node *n, const char *what) {
    if (c->err) return;
    int line = 0, col = 0;
    if (n) kj_linecol(c->t->lines, c->t->nlines, n->pos, &line, &col);
    c->err = kiln_error(KILN_ELIMIT, "line %d, column %d: template exceeds its %s limit", line, col, what);
}

void *kj_alloc(kj_ctx *c, size_t n) {
    if (c->err) return NULL;
    if (n > c->lim.max_memory || ku_arena_used(c->a) > c->lim.max_memory - n) {
        fail_limit(c, NULL, "memory");
        return NULL;
    }
    void *p = ku_arena_alloc(c->a, n);
    if (!p) c->err = kiln_error(KILN_ENOMEM, "out of memory rendering a template");
    return p;
}

bool kj_step(kj_ctx *c, const kj_node *n, uint64_t k) {
    c->steps += k;
    if (c->steps > c->lim.max_steps) {
        fail_limit(c, n, "evaluation step");
        return false;
    }
    return !c->err;
}

bool kj_emit(kj_ctx *c, const kj_node *n, kj_buf *b, const char *p, size_t len) {
    if (c->err) return false;
    if (len > c->lim.max_output || b->n > c->lim.max_output - len) {
        fail_limit(c, n, "output size");
        return false;
    }
    if (!kj_buf_put(b, p, len)) {
        c->err = kiln_error(KILN_ENOMEM, "out of memory rendering a template");
        return false;
    }
    return true;
}

/* ---- values ------------------------------------------------------------ */

kj_val kj_bool(bool b) { return (kj_val){.t = V_BOOL, .b = b}; }
kj_val kj_num(kj_vtype t, double d) { return (kj_val){.t = t, .d = d}; }

kj_val kj_mkstr(kj_ctx *c, const char *p, size_t n) {
    kj_str *s = kj_alloc(c, sizeof *s + n + 1);
    if (!s) return KJ_UNDEF;
    char *d = (char *)(s + 1);
    if (n) memcpy(d, p, n);
    d[n] = 0;
    s->len = n;
    s->p = d;
    return (kj_val){.t = V_STR, .s = s};
}

kj_val kj_buf_str(kj_ctx *c, const kj_node *n, kj_buf *b) {
    (void)n;
    kj_val v = c->err ? KJ_UNDEF : kj_mkstr(c, b->p ? b->p : "", b->n);
    free(b->p);
    *b = (kj_buf){0};
    return v;
}

kj_val kj_mkarr(kj_ctx *c, kj_vtype t, size_t n) {
    kj_arr *a = kj_alloc(c, sizeof *a);
    if (!a) return KJ_UNDEF;
    if (n) {
        if (n > SIZE_MAX / sizeof(kj_val)) {
            fail_limit(c, NULL, "memory");
            return KJ_UNDEF;
        }
        a->v = kj_alloc(c, n * sizeof(kj_val)); /* zeroed: V_UNDEF */
        if (!a->v) return KJ_UNDEF;
    }
    a->n = n;
    return (kj_val){.t = t, .a = a};
}

kj_obj *kj_newobj(kj_ctx *c) { return kj_alloc(c, sizeof(kj_obj)); }

static bool str_key(const kj_obj *o, size_t i) { return !o->kv || o->kv[i].t == V_STR; }

kj_val *kj_obj_get(const kj_obj *o, const char *k, size_t len) {
    for (size_t i = 0; i < o->n; i++)
        if (str_key(o, i) && o->k[i]->len == len && memcmp(o->k[i]->p, k, len) == 0) return &o->v[i];
    return NULL;
}

kj_val kj_obj_key(const kj_obj *o, size_t i) { return o->kv ? o->kv[i] : (kj_val){.t = V_STR, .s = o->k[i]}; }

/* Python's hash equality of non-string keys: 1 == 1.0 == True. */
static bool num_key(kj_val v, double *d) {
    if (v.t == V_BOOL) *d = v.b;
    else if (kj_is_num(v)) *d = v.d;
    else return false;
    return true;
}

kj_val *kj_obj_getv(const kj_obj *o, kj_val key) {
    if (key.t == V_STR) return kj_obj_get(o, key.s->p, key.s->len);
    if (!o->kv) return NULL;
    double d, e;
    bool isnum = num_key(key, &d);
    for (size_t i = 0; i < o->n; i++) {
        kj_val k = o->kv[i];
        if (isnum ? num_key(k, &e) && e == d : k.t == key.t) return &o->v[i];
    }
    return NULL;
}

static bool obj_grow(kj_ctx *c, kj_obj *o) {
    if (o->n < o->cap) return true;
    size_t cap = o->cap ? o->cap * 2 : 8;
    const kj_str **nk = kj_alloc(c, cap * sizeof *nk);
    kj_val *nv = kj_alloc(c, cap * sizeof *nv), *nkv = o->kv ? kj_alloc(c, cap * sizeof *nkv) : NULL;
    if (!nk || !nv || (o->kv && !nkv)) return false;
    if (o->n) {
        memcpy(nk, o->k, o->n * sizeof *nk);
        memcpy(nv, o->v, o->n * sizeof *nv);
        if (nkv) memcpy(nkv, o->kv, o->n * sizeof *nkv);
    }
    o->k = nk;
    o->v = nv;
    o->kv = nkv;
    o->cap = cap;
    return true;
}

bool kj_obj_set(kj_ctx *c, kj_obj *o, const kj_str *k, kj_val v) {
    kj_val *slot = kj_obj_get(o, k->p, k->len);
    if (slot) {
        *slot = v;
        return true;
    }
    if (!obj_grow(c, o)) return false;
    if (o->kv) o->kv[o->n] = (kj_val){.t = V_STR, .s = k};
    o->k[o->n] = k;
    o->v[o->n++] = v;
    return true;
}

bool kj_obj_setv(kj_ctx *c, kj_obj *o, kj_val key, kj_val v) {
    if (key.t == V_STR) return kj_obj_set(c, o, key.s, v);
    kj_val *slot = kj_obj_getv(o, key);
    if (slot) {
        *slot = v;
        return true;
    }
    if (!obj_grow(c, o)) return false;
    if (!o->kv) {
        o->kv = kj_alloc(c, o->cap * sizeof *o->kv);
        if (!o->kv) return false;
        for (size_t i = 0; i < o->n; i++) o->kv[i] = (kj_val){.t = V_STR, .s = o->k[i]};
    }
    kj_buf b = {0};
    bool ok = kj_tojson(c, NULL, key, &(kj_json_opts){0}, 0, true, &b); /* json.dumps' key text */
    kj_val text = ok ? kj_buf_str(c, NULL, &b) : KJ_UNDEF;
    if (!ok) free(b.p);
    if (text.t != V_STR) return false;
    o->kv[o->n] = key;
    o->k[o->n] = text.s;
    o->v[o->n++] = v;
    return true;
}

bool kj_obj_setc(kj_ctx *c, kj_obj *o, const char *k, kj_val v) {
    kj_val s = kj_mkstr(c, k, strlen(k));
    return s.t == V_STR && kj_obj_set(c, o, s.s, v);
}

bool kj_obj_del(kj_obj *o, const char *k, size_t len) {
    for (size_t i = 0; i < o->n; i++)
        if (str_key(o, i) && o->k[i]->len == len && memcmp(o->k[i]->p, k, len) == 0) {
            memmove(o->k + i, o->k + i + 1, (o->n - i - 1) * sizeof *o->k);
            memmove(o->v + i, o->v + i + 1, (o->n - i - 1) * sizeof *o->v);
            if (o->kv) memmove(o->kv + i, o->kv + i + 1, (o->n - i - 1) * sizeof *o->kv);
            o->n--;
            return true;
        }
    return false;
}

const char *kj_typename(kj_val v) {
    static const char *names[] = {
        "UndefinedValue", "undefined", "NullValue", "BooleanValue", "IntegerValue",
        "FloatValue", "StringValue", "ArrayValue", "TupleValue", "ObjectValue",
        "KeywordArgumentsValue", "NamespaceValue", "FunctionValue",
    };
    return names[v.t];
}

bool kj_truthy(kj_ctx *c, const kj_node *n, kj_val v) {
    switch (v.t) {
    case V_JSUNDEF:
        kj_fail(c, n, "cannot read properties of undefined");
        return false;
    case V_UNDEF:
    case V_NULL: return false;
    case V_BOOL: return v.b;
    case V_INT:
    case V_FLOAT: return v.d != 0 && !isnan(v.d);
    case V_STR: return v.s->len > 0;
    case V_ARR:
    case V_TUPLE: return v.a->n > 0;
    case V_OBJ:
    case V_KWARGS: return v.o->n > 0;
    default: return true;
    }
}

/* ---- scopes ------------------------------------------------------------ */

static kj_env *env_new(kj_ctx *c, kj_env *parent) {
    kj_env *e = kj_alloc(c, sizeof *e);
    if (e) e->parent = parent;
    return e;
}

static bool env_set(kj_ctx *c, kj_env *e, const kj_str *name, kj_val v) {
    return kj_obj_set(c, &e->vars, name, v);
}

static kj_val env_get(const kj_env *e, const kj_str *name) {
    for (; e; e = e->parent) {
        kj_val *v = kj_obj_get(&e->vars, name->p, name->len);
        if (v) return v->t == V_JSUNDEF ? KJ_UNDEF : *v;
    }
    return KJ_UNDEF;
}

static kj_val mkfn(kj_ctx *c, kj_fkind kind) {
    kj_fn *f = kj_alloc(c, sizeof *f);
    if (!f) return KJ_UNDEF;
    f->kind = kind;
    return (kj_val){.t = V_FN, .f = f};
}

/* ---- statements -------------------------------------------------------- */

static int exec_list(kj_ctx *c, const kj_list *l, kj_env *e, kj_buf *out);

/* Renders a block into a string value (macro bodies, set blocks). */
static int capture(kj_ctx *c, const kj_list *l, kj_env *e, kj_val *outv) {
    kj_buf b = {0};
    int r = exec_list(c, l, e, &b);
    if (r != R_OK) {
        free(b.p);
        return r;
    }
    *outv = kj_buf_str(c, NULL, &b);
    return c->err ? R_ERR : R_OK;
}

static bool print_value(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *out) {
    if (v.t == V_JSUNDEF) {
        kj_fail(c, n, "cannot read properties of undefined");
        return false;
    }
    if (v.t == V_NULL || v.t == V_UNDEF) return true;
    if (v.t == V_STR) return kj_emit(c, n, out, v.s->p, v.s->len);
    kj_buf b = {0};
    bool ok = kj_display(c, n, v, &b, 0) && kj_emit(c, n, out, b.p ? b.p : "", b.n);
    free(b.p);
    return ok;
}

/* Binds a loop or set target (identifier or tuple of identifiers). */
static bool bind_target(kj_ctx *c, const kj_node *target, kj_val v, kj_env *e, bool in_set) {
    if (target->kind == KN_IDENT) return env_set(c, e, &target->str, v);
    if (target->kind != KN_TUPLE) {
        kj_fail(c, target, "invalid assignment target");
        return false;
    }
    if (!kj_is_arr(v)) { /* (a tuple unpacks too, as in Python) */
        kj_fail(c, target, "cannot unpack non-iterable type: %s", kj_typename(v));
        return false;
    }
    if ((size_t)target->list.n != v.a->n) {
        kj_fail(c, target, "too %s items to unpack", (size_t)target->list.n > v.a->n ? "few" : "many");
        return false;
    }
    for (int i = 0; i < target->list.n; i++) {
        const kj_node *id = target->list.v[i];
        if (id->kind != KN_IDENT) {
            kj_fail(c, id, "cannot unpack to a non-identifier");
            return false;
        }
        if (!env_set(c, e, &id->str, v.a->v[i])) return false;
    }
    return true;
}

static int exec_for(kj_ctx *c, const kj_node *n, kj_env *e, kj_buf *out) {
    kj_env *scope = env_new(c, e);
    if (!scope) return R_ERR;
    const kj_node *test = NULL;
    kj_val it;
    if (n->b->kind == KN_SELECT) {
        it = kj_eval(c, n->b->a, scope);
        test = n->b->b;
    } else {
        it = kj_eval(c, n->b, scope);
    }
    if (c->err) return R_ERR;
    if (kj_is_obj(it)) {
        kj_val keys = kj_mkarr(c, V_ARR, it.o->n);
        if (c->err) return R_ERR;
        for (size_t i = 0; i < it.o->n; i++) keys.a->v[i] = kj_obj_key(it.o, i);
        it = keys;
    } else if (!kj_is_arr(it)) {
        kj_fail(c, n->b, "expected an iterable or object in a for loop: got %s", kj_typename(it));
        return R_ERR;
    }
    size_t total = it.a->n, nitems = 0;
    kj_val *items = total ? kj_alloc(c, total * sizeof *items) : NULL;
    if (total && !items) return R_ERR;
    for (size_t i = 0; i < total; i++) {
        kj_val cur = it.a->v[i];
        if (n->a->kind == KN_TUPLE) {
            if (!kj_is_arr(cur)) { /* a tuple unpacks too (Python; @huggingface/jinja raises) */
                kj_fail(c, n->a, "cannot unpack non-iterable type: %s", kj_typename(cur));
                return R_ERR;
            }
            if ((size_t)n->a->list.n != cur.a->n) {
                kj_fail(c, n->a, "too %s items to unpack", (size_t)n->a->list.n > cur.a->n ? "few" : "many");
                return R_ERR;
            }
        }
        if (test) {
            if (!kj_step(c, n, 1)) return R_ERR;
            kj_env *ls = env_new(c, scope);
            if (!ls || !bind_target(c, n->a, cur, ls, false)) return R_ERR;
            kj_val tv = kj_eval(c, test, ls);
            bool keep = !c->err && kj_truthy(c, test, tv);
            if (c->err) return R_ERR;
            if (!keep) continue;
        }
        items[nitems++] = cur;
    }
    bool none = true;
    static const kj_str k_loop = {4, "loop"};
    for (size_t i = 0; i < nitems; i++) {
        if (!kj_step(c, n, 1)) return R_ERR;
        kj_obj *loop = kj_newobj(c);
        if (!loop) return R_ERR;
        kj_obj_setc(c, loop, "index", kj_num(V_INT, (double)(i + 1)));
        kj_obj_setc(c, loop, "index0", kj_num(V_INT, (double)i));
        kj_obj_setc(c, loop, "revindex", kj_num(V_INT, (double)(nitems - i)));
        kj_obj_setc(c, loop, "revindex0", kj_num(V_INT, (double)(nitems - i - 1)));
        kj_obj_setc(c, loop, "first", kj_bool(i == 0));
        kj_obj_setc(c, loop, "last", kj_bool(i == nitems - 1));
        kj_obj_setc(c, loop, "length", kj_num(V_INT, (double)nitems));
        kj_obj_setc(c, loop, "previtem", i > 0 ? items[i - 1] : KJ_UNDEF);
        kj_obj_setc(c, loop, "nextitem", i + 1 < nitems ? items[i + 1] : KJ_UNDEF);
        if (c->err || !env_set(c, scope, &k_loop, (kj_val){.t = V_OBJ, .o = loop})) return R_ERR;
        if (!bind_target(c, n->a, items[i], scope, false)) return R_ERR;
        size_t mark = out->n;
        int r = exec_list(c, &n->list, scope, out);
        if (r == R_ERR) return R_ERR;
        if (r != R_OK) {
            out->n = mark; /* the iteration's partial text is dropped */
            if (out->p) out->p[mark] = 0;
            if (r == R_BREAK) break;
            continue;
        }
        none = false;
    }
    if (none) return exec_list(c, &n->list2, scope, out);
    return R_OK;
}

static int exec_set(kj_ctx *c, const kj_node *n, kj_env *e) {
    kj_val rhs;
    if (n->b) {
        rhs = kj_eval(c, n->b, e);
        if (c->err) return R_ERR;
    } else {
        int r = capture(c, &n->list, e, &rhs);
        if (r != R_OK) return r;
    }
    const kj_node *t = n->a;
    if (t->kind == KN_IDENT || t->kind == KN_TUPLE) return bind_target(c, t, rhs, e, true) ? R_OK : R_ERR;
    if (t->kind == KN_MEMBER) {
        kj_val obj = kj_eval(c, t->a, e);
        if (c->err) return R_ERR;
        if (obj.t != V_NS) {
            kj_fail(c, t, "cannot assign an attribute of a non-namespace object");
            return R_ERR;
        }
        if (t->b->kind != KN_IDENT) {
            kj_fail(c, t, "cannot assign to a member with a non-identifier property");
            return R_ERR;
        }
        return kj_obj_set(c, obj.o, &t->b->str, rhs) ? R_OK : R_ERR;
    }
    kj_fail(c, t, "invalid left-hand side of an assignment");
    return R_ERR;
}

static kj_val call_fn(kj_ctx *c, const kj_node *at, kj_val fn, kj_val *args, size_t nargs, kj_env *e);

static int exec_callstmt(kj_ctx *c, const kj_node *n, kj_env *e, kj_buf *out) {
    kj_val caller = mkfn(c, F_CALLER);
    if (c->err) return R_ERR;
    caller.f->node = n;
    caller.f->env = e;
    kj_val *pos;
    size_t npos;
    kj_obj *kw;
    if (!kj_eval_args(c, &n->a->list, e, &pos, &npos, &kw)) return R_ERR;
    kj_val *args = kj_alloc(c, (npos + 1) * sizeof *args);
    if (!args) return R_ERR;
    if (npos) memcpy(args, pos, npos * sizeof *args);
    args[npos] = (kj_val){.t = V_KWARGS, .o = kw};
    kj_val fn = kj_eval(c, n->a->a, e);
    if (c->err) return R_ERR;
    if (fn.t != V_FN) {
        kj_fail(c, n, "cannot call something that is not a function: got %s", kj_typename(fn));
        return R_ERR;
    }
    kj_env *ne = env_new(c, e);
    static const kj_str k_caller = {6, "caller"};
    if (!ne || !env_set(c, ne, &k_caller, caller)) return R_ERR;
    kj_val v = call_fn(c, n, fn, args, npos + 1, ne);
    if (c->err) return R_ERR;
    return print_value(c, n, v, out) ? R_OK : R_ERR;
}

static int exec(kj_ctx *c, const kj_node *n, kj_env *e, kj_buf *out) {
    if (!kj_step(c, n, 1)) return R_ERR;
    switch (n->kind) {
    case KN_TEXT: return kj_emit(c, n, out, n->str.p, n->str.len) ? R_OK : R_ERR;
    case KN_COMMENT: return R_OK;
    case KN_IF: {
        kj_val t = kj_eval(c, n->a, e);
        bool yes = !c->err && kj_truthy(c, n->a, t);
        if (c->err) return R_ERR;
        return exec_list(c, yes ? &n->list : &n->list2, e, out);
    }
    case KN_FOR: return exec_for(c, n, e, out);
    case KN_BREAK: return R_BREAK;
    case KN_CONTINUE: return R_CONT;
    case KN_SET: return exec_set(c, n, e);
    case KN_MACRO: {
        kj_val f = mkfn(c, F_MACRO);
        if (c->err) return R_ERR;
        f.f->node = n;
        return env_set(c, e, &n->str, f) ? R_OK : R_ERR;
    }
    case KN_CALLSTMT: return exec_callstmt(c, n, e, out);
    case KN_FILTERSTMT: {
        kj_val body;
        int r = capture(c, &n->list, e, &body);
        if (r != R_OK) return r;
        kj_val v = kj_apply_filter(c, body, n->a, e, n);
        if (c->err) return R_ERR;
        return print_value(c, n, v, out) ? R_OK : R_ERR;
    }
    default: {
        kj_val v = kj_eval(c, n, e);
        if (c->err) return R_ERR;
        return print_value(c, n, v, out) ? R_OK : R_ERR;
    }
    }
}

static int exec_list(kj_ctx *c, const kj_list *l, kj_env *e, kj_buf *out) {
    for (int i = 0; i < l->n; i++) {
        int r = exec(c, l->v[i], e, out);
        if (r != R_OK) return r;
    }
    return R_OK;
}

/* ---- calls ------------------------------------------------------------- */

bool kj_eval_args(kj_ctx *c, const kj_list *args, kj_env *e, kj_val **pos, size_t *npos, kj_obj **kw) {
    *pos = NULL;
    *npos = 0;
    *kw = kj_newobj(c);
    if (!*kw) return false;
    size_t cap = 0;
    for (int i = 0; i < args->n; i++) {
        const kj_node *a = args->v[i];
        if (a->kind == KN_KWARG || a->kind == KN_KWSPREAD) continue;
        kj_val v = kj_eval(c, a->kind == KN_SPREAD ? a->a : a, e);
        if (c->err) return false;
        size_t add = 1;
        const kj_val *src = &v;
        if (a->kind == KN_SPREAD) {
            if (!kj_is_arr(v)) {
                kj_fail(c, a, "cannot unpack non-iterable type: %s", kj_typename(v));
                return false;
            }
            add = v.a->n;
            src = v.a->v;
        }
        if (*npos + add > cap) {
            size_t ncap = (*npos + add) * 2 + 4;
            kj_val *nv = kj_alloc(c, ncap * sizeof *nv);
            if (!nv) return false;
            if (*npos) memcpy(nv, *pos, *npos * sizeof *nv);
            *pos = nv;
            cap = ncap;
        }
        if (add) memcpy(*pos + *npos, src, add * sizeof *src);
        *npos += add;
    }
    for (int i = 0; i < args->n; i++) {
        const kj_node *a = args->v[i];
        if (a->kind == KN_KWARG) {
            kj_val v = kj_eval(c, a->a, e);
            if (c->err) return false;
            if (kj_obj_get(*kw, a->str.p, a->str.len)) {
                kj_fail(c, a, "got multiple values for keyword argument '%s'", a->str.p);
                return false;
            }
            if (!kj_obj_set(c, *kw, &a->str, v)) return false;
        } else if (a->kind == KN_KWSPREAD) {
            kj_val v = kj_eval(c, a->a, e);
            if (c->err) return false;
            if (!kj_is_obj(v)) {
                kj_fail(c, a, "argument after ** must be a mapping, not %s", kj_typename(v));
                return false;
            }
            for (size_t k = 0; k < v.o->n; k++) {
                if (kj_obj_key(v.o, k).t != V_STR) {
                    kj_fail(c, a, "keywords must be strings");
                    return false;
                }
                if (kj_obj_get(*kw, v.o->k[k]->p, v.o->k[k]->len)) {
                    kj_fail(c, a, "got multiple values for keyword argument '%s'", v.o->k[k]->p);
                    return false;
                }
                if (!kj_obj_set(c, *kw, v.o->k[k], v.o->v[k])) return false;
            }
        }
    }
    return true;
}

/* bindMacroArguments(): every parameter is bound (undefined if missing)
 * before any default is evaluated, so defaults see the macro's scope. */
static bool bind_params(kj_ctx *c, const kj_node *at, const char *name, const kj_list *params, uint8_t special,
                        kj_val *args, size_t nargs, kj_env *scope) {
    kj_obj *kw = kj_newobj(c);
    if (!kw) return false;
    if (nargs && args[nargs - 1].t == V_KWARGS) {
        const kj_obj *src = args[nargs - 1].o;
        for (size_t i = 0; i < src->n; i++)
            if (!kj_obj_set(c, kw, src->k[i], src->v[i])) return false;
        nargs--;
    }
    bool *pending = params->n ? kj_alloc(c, (size_t)params->n) : NULL;
    if (params->n && !pending) return false;
    for (int i = 0; i < params->n; i++) {
        const kj_node *p = params->v[i];
        bool have = (size_t)i < nargs && args[i].t != V_JSUNDEF;
        kj_val v = have ? args[i] : KJ_UNDEF;
        if (!have) {
            kj_val *kv = kj_obj_get(kw, p->str.p, p->str.len);
            if (kv) {
                v = *kv;
                have = kv->t != V_JSUNDEF;
                kj_obj_del(kw, p->str.p, p->str.len);
            }
        }
        pending[i] = !have && p->kind == KN_KWARG;
        if (!env_set(c, scope, &p->str, v.t == V_JSUNDEF ? KJ_UNDEF : v)) return false;
    }
    if (special & 1) {
        static const kj_str k = {6, "kwargs"};
        if (!env_set(c, scope, &k, (kj_val){.t = V_OBJ, .o = kw})) return false;
    } else if (kw->n > 0) {
        kj_fail(c, at, "macro %s takes no keyword argument '%s'", name, kw->k[0]->p);
        return false;
    }
    if (special & 2) {
        size_t extra = nargs > (size_t)params->n ? nargs - (size_t)params->n : 0;
        kj_val va = kj_mkarr(c, V_ARR, extra);
        if (c->err) return false;
        for (size_t i = 0; i < extra; i++) va.a->v[i] = args[(size_t)params->n + i];
        static const kj_str k = {7, "varargs"};
        if (!env_set(c, scope, &k, va)) return false;
    } else if (nargs > (size_t)params->n) {
        kj_fail(c, at, "macro %s takes not more than %d argument(s)", name, params->n);
        return false;
    }
    for (int i = 0; i < params->n; i++) {
        if (!pending[i]) continue;
        kj_val v = kj_eval(c, params->v[i]->a, scope);
        if (c->err || !env_set(c, scope, &params->v[i]->str, v)) return false;
    }
    return true;
}

static kj_val call_builtin(kj_ctx *c, const kj_node *at, const kj_fn *f, kj_val *args, size_t nargs);

static kj_val call_fn(kj_ctx *c, const kj_node *at, kj_val fn, kj_val *args, size_t nargs, kj_env *e) {
    const kj_fn *f = fn.f;
    if (f->kind != F_MACRO && f->kind != F_CALLER) return call_builtin(c, at, f, args, nargs);
    if (c->depth >= c->lim.max_depth) {
        fail_limit(c, at, "call depth");
        return KJ_UNDEF;
    }
    c->depth++;
    const kj_node *m = f->node;
    kj_env *scope = env_new(c, f->kind == F_MACRO ? e : f->env);
    char name[128];
    if (f->kind == F_MACRO) snprintf(name, sizeof name, "'%s'", m->str.p);
    else snprintf(name, sizeof name, "None");
    kj_val out = KJ_UNDEF;
    if (scope && bind_params(c, at, name, &m->list2, m->special, args, nargs, scope)) {
        int r = capture(c, &m->list, scope, &out);
        if (r == R_BREAK || r == R_CONT) kj_fail(c, at, "'%s' outside of a loop", r == R_BREAK ? "break" : "continue");
    }
    c->depth--;
    return c->err ? KJ_UNDEF : out;
}

/* ---- built-in functions ------------------------------------------------ */

static bool ns_entry(kj_ctx *c, const kj_node *at, kj_val pair, kj_obj *o) {
    kj_val k, v;
    if (kj_is_arr(pair) && pair.a->n == 2) {
        k = pair.a->v[0];
        v = pair.a->v[1];
    } else if (pair.t == V_STR && kj_utf16_len(pair.s->p, pair.s->len) == 2 &&
               kj_utf8_dec(pair.s->p, pair.s->len, 0, &(uint32_t){0}) < (int)pair.s->len) {
        int k1 = kj_utf8_dec(pair.s->p, pair.s->len, 0, &(uint32_t){0});
        k = kj_mkstr(c, pair.s->p, (size_t)k1);
        v = kj_mkstr(c, pair.s->p + k1, pair.s->len - (size_t)k1);
    } else {
        kj_fail(c, at, "namespace expected an object or an iterable of [key, value] pairs");
        return false;
    }
    if (k.t != V_STR) {
        kj_fail(c, at, "namespace keys must be strings");
        return false;
    }
    return kj_obj_set(c, o, k.s, v);
}

static const char *const MONTHS[] = {"January", "February", "March",     "April",   "May",      "June",
                                     "July",    "August",   "September", "October", "November", "December"};

static kj_val strftime_now(kj_ctx *c, const kj_node *at, kj_val fmt) {
    if (fmt.t != V_STR) return kj_fail(c, at, "strftime_now() expects a format string");
    struct tm tm;
    time_t now = c->lim.now >= 0 ? (time_t)c->lim.now : time(NULL);
    if (c->lim.now >= 0) gmtime_r(&now, &tm);
    else localtime_r(&now, &tm);
    kj_buf b = {0};
    const char *s = fmt.s->p;
    for (size_t i = 0; i < fmt.s->len; i++) {
        char tmp[32];
        if (s[i] == '%' && i + 1 < fmt.s->len && strchr("YmdbBHM%", s[i + 1]) && s[i + 1]) {
            switch (s[++i]) {
            case 'Y': snprintf(tmp, sizeof tmp, "%d", tm.tm_year + 1900); break;
            case 'm': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mon + 1); break;
            case 'd': snprintf(tmp, sizeof tmp, "%02d", tm.tm_mday); break;
            case 'b': snprintf(tmp, sizeof tmp, "%.3s", MONTHS[tm.tm_mon]); break;
            case 'B': snprintf(tmp, sizeof tmp, "%s", MONTHS[tm.tm_mon]); break;
            case 'H': snprintf(tmp, sizeof tmp, "%02d", tm.tm_hour); break;
            case 'M': snprintf(tmp, sizeof tmp, "%02d", tm.tm_min); break;
            default: snprintf(tmp, sizeof tmp, "%%"); break;
            }
            kj_emit(c, at, &b, tmp, strlen(tmp));
        } else {
            kj_emit(c, at, &b, s + i, 1);
        }
    }
    return kj_buf_str(c, at, &b);
}

static kj_val call_builtin(kj_ctx *c, const kj_node *at, const kj_fn *f, kj_val *args, size_t nargs) {
    switch (f->kind) {
    case F_METHOD: return kj_call_method(c, at, f, args, nargs);
    case F_RAISE: {
        kj_buf b = {0};
        if (nargs) kj_rawstr(c, at, args[0], &b, 0);
        if (!c->err) kj_fail(c, at, "raise_exception: %s", b.p ? b.p : "");
        free(b.p);
        return KJ_UNDEF;
    }
    case F_STRFTIME: return strftime_now(c, at, nargs ? args[0] : KJ_UNDEF);
    case F_RANGE: {
        double v[3] = {0, 0, 1};
        size_t n = 0;
        for (size_t i = 0; i < nargs && i < 3; i++) {
            if (!kj_is_num(args[i])) return kj_fail(c, at, "range() expects numbers, got %s", kj_typename(args[i]));
            v[i] = args[i].d;
            n++;
        }
        if (n == 0) return kj_fail(c, at, "range() expects at least one argument");
        double start = n == 1 ? 0 : v[0], stop = n == 1 ? v[0] : v[1], step = n == 3 ? v[2] : 1;
        if (step == 0) return kj_fail(c, at, "range() step must not be zero");
        double cnt = step > 0 ? ceil((stop - start) / step) : ceil((start - stop) / -step);
        if (!(cnt > 0)) cnt = 0;
        if (cnt > 1e8 || !kj_step(c, at, (uint64_t)cnt)) {
            fail_limit(c, at, "evaluation step");
            return KJ_UNDEF;
        }
        kj_val r = kj_mkarr(c, V_ARR, (size_t)cnt);
        if (c->err) return KJ_UNDEF;
        size_t k = 0;
        for (double x = start; k < r.a->n && (step > 0 ? x < stop : x > stop); x += step)
            r.a->v[k++] = kj_num(x == floor(x) && isfinite(x) ? V_INT : V_FLOAT, x);
        r.a->n = k;
        return r;
    }
    case F_NAMESPACE: {
        size_t np = nargs;
        const kj_obj *kw = NULL;
        if (np && args[np - 1].t == V_KWARGS) kw = args[--np].o;
        if (np > 1) return kj_fail(c, at, "namespace expected at most 1 argument, got %zu", np);
        kj_obj *o = kj_newobj(c);
        if (!o) return KJ_UNDEF;
        if (np == 1) {
            kj_val src = args[0];
            if (kj_is_obj(src)) {
                for (size_t i = 0; i < src.o->n; i++) {
                    if (kj_obj_key(src.o, i).t != V_STR) return kj_fail(c, at, "namespace keys must be strings");
                    if (!kj_obj_set(c, o, src.o->k[i], src.o->v[i])) return KJ_UNDEF;
                }
            } else if (kj_is_arr(src)) {
                for (size_t i = 0; i < src.a->n; i++)
                    if (!ns_entry(c, at, src.a->v[i], o)) return KJ_UNDEF;
            } else {
                return kj_fail(c, at, "'%s' object is not iterable", kj_typename(src));
            }
        }
        if (kw)
            for (size_t i = 0; i < kw->n; i++)
                if (!kj_obj_set(c, o, kw->k[i], kw->v[i])) return KJ_UNDEF;
        return (kj_val){.t = V_NS, .o = o};
    }
    default: return kj_fail(c, at, "internal error: bad function");
    }
}

/* ---- expressions ------------------------------------------------------- */

/* ToNumber(string) for JavaScript's loose equality. */
static double js_str_to_num(const kj_str *s) {
    size_t i = 0, n = s->len;
    int k;
    while (i < n) {
        uint32_t cp;
        k = kj_utf8_dec(s->p, n, i, &cp);
        if (!kj_js_space(cp)) break;
        i += (size_t)k;
    }
    while (n > i) {
        uint32_t cp;
        size_t j = n - 1;
        while (j > i && ((unsigned char)s->p[j] & 0xC0) == 0x80) j--;
        kj_utf8_dec(s->p, n, j, &cp);
        if (!kj_js_space(cp)) break;
        n = j;
    }
    if (i == n) return 0;
    char buf[400];
    size_t len = n - i;
    if (len >= sizeof buf) return NAN;
    memcpy(buf, s->p + i, len);
    buf[len] = 0;
    if (!strcmp(buf, "Infinity") || !strcmp(buf, "+Infinity")) return INFINITY;
    if (!strcmp(buf, "-Infinity")) return -INFINITY;
    if (len > 2 && buf[0] == '0' && strchr("xXoObB", buf[1])) {
        int base = (buf[1] == 'x' || buf[1] == 'X') ? 16 : (buf[1] == 'o' || buf[1] == 'O') ? 8 : 2;
        double v = 0;
        for (size_t j = 2; j < len; j++) {
            int d = buf[j] >= '0' && buf[j] <= '9' ? buf[j] - '0'
                  : buf[j] >= 'a' && buf[j] <= 'f' ? buf[j] - 'a' + 10
                  : buf[j] >= 'A' && buf[j] <= 'F' ? buf[j] - 'A' + 10 : 99;
            if (d >= base) return NAN;
            v = v * base + d;
        }
        return v;
    }
    for (size_t j = 0; j < len; j++)
        if (!strchr("0123456789+-.eE", buf[j])) return NAN;
    char *end;
    double v = strtod(buf, &end);
    return *end ? NAN : v;
}

/* JavaScript `left.value == right.value`. */
static bool loose_eq(kj_ctx *c, const kj_node *n, kj_val a, kj_val b) {
    if (a.t == V_UNDEF) a.t = V_NULL;
    if (b.t == V_UNDEF) b.t = V_NULL;
    if (a.t == V_NULL || b.t == V_NULL) return a.t == b.t;
    if (a.t == V_BOOL) a = kj_num(V_INT, a.b);
    if (b.t == V_BOOL) b = kj_num(V_INT, b.b);
    bool an = kj_is_num(a), bn = kj_is_num(b);
    if (an && bn) return a.d == b.d;
    if (a.t == V_STR && b.t == V_STR) return a.s->len == b.s->len && memcmp(a.s->p, b.s->p, a.s->len) == 0;
    if (an && b.t == V_STR) return a.d == js_str_to_num(b.s);
    if (a.t == V_STR && bn) return js_str_to_num(a.s) == b.d;
    bool ap = an || a.t == V_STR, bp = bn || b.t == V_STR;
    if (!ap && !bp) { /* objects: identity */
        if (kj_is_arr(a) && kj_is_arr(b)) return a.a == b.a;
        if (a.t == V_FN || b.t == V_FN) return a.t == b.t && a.f == b.f;
        if (!kj_is_arr(a) && !kj_is_arr(b)) return a.o == b.o;
        return false;
    }
    /* object vs primitive: compare the object's string form */
    kj_val obj = ap ? b : a, prim = ap ? a : b;
    kj_buf buf = {0};
    if (!kj_rawstr(c, n, obj, &buf, 0)) {
        free(buf.p);
        return false;
    }
    kj_str s = {buf.n, buf.p ? buf.p : ""};
    bool r = prim.t == V_STR ? (s.len == prim.s->len && memcmp(s.p, prim.s->p, s.len) == 0)
                             : js_str_to_num(&s) == prim.d;
    free(buf.p);
    return r;
}

static bool str_contains(const kj_str *hay, const kj_str *needle) {
    if (needle->len == 0) return true;
    if (needle->len > hay->len) return false;
    return memmem(hay->p, hay->len, needle->p, needle->len) != NULL;
}

static const char *op_name(kj_op op) {
    static const char *names[] = {"", "and", "or", "not", "==", "!=", "<", ">", "<=", ">=",
                                  "in", "not in", "+", "-", "~", "*", "/", "//", "%", "**"};
    return names[op];
}

static kj_val eval_binary(kj_ctx *c, const kj_node *n, kj_env *e) {
    kj_val l = kj_eval(c, n->a, e);
    if (c->err) return KJ_UNDEF;
    if (n->op == KO_AND || n->op == KO_OR) {
        bool t = kj_truthy(c, n->a, l);
        if (c->err) return KJ_UNDEF;
        if (n->op == KO_AND ? t : !t) return kj_eval(c, n->b, e);
        return l;
    }
    kj_val r = kj_eval(c, n->b, e);
    if (c->err) return KJ_UNDEF;
    if (l.t == V_JSUNDEF || r.t == V_JSUNDEF) return kj_fail(c, n, "cannot read properties of undefined");
    kj_op op = n->op;
    if (op == KO_EQ || op == KO_NE) {
        bool eq = loose_eq(c, n, l, r);
        return c->err ? KJ_UNDEF : kj_bool(op == KO_EQ ? eq : !eq);
    }
    if (l.t == V_UNDEF || r.t == V_UNDEF) {
        if (r.t == V_UNDEF && (op == KO_IN || op == KO_NOTIN)) return kj_bool(op == KO_NOTIN);
        return kj_fail(c, n, "cannot perform operation %s on undefined values", op_name(op));
    }
    if (l.t == V_NULL || r.t == V_NULL) return kj_fail(c, n, "cannot perform operation %s on null values", op_name(op));
    if (op == KO_CONCAT || (op == KO_ADD && (l.t == V_STR || r.t == V_STR) && !(kj_is_num(l) && kj_is_num(r)) &&
                            !(kj_is_arr(l) && kj_is_arr(r)) && !(kj_is_arr(r) && l.t != V_STR))) {
        kj_buf b = {0};
        bool ok = kj_rawstr(c, n, l, &b, 0) && kj_rawstr(c, n, r, &b, 0);
        if (!ok) {
            free(b.p);
            return KJ_UNDEF;
        }
        return kj_buf_str(c, n, &b);
    }
    bool lnum = kj_is_num(l) || l.t == V_BOOL, rnum = kj_is_num(r) || r.t == V_BOOL;
    if (op == KO_POW && lnum && rnum) {
        double a = l.t == V_BOOL ? l.b : l.d, b = r.t == V_BOOL ? r.b : r.d;
        if (a == 0 && b < 0) return kj_fail(c, n, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (isnan(b) || (isnan(a) && b != 0) || (fabs(a) == 1 && isinf(b))) res = NAN; /* JavaScript's ** */
        if (!isfinite(res)) return kj_fail(c, n, "exponentiation result is not a finite real number");
        bool fl = l.t == V_FLOAT || r.t == V_FLOAT || b < 0;
        return kj_num(fl ? V_FLOAT : V_INT, res);
    }
    if (kj_is_num(l) && kj_is_num(r)) {
        double a = l.d, b = r.d;
        kj_vtype ft = l.t == V_FLOAT || r.t == V_FLOAT ? V_FLOAT : V_INT;
        switch (op) {
        case KO_ADD: return kj_num(ft, a + b);
        case KO_SUB: return kj_num(ft, a - b);
        case KO_MUL: return kj_num(ft, a * b);
        case KO_DIV: return kj_num(V_FLOAT, a / b);
        case KO_FLOORDIV: return kj_num(ft, floor(a / b));
        case KO_MOD: return kj_num(ft, fmod(a, b));
        case KO_LT: return kj_bool(a < b);
        case KO_GT: return kj_bool(a > b);
        case KO_GE: return kj_bool(a >= b);
        case KO_LE: return kj_bool(a <= b);
        default: break;
        }
    } else if (kj_is_arr(l) && kj_is_arr(r)) {
        if (op == KO_ADD) {
            kj_val out = kj_mkarr(c, V_ARR, l.a->n + r.a->n);
            if (c->err) return KJ_UNDEF;
            if (l.a->n) memcpy(out.a->v, l.a->v, l.a->n * sizeof(kj_val));
            if (r.a->n) memcpy(out.a->v + l.a->n, r.a->v, r.a->n * sizeof(kj_val));
            return out;
        }
    } else if (kj_is_arr(r)) {
        if (op == KO_IN || op == KO_NOTIN) {
            bool found = false;
            for (size_t i = 0; i < r.a->n && !found; i++) found = kj_strict_eq(r.a->v[i], l);
            return kj_bool(op == KO_IN ? found : !found);
        }
    }
    if (l.t == V_STR && r.t == V_STR && (op == KO_IN || op == KO_NOTIN)) {
        bool has = str_contains(r.s, l.s);
        return kj_bool(op == KO_IN ? has : !has);
    }
    if (kj_hashable(l) && kj_is_obj(r) && (op == KO_IN || op == KO_NOTIN)) {
        bool has = kj_obj_getv(r.o, l) != NULL;
        return kj_bool(op == KO_IN ? has : !has);
    }
    return kj_fail(c, n, "unknown operator \"%s\" between %s and %s", op_name(op), kj_typename(l), kj_typename(r));
}

static kj_val eval_member(kj_ctx *c, const kj_node *n, kj_env *e) {
    kj_val obj = kj_eval(c, n->a, e);
    if (c->err) return KJ_UNDEF;
    kj_val prop;
    if (n->computed) {
        if (n->b->kind == KN_SLICE) {
            const kj_node *s = n->b;
            kj_val a = s->a ? kj_eval(c, s->a, e) : KJ_UNDEF;
            kj_val b = !c->err && s->b ? kj_eval(c, s->b, e) : KJ_UNDEF;
            kj_val st = !c->err && s->c ? kj_eval(c, s->c, e) : KJ_UNDEF;
            if (c->err) return KJ_UNDEF;
            return kj_slice(c, n, obj, a, b, st);
        }
        prop = kj_eval(c, n->b, e);
        if (c->err) return KJ_UNDEF;
    } else if (n->b->kind == KN_INT) {
        prop = kj_num(V_INT, n->b->num);
    } else {
        prop = (kj_val){.t = V_STR, .s = &n->b->str};
    }
    if (obj.t == V_JSUNDEF) return kj_fail(c, n, "cannot read properties of undefined");
    kj_val v = KJ_UNDEF;
    if ((kj_is_obj(obj) || obj.t == V_NS) && prop.t == V_UNDEF) {
        /* (Jinja2: an undefined key is hashable and no key: Command R+'s
         * basic_type_map[json_spec.type] of a property without "type") */
    } else if (kj_is_obj(obj) || obj.t == V_NS) {
        if (!kj_hashable(prop)) return kj_fail(c, n, "unhashable object key: %s", kj_typename(prop));
        kj_val *p = obj.t == V_NS ? (prop.t == V_STR ? kj_obj_get(obj.o, prop.s->p, prop.s->len) : NULL) : kj_obj_getv(obj.o, prop);
        if (p) v = *p;
        else if (kj_is_obj(obj) && prop.t == V_STR) v = kj_builtin_attr(c, obj, prop.s);
    } else if (kj_is_arr(obj) || obj.t == V_STR) {
        if (prop.t == V_INT) {
            if (kj_is_arr(obj)) {
                double i = prop.d < 0 ? prop.d + (double)obj.a->n : prop.d;
                if (i >= 0 && i < (double)obj.a->n) v = obj.a->v[(size_t)i];
            } else {
                /* String.prototype.at: UTF-16 code units; half a surrogate
                 * pair prints as U+FFFD */
                double len = (double)kj_utf16_len(obj.s->p, obj.s->len);
                double i = prop.d < 0 ? prop.d + len : prop.d;
                if (i >= 0 && i < len) {
                    size_t unit = 0, k = 0;
                    while (k < obj.s->len) {
                        uint32_t cp;
                        int step = kj_utf8_dec(obj.s->p, obj.s->len, k, &cp);
                        size_t w = cp >= 0x10000 ? 2 : 1;
                        if ((double)(unit + w) > i) {
                            if (w == 2) v = kj_mkstr(c, "\xEF\xBF\xBD", 3);
                            else v = kj_mkstr(c, obj.s->p + k, (size_t)step);
                            break;
                        }
                        unit += w;
                        k += (size_t)step;
                    }
                }
            }
        } else if (prop.t == V_STR) {
            v = kj_builtin_attr(c, obj, prop.s);
        } else {
            return kj_fail(c, n, "cannot access a property with a non-string/non-number: got %s", kj_typename(prop));
        }
    } else {
        if (prop.t != V_STR) return kj_fail(c, n, "cannot access a property with a non-string: got %s", kj_typename(prop));
        v = KJ_UNDEF;
    }
    return v.t == V_JSUNDEF ? KJ_UNDEF : v;
}

static kj_val eval_call(kj_ctx *c, const kj_node *n, kj_env *e) {
    kj_val *pos;
    size_t npos;
    kj_obj *kw;
    if (!kj_eval_args(c, &n->list, e, &pos, &npos, &kw)) return KJ_UNDEF;
    if (kw->n > 0) {
        kj_val *np = kj_alloc(c, (npos + 1) * sizeof *np);
        if (!np) return KJ_UNDEF;
        if (npos) memcpy(np, pos, npos * sizeof *np);
        np[npos++] = (kj_val){.t = V_KWARGS, .o = kw};
        pos = np;
    }
    kj_val fn = kj_eval(c, n->a, e);
    if (c->err) return KJ_UNDEF;
    if (fn.t != V_FN) return kj_fail(c, n, "cannot call something that is not a function: got %s", kj_typename(fn));
    return call_fn(c, n, fn, pos, npos, e);
}

kj_val kj_eval(kj_ctx *c, const kj_node *n, kj_env *e) {
    if (!n) return KJ_UNDEF;
    if (!kj_step(c, n, 1)) return KJ_UNDEF;
    switch (n->kind) {
    case KN_INT: return kj_num(V_INT, n->num);
    case KN_FLOAT: return kj_num(V_FLOAT, n->num);
    case KN_STR:
    case KN_TEXT: return (kj_val){.t = V_STR, .s = &n->str};
    case KN_ARRAY:
    case KN_TUPLE: {
        kj_val a = kj_mkarr(c, n->kind == KN_ARRAY ? V_ARR : V_TUPLE, (size_t)n->list.n);
        for (int i = 0; i < n->list.n && !c->err; i++) a.a->v[i] = kj_eval(c, n->list.v[i], e);
        return c->err ? KJ_UNDEF : a;
    }
    case KN_OBJECT: {
        kj_obj *o = kj_newobj(c);
        for (int i = 0; o && i < n->list.n && !c->err; i++) {
            kj_val k = kj_eval(c, n->list.v[i], e);
            if (c->err) break;
            if (!kj_hashable(k)) return kj_fail(c, n->list.v[i], "unhashable object key: %s", kj_typename(k));
            kj_val v = kj_eval(c, n->list2.v[i], e);
            if (c->err || !kj_obj_setv(c, o, k, v)) break;
        }
        return c->err ? KJ_UNDEF : (kj_val){.t = V_OBJ, .o = o};
    }
    case KN_IDENT: return env_get(e, &n->str);
    case KN_CALL: return eval_call(c, n, e);
    case KN_MEMBER: return eval_member(c, n, e);
    case KN_UNARY: {
        kj_val v = kj_eval(c, n->a, e);
        if (c->err) return KJ_UNDEF;
        if (n->op == KO_NOT) {
            bool t = kj_truthy(c, n->a, v);
            return c->err ? KJ_UNDEF : kj_bool(!t);
        }
        double sign = n->op == KO_SUB ? -1 : 1;
        if (kj_is_num(v)) return kj_num(v.t, sign * v.d);
        if (v.t == V_BOOL) return kj_num(V_INT, sign * (v.b ? 1 : 0));
        return kj_fail(c, n, "unknown operator \"%s\" for %s", n->op == KO_SUB ? "-" : "+", kj_typename(v));
    }
    case KN_BINARY: return eval_binary(c, n, e);
    case KN_FILTER: {
        kj_val v = kj_eval(c, n->a, e);
        if (c->err) return KJ_UNDEF;
        return kj_apply_filter(c, v, n->b, e, n);
    }
    case KN_TEST: {
        kj_val v = kj_eval(c, n->a, e);
        if (c->err) return KJ_UNDEF;
        bool r;
        if (!kj_run_test(c, n, n->str.p, v, NULL, &r)) return KJ_UNDEF;
        return kj_bool(n->negate ? !r : r);
    }
    case KN_SELECT: {
        kj_val t = kj_eval(c, n->b, e);
        bool yes = !c->err && kj_truthy(c, n->b, t);
        if (c->err || !yes) return KJ_UNDEF;
        return kj_eval(c, n->a, e);
    }
    case KN_TERNARY: {
        kj_val t = kj_eval(c, n->a, e);
        bool yes = !c->err && kj_truthy(c, n->a, t);
        if (c->err) return KJ_UNDEF;
        return kj_eval(c, yes ? n->b : n->c, e);
    }
    default: return kj_fail(c, n, "unexpected %s here", n->kind == KN_KWARG ? "keyword argument" : "expression");
    }
}

/* ---- template variables from JSON -------------------------------------- */

/* A string made valid UTF-8 (invalid bytes become U+FFFD, as when node
 * reads the file). Borrowed from the cJSON tree when already valid. */
static kj_val json_str(kj_ctx *c, const char *s) {
    size_t len = strlen(s);
    bool valid = true;
    for (size_t i = 0; i < len && valid;) {
        uint32_t cp;
        int k = kj_utf8_dec(s, len, i, &cp);
        if (cp == 0xFFFD && !(k == 3 && memcmp(s + i, "\xEF\xBF\xBD", 3) == 0)) valid = false;
        i += (size_t)k;
    }
    if (valid) {
        kj_str *st = kj_alloc(c, sizeof *st);
        if (!st) return KJ_UNDEF;
        st->len = len;
        st->p = s;
        return (kj_val){.t = V_STR, .s = st};
    }
    kj_buf b = {0};
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)kj_utf8_dec(s, len, i, &cp);
        char u[4];
        kj_emit(c, NULL, &b, u, (size_t)kj_utf8_enc(cp, u));
    }
    return kj_buf_str(c, NULL, &b);
}

/* JavaScript orders integer-like keys ("0", "17") first, ascending. */
static bool array_index_key(const char *k, double *out) {
    size_t n = strlen(k);
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0')) return false;
    double v = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return false;
        v = v * 10 + (k[i] - '0');
    }
    if (v >= 4294967295.0) return false;
    *out = v;
    return true;
}

static kj_val from_json(kj_ctx *c, const cJSON *j, int depth) {
    if (depth > KJ_MAX_VALUE_DEPTH) return kj_fail(c, NULL, "JSON input nested too deeply");
    if (cJSON_IsNull(j)) return KJ_NULLV;
    if (cJSON_IsBool(j)) return kj_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        return kj_num(isfinite(d) && d == floor(d) ? V_INT : V_FLOAT, d);
    }
    if (cJSON_IsString(j)) return json_str(c, j->valuestring ? j->valuestring : "");
    if (cJSON_IsArray(j)) {
        kj_val a = kj_mkarr(c, V_ARR, (size_t)cJSON_GetArraySize(j));
        if (c->err) return KJ_UNDEF;
        size_t i = 0;
        for (const cJSON *x = j->child; x && !c->err && i < a.a->n; x = x->next)
            a.a->v[i++] = from_json(c, x, depth + 1);
        return c->err ? KJ_UNDEF : a;
    }
    if (cJSON_IsObject(j)) {
        kj_obj *o = kj_newobj(c);
        if (!o) return KJ_UNDEF;
        /* integer-like keys first, ascending, then the rest in order */
        size_t nidx = 0;
        for (const cJSON *x = j->child; x; x = x->next) {
            double d;
            if (x->string && array_index_key(x->string, &d)) nidx++;
        }
        double last = -1;
        for (size_t round = 0; round < nidx; round++) {
            const cJSON *best = NULL;
            double bv = 0;
            for (const cJSON *x = j->child; x; x = x->next) {
                double d;
                if (x->string && array_index_key(x->string, &d) && d > last && (!best || d < bv)) best = x, bv = d;
            }
            if (!best) break;
            last = bv;
            const cJSON *val = best;
            for (const cJSON *x = best->next; x; x = x->next) /* duplicates: last wins */
                if (x->string && !strcmp(x->string, best->string)) val = x;
            kj_val v = from_json(c, val, depth + 1);
            if (c->err || !kj_obj_set(c, o, json_str(c, best->string).s, v)) return KJ_UNDEF;
        }
        for (const cJSON *x = j->child; x; x = x->next) {
            double d;
            const char *k = x->string ? x->string : "";
            if (array_index_key(k, &d)) continue;
            kj_val key = json_str(c, k);
            if (c->err) return KJ_UNDEF;
            kj_val v = from_json(c, x, depth + 1);
            if (c->err || !kj_obj_set(c, o, key.s, v)) return KJ_UNDEF;
        }
        return (kj_val){.t = V_OBJ, .o = o};
    }
    return KJ_NULLV;
}

/* ---- entry points ------------------------------------------------------- */

kjin_limits kjin_limits_default(void) {
    return (kjin_limits){
        .max_output = 16u << 20,
        .max_memory = 512u << 20,
        .max_steps = 50000000,
        .max_depth = 200,
        .now = -1,
    };
}

static bool bad_utf8(const char *s, size_t len) {
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = kj_utf8_dec(s, len, i, &cp);
        if (cp == 0xFFFD && !(k == 3 && memcmp(s + i, "\xEF\xBF\xBD", 3) == 0)) return true;
        i += (size_t)k;
    }
    return false;
}

kiln_status kjin_parse(const char *src, size_t len, kjin_template **out) {
    *out = NULL;
    kjin_template *t = calloc(1, sizeof *t);
    if (!t || !(t->a = ku_arena_create())) {
        free(t);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    kj_buf clean = {0};
    if (bad_utf8(src, len)) { /* node decodes the file with U+FFFD */
        for (size_t i = 0; i < len;) {
            uint32_t cp;
            i += (size_t)kj_utf8_dec(src, len, i, &cp);
            char u[4];
            kj_buf_put(&clean, u, (size_t)kj_utf8_enc(cp, u));
        }
        if (clean.oom) {
            free(clean.p);
            kjin_free(t);
            return kiln_error(KILN_ENOMEM, "out of memory");
        }
        src = clean.p;
        len = clean.n;
    }
    kj_toks toks;
    kiln_status st = kj_lex(t->a, src, len, &toks);
    free(clean.p);
    if (!st) st = kj_parse_tokens(t->a, &toks, &t->prog);
    if (st) {
        kjin_free(t);
        return st;
    }
    t->lines = toks.lines;
    t->nlines = toks.nlines;
    *out = t;
    return NULL;
}

void kjin_free(kjin_template *t) {
    if (!t) return;
    ku_arena_destroy(t->a);
    free(t);
}

kiln_status kjin_render(const kjin_template *t, const cJSON *vars, const kjin_limits *lim, char **out,
                        size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    kj_ctx c = {.t = t, .lim = lim ? *lim : kjin_limits_default()};
    c.a = ku_arena_create();
    if (!c.a) return kiln_error(KILN_ENOMEM, "out of memory");
    kj_env *g = env_new(&c, NULL);
    static const struct {
        const char *name;
        int kind; /* -1 true, -2 false, -3 none, else a kj_fkind */
    } globals[] = {
        {"namespace", F_NAMESPACE}, {"false", -2},        {"true", -1},
        {"none", -3},               {"raise_exception", F_RAISE}, {"range", F_RANGE},
        {"strftime_now", F_STRFTIME}, {"True", -1},       {"False", -2},
        {"None", -3},
    };
    for (size_t i = 0; g && i < sizeof globals / sizeof globals[0] && !c.err; i++) {
        int k = globals[i].kind;
        kj_val v = k == -1 ? kj_bool(true) : k == -2 ? kj_bool(false) : k == -3 ? KJ_NULLV : mkfn(&c, (kj_fkind)k);
        kj_obj_setc(&c, &g->vars, globals[i].name, v);
    }
    if (vars && !c.err) {
        if (!cJSON_IsObject(vars)) {
            kj_fail(&c, NULL, "template variables must be a JSON object");
        } else {
            for (const cJSON *x = vars->child; x && !c.err; x = x->next) {
                const char *k = x->string ? x->string : "";
                if (kj_obj_get(&g->vars, k, strlen(k))) {
                    kj_fail(&c, NULL, "variable already declared: %s", k);
                    break;
                }
                kj_val key = json_str(&c, k);
                kj_val v = from_json(&c, x, 0);
                if (!c.err) kj_obj_set(&c, &g->vars, key.s, v);
            }
        }
    }
    kj_buf b = {0};
    if (!c.err) {
        int r = exec_list(&c, &t->prog, g, &b);
        if (r == R_BREAK || r == R_CONT) kj_fail(&c, NULL, "'%s' outside of a loop", r == R_BREAK ? "break" : "continue");
    }
    ku_arena_destroy(c.a);
    if (c.err) {
        free(b.p);
        return c.err;
    }
    if (!b.p && !kj_buf_put(&b, "", 0)) return kiln_error(KILN_ENOMEM, "out of memory");
    *out = b.p;
    if (out_len) *out_len = b.n;
    return NULL;
}
