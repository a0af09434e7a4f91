# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Bad-input harness: every module, in-process, >= 1,000 generated cases each (fixed seed).

Each case builds a fresh fake node under a temporary root, makes 1-3 options
bad (wrong types, bool for number, 0 / negative / huge / inf / nan / 10**40,
unicode digits, empty strings, newline / NUL / ; / quotes, file-vs-dir swaps,
dangling and looping symlinks, non-UTF-8 files), optionally damages one file
the module reads (directory in place of a file, non-UTF-8 bytes, wrong-shape
JSON, ...), runs the module's ``main()`` and requires a clean refusal naming
the option, or a sane success; after a refusal every byte under the root must
be as before. ``harness_core`` counts the outcomes; conftest prints them.

UMA_HARNESS_EXAMPLES sets the cases per module (default 1000).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

import harness_core as h
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ansible_collections.uma.vllm.plugins.module_utils.node.base import blockdev as _blockdev
from ansible_collections.uma.vllm.plugins.module_utils.system import guard_service as _guard_service
from ansible_collections.uma.vllm.plugins.modules import (
    drop_cache_loop,
    engine_facts,
    model_copy,
    model_fetch,
    node_facts,
    node_files,
    oom_diagnose,
    rdma_facts,
    readahead_window,
    uma_sysctl,
    vllm_flags,
)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugins", "modules"))
from test_drop_cache_loop import FakeGuardSystemd
from test_readahead_window import FakeSystemd

sys.path.insert(0, os.path.join(HERE, "..", "plugins", "module_utils"))
import rdma_tree
from test_model_fetch import StandInHubClient, make_repo

from ansible_collections.uma.vllm.plugins.module_utils.models import copy as _model_copy
from ansible_collections.uma.vllm.plugins.module_utils.models import fetch as _model_fetch

EXAMPLES = int(os.environ.get("UMA_HARNESS_EXAMPLES", "1000"))
PYTHON = "/usr/bin/python3"
SETTINGS = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def spec_of(module) -> Dict[str, Dict[str, Any]]:
    """The module's argument_spec, read by running main() with a capturing AnsibleModule."""
    from ansible.module_utils import basic

    captured = {}

    class Stop(Exception):
        pass

    def capture(self, argument_spec, **kw):
        captured.update(argument_spec)
        raise Stop

    with h.patched(extra=[(basic.AnsibleModule, "__init__", capture)]), h.patch_module_args({}):
        try:
            module.main()
        except Stop:
            pass
    return captured


class Target:
    """How to build a node for one module and which options are which."""

    name: str = ""
    module: Any = None
    numeric: tuple = ()
    paths: tuple = ()  # options taking a path: never None (None means the real default)
    keep: tuple = ()  # options never mutated (they point at the real system)
    faults: Dict[str, List[str]] = {}  # relative file -> options a refusal should name

    def build(self, root: str) -> Dict[str, Any]:
        raise NotImplementedError

    def runner(self):
        return None

    def extra_patches(self):
        return []

    def special(self, data, root: str, args: Dict[str, Any]) -> Optional[tuple]:
        """Module-specific bad inputs: return (args, names, nonsense) or None."""
        return None

    def post_check(self, args: Dict[str, Any], result: Dict[str, Any], root: str) -> Optional[str]:
        return None

    def nonsense(self, option: str, value: Any) -> bool:
        return option in self.numeric and h.is_bad_number(value)


def _write(path: str, text: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(path, mode) as handle:
        handle.write(text)


class Sysctl(Target):
    name = "uma_sysctl"
    module = uma_sysctl
    numeric = ("min_free_kbytes", "ram_gib", "vfs_cache_pressure", "dirty_ratio", "dirty_background_ratio")
    paths = ("path", "proc_root", "sysctl_dirs", "sysctl_conf", "state_dir")
    faults = {
        "proc/meminfo": ["ram_gib", "proc_root", "meminfo"],
        "proc/sys/vm/dirty_ratio": ["proc_root", "vm.dirty_ratio"],
        "proc/sys/vm/swappiness": ["proc_root", "vm.swappiness", "extra"],
        "etc/sysctl.d/90-vllm.conf": ["path"],
        "etc/sysctl.d/50-other.conf": ["sysctl_dirs", "50-other.conf"],
        "etc/sysctl.d/99-zz.conf": ["sysctl_dirs", "99-zz.conf"],
        "etc/sysctl.conf": ["sysctl_conf"],
        "state/sysctl-original.json": ["state_dir"],
        "state": ["state_dir"],
        "etc/sysctl.d": ["path", "sysctl_dirs"],
    }

    def build(self, root):
        for key, value in {
            "min_free_kbytes": 45056,
            "vfs_cache_pressure": 100,
            "dirty_ratio": 20,
            "dirty_background_ratio": 10,
            "swappiness": 60,
        }.items():
            _write(os.path.join(root, "proc/sys/vm", key), "%s\n" % value)
        _write(os.path.join(root, "proc/meminfo"), "MemTotal:       126877696 kB\n")
        _write(os.path.join(root, "etc/sysctl.d/50-other.conf"), "vm.swappiness = 30\n")
        _write(os.path.join(root, "etc/sysctl.d/99-zz.conf"), "kernel.x = 1\n")
        _write(os.path.join(root, "etc/sysctl.conf"), "# empty\n")
        _write(os.path.join(root, "state/keep"), "")
        return {
            "path": os.path.join(root, "etc/sysctl.d/90-vllm.conf"),
            "proc_root": os.path.join(root, "proc"),
            "sysctl_dirs": [os.path.join(root, "etc/sysctl.d")],
            "sysctl_conf": os.path.join(root, "etc/sysctl.conf"),
            "state_dir": os.path.join(root, "state"),
        }

    def nonsense(self, option, value):
        if option in ("min_free_kbytes", "ram_gib") and value == "":
            return False  # documented: empty means unset
        if option == "vfs_cache_pressure" and value in (0, "0", "-0", 0.0):
            return True
        return super().nonsense(option, value)

    def special(self, data, root, args):
        key = data.draw(
            st.sampled_from(["vm.swappiness", "vm.nope", "kernel.pid_max", "vm.drop_caches", "vm/swappiness", ""]),
            label="extra key",
        )
        value = data.draw(st.sampled_from(h.GENERIC), label="extra value")
        args["extra"] = {key: value}
        bad = key == "vm.swappiness" and (h.is_bad_number(value) or value in (10**40, 2**63))
        return args, ["extra"], bad

    def post_check(self, args, result, root):
        text = h._read(args.get("path")) if isinstance(args.get("path"), str) else None
        if text and "min_free_kbytes = -" in text:
            return "negative min_free_kbytes written"
        for key, value in (result.get("settings") or {}).items():
            if value is not None and len(str(value)) > 20:
                return "absurd value %s = %s" % (key, value)
        return None


class NodeFacts(Target):
    name = "node_facts"
    module = node_facts
    paths = ("sysfs_root", "proc_root")
    faults = {
        "proc/meminfo": ["proc_root", "meminfo"],
        "sys/firmware/devicetree/base/compatible": ["sysfs_root"],
        "sys/class/drm": ["sysfs_root"],
        "sys/devices/system/node/node0/meminfo": ["sysfs_root"],
    }

    def build(self, root):
        _write(os.path.join(root, "proc/meminfo"), "MemTotal: 125522944 kB\n")
        _write(os.path.join(root, "sys/firmware/devicetree/base/compatible"), "nvidia,gb10\x00")
        _write(os.path.join(root, "sys/devices/system/node/node0/meminfo"), "Node 0 MemTotal: 1 kB\n")
        os.makedirs(os.path.join(root, "sys/class/drm"), exist_ok=True)
        return {
            "sysfs_root": os.path.join(root, "sys"),
            "proc_root": os.path.join(root, "proc"),
            "nvidia_smi": os.path.join(root, "bin/nvidia-smi"),
            "lscpu": os.path.join(root, "bin/lscpu"),
        }

    def special(self, data, root, args):
        # Absolute tool paths that are missing, directories, or not executable: evidence, never a failure.
        label = data.draw(st.sampled_from(["missing", "dir", "plain", "dangling"]), label="tool")
        target = os.path.join(root, "bin", "tool-" + label)
        if label == "dir":
            os.makedirs(target)
        elif label == "plain":
            _write(target, "not a program\n")
        elif label == "dangling":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(target + ".nowhere", target)
        option = data.draw(st.sampled_from(["nvidia_smi", "lscpu"]), label="tool option")
        args[option] = target
        return args, [option], False

    def post_check(self, args, result, root):
        if result.get("failed"):
            return "node_facts failed"
        return None


class Readahead(Target):
    name = "readahead_window"
    module = readahead_window
    numeric = ("read_ahead_kb", "duration")
    paths = ("path", "state_dir", "systemd_dir", "udev_rules_dir", "sysfs_root", "proc_root", "lib_dir")
    keep = ("python",)
    faults = {
        "sys/class/block/sda/queue/read_ahead_kb": ["sysfs_root", "read_ahead_kb", "sda"],
        "sys/class/block/sda": ["sysfs_root", "sda", "device"],
        "sys/dev/block/8:0": ["sysfs_root", "8:0", "device", "path"],
        "state/readahead-w.json": ["state_dir", "readahead-w.json"],
        "systemd/uma-readahead-restore.service": ["systemd_dir"],
        "udev/60-uma-vllm-readahead.rules": ["udev_rules_dir"],
        "proc/self/mountinfo": ["proc_root", "path"],
        "models/weights": ["path"],
    }

    def build(self, root):
        sys_root = os.path.join(root, "sys")
        base = os.path.join(sys_root, "devices/virtual/block/sda")
        _write(os.path.join(base, "dev"), "8:0\n")
        _write(os.path.join(base, "queue/read_ahead_kb"), "4096\n")
        for link in (os.path.join(sys_root, "class/block/sda"), os.path.join(sys_root, "dev/block/8:0")):
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(base, link)
        _write(os.path.join(root, "models/weights"), "w")
        _write(
            os.path.join(root, "proc/self/mountinfo"),
            "22 1 8:0 / %s rw,relatime - ext4 /dev/sda rw\n" % os.path.join(root, "models"),
        )
        self._fake = FakeSystemd()
        return {
            "name": "w",
            "device": "sda",
            "python": PYTHON,
            "lib_dir": os.path.join(root, "lib"),
            "state_dir": os.path.join(root, "state"),
            "systemd_dir": os.path.join(root, "systemd"),
            "udev_rules_dir": os.path.join(root, "udev"),
            "sysfs_root": sys_root,
            "proc_root": os.path.join(root, "proc"),
            "persist": True,
        }

    def runner(self):
        return self._fake

    def extra_patches(self):
        return [(_blockdev, "page_kb", lambda: 4)]

    def special(self, data, root, args):
        # A sysfs_root (or lib_dir / python) carrying a systemd-unit line, quotes, spaces, % or $.
        option = data.draw(st.sampled_from(["sysfs_root", "lib_dir", "state_dir", "name"]), label="unit option")
        suffix = data.draw(
            st.sampled_from(["\nExecStartPre=/bin/false", "\n" + h.INJECT, " a b", '"q"', "%h", "$HOME", "\\x", ";x"]),
            label="payload",
        )
        value = args[option] + suffix if option != "name" else "w" + suffix
        if option == "sysfs_root":
            # the same fake sysfs, reachable under the awkward name
            os.symlink(args["sysfs_root"], value) if "\n" not in suffix and "/" not in suffix else None
        args[option] = value
        return args, [option], False

    def post_check(self, args, result, root):
        unit = os.path.join(str(args.get("systemd_dir")), "uma-readahead-restore.service")
        text = h._read(unit)
        if text:
            for line in text.splitlines():
                if line.startswith(("ExecStartPre=", h.INJECT)):
                    return "injected line in unit: %r" % line
        return None


class Guard(Target):
    name = "drop_cache_loop"
    module = drop_cache_loop
    numeric = ("interval", "threshold_mib", "min_available_mib", "act_below_free_mib", "max_duration", "until_pid")
    paths = ("run_dir", "proc_root", "lib_dir", "samples_file")
    keep = ("python",)
    faults = {
        "proc/sys/vm/drop_caches": ["proc_root", "drop_caches", "mode"],
        "proc/meminfo": ["proc_root", "meminfo"],
        "run/guard-g.json": ["run_dir", "guard-g.json"],
        "run/guard-g.unit.json": ["run_dir", "guard-g.unit.json"],
        "run": ["run_dir"],
        "models/model.safetensors": ["paths", "model.safetensors"],
        "models": ["paths"],
        "lib": ["lib_dir"],
    }

    def build(self, root):
        _write(os.path.join(root, "models/model.safetensors"), b"\0" * 4096)
        _write(os.path.join(root, "proc/sys/vm/drop_caches"), "")
        _write(os.path.join(root, "proc/meminfo"), "MemTotal: 125522944 kB\nMemAvailable: 100000000 kB\n")
        os.makedirs(os.path.join(root, "proc/4242"))
        self._fake = FakeGuardSystemd()
        return {
            "name": "g",
            "mode": "files",
            "paths": [os.path.join(root, "models")],
            "python": PYTHON,
            "lib_dir": os.path.join(root, "lib"),
            "run_dir": os.path.join(root, "run"),
            "proc_root": os.path.join(root, "proc"),
            "until_pid": 4242,
        }

    def runner(self):
        return self._fake

    def extra_patches(self):
        return [(_guard_service, "_sleep", lambda s: None)]

    def special(self, data, root, args):
        option = data.draw(st.sampled_from(["samples_file", "until_url", "paths", "name"]), label="guard option")
        value = data.draw(
            st.sampled_from(
                [
                    os.path.join(root, "models"),
                    os.path.join(root, "dangling"),
                    "relative.jsonl",
                    "http://127.0.0.1:1/health\n" + h.INJECT,
                    "ftp://x",
                    "g\nx",
                    "x" * 300,
                    "",
                ]
            ),
            label="guard value",
        )
        args[option] = [value] if option == "paths" else value
        return args, [option], False

    def nonsense(self, option, value):
        if option == "until_pid" and value == "":
            return False  # documented: empty means unset
        if option == "until_pid" and value in (0, -1, -5, "0", "-0", 2**63, 2**31):
            return True
        return super().nonsense(option, value)


class Flags(Target):
    name = "vllm_flags"
    module = vllm_flags
    numeric = (
        "weights_bytes",
        "total_memory_gib",
        "reserve_gib",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "data_parallel_size_local",
        "data_parallel_rpc_port",
        "data_parallel_start_rank",
        "nnodes",
        "node_rank",
        "master_port",
        "max_model_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "block_size",
        "kv_cache_memory_bytes",
        "gpu_memory_utilization",
        "activation_reserve_gib",
    )
    paths = ("model_path",)
    faults = {
        "model/config.json": ["model_path", "config.json"],
        "model": ["model_path"],
    }
    CONFIG = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 2048,
        "torch_dtype": "bfloat16",
    }

    def build(self, root):
        _write(os.path.join(root, "model/config.json"), json.dumps(self.CONFIG))
        _write(os.path.join(root, "model/model.safetensors"), b"\0" * 64)
        self._use_path = True
        return {
            "model": "tiny",
            "model_config": dict(self.CONFIG),
            "weights_bytes": 4 * 1024**2,
            "total_memory_gib": 24,
            "reserve_gib": 2,
            "max_model_len": 512,
            "max_num_seqs": 4,
        }

    def nonsense(self, option, value):
        if option in ("data_parallel_rpc_port", "master_port") and isinstance(value, int) and not 0 < value < 65536:
            return True
        if (
            option in ("data_parallel_address", "master_addr")
            and isinstance(value, str)
            and (any(c.isspace() for c in value) or "\x00" in value or value in ("", ";", "a;b"))
        ):
            return True
        return super().nonsense(option, value)

    def special(self, data, root, args):
        kind = data.draw(st.sampled_from(["override", "model_config", "secret", "model_path"]), label="flags kind")
        if kind == "override":
            flag = data.draw(
                st.sampled_from(
                    [
                        "--max-model-len",
                        "--max_model_len",
                        "--kv-cache-memory-bytes",
                        "--kv_cache_memory_bytes",
                        "--max-num-seqs",
                        "--gpu-memory-utilization",
                        "--gpu_memory_utilization",
                        "--tensor-parallel-size",
                        "-tp",
                        "--model",
                        "--dtype",
                    ]
                ),
                label="flag",
            )
            joined = data.draw(st.booleans(), label="joined")
            args["extra_args"] = ["%s=7" % flag] if joined else [flag, "7"]
            return args, ["extra_args"], True
        if kind == "secret":
            flag = data.draw(st.sampled_from(["--api-key", "--api_key", "--hf-token"]), label="secret")
            args["extra_args"] = ["%s=CANARY" % flag]
            return args, ["extra_args"], False
        if kind == "model_path":
            args.pop("model_config")
            args["model_path"] = os.path.join(root, "model")
            damage = data.draw(st.sampled_from([*h.DAMAGE, "wrong_shape"]), label="config damage")
            cfg = os.path.join(root, "model/config.json")
            if damage == "wrong_shape":
                _write(cfg, json.dumps({"num_attention_heads": "x", "hidden_size": [1], "num_hidden_layers": None}))
            else:
                h.damage(cfg, damage)
            return args, ["model_path", "config.json", "model_config"], False
        key = data.draw(
            st.sampled_from(
                [
                    "num_attention_heads",
                    "num_key_value_heads",
                    "hidden_size",
                    "num_hidden_layers",
                    "head_dim",
                    "sliding_window",
                    "sliding_window_pattern",
                    "max_window_layers",
                    "max_position_embeddings",
                    "vocab_size",
                    "torch_dtype",
                    "layer_types",
                    "text_config",
                    "kv_lora_rank",
                    "architectures",
                ]
            ),
            label="config key",
        )
        value = data.draw(st.sampled_from([*h.GENERIC, 3, "2", 7]), label="config value")
        cfg = dict(args["model_config"])
        cfg[key] = value
        args["model_config"] = cfg
        bad = key == "num_key_value_heads" and value in (3, 7)
        return args, ["model_config", key], bad

    def post_check(self, args, result, root):
        argv = result.get("argv") or []
        for flag in ("--api-key", "--hf-token"):
            if any(str(a).startswith(flag) for a in argv):
                return "secret flag %s left in argv" % flag
        if any("CANARY" in str(a) for a in argv) or "CANARY" in json.dumps(result.get("command", "")):
            return "secret value in argv"
        return None


class Diagnose(Target):
    name = "oom_diagnose"
    module = oom_diagnose
    numeric = ("lines", "metrics_timeout", "cache_fraction", "kv_usage_high")
    paths = ("state_dir", "run_dir", "proc_root", "journal_dir", "kernel_log_file")
    keep = ("metrics_urls",)
    faults = {
        "state/launches/e1/20260101T000000Z/launch.json": [],
        "state/launches/e1/20260101T000000Z/samples.jsonl": [],
        "state/launches/e1/latest": [],
        "state/launches/e2/20260101T000000Z/launch.json": [],
        "journal/e1.log": [],
        "dmesg.txt": [],
        "proc/meminfo": [],
        "proc/sys/vm/min_free_kbytes": [],
        "run/guard-e1.json": [],
    }

    def build(self, root):
        stamp = os.path.join(root, "state/launches/e1/20260101T000000Z")
        launch = {
            "engine": "e1",
            "started_at": "2026-01-01T00:00:00+00:00",
            "failed_at": "2026-01-01T00:01:00+00:00",
            "exit_code": 137,
            "kv_alloc_t": 30.0,
        }
        _write(os.path.join(stamp, "launch.json"), json.dumps(launch))
        _write(
            os.path.join(stamp, "samples.jsonl"),
            "".join(json.dumps({"t": t, "MemAvailable": 10**9, "Cached": 2 * 10**9}) + "\n" for t in range(5)),
        )
        os.symlink("20260101T000000Z", os.path.join(root, "state/launches/e1/latest"))
        _write(
            os.path.join(root, "state/launches/e2/20260101T000000Z/launch.json"), json.dumps(dict(launch, engine="e2"))
        )
        _write(
            os.path.join(root, "journal/e1.log"),
            "2026-01-01T00:00:30+0000 n vllm[1]: INFO Available KV cache memory: 1.00 GiB\n",
        )
        _write(
            os.path.join(root, "dmesg.txt"),
            "2026-01-01T00:00:50+0000 n kernel: Out of memory: Killed process 5 (VLLM::EngineCor)\n",
        )
        _write(os.path.join(root, "proc/meminfo"), "MemTotal: 125522944 kB\nMemAvailable: 100000000 kB\n")
        _write(os.path.join(root, "proc/sys/vm/min_free_kbytes"), "67584\n")
        _write(os.path.join(root, "run/guard-e1.json"), json.dumps({"state": "stopped"}))
        return {
            "engines": ["e1"],
            "state_dir": os.path.join(root, "state"),
            "run_dir": os.path.join(root, "run"),
            "proc_root": os.path.join(root, "proc"),
            "journal_dir": os.path.join(root, "journal"),
            "kernel_log_file": os.path.join(root, "dmesg.txt"),
            "report_host": "node1",
            "kernel_commands": [["true"]],
            "journal_command": ["true"],
        }

    def special(self, data, root, args):
        kind = data.draw(st.sampled_from(["traversal", "commands", "samples", "engine"]), label="diag kind")
        if kind == "traversal":
            option = data.draw(st.sampled_from(["report_host", "timeline_name", "sysctl_keys"]), label="trav option")
            value = data.draw(
                st.sampled_from(["../../etc/x", "a/b", "x./etc/hostname", "..", "vm.min_free_kbytes/../../meminfo"]),
                label="trav value",
            )
            args[option] = [value] if option == "sysctl_keys" else value
            return args, [option], False
        if kind == "commands":
            option = data.draw(st.sampled_from(["kernel_commands", "journal_command"]), label="cmd option")
            args.pop("kernel_log_file" if option == "kernel_commands" else "journal_dir")
            value = data.draw(
                st.sampled_from([[], [[]], [[""]], [["/nonexistent/x"]], [[1, 2]], [["true", "{lines}"]]]),
                label="cmd value",
            )
            if option == "journal_command":
                value = value[0] if value and isinstance(value[0], list) else value
            args[option] = value
            return args, [option], False
        if kind == "samples":
            line = data.draw(
                st.sampled_from(
                    [
                        '{"t": 1e999}',
                        '{"t": "x"}',
                        "[1]",
                        '{"t": null, "Cached": -1}',
                        "\xff",
                        '{"t": 1, "Cached": 1e999}',
                    ]
                ),
                label="sample",
            )
            _write(os.path.join(root, "state/launches/e1/20260101T000000Z/samples.jsonl"), line + "\n")
            return args, [], False
        args["engines"] = [data.draw(st.sampled_from(["e" * 300, "e1\n", "e1 x", "../e1", "e1%", "{host}"]))]
        return args, ["engines"], False

    def post_check(self, args, result, root):
        for timeline in result.get("timelines") or []:
            name = str(timeline.get("file"))
            if "/" in name or name.startswith(".") or "\x00" in name:
                return "unsafe timeline file name %r" % name
        host = str(result.get("host"))
        if "/" in host or host.startswith("."):
            return "unsafe host %r" % host
        for section in (result.get("diagnoses") or [])[:1]:
            text = json.dumps(section)
            if "plain text" in text or "localhost" in text:
                return "foreign file content in report"
        return None


class NodeFiles(Target):
    """A node with its directories and files in place (old content): every case rewrites some."""

    name = "node_files"
    module = node_files
    paths = ("directories", "files", "secret_files", "lib_dir")
    keep = ("programs",)  # true would install 22 programs per case; test_node_files covers it
    faults = {
        "etc/engines/a.json": ["files[0].path", "a.json"],
        "etc/engines/a.env": ["secret_files[0].path", "a.env"],
        "etc/engines": ["directories[1].path", "engines"],
        "etc": ["directories[0].path", "etc"],
    }
    KEYS = ("path", "mode", "owner", "group", "content")
    MODES = ["0644", "644", "7777", "07777", "0o644", "8", "", "rw-r--r--", 420, 0o644, True, None]
    OWNERS = ["root", "0", "nobody", "1", "-1", "no-such-user", ""]

    def build(self, root):
        import grp
        import pwd

        own = {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}
        _write(os.path.join(root, "etc/engines/a.json"), '{"old": true}\n')
        _write(os.path.join(root, "etc/engines/a.env"), "TOKEN=old\n")
        etc = os.path.join(root, "etc")
        return {
            "directories": [dict(own, path=etc), dict(own, path=os.path.join(etc, "engines"), mode="0750")],
            "files": [dict(own, path=os.path.join(etc, "engines/a.json"), content='{"new": true}\n')],
            "secret_files": [dict(own, path=os.path.join(etc, "engines/a.env"), content="TOKEN=new-secret\n")],
            "programs": False,
            "lib_dir": os.path.join(root, "lib"),
        }

    def special(self, data, root, args):
        # one key of one entry made awkward (the top-level options get the generic values)
        kind = data.draw(st.sampled_from(["directories", "files", "secret_files"]), label="kind")
        index = 1 if kind == "directories" and data.draw(st.booleans(), label="second") else 0
        key = data.draw(st.sampled_from(self.KEYS[:4] if kind == "directories" else self.KEYS), label="key")
        paths = list(h.make_paths(os.path.join(root, "awkward-entry")).values())
        plain = [v for v in h.GENERIC if h.INJECT not in str(v)]  # content is written as given
        pool = {"path": [*h.GENERIC, *paths], "mode": [*self.MODES, *h.GENERIC], "owner": self.OWNERS + h.GENERIC,
                "group": self.OWNERS + h.GENERIC}.get(key, plain)  # fmt: skip
        value = data.draw(st.sampled_from(pool), label=key)
        args[kind][index][key] = value
        valid_mode = isinstance(value, str) and len(value) in (3, 4) and set(value) <= set("01234567")
        nonsense = key == "mode" and value is not None and not valid_mode
        return args, ["%s[%d].%s" % (kind, index, key), kind, key], nonsense

    def post_check(self, args, result, root):
        secret = "new-secret"
        if secret in json.dumps(result, default=str):
            return "a secret file's content is in the result"
        return None


class SystemctlShow:
    """systemctl show as systemd 252 answers it for units it does not know: rc 0, inactive."""

    def __call__(self, argv):
        units = [a for a in argv[2:] if a.startswith("uma-vllm@")]
        return 0, "\n".join("Id=%s\nActiveState=inactive\nUnitFileState=\n" % u for u in units), ""


class EngineFacts(Target):
    name = "engine_facts"
    module = engine_facts
    paths = ("systemd_dir", "config_dir", "stamps_path")
    faults = {
        "systemd": ["systemd_dir"],
        "systemd/uma-vllm@a.service.d": [],
        "etc/watchdog": ["config_dir"],
        "etc/watchdog/a.json": [],
        "state/vllm-service.json": [],
    }

    def build(self, root):
        os.makedirs(os.path.join(root, "systemd/uma-vllm@a.service.d"))
        _write(os.path.join(root, "systemd/uma-vllm@.service"), "[Unit]\n")
        _write(os.path.join(root, "etc/watchdog/a.json"), "{}\n")
        _write(os.path.join(root, "state/vllm-service.json"), json.dumps({"a": "fp"}))
        return {
            "systemd_dir": os.path.join(root, "systemd"),
            "config_dir": os.path.join(root, "etc"),
            "stamps_path": os.path.join(root, "state/vllm-service.json"),
            "engines": ["a", "b"],
        }

    def runner(self):
        return SystemctlShow()

    def special(self, data, root, args):
        # names that must never reach a unit name, and drop-ins/configs that are no engine's
        bad = data.draw(st.sampled_from(["a b", "-x", "", "../a", "a/b", "a\n", "x" * 65, "a;reboot", "@a"]))
        if data.draw(st.booleans(), label="where"):
            args["engines"] = ["a", bad]
            return args, ["engines[1]"], True
        if "/" not in bad and bad:
            os.makedirs(os.path.join(root, "systemd", "uma-vllm@%s.service.d" % bad), exist_ok=True)
            _write(os.path.join(root, "etc/watchdog", bad + ".json"), "{}")
        return args, [], False

    def post_check(self, args, result, root):
        from ansible_collections.uma.vllm.plugins.module_utils.service.engine_facts import is_engine_name

        if result.get("changed"):
            return "a read-only module reported a change"
        names = list(result.get("units") or {}) + result.get("installed", []) + result.get("watchdogs", [])
        if not all(is_engine_name(n) for n in names):
            return "not an engine name in the result: %r" % names
        if not isinstance(result.get("stamps"), dict):
            return "stamps is not a dict"
        return None


class RdmaFacts(Target):
    """rdma_facts over the DGX Spark pair node's sysfs tree (tests/unit/fixtures/rdma)."""

    name = "rdma_facts"
    module = rdma_facts
    paths = ("sysfs_root", "proc_root")
    _ib = "sys/class/infiniband/rocep1s0f1"
    # a damaged sysfs file is a note in the fact, never a refusal; sysfs_root without class/ is refused
    faults = {
        _ib + "/ports/1/state": [],
        _ib + "/ports/1/rate": [],
        _ib + "/ports/1/gids/3": [],
        _ib + "/ports/1/gid_attrs/types/3": [],
        _ib + "/ports/1/gid_attrs/ndevs/0": [],
        _ib + "/ports": [],
        _ib + "/device": [],
        "sys/class/infiniband/roceP2p1s0f1/sys_image_guid": [],
        "sys/class/infiniband": [],
        "sys/class/net/enp1s0f1np1/mtu": [],
        "sys/class": ["sysfs_root"],
        "proc/net/route": [],
    }

    def build(self, root):
        sysfs_root, proc_root = rdma_tree.build(rdma_tree.SPARK, root, rdma_tree.spark_halves)
        return {"sysfs_root": sysfs_root, "proc_root": proc_root, "cluster_addr": "192.168.177.11"}

    def special(self, data, root, args):
        value = data.draw(
            st.sampled_from(["192.168.177.11/24", "192.168.178.11", "10.9.9.9", "192.168.177.11/33", "fe80::1",
                             "192.168.177", "0.0.0.0", " 192.168.177.11 ", "192.168.177.11/\u0662"])
        )  # fmt: skip
        args["cluster_addr"] = value
        bad = value.strip() not in ("192.168.177.11/24", "192.168.178.11", "10.9.9.9", "192.168.177.11")
        return args, ["cluster_addr"] if bad else [], False

    def post_check(self, args, result, root):
        fact = (result.get("ansible_facts") or {}).get("uma_rdma")
        if result.get("changed") or not isinstance(fact, dict) or not isinstance(fact.get("summary"), str):
            return "no fact uma_rdma with a summary, or a change reported"
        cluster = fact.get("cluster")
        if cluster and cluster["found"] and not isinstance(cluster["gid_index"], int):
            return "found without a GID index"
        return None


class ModelFetch(Target):
    """model_fetch against a stand-in for the Hub (StandInHubClient over a directory under root)."""

    name = "model_fetch"
    module = model_fetch
    paths = ("dest", "token_file")
    faults = {
        "dest/.uma-model-manifest.json": ["dest", ".uma-model-manifest.json"],
        "dest/model-00001-of-00002.safetensors": ["dest", "model-00001-of-00002.safetensors"],
        "token": ["token_file"],
    }

    def build(self, root):
        StandInHubClient.repos = {
            "lab/tiny": (make_repo(os.path.join(root, "hub/tiny")), False),
            "lab/gated": (os.path.join(root, "hub/tiny"), True),
        }
        token = os.path.join(root, "token")
        _write(token, "hf_harnessToken123\n")
        os.chmod(token, 0o600)
        dest = os.path.join(root, "dest")
        request = _model_fetch.validate(
            {
                "repo_id": "lab/tiny",
                "revision": "main",
                "dest": dest,
                "endpoint": None,
                "allow_patterns": None,
                "verify": False,
                "token_file": None,
            }
        )
        client = StandInHubClient(request)
        _model_fetch.execute(_model_fetch.plan(request, client), client)
        return {"repo_id": "lab/tiny", "dest": dest, "token_file": token, "verify": True}

    def extra_patches(self):
        return [(_model_fetch, "make_client", StandInHubClient)]

    def special(self, data, root, args):
        case = data.draw(st.sampled_from(["gated", "space", "revision", "repo"]), label="hub case")
        if case == "gated":
            args.pop("token_file")
            return dict(args, repo_id="lab/gated", dest=os.path.join(root, "new")), ["token_file"], False
        if case == "space":
            _write(os.path.join(root, "hub/tiny/extra.safetensors"), b"\0" * 4096)
            free = data.draw(st.sampled_from([0, 1, 4095]), label="free")
            _model_fetch.free_bytes = lambda _path, free=free: free
            return args, ["dest"], False
        if case == "revision":
            return dict(args, revision=data.draw(st.sampled_from(["v1", "0" * 40, "dev/x"]))), ["revision"], False
        return dict(args, repo_id="lab/unknown"), ["repo_id"], False

    def post_check(self, args, result, root):
        if "hf_harnessToken123" in json.dumps(result, default=str):
            return "token in the result"
        dest = args.get("dest")
        if not (result.get("download") or {}).get("done") or not isinstance(dest, str):
            return None
        manifest = h._read(os.path.join(dest, _model_fetch.MANIFEST))
        return None if manifest is None or '"commit"' in manifest else "damaged manifest written"


class ModelCopy(Target):
    """model_copy receive against a REAL copy server (the module's own CopyServer on 127.0.0.1, started once
    for the target, serving a verified snapshot outside the case roots); serve mode only up to its validation
    (a serving run blocks for idle_s, so its cases always carry one bad value)."""

    name = "model_copy"
    module = model_copy
    paths = ("dest", "key_file")
    faults = {
        "dest/.uma-model-manifest.json": ["dest", ".uma-model-manifest.json"],
        "dest/model-00001-of-00002.safetensors": ["dest", "model-00001-of-00002.safetensors"],
        "dest/sub/tokenizer.json": ["dest", "tokenizer.json"],
        "dest/.uma-copy": ["dest", ".uma-copy"],
        "link.key": ["key_file"],
    }
    KEY = "cd" * 32
    COMMIT = "c0ffee" * 6 + "abcd"
    DATA = {
        "model-00001-of-00002.safetensors": b"\1" * 5000,
        "model-00002-of-00002.safetensors": b"\2" * 700,
        "sub/tokenizer.json": b"{}",
    }
    server = None

    def _start(self):
        import hashlib
        import threading

        from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import atomic_write_json

        # a case whose source is a closed port: a refused connection is tried again for
        # SERVER_START_S (a copy server still starting); a second is enough here (put back in finish)
        self.server_start_s = _model_copy.SERVER_START_S
        _model_copy.SERVER_START_S = 1.0
        self.base = tempfile.mkdtemp(prefix="harness-rank0-", dir=h.SCRATCH)
        snap = os.path.join(self.base, "snap")
        self.files = {}
        for name, blob in self.DATA.items():
            _write(os.path.join(snap, name), blob)
            self.files[name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        manifest = {"repo_id": "lab/tiny", "revision": "main", "commit": self.COMMIT, "endpoint": "x",
                    "files": self.files}  # fmt: skip
        atomic_write_json(os.path.join(snap, _model_fetch.MANIFEST), manifest)
        self.snap = snap
        self.server = _model_copy.CopyServer(("127.0.0.1", 0), snap, self.files, self.KEY.encode(), len)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def finish(self):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            shutil.rmtree(self.base, ignore_errors=True)
            self.server = None
            _model_copy.SERVER_START_S = self.server_start_s

    def build(self, root):
        if self.server is None:
            self._start()
        key = os.path.join(root, "link.key")
        _write(key, self.KEY + "\n")
        os.chmod(key, 0o600)
        dest = os.path.join(root, "dest")
        shutil.copytree(self.snap, dest)  # this node already holds the copy (most cases: no connection)
        return {
            "mode": "receive", "dest": dest, "repo_id": "lab/tiny", "commit": self.COMMIT, "key_file": key,
            "files": [dict(name=n, **v) for n, v in sorted(self.files.items())],
            "source": "http://127.0.0.1:%d" % self.server.server_address[1], "label": "rank 0 on harness",
            "timeout_s": 5,
        }  # fmt: skip

    def special(self, data, root, args):
        case = data.draw(
            st.sampled_from(["copy", "copy", "copy", "wrong key", "no server", "serve", "lying files"]), label="case"
        )
        os.unlink(os.path.join(args["dest"], "model-00002-of-00002.safetensors"))  # stale: a copy runs
        if case == "copy":
            return args, [], False
        if case == "wrong key":
            _write(args["key_file"], "ef" * 32 + "\n")
            return args, ["key_file"], False
        if case == "no server":
            with __import__("socket").socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            return dict(args, source="http://127.0.0.1:%d" % port), ["source"], False
        if case == "lying files":
            files = [dict(f) for f in args["files"]]
            files[1]["sha256"] = "0" * 64  # rank 0 sends other bytes than the list says
            return dict(args, files=files), ["source"], False
        bad = data.draw(st.sampled_from([("bind", "0.0.0.0"), ("port", 0), ("peers", 0), ("idle_s", 0.5),
                                         ("timeout_s", 10**9), ("commit", "f" * 40), ("bind", "a b")]))  # fmt: skip
        serve = dict(args, mode="serve", dest=self.snap if bad[0] != "commit" else args["dest"], bind="127.0.0.1",
                     port=1, peers=1, idle_s=1)  # fmt: skip
        serve.pop("files")
        serve.pop("source")
        serve[bad[0]] = bad[1]
        return serve, ["dest" if bad[0] == "commit" else bad[0]], True

    def post_check(self, args, result, root):
        if self.KEY in json.dumps(result, default=str):
            return "link key in the result"
        dest = args.get("dest")
        if args.get("mode") != "receive" or not (result.get("copy") or {}).get("done") or not isinstance(dest, str):
            return None
        for name, blob in self.DATA.items():
            if h._read(os.path.join(dest, name)) != blob.decode():
                return "%s not the copy rank 0 served" % name
        return None


REAL_FREE_BYTES = _model_fetch.free_bytes

TARGETS = [
    Sysctl(),
    NodeFacts(),
    Readahead(),
    Guard(),
    Flags(),
    Diagnose(),
    NodeFiles(),
    EngineFacts(),
    RdmaFacts(),
    ModelFetch(),
    ModelCopy(),
]


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except (OSError, TypeError, ValueError):
        return None


h._read = _read


def _bad_value(data, target: Target, option: str, spec: Dict[str, Any], paths: Dict[str, str]):
    kind = spec.get("type", "str")
    pool = list(h.GENERIC)
    if option in target.paths or kind == "path":
        pool = [v for v in pool if v is not None] + list(paths.values())
    value = data.draw(st.sampled_from(pool), label=option)
    if kind == "list" and data.draw(st.booleans(), label="wrap"):
        value = [value]
    if kind == "dict" and data.draw(st.booleans(), label="wrap"):
        value = {"k": value}
    return value


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_bad_inputs(target):
    spec = spec_of(target.module)
    mutable = sorted(o for o in spec if o not in target.keep)
    h.COUNTS.pop(target.name, None)
    h.EXAMPLES.pop(target.name, None)

    @SETTINGS
    @given(st.data())
    def case(data):
        root = tempfile.mkdtemp(prefix="harness-", dir=h.SCRATCH)
        try:
            args = target.build(root)
            paths = h.make_paths(os.path.join(root, "awkward"))
            names: List[str] = []
            nonsense = False
            mode = data.draw(st.sampled_from(["options", "options", "fault", "special"]), label="mode")
            if mode == "options":
                count = data.draw(st.integers(1, 3), label="count")
                for option in data.draw(st.permutations(mutable), label="order")[:count]:
                    value = _bad_value(data, target, option, spec[option], paths)
                    if option in target.paths and (value is None or value == []):
                        continue
                    args[option] = value
                    names.append(option)
                    nonsense = nonsense or target.nonsense(option, value)
            elif mode == "fault":
                rel = data.draw(st.sampled_from(sorted(target.faults)), label="fault file")
                how = data.draw(st.sampled_from(h.DAMAGE), label="damage")
                h.damage(os.path.join(root, rel), how)
                names = [*list(target.faults[rel]), os.path.basename(rel)]
            else:
                args, names, nonsense = target.special(data, root, args)
            check_mode = data.draw(st.booleans(), label="check_mode")
            runner = target.runner()
            # an empty `names` (a damaged optional source): any clean outcome is fine
            names = names or [""]
            with h.patched(runner, target.extra_patches()):
                outcome = h.drive(target.name, target.module, args, root, names, nonsense, check_mode)
            _model_fetch.free_bytes = REAL_FREE_BYTES
            if outcome == "refused" and names == [""]:
                pass
            if outcome == "ok":
                problem = target.post_check(args, h.LAST_RESULT.get("result", {}), root)
                if problem:
                    h.COUNTS[target.name]["ok"] -= 1
                    h.COUNTS[target.name]["nonsense"] += 1
                    h.EXAMPLES[target.name].append(
                        "nonsense: %s <- %r: %s" % (names, {n: args.get(n) for n in names}, problem)
                    )
        finally:
            shutil.rmtree(root, ignore_errors=True)

    try:
        case()
    finally:
        getattr(target, "finish", lambda: None)()
    h.report(target.name, minimum=EXAMPLES)
