#!/usr/bin/env bash
# Runs the official `openai` npm client (tests/e2e/openai_client.mjs) against
# a `kiln serve` of the llama oracle fixture with a 512-id tokenizer and a
# ChatML template. Used by the unit tests (cli_serve_official_openai_client);
# scripts/deps.sh --test installs the client into build/tools/npm.
# Exit 77: node or the client is missing (the test is skipped).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kiln="${KILN_BIN:-$root/build/kiln}"
mods="${KILN_OPENAI_NODE_MODULES:-$root/build/tools/npm/node_modules}"
command -v node >/dev/null 2>&1 || { echo "node not found" >&2; exit 77; }
[ -d "$mods/openai" ] || { echo "the openai npm package is not in $mods (scripts/deps.sh --test installs it)" >&2; exit 77; }
dir="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
cp "$root"/tests/fixtures/oracle/llama/{config.json,generation_config.json} "$dir"/
cp "$root/tests/fixtures/oracle/llama/model.safetensors" "$dir/model.safetensors"
cp "$root"/tests/data/server/tok512/{tokenizer.json,tokenizer_config.json} "$dir"/
"$kiln" serve -m "$dir" --alias tiny --port 0 -np 4 -c 128 -t 1 2>"$dir/err" >/dev/null &
pid=$!
port=""
for _ in $(seq 1 500); do
  grep -q "kiln: ready" "$dir/err" 2>/dev/null && port="$(grep -o '127.0.0.1:[0-9]*' "$dir/err" | head -1 | cut -d: -f2)" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.02
done
[ -n "$port" ] || { echo "kiln serve did not start:" >&2; cat "$dir/err" >&2; exit 1; }
NODE_PATH="$mods" timeout 120 node "$root/tests/e2e/openai_client.mjs" "http://127.0.0.1:$port/v1" tiny
