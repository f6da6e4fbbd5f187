// The official `openai` and `@anthropic-ai/sdk` npm clients against a running
// `kiln serve` whose template writes tool calls (tests/e2e/run_agent_clients.sh):
// chat with tools (streamed by the client's own stream helper, which
// assembles tool-call deltas), a tool round trip, responses.create with
// function tools (streamed and not, a function_call_output turn), and
// messages.create with tools (streamed, a tool_result turn, countTokens).
// Greedy, so streamed and not streamed must agree. Exits 1 on a failed check.
import { createRequire } from "node:module";
const require = createRequire(import.meta.url);
const OpenAI = require("openai").default ?? require("openai");
const AnthropicMod = require("@anthropic-ai/sdk");
const Anthropic = AnthropicMod.default ?? AnthropicMod.Anthropic ?? AnthropicMod;

const base = process.argv[2] ?? "http://127.0.0.1:8080";
const model = process.argv[3] ?? "tiny";
const key = process.env.KILN_API_KEY ?? "none";
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: key });
const anthropic = new Anthropic({ baseURL: base, apiKey: key });
const ver = (p) => require(require.resolve(p).replace(/(node_modules\/(@[^/]+\/)?[^/]+\/).*/, "$1package.json")).version;
console.log(`openai ${ver("openai")}, @anthropic-ai/sdk ${ver("@anthropic-ai/sdk")}, node ${process.version}, ${base}`);

let failed = 0;
function check(name, ok, detail = "") {
  console.log(`${ok ? "ok  " : "FAIL"} ${name}${detail ? ": " + detail : ""}`);
  if (!ok) failed++;
}
const J = JSON.stringify;

const weather = { type: "object", properties: { city: { type: "string", description: "a city" } }, required: ["city"] };
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather of a city", parameters: weather } }];
const ask = [{ role: "user", content: "What is the weather in Paris?" }];
const calls = (m) => (m.tool_calls ?? []).map((c) => [c.id, c.function.name, c.function.arguments]);

// ---- chat completions with tools
const c = await openai.chat.completions.create({ model, messages: ask, tools, max_tokens: 16, temperature: 0 });
const m = c.choices[0].message;
check("chat with tools", c.object === "chat.completion" && m.role === "assistant" &&
      (typeof m.content === "string" || (m.content === null && m.tool_calls?.length > 0)) &&
      ["stop", "length", "tool_calls"].includes(c.choices[0].finish_reason), J(m));
check("chat tool_calls well formed", calls(m).every(([id, n, a]) => typeof id === "string" && n && typeof a === "string"));
const stream = openai.chat.completions.stream({ model, messages: ask, tools, max_tokens: 16, temperature: 0 });
let chunks = 0;
stream.on("chunk", () => chunks++);
const sc = await stream.finalChatCompletion();
const sm = sc.choices[0].message;
check("chat stream helper = not streamed", (sm.content ?? null) === (m.content ?? null) &&
      J(calls(sm).map((x) => x.slice(1))) === J(calls(m).map((x) => x.slice(1))) &&
      sc.choices[0].finish_reason === c.choices[0].finish_reason, `${chunks} chunks, ${J(sm.content)}`);
const round = await openai.chat.completions.create({
  model, tools, max_tokens: 8, temperature: 0,
  messages: [...ask, { role: "assistant", content: null, tool_calls: [{ id: "abcdefghi", type: "function",
             function: { name: "get_weather", arguments: J({ city: "Paris" }) } }] },
             { role: "tool", tool_call_id: "abcdefghi", content: "sunny, 21 C" }],
});
check("chat tool round trip", round.choices[0].message.role === "assistant" && round.usage.prompt_tokens > c.usage.prompt_tokens,
      J(round.usage));
for (const tool_choice of ["none", "required", { type: "function", function: { name: "get_weather" } }]) {
  const r = await openai.chat.completions.create({ model, messages: ask, tools, tool_choice, max_tokens: 4, temperature: 0 });
  check(`chat tool_choice ${J(tool_choice)}`, r.choices.length === 1);
}
try {
  await openai.chat.completions.create({ model, messages: ask, tools, tool_choice: { type: "function", function: { name: "nope" } } });
  check("chat unknown tool_choice function is a 400", false);
} catch (e) {
  check("chat unknown tool_choice function is a 400", e.status === 400, e.message);
}

// ---- responses
const rtools = [{ type: "function", name: "get_weather", description: "Weather of a city", parameters: weather }];
const r = await openai.responses.create({ model, input: "What is the weather in Paris?", instructions: "Be brief.",
                                          tools: rtools, max_output_tokens: 16, temperature: 0 });
check("responses.create", r.object === "response" && ["completed", "incomplete"].includes(r.status) &&
      typeof r.output_text === "string" && r.output.every((o) => ["message", "reasoning", "function_call"].includes(o.type)),
      `${r.status} ${J(r.output_text)}`);
check("responses usage", r.usage.input_tokens > 0 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens, J(r.usage));
const rs = openai.responses.stream({ model, input: "What is the weather in Paris?", instructions: "Be brief.",
                                     tools: rtools, max_output_tokens: 16, temperature: 0 });
const types = [];
let lastSeq = -1, seqOk = true;
for await (const ev of rs) {
  types.push(ev.type);
  if (ev.sequence_number !== lastSeq + 1) seqOk = false;
  lastSeq = ev.sequence_number;
}
const rf = await rs.finalResponse();
check("responses stream = not streamed", rf.output_text === r.output_text && rf.status === r.status, `${types.length} events`);
check("responses stream events", seqOk && types[0] === "response.created" &&
      ["response.completed", "response.incomplete"].includes(types[types.length - 1]), J([...new Set(types)]));
const r2 = await openai.responses.create({
  model, tools: rtools, max_output_tokens: 8, temperature: 0,
  input: [{ role: "user", content: "What is the weather in Paris?" },
          { type: "function_call", call_id: "abcdefghi", name: "get_weather", arguments: J({ city: "Paris" }) },
          { type: "function_call_output", call_id: "abcdefghi", output: "sunny, 21 C" }],
});
check("responses function_call_output turn", r2.object === "response" && r2.usage.input_tokens > r.usage.input_tokens, J(r2.usage));
try {
  await openai.responses.create({ model, input: "hi", previous_response_id: "resp_123" });
  check("responses previous_response_id is a 400", false);
} catch (e) {
  check("responses previous_response_id is a 400", e.status === 400, e.message);
}

// ---- anthropic messages
const atools = [{ name: "get_weather", description: "Weather of a city", input_schema: weather }];
const amsg = [{ role: "user", content: "What is the weather in Paris?" }];
const a = await anthropic.messages.create({ model, max_tokens: 16, system: "Be brief.", messages: amsg, tools: atools, temperature: 0 });
check("messages.create", a.type === "message" && a.role === "assistant" && Array.isArray(a.content) &&
      ["end_turn", "max_tokens", "stop_sequence", "tool_use"].includes(a.stop_reason) && a.usage.input_tokens > 0, J(a.content));
const as = anthropic.messages.stream({ model, max_tokens: 16, system: "Be brief.", messages: amsg, tools: atools, temperature: 0 });
let aev = 0;
as.on("streamEvent", () => aev++);
const af = await as.finalMessage();
check("messages stream = not streamed", J(af.content) === J(a.content) && af.stop_reason === a.stop_reason, `${aev} events`);
const a2 = await anthropic.messages.create({
  model, max_tokens: 8, tools: atools, temperature: 0,
  messages: [...amsg, { role: "assistant", content: [{ type: "text", text: "Let me check." },
             { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
             { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny, 21 C" }] }],
});
// (Anthropic counts a prompt as input_tokens + cache_read_input_tokens + cache_creation_input_tokens)
const prompt = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0) + (u.cache_creation_input_tokens ?? 0);
check("messages tool_result turn", a2.type === "message" && prompt(a2.usage) > prompt(a.usage), J(a2.usage));
const ct = await anthropic.messages.countTokens({ model, system: "Be brief.", messages: amsg, tools: atools });
check("messages.countTokens", ct.input_tokens === prompt(a.usage), J(ct));
try {
  await anthropic.messages.create({ model: "no-such-model", max_tokens: 4, messages: amsg });
  check("messages unknown model is a 404", false);
} catch (e) {
  check("messages unknown model is a 404", e.status === 404 && e.error?.type === "error", `${e.constructor.name} ${J(e.error)}`);
}

console.log(failed ? `${failed} checks failed` : "all checks passed");
process.exit(failed ? 1 : 0);
