#!/usr/bin/env bash
# Two "machines" on one: two network namespaces joined by a veth pair (10.77.<n>.1 and .2), one
# `trainkit launch --nnodes 2 --node-rank K --nproc 1` in each, rank 0's store on the first namespace's
# address, Gloo over the veth link. The two-node `trainkit train` must end with the same final checkpoint
# (`trainkit checkpoint` digest: model, optimizer, position, RNG) as the same 2 ranks on one machine. Then
# the store's interface: with MASTER_ADDR=127.0.0.1 it listens on loopback only, out of node 1's reach.
# Needs root (network namespaces); prints "trainkit-skip: <why>" and exits 0 where they cannot be made.
# Usage: scripts/two_nodes.sh --cli build/apps/trainkit [--data-dir DIR] [--work DIR]
set -euo pipefail
cli=""
data_dir=/usr/share/datasets/fashion-mnist
work=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cli) cli="$2"; shift 2 ;;
    --data-dir) data_dir="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "two_nodes: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$cli" ] || { echo "two_nodes: --cli must name the trainkit executable (got '$cli')" >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then echo "trainkit-skip: network namespaces need root"; exit 0; fi
command -v ip >/dev/null || { echo "trainkit-skip: no ip command (Debian: iproute2)"; exit 0; }

tag=$$
ns_a="tk-node0-$tag"
ns_b="tk-node1-$tag"
veth_a="tka$tag"
veth_b="tkb$tag"
net="10.77.$((tag % 250)).0"
addr_a="${net%.0}.1"
addr_b="${net%.0}.2"
if [ -z "$work" ]; then work=$(mktemp -d); fi
mkdir -p "$work"
cleanup() {
  ip netns pids "$ns_a" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns pids "$ns_b" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$ns_a" 2>/dev/null || true
  ip netns del "$ns_b" 2>/dev/null || true
  ip link del "$veth_a" 2>/dev/null || true
}
trap cleanup EXIT
if ! ip netns add "$ns_a" 2>"$work/netns.err"; then
  echo "trainkit-skip: cannot create a network namespace: $(cat "$work/netns.err")"
  exit 0
fi
ip netns add "$ns_b"
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

# The distributed test's tiny run (SGD, no dropout or batch norm, 2 epochs of 10 steps).
config="$work/tiny.toml"
cat > "$config" <<TOML
[data]
dir = "$data_dir"
val_size = 100
limit_train = 600
limit_test = 200
[model]
channels = [4, 8]
hidden = 16
dropout = 0.0
batch_norm = false
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[train]
epochs = 2
batch_size = 25
seed = 3
threads = 1
[log]
every_steps = 5
progress = "lines"
[distributed]
backend = "gloo"
timeout = 60
bucket_cap_mb = 0.01
TOML

newest() { ls "$1"/checkpoints/ckpt-*.tkpt | sort | tail -n 1; }
digest() { "$cli" checkpoint "$(newest "$1")" | sed 's/.*: ok, //'; }

"$cli" launch --nproc 2 --master-port 0 -- "$cli" train --config "$config" --out "$work/one_machine" \
  > "$work/one_machine.log" 2>&1 || { echo "two_nodes: the one-machine run failed:" >&2; tail -20 "$work/one_machine.log" >&2; exit 1; }

port=29600
# Each node's rank binds its Gloo pair to its namespace's veth (Gloo's GLOO_SOCKET_IFNAME); the rank-0 store
# listens on node 0's address, which node 1 reaches over the link.
ip netns exec "$ns_a" env GLOO_SOCKET_IFNAME="$veth_a" "$cli" launch --nnodes 2 --node-rank 0 --nproc 1 \
  --master-addr "$addr_a" --master-port $port -- "$cli" train --config "$config" --out "$work/two_machines" \
  > "$work/node0.log" 2>&1 &
node0=$!
# Rank 0 writes the run's files; node 1's --out is required but not compared.
ip netns exec "$ns_b" env GLOO_SOCKET_IFNAME="$veth_b" "$cli" launch --nnodes 2 --node-rank 1 --nproc 1 \
  --master-addr "$addr_a" --master-port $port -- "$cli" train --config "$config" --out "$work/node1_out" \
  > "$work/node1.log" 2>&1 || { echo "two_nodes: node 1 failed:" >&2; tail -20 "$work/node1.log" >&2; exit 1; }
wait $node0 || { echo "two_nodes: node 0 failed:" >&2; tail -20 "$work/node0.log" >&2; exit 1; }
grep -q "distributed: 2 ranks, backend gloo" "$work/node0.log" || {
  echo "two_nodes: node 0 did not train as one of 2 ranks:" >&2; tail -20 "$work/node0.log" >&2; exit 1; }

# The store listens on MASTER_ADDR's interface only: with MASTER_ADDR=127.0.0.1, node 1 cannot reach it over
# the link (nor can node 0 itself through its veth address); above, bound to node 0's veth address, it was
# reached. Rank 0 waits for a second rank that never comes; it is killed once checked.
lo_port=29601
ip netns exec "$ns_a" "$cli" launch --nnodes 2 --node-rank 0 --nproc 1 --master-addr 127.0.0.1 \
  --master-port $lo_port -- "$cli" train --config "$config" --out "$work/loopback" > "$work/loopback.log" 2>&1 &
loopback=$!
listening=""
for _ in $(seq 1 300); do  # up to 30 s: LibTorch loads first
  listening=$(ip netns exec "$ns_a" ss -Hltn "sport = :$lo_port" | awk '{print $4}')
  [ -n "$listening" ] && break
  sleep 0.1
done
reach() { ip netns exec "$1" timeout 3 bash -c "exec 3<>/dev/tcp/$2/$lo_port" 2>/dev/null; }
store_ok=1
if [ "$listening" != "127.0.0.1:$lo_port" ]; then
  echo "two_nodes: with MASTER_ADDR=127.0.0.1 the store listens on '$listening', not 127.0.0.1:$lo_port" >&2
  store_ok=0
fi
if reach "$ns_b" "$addr_a"; then
  echo "two_nodes: node 1 reached the store of MASTER_ADDR=127.0.0.1 at $addr_a:$lo_port" >&2
  store_ok=0
fi
if reach "$ns_a" "$addr_a"; then
  echo "two_nodes: node 0's veth address $addr_a:$lo_port reached the store of MASTER_ADDR=127.0.0.1" >&2
  store_ok=0
fi
kill "$loopback" 2>/dev/null || true
ip netns pids "$ns_a" 2>/dev/null | xargs -r kill 2>/dev/null || true
wait "$loopback" 2>/dev/null || true
if ((store_ok == 0)); then exit 1; fi
echo "two_nodes: the store of MASTER_ADDR=127.0.0.1 listens on $listening only; node 1 cannot reach it"

one=$(digest "$work/one_machine")
two=$(digest "$work/two_machines")
echo "two_nodes: one machine, 2 ranks: $one"
echo "two_nodes: two namespaces (node 0 $addr_a, node 1 $addr_b), 1 rank each: $two"
if [ "$one" != "$two" ]; then
  echo "two_nodes: the final checkpoints differ" >&2
  exit 1
fi
echo "two_nodes: equal"
