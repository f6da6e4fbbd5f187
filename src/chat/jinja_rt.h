/* jinja_rt.h: the interpreter's context and helpers shared by
 * jinja_eval.c (statements, expressions, calls) and jinja_builtins.c
 * (filters, tests, methods, JSON). Internal. */
#ifndef KILN_JINJA_RT_H
#define KILN_JINJA_RT_H

#include "chat/jinja_value.h"

struct kjin_template {
    ku_arena *a;
    kj_list prog;
    const uint32_t *lines;
    size_t nlines;
};

/* A scope: a JavaScript Map of variables plus its parent. */
typedef struct kj_env kj_env;
struct kj_env {
    kj_env *parent;
    kj_obj vars;
};

typedef enum {
    F_NAMESPACE, F_RAISE, F_RANGE, F_STRFTIME, F_METHOD, F_MACRO, F_CALLER,
} kj_fkind;

typedef enum {
    M_UPPER, M_LOWER, M_STRIP, M_TITLE, M_CAPITALIZE, M_RSTRIP, M_LSTRIP,
    M_STARTSWITH, M_ENDSWITH, M_SPLIT, M_REPLACE, M_FORMAT, /* strings */
    M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DICTSORT,  /* objects */
} kj_method;

struct kj_fn {
    kj_fkind kind;
    kj_method method;
    kj_val self;         /* F_METHOD: the bound string or object */
    const kj_node *node; /* F_MACRO: the macro; F_CALLER: the call block */
    kj_env *env;         /* F_CALLER: where the call block stands */
};

typedef struct {
    ku_arena *a;
    const kjin_template *t;
    kjin_limits lim;
    uint64_t steps;
    int depth;
    kiln_status err;
} kj_ctx;

#define KJ_UNDEF ((kj_val){.t = V_UNDEF})
#define KJ_NULLV ((kj_val){.t = V_NULL})
#define KJ_MAX_VALUE_DEPTH 512

/* Records the first error (at node n's position) and returns undefined. */
kj_val kj_fail(kj_ctx *c, const kj_node *n, const char *fmt, ...) KILN_PRINTF(3, 4);
/* Arena allocation within the memory limit (NULL and an error past it). */
void *kj_alloc(kj_ctx *c, size_t n);
bool kj_step(kj_ctx *c, const kj_node *n, uint64_t k);

kj_val kj_bool(bool b);
kj_val kj_num(kj_vtype t, double d);
kj_val kj_mkstr(kj_ctx *c, const char *p, size_t n);
/* Moves the buffer's bytes into a string value and frees the buffer. */
kj_val kj_buf_str(kj_ctx *c, const kj_node *n, kj_buf *b);
kj_val kj_mkarr(kj_ctx *c, kj_vtype t, size_t n); /* n undefined slots */
kj_obj *kj_newobj(kj_ctx *c);
bool kj_obj_set(kj_ctx *c, kj_obj *o, const kj_str *k, kj_val v);
bool kj_obj_setc(kj_ctx *c, kj_obj *o, const char *k, kj_val v);
/* String keys only; kj_obj_getv/setv take a key of any hashable type. */
kj_val *kj_obj_get(const kj_obj *o, const char *k, size_t len);
kj_val *kj_obj_getv(const kj_obj *o, kj_val key);
bool kj_obj_setv(kj_ctx *c, kj_obj *o, kj_val key, kj_val v);
/* The i-th key as a value (a string unless a non-string key was set). */
kj_val kj_obj_key(const kj_obj *o, size_t i);
static inline bool kj_hashable(kj_val v) {
    return v.t == V_STR || v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL || v.t == V_NULL;
}
bool kj_obj_del(kj_obj *o, const char *k, size_t len);
const char *kj_typename(kj_val v);
static inline bool kj_is_arr(kj_val v) { return v.t == V_ARR || v.t == V_TUPLE; }
static inline bool kj_is_obj(kj_val v) { return v.t == V_OBJ || v.t == V_KWARGS; }
static inline bool kj_is_num(kj_val v) { return v.t == V_INT || v.t == V_FLOAT; }

/* __bool__(); false plus an error for a bare undefined. */
bool kj_truthy(kj_ctx *c, const kj_node *n, kj_val v);
/* RuntimeValue.toString(): what {{ v }} prints. */
bool kj_display(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth);
/* String(v.value): what `~` and join use (null/undefined print empty). */
bool kj_rawstr(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth);

typedef struct {
    int indent; /* 0: none */
    bool ensure_ascii, sort_keys;
    const kj_str *item_sep, *key_sep; /* NULL: defaults */
} kj_json_opts;
bool kj_tojson(kj_ctx *c, const kj_node *n, kj_val v, const kj_json_opts *o, int depth,
               bool undef_null, kj_buf *b);

/* Output append within max_output. */
bool kj_emit(kj_ctx *c, const kj_node *n, kj_buf *b, const char *p, size_t len);

kj_val kj_eval(kj_ctx *c, const kj_node *n, kj_env *e);
/* Positional values (spreads expanded) and keyword arguments of a call. */
bool kj_eval_args(kj_ctx *c, const kj_list *args, kj_env *e, kj_val **pos, size_t *npos, kj_obj **kw);
kj_val kj_apply_filter(kj_ctx *c, kj_val v, const kj_node *f, kj_env *e, const kj_node *at);
bool kj_run_test(kj_ctx *c, const kj_node *at, const char *name, kj_val v, const kj_val *arg, bool *out);
kj_val kj_call_method(kj_ctx *c, const kj_node *at, const kj_fn *f, kj_val *args, size_t nargs);
kj_val kj_builtin_attr(kj_ctx *c, kj_val obj, const kj_str *name);
/* compareRuntimeValues(); false plus an error when incomparable. */
bool kj_compare(kj_ctx *c, const kj_node *n, kj_val a, kj_val b, bool case_sensitive, int *out);
/* getAttributeValue(item, "a.b.0") */
kj_val kj_attr_path(kj_val item, const kj_str *path);
/* JavaScript strict equality of the .value fields (for `in`, unique). */
bool kj_strict_eq(kj_val a, kj_val b);
/* repr(v) as Python writes it (str() of a list or dict writes its items so) */
bool kj_py_repr(kj_ctx *c, const kj_node *n, kj_val v, kj_buf *b, int depth);
/* jinja_pyfmt.c: Python's str.format of s; the min / max filters
 * (pos: case_sensitive, attribute; kw the same by name) */
kj_val kj_str_format(kj_ctx *c, const kj_node *at, const kj_str *s, const kj_val *args, size_t nargs, const kj_obj *kw);
kj_val kj_min_max(kj_ctx *c, const kj_node *at, kj_val v, const kj_val *pos, size_t npos, const kj_obj *kw, bool max);
kj_val kj_slice(kj_ctx *c, const kj_node *n, kj_val obj, kj_val start, kj_val stop, kj_val step);

#endif
