// Constrained tool calls through the official clients, checked with npm
// `ajv` (+ ajv-formats), against a `kiln serve` of random weights with one
// family's real tokenizer and chat template (tests/e2e/run_agent_families.sh).
// With tool_choice "required" / a named function / Anthropic's "any" and
// "tool", and strict tools, every call's arguments must validate against
// the function's schema, whole and streamed, in chat completions, Responses
// and Messages; then a full round trip (the call sent back with its result,
// an answer), and Messages' countTokens of it equal to its prompt. Sampled at temperature 1 with seeds, so the grammar, not the
// weights, makes the calls valid. Streamed calls are checked against the
// unstreamed ones of the same seed: the first fragment of a call carries its
// id and name, and the argument fragments join to the same arguments. A
// "think" family (argv[5]; its server closes the thinking block after a
// reasoning budget) must split the reasoning out before every forced call
// (reasoning_content, a Responses reasoning item, an Anthropic thinking
// block), no markup in it or in content; other families give none.
// Exits 1 on a failed check.
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const OpenAI = require("openai").default ?? require("openai");
const AnthropicMod = require("@anthropic-ai/sdk");
const Anthropic = AnthropicMod.default ?? AnthropicMod.Anthropic ?? AnthropicMod;
const AjvMod = require("ajv");
const Ajv = AjvMod.default ?? AjvMod;
const addFormats = require("ajv-formats").default ?? require("ajv-formats");

const base = process.argv[2] ?? "http://127.0.0.1:8080";
const model = process.argv[3] ?? "tiny";
const family = process.argv[4] ?? "?";
const think = process.argv[5] === "think";
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "none" });
const anthropic = new Anthropic({ baseURL: base, apiKey: "none" });

let failed = 0;
function check(name, ok, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${family}: ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failed++;
}
const J = JSON.stringify;

// the tag and pythonic formats write a string parameter as their own text
// (raw, or in their quotes), where kiln's grammar takes no "format" (a
// documented 400): a date there is a string of at most 10 characters
const rawStrings = new Set(["qwen3-coder", "glm-4.5", "glm-4.6", "minimax-m2", "minimax-m3", "kimi-k3", "gemma-4", "lfm2", "llama4-pythonic"]);
// (each property described: Command R+'s template writes every description)
const weather = {
  type: "object",
  properties: {
    city: { type: "string", minLength: 1, maxLength: 12, description: "The city" },
    days: { type: "integer", minimum: 1, maximum: 9, description: "How many days" },
    unit: { enum: ["celsius", "fahrenheit"], description: "The unit" },
    when: { ...(rawStrings.has(family) ? { type: "string", maxLength: 10 } : { type: "string", format: "date" }), description: "The day" },
    tags: { type: "array", items: { type: "string", maxLength: 5 }, maxItems: 3, description: "Labels" },
  },
  required: ["city", "days", "unit"],
  additionalProperties: false,
};
const clock = { type: "object", properties: { zone: { type: "string", enum: ["UTC", "CET"], description: "The zone" } }, required: ["zone"],
                additionalProperties: false };
const schemas = { get_weather: weather, get_time: clock };
const ajv = new Ajv({ strict: true, allErrors: true });
addFormats(ajv);
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)]));
// "" when args (a JSON text, or an object) validate against name's schema, else why not
function invalid(name, args) {
  const v = validators[name];
  if (!v) return `no tool ${J(name)}`;
  let a = args;
  if (typeof args === "string") {
    try { a = JSON.parse(args); } catch (e) { return `not JSON: ${J(args)}`; }
  }
  return v(a) ? "" : `${J(a)}: ${ajv.errorsText(v.errors)}`;
}

// the calls that must be whole: all, or all but the last when the output was
// cut short (a max-tokens cut leaves the last call's arguments a prefix)
const whole = (calls, cut) => (cut ? calls.slice(0, -1) : calls);

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: weather, strict: true } },
  { type: "function", function: { name: "get_time", description: "The time in a zone", parameters: clock, strict: true } },
];
const ask = [{ role: "user", content: "What is the weather in Paris?" }];
// the formats' markers, which never reach content or reasoning
const markup = new RegExp(["</?tool_call", "<\\|tool_call", "tool_call\\|>", "<function=", "<parameter", "<arg_key>", "<arg_value>",
  "<\\|tool_calls_section", "<\\|open\\|>tools", "minimax", "<invoke", "TOOLCALL>", "<tool_calls>", ">>>", "</think>", "<\\|channel>",
  "<channel\\|>", "<\\|close\\|>think", "\\[BEGIN FINAL RESPONSE\\]", "\\[TOOL_CALLS\\]", "to=functions", "<｜tool"].join("|"));
// "" when a reasoning text is as the family's: some, without markup ("think"), else none
function badReasoning(text) {
  if (!think) return text ? `reasoning where the prompt opens no thinking block: ${J(text)}` : "";
  return typeof text !== "string" || !text.length ? "no reasoning" : markup.test(text) ? `markup in the reasoning: ${J(text)}` : "";
}
const common = { model, tools, temperature: 1, max_tokens: 400 };

// ---- chat completions
const c1 = await openai.chat.completions.create({ ...common, messages: ask, tool_choice: "required", parallel_tool_calls: false, seed: 1 });
const m1 = c1.choices[0].message, tc1 = m1.tool_calls ?? [];
check("chat required: one valid call", tc1.length === 1 && !invalid(tc1[0].function.name, tc1[0].function.arguments) &&
      c1.choices[0].finish_reason === "tool_calls" && !m1.content,
      tc1.length ? `${tc1[0].function.name}(${J(tc1[0].function.arguments)}) ${invalid(tc1[0].function.name, tc1[0].function.arguments)}` : J(m1));
check("chat required: the reasoning split out", !badReasoning(m1.reasoning_content) && !m1.content, badReasoning(m1.reasoning_content));
{ // the same request streamed (the same seed: the same output), the chunks as they come
  const st = await openai.chat.completions.create({ ...common, messages: ask, tool_choice: "required", parallel_tool_calls: false, seed: 1,
                                                    stream: true });
  const calls = [];
  let reasoning = "", content = "", finish = null, heads = true;
  for await (const ch of st) {
    const d = ch.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? "";
    content += d.content ?? "";
    finish = ch.choices[0]?.finish_reason ?? finish;
    for (const t of d.tool_calls ?? []) {
      if (!calls[t.index]) { // the first fragment: id and name
        heads &&= typeof t.id === "string" && t.type === "function" && typeof t.function?.name === "string";
        calls[t.index] = { id: t.id, name: t.function?.name, arguments: "" };
      } else {
        heads &&= t.id === undefined && t.function?.name === undefined;
      }
      calls[t.index].arguments += t.function?.arguments ?? "";
    }
  }
  check("chat required, raw stream: the deltas join to the unstreamed call", heads && calls.length === 1 && tc1.length === 1 &&
        calls[0].name === tc1[0].function.name && calls[0].arguments === tc1[0].function.arguments && finish === "tool_calls" &&
        !content && reasoning === (m1.reasoning_content ?? ""),
        `${J(calls)} vs ${J(tc1.map((t) => t.function))}; reasoning ${J(reasoning)} vs ${J(m1.reasoning_content)}; content ${J(content)}`);
}
const s1 = await openai.chat.completions.stream({ ...common, messages: ask, tool_choice: "required", parallel_tool_calls: false, seed: 2 })
  .finalChatCompletion();
const sc1 = s1.choices[0].message.tool_calls ?? [];
check("chat required streamed: one valid call", sc1.length === 1 && !invalid(sc1[0].function.name, sc1[0].function.arguments) &&
      s1.choices[0].finish_reason === "tool_calls",
      sc1.length ? `${sc1[0].function.name}(${J(sc1[0].function.arguments)}) ${invalid(sc1[0].function.name, sc1[0].function.arguments)}` : J(s1.choices[0]));
const c2 = await openai.chat.completions.create({ ...common, messages: ask, tool_choice: "required", seed: 3 });
const tc2 = c2.choices[0].message.tool_calls ?? [];
const cut2 = c2.choices[0].finish_reason === "length";
check("chat required, parallel: every call valid", whole(tc2, cut2).length >= 1 &&
      whole(tc2, cut2).every((t) => !invalid(t.function.name, t.function.arguments)),
      tc2.map((t) => `${t.function.name}(${J(t.function.arguments)}) ${invalid(t.function.name, t.function.arguments)}`).join("; "));
for (const [name, seed] of [["get_time", 4], ["get_weather", 5]]) {
  const r = await openai.chat.completions.create({ ...common, messages: ask, tool_choice: { type: "function", function: { name } },
                                                   parallel_tool_calls: false, seed });
  const t = r.choices[0].message.tool_calls ?? [];
  check(`chat named ${name}: a valid call of it`, t.length === 1 && t[0].function.name === name && !invalid(name, t[0].function.arguments),
        t.length ? `${t[0].function.name}(${J(t[0].function.arguments)}) ${invalid(name, t[0].function.arguments)}` : J(r.choices[0]));
}
// the round trip: the call back with its result, then an answer
if (tc1.length) {
  const back = await openai.chat.completions.create({
    ...common, max_tokens: 8, seed: 6,
    messages: [...ask, { role: "assistant", content: null, tool_calls: tc1.map((t) => ({ id: t.id, type: "function", function: t.function })) },
               { role: "tool", tool_call_id: tc1[0].id, content: "sunny, 21 C" }],
  });
  const bm = back.choices[0].message;
  check("chat round trip: an answer to the tool result", back.usage.prompt_tokens > c1.usage.prompt_tokens && bm.role === "assistant" &&
        ["stop", "length", "tool_calls"].includes(back.choices[0].finish_reason) &&
        whole(bm.tool_calls ?? [], back.choices[0].finish_reason === "length").every((t) => !invalid(t.function.name, t.function.arguments)),
        `${J(back.usage)} ${back.choices[0].finish_reason}`);
}

// ---- responses
const rtools = tools.map((t) => ({ type: "function", ...t.function }));
const rcommon = { model, tools: rtools, temperature: 1, max_output_tokens: 400 };
const fcalls = (r) => r.output.filter((o) => o.type === "function_call");
const r1 = await openai.responses.create({ ...rcommon, input: "What is the weather in Paris?", tool_choice: "required",
                                           parallel_tool_calls: false, seed: 7 });
const f1 = fcalls(r1);
check("responses required: one valid function_call", r1.status === "completed" && f1.length === 1 && !invalid(f1[0].name, f1[0].arguments) &&
      typeof f1[0].call_id === "string", f1.length ? `${f1[0].name}(${J(f1[0].arguments)}) ${invalid(f1[0].name, f1[0].arguments)}` : J(r1.output));
const reasoningOf = (r) => r.output.filter((o) => o.type === "reasoning").map((o) => (o.content ?? []).map((c) => c.text).join("")).join("");
const r1texts = r1.output.filter((o) => o.type === "message").flatMap((o) => o.content.map((c) => c.text ?? "")).join("");
check("responses required: the reasoning split out", !badReasoning(reasoningOf(r1)) && !r1texts,
      `${badReasoning(reasoningOf(r1))} ${J(r1texts)}`);
{ // the same streamed (the same seed)
  const st = await openai.responses.create({ ...rcommon, input: "What is the weather in Paris?", tool_choice: "required",
                                             parallel_tool_calls: false, seed: 7, stream: true });
  let args = "", reasoning = "", text = "", added = [], final = null;
  for await (const ev of st) {
    if (ev.type === "response.function_call_arguments.delta") args += ev.delta;
    if (ev.type === "response.reasoning_text.delta") reasoning += ev.delta;
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.output_item.added" && ev.item.type === "function_call") added.push(ev.item.name);
    if (ev.type === "response.completed") final = ev.response;
  }
  const ff = final ? fcalls(final) : [];
  check("responses required, streamed: the deltas join to the unstreamed call", f1.length === 1 && ff.length === 1 &&
        J(added) === J([f1[0].name]) && ff[0].name === f1[0].name && args === f1[0].arguments && ff[0].arguments === args &&
        reasoning === reasoningOf(r1) && reasoningOf(final) === reasoning && !text,
        `${J(added)} ${J(args)} vs ${J(f1[0]?.arguments)}; reasoning ${J(reasoning)} vs ${J(reasoningOf(r1))}; text ${J(text)}`);
}
const rs = openai.responses.stream({ ...rcommon, input: "What is the weather in Paris?", tool_choice: { type: "function", name: "get_weather" },
                                     parallel_tool_calls: false, seed: 8 });
let deltas = "", doneArgs = null;
for await (const ev of rs) {
  if (ev.type === "response.function_call_arguments.delta") deltas += ev.delta;
  if (ev.type === "response.function_call_arguments.done") doneArgs = ev.arguments;
}
const rf = fcalls(await rs.finalResponse());
check("responses named, streamed: the deltas add up to a valid call", rf.length === 1 && rf[0].name === "get_weather" &&
      deltas === doneArgs && deltas === rf[0].arguments && !invalid("get_weather", deltas),
      `${J(deltas)} ${invalid("get_weather", deltas)}`);
if (f1.length) {
  const r2 = await openai.responses.create({
    ...rcommon, max_output_tokens: 8, seed: 9,
    input: [{ role: "user", content: "What is the weather in Paris?" }, { type: "function_call", call_id: f1[0].call_id, name: f1[0].name,
            arguments: f1[0].arguments }, { type: "function_call_output", call_id: f1[0].call_id, output: "sunny, 21 C" }],
  });
  check("responses round trip: an answer to the function_call_output", r2.object === "response" &&
        r2.usage.input_tokens > r1.usage.input_tokens && fcalls(r2).every((f) => f.status === "incomplete" || !invalid(f.name, f.arguments)) &&
        fcalls(r2).every((f, i, a) => f.status !== "incomplete" || (i === a.length - 1 && r2.status === "incomplete")),
        `${J(r2.usage)} vs ${J(r1.usage)}; ${J(r2.output)}`);
}

// ---- anthropic messages
const atools = tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
const acommon = { model, tools: atools, temperature: 1, max_tokens: 400 };
const uses = (m) => m.content.filter((b) => b.type === "tool_use");
// seeded (kiln's extension of Messages), as the requests above: a random
// model's unseeded sample could be anything, a marker's look-alike too
const a1 = await anthropic.messages.create({ ...acommon, messages: ask, tool_choice: { type: "any", disable_parallel_tool_use: true },
                                             seed: 10 });
const u1 = uses(a1);
const thinkingOf = (m) => m.content.filter((b) => b.type === "thinking").map((b) => b.thinking).join("");
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
check("messages any: the thinking block split out, first", !badReasoning(thinkingOf(a1)) && !textOf(a1) &&
      (!think || a1.content[0].type === "thinking"), `${badReasoning(thinkingOf(a1))} ${J(a1.content.map((b) => b.type))}`);
check("messages any: one valid tool_use", a1.stop_reason === "tool_use" && u1.length === 1 && !invalid(u1[0].name, u1[0].input) &&
      typeof u1[0].id === "string", u1.length ? `${u1[0].name}(${J(u1[0].input)}) ${invalid(u1[0].name, u1[0].input)}` : J(a1.content));
const as = anthropic.messages.stream({ ...acommon, messages: ask, tool_choice: { type: "tool", name: "get_time" }, seed: 11 });
const partial = [], thought = [];
as.on("streamEvent", (ev) => {
  if (ev.type !== "content_block_delta") return;
  if (ev.delta.type === "input_json_delta") partial[ev.index] = (partial[ev.index] ?? "") + ev.delta.partial_json;
  if (ev.delta.type === "thinking_delta") thought[ev.index] = (thought[ev.index] ?? "") + ev.delta.thinking;
});
const af = await as.finalMessage();
const au = uses(af);
// each tool_use block's input_json_delta fragments join to its input (a
// last block that max_tokens cut is incomplete: its fragments stop mid-JSON)
const cutAt = af.stop_reason === "max_tokens" ? af.content.length - 1 : -1;
const joined = af.content.map((b, i) => b.type !== "tool_use" || i === cutAt ||
  (!invalid(b.name, partial[i] ?? "") && J(JSON.parse(partial[i])) === J(b.input)));
check("messages tool, streamed: input_json_delta adds up to each valid input", au.length >= 1 && au.every((u) => u.name === "get_time") &&
      !invalid("get_time", au[0].input) && joined.every(Boolean),
      `${af.stop_reason} ${J(partial)} ${J(au.map((u) => u.input))}`);
const tb = af.content.findIndex((b) => b.type === "thinking");
check("messages tool, streamed: thinking_delta adds up to the thinking block", !badReasoning(thinkingOf(af)) && !textOf(af) &&
      (tb < 0 || thought[tb] === af.content[tb].thinking), `${badReasoning(thinkingOf(af))} ${J(thought)} vs ${J(af.content[tb]?.thinking)}; text ${J(textOf(af))}`);
if (u1.length) {
  const a2msgs = [...ask, { role: "assistant", content: a1.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: u1[0].id,
                   content: "sunny, 21 C" }] }];
  const a2 = await anthropic.messages.create({ ...acommon, max_tokens: 8, messages: a2msgs, seed: 12 });
  const prompt = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
  check("messages round trip: an answer to the tool_result", a2.type === "message" && prompt(a2.usage) > prompt(a1.usage) &&
        whole(uses(a2), a2.stop_reason === "max_tokens").every((u) => !invalid(u.name, u.input)), `${J(a2.usage)} ${J(a2.content)}`);
  // countTokens of the same request: its prompt
  const ct = await anthropic.messages.countTokens({ model, tools: atools, messages: a2msgs });
  check("messages.countTokens: the round trip's prompt", ct.input_tokens === prompt(a2.usage), `${J(ct)} vs ${J(a2.usage)}`);
}

console.log(failed ? `${family}: ${failed} checks failed` : `${family}: all passed`);
process.exit(failed ? 1 : 0);
