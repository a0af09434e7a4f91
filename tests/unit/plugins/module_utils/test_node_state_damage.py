# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Damaged state files and power loss (issue 22 items 1 and 4, the unit level).

Every state file a node program reads back (the watchdog's state.json and events.json, the
launch lock's holder, the guard's status the launcher reads after the guard) is read through
``_common.read_state``. A damaged one - empty, truncated, zeroed, not UTF-8, of the wrong JSON
type, NaN, nested too deep, huge, a directory, a FIFO, a symlink (to a file, dangling, a
loop) - is renamed to ``<file>.damaged-<UTC time>``, said once on stderr (the journal), and
the program goes on with a fresh state: never a traceback, never a silent rewrite.

Power loss: the real write paths of the watchdog, the guard, the launcher, the textfile
collector and the readahead record run in a subprocess from the flat directory the roles
install (``python3 -S``, no Ansible) and are SIGKILLed at random points (fixed seed); every
target file is then whole (the old or the new version, never half), and the programs start
again on it. Then each state file is truncated or zeroed and the real programs are started:
they start, say what they set aside, and carry on. A SIGKILL is not a power cut (the page
cache survives it); the fsyncs before and after the rename are what covers the cut itself.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import random
import signal
import subprocess
import time
import types

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base import metrics as _metrics
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import node as _launch_node
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd

NODE_PYTHON = node_helpers.NODE_PYTHON
GOOD = {dict: {"engine": "victim", "pid": 1, "epoch": 9}, list: [{"action": "victim"}]}


def _write(data):
    return lambda path, tmp: path.write_bytes(data)


def _symlink_to_good(kind):
    def make(path, tmp):
        victim = tmp / "victim.json"
        victim.write_text(json.dumps(GOOD[kind]))
        os.symlink(str(victim), str(path))

    return make


def damage_cases(kind):
    """(name, make(path, tmp_path)) for a state file that must hold a JSON ``kind``."""
    other = b"[]" if kind is dict else b"{}"
    truncated = b'{"phase": "heal' if kind is dict else b'[{"action": "restart", "at"'
    return [
        ("empty", _write(b"")),
        ("blank", _write(b" \n\t\n")),
        ("truncated", _write(truncated)),
        ("zeroed", _write(b"\0" * 4096)),
        ("not UTF-8", _write(b'{"reason": "\xff\xfe\xfd"}' if kind is dict else b'[{"reason": "\xff"}]')),
        ("a number", _write(b"7")),
        ("true", _write(b"true")),
        ("false", _write(b"false")),
        ("null", _write(b"null")),
        ("a string", _write(b'"state"')),
        ("the other container", _write(other)),
        ("NaN", _write(b"NaN")),
        # issue 36 item 4: numbers beyond any record's 64 bits (a float() of the first raised later)
        (
            "a 400-digit number",
            _write(b'{"epoch": 1' + b"0" * 400 + b"}" if kind is dict else b'[{"at": 1' + b"0" * 400 + b"}]"),
        ),
        ("1e400", _write(b'{"epoch": 1e400}' if kind is dict else b'[{"at": 1e400}]')),
        ("nested too deep", _write(b"[" * 200000)),
        ("huge", _write(b" " * _common.STATE_READ_CAP + (b"{}" if kind is dict else b"[]"))),
        ("a directory", lambda path, tmp: path.mkdir()),
        ("a FIFO", lambda path, tmp: os.mkfifo(str(path))),
        ("a symlink to a file", _symlink_to_good(kind)),
        ("a dangling symlink", lambda path, tmp: os.symlink(str(tmp / "nowhere"), str(path))),
        ("a symlink loop", lambda path, tmp: os.symlink(str(path), str(path))),
    ] + ([("an entry that is not an object", _write(b'[{"action": "x"}, 3]'))] if kind is list else [])


def watchdog_cfg(tmp_path):
    return node_helpers.watchdog_config(tmp_path, tmp_path / "state", tmp_path / "textfile", interval_s=0.2)


# ---- each reader, each damage: set aside, said once, fresh state


def _read_watchdog_state(tmp_path, path):
    dog = wd.Watchdog(wd.load_config(str(watchdog_cfg(tmp_path))))
    assert dog.state["epoch"] == 0 and dog.mine["acked_stop"] == 0  # fresh
    dog.publish()
    assert json.loads(path.read_text())["engine"] == "main"  # and the program goes on writing it


def _read_watchdog_events(tmp_path, path):
    dog = wd.Watchdog(wd.load_config(str(watchdog_cfg(tmp_path))))
    assert dog.events == []
    dog.record("test", "after a damaged events.json")
    assert [e["action"] for e in json.loads(path.read_text())] == ["test"]


def _read_lock_holder(tmp_path, path):
    lock = _launch_node.LaunchLock(str(path)[: -len(".holder")], "e1")
    assert lock.holder() is None
    assert lock.try_acquire() and json.loads(path.read_text())["engine"] == "e1"
    lock.release()


def _read_guard_status(tmp_path, path):
    guard = subprocess.Popen(["true"])
    guard.wait()
    log = uma_launch.Log("e1", out=io.StringIO())
    stand_in = types.SimpleNamespace(guard=guard, record_dir=str(path.parent), record={}, log=log)
    uma_launch.Launch.stop_guard(stand_in)
    assert stand_in.record["guard_status"] is None and "guard-stopped" in log.out.getvalue()


def _read_metrics(tmp_path, path):
    # no "latest" link: the collector falls back to the kept records, r1/launch.json among them
    none = str(tmp_path / "none")
    samples = _metrics.collect(str(tmp_path / "state"), str(tmp_path / "run"), none, none)
    assert not [s for s in samples if s[1].get("engine") == "e1"]  # nothing from the damaged file
    assert ("uma_vllm_textfile_source_ok", {"source": "launches"}, 1) in samples or "launches" not in str(path)


def _read_shm_record(tmp_path, path):
    # the launcher's note of the engine's shared-memory segments (node/launch/shm.py), read at its start
    config = uma_launch.validate(uma_launch.merge_config({
        "engine": "e1", "command": ["true"], "health_url": "http://127.0.0.1:1/health",
        "state_dir": str(tmp_path / "state"), "lock_path": str(tmp_path / "run" / "launch.lock"),
    }))  # fmt: skip
    launch = uma_launch.Launch(config, uma_launch.Log("e1", out=io.StringIO()))
    launch.sweep_shm(left=True)
    assert launch.shm.segments == {} and "shm_swept" not in launch.record  # nothing followed, nothing removed


READERS = [
    ("watchdog state.json", "state/watchdog/main/state.json", dict, _read_watchdog_state),
    ("launcher shm/segments.json", "state/launches/e1/shm/segments.json", dict, _read_shm_record),
    ("watchdog events.json", "state/watchdog/main/events.json", list, _read_watchdog_events),
    ("launch lock holder", "run/launch.lock.holder", dict, _read_lock_holder),
    ("guard status (launcher)", "state/launches/e1/r1/guard.json", dict, _read_guard_status),
]


def _cases(readers):
    return [
        pytest.param(relative, kind, read, damage, make, id="%s: %s" % (name, damage))
        for name, relative, kind, read in readers
        for damage, make in damage_cases(kind)
    ]


CASES = _cases(READERS)
# Records the textfile collector only reports on (the launcher's, a guard's): named once, left in place
OTHERS = [
    ("launch record (textfile collector)", "state/launches/e1/r1/launch.json", dict, _read_metrics),
    ("guard status (textfile collector)", "run/guard-e1.json", dict, _read_metrics),
]
OTHER_CASES = _cases(OTHERS)


@pytest.mark.parametrize("relative, kind, read, damage, make", OTHER_CASES)
def test_a_damaged_record_of_another_program_is_named_once_and_left_in_place(
    tmp_path, capsys, relative, kind, read, damage, make
):
    """Issue 36 item 4: the textfile collector renamed the launcher's damaged launch.json (and a guard's
    status) aside, hiding it from its owner and from oom_diagnose; a reader now leaves it where it is."""
    path = tmp_path / relative
    path.parent.mkdir(parents=True)
    make(path, tmp_path)
    before = sorted(os.listdir(path.parent))
    getattr(_common, "_SAID", set()).clear()  # each case is a new start of the program
    read(tmp_path, path)
    read(tmp_path, path)  # the timer's next sample in the same process: said once
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if str(path) in line]
    assert "Traceback" not in err
    assert len(said) == 1 and "left in place for its owner, not read" in said[0], err
    assert sorted(os.listdir(path.parent)) == before  # nothing renamed, nothing written beside it


@pytest.mark.parametrize("relative, kind, read, damage, make", CASES)
def test_a_damaged_state_file_is_set_aside_said_once_and_the_program_goes_on(
    tmp_path, capsys, relative, kind, read, damage, make
):
    path = tmp_path / relative
    path.parent.mkdir(parents=True)
    make(path, tmp_path)
    victim = tmp_path / "victim.json"
    victim_before = victim.read_bytes() if victim.exists() else None
    getattr(_common, "_SAID", set()).clear()  # each case is a new start of the program
    read(tmp_path, path)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if str(path) in line]
    assert "Traceback" not in err
    assert len(said) == 1, err
    aside = [n for n in os.listdir(path.parent) if n.startswith(path.name + ".damaged-")]
    assert len(aside) == 1 and "set aside as %s" % (path.parent / aside[0]) in said[0], said
    assert "starting fresh" in said[0]
    if victim_before is not None:
        assert victim.read_bytes() == victim_before  # a symlink is moved, its target never touched
    # read again (the next start): the fresh file the program wrote is whole, nothing more to say
    assert _common.read_state(str(path), kind) is not None or not path.exists()  # the holder goes at release
    assert str(path) not in capsys.readouterr().err


def test_a_file_that_cannot_be_renamed_is_ignored_and_said_once(tmp_path, capsys, monkeypatch):
    path = tmp_path / "ro" / "state.json"
    path.parent.mkdir()
    path.write_text("7")
    getattr(_common, "_SAID", set()).clear()  # each case is a new start of the program

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_common.os, "rename", refuse)  # a read-only directory, as root would not see one
    assert _common.read_state(str(path), dict, prog="t") is None
    assert _common.read_state(str(path), dict, prog="t") is None
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert err.count(str(path)) == 1 and "left in place and ignored (cannot rename it: Permission denied)" in err
    assert path.read_text() == "7"


def test_a_good_state_file_is_read_and_nothing_is_said(tmp_path, capsys):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"epoch": 3}))
    assert _common.read_state(str(path), dict) == {"epoch": 3}
    assert _common.read_state(str(tmp_path / "absent.json"), dict) is None
    assert capsys.readouterr().err == "" and os.listdir(tmp_path) == ["state.json"]


# ---- the real programs, as the node runs them


ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}


def run_watchdog(lib, cfg, ticks=1):
    return subprocess.run(
        [NODE_PYTHON, "-S", str(lib / "uma_watchdog.py"), "--config", str(cfg), "--ticks", str(ticks)],
        env=ENV, cwd="/", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("content", ["7", "true", '"x"', '{"a": 1}', "[1, 2]"])
def test_the_watchdog_starts_on_a_damaged_events_file(tmp_path, content):
    """Regression: a number or true crashed the watchdog at start (a restart loop); a string or an
    object was silently rewritten."""
    lib = node_helpers.flat_copy(tmp_path)
    cfg = watchdog_cfg(tmp_path)
    events = tmp_path / "state" / "watchdog" / "main" / "events.json"
    events.parent.mkdir(parents=True)
    events.write_text(content)
    proc = run_watchdog(lib, cfg)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if str(events) in line]
    assert len(said) == 1 and "set aside as %s.damaged-" % events in said[0], proc.stderr
    aside = [n for n in os.listdir(events.parent) if n.startswith("events.json.damaged-")]
    assert (events.parent / aside[0]).read_text() == content  # kept as evidence
    assert isinstance(json.loads(events.read_text()), list)


# ---- power loss: SIGKILL at random points of the writes

DRIVER = r"""
import json, os, sys, types
lib, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, lib)
from uma_vllm_node.base import blockdev as _blockdev, metrics as _metrics
from uma_vllm_node.guard import status as _guard_status
from uma_vllm_node.launch import node as _launch_node, program as uma_launch
from uma_vllm_node.watchdog import program as uma_watchdog

dog = uma_watchdog.Watchdog(uma_watchdog.load_config(os.path.join(root, "watchdog.json")))
lock = _launch_node.LaunchLock(os.path.join(root, "run", "launch.lock"), "e1")
log = types.SimpleNamespace(line=lambda text: sys.stderr.write(text + "\n"))
rec = types.SimpleNamespace(record_dir=os.path.join(root, "state", "launches", "e1", "r1"), record={}, log=log)
pad = "p" * 100000
none = os.path.join(root, "none")
print("ready", flush=True)
i = 0
while True:
    i += 1
    dog.state["reason"] = "%d %s" % (i, pad)
    dog.publish()  # state.json and the watchdog's textfile
    dog.record("tick", "i=%d" % i, {"pad": pad[:3000]})  # events.json
    _guard_status.write_status(os.path.join(rec.record_dir, "guard.json"), {"i": i, "pad": pad})
    _guard_status._replace_file(os.path.join(root, "run", "guard-e1.json"), json.dumps({"i": i, "pad": pad}))
    if lock.try_acquire():  # the holder
        lock.release()
    rec.record = {"i": i, "pad": pad}
    uma_launch.Launch.write_record(rec)  # launch.json and latest
    _blockdev.write_record(os.path.join(root, "state", "readahead-w.json"), {"devices": [], "i": i, "pad": pad})
    _metrics.main(["--output", os.path.join(root, "textfile", "uma_vllm.prom"), "--state-dir",
                   os.path.join(root, "state"), "--run-dir", os.path.join(root, "run"),
                   "--sysctl-file", os.path.join(none, "x"), "--proc-root", none])
"""
PAD = "p" * 100000
JSON_TARGETS = {
    "state/watchdog/main/state.json": lambda d: isinstance(d, dict) and d["reason"].endswith(" " + PAD),
    "state/watchdog/main/events.json": lambda d: all(e["evidence"]["pad"] == PAD[:3000] for e in d),
    "state/launches/e1/r1/guard.json": lambda d: d["pad"] == PAD,
    "run/guard-e1.json": lambda d: d["pad"] == PAD,
    "run/launch.lock.holder": lambda d: d["engine"] == "e1" and isinstance(d["pid"], int),
    "state/launches/e1/r1/launch.json": lambda d: d["pad"] == PAD,
    "state/launches/e1/latest/launch.json": lambda d: d["pad"] == PAD,
    "state/readahead-w.json": lambda d: d["pad"] == PAD,
}
PROM_TARGETS = ("textfile/uma_vllm_watchdog_main.prom", "textfile/uma_vllm.prom")
KINDS = {"state/watchdog/main/events.json": list}
ITERATIONS = int(os.environ.get("UMA_SIGKILL_ITERATIONS", "50"))


def _check_whole(root):
    """Every target is absent or whole: JSON of its shape with the full padding, a textfile with its last line."""
    seen = 0
    for relative, whole in JSON_TARGETS.items():
        path = os.path.join(root, relative)
        if os.path.exists(path):
            with open(path, "rb") as handle:
                data = json.loads(handle.read().decode("utf-8"))
            assert whole(data), "%s is not whole" % relative
            seen += 1
    for relative in PROM_TARGETS:
        path = os.path.join(root, relative)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            assert text.endswith("\n"), relative
            for line in text.splitlines():  # every sample line whole: a name and a number
                assert line.startswith("#") or float(line.rsplit(" ", 1)[1]) == float(line.rsplit(" ", 1)[1]), line
            seen += 1
    return seen


def test_sigkill_at_random_points_of_the_writes_leaves_every_file_whole(tmp_path, capsys):
    lib = node_helpers.flat_copy(tmp_path)
    cfg = watchdog_cfg(tmp_path)
    for name in ("run", "none"):
        (tmp_path / name).mkdir()
    rng = random.Random(22)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    mid_write = files_checked = 0
    started = time.monotonic()
    for _iteration in range(ITERATIONS):
        before = _temps(tmp_path)
        proc = subprocess.Popen(
            [NODE_PYTHON, "-S", str(driver), str(lib), str(tmp_path)],
            env=ENV, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(rng.uniform(0.0, 0.08))
        proc.send_signal(signal.SIGKILL)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL and "Traceback" not in err, err
        mid_write += len(_temps(tmp_path) - before) > 0  # the kill landed between a temp file's open and rename
        files_checked += _check_whole(str(tmp_path))
        getattr(_common, "_SAID", set()).clear()  # each case is a new start of the program
        for relative in JSON_TARGETS:  # what the programs read back at start: nothing to set aside
            assert (
                _common.read_state(str(tmp_path / relative), KINDS.get(relative, dict)) is not None
                or not (tmp_path / relative).exists()
            )
        assert capsys.readouterr().err == ""
    proc = run_watchdog(lib, cfg, ticks=2)  # and the real watchdog starts on what the kills left
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "set aside" not in proc.stderr, proc.stderr
    with capsys.disabled():
        print(
            "\n[power loss] %d SIGKILLs (seed 22), %d landed mid-write (a temp file left), %d files checked whole, "
            "0 half-written, %.1f s" % (ITERATIONS, mid_write, files_checked, time.monotonic() - started)
        )
    assert mid_write > 0  # the test did kill writes in flight, not only the idle program


def _temps(root):
    found = set()
    for dirpath, _dirs, names in os.walk(str(root)):
        found.update(os.path.join(dirpath, n) for n in names if n.endswith(".tmp") and n.startswith("."))
    return found


ZEROING = [
    ("truncated", lambda data, rng: data[: rng.randrange(1, len(data) - 2)]),  # never only the final newline
    ("zeroed", lambda data, rng: b"\0" * len(data)),
    ("emptied", lambda data, rng: b""),
]


@pytest.mark.parametrize("how, damage", ZEROING, ids=[z[0] for z in ZEROING])
def test_each_state_file_truncated_or_zeroed_then_the_programs_start_again(tmp_path, how, damage):
    lib = node_helpers.flat_copy(tmp_path)
    cfg = watchdog_cfg(tmp_path)
    rng = random.Random(how)
    assert run_watchdog(lib, cfg, ticks=2).returncode == 0  # the watchdog's own state and events
    run = tmp_path / "run"
    run.mkdir()
    holder = run / "launch.lock.holder"
    holder.write_text(json.dumps({"engine": "other", "pid": os.getpid(), "since": time.time()}))
    state_dir = tmp_path / "state" / "watchdog" / "main"
    damaged = [state_dir / "state.json", state_dir / "events.json", holder]
    for path in damaged:
        path.write_bytes(damage(path.read_bytes(), rng))
    proc = run_watchdog(lib, cfg, ticks=2)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    for path in damaged[:2]:
        said = [line for line in proc.stderr.splitlines() if "state file %s " % path in line]
        assert len(said) == 1 and "set aside as %s.damaged-" % path in said[0], proc.stderr
        assert json.loads(path.read_text())  # written fresh
    # the launcher: the lock is held by another engine, whose holder file is damaged
    model = tmp_path / "model"
    model.mkdir()
    fd = os.open(str(run / "launch.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        proc = subprocess.run(
            [NODE_PYTHON, "-S", str(lib / "uma_launch.py"), "--engine", "e1", "--node-config", "/nonexistent",
             "--health-url", "http://127.0.0.1:1/health", "--model-path", str(model), "--lock-path",
             str(run / "launch.lock"), "--lock-timeout", "0.5", "--state-dir", str(tmp_path / "state"), "--", "true"],
            env=ENV, cwd="/", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.close(fd)
    assert proc.returncode == uma_launch.EXIT_LOCK_TIMEOUT and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "state file %s " % holder in line]
    assert len(said) == 1 and "set aside as %s.damaged-" % holder in said[0], proc.stderr
    assert "lock-timeout" in proc.stdout


@pytest.mark.parametrize("reason", ["null", "7", '{"why": "x"}', '["a"]'])
def test_a_gave_up_state_whose_reason_is_not_text_keeps_the_verdict_and_every_tick_runs(tmp_path, reason):
    """Issue 36: state.json {"phase": "gave_up", "reason": null} made every tick fail with a TypeError,
    forever. The verdict is kept (the engine stays stopped, as the watchdog left it) and the reason says
    what was recorded; the ticks run."""
    lib = node_helpers.flat_copy(tmp_path)
    cfg = watchdog_cfg(tmp_path)
    state = tmp_path / "state" / "watchdog" / "main" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text('{"phase": "gave_up", "reason": %s, "epoch": 3}' % reason)
    proc = run_watchdog(lib, cfg, ticks=3)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    assert "tick failed" not in proc.stdout, proc.stdout  # was: "tick failed: TypeError" at every tick
    now = json.loads(state.read_text())
    assert now["phase"] == "gave_up" and now["epoch"] == 3
    assert now["reason"] == "gave up before this watchdog started (its recorded reason was not text: %s)" % reason


@pytest.mark.parametrize(
    "content, said, kept",
    [
        ('{"phase": "gave_up", "reason": null, "epoch": 3}', ["reason = null is not text"], {"epoch": 3}),
        ('{"phase": "healthy", "epoch": true, "acked_stop": "2", "acked_start": 1}',
         ['epoch = true is not a whole number >= 0', 'acked_stop = "2" is not a whole number >= 0'], {"epoch": 0}),
        ('{"phase": "stopped", "epoch": -4, "counts": {"restarts": 1.5, "wedges": 2, "later": "x"}}',
         ["epoch = -4 is not a whole number >= 0", "counts.restarts = 1.5 is not a whole number >= 0"],
         {"epoch": 0, "counts": {"restarts": 0, "wedges": 2}}),
        ('{"phase": ["gave_up"], "counts": [1, 2]}',
         ['phase = ["gave_up"] is not one of starting, healthy', "counts = [1, 2] is not an object of counters"],
         {"epoch": 0}),
    ],
    ids=["gave_up reason null", "epoch true, acked_stop text", "negative epoch, a float count", "phase a list"],
)  # fmt: skip
def test_each_field_of_the_watchdog_state_is_checked_at_read_and_named_once(tmp_path, content, said, kept):
    """Issue 36: state.json was read field by field with isinstance(int) (true and -4 were taken as epochs)
    or not at all (reason), and nothing said which field was wrong. Now each field is checked where the
    file is read; a bad one is named once in the journal with its value, a fresh watchdog's value is used
    for it, the ticks run, and the next start has nothing to say (the file was rewritten)."""
    lib = node_helpers.flat_copy(tmp_path)
    cfg = watchdog_cfg(tmp_path)
    state = tmp_path / "state" / "watchdog" / "main" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(content)
    proc = run_watchdog(lib, cfg, ticks=3)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "tick failed" not in proc.stdout, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "state file %s: " % state in line]
    assert len(lines) == 1, proc.stdout
    for text in said:
        assert text in lines[0], lines[0]
    now = json.loads(state.read_text())
    for key, value in kept.items():
        assert now[key] == value if key != "counts" else all(now[key][k] == v for k, v in value.items()), now
    assert all(isinstance(now[k], int) and not isinstance(now[k], bool) and now[k] >= 0 for k in wd.STATE_EPOCHS), now
    again = run_watchdog(lib, cfg, ticks=1)
    assert "state file" not in again.stdout and again.returncode == 0, again.stdout


def test_the_watchdogs_own_state_reads_back_whole(tmp_path):
    """What publish() writes is what read_back takes, every field, nothing said."""
    dog = wd.Watchdog(wd.load_config(str(watchdog_cfg(tmp_path))))
    dog.state["epoch"], dog.state["counts"]["restarts"], dog.mine["acked_stop"] = 4, 2, 3
    for phase in ("gave_up", "restart_stop", None):
        dog.publish_phase = phase
        good, problems = wd.read_back(json.loads(json.dumps(dog.snapshot())))
        assert problems == [] and good["epoch"] == 4 and good["counts"]["restarts"] == 2 and good["acked_stop"] == 3


def _wait_behind_a_holder(tmp_path, record):
    """A waiting launcher (0.5 s) behind a held launch lock whose holder record is ``record``:
    (acquired, the launcher's log, the holder record's path)."""
    lock_path = tmp_path / "launch.lock"
    holder = tmp_path / "launch.lock.holder"
    holder.write_text(json.dumps(record))
    fd = os.open(str(lock_path), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    out = io.StringIO()
    try:
        lock = _launch_node.LaunchLock(str(lock_path), "e1")
        got = _launch_node.acquire_lock(lock, 0.5, _launch_node.Log("e1", out=out), say_every=0.1)
    finally:
        os.close(fd)
    return got, out.getvalue(), holder


@pytest.mark.parametrize(
    "record",
    [
        {"engine": "other", "pid": os.getpid(), "since": "yesterday"},
        {"engine": "other", "pid": os.getpid(), "since": 1e300},
        {"engine": "other", "pid": 10**30, "since": 1.0},
        {"engine": "other", "pid": True, "since": 1.0},
        {"engine": ["x"], "pid": os.getpid(), "since": 1.0},
    ],
)
def test_a_waiting_launcher_reads_a_holder_record_of_the_wrong_types_without_a_traceback(tmp_path, record):
    """Issue 36: a lock holder whose fields had the wrong type crashed a waiting launcher (time.localtime of
    a string, os.kill of a huge pid). Now the record is set aside and named; the launcher waits, says for
    whom it cannot tell, and times out as it would."""
    got, text, _holder = _wait_behind_a_holder(tmp_path, record)
    lock_path = tmp_path / "launch.lock"
    assert got is False and "waiting for the launch lock %s held by engine ? (pid ?, since ?)" % lock_path in text
    assert "lock-timeout" in text
    assert [n for n in os.listdir(tmp_path) if n.startswith("launch.lock.holder.damaged-")]  # set aside, named


@pytest.mark.parametrize(
    "record, said",
    [
        ({"engine": "other", "pid": "4711", "since": 1.0}, 'its pid = "4711" is not a process id (a whole number'),
        ({"engine": "other", "pid": [4711], "since": 1.0}, "its pid = [4711] is not a process id"),
        ({"engine": "other", "pid": os.getpid(), "since": {"at": 1}}, 'its since = {"at": 1} is not a time'),
        ({"engine": 7, "pid": os.getpid(), "since": 1.0}, "its engine = 7 is not text"),
    ],
    ids=["pid text", "pid a list", "since an object", "engine a number"],
)
def test_a_holder_record_of_the_wrong_types_is_named_with_its_field_and_value_once(tmp_path, capsys, record, said):
    """Issue 36: the journal line for a bad lock holder named the field but not what was in it. Now it says
    the file, the field, the value and what it must be, once (the waiting launcher asks every tick), and
    where the record went; the wait goes on as for a holder it cannot name."""
    got, text, holder = _wait_behind_a_holder(tmp_path, record)
    lines = [line for line in capsys.readouterr().err.splitlines() if str(holder) in line]
    assert got is False and len(lines) == 1, lines
    assert lines[0].startswith("vllm-uma-launch: state file %s %s" % (holder, said)), lines[0]
    assert "set aside as %s.damaged-" % holder in lines[0]
    assert "held by engine ? (pid ?, since ?)" in text
