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
    /* an undefined key is no key (Jinja2), not an error */
    KT_CHECK_OK(render("{% set m = {'string': 'str'} %}{{ 'y' if m[spec.type] is defined else 'n' }}{{ m[nope] is defined }}",
                       "{\"spec\": {}}", NULL, &out));
    KT_CHECK_STR(out, "nfalse");
    free(out);
    KT_CHECK_ERR(render("{% set d = {1: 2} %}{{ namespace(d) }}", NULL, NULL, &out), "namespace keys must be strings");
}

typedef struct {
    const char *src, *out;
} render_case;

static void check_renders(const render_case *cs, size_t n, const char *ctx) {
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        kiln_status st = render(cs[i].src, ctx, NULL, &out);
        KT_CHECKF(!st && !strcmp(out, cs[i].out), "case %zu: [%s], want [%s]", i, st ? kiln_status_msg(st) : out, cs[i].out);
        kiln_status_free(st);
        free(out);
    }
}

typedef struct {
    const char *src, *err;
    bool with_ctx;
} err_case;

static void check_errors(const err_case *cs, size_t n, const char *ctx) {
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        kiln_status st = render(cs[i].src, cs[i].with_ctx ? ctx : NULL, NULL, &out);
        KT_CHECKF(st && strstr(kiln_status_msg(st), cs[i].err), "%s: [%s], want an error with [%s]", cs[i].src,
                  st ? kiln_status_msg(st) : out, cs[i].err);
        kiln_status_free(st);
        free(out);
    }
}

/* The min and max filters as jinja2 has them (case_sensitive=false lowers
 * strings for the comparison, attribute= compares an item's attribute
 * path or index, the first of equal items wins, an empty sequence gives
 * Undefined). Expected text: Python's jinja2 3.1.6. */
KT_TEST(jinja_min_max_filters) {
    const char *ctx = "{\"items\": [{\"k\": \"p\", \"n\": 3, \"s\": \"B\"}, {\"k\": \"q\", \"n\": 1, \"s\": \"a\"},"
                      " {\"k\": \"r\", \"n\": 3, \"s\": \"c\"}], \"tc\": 2, \"sc\": 1}";
    static const render_case k_cases[] = {
        {"{{ [3, 1, 2]|min }}|{{ [3, 1, 2]|max }}|{{ ['b', 'A', 'c']|min }}|{{ ['b', 'A', 'c']|min(case_sensitive=true) }}|"
         "{{ ['b', 'A', 'C']|max }}|{{ ['b', 'A', 'C']|max(true) }}",
         "1|3|A|A|C|b"},
        {"{{ (items|min(attribute='n')).k }}|{{ (items|max(attribute='n')).k }}|{{ (items|min(attribute='s')).k }}|"
         "{{ (items|max(attribute='s', case_sensitive=true)).k }}|{{ (items|max(attribute='s')).k }}",
         "q|p|q|r|r"},
        {"{{ []|min }}|{{ 'hello'|max }}|{{ {'b': 1, 'a': 2}|min }}|{{ [[2, 9], [1, 5]]|min(attribute=1) }}|"
         "{{ [1, 1.5, true]|max }}|{{ [2, 2]|min }}",
         "|o|a|[1, 5]|1.5|2"},
        /* MiniCPM5's use */
        {"{%- set m = [tc, sc]|min %}{{ m }}{{ [tc, sc]|max }}", "12"},
    };
    check_renders(k_cases, sizeof k_cases / sizeof *k_cases, ctx);
    static const err_case k_errs[] = {
        {"{{ [1, 'a']|min }}", "compare", false},
        {"{{ none|max }}", "not iterable", false},
        {"{{ [1]|min(case_sensitive='x') }}", "case_sensitive", false},
        {"{{ items|min(attribute='n.x') }}", "undefined", true},
    };
    check_errors(k_errs, sizeof k_errs / sizeof *k_errs, ctx);
}

/* Python's str.format (tencent Hy3 builds its special tokens with it):
 * automatic, numbered and named fields, item chains, conversions, the
 * format-spec mini-language and nested specs; values print as Python's
 * str(). Expected text: Python's jinja2 3.1.6 sandbox (a differential run
 * of 16k random specs over ints, floats, strings, bools and lists against it
 * agreed but for the NUL of format(0, 'c')). */
KT_TEST(jinja_str_format) {
    const char *ctx = "{\"tag\": \":os\", \"a\": \"x\", \"b\": \"y\"}";
    static const render_case k_cases[] = {
        {"{{ '<think{}>'.format(tag) }}{{ '<｜hy_eos{}｜>'.format(tag) }}", "<think:os><｜hy_eos:os｜>"},
        {"{{ '{} {}'.format(a, b) }}|{{ '{1}-{0}-{1}'.format(a, b) }}|{{ '{name}={v}'.format(name='k', v=3) }}", "x y|y-x-y|k=3"},
        {"{{ '{{}} {{{}}}'.format(1) }}|{{ '{}|{}|{}|{}|{}'.format(true, none, 1.5, [1, 'a'], {'k': 'v'}) }}",
         "{} {1}|True|None|1.5|[1, 'a']|{'k': 'v'}"},
        {"{{ '{:>6}|{:<6}|{:^7}|{:*^7}'.format('ab', 'cd', 'ef', 'gh') }}", "    ab|cd    |  ef   |**gh***"},
        {"{{ '{:05d}|{:+d}|{: d}|{:,}|{:_}|{:x}|{:#X}|{:#b}|{:o}|{:c}'.format(42, 7, 7, 1234567, 1234567, 255, 255, 5, 8, 65) }}",
         "00042|+7| 7|1,234,567|1_234_567|ff|0XFF|0b101|10|A"},
        {"{{ '{:.2f}|{:8.3f}|{:e}|{:.3g}|{:%}|{:.1%}|{:,.2f}|{:g}|{:.3}|{}'.format(3.14159, 2.5, 12345.678, 0.000123456, 0.25, "
         "0.125, 1234567.891, 100000000.0, 2.0, 0.1 + 0.2) }}",
         "3.14|   2.500|1.234568e+04|0.000123|25.000000%|12.5%|1,234,567.89|1e+08|2.0|0.30000000000000004"},
        {"{{ '{0[0]}/{0[1]}|{d.x}|{d[y]}|{0!r}|{1!r:>8}'.format(['p', 'q'], 'z', d={'x': 1, 'y': 'w'}) }}", "p/q|1|w|['p', 'q']|     'z'"},
        {"{{ '{:.3}|{:>{w}}|{:{f}<{w}}'.format('abcdef', 'r', 's', w=4, f='-') }}", "abc|   r|s---"},
        {"{{ '{}'.format(7) }}|{{ '{:d}'.format(true) }}|{{ '{:5}'.format(3) }}|{{ '{:5}'.format(true) }}|{{ '{}{}'.format(-0.0, -3) }}|"
         "{{ '{:=+6d}'.format(-12) }}|{{ '{:08.2f}'.format(-3.14159) }}",
         "7|1|    3|    1|-0.0-3|-   12|-0003.14"},
        /* zero fill with grouping, the '0' flag beside an alignment, no type with a precision, 'n', '#', !s with a spec */
        {"{{ '{:09_}|{:#010,}|{:>010}|{:<-06}|{:05}|{:.1}|{:5.7}|{:#.8}|{:n}|{:.3}|{:#}|{:0=12_.8}|{:*<#9.0%}|{!s:>8}|{:.0}'"
         ".format(255, true, 255, -42, 'ab', 3.14159, 1234567.891, 3.14159, 1234567.891, 100.0, 0.0000001, -0.5, 123456789, [1], "
         "-0.0) }}",
         "0_000_255|00,000,001|0000000255|-42000|ab000|3e+00|1.234568e+06|3.1415900|1.23457e+06|1e+02|1.e-07|-0_000_000.5|"
         "12345678900.%|     [1]|-0e+00"},
    };
    check_renders(k_cases, sizeof k_cases / sizeof *k_cases, ctx);
    static const render_case k_long[] = { /* long outputs (lengths from Python) */
        {"{{ '{:0999_}'.format(1)|length }}|{{ '{:01500,.900f}'.format(big)|length }}|{{ '{:0900_b}'.format(123456789)|length }}|"
         "{{ '{:.1000f}'.format(big)|length }}|{{ '{:.1000%}'.format(big)|length }}",
         "999|1500|901|1302|1305"},
    };
    check_renders(k_long, 1, "{\"big\": 1e300}");
    static const err_case k_errs[] = {
        {"{{ '{} {}'.format(1) }}", "out of range", false},
        {"{{ '{0}{}'.format(1, 2) }}", "cannot switch from manual", false},
        {"{{ 'a}'.format() }}", "Single '}'", false},
        {"{{ 'a{'.format() }}", "expected '}'", false},
        {"{{ '{x}'.format(y=1) }}", "KeyError: 'x'", false},
        {"{{ '{:d}'.format('s') }}", "Unknown format code 'd'", false},
        {"{{ '{:>5}'.format(none) }}", "unsupported format string", false},
        {"{{ '{:{:{}}}'.format(1, 2, 3) }}", "recursion", false},
        {"{{ '{:99999999}'.format(1) }}", "too large", false},
        {"{{ '{0.a.b}'.format({}) }}", "undefined", false},
        {"{{ '{[1]}'.format('abc') }}", "KeyError", false},
    };
    check_errors(k_errs, sizeof k_errs / sizeof *k_errs, ctx);
}
