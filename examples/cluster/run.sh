#!/usr/bin/env bash
# Runs a 3-node Keyline cluster on loopback in one command: three NATS
# servers with JetStream (a NATS cluster) and three keyline nodes, each
# node on its own NATS server, all started at once as a compose file or
# systemd would start them. Ctrl-C stops everything.
#
#   examples/cluster/run.sh            # state in ./cluster-data (kept between runs)
#   DATA=/tmp/kl examples/cluster/run.sh
#
# MQTT:  127.0.0.1:1883, :1884, :1885   (node-1, node-2, node-3)
# HTTP:  127.0.0.1:9883, :9884, :9885   (/metrics, /readyz, /api/v1/...)
# NATS:  127.0.0.1:4222, :4223, :4224   (cluster routes on :6222-:6224)
#
# It needs Go (it builds keyline from this repository) and curl; nats-server
# is the one on PATH, else it is built once into $DATA/bin from the version
# this repository's go.mod names.
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=${DATA:-$PWD/cluster-data}
mkdir -p "$DATA/bin"

command -v curl >/dev/null || { echo "run.sh needs curl"; exit 1; }
busy=()
for port in 1883 1884 1885 9883 9884 9885 4222 4223 4224 6222 6223 6224; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then busy+=("$port"); fi
done
if [ ${#busy[@]} -gt 0 ]; then
  echo "ports in use on 127.0.0.1: ${busy[*]} (another run.sh, a broker or a NATS server?); stop it first"
  exit 1
fi

echo "building keyline"
go build -o "$DATA/bin/keyline" .

NATS_SERVER=$(command -v nats-server || true)
if [ -z "$NATS_SERVER" ]; then
  if [ ! -x "$DATA/bin/nats-server" ]; then
    echo "building nats-server $(go list -m -f '{{.Version}}' github.com/nats-io/nats-server/v2) (once)"
    go build -o "$DATA/bin/nats-server" github.com/nats-io/nats-server/v2
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
trap 'cleanup; exit 0' INT TERM
trap cleanup EXIT

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

# The nodes start with the NATS servers: each waits (and logs what for)
# until JetStream can place its streams, up to --nats-start-timeout.
for i in 1 2 3; do
  mkdir -p "$DATA/keyline-$i"
  # Each node knows every NATS server, its own first.
  urls="nats://127.0.0.1:$((4221 + i))"
  for j in 1 2 3; do [ "$j" = "$i" ] || urls="$urls,nats://127.0.0.1:$((4221 + j))"; done
  "$DATA/bin/keyline" --node-id "node-$i" --nats "$urls" --nats-replicas 3 --nats-start-timeout 60s \
    --tcp "127.0.0.1:$((1882 + i))" --http "127.0.0.1:$((9882 + i))" \
    --data-dir "$DATA/keyline-$i" >"$DATA/keyline-$i.log" 2>&1 &
  pids+=($!)
done

echo "waiting for the nodes to be ready"
for i in 1 2 3; do
  ready=
  for _ in $(seq 1 130); do
    if curl -fs "http://127.0.0.1:$((9882 + i))/readyz" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "${pids[$((2 + i))]}" 2>/dev/null || break # the node exited
    sleep 0.5
  done
  if [ -z "$ready" ]; then
    echo "node-$i not ready; the end of $DATA/keyline-$i.log:"
    tail -n 5 "$DATA/keyline-$i.log"
    exit 1
  fi
done

cat <<MSG
3 keyline nodes up (logs in $DATA):
  node-1 mqtt 127.0.0.1:1883  http 127.0.0.1:9883
  node-2 mqtt 127.0.0.1:1884  http 127.0.0.1:9884
  node-3 mqtt 127.0.0.1:1885  http 127.0.0.1:9885
Try:
  mosquitto_sub -h 127.0.0.1 -p 1885 -t 'sensors/#' -q 1 -v &
  mosquitto_pub -h 127.0.0.1 -p 1883 -t sensors/t1 -q 1 -m 21.5
  curl -s 127.0.0.1:9884/api/v1/cluster/clients
Ctrl-C stops the cluster.
MSG
wait -n "${pids[@]}" || true
echo "a process exited; see the logs in $DATA"
