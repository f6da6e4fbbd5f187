// Checks the demo model's tokenizer.json (written by tools/train_demo.py with its own
// Python encoder) against an independent implementation: the pure-JavaScript
// @huggingface/tokenizers, and its chat template against @huggingface/jinja.
// Development tool, not run by CI (it needs npm packages).
//
//   mkdir -p /tmp/jstok && cd /tmp/jstok && npm init -y >/dev/null &&
//     npm install @huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.11
//   node tools/check_demo_tokenizer.mjs [/tmp/jstok/node_modules]
//
// What it compares, from tests/data/demo/tokenizer_vectors.json:
//   cases[i].ids    == encode(cases[i].text, no special tokens), and decode back;
//   heldout_ids     == encode(models/kiln-demo/heldout.txt), and decode back;
//   encode(text) with special tokens starts with the BOS <|endoftext|> (id 0);
//   chat.rendered   == chat_template rendered by jinja (bos_token, messages,
//                      add_generation_prompt), and chat.ids == its encoding.
// Prints one line per failure and "N passed, M failed"; exits 1 on any failure.
import { readFileSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const modules = process.argv[2] || process.env.KILN_NODE_MODULES || "/tmp/jstok/node_modules";
const load = (pkg, file) => import(pathToFileURL(join(modules, pkg, file)).href);
const { Tokenizer } = await load("@huggingface/tokenizers", "dist/tokenizers.mjs");
const { Template } = await load("@huggingface/jinja", "dist/index.js");

const readJson = (p) => JSON.parse(readFileSync(join(root, p), "utf8"));
const model = "models/kiln-demo";
const tokJson = readJson(`${model}/tokenizer.json`);
const tokConfig = readJson(`${model}/tokenizer_config.json`);
const vectors = readJson("tests/data/demo/tokenizer_vectors.json");
const tok = new Tokenizer(tokJson, tokConfig);

let passed = 0, failed = 0;
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);
function check(ok, what, detail) {
  if (ok) { passed++; return; }
  failed++;
  console.log(`FAIL ${what}${detail ? ": " + detail : ""}`);
}
function firstDiff(a, b) {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return `first difference at index ${i}: js ${JSON.stringify(a.slice(i, i + 8))} ` +
         `python ${JSON.stringify(b.slice(i, i + 8))}`;
}
const ids = (text, special) => tok.encode(text, { add_special_tokens: special }).ids.map(Number);

for (const c of vectors.cases) {
  const js = ids(c.text, false);
  check(same(js, c.ids), `encode ${JSON.stringify(c.text)}`, same(js, c.ids) ? "" : firstDiff(js, c.ids));
  // tokenizers.js refuses to decode an empty list; the empty string is the answer.
  const back = c.ids.length ? tok.decode(c.ids, { skip_special_tokens: false }) : "";
  check(back === c.text, `decode ${JSON.stringify(c.text)}`, JSON.stringify(back));
}

const heldout = readFileSync(join(root, model, "heldout.txt"), "utf8");
const hj = ids(heldout, false);
check(same(hj, vectors.heldout_ids), `heldout.txt (${vectors.heldout_ids.length} ids)`,
      same(hj, vectors.heldout_ids) ? "" : firstDiff(hj, vectors.heldout_ids));
check(tok.decode(vectors.heldout_ids) === heldout, "decode heldout.txt");

const withBos = ids("Hello world", true);
check(withBos[0] === 0 && same(withBos.slice(1), ids("Hello world", false)),
      "BOS added by the post-processor", JSON.stringify(withBos));

const chat = vectors.chat;
const rendered = new Template(tokConfig.chat_template).render({
  messages: chat.messages, add_generation_prompt: chat.add_generation_prompt,
  bos_token: tokConfig.bos_token, eos_token: tokConfig.eos_token,
});
check(rendered === chat.rendered, "chat template rendering", JSON.stringify(rendered));
const cj = ids(rendered, false);
check(same(cj, chat.ids), "chat ids", same(cj, chat.ids) ? "" : firstDiff(cj, chat.ids));

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
