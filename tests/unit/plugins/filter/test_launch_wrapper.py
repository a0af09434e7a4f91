# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher's per-engine config (plugins/filter/launch_wrapper.py over
plugins/module_utils/service/launch_wrapper.py): the same document the role's Jinja wrote before the
filter (tasks/engine.yml up to this release), rendered by ansible-core's to_nice_json."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.uma.vllm.plugins.filter import launch_wrapper as lw
from ansible_collections.uma.vllm.plugins.module_utils.service.launch_wrapper import MANAGED

BASE = {"name": "e1", "command": ["/opt/vllm/bin/python", "-m", "vllm"], "model_path": "/models/m", "port": 8100}


def test_defaults_match_the_old_template():
    config = lw.engine_config(dict(BASE))
    assert config == {
        "_comment": MANAGED,
        "engine": "e1",
        "command": [
            "/opt/vllm/bin/python",
            "-m",
            "vllm",
            "--model",
            "/models/m",
            "--host",
            "127.0.0.1",
            "--port",
            "8100",
        ],
        "model_path": "/models/m",
        "health_url": "http://127.0.0.1:8100/health",
        "env": {},
        "guard_mode": None,
        "readahead_kb": None,
        "pre_evict": None,
        "plan": None,
        "cluster": None,
    }


def test_every_key_the_template_read():
    engine = dict(
        BASE,
        model_flag="",
        host="0.0.0.0",
        args=["--max-model-len", 512, True],
        env={"A": "1"},
        guard_mode="files",
        readahead_kb=128,
        pre_evict=False,
        plan={"kv": 1},
        cluster={"rank": 1},
        user="uma-engine",
        group="uma-engine",
        groups=["video"],
        home="/var/lib/uma-engine",
    )
    config = lw.engine_config(engine, "managed text")
    assert config["command"][3:] == [
        "/models/m",
        "--host",
        "0.0.0.0",
        "--port",
        "8100",
        "--max-model-len",
        "512",
        "True",
    ]
    assert config["health_url"] == "http://127.0.0.1:8100/health"  # 0.0.0.0 is asked on loopback
    assert config["_comment"] == "managed text"
    assert (config["engine_user"], config["engine_group"], config["engine_groups"], config["engine_home"]) == (
        "uma-engine",
        "uma-engine",
        ["video"],
        "/var/lib/uma-engine",
    )
    assert lw.engine_config(dict(BASE, health_url="http://x/h"))["health_url"] == "http://x/h"
    assert "engine_user" not in lw.engine_config(dict(BASE, user=""))  # unset: configs stay byte for byte the same


def test_files_are_nice_json_with_a_newline():
    files = lw.engine_files([dict(BASE), dict(BASE, name="e2", port=8101)], "/etc/uma-vllm")
    assert [(f["path"], f["mode"]) for f in files] == [
        ("/etc/uma-vllm/engines/e1.json", "0644"),
        ("/etc/uma-vllm/engines/e2.json", "0644"),
    ]
    text = files[0]["content"]
    assert text.endswith("}\n") and text.startswith('{\n  "_comment": ')
    assert json.loads(text)["command"][-1] == "8100"
    assert lw.engine_files(None, "/etc/uma-vllm") == []


@pytest.mark.parametrize("name", ["", "-x", "a/b", "x" * 65, None, "a b", "ok\n"])
def test_bad_names_are_refused_naming_the_variable(name):
    with pytest.raises(AnsibleFilterError, match=r"launch_wrapper_engines\[\]\.name = .* is not a valid engine name"):
        lw.engine_config(dict(BASE, name=name))


def test_missing_keys_are_refused():
    engine = dict(BASE)
    del engine["port"]
    with pytest.raises(AnsibleFilterError, match=r"launch_wrapper_engines\[e1\] has no 'port'"):
        lw.engine_config(engine)


@pytest.mark.parametrize("env", [{"A": True}, {"A": None}, {"A": [1]}, {"A-B": "1"}, {"A": "x\x00"}, "A=1"])
def test_env_the_launcher_refuses_is_refused_here(env):
    """A value the node's launcher refuses (exit 78 at the engine's start) is refused before a file changes."""
    with pytest.raises(AnsibleFilterError, match=r"launch_wrapper_engines\[e1\]\.env"):
        lw.engine_config(dict(BASE, env=env))


def test_the_default_managed_text_is_the_roles():
    """vllm_service writes engine configs without passing the text; it must be launch_wrapper's own."""
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
    with open(os.path.join(root, "roles", "launch_wrapper", "vars", "main.yml"), encoding="utf-8") as handle:
        assert yaml.safe_load(handle)["__launch_wrapper_managed"] == MANAGED


@pytest.mark.parametrize("user", [None, "nobody"])
def test_what_the_role_writes_passes_the_launchers_validator(tmp_path, user):
    """launch.json as roles/launch_wrapper renders it (vars/main.yml over defaults/main.yml) and an
    engine's file from this filter: the node's launcher (its strict reader and validator) takes both."""
    from jinja2.nativetypes import NativeEnvironment

    from ansible_collections.uma.vllm.plugins.module_utils.node.launch import config as _launch_config

    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
    with open(os.path.join(root, "roles", "launch_wrapper", "defaults", "main.yml"), encoding="utf-8") as handle:
        context = yaml.safe_load(handle)
    with open(os.path.join(root, "roles", "launch_wrapper", "vars", "main.yml"), encoding="utf-8") as handle:
        role_vars = yaml.safe_load(handle)
    env = NativeEnvironment()
    context.update(launch_wrapper_engine_user=user, launch_wrapper_engine_groups=[],
                   launch_wrapper_state_dir=str(tmp_path / "state"))  # fmt: skip
    context["launch_wrapper_engine_home"] = env.from_string(context["launch_wrapper_engine_home"]).render(**context)
    context["__launch_wrapper_managed"] = role_vars["__launch_wrapper_managed"]
    context["__launch_wrapper_user"] = env.from_string(role_vars["__launch_wrapper_user"]).render(**context)
    node = {k: env.from_string(v).render(**context) if isinstance(v, str) else v
            for k, v in role_vars["__launch_wrapper_node_config"].items()}  # fmt: skip
    assert node["engine_user"] == user and node["lock_timeout_s"] == 3600
    (tmp_path / "model").mkdir()
    (tmp_path / "launch.json").write_text(json.dumps(node, indent=2) + "\n")
    engine = lw.engine_config(dict(BASE, model_path=str(tmp_path / "model"), env={"VLLM_CPU_KVCACHE_SPACE": "1"}))
    (tmp_path / "e1.json").write_text(lw.to_nice_json(engine, indent=2) + "\n")
    config = _launch_config.load_config(
        ["--engine", "e1", "--config", str(tmp_path / "e1.json"), "--node-config", str(tmp_path / "launch.json")]
    )
    assert config["_sources"] == [str(tmp_path / "launch.json"), str(tmp_path / "e1.json")]
    assert (config["_identity"] or {}).get("user") == user
