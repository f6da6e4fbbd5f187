#!/usr/bin/env bash
# Runs tests/e2e/agent_families.mjs (the official `openai` and
# `@anthropic-ai/sdk` npm clients, arguments checked with npm `ajv`) against
# `kiln serve` of random weights (`kiln synth`'s tiny shape, the vocabulary
# of the real tokenizer) for each family's real chat template (committed in
# tests/data): Qwen3 (Hermes), Llama 3.1 (JSON, its tokenizer from
# ../shared/tokenizers; skipped when absent), Mistral (Nemo's [TOOL_CALLS]
# list), gpt-oss (Harmony), DeepSeek-V3.1, and the tag, section and
# pythonic formats: Qwen3-Coder, GLM-4.7-Flash and GLM-4.6 (GLM-4.5's format, on one line and on several), Kimi K2,
# Kimi K3, MiniMax-M2, MiniMax-M3, Gemma 4, LFM2.5, Apriel 1.6, functionary
# v3.2 (the Llama 3.1 tokenizer), Nemotron Nano v2, DeepSeek-R1 (llama.cpp's
# R1 template, which renders the tools and opens <think>, and R1-Distill's,
# both on DeepSeek-V3's tokenizer, R1's), Granite 3.3, Command R7B,
# Command R+, Cohere2 MoE (Command A's <|START_ACTION|> format, <|START_TEXT|>,
# a prompt that opens <|START_THINKING|>), Mistral Small 3.2 ([TOOL_CALLS]NAME
# [ARGS], Mistral's v11 layout), Llama 4 with pythonic calls (tests/data/chat/templates/
# llama4-pythonic.jinja, written after Meta's Llama 4 prompt format: its
# published template writes Llama 3's JSON calls) and Phi-4-mini (its
# published template, transcribed: it reads tools only from a system
# message's "tools" text, so the grammar alone makes the calls). Families without
# their own tokenizer here use Qwen3's with the template's markers added as
# special tokens (as their own tokenizers have them), so that
# the grammar's special-token terminals and the detokenizer's kept special
# tokens are what is tested. A family marked "think" has a prompt that
# opens a thinking block: its server runs with --reasoning-budget 6 (random
# weights never close the block), which closes it and the grammar then
# forces the call, so that the reasoning is split out before every call
# ("think:N": --reasoning-budget N; the committed DeepSeek-V3 tokenizer
# keeps its first 20259 ids and its added tokens from 128000 on, so most
# ids random weights sample have no text: 64 tokens of thinking, where 6
# are no text one time in three, are some text but one time in 10^5).
# Used by the unit tests (cli_serve_agent_clients_families_ajv).
# Exit 77: node, a client or ajv is missing (the test is skipped).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kiln="${KILN_BIN:-$root/build/kiln}"
mods="${KILN_OPENAI_NODE_MODULES:-$root/build/tools/npm/node_modules}"
shared="${KILN_SHARED-$root/../shared}"
. "$root/tests/e2e/serve_lib.sh"
need_clients openai @anthropic-ai/sdk ajv ajv-formats
dir="$(mktemp -d)"
pid=""
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; [ -n "${KILN_KEEP:-}" ] || rm -rf "$dir"' EXIT
tpl="$root/tests/data/chat/templates"
q3="$root/tests/data/tokenizer/qwen3"
# family  tokenizer folder  template  think|-  special tokens to add
families=(
  "qwen3 $q3 $root/tests/data/tools/templates/Qwen-Qwen3-0.6B.jinja -"
  "llama3.1 $shared/tokenizers/llama3_1 $tpl/meta-llama-Llama-3.1-8B-Instruct.jinja -"
  "mistral $root/tests/data/tokenizer/mistral $tpl/mistralai-Mistral-Nemo-Instruct-2407.jinja -"
  "gpt-oss $root/tests/data/tokenizer/gptoss $tpl/openai-gpt-oss-120b.jinja -"
  "deepseek-v3 $root/tests/data/tokenizer/deepseek3 $tpl/deepseek-ai-DeepSeek-V3.1.jinja -"
  "qwen3-coder $q3 $tpl/Qwen3-Coder.jinja -"
  "glm-4.5 $q3 $tpl/GLM-4.7-Flash.jinja think [gMASK] <sop> <|system|> <|user|> <|assistant|> <|observation|>"
  "glm-4.6 $q3 $tpl/GLM-4.6.jinja - [gMASK] <sop> <|system|> <|user|> <|assistant|> <|observation|>"
  "kimi-k2 $q3 $tpl/moonshotai-Kimi-K2.jinja - <|im_user|> <|im_assistant|> <|im_system|> <|im_middle|> <|tool_calls_section_begin|>
   <|tool_calls_section_end|> <|tool_call_begin|> <|tool_call_argument_begin|> <|tool_call_end|>"
  "kimi-k3 $q3 $tpl/Kimi-K3.jinja think <|open|> <|close|> <|sep|> <|end_of_msg|>"
  "minimax-m2 $q3 $tpl/MiniMax-M2.jinja think ]~b] ]~!b[ [e~[ <minimax:tool_call> </minimax:tool_call>"
  "minimax-m3 $q3 $tpl/MiniMax-M3.jinja - ]~b] ]~!b[ [e~[ ]<]minimax[>["
  "gemma-4 $q3 $tpl/google-gemma-4-31B-it.jinja - <|turn> <turn|> <|tool> <tool|> <|tool_call> <tool_call|> <|tool_response>
   <tool_response|> <|\"|> <|channel> <channel|> <|think|>"
  "lfm2 $q3 $tpl/LFM2.5-8B-A1B.jinja - <|tool_call_start|> <|tool_call_end|>"
  "apriel $q3 $tpl/Apriel-1.6-15b-Thinker-fixed.jinja think <|begin_system|> <|begin_user|> <|begin_assistant|> <|begin_content|>
   <|begin_tool_result|> <|end|>"
  "functionary-v3.2 $shared/tokenizers/llama3_1 $tpl/meetkai-functionary-medium-v3.2.jinja -"
  "nemotron-v2 $q3 $tpl/NVIDIA-Nemotron-Nano-v2.jinja think <SPECIAL_10> <SPECIAL_11> <SPECIAL_12> <TOOLCALL> </TOOLCALL>"
  "deepseek-r1 $root/tests/data/tokenizer/deepseek3 $tpl/llama-cpp-deepseek-r1.jinja think:64"
  "deepseek-r1-distill $root/tests/data/tokenizer/deepseek3 $tpl/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja -"
  "granite-3.3 $q3 $tpl/ibm-granite-granite-3.3-2B-Instruct.jinja - <|start_of_role|> <|end_of_role|> <|end_of_text|> <|tool_call|>
   <|start_of_cite|> <|end_of_cite|>"
  "command-r7b $q3 $tpl/CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja - <|START_OF_TURN_TOKEN|> <|END_OF_TURN_TOKEN|>
   <|SYSTEM_TOKEN|> <|USER_TOKEN|> <|CHATBOT_TOKEN|> <|START_RESPONSE|> <|END_RESPONSE|> <|START_ACTION|> <|END_ACTION|>
   <|START_THINKING|> <|END_THINKING|> <|START_TOOL_RESULT|> <|END_TOOL_RESULT|>"
  "command-r-plus $q3 $tpl/CohereForAI-c4ai-command-r-plus-tool_use.jinja - <|START_OF_TURN_TOKEN|> <|END_OF_TURN_TOKEN|>
   <|SYSTEM_TOKEN|> <|USER_TOKEN|> <|CHATBOT_TOKEN|>"
  "llama4-pythonic $q3 $tpl/llama4-pythonic.jinja - <|begin_of_text|> <|header_start|> <|header_end|> <|eot|> <|eom|> <|python_start|>
   <|python_end|>"
  "mistral-v11 $root/tests/data/tokenizer/mistral $tpl/Mistral-Small-3.2-24B-Instruct-2506.jinja - [INST] [/INST] [SYSTEM_PROMPT]
   [/SYSTEM_PROMPT] [AVAILABLE_TOOLS] [/AVAILABLE_TOOLS] [TOOL_RESULTS] [/TOOL_RESULTS] [TOOL_CALLS] [ARGS] [CALL_ID]"
  "cohere2-moe $q3 $tpl/Cohere2MoE.jinja think <|START_OF_TURN_TOKEN|> <|END_OF_TURN_TOKEN|> <|SYSTEM_TOKEN|> <|USER_TOKEN|>
   <|CHATBOT_TOKEN|> <|START_TEXT|> <|END_TEXT|> <|START_ACTION|> <|END_ACTION|> <|START_THINKING|> <|END_THINKING|>
   <|START_TOOL_RESULT|> <|END_TOOL_RESULT|> <|IMG_PATCH|>"
  "phi-4-mini $q3 $tpl/microsoft-Phi-4-mini-instruct.jinja - <|system|> <|user|> <|assistant|> <|end|> <|tool|> <|/tool|>
   <|tool_call|> <|/tool_call|>"
)
rc=0
for f in "${families[@]}"; do
  read -r name tok tmpl think specials <<<"$(tr '\n' ' ' <<<"$f")"
  read -r -a sp <<<"$specials" # (no globbing: [gMASK])
  [ -n "${KILN_FAMILIES:-}" ] && [[ " $KILN_FAMILIES " != *" $name "* ]] && continue # a subset: KILN_FAMILIES="kimi-k2 lfm2"
  if [ ! -f "$tok/tokenizer.json" ]; then
    echo "SKIP $name: $tok/tokenizer.json is absent (KILN_SHARED)"
    continue
  fi
  d="$dir/$name"
  mkdir -p "$d"
  # the tokenizer with the special tokens added (new ids), the tiny shape with
  # its vocabulary (its largest id + 1) and eos
  node -e '
    const fs = require("fs"), [tok, out, d, ...specials] = process.argv.slice(1);
    const t = JSON.parse(fs.readFileSync(tok + "/tokenizer.json")), c = JSON.parse(fs.readFileSync(tok + "/tokenizer_config.json"));
    t.added_tokens ??= [];
    let next = Object.values(t.model.vocab).concat(t.added_tokens.map((a) => a.id)).reduce((a, b) => Math.max(a, b), 0) + 1;
    for (const content of specials) {
      if (t.added_tokens.some((a) => a.content === content) || t.model.vocab[content] !== undefined) continue;
      t.added_tokens.push({ id: next++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
    }
    fs.writeFileSync(d + "/tokenizer.json", JSON.stringify(t));
    fs.writeFileSync(d + "/tokenizer_config.json", JSON.stringify(c));
    const ids = Object.values(t.model.vocab).concat((t.added_tokens ?? []).map((a) => a.id));
    const eosName = typeof c.eos_token === "string" ? c.eos_token : c.eos_token?.content;
    const eos = (t.added_tokens ?? []).find((a) => a.content === eosName)?.id ?? t.model.vocab[eosName] ?? 2;
    fs.writeFileSync(out, JSON.stringify({ model_type: "llama", hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,
      num_key_value_heads: 2, head_dim: 16, intermediate_size: 128, vocab_size: ids.reduce((a, b) => Math.max(a, b), 0) + 1,
      max_position_embeddings: 4096, rope_theta: 10000, rms_norm_eps: 1e-5, tie_word_embeddings: true, hidden_act: "silu",
      bos_token_id: 1, eos_token_id: eos, torch_dtype: "bfloat16" }));' "$tok" "$dir/$name.config.json" "$dir" "${sp[@]}" || exit 1
  "$kiln" synth --config "$dir/$name.config.json" --seed 7 --out "$d" >/dev/null || exit 1
  mv "$dir/tokenizer.json" "$dir/tokenizer_config.json" "$d/"
  cp "$tmpl" "$d/chat_template.jinja"
  budget=()
  [[ "$think" == think* ]] && budget=(--reasoning-budget "$( [ "$think" = think ] && echo 6 || echo "${think#think:}")")
  start_serve "$d" --alias tiny -np 2 -c 4096 -t 1 "${budget[@]}"
  NODE_PATH="$mods" timeout 300 node "$root/tests/e2e/agent_families.mjs" "http://127.0.0.1:$port" tiny "$name" "${think%%:*}" || { rc=1; echo "kiln serve's log ($name):"; tail -40 "$d/err"; }
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=""
done
[ "$rc" = 0 ] && echo "all checks passed"
exit "$rc"
