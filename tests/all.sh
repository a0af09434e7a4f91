#!/usr/bin/env bash
# Run every test of the collection from a fresh clone: set-up, static checks,
# unit tests, integration tests and every Molecule scenario.
#
#   tests/all.sh                      # everything (what CI runs)
#   tests/all.sh static unit          # only these stages
#   tests/all.sh molecule:node_prep   # one Molecule scenario
#
# Stages: setup static unit integration molecule[:scenario]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
stages=("$@")
[ "${#stages[@]}" -gt 0 ] || stages=(setup static unit integration molecule)
log() { printf '\n[tests] ==== %s\n' "$*" >&2; }
declare -a timings=()
run_stage() {
  local name=$1; shift
  local start=$SECONDS
  log "$name"
  "$@"
  timings+=("$(printf '%-28s %5ss' "$name" $((SECONDS - start)))")
}

export PATH="$root/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$root/ansible.cfg"
export ANSIBLE_COLLECTIONS_PATH="$root/.cache/collections"
export PYTHONPATH="$root/.cache/collections${PYTHONPATH:+:$PYTHONPATH}"
export ANSIBLE_FORCE_COLOR=0 PY_COLORS=0 ANSIBLE_NOCOLOR=1
# The tests that need the lab's vLLM venv or promtool fail (not skip) here:
# this command installs them itself.
export UMA_REQUIRE_VLLM=1 UMA_REQUIRE_TOOLS=1

# Kernel knobs are global to the machine (also from inside the containers):
# whatever a test leaves behind, the machine gets its own values back.
knobs=(/proc/sys/vm/min_free_kbytes /proc/sys/vm/vfs_cache_pressure /proc/sys/vm/dirty_ratio
       /proc/sys/vm/dirty_background_ratio /proc/sys/vm/swappiness /sys/block/*/queue/read_ahead_kb)
declare -A saved=()
for knob in "${knobs[@]}"; do
  [ -r "$knob" ] && saved[$knob]=$(cat "$knob")
done
restore_knobs() {
  local knob
  for knob in "${!saved[@]}"; do
    if [ "$(cat "$knob" 2>/dev/null)" != "${saved[$knob]}" ]; then
      echo "[tests] restoring $knob to ${saved[$knob]}" >&2
      echo "${saved[$knob]}" >"$knob" 2>/dev/null || true
    fi
  done
}
# UMA_KEEP_KNOBS=1 skips this, for a run beside another one that owns the knobs.
[ "${UMA_KEEP_KNOBS:-0}" = 1 ] || trap restore_knobs EXIT

stage_setup() { bash tests/setup.sh; }

stage_static() {
  ruff check plugins tests benchmarks lab
  ruff format --check plugins tests benchmarks lab
  yamllint -s .
  shellcheck -x lab/*.sh tests/*.sh .ci/run
  ansible-lint --profile production --offline
  bash tests/sanity.sh
  bash tests/build_install.sh
}

stage_unit() { python -m pytest -q -p no:cacheprovider tests/unit; }

stage_integration() { python -m pytest -q -p no:cacheprovider tests/integration; }

stage_molecule() {
  local scenario
  for scenario in "$@"; do
    run_stage "molecule:$scenario" molecule test -s "$scenario"
  done
}

scenarios() { grep -v -e '^#' -e '^$' tests/scenarios.txt; }

for stage in "${stages[@]}"; do
  case "$stage" in
    setup|static|unit|integration) run_stage "$stage" "stage_$stage" ;;
    molecule) mapfile -t all < <(scenarios); stage_molecule "${all[@]}" ;;
    molecule:*) stage_molecule "${stage#molecule:}" ;;
    *) echo "all.sh: unknown stage '$stage' (setup static unit integration molecule molecule:NAME)" >&2; exit 2 ;;
  esac
done
log "all passed"
printf '%s\n' "${timings[@]}" >&2
