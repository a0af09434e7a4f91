# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/scenarios.txt's lanes (``NAME beside OTHER``) keep off the default Docker bridge.

The engine scenarios (molecule/cluster, molecule/cluster_container) take each node's Docker bridge
address as its cluster address and reboot or kill nodes; Docker 20.10 gives a container started
again the lowest free address, so a scenario beside them on the same bridge (a node created while
one is down, or one removed that leaves a lower address free) moves a node and the engine never
heals (the CI run of commit afeaf6b: rank 0's node came back elsewhere, the reboot drill timed
out after 322 s). Each lane scenario's platforms are on a Docker network of the scenario's own.
"""

from __future__ import annotations

import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lines():
    text = (ROOT / "tests" / "scenarios.txt").read_text(encoding="utf-8")
    return [line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _platforms(name):
    return yaml.safe_load((ROOT / "molecule" / name / "molecule.yml").read_text(encoding="utf-8"))["platforms"]


def _networks(platform):
    return [net["name"] for net in platform.get("networks") or []]


def _beside():
    return [(fields[0], fields[2]) for fields in _lines() if len(fields) == 3 and fields[1] == "beside"]


def test_there_are_lanes():
    assert _beside(), "tests/scenarios.txt has no 'NAME beside OTHER' line: this test guards nothing"


def test_each_lane_scenario_has_a_network_of_its_own():
    owners = {}
    for name, _other in _beside():
        for platform in _platforms(name):
            nets = _networks(platform)
            assert nets, (
                "molecule/%s/molecule.yml: platform %s runs beside another scenario on the default bridge; "
                "give it `networks: [{name: uma-lane-%s}]`" % (name, platform["name"], name.replace("_", "-"))
            )
            mode = platform.get("network_mode")
            assert mode in (None, nets[0]), (name, platform["name"], mode)
            for net in nets:
                assert net not in ("bridge", "host", "default", "none"), (name, platform["name"], net)
                owner = owners.setdefault(net, name)
                assert owner == name, "network %s is both %s's and %s's" % (net, owner, name)


def test_no_foreground_scenario_uses_a_lane_network():
    lanes = {name for name, _other in _beside()}
    lane_nets = {net for name in lanes for platform in _platforms(name) for net in _networks(platform)}
    for fields in _lines():
        if fields[0] in lanes:
            continue
        for platform in _platforms(fields[0]):
            assert not set(_networks(platform)) & lane_nets, (fields[0], platform["name"])
