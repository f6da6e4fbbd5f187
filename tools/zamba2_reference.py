#!/usr/bin/python3
"""zamba2_reference.py: a NumPy (float64) reference for Zamba2, transcribed
from transformers' modeling_zamba2.py (4.57, Zamba2MambaMixer.torch_forward,
Zamba2Attention, Zamba2MLP, Zamba2HybridLayer, Zamba2Model), with a switch
for the bug of transformers' CPU path (not run by CI).

The bug: torch_forward's naive chunked SSD carries the states between chunks
with

    result = (decay_chunk[..., None, None] * states_permuted[:, :, None, ...]).sum(dim=2)

which sums over the *output* chunk z; Mamba-2 (the model's authors, and
transformers' CUDA path, mamba_chunk_scan_combined) sums over the source
chunk c. A first forward call longer than chunk_size therefore hands a wrong
state to its later chunks and keeps only its last chunk's state, so the
result depends on how tokens are grouped into calls. The shared fixture
../shared/oracle/fixtures/zamba2 was made on that path.

    /usr/bin/python3 tools/zamba2_reference.py check [FIXTURE_DIR]
        simulates transformers' greedy generate (a chunked first call, then
        one-token cached steps) and the final no-cache forward, with the bug
        on and off, and prints the max |logit diff| per row group against the
        fixture's logits.npy: with --bug semantics it reproduces the oracle
        (~1e-6), the correct recurrence is 1e-3..1e-2 away from it.
    /usr/bin/python3 tools/zamba2_reference.py make --out DIR [FIXTURE_DIR]
        writes the same model (config, float32 weights, generation config)
        with an oracle.json and logits.npy computed with the correct
        recurrence (bug off), greedy from the fixture's prompt, in the layout
        of ../shared/oracle (row 0: the prompt's last position, row i: after
        generated token i). Without the bug the model is chunking-independent,
        so every row comes from one full forward over all_ids.
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np

DEFAULT = "/work/shared/oracle/fixtures/zamba2"


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
        raw = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.uint8)
        if meta["dtype"] == "F32":
            arr = raw.view(np.float32)
        elif meta["dtype"] == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {meta['dtype']} not handled (float checkpoints only)")
        out[name] = arr.reshape(meta["shape"]).astype(np.float64)
    return out


_erf = np.vectorize(math.erf)


def act(name, x):
    if name == "gelu":
        return 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    if name == "silu":
        return x / (1 + np.exp(-x))
    raise SystemExit(f"hidden_act {name} not handled")


def silu(x):
    return x / (1 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def rms(x, w, eps):
    return w * (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps))


def segsum(x):
    """mamba2's segment_sum: x [..., L] -> [..., L, L], sum of x[j+1..i] at [i, j], -inf above."""
    L = x.shape[-1]
    xe = np.repeat(x[..., None], L, axis=-1)
    xe = np.where(np.tril(np.ones((L, L), bool), -1), xe, 0)
    cs = np.cumsum(xe, axis=-2)
    return np.where(np.tril(np.ones((L, L), bool), 0), cs, -np.inf)


def ssd_chunked(x, dt, A, B, C, cs, bug):
    """torch_forward's naive chunked SSD from a zero state. x [T,H,P], dt [T,H],
    A [H], B, C [T,H,N] (heads already repeated). Returns y [T,H,P] (no D) and the final state [H,P,N]."""
    T, H, P = x.shape
    N = B.shape[-1]
    pad = (cs - T % cs) % cs

    def chunks(t):
        t = np.concatenate([t, np.zeros((pad,) + t.shape[1:])])
        return t.reshape((-1, cs) + t.shape[1:])

    xs, Ad, Bc, Cc = chunks(x * dt[..., None]), chunks(A[None, :] * dt), chunks(B), chunks(C)
    Ad = Ad.transpose(2, 0, 1)  # [h, c, l]
    Acs = np.cumsum(Ad, -1)
    Lm = np.exp(segsum(Ad))  # [h, c, l, s]
    G = np.einsum("clhn,cshn->clsh", Cc, Bc)
    M = G * Lm.transpose(1, 2, 3, 0)
    Ydiag = np.einsum("clsh,cshp->clhp", M, xs)
    decay_states = np.exp(Acs[:, :, -1:] - Acs)  # [h, c, l]
    states = np.einsum("clhn,clhp->chpn", Bc * decay_states.transpose(1, 2, 0)[..., None], xs)
    states = np.concatenate([np.zeros((1, H, P, N)), states])  # [c+1, h, p, n]
    dc = np.exp(segsum(np.pad(Acs[:, :, -1], ((0, 0), (1, 0)))))  # [h, z, c]
    if bug:  # .sum(dim=2): over the output chunk z
        new = np.einsum("hzc,chpn->chpn", dc, states)
    else:  # Mamba-2: over the source chunk c
        new = np.einsum("hzc,chpn->zhpn", dc, states)
    st, final = new[:-1], new[-1]
    Yoff = np.einsum("clhn,chpn->clhp", Cc, st) * np.exp(Acs).transpose(1, 2, 0)[..., None]
    return (Ydiag + Yoff).reshape(-1, H, P)[:T], final


class Model:
    def __init__(self, d):
        self.cfg = json.load(open(os.path.join(d, "config.json")))
        self.W = st_read(os.path.join(d, "model.safetensors"))
        c = self.cfg
        self.H = c["hidden_size"]
        self.eps = c.get("rms_norm_eps", 1e-5)
        self.types = c["layers_block_type"]
        self.hybrid = [i for i, t in enumerate(self.types) if t == "hybrid"]
        self.Di = int(c.get("mamba_expand", 2) * self.H)
        self.nh = c.get("n_mamba_heads", 8)
        self.hd = self.Di // self.nh
        self.G = c.get("mamba_ngroups", 1)
        self.N = c.get("mamba_d_state", 64)
        self.K = c.get("mamba_d_conv", 4)
        self.nH = c["num_attention_heads"]
        self.nK = c.get("num_key_value_heads") or self.nH
        self.D = 2 * self.H // self.nH
        theta = c.get("rope_theta", 10000)
        if c.get("use_long_context"):
            theta = theta * 8 ** (self.D / (self.D - 2))
        self.inv = 1.0 / (np.float64(theta) ** (np.arange(0, self.D, 2) / self.D))

    def w(self, name):
        return self.W[name]

    def lin(self, x, name, bias=False):
        y = x @ self.w(name + ".weight").T
        if bias and name + ".bias" in self.W:
            y = y + self.W[name + ".bias"]
        return y

    def new_cache(self):
        L = len(self.types)
        conv_dim = self.Di + 2 * self.G * self.N
        return {"conv": [np.zeros((self.K - 1, conv_dim)) for _ in range(L)],
                "ssm": [np.zeros((self.nh, self.hd, self.N)) for _ in range(L)],
                "k": [np.zeros((0, self.nK, self.D)) for _ in range(L)],
                "v": [np.zeros((0, self.nK, self.D)) for _ in range(L)],
                "pos": 0, "started": False}

    def mamba(self, x, p, il, cache, chunked, bug):
        c = self.cfg
        T = x.shape[0]
        Di, nh, hd, G, N, K = self.Di, self.nh, self.hd, self.G, self.N, self.K
        zx = self.lin(x, p + "in_proj", c.get("add_bias_linear", False))
        z, xbc, dt = zx[:, :Di], zx[:, Di:2 * Di + 2 * G * N], zx[:, 2 * Di + 2 * G * N:]
        cw = self.w(p + "conv1d.weight")[:, 0, :]
        full = np.concatenate([cache["conv"][il], xbc])
        y = np.stack([(full[t:t + K] * cw.T).sum(0) for t in range(T)])
        if p + "conv1d.bias" in self.W:
            y = y + self.w(p + "conv1d.bias")
        cache["conv"][il] = full[-(K - 1):]
        y = silu(y)
        xs, B, C = y[:, :Di], y[:, Di:Di + G * N].reshape(T, G, N), y[:, Di + G * N:].reshape(T, G, N)
        dt = np.maximum(softplus(dt + self.w(p + "dt_bias")), c.get("time_step_min", 0.001))
        A = -np.exp(self.w(p + "A_log"))
        x3 = xs.reshape(T, nh, hd)
        Bh, Ch = np.repeat(B, nh // G, axis=1), np.repeat(C, nh // G, axis=1)
        if chunked:  # transformers' first call: chunked SSD from a zero state
            out, cache["ssm"][il] = ssd_chunked(x3, dt, A, Bh, Ch, c.get("chunk_size", 256), bug)
        else:  # the recurrence token by token (transformers' cached step; Mamba-2 itself)
            h = cache["ssm"][il]
            out = np.zeros((T, nh, hd))
            for t in range(T):
                h = np.exp(dt[t] * A)[:, None, None] * h + (dt[t][:, None] * Bh[t])[:, None, :] * x3[t][:, :, None]
                out[t] = np.einsum("hpn,hn->hp", h, Ch[t])
            cache["ssm"][il] = h
        out = (out + x3 * self.w(p + "D")[None, :, None]).reshape(T, Di)
        g = (out * silu(z)).reshape(T, G, Di // G)  # Zamba2RMSNormGated: gate first, groups, eps 1e-5
        g = (g / np.sqrt((g * g).mean(-1, keepdims=True) + 1e-5)).reshape(T, Di) * self.w(p + "norm.weight")
        return self.lin(g, p + "out_proj", c.get("add_bias_linear", False))

    def rope(self, x, pos):
        fr = np.outer(pos, self.inv)
        emb = np.concatenate([fr, fr], -1)
        cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
        x1, x2 = x[..., :self.D // 2], x[..., self.D // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    def shared(self, x, emb, il, j, cache):
        c = self.cfg
        lb = self.hybrid[j % c.get("num_mem_blocks", 1)]
        p = "model.layers.%d.shared_transformer." % lb
        T = x.shape[0]
        h = rms(np.concatenate([x, emb], -1), self.w(p + "input_layernorm.weight"), self.eps)
        qkv = []
        for which, heads in (("q", self.nH), ("k", self.nK), ("v", self.nK)):
            y = self.lin(h, p + "self_attn.%s_proj" % which)
            if c.get("use_shared_attention_adapter"):
                a = p + "self_attn.linear_%s_adapter_list.%d." % (which, j)
                y = y + (h @ self.w(a + "0.weight").T) @ self.w(a + "1.weight").T
            qkv.append(y.reshape(T, heads, self.D))
        q, k, v = qkv
        pos = cache["pos"] + np.arange(T)
        if c.get("use_mem_rope"):
            q, k = self.rope(q, pos), self.rope(k, pos)
        cache["k"][il] = np.concatenate([cache["k"][il], k])
        cache["v"][il] = np.concatenate([cache["v"][il], v])
        K, V = cache["k"][il], cache["v"][il]
        S = K.shape[0]
        o = np.zeros((T, self.nH, self.D))
        mask = np.where(np.arange(S)[None, :] <= pos[:, None], 0.0, -np.inf)
        for hh in range(self.nH):
            kv = hh // (self.nH // self.nK)
            s = q[:, hh] @ K[:, kv].T / math.sqrt(self.D / 2) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ V[:, kv]
        a = self.lin(o.reshape(T, self.nH * self.D), p + "self_attn.o_proj")
        a = rms(a, self.w(p + "pre_ff_layernorm.weight"), self.eps)
        gu = self.lin(a, p + "feed_forward.gate_up_proj", c.get("add_bias_linear", False))
        ad = p + "feed_forward.gate_up_proj_adapter_list.%d." % j
        gu = gu + (a @ self.w(ad + "0.weight").T) @ self.w(ad + "1.weight").T
        F = gu.shape[1] // 2
        f = act(c.get("hidden_act", "gelu"), gu[:, :F]) * gu[:, F:]
        f = self.lin(f, p + "feed_forward.down_proj", c.get("add_bias_linear", False))
        return self.lin(f, "model.layers.%d.linear" % il)

    def forward(self, ids, cache, bug):
        """One forward call on ids (continuing cache); logits [T, vocab]. The
        first call with bug runs the chunked SSD (torch_forward without a
        previous state); every other call runs the recurrence."""
        chunked = bug and not cache["started"]
        emb = self.w("model.embed_tokens.weight")[ids]
        x = emb.copy()
        j = 0
        for il, t in enumerate(self.types):
            if t == "hybrid":
                tr = self.shared(x, emb, il, j, cache)
                p = "model.layers.%d.mamba_decoder." % il
                x = x + self.mamba(rms(x + tr, self.w(p + "input_layernorm.weight"), self.eps), p + "mamba.", il, cache,
                                   chunked, bug)
                j += 1
            else:
                p = "model.layers.%d." % il
                x = x + self.mamba(rms(x, self.w(p + "input_layernorm.weight"), self.eps), p + "mamba.", il, cache,
                                   chunked, bug)
        cache["pos"] += len(ids)
        cache["started"] = True
        head = "lm_head.weight" if "lm_head.weight" in self.W else "model.embed_tokens.weight"
        return rms(x, self.w("model.final_layernorm.weight"), self.eps) @ self.w(head).T


def oracle_rows(m, prompt, gen, bug):
    """transformers' generate rows: row 0 from the prompt call, rows 1..n-1
    from one-token cached calls, row n from a no-cache forward over all ids."""
    cache = m.new_cache()
    rows = [m.forward(np.array(prompt), cache, bug)[-1]]
    for t in gen[:-1]:
        rows.append(m.forward(np.array([t]), cache, bug)[-1])
    rows.append(m.forward(np.array(prompt + gen), m.new_cache(), bug)[-1])
    return np.stack(rows)


def check(d):
    m = Model(d)
    o = json.load(open(os.path.join(d, "oracle.json")))
    L = np.load(os.path.join(d, "logits.npy")).astype(np.float64)
    for bug in (True, False):
        r = oracle_rows(m, o["prompt_ids"], o["generated_ids"], bug)
        diff = np.abs(r - L).max(-1)
        print("%s: row 0 (prompt) %.3g, rows 1..%d (cached steps) %.3g, row %d (no-cache forward) %.3g" %
              ("bug on " if bug else "bug off", diff[0], len(diff) - 2, diff[1:-1].max(), len(diff) - 1, diff[-1]))
    # the chunked SSD summed over the source chunk is the recurrence; over the output chunk it is not
    rng = np.random.default_rng(0)
    T, H, P, N = 21, 3, 4, 5
    x, dt = rng.standard_normal((T, H, P)), rng.uniform(0.01, 0.5, (T, H))
    A, B, C = -rng.uniform(0.5, 2, H), rng.standard_normal((T, H, N)), rng.standard_normal((T, H, N))
    h, ref = np.zeros((H, P, N)), np.zeros((T, H, P))
    for t in range(T):
        h = np.exp(dt[t] * A)[:, None, None] * h + (dt[t][:, None] * B[t])[:, None, :] * x[t][:, :, None]
        ref[t] = np.einsum("hpn,hn->hp", h, C[t])
    for bug in (False, True):
        y, fin = ssd_chunked(x, dt, A, B, C, 8, bug)
        print("chunked SSD (chunk 8, %d tokens) %s vs the recurrence: y %.3g, final state %.3g" %
              (T, "bug on " if bug else "bug off", np.abs(y - ref).max(), np.abs(fin - h).max()))


def make(out, d):
    m = Model(d)
    o = json.load(open(os.path.join(d, "oracle.json")))
    prompt, n_gen = o["prompt_ids"], len(o["generated_ids"])
    gen = []
    for _ in range(n_gen):  # greedy; without the bug one full forward per step gives the same numbers as a cache
        gen.append(int(np.argmax(m.forward(np.array(prompt + gen), m.new_cache(), False)[-1])))
    all_ids = prompt + gen
    lg = m.forward(np.array(all_ids), m.new_cache(), False)[len(prompt) - 1:]
    srt = np.sort(lg, -1)
    gaps = (srt[:, -1] - srt[:, -2]).tolist()
    os.makedirs(out, exist_ok=True)
    for fn in ("config.json", "generation_config.json", "model.safetensors"):
        shutil.copy(os.path.join(d, fn), out)
        os.chmod(os.path.join(out, fn), 0o644)
    np.save(os.path.join(out, "logits.npy"), lg.astype(np.float32))
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump({"fixture": os.path.basename(out.rstrip("/")), "model_type": "zamba2",
                   "exercises": "Zamba2 with Mamba-2's exact recurrence (transformers' CUDA semantics): the weights of "
                                "../shared/oracle/fixtures/zamba2, whose oracle carries the CPU path's chunked-SSD bug",
                   "reference": "tools/zamba2_reference.py make (NumPy float64, bug off)",
                   "compute_dtype": "float64", "prompt_ids": prompt, "generated_ids": gen, "all_ids": all_ids,
                   "logits_file": "logits.npy", "logits_shape": list(lg.shape),
                   "logits_rows": "row0=prompt last position; row i=after generated token i (one full forward: the "
                                  "model is chunking-independent)",
                   "decoding": "greedy", "top1_top2_gap": [round(g, 6) for g in gaps],
                   "weights_file": "model.safetensors", "weights_dtype": "float32"}, f, indent=1)
    print("wrote %s: %d prompt + %d generated tokens, min top-2 gap %.4f" % (out, len(prompt), n_gen, min(gaps)))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["check"]:
        check(args[1] if len(args) > 1 else DEFAULT)
    elif args[:1] == ["make"] and len(args) >= 3 and args[1] == "--out":
        make(args[2], args[3] if len(args) > 3 else DEFAULT)
    else:
        raise SystemExit(__doc__)
