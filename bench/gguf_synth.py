#!/usr/bin/env python3
"""gguf_synth.py: a GGUF file of a real model's shape with random weights, for
llama-bench, written with the standard library only (no gguf-py, no numpy).

    gguf_synth.py --config DIR/config.json --type q4_0|q8_0|f16 --out FILE.gguf

The shape comes from the config.json that `kiln synth` wrote (so both engines
run the same shape): llama, qwen2 (q/k/v biases) and qwen3 (q/k norms) map
to llama.cpp's architectures of the same names. Every matrix, the embedding
and the output head included, has the requested type (Q4_0 against kiln's q4
with group size 64: both 4.5 bits per weight; Q8_0 against q8: both 8.5 bits;
F16 against bf16/f16), norms and biases are F32. Throughput depends only on
shapes and types, so random bits are enough: one random chunk with valid
block scales is repeated through each tensor. The vocabulary is synthetic
(SentencePiece-style: <unk>, <s>, </s>, 256 byte tokens, then "t<i>"), of the
config's vocab_size.
"""
import argparse
import json
import os
import random
import struct

GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
# (block elements, block bytes)
BLOCK = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q8_0: (32, 34)}
FILE_TYPE = {GGML_F16: 1, GGML_Q4_0: 2, GGML_Q8_0: 7}
ALIGN = 32

T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64 = 4, 5, 6, 7, 8, 9, 10


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, val):
    out = gstr(key) + struct.pack("<I", typ)
    if typ == T_STR:
        return out + gstr(val)
    if typ == T_U32:
        return out + struct.pack("<I", val)
    if typ == T_F32:
        return out + struct.pack("<f", val)
    if typ == T_BOOL:
        return out + struct.pack("<?", val)
    raise ValueError(typ)


def kv_array(key, elem, vals):
    out = gstr(key) + struct.pack("<IIQ", T_ARR, elem, len(vals))
    if elem == T_STR:
        return out + b"".join(gstr(v) for v in vals)
    fmt = {T_I32: "<i", T_F32: "<f"}[elem]
    return out + b"".join(struct.pack(fmt, v) for v in vals)


def random_chunk(typ, nbytes, rng):
    """nbytes (a multiple of the block size) of valid random blocks."""
    be, bb = BLOCK[typ]
    nblocks = nbytes // bb
    if typ == GGML_F32:
        return b"".join(struct.pack("<f", rng.uniform(-0.05, 0.05)) for _ in range(nblocks))
    if typ == GGML_F16:
        # sign, exponent 7..10 (|w| in [2^-8, 2^-4)), random mantissa
        return b"".join(struct.pack("<H", rng.getrandbits(1) << 15 | (7 + rng.getrandbits(2)) << 10 |
                                    rng.getrandbits(10)) for _ in range(nblocks))
    scale = struct.pack("<e", 0.002)
    payload = bb - 2
    return b"".join(scale + rng.randbytes(payload) for _ in range(nblocks))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--type", required=True, choices=["q4_0", "q8_0", "f16"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    moe = cfg["model_type"] == "qwen3_moe"  # llama.cpp's qwen3moe: stacked experts per layer
    arch = "qwen3moe" if moe else cfg["model_type"]
    if arch not in ("llama", "qwen2", "qwen3", "qwen3moe"):
        raise SystemExit(f"gguf_synth: model_type {arch} is not mapped to a llama.cpp architecture here")
    wtype = {"q4_0": GGML_Q4_0, "q8_0": GGML_Q8_0, "f16": GGML_F16}[a.type]
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    hd = cfg.get("head_dim", H // nh)
    F, V = cfg["intermediate_size"], cfg["vocab_size"]
    E, K, FE = cfg.get("num_experts", 0), cfg.get("num_experts_per_tok", 0), cfg.get("moe_intermediate_size", 0)
    tied = cfg.get("tie_word_embeddings", False)
    Q, KV = nh * hd, nkv * hd

    tensors = []  # (name, [ne0, ne1...], type)

    def mat(name, rows, cols):
        tensors.append((name, [cols, rows], wtype))

    def vec(name, n):
        tensors.append((name, [n], GGML_F32))

    def experts(name, rows, cols):  # E matrices [rows, cols], stacked
        tensors.append((name, [cols, rows, E], wtype))

    mat("token_embd.weight", V, H)
    for i in range(L):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", H)
        mat(p + "attn_q.weight", Q, H)
        mat(p + "attn_k.weight", KV, H)
        mat(p + "attn_v.weight", KV, H)
        if arch == "qwen2":
            vec(p + "attn_q.bias", Q)
            vec(p + "attn_k.bias", KV)
            vec(p + "attn_v.bias", KV)
        if arch in ("qwen3", "qwen3moe"):
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        mat(p + "attn_output.weight", H, Q)
        vec(p + "ffn_norm.weight", H)
        if moe:
            tensors.append((p + "ffn_gate_inp.weight", [H, E], GGML_F32))
            experts(p + "ffn_gate_exps.weight", FE, H)
            experts(p + "ffn_up_exps.weight", FE, H)
            experts(p + "ffn_down_exps.weight", H, FE)
            continue
        mat(p + "ffn_gate.weight", F, H)
        mat(p + "ffn_up.weight", F, H)
        mat(p + "ffn_down.weight", H, F)
    vec("output_norm.weight", H)
    if not tied:
        mat("output.weight", V, H)

    vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    vocab += [f"t{i}" for i in range(V - len(vocab))]
    ttype = [2, 3, 3] + [6] * 256 + [1] * (V - 259)

    meta = [
        kv("general.architecture", T_STR, arch),
        kv("general.name", T_STR, f"kiln-synth-{arch}"),
        kv("general.alignment", T_U32, ALIGN),
        kv("general.file_type", T_U32, FILE_TYPE[wtype]),
        kv(f"{arch}.context_length", T_U32, cfg.get("max_position_embeddings", 4096)),
        kv(f"{arch}.embedding_length", T_U32, H),
        kv(f"{arch}.block_count", T_U32, L),
        kv(f"{arch}.feed_forward_length", T_U32, F),
        kv(f"{arch}.attention.head_count", T_U32, nh),
        kv(f"{arch}.attention.head_count_kv", T_U32, nkv),
        kv(f"{arch}.attention.key_length", T_U32, hd),
        kv(f"{arch}.attention.value_length", T_U32, hd),
        kv(f"{arch}.rope.dimension_count", T_U32, hd),
        kv(f"{arch}.rope.freq_base", T_F32, float(cfg.get("rope_theta", 10000.0))),
        kv(f"{arch}.attention.layer_norm_rms_epsilon", T_F32, float(cfg.get("rms_norm_eps", 1e-6))),
    ] + ([
        kv(f"{arch}.expert_count", T_U32, E),
        kv(f"{arch}.expert_used_count", T_U32, K),
        kv(f"{arch}.expert_feed_forward_length", T_U32, FE),
    ] if moe else []) + [
        kv("tokenizer.ggml.model", T_STR, "llama"),
        kv_array("tokenizer.ggml.tokens", T_STR, vocab),
        kv_array("tokenizer.ggml.scores", T_F32, [0.0] * V),
        kv_array("tokenizer.ggml.token_type", T_I32, ttype),
        kv("tokenizer.ggml.bos_token_id", T_U32, 1),
        kv("tokenizer.ggml.eos_token_id", T_U32, 2),
        kv("tokenizer.ggml.unknown_token_id", T_U32, 0),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, True),
    ]

    infos, offset, sizes = [], 0, []
    for name, ne, typ in tensors:
        be, bb = BLOCK[typ]
        n = 1
        for d in ne:
            n *= d
        size = n // be * bb
        infos.append(gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) +
                     struct.pack("<IQ", typ, offset))
        sizes.append(size)
        offset += (size + ALIGN - 1) // ALIGN * ALIGN

    rng = random.Random(a.seed)
    chunks = {}
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)))
        for m in meta:
            f.write(m)
        for i in infos:
            f.write(i)
        f.write(b"\0" * ((-f.tell()) % ALIGN))
        for (name, ne, typ), size in zip(tensors, sizes):
            if typ not in chunks:
                bb = BLOCK[typ][1]
                chunks[typ] = random_chunk(typ, (1 << 20) // bb * bb, rng)
            ch = chunks[typ]
            if name.endswith("norm.weight"):
                f.write(struct.pack("<f", 1.0) * (size // 4))
            else:
                left = size
                while left > 0:
                    n = min(left, len(ch))
                    f.write(ch[:n])
                    left -= n
            f.write(b"\0" * ((-size) % ALIGN))
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
