# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Least privilege (issue 10): the launcher keeps root, the engine process runs as engine_user.

The drop itself is real: these tests start a real child through Launch.start_engine and
read its /proc/<pid>/status (they need root to change uid, as the launcher on a node has).
"""

from __future__ import annotations

import grp
import io
import os
import pwd
import shutil
import sys
import tempfile
import time

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

NOBODY = pwd.getpwnam("nobody")
VIDEO = grp.getgrnam("video").gr_gid if "video" in [g.gr_name for g in grp.getgrall()] else None


def config(tmp_path, **extra):
    return uma_launch.validate(
        uma_launch.merge_config(
            {
                "engine": "u1",
                "command": ["true"],
                "health_url": "http://127.0.0.1:1/health",
                "state_dir": str(tmp_path / "state"),
                "lock_path": str(tmp_path / "lock"),
                **extra,
            }
        )
    )


def test_no_user_means_the_engine_runs_as_the_launcher(tmp_path):
    assert config(tmp_path)["_identity"] is None
    assert config(tmp_path, engine_user="root")["_identity"] is None


def test_identity_resolves_user_group_groups_home_umask(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    ident = config(tmp_path, engine_user="nobody", engine_groups=["nogroup"], engine_home=str(home))["_identity"]
    assert ident == {
        "user": "nobody",
        "uid": NOBODY.pw_uid,
        "gid": NOBODY.pw_gid,
        "groups": [grp.getgrnam("nogroup").gr_gid],
        "home": str(home),
        "umask": 0o027,
    }


@pytest.mark.parametrize(
    ("extra", "option", "words"),
    [
        ({"engine_user": "no-such-user-x"}, "engine_user", "is not a user on this node"),
        ({"engine_user": "bad\nname"}, "engine_user", "is not a user name"),
        ({"engine_user": 1000}, "engine_user", "is not a user name"),
        ({"engine_user": "nobody", "engine_groups": ["no-such-group-x"]}, "engine_groups", "groupadd"),
        ({"engine_user": "nobody", "engine_groups": "video"}, "engine_groups", "is not a list"),
        ({"engine_user": "nobody", "engine_group": "x;y"}, "engine_group", "is not a group name"),
        ({"engine_user": "nobody", "engine_home": "rel/home"}, "engine_home", "absolute"),
        ({"engine_user": "nobody", "engine_umask": "999"}, "engine_umask", "octal"),
        ({"engine_user": "nobody", "engine_umask": True}, "engine_umask", "octal"),
        ({"engine_home": "/var/lib/x"}, "engine_home", "without engine_user"),
    ],
)
def test_bad_identity_is_refused_naming_the_option(tmp_path, extra, option, words):
    with pytest.raises(UmaError) as err:
        config(tmp_path, **extra)
    assert err.value.option == option
    assert words in err.value.message


def _status(pid):
    fields = {}
    with open("/proc/%d/status" % pid, encoding="ascii") as handle:
        for line in handle:
            key, _sep, value = line.partition(":")
            fields[key] = value.split()
    return fields


@pytest.fixture
def open_dir():
    """A directory the engine user can enter (pytest's tmp_path is 0700 root)."""
    import pathlib

    path = tempfile.mkdtemp(prefix="uma-user-", dir="/tmp")
    os.chmod(path, 0o755)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


PYTHON = "/usr/bin/python3"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(PYTHON, os.X_OK),
    reason="changing uid needs root (the launcher on a node is root) and a system python3",
)


@needs_root
def test_the_engine_process_runs_as_the_engine_user(open_dir):
    tmp_path = open_dir
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    os.chmod(out, 0o777)
    script = (
        "import os, sys, time; "
        "open(sys.argv[1] + '/env', 'w').write(os.environ['HOME'] + ' ' + os.environ['USER'] + ' ' + os.getcwd()); "
        "open(sys.argv[1] + '/made', 'w').close(); time.sleep(30)"
    )
    groups = ["nogroup"] + (["video"] if VIDEO is not None else [])
    cfg = config(
        tmp_path, command=[PYTHON, "-c", script, str(out)], engine_user="nobody", engine_groups=groups,
        engine_home=str(home),
    )  # fmt: skip
    launch = uma_launch.Launch(cfg, uma_launch.Log("u1", out=io.StringIO()))
    launch.start_engine()
    try:
        deadline = time.monotonic() + 20
        while not (out / "made").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        status = _status(launch.engine.pid)
        assert status["Uid"] == [str(NOBODY.pw_uid)] * 4
        assert status["Gid"] == [str(NOBODY.pw_gid)] * 4
        assert sorted(int(g) for g in status["Groups"]) == sorted(grp.getgrnam(g).gr_gid for g in groups)
        assert status["CapEff"] == ["0000000000000000"]
        assert (out / "env").read_text() == "%s nobody %s" % (home, home)
        # umask 0027: the engine's files are not world-readable
        assert (out / "made").stat().st_mode & 0o777 == 0o640
        assert (out / "made").stat().st_uid == NOBODY.pw_uid
        assert launch.record["engine_user"] == "nobody"
        assert "user=nobody" in launch.log.out.getvalue()
    finally:
        launch.stop_engine()
    # the launcher (root) could stop the other user's process
    assert launch.engine.returncode is not None


@needs_root
def test_a_command_the_engine_user_may_not_run_is_a_clear_config_failure(open_dir, tmp_path):
    # tmp_path is 0700 root: the engine user cannot reach a program there
    prog = tmp_path / "engine"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o755)
    home = open_dir / "home"
    home.mkdir()
    cfg = config(
        open_dir, command=[str(prog)], engine_user="nobody", engine_groups=[], engine_home=str(home),
        lock_timeout_s=5, guard=False, pre_evict="none", admission=False,
    )  # fmt: skip
    out = io.StringIO()
    code = uma_launch.Launch(cfg, uma_launch.Log("u1", out=out)).run()
    assert code == uma_launch.EXIT_CONFIG
    text = out.getvalue()
    assert "cannot be started as user nobody" in text and "Permission denied" in text and "chmod o+rX" in text


CHILD = r"""
import io, json, sys, time
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch
base, home = sys.argv[1], sys.argv[2]
cfg = uma_launch.validate(uma_launch.merge_config({
    "engine": "u2", "health_url": "http://127.0.0.1:1/health",
    "state_dir": base + "/state", "lock_path": base + "/lock",
    "engine_user": "nobody", "engine_groups": [], "engine_home": home,
    "command": ["/usr/bin/python3", "-c", "import os; print(os.getcwd(), os.getuid(), flush=True)"]}))
launch = uma_launch.Launch(cfg, uma_launch.Log("u2", out=io.StringIO()))
launch.start_engine()
print(launch.engine.stdout.read().decode().strip())
launch.engine.wait()
"""


@needs_root
@pytest.mark.skipif(not os.access("/usr/sbin/capsh", os.X_OK), reason="needs capsh (libcap2-bin)")
def test_the_launcher_without_dac_override_starts_the_engine_in_its_0750_home(open_dir):
    """The unit's CapabilityBoundingSet has no CAP_DAC_OVERRIDE: the launcher (root) cannot enter
    the engine user's 0750 home; the child changes directory after it became the engine user.
    (Seen in molecule/launch_wrapper: 'Permission denied: /var/lib/uma-vllm/engine-home'.)"""
    import subprocess

    home = open_dir / "home"
    home.mkdir(mode=0o750)
    os.chown(home, NOBODY.pw_uid, NOBODY.pw_gid)
    os.chmod(home, 0o750)
    proc = subprocess.run(
        ["/usr/sbin/capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--",
         "-c", '"$0" -c "$1" "$2" "$3"', sys.executable, CHILD, str(open_dir), str(home)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(home), str(NOBODY.pw_uid)]
