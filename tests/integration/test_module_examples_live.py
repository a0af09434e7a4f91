"""Every module's EXAMPLES block runs in check mode against a real lab node (issue 21 item 7).

Each ``plugins/modules/*.py`` EXAMPLES block is parsed as YAML and becomes one play of ONE
playbook, run with ``ansible-playbook --check --diff`` against one systemd lab node container
(uma-lab/node:bookworm, the lab's way to start a node). Every example task must run without
failing (a failure names the module and the example's task name), and the node must be the same
afterwards as before: files under /etc, /usr, /var/lib, /opt, /srv, /root and the units in
/run, the live vm.* sysctls and every disk's read_ahead_kb, and the set of systemd units.

What the examples need on the node is made here, as FIXTURES (the examples are not trimmed):

- ``/models/<name>`` for each model path the examples name: the lab's tiny Llama
  (.cache/lab/models/tiny-1g, real safetensors) mounted read-only there, as the lab mounts it;
  where vllm_flags' examples plan 8192 or 65536 tokens, a tiny Llama from lab/make_model.py whose
  config says Llama 3.1's context length (131072 positions);
- a process whose command line says ``vllm serve`` (the loader whose PID drop_cache_loop's
  example looks up; a ``sleep`` renamed with ``exec -a``);
- ``/root/.hf_token`` (0600); model_fetch runs in the image's own python3 (no ``huggingface_hub``: its
  default client is built in);
- ``/srv/support/case-42``: an exported journal (``qwen.log``), a kernel log and a state dir;
- for model_copy, rank 0's verified snapshot in the examples' dest, made by running model_fetch for
  real against the Hub stand-in, and the engine's 0600 link key at the examples' ``key_file``;
- on the control node, ``files/qwen3-32b/config.json`` beside the playbook (what vllm_flags'
  example reads with the file lookup): Qwen3-32B's published shape;
- the variables the examples take from the inventory: ``VARS`` below.

STAND-INS, only for what cannot exist here (each one is an argument the test sets, listed in
``STAND_INS``): no Hugging Face Hub is reachable, so model_fetch's examples talk to
lab/hub_standin.py (run inside the node, serving the tiny model under the examples' repository
ids; the gated one needs the token) and the pinned revision is the stand-in's commit; there is
no NVMe disk, so readahead_window's ``/dev/nvme0n1`` is the machine's real ``vda``; no 128 GiB
Spark, so uma_sysctl's explicit 3 GiB reserve (above 10% of the lab's 23.5 GiB, refused there)
is 1 GiB; there is one node, not a two-node engine, so model_copy's rank 0 address is 127.0.0.1,
the receiving rank takes rank 0's ``fetched`` from this node (not ``hostvars['spark1']``) and copies
into its own directory (``COPY_RANK1_DEST``, so that it has something to copy).

model_copy's server runs with ``async``/``poll: 0`` as users run it: ansible-core 2.19 does not
refuse async in check mode; its async_wrapper starts the module in the background with the check
flag, the module returns at once (binding nothing) and its result is in the node's async job file
(``~/.ansible_async/JID``, Ansible's own bookkeeping like ``~/.ansible``). The example's own
``async_status`` task reads it, and the test reads every started job's file too: a background
failure or change fails the test.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from test_vllm_parser_oracle import IMAGE, ROOT, VENV

sys.path.insert(0, str(ROOT / "lab"))
import hub_standin

# tests/all.sh runs this file with no other test beside it: it reads every vm.* value and
# read_ahead_kb of the machine, before and after
pytestmark = pytest.mark.alone

PREFIX = os.environ.get("UMA_ITEST_PREFIX", "itest")
NODE = "%s-examples-%d" % (PREFIX, os.getpid())
MODEL = ROOT / ".cache" / "lab" / "models" / "tiny-1g"
MODEL_PATHS = ("/models/llama-3.1-70b", "/models/hub/tiny", "/models/my-model")
# vllm_flags' examples plan 8192 and 65536 tokens: the tiny Llama with Llama 3.1's context length.
LONG_MODEL_PATHS = ("/models/Meta-Llama-3-8B-Instruct", "/models/Qwen3-Next-80B-A3B-Instruct")
HUB_PORT = 8765
HUB_TOKEN = "hf_examplesStandInToken0123456789"
GATED = "meta-llama/Llama-3.1-8B-Instruct"
# What the examples take from the inventory.
VARS = {
    "uma_ram_gib": 23,
    "engine_config": {"engine": "llama", "model_path": "/models/llama-3.1-70b"},
    "hf_token": "hf_notARealToken",
    "uma_cluster_addr": "192.168.100.11",  # rdma_facts' example; the lab node has no RDMA device: not found
}
# Qwen3-32B's published config.json (the values the planner reads), for vllm_flags' file lookup.
QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
    "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "torch_dtype": "bfloat16",
}  # fmt: skip
# (module, example task name) -> arguments set over the example's: stand-ins for what cannot exist here.
STAND_INS = {
    ("uma_sysctl", "Explicit per-host reserve (3 GiB), refuse if another file would override it at boot"): {
        "min_free_kbytes": 1048576  # a Spark has 128 GiB; 3 GiB is above the 10% cap of the lab's 23.5 GiB
    },
    ("readahead_window", "Same, by device, and keep the operator's value for the next boot in a udev rule"): {
        "device": "/dev/vda"  # no NVMe here: the machine's real disk
    },
}
# model_fetch: every example talks to the Hub stand-in (endpoint) with the module's built-in client.
HUB_MODULES = {"model_fetch"}
# model_copy: rank 0's snapshot (the fixture fetches it for real), the engine's link key, the other rank's dir.
COPY_REPO = "Qwen/Qwen3-0.6B"
COPY_DEST = "/var/lib/uma-vllm/models/Qwen/Qwen3-0.6B"
COPY_KEY = "/etc/uma-vllm/engines/tp.link.key"
COPY_RANK1_DEST = "/srv/rank1/models/Qwen/Qwen3-0.6B"
COPY_RECEIVE = "Copy it on the other rank and verify it"
STAND_INS.update({
    ("model_copy", "Serve rank 0's verified snapshot to one other rank (in the background)"): {
        "bind": "127.0.0.1"  # rank 0's cluster address: the test's node has none
    },
    ("model_copy", COPY_RECEIVE): {
        "source": "http://127.0.0.1:29513",  # rank 0's address (check mode must not connect: nothing listens there)
        "commit": "{{ fetched.commit }}",  # rank 0 is this node: hostvars['spark1'] is not in this inventory
        "files": "{{ fetched.files }}",
        "dest": COPY_RANK1_DEST,  # the other rank's disk: empty, so it has everything to copy
    },
})  # fmt: skip


def _docker(*args, check=True, timeout=120):
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, timeout=timeout)


def _inventory(path):
    host = {
        "ansible_host": NODE,
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    path.write_text(yaml.safe_dump({"all": {"hosts": {"node": host}}}))
    return str(path)


def _copy_fixtures(tmp):
    """model_copy's rank 0: a real verified snapshot (model_fetch, for real, from the Hub stand-in) and the link key."""
    args = {"repo_id": COPY_REPO, "dest": COPY_DEST, "endpoint": "http://127.0.0.1:%d" % HUB_PORT}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run(
        ["ansible", "node", "-i", _inventory(tmp / "fixture-hosts.yml"), "-m", "uma.vllm.model_fetch",
         "-a", json.dumps(args)],
        check=False, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, "model_fetch could not make rank 0's snapshot:\n" + proc.stdout[-3000:]
    # the engine's link key as the vllm_service role writes it: 64 hex digits in a root-owned 0600 file
    key = "mkdir -p -m 0755 %s && umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' >%s"
    _docker("exec", NODE, "bash", "-c", key % (os.path.dirname(COPY_KEY), COPY_KEY))


def module_examples():
    """(module name, list of example tasks) for every module, from its EXAMPLES string."""
    found = []
    for path in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        text = [
            node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES"
        ]
        assert text, "%s has no EXAMPLES" % path.name
        tasks = yaml.safe_load(text[0])
        assert isinstance(tasks, list) and tasks, "%s: EXAMPLES is not a list of tasks" % path.name
        found.append((path.stem, tasks))
    return found


def test_every_module_has_examples_with_names():
    """The play below names failures by module and task: every example task has a unique name."""
    modules = module_examples()
    assert len(modules) >= 9
    for module, tasks in modules:
        names = [task.get("name") for task in tasks]
        assert all(names) and len(set(names)) == len(names), (module, names)
        assert any("uma.vllm.%s" % module in task for task in tasks), module


def test_examples_that_write_to_the_node_ask_for_become():
    """An example of a module that writes as root says ``become: true`` (users copy them as they are)."""
    writers = {"drop_cache_loop", "model_copy", "model_fetch", "node_files", "readahead_window", "uma_sysctl"}
    missing = [
        (module, task["name"])
        for module, tasks in module_examples()
        for task in tasks
        if "uma.vllm.%s" % module in task and module in writers and task.get("become") is not True
    ]
    assert not missing, missing


def _playbook(hub_commit):
    plays = []
    for module, tasks in module_examples():
        body = []
        for example in tasks:
            task = dict(example)
            name = task["name"]
            key = "uma.vllm.%s" % module
            # the example's own module, or another one it needs first (model_copy's model_fetch)
            key = next((k for k in task if k.startswith("uma.vllm.")), key)
            if key in task:
                args = dict(task[key] or {})
                args.update(STAND_INS.get((module, name), {}))
                if key.split(".")[-1] in HUB_MODULES:
                    args["endpoint"] = "http://127.0.0.1:%d" % HUB_PORT
                    if "revision" in args:
                        args["revision"] = hub_commit  # the stand-in serves main and its own commit
                task[key] = args
            task["name"] = "%s | %s" % (module, name)
            body.append(task)
        plays.append({"name": module, "hosts": "node", "gather_facts": False, "ignore_errors": True, "tasks": body})
    return plays


SNAPSHOT = r"""
import glob, os, subprocess

# Ansible's own bookkeeping (~/.ansible, async jobs in ~/.ansible_async) and the system's
skip = ("/root/.ansible", "/root/.ansible_async", "/var/lib/systemd/", "/var/log", "/var/cache", "/var/lib/apt")
out = []
for top in ("/etc", "/usr", "/var/lib", "/opt", "/srv", "/root", "/models", "/run/uma-vllm",
            "/run/systemd/transient", "/run/systemd/system", "/run/udev"):
    for base, dirs, files in os.walk(top):
        if base.startswith(skip):
            dirs[:] = []
            continue
        for name in sorted(files + dirs):
            path = os.path.join(base, name)
            if path.startswith(skip):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            out.append("%s %o %d %d" % (path, st.st_mode, st.st_size, st.st_mtime_ns))
for path in sorted(glob.glob("/proc/sys/vm/*") + glob.glob("/sys/block/*/queue/read_ahead_kb")):
    try:
        out.append("%s=%s" % (path, open(path).read().strip()))
    except OSError:
        pass
units = subprocess.run(["systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager"],
                       capture_output=True, text=True).stdout
out += sorted(" ".join(line.split()[:4]) for line in units.splitlines())
print("\n".join(out))
"""
# Change by themselves, whatever a play does: counters and the kernel's own bookkeeping.
VOLATILE = ("/proc/sys/vm/stat_refresh", "/proc/sys/vm/drop_caches", "/proc/sys/vm/compact_memory")


def _snapshot():
    out = _docker("exec", "-i", NODE, "python3", "-c", SNAPSHOT).stdout.splitlines()
    return [line for line in out if not line.startswith(VOLATILE)]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    reason = None
    if os.geteuid() != 0 or not shutil.which("docker"):
        reason = "needs root and docker"
    elif _docker("image", "inspect", IMAGE, check=False).returncode != 0:
        reason = "needs the lab image %s (tests/setup.sh builds it)" % IMAGE
    elif not (MODEL / "config.json").is_file() or not (VENV / "bin" / "python").exists():
        reason = "needs the lab's tiny model and vLLM venv (lab/up.sh, tests/setup.sh)"
    if reason:
        if os.environ.get("UMA_REQUIRE_TOOLS") == "1":
            pytest.fail("UMA_REQUIRE_TOOLS=1 but the EXAMPLES test %s" % reason)
        pytest.skip(reason)
    _docker("rm", "-f", NODE, check=False)
    long_model = tmp_path_factory.mktemp("examples") / "tiny-long"
    subprocess.run(
        [sys.executable, str(ROOT / "lab" / "make_model.py"), "--out", str(long_model)],
        check=True, stdout=subprocess.DEVNULL, timeout=300,
    )  # fmt: skip
    config = json.loads((long_model / "config.json").read_text())
    config["max_position_embeddings"] = 131072
    (long_model / "config.json").write_text(json.dumps(config))
    mounts = []
    for path in MODEL_PATHS:
        mounts += ["-v", "%s:%s:ro" % (MODEL, path)]
    for path in LONG_MODEL_PATHS:
        mounts += ["-v", "%s:%s:ro" % (long_model, path)]
    try:
        _docker(
            "run", "-d", "--name", NODE, "--hostname", "examples", "--cgroupns", "host",
            "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", "--tmpfs", "/tmp",
            "--cap-add", "SYS_ADMIN", "--security-opt", "apparmor=unconfined", "--shm-size", "1g",
            "--stop-signal", "SIGRTMIN+3", "-v", "%s:/opt/vllm:ro" % VENV, *mounts, IMAGE,
        )  # fmt: skip
        for _attempt in range(60):
            state = _docker("exec", NODE, "systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                break
            time.sleep(1)
        setup = """
set -e
umask 077
printf '%%s\\n' '%(token)s' >/root/.hf_token
mkdir -p /srv/support/case-42/journal /srv/support/case-42/uma-vllm
printf '2026-07-01T10:00:00+0000 node systemd[1]: Started uma-vllm@qwen.service.\\n' \\
  >/srv/support/case-42/journal/qwen.log
printf '2026-07-01T09:59:00+0000 node kernel: Linux version 6.1.0\\n' >/srv/support/case-42/dmesg.txt
""" % {"token": HUB_TOKEN}
        _docker("exec", NODE, "bash", "-c", setup)
        _docker("cp", str(ROOT / "lab" / "hub_standin.py"), "%s:/srv/hub_standin.py" % NODE)
        # the loader drop_cache_loop's example finds, and the Hub stand-in (both outside the snapshot)
        _docker("exec", "-d", NODE, "bash", "-c", "exec -a 'vllm serve /models/llama-3.1-70b' sleep 3600")
        _docker(
            "exec", "-d", NODE, "python3", "/srv/hub_standin.py", "--port", str(HUB_PORT),
            "--repo", "Qwen/Qwen3-0.6B=/models/hub/tiny", "--repo", "%s=/models/hub/tiny" % GATED,
            "--gated", GATED, "--token-file", "/root/.hf_token",
        )  # fmt: skip
        for _attempt in range(30):
            probe = "exec 3<>/dev/tcp/127.0.0.1/%d" % HUB_PORT
            if _docker("exec", NODE, "bash", "-c", probe, check=False).returncode == 0:
                break
            time.sleep(0.5)
        _copy_fixtures(tmp_path_factory.mktemp("fixtures"))
        yield NODE
    finally:
        _docker("rm", "-f", NODE, check=False)


def _background_failure(name, jid):
    """An async example (poll: 0) in check mode: its module ran in the background; its job file says how it went."""
    for _attempt in range(60):
        job = _docker("exec", NODE, "cat", "/root/.ansible_async/%s" % jid, check=False).stdout
        try:
            data = json.loads(job)
        except ValueError:
            data = {}  # not yet written (or being written)
        if data and not (data.get("started") and not data.get("finished")):
            break
        time.sleep(0.5)
    else:
        return ["%s: its background job %s did not finish: %r" % (name, jid, job[-500:])]
    if data.get("failed") or data.get("changed"):
        return ["%s (in the background): %s" % (name, data.get("msg", data))]
    return []


def _copy_checked(results):
    """model_copy in check mode: the server served nothing; the other rank would copy all of rank 0's files."""
    fetched = results["model_copy | Download and verify the model once, on rank 0"]
    assert fetched["changed"] is False and all(f["sha256"] for f in fetched["files"]), fetched  # the fixture's
    served = results["model_copy | Wait until rank 0's copy server has stopped"]
    assert served["finished"] and served["served"] == {}, served
    copy = results["model_copy | %s" % COPY_RECEIVE]
    assert copy["changed"] is True and copy["copy"]["done"] is False, copy
    assert sorted(copy["copy"]["files"]) == sorted(f["name"] for f in fetched["files"]), copy
    assert copy["copy"]["bytes"] == sum(f["size"] for f in fetched["files"]), copy


def test_every_example_runs_in_check_mode_and_changes_nothing(node, tmp_path):
    commit = hub_standin.Repo("x/y", str(MODEL)).commit
    (tmp_path / "files" / "qwen3-32b").mkdir(parents=True)
    (tmp_path / "files" / "qwen3-32b" / "config.json").write_text(json.dumps(QWEN3_32B))
    (tmp_path / "examples.yml").write_text(yaml.safe_dump(_playbook(commit), sort_keys=False))
    (tmp_path / "vars.json").write_text(json.dumps(VARS))
    before = _snapshot()
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run(
        ["ansible-playbook", "-i", _inventory(tmp_path / "hosts.yml"), str(tmp_path / "examples.yml"),
         "-e", "@%s" % (tmp_path / "vars.json"), "--check", "--diff"],
        check=False, cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    after = _snapshot()
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        tail = proc.stdout[-3000:] + proc.stderr[-3000:]
        pytest.fail("ansible-playbook printed no JSON report (rc %d):\n%s" % (proc.returncode, tail))
    failed, ran, results = [], set(), {}
    for play in report["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get("node", {})
            ran.add(task["task"]["name"])
            results[task["task"]["name"]] = result
            if result.get("failed") or result.get("unreachable"):
                failed.append("%s: %s" % (task["task"]["name"], result.get("msg", result)))
            elif result.get("ansible_job_id") and result.get("started") and "finished" in result:
                failed += _background_failure(task["task"]["name"], result["ansible_job_id"])
    assert not failed, "EXAMPLES that fail in check mode (module | task):\n" + "\n".join(failed)
    _copy_checked(results)
    expected = {"%s | %s" % (module, task["name"]) for module, tasks in module_examples() for task in tasks}
    assert expected <= ran, "example tasks that never ran: %s" % sorted(expected - ran)
    changed = sorted(set(before) ^ set(after))
    assert not changed, "check mode changed the node:\n" + "\n".join(changed[:60])
    # the snapshot sees a change where there is one (a file in /etc, a live vm.* value)
    _docker("exec", node, "touch", "/etc/uma-examples-probe")
    assert any("/etc/uma-examples-probe" in line for line in set(_snapshot()) - set(after))
