#!/usr/bin/python3
"""torch_reference.py: a second, independent float32 reference for the core
families (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text), written
from transformers' semantics in plain PyTorch (Debian's python3-torch; not run
by CI), and the dense families phi3 (fused qkv and gate_up, partial rotary),
starcoder2 (LayerNorm with bias, biases, GELU MLP), olmo2 (post-norms, q/k
RMSNorm over the full width), granite (embedding, residual, attention and
logit multipliers), stablelm (partial rotary, LayerNorm, per-head q/k
LayerNorm, optional parallel residual) and cohere (parallel block, LayerNorm
without bias, per-head q/k LayerNorm, interleaved rotary, logit scale), olmo
(weightless LayerNorms, clip_qkv), and, in class Legacy with their own weight
names, gpt_neox (parallel residual, partial rotary, per-head fused qkv), gpt2
(Conv1D weights, learned positions), falcon (multi-query, grouped new decoder
architecture), bloom and mpt (ALiBi with their own slopes; mpt clip_qkv).

It exists to make oracle fixtures of shapes the shared fixtures do not have
(other widths, 1 KV head, more layers, 40-token prompts with 40 new tokens,
longer than every sliding window), in the layout of ../shared/oracle:

    /usr/bin/python3 tools/torch_reference.py check ../shared/oracle/fixtures/gemma2
        runs the reference on a transformers fixture and prints the max |logit
        diff| against its logits.npy (proves the reference itself)
    /usr/bin/python3 tools/torch_reference.py make --family gemma2 --out DIR [--seed N]
        writes config.json, generation_config.json, model.safetensors (bf16),
        oracle.json and logits.npy for a new random model

The weights are stored in bfloat16 (half the bytes in the repository); the
reference computes in float32 from those rounded weights, as the shared
fixtures' bf16/ variants do.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_grad_enabled(False)


# ---------------------------------------------------------------- safetensors

def st_read(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = np.frombuffer(data[base + a:base + b], dtype=np.uint8)
        if meta["dtype"] == "F32":
            arr = raw.view(np.float32).astype(np.float32)
        elif meta["dtype"] == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif meta["dtype"] == "F16":
            arr = raw.view(np.float16).astype(np.float32)
        else:
            raise SystemExit(f"{path}: {name}: dtype {meta['dtype']} not handled")
        out[name] = torch.from_numpy(arr.reshape(meta["shape"]).copy())
    return out


def bf16_bits(t):
    """float32 tensor -> uint16 numpy array of its bfloat16 rounding (nearest even)"""
    u = t.contiguous().numpy().astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def st_write(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        b = bf16_bits(tensors[name]).tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def npy_write(path, arr):
    np.save(path, np.ascontiguousarray(arr, dtype=np.float32))


# ---------------------------------------------------------------- the model

GEMMA = ("gemma", "gemma2", "gemma3_text")
LAYERNORM = ("starcoder2", "stablelm", "cohere")  # nn.LayerNorm (cohere: no bias) instead of RMSNorm


class Model:
    def __init__(self, cfg, w):
        self.c, self.w = cfg, w
        c = cfg
        self.mt = c["model_type"]
        self.H = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads", self.nh)
        self.hd = c.get("head_dim") or self.H // self.nh
        self.L = c["num_hidden_layers"]
        self.eps = c.get("rms_norm_eps", c.get("norm_epsilon", c.get("layer_norm_eps", 1e-6)))
        self.rot = int(self.hd * c.get("partial_rotary_factor", 1.0)) if self.mt in ("phi3", "stablelm") else self.hd
        self.layer_types = self._layer_types()

    def _layer_types(self):
        c, L = self.c, self.c["num_hidden_layers"]
        if c.get("layer_types"):
            return c["layer_types"]
        W = c.get("sliding_window")
        if self.mt in ("mistral", "starcoder2", "phi3"):
            return ["sliding_attention" if W else "full_attention"] * L
        if self.mt in ("qwen2", "qwen3"):
            use = c.get("use_sliding_window", False)
            mwl = c.get("max_window_layers", L)
            return ["sliding_attention" if use and W and i >= mwl else "full_attention" for i in range(L)]
        if self.mt == "gemma2":
            return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        if self.mt == "gemma3_text":
            p = c.get("sliding_window_pattern", c.get("_sliding_window_pattern", 6))
            return ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(L)]
        return ["full_attention"] * L

    def norm(self, x, w, eps=None):
        eps = self.eps if eps is None else eps
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * (1.0 + w) if self.mt in GEMMA else y * w

    def lnorm(self, x, name):
        """the family's norm of x by the weights (and bias) called name"""
        if self.mt == "olmo":  # OlmoLayerNorm: no weight, no bias, eps 1e-5
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), None, None, 1e-5)
        if self.mt in LAYERNORM:
            w = self.w[name + ".weight"]
            return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, self.w.get(name + ".bias"), self.eps)
        return self.norm(x, self.w[name + ".weight"])

    def rope(self, x, pos, sliding):
        c = self.c
        theta = c.get("rope_theta", 10000.0)
        scaling = c.get("rope_scaling")
        if self.mt == "gemma3_text" and sliding:
            theta, scaling = c.get("rope_local_base_freq", 10000.0), None
        D = self.rot
        inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "linear":
                raise SystemExit(f"rope_type {kind} not in this reference")
            inv = inv / scaling["factor"]
        f = pos.float()[:, None] * inv[None, :]
        xr, xp = x[..., :D], x[..., D:]
        if self.mt == "cohere":  # pairs (2i, 2i+1) rotate together
            emb = f.repeat_interleave(2, dim=-1)
            rot = torch.stack([-xr[..., 1::2], xr[..., ::2]], -1).flatten(-2)
        else:
            emb = torch.cat([f, f], -1)
            rot = torch.cat([-xr[..., D // 2:], xr[..., : D // 2]], -1)
        cos, sin = emb.cos(), emb.sin()
        return torch.cat([xr * cos[:, None, :] + rot * sin[:, None, :], xp], -1)

    def lin(self, x, name, bias=False):
        y = x @ self.w[name + ".weight"].t()
        if bias:
            y = y + self.w[name + ".bias"]
        return y

    def attention(self, x, i, pos):
        c, T = self.c, x.shape[0]
        p = f"model.layers.{i}.self_attn."
        qkv_bias = (self.mt == "qwen2" or c.get("attention_bias", False) or
                    (self.mt == "starcoder2" and c.get("use_bias", True)) or
                    (self.mt == "stablelm" and c.get("use_qkv_bias", False)))
        o_bias = c.get("attention_bias", False) or (self.mt == "starcoder2" and c.get("use_bias", True))
        nq, nk = self.nh * self.hd, self.nkv * self.hd
        if self.mt == "phi3":
            q, k, v = self.lin(x, p + "qkv_proj").split([nq, nk, nk], -1)
        else:
            q, k, v = (self.lin(x, p + n, qkv_bias) for n in ("q_proj", "k_proj", "v_proj"))
        if self.mt == "olmo" and c.get("clip_qkv"):
            q, k, v = (t.clamp(-c["clip_qkv"], c["clip_qkv"]) for t in (q, k, v))
        if self.mt == "olmo2":  # RMSNorm over all heads together
            q, k = self.norm(q, self.w[p + "q_norm.weight"]), self.norm(k, self.w[p + "k_norm.weight"])
        q, k, v = q.view(T, self.nh, self.hd), k.view(T, self.nkv, self.hd), v.view(T, self.nkv, self.hd)
        if self.mt in ("qwen3", "gemma3_text"):
            q = self.norm(q, self.w[p + "q_norm.weight"])
            k = self.norm(k, self.w[p + "k_norm.weight"])
        if (self.mt == "stablelm" and c.get("qk_layernorm")) or (self.mt == "cohere" and c.get("use_qk_norm")):
            def per_head(t, n, heads):
                if self.mt == "stablelm":
                    w = torch.stack([self.w[f"{p}{n}_layernorm.norms.{j}.weight"] for j in range(heads)])
                else:
                    w = self.w[f"{p}{n}_norm.weight"]
                return torch.nn.functional.layer_norm(t, (self.hd,), None, None, self.eps) * w
            q, k = per_head(q, "q", self.nh), per_head(k, "k", self.nkv)
        sliding = self.layer_types[i] == "sliding_attention"
        q, k = self.rope(q, pos, sliding), self.rope(k, pos, sliding)
        g = self.nh // self.nkv
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        scale = c["query_pre_attn_scalar"] ** -0.5 if self.mt in ("gemma2", "gemma3_text") else self.hd ** -0.5
        if self.mt == "granite":
            scale = c["attention_multiplier"]
        s = torch.einsum("qhd,khd->hqk", q, k) * scale
        cap = c.get("attn_logit_softcapping") if self.mt in ("gemma2", "gemma3_text") else None
        if cap:
            s = torch.tanh(s / cap) * cap
        qi, ki = pos[:, None], pos[None, :]
        allowed = ki <= qi
        if sliding:
            allowed &= ki > qi - c["sliding_window"]
        s = s.masked_fill(~allowed[None], float("-inf"))
        a = torch.softmax(s, dim=-1)
        o = torch.einsum("hqk,khd->qhd", a, v).reshape(T, self.nh * self.hd)
        return self.lin(o, p + "o_proj", o_bias)

    def mlp(self, x, i):
        p, b = f"model.layers.{i}.mlp.", self.c.get("mlp_bias", False)
        act = self.c.get("hidden_act", self.c.get("hidden_activation", "silu"))
        if self.mt in GEMMA or act in ("gelu_pytorch_tanh", "gelu_tanh"):
            act = lambda t: torch.nn.functional.gelu(t, approximate="tanh")
        elif act == "silu":
            act = torch.nn.functional.silu
        else:
            raise SystemExit(f"hidden_act {act} not in this reference")
        if self.mt == "starcoder2":  # not gated
            b = self.c.get("use_bias", True)
            return self.lin(act(self.lin(x, p + "c_fc", b)), p + "c_proj", b)
        if self.mt == "phi3":
            g, u = self.lin(x, p + "gate_up_proj").chunk(2, -1)
        else:
            g, u = self.lin(x, p + "gate_proj", b), self.lin(x, p + "up_proj", b)
        return self.lin(act(g) * u, p + "down_proj", b)

    def forward(self, ids):
        """logits [T, vocab] for every position of ids"""
        ids = torch.tensor(ids, dtype=torch.int64)
        pos = torch.arange(len(ids))
        h = self.w["model.embed_tokens.weight"][ids]
        if self.mt in GEMMA:
            h = h * torch.tensor(self.H ** 0.5, dtype=torch.float32)
        if self.mt == "granite":
            h = h * self.c["embedding_multiplier"]
        rm = self.c["residual_multiplier"] if self.mt == "granite" else 1.0
        sandwich = self.mt in ("gemma2", "gemma3_text")
        parallel = self.mt == "cohere" or (self.mt == "stablelm" and self.c.get("use_parallel_residual"))
        for i in range(self.L):
            p = f"model.layers.{i}."
            if self.mt == "olmo2":  # no pre-norms: each branch's output is normed
                h = h + self.lnorm(self.attention(h, i, pos), p + "post_attention_layernorm")
                h = h + self.lnorm(self.mlp(h, i), p + "post_feedforward_layernorm")
                continue
            x = self.lnorm(h, p + "input_layernorm")
            a = self.attention(x, i, pos)
            if parallel:
                h = h + a + self.mlp(x, i)
            elif sandwich:
                a = self.norm(a, self.w[p + "post_attention_layernorm.weight"])
                h = h + a
                m = self.mlp(self.norm(h, self.w[p + "pre_feedforward_layernorm.weight"]), i)
                h = h + self.norm(m, self.w[p + "post_feedforward_layernorm.weight"])
            else:
                h = h + a * rm
                h = h + self.mlp(self.lnorm(h, p + "post_attention_layernorm"), i) * rm
        h = self.lnorm(h, "model.norm")
        head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])
        logits = h @ head.t()
        cap = self.c.get("final_logit_softcapping") if self.mt in ("gemma2", "gemma3_text") else None
        if cap:
            logits = torch.tanh(logits / cap) * cap
        if self.mt == "granite":
            logits = logits / self.c["logits_scaling"]
        if self.mt == "cohere":
            logits = logits * self.c["logit_scale"]
        return logits


# ---------------------------------------------------------------- older layouts
# gpt_neox, gpt2, falcon, bloom, mpt: their own weight names, fused qkv
# layouts, LayerNorms with bias (mpt: without), learned positions or ALiBi.

LEGACY = ("gpt_neox", "gpt2", "falcon", "bloom", "mpt")


def rotate(x, pos, D, theta):
    """rotate_half rotary on the first D dims of x [T, heads, hd]"""
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    f = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([f, f], -1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    xr, xp = x[..., :D], x[..., D:]
    rot = torch.cat([-xr[..., D // 2:], xr[..., : D // 2]], -1)
    return torch.cat([xr * cos + rot * sin, xp], -1)


def bloom_slopes(n):
    p2 = 2 ** math.floor(math.log2(n))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(p2) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + p2, dtype=torch.int32))
    if p2 != n:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * p2) - 3))), dtype=torch.float32)
        k = min(p2, n - p2)
        slopes = torch.cat([slopes, torch.pow(extra, torch.arange(1, 1 + 2 * k, 2, dtype=torch.int32))])
    return slopes


def mpt_slopes(n, bias_max=8):
    p2 = 2 ** math.ceil(math.log2(n))
    base = torch.arange(1, p2 + 1, dtype=torch.int64).float() * (bias_max / p2)
    slopes = 1.0 / torch.pow(2, base)
    if p2 != n:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:n]
    return slopes


class Legacy:
    def __init__(self, cfg, w):
        c, self.c, self.w = cfg, cfg, w
        self.mt = c["model_type"]
        self.H = c.get("hidden_size", c.get("n_embd", c.get("d_model")))
        self.nh = c.get("num_attention_heads", c.get("n_head", c.get("n_heads")))
        self.L = c.get("num_hidden_layers", c.get("n_layer", c.get("n_layers")))
        self.hd = self.H // self.nh
        self.eps = c.get("layer_norm_eps", c.get("layer_norm_epsilon", 1e-5))
        self.nkv = self.nh
        if self.mt == "falcon":
            if c.get("new_decoder_architecture"):
                self.nkv = c["num_kv_heads"]
            elif c.get("multi_query", True):
                self.nkv = 1

    def ln(self, x, name):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), self.w[name + ".weight"],
                                              self.w.get(name + ".bias"), self.eps)

    def lin(self, x, name):
        y = x @ self.w[name + ".weight"].t()
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def attend(self, q, k, v, bias=None):
        """q [T, nh, hd], k/v [T, nkv, hd], bias [nh, T, T] added to the scaled scores"""
        T = q.shape[0]
        g = self.nh // k.shape[1]
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * self.hd ** -0.5
        if bias is not None:
            s = s + bias
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        s = s.masked_fill(~allowed[None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v).reshape(T, self.nh * self.hd)

    def layer(self, h, i, pos):
        c, T, nh, hd = self.c, h.shape[0], self.nh, self.hd
        gelu = torch.nn.functional.gelu
        tanh_gelu = lambda t: gelu(t, approximate="tanh")
        kpos = pos.float()
        if self.mt == "gpt_neox":
            p = f"gpt_neox.layers.{i}."
            x = self.ln(h, p + "input_layernorm")
            q, k, v = self.lin(x, p + "attention.query_key_value").view(T, nh, 3 * hd).split(hd, -1)
            D = int(hd * c.get("partial_rotary_factor", c.get("rotary_pct", 0.25)))
            theta = c.get("rope_theta", c.get("rotary_emb_base", 10000.0))
            q, k = rotate(q, pos, D, theta), rotate(k, pos, D, theta)
            a = self.lin(self.attend(q, k, v), p + "attention.dense")
            act = tanh_gelu if c.get("hidden_act") in ("gelu_new", "gelu_pytorch_tanh") else gelu
            mlp = lambda y: self.lin(act(self.lin(y, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h")
            if c.get("use_parallel_residual", True):
                return h + a + mlp(self.ln(h, p + "post_attention_layernorm"))
            h = h + a
            return h + mlp(self.ln(h, p + "post_attention_layernorm"))
        if self.mt == "gpt2":
            p = f"transformer.h.{i}."
            x = self.ln(h, p + "ln_1")
            cl = lambda y, n: y @ self.w[n + ".weight"] + self.w[n + ".bias"]  # Conv1D: weight [in, out]
            q, k, v = cl(x, p + "attn.c_attn").split(self.H, -1)
            o = self.attend(q.view(T, nh, hd), k.view(T, nh, hd), v.view(T, nh, hd))
            h = h + cl(o, p + "attn.c_proj")
            x = self.ln(h, p + "ln_2")
            return h + cl(tanh_gelu(cl(x, p + "mlp.c_fc")), p + "mlp.c_proj")
        if self.mt == "falcon":
            p = f"transformer.h.{i}."
            new = c.get("new_decoder_architecture", False)
            two = new and c.get("num_ln_in_parallel_attn", 2) == 2
            x = self.ln(h, p + ("ln_attn" if two else "input_layernorm"))
            qkv = self.lin(x, p + "self_attention.query_key_value")
            if new:
                g = qkv.view(T, self.nkv, nh // self.nkv + 2, hd)
                q, k, v = g[:, :, :-2].reshape(T, nh, hd), g[:, :, -2], g[:, :, -1]
            elif self.nkv == 1:
                q, k, v = qkv.split([nh * hd, hd, hd], -1)
                q, k, v = q.view(T, nh, hd), k.view(T, 1, hd), v.view(T, 1, hd)
            else:
                q, k, v = qkv.view(T, nh, 3, hd).unbind(2)
            theta = c.get("rope_theta", 10000.0)
            q, k = rotate(q, pos, hd, theta), rotate(k, pos, hd, theta)
            a = self.lin(self.attend(q, k, v), p + "self_attention.dense")
            xm = self.ln(h, p + "ln_mlp") if two else x
            m = self.lin(gelu(self.lin(xm, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h")
            return h + a + m
        if self.mt == "bloom":
            p = f"transformer.h.{i}."
            x = self.ln(h, p + "input_layernorm")
            q, k, v = self.lin(x, p + "self_attention.query_key_value").view(T, nh, 3, hd).unbind(2)
            bias = (bloom_slopes(nh)[:, None] * kpos[None, :])[:, None, :]
            res = x if c.get("apply_residual_connection_post_layernorm") else h
            h = res + self.lin(self.attend(q, k, v, bias), p + "self_attention.dense")
            x = self.ln(h, p + "post_attention_layernorm")
            res = x if c.get("apply_residual_connection_post_layernorm") else h
            bloom_gelu = lambda t: t * 0.5 * (1.0 + torch.tanh(0.79788456 * t * (1 + 0.044715 * t * t)))
            return res + self.lin(bloom_gelu(self.lin(x, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h")
        if self.mt == "mpt":
            p = f"transformer.blocks.{i}."
            x = self.ln(h, p + "norm_1")
            qkv = self.lin(x, p + "attn.Wqkv")
            clip = c["attn_config"].get("clip_qkv")
            if clip:
                qkv = qkv.clamp(-clip, clip)
            q, k, v = (t.reshape(T, nh, hd) for t in qkv.chunk(3, -1))
            bias = (mpt_slopes(nh)[:, None] * (kpos - (T - 1))[None, :])[:, None, :]
            h = h + self.lin(self.attend(q, k, v, bias), p + "attn.out_proj")
            x = self.ln(h, p + "norm_2")
            return h + self.lin(gelu(self.lin(x, p + "ffn.up_proj")), p + "ffn.down_proj")
        raise SystemExit(f"{self.mt}: not in this reference")

    def forward(self, ids):
        ids = torch.tensor(ids, dtype=torch.int64)
        pos = torch.arange(len(ids))
        emb, norm, head = {
            "gpt_neox": ("gpt_neox.embed_in", "gpt_neox.final_layer_norm", "embed_out"),
            "gpt2": ("transformer.wte", "transformer.ln_f", "lm_head"),
            "falcon": ("transformer.word_embeddings", "transformer.ln_f", "lm_head"),
            "bloom": ("transformer.word_embeddings", "transformer.ln_f", "lm_head"),
            "mpt": ("transformer.wte", "transformer.norm_f", "lm_head"),
        }[self.mt]
        h = self.w[emb + ".weight"][ids]
        if self.mt == "gpt2":
            h = h + self.w["transformer.wpe.weight"][pos]
        if self.mt == "bloom":
            h = self.ln(h, "transformer.word_embeddings_layernorm")
        for i in range(self.L):
            h = self.layer(h, i, pos)
        h = self.ln(h, norm)
        return h @ self.w.get(head + ".weight", self.w[emb + ".weight"]).t()


def oracle(model, prompt, n_new):
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(int(model.forward(ids)[-1].argmax()))
    logits = model.forward(ids)[len(prompt) - 1:]
    gaps = []
    for r in logits[:-1]:
        top = torch.topk(r, 2).values
        gaps.append(round(float(top[0] - top[1]), 6))
    return ids, logits.numpy(), gaps


# ---------------------------------------------------------------- shapes

# Untied heads for gemma2/gemma3/granite: with a tied head, their sandwich norms
# and scaled embeddings make a random model repeat one token forever.
BASE = {
    "llama": dict(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=1,
                  num_hidden_layers=3, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False),
    "mistral": dict(hidden_size=128, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=3, head_dim=48, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=8,
                    tie_word_embeddings=False),
    "qwen2": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
                  num_hidden_layers=4, rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=True,
                  sliding_window=8, max_window_layers=2, tie_word_embeddings=True),
    "qwen3": dict(hidden_size=96, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  num_hidden_layers=3, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    "gemma": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                  num_hidden_layers=3, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                  tie_word_embeddings=True),
    "gemma2": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   num_hidden_layers=3, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_activation="gelu_pytorch_tanh",
                   query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, tie_word_embeddings=False),
    "gemma3_text": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=32, num_hidden_layers=7, rms_norm_eps=1e-6, rope_theta=1000000.0,
                        rope_local_base_freq=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0},
                        hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32, sliding_window=8,
                        attn_logit_softcapping=None, final_logit_softcapping=None, tie_word_embeddings=False),
    "phi3": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1,
                 num_hidden_layers=3, rms_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.75,
                 original_max_position_embeddings=4096, rope_scaling=None, sliding_window=None, hidden_act="silu",
                 tie_word_embeddings=False),
    "starcoder2": dict(hidden_size=96, intermediate_size=256, num_attention_heads=6, num_key_value_heads=2,
                       num_hidden_layers=4, norm_epsilon=1e-5, rope_theta=100000.0, sliding_window=8, use_bias=True,
                       hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True),
    "olmo2": dict(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=1,
                  num_hidden_layers=5, rms_norm_eps=1e-6, rope_theta=500000.0, attention_bias=False,
                  hidden_act="silu", tie_word_embeddings=False),
    "granite": dict(hidden_size=96, intermediate_size=256, num_attention_heads=3, num_key_value_heads=1,
                    num_hidden_layers=4, rms_norm_eps=1e-5, rope_theta=10000.0, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.03125, logits_scaling=4.0,
                    attention_bias=False, mlp_bias=False, hidden_act="silu", tie_word_embeddings=False),
    "stablelm": dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                     num_hidden_layers=3, layer_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.25,
                     qk_layernorm=True, use_qkv_bias=True, use_parallel_residual=False, hidden_act="silu",
                     tie_word_embeddings=False),
    "cohere": dict(hidden_size=96, intermediate_size=256, num_attention_heads=6, num_key_value_heads=2,
                   num_hidden_layers=4, layer_norm_eps=1e-5, rope_theta=10000.0, use_qk_norm=True,
                   logit_scale=0.25, attention_bias=False, hidden_act="silu", tie_word_embeddings=True),
}
ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
        "gemma3_text": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM", "starcoder2": "Starcoder2ForCausalLM",
        "olmo2": "Olmo2ForCausalLM", "granite": "GraniteForCausalLM", "stablelm": "StableLmForCausalLM",
        "cohere": "CohereForCausalLM"}


def random_weights(cfg, gen, init):
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    mt = cfg["model_type"]

    def mat(*shape):
        return torch.randn(*shape, generator=gen) * init

    def vec(n, base):
        return base + torch.randn(n, generator=gen) * 0.1

    nb = 0.0 if mt in GEMMA else 1.0  # gemma norms are 1 + w
    w = {"model.embed_tokens.weight": mat(V, H), "model.norm.weight": vec(H, nb)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(V, H)
    if mt in ("starcoder2", "stablelm"):
        w["model.norm.bias"] = vec(H, 0.0)
    if mt == "olmo":  # weightless LayerNorms
        del w["model.norm.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        norms = {"olmo2": ("post_attention_layernorm", "post_feedforward_layernorm"), "cohere": ("input_layernorm",),
                 "olmo": ()}
        for n in norms.get(mt, ("input_layernorm", "post_attention_layernorm")):
            if n == "post_attention_layernorm" and mt == "stablelm" and cfg["use_parallel_residual"]:
                continue
            w[p + n + ".weight"] = vec(H, nb)
            if mt in ("starcoder2", "stablelm"):
                w[p + n + ".bias"] = vec(H, 0.0)
        if mt in ("gemma2", "gemma3_text"):
            w[p + "pre_feedforward_layernorm.weight"] = vec(H, nb)
            w[p + "post_feedforward_layernorm.weight"] = vec(H, nb)
        a = p + "self_attn."
        if mt == "phi3":
            w[a + "qkv_proj.weight"] = mat((nh + 2 * nkv) * hd, H)
        else:
            w[a + "q_proj.weight"], w[a + "k_proj.weight"] = mat(nh * hd, H), mat(nkv * hd, H)
            w[a + "v_proj.weight"] = mat(nkv * hd, H)
        w[a + "o_proj.weight"] = mat(H, nh * hd)
        if mt in ("qwen2", "starcoder2") or (mt == "stablelm" and cfg["use_qkv_bias"]):
            for n, r in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
                w[a + n + ".bias"] = vec(r, 0.0)
        if mt == "starcoder2":
            w[a + "o_proj.bias"] = vec(H, 0.0)
        if mt in ("qwen3", "gemma3_text"):
            w[a + "q_norm.weight"], w[a + "k_norm.weight"] = vec(hd, nb), vec(hd, nb)
        if mt == "olmo2":
            w[a + "q_norm.weight"], w[a + "k_norm.weight"] = vec(nh * hd, 1.0), vec(nkv * hd, 1.0)
        if mt == "cohere":
            w[a + "q_norm.weight"] = vec(nh * hd, 1.0).view(nh, hd)
            w[a + "k_norm.weight"] = vec(nkv * hd, 1.0).view(nkv, hd)
        if mt == "stablelm" and cfg["qk_layernorm"]:
            for n, heads in (("q", nh), ("k", nkv)):
                for j in range(heads):
                    w[f"{a}{n}_layernorm.norms.{j}.weight"] = vec(hd, 1.0)
        m = p + "mlp."
        if mt == "starcoder2":
            w[m + "c_fc.weight"], w[m + "c_fc.bias"] = mat(F, H), vec(F, 0.0)
            w[m + "c_proj.weight"], w[m + "c_proj.bias"] = mat(H, F), vec(H, 0.0)
        elif mt == "phi3":
            w[m + "gate_up_proj.weight"], w[m + "down_proj.weight"] = mat(2 * F, H), mat(H, F)
        else:
            w[m + "gate_proj.weight"], w[m + "up_proj.weight"] = mat(F, H), mat(F, H)
            w[m + "down_proj.weight"] = mat(H, F)
    return w


BASE.update({
    "gpt_neox": dict(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_hidden_layers=3,
                     layer_norm_eps=1e-5, rope_theta=10000.0, rotary_emb_base=10000.0, partial_rotary_factor=0.5,
                     rotary_pct=0.5, use_parallel_residual=True, attention_bias=True, hidden_act="gelu",
                     tie_word_embeddings=False),
    "gpt2": dict(n_embd=96, n_head=3, n_layer=4, n_positions=128, n_inner=None, activation_function="gelu_new",
                 layer_norm_epsilon=1e-5, scale_attn_weights=True, tie_word_embeddings=True),
    "falcon": dict(hidden_size=128, num_attention_heads=8, num_kv_heads=2, num_hidden_layers=3,
                   ffn_hidden_size=256, new_decoder_architecture=True, multi_query=True, num_ln_in_parallel_attn=2,
                   parallel_attn=True, alibi=False, bias=False, activation="gelu", layer_norm_epsilon=1e-5,
                   rope_theta=10000.0, tie_word_embeddings=True),
    "bloom": dict(hidden_size=96, n_head=6, n_layer=3, layer_norm_epsilon=1e-5,
                  apply_residual_connection_post_layernorm=False, pretraining_tp=1, tie_word_embeddings=False),
    "mpt": dict(d_model=96, n_heads=6, n_layers=3, expansion_ratio=4, max_seq_len=256, layer_norm_epsilon=1e-5,
                no_bias=True, norm_type="low_precision_layernorm", learned_pos_emb=True, logit_scale=None,
                attn_config={"alibi": True, "alibi_bias_max": 8, "attn_type": "multihead_attention",
                             "clip_qkv": 2.0, "qk_ln": False, "softmax_scale": None, "prefix_lm": False,
                             "attn_uses_sequence_id": False, "attn_impl": "torch"},
                tie_word_embeddings=False),
    "olmo": dict(hidden_size=96, intermediate_size=256, num_attention_heads=6, num_key_value_heads=2,
                 num_hidden_layers=4, rope_theta=10000.0, clip_qkv=2.0, attention_bias=False, hidden_act="silu",
                 tie_word_embeddings=False),
})
ARCH.update({"gpt_neox": "GPTNeoXForCausalLM", "gpt2": "GPT2LMHeadModel", "falcon": "FalconForCausalLM",
             "bloom": "BloomForCausalLM", "mpt": "MptForCausalLM", "olmo": "OlmoForCausalLM"})


def legacy_weights(cfg, gen, init):
    m = Legacy(cfg, {})
    H, V, L, nh, nkv, hd, mt = m.H, cfg["vocab_size"], m.L, m.nh, m.nkv, m.hd, m.mt

    def mat(*shape):
        return torch.randn(*shape, generator=gen) * init

    def vec(n, base):
        return base + torch.randn(n, generator=gen) * 0.1

    def ln(name, bias=True):
        w[name + ".weight"] = vec(H, 1.0)
        if bias:
            w[name + ".bias"] = vec(H, 0.0)

    def linear(name, o, i, bias=True):
        w[name + ".weight"] = mat(o, i)
        if bias:
            w[name + ".bias"] = vec(o, 0.0)

    w = {}
    if mt in ("bloom", "mpt") and not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(V, H)
    if mt == "gpt_neox":
        F = cfg["intermediate_size"]
        w["gpt_neox.embed_in.weight"], w["embed_out.weight"] = mat(V, H), mat(V, H)
        ln("gpt_neox.final_layer_norm")
        for i in range(L):
            p = f"gpt_neox.layers.{i}."
            ln(p + "input_layernorm"), ln(p + "post_attention_layernorm")
            linear(p + "attention.query_key_value", 3 * H, H), linear(p + "attention.dense", H, H)
            linear(p + "mlp.dense_h_to_4h", F, H), linear(p + "mlp.dense_4h_to_h", H, F)
    elif mt == "gpt2":
        w["transformer.wte.weight"], w["transformer.wpe.weight"] = mat(V, H), mat(cfg["n_positions"], H)
        ln("transformer.ln_f")
        for i in range(L):
            p = f"transformer.h.{i}."
            ln(p + "ln_1"), ln(p + "ln_2")
            for n, a, b in (("attn.c_attn", H, 3 * H), ("attn.c_proj", H, H), ("mlp.c_fc", H, 4 * H),
                            ("mlp.c_proj", 4 * H, H)):
                w[p + n + ".weight"], w[p + n + ".bias"] = mat(a, b), vec(b, 0.0)  # Conv1D: [in, out]
    elif mt == "falcon":
        F = cfg["ffn_hidden_size"]
        w["transformer.word_embeddings.weight"] = mat(V, H)
        ln("transformer.ln_f")
        for i in range(L):
            p = f"transformer.h.{i}."
            ln(p + "ln_attn"), ln(p + "ln_mlp")
            linear(p + "self_attention.query_key_value", (nh + 2 * nkv) * hd, H, False)
            linear(p + "self_attention.dense", H, H, False)
            linear(p + "mlp.dense_h_to_4h", F, H, False), linear(p + "mlp.dense_4h_to_h", H, F, False)
    elif mt == "bloom":
        w["transformer.word_embeddings.weight"] = mat(V, H)
        ln("transformer.word_embeddings_layernorm"), ln("transformer.ln_f")
        for i in range(L):
            p = f"transformer.h.{i}."
            ln(p + "input_layernorm"), ln(p + "post_attention_layernorm")
            linear(p + "self_attention.query_key_value", 3 * H, H), linear(p + "self_attention.dense", H, H)
            linear(p + "mlp.dense_h_to_4h", 4 * H, H), linear(p + "mlp.dense_4h_to_h", H, 4 * H)
    elif mt == "mpt":
        w["transformer.wte.weight"] = mat(V, H)
        ln("transformer.norm_f", False)
        for i in range(L):
            p = f"transformer.blocks.{i}."
            ln(p + "norm_1", False), ln(p + "norm_2", False)
            linear(p + "attn.Wqkv", 3 * H, H, False), linear(p + "attn.out_proj", H, H, False)
            linear(p + "ffn.up_proj", 4 * H, H, False), linear(p + "ffn.down_proj", H, 4 * H, False)
    return w


def make(family, out, seed, prompt_len, n_new, vocab):
    cfg = {"architectures": [ARCH[family]], "model_type": family, "vocab_size": vocab, "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": 0, "max_position_embeddings": 256, "dtype": "bfloat16",
           **BASE[family]}
    best = None
    for s in range(seed, seed + 8):  # the seed whose greedy path has the widest top-1/top-2 gaps
        gen = torch.Generator().manual_seed(s)
        w = (legacy_weights if family in LEGACY else random_weights)(cfg, gen, 0.15)
        w = {k: torch.from_numpy((bf16_bits(v).astype(np.uint32) << 16).view(np.float32).reshape(v.shape))
             for k, v in w.items()}  # the rounded weights are the model
        prompt = [int(x) for x in torch.randint(3, vocab, (prompt_len,), generator=gen)]
        ids, logits, gaps = oracle((Legacy if family in LEGACY else Model)(cfg, w), prompt, n_new)
        gen_ids = ids[prompt_len:]
        score = (min(gaps), len(set(gen_ids)))
        if len(set(gen_ids)) >= 3 and (best is None or score > best[0]):
            best = (score, s, w, prompt, ids, logits, gaps)
    if best is None:
        raise SystemExit(f"{family}: no seed gave a varied greedy path")
    _, s, w, prompt, ids, logits, gaps = best
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, f, indent=2)
    st_write(os.path.join(out, "model.safetensors"), w)
    npy_write(os.path.join(out, "logits.npy"), logits)
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump({"fixture": os.path.basename(out), "model_type": family,
                   "made_by": "tools/torch_reference.py (kiln's own float32 PyTorch reference, checked against "
                              "the transformers fixtures of ../shared/oracle), torch " + torch.__version__,
                   "seed": s, "prompt_ids": prompt, "generated_ids": ids[len(prompt):], "all_ids": ids,
                   "logits_file": "logits.npy", "logits_shape": list(logits.shape),
                   "top1_top2_gap": gaps, "min_gap_greedy_steps": min(gaps), "weights_dtype": "bfloat16"}, f)
    print(f"{out}: seed {s}, {len(prompt)} + {len(ids) - len(prompt)} tokens, min gap {min(gaps):.4f}, "
          f"{len(set(ids[len(prompt):]))} distinct")


def check(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = st_read(os.path.join(d, "model.safetensors"))
    o = json.load(open(os.path.join(d, "oracle.json")))
    ref = np.load(os.path.join(d, "logits.npy"))
    logits = (Legacy if cfg["model_type"] in LEGACY else Model)(cfg, w).forward(o["all_ids"])[len(o["prompt_ids"]) - 1:].numpy()
    diff = float(np.abs(logits - ref).max())
    print(f"{d}: max |logit diff| {diff:.3g} against its oracle")
    return diff


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dirs", nargs="+")
    m = sub.add_parser("make")
    m.add_argument("--family", required=True, choices=sorted(BASE))
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--prompt-len", type=int, default=40)
    m.add_argument("--new", type=int, default=40)
    m.add_argument("--vocab", type=int, default=640)
    a = ap.parse_args()
    if a.cmd == "check":
        worst = max(check(d) for d in a.dirs)
        sys.exit(0 if worst < 1e-3 else 1)
    make(a.family, a.out, a.seed, a.prompt_len, a.new, a.vocab)


if __name__ == "__main__":
    main()
