# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad-input harness, node side: the real programs (uma_launch.py, uma_guard.py, uma_watchdog.py)
as subprocesses, every configuration they read made bad (fixed seed).

Each case starts from what the roles write (the launch_wrapper filter's engine config, the
role's launch.json, the vllm_service filter's watchdog config; the guard's command line as
the launcher builds it), every path inside a fresh temporary directory, and makes it bad in
one way:

- a config file missing, empty, truncated, of the wrong JSON shape, not UTF-8, a directory,
  a FIFO, a symlink (to a text file, dangling, a loop), huge, nested too deep, NaN/Infinity
  literals, an unknown key;
- a numeric setting NaN / Infinity / 1e308 / 1e400 / negative / a boolean / a string / 10**40;
- a boolean as the string "false" or 0; a path empty, relative, with NUL or a line break.

The program runs as the node runs it (``python3 -E -s FILE``, no Ansible on the path) with
``--check-config`` (validate, say so, exit), under a timeout. A bad case passes when the program
exits with its configuration error code (78; the guard's command line: 2) and ONE line on
stderr that names the key or the file and gives a fix. Counted per program: ``traceback``
(Python's), ``hang`` (timeout), ``silent`` (exit 0 on a bad value: accepted or replaced by a
default), ``unclear`` (another exit code, several lines, or a line naming neither key nor file),
``false_refusal`` (a valid variant refused). conftest prints the counts.

UMA_NODE_HARNESS_EXAMPLES sets the cases per program (default 120).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import harness_core as h
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "module_utils"))
import node_helpers

from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic
from ansible_collections.uma.vllm.plugins.module_utils.service import launch_wrapper as _launch_wrapper
from ansible_collections.uma.vllm.plugins.module_utils.service import watchdog as _vllm_service_watchdog

HERE = os.path.dirname(os.path.abspath(__file__))
# the programs as a node runs them: the node package installed by the collection's installer
NODE_LIB = node_helpers.NODE_LIB
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
EXAMPLES = int(os.environ.get("UMA_NODE_HARNESS_EXAMPLES", "120"))
TIMEOUT_S = 20
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
NAN = "__NaN__"  # placeholders written as the bare JSON-ish literals Python's json emits and accepts
RAW = {NAN: "NaN", "__Inf__": "Infinity", "__-Inf__": "-Infinity", "__1e400__": "1e400"}
NUMERIC_BAD = [NAN, "__Inf__", "__-Inf__", "__1e400__", 1e308, -1e308, -1, -0.5, True, False, "5", "nan", "", [], {},
               10**40, "1e3"]  # fmt: skip
BOOL_BAD = ["false", "true", 0, 1, "", [], "yes"]
PATH_BAD = ["", "relative/dir", "/a\x00b", "/a\nb", 5, True, []]
TEXT_BAD = ["", "a b", "a\nb", "x\x00", 5, True, [], {"k": 1}]
FILE_DAMAGE = ["missing", "empty", "truncated", "list", "string", "null", "number", "non_utf8", "dir", "fifo",
               "link_text", "dangling", "loop", "huge", "deep", "nan_literal", "unknown_key"]  # fmt: skip


@dataclass
class Case:
    program: str
    argv: List[str]
    root: str
    names: List[str]  # a refusal must name one of these (a key, an option or a file)
    bad: bool = True  # False: a valid variant (exit 0 expected)
    either: bool = False  # a valid or a refused outcome are both right (e.g. a symlink to another config)
    label: str = ""
    cwd: Optional[str] = None
    result: Dict[str, Any] = field(default_factory=dict)


def _dump(path: str, data: Any) -> None:
    text = json.dumps(data, indent=2)
    for marker, literal in RAW.items():
        text = text.replace('"%s"' % marker, literal)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


def damage_file(path: str, how: str, valid: Dict[str, Any], data) -> List[str]:
    """Replace a config file by something bad; the names a refusal may use besides the option."""
    if os.path.lexists(path):
        os.unlink(path)
    text = json.dumps(valid, indent=2)
    if how == "missing":
        pass
    elif how == "empty":
        open(path, "w").close()
    elif how == "truncated":
        cut = data.draw(st.integers(1, len(text) - 2), label="cut at")
        with open(path, "w") as handle:
            handle.write(text[:cut])
    elif how in ("list", "string", "null", "number"):
        body = {"list": "[1, 2]", "string": '"text"', "null": "null", "number": "5"}[how]
        with open(path, "w") as handle:
            handle.write(body)
    elif how == "non_utf8":
        with open(path, "wb") as handle:
            handle.write(text.replace('"', '"\xff', 1).encode("latin-1"))
    elif how == "dir":
        os.mkdir(path)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "link_text":
        other = path + ".txt"
        with open(other, "w") as handle:
            handle.write("root:x:0:0:root:/root:/bin/bash\n")
        os.symlink(other, path)
    elif how == "dangling":
        os.symlink(path + ".nowhere", path)
    elif how == "loop":
        os.symlink(path + ".loop", path)
        os.symlink(path, path + ".loop")
    elif how == "huge":
        with open(path, "w") as handle:
            handle.write(text[:-1] + ', "_comment": "%s"}' % ("x" * (1100 * 1024)))
    elif how == "deep":
        with open(path, "w") as handle:
            handle.write('{"_comment": ' + "[" * 200000 + "]" * 200000 + "}")
    elif how == "nan_literal":
        key = data.draw(st.sampled_from(sorted(k for k in valid if not k.startswith("_"))), label="nan key")
        _dump(path, dict(valid, **{key: NAN}))
    elif how == "unknown_key":
        _dump(path, dict(valid, lock_timout_s=5))
        return ["lock_timout_s"]
    else:
        raise ValueError(how)
    return []


def _bad_value(data, kind: str) -> Any:
    pool = {"number": NUMERIC_BAD, "bool": BOOL_BAD, "path": PATH_BAD, "text": TEXT_BAD}[kind]
    return data.draw(st.sampled_from(pool), label="value")


# --------------------------------------------------------------------------
# The programs


class Launcher:
    name = "uma_launch.py"
    code = 78
    numbers = ("lock_timeout_s", "health_timeout_s", "health_interval_s", "stop_timeout_s", "peer_stop_grace_s",
               "admission_wait_s",
               "guard_interval", "guard_threshold_mib", "guard_max_duration", "readahead_kb",
               "admission_request_bytes", "guard_act_below_free_mib")  # fmt: skip
    bools = ("evict_after_healthy", "guard", "watch_ranks", "admission", "shm_sweep")
    paths = ("lock_path", "state_dir", "lib_dir", "python", "proc_root", "sysfs_root", "model_path", "shm_dir")
    texts = ("engine", "pre_evict", "guard_mode", "health_url", "engine_user", "engine_umask", "command", "env",
             "plan", "cluster", "admission_memory")  # fmt: skip
    # what the roles write into the engine's file (the filter); the rest into the node's launch.json
    engine_keys = ("engine", "command", "model_path", "health_url", "env", "guard_mode", "readahead_kb", "pre_evict",
                   "plan", "cluster")  # fmt: skip

    def files(self, root: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        model = os.path.join(root, "model")
        os.makedirs(model, exist_ok=True)
        # the engine's file as the launch_wrapper filter (roles launch_wrapper, vllm_service) writes it
        engine = _launch_wrapper.engine_config(
            {
                "name": "main",
                "command": [PYTHON, "-m", "vllm.entrypoints.openai.api_server"],
                "model_path": model,
                "port": 8000,
                "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
                "readahead_kb": 8,
            }
        )
        # launch.json as roles/launch_wrapper writes it (vars/main.yml), every path in the temp dir
        node = {
            "_comment": "Managed by uma.vllm (role launch_wrapper)",
            "lock_path": os.path.join(root, "run", "launch.lock"),
            "lock_timeout_s": 3600,
            "health_timeout_s": 1800,
            "pre_evict": "files",
            "guard_mode": "adaptive",
            "guard_interval": 0.1,
            "guard_threshold_mib": 16,
            "guard_max_duration": 1800,
            "guard_act_below_free_mib": "auto",
            "readahead_kb": None,
            "evict_after_healthy": True,
            "shm_sweep": True,
            "state_dir": os.path.join(root, "state"),
            "lib_dir": NODE_LIB,
            "python": PYTHON,
            "engine_user": "nobody",
            "engine_group": None,
            "engine_groups": [],
            "engine_home": os.path.join(root, "home"),
            "engine_umask": "0027",
        }
        return node, engine

    VALID = ("as is", "no node config", "node link", "engine link", "nulls", "root engine", "plan")
    # the plan's numbers the launcher reads (issue 36: each checked where the config is read)
    plan_numbers = ("requested_memory_bytes", "cuda_context_bytes", "ranks_per_node", "gpus_per_node")
    plan = {"requested_memory_bytes": 12 << 30, "ranks_per_node": 1, "gpus_per_node": 1, "unified_memory": True,
            "cuda_context_bytes": None}  # fmt: skip

    def build(self, data, root: str, variant: Optional[str] = None) -> Case:
        node, engine = self.files(root)
        node_path, engine_path = os.path.join(root, "launch.json"), os.path.join(root, "engine.json")
        # no --engine: the engine file's name counts (the unit's --engine %i would win over it)
        argv = [os.path.join(NODE_LIB, "uma_launch.py"), "--config", engine_path, "--node-config", node_path,
                "--check-config"]  # fmt: skip
        mode = data.draw(st.sampled_from(["value", "value", "file", "valid"]), label="mode") if data else "valid"
        _dump(node_path, node)
        _dump(engine_path, engine)
        if mode == "valid":
            how = variant or data.draw(st.sampled_from(self.VALID), label="variant")
            if how == "no node config":  # documented: no launch.json = the launcher's defaults (logged)
                os.unlink(node_path)
            elif how in ("node link", "engine link"):
                target = node_path if how == "node link" else engine_path
                os.rename(target, target + ".real")
                os.symlink(target + ".real", target)
            elif how == "nulls":  # null = the node-wide default (the filter writes guard_mode: null)
                _dump(engine_path, dict(engine, guard_mode=None, pre_evict=None, readahead_kb=None))
            elif how == "root engine":  # the role's launch.json when vllm_service_user is root
                _dump(node_path, dict(node, engine_user=None, engine_home=None, engine_groups=[]))
            elif how == "plan":  # a plan as uma.vllm.vllm_flags makes it
                _dump(engine_path, dict(engine, plan=self.plan))
            return Case(self.name, argv, root, [], bad=False, label="valid: " + how)
        if mode == "file":
            which = data.draw(st.sampled_from([node_path, engine_path]), label="file")
            how = data.draw(st.sampled_from(FILE_DAMAGE), label="damage")
            valid = node if which == node_path else engine
            extra = damage_file(which, how, valid, data)
            if how == "missing" and which == node_path:
                return Case(self.name, argv, root, [], bad=False, label="valid: launch.json missing")
            return Case(self.name, argv, root, [which, *extra], label="%s %s" % (os.path.basename(which), how))
        kind = data.draw(st.sampled_from(["number", "bool", "path", "text", "plan"]), label="kind")
        if kind == "plan":  # one of the plan's numbers made bad, in the engine's file
            key = data.draw(st.sampled_from(self.plan_numbers), label="key")
            value = _bad_value(data, "number")
            _dump(engine_path, dict(engine, plan=dict(self.plan, **{key: value})))
            return Case(self.name, argv, root, ["plan." + key, engine_path], label="plan.%s=%r" % (key, value))
        key = data.draw(st.sampled_from({"number": self.numbers, "bool": self.bools, "path": self.paths,
                                         "text": self.texts}[kind]), label="key")  # fmt: skip
        value = self.text_value(data, key) if kind == "text" else _bad_value(data, kind)
        in_engine = key in self.engine_keys or data.draw(st.booleans(), label="in engine file")
        path = engine_path if in_engine else node_path
        layer = dict(engine if in_engine else node)
        layer[key] = value
        _dump(path, layer)
        return Case(self.name, argv, root, [key, path], label="%s=%r in %s" % (key, value, os.path.basename(path)))

    def text_value(self, data, key: str) -> Any:
        special = {
            "command": [[], "python3", [""], ["a\x00b"], [5], {"a": 1}],
            "env": [[], "A=1", {"A": None}, {"A=B": "x"}, {"A": "x\x00"}, {"A": True}, {"A": [1]}, {"": "x"}],
            "health_url": ["ftp://x/h", "http://", "http://a b/h", "http://a/\nb", 5, "127.0.0.1:8000/health"],
            "engine_user": [5, False, True, "no such user", "nosuchuser-uma", [], "a\nb"],
            "engine_umask": ["0999", "27", -1, 4096, True, "u=rwx", 1.5],
            "plan": ["plan", [1], 5, True],
            "cluster": ["x", [1], {"rank": 0}, {"nnodes": 2, "rank": 5, "link_port": 1, "head_addr": "h"}, True],
        }
        # "bogus": not one of the names an enumeration allows
        enumerated = ["bogus"] if key in ("pre_evict", "guard_mode", "admission_memory") else []
        return data.draw(st.sampled_from(special.get(key, TEXT_BAD + enumerated)), label="value")


class Watchdog:
    name = "uma_watchdog.py"
    code = 78
    ints = ("fail_threshold", "max_restarts", "floor_samples", "status_port", "rank")
    bools = ("unified_memory", "lock_memory")
    paths = ("state_dir", "proc_root", "cgroup_root", "meminfo_root", "textfile_dir", "model_path")
    texts = ("engine", "unit", "base_url", "evict_scope", "systemctl", "container_bin", "api_key_env", "status_bind",
             "model", "container", "processes", "peers", "leader_url")  # fmt: skip

    @property
    def numbers(self) -> Tuple[str, ...]:
        # every duration the watchdog knows (new ones are covered as they are added) and the rest
        return (*logic._POSITIVE, "rank_link_grace_s", *self.ints, "ram_gib", "warn_floor_mib", "critical_floor_mib")

    def config(self, root: str) -> Dict[str, Any]:
        model = os.path.join(root, "model")
        os.makedirs(model, exist_ok=True)
        settings_ = {"state_dir": os.path.join(root, "state"), "unified_memory": True,
                     "textfile_dir": os.path.join(root, "textfile"), "interval_s": 5, "ram_gib": 128}  # fmt: skip
        raw = _vllm_service_watchdog.base_config(
            "main", {"model_path": model, "port": 8000}, {"health_url": "http://127.0.0.1:8000/health"}, 0, settings_
        )
        raw.update(proc_root="/proc", cgroup_root=os.path.join(root, "cgroup"))
        return raw

    VALID = ("as is", "link", "nulls", "rank 1", "container")

    def build(self, data, root: str, variant: Optional[str] = None) -> Case:
        cfg = self.config(root)
        path = os.path.join(root, "watchdog.json")
        argv = [os.path.join(NODE_LIB, "uma_watchdog.py"), "--config", path, "--check-config"]
        _dump(path, cfg)
        mode = data.draw(st.sampled_from(["value", "value", "file", "valid"]), label="mode") if data else "valid"
        if mode == "valid":
            how = variant or data.draw(st.sampled_from(self.VALID), label="variant")
            if how == "link":
                os.rename(path, path + ".real")
                os.symlink(path + ".real", path)
            elif how == "nulls":
                _dump(path, dict(cfg, textfile_dir=None, model=None, warn_floor_mib=None))
            elif how == "rank 1":  # a peer rank as the vllm_service filter writes it
                _dump(path, dict(cfg, rank=1, leader_url="http://10.0.0.1:9411/status", status_port=9411,
                                 status_bind="10.0.0.2"))  # fmt: skip
            elif how == "container":
                _dump(path, dict(cfg, container="uma-vllm-main", container_bin="/usr/bin/docker"))
            return Case(self.name, argv, root, [], bad=False, label="valid: " + how)
        if mode == "file":
            how = data.draw(st.sampled_from(FILE_DAMAGE), label="damage")
            extra = damage_file(path, how, cfg, data)
            return Case(self.name, argv, root, [path, *extra], label="config " + how)
        kind = data.draw(st.sampled_from(["number", "bool", "path", "text"]), label="kind")
        key = data.draw(st.sampled_from({"number": self.numbers, "bool": self.bools, "path": self.paths,
                                         "text": self.texts}[kind]), label="key")  # fmt: skip
        if kind == "text":
            value = data.draw(st.sampled_from(self.text_values(key)), label="value")
        else:
            value = _bad_value(data, kind)
        _dump(path, dict(cfg, **{key: value}))
        return Case(self.name, argv, root, [key, path], label="%s=%r" % (key, value))

    @staticmethod
    def text_values(key: str) -> List[Any]:
        special = {
            "base_url": ["ftp://x", "http://", "http://a b", "http://a\nb", 5],
            "processes": ["x", [1], [{"match": "("}], [{"match": "a", "min": 0}], [{"match": "a", "min": True}]],
            "peers": ["x", [1], [{"name": "a", "url": "ftp://x"}]],
            "leader_url": [5, "ftp://x"],  # on rank 0 a leader_url is ignored: only refusable values
            "container": ["a b", "-x", 5, True, "a\nb"],
            "api_key_env": ["A-B", "1A", "A B", 5, "", "A\n"],
            "model": ["", "a\nb", "x\x00", 5, True, [], {"k": 1}],  # a served model name may hold a space
        }
        # "bogus": not one of the names an enumeration allows (a valid command or address elsewhere)
        return special.get(key, TEXT_BAD + (["bogus"] if key in ("unit", "evict_scope") else []))


class GuardCli:
    """uma_guard.py reads no config file: its configuration is its command line (exit 2 on a bad one)."""

    name = "uma_guard.py"
    code = 2
    numbers = ("--interval", "--threshold-mib", "--min-available-mib", "--drop-level", "--max-duration",
               "--until-pid", "--act-below-free-mib")  # fmt: skip
    number_bad = ["nan", "inf", "-inf", "1e308", "1e400", "-1", "True", "", "x", "0x10", "\uff11", "1" * 40, "--"]

    def base(self, root: str) -> List[str]:
        model = os.path.join(root, "model")
        os.makedirs(model, exist_ok=True)
        with open(os.path.join(model, "model.safetensors"), "wb") as handle:
            handle.write(b"\0" * 4096)
        return [os.path.join(NODE_LIB, "uma_guard.py"), "--name", "launch-main", "--mode", "files",
                "--paths", model, "--status-file", os.path.join(root, "guard.json"),
                "--samples-file", os.path.join(root, "samples.jsonl"), "--check-config"]  # fmt: skip

    VALID = ("as is", "relative status file", "numbers as text", "as the launcher writes it")

    def build(self, data, root: str, variant: Optional[str] = None) -> Case:
        argv = self.base(root)
        mode = data.draw(st.sampled_from(["number", "number", "path", "valid"]), label="mode") if data else "valid"
        if mode == "valid":
            how = variant or data.draw(st.sampled_from(self.VALID), label="variant")
            if how == "as the launcher writes it":  # uma_launch.py's start_guard: str() of its numbers
                argv += ["--interval", str(0.1), "--threshold-mib", str(16), "--max-duration", str(1800.0),
                         "--until-pid", str(os.getpid())]  # fmt: skip
                # the launcher's adaptive guard with its line (files mode takes no line)
                argv[argv.index("files")] = "adaptive"
                argv += ["--act-below-free-mib", str(4096)]
            if how == "relative status file":  # documented: made absolute against the working directory
                argv[argv.index("--status-file") + 1] = "guard.json"
            elif how == "numbers as text":
                argv += ["--interval", "0.5", "--max-duration", "60", "--threshold-mib", "32"]
            return Case(self.name, argv, root, [], bad=False, label="valid: " + how, cwd=root)
        if mode == "number":
            option = data.draw(st.sampled_from(self.numbers), label="option")
            value = data.draw(st.sampled_from(self.number_bad), label="value")
            return Case(self.name, [*argv, "%s=%s" % (option, value)], root, [option], label="%s=%r" % (option, value))
        option = data.draw(st.sampled_from(["--status-file", "--samples-file", "--proc-root", "--sysfs-root",
                                            "--paths"]), label="option")  # fmt: skip
        how = data.draw(st.sampled_from(["", "newline", "dir", "link", "loop", "missing dir"]), label="path")
        value = {"": "", "newline": os.path.join(root, "a\nb")}.get(how)
        if how == "dir":
            value = os.path.join(root, "a_dir")
            os.mkdir(value)
        elif how in ("link", "loop"):
            value = os.path.join(root, "a_link")
            os.symlink(os.path.join(root, "guard.json") if how == "link" else value, value)
        elif how == "missing dir":
            value = os.path.join(root, "no", "such", "file")
        if option in ("--status-file", "--proc-root", "--sysfs-root") and how in ("dir", "link", "loop", "missing dir"):
            # status: written by the guard at run time (its writer reports a failure); the roots are
            # read at run time: what --check-config can judge is the value, which is a valid path here
            return Case(self.name, [*argv, option, value], root, [option], bad=False, either=True, label=option + how)
        if option == "--paths" and how == "dir":  # a model directory: valid
            return Case(self.name, [*argv, option, value], root, [], bad=False, label="valid: --paths dir")
        return Case(self.name, [*argv, option, value], root, [option], label="%s %s" % (option, how or "empty"))


PROGRAMS = [Launcher(), Watchdog(), GuardCli()]


# --------------------------------------------------------------------------
# Running and judging


def run_case(case: Case) -> Dict[str, Any]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    try:
        proc = subprocess.run([PYTHON, "-E", "-s", *case.argv], capture_output=True, text=True, errors="replace",
                              timeout=TIMEOUT_S, env=env, cwd=case.cwd or case.root, check=False,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "detail": "no exit within %ss" % TIMEOUT_S}
    return judge(case, proc.returncode, proc.stdout, proc.stderr)


def judge(case: Case, code: int, out: str, err: str) -> Dict[str, Any]:
    program = next(p for p in PROGRAMS if p.name == case.program)
    lines = [line for line in err.splitlines() if line.strip()]
    detail = "exit %d: %s" % (code, err.strip()[-700:] or out.strip()[-300:])
    if "Traceback (most recent call last)" in err:
        return {"outcome": "traceback", "detail": detail}
    if code == 0:
        if case.bad and not case.either:
            return {"outcome": "silent", "detail": "exit 0 on a bad value: %s" % out.strip()[-300:]}
        return {"outcome": "ok", "detail": ""}
    if code != program.code:
        return {"outcome": "unclear", "detail": detail}
    if not case.bad and not case.either:
        return {"outcome": "false_refusal", "detail": detail}
    if len(lines) != 1:
        return {"outcome": "unclear", "detail": "%d lines: %s" % (len(lines), detail)}
    line = lines[0]
    named = any(name and name in line for name in case.names)
    has_fix = ". " in line and line.rstrip().endswith(".")
    if not named or not has_fix:
        return {"outcome": "unclear", "detail": "names none of %s or no fix: %s" % (case.names, line)}
    return {"outcome": "refused", "detail": ""}


def _rmtree(root: str) -> None:
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(base, name)
            try:
                if stat.S_ISFIFO(os.lstat(full).st_mode):
                    os.unlink(full)
            except OSError:
                pass
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_node_program_bad_configuration(program):
    target = "node:" + program.name
    h.COUNTS.pop(target, None)
    h.EXAMPLES.pop(target, None)
    cases: List[Case] = []
    base = tempfile.mkdtemp(prefix="node-harness-", dir=h.SCRATCH)

    @SETTINGS
    @given(st.data())
    def generate(data):
        root = tempfile.mkdtemp(dir=base)
        cases.append(program.build(data, root))

    try:
        generate()
        # every valid variant once, beside the generated ones: the programs must still take them
        cases.extend(program.build(None, tempfile.mkdtemp(dir=base), how) for how in program.VALID)
        # the programs run concurrently (each is a short, independent process)
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(run_case, cases))
    finally:
        _rmtree(base)
    counts, bad = tally(target, cases, results, EXAMPLES)
    assert counts["ok"] >= len(program.VALID), "too few valid variants accepted (%s)" % dict(counts)
    assert not bad, "%s: %s\n%s" % (target, bad, "\n".join(h.EXAMPLES[target]))


def tally(target: str, cases: List[Any], results: List[Dict[str, Any]], examples: int) -> Tuple[Any, Dict[str, int]]:
    """Each case's outcome counted under ``target`` (conftest prints the table), the first 40 bad
    ones kept as examples; the run must have drawn ``examples`` cases and refused half of them.
    Returns the counts and the bad outcomes (traceback, hang, silent, unclear, false_refusal)."""
    counts = h.COUNTS[target]
    for case, result in zip(cases, results):
        counts["cases"] += 1
        counts[result["outcome"]] += 1
        if result["outcome"] not in ("ok", "refused") and len(h.EXAMPLES[target]) < 40:
            h.EXAMPLES[target].append("%s: %s\n    %s" % (result["outcome"], case.label, result["detail"]))
    bad = {k: counts[k] for k in ("traceback", "hang", "silent", "unclear", "false_refusal") if counts[k]}
    assert counts["cases"] >= examples, "only %d cases for %s" % (counts["cases"], target)
    assert counts["refused"] >= examples // 2, "too few refusals: the harness exercises too little (%s)" % dict(counts)
    return counts, bad
