#!/usr/bin/env bash
# Two `kiln serve` replicas of the tiny llama fixture behind nginx on
# loopback, configured by docs/examples/nginx-kiln.conf: requests without a
# session header are spread over both, requests with one stick to one
# replica, when a replica is killed (SIGKILL) the requests still succeed on
# the other, and when the last one drains (SIGTERM) nginx answers 502/503
# at once. Used by the unit tests
# (cli_serve_replicas_behind_nginx); exit 77: nginx or curl is missing.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
kiln="${KILN_BIN:-$root/build/kiln}"
. "$root/tests/e2e/serve_lib.sh"
ngx="$(command -v nginx || echo "$root/build/tools/usr/sbin/nginx")"
[ -x "$ngx" ] || { echo "nginx not found (scripts/deps.sh --test installs it)" >&2; exit 77; }
command -v curl >/dev/null 2>&1 || { echo "curl not found" >&2; exit 77; }
a="$(mktemp -d)" b="$(mktemp -d)" n="$(mktemp -d)"
pa="" pb="" pn=""
trap 'kill $pa $pb $pn 2>/dev/null; wait $pa $pb $pn 2>/dev/null; rm -rf "$a" "$b" "$n"' EXIT
fail() { echo "FAIL: $*" >&2; cat "$n/error.log" >&2 2>/dev/null; exit 1; }
tiny_model "$a"
tiny_model "$b"
start_serve "$a" -t 1 -c 128
pa="$pid" porta="$port"
start_serve "$b" -t 1 -c 128
pb="$pid" portb="$port"

# nginx on a free port (retried: another process may take it first)
for _ in 1 2 3 4 5; do
  pport=$((20000 + RANDOM % 30000))
  sed -e "s|@DIR@|$n|g" -e "s|@PORT@|$pport|g" -e "s|@A@|$porta|g" -e "s|@B@|$portb|g" \
    "$root/docs/examples/nginx-kiln.conf" > "$n/nginx.conf"
  "$ngx" -p "$n" -c "$n/nginx.conf" -g 'daemon off;' 2>>"$n/stderr" &
  pn=$!
  for _ in $(seq 1 100); do
    curl -s -o /dev/null "http://127.0.0.1:$pport/health" && break
    kill -0 "$pn" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pn" 2>/dev/null && break
  wait "$pn" 2>/dev/null
  pn=""
done
[ -n "$pn" ] || { cat "$n/stderr" >&2; fail "nginx did not start"; }
lb="http://127.0.0.1:$pport"

served() { # requests a replica has finished
  curl -s "http://127.0.0.1:$1/metrics" | awk '/^kiln_request_success_total/ {s += $2} END {print s + 0}'
}
ask() { # ask [header]: one completion through nginx; prints the HTTP status
  curl -s -o "$n/out" -w '%{http_code}' ${1:+-H "$1"} -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}' "$lb/v1/completions"
}

# spread: 8 requests without a session header, 4 on each replica
for i in $(seq 1 8); do
  s="$(ask)"
  [ "$s" = 200 ] || fail "request $i through nginx: HTTP $s: $(cat "$n/out")"
done
ca="$(served "$porta")" cb="$(served "$portb")"
[ "$ca" -ge 3 ] && [ "$cb" -ge 3 ] && [ $((ca + cb)) -eq 8 ] || fail "8 requests were spread $ca / $cb"
echo "spread: $ca / $cb"

# affinity: 6 requests of one conversation land on one replica
for i in $(seq 1 6); do
  s="$(ask 'X-Session-ID: conversation-42')"
  [ "$s" = 200 ] || fail "session request $i: HTTP $s"
done
da=$(($(served "$porta") - ca)) db=$(($(served "$portb") - cb))
{ [ "$da" -eq 6 ] && [ "$db" -eq 0 ]; } || { [ "$da" -eq 0 ] && [ "$db" -eq 6 ]; } ||
  fail "6 requests of one session were split $da / $db"
echo "affinity: $da / $db"

# /health through nginx carries the load fields
curl -s "$lb/health" | grep -q '"slots_idle"' || fail "/health through nginx: $(curl -s "$lb/health")"

# one replica dies without warning (SIGKILL): requests go on on the other
kill -KILL "$pb"
wait "$pb" 2>/dev/null
pb=""
for i in $(seq 1 4); do
  s="$(ask)"
  [ "$s" = 200 ] || fail "request $i after replica B died: HTTP $s: $(cat "$n/out")"
done
# the last one drains (SIGTERM): new work is refused with 503 from it (the
# dead one gives 502), never a hang
kill -TERM "$pa"
s="$(timeout 30 bash -c "$(declare -f ask); lb=$lb n=$n; ask")"
case "$s" in 502 | 503) ;; *) fail "with no replica left nginx answered $s" ;; esac
wait "$pa" 2>/dev/null
pa=""
echo "all checks passed"
