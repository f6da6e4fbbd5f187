// tokenizer_oracle.mjs: expected ids for the tokenizer's differential test.
//
// Generates a deterministic corpus (every Unicode block, code, whitespace
// runs, digits, emoji and ZWJ sequences, CJK, mixed scripts, invalid bytes,
// special tokens written inline) and runs @huggingface/tokenizers (the pure
// JS port of HF tokenizers) on it for each tokenizer under
// tests/data/tokenizer/. Writes tests/data/tokenizer/corpus.json and
// expected_<name>.json, which src/tokenizer/tokenizer_test.c checks.
//
//   npm install --prefix /tmp/tokjs @huggingface/tokenizers
//   TOKJS=/tmp/tokjs/node_modules node tools/tokenizer_oracle.mjs
//
// Where the JS port is known to differ from the Rust crate (which kiln
// follows), the case is listed in KNOWN_JS_DIFFS and left out for that
// tokenizer, with the reason.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const TOKJS = process.env.TOKJS || "/tmp/tokjs/node_modules";
const require = createRequire(TOKJS + "/");
const { Tokenizer } = require("@huggingface/tokenizers");
const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const DATA = path.join(ROOT, "tests/data/tokenizer");

// ---- deterministic corpus ----------------------------------------------------

let seed = 0x12345678;
function rnd() {
  seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];

// Blocks (start, end), BMP and beyond; unassigned code points are skipped.
const BLOCKS = [
  [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x17f], [0x180, 0x24f], [0x250, 0x2af], [0x2b0, 0x2ff], [0x300, 0x36f],
  [0x370, 0x3ff], [0x400, 0x4ff], [0x500, 0x52f], [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff], [0x700, 0x74f],
  [0x750, 0x77f], [0x780, 0x7bf], [0x7c0, 0x7ff], [0x800, 0x83f], [0x900, 0x97f], [0x980, 0x9ff], [0xa00, 0xa7f],
  [0xa80, 0xaff], [0xb00, 0xb7f], [0xb80, 0xbff], [0xc00, 0xc7f], [0xc80, 0xcff], [0xd00, 0xd7f], [0xd80, 0xdff],
  [0xe00, 0xe7f], [0xe80, 0xeff], [0xf00, 0xfff], [0x1000, 0x109f], [0x10a0, 0x10ff], [0x1100, 0x11ff],
  [0x1200, 0x137f], [0x13a0, 0x13ff], [0x1400, 0x167f], [0x1680, 0x169f], [0x16a0, 0x16ff], [0x1780, 0x17ff],
  [0x1800, 0x18af], [0x1e00, 0x1eff], [0x1f00, 0x1fff], [0x2000, 0x206f], [0x2070, 0x209f], [0x20a0, 0x20cf],
  [0x20d0, 0x20ff], [0x2100, 0x214f], [0x2150, 0x218f], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2300, 0x23ff],
  [0x2460, 0x24ff], [0x2500, 0x257f], [0x25a0, 0x25ff], [0x2600, 0x26ff], [0x2700, 0x27bf], [0x2800, 0x28ff],
  [0x2c00, 0x2c5f], [0x2e80, 0x2eff], [0x3000, 0x303f], [0x3040, 0x309f], [0x30a0, 0x30ff], [0x3100, 0x312f],
  [0x3130, 0x318f], [0x3200, 0x32ff], [0x3300, 0x33ff], [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xa48f],
  [0xa4d0, 0xa4ff], [0xa500, 0xa63f], [0xa640, 0xa69f], [0xac00, 0xd7af], [0xe000, 0xe0ff], [0xf900, 0xfaff],
  [0xfb00, 0xfb4f], [0xfb50, 0xfdff], [0xfe00, 0xfe0f], [0xfe30, 0xfe4f], [0xfe70, 0xfeff], [0xff00, 0xffef],
  [0xfff0, 0xfffd], [0x10000, 0x1007f], [0x10300, 0x1032f], [0x10330, 0x1034f], [0x10400, 0x1044f],
  [0x1d400, 0x1d7ff], [0x1f000, 0x1f02f], [0x1f100, 0x1f1ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f],
  [0x1f680, 0x1f6ff], [0x1f900, 0x1f9ff], [0x20000, 0x2a6df], [0x2f800, 0x2fa1f], [0xe0000, 0xe007f],
];
const assigned = (cp) => /\P{Cn}/u.test(String.fromCodePoint(cp)) && !(cp >= 0xd800 && cp <= 0xdfff);

function blockText(b) {
  const [lo, hi] = b;
  let s = "";
  const n = 8 + ri(40);
  for (let i = 0; i < n; i++) {
    const cp = lo + ri(hi - lo + 1);
    if (assigned(cp)) s += String.fromCodePoint(cp);
    if (rnd() < 0.15) s += pick([" ", " ", "  ", "\n", "\t", ""]);
  }
  return s;
}

const WORDS = ["the", "The", "THE", "hello", "world", "don't", "I'm", "we'll", "they've", "she'd", "it's", "IT'S",
  "you're", "naïve", "café", "résumé", "Zürich", "straße", "Ελλάδα", "ΣΊΣΥΦΟΣ", "Москва", "привет", "مرحبا", "שלום",
  "नमस्ते", "ধন্যবাদ", "สวัสดี", "こんにちは", "カタカナ", "你好", "世界", "中文字符", "한국어", "안녕하세요", "ქართული",
  "Ḽơᶉëᶆ", "ﬁ", "Ⅻ", "①②③", "x²", "½", "µ", "İstanbul", "ǅemal", "ﬀ", "e\u0301", "a\u0308\u0304", "\u1100\u1161\u11a8"];
const EMOJI = ["😀", "😁", "🦙", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "😶‍🌫️", "🇯🇵", "🇺🇸🇫🇷", "❤️", "✅", "🧑🏿‍💻", "👩‍❤️‍💋‍👨", "#️⃣", "🫠"];
const CODE = [
  "def f(x):\n    return x ** 2  # square\n",
  "for (int i = 0; i < n; ++i) { a[i] += b[i] * 3.14f; }\n",
  "const obj = { key: \"value\", arr: [1, 2, 3], nested: { ok: true } };",
  "<div class=\"a\">\n\t<span>Hi &amp; bye</span>\n</div>",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
  "fn main() {\n    println!(\"{:?}\", vec![1u8, 2, 3]);\n}",
  "{\"ids\": [1, 2, 3], \"text\": \"a\\nb\", \"x\": null}",
  "if __name__ == '__main__':\n\tmain()\r\n",
  "    \n        \n            x = 1\n\n\n",
  "https://example.com/path?q=1&r=two#frag  mailto:someone@example.org",
  "$ git commit -m 'fix: ...' && make -j2 2>&1 | tee log.txt",
  "λx.λy.x (y) → ∀n∈ℕ: n² ≥ 0 ∧ ¬(a ⊕ b)",
];

function whitespaceRun() {
  const parts = [" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b", "\u0085", "\u2028", "\u000b", "\u000c"];
  let s = "";
  const n = 1 + ri(rnd() < 0.2 ? 300 : 20);
  const same = rnd() < 0.5 ? pick(parts) : null;
  for (let i = 0; i < n; i++) s += same ?? pick(parts);
  return s;
}

function digits() {
  const n = 1 + ri(rnd() < 0.2 ? 60 : 12);
  let s = "";
  for (let i = 0; i < n; i++) s += String(ri(10));
  return pick(["", "-", "+", "$", "#", " "]) + s + pick(["", ".", ",", "%", " ", ".5", ",000", "e10", "٣٤", "१२"]);
}

function sentence(specials) {
  const pieces = [];
  const n = 3 + ri(25);
  for (let i = 0; i < n; i++) {
    const r = rnd();
    if (r < 0.45) pieces.push(pick(WORDS));
    else if (r < 0.55) pieces.push(digits());
    else if (r < 0.65) pieces.push(pick(EMOJI));
    else if (r < 0.72) pieces.push(pick([".", ",", "!", "?", "...", "—", "–", "'", "\"", "(", ")", "«", "»", "„", "“", "”", "''", "```", "--", "=="]));
    else if (r < 0.8) pieces.push(whitespaceRun());
    else if (r < 0.88 && specials.length) pieces.push(pick(specials));
    else pieces.push(blockText(pick(BLOCKS)));
    pieces.push(rnd() < 0.7 ? " " : rnd() < 0.5 ? "" : pick(["\n", "  ", "\t"]));
  }
  return pieces.join("");
}

function makeCorpus(specials) {
  const cases = [];
  cases.push("", " ", "  ", "\n", "\t\t", "a", "A", "'s", "'S", "'ll'", " 's", "s's", "Hello", " Hello", "Hello world",
    "  leading and trailing  ", "ﬁnance ﬂoor", "1234567890", "3.14159", "𝔾𝕠𝕠𝕕 𝕞𝕠𝕣𝕟𝕚𝕟𝕘", "x".repeat(1000),
    "ab".repeat(300), "🦙".repeat(50), "\u0000\u0001\u001f\u007f", "\ufeffBOM", "\ufffd\ufffd", "a\u200db", "e\u0301\u0301\u0301");
  for (const b of BLOCKS) cases.push(blockText(b));
  for (const c of CODE) cases.push(c);
  for (let i = 0; i < 30; i++) cases.push(whitespaceRun());
  for (let i = 0; i < 20; i++) cases.push(digits() + " " + digits());
  for (let i = 0; i < 15; i++) cases.push(Array.from({ length: 1 + ri(6) }, () => pick(EMOJI)).join(rnd() < 0.5 ? "" : " "));
  for (const s of specials.slice(0, 40)) {
    cases.push(s, " " + s + " ", "x" + s + "y", "Hi " + s + "\nthere" + s + s, s + " leading", "trailing " + s);
  }
  for (let i = 0; i < 170; i++) cases.push(sentence(specials));
  // invalid UTF-8: stored as hex, fed to kiln as raw bytes; the oracle sees
  // what a Rust/Python caller would pass on: the lossy (U+FFFD) decoding
  const bad = [[0xff], [0xc3], [0xe4, 0xb8], [0xf0, 0x9f, 0x98], [0x80, 0x80], [0xed, 0xa0, 0x80], [0xc0, 0xaf],
    [0xf5, 0x80, 0x80, 0x80], [0xe0, 0x80, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xfe, 0xfe, 0xff]];
  for (let i = 0; i < 25; i++) {
    const enc = Buffer.from(sentence([]).slice(0, 60), "utf8");
    const at = ri(enc.length + 1);
    cases.push({ hex: Buffer.concat([enc.subarray(0, at), Buffer.from(pick(bad)), enc.subarray(at)]).toString("hex") });
  }
  return cases;
}

// ---- tokenizers ------------------------------------------------------------------

function legacyJson(dir) {
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, "encoder.json")));
  const merges = fs.readFileSync(path.join(dir, "vocab.bpe"), "utf8").split("\n").filter((l) => l && !l.startsWith("#version"));
  return {
    added_tokens: [{ id: vocab["<|endoftext|>"], content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true }],
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false, vocab, merges },
  };
}

// Llama-3's 9 MB tokenizer.json is not committed: it is read from ../shared.
const SHARED = process.env.KILN_SHARED || path.resolve(ROOT, "../shared");
const EXTERNAL = { llama3: path.join(SHARED, "tokenizers/llama3_1") };

function loadTok(name) {
  const dir = EXTERNAL[name] ?? path.join(DATA, name);
  const tj = fs.existsSync(path.join(dir, "tokenizer.json")) ? JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"))) : legacyJson(dir);
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath)) : {};
  return { tj, cfg, tok: new Tokenizer(tj, cfg) };
}

// Cases where the JS port is known to disagree with the Rust crate.
function jsDiffers(name, tj, text) {
  // JS runs the GPT-2 pattern of a ByteLevel pre-tokenizer as a JS RegExp,
  // whose \s lacks U+0085 and has U+FEFF; Oniguruma's \s is White_Space.
  const bl = (p) => p && (p.type === "ByteLevel" ? p.use_regex !== false : (p.pretokenizers ?? []).some(bl));
  if (bl(tj.pre_tokenizer) && /[\u0085\ufeff\u180e]/.test(text)) return "JS \\s in the ByteLevel regex";
  // JS lowercases with String.toLowerCase (final sigma in context); Rust maps
  // char by char.
  if (JSON.stringify(tj.normalizer ?? "").includes("Lowercase") || JSON.stringify(tj.normalizer ?? "").includes("\"lowercase\":true")) {
    if (/[\u03a3]/.test(text)) return "final sigma";
  }
  // JS's BertNormalizer looks at UTF-16 units: astral CJK is not padded
  if (JSON.stringify(tj.normalizer ?? "").includes("\"handle_chinese_chars\":true") && /[\u{20000}-\u{2FA1F}]/u.test(text))
    return "astral CJK in BertNormalizer";
  return null;
}

// transformers' Llama/Gemma fast tokenizers rebuild the post-processor from
// add_bos_token/add_eos_token (the JS port keeps tokenizer.json's)
function specialIds(tj, cfg, tok, ids, text) {
  const cls = cfg.tokenizer_class ?? "";
  if (!/^(Llama|Gemma|CodeLlama)Tokenizer/.test(cls)) return tok.encode(text, { add_special_tokens: true }).ids;
  const name = (k) => (typeof cfg[k] === "string" ? cfg[k] : cfg[k]?.content);
  const id = (k) => (name(k) != null ? tok.token_to_id(name(k)) : undefined);
  const out = [];
  if ((cfg.add_bos_token ?? true) && id("bos_token") !== undefined) out.push(id("bos_token"));
  out.push(...ids);
  if (cfg.add_eos_token && id("eos_token") !== undefined) out.push(id("eos_token"));
  return out;
}

const NAMES = fs.readdirSync(DATA).filter((d) => fs.statSync(path.join(DATA, d)).isDirectory()).concat(Object.keys(EXTERNAL)).sort();

function specialsOf(tj) {
  return (tj.added_tokens ?? []).map((a) => a.content).filter((c) => c.length > 0).slice(0, 60);
}

// One corpus for all tokenizers: special tokens of every tokenizer appear in
// it (each tokenizer sees the others' as plain text).
const allSpecials = [];
const loaded = {};
for (const name of NAMES) {
  loaded[name] = loadTok(name);
  for (const s of specialsOf(loaded[name].tj).slice(0, 8)) if (!allSpecials.includes(s)) allSpecials.push(s);
}
const corpus = makeCorpus(allSpecials);
// NUL cannot live in a C string: such cases go as hex too
const asCase = (c) => (typeof c !== "string" ? c : c.includes("\0") ? { hex: Buffer.from(c, "utf8").toString("hex") } : { text: c });
fs.writeFileSync(path.join(DATA, "corpus.json"), JSON.stringify({ cases: corpus.map(asCase) }) + "\n");

for (const name of NAMES) {
  const { tj, cfg, tok } = loaded[name];
  const ids = [], skip = [], decoded = {}, special_ids = {};
  corpus.forEach((c, i) => {
    const text = typeof c === "string" ? c : new TextDecoder("utf-8", { fatal: false }).decode(Buffer.from(c.hex, "hex"));
    const why = jsDiffers(name, tj, text);
    if (why) {
      ids.push(null);
      skip.push([i, why]);
      return;
    }
    const e = tok.encode(text, { add_special_tokens: false }).ids;
    ids.push(e);
    if (i % 7 === 0) special_ids[i] = specialIds(tj, cfg, tok, e, text);
    if (e.length) {
      const d = tok.decode(e, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
      if (d !== text) decoded[i] = d;
    }
  });
  const out = { tokenizer: name, ids, special_ids, decoded, skipped: skip };
  fs.writeFileSync(path.join(DATA, `expected_${name}.json`), JSON.stringify(out) + "\n");
  console.log(name, corpus.length, "cases,", skip.length, "skipped,", Object.keys(decoded).length, "decodes differ from the text");
}
