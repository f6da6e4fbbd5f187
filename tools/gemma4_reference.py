#!/usr/bin/python3
"""gemma4_reference.py: a pure-Python (float64, no NumPy) reference for
Gemma 4 text (gemma4_text), written from transformers' modeling_gemma4.py
(Gemma4TextModel, Gemma4TextDecoderLayer, Gemma4TextAttention,
Gemma4TextRouter / Gemma4TextExperts, the proportional rope of
modeling_rope_utils.py): per-layer inputs, KV sharing, double-wide MLP,
global_head_dim, K=V, v-norm, experts beside the dense MLP, layer_scalar,
final soft-cap. Not run by CI.

    /usr/bin/python3 tools/gemma4_reference.py check FIXTURE_DIR
        runs the reference over the fixture's all_ids (float32 or bfloat16
        weights) and prints the max |logit diff| against its logits.npy
        (proves the reference against transformers' own outputs)
    /usr/bin/python3 tools/gemma4_reference.py make --case {dense,moe} --out DIR [--seed N]
        writes config.json, generation_config.json, model.safetensors (bf16),
        oracle.json and logits.npy of a new random model of a shape the shared
        fixtures do not have (40-token prompt, 40 new tokens), in the layout
        of ../shared/oracle; the oracle is these rounded weights in float64.
"""
import json
import math
import os
import random
import struct
import sys

# ---------------------------------------------------------------- files


def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = data[8 + n + a:8 + n + b]
        if meta["dtype"] == "F32":
            vals = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        elif meta["dtype"] == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack(f"<{len(raw) // 2}H", raw)]
        else:
            raise SystemExit(f"{path}: {name}: dtype {meta['dtype']} not handled (float checkpoints only)")
        out[name] = (meta["shape"], vals)
    return out


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def st_write(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (shape, vals) in sorted(tensors.items()):
        blob = struct.pack(f"<{len(vals)}H", *[bf16_bits(v) for v in vals])
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def npy_read(path):
    with open(path, "rb") as f:
        data = f.read()
    hl = struct.unpack("<H", data[8:10])[0]
    hdr = data[10:10 + hl].decode()
    shape = tuple(int(s) for s in hdr.split("'shape': (")[1].split(")")[0].split(",") if s.strip())
    vals = struct.unpack(f"<{shape[0] * shape[1]}f", data[10 + hl:])
    return [list(vals[r * shape[1]:(r + 1) * shape[1]]) for r in range(shape[0])]


def npy_write(path, rows):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (len(rows), len(rows[0]))
    hdr += " " * ((64 - (10 + len(hdr) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack(f"<{sum(len(r) for r in rows)}f", *[v for r in rows for v in r]))


# ---------------------------------------------------------------- maths


def matvec(w, x):
    """w: rows (lists), x: list"""
    return [sum(a * b for a, b in zip(row, x)) for row in w]


def rms(x, w, eps):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * (w[i] if w is not None else 1.0) for i, v in enumerate(x)]


def gelu_tanh(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def act(name, x):
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return gelu_tanh(x)
    if name == "silu":
        return x / (1 + math.exp(-x))
    if name == "gelu":
        return 0.5 * x * (1 + math.erf(x / math.sqrt(2)))
    raise SystemExit(f"activation {name} not handled")


def rope(x, inv, pos):
    d = len(x) // 2
    out = list(x)
    for i in range(d):
        a = pos * inv[i]
        c, s = math.cos(a), math.sin(a)
        out[i] = x[i] * c - x[i + d] * s
        out[i + d] = x[i + d] * c + x[i] * s
    return out


def attend(qs, K, V, lo, pos):
    """unscaled softmax attention of the query heads qs over cached positions lo..pos (grouped KV heads)"""
    att = []
    for hq in range(len(qs)):
        hk = hq // (len(qs) // len(K[0]))
        sc = [sum(a * b for a, b in zip(qs[hq], K[t][hk])) for t in range(lo, pos + 1)]
        mx = max(sc)
        e = [math.exp(v - mx) for v in sc]
        z = sum(e)
        att += [sum(e[j] / z * V[lo + j][hk][d] for j in range(len(e))) for d in range(len(qs[hq]))]
    return att


def inv_freq(params, dim):
    theta = params.get("rope_theta", 10000.0)
    if params.get("rope_type", "default") == "proportional":
        n = int(params.get("partial_rotary_factor", 1.0) * dim // 2)
        factor = params.get("factor", 1.0)
        return [(1.0 / theta ** (2 * i / dim) if i < n else 0.0) / factor for i in range(dim // 2)]
    rd = int(dim * params.get("partial_rotary_factor", 1.0))
    if rd != dim:
        raise SystemExit("partial default rope not handled")
    return [1.0 / theta ** (2 * i / dim) for i in range(dim // 2)]


# ---------------------------------------------------------------- the model


class Model:
    def __init__(self, cfg, w):
        self.c = cfg
        self.w = w
        c = cfg
        self.L = c["num_hidden_layers"]
        self.Hd = c["hidden_size"]
        self.types = c["layer_types"]
        self.eps = c["rms_norm_eps"]
        n_shared = c.get("num_kv_shared_layers") or 0
        first = self.L - n_shared
        self.src = {}
        for il in range(first, self.L):
            self.src[il] = max(j for j in range(first) if self.types[j] == self.types[il])
        self.ple = c.get("hidden_size_per_layer_input") or 0
        rp = c["rope_parameters"]
        self.gdim = c.get("global_head_dim") or c["head_dim"]
        self.memo = {}
        self.cache = [([], []) for _ in range(self.L)]
        self.inv = {"sliding_attention": inv_freq(rp["sliding_attention"], c["head_dim"]),
                    "full_attention": inv_freq(rp["full_attention"], self.gdim)}

    def m(self, name):
        """a 2-D tensor as rows, or a 1-D one as a list"""
        full = "model." + name if not name.startswith("lm_head") else name
        shape, vals = self.w[full]
        if len(shape) == 1:
            return vals
        cols = shape[-1]
        return [vals[r * cols:(r + 1) * cols] for r in range(len(vals) // cols)]

    def layer_dims(self, il):
        c = self.c
        full = self.types[il] == "full_attention"
        D = self.gdim if full else c["head_dim"]
        kv = c["num_key_value_heads"]
        keqv = bool(c.get("attention_k_eq_v")) and full
        if keqv:
            kv = c.get("num_global_key_value_heads") or kv
        return D, kv, keqv, full

    def g(self, name):
        if name not in self.memo:
            self.memo[name] = self.m(name)
        return self.memo[name]

    def step(self, pos, tok):
        """the logits after token tok at position pos (the caches hold 0 .. pos-1)"""
        c = self.c
        H, eps, act_name = self.Hd, self.eps, c["hidden_activation"]
        nh = c["num_attention_heads"]
        g, cache = self.g, self.cache
        emb = g("embed_tokens.weight")
        if True:
            x = [v * math.sqrt(H) for v in emb[tok]]
            if self.ple:
                P = self.ple
                pe = g("embed_tokens_per_layer.weight")[tok if tok < c["vocab_size_per_layer_input"] else 0]
                proj = [v / math.sqrt(H) for v in matvec(g("per_layer_model_projection.weight"), x)]
                pli = []
                for il in range(self.L):
                    pr = rms(proj[il * P:(il + 1) * P], g("per_layer_projection_norm.weight"), eps)
                    pli.append([(a + b * math.sqrt(P)) / math.sqrt(2) for a, b in zip(pr, pe[il * P:(il + 1) * P])])
            for il in range(self.L):
                p = f"layers.{il}."
                D, kv, keqv, full = self.layer_dims(il)
                inv = self.inv[self.types[il]]
                res = x
                h = rms(x, g(p + "input_layernorm.weight"), eps)
                q = matvec(g(p + "self_attn.q_proj.weight"), h)
                qs = [rope(rms(q[i * D:(i + 1) * D], g(p + "self_attn.q_norm.weight"), eps), inv, pos) for i in range(nh)]
                if il in self.src:
                    K, V = cache[self.src[il]]
                else:
                    k = matvec(g(p + "self_attn.k_proj.weight"), h)
                    v = k if keqv else matvec(g(p + "self_attn.v_proj.weight"), h)
                    cache[il][0].append([rope(rms(k[i * D:(i + 1) * D], g(p + "self_attn.k_norm.weight"), eps), inv, pos)
                                         for i in range(kv)])
                    cache[il][1].append([rms(v[i * D:(i + 1) * D], None, eps) for i in range(kv)])
                    K, V = cache[il]
                att = attend(qs, K, V, 0 if full else max(0, pos - c["sliding_window"] + 1), pos)
                a = matvec(g(p + "self_attn.o_proj.weight"), att)
                x = [r + v for r, v in zip(res, rms(a, g(p + "post_attention_layernorm.weight"), eps))]
                res = x
                h = rms(x, g(p + "pre_feedforward_layernorm.weight"), eps)
                gt = matvec(g(p + "mlp.gate_proj.weight"), h)
                up = matvec(g(p + "mlp.up_proj.weight"), h)
                mo = matvec(g(p + "mlp.down_proj.weight"), [act(act_name, a) * b for a, b in zip(gt, up)])
                if c.get("enable_moe_block"):
                    m1 = rms(mo, g(p + "post_feedforward_layernorm_1.weight"), eps)
                    r = rms(res, None, eps)
                    r = [v * s / math.sqrt(H) for v, s in zip(r, g(p + "router.scale"))]
                    lg = matvec(g(p + "router.proj.weight"), r)
                    mx = max(lg)
                    pr = [math.exp(v - mx) for v in lg]
                    z = sum(pr)
                    pr = [v / z for v in pr]
                    top = sorted(range(len(pr)), key=lambda e: (-pr[e], e))[:c["top_k_experts"]]
                    ws = sum(pr[e] for e in top)
                    h2 = rms(res, g(p + "pre_feedforward_layernorm_2.weight"), eps)
                    gu_shape, gu = self.w["model." + p + "experts.gate_up_proj"]
                    dn_shape, dn = self.w["model." + p + "experts.down_proj"]
                    F = gu_shape[1] // 2
                    y = [0.0] * H
                    for e in top:
                        we = pr[e] / ws * g(p + "router.per_expert_scale")[e]
                        base = e * 2 * F * H
                        ge = [sum(gu[base + f * H + j] * h2[j] for j in range(H)) for f in range(F)]
                        ue = [sum(gu[base + (F + f) * H + j] * h2[j] for j in range(H)) for f in range(F)]
                        me = [act(act_name, a) * b for a, b in zip(ge, ue)]
                        for o in range(H):
                            y[o] += we * sum(dn[e * H * F + o * F + f] * me[f] for f in range(F))
                    m2 = rms(y, g(p + "post_feedforward_layernorm_2.weight"), eps)
                    mo = [a + b for a, b in zip(m1, m2)]
                x = [r + v for r, v in zip(res, rms(mo, g(p + "post_feedforward_layernorm.weight"), eps))]
                if self.ple:
                    gg = [act(act_name, v) * b for v, b in zip(matvec(g(p + "per_layer_input_gate.weight"), x), pli[il])]
                    pp = rms(matvec(g(p + "per_layer_projection.weight"), gg), g(p + "post_per_layer_input_norm.weight"), eps)
                    x = [a + b for a, b in zip(x, pp)]
                sc = g(p + "layer_scalar")[0]
                x = [v * sc for v in x]
            hN = rms(x, g("norm.weight"), eps)
            lg = matvec(emb, hN)
            cap = c.get("final_logit_softcapping")
            if cap:
                lg = [cap * math.tanh(v / cap) for v in lg]
            return lg


# ---------------------------------------------------------------- commands


CASES = {
    # an E2B-like shape the shared fixture lacks: 6 layers (2 sliding per full), 6 heads over 2 KV heads,
    # 3 KV-shared layers, PLE 8, a wider global head, partial rotary 0.5, untied vocabulary of 640
    "dense": dict(hidden_size=96, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                  global_head_dim=48, intermediate_size=80, num_kv_shared_layers=3, hidden_size_per_layer_input=8,
                  use_double_wide_mlp=True, attention_k_eq_v=False, enable_moe_block=False, prf=0.5,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2),
    # a 26B-A4B-like shape: K=V with 2 global KV heads, top-3 of 6 experts, 1 KV-shared layer
    "moe": dict(hidden_size=96, num_hidden_layers=5, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
                global_head_dim=32, intermediate_size=64, num_kv_shared_layers=1, hidden_size_per_layer_input=0,
                use_double_wide_mlp=False, attention_k_eq_v=True, num_global_key_value_heads=2, enable_moe_block=True,
                num_experts=6, top_k_experts=3, moe_intermediate_size=16, prf=0.25,
                layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                             "full_attention"]),
}


def make(case, out, seed):
    s = dict(CASES[case])
    prf = s.pop("prf")
    V = 640
    cfg = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "attention_bias": False,
           "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 256,
           "rms_norm_eps": 1e-6, "sliding_window": 8, "tie_word_embeddings": True, "vocab_size": V,
           "vocab_size_per_layer_input": V, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
           "use_bidirectional_attention": None, "dtype": "bfloat16",
           "rope_parameters": {"full_attention": {"partial_rotary_factor": prf, "rope_theta": 1000000.0,
                                                  "rope_type": "proportional"},
                               "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}
    cfg.update(s)
    cfg.setdefault("num_global_key_value_heads", None)
    for k in ("num_experts", "top_k_experts", "moe_intermediate_size"):
        cfg.setdefault(k, None)
    rng = random.Random(seed)
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    w = {}

    def mat(name, rows, cols, std=0.1):
        w[name] = ([rows, cols], [rng.gauss(0, std) for _ in range(rows * cols)])

    def vec(name, n, mean=1.0):
        w[name] = ([n], [mean + rng.gauss(0, 0.1) for _ in range(n)])

    mat("model.embed_tokens.weight", V, H)
    vec("model.norm.weight", H)
    P = cfg["hidden_size_per_layer_input"]
    if P:
        mat("model.embed_tokens_per_layer.weight", V, L * P)
        mat("model.per_layer_model_projection.weight", L * P, H)
        vec("model.per_layer_projection_norm.weight", P)
    m = Model(cfg, {})
    for il in range(L):
        p = f"model.layers.{il}."
        D, kv, keqv, full = m.layer_dims(il)
        nh = cfg["num_attention_heads"]
        mat(p + "self_attn.q_proj.weight", nh * D, H)
        vec(p + "self_attn.q_norm.weight", D)
        mat(p + "self_attn.o_proj.weight", H, nh * D)
        if il not in m.src:
            mat(p + "self_attn.k_proj.weight", kv * D, H)
            vec(p + "self_attn.k_norm.weight", D)
            if not keqv:
                mat(p + "self_attn.v_proj.weight", kv * D, H)
        F = cfg["intermediate_size"] * (2 if cfg["use_double_wide_mlp"] and il in m.src else 1)
        mat(p + "mlp.gate_proj.weight", F, H)
        mat(p + "mlp.up_proj.weight", F, H)
        mat(p + "mlp.down_proj.weight", H, F)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            vec(p + n + ".weight", H)
        vec(p + "layer_scalar", 1)
        if P:
            mat(p + "per_layer_input_gate.weight", P, H)
            mat(p + "per_layer_projection.weight", H, P)
            vec(p + "post_per_layer_input_norm.weight", H)
        if cfg["enable_moe_block"]:
            E, FE = cfg["num_experts"], cfg["moe_intermediate_size"]
            for n in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                vec(p + n + ".weight", H)
            mat(p + "router.proj.weight", E, H, 0.3)
            vec(p + "router.scale", H)
            vec(p + "router.per_expert_scale", E)
            w[p + "experts.gate_up_proj"] = ([E, 2 * FE, H], [rng.gauss(0, 0.1) for _ in range(E * 2 * FE * H)])
            w[p + "experts.down_proj"] = ([E, H, FE], [rng.gauss(0, 0.1) for _ in range(E * H * FE)])
    write_fixture(out, cfg, w, Model, f"Gemma 4 {case} of an unseen shape", f"tools/gemma4_reference.py make --case {case} --seed {seed}", rng)


def write_fixture(out, cfg, w, model_class, exercises, reference, rng):
    """greedy 40 tokens after a 40-token prompt on the bf16-rounded weights w; writes the fixture folder"""
    V = cfg["vocab_size"]
    rounded = {k: (sh, [struct.unpack("<f", struct.pack("<I", bf16_bits(v) << 16))[0] for v in vals]) for k, (sh, vals) in w.items()}
    prompt = [1] + [rng.randrange(3, V) for _ in range(39)]
    model = model_class(cfg, rounded)
    for pos, tok in enumerate(prompt):
        lg = model.step(pos, tok)
    ids, gaps, rows = list(prompt), [], [lg]
    for _ in range(40):
        order = sorted(range(V), key=lambda i: -lg[i])
        gaps.append(lg[order[0]] - lg[order[1]])
        ids.append(order[0])
        lg = model.step(len(ids) - 1, order[0])
        rows.append(lg)
    os.makedirs(out, exist_ok=True)
    st_write(os.path.join(out, "model.safetensors"), w)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, open(os.path.join(out, "generation_config.json"), "w"))
    npy_write(os.path.join(out, "logits.npy"), rows)
    orc = {"fixture": os.path.basename(out.rstrip("/")), "model_type": cfg["model_type"], "exercises": exercises,
           "reference": reference, "compute_dtype": "float64", "prompt_ids": prompt, "generated_ids": ids[len(prompt):],
           "all_ids": ids, "top1_top2_gap": gaps, "min_gap": min(gaps)}
    json.dump(orc, open(os.path.join(out, "oracle.json"), "w"), indent=1)
    print(f"{out}: min top1-top2 gap {min(gaps):.3g}")


def check_with(model_class, d):
    """the max |logit diff| of model_class against the transformers fixture d"""
    cfg = json.load(open(os.path.join(d, "config.json")))
    orc = json.load(open(os.path.join(d, "oracle.json")))
    ref = npy_read(os.path.join(d, "logits.npy"))
    m = model_class(cfg, st_read(os.path.join(d, "model.safetensors")))
    lg = [m.step(pos, tok) for pos, tok in enumerate(orc["all_ids"])]
    rows = lg[len(orc["prompt_ids"]) - 1:]
    md = max(abs(a - b) for r1, r2 in zip(rows, ref) for a, b in zip(r1, r2))
    print(f"{d}: max |logit diff| {md:.3g} over {len(ref)} rows")
    return md


def cli(model_class, make_fn, doc):
    a = sys.argv[1:]
    if len(a) >= 2 and a[0] == "check":
        for d in a[1:]:
            check_with(model_class, d)
        return
    if a and a[0] == "make":
        make_fn(dict(zip(a[1::2], a[2::2])))
        return
    raise SystemExit(doc)


def main():
    cli(Model, lambda o: make(o["--case"], o["--out"], int(o.get("--seed", 1))), __doc__)


if __name__ == "__main__":
    main()
