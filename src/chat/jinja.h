/* jinja.h: a Jinja2 subset for chat templates (prefix kjin_).
 *
 * The semantics are those of the npm package @huggingface/jinja 0.5.11 (the
 * renderer transformers.js uses, which mirrors transformers' Python Jinja
 * environment with trim_blocks and lstrip_blocks): undefined renders empty,
 * `true` prints "true", numbers print as JavaScript prints them, `tojson`
 * uses ", " and ": " separators. Where that package raises, kiln raises too,
 * except where Python's jinja2 (what transformers renders with: the reference
 * for chat templates, whose output the models were trained on) renders:
 *  - an undefined value given to a filter that stringifies its input (trim,
 *    upper, lower, title, capitalize, replace, string; and length) is "", as
 *    Python's Undefined stringifies to "" (indent still raises, as there);
 *  - dict keys may be any hashable scalar (string, integer, float, boolean,
 *    none); d[1] and d['1'] are different keys, d[1], d[1.0] and d[true] the
 *    same one; keys iterate (for, items, dictsort) as their values and print
 *    (tojson, {{ d }}) as json.dumps writes them ({"1": 2});
 *  - none, a list or a dict given to those string filters (none|trim,
 *    list|trim, dict|string, dict|upper) is Python's str() of it: "None",
 *    "['a', 'b']", "{'k': 'v'}" (items as repr writes them: quotes, escapes,
 *    True / None, float reprs); a list's |string stays the package's (JSON);
 *  - none|selectattr (rejectattr, select, reject, map) is empty, and a
 *    tuple unpacks in a for loop (`for a, b in [("x", 1)]`).
 * tests/data/chat/expected_python/ and jinja_test.c's PYTHON_DIFFERS list
 * those cases. One known difference stays: `+` of a string and a list or
 * dict concatenates (as @huggingface/jinja does, and many templates rely on
 * it for content parts), where Python raises.
 *
 * A parsed template is immutable: render it from many threads at once.
 * Rendering is bounded (output bytes, memory, evaluation steps, call depth):
 * a runaway template fails with KILN_ELIMIT instead of hanging.
 * Errors name the line and column of the template at fault. */
#ifndef KILN_JINJA_H
#define KILN_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct kjin_template kjin_template;

/* Parses len bytes of template text (need not be NUL-terminated). */
kiln_status kjin_parse(const char *src, size_t len, kjin_template **out);
void kjin_free(kjin_template *t);

typedef struct {
    size_t max_output;  /* bytes of rendered text */
    size_t max_memory;  /* bytes of values built while rendering */
    uint64_t max_steps; /* expression and statement evaluations */
    int max_depth;      /* nested macro calls and evaluation depth */
    int64_t now;        /* strftime_now's clock, Unix seconds UTC; < 0: the real clock */
} kjin_limits;

/* 16 MiB output, 512 MiB memory, 50M steps, depth 200, the real clock. */
kjin_limits kjin_limits_default(void);

/* Renders t with the members of vars (a cJSON object, borrowed; NULL for
 * none) as template variables; names of the built-in globals (true, range,
 * namespace, ...) are an error, as in @huggingface/jinja. lim NULL means
 * the defaults. *out is malloc'ed and NUL-terminated; *out_len (optional)
 * excludes the NUL. */
kiln_status kjin_render(const kjin_template *t, const cJSON *vars, const kjin_limits *lim,
                        char **out, size_t *out_len);

#endif
