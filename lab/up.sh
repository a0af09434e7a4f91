#!/usr/bin/env bash
# The two-node lab: two systemd containers ai1 and ai2 on this machine, shaped like two DGX
# Sparks (inventories/lab mirrors inventories/spark), running ONE tensor-parallel vLLM engine
# (the REAL CPU build, TP=2) over both: rank 0 on ai1 serves the API, rank 1 on ai2 runs
# headless, each as a service through site.yml.
#
#   lab/up.sh          build or reuse the lab image, the vLLM venv and the tiny model; start
#                      ai1/ai2 (kept when already running); run site.yml; print each host's
#                      planned budget, each rank's /health and one completion. Re-running changes nothing.
#   lab/up.sh --down   playbooks/restore.yml (engines, launcher, sysctls: the shared kernel gets
#                      its own vm.* values back), then remove the containers.
#   lab/up.sh --runtime container
#                      the same engine with vllm_service_runtime: container (the role's default):
#                      each node runs a Docker engine (uma-lab/node-docker:bookworm) and each rank
#                      a container of uma-lab/vllm-cpu (lab/build-engine-image.sh builds both and
#                      loads the engine image into each node; lab/runtime-container.yml).
#                      Nodes of the other runtime are replaced. The default stays native: the
#                      container runtime costs a 3.9 GB image, loaded into each node's Docker.
#   lab/up.sh [--runtime R] --nodes-only
#                      only start the nodes (and, for the container runtime, load the engine image
#                      into them); no site.yml (tests/integration/test_quickstart_live.py runs the
#                      README's own commands on them)
#   UMA_LAB_PREFIX=x-  name the node containers x-ai1, x-ai2 (a second lab on the same machine)
#   UMA_LAB_VOLUME_PREFIX=y-  the container runtime's Docker volumes y-uma-lab-ai1-docker, ...
#                      (default: UMA_LAB_PREFIX): a second lab can reuse the first one's loaded
#                      engine image, never while the first one's nodes run
#   UMA_LAB_SETUP=0    skip tests/setup.sh (a machine that is set up)
#   UMA_LAB_MODELS=0   do not mount .cache/lab/models at /models (nodes without any model, as two
#                      fresh Sparks are: the quick-start test's model comes from the stand-in Hub)
#   UMA_LAB_ENGINE_LOAD=0  (container runtime) do not load the engine image into the nodes (the
#                      quick-start test's nodes pull it from the lab registry, lab/registry.sh)
#
# Extra arguments go to ansible-playbook, e.g. lab/up.sh --check --diff.
# On a fresh machine it first runs tests/setup.sh (apt, docker engine, .venv, the collection
# link, the lab image, the vLLM venv); that step is a no-op once done.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"
image="${UMA_LAB_IMAGE:-uma-lab/node:bookworm}"
cache="$root/.cache/lab"
runtime=native
if [ "${1:-}" = --runtime ]; then
  case "${2:-}" in
    native|container) runtime=$2 ;;
    *) echo "up.sh: --runtime takes native or container, not '${2:-}'" >&2; exit 2 ;;
  esac
  shift 2
fi
nodes_only=0
if [ "${1:-}" = --nodes-only ]; then
  nodes_only=1
  shift
fi
extra=()
if [ "$runtime" = container ]; then
  image="${UMA_LAB_NODE_DOCKER_IMAGE:-uma-lab/node-docker:bookworm}"
  extra=(-e @lab/runtime-container.yml)
fi
nodes=(ai1 ai2)
# UMA_LAB_PREFIX: run the lab's node containers (and their volumes) as PREFIXai1, PREFIXai2, so a
# second lab on the same machine does not take the first one's names.
prefix="${UMA_LAB_PREFIX:-}"
volume_prefix="${UMA_LAB_VOLUME_PREFIX-$prefix}"
if [ -n "$prefix" ]; then
  # shellcheck disable=SC2016  # templated by Ansible per host
  extra+=(-e '{"ansible_host": "'"$prefix"'{{ inventory_hostname }}"}')
fi
export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$root/.cache/collections"
log() { printf '[lab] %s\n' "$*" >&2; }

case "${1:-}" in
  --help|-h) sed -n '2,31p' "$0"; exit 0 ;;
  --down) ;;
  # UMA_LAB_SETUP=0: the machine is set up already (CI, shared checkouts): skip tests/setup.sh
  *) [ "${UMA_LAB_SETUP:-1}" = 0 ] || bash tests/setup.sh ;;
esac
if [ ! -x "$root/.venv/bin/ansible-playbook" ] || ! docker info >/dev/null 2>&1; then
  echo "up.sh: no .venv or no docker engine: run 'bash tests/setup.sh' and see its errors" >&2
  exit 1
fi

running() { [ "$(docker inspect -f '{{.State.Running}}' "$1" 2>/dev/null || true)" = true ]; }
# The runtime a running node was started for (a label of the node container; none: a node of
# an older lab/up.sh, which ran only the native runtime).
node_runtime() {
  local have
  have=$(docker inspect -f '{{ index .Config.Labels "uma.lab.runtime" }}' "$1" 2>/dev/null || true)
  case "$have" in ""|"<no value>") echo native ;; *) echo "$have" ;; esac
}

down() {
  local up=()
  for node in "${nodes[@]}"; do running "$prefix$node" && up+=("$node"); done
  if [ "${#up[@]}" -gt 0 ]; then
    log "restoring ${up[*]} (playbooks/restore.yml)"
    ansible-playbook -i inventories/lab playbooks/restore.yml "${extra[@]}" --limit "$(IFS=,; echo "${up[*]}")"
  fi
  for node in "${nodes[@]}"; do docker rm -f "$prefix$node" >/dev/null 2>&1 || true; done
  log "lab removed"
}

start_node() {
  local node=$1 name=$prefix$1
  if running "$name"; then
    log "$name is running ($runtime runtime)"
    return
  fi
  docker rm -f "$name" >/dev/null 2>&1 || true
  # ai1 owns the shared kernel's live vm.* values (/proc/sys writable); ai2 only persists its
  # file (/proc/sys read-only), as in molecule/cluster.
  local cmd=() opts=(-v "$cache/vllm-venv:/opt/vllm:ro") models=(-v "$cache/models:/models:ro")
  [ "${UMA_LAB_MODELS:-1}" = 1 ] || models=()
  [ "$node" = ai1 ] || cmd=(/bin/sh -c 'mount -o remount,rw /sys && exec /lib/systemd/systemd')
  if [ "$runtime" = container ]; then
    # Docker inside the node (lab/build-engine-image.sh says why these two), its images and
    # layers on a volume of this machine's disk: on the node's own overlay root overlay2 fails
    # and Docker falls back to vfs (a full image copy per container). The volume keeps the
    # loaded engine image across lab/up.sh --down.
    opts=(--cap-add NET_ADMIN --security-opt seccomp=unconfined -v "${volume_prefix}uma-lab-$node-docker:/var/lib/docker")
  fi
  docker run -d --name "$name" --hostname "$node" --label "uma.lab.runtime=$runtime" \
    --cap-add SYS_ADMIN --security-opt apparmor=unconfined --cgroupns host \
    -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock --tmpfs /tmp \
    --shm-size 1g --stop-signal SIGRTMIN+3 \
    "${opts[@]}" "${models[@]}" \
    "$image" "${cmd[@]}" >/dev/null
  log "$name started ($runtime runtime)"
}

summary() {
  for node in "${nodes[@]}"; do
    printf '\n===== %s =====\n' "$node"
    docker exec -i "$prefix$node" python3 - <<'PY'
import glob, json, shlex, subprocess, urllib.request

def api_key(name):
    """The engine's API key from its 0600 EnvironmentFile (read as root; never printed)."""
    try:
        for line in open("/etc/uma-vllm/engines/%s.env" % name):
            if line.startswith("VLLM_API_KEY="):
                return shlex.split(line.split("=", 1)[1])[0]
    except OSError:
        pass
    return None

for path in sorted(glob.glob("/etc/uma-vllm/engines/*.json")):
    config = json.load(open(path))
    name = config["engine"]
    unit = "uma-vllm@%s.service" % name
    active = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True).stdout.strip()
    cluster = config.get("cluster")
    role = "single node" if not cluster else "rank %d of %d (%s)" % (
        cluster["rank"], cluster["nnodes"], "serves the API" if cluster["rank"] == 0 else "headless, rank 0 at %s" % cluster["head_addr"])
    try:
        with urllib.request.urlopen(config["health_url"], timeout=5) as response:
            health = "%d" % response.status
    except Exception as exc:  # noqa: BLE001
        health = "no answer (%s)" % type(exc).__name__
    if active != "active":
        print("--- engine %s, %s: %s (installed, not started)" % (name, role, active))
        continue
    print("--- engine %s, %s: %s, GET %s -> %s" % (name, role, active, config["health_url"], health))
    if not cluster or cluster["rank"] == 0:
        url = config["health_url"].rsplit("/", 1)[0] + "/v1/completions"
        body = json.dumps({"model": config["model_path"], "prompt": "The two nodes", "max_tokens": 8}).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        key = api_key(name)
        if key:
            request.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.load(response)
            print("    POST %s -> %r (%d tokens)" % (url, answer["choices"][0]["text"], answer["usage"]["completion_tokens"]))
        except Exception as exc:  # noqa: BLE001
            print("    POST %s -> failed: %s" % (url, exc))
    print((config.get("plan") or {}).get("table") or "(no plan)")
PY
  done
}

if [ "${1:-}" = --down ]; then
  down
  exit 0
fi

SECONDS=0
if [ ! -f "$cache/models/tiny-1g/config.json" ]; then
  log "writing the tiny Llama model (.cache/lab/models/tiny-1g, 4 shards, 1 GiB)"
  python lab/make_model.py --out "$cache/models/tiny-1g" --shards 4 --pad-gib 1
fi
# Nodes started for the other runtime are restored and replaced.
for node in "${nodes[@]}"; do
  if running "$prefix$node" && [ "$(node_runtime "$prefix$node")" != "$runtime" ]; then
    log "the lab runs the other runtime: replacing it"
    down
    break
  fi
done
# The node image (Docker inside) is built before any node starts from it.
[ "$runtime" = native ] || bash lab/build-engine-image.sh
for node in "${nodes[@]}"; do start_node "$node"; done
for node in "${nodes[@]}"; do
  docker exec "$prefix$node" systemctl is-system-running --wait >/dev/null || true
done
if [ "$runtime" = container ] && [ "${UMA_LAB_ENGINE_LOAD:-1}" = 1 ]; then
  load=()
  for node in "${nodes[@]}"; do load+=(--load "$prefix$node"); done
  bash lab/build-engine-image.sh "${load[@]}"
fi
if [ "$nodes_only" = 1 ]; then
  log "nodes ${nodes[*]} up in ${SECONDS} s ($runtime runtime, --nodes-only: no site.yml)"
  exit 0
fi
log "site.yml on ${nodes[*]} (the first run waits 2-4 min for the engines)"
start=$SECONDS
ansible-playbook -i inventories/lab site.yml "${extra[@]}" "$@"
log "site.yml took $((SECONDS - start)) s"
summary
log "lab up in ${SECONDS} s; the API (rank 0 on ai1): docker exec ai1 curl -s -H 'Authorization: Bearer uma-lab-key-not-secret' http://127.0.0.1:8100/v1/models"
