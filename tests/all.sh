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
declare -i total_passed=0 total_failed=0
logs=$(mktemp -d)
# A stage that runs tests must have run some: its pytest/testinfra summary lines
# ("N passed, M failed ... in Xs") are summed into the run's closing line.
counts() {
  grep -E '^[= ]*[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)(, [0-9]+ [a-z]+)* in [0-9.]+s' "$1" || true
}
run_stage() {
  local name=$1; shift
  local start=$SECONDS log_file passed=0 failed=0 line
  log "$name"
  log_file="$logs/${name//[^A-Za-z0-9_]/_}.log"
  "$@" 2>&1 | tee "$log_file"
  while read -r line; do
    [[ $line =~ ([0-9]+)\ passed ]] && passed=$((passed + BASH_REMATCH[1]))
    [[ $line =~ ([0-9]+)\ (failed|error) ]] && failed=$((failed + BASH_REMATCH[1]))
  done < <(counts "$log_file")
  total_passed+=passed
  total_failed+=failed
  timings+=("$(printf '%-28s %5ss  %s' "$name" $((SECONDS - start)) "$([ "$name" = setup ] || [ "$name" = static ] || echo "$passed passed")")")
  if [ "$name" != setup ] && [ "$name" != static ] && [ "$passed" -eq 0 ]; then
    echo "[tests] stage $name ran no test: a stage that checks nothing must not pass" >&2
    exit 1
  fi
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
  local status=$? knob leaked=0
  for knob in "${!saved[@]}"; do
    if [ "$(cat "$knob" 2>/dev/null)" != "${saved[$knob]}" ]; then
      echo "[tests] a test left $knob at $(cat "$knob" 2>/dev/null); restoring ${saved[$knob]}" >&2
      echo "${saved[$knob]}" >"$knob" 2>/dev/null || true
      leaked=1
    fi
  done
  # a leaked knob is a failure of the run (something did not restore what it changed)
  [ "$leaked" = 0 ] || [ "$status" != 0 ] || status=1
  exit "$status"
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

# Two workers (pytest-xdist): the unit tests are CPU-bound and independent (each its own tmp_path);
# on 2 cores this halves the stage (262 s -> ~150 s here).
stage_unit() { python -m pytest -q -p no:cacheprovider -n 2 tests/unit; }

# --durations: the slowest tests named in the log (where the stage's time goes)
stage_integration() { python -m pytest -q -p no:cacheprovider --durations=25 tests/integration; }

stage_molecule() {
  local scenario
  for scenario in "$@"; do
    run_stage "molecule:$scenario" molecule test -s "$scenario"
  done
}

# A line "NAME manual" lists a scenario that CI does not run (molecule:NAME still runs it).
listed_scenarios() { grep -v -e '^#' -e '^$' tests/scenarios.txt || true; }
scenarios() { listed_scenarios | awk '$2 != "manual" {print $1}'; }
# Every scenario directory is listed and every listed scenario exists: a list that lost a line
# (or came back empty) must not turn into a run that tests less and still passes.
check_scenarios() {
  local listed found
  listed=$(listed_scenarios | awk '{print $1}' | sort)
  found=$(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | sed 's|^molecule/||' | sort)
  if [ -z "$listed" ] || [ "$listed" != "$found" ]; then
    echo "[tests] tests/scenarios.txt lists [${listed//$'\n'/ }] but molecule/ has [${found//$'\n'/ }]" >&2
    exit 1
  fi
}

for stage in "${stages[@]}"; do
  case "$stage" in
    setup|static|unit|integration) run_stage "$stage" "stage_$stage" ;;
    molecule) check_scenarios; mapfile -t all < <(scenarios); stage_molecule "${all[@]}" ;;
    molecule:*) stage_molecule "${stage#molecule:}" ;;
    *) echo "all.sh: unknown stage '$stage' (setup static unit integration molecule molecule:NAME)" >&2; exit 2 ;;
  esac
done
printf '%s\n' "${timings[@]}" >&2
log "all passed"
# the run's closing line: every pytest and testinfra count of every stage above
echo "$total_passed passed, $total_failed failed"
