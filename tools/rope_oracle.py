#!/usr/bin/env python3
"""Reference rotary tables for kiln's rope tests (tests/data/rope/cases.json).

Re-derives, with torch in float32, the inverse frequencies and attention
factors that transformers' modeling_rope_utils.py (4.57) computes for each
rope_scaling type, and the cos/sin rows its rotary embedding produces for a
few positions (`dynamic` and `longrope` depend on the sequence length).
Run: /usr/bin/python3 tools/rope_oracle.py > tests/data/rope/cases.json
"""
import json
import math

import torch


def default_inv(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def params(case):
    rs, base, dim, maxp = case["rope_scaling"], case["theta"], case["dim"], case["max_pos"]
    t = (rs or {}).get("rope_type", "default")
    if t == "default":
        return default_inv(base, dim), 1.0
    if t == "linear":
        return default_inv(base, dim) / rs["factor"], 1.0
    if t == "dynamic":
        seq = max(case.get("seq_len", maxp), maxp)
        f = rs["factor"]
        b = base * ((f * seq / maxp) - (f - 1)) ** (dim / (dim - 2))
        return default_inv(b, dim), 1.0
    if t == "llama3":
        inv = default_inv(base, dim)
        f, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        low_wl, high_wl = old / lo, old / hi
        wl = 2 * math.pi / inv
        out = torch.where(wl > low_wl, inv / f, inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / f + smooth * out
        med = ~(wl < high_wl) * ~(wl > low_wl)
        return torch.where(med, smoothed, out), 1.0
    if t == "yarn":
        f = rs["factor"]
        attn = rs.get("attention_factor")
        ms, msa = rs.get("mscale"), rs.get("mscale_all_dim")
        if "original_max_position_embeddings" in rs:
            orig = rs["original_max_position_embeddings"]
            f = maxp / orig
        else:
            orig = maxp

        def gm(s, m=1):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

        if attn is None:
            attn = gm(f, ms) / gm(f, msa) if ms and msa else gm(f)
        bf, bs = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def cdim(r):
            return (dim * math.log(orig / (r * 2 * math.pi))) / (2 * math.log(base))

        lo, hi = cdim(bf), cdim(bs)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
        pf = base ** (torch.arange(0, dim, 2).float() / dim)
        extra, inter = 1.0 / pf, 1.0 / (f * pf)
        ef = 1 - ramp
        return inter * (1 - ef) + extra * ef, attn
    if t == "longrope":
        orig = rs.get("original_max_position_embeddings", maxp)
        f = maxp / orig
        attn = rs.get("attention_factor")
        if attn is None:
            attn = 1.0 if f <= 1.0 else math.sqrt(1 + math.log(f) / math.log(orig))
        seq = case.get("seq_len", 0)
        fac = torch.tensor(rs["long_factor"] if seq > orig else rs["short_factor"], dtype=torch.float32)
        e = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (fac * base ** e), attn
    raise ValueError(t)


def main():
    half = 8
    cases = [
        {"name": "default", "theta": 10000.0, "dim": 16, "max_pos": 256, "rope_scaling": None},
        {"name": "default_1e6", "theta": 1000000.0, "dim": 32, "max_pos": 256, "rope_scaling": None},
        {"name": "linear", "theta": 10000.0, "dim": 16, "max_pos": 256, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
        {"name": "dynamic_short", "theta": 10000.0, "dim": 16, "max_pos": 64, "seq_len": 40,
         "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        {"name": "dynamic_long", "theta": 10000.0, "dim": 16, "max_pos": 64, "seq_len": 100,
         "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        {"name": "llama3", "theta": 500000.0, "dim": 64, "max_pos": 256,
         "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 32}},
        {"name": "yarn", "theta": 10000.0, "dim": 16, "max_pos": 256,
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
        {"name": "yarn_mscale", "theta": 10000.0, "dim": 32, "max_pos": 512,
         "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "mscale": 0.707,
                          "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2}},
        {"name": "yarn_notruncate", "theta": 10000.0, "dim": 16, "max_pos": 256,
         "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": False}},
        {"name": "longrope_short", "theta": 10000.0, "dim": 16, "max_pos": 64, "seq_len": 8,
         "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 16,
                          "short_factor": [1.0 + 0.1 * i for i in range(half)],
                          "long_factor": [2.0 + 0.3 * i for i in range(half)]}},
        {"name": "longrope_long", "theta": 10000.0, "dim": 16, "max_pos": 64, "seq_len": 40,
         "rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 16,
                          "short_factor": [1.0 + 0.1 * i for i in range(half)],
                          "long_factor": [2.0 + 0.3 * i for i in range(half)]}},
    ]
    positions = [0, 1, 7, 39, 99]
    for c in cases:
        inv, attn = params(c)
        pos = torch.tensor(positions, dtype=torch.float32)
        freqs = pos[:, None] * inv[None, :].float()
        c["inv_freq"] = [float(x) for x in inv.float()]
        c["attention_factor"] = float(attn)
        c["positions"] = positions
        c["cos"] = [[float(x) for x in row] for row in (freqs.cos() * attn)]
        c["sin"] = [[float(x) for x in row] for row in (freqs.sin() * attn)]
    print(json.dumps(cases, indent=1))


if __name__ == "__main__":
    main()
