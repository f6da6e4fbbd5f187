// jinja_oracle.mjs: reference renders of chat templates by @huggingface/jinja,
// the renderer kiln's src/chat/ must match byte for byte.
//
//   npm install --prefix /tmp/jref @huggingface/jinja@0.5.11
//   JINJA_NODE_MODULES=/tmp/jref/node_modules node tools/jinja_oracle.mjs collect OUT SRC...
//       extracts templates from tokenizer_config.json / chat_template.json /
//       *.jinja files or folders of them into OUT/NAME.jinja (deduplicated)
//   JINJA_NODE_MODULES=/tmp/jref/node_modules node tools/jinja_oracle.mjs render [DATA]
//       renders every DATA/templates/*.jinja with every DATA/inputs/*.json
//       into DATA/expected/TEMPLATE.json: {input: {"out": text} | {"error": msg}}
//       (DATA defaults to tests/data/chat)
//   ... jinja_oracle.mjs snippets [DATA]
//       renders the engine unit cases of DATA/snippets.json
//
// The clock is frozen (strftime_now) at FIXED_NOW, UTC, as kiln's test does.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";

process.env.TZ = "UTC";
const FIXED_NOW = Date.UTC(2025, 6, 15, 12, 34, 56); // 1752582896 s
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...a) {
    if (a.length === 0) super(FIXED_NOW);
    else super(...a);
  }
  static now() {
    return FIXED_NOW;
  }
};

const modules = process.env.JINJA_NODE_MODULES || "/tmp/jref/node_modules";
const { Template } = await import(path.join(modules, "@huggingface/jinja/dist/index.js"));

const BOS = "<s>";
const EOS = "</s>";

function templatesOf(file) {
  // -> [[suffix, text]]
  const text = fs.readFileSync(file, "utf8");
  if (file.endsWith(".jinja")) return [["", text]];
  const j = JSON.parse(text);
  const ct = j.chat_template;
  if (ct == null) return [];
  if (typeof ct === "string") return [["", ct]];
  return ct.map((e) => [e.name === "default" ? "" : "-" + e.name, e.template]);
}

function collect(out, srcs) {
  fs.mkdirSync(out, { recursive: true });
  const seen = new Set();
  for (const f of fs.readdirSync(out)) {
    if (f.endsWith(".jinja")) seen.add(hash(fs.readFileSync(path.join(out, f), "utf8")));
  }
  for (const src of srcs) {
    const [dirOrFile, prefix] = src.split("=");
    const files = fs.statSync(dirOrFile).isDirectory()
      ? fs.readdirSync(dirOrFile).filter((f) => f.endsWith(".jinja")).map((f) => path.join(dirOrFile, f))
      : [dirOrFile];
    for (const file of files) {
      for (const [suffix, text] of templatesOf(file)) {
        const h = hash(text);
        if (seen.has(h)) continue;
        seen.add(h);
        const base = prefix ?? path.basename(file).replace(/\.jinja$/, "");
        fs.writeFileSync(path.join(out, base + suffix + ".jinja"), text);
      }
    }
  }
}

function hash(s) {
  return crypto.createHash("sha256").update(s).digest("hex");
}

function render(data) {
  const tdir = path.join(data, "templates");
  const idir = path.join(data, "inputs");
  const edir = path.join(data, "expected");
  fs.mkdirSync(edir, { recursive: true });
  const inputs = fs
    .readdirSync(idir)
    .filter((f) => f.endsWith(".json"))
    .sort()
    .map((f) => [f.replace(/\.json$/, ""), JSON.parse(fs.readFileSync(path.join(idir, f), "utf8"))]);
  let ok = 0,
    err = 0;
  for (const f of fs.readdirSync(tdir).filter((f) => f.endsWith(".jinja")).sort()) {
    const src = fs.readFileSync(path.join(tdir, f), "utf8");
    const result = {};
    let tpl = null,
      perr = null;
    try {
      tpl = new Template(src);
    } catch (e) {
      perr = String(e.message || e);
    }
    for (const [name, inp] of inputs) {
      if (perr) {
        result[name] = { error: perr };
        err++;
        continue;
      }
      try {
        const vars = {
          messages: inp.messages,
          add_generation_prompt: !!inp.add_generation_prompt,
          tools: inp.tools ?? null,
          documents: inp.documents ?? null,
          bos_token: BOS,
          eos_token: EOS,
          ...(inp.kwargs || {}),
        };
        result[name] = { out: tpl.render(vars) };
        ok++;
      } catch (e) {
        result[name] = { error: String(e.message || e) };
        err++;
      }
    }
    fs.writeFileSync(path.join(edir, f.replace(/\.jinja$/, ".json")), JSON.stringify(result, null, 1) + "\n");
  }
  console.log(`rendered ${ok} pairs, ${err} raised`);
}

// snippets: DATA/snippets.json is a list of {"t": template, "ctx": {...}};
// writes DATA/snippets_expected.json, one {"out"} or {"error"} per case.
function snippets(data) {
  const cases = JSON.parse(fs.readFileSync(path.join(data, "snippets.json"), "utf8"));
  const out = cases.map((c) => {
    try {
      return { out: new Template(c.t).render(c.ctx || {}) };
    } catch (e) {
      return { error: String(e.message || e) };
    }
  });
  fs.writeFileSync(path.join(data, "snippets_expected.json"), JSON.stringify(out, null, 1) + "\n");
  console.log(`${out.length} snippets, ${out.filter((x) => x.error).length} raised`);
}

const [cmd, ...rest] = process.argv.slice(2);
if (cmd === "collect") collect(rest[0], rest.slice(1));
else if (cmd === "render") render(rest[0] || "tests/data/chat");
else if (cmd === "snippets") snippets(rest[0] || "tests/data/chat");
else {
  console.error("usage: jinja_oracle.mjs collect OUT SRC... | render [DATA]");
  process.exit(2);
}
