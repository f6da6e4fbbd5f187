#!/usr/bin/env bash
# Runs tests/e2e/agent_families.mjs (the official `openai` and
# `@anthropic-ai/sdk` npm clients, arguments checked with npm `ajv`) against
# `kiln serve` of random weights (`kiln synth`'s tiny shape, the vocabulary
# of the real tokenizer) for each family: Qwen3 (Hermes), Llama 3.1 (JSON,
# its tokenizer from ../shared/tokenizers; skipped when absent), Mistral
# (Nemo's [TOOL_CALLS] list), gpt-oss (Harmony) and DeepSeek-V3.1. Used by
# the unit tests (cli_serve_agent_clients_families_ajv).
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
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
tpl="$root/tests/data/chat/templates"
# family  tokenizer folder  template
families=(
  "qwen3 $root/tests/data/tokenizer/qwen3 $root/tests/data/tools/templates/Qwen-Qwen3-0.6B.jinja"
  "llama3.1 $shared/tokenizers/llama3_1 $tpl/meta-llama-Llama-3.1-8B-Instruct.jinja"
  "mistral $root/tests/data/tokenizer/mistral $tpl/mistralai-Mistral-Nemo-Instruct-2407.jinja"
  "gpt-oss $root/tests/data/tokenizer/gptoss $tpl/openai-gpt-oss-120b.jinja"
  "deepseek-v3 $root/tests/data/tokenizer/deepseek3 $tpl/deepseek-ai-DeepSeek-V3.1.jinja"
)
rc=0
for f in "${families[@]}"; do
  read -r name tok tmpl <<<"$f"
  if [ ! -f "$tok/tokenizer.json" ]; then
    echo "SKIP $name: $tok/tokenizer.json is absent (KILN_SHARED)"
    continue
  fi
  d="$dir/$name"
  mkdir -p "$d"
  # the tiny shape with the tokenizer's vocabulary (its largest id + 1) and eos
  node -e '
    const fs = require("fs"), [tok, out] = process.argv.slice(1);
    const t = JSON.parse(fs.readFileSync(tok + "/tokenizer.json")), c = JSON.parse(fs.readFileSync(tok + "/tokenizer_config.json"));
    const ids = Object.values(t.model.vocab).concat((t.added_tokens ?? []).map((a) => a.id));
    const eosName = typeof c.eos_token === "string" ? c.eos_token : c.eos_token?.content;
    const eos = (t.added_tokens ?? []).find((a) => a.content === eosName)?.id ?? t.model.vocab[eosName] ?? 2;
    fs.writeFileSync(out, JSON.stringify({ model_type: "llama", hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4,
      num_key_value_heads: 2, head_dim: 16, intermediate_size: 128, vocab_size: ids.reduce((a, b) => Math.max(a, b), 0) + 1,
      max_position_embeddings: 4096, rope_theta: 10000, rms_norm_eps: 1e-5, tie_word_embeddings: true, hidden_act: "silu",
      bos_token_id: 1, eos_token_id: eos, torch_dtype: "bfloat16" }));' "$tok" "$dir/$name.config.json" || exit 1
  "$kiln" synth --config "$dir/$name.config.json" --seed 7 --out "$d" >/dev/null || exit 1
  cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$d/"
  cp "$tmpl" "$d/chat_template.jinja"
  start_serve "$d" --alias tiny -np 2 -c 4096 -t 1
  NODE_PATH="$mods" timeout 300 node "$root/tests/e2e/agent_families.mjs" "http://127.0.0.1:$port" tiny "$name" || { rc=1; echo "kiln serve's log ($name):"; tail -40 "$d/err"; }
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  pid=""
done
[ "$rc" = 0 ] && echo "all checks passed"
exit "$rc"
