#!/usr/bin/python3
"""Train kiln's bundled demo model from scratch, on two CPU cores, in minutes.

What it makes (all paths relative to the repository root):
  models/kiln-demo/        a standard Hugging Face checkpoint folder: config.json,
                           generation_config.json, model.safetensors (float32),
                           tokenizer.json, tokenizer_config.json, README.md (model card),
                           heldout.txt (text never trained on, for perplexity)
  tests/data/demo/         oracle.json + logits.npy (greedy reference in the layout of
                           ../shared/oracle fixtures), tokenizer_vectors.json (strings and
                           their ids), perplexity.json (llama.cpp-style reference figures)

Pipeline (each step is deterministic; seeds are fixed below):
  1. corpus: the fortune cookie files of Debian's `fortunes` / `fortunes-min` packages
     (BSD licence, see the model card), cleaned and split by fortune into train / held-out;
  2. tokenizer: byte-level BPE (GPT-2 pre-tokenizer regex, GPT-2 byte-to-unicode map,
     merges learned here), written as tokenizer.json; our own encoder is checked against
     the JavaScript @huggingface/tokenizers by tools/check_demo_tokenizer.mjs;
  3. model: a Llama (transformers' LlamaForCausalLM maths, written out below) trained
     with AdamW (its training forward takes two exact-in-maths shortcuts, see Attention);
  4. export + reference: the checkpoint is written, read back from disk and run in float32
     to produce the reference data kiln's tests compare against.

Needs only Debian packages: python3-torch python3-numpy fortunes fortunes-min.
Run:  /usr/bin/python3 tools/train_demo.py     (everything: ~20 min on 2 quiet cores)
      /usr/bin/python3 tools/train_demo.py --draft   (models/kiln-demo-draft: a 2-layer
                 draft with the same tokenizer, distilled from models/kiln-demo)
      /usr/bin/python3 tools/train_demo.py --reference-only   (steps 1, 2, 4 from the
                 committed checkpoint and tests/data/demo/training_info.json; no training)
"""
import argparse
import heapq
import json
import math
import os
import random
import re
import struct
import sys
import time
import unicodedata

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORTUNE_DIR = "/usr/share/games/fortunes"
SEED = 1234

# ----------------------------------------------------------------------------
# Hyper-parameters (everything the result depends on is here)

VOCAB_SIZE = 4096               # 3 special tokens + 256 bytes + 3837 merges
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT, IM_START, IM_END = 0, 1, 2
MODEL_CFG = dict(
    hidden_size=256,
    intermediate_size=640,      # a multiple of 128: every MLX group size divides it
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    max_position_embeddings=256,   # = the training window: no untrained positions
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)
TRAIN_CFG = dict(
    seq_len=256,
    batch_size=16,
    steps=650,
    lr=2e-3,
    min_lr=1e-4,
    warmup=60,
    weight_decay=0.1,
    dropout=0.0,
    grad_clip=1.0,
    threads=2,
)
# --draft: a small sibling with the same tokenizer, for speculative decoding (kiln
# --model-draft), trained to predict the demo model's next-token distributions.
DRAFT_CFG = dict(MODEL_CFG, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)
# (shorter windows and fewer steps than the demo's: the teacher's forward doubles a step's cost)
DRAFT_TRAIN_CFG = dict(TRAIN_CFG, seq_len=128, steps=240, warmup=24, lr=3e-3, threads=1)
HELDOUT_EVERY = 20              # one fortune in 20 (after a seeded shuffle) is held out
MAX_FORTUNE_CHARS = 700         # longer entries are stories, not fortunes
CHAT_FRACTION = 0.15            # share of training fortunes also shown in ChatML form
# Files left out: ascii-art (pictures), translate-me (not English prose), ethnic
# (jokes about ethnic groups: not what a demo should echo).
SKIP_FILES = {"ascii-art", "translate-me", "ethnic"}

PROMPT_TEXT = "The secret of success is"
N_ORACLE = 24
N_LONG = 64

# ----------------------------------------------------------------------------
# 1. Corpus


def clean_fortune(raw):
    """One fortune as it appears between `%` lines -> normalised text, or None.

    Removes terminal overstrike (`_\\bX` underline, `X\\bX` bold), expands tabs, strips
    trailing blanks, turns an indented attribution `\\t\\t-- Name` into `-- Name`, turns any
    other indentation into four spaces, squeezes runs of blanks inside a line to one, drops
    leading/trailing empty lines and squeezes runs of empty lines to one."""
    text = unicodedata.normalize("NFC", raw)
    text = re.sub(r".\x08", "", text)
    text = text.replace("\r", "")
    lines = []
    for line in text.split("\n"):
        line = line.expandtabs(8).rstrip()
        body = line.lstrip(" ")
        indent = len(line) - len(body)
        body = re.sub(r" {2,}", " ", body)
        if body.startswith("--") and indent > 0:
            line = body
        elif indent >= 2:
            line = "    " + body
        else:
            line = body
        if line == "" and (not lines or lines[-1] == ""):
            continue
        lines.append(line)
    while lines and lines[-1] == "":
        lines.pop()
    text = "\n".join(lines)
    if not text or len(text) > MAX_FORTUNE_CHARS:
        return None
    if any(unicodedata.category(c) == "Cc" and c != "\n" for c in text):
        return None
    # Pictures and tables: mostly punctuation.
    letters = sum(c.isalpha() for c in text)
    if letters < 0.6 * len(text.replace(" ", "").replace("\n", "")):
        return None
    return text


def load_corpus():
    """-> (train, heldout): lists of (category, text), in a seeded order."""
    if not os.path.isdir(FORTUNE_DIR):
        sys.exit(f"{FORTUNE_DIR} missing: apt-get install -y fortunes fortunes-min")
    entries, seen = [], set()
    for name in sorted(os.listdir(FORTUNE_DIR)):
        path = os.path.join(FORTUNE_DIR, name)
        if "." in name or os.path.islink(path) or name in SKIP_FILES:
            continue
        with open(path, "rb") as f:
            data = f.read().decode("utf-8", errors="replace")
        for raw in re.split(r"^%\n", data, flags=re.M):
            text = clean_fortune(raw)
            if text is None or text in seen:
                continue
            seen.add(text)
            entries.append((name, text))
    rng = random.Random(SEED)
    rng.shuffle(entries)
    heldout = [e for i, e in enumerate(entries) if i % HELDOUT_EVERY == 0]
    train = [e for i, e in enumerate(entries) if i % HELDOUT_EVERY != 0]
    return train, heldout


# Topics for the ChatML-formatted copies, so that the chat template leads somewhere.
TOPICS = {
    "art": "art", "computers": "computers", "cookie": None, "debian": "Debian",
    "definitions": "definitions", "disclaimer": "disclaimers", "drugs": "drugs",
    "education": "education", "food": "food", "fortunes": None, "goedel": "logic",
    "humorists": "humor", "kids": "kids", "knghtbrd": None, "law": "the law",
    "linux": "Linux", "linuxcookie": "Linux", "literature": "literature",
    "love": "love", "magic": "magic", "medicine": "medicine", "men-women": "love",
    "miscellaneous": None, "news": "the news", "paradoxum": "paradoxes",
    "people": "people", "perl": "Perl", "pets": "pets", "platitudes": "life",
    "politics": "politics", "pratchett": "books", "riddles": "riddles",
    "science": "science", "songs-poems": "poetry", "sports": "sports",
    "startrek": "Star Trek", "tao": "the Tao", "wisdom": "wisdom", "work": "work",
    "zippy": "Zippy",
}
PLAIN_ASKS = ["Tell me a fortune.", "Give me a fortune cookie.", "Say something.",
              "Tell me something funny.", "Fortune, please."]
TOPIC_ASKS = ["Tell me something about {}.", "Give me a quote about {}.",
              "What do you know about {}?", "Say something about {}."]
SYSTEMS = ["You are a fortune cookie.", "You are a helpful assistant."]


def chat_text(rng, category, text):
    topic = TOPICS.get(category)
    if topic is not None and rng.random() < 0.7:
        ask = rng.choice(TOPIC_ASKS).format(topic)
    else:
        ask = rng.choice(PLAIN_ASKS)
    sys_part = ""
    if rng.random() < 0.3:
        sys_part = "<|im_start|>system\n" + rng.choice(SYSTEMS) + "<|im_end|>\n"
    return (sys_part + "<|im_start|>user\n" + ask + "<|im_end|>\n"
            "<|im_start|>assistant\n" + text + "<|im_end|>\n")


# ----------------------------------------------------------------------------
# 2. Byte-level BPE tokenizer (GPT-2 style)

GPT2_PATTERN = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                r"|\s+(?!\S)|\s+")
# \s as Oniguruma (Hugging Face tokenizers) and tokenizers.js read it: Unicode White_Space.
WHITE_SPACE = frozenset(map(chr, [9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680,
                                  *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
                                  0x205F, 0x3000]))
CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


def _char_class(c):
    if c in WHITE_SPACE:
        return "S"
    cat = unicodedata.category(c)
    return "L" if cat[0] == "L" else "N" if cat[0] == "N" else "P"


def pretokenize(text):
    """Splits text exactly as GPT2_PATTERN does (leftmost match, first alternative)."""
    cls = [_char_class(c) for c in text]
    n, i, out = len(text), 0, []
    while i < n:
        if text[i] == "'":
            suf = next((s for s in CONTRACTIONS if text.startswith(s, i + 1)), None)
            if suf is not None:
                out.append(text[i:i + 1 + len(suf)])
                i += 1 + len(suf)
                continue
        if text[i] == " " and i + 1 < n and cls[i + 1] != "S":
            start = i + 1            # ` ?\p{L}+` and friends, with the optional space
        elif cls[i] != "S":
            start = i
        else:                        # `\s+(?!\S)|\s+`
            j = i
            while j < n and cls[j] == "S":
                j += 1
            if j < n and j - i >= 2:
                j -= 1               # leave the last blank to prefix the next word
            out.append(text[i:j])
            i = j
            continue
        k, j = cls[start], start
        while j < n and cls[j] == k:
            j += 1
        out.append(text[i:j])
        i = j
    return out


def bytes_to_unicode():
    """GPT-2's reversible map from the 256 byte values to printable characters."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_ENC = bytes_to_unicode()
BYTE_DEC = {v: k for k, v in BYTE_ENC.items()}


def to_byte_level(s):
    return "".join(BYTE_ENC[b] for b in s.encode("utf-8"))


def train_bpe(texts, vocab_size):
    """Learns merges until the vocabulary (specials + 256 bytes + merges) is full.
    Ties between equally frequent pairs go to the lexicographically smallest pair."""
    counts = {}
    for t in texts:
        for w in pretokenize(t):
            bl = to_byte_level(w)
            counts[bl] = counts.get(bl, 0) + 1
    words = [list(w) for w in sorted(counts)]
    freq = [counts[w] for w in sorted(counts)]
    pair_count, where = {}, {}
    for wi, sym in enumerate(words):
        for a, b in zip(sym, sym[1:]):
            pair_count[(a, b)] = pair_count.get((a, b), 0) + freq[wi]
            where.setdefault((a, b), set()).add(wi)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    n_merges = vocab_size - len(SPECIALS) - 256
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        cur = pair_count.get(pair, 0)
        if cur != -negc:
            if cur > 0:
                heapq.heappush(heap, (-cur, pair))
            continue
        if cur < 2:
            break
        merges.append(pair)
        new_sym = pair[0] + pair[1]
        touched = set()
        for wi in sorted(where.pop(pair, ())):
            sym, f = words[wi], freq[wi]
            for a, b in zip(sym, sym[1:]):
                pair_count[(a, b)] -= f
                touched.add((a, b))
            out, k = [], 0
            while k < len(sym):
                if k + 1 < len(sym) and sym[k] == pair[0] and sym[k + 1] == pair[1]:
                    out.append(new_sym)
                    k += 2
                else:
                    out.append(sym[k])
                    k += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):
                pair_count[(a, b)] = pair_count.get((a, b), 0) + f
                where.setdefault((a, b), set()).add(wi)
                touched.add((a, b))
        pair_count.pop(pair, None)
        for p in touched:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
    if len(merges) < n_merges:
        sys.exit(f"corpus too small for {vocab_size} tokens ({len(merges)} merges)")
    return merges


class Tokenizer:
    """Our own encoder/decoder for the tokenizer.json we write: added tokens are split
    out first, then the GPT-2 pre-tokenizer, byte-level map and rank-ordered merges."""

    def __init__(self, merges):
        self.vocab = {s: i for i, s in enumerate(SPECIALS)}
        for b in range(256):
            self.vocab[BYTE_ENC[b]] = len(self.vocab)
        for a, b in merges:
            self.vocab[a + b] = len(self.vocab)
        self.merges = merges
        self.ranks = {p: r for r, p in enumerate(merges)}
        self.inv = {i: s for s, i in self.vocab.items()}
        self.cache = {}
        self.special_re = re.compile("(" + "|".join(map(re.escape, SPECIALS)) + ")")

    def _bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        sym = list(word)
        while len(sym) > 1:
            best = None
            for k in range(len(sym) - 1):
                r = self.ranks.get((sym[k], sym[k + 1]))
                if r is not None and (best is None or r < best):
                    best = r
            if best is None:
                break
            a, b = self.merges[best]
            out, k = [], 0
            while k < len(sym):
                if k + 1 < len(sym) and sym[k] == a and sym[k + 1] == b:
                    out.append(a + b)
                    k += 2
                else:
                    out.append(sym[k])
                    k += 1
            sym = out
        ids = [self.vocab[s] for s in sym]
        self.cache[word] = ids
        return ids

    def encode(self, text, add_bos=True):
        ids = [EOT] if add_bos else []
        for part in self.special_re.split(text):
            if part in self.vocab and part in SPECIALS:
                ids.append(self.vocab[part])
                continue
            for w in pretokenize(part):
                ids.extend(self._bpe(to_byte_level(w)))
        return ids

    def decode(self, ids, skip_special=False):
        out, buf = [], bytearray()
        for i in ids:
            s = self.inv[i]
            if i < len(SPECIALS):
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                if not skip_special:
                    out.append(s)
            else:
                buf.extend(BYTE_DEC[c] for c in s)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    def tokenizer_json(self):
        added = [dict(id=i, content=s, single_word=False, lstrip=False, rstrip=False,
                      normalized=False, special=True) for i, s in enumerate(SPECIALS)]
        bos = {"SpecialToken": {"id": SPECIALS[EOT], "type_id": 0}}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": GPT2_PATTERN},
                 "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                 "use_regex": False}]},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": SPECIALS[EOT], "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {SPECIALS[EOT]: {"id": SPECIALS[EOT], "ids": [EOT],
                                                   "tokens": [SPECIALS[EOT]]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                        "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": self.vocab, "merges": [list(m) for m in self.merges]},
        }


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def tokenizer_config():
    dec = {str(i): dict(content=s, lstrip=False, normalized=False, rstrip=False,
                        single_word=False, special=True) for i, s in enumerate(SPECIALS)}
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": dec,
        "additional_special_tokens": SPECIALS[1:],
        "bos_token": SPECIALS[EOT],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": SPECIALS[EOT],
        "model_max_length": MODEL_CFG["max_position_embeddings"],
        "pad_token": SPECIALS[EOT],
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


TRICKY = [
    "Hello world", " Hello world", "Hello  world", "Hello   world ", "  leading spaces",
    "trailing spaces   ", "tabs\tand\t\tmore\ttabs", "line\nbreaks\n\n\nand blank lines\n",
    "\n", " ", "", "a", "I'm sure you'll see they've done it, she'd say, 'tis so.",
    "DON'T SHOUT, I'M HERE", "it's John's", "x'sy 's 'S", "Numbers 1 12 123 1234 3.14159 1,000,000",
    "$5.99 + 20% = ?", "e-mail: someone@example.com, http://www.debian.org/~user/",
    "C++ && (a||b) -> *p++; // comment", "Ünïcödé naïve café résumé", "日本語のテキスト",
    "Привет, мир!", "emoji 😀🎉 and ZWJ 👩‍💻", "mixed\u00a0nbsp and\u2003em space",
    "\u3000ideographic space", "combining e\u0301 accent", "<|endoftext|>", "a<|im_start|>b<|im_end|>c",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n", "<|endoftext", "  \n  \n",
    "Ελληνικά ½ ² ³ Ⅻ ٣", "    -- Mark Twain", "\"Quoted,\" he said... (really?!)",
    "windows\r\nline ends\r\n", "next\u0085line", "\ufeffbyte order mark", "vertical\x0btab",
    "line\u2028separator", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math letters", "control \x00\x01\x7f chars",
    "thumbs 👍🏽 up", "'' ' '''s", "end with space ", "12345678901234567890",
]


# ----------------------------------------------------------------------------
# 3. Model: transformers' LlamaForCausalLM, float32 (eager attention)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(cfg, positions):
    """positions [T] int64 -> cos, signed sin [T, head_dim] (HF's default rope, float32).

    HF rotates with q*cos + rotate_half(q)*sin, rotate_half(q) = cat(-q2, q1). Here the
    sign lives in sin: cat(-q2, q1)*sin == roll(q, d/2)*cat(-sin1, sin2) bit for bit
    (negation is exact), and roll costs one copy where slicing + cat cost several."""
    d = cfg["head_dim"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64)
                                            .to(torch.float32) / d))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    sign = torch.cat((-torch.ones(d // 2), torch.ones(d // 2)))
    return emb.cos(), sin * sign


def apply_rope(x, cos, sin_signed):
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_signed


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, d = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.d = cfg["num_attention_heads"], cfg["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.nh * d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nh * d, h, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.d).transpose(1, 2)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        if self.training:
            # Same maths, cheaper: the scale folded into q, and each KV head shared by
            # its `rep` query heads without copying K and V.
            q = (q * self.d ** -0.5).reshape(B, self.nkv, rep * T, self.d)
            w = torch.matmul(q, k.transpose(2, 3)).view(B, self.nkv, rep, T, T) + mask
            w = F.softmax(w, dim=-1).view(B, self.nkv, rep * T, T)
            o = torch.matmul(w, v).view(B, self.nh, T, self.d)
        else:
            # transformers' eager attention, operation for operation (repeat_kv, scale
            # after the product, additive mask, float32 softmax).
            k = k[:, :, None].expand(B, self.nkv, rep, T, self.d).reshape(B, self.nh, T, self.d)
            v = v[:, :, None].expand(B, self.nkv, rep, T, self.d).reshape(B, self.nh, T, self.d)
            w = torch.matmul(q, k.transpose(2, 3)) * self.d ** -0.5
            w = w + mask
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, v)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.d)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x, cos, sin, mask, drop):
        a = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        if drop > 0 and self.training:
            a = F.dropout(a, drop)
        x = x + a
        m = self.mlp(self.post_attention_layernorm(x))
        if drop > 0 and self.training:
            m = F.dropout(m, drop)
        return x + m


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class Llama(nn.Module):
    """HF LlamaForCausalLM: module names equal the checkpoint's tensor names."""

    def __init__(self, cfg, dropout=0.0):
        super().__init__()
        self.cfg, self.dropout = cfg, dropout
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, gen):
        std = 0.02
        resid = std / math.sqrt(2 * self.cfg["num_hidden_layers"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    p.fill_(1.0)
                elif name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.normal_(0.0, resid, generator=gen)
                else:
                    p.normal_(0.0, std, generator=gen)

    def forward(self, ids):
        """ids [B, T] -> logits [B, T, vocab] (float32)."""
        T = ids.shape[1]
        pos = torch.arange(T)
        cos, sin = rope_cos_sin(self.cfg, pos)
        mask = torch.full((T, T), torch.finfo(torch.float32).min).triu(1)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, self.dropout)
        return self.lm_head(self.model.norm(x))


# ----------------------------------------------------------------------------
# Checkpoint files


def hf_config(cfg):
    c = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": EOT,
        "dtype": "float32",
        "eos_token_id": EOT,
        "head_dim": cfg["head_dim"],
        "hidden_act": "silu",
        "hidden_size": cfg["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "pad_token_id": EOT,
        "pretraining_tp": 1,
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": cfg["rope_theta"],
        "tie_word_embeddings": cfg["tie_word_embeddings"],
        "use_cache": True,
        "vocab_size": cfg["vocab_size"],
    }
    return c


GENERATION_CONFIG = {
    "bos_token_id": EOT,
    "do_sample": True,
    "eos_token_id": [EOT, IM_END],
    "pad_token_id": EOT,
    "temperature": 0.8,
    "top_k": 40,
}


def state_for_checkpoint(model):
    """HF tensor names -> float32 numpy arrays; a tied lm_head is left out, as
    transformers' save_pretrained does."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.cfg["tie_word_embeddings"]:
            continue
        out[name] = t.detach().to(torch.float32).contiguous().numpy()
    return out


def write_safetensors(path, tensors):
    """safetensors: u64 LE header length, JSON header (space-padded to 8 bytes), data."""
    header, offset, names = {}, 0, sorted(tensors)
    for n in names:
        a = tensors[n]
        header[n] = {"dtype": "F32", "shape": list(a.shape),
                     "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(np.ascontiguousarray(tensors[n], dtype="<f4").tobytes())
    os.replace(tmp, path)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base, out = 8 + hlen, {}
    for n, info in header.items():
        if n == "__metadata__":
            continue
        assert info["dtype"] == "F32", n
        a, b = info["data_offsets"]
        out[n] = np.frombuffer(data[base + a:base + b], dtype="<f4").reshape(info["shape"])
    return out


def load_model(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    cfg = {k: c[k] for k in list(MODEL_CFG) + ["vocab_size"]}
    model = Llama(cfg)
    sd = {k: torch.from_numpy(v.copy()) for k, v in
          read_safetensors(os.path.join(folder, "model.safetensors")).items()}
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    model.eval()
    return model


def write_json(path, obj, indent=2):
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------
# Training


def doc_ids(tok, text):
    """One training document: <|endoftext|> text \\n (the <|endoftext|> that opens the
    next document ends this one)."""
    return tok.encode(text + "\n", add_bos=True)


def build_stream(tok, entries, chat_rng=None):
    ids = []
    for cat, text in entries:
        ids += doc_ids(tok, text)
        if chat_rng is not None and chat_rng.random() < CHAT_FRACTION:
            ids += tok.encode(chat_text(chat_rng, cat, text), add_bos=True)
    return torch.tensor(ids, dtype=torch.int64)


@torch.no_grad()
def eval_loss(model, stream, T, B=16, max_windows=256):
    """Mean next-token loss over the first max_windows non-overlapping windows."""
    model.eval()
    n = min((len(stream) - 1) // T, max_windows)
    tot, cnt = 0.0, 0
    for s in range(0, n, B):
        idx = torch.arange(s, min(s + B, n))[:, None] * T + torch.arange(T + 1)[None]
        x = stream[idx]
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum")
        tot += loss.item()
        cnt += x[:, 1:].numel()
    model.train()
    return tot / cnt


def train(tok, train_stream, held_stream, log, cfg=None, tc=None, teacher=None):
    """teacher: None (next-token cross-entropy, the demo model) or a model whose
    next-token distributions the new one learns (distillation, --draft)."""
    tc = tc or TRAIN_CFG
    cfg = cfg or dict(MODEL_CFG, vocab_size=VOCAB_SIZE)
    gen = torch.Generator().manual_seed(SEED)
    model = Llama(cfg, dropout=tc["dropout"])
    model.init_weights(gen)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tc["lr"], betas=(0.9, 0.95), eps=1e-8)
    T, B, steps = tc["seq_len"], tc["batch_size"], tc["steps"]
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params} parameters; train stream {len(train_stream)} tokens, "
        f"held-out {len(held_stream)} tokens; {steps} steps of {B}x{T} tokens "
        f"= {steps * B * T / len(train_stream):.1f} epochs")
    t0 = time.time()
    model.train()
    hist, steplog = [], []
    for step in range(1, steps + 1):
        if step <= tc["warmup"]:
            lr = tc["lr"] * step / tc["warmup"]
        else:
            p = (step - tc["warmup"]) / (steps - tc["warmup"])
            lr = tc["min_lr"] + 0.5 * (tc["lr"] - tc["min_lr"]) * (1 + math.cos(math.pi * p))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(train_stream) - T - 1, (B,), generator=gen)
        x = train_stream[starts[:, None] + torch.arange(T + 1)[None]]
        logits = model(x[:, :-1])
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        else:  # cross-entropy against the teacher's distribution (KL + its entropy)
            with torch.no_grad():
                target = F.softmax(teacher(x[:, :-1]), dim=-1)
            loss = -(target * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        hist.append(loss.item())
        if step % 25 == 0 or step == steps:
            msg = (f"step {step:5d}  lr {lr:.2e}  train loss (last 50) "
                   f"{sum(hist[-50:]) / len(hist[-50:]):.4f}  {time.time() - t0:6.0f} s")
            entry = {"step": step, "lr": lr, "train_loss_last50": sum(hist[-50:]) / len(hist[-50:]),
                     "seconds": round(time.time() - t0, 1)}
            if step % 100 == 0 or step == steps:
                entry["heldout_loss"] = eval_loss(model, held_stream, T)
                msg += f"  held-out {entry['heldout_loss']:.4f}"
            steplog.append(entry)
            log(msg)
    secs = time.time() - t0
    model.eval()
    model.dropout = 0.0
    return model, secs, n_params, sum(hist[-50:]) / len(hist[-50:]), steplog


# ----------------------------------------------------------------------------
# 4. Reference data for kiln's tests


def until_eos(ids):
    """The ids before the first <|endoftext|> or <|im_end|>."""
    for i, t in enumerate(ids):
        if t in (EOT, IM_END):
            return ids[:i]
    return ids


@torch.no_grad()
def greedy(model, ids, n):
    ids = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1]
        ids.append(int(torch.argmax(logits)))
    return ids


@torch.no_grad()
def oracle(model, tok, folder_rel):
    prompt = tok.encode(PROMPT_TEXT, add_bos=True)
    all_ids = greedy(model, prompt, N_ORACLE)
    logits = model(torch.tensor([all_ids]))[0]            # one no-cache forward
    rows = logits[len(prompt) - 1:].numpy().astype(np.float32)
    assert rows.shape == (N_ORACLE + 1, VOCAB_SIZE)
    gen_ids = all_ids[len(prompt):]
    gaps = []
    for r in range(rows.shape[0]):
        top2 = np.sort(rows[r])[-2:]
        gaps.append(round(float(top2[1] - top2[0]), 6))
    for i, g in enumerate(gen_ids):
        assert int(np.argmax(rows[i])) == g
    long_ids = greedy(model, prompt, N_LONG)
    long_gen = long_ids[len(prompt):]
    return {
        "fixture": "kiln-demo",
        "model_dir": folder_rel,
        "model_type": "llama",
        "made_by": "tools/train_demo.py: its own PyTorch LlamaForCausalLM forward "
                   "(transformers' eager maths), float32, from the checkpoint read back "
                   "from model.safetensors",
        "torch": torch.__version__ + " (Debian python3-torch)",
        "attn_implementation": "eager",
        "compute_dtype": "float32",
        "prompt_text": PROMPT_TEXT,
        "prompt_note": "ids from the demo tokenizer with add_special_tokens (leading "
                       "<|endoftext|> = BOS, id 0)",
        "prompt_ids": prompt,
        "generated_ids": gen_ids,
        "generated_text": tok.decode(gen_ids),
        "all_ids": all_ids,
        "logits_file": "logits.npy",
        "logits_shape": list(rows.shape),
        "logits_rows": "row0=prompt last position; row i=after generated token i (1..23); "
                       "row24=after last generated token (all rows from one full "
                       "no-cache forward of all_ids)",
        "decoding": "greedy (argmax, no eos stop, no logits processors)",
        "greedy_equals_argmax": True,
        "top1_top2_gap": gaps,
        "min_gap_greedy_steps": min(gaps[:N_ORACLE]),
        "logits_abs_max": float(np.abs(rows).max()),
        "logits_std": float(rows.std()),
        "long_greedy": {
            "n_new": N_LONG,
            "generated_ids": long_gen,
            "text": tok.decode(long_gen),
            "full_text": tok.decode(long_ids, skip_special=True),
        },
    }, rows


@torch.no_grad()
def check_against_transformers():
    """Runs this file's forward on ../shared's transformers-made llama fixtures (when
    present; $KILN_SHARED overrides ../shared as for kiln's tests): the logits must match
    transformers' own within 1e-4 and greedy ids exactly.
    -> {case: max_abs_diff} or {} without ../shared."""
    shared = os.environ.get("KILN_SHARED") or os.path.join(ROOT, "..", "shared")
    base = os.path.join(shared, "oracle", "fixtures")
    out = {}
    for case in ("llama", "llama_head_dim"):
        d = os.path.join(base, case)
        if not os.path.isfile(os.path.join(d, "oracle.json")):
            continue
        with open(os.path.join(d, "oracle.json")) as f:
            o = json.load(f)
        m = load_model(d)
        rows = m(torch.tensor([o["all_ids"]]))[0, len(o["prompt_ids"]) - 1:].numpy()
        diff = float(np.abs(rows - np.load(os.path.join(d, "logits.npy"))).max())
        gen = greedy(m, o["prompt_ids"], len(o["generated_ids"]))[len(o["prompt_ids"]):]
        if diff > 1e-4 or gen != o["generated_ids"]:
            sys.exit(f"forward disagrees with transformers on fixture {case}: "
                     f"max |diff| {diff}, greedy equal {gen == o['generated_ids']}")
        out[case] = diff
    return out


@torch.no_grad()
def llama_cpp_perplexity(model, tokens, n_ctx):
    """llama.cpp's perplexity tool: consecutive chunks of n_ctx tokens (whole text
    tokenized once, with BOS), first token of each chunk replaced by BOS, only the
    second half of each chunk scored. Returns (ppl, stderr, n_chunks, n_scored)."""
    n_chunk = len(tokens) // n_ctx
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    for c in range(n_chunk):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        chunk[0] = EOT
        logits = model(torch.tensor([chunk]))[0].to(torch.float64)
        logp = torch.log_softmax(logits, dim=-1)
        for j in range(first, n_ctx - 1):
            v = -float(logp[j, chunk[j + 1]])
            nll += v
            nll2 += v * v
            count += 1
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 else 0.0
    return ppl, err, n_chunk, count


# ----------------------------------------------------------------------------


BSD_NOTICE = """\
This program falls under the BSD copyright:

Copyright (c) 1991 The Regents of the University of California.
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions
are met:

1. Redistributions of source code must retain the above copyright
   notice, this list of conditions and the following disclaimer.
2. Redistributions in binary form must reproduce the above copyright
   notice, this list of conditions and the following disclaimer in the
   documentation and/or other materials provided with the distribution.
3. [ Deleted.  see :-
	ftp://ftp.cs.berkeley.edu/pub/4bsd/README.Impt.License.Change
   ]
4. Neither the name of the University nor the names of its contributors
   may be used to endorse or promote products derived from this software
   without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE REGENTS AND CONTRIBUTORS ``AS IS'' AND
ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE
ARE DISCLAIMED.  IN NO EVENT SHALL THE REGENTS OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS
OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION)
HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT
LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY
OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF
SUCH DAMAGE."""


def model_card(info):
    return f"""# kiln-demo

A tiny Llama-architecture language model that kiln ships so that its main command shows
real generated text on a fresh clone. It writes fortune-cookie text; it knows nothing else.
It was trained from scratch by `tools/train_demo.py` in this repository, on two CPU cores.

| | |
|---|---|
| architecture | `LlamaForCausalLM` (transformers), float32 |
| parameters | {info['n_params']:,} (tied input/output embeddings) |
| layers / hidden / MLP | {MODEL_CFG['num_hidden_layers']} / {MODEL_CFG['hidden_size']} / {MODEL_CFG['intermediate_size']} (SwiGLU) |
| attention | {MODEL_CFG['num_attention_heads']} query heads, {MODEL_CFG['num_key_value_heads']} KV heads (GQA), head_dim {MODEL_CFG['head_dim']}, RoPE theta {MODEL_CFG['rope_theta']:g} |
| context | {MODEL_CFG['max_position_embeddings']} tokens (max_position_embeddings = the training window) |
| vocabulary | {VOCAB_SIZE} byte-level BPE tokens, trained on the same corpus |
| file size | {info['file_bytes'] / 1e6:.1f} MB (`model.safetensors`) |

## Corpus and licence

The fortune cookie files of Debian 12's `fortunes` and `fortunes-min` packages
(source package `fortune-mod` {info['fortune_version']}), from `/usr/share/games/fortunes`.
Debian's copyright file for those packages (`/usr/share/doc/fortunes/copyright`) puts the
package under the BSD licence of the University of California, reproduced at the end of
this card. The model and the held-out text derive from that data and are redistributed
under the same terms, with that notice.

Files used: every non-offensive file except `ascii-art` (pictures), `translate-me` (not
prose) and `ethnic`. Cleaning: terminal overstrike removed, tabs expanded, indented
`-- Author` lines unindented, other indentation made four spaces, runs of blanks squeezed,
entries over {MAX_FORTUNE_CHARS} characters or mostly punctuation dropped, duplicates dropped.
That leaves {info['n_fortunes']:,} fortunes; after a seeded shuffle every
{HELDOUT_EVERY}th one is held out ({info['n_heldout']:,} fortunes, `heldout.txt`, one
fortune after another separated by a blank line, {info['heldout_bytes']:,} bytes) and the
other {info['n_train']:,} are trained on.

Training documents are `<|endoftext|>` + fortune + `\\n`. A seeded
{int(CHAT_FRACTION * 100)}% of the training fortunes appear a second time as a ChatML
exchange (an optional system message, a user request such as "Give me a quote about
science.", the fortune as the assistant's answer), so the chat template leads somewhere.

## Tokenizer

Byte-level BPE in the GPT-2 manner: the GPT-2 pre-tokenizer regex
(`Split` + `ByteLevel` in `tokenizer.json`), GPT-2's byte-to-unicode map, {VOCAB_SIZE - 259}
merges learned on the training fortunes. Ids: `<|endoftext|>` = 0, `<|im_start|>` = 1,
`<|im_end|>` = 2 (all special), the 256 bytes = 3..258 in byte order, merges from 259 on.
`<|endoftext|>` is BOS, EOS and PAD; the post-processor prepends it (`add_bos_token`).
`generation_config.json` stops on `<|endoftext|>` or `<|im_end|>`. Chat template (ChatML):

```
{CHAT_TEMPLATE}
```

## Training

AdamW (betas 0.9/0.95, weight decay {TRAIN_CFG['weight_decay']} on matrices), peak LR
{TRAIN_CFG['lr']:g} after {TRAIN_CFG['warmup']} warm-up steps, cosine to
{TRAIN_CFG['min_lr']:g}; {TRAIN_CFG['steps']} steps of {TRAIN_CFG['batch_size']} random
windows of {TRAIN_CFG['seq_len']} tokens ({info['epochs']:.1f} passes over
{info['train_tokens']:,} training tokens, chat copies included); no dropout; gradient
clipping {TRAIN_CFG['grad_clip']}; seed {SEED}; torch threads {TRAIN_CFG['threads']}. The
training forward folds the attention scale into q and shares K/V heads without copies;
the same weights then run through transformers' exact eager maths for everything below.
Training took {info['train_secs'] / 60:.1f} minutes ({info['cpu']}){info.get('load_note', '')}.

| | loss (nats/token) | perplexity |
|---|---|---|
| train (mean of the last 50 steps) | {info['final_train_loss']:.4f} | {math.exp(info['final_train_loss']):.2f} |
| train stream (first 256 windows, eval mode) | {info['train_eval_loss']:.4f} | {math.exp(info['train_eval_loss']):.2f} |
| held-out stream (first 256 windows, eval mode) | {info['heldout_loss']:.4f} | {math.exp(info['heldout_loss']):.2f} |

`heldout.txt` as llama.cpp's perplexity tool measures it (whole file tokenized with BOS,
chunks of n_ctx, second half of each chunk scored), float32 PyTorch:
{info['ppl_lines']}

## Samples

Greedy, prompt `{PROMPT_TEXT}` (BOS prepended), up to the first end-of-text token:

```
{info['long_text']}
```

Sampled (temperature 0.8, top-k 40, seed {SEED}), from `<|endoftext|>` alone:

```
{info['samples']}
```

## Reproduce

    apt-get install -y python3-torch python3-numpy fortunes fortunes-min
    /usr/bin/python3 tools/train_demo.py

Every step is seeded; the tokenizer and corpus are bit-exact across machines, the weights
are bit-exact for the same torch build, BLAS and thread count. `--reference-only`
recomputes `tests/data/demo/` from the committed checkpoint without training.
`tools/check_demo_tokenizer.mjs` checks tokenizer.json against the JavaScript
`@huggingface/tokenizers`.

## Licence of the corpus (from /usr/share/doc/fortunes/copyright)

```
{BSD_NOTICE}
```
"""


@torch.no_grad()
def sample(model, tok, n, seed, temperature=0.8, top_k=40, max_new=120):
    gen = torch.Generator().manual_seed(seed)
    outs = []
    for _ in range(n):
        ids = [EOT]
        for _ in range(max_new):
            logits = model(torch.tensor([ids[-MODEL_CFG["max_position_embeddings"]:]]))[0, -1]
            v, ix = torch.topk(logits / temperature, top_k)
            p = torch.softmax(v, -1)
            nxt = int(ix[torch.multinomial(p, 1, generator=gen)])
            if nxt in (EOT, IM_END):
                break
            ids.append(nxt)
        outs.append(tok.decode(ids[1:], skip_special=True).rstrip())
    return outs


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


@torch.no_grad()
def agreement(draft, teacher, stream, T, B=16, max_windows=64):
    """Share of positions of the first max_windows windows where the draft's top
    token is the teacher's (what greedy speculation keeps)."""
    n = min((len(stream) - 1) // T, max_windows)
    same = cnt = 0
    for s in range(0, n, B):
        idx = torch.arange(s, min(s + B, n))[:, None] * T + torch.arange(T)[None]
        x = stream[idx]
        same += int((draft(x).argmax(-1) == teacher(x).argmax(-1)).sum())
        cnt += x.numel()
    return same / cnt


def draft_card(info):
    c = DRAFT_CFG
    return f"""# kiln-demo-draft

A draft model for speculative decoding with [kiln-demo](../kiln-demo): the same tokenizer
(its `tokenizer.json` and `tokenizer_config.json`, copied byte for byte), a smaller Llama,
trained by `tools/train_demo.py --draft` to predict kiln-demo's next-token distributions
(distillation: cross-entropy against kiln-demo's softmax on the training fortunes). Use it as

    kiln generate -m models/kiln-demo --model-draft models/kiln-demo-draft -p "..."
    kiln bench -m models/kiln-demo --model-draft models/kiln-demo-draft -f PROMPT.txt

Speculation never changes kiln's output; the draft only changes how many tokens each
target step verifies.

| | |
|---|---|
| architecture | `LlamaForCausalLM` (transformers), float32 |
| parameters | {info['n_params']:,} (tied input/output embeddings) |
| layers / hidden / MLP | {c['num_hidden_layers']} / {c['hidden_size']} / {c['intermediate_size']} (SwiGLU) |
| attention | {c['num_attention_heads']} query heads, {c['num_key_value_heads']} KV heads, head_dim {c['head_dim']} |
| context | {c['max_position_embeddings']} tokens |
| file size | {info['file_bytes'] / 1e6:.1f} MB (`model.safetensors`) |

Training: kiln-demo's corpus and training stream (chat copies included), its optimizer
and schedule shape (AdamW, warm-up then cosine) with peak LR {DRAFT_TRAIN_CFG['lr']:g} and
{DRAFT_TRAIN_CFG['steps']} steps of {DRAFT_TRAIN_CFG['batch_size']} windows of
{DRAFT_TRAIN_CFG['seq_len']} tokens ({DRAFT_TRAIN_CFG['steps'] * DRAFT_TRAIN_CFG['batch_size'] * DRAFT_TRAIN_CFG['seq_len']:,}
tokens, under one pass), seed {SEED}, targets from kiln-demo; {info['train_secs'] / 60:.1f}
minutes ({info['cpu']}){info.get('load_note', '')}. A longer run would make a better draft.

| | |
|---|---|
| distillation loss, mean of the last 50 steps (nats/token) | {info['final_train_loss']:.4f} |
| held-out next-token loss (first 256 windows) | {info['heldout_loss']:.4f} (kiln-demo: {info['teacher_heldout_loss']:.4f}) |
| top-1 agreement with kiln-demo, held-out (first 64 windows) | {100 * info['agreement']:.1f}% |

The corpus and its licence are kiln-demo's (see its model card): the fortune cookie files
of Debian's `fortunes` and `fortunes-min` packages, BSD licence.

Reproduce: `/usr/bin/python3 tools/train_demo.py --draft` (needs models/kiln-demo).
"""


def main_draft(args, log):
    """--draft: trains DRAFT_CFG into args.out from the committed demo model; writes
    nothing else."""
    import shutil
    src = os.path.join(ROOT, "models/kiln-demo")
    out = os.path.join(ROOT, args.out)
    if os.path.realpath(out) == os.path.realpath(src):
        sys.exit("--draft: --out must not be the demo model's folder")
    os.makedirs(out, exist_ok=True)
    train_set, held_set = load_corpus()
    with open(os.path.join(src, "tokenizer.json")) as f:
        tj = json.load(f)
    tok = Tokenizer([tuple(m) for m in tj["model"]["merges"]])
    assert tok.vocab == tj["model"]["vocab"], "models/kiln-demo/tokenizer.json: not this script's"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src, name), os.path.join(out, name))
    train_stream = build_stream(tok, train_set, random.Random(SEED + 1))
    held_stream = build_stream(tok, held_set)
    torch.set_num_threads(DRAFT_TRAIN_CFG["threads"])
    teacher = load_model(src)
    for p in teacher.parameters():
        p.requires_grad_(False)
    teacher.train()  # the cheaper attention of the training forward (same maths); no dropout
    cfg = dict(DRAFT_CFG, vocab_size=VOCAB_SIZE)
    trained, secs, n_params, last_loss, _ = train(tok, train_stream, held_stream, log, cfg,
                                                   DRAFT_TRAIN_CFG, teacher)
    write_json(os.path.join(out, "config.json"), hf_config(cfg))
    write_json(os.path.join(out, "generation_config.json"), GENERATION_CONFIG)
    path = os.path.join(out, "model.safetensors")
    write_safetensors(path, state_for_checkpoint(trained))
    model = load_model(out)
    for name, t in trained.state_dict().items():
        assert torch.equal(t, model.state_dict()[name]), name
    teacher.eval()
    cpu = cpu_name()
    T = DRAFT_TRAIN_CFG["seq_len"]
    info = dict(n_params=n_params, file_bytes=os.path.getsize(path), train_secs=secs,
                cpu=f"{cpu}, {DRAFT_TRAIN_CFG['threads']} threads", final_train_loss=last_loss,
                heldout_loss=eval_loss(model, held_stream, T),
                teacher_heldout_loss=eval_loss(teacher, held_stream, T),
                agreement=agreement(model, teacher, held_stream, T))
    log(f"draft: held-out loss {info['heldout_loss']:.4f} (demo {info['teacher_heldout_loss']:.4f}), "
        f"top-1 agreement {100 * info['agreement']:.1f}%")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(draft_card(info))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="models/kiln-demo")
    ap.add_argument("--data", default="tests/data/demo")
    ap.add_argument("--reference-only", action="store_true",
                    help="do not train: rebuild tokenizer data and tests/data/demo from the "
                         "checkpoint in --out")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--draft", action="store_true",
                    help="train the small draft model (same tokenizer, for speculative "
                         "decoding) into --out (default models/kiln-demo-draft) from the "
                         "demo model in models/kiln-demo; writes nothing else")
    args = ap.parse_args()
    if args.draft:
        if args.out == "models/kiln-demo":
            args.out = "models/kiln-demo-draft"
        if args.steps:
            DRAFT_TRAIN_CFG["steps"] = args.steps
    elif args.steps:
        TRAIN_CFG["steps"] = args.steps
    out = os.path.join(ROOT, args.out)
    data = os.path.join(ROOT, args.data)
    os.makedirs(out, exist_ok=True)
    os.makedirs(data, exist_ok=True)
    torch.manual_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    torch.set_num_threads(TRAIN_CFG["threads"])
    torch.use_deterministic_algorithms(True)

    def log(msg):
        print(msg, flush=True)

    if args.draft:
        return main_draft(args, log)
    t_all = time.time()
    train_set, held_set = load_corpus()
    log(f"corpus: {len(train_set)} train fortunes, {len(held_set)} held out")
    heldout_text = "\n\n".join(t for _, t in held_set) + "\n"
    with open(os.path.join(out, "heldout.txt"), "w") as f:
        f.write(heldout_text)

    t0 = time.time()
    merges = train_bpe([t + "\n" for _, t in train_set], VOCAB_SIZE)
    tok = Tokenizer(merges)
    log(f"tokenizer: {len(tok.vocab)} tokens in {time.time() - t0:.0f} s")
    write_json(os.path.join(out, "tokenizer.json"), tok.tokenizer_json())
    write_json(os.path.join(out, "tokenizer_config.json"), tokenizer_config())
    with open(os.path.join(out, "tokenizer.json")) as f:
        assert json.load(f)["model"]["vocab"] == tok.vocab

    chat_rng = random.Random(SEED + 1)
    train_stream = build_stream(tok, train_set, chat_rng)
    held_stream = build_stream(tok, held_set)
    heldout_ids = tok.encode(heldout_text, add_bos=False)
    plain = build_stream(tok, train_set)
    nbytes = sum(len(t.encode()) + 1 for _, t in train_set)
    log(f"train: {len(plain)} tokens of plain fortunes ({nbytes / len(plain):.2f} bytes per "
        f"token, BOS included), {len(train_stream)} with the chat copies")

    vectors = {
        "tokenizer": os.path.join(args.out, "tokenizer.json"),
        "note": "ids without the BOS that add_special_tokens prepends; "
                "heldout_ids = ids of heldout.txt",
        "cases": [{"text": s, "ids": tok.encode(s, add_bos=False)} for s in TRICKY],
        "chat": {
            "messages": [{"role": "system", "content": "You are a fortune cookie."},
                         {"role": "user", "content": "Give me a quote about science."}],
            "add_generation_prompt": True,
        },
        "heldout_ids": heldout_ids,
    }
    chat_str = ("<|endoftext|><|im_start|>system\nYou are a fortune cookie.<|im_end|>\n"
                "<|im_start|>user\nGive me a quote about science.<|im_end|>\n"
                "<|im_start|>assistant\n")
    vectors["chat"]["rendered"] = chat_str
    vectors["chat"]["ids"] = tok.encode(chat_str, add_bos=False)
    for c in vectors["cases"]:
        assert tok.decode(c["ids"]) == c["text"], c
    assert tok.decode(heldout_ids) == heldout_text
    with open(os.path.join(data, "tokenizer_vectors.json"), "w") as f:
        json.dump(vectors, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    info_path = os.path.join(data, "training_info.json")
    if not args.reference_only:
        trained, secs, n_params, last_loss, steplog = train(tok, train_stream, held_stream, log)
        write_json(os.path.join(out, "config.json"), hf_config(trained.cfg))
        write_safetensors(os.path.join(out, "model.safetensors"),
                          state_for_checkpoint(trained))
        cpu = cpu_name()
        write_json(info_path, dict(
            train_secs=secs, n_params=n_params, final_train_loss=last_loss,
            train_tokens=len(train_stream), cpu=f"{cpu}, {TRAIN_CFG['threads']} threads",
            epochs=TRAIN_CFG["steps"] * TRAIN_CFG["batch_size"] * TRAIN_CFG["seq_len"]
            / len(train_stream), train_cfg=TRAIN_CFG, steplog=steplog))
    write_json(os.path.join(out, "generation_config.json"), GENERATION_CONFIG)
    with open(info_path) as f:
        info = json.load(f)
    model = load_model(out)
    if not args.reference_only:
        # What is on disk is what was trained, bit for bit.
        for name, t in trained.state_dict().items():
            assert torch.equal(t, model.state_dict()[name]), name
        del trained

    checked = check_against_transformers()
    log(f"forward vs transformers fixtures: {checked or 'skipped (no ../shared)'}")
    ref, rows = oracle(model, tok, args.out)
    if checked:
        ref["forward_checked_against"] = {
            "what": "this forward on ../shared/oracle/fixtures (made by transformers "
                    "LlamaForCausalLM): greedy ids equal, max |logit diff| per case",
            "max_abs_diff": checked}
    write_json(os.path.join(data, "oracle.json"), ref, indent=1)
    np.save(os.path.join(data, "logits.npy"), rows)
    log(f"oracle: prompt {ref['prompt_ids']} -> {ref['generated_text']!r}, "
        f"min gap {ref['min_gap_greedy_steps']}")
    log(f"long greedy: {ref['long_greedy']['full_text']!r}")

    ppl_tokens = tok.encode(heldout_text, add_bos=True)
    ppl = {"file": os.path.join(args.out, "heldout.txt"), "n_tokens": len(ppl_tokens),
           "method": "llama.cpp perplexity: tokens = BOS + tokenize(file); chunk c = "
                     "tokens[c*n_ctx:(c+1)*n_ctx] with its first token set to BOS; score "
                     "positions n_ctx/2 .. n_ctx-2 predicting the next token; "
                     "PPL = exp(mean nll), stderr = sqrt(var(nll)/(N-1)) * PPL",
           "compute": "float32 forward, log-softmax in float64", "results": []}
    for n_ctx in (128, 256):
        p, e, nc, ns = llama_cpp_perplexity(model, ppl_tokens, n_ctx)
        ppl["results"].append({"n_ctx": n_ctx, "ppl": round(p, 6), "stderr": round(e, 6),
                               "n_chunks": nc, "n_scored": ns})
        log(f"perplexity heldout.txt n_ctx {n_ctx}: {p:.4f} +/- {e:.5f} ({nc} chunks)")
    write_json(os.path.join(data, "perplexity.json"), ppl)

    samples = sample(model, tok, 4, SEED)
    for smp in samples:
        log("sample: " + repr(smp))
    import subprocess
    fv = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "fortunes"],
                        capture_output=True, text=True).stdout.strip()
    info.update(
        file_bytes=os.path.getsize(os.path.join(out, "model.safetensors")),
        fortune_version=fv or "unknown",
        n_fortunes=len(train_set) + len(held_set), n_train=len(train_set),
        n_heldout=len(held_set), heldout_bytes=len(heldout_text.encode()),
        train_eval_loss=eval_loss(model, train_stream, TRAIN_CFG["seq_len"]),
        heldout_loss=eval_loss(model, held_stream, TRAIN_CFG["seq_len"]),
        long_text=PROMPT_TEXT + tok.decode(until_eos(ref["long_greedy"]["generated_ids"])),
        samples="\n\n".join(samples),
        ppl_lines="\n".join(f"- n_ctx {r['n_ctx']}: PPL = {r['ppl']:.4f} +/- "
                            f"{r['stderr']:.5f} ({r['n_chunks']} chunks)"
                            for r in ppl["results"]))
    log(f"losses: train {info['train_eval_loss']:.4f}, held-out {info['heldout_loss']:.4f}")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(model_card(info))
    log(f"done in {(time.time() - t_all) / 60:.1f} min")


if __name__ == "__main__":
    main()
