"""The two-node engine tp2 in containers (molecule/cluster_container) after converge and the
faults of side_effect.yml: on each node the rank's unit runs, its one engine container runs the
lab engine image under the node's own Docker, the rank's vLLM processes live in that container,
and rank 0 answers a completion."""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests" / "integration"))
from _shm_left import latest_tracked, shm_files

IMAGE = "uma-lab/vllm-cpu:0.32.0"
CONTAINER = "uma-vllm-tp2"
API_KEY = "uma-lab-key-not-secret"


def _rank(host):
    return json.loads(host.file("/etc/uma-vllm/engines/tp2.json").content_string)["cluster"]["rank"]


def test_the_rank_runs_under_systemd(host):
    assert host.service("uma-vllm@tp2.service").is_running
    assert host.service("docker.service").is_running


def test_one_engine_container_from_the_lab_image(host):
    rows = host.check_output("docker ps -a --format '{{.Names}} {{.Image}} {{.State}}'").splitlines()
    assert rows == ["%s %s running" % (CONTAINER, IMAGE)]


def test_the_vllm_processes_are_in_the_container(host):
    # the container's main process and its descendants are the rank's vLLM processes
    main = host.check_output("docker inspect -f '{{.State.Pid}}' %s" % CONTAINER)
    # anchored: the shell that runs pgrep has the pattern in its own command line
    pids = host.check_output("pgrep -f '^(VLLM::|/opt/vllm/bin/python /opt/vllm/bin/vllm-serve-lab)'").split()
    assert pids, "no vLLM process on the node"
    for pid in pids:
        cgroup = host.file("/proc/%s/cgroup" % pid).content_string
        assert cgroup == host.file("/proc/%s/cgroup" % main).content_string, pid


def test_rank_0_answers_a_completion_rank_1_is_headless(host):
    body = json.dumps({"model": "/models/tiny-1g", "prompt": "The two nodes", "max_tokens": 4})
    answer = host.run(
        "curl -sf -m 60 -H 'Content-Type: application/json' -H 'Authorization: Bearer %s' -d '%s' "
        "http://127.0.0.1:8100/v1/completions" % (API_KEY, body)
    )
    if _rank(host) == 0:
        assert answer.rc == 0, answer.stderr
        assert json.loads(answer.stdout)["usage"]["completion_tokens"] == 4
    else:
        assert answer.rc != 0, "rank 1 runs headless: no API on its node"


def test_no_engine_left_its_shared_memory_on_the_node_and_the_running_one_is_tracked(host):
    """After the drills (SIGKILL of rank 0's worker and of a launcher, SIGSTOP, Docker restarts, a reboot,
    changed options and image, stops by hand) no psm_*/sem.mp-* file in the node's /dev/shm (the
    containers run with --ipc host) is left unmapped, and the running rank's launcher found its vLLM
    processes' segments below the container's init (the names it removes after a stop)."""
    files = shm_files(host)
    assert files["left"] == [], files
    assert files["used"], files
    tracked = latest_tracked(host)
    assert tracked and set(tracked) & set(files["used"]), (tracked, files)
