#!/usr/bin/python3
"""Writes tests/data/vision/webp_gif/: small WebP and GIF files saved by
Debian's python3-pil (libwebp, Pillow's own GIF writer) and, for each, the
RGB bytes Pillow decodes from it (Image.open(f).convert("RGB"): the first
frame, alpha dropped, palette looked up) as NAME.rgb, plus index.json
(name, file, h, w, sha256 of the RGB bytes). kimg_decode must match every
byte. Also a few truncated or corrupt files with whether Pillow refuses
them.

Run with /usr/bin/python3 (python3-pil) from the repository root:
    /usr/bin/python3 tools/pil_webp_gif_reference.py
"""
import hashlib
import io
import json
import os
import random
import struct

import PIL
from PIL import Image

OUT = "tests/data/vision/webp_gif"
rnd = random.Random(5)


def picture(w, h, mode="RGB"):
    """Smooth gradients plus noise (lossy coding and chroma upsampling matter)."""
    im = Image.new(mode, (w, h))
    px = []
    for y in range(h):
        for x in range(w):
            r = x * 255 // max(w - 1, 1)
            g = y * 255 // max(h - 1, 1)
            b = ((x + y) * 7) % 256
            n = lambda v: max(0, min(255, v + rnd.randint(-30, 30)))
            p = (n(r), n(g), n(b))
            if mode == "RGBA":
                # a transparent band whose colours the lossless coder keeps
                a = 0 if 3 <= x < 7 else (255 if y % 3 else 128)
                p = p + (a,)
            px.append(p)
    im.putdata(px)
    return im


def save(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def gif_raw(w, h, frames, global_pal=None, interlace=False, trns=None, bg=0, code_bits=None):
    """A GIF written by hand (Pillow's writer always covers the whole
    screen): frames are (x, y, fw, fh, indices, local_palette or None)."""
    def lzw(data, bits):
        # the plainest valid encoder: a clear code before every code, so
        # codes stay at min_bits + 1 bits
        clear, end = 1 << bits, (1 << bits) + 1
        width = bits + 1
        out, acc, n = bytearray(), 0, 0
        def put(code):
            nonlocal acc, n
            acc |= code << n
            n += width
            while n >= 8:
                out.append(acc & 255)
                acc >>= 8
                n -= 8
        for v in data:
            put(clear)
            put(v)
        put(end)
        if n:
            out.append(acc & 255)
        blocks = bytearray()
        for i in range(0, len(out), 255):
            c = out[i:i + 255]
            blocks += bytes([len(c)]) + c
        return bytes(blocks) + b"\0"

    def pal_bits(p):
        n = len(p) // 3
        k = 1
        while (1 << k) < n:
            k += 1
        return k

    b = bytearray(b"GIF89a")
    flags = 0
    if global_pal:
        k = pal_bits(global_pal)
        flags = 0x80 | ((k - 1) << 4) | (k - 1)
    b += struct.pack("<HHBBB", w, h, flags, bg, 0)
    if global_pal:
        b += bytes(global_pal) + bytes(3 * (1 << pal_bits(global_pal)) - len(global_pal))
    if len(frames) > 1:
        b += b"\x21\xff\x0bNETSCAPE2.0\x03\x01\x00\x00\x00"
    for (x, y, fw, fh, idx, local) in frames:
        if trns is not None or len(frames) > 1:
            b += b"\x21\xf9\x04" + bytes([1 if trns is not None else 0]) + struct.pack("<H", 10) + bytes([trns or 0]) + b"\0"
        f = 0x40 if interlace else 0
        if local:
            k = pal_bits(local)
            f |= 0x80 | (k - 1)
        b += b"\x2c" + struct.pack("<HHHHB", x, y, fw, fh, f)
        if local:
            b += bytes(local) + bytes(3 * (1 << pal_bits(local)) - len(local))
        rows = [idx[r * fw:(r + 1) * fw] for r in range(fh)]
        if interlace:
            order = list(range(0, fh, 8)) + list(range(4, fh, 8)) + list(range(2, fh, 4)) + list(range(1, fh, 2))
            rows = [rows[r] for r in order]
        data = [v for r in rows for v in r]
        bits = code_bits or max(2, pal_bits(local or global_pal or [0] * 12))
        b += bytes([bits]) + lzw(data, bits)
    b += b"\x3b"
    return bytes(b)


def cases():
    out = []
    out.append(("webp_lossy", "webp", save(picture(37, 23), "WEBP", quality=70)))
    out.append(("webp_lossy_odd", "webp", save(picture(9, 5), "WEBP", quality=20)))
    out.append(("webp_lossless", "webp", save(picture(21, 14), "WEBP", lossless=True)))
    out.append(("webp_alpha_lossless", "webp", save(picture(16, 11, "RGBA"), "WEBP", lossless=True, exact=True)))
    out.append(("webp_alpha_lossy", "webp", save(picture(16, 11, "RGBA"), "WEBP", quality=60)))
    a, b = picture(12, 8), picture(12, 8).transpose(Image.FLIP_LEFT_RIGHT)
    out.append(("webp_animated", "webp", save(a, "WEBP", save_all=True, append_images=[b], duration=100, lossless=True)))
    # GIFs from Pillow's writer: quantized photo, a gray one, an animation
    p = picture(31, 17).quantize(colors=64)
    out.append(("gif_pil_quantized", "gif", save(p, "GIF")))
    out.append(("gif_pil_gray", "gif", save(picture(13, 9).convert("L"), "GIF")))
    q1, q2 = picture(10, 6).quantize(colors=16), picture(10, 6).rotate(180).quantize(colors=16)
    out.append(("gif_pil_animated", "gif", save(q1, "GIF", save_all=True, append_images=[q2], duration=80, loop=0)))
    # GIFs by hand: interlaced with a local palette; a first frame smaller
    # than the screen, with and without a transparent index; indices past
    # the 8-entry colour table (an LZW code size of 4 allows 16)
    pal = [v for i in range(16) for v in ((i * 17) % 256, (255 - i * 13) % 256, (i * 40) % 256)]
    idx = [(x * 3 + y * 5) % 16 for y in range(11) for x in range(7)]
    out.append(("gif_interlaced_local", "gif", gif_raw(7, 11, [(0, 0, 7, 11, idx, pal)], interlace=True)))
    small = [(x + y) % 8 for y in range(4) for x in range(5)]
    out.append(("gif_offset_frame", "gif", gif_raw(9, 7, [(2, 1, 5, 4, small, None)], global_pal=pal[:24], bg=3)))
    out.append(("gif_offset_transparent", "gif", gif_raw(9, 7, [(3, 2, 5, 4, small, None)], global_pal=pal[:24], trns=5)))
    past = [(x * 7 + y) % 16 for y in range(3) for x in range(6)]
    out.append(("gif_short_palette", "gif", gif_raw(6, 3, [(0, 0, 6, 3, past, None)], global_pal=pal[:12] + [9, 9, 9] * 2, code_bits=4)))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    index = {"pillow": PIL.__version__, "cases": []}
    for name, ext, data in cases():
        with open(f"{OUT}/{name}.{ext}", "wb") as f:
            f.write(data)
        rgb = Image.open(io.BytesIO(data)).convert("RGB")
        raw = rgb.tobytes()
        with open(f"{OUT}/{name}.rgb", "wb") as f:
            f.write(raw)
        index["cases"].append({"name": name, "file": f"{name}.{ext}", "h": rgb.height, "w": rgb.width,
                               "sha256": hashlib.sha256(raw).hexdigest()})
    # broken files: cut short, a corrupt header
    for name, ext, data in cases()[:1] + cases()[6:7]:
        for cut_name, blob in ((f"{name}_cut", data[: len(data) // 2]), (f"{name}_badhdr", data[:6] + b"\xff" * 8 + data[14:])):
            with open(f"{OUT}/{cut_name}.{ext}", "wb") as f:
                f.write(blob)
            try:
                im = Image.open(io.BytesIO(blob))
                im.load()
                refused = False
            except Exception:
                refused = True
            index["cases"].append({"name": cut_name, "file": f"{cut_name}.{ext}", "pil_refuses": refused})
    with open(f"{OUT}/index.json", "w") as f:
        json.dump(index, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
