# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One regression case per configuration defect of the node programs found for issue 22
(items 1-2; each failed before its fix). The programs run as the node runs them where the
defect shows only there (python3 -E -s FILE, no --check-config: the real start path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "module_utils"))
import node_helpers

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import program as uma_guard
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import config as _launch_config
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd

HERE = os.path.dirname(os.path.abspath(__file__))
# the programs as a node runs them: the node package installed by the collection's installer
NODE_LIB = node_helpers.NODE_LIB
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


def node_run(argv, timeout=60, cwd=None):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    return subprocess.run([PYTHON, "-E", "-s", *argv], capture_output=True, text=True, errors="replace",
                          timeout=timeout, env=env, cwd=cwd, check=False, stdin=subprocess.DEVNULL)  # fmt: skip


def launch_config(**over):
    base = {"engine": "e", "command": ["true"], "health_url": "http://127.0.0.1:9/health"}
    return _launch_config.validate(_launch_config.merge_config(dict(base, **over)))


# ---- the launcher: a damaged launch.json was ignored, the engine started as root ------------


@pytest.mark.parametrize("body", [b"", b"{", b"[1]", b'{"engine_user": "nobody"', b"\xff\xfe{}", "dir"])
def test_damaged_node_config_exits_78_and_never_starts_the_engine(tmp_path, body):
    """launch.json (engine_user set there) empty or damaged: the launcher fell back to its
    defaults and started the engine as root with exit 0. Now: exit 78, one line naming the file."""
    node = tmp_path / "launch.json"
    if body == "dir":
        node.mkdir()
    else:
        node.write_bytes(body)
    marker = tmp_path / "engine-ran"
    model = tmp_path / "model"
    model.mkdir()
    argv = [
        os.path.join(NODE_LIB, "uma_launch.py"), "--engine", "e", "--node-config", str(node),
        "--health-url", "http://127.0.0.1:9/health", "--health-timeout", "2", "--model-path", str(model),
        "--guard-mode", "files", "--lock-path", str(tmp_path / "launch.lock"), "--state-dir", str(tmp_path / "state"),
        "--", PYTHON, "-c", "import os; open(%r, 'w').write(str(os.getuid()))" % str(marker),
    ]  # fmt: skip
    proc = node_run(argv)
    assert proc.returncode == 78, (proc.returncode, proc.stderr[-800:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(node) in lines[0] and "--node-config" in lines[0], proc.stderr
    assert not marker.exists(), "the engine ran (as uid %s) on the launcher's defaults" % marker.read_text()


@pytest.mark.parametrize("key", ["lock_timeout_s", "health_timeout_s", "health_interval_s", "stop_timeout_s",
                                 "admission_wait_s"])  # fmt: skip
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e308])
def test_launcher_durations_are_finite_and_bounded(key, value):
    """NaN, Infinity and 1e308 passed (the check was only `<= 0`): time.sleep(1e308) raised
    OverflowError mid-launch, an infinite lock or health wait never ended."""
    with pytest.raises(UmaError) as err:
        launch_config(**{key: value})
    assert err.value.option == key


@pytest.mark.parametrize(
    "over, key",
    [
        ({"engine_user": False}, "engine_user"),  # false == 0 was taken for "root": the engine ran as root
        ({"engine_user": 0}, "engine_user"),
        ({"guard": "false"}, "guard"),  # a non-empty string is true: the guard ran although "false" was written
        ({"evict_after_healthy": "no"}, "evict_after_healthy"),
        ({"command": ["python3", "a\x00b"]}, "command"),  # Popen's ValueError escaped as a traceback
        ({"env": {"A": "x\x00y"}}, "env.A"),
        ({"env": {"A": True}}, "env.A"),  # became the string "True"
        ({"env": {"A=B": "x"}}, "env"),
        ({"state_dir": "relative"}, "state_dir"),
        ({"lock_path": "/run/a\nb"}, "lock_path"),
        ({"python": ""}, "python"),
        ({"readahead_kb": 10**40, "model_path": "/"}, "readahead_kb"),
        ({"guard_interval": "0.5"}, "guard_interval"),  # a string from a file: not a number
        ({"health_url": "http://a b/health"}, "health_url"),
        ({"plan": "big"}, "plan"),
        ({"engine_groups": "video"}, "engine_groups"),  # ignored without a word when the engine ran as root
    ],
)
def test_launcher_exact_types(over, key):
    with pytest.raises(UmaError) as err:
        launch_config(**over)
    assert err.value.option == key


def test_unknown_key_in_a_config_file_is_named_not_ignored(tmp_path):
    """A typo (lock_timout_s) was silently ignored: the default applied without a word."""
    node = tmp_path / "launch.json"
    node.write_text(json.dumps({"lock_timout_s": 5}))
    with pytest.raises(UmaError) as err:
        _launch_config.load_config(["--engine", "e", "--health-url", "http://x/h", "--node-config", str(node),
                                    "--", "true"])  # fmt: skip
    assert err.value.option == "lock_timout_s" and str(node) in err.value.message


def test_a_refusal_names_the_file_that_set_the_value(tmp_path):
    node, engine = tmp_path / "launch.json", tmp_path / "engine.json"
    node.write_text(json.dumps({"lock_timeout_s": 1e308}))
    engine.write_text(json.dumps({"engine": "e", "command": ["true"], "health_url": "http://x/h"}))
    with pytest.raises(UmaError) as err:
        _launch_config.load_config(["--config", str(engine), "--node-config", str(node)])
    assert err.value.option == "lock_timeout_s" and "(set in %s)" % node in err.value.message


def test_a_number_that_overflows_is_refused_anywhere_in_the_file(tmp_path):
    """1e400 parses as Infinity: in the plan (which the validator does not walk) the admission's
    int(requested_memory_bytes) raised OverflowError at the engine's start, a traceback."""
    engine = tmp_path / "engine.json"
    engine.write_text('{"engine": "e", "command": ["true"], "health_url": "http://x/h", '
                      '"plan": {"requested_memory_bytes": 1e400}}')  # fmt: skip
    with pytest.raises(UmaError) as err:
        _launch_config.load_config(["--config", str(engine), "--node-config", str(tmp_path / "none.json")])
    assert err.value.option == "--config" and "1e400 is too large" in err.value.message


@pytest.mark.parametrize("program", ["uma_launch.py", "uma_watchdog.py"])
def test_a_fifo_as_config_is_refused_not_waited_on(tmp_path, program):
    """open() + read() of a FIFO blocks until a writer comes: the program hung at start."""
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    proc = node_run([os.path.join(NODE_LIB, program), "--config", str(fifo)], timeout=20)
    assert proc.returncode == 78 and "is not a regular file" in proc.stderr, proc.stderr


@pytest.mark.parametrize("program", ["uma_launch.py", "uma_watchdog.py"])
def test_a_non_utf8_config_is_refused_not_mangled(tmp_path, program):
    """Bytes that are not UTF-8 became U+FFFD and the rest of the file was used."""
    config = tmp_path / "config.json"
    config.write_bytes(b'{"engine": "main", "model": "\xff"}')
    proc = node_run([os.path.join(NODE_LIB, program), "--config", str(config)], timeout=20)
    assert proc.returncode == 78 and "is not UTF-8" in proc.stderr, proc.stderr


# ---- the watchdog -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["interval_s", "health_timeout_s", "probe_timeout_s", "busy_stall_s", "backoff_max_s",
                                 "rank_link_grace_s", "window_s"])  # fmt: skip
@pytest.mark.parametrize("value", [float("inf"), 1e308])
def test_watchdog_durations_are_bounded(key, value):
    """Infinity and 1e308 passed (only NaN and <= 0 were refused): stop.wait(inf) never
    returned, so the watchdog stopped ticking; a deadline of now + 1e308 never came."""
    with pytest.raises(UmaError) as err:
        logic.validate({"engine": "main", key: value})
    assert err.value.option == key


@pytest.mark.parametrize(
    "over, key",
    [
        ({"ram_gib": float("nan")}, "ram_gib"),  # int(nan * GIB): ValueError, a traceback at start
        ({"warn_floor_mib": float("inf")}, "warn_floor_mib"),  # int(inf): OverflowError at start
        ({"state_dir": ""}, "state_dir"),
        ({"state_dir": "relative"}, "state_dir"),
        ({"textfile_dir": "/a\nb"}, "textfile_dir"),
        ({"proc_root": 5}, "proc_root"),
        ({"engine": "m\u00e4in"}, "engine"),  # isalnum() took any Unicode letter; unit names are ASCII
        ({"unit": "a b"}, "unit"),
        ({"api_key_env": "A-B"}, "api_key_env"),
        ({"systemctl": "systemctl --force"}, "systemctl"),
        ({"leader_url": "http://x/status"}, "leader_url"),  # on rank 0: ignored without a word
        ({"base_url": "http://a b"}, "base_url"),
        ({"peers": [{"name": "ai2", "url": "http://a b/status"}], "status_port": 9411}, "peers"),
    ],
)
def test_watchdog_exact_types_and_paths(over, key):
    with pytest.raises(UmaError) as err:
        logic.validate(dict({"engine": "main"}, **over))
    assert err.value.option == key


def test_watchdog_refusal_names_the_file(tmp_path):
    config = tmp_path / "main.json"
    config.write_text(json.dumps({"engine": "main", "interval_s": 1e308}))
    with pytest.raises(UmaError) as err:
        wd.load_config(str(config))
    assert err.value.option == "interval_s" and str(config) in err.value.message


# ---- the guard's command line --------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, option",
    [
        (["--status-file", "/run/a\nb.json"], "--status-file"),  # a status file named across two lines
        (["--samples-file", "/run/a\nb.jsonl"], "--samples-file"),
        (["--proc-root", ""], "--proc-root"),  # not checked at all
        (["--sysfs-root", "/s\ny"], "--sysfs-root"),
        (["--threshold-mib", "\uff11\uff16"], "--threshold-mib"),  # fullwidth 16: int() took it
        (["--until-pid", "\u0661"], "--until-pid"),  # Arabic-Indic 1: int() took it (PID 1)
        (["--interval", "\uff10.\uff15"], "--interval"),
    ],
)
def test_guard_refuses_in_one_line(argv, option, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        uma_guard.parse_config(["--name", "x", "--mode", "files", "--paths", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert len(err.strip().splitlines()) == 1 and option in err, err  # no usage block before it


def test_check_config_validates_without_running(tmp_path):
    """--check-config: every program validates, says so in one line and exits (the harness's mode)."""
    model = tmp_path / "model"
    model.mkdir()
    guard = node_run([os.path.join(NODE_LIB, "uma_guard.py"), "--name", "x", "--mode", "files", "--paths",
                      str(model), "--check-config"])  # fmt: skip
    assert guard.returncode == 0 and "valid" in guard.stdout and not (tmp_path / "guard.json").exists()
    config = tmp_path / "w.json"
    config.write_text(json.dumps({"engine": "main", "state_dir": str(tmp_path / "state")}))
    dog = node_run([os.path.join(NODE_LIB, "uma_watchdog.py"), "--config", str(config), "--check-config"])
    assert dog.returncode == 0 and "valid" in dog.stdout and not (tmp_path / "state").exists()
    launch = node_run([os.path.join(NODE_LIB, "uma_launch.py"), "--engine", "e", "--health-url", "http://x/h",
                       "--node-config", str(tmp_path / "none.json"), "--state-dir", str(tmp_path / "state"),
                       "--check-config", "--", "true"])  # fmt: skip
    assert launch.returncode == 0 and "no launch.json" in launch.stdout and not (tmp_path / "state").exists()
