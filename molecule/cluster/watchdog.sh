#!/usr/bin/env bash
# The engine watchdog (uma-vllm-watchdog@tp2) on the two-node engine tp2 of molecule/cluster, seen
# from the build machine (docker exec). Each fault prints what it measured; exit 1 = not healed.
#
#   watchdog.sh wedge         SIGSTOP VLLM::EngineCore on rank 0 (/health still 200): the watchdog
#                             restarts the whole engine; time to its decision and to a completion again
#   watchdog.sh wedge-rank1   SIGSTOP VLLM::Worker_TP1 on rank 1: decided by rank 0's watchdog within 15 s
#                             of rank 1's watchdog's first failed observation (issue 19), whole restart
#   watchdog.sh kill-worker   SIGKILL VLLM::Worker_TP1 on rank 1: left to the rank link (exit 69,
#                             systemd), recorded by the watchdog, no second restart by it
#   watchdog.sh never-start   (both ranks stopped, e.g. by engine.sh stop) rank 0's vLLM can never
#                             start (a missing VLLM_LOGGING_CONFIG_PATH): bounded attempts, then both
#                             ranks stopped, GAVE_UP in systemctl status
#   watchdog.sh recover       undo never-start: operator start of both ranks, healthy again
#   watchdog.sh load SECONDS  3 clients generating for SECONDS: 0 restarts, 0 wedges
#   watchdog.sh floor-fake    the watchdog reads a fake proc root: warning floor -> the model's
#                             shards evicted; critical floor -> graceful whole-engine restart
#   watchdog.sh floor-hog     a real memory hog (systemd-run MemoryMax, 1 GiB) on cluster-ai1 under
#                             floors set just below MemAvailable: evicted while the hog lives, no OOM kill
#   watchdog.sh fresh         a fresh restart window on both nodes: watchdogs restarted, the units'
#                             start limit reset (the lab's faults follow each other within minutes)
#   watchdog.sh healed-series [N] [GAP]  (the lab converged with a short
#                             vllm_service_watchdog_healthy_reset_s, below GAP) N faults (default 5)
#                             left to the rank link (SIGKILL of VLLM::Worker_TP1: exit 69, systemd's
#                             Restart=), each healed and followed by GAP s (default 80) of serving:
#                             more starts than the unit's StartLimitBurst, every one healed, each gap
#                             ending with both watchdogs' budget-reset that cleared systemd's limit
#   WD_FAULT_ONLY=1           (benchmarks) skip the checks, print only the times
#   UMA_CLUSTER_NODES="RANK0_NODE RANK1_NODE" (default: cluster-ai1 cluster-ai2), UMA_CLUSTER_RUNTIME
#                             (default native): the nodes and the runtime (molecule/cluster_container)
# The wedges also print one parseable line (detected: the watchdog's decision, from its events):
#   UMA-DRILL fault=NAME runtime=RUNTIME detected_s=S recovered_s=S
set -euo pipefail
read -r ai1 ai2 <<<"${UMA_CLUSTER_NODES:-cluster-ai1 cluster-ai2}"
runtime=${UMA_CLUSTER_RUNTIME:-native}
unit=uma-vllm@tp2.service
wd=uma-vllm-watchdog@tp2.service
records=/var/lib/uma-vllm/watchdog/tp2
key=uma-lab-key-not-secret
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
healthy() { docker exec "$ai1" curl -sf -o /dev/null -m 2 http://127.0.0.1:8100/health; }
complete() {
  docker exec "$ai1" curl -sf -m 30 -o /dev/null -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d '{"model": "/models/tiny-1g", "prompt": "hello", "max_tokens": 2}' http://127.0.0.1:8100/v1/completions
}
# events of the watchdog on NODE since EPOCH with ACTION: their JSON lines
events() {
  docker exec "$1" python3 -c '
import json, sys
try:
    events = json.load(open(sys.argv[1] + "/events.json"))
except (OSError, ValueError):
    events = []
for e in events:
    if e["epoch_s"] >= float(sys.argv[2]) and e["action"] == sys.argv[3]:
        print(json.dumps(e, sort_keys=True))' "$records" "$2" "$3"
}
count() { events "$@" | wc -l; }
phase() { docker exec "$1" python3 -c 'import json,sys; print(json.load(open(sys.argv[1] + "/state.json"))["phase"])' "$records"; }
wait_for() { # SECONDS CMD...: poll every 0.5 s
  local limit=$1
  shift
  local end
  end=$(echo "$(now) + $limit" | bc)
  until "$@"; do
    if [ "$(echo "$(now) > $end" | bc)" = 1 ]; then return 1; fi
    sleep 0.5
  done
}
wait_healthy_completion() { wait_for "$1" bash -c "$(declare -f healthy complete); ai1=$ai1 key=$key; healthy && complete"; }
has_event() { [ "$(count "$@")" -ge 1 ]; }
# a fresh restart window on both nodes (the lab's faults follow each other within minutes, each
# node's faults in the field hours apart): the watchdogs restarted (their budget of restarts) and the
# engine units' start limit reset (systemd's own: StartLimitBurst starts per StartLimitIntervalSec)
# (fresh stopped: of a stopped engine, whose watchdogs then say "stopped")
fresh() {
  local phase=${1:-healthy}
  docker exec "$ai1" systemctl reset-failed "$unit"
  docker exec "$ai2" systemctl reset-failed "$unit"
  docker exec "$ai1" systemctl restart "$wd"
  docker exec "$ai2" systemctl restart "$wd"
  wait_for 30 bash -c "[ \"\$(docker exec $ai1 python3 -c 'import json; print(json.load(open(\"$records/state.json\"))[\"phase\"])')\" = $phase ]"
}
oom_kills() { awk '$1 == "oom_kill" {print $2}' /proc/vmstat; }
decided() { python3 -c 'import json,sys; e=json.loads(sys.stdin.readline()); print(round(e["evidence"]["decided_at_epoch_s"] - float(sys.argv[1]), 2))' "$1"; }

case "${1:-}" in
  fresh)
    fresh
    ;;
  healed-series)
    n=${2:-5}
    gap=${3:-80}
    wait_healthy_completion 120
    fresh
    burst=$(docker exec "$ai1" systemctl show -p StartLimitBurst --value "$unit")
    echo "StartLimitBurst $burst per $(docker exec "$ai1" systemctl show -p StartLimitIntervalUSec --value "$unit")"
    for i in $(seq 1 "$n"); do
      t0=$(now)
      docker exec "$ai2" pkill -KILL -f '^VLLM::Worker_TP1'
      wait_for 60 has_event "$ai1" "$t0" systemd-restart || { echo "fault $i: the watchdog saw no systemd restart"; exit 1; }
      if ! wait_healthy_completion 300; then
        for node in "$ai1" "$ai2"; do
          echo "$node: $(docker exec "$node" systemctl show -p ActiveState -p Result --value "$unit" | xargs)"
        done
        echo "fault $i: not healthy again"
        exit 1
      fi
      echo "fault $i: healthy again (completion answered) in $(since "$t0") s"
      sleep "$gap"
      for node in "$ai1" "$ai2"; do
        reset=$(events "$node" "$t0" budget-reset | grep "\"start_limit_reset\": \"$unit\"" | head -1)
        [ -n "$reset" ] || { echo "fault $i: no budget-reset clearing systemd's start limit on $node"; exit 1; }
        echo "fault $i: $node $(python3 -c 'import json,sys; e=json.loads(sys.stdin.readline()); print(e["reason"], e["evidence"])' <<<"$reset")"
      done
    done
    echo "healed-series: $n faults (StartLimitBurst $burst), every one healed, each followed by a start-limit reset on both nodes"
    ;;
  wedge)
    wait_healthy_completion 120
    fresh
    t0=$(now)
    docker exec "$ai1" pkill -STOP -f '^VLLM::EngineCore'
    sleep 1
    healthy && echo "rank 0 /health still 200 after the SIGSTOP"
    wait_for 240 has_event "$ai1" "$t0" restart || { echo "no restart by the watchdog"; exit 1; }
    events "$ai1" "$t0" restart | head -1 | tee /dev/stderr | grep -q 'is stopped (state T)'
    detected=$(events "$ai1" "$t0" restart | head -1 | decided "$t0")
    echo "detected (restart decided) $detected s after the SIGSTOP"
    wait_healthy_completion 300 || { echo "not healthy again"; exit 1; }
    recovered=$(since "$t0")
    echo "healthy again (completion answered) in $recovered s"
    echo "UMA-DRILL fault=sigstop-rank0 runtime=$runtime detected_s=$detected recovered_s=$recovered"
    [ "$(docker exec "$ai1" ps -eo stat= | grep -c '^T' || true)" = 0 ]
    # the peer carried the epoch out (stop, start) on its own unit
    has_event "$ai2" "$t0" peer-stop && has_event "$ai2" "$t0" peer-start
    echo "rank 1 followed: peer-stop, peer-start"
    ;;
  wedge-rank1)
    wait_healthy_completion 120
    fresh
    t0=$(now)
    docker exec "$ai2" pkill -STOP -f '^VLLM::Worker_TP1'
    wait_for 240 has_event "$ai1" "$t0" restart || { echo "no restart by the watchdog"; exit 1; }
    events "$ai1" "$t0" restart | head -1 | tee /dev/stderr | grep -q 'is stopped (state T)'
    # rank 1's watchdog saw it first (its phase record healthy -> suspect), rank 0 decided the restart
    seen=$(events "$ai2" "$t0" phase | grep 'is stopped' | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["epoch_s"])')
    decided=$(events "$ai1" "$t0" restart | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["evidence"]["decided_at_epoch_s"])')
    echo "rank 1 saw the stopped worker $(echo "$seen - $t0" | bc) s after the SIGSTOP; rank 0 decided the restart $(echo "$decided - $t0" | bc) s after it, $(echo "$decided - $seen" | bc) s after the first failed observation"
    [ "$(echo "$decided - $seen <= 15" | bc)" = 1 ] || { echo "not within 15 s of the first failed observation"; exit 1; }
    wait_healthy_completion 300 || { echo "not healthy again"; exit 1; }
    recovered=$(since "$t0")
    echo "healthy again (completion answered) in $recovered s"
    echo "UMA-DRILL fault=sigstop-rank1 runtime=$runtime detected_s=$(echo "$decided - $t0" | bc) recovered_s=$recovered"
    [ "$(docker exec "$ai2" ps -eo stat= | grep -c '^T' || true)" = 0 ]
    has_event "$ai2" "$t0" peer-stop && has_event "$ai2" "$t0" peer-start
    echo "rank 1 followed: peer-stop, peer-start"
    ;;
  kill-worker)
    wait_healthy_completion 120
    fresh
    t0=$(now)
    docker exec "$ai2" pkill -KILL -f '^VLLM::Worker_TP1'
    wait_for 60 has_event "$ai1" "$t0" systemd-restart || { echo "the watchdog saw no systemd restart"; exit 1; }
    events "$ai1" "$t0" systemd-restart | head -1 | grep -q 'exit status 69' || { echo "not exit status 69"; exit 1; }
    echo "rank link restart seen by the watchdog $(since "$t0") s after the kill (exit status 69)"
    wait_healthy_completion 300 || { echo "not healthy again"; exit 1; }
    echo "healthy again (completion answered) in $(since "$t0") s"
    sleep 12  # past the watchdog's fail_threshold ticks: still no restart of its own
    [ "$(count "$ai1" "$t0" restart)" = 0 ] || { echo "the watchdog restarted as well"; exit 1; }
    echo "watchdog restarts: 0 (left to the rank link)"
    ;;
  never-start)
    # from a stopped engine (molecule/cluster: engine.sh stop just before)
    for node in "$ai1" "$ai2"; do
      state=$(docker exec "$node" systemctl show -p ActiveState --value "$unit")
      [ "$state" = inactive ] || [ "$state" = failed ] ||
        { echo "never-start: $unit is $state on $node; stop the engine first (engine.sh stop $ai1)"; exit 1; }
    done
    fresh stopped
    docker exec "$ai1" mkdir -p /run/systemd/system/$unit.d
    printf '[Service]\nEnvironment=VLLM_LOGGING_CONFIG_PATH=/nonexistent/uma-lab-logging.json\n' |
      docker exec -i "$ai1" tee /run/systemd/system/$unit.d/90-never-start.conf >/dev/null
    docker exec "$ai1" systemctl daemon-reload
    t0=$(now)
    for node in "$ai1" "$ai2"; do docker exec "$node" systemctl reset-failed "$unit" || true; done
    docker exec "$ai1" systemctl start --no-block "$unit"
    docker exec "$ai2" systemctl start --no-block "$unit"
    wait_for 420 has_event "$ai1" "$t0" gave_up || { echo "the watchdog did not give up"; exit 1; }
    echo "gave up $(since "$t0") s after the first start; systemd restarts seen: $(count "$ai1" "$t0" systemd-restart)"
    wait_for 150 bash -c "[ \"\$(docker exec $ai2 python3 -c 'import json; print(json.load(open(\"$records/state.json\"))[\"phase\"])')\" = gave_up ]"
    sleep 15  # nothing starts again by itself
    for node in "$ai1" "$ai2"; do
      state=$(docker exec "$node" systemctl show -p ActiveState --value "$unit")
      procs=$(docker exec "$node" pgrep -fc 'vllm-serve-lab|VLLM::' || true)
      echo "$node: $unit $state, $procs vLLM processes, watchdog phase $(phase "$node")"
      [ "$state" = inactive ] || [ "$state" = failed ]
      [ "$procs" = 0 ]
    done
    docker exec "$ai1" systemctl status --no-pager "$wd" | grep 'Status: "GAVE_UP: gave up'
    docker exec "$ai1" grep -E '^uma_vllm_watchdog_gave_up\{engine="tp2"\} 1(\.0)?$' /var/lib/prometheus/node-exporter/uma_vllm_watchdog_tp2.prom
    docker exec "$ai1" cat $records/state.json | grep -q '"phase": "gave_up"'
    ;;
  recover)
    docker exec "$ai1" rm -f /run/systemd/system/$unit.d/90-never-start.conf
    docker exec "$ai1" systemctl daemon-reload
    t0=$(now)
    for node in "$ai1" "$ai2"; do
      docker exec "$node" systemctl reset-failed "$unit" || true
      docker exec "$node" systemctl start --no-block "$unit"
    done
    wait_healthy_completion 300 || { echo "not healthy again"; exit 1; }
    echo "started by hand: healthy in $(since "$t0") s, watchdog phase $(phase "$ai1")"
    ;;
  no-fight)
    # after `engine.sh kill-worker`: the watchdog saw the rank link's restart (exit 69) and made none of its own
    has_event "$ai1" 0 systemd-restart || { echo "no systemd restart recorded"; exit 1; }
    events "$ai1" 0 systemd-restart | python3 -c 'import json,sys; [print("recorded:", json.loads(l)["reason"]) for l in sys.stdin]'
    events "$ai1" 0 systemd-restart | grep -q 'exit status 69' || { echo "the recorded restart does not name exit status 69"; exit 1; }
    echo "watchdog records of systemd restarts: $(count "$ai1" 0 systemd-restart); its own restarts: $(count "$ai1" 0 restart)"
    [ "$(count "$ai1" 0 restart)" = 0 ]
    ;;
  load)
    seconds=${2:-120}
    wait_healthy_completion 120
    fresh
    before=$(docker exec "$ai1" cat $records/state.json)
    restarts0=$(docker exec "$ai1" systemctl show -p NRestarts --value "$unit")
    t0=$(now)
    docker exec "$ai1" bash -c '
      end=$((SECONDS + '"$seconds"'))
      for c in 1 2 3; do
        ( n=0; while [ $SECONDS -lt $end ]; do
            curl -sf -m 120 -o /dev/null -H "Authorization: Bearer '"$key"'" -H "Content-Type: application/json" \
              -d "{\"model\": \"/models/tiny-1g\", \"prompt\": \"count to a thousand\", \"max_tokens\": 200, \"ignore_eos\": true}" \
              http://127.0.0.1:8100/v1/completions && n=$((n + 1)); done; echo "$n" > /tmp/load-$c ) &
      done
      wait
      total=0; for c in 1 2 3; do total=$((total + $(cat /tmp/load-$c))); done; echo $total' >/tmp/uma-wd-load.$$
    done_requests=$(cat /tmp/uma-wd-load.$$)
    rm -f /tmp/uma-wd-load.$$
    after=$(docker exec "$ai1" cat $records/state.json)
    restarts1=$(docker exec "$ai1" systemctl show -p NRestarts --value "$unit")
    python3 - "$before" "$after" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1])["counts"], json.loads(sys.argv[2])["counts"]
print("watchdog during the load: wedges %d, restarts %d, gave_up %d" % (
    b["wedges"] - a["wedges"], b["restarts"] - a["restarts"], b["gave_up"] - a["gave_up"]))
sys.exit(0 if (b["wedges"], b["restarts"], b["gave_up"]) == (a["wedges"], a["restarts"], a["gave_up"]) else 1)
PY
    busy=$(events "$ai1" "$t0" phase | grep -c suspect || true)
    echo "load: $done_requests completions of 200 tokens in $(since "$t0") s by 3 clients; suspect ticks $busy; NRestarts $restarts0 -> $restarts1"
    [ "$restarts0" = "$restarts1" ] && [ "$done_requests" -gt 0 ]
    ;;
  floor-fake|floor-hog)
    wait_healthy_completion 120
    fake=/run/uma-wd-test
    oom0=$(oom_kills)
    avail_kib=$(docker exec "$ai1" awk '$1 == "MemAvailable:" {print $2}' /proc/meminfo)
    if [ "$1" = floor-fake ]; then
      extra='{"meminfo_root": "'$fake'/proc", "evict_every_s": 5}'
    else
      # floors just below what is available now: a 1 GiB hog crosses the warning floor only
      warn=$((avail_kib / 1024 - 512))
      extra='{"warn_floor_mib": '$warn', "critical_floor_mib": 256, "evict_every_s": 5}'
    fi
    docker exec "$ai1" mkdir -p $fake/proc/sys/vm /run/systemd/system/$wd.d
    docker exec "$ai1" python3 -c '
import json, sys
cfg = json.load(open("/etc/uma-vllm/watchdog/tp2.json"))
cfg.update(json.loads(sys.argv[1]))
json.dump(cfg, open(sys.argv[2] + "/tp2.json", "w"))' "$extra" "$fake"
    printf '[Service]\nExecStart=\nExecStart=/usr/bin/python3 -E -s /usr/local/lib/uma-vllm/uma_watchdog.py --config %s/tp2.json\n' "$fake" |
      docker exec -i "$ai1" tee /run/systemd/system/$wd.d/90-test.conf >/dev/null
    docker exec "$ai1" cp /proc/sys/vm/min_free_kbytes $fake/proc/sys/vm/min_free_kbytes
    # fake meminfo: the real one with MemAvailable (and MemFree) set to MiB
    meminfo() {
      docker exec "$ai1" python3 -c '
import sys
kib = int(sys.argv[1]) * 1024
out = []
for line in open("/proc/meminfo"):
    key = line.split(":")[0]
    out.append("%s:%15d kB\n" % (key, kib) if key in ("MemAvailable", "MemFree") else line)
open(sys.argv[2] + "/proc/meminfo.new", "w").writelines(out)' "$1" "$fake"
      docker exec "$ai1" mv $fake/proc/meminfo.new $fake/proc/meminfo
    }
    meminfo $((avail_kib / 1024))
    docker exec "$ai1" systemctl daemon-reload
    docker exec "$ai1" systemctl restart "$wd"
    floors=$(docker exec "$ai1" python3 -c 'import json; f=json.load(open("'$records'/state.json"))["floors"]; print(f["warn_bytes"] >> 20, f["critical_bytes"] >> 20)')
    read -r warn_mib crit_mib <<<"$floors"
    echo "floors in force: warning $warn_mib MiB, critical $crit_mib MiB (MemAvailable $((avail_kib / 1024)) MiB)"
    t0=$(now)
    if [ "$1" = floor-fake ]; then
      meminfo $((warn_mib - 100))
      wait_for 30 has_event "$ai1" "$t0" evict || { echo "no eviction at the warning floor"; exit 1; }
      events "$ai1" "$t0" evict | head -1 | python3 -c 'import json,sys; e=json.loads(sys.stdin.readline()); r=e["evidence"]["result"]; print("warning floor: evicted %d files (%d MiB advised) %.1f s after the fake MemAvailable fell; %s" % (r["files"], r["bytes_advised"] >> 20, e["epoch_s"] - float(sys.argv[1]), e["reason"])); sys.exit(0 if r["files"] > 0 else 1)' "$t0"
      [ "$(count "$ai1" "$t0" restart)" = 0 ]
      t1=$(now)
      meminfo $((crit_mib - 100))
      wait_for 60 bash -c "docker exec $ai1 grep -q '\"phase\": \"restart_stop\"' $records/state.json" || { echo "no restart at the critical floor"; exit 1; }
      meminfo $((avail_kib / 1024))  # back above the floors while the engine restarts
      wait_for 240 has_event "$ai1" "$t1" restart || { echo "the restart did not finish"; exit 1; }
      events "$ai1" "$t1" restart | head -1 | grep -q 'critical floor'
      echo "critical floor: graceful restart decided $(events "$ai1" "$t1" restart | head -1 | decided "$t1") s after the fake MemAvailable fell"
      wait_healthy_completion 300 || { echo "not healthy again"; exit 1; }
      echo "healthy again in $(since "$t1") s"
    else
      docker exec "$ai1" systemd-run --unit uma-lab-hog -p MemoryMax=1280M -p MemorySwapMax=0 \
        /usr/bin/python3 -c 'import time; b = bytearray(1 << 30); [b.__setitem__(i, 1) for i in range(0, len(b), 4096)]; time.sleep(120)'
      # the first eviction for MemAvailable under the warning floor (not any eviction since t0)
      mem_evict() { events "$ai1" "$t0" evict | grep MemAvailable >/dev/null; }
      wait_for 60 mem_evict || { docker exec "$ai1" systemctl stop uma-lab-hog; echo "no eviction under the hog"; exit 1; }
      events "$ai1" "$t0" evict | grep MemAvailable | head -1 | python3 -c 'import json,sys; e=json.loads(sys.stdin.readline()); r=e["evidence"]["result"]; print("hog: evicted %d files %.1f s after the hog started; %s" % (r["files"], e["epoch_s"] - float(sys.argv[1]), e["reason"])); sys.exit(0 if r["files"] > 0 else 1)' "$t0"
      hog="$(docker exec "$ai1" systemctl show -p ActiveState --value uma-lab-hog) $(docker exec "$ai1" systemctl show -p Result --value uma-lab-hog)"
      echo "hog while evicting: $hog"
      docker exec "$ai1" systemctl stop uma-lab-hog
      [ "$hog" = "active success" ]
      [ "$(count "$ai1" "$t0" restart)" = 0 ]
    fi
    docker exec "$ai1" rm -rf /run/systemd/system/$wd.d $fake
    docker exec "$ai1" systemctl daemon-reload
    docker exec "$ai1" systemctl restart "$wd"
    oom1=$(oom_kills)
    echo "kernel OOM kills during the test: $((oom1 - oom0))"
    [ "$oom1" = "$oom0" ]
    ;;
  *)
    sed -n '2,29p' "$0" >&2
    exit 2
    ;;
esac
