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
#   engine.sh restart R       systemctl restart of rank R's unit (an operator's restart of one rank): the
#                             other ranks restart too (exit 69) and the whole engine serves again
#   engine.sh restart-node NODE SIGNAL [WAIT_S]  NODE's container killed with SIGNAL (SIGRTMIN+3 or
#                             KILL), waited for (180 s), started again; fails if its address changed
#   engine.sh reboot R        rank R's node shut down the way systemd expects (SIGRTMIN+3 to the lab
#                             node's PID 1) and started again: the engine comes back whole by itself,
#                             with the node's cluster link firewall loaded again where it has one
#   engine.sh strangers       (the cluster link firewall on, engine running) from a third container
#                             every cluster port of either node, and every port the engine listens
#                             on in its ephemeral range, is dropped and the API answers; from
#                             rank 1's node they are not; a status request not signed with the
#                             engine's key gets 401 and rank 0's watchdog names rank 1's address;
#                             nothing restarted
#   engine.sh forged-hello    (both ranks stopped) start rank 0 alone; while it waits, a stranger's
#                             connection to its rank link is dropped and an unsigned hello + stop
#                             from rank 1's node are refused and named; rank 0 keeps waiting, rank 1
#                             starts and the engine serves within 180 s
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
# after a fault: each node's unit state and engine containers said; exactly the expected containers
# on every node (no orphan kept the name, none missing)
containers_whole() {
  local node count
  for node in "${nodes[@]}"; do
    count=$(containers "$node")
    echo "$node: $(docker exec "$node" systemctl show -p ActiveState -p UnitFileState --value "$unit" | xargs)," \
      "$count engine container(s)"
    [ "$count" = "$(expected_containers)" ]
  done
}
# each rank's systemd invocation (a new one: the rank's unit started again)
invocations() {
  local node
  for node in "${nodes[@]}"; do docker exec "$node" systemctl show -p InvocationID --value "$unit"; done
}
# NODE SIGNAL WAIT_S: the lab node's container killed with SIGNAL (SIGRTMIN+3: the clean shutdown
# systemd expects; KILL: power loss), waited for, started again, and still at the address it had.
# The engine's cluster addresses are the nodes' Docker bridge addresses when the role ran (a real
# cluster's are static); Docker hands a stopped container's address to the next container started
# (20.10: the lowest free one), so a container started on the bridge while the node is down, or one
# that left a lower address free, gives the node another address and the engine never heals.
# (tests/scenarios.txt: the scenarios that run beside this one have Docker networks of their own.)
restart_node() {
  local before after
  before=$(addr "$1")
  docker kill --signal "$2" "$1" >/dev/null
  timeout "$3" docker wait "$1" >/dev/null
  docker start "$1" >/dev/null
  after=$(addr "$1")
  [ "$after" = "$before" ] || {
    echo "$1 came back at $after, not $before: another container took its address on the Docker bridge while it was down; the engine's cluster addresses are the old ones" >&2
    return 1
  }
}
# a lab node's reboot: restart_node with the clean shutdown, in the background (the fault's clock
# runs meanwhile; fault() stops at its failure and waits for it before it returns)
reboot_node() {
  restart_node "$1" SIGRTMIN+3 180 &
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
    if [ -n "$rebooting" ] && ! kill -0 "$rebooting" 2>/dev/null; then
      wait "$rebooting" || { echo "the node's restart failed after $(since "$start") s"; return 1; }
      rebooting=
    fi
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

# the lab nodes' addresses on the Docker bridge (the engine's cluster addresses there)
addr() { docker inspect -f '{{.NetworkSettings.IPAddress}}' "$1"; }
here=$(cd "$(dirname "$0")" && pwd)
# stranger.py ARGS... inside a lab node (NODE) or a throwaway third container on the same bridge (-)
stranger() {
  local where=$1
  shift
  if [ "$where" = - ]; then
    docker run --rm -i --entrypoint python3 uma-lab/node:bookworm - "$@" <"$here/stranger.py"
  else
    docker exec -i "$where" python3 - "$@" <"$here/stranger.py"
  fi
}
# the cluster ports of engine tp2, from the rules the role wrote on rank 0's node
cluster_ports() {
  docker exec "${nodes[0]}" awk '/# engine tp2:/ {getline; print; exit}' /etc/uma-vllm/firewall.nft |
    sed -n 's/.*tcp dport { \([0-9, ]*\) }.*/\1/p' | tr -d ,
}
# the lab's tp2 uses the role's defaults: the rank link at master_port + 10, the watchdogs' status
# at + 11 (plugins/module_utils/service/firewall.py); each must be one of the rules' ports
cluster_port() {
  local all master port
  all=$(cluster_ports)
  master=${all%% *}
  case "$1" in link) port=$((master + 10)) ;; status) port=$((master + 11)) ;; esac
  grep -qw "$port" <<<"$all" || { echo "port $port ($1) is not in the rules' ports: $all" >&2; return 1; }
  echo "$port"
}
journal_since() { docker exec "$1" journalctl --no-pager -o cat -u "$2" --since "@$3"; }
# NODE: the TCP ports NODE listens on (any address or its own) inside its ephemeral range
# (ip_local_port_range): NCCL/gloo's and torch's worker sockets of the running engine
ephemeral_listeners() {
  local range
  range=$(docker exec "$1" cat /proc/sys/net/ipv4/ip_local_port_range)
  docker exec "$1" ss -ltnH | awk -v low="${range%%[[:space:]]*}" -v high="${range##*[[:space:]]}" -v own="$(addr "$1")" '
    { n = split($4, part, ":"); port = part[n]; host = substr($4, 1, length($4) - length(port) - 1)
      if (port + 0 >= low + 0 && port + 0 <= high + 0 && (host == "0.0.0.0" || host == "*" || host == "[::]" || host == own)) print port }' |
    sort -un
}
# NODE UNIT SINCE PATTERN [SECONDS]: the unit's journal lines since SINCE that match PATTERN,
# waiting up to SECONDS (10) for them (nothing printed, status 1, if none came)
journal_wait() {
  local lines
  for _ in $(seq 1 $((${5:-10} * 2))); do
    lines=$(journal_since "$1" "$2" "$3" | grep -- "$4" || true)
    [ -z "$lines" ] || { echo "$lines"; return 0; }
    sleep 0.5
  done
  return 1
}

case "${1:-}" in
  strangers)
    for node in "${nodes[@]}"; do
      docker exec "$node" nft list table inet uma_vllm >/dev/null
      docker exec "$node" systemctl is-active uma-vllm-firewall.service
    done
    read -r -a ports <<<"$(cluster_ports)"
    [ "${#ports[@]}" -ge 4 ] || { echo "no cluster ports in rank 0's firewall.nft: ${ports[*]}"; exit 1; }
    echo "cluster ports of tp2: ${ports[*]}"
    a0=$(addr "${nodes[0]}")
    a1=$(addr "${nodes[1]}")
    healthy && complete
    before=$(invocations)
    since=$(date +%s)
    targets=()
    for port in "${ports[@]}"; do targets+=("$a0:$port" "$a1:$port"); done
    # the running engine's worker sockets in each node's ephemeral range (vllm_service_firewall_ephemeral)
    mapfile -t workers0 < <(ephemeral_listeners "${nodes[0]}")
    mapfile -t workers1 < <(ephemeral_listeners "${nodes[1]}")
    echo "listening in the ephemeral range: rank 0 ${workers0[*]:-none}; rank 1 ${workers1[*]:-none}"
    [ "$((${#workers0[@]} + ${#workers1[@]}))" -gt 0 ] || { echo "no worker socket in either node's ephemeral range"; exit 1; }
    for port in "${workers0[@]}"; do targets+=("$a0:$port"); done
    for port in "${workers1[@]}"; do targets+=("$a1:$port"); done
    seen=$(stranger - probe 3 "${targets[@]}" "$a0:8100")
    echo "from a third container: $seen" | tr '\n' ' '; echo
    [ "$(grep -c ' dropped$' <<<"$seen")" = "${#targets[@]}" ] || { echo "a cluster port answered a stranger"; exit 1; }
    grep -qx "$a0:8100 open" <<<"$seen" || { echo "the API did not answer the stranger"; exit 1; }
    peer=$(stranger "${nodes[1]}" probe 3 "${ports[@]/#/$a0:}" "${workers0[@]/#/$a0:}")
    echo "from rank 1's node: $peer" | tr '\n' ' '; echo
    if grep -q ' dropped$' <<<"$peer"; then echo "rank 1's node was dropped"; exit 1; fi
    # torch.distributed's store and the watchdog's status listen on rank 0 while the engine runs
    [ "$(grep -c ' open$' <<<"$peer")" -ge 2 ] || { echo "fewer than two cluster ports open to rank 1"; exit 1; }
    forged=$(stranger "${nodes[1]}" forge-status "$a0:$(cluster_port status)")
    echo "$forged"
    [ "$(grep -c '^status 401 ' <<<"$forged")" = 2 ] || { echo "a status request without the key was answered"; exit 1; }
    named=$(journal_wait "${nodes[0]}" uma-vllm-watchdog@tp2.service "$since" "refused a status request" || true)
    echo "rank 0's watchdog: $named"
    grep -q "from $a1:" <<<"$named" || { echo "rank 0's watchdog did not name $a1"; exit 1; }
    healthy && complete
    [ "$before" = "$(invocations)" ] || { echo "a rank restarted: $before -> $(invocations)"; exit 1; }
    echo "strangers: every cluster port dropped for a third container, open to rank 1; forged status refused and named; nothing restarted"
    ;;
  forged-hello)
    a0=$(addr "${nodes[0]}")
    a1=$(addr "${nodes[1]}")
    link=$(cluster_port link)
    since=$(date +%s)
    docker exec "${nodes[0]}" systemctl start "$unit"
    journal_wait "${nodes[0]}" "$unit" "$since" 'waiting on port' 60 ||
      { echo "rank 0 did not say it waits on its rank link within 60 s"; exit 1; }
    seen=$(stranger - probe 3 "$a0:$link")
    echo "a third container to rank 0's waiting rank link: $seen"
    [ "$seen" = "$a0:$link dropped" ]
    stranger "${nodes[1]}" forge-hello "$a0:$link"
    named=$(journal_wait "${nodes[0]}" "$unit" "$since" "refused a hello as rank 1 of engine 'tp2' not signed" || true)
    echo "rank 0: $named"
    grep -q "from $a1:" <<<"$named" || { echo "rank 0 did not name $a1"; exit 1; }
    [ "$(docker exec "${nodes[0]}" systemctl show -p ActiveState --value "$unit")" = active ]
    start=$(now)
    docker exec "${nodes[1]}" systemctl start "$unit"
    for _ in $(seq 1 180); do
      if healthy && complete; then
        echo "healthy $(since "$start") s after rank 1 started; the forged hello and stop changed nothing"
        exit 0
      fi
      sleep 1
    done
    exit 1
    ;;
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
    since=$(date +%s)
    docker exec "${nodes[1]}" systemctl start "$unit"
    journal_wait "${nodes[1]}" "$unit" "$since" 'waiting for rank 0' 60 ||
      { echo "rank 1 did not say it waits for rank 0 within 60 s"; exit 1; }
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
    containers_whole
    ;;
  restart-docker)
    fault "restart-docker-rank$2" docker exec "${nodes[$2]}" systemctl restart docker.service
    ;;
  restart)
    fault "systemctl-restart-rank$2" docker exec "${nodes[$2]}" systemctl restart "$unit"
    ;;
  restart-node)
    restart_node "$2" "$3" "${4:-180}"
    ;;
  reboot)
    fault "reboot-rank$2" reboot_node "${nodes[$2]}"
    containers_whole
    # a node whose engine has the cluster link firewall gets its rules back at boot
    if [ "$(docker exec "${nodes[$2]}" systemctl is-enabled uma-vllm-firewall.service 2>/dev/null || true)" = enabled ]; then
      docker exec "${nodes[$2]}" nft list table inet uma_vllm >/dev/null ||
        { echo "${nodes[$2]}: the firewall's table is not loaded after the reboot"; exit 1; }
      echo "${nodes[$2]}: the firewall's table loaded again at boot"
    fi
    ;;
  *)
    sed -n '2,35p' "$0" >&2
    exit 2
    ;;
esac
