# Sourced by the tests/e2e runners. start_serve DIR [flags...]: runs
# `kiln serve -m DIR --port 0 flags...` in the background ($kiln), waits for
# "kiln: ready", and sets pid and port (exits 1 when it does not start).
start_serve() {
  local d="$1"
  shift
  "$kiln" serve -m "$d" --port 0 "$@" 2>"$d/err" >/dev/null &
  pid=$!
  port=""
  for _ in $(seq 1 500); do
    grep -q "kiln: ready" "$d/err" 2>/dev/null && port="$(grep -o '127.0.0.1:[0-9]*' "$d/err" | head -1 | cut -d: -f2)" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  [ -n "$port" ] || { echo "kiln serve did not start:" >&2; cat "$d/err" >&2; exit 1; }
}

# tiny_model DIR: the llama oracle fixture with the 512-id tokenizer (and its
# ChatML template) assembled in DIR.
tiny_model() {
  cp "$root"/tests/fixtures/oracle/llama/{config.json,generation_config.json} "$1"/
  cp "$root/tests/fixtures/oracle/llama/model.safetensors" "$1/model.safetensors" # weights must lie in the folder
  cp "$root"/tests/data/server/tok512/{tokenizer.json,tokenizer_config.json} "$1"/
}

# need_clients PKG...: exits 77 (the test is skipped) when node or one of the
# npm packages is not in $mods.
need_clients() {
  command -v node >/dev/null 2>&1 || { echo "node not found" >&2; exit 77; }
  for p in "$@"; do
    [ -d "$mods/$p" ] || { echo "the $p npm package is not in $mods (scripts/deps.sh --test installs it)" >&2; exit 77; }
  done
}
