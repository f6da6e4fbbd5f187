#!/usr/bin/env bash
# Installs kiln's Debian dependencies when they are missing.
#   scripts/deps.sh          what building kiln needs
#   scripts/deps.sh --test   plus what the tests use:
#                            mlir-opt (checks the StableHLO printer; with
#                            mlir-cpu-runner, the MLIR backend), MLIR's C
#                            API (libmlir-16-dev: the backend's in-process
#                            ExecutionEngine, build/libkiln-mlir.so) and
#                            promtool (checks /metrics; only its binary is
#                            extracted into build/tools) and, when npm is
#                            there, the official openai and @anthropic-ai/sdk
#                            clients (build/tools/npm), nginx (its binary
#                            alone, into build/tools: the replicas test),
#                            chromium with npm's playwright-core (the chat
#                            page's browser test) and mpirun (openmpi-bin: the
#                            tensor-parallel tests)
set -euo pipefail
test_deps=false
[ "${1:-}" = "--test" ] && test_deps=true
pkgs=(build-essential libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libblis-serial-dev libpng-dev libjpeg62-turbo-dev libgif-dev libwebp-dev libedit-dev libcurl4-openssl-dev libssl-dev libopenmpi-dev)
$test_deps && pkgs+=(mlir-16-tools libmlir-16-dev curl chromium openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "kiln: installing ${missing[*]}" >&2
  # wait for another apt (unattended upgrades, a parallel install) instead of failing
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
fi
$test_deps || exit 0

root="$(cd "$(dirname "$0")/.." && pwd)"
# extract_tool PKG PATH WHAT: one binary (PATH inside the package, e.g.
# ./usr/bin/promtool) from Debian's package PKG into build/tools, without the
# package's other dependencies or its service; without it WHAT is skipped.
extract_tool() {
  local pkg="$1" path="$2" what="$3" tmp
  command -v "$(basename "$path")" >/dev/null 2>&1 && return 0
  [ -x "$root/build/tools/${path#./}" ] && return 0
  tmp="$(mktemp -d)"
  if (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1); then
    mkdir -p "$root/build/tools"
    dpkg-deb --fsys-tarfile "$tmp"/"$pkg"_*.deb | tar -x -C "$root/build/tools" "$path" \
      && echo "kiln: $(basename "$path") extracted to build/tools/$(dirname "${path#./}")" >&2
  else
    echo "kiln: $(basename "$path") unavailable (apt-get download $pkg failed): $what is skipped" >&2
  fi
  rm -rf "$tmp"
}
# promtool lints /metrics; nginx (installing its package would start a
# system service on port 80) fronts the replicas test
extract_tool prometheus ./usr/bin/promtool "the /metrics lint test"
extract_tool nginx ./usr/sbin/nginx "the replicas-behind-nginx test"

# The official openai and Anthropic clients (and ajv with ajv-formats, the
# validator of the structured-output and tool-call tests) for the end-to-end server
# tests, when npm is there; without them those tests are skipped. Pinned to
# versions that declare no minimum Node.js (openai 7 needs Node 22, newer than
# Debian 12's nodejs 18); checked on Node 20.
npm_dir="$root/build/tools/npm/node_modules"
# playwright-core 1.57.0 (Node >= 18) drives Debian's chromium for the chat
# page's test; it downloads no browser.
# A marker naming the pins is written after a complete install, so an
# install that was cut short (its folders there, files missing) is redone.
npm_pins="openai@6.49.0 @anthropic-ai/sdk@1.15.0 playwright-core@1.57.0 ajv@8.20.0 ajv-formats@3.0.1"
npm_mark="$root/build/tools/npm/.kiln-installed"
if command -v npm >/dev/null 2>&1 && [ "$(cat "$npm_mark" 2>/dev/null)" != "$npm_pins" ]; then
  rm -rf "$npm_dir" "$npm_mark"
  # shellcheck disable=SC2086 # the pins are separate words
  if timeout 300 npm install --prefix "$root/build/tools/npm" --no-audit --no-fund --silent $npm_pins >/dev/null 2>&1; then
    echo "$npm_pins" > "$npm_mark"
    echo "kiln: openai, @anthropic-ai/sdk, playwright-core and ajv installed in build/tools/npm" >&2
  else
    echo "kiln: npm install openai @anthropic-ai/sdk playwright-core ajv failed: the official client and chat page tests are skipped" >&2
  fi
fi
