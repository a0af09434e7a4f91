"""The pure parts of the launchers' rank link (node/cluster/ranks.py): what the ranks compare, the
cluster config's checks, the rank-process scan over a proc tree; and the link itself over
real loopback sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.base.common import UmaError
from ansible_collections.uma.vllm.plugins.module_utils.node.cluster import ranks as _ranks

RANK0 = [
    "/opt/vllm/bin/python", "/opt/vllm/bin/vllm-serve-lab", "/models/tiny-1g", "--host", "0.0.0.0",
    "--port", "8100", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "0",
    "--master-addr", "172.17.0.2", "--master-port", "29501", "--gpu-memory-utilization", "0.8123",
    "--kv-cache-memory-bytes", "1048576",
]  # fmt: skip
RANK1 = [
    *RANK0[:11], "--node-rank=1", *RANK0[13:17], "--gpu-memory-utilization", "0.8012",
    "--kv-cache-memory-bytes=2097152", "--headless",
]  # fmt: skip


def config(command, env=None, rank=0, port=1, timeout=5.0, compare=True):
    return {
        "engine": "tp2",
        "command": command,
        "env": env if env is not None else {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "10.0.0.%d" % (rank + 1)},
        "cluster": {"rank": rank, "nnodes": 2, "head_addr": "127.0.0.1", "link_port": port,
                    "peer_timeout_s": timeout, "compare": compare},
    }  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- what the ranks compare


def test_per_rank_and_per_host_words_are_left_out_in_both_spellings():
    assert _ranks.strip_per_rank(RANK0) == _ranks.strip_per_rank(RANK1)
    stripped = _ranks.strip_per_rank(RANK1)
    assert "--headless" not in stripped and "--node-rank=1" not in stripped
    assert not any(w.startswith(("--gpu-memory-utilization", "--kv-cache-memory-bytes")) for w in stripped)
    assert stripped[-4:] == ["--master-addr", "172.17.0.2", "--master-port", "29501"]


def test_ranks_of_one_engine_share_a_fingerprint_and_host_env_does_not_count():
    a, _shared = _ranks.fingerprint(config(RANK0, rank=0))
    b, _shared = _ranks.fingerprint(config(RANK1, rank=1))
    assert a == b and len(a) == 16


@pytest.mark.parametrize(
    "change, expect",
    [
        (lambda c: c["command"].__setitem__(8, "4"), "argv: here ['4']"),
        (lambda c: c["env"].__setitem__("VLLM_CPU_KVCACHE_SPACE", "2"), "env VLLM_CPU_KVCACHE_SPACE: here '2'"),
        (lambda c: c["env"].__setitem__("TORCHDYNAMO_DISABLE", "1"), "env TORCHDYNAMO_DISABLE: here '1', there None"),
        (lambda c: c.__setitem__("engine", "other"), "engine 'other' vs 'tp2'"),
    ],
)
def test_a_different_configuration_changes_the_fingerprint_and_says_what_differs(change, expect):
    mine = config(list(RANK1), rank=1)
    change(mine)
    a, shared_a = _ranks.fingerprint(mine)
    b, shared_b = _ranks.fingerprint(config(RANK0))
    assert a != b
    assert any(expect in d for d in _ranks.differences(shared_a, shared_b)), _ranks.differences(shared_a, shared_b)


@pytest.mark.parametrize(
    "cluster, option",
    [
        ("x", "cluster"),
        ({"nnodes": 1, "rank": 0, "link_port": 1, "head_addr": "a"}, "cluster.nnodes"),
        ({"nnodes": True, "rank": 0, "link_port": 1, "head_addr": "a"}, "cluster.nnodes"),
        ({"nnodes": 2, "rank": 2, "link_port": 1, "head_addr": "a"}, "cluster.rank"),
        ({"nnodes": 2, "rank": -1, "link_port": 1, "head_addr": "a"}, "cluster.rank"),
        ({"nnodes": 2, "rank": 0, "link_port": 70000, "head_addr": "a"}, "cluster.link_port"),
        ({"nnodes": 2, "rank": 0, "link_port": "29511", "head_addr": "a"}, "cluster.link_port"),
        ({"nnodes": 2, "rank": 0, "link_port": 1, "head_addr": "a b"}, "cluster.head_addr"),
        ({"nnodes": 2, "rank": 0, "link_port": 1, "head_addr": None}, "cluster.head_addr"),
        ({"nnodes": 2, "rank": 0, "link_port": 1, "head_addr": "a", "peer_timeout_s": 0}, "cluster.peer_timeout_s"),
        ({"nnodes": 2, "rank": 0, "link_port": 1, "head_addr": "a", "peer_timeout_s": float("nan")},
         "cluster.peer_timeout_s"),
    ],
)  # fmt: skip
def test_bad_cluster_configs_are_refused_naming_the_key(cluster, option):
    with pytest.raises(UmaError) as err:
        _ranks.validate_cluster(cluster)
    assert err.value.option == option and err.value.message.startswith("option '%s' = " % option)


def test_a_single_node_engine_has_no_cluster():
    assert _ranks.validate_cluster(None) is None
    ok = _ranks.validate_cluster({"nnodes": 2, "rank": 1, "link_port": 29511, "head_addr": "10.0.0.1"})
    assert ok["peer_timeout_s"] == 600.0 and ok["compare"] is True


@pytest.mark.parametrize("value", ["false", "no", 0, 1, None, [], "true"])
def test_compare_must_be_a_boolean(value):
    """Regression: bool() took the string "false" (and 1, "no") as true - the ranks compared after all."""
    cluster = {"nnodes": 2, "rank": 1, "link_port": 29511, "head_addr": "10.0.0.1", "compare": value}
    with pytest.raises(UmaError) as err:
        _ranks.validate_cluster(cluster)
    assert err.value.option == "cluster.compare" and "is not a boolean" in err.value.message
    assert "Give true or false" in err.value.message


@pytest.mark.parametrize("value", [True, False])
def test_compare_keeps_a_boolean(value):
    cluster = {"nnodes": 2, "rank": 1, "link_port": 29511, "head_addr": "10.0.0.1", "compare": value}
    assert _ranks.validate_cluster(cluster)["compare"] is value


# ---------------------------------------------------------------- rank processes


def write_stat(root, pid, comm, ppid, state="S"):
    os.makedirs(os.path.join(root, str(pid)), exist_ok=True)
    with open(os.path.join(root, str(pid), "stat"), "w") as handle:
        handle.write("%d (%s) %s %d 1 1 0 -1\n" % (pid, comm, state, ppid))


def test_vllm_processes_below_the_engine_only(tmp_path):
    root = str(tmp_path)
    write_stat(root, 10, "python", 1)  # the engine
    write_stat(root, 11, "python", 10)  # resource tracker: not a rank process
    write_stat(root, 12, "VLLM::EngineCor", 10)
    write_stat(root, 13, "VLLM::Worker_TP", 12)
    write_stat(root, 20, "VLLM::Worker_TP", 1)  # another engine's
    write_stat(root, 21, "x) S 10 (evil", 10)  # a name with parentheses and spaces
    assert _ranks.vllm_processes(10, root) == {12: "VLLM::EngineCor", 13: "VLLM::Worker_TP"}
    watched = _ranks.vllm_processes(10, root)
    assert _ranks.gone(watched, root) == []
    write_stat(root, 13, "VLLM::Worker_TP", 12, state="Z")
    assert _ranks.gone(watched, root) == [(13, "VLLM::Worker_TP")]
    os.remove(os.path.join(root, "12", "stat"))
    os.rmdir(os.path.join(root, "12"))
    assert _ranks.gone(watched, root) == [(12, "VLLM::EngineCor"), (13, "VLLM::Worker_TP")]


def test_vllm_processes_of_a_missing_proc_root_is_empty(tmp_path):
    assert _ranks.vllm_processes(1, str(tmp_path / "nowhere")) == {}


class Inspect:
    """Stands in for the docker/podman client's ``inspect`` (no container engine in unit tests)."""

    def __init__(self, out="4242\n", rc=0, raises=None):
        self.out, self.rc, self.raises, self.calls = out, rc, raises, []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        if self.raises is not None:
            raise self.raises
        return subprocess.CompletedProcess(argv, self.rc, self.out, "")


DOCKER_RUN = ["/usr/bin/docker", "run", "--rm", "--name", "vllm-tp2", "--network", "host", "img:1", "vllm", "serve"]


@pytest.mark.parametrize(
    "argv, name",
    [
        (DOCKER_RUN, "vllm-tp2"),
        (["podman", "run", "--name=vllm-x", "img", "vllm", "serve"], "vllm-x"),
    ],
)
def test_container_root_pid_asks_the_runtime_for_the_containers_init(argv, name):
    inspect = Inspect()
    assert _ranks.container_root_pid(argv, inspect) == 4242
    assert inspect.calls == [[argv[0], "inspect", "-f", "{{.State.Pid}}", name]]


@pytest.mark.parametrize(
    "argv",
    [
        None,
        [],
        ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--name", "x"],  # native
        ["/usr/bin/docker", "start", "--name", "x"],  # not `run`
        ["/usr/bin/docker", "run", "--rm", "img"],  # no name to ask for
        ["/usr/bin/docker", "run", "--name"],  # a name flag without a value
    ],
)
def test_container_root_pid_of_other_commands_is_none(argv):
    inspect = Inspect()
    assert _ranks.container_root_pid(argv, inspect) is None
    assert inspect.calls == []


@pytest.mark.parametrize(
    "inspect",
    [
        Inspect(out="", rc=1),  # no such container
        Inspect(out="0\n"),  # docker says 0 for a stopped container
        Inspect(out="<no value>\n"),
        Inspect(raises=OSError(2, "No such file or directory")),
        Inspect(raises=subprocess.TimeoutExpired(["docker"], 15)),
    ],
)
def test_container_root_pid_is_none_when_the_runtime_does_not_say(inspect):
    assert _ranks.container_root_pid(DOCKER_RUN, inspect) is None


def test_vllm_processes_of_a_container_are_below_its_init_not_the_client(tmp_path):
    """Regression (issue 19): the launcher's child is the docker client; the rank's VLLM::
    processes descend from the container runtime (containerd-shim -> the container's init)."""
    root = str(tmp_path)
    write_stat(root, 10, "docker", 1)  # the launcher's engine process: the client
    write_stat(root, 40, "containerd-shim", 1)
    write_stat(root, 50, "python", 40)  # the container's init: vllm serve
    write_stat(root, 51, "VLLM::EngineCor", 50)
    write_stat(root, 52, "VLLM::Worker_TP", 51)
    assert _ranks.vllm_processes(10, root) == {}  # the client has no VLLM:: children
    inspect = Inspect(out="50\n")
    watched = _ranks.vllm_processes(10, root, DOCKER_RUN, inspect)
    assert watched == {51: "VLLM::EngineCor", 52: "VLLM::Worker_TP"}
    os.remove(os.path.join(root, "52", "stat"))
    os.rmdir(os.path.join(root, "52"))
    assert _ranks.gone(watched, root) == [(52, "VLLM::Worker_TP")]
    # the runtime does not answer: the client's own tree, as before
    assert _ranks.vllm_processes(10, root, DOCKER_RUN, Inspect(rc=1, out="")) == {}


# ---------------------------------------------------------------- the link over loopback


def run_pair(cfg0, cfg1, first=1, delay=0.3):
    """Rendezvous of rank 0 and rank 1 in threads; returns {rank: link or exception}."""
    out = {}

    def go(cfg):
        link = _ranks.RankLink(cfg, lambda _line: None)
        try:
            link.rendezvous(lambda: False)
            out[cfg["cluster"]["rank"]] = link
        except Exception as err:
            out[cfg["cluster"]["rank"]] = err

    order = [cfg1, cfg0] if first == 1 else [cfg0, cfg1]
    threads = [threading.Thread(target=go, args=(c,)) for c in order]
    threads[0].start()
    time.sleep(delay)
    threads[1].start()
    for t in threads:
        t.join(30)
    return out


@pytest.mark.parametrize("first", [0, 1])
def test_ranks_meet_in_either_order_then_a_deliberate_stop_reaches_the_peer(first):
    port = free_port()
    out = run_pair(config(RANK0, port=port), config(RANK1, rank=1, port=port), first=first)
    link0, link1 = out[0], out[1]
    assert isinstance(link0, _ranks.RankLink) and isinstance(link1, _ranks.RankLink), out
    assert link0.lost is None and link1.lost is None
    link0.notify("rank 0: signal 15", deliberate=True)
    deadline = time.monotonic() + 5
    while link1.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert link1.lost == ("rank 0 stopped: rank 0: signal 15", True)
    link1.notify("done", True)


def test_a_failure_is_not_deliberate_and_a_silent_close_is_a_lost_peer():
    port = free_port()
    out = run_pair(config(RANK0, port=port), config(RANK1, rank=1, port=port))
    out[1].notify("rank 1: its engine exited with -9", deliberate=False)
    deadline = time.monotonic() + 5
    while out[0].lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out[0].lost == ("rank 1 stopped: rank 1: its engine exited with -9", False)

    port = free_port()
    out = run_pair(config(RANK0, port=port), config(RANK1, rank=1, port=port))
    for conn in out[0].conns:  # rank 0 vanishes without a word
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
    deadline = time.monotonic() + 5
    while out[1].lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out[1].lost is not None and out[1].lost[1] is False, out[1].lost


def test_different_configurations_are_refused_on_both_ranks():
    port = free_port()
    other = list(RANK1)
    other[other.index("--tensor-parallel-size") + 1] = "4"
    out = run_pair(config(RANK0, port=port), config(other, rank=1, port=port))
    for rank in (0, 1):
        assert isinstance(out[rank], _ranks.PeerRefused), out
        assert "rank 1 runs another configuration than rank 0" in str(out[rank])
        assert "'4'" in str(out[rank])


def test_compare_false_lets_a_ray_worker_join_with_another_argv():
    port = free_port()
    out = run_pair(
        config(RANK0, port=port, compare=False), config(["ray", "start", "--block"], rank=1, port=port, compare=False)
    )
    assert all(isinstance(link, _ranks.RankLink) for link in out.values()), out


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_alone_gives_up_at_its_deadline(rank):
    port = free_port()
    link = _ranks.RankLink(config(RANK0 if rank == 0 else RANK1, rank=rank, port=port, timeout=1.5), lambda _l: None)
    started = time.monotonic()
    with pytest.raises(_ranks.PeerTimeout) as err:
        link.rendezvous(lambda: False)
    assert 1.4 <= time.monotonic() - started < 5
    assert ("0 of 1 other ranks arrived" if rank == 0 else "did not answer within") in str(err.value)


def test_a_stop_request_ends_the_wait_at_once():
    link = _ranks.RankLink(config(RANK0, port=free_port(), timeout=60), lambda _l: None)
    started = time.monotonic()
    with pytest.raises(_ranks.PeerTimeout, match="stopped while waiting"):
        link.rendezvous(lambda: time.monotonic() - started > 0.5)
    assert time.monotonic() - started < 3
