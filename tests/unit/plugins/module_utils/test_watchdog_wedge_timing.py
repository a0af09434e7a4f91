# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""When a wedge is decided, on rank 0's node and on rank 1's node (issue 19 item 3), with a fake clock.

Two real ``Watchdog`` objects (rank 0 with the API, rank 1 headless) run their real ``tick``
(observe, decide, publish, follow the leader) on made-up time. Stand-ins, named as such:
systemd (every unit active), the rank processes (a process of the faulted node is stopped, or
gone, from ``fault_at`` on), the engine's HTTP surface (each call costs made-up time: the
1-token completion hangs for ``probe_timeout_s`` while any rank is stopped, as a real TP=2
engine's does) and the status link (rank 0 reads rank 1's last published status). Rank 1's
ticks cost no time; rank 0's cost what its HTTP calls cost, so a probe that hangs delays its
next tick exactly as in the lab.

Measured in the native lab before the fix: a SIGSTOPped worker on rank 1 was decided ~30 s
after it was seen (the tick after the first failed observation waited for a completion that
hung behind the stopped rank), one on rank 0's node ~10 s after the fault.
"""

from __future__ import annotations

import json

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import logic, probes
from ansible_collections.uma.vllm.plugins.module_utils.node.watchdog import program as wd

BOUND_S = 15.0  # issue 19: decided within 15 s of the first failed observation, whichever node


class FakeSystemd:
    """systemctl stand-in: the engine unit is active on every node."""

    runner = None

    def show(self, unit, props):
        return {"ActiveState": "active", "SubState": "running", "MainPID": "100", "ControlGroup": "",
                "NRestarts": "0", "Result": "success", "ExecMainStatus": "0", "InvocationID": "inv-1"}  # fmt: skip

    def stop(self, unit):
        pass

    def start(self, unit):
        pass

    def reset_failed(self, unit):
        pass


class FakeServer:
    """The status endpoint stand-in: what the node publishes, read by the other node's fetch."""

    def __init__(self, bind, port, key=None, say=None):
        self.published = {}

    def close(self):
        pass


class Lab:
    """Rank 0 (ai1) and rank 1 (ai2), each with its own made-up clock."""

    def __init__(self, tmp_path, monkeypatch, fault_node, fault_at, kind="stopped", **over):
        self.fault_node, self.fault_at, self.kind = fault_node, fault_at, kind
        self.now = [0.0, 0.0]
        self.first_failed = None  # (node, time) of the first observation that saw the fault
        self.decided = None
        self.requests = 0
        proc = tmp_path / "proc"
        (proc / "sys" / "vm").mkdir(parents=True)
        (proc / "meminfo").write_text("MemTotal: %d kB\nMemFree: %d kB\nMemAvailable: %d kB\n" % (
            24 << 20, 16 << 20, 16 << 20))  # fmt: skip
        (proc / "sys" / "vm" / "min_free_kbytes").write_text("67584\n")
        monkeypatch.setattr(probes, "StatusServer", FakeServer)
        monkeypatch.setattr(probes, "check_local", self.check_local)
        monkeypatch.setattr(probes, "probe_health", self.cost(0.01, {"ok": True, "latency_s": 0.01, "error": None}))
        monkeypatch.setattr(probes, "read_metrics", self.read_metrics)
        monkeypatch.setattr(probes, "model_id", lambda cfg: "tiny")
        monkeypatch.setattr(probes, "start_completion", self.start_completion)
        monkeypatch.setattr(probes, "fetch_status", self.fetch_status)
        base = {"engine": "tp2", "meminfo_root": str(proc), "status_bind": "127.0.0.1", "status_port": 9411,
                "textfile_dir": None, "processes": [{"match": "VLLM::", "min": 1}]}  # fmt: skip
        base.update(over)
        cfg0 = logic.validate(dict(base, rank=0, peers=[{"name": "ai2", "url": "http://ai2:9411/status"}],
                                   state_dir=str(tmp_path / "ai1")))  # fmt: skip
        cfg1 = logic.validate(dict(base, rank=1, leader_url="http://ai1:9411/status", state_dir=str(tmp_path / "ai2")))
        self.dogs = [
            wd.Watchdog(cfg0, systemd=FakeSystemd(), clock=lambda: self.now[0], sleep=self.sleep0),
            wd.Watchdog(cfg1, systemd=FakeSystemd(), clock=lambda: self.now[1], sleep=lambda s: None),
        ]
        self.dogs[0].restart_all = self.restart_all
        self.next1 = 0.0

    # ---- stand-ins
    def cost(self, seconds, result):
        def call(*_args):
            self.now[0] += seconds
            return dict(result)

        return call

    def sleep0(self, seconds):
        self.now[0] += seconds

    def faulted(self, node, t):
        return node == self.fault_node and t >= self.fault_at

    def check_local(self, cfg, show, runner=None):
        node = cfg["rank"]
        t = self.now[node]
        if not self.faulted(node, t):
            return {"ok": True, "reason": "2 processes", "pids": [41, 42]}
        if self.first_failed is None:
            self.first_failed = (node, t)
        if self.kind == "stopped":
            return {"ok": False, "reason": "process 42 (VLLM::Worker_TP%d) is stopped (state T)" % node,
                    "pids": [41, 42], "stopped": True}  # fmt: skip
        return {"ok": False, "reason": "0 of 1 processes matching 'VLLM::' alive", "pids": [41]}

    def wedged(self, t):
        return self.kind == "stopped" and t >= self.fault_at

    def read_metrics(self, cfg):
        self.now[0] += 0.01
        done = float(self.requests)  # each answered probe is one finished request in vLLM's counters
        return {"running": 0, "waiting": 0, "progress": {"vllm:request_success_total": done,
                                                         "vllm:generation_tokens_total": done}}  # fmt: skip

    def start_completion(self, cfg, model):
        """The completion in flight: answered 0.3 s after it was sent, unless a rank is stopped by then
        (a TP=2 step waits for every rank): then it times out after probe_timeout_s."""
        lab, sent = self, self.now[0]

        class Pending:
            def done(self):
                return lab.now[0] >= sent + (cfg["probe_timeout_s"] if lab.wedged(sent + 0.3) else 0.3)

            def result(self):
                if lab.wedged(sent + 0.3):
                    return {"ok": False, "latency_s": cfg["probe_timeout_s"], "error": "timed out"}
                lab.requests += 1
                return {"ok": True, "latency_s": 0.3, "error": None}

        return Pending()

    def fetch_status(self, url, timeout, key=None, refusals=None):
        if "ai2" in url:  # rank 0 reads rank 1: rank 1 has ticked up to rank 0's now
            self.run_rank1(self.now[0])
            self.now[0] += 0.01
            return json.loads(json.dumps(self.dogs[1].server.published)) or None
        return json.loads(json.dumps(self.dogs[0].server.published)) or None

    def restart_all(self, action):
        self.decided = (self.now[0], action)

    # ---- the loops (uma_watchdog.Watchdog.run's pacing: a tick every interval_s, or at once after a long one)
    def run_rank1(self, until):
        while self.next1 <= until:
            self.now[1] = self.next1
            self.dogs[1].tick()
            self.next1 += self.dogs[1].cfg["interval_s"]

    def run(self, limit, rank1_offset=0.0):
        self.next1 = rank1_offset
        interval = self.dogs[0].cfg["interval_s"]
        next0 = 0.0
        while self.decided is None and self.now[0] < limit:
            self.now[0] = max(self.now[0], next0)
            started = self.now[0]
            self.dogs[0].tick()
            next0 = started + interval
        return self

    def decision_after_first_failure(self):
        assert self.decided is not None, "no restart decided"
        assert self.first_failed is not None
        return self.decided[0] - self.first_failed[1]


OFFSETS = [x * 1.45 for x in range(0, 45)]  # faults at every phase of the ticks and of the once-a-minute probe


@pytest.mark.parametrize("node", [0, 1], ids=["rank 0's node", "rank 1's node"])
def test_a_stopped_process_is_decided_within_15_s_of_the_first_failed_observation(tmp_path, monkeypatch, node):
    worst = (0.0, None)
    for i, offset in enumerate(OFFSETS):
        lab = Lab(tmp_path / str(i), monkeypatch, fault_node=node, fault_at=200.0 + offset)
        lab.run(limit=400.0, rank1_offset=(offset * 3.1) % 5.0)
        took = lab.decision_after_first_failure()
        action = lab.decided[1]
        assert action["kind"] in ("local", "peer") and "is stopped (state T)" in action["reason"]
        assert lab.decided[0] - lab.fault_at <= BOUND_S + 5.0  # and from the fault itself: one tick more at most
        worst = max(worst, (took, offset))
    print("wedge on rank %d's node: worst %.1f s from the first failed observation to the decision" % (node, worst[0]))
    assert worst[0] <= BOUND_S, worst


def test_the_rank_link_grace_still_protects_a_gone_process_on_rank_1(tmp_path, monkeypatch):
    """A gone worker on rank 1 is the launchers' rank link's first (every rank exits 69): the watchdog
    does not restart within rank_link_grace_s, and does after it when nothing else acted."""
    lab = Lab(tmp_path, monkeypatch, fault_node=1, fault_at=200.0, kind="gone").run(limit=400.0, rank1_offset=2.0)
    took = lab.decision_after_first_failure()
    assert lab.decided[1]["kind"] == "peer" and "0 of 1 processes" in lab.decided[1]["reason"]
    grace = lab.dogs[0].cfg["rank_link_grace_s"]
    assert grace == 30.0
    assert grace <= took <= grace + BOUND_S, took


def test_idle_probes_pace_at_most_one_a_minute(tmp_path, monkeypatch):
    """A healthy idle engine for an hour: about one completion a minute (it was one per 5 s tick)."""
    lab = Lab(tmp_path, monkeypatch, fault_node=0, fault_at=1e9).run(limit=3600.0)
    assert lab.decided is None
    assert 55 <= lab.requests <= 61, lab.requests  # 3600 s / 60 s, the first at the start
    assert lab.dogs[0].state["counts"]["probes"] == lab.requests
