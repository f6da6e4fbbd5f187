#!/usr/bin/env bash
# Runs tests/e2e/embed_clients.mjs (the official `openai` client's
# embeddings.create, fetch for /v1/rerank) against two `kiln serve`s: the
# gemma3_embed fixture and the bert_rerank cross-encoder of
# tests/fixtures/embed, each with the 512-id tokenizer. Used by the unit
# tests (cli_serve_embeddings_and_rerank); exit 77: node or the client is
# missing (the test is skipped).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kiln="${KILN_BIN:-$root/build/kiln}"
mods="${KILN_OPENAI_NODE_MODULES:-$root/build/tools/npm/node_modules}"
. "$root/tests/e2e/serve_lib.sh"
need_clients openai
emb="$(mktemp -d)" rer="$(mktemp -d)"
pid="" pid2=""
trap 'kill $pid $pid2 2>/dev/null; wait $pid $pid2 2>/dev/null; rm -rf "$emb" "$rer"' EXIT
cp -r "$root/tests/fixtures/embed/gemma3_embed/." "$emb/"
cp -r "$root/tests/fixtures/embed/bert_rerank/." "$rer/"
for d in "$emb" "$rer"; do cp "$root"/tests/data/server/tok512/{tokenizer.json,tokenizer_config.json} "$d"/; done
start_serve "$rer" -t 1 -c 128
pid2="$pid" rport="$port"
start_serve "$emb" -t 1 -c 128
NODE_PATH="$mods" timeout 120 node "$root/tests/e2e/embed_clients.mjs" "http://127.0.0.1:$port" "http://127.0.0.1:$rport" "$emb"
