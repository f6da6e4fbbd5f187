#!/usr/bin/env python3
"""Cuts a byte-level BPE tokenizer.json down to its first N ids, for tests
that pair a tokenizer with the tiny oracle fixtures (vocab_size 512).

BPE ids of a trained tokenizer are assigned in merge order (specials, the
256 bytes, then one id per merge), so keeping the ids below N and the merges
whose result is below N is the tokenizer that training would have produced
had it stopped there: encoding stays exact, every id fits the model.

    tools/make_test_tokenizer.py SRC_DIR DST_DIR [N]

SRC_DIR holds tokenizer.json and tokenizer_config.json (kiln's demo model,
models/kiln-demo, made by tools/train_demo.py). tests/data/server/tok512 was
made from it with N = 512.
"""
import json
import os
import sys

src, dst = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 512
with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
    tok = json.load(f)
model = tok["model"]
assert model["type"] == "BPE", "only BPE tokenizers"
vocab = {s: i for s, i in model["vocab"].items() if i < n}
merges = []
for m in model["merges"]:
    a, b = m if isinstance(m, list) else m.split(" ", 1)
    if a in vocab and b in vocab and (a + b) in vocab:
        merges.append([a, b])
model["vocab"] = vocab
model["merges"] = merges
tok["added_tokens"] = [t for t in tok["added_tokens"] if t["id"] < n]
os.makedirs(dst, exist_ok=True)
with open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tok, f, ensure_ascii=False, indent=None, separators=(",", ":"))
with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
    cfg = json.load(f)
cfg["added_tokens_decoder"] = {k: v for k, v in cfg.get("added_tokens_decoder", {}).items() if int(k) < n}
with open(os.path.join(dst, "tokenizer_config.json"), "w", encoding="utf-8") as f:
    json.dump(cfg, f, ensure_ascii=False, indent=2)
print(f"{dst}: {len(vocab)} ids, {len(merges)} merges")
