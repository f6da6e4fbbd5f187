#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_safetensors.c to tests/data/ckpt/fuzz-seeds/.

Small safetensors files, valid and malformed, that reach every branch of the
header parser. Run from the repository root; no dependencies."""
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

os.makedirs(OUT, exist_ok=True)
for name, blob in SEEDS.items():
    with open(os.path.join(OUT, name + ".safetensors"), "wb") as f:
        f.write(blob)
print(f"{len(SEEDS)} seeds in {OUT}")
