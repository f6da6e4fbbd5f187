# jinja_python_oracle.py: reference renders by Python's jinja2 configured as
# transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment,
# trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception and
# strftime_now), for the (template, input) pairs where @huggingface/jinja
# raises but Python renders. kiln follows Python there (transformers is the
# reference for chat templates); chat_oracle_renders reads these files
# before tests/data/chat/expected/.
#
#   python3 tools/jinja_python_oracle.py TEMPLATE...   (names under tests/data/chat/templates)
# writes tests/data/chat/expected_python/TEMPLATE.json: {input: {"out": text}}.
#   python3 tools/jinja_python_oracle.py
# writes nothing: lists every template with such pairs (a survey: kiln does not
# follow Python on all of them yet).
import datetime
import json
import os
import sys

from jinja2.exceptions import TemplateError
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

DATA = "tests/data/chat"
FIXED_NOW = 1752582896  # the JavaScript oracle's frozen clock


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(FIXED_NOW, datetime.timezone.utc).strftime(fmt)


class Generation(Extension):
    """transformers' AssistantTracker without the tracking: the body renders as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

# Differences kiln keeps with Python (it follows @huggingface/jinja there).
KNOWN = [("can only concatenate str (not \"list\")",
          "str + list: kiln concatenates as @huggingface/jinja does (13 templates render content parts so); Python raises"),
         ("can only concatenate str (not \"dict\")",
          "str + dict: kiln concatenates as @huggingface/jinja does; Python raises")]

def main():
    if sys.argv[1:2] == ["--agent"]:
        agent_renders(sys.argv[2] if sys.argv[2:] else "../shared/chat-templates")
        return
    oracle_renders()


def oracle_renders():
    inputs = {}
    for f in sorted(os.listdir(f"{DATA}/inputs")):
        if f.endswith(".json"):
            inputs[f[:-5]] = json.load(open(f"{DATA}/inputs/{f}"))
    os.makedirs(f"{DATA}/expected_python", exist_ok=True)
    survey = not sys.argv[1:]
    names = sys.argv[1:] or sorted(f[:-6] for f in os.listdir(f"{DATA}/templates") if f.endswith(".jinja"))
    for name in names:
        try:
            tpl = env.from_string(open(f"{DATA}/templates/{name}.jinja").read())
        except Exception as e:
            print(f"{name}: Python cannot parse it: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        js = json.load(open(f"{DATA}/expected/{name}.json"))
        out = {}
        for k, inp in inputs.items():
            if "error" not in js.get(k, {}):
                continue  # @huggingface/jinja renders it: its render stays the reference
            try:
                out[k] = {"out": tpl.render(messages=inp["messages"], tools=inp.get("tools"), documents=inp.get("documents"),
                                            add_generation_prompt=bool(inp.get("add_generation_prompt")),
                                            bos_token="<s>", eos_token="</s>", **inp.get("kwargs", {}))}
            except Exception as e:
                # raises in Python too: the JavaScript oracle's error stands, unless
                # past the point where that package raised kiln renders what both
                # renderers would differ on (KNOWN below): then the pair is left out
                msg = f"{type(e).__name__}: {e}"
                print(f"{name} x {k}: Python raises too: {msg}", file=sys.stderr)
                for pat, why in KNOWN:
                    if pat in msg:
                        out[k] = {"error": msg, "not_compared": why}
        if survey or not out:
            if out:
                print(f"{name}: {sum('out' in v for v in out.values())} pairs where Python renders and @huggingface/jinja raises")
            continue
        with open(f"{DATA}/expected_python/{name}.json", "w") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        print(f"{name}: {sum('out' in v for v in out.values())} pairs where Python renders and @huggingface/jinja raises")


# More differences kiln keeps with Python (it follows @huggingface/jinja there).
AGENT_KNOWN = [("Object of type generator is not JSON serializable",
                "map(..)|tojson: kiln's map gives a list, as @huggingface/jinja's; Python's a generator, which tojson refuses")]
AGENT_NOT_COMPARED = {
    "meetkai-functionary-medium-v3.1": "\"..\"|safe + text: Python's Markup escapes the text it is added to (&#34;); "
                                       "kiln's safe is a no-op, as @huggingface/jinja's (tests/data/chat/expected/ has its render)",
}


def agent_renders(tdir):
    """`python3 tools/jinja_python_oracle.py --agent [TEMPLATES]` (default ../shared/chat-templates):
    renders every template there with the tool-calling conversations of
    tests/data/chat/agent/inputs.json (tools, assistant tool calls with
    reasoning_content, tool results, a later turn, thinking on and off) into
    tests/data/chat/agent/expected.json: {template: {input: {"out"} | {"error"}}},
    what chat_renders_agent_conversations compares kiln's renders with."""
    inputs = json.load(open(f"{DATA}/agent/inputs.json"))
    out = {}
    for f in sorted(os.listdir(tdir)):
        if not f.endswith(".jinja"):
            continue
        name = f[:-6]
        tpl = env.from_string(open(f"{tdir}/{f}").read())
        out[name] = {}
        for k, inp in inputs.items():
            try:
                out[name][k] = {"out": tpl.render(messages=inp["messages"], tools=inp.get("tools"),
                                                  add_generation_prompt=bool(inp.get("add_generation_prompt")),
                                                  bos_token="<s>", eos_token="</s>", **inp.get("kwargs", {}))}
            except Exception as e:
                msg = f"{type(e).__name__}: {e}"
                out[name][k] = {"error": msg}
                print(f"{name} x {k}: Python raises: {msg}", file=sys.stderr)
                for pat, why in KNOWN + AGENT_KNOWN:
                    if pat in msg:
                        out[name][k]["not_compared"] = why
            if name in AGENT_NOT_COMPARED:
                out[name][k]["not_compared"] = AGENT_NOT_COMPARED[name]
    with open(f"{DATA}/agent/expected.json", "w") as fo:
        json.dump(out, fo, ensure_ascii=False, indent=1)
        fo.write("\n")


main()
