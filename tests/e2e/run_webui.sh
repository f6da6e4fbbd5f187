#!/usr/bin/env bash
# Drives the chat page `kiln serve` serves at / in headless Chromium
# (tests/e2e/webui.mjs: Debian's chromium driven by npm's playwright-core,
# which scripts/deps.sh --test pins into build/tools/npm) against
# three servers: the demo model (slowed per step so that a reply streams
# visibly and can be stopped), the qwen2_vl fixture (images) and the llama
# fixture with DeepSeek-R1's template and --reasoning-budget 3 behind an API
# key (reasoning_content, then content). Used by the unit tests
# (cli_serve_webui_chromium); scripts/deps.sh --test installs chromium and
# playwright-core. Screenshots go to build/webui-test/.
# Exit 77: node, chromium or playwright-core is missing (the test is skipped).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kiln="${KILN_BIN:-$root/build/kiln}"
chromium="${KILN_CHROMIUM:-/usr/bin/chromium}"
modules="${KILN_NPM_MODULES:-$root/build/tools/npm/node_modules}"
command -v node >/dev/null 2>&1 || { echo "node not found" >&2; exit 77; }
[ -x "$chromium" ] || { echo "$chromium not found (Debian's chromium; scripts/deps.sh --test installs it)" >&2; exit 77; }
[ -f "$modules/playwright-core/package.json" ] || { echo "$modules/playwright-core not found (npm's playwright-core; scripts/deps.sh --test installs it)" >&2; exit 77; }
. "$root/tests/e2e/serve_lib.sh"
dir="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$dir"' EXIT
mkdir "$dir/demo" "$dir/vlm" "$dir/think"
cp "$root"/models/kiln-demo/{config.json,generation_config.json,model.safetensors,tokenizer.json,tokenizer_config.json} "$dir/demo/"
cp "$root"/tests/fixtures/vlm/qwen2_vl/{config.json,generation_config.json,model.safetensors,preprocessor_config.json} "$dir/vlm/"
cp "$root"/tests/data/server/vlm_qwen/{tokenizer.json,tokenizer_config.json} "$dir/vlm/"
tiny_model "$dir/think"
cp "$root/tests/data/chat/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja" "$dir/think/chat_template.jinja"
# 20 ms per engine step: a 40-token reply takes about a second to stream
KILN_SERVE_STEP_DELAY_US=20000 start_serve "$dir/demo" --alias kiln-demo -np 2 -t 1
pids+=("$pid"); demo_port=$port
start_serve "$dir/vlm" --alias tiny-vl -np 1 -c 2048 -t 1
pids+=("$pid"); vlm_port=$port
start_serve "$dir/think" --alias tiny-r1 -np 1 -c 1024 -t 1 --reasoning-budget 3 --api-key sekrit
pids+=("$pid"); think_port=$port
mkdir -p "$root/build/webui-test"
timeout 90 node "$root/tests/e2e/webui.mjs" --chromium "$chromium" --modules "$modules" \
  --demo "http://127.0.0.1:$demo_port" --vlm "http://127.0.0.1:$vlm_port" --think "http://127.0.0.1:$think_port" \
  --key sekrit --image "$root/tests/fixtures/vlm/qwen2_vl/image.png" --shots "$root/build/webui-test"
