#!/usr/bin/env bash
# quality_table.sh: what each format costs in quality. Converts a model to
# f32, bf16, MLX q8/q6/q5/q4/q3/q2 and mlx-lm's mixed recipes with
# `kiln quantize`, measures the perplexity of a held-out text with
# `kiln perplexity` (llama.cpp's method), and prints a Markdown table.
#
#   tools/quality_table.sh [MODEL_DIR [TEXT_FILE]] > table.md
#
# Defaults: models/kiln-demo and its heldout.txt. Extra `kiln perplexity`
# flags can be given in PPL_FLAGS (e.g. PPL_FLAGS="--ctx 128"). Needs
# build/kiln (make) and jq. Takes a few minutes on 2 cores for the demo model.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/kiln-demo}
text=${2:-$model/heldout.txt}
kiln=${KILN:-build/kiln}
[ -x "$kiln" ] || { echo "build kiln first: make" >&2; exit 1; }
[ -f "$model/config.json" ] || { echo "$model: no config.json" >&2; exit 1; }
[ -f "$text" ] || { echo "$text: no such file" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name | kiln quantize flags ("" = the model as it is)
variants=(
  "f32|--dtype float32"
  "bf16|--dtype bfloat16"
  "q8|--bits 8"
  "q6|--bits 6"
  "q5|--bits 5"
  "q4|--bits 4"
  "q3|--bits 3"
  "q2|--bits 2"
  "mixed_4_6|--mixed mixed_4_6"
  "mixed_3_6|--mixed mixed_3_6"
  "mixed_3_4|--mixed mixed_3_4"
  "mixed_2_6|--mixed mixed_2_6"
)

size_of() { # MiB of the weight files
  du -cb "$1"/*.safetensors | tail -1 | awk '{printf "%.2f", $1 / 1048576}'
}

rows=()
base=""
for v in "${variants[@]}"; do
  name=${v%%|*}
  flags=${v#*|}
  dir="$tmp/$name"
  # shellcheck disable=SC2086
  "$kiln" quantize -m "$model" $flags --out "$dir" > "$tmp/$name.log"
  bpw=$(grep -o '[0-9.]* bits per weight' "$tmp/$name.log" | awk '{print $1}' || true)
  [ -n "$bpw" ] || bpw=$([ "$name" = f32 ] && echo 32 || echo 16)
  echo "measuring $name ..." >&2
  # shellcheck disable=SC2086
  "$kiln" perplexity -m "$dir" -f "$text" --json ${PPL_FLAGS:-} > "$tmp/$name.json" 2> "$tmp/$name.err"
  ppl=$(jq -r '.ppl' "$tmp/$name.json")
  se=$(jq -r '.ppl_se' "$tmp/$name.json")
  [ -n "$base" ] || base=$ppl
  delta=$(awk -v p="$ppl" -v b="$base" 'BEGIN { printf "%+.2f%%", (p / b - 1) * 100 }')
  rows+=("| $name | $bpw | $(size_of "$dir") | $(printf '%.4f ± %.4f' "$ppl" "$se") | $delta |")
  info=$(jq -r '"\(.n_tokens) tokens, \(.n_chunks) chunks of \(.n_ctx), \(.n_scored) tokens scored"' "$tmp/$name.json")
done

echo "Perplexity of \`$text\` ($info; \`kiln perplexity\`, llama.cpp's method:"
echo "the second half of each chunk scored), lower is better:"
echo
echo "| format | bits/weight | weights (MiB) | perplexity ± s.e. | vs f32 |"
echo "|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
