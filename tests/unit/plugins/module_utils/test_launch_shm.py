# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine's shared-memory segments (node/launch/shm.py): what a killed engine leaves in
/dev/shm is removed once its processes are gone, and nothing else is touched.

Real parts: the kernel's /dev/shm (tmpfs) and /proc/<pid>/maps, real Python ``SharedMemory``
segments and named semaphores made by real child processes (unregistered from the resource
tracker, as vLLM's message queues are), killed with SIGKILL as an unclean engine stop is; the
launcher's own steps (``Launch.start_engine``, ``wait_healthy``, ``cleanup``) drive it.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from multiprocessing import shared_memory

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import shm as _shm

SHM = "/dev/shm"
pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm on this machine")

# An engine stand-in: a parent that forks a worker; both map segments as vLLM's processes do (the
# parent a SharedMemory queue and a named semaphore, the worker another queue), then it prints the
# names and waits. Neither ever unlinks anything: it is killed.
ENGINE = r"""
import multiprocessing as mp, os, sys, time
from multiprocessing import resource_tracker, shared_memory

def keep(seg):
    resource_tracker.unregister(seg._name, "shared_memory")  # as vLLM's shm_broadcast does
    return seg

def worker(out):
    seg = keep(shared_memory.SharedMemory(create=True, size=1 << 20))
    seg.buf[:4] = b"work"
    open(out + ".worker", "w").write(seg.name)
    time.sleep(600)

out = sys.argv[1]
seg = keep(shared_memory.SharedMemory(create=True, size=4 << 20))
seg.buf[: 1 << 20] = b"x" * (1 << 20)  # resident pages, as a used queue has
lock = mp.get_context("fork").Lock()
sem = getattr(lock, "_semlock").name  # "/mp-XXXX" while it is linked (it may be unlinked already)
child = mp.get_context("fork").Process(target=worker, args=(out,))
child.start()
while not os.path.exists(out + ".worker"):
    time.sleep(0.02)
open(out, "w").write(" ".join([seg.name, sem or "-", str(child.pid)]))
time.sleep(600)
"""


def _wait_for(path, timeout=30.0):
    end = time.monotonic() + timeout
    while not os.path.exists(path) or not open(path).read():
        assert time.monotonic() < end, "the stand-in never wrote %s" % path
        time.sleep(0.05)
    return open(path).read()


def _config(tmp_path, out, **extra):
    return uma_launch.validate(
        uma_launch.merge_config(
            {
                "engine": "shm1",
                "command": [sys.executable, "-c", ENGINE, str(out)],
                "health_url": "http://127.0.0.1:1/health",
                "state_dir": str(tmp_path / "state"),
                "lock_path": str(tmp_path / "lock"),
                "stop_timeout_s": 5.0,
                **extra,
            }
        )
    )


@pytest.fixture
def foreign():
    """A segment of another workload, made before the engine starts and still mapped by it, and one
    made after the start that no engine process maps: neither is the engine's."""
    made = []
    yield made
    for seg in made:
        try:
            seg.close()
            seg.unlink()
        except FileNotFoundError:
            pass


def _started(tmp_path, **extra):
    out = tmp_path / "engine.names"
    launch = uma_launch.Launch(_config(tmp_path, out, **extra), uma_launch.Log("shm1", out=io.StringIO()))
    launch.start_engine()
    seg, sem, child = _wait_for(str(out)).split()
    worker = _wait_for(str(out) + ".worker")
    return launch, seg, worker, (None if sem == "-" else sem.lstrip("/")), int(child)


def _kill_tree(launch, child):
    """SIGKILL to every process of the engine's tree (the stand-in, its worker and the resource
    tracker Python starts for SharedMemory), as systemd's KillMode=control-group does."""
    tree = set(_shm.process_tree([launch.engine.pid, child])) | set(launch.shm.pids if launch.shm else ())
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launch.engine.wait(timeout=10)
    end = time.monotonic() + 10
    while any(_shm._stat_fields("/proc", pid) for pid in tree):
        assert time.monotonic() < end, "the stand-in's processes did not die"
        time.sleep(0.05)


def test_a_killed_engines_segments_are_removed_and_nothing_else(tmp_path, foreign):
    before = shared_memory.SharedMemory(create=True, size=1 << 16)  # another workload's, older than the start
    foreign.append(before)
    time.sleep(_shm.CREATED_SLACK_S + 0.1)
    launch, seg, worker, sem, child = _started(tmp_path)
    after = shared_memory.SharedMemory(create=True, size=1 << 16)  # made during the run, mapped by the test only
    foreign.append(after)
    try:
        launch.track_shm(force=True)
        tracked = set(launch.shm.segments)
        assert {seg, worker} <= tracked, (tracked, launch.log.out.getvalue())
        if sem is not None and os.path.exists(os.path.join(SHM, "sem." + sem)):
            assert "sem." + sem in tracked
        assert before.name not in tracked and after.name not in tracked
        record = json.loads((tmp_path / "state" / "launches" / "shm1" / "shm" / "segments.json").read_text())
        assert set(record["segments"]) == tracked and record["dir"] == SHM
        pids = [pid for pid, _start in record["pids"]]
        assert launch.engine.pid in pids and child in pids
    finally:
        _kill_tree(launch, child)  # an unclean stop: vLLM unlinks nothing
    assert os.path.exists(os.path.join(SHM, seg)) and os.path.exists(os.path.join(SHM, worker))
    launch.cleanup()
    for name in tracked:
        assert not os.path.exists(os.path.join(SHM, name)), name
    # the other workload's segments are there, with their contents
    assert os.path.exists(os.path.join(SHM, before.name)) and os.path.exists(os.path.join(SHM, after.name))
    (swept,) = launch.record["shm_swept"]
    assert swept["removed"] == len(tracked) and swept["mib"] >= 1.0 and not swept["left"]
    assert re.search(r"shm-swept t=[0-9.]+ removed=%d mib=" % len(tracked), launch.log.out.getvalue())
    assert not (tmp_path / "state" / "launches" / "shm1" / "shm" / "segments.json").exists()


def test_nothing_is_removed_while_a_process_of_the_engine_still_runs(tmp_path):
    launch, seg, worker, _sem, child = _started(tmp_path)
    try:
        launch.track_shm(force=True)
        os.kill(launch.engine.pid, signal.SIGKILL)  # the worker lives on (it holds its segment)
        launch.engine.wait(timeout=10)
        started = time.monotonic()
        done = launch.shm.sweep(wait_s=0.5)
        assert time.monotonic() - started >= 0.5
        assert child in done["running"] and launch.engine.pid not in done["running"] and done["removed"] == []
        assert os.path.exists(os.path.join(SHM, seg)) and os.path.exists(os.path.join(SHM, worker))
        assert (tmp_path / "state" / "launches" / "shm1" / "shm" / "segments.json").exists()  # kept for the next start
    finally:
        _kill_tree(launch, child)
    # the next start of the engine (a launcher that was itself killed left them): swept first
    nxt = uma_launch.Launch(_config(tmp_path, tmp_path / "unused"), uma_launch.Log("shm1", out=io.StringIO()))
    nxt.sweep_shm(left=True)
    assert not os.path.exists(os.path.join(SHM, seg)) and not os.path.exists(os.path.join(SHM, worker))
    assert re.search(r"shm-swept-left t=[0-9.]+ removed=2 mib=", nxt.log.out.getvalue())
    assert nxt.record["shm_swept"][0]["left"] is True


def test_a_segment_replaced_by_another_file_of_the_same_name_is_kept(tmp_path):
    launch, seg, worker, _sem, child = _started(tmp_path)
    launch.track_shm(force=True)
    _kill_tree(launch, child)
    os.unlink(os.path.join(SHM, seg))  # vLLM removed it itself ...
    replacement = os.path.join(SHM, seg)
    with open(replacement, "wb") as handle:  # ... and something else took the name since
        handle.write(b"not the engine's")
    try:
        done = launch.shm.sweep()
        assert done["kept"] == {seg: "another file now"} and done["removed"] == [worker]
        assert open(replacement, "rb").read() == b"not the engine's"
    finally:
        os.unlink(replacement)


def test_shm_sweep_false_tracks_and_removes_nothing(tmp_path):
    launch, seg, worker, _sem, child = _started(tmp_path, shm_sweep=False)
    assert launch.shm is None
    launch.track_shm(force=True)
    _kill_tree(launch, child)
    launch.cleanup()
    try:
        assert os.path.exists(os.path.join(SHM, seg)) and os.path.exists(os.path.join(SHM, worker))
        assert "shm_swept" not in launch.record
    finally:
        for name in (seg, worker):
            os.unlink(os.path.join(SHM, name))


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{", "not JSON"),
        (json.dumps({"dir": "/dev/shm", "since": 1.0, "pids": [[1, "x"]], "segments": {}}), "pids"),
        (json.dumps({"dir": "/dev/shm", "since": 1.0, "pids": [], "segments": {"../etc/passwd": 1}}), "segments"),
        (json.dumps({"dir": "rel", "since": 1.0, "pids": [], "segments": {}}), "dir"),
        (json.dumps({"dir": "/dev/shm", "since": True, "pids": [], "segments": {}}), "since"),
    ],
)
def test_a_damaged_record_is_set_aside_and_named_never_followed(tmp_path, capsys, content, problem):
    record = tmp_path / "state" / "launches" / "shm1" / "shm" / "segments.json"
    record.parent.mkdir(parents=True)
    record.write_text(content)
    launch = uma_launch.Launch(_config(tmp_path, tmp_path / "unused"), uma_launch.Log("shm1", out=io.StringIO()))
    launch.sweep_shm(left=True)
    err = capsys.readouterr().err
    assert str(record) in err and "starting fresh" in err, err
    assert problem in err or problem == "not JSON", err
    assert not record.exists() and list(record.parent.glob("segments.json.damaged-*"))
    assert "shm_swept" not in launch.record


def test_the_names_are_vllms_and_pythons_only():
    for name in ("psm_0a1b2c3d", "sem.mp-abc_123"):
        assert _shm.NAME_RE.match(name)
    for name in ("psm_", "psm_XYZ", "model.safetensors", "sem.other", "psm_0a/../x", "nccl-123", ".psm_00"):
        assert not _shm.NAME_RE.match(name), name


def test_maps_lines_give_device_and_inode():
    lines = [
        "7f00-7f10 rw-s 00000000 00:1a 4242                       /dev/shm/psm_0a1b2c3d",
        "7f10-7f20 r-xp 00000000 fd:01 99                         /usr/lib/libc.so.6",
        "7f20-7f30 rw-p 00000000 00:00 0                          [heap]",
        "garbage",
    ]
    assert _shm.parse_maps(lines) == {(os.makedev(0, 0x1A), 4242), (os.makedev(0xFD, 1), 99)}


NOBODY_SEGMENT = r"""
import sys, time
from multiprocessing import resource_tracker, shared_memory
seg = shared_memory.SharedMemory(create=True, size=1 << 16)
resource_tracker.unregister(seg._name, "shared_memory")
print(seg.name, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access("/usr/bin/python3", os.X_OK),
    reason="changing uid needs root and a system python3",
)
def test_maps_of_another_users_process_are_read_as_that_user(monkeypatch):
    """On a node the launcher is root without CAP_SYS_PTRACE (the unit's capability set for an engine
    user), and the kernel refuses it the maps of the engine user's processes. That refusal is made
    here by the test (this sandbox's root has the capability): the launcher's own read of that pid's
    maps raises PermissionError; the fallback is real - a child as user nobody reads the maps of a
    real process of nobody that maps a real segment."""
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-c", NOBODY_SEGMENT], user=65534, group=65534, stdout=subprocess.PIPE, cwd="/"
    )
    try:
        name = proc.stdout.readline().decode().strip()
        info = os.stat(os.path.join(SHM, name))
        assert info.st_uid == 65534
        real_open = open

        def refused(path, *args, **kwargs):
            if str(path) == "/proc/%d/maps" % proc.pid:
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(_shm, "open", refused, raising=False)
        found, denied = _shm.mapped_files([proc.pid], "/proc", None)
        assert denied == [proc.pid] and proc.pid not in found  # no identity: not read
        found, denied = _shm.mapped_files(
            [proc.pid], "/proc", {"uid": 65534, "gid": 65534}, python="/usr/bin/python3"
        )  # fmt: skip
        assert denied == [] and (info.st_dev, info.st_ino) in found[proc.pid]
    finally:
        proc.kill()
        proc.wait()
        try:
            os.unlink(os.path.join(SHM, name))
        except (OSError, UnboundLocalError):
            pass


def test_the_as_user_reader_reads_what_the_launcher_reads():
    """The child's program, run for real on this process's own maps, finds what parse_maps finds."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", _shm._MAPS_AS_USER, str(os.getpid())],
        capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    lines = done.stdout.decode().splitlines()
    assert lines and all(len(line.split()) == 3 and line.split()[0] == str(os.getpid()) for line in lines)
    mine = _shm.parse_maps(open("/proc/%d/maps" % os.getpid()).read().splitlines())
    theirs = _shm.parse_maps("x x x %s" % line.split(None, 1)[1] for line in lines)
    assert len(mine) > 10 and len(theirs & mine) >= 0.9 * len(mine), (len(theirs & mine), len(mine))


def test_the_launcher_config_checks_the_new_keys(tmp_path):
    from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError

    with pytest.raises(UmaError, match="shm_dir"):
        _config(tmp_path, tmp_path / "x", shm_dir="relative/dir")
    with pytest.raises(UmaError, match="shm_sweep"):
        _config(tmp_path, tmp_path / "x", shm_sweep="maybe")
    assert pathlib.Path(_config(tmp_path, tmp_path / "x")["shm_dir"]) == pathlib.Path(SHM)


def test_a_look_that_hangs_never_holds_up_the_launcher(tmp_path):
    """Reading a process's maps waits for its memory-map lock (a process stuck in a driver can hold it)
    and ``docker inspect`` for the daemon: the look runs in its own thread, the launcher waits for it
    SHM_LOOK_WAIT_S at most. The hang here is real: the engine's maps file is a FIFO nobody writes
    (a proc_root made for the test, its stat lines in the kernel's format)."""
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    proc = tmp_path / "proc"
    cfg = _config(tmp_path, tmp_path / "unused", command=["sleep", "30"], shm_dir=str(shm_dir), proc_root=str(proc))
    launch = uma_launch.Launch(cfg, uma_launch.Log("shm1", out=io.StringIO()))
    launch.start_engine()
    try:
        pid = launch.engine.pid
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text("%d (sleep) S 1 %s 4242 0\n" % (pid, " ".join(["0"] * 17)))
        os.mkfifo(str(proc / str(pid) / "maps"))
        (shm_dir / "psm_0a1b2c3d").write_bytes(b"x")  # a candidate: the look must read the maps
        started = time.monotonic()
        launch.track_shm(force=True)
        waited = time.monotonic() - started
        assert uma_launch.SHM_LOOK_WAIT_S - 0.1 <= waited < uma_launch.SHM_LOOK_WAIT_S + 1.5, waited
        assert launch._shm_look.is_alive()  # still blocked in the read
        started = time.monotonic()
        launch.track_shm(force=True)  # a look in flight: no second one, the same bounded wait
        assert time.monotonic() - started < uma_launch.SHM_LOOK_WAIT_S + 1.5
        launch.track_shm()  # not forced: returns at once
        with open(str(proc / str(pid) / "maps"), "w") as fifo:  # the hang ends: the look finishes
            fifo.write("")
        launch._shm_look.join(5)
        assert not launch._shm_look.is_alive() and launch.shm.segments == {}  # the engine maps nothing
    finally:
        launch.engine.kill()
        launch.engine.wait()
