# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_engine_facts: what vllm_service reads about a node's engines, in one pass.

Directories and files are real (tmp_path); systemctl is a fake runner that returns what the lab's
systemd 252 printed for the same command (captured in a lab container, see
/work/notes/issue-13-enginefacts.md); the module end to end against real systemd is in
tests/integration/test_engine_facts_live.py.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import paths as _paths
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.service import engine_facts as ef
from ansible_collections.uma.vllm.plugins.module_utils.service import state as _vllm_service_state

SHOW = ["/usr/bin/systemctl", "show", "-p", "Id", "-p", "ActiveState", "-p", "UnitFileState"]
# systemd 252 (Debian 12, the lab image): uma-vllm@a enabled and running, b installed and
# stopped, nope unknown to systemd - exit 0 for all three
REAL_252 = (
    "Id=uma-vllm@a.service\nActiveState=active\nUnitFileState=enabled\n\n"
    "Id=uma-vllm@b.service\nActiveState=inactive\nUnitFileState=disabled\n\n"
    "Id=uma-vllm@nope.service\nActiveState=inactive\nUnitFileState=\n"
)


class FakeSystemctl:
    """Records every argv; answers (rc, out, err)."""

    def __init__(self, rc=0, out=REAL_252, err=""):
        self.calls = []
        self.answer = (rc, out, err)

    def __call__(self, argv):
        self.calls.append(list(argv))
        return self.answer


@pytest.fixture
def node(tmp_path):
    """A node with engines a and b installed, their watchdogs, stamps, and things that are not theirs."""
    systemd = tmp_path / "systemd"
    for name in ("uma-vllm@a.service.d", "uma-vllm@b.service.d", "uma-vllm@.service.d", "other@x.service.d"):
        (systemd / name).mkdir(parents=True)
    (systemd / "uma-vllm@.service").write_text("[Unit]\n")
    (systemd / "uma-vllm@file.service.d").write_text("a regular file, not a drop-in directory\n")
    (systemd / "uma-vllm@a.service.d" / "engine.conf").write_text("[Service]\n")
    watchdog = tmp_path / "etc" / "watchdog"
    watchdog.mkdir(parents=True)
    (watchdog / "a.json").write_text("{}\n")
    (watchdog / "b.json").write_text("{}\n")
    (watchdog / ".a.json.x1.tmp").write_text("{")  # a writer's temporary file
    (watchdog / ".hidden.json").write_text("{}")
    (watchdog / "README").write_text("not a config\n")
    (watchdog / "dir.json").mkdir()
    stamps = tmp_path / "state" / "vllm-service.json"
    stamps.parent.mkdir()
    stamps.write_text(json.dumps({"a": "u/d/e/j", "b": "u/d/e/k"}))
    return {
        "systemd_dir": str(systemd),
        "config_dir": str(tmp_path / "etc"),
        "stamps_path": str(stamps),
        "engines": ["a", "b", "nope"],
    }


def test_a_node_with_two_engines(node):
    fake = FakeSystemctl()
    result = ef.engine_facts(node, fake, "/usr/bin/systemctl")
    watchdog = os.path.join(node["config_dir"], "watchdog")
    assert result == {
        "installed": ["a", "b"],
        "watchdogs": ["a", "b"],
        "watchdog_paths": [os.path.join(watchdog, "a.json"), os.path.join(watchdog, "b.json")],
        "stamps": {"a": "u/d/e/j", "b": "u/d/e/k"},
        "units": {
            "a": {"Id": "uma-vllm@a.service", "ActiveState": "active", "UnitFileState": "enabled"},
            "b": {"Id": "uma-vllm@b.service", "ActiveState": "inactive", "UnitFileState": "disabled"},
            "nope": {"Id": "uma-vllm@nope.service", "ActiveState": "inactive", "UnitFileState": ""},
        },
        "systemd_dir": node["systemd_dir"],
        "config_dir": node["config_dir"],
        "stamps_path": node["stamps_path"],
        "files": {},
        "contents": {},
        "extra_units": {},
        "packages_missing": [],
    }
    assert fake.calls == [[*SHOW, "uma-vllm@a.service", "uma-vllm@b.service", "uma-vllm@nope.service"]]


def test_a_fresh_node_has_nothing_and_asks_systemd_nothing(tmp_path):
    fake = FakeSystemctl()
    params = {
        "systemd_dir": str(tmp_path / "no-systemd"),
        "config_dir": str(tmp_path / "no-etc"),
        "stamps_path": str(tmp_path / "no-state" / "vllm-service.json"),
        "engines": [],
    }
    result = ef.engine_facts(params, fake, None)
    assert result == {
        "installed": [],
        "watchdogs": [],
        "watchdog_paths": [],
        "stamps": {},
        "units": {},
        "systemd_dir": params["systemd_dir"],
        "config_dir": params["config_dir"],
        "stamps_path": params["stamps_path"],
        "files": {},
        "contents": {},
        "extra_units": {},
        "packages_missing": [],
    }
    assert fake.calls == []


def test_config_dir_without_watchdog_directory(node):
    os.rename(os.path.join(node["config_dir"], "watchdog"), os.path.join(node["config_dir"], "elsewhere"))
    result = ef.engine_facts(dict(node, engines=[]), FakeSystemctl(), None)
    assert result["watchdogs"] == [] and result["watchdog_paths"] == []
    assert result["installed"] == ["a", "b"]


def test_drop_in_name_that_is_a_file_is_not_an_engine(node):
    assert "file" not in ef.installed(node["systemd_dir"], [])
    os.remove(os.path.join(node["systemd_dir"], "uma-vllm@file.service.d"))
    os.mkdir(os.path.join(node["systemd_dir"], "uma-vllm@file.service.d"))
    assert ef.installed(node["systemd_dir"], []) == ["a", "b", "file"]


def test_symlinked_drop_in_counts_a_dangling_one_does_not(node, tmp_path):
    (tmp_path / "real-dropin").mkdir()
    os.symlink(str(tmp_path / "real-dropin"), os.path.join(node["systemd_dir"], "uma-vllm@linked.service.d"))
    os.symlink(str(tmp_path / "gone"), os.path.join(node["systemd_dir"], "uma-vllm@dangling.service.d"))
    os.symlink(str(tmp_path / "gone.json"), os.path.join(node["config_dir"], "watchdog", "dangling.json"))
    warnings = []
    assert ef.installed(node["systemd_dir"], warnings) == ["a", "b", "linked"]
    assert ef.watchdogs(node["config_dir"], warnings)[0] == ["a", "b"]
    assert warnings == []


def test_names_that_are_no_engine_names_are_left_out_with_a_warning(node):
    os.mkdir(os.path.join(node["systemd_dir"], "uma-vllm@a b.service.d"))
    with open(os.path.join(node["config_dir"], "watchdog", "-x.json"), "w") as handle:
        handle.write("{}")
    result = ef.engine_facts(dict(node, engines=[]), FakeSystemctl(), None)
    assert result["installed"] == ["a", "b"] and result["watchdogs"] == ["a", "b"]
    assert len(result["warnings"]) == 2
    assert "uma-vllm@a b.service.d" in result["warnings"][1] and "left alone" in result["warnings"][1]
    assert "-x.json" in result["warnings"][0]


@pytest.mark.parametrize(
    "content, what",
    [
        ("{not json", "is not JSON"),
        ("", "is not JSON"),
        ("[1, 2]", "a JSON list, not an object"),
        ('"fp"', "a JSON str, not an object"),
        ("null", "a JSON NoneType, not an object"),
        (b"\xff\xfe{}", "is not JSON"),
    ],
)
def test_garbled_stamps_read_as_empty_with_a_warning(node, content, what):
    mode = "wb" if isinstance(content, bytes) else "w"
    with open(node["stamps_path"], mode) as handle:
        handle.write(content)
    result = ef.engine_facts(dict(node, engines=[]), FakeSystemctl(), None)
    assert result["stamps"] == {}
    [warning] = result["warnings"]
    assert node["stamps_path"] in warning and what in warning and "restart" in warning


def test_stamps_path_that_is_a_directory_reads_as_empty_with_a_warning(node):
    os.remove(node["stamps_path"])
    os.mkdir(node["stamps_path"])
    result = ef.engine_facts(dict(node, engines=[]), FakeSystemctl(), None)
    assert result["stamps"] == {}
    assert node["stamps_path"] in result["warnings"][0] and "cannot be read" in result["warnings"][0]


def test_missing_stamps_are_empty_without_a_warning(node):
    os.remove(node["stamps_path"])
    result = ef.engine_facts(dict(node, engines=[]), FakeSystemctl(), None)
    assert result["stamps"] == {} and "warnings" not in result


@pytest.mark.parametrize(
    "engines, index, value",
    [
        (["ok", "a b"], 1, "'a b'"),
        (["-x"], 0, "'-x'"),
        (["ok", "fine", ""], 2, "''"),
        (["a/b"], 0, "'a/b'"),
        (["x" * 65], 0, repr("x" * 65)),
        (["abc\n"], 0, repr("abc\n")),
        (["uma-vllm@a.service"], 0, "'uma-vllm@a.service'"),
        ([7], 0, "7"),
        ([None], 0, "null"),
    ],
)
def test_bad_engine_name_names_option_index_value_and_fix(node, engines, index, value):
    fake = FakeSystemctl()
    with pytest.raises(UmaError) as err:
        ef.engine_facts(dict(node, engines=engines), fake, "/usr/bin/systemctl")
    message = err.value.message
    assert message.startswith("option 'engines[%d]' = %s: is not an engine name." % (index, value)), message
    assert "1-64 characters from A-Z a-z 0-9 _ . -" in message
    assert fake.calls == []


def test_engine_names_follow_the_collections_pattern():
    assert ef._ENGINE_RE.pattern == _paths.ENGINE_NAME_PATTERN
    assert ef.check_engines(["a", "A.b_c-9", "x" * 64, "a", "7"]) == ["a", "A.b_c-9", "x" * 64, "7"]


def test_engines_not_a_list():
    with pytest.raises(UmaError, match=r"option 'engines' = 'a': is not a list"):
        ef.check_engines("a")


@pytest.mark.parametrize("option", ["systemd_dir", "config_dir", "stamps_path"])
@pytest.mark.parametrize("value, problem", [("relative/dir", "is not an absolute path"), ("/a\nb", "line-break")])
def test_bad_paths_are_refused_naming_the_option(node, option, value, problem):
    with pytest.raises(UmaError) as err:
        ef.engine_facts(dict(node, **{option: value}), FakeSystemctl(), None)
    assert err.value.message.startswith("option '%s' = %r:" % (option, value)) and problem in err.value.message


@pytest.mark.parametrize("option, sub", [("systemd_dir", ""), ("config_dir", "watchdog")])
def test_a_file_in_place_of_a_directory_is_refused_not_read_as_empty(node, tmp_path, option, sub):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    if sub:
        os.rename(os.path.join(node["config_dir"], sub), str(tmp_path / "moved"))
        (tmp_path / "etc" / sub).write_text("x")
        value = node["config_dir"]
    else:
        value = str(blocker)
    with pytest.raises(UmaError) as err:
        ef.engine_facts(dict(node, engines=[], **{option: value}), FakeSystemctl(), None)
    assert err.value.message.startswith("option '%s' = %r:" % (option, value))
    assert "cannot be read (Not a directory)" in err.value.message


def test_units_are_parsed_by_the_roles_unit_states():
    assert ef.unit_states is _vllm_service_state.unit_states
    out = "Id=uma-vllm@a.service\nActiveState=failed\nUnitFileState=enabled\nSubState=failed\n"
    got = ef.units(FakeSystemctl(out=out), "/usr/bin/systemctl", ["a", "b"])
    assert got == _vllm_service_state.unit_states(out, ["a", "b"])
    # a name systemd did not report reads as the role always read it
    assert got["b"] == {"ActiveState": "inactive", "UnitFileState": ""}
    assert got["a"]["SubState"] == "failed"


def test_duplicate_engines_are_asked_once():
    fake = FakeSystemctl()
    ef.units(fake, "/usr/bin/systemctl", ef.check_engines(["a", "a", "b"]))
    assert fake.calls == [[*SHOW, "uma-vllm@a.service", "uma-vllm@b.service"]]


def test_without_systemctl_engines_are_refused_but_none_is_fine(node):
    with pytest.raises(UmaError) as err:
        ef.engine_facts(node, FakeSystemctl(), None)
    assert 'option \'engines\' = ["a", "b", "nope"]: needs systemctl' in err.value.message
    assert ef.engine_facts(dict(node, engines=[]), FakeSystemctl(), None)["units"] == {}


def test_systemctl_failing_is_a_failure_with_command_rc_and_stderr():
    # what systemctl says in a container whose PID 1 is not systemd
    err = "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
    fake = FakeSystemctl(rc=1, out="", err=err)
    with pytest.raises(UmaError) as raised:
        ef.units(fake, "/usr/bin/systemctl", ["a"])
    message = raised.value.message
    assert "/usr/bin/systemctl show -p Id -p ActiveState -p UnitFileState uma-vllm@a.service exited 1" in message
    assert "System has not been booted with systemd" in message and "become: true" in message


def test_systemctl_refusing_a_unit_name_is_a_failure():
    # systemd 252 on "uma-vllm@.service" (measured): rc 1, nothing on stdout
    err = "Failed to get properties: Unit name uma-vllm@.service is neither a valid invocation ID nor unit name.\n"
    with pytest.raises(UmaError, match=r"exited 1 .*neither a valid invocation ID"):
        ef.units(FakeSystemctl(rc=1, out="", err=err), "/usr/bin/systemctl", ["a"])


def test_a_not_found_exit_whose_output_parses_is_read():
    out = "Id=uma-vllm@a.service\nActiveState=active\nUnitFileState=enabled\n"
    fake = FakeSystemctl(rc=1, out=out, err="Unit uma-vllm@b.service could not be found.\n")
    got = ef.units(fake, "/usr/bin/systemctl", ["a", "b"])
    assert got["a"]["ActiveState"] == "active"
    assert got["b"] == {"ActiveState": "inactive", "UnitFileState": ""}


def test_a_not_found_exit_without_units_is_still_a_failure():
    with pytest.raises(UmaError, match="exited 4"):
        ef.units(FakeSystemctl(rc=4, out="", err="Unit uma-vllm@a.service not found.\n"), "/usr/bin/systemctl", ["a"])


def test_systemctl_that_cannot_run_is_a_failure():
    def broken(argv):
        raise OSError(8, "Exec format error")

    with pytest.raises(UmaError, match=r"could not run /usr/bin/systemctl \(\[Errno 8\] Exec format error\)"):
        ef.units(broken, "/usr/bin/systemctl", ["a"])


def test_defaults_come_from_the_collections_paths():
    assert ef.DEFAULT_STAMPS_PATH == _paths.STATE_DIR + "/vllm-service.json"


def test_watchdog_units_come_from_the_same_systemctl_call(tmp_path):
    calls = []

    def runner(argv):
        calls.append(argv)
        return (
            0,
            "Id=uma-vllm@a.service\nActiveState=active\nUnitFileState=enabled\n\n"
            "Id=uma-vllm-watchdog@a.service\nActiveState=failed\nUnitFileState=enabled\n",
            "",
        )

    params = {
        "systemd_dir": str(tmp_path),
        "config_dir": str(tmp_path),
        "stamps_path": str(tmp_path / "stamps.json"),
        "engines": ["a", "b"],
        "watchdog_units": True,
    }
    out = ef.engine_facts(params, runner, "/bin/systemctl")
    assert len(calls) == 1 and calls[0][-2:] == ["uma-vllm-watchdog@a.service", "uma-vllm-watchdog@b.service"]
    assert out["units"]["a"]["ActiveState"] == "active" and out["units"]["b"]["ActiveState"] == "inactive"
    assert out["watchdog_units"]["a"]["ActiveState"] == "failed"  # not mixed up with the engine's own unit
    assert out["watchdog_units"]["b"] == {"ActiveState": "inactive", "UnitFileState": ""}
    assert "watchdog_units" not in ef.engine_facts(dict(params, watchdog_units=False), runner, "/bin/systemctl")


def test_files_contents_units_and_packages_on_request(node, tmp_path):
    # what the role's firewall and port-range steps read here instead of tasks of their own
    (tmp_path / "rules.nft").write_text("table inet x {}\n")
    os.chmod(str(tmp_path / "rules.nft"), 0o640)
    os.symlink(str(tmp_path / "gone"), str(tmp_path / "dangling.service"))
    (tmp_path / "range").write_text("32768\t60999\n")
    (tmp_path / "status").write_text("Package: nftables\nStatus: install ok installed\n")
    paths = [str(tmp_path / "rules.nft"), str(tmp_path / "dangling.service"), str(tmp_path / "none.service")]
    fake = FakeSystemctl(out="Id=uma-vllm-firewall.service\nActiveState=active\nUnitFileState=enabled\n")
    params = dict(
        node,
        engines=[],
        files=paths,
        read=[str(tmp_path / "range"), str(tmp_path / "nope")],
        extra_units=["uma-vllm-firewall.service", "other.service"],
        packages=["nftables", "iperf3"],
        dpkg_status=str(tmp_path / "status"),
    )
    result = ef.engine_facts(params, fake, "/usr/bin/systemctl")
    rules = result["files"][paths[0]]
    assert rules["exists"] and rules["kind"] == "file" and rules["mode"] == "0640" and rules["uid"] == os.getuid()
    assert rules["sha256"] == hashlib.sha256(b"table inet x {}\n").hexdigest()
    assert result["files"][paths[1]]["exists"] and result["files"][paths[1]]["kind"] == "link"
    assert result["files"][paths[2]] == {
        "exists": False,
        "kind": None,
        "mode": None,
        "uid": None,
        "gid": None,
        "sha256": None,
    }
    assert result["contents"] == {str(tmp_path / "range"): "32768\t60999\n", str(tmp_path / "nope"): None}
    assert result["extra_units"] == {
        "uma-vllm-firewall.service": {
            "Id": "uma-vllm-firewall.service",
            "ActiveState": "active",
            "UnitFileState": "enabled",
        },
        "other.service": {"ActiveState": "inactive", "UnitFileState": ""},
    }
    assert fake.calls == [[*SHOW, "uma-vllm-firewall.service", "other.service"]]
    assert result["packages_missing"] == ["iperf3"]
    assert (
        ef.engine_facts(dict(params, dpkg_status=str(tmp_path / "none")), fake, "/usr/bin/systemctl")[
            "packages_missing"
        ]
        is None
    )


@pytest.mark.parametrize(
    "option, value, problem",
    [
        ("files", ["relative"], "is not an absolute path"),
        ("files", "/a", "is not a list"),
        ("read", ["/a\nb"], "line-break"),
        ("extra_units", ["rm -rf /"], "is not a systemd unit name"),
        ("packages", [""], "is not a package name"),
    ],
)
def test_bad_request_options_are_refused_naming_the_option(node, option, value, problem):
    with pytest.raises(UmaError) as err:
        ef.engine_facts(dict(node, engines=[], **{option: value}), FakeSystemctl(), None)
    assert err.value.message.startswith("option '%s" % option) and problem in err.value.message
