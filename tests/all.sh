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
# Nothing named: everything, with the set-up's lab half (image, vLLM venv, model) beside the
# static checks and the unit tests, which need none of it (tests/setup.sh --base / --lab).
overlap=0
if [ "${#stages[@]}" -eq 0 ]; then
  stages=(setup static unit integration molecule)
  overlap=1
fi
log() { printf '\n[tests] ==== %s\n' "$*" >&2; }
logs=$(mktemp -d)
declare -a ran=()
# A stage that runs tests must have run some: its pytest/testinfra summary lines
# ("N passed, M failed ... in Xs") are summed into the run's closing line.
counts() {
  grep -E '^[= ]*[0-9]+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed)(, [0-9]+ [a-z]+)* in [0-9.]+s' "$1" || true
}
# NAME CMD...: run one stage, its output to the terminal and $logs/NAME.log; its time and its
# counts to $logs/NAME.result (read by the closing lines: a stage may run in a subshell)
run_stage() {
  local name=$1; shift
  local start=$SECONDS file passed=0 failed=0 line
  log "$name"
  file="$logs/${name//[^A-Za-z0-9_]/_}"
  "$@" 2>&1 | tee "$file.log"
  while read -r line; do
    [[ $line =~ ([0-9]+)\ passed ]] && passed=$((passed + BASH_REMATCH[1]))
    [[ $line =~ ([0-9]+)\ (failed|error) ]] && failed=$((failed + BASH_REMATCH[1]))
  done < <(counts "$file.log")
  printf '%s %s %s\n' "$passed" "$failed" \
    "$(printf '%-28s %5ss  %s' "$name" $((SECONDS - start)) "$(case $name in setup*|static) ;; *) echo "$passed passed" ;; esac)")" \
    >"$file.result"
  case $name in
    setup*|static) ;;
    *) if [ "$passed" -eq 0 ]; then
         echo "[tests] stage $name ran no test: a stage that checks nothing must not pass" >&2
         exit 1
       fi ;;
  esac
}
# NAME CMD...: run_stage in the background, its output held in $logs/NAME.out until join
declare -A background=()
start_stage() {
  local name=$1
  ran+=("$name")
  run_stage "$@" >"$logs/${name//[^A-Za-z0-9_]/_}.out" 2>&1 &
  background[$name]=$!
}
# NAME: wait for a background stage, show its output; its failure ends the run
join_stage() {
  local name=$1 status=0
  wait "${background[$name]}" || status=$?
  cat "$logs/${name//[^A-Za-z0-9_]/_}.out" >&2
  unset "background[$name]"
  [ "$status" = 0 ] || { echo "[tests] stage $name failed (exit $status)" >&2; exit "$status"; }
}
stage() { ran+=("$1"); run_stage "$@"; }

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
# Their values are also kept in a file of the machine's (not the checkout's, not /tmp's) until the run
# restores them: a run killed before its exit handler (SIGKILL, a lost VM session) leaves it, and the
# next run puts those values back before it reads the machine's own.
knob_record=${UMA_KNOB_RECORD:-/var/tmp/uma-vllm-tests.knobs}
declare -A saved=()
# put_back WHY: every saved knob whose live value differs gets its saved value back, each named;
# returns 1 when one differed
put_back() {
  local knob differed=0
  for knob in "${!saved[@]}"; do
    if [ "$(cat "$knob" 2>/dev/null)" != "${saved[$knob]}" ]; then
      echo "[tests] $1 $knob at $(cat "$knob" 2>/dev/null); restoring ${saved[$knob]}" >&2
      echo "${saved[$knob]}" >"$knob" 2>/dev/null || true
      differed=1
    fi
  done
  return "$differed"
}
if [ "${UMA_KEEP_KNOBS:-0}" != 1 ] && [ -s "$knob_record" ]; then
  echo "[tests] $knob_record: a run before this one ended without restoring the kernel knobs; restoring what it recorded" >&2
  while IFS='=' read -r knob value; do  # only the knobs above, only numbers
    [[ " ${knobs[*]} " == *" $knob "* && $value =~ ^[0-9]+$ ]] && saved[$knob]=$value
  done <"$knob_record"
  put_back "the run before left" || true
fi
for knob in "${knobs[@]}"; do
  [ -r "$knob" ] && saved[$knob]=$(cat "$knob")
done
if [ "${UMA_KEEP_KNOBS:-0}" != 1 ]; then
  for knob in "${!saved[@]}"; do printf '%s=%s\n' "$knob" "${saved[$knob]}"; done >"$knob_record.new" &&
    mv -f "$knob_record.new" "$knob_record"
fi
restore_knobs() {
  local status=$1 leaked=0
  put_back "a test left" || leaked=1
  rm -f "$knob_record"
  # a leaked knob is a failure of the run (something did not restore what it changed)
  [ "$leaked" = 0 ] || [ "$status" != 0 ] || status=1
  exit "$status"
}
# At the end, and after a failed stage: a background stage still running is waited for, not killed,
# and its output shown
# (the lab's build mounts an overlay and fills a venv: stopped half-way it would leave both behind),
# and the knobs are restored (UMA_KEEP_KNOBS=1 skips that, for a run beside another one that owns them).
on_exit() {
  local status=$? name
  for name in "${!background[@]}"; do
    wait "${background[$name]}" 2>/dev/null || true
    echo "[tests] $name, still running when the run failed, ended; its output:" >&2
    cat "$logs/${name//[^A-Za-z0-9_]/_}.out" >&2 2>/dev/null || true
  done
  [ "${UMA_KEEP_KNOBS:-0}" = 1 ] || restore_knobs "$status"
  exit "$status"
}
trap on_exit EXIT

stage_setup() { bash tests/setup.sh; }
stage_setup_base() { bash tests/setup.sh --base; }
stage_setup_lab() { bash tests/setup.sh --lab; }

# ansible-lint (one core, 63 s) beside ansible-test sanity (139 s): its output is shown after
# sanity's, and either failure fails the stage with its exit status (`bash tests/all.sh static` at
# 98adf57: 169 s, the parts one after another about 225 s).
stage_static() {
  local lint_log lint_pid lint_status=0 sanity_status=0
  ruff check plugins tests benchmarks lab
  ruff format --check plugins tests benchmarks lab
  yamllint -s .
  shellcheck -x lab/*.sh tests/*.sh .ci/run
  lint_log=$(mktemp)
  ansible-lint --profile production --offline >"$lint_log" 2>&1 &
  lint_pid=$!
  bash tests/sanity.sh || sanity_status=$?
  wait "$lint_pid" || lint_status=$?
  cat "$lint_log"
  rm -f "$lint_log"
  [ "$sanity_status" = 0 ] || { echo "[tests] ansible-test sanity failed (exit $sanity_status)" >&2; return "$sanity_status"; }
  [ "$lint_status" = 0 ] || { echo "[tests] ansible-lint failed (exit $lint_status)" >&2; return "$lint_status"; }
  bash tests/build_install.sh
}

# Two workers (pytest-xdist): the unit tests are CPU-bound and independent (each its own tmp_path);
# on 2 cores this halves the stage (262 s -> ~150 s here). --durations: the slowest named in the log.
stage_unit() { python -m pytest -q -rs -p no:cacheprovider --durations=30 -n 2 tests/unit; }

# --durations: the slowest tests named in the log (where the stage's time goes). First the files
# marked `alone` (tests/integration/conftest.py: they read state of the whole machine that other
# tests change, or decide by the wall clock), one at a time; then every other file on two workers,
# a file per worker (a file's containers and fixtures are its own; no two files share a name),
# handed out longest first (conftest.py's LONGEST; --no-loadscope-reorder keeps that order: xdist's
# own sorts by the number of tests and left the ~300 s quick-start test for last, the other worker
# idle: 672 s; longest first 613 s, 2 Dec 2026. Not the ~505 s the first run's durations promised:
# the long files now overlap each other and each is slower beside another, 1003 -> 1213 s summed).
stage_integration() {
  python -m pytest -q -rs -p no:cacheprovider --durations=10 -m alone tests/integration
  python -m pytest -q -rs -p no:cacheprovider --durations=25 -m "not alone" -n 2 --dist loadfile --no-loadscope-reorder \
    tests/integration
}

stage_molecule() {
  local scenario
  for scenario in "$@"; do
    stage "molecule:$scenario" molecule test -s "$scenario"
  done
}
# NAME SCENARIO...: the scenarios one after another in the background (a lane), each a stage of
# its own (log, time, counts); their output held in $logs/NAME.out until join_stage NAME shows it.
# The first that fails ends the lane with its status, and join_stage ends the run with it.
start_lane() {
  local name=$1 scenario
  shift
  for scenario in "$@"; do ran+=("molecule:$scenario"); done
  (
    for scenario in "$@"; do
      run_stage "molecule:$scenario" molecule test -s "$scenario"
    done
  ) >"$logs/${name//[^A-Za-z0-9_]/_}.out" 2>&1 &
  background[$name]=$!
}
# Every scenario CI runs, in the list's order; a scenario listed "beside" another runs in a lane
# started with that one and is waited for when that one ends (tests/scenarios.txt says why).
stage_molecule_all() {
  local scenario
  local -a lane
  for scenario in $(scenarios); do
    mapfile -t lane < <(beside "$scenario")
    [ "${#lane[@]}" = 0 ] || start_lane "beside:$scenario" "${lane[@]}"
    stage "molecule:$scenario" molecule test -s "$scenario"
    [ "${#lane[@]}" = 0 ] || join_stage "beside:$scenario"
  done
}

# A line is "NAME" (run in order), "NAME manual" (listed, not run by CI; molecule:NAME still runs
# it) or "NAME beside OTHER" (run by CI in a lane beside OTHER, itself a line "OTHER").
listed_scenarios() { grep -v -e '^#' -e '^$' tests/scenarios.txt || true; }
scenarios() { listed_scenarios | awk 'NF == 1 {print $1}'; }
beside() { listed_scenarios | awk -v other="$1" '$2 == "beside" && $3 == other {print $1}'; }
# Every scenario directory is listed and every listed scenario exists: a list that lost a line
# (or came back empty) must not turn into a run that tests less and still passes. A line of any
# other shape, or one beside a scenario that is not run in order, would drop its scenario: refused.
check_scenarios() {
  local listed found bad
  listed=$(listed_scenarios | awk '{print $1}' | sort)
  found=$(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | sed 's|^molecule/||' | sort)
  if [ -z "$listed" ] || [ "$listed" != "$found" ]; then
    echo "[tests] tests/scenarios.txt lists [${listed//$'\n'/ }] but molecule/ has [${found//$'\n'/ }]" >&2
    exit 1
  fi
  bad=$(listed_scenarios | awk -v run=" $(scenarios | tr '\n' ' ') " '
    !(NF == 1 || (NF == 2 && $2 == "manual") || (NF == 3 && $2 == "beside" && index(run, " " $3 " ")))')
  if [ -n "$bad" ]; then
    echo "[tests] tests/scenarios.txt: each line is NAME, NAME manual or NAME beside OTHER (OTHER a line of its own); not: ${bad//$'\n'/; }" >&2
    exit 1
  fi
}

if [ "$overlap" = 1 ]; then
  # The lab's build (downloads, debootstrap, pip, the engine image loaded into the node volumes:
  # mostly network and disk) beside the static checks (mostly one core) and the unit tests; each
  # has what it needs before it starts. (Static beside unit was tried: ~1 min less, and a timing
  # bound of a unit test broke under the load.)
  stage setup stage_setup_base
  start_stage setup:lab stage_setup_lab
  stage static stage_static
  stage unit stage_unit
  join_stage setup:lab
  stages=(integration molecule)
fi
for stage in "${stages[@]}"; do
  case "$stage" in
    setup|static|unit|integration) stage "$stage" "stage_$stage" ;;
    molecule) check_scenarios; stage_molecule_all ;;
    molecule:*) stage_molecule "${stage#molecule:}" ;;
    *) echo "all.sh: unknown stage '$stage' (setup static unit integration molecule molecule:NAME)" >&2; exit 2 ;;
  esac
done
total_passed=0 total_failed=0
for name in "${ran[@]}"; do
  read -r passed failed timing <"$logs/${name//[^A-Za-z0-9_]/_}.result"
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
  echo "$timing" >&2
done
log "all passed"
# the run's closing line: every pytest and testinfra count of every stage above
echo "$total_passed passed, $total_failed failed"
