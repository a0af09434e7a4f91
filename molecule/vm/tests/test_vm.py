"""The VM lab node after site.yml (inventories/vm), its idempotent re-run and one `systemctl restart` of
the engine: node_prep's sysctls in force, the launcher and the guard programs installed, the engine (the
UMA loader through the launcher) healthy and answering a completion, its watchdog running."""

from __future__ import annotations

import json
import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[3]
GROUP = yaml.safe_load((ROOT / "inventories" / "vm" / "group_vars" / "uma_vm.yml").read_text(encoding="utf-8"))
ENGINE = GROUP["vllm_service_engines"][0]
UNIT = "uma-vllm@%s.service" % ENGINE["name"]
WATCHDOG = "uma-vllm-watchdog@%s.service" % ENGINE["name"]
URL = "http://%s:%d" % (ENGINE["host"], ENGINE["port"])
# node_prep's defaults (roles/node_prep/defaults/main.yml); the reserve is the inventory's
SETTINGS = {"vm.vfs_cache_pressure": "200", "vm.dirty_ratio": "5", "vm.dirty_background_ratio": "2"}
PROGRAMS = yaml.safe_load((ROOT / "roles" / "launch_wrapper" / "vars" / "main.yml").read_text(encoding="utf-8"))[
    "__launch_wrapper_programs"
]


def _planned_min_free_kbytes(host):
    """inventories/vm's uma_min_free_kbytes: the Spark rule's 121 GiB value scaled to the guest's memtotal_mb."""
    memtotal_kb = int(host.check_output("awk '/^MemTotal:/ {print $2}' /proc/meminfo"))
    formula = GROUP["uma_min_free_kbytes"]
    spark = int(formula.split("{{ (", 1)[1].split(" *", 1)[0])
    return int(spark * (memtotal_kb // 1024) / (121 * 1024))


def _get(host, path, body=None):
    """An HTTP request from inside the guest (it has python3, no curl): (status, body)."""
    script = (
        "import json, sys, urllib.request as u\n"
        "data = sys.argv[2].encode() if len(sys.argv) > 2 else None\n"
        "req = u.Request(sys.argv[1], data=data, headers={'Content-Type': 'application/json'})\n"
        "r = u.urlopen(req, timeout=60)\n"
        "print(json.dumps([r.status, r.read().decode()]))\n"
    )
    args = [URL + path] + ([json.dumps(body)] if body is not None else [])
    out = host.run("python3 -c" + " %s" * (1 + len(args)), script, *args)  # testinfra quotes each
    assert out.rc == 0, out.stderr
    return json.loads(out.stdout)


def test_the_guest_is_the_vm_lab_node(host):
    assert host.check_output("uname -r") == "6.1.0-56-amd64"
    assert host.file("/dev/fakegb10").exists
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"


def test_node_prep_sysctls_are_in_force_and_persisted(host):
    want = dict(SETTINGS, **{"vm.min_free_kbytes": str(_planned_min_free_kbytes(host))})
    f = host.file("/etc/sysctl.d/90-vllm.conf")
    assert f.exists and f.user == "root" and f.mode == 0o644
    assert "Managed by uma.vllm" in f.content_string.splitlines()[0]
    pairs = [line.partition("=") for line in f.content_string.splitlines() if line.strip() and line[0] != "#"]
    assert {key.strip(): value.strip() for key, _unused, value in pairs} == want
    for key, value in want.items():
        assert host.file("/proc/sys/" + key.replace(".", "/")).content_string.strip() == value, key
    original = json.loads(host.file("/var/lib/uma-vllm/sysctl-original.json").content_string)
    assert set(original) <= set(want) and original["vm.min_free_kbytes"] != want["vm.min_free_kbytes"]


def test_the_launcher_and_the_guard_programs_are_installed(host):
    for name in PROGRAMS:
        f = host.file("/usr/local/lib/uma-vllm/" + name)
        assert f.exists and f.user == "root" and f.mode == 0o644, name
    launcher = host.file("/usr/local/bin/vllm-uma-launch")
    assert launcher.mode == 0o755 and "Ansible managed" in launcher.content_string
    assert host.run("/usr/local/bin/vllm-uma-launch --help").rc == 0
    assert host.run("python3 /usr/local/lib/uma-vllm/uma_guard.py --help").rc == 0


def test_the_engine_runs_the_loader_through_the_launcher(host):
    unit = host.service(UNIT)
    assert unit.is_running and unit.is_enabled
    config = json.loads(host.file("/etc/uma-vllm/engines/%s.json" % ENGINE["name"]).content_string)
    assert config["command"][: len(ENGINE["command"])] == ENGINE["command"]
    plan = config["plan"]
    assert plan["kv_cache_bytes"] > 0 and 0 < plan["gpu_memory_utilization"] < 1
    assert "--kv-cache-memory-bytes" in config["command"]
    main_pid = host.check_output("systemctl show -p MainPID --value %s" % UNIT)
    assert "uma_launch.py --engine %s" % ENGINE["name"] in host.check_output("ps -o args= -p %s" % main_pid)
    assert "/root/uma_loader.py" in host.check_output("ps -o args= --ppid %s" % main_pid)


def test_the_engine_is_healthy_and_answers_a_completion(host):
    status, _body = _get(host, "/health")
    assert status == 200
    status, body = _get(host, "/v1/completions", {"model": ENGINE["model_path"], "prompt": "ping", "max_tokens": 1})
    assert status == 200 and json.loads(body)["choices"]


def test_the_last_launch_was_admitted_and_reached_health(host):
    record = json.loads(host.file("/var/lib/uma-vllm/launches/%s/latest/launch.json" % ENGINE["name"]).content_string)
    assert record["healthy_at"] is not None and record["failed_at"] is None
    assert record["admission"]["admitted"] is True
    assert record["plan"]["kv_cache_bytes"] > 0
    # the guard's line (guard_act_below_free_mib auto): the engine's startup request, admission's figure
    guard = record["guard_status"]
    assert guard["config"]["act_below_free_mib"] == -(-record["admission"]["need_bytes"] // (1 << 20)), guard
    assert guard["stop_reason"] == "signal" and guard["locked_kib"] > 0, guard


def test_the_watchdog_runs_beside_the_engine(host):
    watchdog = host.service(WATCHDOG)
    assert watchdog.is_running and watchdog.is_enabled
    # this boot only: the guest's journal is persistent (earlier runs on the same disk image)
    journal = host.check_output("journalctl -b -u %s -o cat --no-pager" % WATCHDOG)
    acts = [line for line in journal.splitlines() if line.startswith("[uma-vllm-watchdog")]
    assert acts, journal[-2000:]  # it logged its start at least
    assert not [a for a in acts if "] restart:" in a or "] gave_up:" in a], acts
    # its own pages locked (vllm_service_watchdog_lock_memory, the default; root in a VM: CAP_IPC_LOCK kept)
    events = json.loads(host.file("/var/lib/uma-vllm/watchdog/%s/events.json" % ENGINE["name"]).content_string)
    start = [e for e in events if e["action"] == "start"][-1]["evidence"]
    assert start.get("locked_kib", 0) > 1024 and "lock_error" not in start, start
    pid = host.check_output("systemctl show -p MainPID --value %s" % WATCHDOG)
    locked = [ln for ln in host.file("/proc/%s/status" % pid).content_string.splitlines() if ln.startswith("VmLck:")]
    assert locked and int(locked[0].split()[1]) > 1024, locked
