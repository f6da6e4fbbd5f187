/* jinja_value.h: runtime values of the interpreter (internal).
 *
 * Values are small tagged unions; everything they point to lives in the
 * render's arena and dies with it. Types mirror @huggingface/jinja's
 * runtime classes; V_JSUNDEF stands for a bare JavaScript `undefined`
 * (e.g. `[]|first`), which errors where the original would throw. */
#ifndef KILN_JINJA_VALUE_H
#define KILN_JINJA_VALUE_H

#include "chat/jinja_int.h"

typedef enum {
    V_UNDEF, V_JSUNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARR, V_TUPLE,
    V_OBJ, V_KWARGS, V_NS, V_FN,
} kj_vtype;

typedef struct kj_arr kj_arr;
typedef struct kj_obj kj_obj;
typedef struct kj_fn kj_fn;

typedef struct {
    kj_vtype t;
    union {
        bool b;
        double d; /* V_INT too: JavaScript numbers are doubles */
        const kj_str *s;
        kj_arr *a;
        kj_obj *o;
        kj_fn *f;
    };
} kj_val;

struct kj_arr {
    size_t n;
    kj_val *v;
};

/* An insertion-ordered map, as a JavaScript Map. Keys are any hashable
 * scalar, as in Python: strings, integers, floats, booleans, none. k holds
 * each key's text (what tojson writes: 1 -> "1", true -> "true"); kv, NULL
 * while every key is a string, holds each key as its value, so that d[1]
 * and d['1'] are different keys (and d[1], d[1.0], d[true] the same). */
struct kj_obj {
    size_t n, cap;
    const kj_str **k;
    kj_val *kv;
    kj_val *v;
};

#endif
