# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of playbooks/link_check.yml: the pairs of nodes to measure and the report
(plugins/module_utils/service/link_check.py). A refusal (EngineModelError) reaches Ansible as
AnsibleFilterError with the same text."""

from __future__ import annotations

from typing import Any

from ansible_collections.uma.vllm.plugins.filter.vllm_service import lazy

# imported at the first call: see lazy() in vllm_service.py
_pairs = lazy("service.link_check:pairs")
link_check_report = lazy("service.link_check:report", refusals=False)


def link_check_pairs(engines: Any, hostvars: Any, play_hosts: Any, port: Any = 29590) -> Any:
    return _pairs(engines, hostvars, play_hosts, port)


class FilterModule:
    def filters(self):
        return {"link_check_pairs": link_check_pairs, "link_check_report": link_check_report}
