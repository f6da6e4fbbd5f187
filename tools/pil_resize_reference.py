#!/usr/bin/python3
"""Writes tests/data/vision/resize.json: small RGB images resized by PIL
(Debian's python3-pil, whose ImagingResample kimg_resize reproduces) with
every separable filter, down and up, and Qwen2-VL's smart_resize sizes as
transformers 4.57 computes them (Python's round: half to even).

Run with /usr/bin/python3 (python3-pil, python3-numpy) from the repository root:
    /usr/bin/python3 tools/pil_resize_reference.py
"""
import json
import math

import numpy as np
import PIL
from PIL import Image

rng = np.random.default_rng(7)
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS,
           "box": Image.BOX, "hamming": Image.HAMMING}
IN = [(13, 17), (9, 6)]  # (h, w)
OUT = [(5, 7), (13, 8), (20, 31), (4, 17), (1, 3)]


def smart_resize(height, width, factor, min_pixels, max_pixels):
    # transformers/models/qwen2_vl/image_processing_qwen2_vl.py (4.57)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


cases = []
for h, w in IN:
    src = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    # a smooth ramp plus noise keeps both the edges and the overshoot clipping busy
    src[: h // 2, : w // 2] = 255
    for name, f in FILTERS.items():
        for oh, ow in OUT:
            out = np.asarray(Image.fromarray(src).resize((ow, oh), resample=f))
            cases.append({"filter": name, "pil_filter": int(f), "h": h, "w": w, "oh": oh, "ow": ow,
                          "in": src.reshape(-1).tolist(), "out": out.reshape(-1).tolist()})
smart = []
for h, w, factor, lo, hi in [(48, 64, 16, 256, 16384), (40, 56, 16, 256, 16384), (24, 24, 16, 256, 16384),
                             (1000, 700, 28, 3136, 1003520), (4000, 3000, 28, 3136, 1003520), (10, 300, 16, 1024, 16384),
                             (72, 88, 16, 256, 4096), (7, 9, 14, 3136, 12845056)]:
    oh, ow = smart_resize(h, w, factor, lo, hi)
    smart.append({"h": h, "w": w, "factor": factor, "min_pixels": lo, "max_pixels": hi, "oh": oh, "ow": ow})
# Qwen2-VL's slow processor end to end on an image that needs resizing, as
# Qwen2VLImageProcessor._preprocess does it with the committed qwen2_vl
# fixture's preprocessor_config.json: smart_resize, PIL resize of the uint8
# image, rescale in float64 then float32, normalize in float32, the still
# image repeated over temporal_patch_size, patches in merged-block order.
cfg = json.load(open("tests/fixtures/vlm/qwen2_vl/preprocessor_config.json"))
P, T, M = cfg["patch_size"], cfg["temporal_patch_size"], cfg["merge_size"]
img = rng.integers(0, 256, size=(23, 29, 3), dtype=np.uint8)
rh, rw = smart_resize(23, 29, P * M, cfg["min_pixels"], cfg["max_pixels"])
x = np.asarray(Image.fromarray(img).resize((rw, rh), resample=cfg["resample"]))
x = (x.astype(np.float64) * cfg["rescale_factor"]).astype(np.float32)
x = (x - np.array(cfg["image_mean"], dtype=np.float32)) / np.array(cfg["image_std"], dtype=np.float32)
x = x.transpose(2, 0, 1)[None].repeat(T, axis=0)  # [T, C, H, W]
gh, gw = rh // P, rw // P
x = x.reshape(1, T, 3, gh // M, M, P, gw // M, M, P).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
qwen = {"h": 23, "w": 29, "image": img.reshape(-1).tolist(), "oh": rh, "ow": rw,
        "patches": [float(v) for v in x.reshape(gh * gw, 3 * T * P * P).reshape(-1)]}
with open("tests/data/vision/resize.json", "w") as fp:
    json.dump({"pil_version": PIL.__version__, "resize": cases, "smart_resize": smart, "qwen2_vl_preprocess": qwen}, fp,
              separators=(",", ":"))
print(len(cases), "resize cases,", len(smart), "smart_resize cases; PIL", PIL.__version__)
