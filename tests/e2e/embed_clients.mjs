// The official `openai` npm client's embeddings.create and a plain HTTP
// client (fetch) for /v1/rerank, /rerank and /v2/rerank against two running
// `kiln serve`s: an EmbeddingGemma-shaped embedding fixture and a BERT
// cross-encoder (tests/e2e/run_embed_clients.sh starts them).
//
//   node tests/e2e/embed_clients.mjs EMBED_URL RERANK_URL FIXTURE_DIR
//
// Exits 1 on a failed check; prints one line per check.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
const require = createRequire(import.meta.url);
const OpenAI = require("openai").default ?? require("openai");

const [embedURL, rerankURL, fixture] = process.argv.slice(2);
const client = new OpenAI({ baseURL: embedURL + "/v1", apiKey: "none" });
let failed = 0;
function check(name, ok, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failed++;
}

// float32 .npy (little-endian, C order) -> rows
function npy(path) {
  const b = readFileSync(path);
  const hlen = b.readUInt16LE(8), header = b.subarray(10, 10 + hlen).toString();
  const shape = header.match(/\(([^)]*)\)/)[1].split(",").filter((s) => s.trim()).map(Number);
  const f = new Float32Array(b.buffer.slice(b.byteOffset + 10 + hlen, b.byteOffset + b.length));
  const rows = [];
  for (let i = 0; i < shape[0]; i++) rows.push(Array.from(f.subarray(i * shape[1], (i + 1) * shape[1])));
  return rows;
}
const maxdiff = (a, b) => Math.max(...a.map((x, i) => Math.abs(x - b[i])));
const norm = (a) => Math.sqrt(a.reduce((s, x) => s + x * x, 0));

const oracle = JSON.parse(readFileSync(fixture + "/oracle.json", "utf8"));
const want = npy(fixture + "/embedding_single.npy");

// token id lists: the oracle's vectors, in order, in one request
let r = await client.embeddings.create({ model: "embed", input: oracle.inputs, encoding_format: "float" });
check("ids: one vector per input, in order", r.data.length === 4 && r.data.every((d, i) => d.index === i && d.object === "embedding"));
const md = Math.max(...r.data.map((d, i) => maxdiff(d.embedding, want[i])));
check("ids: the oracle's embeddings", md <= 1e-5, `max |diff| ${md.toExponential(2)}`);
const total = oracle.inputs.reduce((s, x) => s + x.length, 0);
check("usage counts the tokens", r.usage.prompt_tokens === total && r.usage.total_tokens === total, JSON.stringify(r.usage));

// base64 (the client decodes it to floats itself when it asked for none)
const b64 = await client.embeddings.create({ model: "embed", input: [oracle.inputs[1]], encoding_format: "base64" });
const raw = Buffer.from(b64.data[0].embedding, "base64");
const fl = Array.from(new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length)));
const f32 = (a) => a.map(Math.fround); // the JSON floats are float32 values printed to round-trip
check("base64: little-endian float32 of the same vector", fl.length === want[1].length && maxdiff(fl, f32(r.data[1].embedding)) === 0);
const dflt = await client.embeddings.create({ model: "embed", input: [oracle.inputs[1]] });
check("the client's default (base64, decoded by it)", maxdiff(dflt.data[0].embedding, f32(r.data[1].embedding)) === 0);

// dimensions: Matryoshka truncation, renormalised
const d16 = await client.embeddings.create({ model: "embed", input: [oracle.inputs[2]], dimensions: 16, encoding_format: "float" });
const e16 = d16.data[0].embedding, full = r.data[2].embedding.slice(0, 16), s = norm(full);
check("dimensions: 16 values of norm 1", e16.length === 16 && Math.abs(norm(e16) - 1) < 1e-6);
check("dimensions: the leading values, rescaled", maxdiff(e16, full.map((x) => x / s)) < 1e-6);

// text: through the model's tokenizer, a string or a list of strings
const t = await client.embeddings.create({ model: "embed", input: ["hello world", "hello world"], encoding_format: "float" });
check("text: equal strings give equal vectors", t.data.length === 2 && maxdiff(t.data[0].embedding, t.data[1].embedding) === 0);
const one = await client.embeddings.create({ model: "embed", input: "hello world", encoding_format: "float" });
check("text: a string alone gives the same vector", maxdiff(one.data[0].embedding, t.data[0].embedding) === 0);

// errors: a 400 naming the problem
for (const [name, body, needle] of [
  ["an input past the context", { input: [Array(5000).fill(5)] }, "more than"],
  ["an id out of range", { input: [[1, 2, 99999]] }, "out of range"],
  ["bad dimensions", { input: "x", dimensions: 100000 }, "dimensions"],
  ["no input", {}, "input"],
]) {
  try {
    await client.embeddings.create({ model: "embed", encoding_format: "float", ...body });
    check(`error: ${name}`, false, "no error");
  } catch (e) {
    check(`error: ${name}`, e.status === 400 && String(e.message).includes(needle), `${e.status} ${e.message}`);
  }
}

// rerank, in Jina / Cohere's shape, through fetch
const docs = ["the first document", "another one", { text: "a third, as an object" }, "x"];
async function rerank(path, body) {
  const res = await fetch(rerankURL + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}
const rr = await rerank("/v1/rerank", { model: "rerank", query: "which document", documents: docs, top_n: 3 });
check("rerank: 200 and top_n results", rr.status === 200 && rr.json.results.length === 3, JSON.stringify(rr.json).slice(0, 200));
const sc = rr.json.results.map((x) => x.relevance_score);
check("rerank: best first", sc.every((x, i) => i === 0 || sc[i - 1] >= x));
check("rerank: documents returned", rr.json.results.every((x) => typeof x.document.text === "string"));
let alone = true;
for (const x of rr.json.results) {
  const a = await rerank("/rerank", { query: "which document", documents: [docs[x.index]], return_documents: false });
  alone &&= a.status === 200 && a.json.results[0].relevance_score === x.relevance_score && a.json.results[0].document === undefined;
}
check("rerank: a document's score does not depend on its neighbours (/rerank)", alone);
const v2 = await rerank("/v2/rerank", { query: "which document", documents: docs });
check("rerank: /v2/rerank, every document", v2.status === 200 && v2.json.results.length === 4 && v2.json.usage.total_tokens > 0);
const bad = await rerank("/v1/rerank", { query: "q", documents: [] });
check("rerank: an empty list is a 400", bad.status === 400 && bad.json.error.message.includes("documents"));
const other = new OpenAI({ baseURL: rerankURL + "/v1", apiKey: "none" });
const wrong = await other.embeddings.create({ model: "x", input: "x" }).catch((e) => e);
check("embeddings on a cross-encoder: a 400", wrong.status === 400);

console.log(failed ? `${failed} checks failed` : "all checks passed");
process.exit(failed ? 1 : 0);
