#!/usr/bin/env bash
# Everything the tests need, on a fresh Debian machine, idempotently:
# apt packages, a running Docker engine, the control-node venv (.venv), the
# collection linked where ansible finds it, the lab image and the vLLM venv.
#
#   tests/setup.sh            # all of it
#   tests/setup.sh --no-vllm  # skip the vLLM CPU venv (about 3 GB, 3 min)
#   tests/setup.sh --base     # only what the static checks and unit tests need (apt, dockerd, .venv)
#   tests/setup.sh --lab      # only the lab (image, vLLM venv, model); after --base
# (tests/all.sh runs --base, then --lab beside the static checks and the unit tests, which need none of it)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
want_vllm=1 want_base=1 want_lab=1
for arg in "$@"; do
  case "$arg" in
    --no-vllm) want_vllm=0 ;;
    --base) want_lab=0 ;;
    --lab) want_base=0 ;;
    *) echo "setup.sh: unknown argument '$arg' (use --no-vllm, --base, --lab or nothing)" >&2; exit 2 ;;
  esac
done
[ "$want_base" = 1 ] || [ "$want_lab" = 1 ] || { echo "setup.sh: --base and --lab exclude each other (nothing: both)" >&2; exit 2; }
log() { printf '[setup] %s\n' "$*" >&2; }
SECONDS=0

base() {
  need_apt=()
  command -v debootstrap >/dev/null || need_apt+=(debootstrap)
  command -v dockerd >/dev/null || need_apt+=(docker.io)
  command -v promtool >/dev/null || need_apt+=(prometheus)
  command -v shellcheck >/dev/null || need_apt+=(shellcheck)
  command -v nft >/dev/null || need_apt+=(nftables)  # the firewall rules' test (a private netns)
  command -v podman >/dev/null || need_apt+=(podman)  # the container runtime test runs both clients
  command -v docker-registry >/dev/null || need_apt+=(docker-registry)  # the lab's registry (lab/registry.sh)
  if [ "${#need_apt[@]}" -gt 0 ]; then
    log "apt-get install ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  fi
  # The prometheus package would start a server; the tests only want promtool.
  systemctl disable --now prometheus >/dev/null 2>&1 || pkill -x prometheus 2>/dev/null || true
  # Likewise the docker-registry package's own service (port 5000, htpasswd auth) where systemd runs:
  # the lab starts its own registry (lab/registry.sh), which a re-run of this script must not stop.
  systemctl disable --now docker-registry >/dev/null 2>&1 || true

  if ! docker info >/dev/null 2>&1; then
    log "starting dockerd"
    (dockerd >/var/log/dockerd.log 2>&1 &)
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -20 /var/log/dockerd.log >&2; exit 1; }
  fi

  py=${UMA_PYTHON:-python3}
  if [ ! -x .venv/bin/python ] || ! cmp -s tests/requirements.txt .venv/.requirements; then
    log "control-node venv (.venv)"
    "$py" -m venv .venv
    # a failed install fails the set-up (only pip's find-links warnings are filtered out)
    .venv/bin/pip install -q -r tests/requirements.txt 2> >(grep -v "^WARNING: Location" >&2)
    .venv/bin/python -c "import ansible, molecule, testinfra, psutil" # fail here, not later
    cp tests/requirements.txt .venv/.requirements
  fi

  # ansible finds the checkout as the collection uma.vllm through ansible.cfg.
  mkdir -p .cache/collections/ansible_collections/uma
  ln -sfn ../../../.. .cache/collections/ansible_collections/uma/vllm
}

lab() {
  if [ ! -x .venv/bin/python ] || ! docker info >/dev/null 2>&1; then
    echo "setup.sh --lab: no .venv or no Docker engine; run tests/setup.sh --base first" >&2
    exit 1
  fi
  local lab_args=() site
  [ "$want_vllm" = 1 ] && lab_args+=(--vllm)
  bash lab/build-image.sh "${lab_args[@]}"
  if [ "$want_vllm" = 1 ]; then
    # Lab-only additions to the vLLM venv (mounted read-only at /opt/vllm in the lab nodes):
    # `vllm serve` without the CLI's other subcommands, and the AMX start-up hook (lab/*.py say why).
    site=$(echo .cache/lab/vllm-venv/lib/python3.*/site-packages)
    install -m 0755 lab/vllm-serve-lab.py .cache/lab/vllm-venv/bin/vllm-serve-lab
    install -m 0644 lab/uma_lab_amx.py "$site/uma_lab_amx.py"
    echo "import uma_lab_amx" >"$site/uma_lab_amx.pth"
  fi
  # The lab's tiny Llama (real safetensors, 4 shards, 1 GiB), mounted at /models/tiny-1g by the lab,
  # the Molecule scenarios and the integration tests (the same command as lab/up.sh and the
  # scenarios' prepare, which keep making it when it is missing).
  if [ ! -f .cache/lab/models/tiny-1g/config.json ]; then
    log "the tiny Llama model (.cache/lab/models/tiny-1g)"
    .venv/bin/python lab/make_model.py --out .cache/lab/models/tiny-1g --shards 4 --pad-gib 1 >/dev/null
  fi
  [ "$want_vllm" = 0 ] || engine_image
}

# The container runtime's images (lab/build-engine-image.sh) and the 3.9 GB engine image pushed into
# the lab's registry (lab/registry.sh, the stand-in for nvcr.io): the quick-start test's empty nodes
# pull it from there with the role's own pull, into the lab's node volumes uma-lab-ai{1,2}-docker,
# where molecule/cluster_container and lab/up.sh --runtime container find it (build-engine-image.sh
# --load tags it, or loads it where no pull put it there). Before, this step loaded the image into
# both volumes itself: 222 s beside the unit tests (2 Dec 2026); the push took 86-90 s.
engine_image() {
  bash lab/build-engine-image.sh
  bash lab/registry.sh push "${UMA_LAB_ENGINE_IMAGE:-uma-lab/vllm-cpu:0.32.0}"
}

[ "$want_base" = 0 ] || base
[ "$want_lab" = 0 ] || lab
log "done in ${SECONDS}s"
