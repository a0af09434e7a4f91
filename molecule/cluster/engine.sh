#!/usr/bin/env bash
# The two-node engine tp2 of molecule/cluster seen from the build machine (docker exec into
# the two lab nodes): stop a rank and wait until the whole engine is gone, time a fault.
#
#   engine.sh stop NODE       systemctl stop on NODE; then both ranks inactive (not failed) and no
#                             vLLM process (vllm-serve-lab, VLLM::*) on either node, within 60 s
#   engine.sh wrong-order     start rank 1, see it wait for rank 0, start rank 0; healthy within 180 s
#   engine.sh kill-worker [R] SIGKILL VLLM::Worker_TP<R> (default 1) on rank R's node; time until
#                             rank 0's /health stops answering (detected) and a completion answers
#                             again (recovered)
#   engine.sh kill-launcher R SIGKILL of rank R's launcher (the unit's main process); the same times,
#                             then exactly one engine container per node (no orphan kept the name)
#   engine.sh restart-docker R  systemctl restart docker on rank R's node under the running engine
#   engine.sh reboot R        rank R's node shut down the way systemd expects (SIGRTMIN+3 to the lab
#                             node's PID 1) and started again: the engine comes back whole by itself
#
# UMA_CLUSTER_NODES="RANK0_NODE RANK1_NODE" (default: cluster-ai1 cluster-ai2) names the nodes and
# UMA_CLUSTER_RUNTIME (default native) the runtime (molecule/cluster_container: container). `stop`
# also wants no engine container left on either node. Each fault prints one parseable line:
#   UMA-DRILL fault=NAME runtime=RUNTIME detected_s=S recovered_s=S
set -euo pipefail
read -r -a nodes <<<"${UMA_CLUSTER_NODES:-cluster-ai1 cluster-ai2}"
runtime=${UMA_CLUSTER_RUNTIME:-native}
key=uma-lab-key-not-secret
unit=uma-vllm@tp2.service
health=http://127.0.0.1:8100/health
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
healthy() { docker exec "${nodes[0]}" curl -sf -o /dev/null -m 2 "$health"; }
complete() {
  docker exec "${nodes[0]}" curl -sf -m 30 -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"model": "/models/tiny-1g", "prompt": "hello", "max_tokens": 2}' http://127.0.0.1:8100/v1/completions
}
# the engine containers on NODE (0 on a node without Docker: the native runtime)
containers() { docker exec "$1" sh -c 'if command -v docker >/dev/null; then docker ps -aq | wc -l; else echo 0; fi'; }
# a running engine's containers per node: one (the rank's) with the container runtime, none native
expected_containers() { if [ "$runtime" = container ]; then echo 1; else echo 0; fi; }
# each rank's systemd invocation (a new one: the rank's unit started again)
invocations() {
  local node
  for node in "${nodes[@]}"; do docker exec "$node" systemctl show -p InvocationID --value "$unit"; done
}
# a lab node's reboot: a clean shutdown (SIGRTMIN+3 to its systemd), then the node started again in
# the background (the fault's clock runs meanwhile; fault() waits for it before it returns)
reboot_node() {
  docker kill --signal SIGRTMIN+3 "$1" >/dev/null
  (timeout 180 docker wait "$1" >/dev/null && docker start "$1" >/dev/null) &
  rebooting=$!
}
rebooting=
# time a fault: NAME CMD...: detected = rank 0's /health stops answering, recovered = /health and a
# completion answer again, every rank started again (the whole engine restarted)
fault() {
  local name=$1 start detected recovered before
  shift
  healthy && complete
  before=$(invocations)
  start=$(now)
  "$@"
  for _ in $(seq 1 240); do
    healthy || break
    sleep 0.5
  done
  healthy && { echo "rank 0 still answers /health $(since "$start") s after the fault"; return 1; }
  detected=$(since "$start")
  echo "detected in $detected s"
  for _ in $(seq 1 300); do
    if healthy && complete; then
      recovered=$(since "$start")
      if [ -n "$(comm -12 <(sort <<<"$before") <(invocations | sort))" ]; then
        echo "not every rank restarted: invocations $before -> $(invocations)"
        return 1
      fi
      echo "healthy again (completion answered) in $recovered s"
      [ -z "$rebooting" ] || wait "$rebooting"
      echo "UMA-DRILL fault=$name runtime=$runtime detected_s=$detected recovered_s=$recovered"
      return 0
    fi
    sleep 1
  done
  return 1
}

state() {
  local node
  for node in "${nodes[@]}"; do
    printf '%s %s %s %s\n' "$node" "$(docker exec "$node" systemctl show -p ActiveState --value "$unit")" \
      "$(docker exec "$node" pgrep -fc 'vllm-serve-lab|VLLM::' || true)" "$(containers "$node")"
  done
}

case "${1:-}" in
  stop)
    start=$(now)
    docker exec "$2" systemctl stop "$unit"
    for _ in $(seq 1 120); do
      now_state=$(state)
      if [ "$(awk '$2 == "inactive" && $3 == 0 && $4 == 0' <<<"$now_state" | wc -l)" = 2 ]; then
        echo "$now_state"
        echo "whole engine stopped in $(since "$start") s"
        echo "UMA-DRILL fault=systemctl-stop-$2 runtime=$runtime detected_s=0 recovered_s=$(since "$start")"
        exit 0
      fi
      sleep 0.5
    done
    echo "$now_state"
    exit 1
    ;;
  wrong-order)
    docker exec "${nodes[1]}" systemctl start "$unit"
    sleep 10
    docker exec "${nodes[1]}" journalctl --no-pager -u "$unit" -n 40 | grep 'waiting for rank 0'
    start=$(now)
    docker exec "${nodes[0]}" systemctl start "$unit"
    for _ in $(seq 1 180); do
      healthy && { echo "healthy $(since "$start") s after rank 0 started"; exit 0; }
      sleep 1
    done
    exit 1
    ;;
  kill-worker)
    rank=${2:-1}
    fault "kill-worker-rank$rank" docker exec "${nodes[$rank]}" pkill -KILL -f "^VLLM::Worker_TP$rank"
    ;;
  kill-launcher)
    main=$(docker exec "${nodes[$2]}" systemctl show -p MainPID --value "$unit")
    fault "kill-launcher-rank$2" docker exec "${nodes[$2]}" kill -KILL "$main"
    for node in "${nodes[@]}"; do
      echo "$node: $(containers "$node") engine container(s)"
      [ "$(containers "$node")" = "$(expected_containers)" ]
    done
    ;;
  restart-docker)
    fault "restart-docker-rank$2" docker exec "${nodes[$2]}" systemctl restart docker.service
    ;;
  reboot)
    fault "reboot-rank$2" reboot_node "${nodes[$2]}"
    for node in "${nodes[@]}"; do
      echo "$node: $(docker exec "$node" systemctl show -p ActiveState -p UnitFileState --value "$unit" | xargs)," \
        "$(containers "$node") engine container(s)"
      [ "$(containers "$node")" = "$(expected_containers)" ]
    done
    ;;
  *)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
