"""What the launches left on the node: records, lock, guard, readahead, ordering."""

from __future__ import annotations

import json


def record(host, engine):
    return json.loads(host.file("/var/lib/uma-vllm/launches/%s/latest/launch.json" % engine).content_string)


def steps(rec):
    return {s["name"]: s for s in rec["steps"]}


def test_programs_installed(host):
    for name in ("uma_vllm_node/base/common.py", "uma_vllm_node/base/blockdev.py", "uma_guard.py", "uma_launch.py"):
        f = host.file("/usr/local/lib/uma-vllm/" + name)
        assert f.exists and f.user == "root" and f.mode == 0o644
    launcher = host.file("/usr/local/bin/vllm-uma-launch")
    assert launcher.mode == 0o755 and "Ansible managed" in launcher.content_string
    assert host.run("/usr/local/bin/vllm-uma-launch --help").rc == 0
    node = json.loads(host.file("/etc/uma-vllm/launch.json").content_string)
    assert node["guard_mode"] == "adaptive" and node["lock_path"] == "/run/uma-vllm/launch.lock"


def test_healthy_launch_record(host):
    rec = record(host, "a")
    assert rec["healthy_at"] is not None and rec["failed_at"] is None
    assert rec["kv_alloc_t"] is not None and rec["kv_alloc_t"] < rec["healthy_at"]
    assert rec["guard_status"]["state"] == "stopped" and rec["guard_status"]["stop_reason"] == "signal"
    assert rec["page_cache_peak_mib"] is not None
    # the default --lock-memory: locked, or the node's refusal named (a lab container may cap RLIMIT_MEMLOCK)
    guard = rec["guard_status"]
    assert (guard["locked_kib"] or 0) > 1024 or "CAP_IPC_LOCK" in guard["lock_error"], guard
    assert rec["plan"]["kv_tokens"] > 0
    # admission: the plan's startup request was checked against the live MemAvailable
    assert rec["admission"]["admitted"] is True
    assert rec["admission"]["need_bytes"] == rec["plan"]["requested_memory_bytes"] * rec["plan"]["ranks_per_node"]
    names = [s["name"] for s in rec["steps"]]
    for earlier, later in [("lock-acquired", "engine-started"), ("engine-healthy", "guard-stopped"),
                           ("guard-stopped", "post-evict"), ("post-evict", "lock-released")]:  # fmt: skip
        assert names.index(earlier) < names.index(later)
    # stopped by systemctl stop: the engine's own exit status is passed on
    returncode = steps(rec)["engine-exited"]["returncode"]
    assert rec["exit_code"] == (128 - returncode if returncode < 0 else returncode)
    assert host.file("/var/lib/uma-vllm/launches/a/latest/samples.jsonl").size > 0


def test_killed_engine_record(host):
    rec = record(host, "k")
    assert rec["healthy_at"] is None and rec["failed_at"] is not None
    assert rec["exit_code"] == 137
    names = [s["name"] for s in rec["steps"]]
    assert {"readahead-window", "launch-failed", "guard-stopped", "readahead-restored", "lock-released"} <= set(names)
    assert not host.file("/var/lib/uma-vllm/readahead-launch-k.json").exists


def test_nothing_left_running_or_held(host):
    assert host.run("pgrep -f '[u]ma_guard.py'").rc == 1
    assert host.run("pgrep -f '[v]llm.entrypoints'").rc == 1
    assert host.run("flock --nonblock /run/uma-vllm/launch.lock true").rc == 0
    assert not host.file("/run/uma-vllm/launch.lock.holder").exists


def test_three_simultaneous_engines_started_one_after_another(host):
    windows = []
    for engine in ("b", "c", "d"):
        rec = record(host, engine)
        assert rec["healthy_at"] is not None, engine
        s = steps(rec)
        windows.append((s["lock-acquired"]["at"], s["lock-released"]["at"], engine))
    windows.sort()
    for earlier, later in zip(windows, windows[1:]):
        released, acquired = earlier[1], later[0]
        assert released <= acquired, (earlier, later)
    waits = host.file("/var/lib/uma-vllm/lw-waits.txt").content_string
    assert "waiting for the launch lock /run/uma-vllm/launch.lock held by engine" in waits
    assert len(waits.strip().splitlines()) >= 2  # two engines waited


def test_admission_refused_next_to_a_memory_hog(host):
    rec = record(host, "h")
    adm = rec["admission"]
    assert rec["exit_code"] == 75 and adm["admitted"] is False
    assert adm["mem_available_bytes"] < adm["need_bytes"] and adm["short_bytes"] > 0
    assert "Fix: free" in adm["reason"]
    names = [s["name"] for s in rec["steps"]]
    assert "admission-refused" in names and "engine-started" not in names
    assert rec["failed_at"] < 30


def test_the_engine_runs_as_the_engine_user_the_launcher_as_root(host):
    """Least privilege (issue 10): launcher_wrapper_engine_user = uma-engine, under the unit's hardening."""
    user = host.user("uma-engine")
    assert user.exists and user.shell == "/usr/sbin/nologin" and user.home == "/var/lib/uma-vllm/engine-home"
    home = host.file("/var/lib/uma-vllm/engine-home")
    assert home.is_directory and home.user == "uma-engine" and home.mode == 0o750
    node = json.loads(host.file("/etc/uma-vllm/launch.json").content_string)
    assert node["engine_user"] == "uma-engine" and node["engine_groups"] == ["video", "render"]
    seen = json.loads(host.file("/var/lib/uma-vllm/lw-user.json").content_string)
    launcher, *engine = seen["processes"]
    assert launcher["uid"] == ["0"] * 4 and "uma_launch" in launcher["cmd"]
    assert len(engine) >= 2  # the API server and the engine core at least
    assert {tuple(p["uid"]) for p in engine} == {(str(user.uid),) * 4}
    assert {tuple(p["gid"]) for p in engine} == {(str(user.gid),) * 4}
    groups = {host.group(g).gid for g in ("video", "render")}
    assert all({int(g) for g in p["groups"]} == groups for p in engine)
    assert {p["cap_eff"] for p in engine} == {"0000000000000000"}
    assert any(p["name"].startswith("VLLM") or "EngineCore" in p["cmd"] for p in engine)
    # the unit ran under the hardening vllm_service gives a non-root engine user
    assert seen["unit"]["ProtectHome"] == "yes" and seen["unit"]["NoNewPrivileges"] == "yes"
    assert set(seen["unit"]["CapabilityBoundingSet"].split()) == {
        "cap_setuid", "cap_setgid", "cap_kill", "cap_sys_admin", "cap_dac_read_search",
    }  # fmt: skip
    assert record(host, "a")["engine_user"] == "uma-engine"
