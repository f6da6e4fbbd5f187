# jinja_snippets.py: writes tests/data/chat/snippets.json, the engine unit cases
# (run from the repository root; then `node tools/jinja_oracle.mjs snippets`).
import json
C = {"msgs": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": " end "}],
     "d": {"b": 2, "a": 1, "c": {"x": [1, 2.5, "s", None, True]}}, "s": "Hello World", "n": 7, "f": 2.5, "z": 0, "e": [], "u": "日本😀é",
     "items": [{"name": "b", "v": 2, "ok": True}, {"name": "A", "v": 1, "ok": False}, {"name": "c", "v": 3}]}
T = r'''
{{ 1 + 2 }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 1.0 }}|{{ 1.5 + 1 }}|{{ 3 * 1.0 }}
{{ 10 / 4 * 2 }}|{{ -3 }}|{{ - n }}|{{ +f }}|{{ 1000 if false else 2 }}|{{ 0.1 + 0.2 }}|{{ 1/3 }}|{{ 1e21 }}|{{ 100000000000000000000 * 10 }}
{{ "a" ~ 1 ~ 1.0 ~ true ~ 2.5 }}
{{ "a" + "b" }}|{{ "a" + 1 }}|{{ [1,2] + [3] }}|{{ "x" ~ [1, "a"] }}|{{ "x" ~ d }}
{{ 1 == 1.0 }}|{{ "1" == 1 }}|{{ true == 1 }}|{{ none == undefinedvar }}|{{ [1] == [1] }}|{{ d == d }}|{{ msgs[0] == msgs[0] }}|{{ "a" != "b" }}
{{ 1 < 2 }}|{{ 2 >= 2.0 }}|{{ "a" in "cat" }}|{{ "z" not in "cat" }}|{{ 1 in [1,2] }}|{{ "a" in d }}|{{ "q" in d }}|{{ x in undefinedvar }}
{{ true and "x" }}|{{ false or "y" }}|{{ "" or [] }}|{{ not [] }}|{{ not 0 }}|{{ [] and 1 }}|{{ d and 1 }}
{{ n is odd }}|{{ n is even }}|{{ x is defined }}|{{ n is defined }}|{{ none is none }}|{{ s is string }}|{{ n is number }}|{{ f is integer }}|{{ d is mapping }}|{{ e is iterable }}|{{ s is sequence }}|{{ true is boolean }}|{{ "abc" is lower }}|{{ "ABC" is upper }}|{{ n is not string }}|{{ e is true }}|{{ false is false }}|{{ x is undefined }}
{{ s[0] }}|{{ s[-1] }}|{{ s[1:4] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ s[-3:] }}|{{ msgs[-1].content }}|{{ msgs[1:][0].role }}|{{ e[5] }}|{{ [1,2,3,4][1:-1] }}|{{ [1,2,3][5:] }}|{{ u[1:3] }}|{{ u[-1] }}|{{ u|length }}
{{ d.a }}|{{ d['b'] }}|{{ d.c.x[1] }}|{{ d.missing }}|{{ d.missing.deeper }}|{{ msgs.0.role }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.items() | list }}|{{ d.get('a') }}|{{ d.get('zz', 9) }}|{{ d.get('zz') }}
{{ s.upper() }}|{{ s.lower() }}|{{ "  x y  ".strip() }}|{{ "  x ".lstrip() }}|{{ " x  ".rstrip() }}|{{ "hello world-foo_bar".title() }}|{{ "hELLO".capitalize() }}|{{ s.startswith("He") }}|{{ s.endswith(("x", "ld")) }}|{{ s.split() }}|{{ "a,b,,c".split(",") }}|{{ "a b  c".split(" ", 1) }}|{{ "a,b,c".split(",", 1) }}|{{ "  a  b ".split(none, 1) }}|{{ "aaa".replace("a", "b", 2) }}|{{ "abc".replace("", "-") }}|{{ s.length }}
{{ s|length }}|{{ e|length }}|{{ d|length }}|{{ s|upper }}|{{ s|lower }}|{{ "ab cd"|title }}|{{ "ab"|capitalize }}|{{ "  t  "|trim }}|{{ [3,1,2]|sort }}|{{ [3,1,2]|sort(reverse=true) }}|{{ ["b","A","c"]|sort }}|{{ ["b","A","c"]|sort(case_sensitive=true) }}|{{ [1,2,3]|reverse }}|{{ [1,2,3]|first }}|{{ [1,2,3]|last }}|{{ [1,2]|join }}|{{ [1,"a",2.0]|join(", ") }}|{{ "abc"|join("-") }}|{{ [1,1,2,1.0]|unique }}
{{ "42"|int }}|{{ "4.5x"|float }}|{{ "x"|int }}|{{ "x"|int(7) }}|{{ 3.7|int }}|{{ -3.7|int }}|{{ 3|float }}|{{ -2|abs }}|{{ -2.5|abs }}|{{ 5|string }}|{{ 5.0|string }}|{{ true|string }}|{{ true|int }}|{{ [1]|string }}|{{ "a"|string }}
{{ x|default("dflt") }}|{{ ""|default("dflt") }}|{{ ""|default("dflt", true) }}|{{ none|default("nd") }}|{{ n|default(3) }}|{{ 0|default(5, boolean=true) }}
{{ d|tojson }}|{{ msgs|tojson }}|{{ d|tojson(indent=2) }}|{{ "é\n\"😀"|tojson }}|{{ "é😀"|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(",", ":")) }}|{{ [1.0, 2.5, none, true]|tojson }}|{{ x|tojson }}|{{ {}|tojson(indent=2) }}|{{ []|tojson(indent=4) }}
{{ d|items|list }}|{{ d|dictsort }}|{{ d|dictsort(reverse=true) }}|{{ {"b": 2, "a": 3}|dictsort(by="value") }}
{{ items|selectattr("ok")|map(attribute="name")|list }}|{{ items|rejectattr("ok")|map(attribute="name")|join(",") }}|{{ items|selectattr("v", "odd")|map(attribute="v")|list }}|{{ items|selectattr("name", "equalto", "c")|list|length }}|{{ items|map(attribute="ok", default="none")|list }}|{{ items|sort(attribute="v")|map(attribute="name")|join }}|{{ items|sort(attribute="name")|map(attribute="name")|join }}
{{ "a\nb\n\nc"|indent }}|{{ "a\nb"|indent(2, true) }}|{{ "a\n\nb"|indent(width=1, blank=true) }}
{{ [1, 2][0] }}{{ {"k": "v"}["k"] }}{{ (1, 2)[1] }}{{ ("a" "b") }}{{ 'it\'s' }}{{ "\u00e9\x41\t|" }}
{{ range(3)|list }}|{{ range(1, 4) }}|{{ range(10, 0, -3) }}|{{ range(0) }}
{{ "x" if n > 5 else "y" }}|{{ "x" if n < 5 }}|{{ ("t" if true) ~ "!" }}
{{ namespace(a=1).a }}|{% set ns = namespace(v=0, l=[]) %}{% for i in range(4) %}{% set ns.v = ns.v + i %}{% endfor %}{{ ns.v }}|{{ ns }}
'''.strip().split('\n')
T2 = [
 "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}:{{ m.role }};{% endfor %}",
 "{% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }} {% endfor %}",
 "{% for m in msgs if m.role == 'user' %}{{ loop.index }}{{ m.content }}{% endfor %}",
 "{% for m in e %}x{% else %}empty{% endfor %}",
 "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
 "{% for k in d %}{{ k }}{% endfor %}",
 "{% for i in range(10) %}{% if i == 3 %}{% continue %}{% endif %}{% if i == 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
 "{% for i in range(3) %}a{% continue %}b{% else %}E{% endfor %}",
 "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}",
 "{% for a, b in [[1, 2, 3]] %}{{ a }}{% endfor %}",
 "{% for x in 5 %}{% endfor %}",
 "{% for x in 'abc' %}{{ x }}{% endfor %}",
 "{% set x = 1 %}{% for i in range(2) %}{% set x = x + 10 %}{{ x }},{% endfor %}{{ x }}",
 "{% set a, b = [1, 2] %}{{ b }}{{ a }}",
 "{% set a, b = (1, 2) %}{{ b }}{{ a }}",
 "{% set a, b = [1] %}",
 "{% set blk %}  inner {{ n }}  {% endset %}[{{ blk }}]",
 "{% if n > 10 %}big{% elif n > 5 %}mid{% elif n > 1 %}small{% else %}tiny{% endif %}",
 "{% if false %}a{% else %}b{% endif %}{% if e %}no{% endif %}",
 "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }}",
 "{% macro m(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}",
 "{% macro m(a) %}{{ a }}{{ kwargs }}{{ varargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
 "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
 "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, k=2) }}",
 "{% macro m() %}{{ caller() }}+{{ caller() }}{% endmacro %}{% call m() %}body{{ n }}{% endcall %}",
 "{% macro m(x) %}[{{ caller(x * 2) }}]{% endmacro %}{% call(v) m(21) %}v={{ v }}{% endcall %}",
 "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
 "{% macro outer() %}{{ seen }}{% endmacro %}{% set seen = 'dyn' %}{{ outer() }}",
 "{% filter upper %}shout {{ s }}{% endfilter %}",
 "{% filter indent(2, true) %}a\nb{% endfilter %}",
 "a  {%- if true -%}  b  {%- endif -%}  c",
 "a  {{- 'b' -}}  c {# comment #} d {#- trimmed -#} e",
 "line1\n  {% if true %}\n  kept\n  {% endif %}\nline2\n",
 "  {%+ if true %}x{% endif %}",
 "a\n{# c #}\nb",
 "{%- generation -%} gen {%- endgeneration -%}|{% generation %}  g  {% endgeneration %}",
 "{{ raise_exception('bad role') }}",
 "{{ strftime_now('%Y-%m-%d %H:%M %b %B %%') }}",
 "{{ undefined_fn() }}",
 "{{ s.nosuch() }}",
 "{{ s|nosuchfilter }}",
 "{{ n is nosuchtest }}",
 "{{ x + 1 }}",
 "{{ none + 1 }}",
 "{{ [1] - [1] }}",
 "{{ 'a' * 3 }}",
 "{{ d[0] }}",
 "{{ s[1.5] }}",
 "{{ e|first }}",
 "{% set y = e|first %}[{{ y }}]",
 "{{ {1: 2} }}",
 "{{ (1, 2) }}",
 "{{ (1, 2)|tojson }}",
 "{{ 0 ** -1 }}",
 "{{ n|items }}",
 "{{ x|string }}",
 "{{ x|default }}",
 "{{ d|upper }}",
 "{{ range(3)|tojson }}",
 "{{ 'a,b'.split(',', 0) }}|{{ ''.split(',') }}|{{ ''.split() }}",
 "{{ 1 if x else 2 }}{{ x.y.z }}",
 "{{ namespace({'a': 1}, b=2) }}|{{ namespace([['k', 'v']]).k }}",
 "{% set ns = namespace(a=1) %}{% set ns.b = ns.a + 1 %}{{ ns.b }}{{ ns|tojson }}",
 "{% set d2 = {'a': 1} %}{% set d2.b = 2 %}",
 "{{ messages is defined }}{{ true }}{{ True }}{{ none }}{{ None }}|{{ false|string }}",
 "{% set true = 5 %}{{ true }}",
 "{{ 'abc' is iterable }}{{ (1, 2) is iterable }}{{ (1, 2) is sequence }}{{ d.items is callable }}",
 "{{ [1, [2, 3], 'x', none]|join('|') }}",
 "{{ 'x' ~ [none, x] }}",

 "{{ items|map(attribute='name')|join(', ') }}{{ items|map('upper') }}",
 "{{ 1 }}{{ 1.50 }}{{ 0.000001 }}{{ 0.0000001 }}{{ 123456789012345680000 }}{{ -0.0 }}{{ 2.0 ** 70 }}",
 "{{ 5 // 0 }}|{{ 5 / 0 }}|{{ -5 / 0 }}|{{ 0 / 0 }}|{{ 5 % 0 }}",
 "{{ [3, 'a']|sort }}",
 "{{ x in [1] }}",
 "{{ [1] in [[1]] }}",
 "{{ d.c.x|tojson(indent=1) }}",
 "{{ d|tojson(sort_keys=true) }}",
 "{% for i in range(3) %}{% for j in range(2) %}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}",
 "{% if true %}unclosed",
 "{% for x in y %}",
 "{{ 1 + }}",
 "{{ (1 }}",
 "{% endif %}",
 "{% else %}",
 "{{ 'unterminated }}",
 "{# never closed",
 "{{ x | }}",
 "{% nosuch %}",
 "{{ a b }}",
 "{% set %}",
 "{% macro m(a=1, b) %}{% endmacro %}",
 "{{ f(a=1, 2) }}",
 "{% break %}",
 "{{ '\\q' }}",
 "{{ x",
 "text then {{ -5 }} {{ 3 - -2 }} {{ 3-2 }} {{ n-1 }}",
 "{{ 'a' 'b' }}{{ \"c\" }}",
 "{{ [1,2,3,][1] }}{{ {'a':1,}['a'] }}",
 "{{ d | dictsort(false, 'value') }}",
 "{{ 'Hello'[1:] ~ 'Hello'[:-1] ~ 'Hello'[10:] }}",
 "{{ msgs|selectattr('role', 'eq', 'user')|list|length }}",
 "{{ msgs|selectattr('role', 'in', 'user')|list|length }}",
 "{{ [1,2]|selectattr('x') }}",
 "{{ s.split('l') }}{{ s.split('l', 1) }}",
 "{{ '%d'|format(1) }}",
 "{{ [1,2]|map(attribute='x')|list }}",
 "{{ msgs[0]['content'] | trim | length }}",
 "{% set x %}a{% endset %}{{ x is string }}",
 "{{ 10 ** 21 }}|{{ 2 ** 53 + 1 }}|{{ 7.0 // 2 }}|{{ 7 % 2.5 }}",
 "{{ 'ab' < 'b' }}",
 "{{ true + 1 }}",
 "{{ -true }}",
 "{{ not x }}{{ not none }}",
 "{{ loop }}",
 "{{ [none, x, 1]|unique|length }}",

]
cases = [{"t": t, "ctx": C} for t in T + T2]
json.dump(cases, open("tests/data/chat/snippets.json", "w"), indent=1, ensure_ascii=False)
print(len(cases))
