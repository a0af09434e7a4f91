# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""No root write of a node program follows a symlink (issue 22 item 3).

Every file the launcher, the guard, the watchdog, the textfile collector and the readahead
record write goes through ``_common.node_write``: an exclusive temp file (O_EXCL|O_NOFOLLOW,
random name) in a directory checked first (a real directory of root or this uid, writable by
nobody else), fchmod, fsync, rename, fsync of the directory. Each writer below is the real
program code; each is tried with a symlink planted at its target (and at the temp name the
old code used) pointing at a victim file, and in a directory others can write to. The victim
keeps its bytes and its mode every time; the unsafe directory is refused with its path named.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import time
import types

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.node.base import common as _common
from ansible_collections.uma.vllm.plugins.module_utils.node.base import metrics as _metrics
from ansible_collections.uma.vllm.plugins.module_utils.node.guard import status as _guard_status
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd
from ansible_collections.uma.vllm.plugins.module_utils.system import readahead as _readahead

VICTIM_TEXT = "precious: root must never write here\n"
VICTIM_MODE = 0o600


def watchdog_cfg(tmp_path, state_dir, textfile_dir=None):
    """A loaded watchdog config whose every path is under tmp_path (systemctl: /bin/false, no engine)."""
    return wd.load_config(str(node_helpers.watchdog_config(tmp_path, state_dir, textfile_dir)))


def launch(tmp_path, state_dir, lock_path):
    """A real Launch whose run stops at admission (exit 75): it takes the lock and writes its record."""
    config = node_helpers.launch_config(
        tmp_path,
        "MemTotal: 134217728 kB\nMemFree: 1 kB\nMemAvailable: 1 kB\n",
        state_dir=str(state_dir),
        lock_path=str(lock_path),
        plan={"requested_memory_bytes": 1 << 40, "ranks_per_node": 1},
        admission_wait_s=0,
        guard=False,
    )
    return uma_launch.Launch(config, uma_launch.Log("e1", out=io.StringIO()))


# Each writer: (name, target relative to its directory, the old code's predictable temp name or None,
# write(tmp_path, directory, target) -> None (exceptions are the writer's own refusal).


def _guard_running(tmp_path, directory, target):
    _guard_status._replace_file(str(target), json.dumps({"phase": "watching"}) + "\n")


def _guard_final(tmp_path, directory, target):
    if not _guard_status.write_status(str(target), {"phase": "done"}):
        raise OSError("write_status refused")


def _guard_samples(tmp_path, directory, target):
    handle = _guard_status.open_samples(str(target))
    handle.write("{}\n")
    handle.close()


def _watchdog(tmp_path, directory, target):
    dog = wd.Watchdog(watchdog_cfg(tmp_path, directory.parent.parent, textfile_dir=tmp_path / "tf"))
    dog.record("test", "a planted symlink must not be followed")
    dog.publish()


def _watchdog_metrics(tmp_path, directory, target):
    dog = wd.Watchdog(watchdog_cfg(tmp_path, tmp_path / "wd-state", textfile_dir=directory))
    dog.publish()


def _launch_run(tmp_path, directory, target):
    assert launch(tmp_path, tmp_path / "state", directory / "launch.lock").run() == uma_launch.EXIT_ADMISSION


def _launch_record(tmp_path, directory, target):
    stand_in = types.SimpleNamespace(record_dir=str(directory), record={"exit_code": 0}, log=uma_launch.Log("e1"))
    stand_in.log.out = io.StringIO()
    uma_launch.Launch.write_record(stand_in)
    if "cannot write" in stand_in.log.out.getvalue():
        raise OSError(stand_in.log.out.getvalue())


def _textfile(tmp_path, directory, target):
    code = _metrics.main(
        ["--output", str(target), "--state-dir", str(tmp_path / "none"), "--run-dir", str(tmp_path / "none"),
         "--sysctl-file", str(tmp_path / "none" / "x.conf"), "--proc-root", str(tmp_path / "none")]
    )  # fmt: skip
    if code != 0:
        raise OSError("_metrics.main returned %d" % code)


def _readahead_record(tmp_path, directory, target):
    _blockdev.write_record(str(target), {"name": "w", "devices": []})


def _readahead_undo(tmp_path, directory, target):
    _readahead._put_back(str(target), (b"old content\n", 0o644))


WRITERS = [
    ("guard status (running)", "status.json", ".status.json.{pid}.tmp", _guard_running),
    ("guard status (final)", "status.json", None, _guard_final),
    ("guard samples", "samples.jsonl", None, _guard_samples),
    ("watchdog state.json", "state/watchdog/main/state.json", None, _watchdog),
    ("watchdog events.json", "state/watchdog/main/events.json", None, _watchdog),
    ("watchdog textfile", "uma_vllm_watchdog_main.prom", None, _watchdog_metrics),
    ("launch lock file", "launch.lock", None, _launch_run),
    ("launch lock holder", "launch.lock.holder", None, _launch_run),
    ("launch record", "launch.json", None, _launch_record),
    ("textfile collector", "uma_vllm.prom", None, _textfile),
    ("readahead record", "readahead-w.json", None, _readahead_record),
    ("readahead undo (module side)", "99-uma.rules", "99-uma.rules.uma-undo.{pid}", _readahead_undo),
]
IDS = [w[0] for w in WRITERS]


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(VICTIM_TEXT)
    victim.chmod(VICTIM_MODE)
    return victim


def _assert_victim_intact(victim):
    assert victim.read_text() == VICTIM_TEXT
    assert stat.S_IMODE(os.stat(victim).st_mode) == VICTIM_MODE


def _where(tmp_path, relative):
    """The target path; its directory is made, mode 0755 up to tmp_path."""
    base = tmp_path / "d"
    target = base / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    for parent in [target.parent, *target.parent.parents]:
        if parent == tmp_path:
            break
        parent.chmod(0o755)
    return target


@pytest.mark.parametrize("name, relative, old_tmp, write", WRITERS, ids=IDS)
def test_a_symlink_at_the_target_is_replaced_never_followed(tmp_path, name, relative, old_tmp, write):
    victim = _victim(tmp_path)
    target = _where(tmp_path, relative)
    os.symlink(str(victim), str(target))
    try:
        write(tmp_path, target.parent, target)
    except (OSError, _common.UmaError):
        pass  # refusing (O_NOFOLLOW on a file opened in place) is as good as replacing
    _assert_victim_intact(victim)
    if os.path.lexists(target) and not os.path.islink(target):  # the lock holder is gone after the run
        assert stat.S_ISREG(os.lstat(target).st_mode)


@pytest.mark.parametrize(
    "name, relative, old_tmp, write", [w for w in WRITERS if w[2]], ids=[w[0] for w in WRITERS if w[2]]
)
def test_a_symlink_at_the_old_predictable_temp_name_is_not_followed(tmp_path, name, relative, old_tmp, write):
    victim = _victim(tmp_path)
    target = _where(tmp_path, relative)
    os.symlink(str(victim), str(target.parent / old_tmp.format(pid=os.getpid())))
    write(tmp_path, target.parent, target)
    _assert_victim_intact(victim)
    assert stat.S_ISREG(os.lstat(target).st_mode) and target.read_text() != VICTIM_TEXT


def test_a_directory_where_latest_goes_is_said_and_leaves_nothing_behind(tmp_path):
    record_dir = tmp_path / "launches" / "e1" / "r1"
    (tmp_path / "launches" / "e1" / "latest" / "x").mkdir(parents=True)
    stand_in = types.SimpleNamespace(record_dir=str(record_dir), record={"exit_code": 0}, log=uma_launch.Log("e1"))
    stand_in.log.out = io.StringIO()
    uma_launch.Launch.write_record(stand_in)
    assert "cannot write the launch record" in stand_in.log.out.getvalue()
    assert json.loads((record_dir / "launch.json").read_text()) == {"exit_code": 0}
    assert sorted(os.listdir(record_dir.parent)) == ["latest", "r1"]  # no temp link left


def test_a_dangling_symlink_at_the_lock_path_creates_nothing(tmp_path):
    """The lock file is opened in place (flock): with O_CREAT through a link, root would create any file."""
    victim = tmp_path / "created-by-root"
    target = _where(tmp_path, "launch.lock")
    os.symlink(str(victim), str(target))
    launch_ = launch(tmp_path, tmp_path / "state", target)
    with pytest.raises(_common.UmaError) as err:
        launch_.run()
    assert not os.path.lexists(victim)
    assert "option 'lock_path'" in err.value.message and str(target) in err.value.message


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777], ids=["o+w", "g+w", "sticky o+w"])
@pytest.mark.parametrize("name, relative, old_tmp, write", WRITERS[:-1], ids=IDS[:-1])
def test_an_unsafe_directory_is_refused_naming_it(tmp_path, name, relative, old_tmp, write, mode, capsys):
    victim = _victim(tmp_path)
    target = _where(tmp_path, relative)
    target.parent.chmod(mode)
    os.symlink(str(victim), str(target))
    refused = None
    try:
        write(tmp_path, target.parent, target)
    except (OSError, _common.UmaError) as err:
        refused = str(err)
    out = capsys.readouterr()
    said = (refused or "") + out.out + out.err
    _assert_victim_intact(victim)
    assert "directory %s" % target.parent in said and "writable by its group or others" in said, said
    # nothing written: the planted link is still there (or was set aside by a program that reads the file)
    left = os.listdir(target.parent)
    assert all(os.path.islink(target.parent / n) for n in left), "%s wrote in a directory of mode %o" % (name, mode)
    assert [n for n in left if n != target.name and ".damaged-" not in n] == []  # no temp file left behind


def test_the_unsafe_directory_is_said_once_by_the_watchdog(tmp_path, capsys):
    textfile = tmp_path / "tf"
    textfile.mkdir()
    textfile.chmod(0o777)
    dog = wd.Watchdog(watchdog_cfg(tmp_path, tmp_path / "state", textfile_dir=textfile))
    for _tick in range(3):
        dog.publish()
    lines = [line for line in capsys.readouterr().out.splitlines() if "cannot write" in line]
    assert len(lines) == 1 and "directory %s is writable by its group or others" % textfile in lines[0]
    assert os.listdir(textfile) == []


# ---- the helper itself


def test_node_write_sets_the_mode_exactly_and_leaves_no_temp_file(tmp_path):
    old = os.umask(0o077)
    try:
        _common.node_write(str(tmp_path / "a" / "f.json"), "{}\n", 0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "f.json").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o700  # made under the umask, never wider than 0755
    assert os.listdir(tmp_path / "a") == ["f.json"]


def test_a_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(PermissionError) as err:
        _common.node_write(str(tmp_path / "link" / "f.json"), "{}\n")
    assert "directory %s is a symlink" % (tmp_path / "link") in str(err.value)
    assert os.listdir(real) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another uid")
def test_a_directory_of_another_uid_is_refused(tmp_path):
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    with pytest.raises(PermissionError) as err:
        _common.node_write(str(other / "f.json"), "{}\n")
    assert "directory %s belongs to uid 65534" % other in str(err.value)


def test_modules_keep_their_atomic_write_in_any_directory(tmp_path):
    """atomic_write without safe=True (the modules' use) still writes into a group-writable directory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    _common.atomic_write(str(shared / "f.conf"), "x\n", 0o640)
    assert (shared / "f.conf").read_text() == "x\n"
    assert stat.S_IMODE(os.stat(shared / "f.conf").st_mode) == 0o640


def test_every_other_write_of_the_node_programs_is_known():
    """The node programs open nothing for writing by themselves but these (new ones must come here).

    Everything else goes through node_write; these are the kernel's files (procfs, sysfs: no
    rename there), the samples stream (opened O_NOFOLLOW in a checked directory) and the
    ``latest`` symlink (a random temp name in a checked directory).
    """
    from ansible_collections.uma.vllm.plugins.module_utils.plumbing import node_install

    pattern = re.compile(r'"(w|wb|a|ab|r\+)"|os\.replace\(|write_(text|bytes)\(|atomic_write(_json)?\(')
    found = set()
    for module in node_install.NODE_MODULES:
        name = node_install.relative_path(module)[len(node_install.PACKAGE_DIR) + 1 :]
        if name == "base/common.py":
            continue  # the helpers themselves
        with open(module.__file__, encoding="utf-8") as handle:
            for line in handle:
                if pattern.search(line):
                    found.add((name, line.strip()[:60]))
    assert found == {
        ("launch/node.py", "os.replace(tmp, latest)"),
        ("guard/program.py", 'with open(self.drop_path, "w", encoding="ascii") as handle:'),
        ("watchdog/program.py", 'os.path.join(self.cfg["meminfo_root"], "sys", "vm", "drop_ca'),
        ("base/blockdev.py", 'with open(path, "w", encoding="ascii") as handle:'),
        ("guard/status.py", 'return os.fdopen(fd, "w", encoding="ascii")'),
        ("launch/node.py", 'with open(path, "w", encoding="ascii") as handle:'),
        ("launch/node.py", 'with open(os.path.join(proc_root, "sys", "vm", "drop_caches"'),
    }


def test_temp_files_a_killed_writer_left_are_swept_once_they_are_old(tmp_path):
    """A power loss mid-write leaves ``.<name>.<hex>.tmp``; the next start removes the old ones of that file."""
    old = time.time() - _common.STALE_TEMP_S - 60
    names = {
        "stale": ".f.json.0123456789ab.tmp",
        "fresh": ".f.json.aaaaaaaaaaaa.tmp",
        "another file's": ".g.json.0123456789ab.tmp",
        "not ours": ".f.json.keep.tmp",
    }
    for key, name in names.items():
        (tmp_path / name).write_text("half")
        if key != "fresh":
            os.utime(tmp_path / name, (old, old))
    os.symlink(str(tmp_path / "victim"), str(tmp_path / ".f.json.bbbbbbbbbbbb.tmp"))
    os.utime(tmp_path / ".f.json.bbbbbbbbbbbb.tmp", (old, old), follow_symlinks=False)
    _common._SWEPT.clear()
    _common.node_write(str(tmp_path / "f.json"), "{}\n")
    left = set(os.listdir(tmp_path))
    assert names["stale"] not in left
    assert {names["fresh"], names["another file's"], names["not ours"], ".f.json.bbbbbbbbbbbb.tmp"} <= left
