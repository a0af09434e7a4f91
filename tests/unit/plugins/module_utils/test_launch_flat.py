"""The launcher runs from the lib directory the launch_wrapper role installs, as on a node.

uma.vllm.node_files (``programs: true``, the role's install task) installs the node package
(``plumbing/node_install.py`` NODE_MODULES) as ``lib/uma_vllm_node/`` with its entry scripts, and
systemd runs ``python3 lib/uma_launch.py`` there, without Ansible. test_node_programs checks the
package's imports statically; this runs the installed set with ``python3 -S`` (no site-packages,
so no ``ansible_collections``) and a bad configuration, which must be refused with exit 78 and the
option named, not a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch


def run_flat(lib, *args):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}  # no PYTHONPATH
    return subprocess.run(
        [sys.executable, "-S", str(lib / "uma_launch.py"), *args],
        cwd="/", env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_installed_set_imports_and_refuses_a_bad_config_with_78(tmp_path):
    lib = node_helpers.flat_copy(tmp_path)
    proc = run_flat(
        lib, "--engine", "flat", "--node-config", "/nonexistent", "--health-url", "http://127.0.0.1:1/health",
        "--model-path", str(tmp_path / "absent"), "--", "true",
    )  # fmt: skip
    assert proc.returncode == uma_launch.EXIT_CONFIG == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "option 'model_path'" in proc.stderr and "does not exist on this node" in proc.stderr


def test_the_installed_set_prints_its_help(tmp_path):
    proc = run_flat(node_helpers.flat_copy(tmp_path), "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: vllm-uma-launch")


def test_a_missing_part_fails_on_the_node(tmp_path):
    """The check can fail: without launch/node.py the launcher cannot start."""
    lib = node_helpers.flat_copy(tmp_path)
    os.unlink(str(lib / "uma_vllm_node" / "launch" / "node.py"))
    proc = run_flat(lib, "--help")
    assert proc.returncode != 0
    assert "No module named 'uma_vllm_node.launch.node'" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "plan, key",
    [
        ({"requested_memory_bytes": 1e308}, "plan.requested_memory_bytes"),
        ({"requested_memory_bytes": -1}, "plan.requested_memory_bytes"),
        ({"requested_memory_bytes": "12 GiB"}, "plan.requested_memory_bytes"),
        ({"requested_memory_bytes": True}, "plan.requested_memory_bytes"),
        ({"requested_memory_bytes": 1 << 33, "ranks_per_node": 10**12}, "plan.ranks_per_node"),
        ({"requested_memory_bytes": 1 << 33, "ranks_per_node": True}, "plan.ranks_per_node"),
        ({"gpus_per_node": 0}, "plan.gpus_per_node"),
        ({"cuda_context_bytes": 1e20}, "plan.cuda_context_bytes"),
        ({"unified_memory": "yes"}, "plan.unified_memory"),
    ],
)
def test_a_plan_out_of_range_is_refused_by_the_installed_launcher(tmp_path, plan, key):
    """Issue 36: a plan with requested_memory_bytes 1e308 ended the launcher in an OverflowError traceback;
    other bad numbers were read as "no request" (admission unchecked). Now refused at the config's door,
    exit 78, naming the key, before any lock or eviction."""
    lib = node_helpers.flat_copy(tmp_path)
    config = tmp_path / "engine.json"
    config.write_text(json.dumps({"engine": "p", "command": ["true"], "health_url": "http://x:1/h", "plan": plan}))
    proc = run_flat(lib, "--engine", "p", "--config", str(config), "--node-config", "/nonexistent",
                    "--lock-path", str(tmp_path / "lock"), "--state-dir", str(tmp_path / "state"))  # fmt: skip
    assert proc.returncode == uma_launch.EXIT_CONFIG, proc.stderr
    assert "Traceback" not in proc.stderr and "option '%s'" % key in proc.stderr, proc.stderr
    assert not (tmp_path / "lock").exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize("value", [1e308, -1, float("nan"), float("inf"), True, "12", [1], 1 << 51])
def test_the_plan_check_names_the_key_the_value_and_the_range(value):
    """The plan's requested_memory_bytes as the plan contract reads it (node/base/plan.py StartPlan.read;
    NaN and Infinity never pass the JSON loader;
    the check refuses them too): the key, the value and the valid range in one message."""
    from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
    from ansible_collections.uma.vllm.plugins.module_utils.node.base.plan import StartPlan

    with pytest.raises(UmaError) as err:
        StartPlan.read({"requested_memory_bytes": value})
    assert err.value.message.startswith("option 'plan.requested_memory_bytes' = ")
    assert "is not a number of bytes from 0 to 1 PiB" in err.value.message
    assert "nothing was started" in err.value.message


def test_the_planners_own_plan_passes_the_launchers_check():
    """What uma.vllm.vllm_flags emits is what the launcher accepts (the two sides of the wire agree)."""
    from ansible_collections.uma.vllm.plugins.module_utils.node.base.plan import StartPlan
    from ansible_collections.uma.vllm.plugins.module_utils.plan import planner

    config = json.loads(
        open(
            os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "models", "qwen3-32b", "config.json")
        ).read()
    )
    for unified in (True, False):
        plan = planner.plan({"model_config": config, "model": "m", "weights_bytes": 8 << 30, "total_memory_gib": 119.7,
                             "max_model_len": 8192, "unified_memory": unified})  # fmt: skip
        assert StartPlan.read(plan["budget"]).request == plan["budget"]["requested_memory_bytes"]


@pytest.mark.parametrize("meminfo", [None, "MemTotal: 1024 kB\nMemFree: 512 kB\n"], ids=["missing", "no-MemAvailable"])
def test_a_node_whose_meminfo_cannot_be_read_is_refused_at_admission(tmp_path, meminfo):
    """Issue 36: a missing /proc/meminfo at admission was a traceback (and one without MemAvailable read as 0
    bytes free: a wait, then a refusal with wrong numbers). Now exit 78 naming proc_root, the lock released."""
    lib = node_helpers.flat_copy(tmp_path)
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    if meminfo is not None:
        (proc_root / "meminfo").write_text(meminfo)
    config = tmp_path / "engine.json"
    plan = {"requested_memory_bytes": 1 << 30}
    engine = {"engine": "m", "command": ["true"], "health_url": "http://x:1/h", "plan": plan,
              "proc_root": str(proc_root), "pre_evict": "none"}  # fmt: skip
    config.write_text(json.dumps(engine))
    proc = run_flat(lib, "--engine", "m", "--config", str(config), "--node-config", "/nonexistent",
                    "--lock-path", str(tmp_path / "lock"), "--state-dir", str(tmp_path / "state"))  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == uma_launch.EXIT_CONFIG, out
    assert "Traceback" not in out and "option 'proc_root'" in out and "nothing was started" in out, out
    record = json.loads(next((tmp_path / "state").rglob("launch.json")).read_text())
    assert record["exit_code"] == uma_launch.EXIT_CONFIG


@pytest.mark.parametrize(
    "meminfo, said",
    [
        (None, "/meminfo cannot be read for the admission (No such file or directory)"),
        ("a directory", "/meminfo cannot be read for the admission (Is a directory)"),
        ("MemTotal: 1024 kB\nMemFree: 512 kB\n", "/meminfo has no 'MemAvailable: <number> kB' line"),
        ("MemTotal: 1024 kB\nMemAvailable: lots kB\n", "/meminfo has no 'MemAvailable: <number> kB' line"),
    ],
    ids=["missing", "a directory", "no MemAvailable", "MemAvailable not a number"],
)
def test_a_meminfo_refusal_names_the_file_and_is_the_records_stop_reason(tmp_path, meminfo, said):
    """Issue 36: the refusal said proc_root "has no readable meminfo" (not the file), logged it as an
    "admission" step with checked=False (as if admission were off) and left no stop reason in launch.json
    (status.yml's last_launch, the peers: "its engine exited with None"). Now it names <proc_root>/meminfo
    and what is missing in it, is an admission-refused step, the record's stopped_because; exit 78 (no
    systemd retry loop: a retry reads the same file)."""
    lib = node_helpers.flat_copy(tmp_path)
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    if meminfo == "a directory":
        (proc_root / "meminfo").mkdir()
    elif meminfo is not None:
        (proc_root / "meminfo").write_text(meminfo)
    config = tmp_path / "engine.json"
    engine = {"engine": "m", "command": ["true"], "health_url": "http://x:1/h", "pre_evict": "none",
              "plan": {"requested_memory_bytes": 1 << 30}, "proc_root": str(proc_root)}  # fmt: skip
    config.write_text(json.dumps(engine))
    proc = run_flat(lib, "--engine", "m", "--config", str(config), "--node-config", "/nonexistent",
                    "--lock-path", str(tmp_path / "lock"), "--state-dir", str(tmp_path / "state"))  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == uma_launch.EXIT_CONFIG and "Traceback" not in out, out
    message = "option 'proc_root' = '%s': %s%s" % (proc_root, proc_root, said)
    assert message in out and "set admission false; nothing was started." in out, out
    record = json.loads(next((tmp_path / "state").rglob("launch.json")).read_text())
    assert message in record["stopped_because"] and record["exit_code"] == uma_launch.EXIT_CONFIG
    assert [s["name"] for s in record["steps"] if s["name"].startswith("admission")] == ["admission-refused"]
