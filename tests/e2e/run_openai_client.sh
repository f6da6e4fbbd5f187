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
. "$root/tests/e2e/serve_lib.sh"
dir="$(mktemp -d)"
pid=""
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
tiny_model "$dir"
start_serve "$dir" --alias tiny -np 4 -c 128 -t 1
NODE_PATH="$mods" timeout 120 node "$root/tests/e2e/openai_client.mjs" "http://127.0.0.1:$port/v1" tiny
