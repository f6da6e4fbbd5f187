#!/usr/bin/env bash
# Installs kiln's Debian build dependencies when they are missing.
set -euo pipefail
pkgs=(build-essential libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libblis-serial-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "kiln: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
