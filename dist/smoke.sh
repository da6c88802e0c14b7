#!/usr/bin/env bash
# Smoke test of a release binary, for any architecture: runs it (under qemu-user when it is not
# this machine's, e.g. qemu-arm for armv7, qemu-aarch64 for arm64) and checks over real MQTT that it
# serves: a subscriber gets a QoS 1 publish, a Key-Shared group delivers, a retained message and a
# persistent session's queued message survive a kill -9 and restart, /metrics answers.
#
#   dist/smoke.sh dist/out/keyline-v1.0.0-linux-armv7
#
# Needs mosquitto_pub/mosquitto_sub and curl. 32-bit ARM is where unaligned 64-bit atomics panic,
# so this runs the code paths a broker takes in its first seconds, on the real instruction set.
set -euo pipefail
bin=$(realpath "$1")
case "$(file -b "$bin")" in
  *x86-64*) run=() ;;
  *aarch64*) run=(qemu-aarch64) ;;
  *ARM*) run=(qemu-arm) ;;
  *) echo "smoke: $bin: unknown architecture: $(file -b "$bin")" >&2; exit 2 ;;
esac
if [ ${#run[@]} -gt 0 ] && [ "$(uname -m)" != x86_64 ]; then run=(); fi
dir=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -rf "$dir"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mqtt=$(port) http=$(port)
start() {
  "${run[@]}" "$bin" --tcp 127.0.0.1:$mqtt --http 127.0.0.1:$http --data-dir "$dir/data" >>"$dir/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 200); do
    if curl -sf --max-time 2 "127.0.0.1:$http/readyz" >/dev/null; then return 0; fi
    if ! kill -0 $pid 2>/dev/null; then cat "$dir/log" >&2; echo "smoke: keyline exited" >&2; exit 1; fi
    sleep 0.1 # polling readiness of a child process; no event to wait on
  done
  cat "$dir/log" >&2; echo "smoke: keyline not ready within 20s" >&2; exit 1
}
# Every client call is bounded (mosquitto_sub -W, timeout for mosquitto_pub, curl --max-time): a
# broker that dies or wedges under qemu fails the smoke test with its log instead of hanging CI.
fail() { cat "$dir/log" >&2; echo "smoke: $*" >&2; exit 1; }
pub() { timeout 10 mosquitto_pub -p $mqtt "$@" || fail "mosquitto_pub $* failed"; }
expect() { # expect WANT GOT
  if [ "$1" != "$2" ]; then echo "smoke: want '$1', got '$2'" >&2; cat "$dir/log" >&2; exit 1; fi
}
"${run[@]}" "$bin" --version
start
# Sessions and groups are set up first and the publishes come after, so that nothing depends
# on a subscriber being ready in time: a persistent session keeps what is published while it is
# away, and a group keeps its log while it has no member.
mosquitto_sub -p $mqtt -i smoke-live -c -q 1 -t 'smoke/live' -E -W 10 || fail "subscribe 'smoke/live'"
mosquitto_sub -p $mqtt -i smoke-persist -c -q 1 -t 'smoke/queued' -E -W 10 || fail "subscribe 'smoke/queued'"
mosquitto_sub -p $mqtt -V 5 -t '$share/smoke/jobs/#' -q 1 -E -W 10 || fail "subscribe '$share/smoke/jobs/#'"
pub -t smoke/live -q 1 -m live
pub -V 5 -t jobs/1 -q 1 -m job -D publish user-property key k1
expect live "$(mosquitto_sub -p $mqtt -i smoke-live -c -q 1 -t 'smoke/live' -C 1 -W 10)"
expect job "$(mosquitto_sub -p $mqtt -V 5 -t '$share/smoke/jobs/#' -q 1 -C 1 -W 10)"
pub -t smoke/retained -r -q 1 -m kept
pub -t smoke/queued -q 1 -m queued
# Read whole, then searched: grep -q in a pipe would close it at the first match, and with pipefail
# curl's SIGPIPE (the scrape is larger than a pipe's buffer) fails the step.
metrics=$(curl -sf --max-time 10 "127.0.0.1:$http/metrics") || fail "GET /metrics failed"
grep -q '^keyline_messages_received_total' <<<"$metrics" || fail "/metrics has no keyline_messages_received_total"
kill -9 $pid; wait $pid 2>/dev/null || true; pid= # the crash being tested
start
expect kept "$(mosquitto_sub -p $mqtt -t smoke/retained -C 1 -W 10)"
expect queued "$(mosquitto_sub -p $mqtt -i smoke-persist -c -q 1 -t 'smoke/queued' -C 1 -W 10)"
echo "smoke: $(basename "$bin") ok"
