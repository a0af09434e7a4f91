# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""launch_wrapper refuses a launch.json value the launcher would refuse, before anything changes.

The role renders the node-wide ``launch.json`` from its variables; the launcher reads it at every
engine start and refuses a bad value there (exit 78): the role used to write it anyway and every
engine of the node failed to start. The role's first task now runs the launcher's own checks that
need nothing from the node (``_launch_config.check_node_values``, filter
``uma.vllm.launch_wrapper_node_config_errors``). Each bad value below is refused by the filter
naming the role variable AND by the real launcher (``python3 -S uma_launch.py --check-config`` on
the flat copy of the node programs, exit 78), so the role is not stricter than the node; the
real role (ansible-playbook, local connection) fails on two of them before it creates anything,
and passes with its defaults (check mode).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import node_helpers
import pytest
import yaml

from ansible_collections.uma.vllm.plugins.filter import launch_wrapper as lw
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import config as _launch_config

ROOT = pathlib.Path(__file__).resolve().parents[4]


def role_layer():
    """launch.json as roles/launch_wrapper/vars/main.yml renders it from the role's defaults (no engine user)."""
    defaults = yaml.safe_load((ROOT / "roles" / "launch_wrapper" / "defaults" / "main.yml").read_text())
    template = yaml.safe_load((ROOT / "roles" / "launch_wrapper" / "vars" / "main.yml").read_text())
    layer = {}
    for key, value in template["__launch_wrapper_node_config"].items():
        name = value.strip("{} ") if isinstance(value, str) else None
        layer[key] = defaults[name] if name in defaults else None  # the user keys: null without a user
    layer["_comment"] = "managed"
    layer["engine_groups"] = []
    return layer


# (role variable, launch.json key, bad value, launcher option the refusal names)
BAD = [
    ("launch_wrapper_lock_timeout_s", "lock_timeout_s", 0, "lock_timeout_s"),
    ("launch_wrapper_lock_timeout_s", "lock_timeout_s", 10**9, "lock_timeout_s"),
    ("launch_wrapper_health_timeout_s", "health_timeout_s", -1, "health_timeout_s"),
    ("launch_wrapper_guard_interval_s", "guard_interval", 0.001, "guard_interval"),
    ("launch_wrapper_guard_interval_s", "guard_interval", 61, "guard_interval"),
    ("launch_wrapper_guard_threshold_mib", "guard_threshold_mib", 0, "guard_threshold_mib"),
    ("launch_wrapper_guard_max_duration_s", "guard_max_duration", 86401, "guard_max_duration"),
    ("launch_wrapper_readahead_kb", "readahead_kb", 2**32, "readahead_kb"),
    ("launch_wrapper_readahead_kb", "readahead_kb", -1, "readahead_kb"),
    ("launch_wrapper_pre_evict", "pre_evict", "all", "pre_evict"),
    ("launch_wrapper_guard_mode", "guard_mode", "fast", "guard_mode"),
    ("launch_wrapper_evict_after_healthy", "evict_after_healthy", "false", "evict_after_healthy"),
    ("launch_wrapper_guard_lock_memory", "guard_lock_memory", "yes", "guard_lock_memory"),
    ("launch_wrapper_shm_sweep", "shm_sweep", "yes", "shm_sweep"),
    ("launch_wrapper_guard_act_below_free_mib", "guard_act_below_free_mib", "lots", "guard_act_below_free_mib"),
    ("launch_wrapper_guard_act_below_free_mib", "guard_act_below_free_mib", -1, "guard_act_below_free_mib"),
    ("launch_wrapper_guard_act_below_free_mib", "guard_act_below_free_mib", True, "guard_act_below_free_mib"),
    ("launch_wrapper_guard_act_below_free_mib", "guard_act_below_free_mib", 2.5, "guard_act_below_free_mib"),
    ("launch_wrapper_state_dir", "state_dir", "var/lib/uma-vllm", "state_dir"),
    ("launch_wrapper_python", "python", "/usr/bin/python3\n", "python"),
    ("launch_wrapper_engine_umask", "engine_umask", "0999", "engine_umask"),
]
IDS = ["%s=%r" % (case[0], case[2]) for case in BAD]


def test_the_role_defaults_pass():
    assert lw.node_config_errors(role_layer()) == []


@pytest.mark.parametrize("variable, key, value, option", BAD, ids=IDS)
def test_the_filter_names_the_role_variable(variable, key, value, option):
    errors = lw.node_config_errors(dict(role_layer(), **{key: value}))
    assert len(errors) == 1
    assert errors[0].startswith("%s: option '%s' = " % (variable, option)), errors
    assert "exit 78" in errors[0] and "Traceback" not in errors[0]


def test_an_unknown_key_is_named():
    errors = lw.node_config_errors(dict(role_layer(), guard_intervall=0.1))
    assert len(errors) == 1 and "option 'guard_intervall'" in errors[0] and "is not a launcher option" in errors[0]


def test_not_a_mapping_is_a_filter_error():
    with pytest.raises(Exception, match="expects a mapping"):
        lw.node_config_errors(["lock_timeout_s"])


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    return node_helpers.flat_copy(tmp_path_factory.mktemp("flat"))


def check_config(lib, tmp_path, layer, engine_user=None):
    """The real launcher's --check-config on this launch.json and a minimal engine file."""
    (tmp_path / "model").mkdir(exist_ok=True)
    node = tmp_path / "launch.json"
    node.write_text(json.dumps(layer))
    engine = {"engine": "e1", "command": ["true"], "health_url": "http://127.0.0.1:1/health",
              "model_path": str(tmp_path / "model")}  # fmt: skip
    if engine_user:
        engine["engine_user"] = engine_user
    config = tmp_path / "e1.json"
    config.write_text(json.dumps(engine))
    return subprocess.run(
        [node_helpers.NODE_PYTHON, "-S", str(lib / "uma_launch.py"), "--node-config", str(node), "--config",
         str(config), "--check-config"],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/", capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def test_the_launcher_takes_the_role_defaults(lib, tmp_path):
    proc = check_config(lib, tmp_path, role_layer())
    assert proc.returncode == 0 and "is valid" in proc.stdout, proc.stderr


@pytest.mark.parametrize("variable, key, value, option", BAD, ids=IDS)
def test_the_launcher_refuses_each_with_78(lib, tmp_path, variable, key, value, option):
    """The filter is not stricter than the node: the launcher refuses the same value (the umask once
    an engine runs as a user: as root the launcher does not read it)."""
    user = "nobody" if key == "engine_umask" else None
    proc = check_config(lib, tmp_path, dict(role_layer(), **{key: value}), engine_user=user)
    assert proc.returncode == _launch_config.EXIT_CONFIG == 78, proc.stdout + proc.stderr
    assert "option '%s'" % option in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """The real role: its defaults (installs under tmp), two bad values (fail before anything is created)."""
    tmp = tmp_path_factory.mktemp("lw-node-config")
    hosts = {}
    for name, extra in (("defaults", {}), ("lock0", {"launch_wrapper_lock_timeout_s": 0}),
                        ("interval", {"launch_wrapper_guard_interval_s": 0.001})):  # fmt: skip
        base = tmp / name
        base.mkdir()
        hosts[name] = dict(
            extra,
            ansible_connection="local",
            ansible_python_interpreter=sys.executable,
            launch_wrapper_lib_dir=str(base / "lib"),
            launch_wrapper_state_dir=str(base / "state"),
            launch_wrapper_config_dir=str(base / "etc"),
            launch_wrapper_bin=str(base / "vllm-uma-launch"),
        )
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    # one play: a host that fails leaves the others going (the defaults host installs for real, under tmp)
    play = [{"hosts": "all", "gather_facts": False, "roles": ["uma.vllm.launch_wrapper"]}]
    (tmp / "play.yml").write_text(yaml.safe_dump(play))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json")  # fmt: skip
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(tmp / "inventory.yml"),
         str(tmp / "play.yml")],
        capture_output=True, text=True, cwd=tmp, env=env, timeout=300, check=False,
    )  # fmt: skip
    return tmp, done


def test_the_role_installs_with_its_defaults(played):
    tmp, done = played
    assert "fatal: [defaults]" not in done.stdout and re.search(r"defaults +: ok=\d+ .* failed=0", done.stdout), (
        done.stdout[-3000:]
    )
    assert json.loads((tmp / "defaults" / "etc" / "launch.json").read_text())["lock_timeout_s"] == 3600


@pytest.mark.parametrize("host, variable", [("lock0", "launch_wrapper_lock_timeout_s"),
                                            ("interval", "launch_wrapper_guard_interval_s")])  # fmt: skip
def test_the_role_refuses_before_anything_changes(played, host, variable):
    tmp, done = played
    fatal = [line for line in done.stdout.splitlines() if line.startswith("fatal: [%s]: FAILED! => " % host)]
    assert len(fatal) == 1, done.stdout[-3000:]
    result = json.loads(fatal[0].split(" => ", 1)[1])
    assert result["msg"].startswith("uma.vllm.launch_wrapper: %s: option '" % variable), result
    assert result["assertion"] == "__launch_wrapper_node_config_errors | length == 0"
    assert os.listdir(tmp / host) == []  # no directory, program or config made
