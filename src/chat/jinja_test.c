/* jinja_test.c: the engine's pieces (expressions, filters, tests, loops,
 * whitespace control, macros, namespaces, errors) against @huggingface/jinja
 * (tests/data/chat/snippets*.json, made by tools/jinja_oracle.mjs), plus
 * error positions, limits and concurrent rendering. */
#include <dirent.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "chat/jinja.h"
#include "kt.h"

static kiln_status render(const char *src, const char *ctx_json, const kjin_limits *lim, char **out) {
    kjin_template *t;
    *out = NULL;
    KILN_TRY(kjin_parse(src, strlen(src), &t));
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    kiln_status st = kjin_render(t, ctx, lim, out, NULL);
    cJSON_Delete(ctx);
    kjin_free(t);
    return st;
}

/* Snippets where kiln follows Python's jinja2 (transformers' renderer, the
 * reference for chat templates) instead of @huggingface/jinja, with why. */
static const struct {
    const char *src, *out, *why;
} PYTHON_DIFFERS[] = {
    {"{{ d[0] }}", "", "dict keys may be any hashable: d has no key 0, so undefined (the package refuses non-string keys)"},
    {"{{ {1: 2} }}", "{\"1\": 2}", "dict keys may be any hashable (the package refuses non-string keys); printed as kiln prints dicts"},
    {"{{ x|string }}", "", "Undefined stringifies to \"\" (the package raises for string filters of undefined)"},
    {"{{ d|upper }}", "{'B': 2, 'A': 1, 'C': {'X': [1, 2.5, 'S', NONE, TRUE]}}",
     "string filters of a dict take Python's str() of it (the package has no ObjectValue upper)"},
};

KT_TEST(jinja_snippets_match_reference) {
    char p[4096];
    cJSON *cases = NULL, *exp = NULL;
    KT_CHECK_OK(ku_json_load(kt_path(p, sizeof p, "tests/data/chat/snippets.json"), &cases));
    KT_CHECK_OK(ku_json_load(kt_path(p, sizeof p, "tests/data/chat/snippets_expected.json"), &exp));
    int n = cJSON_GetArraySize(cases), match = 0, shown = 0, python = 0;
    KT_CHECK_EQ(n, cJSON_GetArraySize(exp));
    kjin_limits lim = kjin_limits_default();
    lim.now = 1752582896;
    for (int i = 0; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i), *e = cJSON_GetArrayItem(exp, i);
        const char *src = cJSON_GetObjectItemCaseSensitive(c, "t")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(e, "out");
        const char *want_s = want ? want->valuestring : NULL;
        for (size_t k = 0; k < sizeof PYTHON_DIFFERS / sizeof PYTHON_DIFFERS[0]; k++)
            if (!strcmp(src, PYTHON_DIFFERS[k].src)) want_s = PYTHON_DIFFERS[k].out, python++;
        kjin_template *t = NULL;
        char *got = NULL;
        kiln_status st = kjin_parse(src, strlen(src), &t);
        if (!st) st = kjin_render(t, cJSON_GetObjectItemCaseSensitive(c, "ctx"), &lim, &got, NULL);
        bool ok = want_s ? (!st && !strcmp(got, want_s)) : st != NULL;
        if (ok) match++;
        else if (shown++ < 15) {
            fprintf(stderr, "  snippet %d: %s\n    want: %s\n    got:  %s\n", i, src,
                    want_s ? want_s : cJSON_GetObjectItemCaseSensitive(e, "error")->valuestring,
                    st ? kiln_status_msg(st) : got);
        }
        kiln_status_free(st);
        free(got);
        kjin_free(t);
    }
    cJSON_Delete(cases);
    cJSON_Delete(exp);
    KT_CHECK_EQ(match, n);
    KT_CHECK_EQ(python, (int)(sizeof PYTHON_DIFFERS / sizeof PYTHON_DIFFERS[0])); /* each one still a snippet */
}

KT_TEST(jinja_errors_name_line_and_column) {
    char *out;
    KT_CHECK_ERR(render("a\n{% if x %}\nb", NULL, NULL, &out), "line 3");
    KT_CHECK_ERR(render("{{ 1 +\n }}", NULL, NULL, &out), "line 2, column 2");
    KT_CHECK_ERR(render("ok\n  {{ x|nosuch }}", "{\"x\": 1}", NULL, &out), "line 2, column 7");
    KT_CHECK_ERR(render("{{ 'abc", NULL, NULL, &out), "end of input");
    KT_CHECK_ERR(render("{% for %}", NULL, NULL, &out), "line 1");
    KT_CHECK_ERR(render("x\n{{ raise_exception('Conversation roles must alternate') }}", NULL, NULL, &out),
                 "line 2, column 4: raise_exception: Conversation roles must alternate");
    KT_CHECK_ERR(render("{% endfor %}", NULL, NULL, &out), "unknown statement 'endfor'");
    KT_CHECK_ERR(render("{{ x }}", "{\"range\": 1}", NULL, &out), "already declared");
}

KT_TEST(jinja_render_is_bounded) {
    char *out;
    kjin_limits lim = kjin_limits_default();
    lim.max_steps = 100000;
    KT_CHECK_ERR(render("{% for i in range(100000000) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}", NULL, &lim, &out), "limit");
    lim = kjin_limits_default();
    lim.max_output = 1000;
    KT_CHECK_ERR(render("{% for i in range(10000) %}xxxxxxxx{% endfor %}", NULL, &lim, &out), "output size");
    lim = kjin_limits_default();
    lim.max_memory = 1 << 20;
    KT_CHECK_ERR(render("{% set ns = namespace(s='x') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", NULL, &lim, &out), "limit");
    KT_CHECK_ERR(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &out), "call depth");
    KT_CHECK_ERR(render("{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}", NULL, NULL, &out), "nested");
    /* deep nesting in the source fails cleanly instead of exhausting the stack */
    char deep[40000];
    size_t k = 0;
    k += (size_t)sprintf(deep + k, "{{ ");
    for (int i = 0; i < 5000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 5000; i++) deep[k++] = ')';
    sprintf(deep + k, " }}");
    KT_CHECK_ERR(render(deep, NULL, NULL, &out), "nested");
}

KT_TEST(jinja_whitespace_control) {
    char *out;
    /* trim_blocks and lstrip_blocks as transformers configures Jinja */
    KT_CHECK_OK(render("<\n  {% if true %}\n  a\n  {% endif %}\n>", NULL, NULL, &out));
    KT_CHECK_STR(out, "<\n  a\n>");
    free(out);
    KT_CHECK_OK(render("a  {{- 'b' -}}  c", NULL, NULL, &out));
    KT_CHECK_STR(out, "abc");
    free(out);
    KT_CHECK_OK(render("x {%- generation %} y {% endgeneration -%} z", NULL, NULL, &out));
    KT_CHECK_STR(out, "x y z");
    free(out);
    KT_CHECK_OK(render("trailing newline dropped\n", NULL, NULL, &out));
    KT_CHECK_STR(out, "trailing newline dropped");
    free(out);
}

typedef struct {
    const kjin_template *t;
    const cJSON *ctx;
    const char *want;
    int bad;
} thread_arg;

static void *render_many(void *p) {
    thread_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        kiln_status st = kjin_render(a->t, a->ctx, NULL, &out, NULL);
        if (st || strcmp(out, a->want)) a->bad++;
        kiln_status_free(st);
        free(out);
    }
    return NULL;
}

KT_TEST(jinja_concurrent_renders_share_a_template) {
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "<{{ m.role }}>{{ m.content|trim }}{% endfor %}{{ ns.n }}";
    kjin_template *t;
    KT_CHECK_OK(kjin_parse(src, strlen(src), &t));
    cJSON *ctx = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}");
    thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, ctx, "<user>hi<assistant>yo2", 0};
        pthread_create(&th[i], NULL, render_many, &args[i]);
    }
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad += args[i].bad;
    }
    cJSON_Delete(ctx);
    kjin_free(t);
    KT_CHECK_EQ(bad, 0);
}

/* Inputs the fuzzer (fuzz/fuzz_jinja.c) once crashed on, replayed with the
 * harness's context and limits: each must end in output or an error. */
KT_TEST(jinja_fuzz_regressions) {
    char dir[4096];
    kt_path(dir, sizeof dir, "tests/data/chat/fuzz");
    DIR *d = opendir(dir);
    KT_CHECKF(d, "no %s", dir);
    cJSON *ctx = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"n\": 3}");
    kjin_limits lim = kjin_limits_default();
    lim.max_steps = 200000;
    lim.max_output = 1 << 20;
    lim.max_memory = 64 << 20;
    lim.max_depth = 50;
    lim.now = 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        char *src;
        size_t len;
        kiln_status st = ku_read_file(p, &src, &len);
        if (st) {
            kiln_status_free(st);
            continue;
        }
        kjin_template *t = NULL;
        char *out = NULL;
        st = kjin_parse(src, len, &t);
        if (!st) st = kjin_render(t, ctx, &lim, &out, NULL);
        kiln_status_free(st);
        free(out);
        kjin_free(t);
        free(src);
        n++;
    }
    closedir(d);
    cJSON_Delete(ctx);
    KT_CHECK(n > 0);
}

/* Where Python's jinja2 (transformers' renderer) and @huggingface/jinja
 * differ, kiln follows Python: expected texts from jinja2 3.1 with
 * trim_blocks and lstrip_blocks (booleans kept out of the output, which
 * print "True" there and "true" here). */
KT_TEST(jinja_undefined_is_empty_for_string_filters) {
    char *out;
    KT_CHECK_OK(render("{{ u|trim }}|{{ u|upper }}|{{ u|lower }}|{{ u|title }}|{{ u|capitalize }}|{{ u|replace('a','b') }}|"
                       "{{ u|string }}|{{ u|length }}|{{ x.nope|trim }}|{{ 'a: ' + x.nope|trim }}",
                       "{\"x\": {\"a\": 1}}", NULL, &out));
    KT_CHECK_STR(out, "|||||||0||a: ");
    free(out);
    /* none is not undefined: str(None) is "None" (jinja_python_str) */
    /* Undefined + "\n" raises in Python: so does indent */
    KT_CHECK_ERR(render("{{ u|indent }}", NULL, NULL, &out), "indent");
}

/* The string filters of none, lists and dicts (where @huggingface/jinja
 * raises) take Python's str() of them, as jinja2 does: reprs of the items
 * (quotes, escapes, True/None, float reprs), tuples unpack in loops, and
 * none|selectattr is empty. Expected text: Python's jinja2 3.1. */
KT_TEST(jinja_python_str) {
    char *out;
    KT_CHECK_OK(render("{{ none|trim }}|{{ none|string }}|{{ none|upper }}|{{ ['a', \"it's\", 'q\\\"', 'x\\\\y\\nz']|trim }}|{{ {'k': 'v', 'n': [1, 2.5, none, 10000000000000000.0, 0.0001, 0.000015, 100.0, 123456789.125, 0.1], 'b': true}|string }}|{{ {'t': ('a', 1), 'u': ('b', 2)}|string }}|{{ [{'x': 'y'}]|lower }}|{% for a, b in [('m', 1), ('n', 2)] %}{{ a }}{{ b }}{% endfor %}|{{ none|selectattr('x')|list|length }}|{{ {1: 'a', 2.5: 'b'}|string }}", NULL, NULL, &out));
    KT_CHECK_STR(out, "None|None|NONE|['a', \"it's\", 'q\"', 'x\\\\y\\nz']|{'k': 'v', 'n': [1, 2.5, None, 1e+16, 0.0001, 1.5e-05, 100.0, 123456789.125, 0.1], 'b': True}|{'t': ('a', 1), 'u': ('b', 2)}|[{'x': 'y'}]|m1n2|0|{1: 'a', 2.5: 'b'}");
    free(out);
    /* a list's |string stays @huggingface/jinja's (it does not raise there) */
    KT_CHECK_OK(render("{{ ['a', 1]|string }}", NULL, NULL, &out));
    KT_CHECK_STR(out, "[\"a\", 1]");
    free(out);
}

KT_TEST(jinja_dict_keys_are_any_hashable) {
    char *out;
    KT_CHECK_OK(render("{% set d = {0: 'z', 512: 'a', '1': 's', 1: 'i', true: 'T'} %}{{ d[0] }}|{{ d[1] }}|{{ d['1'] }}|"
                       "{{ d[512] }}|{{ d[1.0] }}|{{ d|length }}|{{ 'y' if 512 in d else 'n' }}|{{ 'y' if '512' in d else 'n' }}|"
                       "{{ d.get(0) }}|{{ d|tojson }}{% for k, v in d|dictsort(by='value') %}[{{ k }}={{ v }}]{% endfor %}",
                       NULL, NULL, &out));
    KT_CHECK_STR(out, "z|T|s|a|T|4|y|n|z|{\"0\": \"z\", \"512\": \"a\", \"1\": \"s\", \"1\": \"T\"}[512=a][1=s][1=T][0=z]");
    free(out);
    /* keys come back as numbers: sorted and computed with as numbers */
    KT_CHECK_OK(render("{% set d = {2: 'b', 0: 'a', 10: 'c'} %}{% for k, v in d|dictsort %}{{ k + 1 }}{{ v }},{% endfor %}"
                       "{% for k in d %}{{ k * 2 }};{% endfor %}{{ d.items()|list|length }}{{ d.0 }}",
                       NULL, NULL, &out));
    KT_CHECK_STR(out, "1a,3b,11c,4;0;20;3a");
    free(out);
    KT_CHECK_ERR(render("{{ {[1]: 2} }}", NULL, NULL, &out), "unhashable");
    KT_CHECK_ERR(render("{% set d = {1: 2} %}{{ namespace(d) }}", NULL, NULL, &out), "namespace keys must be strings");
}
