// The official `openai` npm client against a running `kiln serve`:
// completions and chat, streamed and not, n > 1, stop strings, seeds, usage.
// Not part of `make test` (CI has no network for npm); run by hand:
//
//   npm install --prefix /tmp/oai openai            # any place outside the repo
//   build/kiln serve -m MODEL --port 8080 &
//   NODE_PATH=/tmp/oai/node_modules node tests/e2e/openai_client.mjs http://127.0.0.1:8080/v1 MODEL_ID
//
// Exits 1 on the first failed check; prints one line per check. The output
// of a run is kept in tests/e2e/openai_client.out.txt.
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const OpenAI = require("openai").default ?? require("openai");

const baseURL = process.argv[2] ?? "http://127.0.0.1:8080/v1";
const model = process.argv[3] ?? "kiln-demo";
const client = new OpenAI({ baseURL, apiKey: process.env.KILN_API_KEY ?? "none" });
import { readFileSync } from "node:fs";
const main = require.resolve("openai");
const pkgDir = main.slice(0, main.lastIndexOf("node_modules/openai/") + "node_modules/openai/".length);
const version = JSON.parse(readFileSync(pkgDir + "package.json", "utf8")).version;
console.log(`openai ${version}, node ${process.version}, ${baseURL}, model ${model}`);

let failed = 0;
function check(name, ok, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failed++;
}

async function collect(stream, chat) {
  const text = {}, finish = {};
  let usage = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices ?? []) {
      const piece = chat ? ch.delta?.content : ch.text;
      text[ch.index] = (text[ch.index] ?? "") + (piece ?? "");
      if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
    }
  }
  return { text, finish, usage, chunks };
}

const prompt = "The cat sat on the mat. The dog";
const messages = [{ role: "system", content: "You are terse." }, { role: "user", content: "Say something." }];

// models
const models = await client.models.list();
const ids = [];
for await (const m of models) ids.push(m.id);
check("models.list", ids.includes(model), JSON.stringify(ids));

// completions: not streamed, greedy
const a = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
check("completions", typeof a.choices[0].text === "string" && a.choices[0].text.length > 0, JSON.stringify(a.choices[0].text));
check("completions usage", a.usage.completion_tokens > 0 && a.usage.total_tokens === a.usage.prompt_tokens + a.usage.completion_tokens,
      JSON.stringify(a.usage));
// streamed: the same text
const as = await collect(await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true,
                                                            stream_options: { include_usage: true } }), false);
check("completions stream = not streamed", as.text[0] === a.choices[0].text, `${as.chunks} chunks`);
check("completions stream usage", as.usage && as.usage.completion_tokens === a.usage.completion_tokens, JSON.stringify(as.usage));
check("completions stream finish_reason", as.finish[0] === a.choices[0].finish_reason, as.finish[0]);

// stop strings: the text ends right before the first match; never streamed
const t = a.choices[0].text;
const m = t.slice(Math.floor(t.length / 3)).match(/[A-Za-z]{2}/);
if (m) {
  const stop = m[0], want = t.slice(0, t.indexOf(stop));
  const b = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop: [stop, "\u2603never"] });
  check("stop", b.choices[0].text === want && b.choices[0].finish_reason === "stop",
        `stop ${JSON.stringify(stop)} -> ${JSON.stringify(b.choices[0].text)}`);
  const bs = await collect(await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop, stream: true }), false);
  check("stop stream", bs.text[0] === want && !bs.text[0].includes(stop) && bs.finish[0] === "stop");
}

// seeds: n = 3 seeded = three lone requests seeded seed, seed + 1, seed + 2; repeatable
const n3 = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 1.0, n: 3, seed: 42 });
check("n = 3", n3.choices.length === 3 && n3.choices.every((c, i) => c.index === i));
for (let k = 0; k < 3; k++) {
  const one = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 1.0, seed: 42 + k });
  check(`seed ${42 + k} = choice ${k} of n = 3`, one.choices[0].text === n3.choices[k].text, JSON.stringify(one.choices[0].text));
}
const again = await client.completions.create({ model, prompt, max_tokens: 16, temperature: 1.0, n: 3, seed: 42 });
check("seeded n = 3 repeats", again.choices.every((c, i) => c.text === n3.choices[i].text));
const n3s = await collect(await client.completions.create({ model, prompt, max_tokens: 16, temperature: 1.0, n: 3, seed: 42,
                                                           stream: true }), false);
check("n = 3 streamed = not streamed", [0, 1, 2].every((i) => n3s.text[i] === n3.choices[i].text));

// chat
const c = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0 });
check("chat", c.object === "chat.completion" && c.choices[0].message.role === "assistant" &&
      typeof c.choices[0].message.content === "string", JSON.stringify(c.choices[0].message.content));
check("chat usage", c.usage.prompt_tokens > 0 && c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens,
      JSON.stringify(c.usage));
const cs = await collect(await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0, stream: true,
                                                               stream_options: { include_usage: true } }), true);
check("chat stream = not streamed", cs.text[0] === c.choices[0].message.content, `${cs.chunks} chunks`);
check("chat stream usage", cs.usage && cs.usage.completion_tokens === c.usage.completion_tokens, JSON.stringify(cs.usage));
const cn = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0.9, n: 2, seed: 7 });
check("chat n = 2", cn.choices.length === 2);
const cns = await collect(await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 0.9, n: 2,
                                                                seed: 7, stream: true }), true);
check("chat n = 2 streamed = not streamed", [0, 1].every((i) => cns.text[i] === cn.choices[i].message.content));
const cstop = c.choices[0].message.content.match(/[A-Za-z]{2}/);
if (cstop) {
  const want = c.choices[0].message.content.slice(0, c.choices[0].message.content.indexOf(cstop[0]));
  const d = await client.chat.completions.create({ model, messages, max_tokens: 20, temperature: 0, stop: cstop[0] });
  check("chat stop", d.choices[0].message.content === want && d.choices[0].finish_reason === "stop");
}
const lp = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
check("chat logprobs", lp.choices[0].logprobs.content.length > 0 && lp.choices[0].logprobs.content[0].top_logprobs.length === 2);

// structured output: response_format json_schema obeyed whenever the answer finishes
const schema = { type: "object", properties: { k: { enum: ["x", "y"] }, n: { type: "integer", minimum: 0, maximum: 99 } },
                 required: ["k", "n"], additionalProperties: false };
let stops = 0, obeyed = true;
for (let seed = 1; seed <= 6; seed++) {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 60, temperature: 1, seed,
                                                   response_format: { type: "json_schema", json_schema: { name: "t", strict: true, schema } } });
  if (r.choices[0].finish_reason !== "stop") continue;
  stops++;
  try {
    const v = JSON.parse(r.choices[0].message.content);
    obeyed &&= (v.k === "x" || v.k === "y") && Number.isInteger(v.n) && v.n >= 0 && v.n <= 99 && Object.keys(v).length === 2;
  } catch {
    obeyed = false;
  }
}
check("response_format json_schema", stops > 0 && obeyed, `${stops} of 6 finished`);
try {
  await client.chat.completions.create({ model, messages, max_tokens: 4,
                                         response_format: { type: "json_schema", json_schema: { name: "t", schema: { type: "array", uniqueItems: true } } } });
  check("400 for an unsupported schema keyword", false);
} catch (e) {
  check("400 for an unsupported schema keyword", e.status === 400 && /uniqueItems/.test(e.message), `${e.constructor.name}: ${e.message}`);
}

// errors come back as the client's typed errors
try {
  await client.completions.create({ model: "no-such-model", prompt, max_tokens: 2 });
  check("404 for an unknown model", false);
} catch (e) {
  check("404 for an unknown model", e.status === 404, `${e.constructor.name} ${e.status}`);
}
try {
  await client.completions.create({ model, prompt, max_tokens: "ten" });
  check("400 for a bad parameter", false);
} catch (e) {
  check("400 for a bad parameter", e.status === 400, `${e.constructor.name}: ${e.message}`);
}

console.log(failed ? `${failed} checks failed` : "all checks passed");
process.exit(failed ? 1 : 0);
