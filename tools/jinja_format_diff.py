# jinja_format_diff.py: differential check of kiln's str.format (src/chat/jinja_pyfmt.c)
# against Python's jinja2 sandbox (transformers' renderer): random format specs over
# ints, floats, strings, booleans and lists, the ones Python renders put in one template,
# rendered by `kiln template`, line by line compared.
#
#   python3 tools/jinja_format_diff.py [SEED...]     (kiln: build/kiln; default seeds 1..10)
# prints each seed's mismatches (format(0, 'c') differs only in the CLI's output: a NUL).
import json, os, random, subprocess, sys, tempfile

from jinja2.sandbox import ImmutableSandboxedEnvironment

VALS = ["7", "-42", "0", "123456789", "3.14159", "-0.5", "0.0000001", "2.5", "100.0", "'abc'", "'héllo'", "true",
        "false", "none", "[1, 'a']", "1234567.891", "-0.0", "99999999999.0", "0.1", "255"]


def spec(r):
    s = ""
    if r.random() < 0.3: s += r.choice(["", "*", "0", "é"]) + r.choice("<>^=")
    if r.random() < 0.3: s += r.choice("+- ")
    if r.random() < 0.2: s += "#"
    if r.random() < 0.2: s += "0"
    if r.random() < 0.5: s += str(r.randint(0, 12))
    if r.random() < 0.2: s += r.choice(",_")
    if r.random() < 0.4: s += "." + str(r.randint(0, 8))
    if r.random() < 0.6: s += r.choice("bcdeEfFgGnosxX%")
    return s


def run(seed, kiln, d):
    env = ImmutableSandboxedEnvironment()
    r = random.Random(seed)
    ok = []
    for _ in range(4000):
        v, sp, conv = r.choice(VALS), spec(r), r.choice(["", "", "", "!r", "!s"])
        e = "'[{%s:%s}]'.format(%s)" % (conv, sp, v)
        try:
            out = env.from_string("{{ %s }}" % e).render()
        except Exception:
            continue
        if "\n" not in out:
            ok.append((e, out))
    with open(f"{d}/chat_template.jinja", "w") as f:
        f.write("\n".join("{{ %s }}" % e for e, _ in ok) + "\n")
    p = subprocess.run([kiln, "template", "-m", d, "--messages", f"{d}/m.json"], capture_output=True, text=True)
    if p.returncode:
        print(f"seed {seed}: kiln: {p.stderr.strip()}")
    got = p.stdout.split("\n")
    bad = [(e, w, g) for (e, w), g in zip(ok, got) if w != g]
    print(f"seed {seed}: {len(ok)} specs, {len(bad)} mismatches")
    for b in bad[:20]:
        print("  ", b)


kiln = os.environ.get("KILN", "build/kiln")
with tempfile.TemporaryDirectory() as d:
    with open(f"{d}/m.json", "w") as f:
        json.dump([{"role": "user", "content": "x"}], f)
    for s in [int(a) for a in sys.argv[1:]] or range(1, 11):
        run(s, kiln, d)
