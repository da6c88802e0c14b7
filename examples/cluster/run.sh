#!/usr/bin/env bash
# Runs a 3-node Keyline cluster on loopback in one command: three NATS
# servers with JetStream (a NATS cluster) and three keyline nodes, each
# node on its own NATS server. Ctrl-C stops everything.
#
#   examples/cluster/run.sh            # state in ./cluster-data (kept between runs)
#   DATA=/tmp/kl examples/cluster/run.sh
#
# MQTT:  127.0.0.1:1883, :1884, :1885   (node-1, node-2, node-3)
# HTTP:  127.0.0.1:9883, :9884, :9885   (/metrics, /readyz, /api/v1/...)
# NATS:  127.0.0.1:4222, :4223, :4224   (cluster routes on :6222-:6224)
#
# It needs Go (it builds keyline from this repository) and nats-server: the
# one on PATH, else it builds v2.15.2 with `go install` (through the Go
# module proxy) into $DATA/bin.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-$PWD/cluster-data}
NATS_VERSION=v2.15.2
mkdir -p "$DATA/bin"

echo "building keyline"
go build -o "$DATA/bin/keyline" .

NATS_SERVER=$(command -v nats-server || true)
if [ -z "$NATS_SERVER" ]; then
  if [ ! -x "$DATA/bin/nats-server" ]; then
    echo "building nats-server $NATS_VERSION (once)"
    GOBIN="$DATA/bin" go install "github.com/nats-io/nats-server/v2@$NATS_VERSION"
  fi
  NATS_SERVER="$DATA/bin/nats-server"
fi

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo "stopping"
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup INT TERM EXIT

routes="nats-route://127.0.0.1:6222,nats-route://127.0.0.1:6223,nats-route://127.0.0.1:6224"
for i in 1 2 3; do
  mkdir -p "$DATA/nats-$i"
  # sync_interval: always makes JetStream fsync before it acknowledges, as
  # keyline's --fsync does for bbolt; the default (2 min) acknowledges
  # writes a power loss can lose. It costs about 5x on synchronous R3 writes.
  cat > "$DATA/nats-$i.conf" <<CONF
server_name: n$i
listen: 127.0.0.1:$((4221 + i))
jetstream { store_dir: "$DATA/nats-$i", sync_interval: always }
cluster { name: keyline, listen: 127.0.0.1:$((6221 + i)), routes: [$routes] }
CONF
  "$NATS_SERVER" -c "$DATA/nats-$i.conf" >"$DATA/nats-$i.log" 2>&1 &
  pids+=($!)
done

for i in 1 2 3; do
  mkdir -p "$DATA/keyline-$i"
  # Each node knows every NATS server, its own first.
  urls="nats://127.0.0.1:$((4221 + i))"
  for j in 1 2 3; do [ "$j" = "$i" ] || urls="$urls,nats://127.0.0.1:$((4221 + j))"; done
  "$DATA/bin/keyline" --node-id "node-$i" --nats "$urls" \
    --tcp "127.0.0.1:$((1882 + i))" --http "127.0.0.1:$((9882 + i))" \
    --data-dir "$DATA/keyline-$i" >"$DATA/keyline-$i.log" 2>&1 &
  pids+=($!)
done

echo "waiting for the nodes to be ready"
for i in 1 2 3; do
  for _ in $(seq 1 120); do
    if curl -fs "http://127.0.0.1:$((9882 + i))/readyz" >/dev/null 2>&1; then break; fi
    sleep 0.5
  done
  curl -fs "http://127.0.0.1:$((9882 + i))/readyz" >/dev/null || { echo "node-$i not ready; see $DATA/keyline-$i.log"; exit 1; }
done

cat <<MSG
3 keyline nodes up (logs in $DATA):
  node-1 mqtt 127.0.0.1:1883  http 127.0.0.1:9883
  node-2 mqtt 127.0.0.1:1884  http 127.0.0.1:9884
  node-3 mqtt 127.0.0.1:1885  http 127.0.0.1:9885
Try:
  mosquitto_sub -h 127.0.0.1 -p 1885 -t 'sensors/#' -v &
  mosquitto_pub -h 127.0.0.1 -p 1883 -t sensors/t1 -q 1 -m 21.5
  curl -s 127.0.0.1:9884/api/v1/cluster/clients
Ctrl-C stops the cluster.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; see the logs in $DATA"
