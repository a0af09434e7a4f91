# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher's admission on a discrete GPU (admission_memory gpu, node/launch/admission.py admit_gpu).

No GPU exists on this machine or in CI: every test puts a FAKE ``nvidia-smi`` (a shell script
in tmp_path) first on PATH. It prints the file ``rows`` (the CSV that
``nvidia-smi --query-gpu=index,uuid,memory.free,memory.total --format=csv,noheader,nounits``
prints, MiB), which a test rewrites to change what the GPUs have free, and exits with the
number in ``rc`` (0 when absent).
"""

from __future__ import annotations

import io
import os

import node_helpers
import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base import plan as _contract
from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import admission as _admission
from ansible_collections.uma.vllm.plugins.module_utils.node.launch import program as uma_launch

GIB = 1 << 30
MIB = 1 << 20
CONTEXT = _contract.CUDA_CONTEXT_BYTES
UUID0 = "GPU-0a6f4e2c-1111-2222-3333-444455556666"
UUID1 = "GPU-9b7c5d3e-aaaa-bbbb-cccc-ddddeeeeffff"
TOTAL_MIB = 143771  # an H200: 140.4 GiB
# the plan of a discrete GPU: ceil(total x gmu) of one GPU, per rank
PLAN = {"requested_memory_bytes": 100 * GIB, "ranks_per_node": 1, "unified_memory": False}
FAKE_SMI = """#!/bin/sh
# a FAKE nvidia-smi for the unit tests (no GPU here): prints the rows the test wrote, exits with rc
echo "$@" > "{d}/args"
[ -f "{d}/sleep" ] && exec sleep "$(cat "{d}/sleep")"
cat "{d}/rows"
exit "$(cat "{d}/rc" 2>/dev/null || echo 0)"
"""


def rows(*free_mib, total=TOTAL_MIB):
    return "".join("%d, %s, %d, %d\n" % (i, (UUID0, UUID1)[i], f, total) for i, f in enumerate(free_mib))


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """The fake nvidia-smi's directory, first on PATH; the test writes ``rows`` (and ``rc``, ``sleep``)."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    script = fake / "nvidia-smi"
    script.write_text(FAKE_SMI.format(d=fake))
    script.chmod(0o755)
    (fake / "rows").write_text(rows(120 * 1024))
    monkeypatch.setenv("PATH", "%s%s%s" % (fake, os.pathsep, os.environ.get("PATH", "")))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return fake


def make(tmp_path, plan=None, available=8 * GIB, **extra):
    """A launch of engine e1 whose host MemAvailable (``available``) is far below any GPU request."""
    plan = PLAN if plan is None else plan
    meminfo = "MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n" % (126 * GIB // 1024, 1024, available // 1024)
    extra.setdefault("admission_wait_s", 0)
    config = node_helpers.launch_config(tmp_path, meminfo, plan=plan, **extra)
    return uma_launch.Launch(config, uma_launch.Log("e1", out=io.StringIO()))


def test_eager_module_loading_in_the_engines_env_needs_the_eager_context():
    # the engine's env says CUDA_MODULE_LOADING=EAGER: its context is ~1.23 GiB (H200, H100), whatever the plan
    eager = {"CUDA_MODULE_LOADING": "EAGER"}
    cases = [
        ({}, PLAN, CONTEXT, "(default)"),
        (eager, PLAN, _contract.CUDA_CONTEXT_EAGER_BYTES, "env CUDA_MODULE_LOADING=EAGER; the plan kept less"),
        (eager, dict(PLAN, cuda_context_bytes=CONTEXT), _contract.CUDA_CONTEXT_EAGER_BYTES, "the plan kept less"),
        (eager, dict(PLAN, cuda_context_bytes=2 * GIB), 2 * GIB, "(plan cuda_context_bytes)"),
        ({"CUDA_MODULE_LOADING": "LAZY"}, dict(PLAN, cuda_context_bytes=CONTEXT), CONTEXT, "(plan cuda_context_bytes)"),
        ({"CUDA_MODULE_LOADING": "eager"}, PLAN, _contract.CUDA_CONTEXT_EAGER_BYTES, "EAGER"),
    ]
    for env, plan, context, said in cases:
        need, source = _admission.gpu_need({"plan": plan, "env": env})
        assert need == 100 * GIB + context and said in source, (env, plan, source)
    # a given whole need is taken as given
    assert _admission.gpu_need({"plan": PLAN, "env": eager, "admission_request_bytes": GIB})[0] == GIB


def test_eager_engine_refused_where_the_lazy_context_would_fit(tmp_path, smi):
    # 101 GiB free: request 100 + 0.75 fits, + 1.5 does not (the H100's edge-new-eager, docs/BENCHMARKS.md)
    (smi / "rows").write_text(rows(101 * 1024))
    (tmp_path / "lazy").mkdir()
    (tmp_path / "eager").mkdir()
    assert make(tmp_path / "lazy").admit(sleep=no_wait)
    launch = make(tmp_path / "eager", env={"CUDA_MODULE_LOADING": "EAGER"})
    assert not launch.admit(sleep=lambda _s: None)
    adm = launch.record["admission"]
    assert adm["admitted"] is False and adm["need_bytes"] == 100 * GIB + _contract.CUDA_CONTEXT_EAGER_BYTES
    assert "CUDA_MODULE_LOADING=EAGER" in adm["reason"]


def no_wait(_seconds):
    pytest.fail("no wait expected")


def test_admitted_on_the_gpus_free_memory_not_memavailable(tmp_path, smi):
    launch = make(tmp_path)  # MemAvailable 8 GiB: host admission would refuse
    assert launch.admit(sleep=no_wait)
    adm = launch.record["admission"]
    assert adm["memory"] == "gpu" and adm["admitted"] is True and adm["short_bytes"] == 0
    assert adm["need_bytes"] == 100 * GIB + CONTEXT and "CUDA context 0.75 GiB (default)" in adm["need_source"]
    assert adm["gpus"] == [{"index": 0, "uuid": UUID0, "free_bytes": 120 * GIB, "total_bytes": TOTAL_MIB * MIB}]
    assert adm["evicted_bytes"] == 0 and "mem_available_bytes" not in adm
    step = launch.log.steps[-1]
    assert step["name"] == "admission" and step["memory"] == "gpu" and step["gpu_free"] == {"0": 120 * GIB}
    assert (smi / "args").read_text().split() == list(_admission.NVIDIA_SMI[1:])


def test_the_plans_cuda_context_counts(tmp_path, smi):
    (smi / "rows").write_text(rows(int(100.9 * 1024)))  # 100.9 GiB free: enough for 100 + 0.75, not 100 + 1
    assert make(tmp_path).admit(sleep=no_wait)
    launch = make(tmp_path, dict(PLAN, cuda_context_bytes=GIB))
    assert not launch.admit(sleep=lambda s: None)
    assert launch.record["admission"]["need_bytes"] == 101 * GIB
    assert "(plan cuda_context_bytes)" in launch.record["admission"]["need_source"]


def test_refused_naming_the_gpu_exit_75(tmp_path, smi):
    (smi / "rows").write_text(rows(60 * 1024))  # another process holds the card
    launch = make(tmp_path, admission_wait_s=0.2)
    launch.config["guard"] = False
    assert launch.run() == uma_launch.EXIT_ADMISSION == 75
    assert launch.engine is None and launch.record["exit_code"] == 75 and not launch.lock.held
    adm = launch.record["admission"]
    assert adm["memory"] == "gpu" and adm["admitted"] is False and adm["short_gpu"] == 0
    assert adm["short_bytes"] == 100 * GIB + CONTEXT - 60 * GIB
    assert "GPU 0 (%s) has 61440 MiB (60.00 GiB) free of %d MiB (140.40 GiB)" % (UUID0, TOTAL_MIB) in adm["reason"]
    assert "below the 100.75 GiB this engine's start needs on it" in adm["reason"]
    assert "stop the other process on GPU 0 (see nvidia-smi)" in adm["reason"]
    assert "gpu_memory_utilization or kv_cache_memory_bytes" in adm["reason"]
    refused = [s for s in launch.log.steps if s["name"] == "admission-refused"]
    assert refused and refused[0]["memory"] == "gpu" and refused[0]["reason"] == adm["reason"]


def test_waits_for_another_process_to_free_the_gpu_without_evicting(tmp_path, smi, monkeypatch):
    (smi / "rows").write_text(rows(60 * 1024))
    for home in (_admission, uma_launch):
        monkeypatch.setattr(home, "evict_files", lambda paths: pytest.fail("no page-cache eviction in gpu mode"))
    launch = make(tmp_path, admission_wait_s=30)
    calls = []

    def sleep(seconds):
        calls.append(seconds)
        if len(calls) == 2:  # the other process on the card exits
            (smi / "rows").write_text(rows(110 * 1024))

    assert launch.admit(sleep=sleep)
    assert len(calls) == 2
    adm = launch.record["admission"]
    assert adm["admitted"] and adm["gpus"][0]["free_bytes"] == 110 * GIB and adm["evicted_bytes"] == 0


@pytest.mark.parametrize("visible", ["1", UUID1, UUID1[:12], " 1 , 0"])
def test_cuda_visible_devices_picks_the_engines_gpu(tmp_path, smi, monkeypatch, visible):
    (smi / "rows").write_text(rows(10 * 1024, 120 * 1024))  # GPU 0 busy, GPU 1 free
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    launch = make(tmp_path)
    assert launch.admit(sleep=no_wait)
    assert [g["index"] for g in launch.record["admission"]["gpus"]] == [1]


def test_cuda_visible_devices_of_the_engines_env_wins(tmp_path, smi, monkeypatch):
    (smi / "rows").write_text(rows(120 * 1024, 10 * 1024))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    launch = make(tmp_path, env={"CUDA_VISIBLE_DEVICES": UUID1})
    assert not launch.admit(sleep=lambda s: None)
    assert launch.record["admission"]["short_gpu"] == 1 and "GPU 1 (%s)" % UUID1 in launch.record["admission"]["reason"]


def test_without_cuda_visible_devices_the_first_gpu_by_index(tmp_path, smi):
    (smi / "rows").write_text("1, %s, 10240, %d\n0, %s, 122880, %d\n" % (UUID1, TOTAL_MIB, UUID0, TOTAL_MIB))
    launch = make(tmp_path)
    assert launch.admit(sleep=no_wait)
    assert [g["uuid"] for g in launch.record["admission"]["gpus"]] == [UUID0]


def test_gpus_per_node_two_needs_both(tmp_path, smi):
    plan = dict(PLAN, gpus_per_node=2, ranks_per_node=2)
    (smi / "rows").write_text(rows(120 * 1024, 120 * 1024))
    launch = make(tmp_path, plan)
    assert launch.admit(sleep=no_wait)
    adm = launch.record["admission"]
    assert [g["index"] for g in adm["gpus"]] == [0, 1] and adm["need_bytes"] == 100 * GIB + CONTEXT  # per GPU
    (smi / "rows").write_text(rows(120 * 1024, 50 * 1024))
    launch = make(tmp_path, plan)
    assert not launch.admit(sleep=lambda s: None)
    assert launch.record["admission"]["short_gpu"] == 1 and "GPU 1 (" in launch.record["admission"]["reason"]
    (smi / "rows").write_text(rows(120 * 1024))  # one GPU where the plan wants two: vLLM's own error, not ours
    launch = make(tmp_path, plan)
    assert launch.admit(sleep=no_wait)
    assert launch.log.steps[-1]["checked"] is False and "gpus_per_node 2 but 1 GPU(s)" in launch.log.steps[-1]["reason"]


def unchecked(launch, *words):
    step = launch.log.steps[-1]
    assert step["name"] == "admission" and step["checked"] is False and step["memory"] == "gpu", step
    assert all(w in step["reason"] for w in words), step["reason"]
    assert "the GPU's free memory is not checked" in step["reason"]
    adm = launch.record["admission"]
    assert adm["checked"] is False and adm["admitted"] is None and adm["reason"] == step["reason"]


@pytest.mark.parametrize(
    "fault, words",
    [
        ("missing", ["nvidia-smi not found"]),
        ("exit1", ["nvidia-smi exited with 1", "NVIDIA-SMI has failed"]),
        ("garbage", ["nvidia-smi printed", "not index, uuid, free and total MiB"]),
        ("not_supported", ["nvidia-smi printed", "[N/A]"]),
        ("empty", ["nvidia-smi listed no GPU"]),
        ("timeout", ["nvidia-smi did not answer within 0.3 s"]),
        ("unknown_gpu", ["CUDA_VISIBLE_DEVICES=GPU-nope names GPU 'GPU-nope', which nvidia-smi does not list"]),
        ("unknown_index", ["CUDA_VISIBLE_DEVICES=0,7 names GPU '7'"]),
    ],
)
def test_unreadable_gpus_start_unchecked_never_refused(tmp_path, smi, monkeypatch, fault, words):
    if fault == "missing":
        (tmp_path / "empty-bin").mkdir()
        monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    elif fault == "exit1":
        (smi / "rows").write_text("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
        (smi / "rc").write_text("1")
    elif fault == "garbage":
        (smi / "rows").write_text("<html>nope</html>\n")
    elif fault == "not_supported":
        (smi / "rows").write_text("0, %s, [N/A], [N/A]\n" % UUID0)
    elif fault == "empty":
        (smi / "rows").write_text("\n")
    elif fault == "timeout":
        monkeypatch.setattr(_admission, "NVIDIA_SMI_TIMEOUT_S", 0.3)
        (smi / "sleep").write_text("5")
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-nope" if fault == "unknown_gpu" else "0,7")
    launch = make(tmp_path)
    assert launch.admit(sleep=no_wait)
    unchecked(launch, *words)


def test_unchecked_gpu_still_starts_the_engine(tmp_path, smi, monkeypatch):
    (tmp_path / "empty-bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin") + os.pathsep + "/usr/bin" + os.pathsep + "/bin")
    launch = make(tmp_path, health_timeout_s=0.5)
    launch.config["guard"] = False
    launch.run()  # the engine (true) exits before it is healthy: a launch failure, not an admission refusal
    assert launch.record["exit_code"] != uma_launch.EXIT_ADMISSION
    assert [s for s in launch.log.steps if s["name"] == "engine-started"]
    assert launch.record["admission"]["checked"] is False


@pytest.mark.parametrize(
    "plan, memory, expected",
    [
        (dict(PLAN, unified_memory=True), "auto", "host"),
        ({"requested_memory_bytes": 100 * GIB, "ranks_per_node": 1}, "auto", "host"),
        (PLAN, "auto", "gpu"),
        (PLAN, "host", "host"),
        (dict(PLAN, unified_memory=True), "gpu", "gpu"),
    ],
)
def test_auto_follows_the_plans_unified_memory(tmp_path, smi, plan, memory, expected):
    launch = make(tmp_path, plan, admission_memory=memory)
    admitted = launch.admit(sleep=lambda s: None)
    adm = launch.record["admission"]
    assert adm["memory"] == expected
    if expected == "host":  # unchanged: MemAvailable 8 GiB against the 100 GiB request
        assert not admitted and adm["mem_available_bytes"] == 8 * GIB and "MemAvailable" in adm["reason"]
        assert "memory" not in launch.log.steps[-1]
    else:
        assert admitted and adm["gpus"][0]["free_bytes"] == 120 * GIB


def test_host_mode_on_a_unified_node_never_runs_nvidia_smi(tmp_path, smi):
    launch = make(tmp_path, dict(PLAN, unified_memory=True), available=120 * GIB)
    assert launch.admit(sleep=no_wait)
    assert launch.record["admission"]["memory"] == "host" and not (smi / "args").exists()


def test_explicit_request_is_what_each_gpu_must_have_free(tmp_path, smi):
    launch = make(tmp_path, admission_request_bytes=110 * GIB)
    assert launch.admit(sleep=no_wait)
    assert launch.record["admission"]["need_bytes"] == 110 * GIB  # no context added: the whole need, as given
    assert launch.record["admission"]["need_source"] == "admission_request_bytes (per GPU)"
    assert not make(tmp_path, admission_request_bytes=121 * GIB).admit(sleep=lambda s: None)


def test_off_or_without_a_request_is_not_checked(tmp_path, smi):
    launch = make(tmp_path, admission=False)
    assert launch.admit(sleep=no_wait) and launch.log.steps[-1]["reason"] == "off"
    launch = make(tmp_path, {"unified_memory": False})
    assert launch.admit(sleep=no_wait) and launch.log.steps[-1]["reason"] == "no startup request in the plan"
    assert not (smi / "args").exists()


@pytest.mark.parametrize("value", ["GPU", "both", "", 1, True, ["gpu"]])
def test_bad_admission_memory_is_refused_naming_option_value_and_fix(tmp_path, value):
    with pytest.raises(UmaError) as err:
        make(tmp_path, admission_memory=value)
    message = err.value.message
    assert "option 'admission_memory'" in message and "is not auto, host or gpu" in message
    assert "Use auto (gpu where the plan says unified_memory false, else host)" in message


def test_the_command_line_sets_admission_memory(tmp_path):
    (tmp_path / "model").mkdir()
    argv = ["--engine", "e1", "--node-config", str(tmp_path / "none.json"), "--health-url", "http://127.0.0.1:1/h",
            "--state-dir", str(tmp_path / "state"), "--lock-path", str(tmp_path / "lock"),
            "--admission-memory"]  # fmt: skip
    assert uma_launch.load_config([*argv, "gpu", "--", "true"])["admission_memory"] == "gpu"
    assert uma_launch.load_config([*argv[:-1], "--", "true"])["admission_memory"] == "auto"
    with pytest.raises(UmaError) as err:
        uma_launch.load_config([*argv, "cuda", "--", "true"])
    assert "option 'admission_memory'" in err.value.message and "(set in the command line)" in err.value.message
