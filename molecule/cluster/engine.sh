#!/usr/bin/env bash
# The two-node engine tp2 of molecule/cluster seen from the build machine (docker exec into
# the two lab nodes): stop a rank and wait until the whole engine is gone, time a fault.
#
#   engine.sh stop NODE       systemctl stop on NODE; then both ranks inactive (not failed) and no
#                             vLLM process (vllm-serve-lab, VLLM::*) on either node, within 60 s
#   engine.sh wrong-order     start rank 1, see it wait for rank 0, start rank 0; healthy within 180 s
#   engine.sh kill-worker     SIGKILL VLLM::Worker_TP1 on cluster-ai2; time until rank 0's /health
#                             stops answering (detected) and answers again (recovered)
set -euo pipefail
nodes=(cluster-ai1 cluster-ai2)
unit=uma-vllm@tp2.service
health=http://127.0.0.1:8100/health
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
healthy() { docker exec cluster-ai1 curl -sf -o /dev/null -m 2 "$health"; }

state() {
  local node
  for node in "${nodes[@]}"; do
    printf '%s %s %s\n' "$node" "$(docker exec "$node" systemctl show -p ActiveState --value "$unit")" \
      "$(docker exec "$node" pgrep -fc 'vllm-serve-lab|VLLM::' || true)"
  done
}

case "${1:-}" in
  stop)
    start=$(now)
    docker exec "$2" systemctl stop "$unit"
    for _ in $(seq 1 120); do
      now_state=$(state)
      if [ "$(awk '$2 == "inactive" && $3 == 0' <<<"$now_state" | wc -l)" = 2 ]; then
        echo "$now_state"
        echo "whole engine stopped in $(since "$start") s"
        exit 0
      fi
      sleep 0.5
    done
    echo "$now_state"
    exit 1
    ;;
  wrong-order)
    docker exec cluster-ai2 systemctl start "$unit"
    sleep 10
    docker exec cluster-ai2 journalctl --no-pager -u "$unit" -n 40 | grep 'waiting for rank 0'
    start=$(now)
    docker exec cluster-ai1 systemctl start "$unit"
    for _ in $(seq 1 180); do
      healthy && { echo "healthy $(since "$start") s after rank 0 started"; exit 0; }
      sleep 1
    done
    exit 1
    ;;
  kill-worker)
    healthy
    start=$(now)
    docker exec cluster-ai2 pkill -KILL -f '^VLLM::Worker_TP1'
    for _ in $(seq 1 240); do
      healthy || break
      sleep 0.5
    done
    healthy && { echo "rank 0 still answers /health $(since "$start") s after the kill"; exit 1; }
    echo "detected in $(since "$start") s"
    for _ in $(seq 1 300); do
      healthy && { echo "healthy again in $(since "$start") s"; exit 0; }
      sleep 1
    done
    exit 1
    ;;
  *)
    sed -n '2,10p' "$0" >&2
    exit 2
    ;;
esac
