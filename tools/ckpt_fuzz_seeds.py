#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer harnesses:
  tests/data/ckpt/fuzz-seeds/             fuzz/fuzz_safetensors.c: safetensors files
  tests/data/ckpt/fuzz-seeds-checkpoint/  fuzz/fuzz_checkpoint.c: 2-byte config length,
                                          config.json, model.safetensors
Small inputs, valid and malformed, that reach every branch of the parsers.
Run from the repository root; no dependencies."""
import json
import os
import struct

OUT = "tests/data/ckpt/fuzz-seeds"
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4,
         "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8, "F8_E4M3": 1}


def st(tensors, meta=None, pad=True, data=None):
    """tensors: list of (name, dtype, shape); data laid out in order."""
    hdr, off = {}, 0
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = SIZES[dt]
        for d in shape:
            n *= d
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(hdr, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    body = data if data is not None else bytes((i * 37) & 255 for i in range(off))
    return struct.pack("<Q", len(h)) + h + body


def raw(header, dlen):
    h = header.encode()
    return struct.pack("<Q", len(h)) + h + bytes(dlen)


SEEDS = {
    "f32": st([("w", "F32", [2, 3])]),
    "dtypes": st([(f"t.{d}", d, [3]) for d in SIZES], meta={"format": "pt"}),
    "mlx_q4": st([("m.weight", "U32", [4, 8]), ("m.scales", "BF16", [4, 1]), ("m.biases", "BF16", [4, 1]),
                  ("m.norm", "F32", [64])], meta={"format": "mlx"}),
    "zero_scalar": st([("z", "F32", [0, 5]), ("s", "F64", []), ("e", "I8", [0])]),
    "misaligned": st([("a", "BF16", [3]), ("b", "F32", [2])], pad=False),
    "empty": st([]),
    "rank8": st([("r", "U8", [1, 1, 1, 1, 1, 1, 1, 2])]),
    "overlap": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                   '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12),
    "hole": raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
    "dup": raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
               '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
    "bigshape": raw('{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}', 4),
    "badlen": b"\xff" * 8 + b"{}",
}



def ckpt(config, blob):
    c = json.dumps(config).encode() if not isinstance(config, bytes) else config
    return struct.pack("<H", len(c)) + c + blob


Q = {"group_size": 32, "bits": 4}
QM = [("m.weight", "U32", [2, 4]), ("m.scales", "F16", [2, 1]), ("m.biases", "F16", [2, 1])]
CKPT_SEEDS = {
    "plain": ckpt({"model_type": "llama", "eos_token_id": [1, 2], "bos_token_id": 1},
                  st([("a.weight", "F32", [2, 3]), ("b.weight", "BF16", [3, 2]), ("n.weight", "F16", [4])])),
    "q4": ckpt({"model_type": "llama", "quantization": Q}, st(QM + [("e.weight", "F32", [2, 2])])),
    "q3_override": ckpt({"model_type": "qwen3", "quantization": {"group_size": 64, "bits": 4,
                                                                  "m": {"group_size": 32, "bits": 3}}},
                        st([("m.weight", "U32", [2, 3]), ("m.scales", "BF16", [2, 1]), ("m.biases", "BF16", [2, 1])])),
    "derived": ckpt({"model_type": "llama", "quantization": {"group_size": 64, "bits": 4}},
                    st([("m.weight", "U32", [2, 16]), ("m.scales", "F32", [2, 1]), ("m.biases", "F32", [2, 1])])),
    "text_config": ckpt(b'{"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "x": [0.0, Infinity],'
                        b' "eos_token_id": 106}, "quantization_config": {"group_size": 32, "bits": 8}}',
                        st([("m.weight", "U32", [1, 8]), ("m.scales", "F32", [1, 1]), ("m.biases", "F32", [1, 1])])),
    "gptq": ckpt({"model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 4}},
                 st([("q.weight", "U8", [2, 2]), ("q.scales", "F16", [2, 1])])),
    "misaligned": ckpt({"model_type": "llama", "quantization": Q}, st(QM, pad=False)),
    "mxfp4": ckpt({"model_type": "gpt_oss", "quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}},
                  st(QM)),
}

for out, seeds, ext in ((OUT, SEEDS, ".safetensors"), (OUT + "-checkpoint", CKPT_SEEDS, ".bin")):
    os.makedirs(out, exist_ok=True)
    for name, blob in seeds.items():
        with open(os.path.join(out, name + ext), "wb") as f:
            f.write(blob)
    print(f"{len(seeds)} seeds in {out}")
