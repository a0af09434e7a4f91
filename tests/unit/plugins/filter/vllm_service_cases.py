# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Inputs shared by the tests of the vllm_service filters (no tests here): a native runtime's
settings, the hosts, an engine mapping and a planner result."""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.filter import vllm_service as vs

MODEL = "/models/tiny"
NATIVE = {
    "runtime": "native",
    "native_command": ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"],
    "native_model_flag": "--model",
    "api_host": "0.0.0.0",
    "ray_command": ["ray"],
    "node_addr": "10.0.0.2",
    "ifnames": {"nccl": "enp1s0f1np1", "gloo": "enp1s0f1np1", "ucx": "enp1s0f1np1"},
}
HOSTS = ["ai1", "ai2", "ai3"]
ADDRS = {"ai1": "10.0.0.1"}


def engine(**kw):
    base = {"name": "e", "port": 8000, "model_path": MODEL}
    base.update(kw)
    return base


def plan(argv_tail=(), budget=None, env=None):
    return {"argv": ["vllm", "serve", MODEL, *argv_tail], "env": env or {}, "budget": budget or {"kv_cache_bytes": 1}}


def one(hostname, **kw):
    (e,) = vs.host_engines([engine(**kw)], hostname, "mp")
    return e
