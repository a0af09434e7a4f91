"""The real guard program (plugins/module_utils/node/guard/program.py) against real files and the real kernel.

Each test runs ``python3 uma_guard.py`` as a separate process for a few
seconds on files in a temporary directory and checks their page-cache
residency (cachestat/mincore through the guard's own helper) and the status
JSON. ``global`` mode runs only as root and must leave every knob as it was.
"""

from __future__ import annotations

import glob
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import _node_lib  # the installed node programs
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.guard import program as g
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import residency as _guard_residency

# tests/all.sh runs this file with no other test beside it: it reads
# the page cache of its files and drop_caches, for the whole machine
pytestmark = pytest.mark.alone

GUARD = _node_lib.program("uma_guard.py")  # the installed entry script, as a node runs it
MIB = 1 << 20
ROOT = os.geteuid() == 0


def _fs_type(path):
    path = os.path.realpath(path)
    best, best_type = "", "unknown"
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            left, _unused, right = line.partition(" - ")
            mount = left.split()[4]
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, best_type = mount, right.split()[0]
    return best_type


def _disk_tmp() -> str:
    """A temporary-files directory on a disk: tmpfs pages cannot be evicted, so the eviction
    tests need a real file system. The first of $TMPDIR, /var/tmp and the checkout's .cache."""
    repo_cache = Path(__file__).resolve().parents[2] / ".cache"
    for candidate in (tempfile.gettempdir(), "/var/tmp", str(repo_cache)):
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK) and _fs_type(candidate) not in ("tmpfs", "ramfs"):
            return candidate
    raise AssertionError("no writable temporary directory on a disk (TMPDIR, /var/tmp, .cache are all tmpfs)")


@pytest.fixture
def work():
    """A temporary directory on a disk that any user can enter (pytest's own is private to
    root), removed after. Not world-writable: the guard writes its status only into a directory
    owned by its own user (or root) that nobody else can write to; _guard() hands it to the user
    the guard runs as."""
    path = Path(tempfile.mkdtemp(prefix="uma-guard-live-", dir=_disk_tmp()))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def ckpt(work):
    """Two 16 MiB files on a real disk, written, synced (clean pages) and read: fully resident."""
    directory = work / "ckpt"
    (directory / "sub").mkdir(parents=True)
    paths = [directory / "model-00001.safetensors", directory / "sub" / "model-00002.bin"]
    for path in paths:
        with open(path, "wb") as handle:
            handle.write(os.urandom(16 * MIB))
            handle.flush()
            os.fsync(handle.fileno())
    os.chmod(directory, 0o755)
    os.chmod(directory / "sub", 0o755)
    for path in paths:
        os.chmod(path, 0o644)
        _read(path)
        assert _resident(path) > 0.99
    return directory, paths


def _read(path):
    with open(path, "rb") as handle:
        while handle.read(4 * MIB):
            pass


def _resident(path):
    resident, size = g.file_residency(str(path))
    return resident / float(size)


NOBODY = 65534


def _guard(tmp_path, *argv, as_user=None):
    status = tmp_path / "status.json"
    # an unprivileged user cannot run the venv's interpreter (under /root): use the system
    # one, which also shows the program runs on a node's stdlib Python
    python = "/usr/bin/python3" if as_user is not None and os.path.exists("/usr/bin/python3") else sys.executable
    cmd = [python, GUARD, "--name", "live", "--status-file", str(status), *map(str, argv)]
    if as_user is not None:
        os.chown(tmp_path, as_user, as_user)  # the status directory belongs to the guard's user
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        user=as_user,
        group=as_user,
        extra_groups=[] if as_user else None,
    )
    return proc, status


def _finish(proc, timeout=15):
    _out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


def _status(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def _wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_residency_helper_matches_what_was_read(ckpt):
    _unused, paths = ckpt
    path = paths[0]
    fd = os.open(path, os.O_RDONLY)
    try:
        _guard_residency.fadvise_dontneed(fd)
        assert _resident(path) < 0.01
        with open(path, "rb") as handle:
            handle.read(4 * MIB)
        time.sleep(0.3)  # let async readahead finish: mincore counts only up-to-date pages, cachestat all
        # 4 MiB read plus whatever readahead the device adds
        assert _resident(path) >= 0.25
        mincore = _guard_residency.Residency(prefer="mincore")
        assert mincore.method == "mincore"
        size = os.path.getsize(path)
        assert (
            abs(mincore.resident_bytes(fd, size) - _guard_residency.Residency().resident_bytes(fd, size)) <= 64 * 4096
        )
        end = _guard_residency.Residency().resident_end(fd, size)
        assert 4 * MIB <= end <= size
        assert abs(mincore.resident_end(fd, size) - end) <= 64 * 4096
    finally:
        os.close(fd)


def test_files_mode_evicts_the_files_and_stops_at_max_duration(ckpt, tmp_path):
    directory, paths = ckpt
    samples = tmp_path / "samples.jsonl"
    started = time.monotonic()
    proc, status_file = _guard(
        tmp_path,
        *("--mode", "files", "--paths", directory, "--interval", "0.05", "--max-duration", "1.5"),
        *("--samples-file", samples),
    )
    code, err = _finish(proc)
    elapsed = time.monotonic() - started
    assert code == 0, err
    assert 1.5 <= elapsed < 10
    for path in paths:
        assert _resident(path) < 0.05, path
    status = _status(status_file)
    assert status["stop_reason"] == "max_duration"
    assert status["state"] == "stopped"
    assert status["files"] == 2
    assert status["evictions"] >= 2
    assert status["evicted_bytes"] >= 30 * MIB
    assert status["residency_method"] in ("cachestat", "mincore")
    assert status["config"]["paths"] == [str(directory)]
    lines = samples.read_text().splitlines()
    assert len(lines) >= 5
    assert set(json.loads(lines[-1])) == {"t", "MemAvailable", "Cached", "Mapped", "AnonPages", "Dirty"}


def test_adaptive_mode_evicts_what_a_reader_loads_and_stops_on_sigterm(ckpt, tmp_path):
    directory, paths = ckpt
    for path in paths:  # start cold
        fd = os.open(path, os.O_RDONLY)
        _guard_residency.fadvise_dontneed(fd)
        os.close(fd)
    proc, status_file = _guard(
        tmp_path, "--mode", "adaptive", "--paths", directory, "--threshold-mib", "8", "--max-duration", "60"
    )
    try:
        assert _wait_for(status_file.exists, 10), "no status written"
        assert _status(status_file)["state"] == "running"
        for path in paths:
            _read(path)
        # the guard acts on the growth; the last tail goes at the idle clean-up
        assert _wait_for(lambda: all(_resident(p) < 0.05 for p in paths), 10), [_resident(p) for p in paths]
    finally:
        proc.send_signal(signal.SIGTERM)
        code, err = _finish(proc)
    assert code == 0, err
    status = _status(status_file)
    assert status["stop_reason"] == "signal"
    assert status["state"] == "stopped"
    assert status["evictions"] >= 1
    assert status["triggers"].get("growth", 0) >= 1
    assert status["inotify_watches"] == 2  # woken by the reader's open/read events, not only by ticks


def test_act_below_free_mib_holds_growth_while_memfree_is_above_it(ckpt, tmp_path):
    """The real kernel's MemFree against the line: 1 MiB (never reached here) holds every growth; the
    line at 1 TiB (always below it) acts as the guard without a line does."""
    directory, paths = ckpt
    for line, evicts in (("1", False), ("1048576", True)):
        (tmp_path / "status.json").unlink(missing_ok=True)  # the next guard's first status says it watches
        for path in paths:  # start cold
            fd = os.open(path, os.O_RDONLY)
            _guard_residency.fadvise_dontneed(fd)
            os.close(fd)
        proc, status_file = _guard(
            tmp_path, "--mode", "adaptive", "--paths", directory, "--threshold-mib", "8", "--max-duration", "60",
            "--act-below-free-mib", line,
        )  # fmt: skip
        try:
            assert _wait_for(status_file.exists, 10), "no status written"
            for path in paths:
                _read(path)
            if evicts:
                assert _wait_for(lambda: all(_resident(p) < 0.05 for p in paths), 10), [_resident(p) for p in paths]
            else:
                time.sleep(1.0)  # ten ticks at the default interval: the guard has seen the growth
                assert all(_resident(p) > 0.95 for p in paths), [_resident(p) for p in paths]
        finally:
            proc.send_signal(signal.SIGTERM)
            code, err = _finish(proc)
        assert code == 0, err
        status = _status(status_file)
        assert status["config"]["act_below_free_mib"] == int(line)
        if evicts:
            assert status["triggers"].get("growth", 0) >= 1 and status["evicted_bytes"] >= 30 * MIB
        else:
            assert status["held_ticks"] >= 1 and status["evictions"] == 0 and status["evicted_bytes"] == 0


def test_adaptive_mode_leaves_other_files_alone(ckpt, tmp_path):
    directory, _unused = ckpt
    bystander = tmp_path / "bystander.bin"
    with open(bystander, "wb") as handle:
        handle.write(os.urandom(8 * MIB))
        handle.flush()
        os.fsync(handle.fileno())
    _read(bystander)
    proc, status_file = _guard(
        tmp_path, "--mode", "adaptive", "--paths", directory, "--threshold-mib", "4", "--max-duration", "2"
    )
    assert _wait_for(status_file.exists, 10)
    for path in glob.glob(str(directory / "**" / "*"), recursive=True):
        if os.path.isfile(path):
            _read(path)
    code, err = _finish(proc)
    assert code == 0, err
    assert _resident(bystander) > 0.99


def test_files_mode_needs_no_root(ckpt, work):
    if not ROOT:
        pytest.skip("checks that an unprivileged user can run it: needs root to switch user")
    directory, paths = ckpt
    proc, status_file = _guard(
        work,
        *("--mode", "files", "--paths", directory, "--interval", "0.05", "--max-duration", "1"),
        as_user=NOBODY,
    )
    code, err = _finish(proc)
    assert code == 0, err
    assert all(_resident(p) < 0.05 for p in paths)
    assert _status(status_file)["stop_reason"] == "max_duration"


def test_stops_when_the_watched_pid_exits(tmp_path):
    child = subprocess.Popen(["sleep", "1"])  # not reaped until the guard is done: a zombie counts as gone
    started = time.monotonic()
    proc, status_file = _guard(
        tmp_path, "--mode", "adaptive", "--paths", tmp_path, "--until-pid", child.pid, "--max-duration", "30"
    )
    code, err = _finish(proc)
    child.wait()
    assert code == 0, err
    assert _status(status_file)["stop_reason"] == "until_pid"
    assert 0.9 <= time.monotonic() - started < 10


def test_stops_when_the_url_answers_200(tmp_path):
    state = {"ready": False, "hits": 0}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            state["hits"] += 1
            self.send_response(200 if state["ready"] else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = "http://127.0.0.1:%d/health" % server.server_address[1]
    try:
        proc, status_file = _guard(tmp_path, "--mode", "adaptive", "--paths", tmp_path, "--until-url", url)
        time.sleep(2.2)
        assert proc.poll() is None, "stopped on a 503"
        state["ready"] = True
        code, err = _finish(proc)
    finally:
        server.shutdown()
    assert code == 0, err
    status = _status(status_file)
    assert status["stop_reason"] == "until_url"
    assert 2 <= state["hits"] <= 6  # about once a second, not more


def test_bad_arguments_exit_2(tmp_path):
    proc, _unused = _guard(tmp_path, "--mode", "files")
    code, err = _finish(proc)
    assert code == 2
    assert "option '--paths' = []: is empty but mode=files evicts only these" in err


def _knobs():
    values = {}
    for path in sorted(glob.glob("/proc/sys/vm/*")) + sorted(glob.glob("/sys/block/*/queue/read_ahead_kb")):
        if path.endswith("drop_caches"):
            continue
        try:
            with open(path, encoding="ascii") as handle:
                values[path] = handle.read()
        except OSError:
            pass
    return values


def _written_paths(strace_log):
    """Paths a traced process opened for writing (O_WRONLY/O_RDWR/O_CREAT) or renamed to."""
    written = set()
    with open(strace_log, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if ("openat(" in line or "open(" in line) and "= -1" not in line:
                if any(flag in line for flag in ("O_WRONLY", "O_RDWR", "O_CREAT")):
                    written.add(line.split('"')[1])
            elif "rename" in line and "= -1" not in line:
                written.add(line.split('"')[3])
    return written


def _drop_writes(strace_log):
    """How many times a traced process opened /proc/sys/vm/drop_caches for writing."""
    with open(strace_log, encoding="utf-8", errors="replace") as handle:
        return sum(
            1 for line in handle if '"/proc/sys/vm/drop_caches"' in line and "O_WRONLY" in line and "= -1" not in line
        )


@pytest.mark.skipif(not ROOT, reason="global mode writes /proc/sys/vm/drop_caches: root only")
def test_global_mode_drops_caches_and_changes_no_knob(ckpt, work):
    _unused, paths = ckpt
    before = _knobs()
    status_file = work / "status.json"
    cmd = [sys.executable, GUARD, "--name", "live", "--status-file", str(status_file)]
    # a drop of every clean page can take most of a second on a busy machine with a big
    # cache (it did on CI): give the loop time for several ticks, and count the writes
    cmd += ["--mode", "global", "--interval", "0.2", "--max-duration", "4"]
    strace = shutil.which("strace")
    log = work / "strace.log"
    if strace:  # the exact list of what the guard wrote, immune to other jobs changing knobs meanwhile
        cmd = [strace, "-f", "-qq", "-e", "trace=open,openat,creat,rename,renameat,renameat2", "-o", str(log), *cmd]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(cmd, check=False, capture_output=True, timeout=30, env=env)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    status = _status(status_file)
    assert status["stop_reason"] == "max_duration"
    assert status["evictions"] >= 2, status  # it loops: more than the one drop at start
    assert all(_resident(p) < 0.05 for p in paths)
    if strace:
        assert _drop_writes(log) == status["evictions"], status  # what it reports is what it did
        written = _written_paths(log)
        assert "/proc/sys/vm/drop_caches" in written
        # the status writer opens its temp file relative to the directory it checked (openat on the
        # directory's fd): strace shows those names without the directory
        in_work = re.compile(r"\.?status\.json(\.[0-9a-f]+\.tmp)?")
        others = {
            p
            for p in written
            if p != "/proc/sys/vm/drop_caches" and not p.startswith(str(work) + "/") and not in_work.fullmatch(p)
        }
        assert others == set()
    else:
        assert _knobs() == before


def test_global_mode_without_root_is_an_error_stop(work):
    proc, status_file = _guard(work, "--mode", "global", "--max-duration", "5", as_user=NOBODY if ROOT else None)
    code, err = _finish(proc)
    assert code == 1
    assert "needs root" in err
    status = _status(status_file)
    assert status["stop_reason"].startswith("error: ")
