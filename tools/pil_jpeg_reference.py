#!/usr/bin/python3
"""Writes tests/data/vision/jpeg/: small JPEGs saved by Debian's python3-pil
(libjpeg-turbo) and, for each, the RGB bytes Pillow decodes from it
(Image.open(f).convert("RGB"), no EXIF transpose) as NAME.rgb, plus
index.json (name, h, w, sha256 of the RGB bytes). kimg_decode_jpeg must
match every byte. Also writes a few truncated/corrupt cases with whether
Pillow refuses them, and the server test's JPEG (qwen2_vl_image.jpg) with
the PNG of its decoded pixels.

Run with /usr/bin/python3 (python3-pil, python3-numpy) from the repository root:
    /usr/bin/python3 tools/pil_jpeg_reference.py
"""
import hashlib
import io
import json
import os

import numpy as np
import PIL
from PIL import Image

OUT = "tests/data/vision/jpeg"
rng = np.random.default_rng(11)


def picture(h, w, ch):
    # smooth gradients plus noise: chroma subsampling and the IDCT both matter
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256, (x * y) % 200], -1)
    img = (base[..., :ch] + rng.integers(-40, 40, (h, w, ch))).clip(0, 255).astype(np.uint8)
    return img


def save(img, **kw):
    b = io.BytesIO()
    img.save(b, "JPEG", **kw)
    return b.getvalue()


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = {}
    rgb = Image.fromarray(picture(37, 53, 3))
    cases["color420"] = save(rgb, quality=85, subsampling=2)
    cases["color444"] = save(rgb, quality=90, subsampling=0)
    cases["color422_odd"] = save(Image.fromarray(picture(13, 7, 3)), quality=75, subsampling=1)
    cases["progressive"] = save(Image.fromarray(picture(29, 41, 3)), quality=80, progressive=True)
    cases["gray"] = save(Image.fromarray(picture(21, 19, 1)[..., 0]), quality=85)
    cases["gray_progressive"] = save(Image.fromarray(picture(9, 33, 1)[..., 0]), quality=70, progressive=True)
    cmyk = Image.fromarray(picture(11, 17, 4), "CMYK")
    cases["cmyk"] = save(cmyk, quality=90)
    cases["tiny_1x1"] = save(Image.fromarray(picture(1, 1, 3)), quality=95)
    # an EXIF orientation of 6 (rotate): Image.open does not apply it
    exif = Image.Exif()
    exif[0x0112] = 6
    cases["exif_rotated"] = save(Image.fromarray(picture(8, 24, 3)), quality=85, exif=exif.tobytes())
    cases["optimized"] = save(Image.fromarray(picture(40, 24, 3)), quality=60, optimize=True)
    index = []
    for name, data in cases.items():
        with open(f"{OUT}/{name}.jpg", "wb") as f:
            f.write(data)
        im = Image.open(io.BytesIO(data))
        mode = im.mode
        px = im.convert("RGB")
        raw = px.tobytes()
        with open(f"{OUT}/{name}.rgb", "wb") as f:
            f.write(raw)
        index.append({"name": name, "mode": mode, "h": px.height, "w": px.width,
                      "sha256": hashlib.sha256(raw).hexdigest()})
    # bad input: does Pillow refuse it?
    good = cases["color420"]
    bad = {"truncated_half": good[: len(good) // 2], "no_eoi": good[:-2], "header_only": good[:200]}
    for name, data in bad.items():
        with open(f"{OUT}/{name}.jpg", "wb") as f:
            f.write(data)
        try:
            Image.open(io.BytesIO(data)).convert("RGB")
            refused = False
        except Exception as e:  # noqa: BLE001
            refused = str(e)
        index.append({"name": name, "pil_refuses": refused})
    # the server test's image: the Qwen2-VL fixture's picture as a JPEG, and
    # the pixels Pillow decodes from it as a PNG (the same request twice)
    src = Image.open("tests/fixtures/vlm/qwen2_vl/image.png").convert("RGB")
    data = save(src, quality=80)
    with open(f"{OUT}/qwen2_vl_image.jpg", "wb") as f:
        f.write(data)
    Image.open(io.BytesIO(data)).convert("RGB").save(f"{OUT}/qwen2_vl_image_decoded.png")
    with open(f"{OUT}/index.json", "w") as f:
        json.dump({"pil": PIL.__version__, "cases": index}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
