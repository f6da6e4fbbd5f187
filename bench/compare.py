#!/usr/bin/env python3
"""compare.py: kiln bench against llama-bench, side by side (not run by CI).

    python3 bench/compare.py [--shapes smollm2-135m,qwen2.5-0.5b,...] [--types q4,q8,bf16]
                             [-t 2] [-p 512[,128...]] [-n 128] [-r 5] [--work DIR]

For every shape and bit width it writes a kiln checkpoint (`kiln synth`) and a
GGUF of the same shape (bench/gguf_synth.py: Q4_0 against q4, Q8_0 against
q8, F16 against bf16/f16), then runs llama-bench and kiln bench alternately,
one run each per round (the order flips every round), with the same thread
count, and prints the median tokens/s of each and their ratio. The machines
here are shared and noisy: read the ratios, never one absolute time.
-p takes a list (-p 512,128: one kiln run per length, one llama-bench run for
all of them, in each round); -n 0 times prompt processing only.
-d takes a list of depths (llama-bench's -d: that many tokens already in the
KV cache before each pp and tg; kiln bench -d): every result is reported per
depth, as pp512@d4096 and tg@d4096 (depth 0 keeps the plain names).
A shape named like a file in bench/configs (qwen3-30b-a3b-2l: Qwen3-30B-A3B's
config with 2 of its 48 layers) is written from that config (kiln synth
--config; gguf_synth.py maps qwen3_moe to llama.cpp's qwen3moe). For MoE shapes
the roofline divides by the weights one token reads: the routed experts' share
(experts used / experts) and everything else.

llama.cpp is built on demand from the git bundle that the npm package
node-llama-cpp ships (llama/gitRelease.bundle); nothing is downloaded here.
Give the bundle with --bundle (or LLAMA_BUNDLE), e.g. after
    npm pack node-llama-cpp@3.22.1 && tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle
or an existing build with --llama-dir (a llama.cpp checkout with build/bin/llama-bench).
Without llama.cpp, --baseline OTHER_KILN alternates kiln with another kiln
binary (e.g. the previous commit's) on the same checkpoints instead.

Each kiln run measures the bandwidth too (before and after its runs, several
read kernels and sizes, one of them the weights' own: see docs/performance.md);
a pair's roofline uses the best of all its measurements, so that a fraction
over 100% means the weights were read faster than any measurement saw.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_TYPE = {"q4": "q4_0", "q8": "q8_0", "bf16": "f16", "f16": "f16"}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def ensure_llama(a):
    bench = os.path.join(a.llama_dir, "build", "bin", "llama-bench")
    if os.path.exists(bench):
        return bench
    bundle = a.bundle or os.environ.get("LLAMA_BUNDLE")
    if not bundle:
        for c in ("node_modules/node-llama-cpp/llama/gitRelease.bundle", "package/llama/gitRelease.bundle"):
            if os.path.exists(os.path.join(ROOT, c)):
                bundle = os.path.join(ROOT, c)
    if not bundle or not os.path.exists(bundle):
        sys.exit("compare.py: no llama-bench and no node-llama-cpp bundle; run\n"
                 "  npm pack node-llama-cpp@3.22.1 && tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle\n"
                 "and pass --bundle package/llama/gitRelease.bundle (or --llama-dir to an existing build)")
    if not os.path.exists(a.llama_dir):
        subprocess.run(["git", "clone", "-q", bundle, a.llama_dir], check=True)
    print(f"building llama-bench in {a.llama_dir} (about 10 minutes on 2 cores)", file=sys.stderr)
    subprocess.run(["cmake", "-S", a.llama_dir, "-B", os.path.join(a.llama_dir, "build"), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DGGML_NATIVE=ON"], check=True)
    subprocess.run(["cmake", "--build", os.path.join(a.llama_dir, "build"), "-j2", "--target", "llama-bench"],
                   check=True)
    return bench


def at(name, d):
    return name if d == 0 else f"{name}@d{d}"


def llama_run(bench, gguf, a):
    out = run([bench, "-m", gguf, "-t", str(a.threads), "-p", a.p, "-n", str(a.n), "-d", a.d, "-r", "1", "-o", "json",
               *a.llama_arg])
    res = {}
    for t in json.loads(out):
        res[at(f"pp{t['n_prompt']}" if t["n_gen"] == 0 else "tg", t.get("n_depth", 0))] = t["avg_ts"]
    return res


def kiln_run(kiln, model, a, extra=()):
    """One kiln bench per prompt length (the first also times generation)."""
    res, j = {}, None
    for d in a.dlist:
        for i, p in enumerate(a.plist or [0]):
            n = a.n if i == 0 else 0
            out = run([kiln, "bench", "-m", model, "-t", str(a.threads), "-p", str(p), "-n", str(n), "-d", str(d),
                       "--batch", "0", "-r", "1", "--json", *extra])
            jj = json.loads(out)
            if "pp" in jj:
                res[at(f"pp{p}", d)] = jj["pp"]["tps"]
            if n and "tg" in jj:
                res[at("tg", d)] = jj["tg"]["tps"]
            if j is None or jj.get("bandwidth_gbs", 0) > j.get("bandwidth_gbs", 0):
                j = jj
    return res, j


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b,llama-3.2-1b,tinyllama-1.1b")
    ap.add_argument("--types", default="q4,q8,bf16")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count())
    ap.add_argument("-p", default="512", help="prompt length(s), comma-separated")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-d", default="0", help="depth(s), comma-separated: tokens in the KV cache before each run")
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--work", default=os.path.join(ROOT, "bench", "work"), help="models and results (git-ignored)")
    ap.add_argument("--llama-dir", default=os.path.join(ROOT, "bench", "work", "llama.cpp"))
    ap.add_argument("--bundle")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "kiln"), help="the kiln binary")
    ap.add_argument("--kiln-arg", action="append", default=[],
                    help="an extra argument for kiln bench, e.g. --kiln-arg=--int8-act (repeatable)")
    ap.add_argument("--llama-arg", action="append", default=[],
                    help="an extra argument for llama-bench, e.g. --llama-arg=-ctk --llama-arg=f16 (repeatable)")
    ap.add_argument("--baseline", help="another kiln binary to alternate with instead of llama.cpp")
    ap.add_argument("--prepare", action="store_true", help="only write the checkpoints and GGUF files")
    a = ap.parse_args()
    a.plist = [int(p) for p in a.p.split(",") if int(p) > 0]
    a.dlist = [int(d) for d in a.d.split(",")]
    keys = [at(k, d) for d in a.dlist for k in [f"pp{p}" for p in a.plist] + (["tg"] if a.n > 0 else [])]
    kiln = a.kiln
    if not os.path.exists(kiln):
        sys.exit("compare.py: build kiln first (make)")
    bench = None if a.prepare or a.baseline else ensure_llama(a)
    other = "baseline" if a.baseline else "llama"
    os.makedirs(a.work, exist_ok=True)
    pairs = []
    for shape in a.shapes.split(","):
        for dt in a.types.split(","):
            d = os.path.join(a.work, f"{shape}-{dt}")
            g = os.path.join(a.work, f"{shape}-{GGUF_TYPE[dt]}.gguf")
            if not os.path.exists(os.path.join(d, "model.safetensors")):
                cfg = os.path.join(ROOT, "bench", "configs", shape + ".json")  # a real config, fewer layers (MoE)
                src = ["--config", cfg] if os.path.exists(cfg) else ["--shape", shape]
                run([kiln, "synth", *src, "--dtype", dt, "--out", d])
            if not a.baseline and not os.path.exists(g):
                run([sys.executable, os.path.join(ROOT, "bench", "gguf_synth.py"), "--config",
                     os.path.join(d, "config.json"), "--type", GGUF_TYPE[dt], "--out", g])
            pairs.append((shape, dt, d, g))
    if a.prepare:
        return
    # freshly written files: let writeback finish before timing anything
    os.sync()
    time.sleep(10)
    bw = json.loads(run([kiln, "bench", "-m", pairs[0][2], "-t", str(a.threads), "-p", "0", "-n", "0",
                         "--json"]))["bandwidth_gbs"]
    results = []
    for shape, dt, d, g in pairs:
        k_runs, l_runs, kj = {k: [] for k in keys}, {k: [] for k in keys}, None
        best_bw = bw
        for r in range(a.rounds):
            order = ("kiln", "llama") if r % 2 == 0 else ("llama", "kiln")
            for who in order:
                if who == "kiln":
                    res, kj = kiln_run(kiln, d, a, a.kiln_arg)
                    runs = k_runs
                    best_bw = max(best_bw, kj.get("bandwidth_gbs", 0))
                elif a.baseline:
                    res, bj = kiln_run(a.baseline, d, a, a.kiln_arg)
                    runs = l_runs
                    best_bw = max(best_bw, bj.get("bandwidth_gbs", 0))
                else:
                    res, runs = llama_run(bench, g, a), l_runs
                for k, v in res.items():
                    runs[k].append(v)
        bw_pair = best_bw
        row = {"shape": shape, "dtype": dt, "against": a.baseline or GGUF_TYPE[dt], "threads": a.threads,
               "weight_bytes_per_token": kj["weight_bytes_per_token"], "bandwidth_gbs": bw_pair,
               "weights_fit_llc": kj.get("weights_fit_llc")}
        for k in keys:
            km, lm = statistics.median(k_runs[k]), statistics.median(l_runs[k])
            # per-round ratios too: the load changes between rounds more than within a pair
            rr = [x / y for x, y in zip(k_runs[k], l_runs[k])]
            row[k] = {"kiln": km, other: lm, "ratio": km / lm, "round_ratios": rr, "kiln_runs": k_runs[k],
                      other + "_runs": l_runs[k]}
        for k in keys:
            if k.startswith("tg"):
                row[k]["roofline_fraction"] = row[k]["kiln"] / (bw_pair * 1e9 / kj["weight_bytes_per_token"])
        results.append(row)
        if a.json:
            with open(a.json + "l", "a") as f:  # one line per pair as it completes
                f.write(json.dumps(row) + "\n")
        parts = [f"{k}: kiln {row[k]['kiln']:8.2f} {other} {row[k][other]:8.2f} x{row[k]['ratio']:.2f} "
                 f"(rounds {' '.join(f'{x:.2f}' for x in row[k]['round_ratios'])})" for k in keys if not k.startswith("tg")]
        for k in keys:
            if k.startswith("tg"):
                parts.append(f"tg{a.n}{k[2:]}: kiln {row[k]['kiln']:7.2f} {other} {row[k][other]:7.2f} "
                             f"x{row[k]['ratio']:.2f} (rounds {' '.join(f'{x:.2f}' for x in row[k]['round_ratios'])}), "
                             f"{100 * row[k]['roofline_fraction']:.0f}% of roofline at "
                             f"{bw_pair:.1f} GB/s{' (weights fit in the LLC)' if row['weights_fit_llc'] else ''}")
        print(f"{shape:16s} {dt:5s} " + " | ".join(parts), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"bandwidth_gbs": bw, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
