#!/usr/bin/env bash
# Runs the official `openai` and `@anthropic-ai/sdk` npm clients
# (tests/e2e/agent_clients.mjs) against a `kiln serve` of the llama oracle
# fixture with the 512-id tokenizer and Qwen3's chat template (Hermes tool
# calls, <think> blocks). Used by the unit tests (cli_serve_official_agent_clients);
# scripts/deps.sh --test installs the clients into build/tools/npm.
# Exit 77: node or a client is missing (the test is skipped).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kiln="${KILN_BIN:-$root/build/kiln}"
mods="${KILN_OPENAI_NODE_MODULES:-$root/build/tools/npm/node_modules}"
command -v node >/dev/null 2>&1 || { echo "node not found" >&2; exit 77; }
for p in openai @anthropic-ai/sdk; do
  [ -d "$mods/$p" ] || { echo "the $p npm package is not in $mods (scripts/deps.sh --test installs it)" >&2; exit 77; }
done
. "$root/tests/e2e/serve_lib.sh"
dir="$(mktemp -d)"
pid=""
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
tiny_model "$dir"
cp "$root/tests/data/tools/templates/Qwen-Qwen3-0.6B.jinja" "$dir/chat_template.jinja"
start_serve "$dir" --alias tiny -np 4 -c 1024 -t 1 --api-key sekrit
KILN_API_KEY=sekrit NODE_PATH="$mods" timeout 120 node "$root/tests/e2e/agent_clients.mjs" "http://127.0.0.1:$port" tiny
