// tokenizer_bench.mjs: kiln's tokenizer against @huggingface/tokenizers on the
// same large mixed text (code, prose, the multilingual test corpus), and the
// load time of each tokenizer.
//
//   make && TOKJS=/tmp/tokjs/node_modules node tools/tokenizer_bench.mjs [MB]
import fs from "fs";
import path from "path";
import { execFileSync } from "child_process";
import { createRequire } from "module";

const TOKJS = process.env.TOKJS || "/tmp/tokjs/node_modules";
const require = createRequire(TOKJS + "/");
const { Tokenizer } = require("@huggingface/tokenizers");
const ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const DATA = path.join(ROOT, "tests/data/tokenizer");
const SHARED = process.env.KILN_SHARED || path.resolve(ROOT, "../shared");
const MB = Number(process.argv[2] || 4);

// the text: this repository's sources, the JS library itself, the corpus
function gather(dir, out) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory() && !e.name.startsWith(".") && e.name !== "build" && e.name !== "data") gather(p, out);
    else if (/\.(c|h|md|mjs|sh)$/.test(e.name) || e.name === "Makefile") out.push(fs.readFileSync(p, "utf8"));
  }
  return out;
}
const parts = gather(ROOT, []);
parts.push(fs.readFileSync(require.resolve("@huggingface/tokenizers"), "utf8"));
for (const c of JSON.parse(fs.readFileSync(path.join(DATA, "corpus.json"))).cases) if (c.text) parts.push(c.text);
let text = "";
for (let i = 0; text.length < MB * 1e6; i++) text += parts[i % parts.length] + "\n";
const file = "/tmp/kiln_tokenizer_bench.txt";
fs.writeFileSync(file, text);
const bytes = Buffer.byteLength(text);

const dirs = { qwen3: path.join(DATA, "qwen3"), llama3: path.join(SHARED, "tokenizers/llama3_1"), mistral: path.join(DATA, "mistral"), gemma3_trimmed: path.join(DATA, "gemma3") };
console.log(`text: ${(bytes / 1e6).toFixed(2)} MB (code, prose, multilingual corpus)`);
console.log("tokenizer        kiln load   kiln MB/s   JS load   JS MB/s   ids equal");
for (const [name, dir] of Object.entries(dirs)) {
  if (!fs.existsSync(path.join(dir, "tokenizer.json"))) continue;
  // --bench prints its timings on stderr
  const line = execFileSync("sh", ["-c", `'${path.join(ROOT, "build/kiln")}' tokenize -m '${dir}' --bench < ${file} 2>&1 >/dev/null`], { encoding: "utf8" });
  const m = /load ([\d.]+) ms, encode (\d+) bytes -> (\d+) ids in ([\d.]+) ms: ([\d.]+) MB\/s/.exec(line);
  const t0 = performance.now();
  const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json")));
  const cfgp = path.join(dir, "tokenizer_config.json");
  const tok = new Tokenizer(tj, fs.existsSync(cfgp) ? JSON.parse(fs.readFileSync(cfgp)) : {});
  const jsLoad = performance.now() - t0;
  const t1 = performance.now();
  const ids = tok.encode(text, { add_special_tokens: false }).ids;
  const jsEnc = (performance.now() - t1) / 1e3;
  const kilnIds = m ? Number(m[3]) : -1;
  console.log(`${name.padEnd(16)} ${m ? (m[1] + " ms").padStart(9) : "?"}   ${m ? m[5].padStart(9) : "?"}   ${(jsLoad.toFixed(0) + " ms").padStart(7)}   ${(bytes / 1e6 / jsEnc).toFixed(2).padStart(7)}   ${kilnIds === ids.length ? "count equal" : `count ${kilnIds} vs ${ids.length}`}`);
}
