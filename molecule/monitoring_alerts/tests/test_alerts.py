"""The collection's alert rules in a real Prometheus, fed by the real watchdog program on two lab nodes.

The host's Prometheus (Debian's 2.42) scrapes both nodes' node-exporter (the textfile directory
the collection writes) and the real vLLM engine's /metrics every second, and evaluates
roles/monitoring/files/prometheus/uma-vllm-rules.yml unchanged every second. Faults:

- memory floor on alerts-ai1 (engine tiny, the real vLLM engine): the watchdog reads its memory
  from a fake proc root (``meminfo_root``; a real low-memory state cannot be made safely on the
  shared machine); its processes, the engine unit and systemctl are real.
  Near miss first: MemAvailable between the critical and the warning floor -> one eviction,
  which must NOT fire UmaVllmWatchdogMemoryFloorWarning (3 needed) nor ...Critical.
  Then below the critical floor -> the watchdog restarts the real engine ->
  UmaVllmWatchdogMemoryFloorCritical firing for engine tiny on alerts-ai1.
- gave up on alerts-ai2 (engine never: a unit that can never become healthy): the real
  watchdog restarts it once (max_restarts 1), then gives up and leaves it stopped ->
  UmaVllmWatchdogGaveUp firing for engine never on alerts-ai2.

Times from the fault to the alert firing are printed (run with -s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))

from lab_prometheus import LabPrometheus, docker_ip, rfc3339_to_unix

AI1, AI2 = "alerts-ai1", "alerts-ai2"
MIB = 1 << 20
GIB = 1 << 30
RAM_GIB = 24  # floors from uma-3pct-v1 on 24 GiB: critical 704 MiB, warning 1408 MiB
FAKE_PROC = "/run/uma-lab-proc"
TEXTFILE = "/var/lib/prometheus/node-exporter"


def sh(node, script, check=True):
    proc = subprocess.run(
        ["docker", "exec", node, "bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError("%s: %s -> rc %d\n%s%s" % (node, script, proc.returncode, proc.stdout, proc.stderr))
    return proc.stdout


def put(node, path, text):
    proc = subprocess.run(
        ["docker", "exec", "-i", node, "bash", "-c", 'cat > "$1.tmp" && mv "$1.tmp" "$1"', "put", path],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def fake_meminfo(node, available):
    """The watchdog's proc root: MemAvailable as given, 24 GiB total, MemFree 1 GiB above it."""
    put(
        node,
        FAKE_PROC + "/meminfo",
        "MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\n"
        % (RAM_GIB * GIB // 1024, (available + GIB) // 1024, available // 1024),
    )


def start_watchdog(node, engine, **over):
    cfg = {
        "engine": engine,
        "base_url": "http://127.0.0.1:8000",
        "interval_s": 1,
        "fail_threshold": 2,
        "probe_timeout_s": 20,
        "health_timeout_s": 5,
        "processes": [{"match": "VLLM::EngineCore", "min": 1}],
        "state_dir": "/var/lib/uma-vllm",
        "textfile_dir": TEXTFILE,
        "ram_gib": RAM_GIB,
    }
    cfg.update(over)
    sh(node, "mkdir -p /etc/uma-vllm/watchdog")
    put(node, "/etc/uma-vllm/watchdog/%s.json" % engine, json.dumps(cfg, indent=1))
    sh(
        node,
        "systemd-run --unit uma-vllm-watchdog-%s --collect /usr/bin/python3 -E -s "
        "/usr/local/lib/uma-vllm/uma_watchdog.py --config /etc/uma-vllm/watchdog/%s.json" % (engine, engine),
    )


def events(node, engine):
    text = sh(node, "cat /var/lib/uma-vllm/watchdog/%s/events.json 2>/dev/null || echo []" % engine)
    return json.loads(text)


def wait_events(node, engine, action, timeout=120.0):
    """The events of ``action`` once there is one (a restart is recorded when its stop and start are done)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in events(node, engine) if e["action"] == action]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def values(prom, expr):
    return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in prom.query(expr)}


@pytest.fixture(scope="module")
def prom():
    ip1, ip2 = docker_ip(AI1), docker_ip(AI2)
    server = LabPrometheus(
        nodes={"alerts-ai1": ip1 + ":9100", "alerts-ai2": ip2 + ":9100"}, engines={"alerts-ai1": ip1 + ":8000"}
    )
    server.start()
    yield server
    print("\n[monitoring_alerts] prometheus log tail:\n" + server.log_tail())
    server.stop()


def test_targets_up_and_both_textfiles_and_the_engine_are_scraped(prom):
    sh(
        AI1,
        "mkdir -p %s/sys/vm && cat /proc/sys/vm/min_free_kbytes > %s/sys/vm/min_free_kbytes" % (FAKE_PROC, FAKE_PROC),
    )
    fake_meminfo(AI1, 8 * GIB)
    start_watchdog(
        AI1, "tiny", meminfo_root=FAKE_PROC, model_path="/models/tiny-1g", evict_every_s=600, start_timeout_s=300
    )
    # an engine that never becomes healthy: one restart allowed, then the watchdog gives up
    start_watchdog(AI2, "never", start_timeout_s=3, max_restarts=1, backoff_initial_s=1, fail_threshold=1)
    started = time.monotonic()
    targets = prom.wait_targets_up(90)
    print("\n[monitoring_alerts] %d targets up after %.1f s" % (len(targets), time.monotonic() - started))
    assert sorted((t["labels"]["job"], t["labels"]["instance"]) for t in targets) == [
        ("node", "alerts-ai1:9100"),
        ("node", "alerts-ai2:9100"),
        ("vllm", "alerts-ai1:8000"),
    ]
    # the engine's own metrics, the collection's textfile and both watchdogs' textfiles, through Prometheus
    assert prom.wait_query('vllm:num_requests_running{job="vllm",instance="alerts-ai1:8000"}', 30)
    prom.wait_query('uma_vllm_textfile_timestamp_seconds{instance="alerts-ai1:9100"}', 30)
    prom.wait_query('uma_vllm_textfile_timestamp_seconds{instance="alerts-ai2:9100"}', 30)
    prom.wait_query('uma_vllm_watchdog_state{instance="alerts-ai1:9100",engine="tiny",phase="healthy"} == 1', 90)
    prom.wait_query('uma_vllm_watchdog_timestamp_seconds{instance="alerts-ai2:9100",engine="never"}', 30)
    # node-exporter accepted every textfile (a duplicate series across files would make this 1)
    errors = values(prom, "node_textfile_scrape_error")
    assert errors and set(errors.values()) == {0.0}, errors


def active_at(alert):
    """The alert's activeAt (when its rule first matched) as Unix time."""
    return rfc3339_to_unix(alert["activeAt"])


def test_gave_up_engine_fires_the_gave_up_alert(prom):
    alert = prom.wait_alert("UmaVllmWatchdogGaveUp", {"engine": "never", "instance": "alerts-ai2:9100"}, 120)
    assert alert["labels"]["severity"] == "critical"
    assert "every rank is left stopped" in alert["annotations"]["summary"]
    (gave_up,) = wait_events(AI2, "never", "gave_up")
    (start,) = [e for e in events(AI2, "never") if e["action"] == "start"]
    print(
        "[monitoring_alerts] never: watchdog start -> gave up %.1f s -> UmaVllmWatchdogGaveUp active %.1f s later"
        % (
            gave_up["evidence"]["decided_at_epoch_s"] - start["epoch_s"],
            active_at(alert) - gave_up["evidence"]["decided_at_epoch_s"],
        )
    )
    # two attempts, each given the whole start_timeout_s (3 s), before giving up
    assert gave_up["evidence"]["decided_at_epoch_s"] - start["epoch_s"] >= 2 * 3
    actions = [e["action"] for e in events(AI2, "never")]
    assert actions.count("restart") == 1 and actions.count("gave_up") == 1, actions
    assert sh(AI2, "systemctl is-active uma-vllm@never.service", check=False).strip() == "inactive"
    # the real engine on the other node is not affected
    assert not prom.firing("UmaVllmWatchdogGaveUp", {"engine": "tiny"})


def test_near_miss_one_eviction_fires_no_floor_alert(prom):
    # between the floors: the warning floor (1408 MiB) is crossed, the critical one (704 MiB) is not
    fake_meminfo(AI1, 1000 * MIB)
    prom.wait_query('uma_vllm_watchdog_floor_events_total{engine="tiny",level="warn"} == 1', 30)
    prom.wait_query('uma_vllm_watchdog_mem_available_bytes{engine="tiny"} == %d' % (1000 * MIB), 30)
    # several evaluations of every rule with the eviction scraped: no floor alert, pending or firing
    seen_at = time.time()
    prom.wait_evaluated_after(seen_at + 3, 30)
    floor_alerts = [a for a in prom.alerts() if a["labels"]["alertname"].startswith("UmaVllmWatchdogMemoryFloor")]
    assert floor_alerts == [], floor_alerts
    assert [e["action"] for e in events(AI1, "tiny")].count("evict") == 1
    assert [e for e in events(AI1, "tiny") if e["action"] == "restart"] == []


def test_critical_floor_restarts_the_real_engine_and_fires(prom):
    fake_meminfo(AI1, 600 * MIB)
    lowered = time.time()
    alert = prom.wait_alert("UmaVllmWatchdogMemoryFloorCritical", {"engine": "tiny", "instance": "alerts-ai1:9100"}, 90)
    seen_firing = time.time()
    fake_meminfo(AI1, 8 * GIB)  # memory back: the restarted engine is watched as usual
    assert alert["labels"]["severity"] == "critical"
    restarts = wait_events(AI1, "tiny", "restart")
    decided = restarts[0]["evidence"]["decided_at_epoch_s"]
    print(
        "[monitoring_alerts] tiny: MemAvailable under the critical floor -> restart decided %.1f s -> "
        "UmaVllmWatchdogMemoryFloorCritical active %.1f s later (seen firing through the API %.1f s after the fault)"
        % (decided - lowered, active_at(alert) - decided, seen_firing - lowered)
    )
    assert len(restarts) == 1 and "critical floor" in restarts[0]["reason"], restarts
    assert restarts[0]["evidence"]["kind"] == "floor"
    assert restarts[0]["evidence"]["stop"]["error"] is None and "error" not in restarts[0]["evidence"]["start"]
    # while the real engine stopped, the textfile said restart_stop (a phase series at 1, not all 0)
    stop_s = restarts[0]["evidence"]["stop"]["duration_s"]
    print("[monitoring_alerts] the real engine's stop took %.1f s" % stop_s)
    seen = values(prom, 'max_over_time(uma_vllm_watchdog_state{engine="tiny",phase="restart_stop"}[10m])')
    assert list(seen.values()) == [1.0], seen
    # the warning alert still needs 3 evictions: one so far (evict_every_s 600)
    assert not prom.firing("UmaVllmWatchdogMemoryFloorWarning", state="firing")
    # the real engine serves again after the restart (the watchdog sees it healthy)
    prom.wait_query('uma_vllm_watchdog_state{engine="tiny",phase="healthy"} == 1', 180)


def test_diagnose_playbook_reports_what_the_watchdogs_did(tmp_path):
    """playbooks/diagnose.yml on both nodes: the real watchdogs' records, read by oom_diagnose."""
    playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, ".cache", "collections"))
    proc = subprocess.run(
        [playbook, "-i", os.environ["MOLECULE_INVENTORY_FILE"], os.path.join(REPO, "playbooks", "diagnose.yml"),
         "-e", "report_dir=%s" % tmp_path],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    reports = {host: json.loads((tmp_path / ("%s.json" % host)).read_text()) for host in (AI1, AI2)}
    (never,) = [d for d in reports[AI2]["diagnoses"] if d["engine"] == "never"]
    assert never["watchdog"]["gave_up"] is True and never["watchdog"]["restarts"] == 1, never["watchdog"]
    assert "watchdog GAVE UP: every rank is stopped and left stopped" in never["evidence"]
    (tiny,) = [d for d in reports[AI1]["diagnoses"] if d["engine"] == "tiny"]
    assert (tiny["watchdog"]["floor_restarts"], tiny["watchdog"]["evictions"]) == (1, 1), tiny["watchdog"]
    restart = next(e for e in tiny["watchdog"]["events"] if e["action"] == "restart")
    assert "kind floor" in restart["evidence"] and any(
        p.startswith("MemAvailable 600 MiB") for p in restart["evidence"]
    )
    markdown = (tmp_path / ("%s.md" % AI1)).read_text()
    assert "## Engine watchdog" in markdown and "critical floor" in markdown
    assert "Watchdog: phase gave_up" in " ".join(proc.stdout.split())  # the verdict line the play shows
    shown = [line for line in proc.stdout.splitlines() if "Watchdog" in line or "msg:" in line]
    print("[monitoring_alerts] diagnose.yml:\n" + "\n".join(shown))
