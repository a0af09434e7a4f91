# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of playbooks/link_check.yml: the pairs of nodes to measure and the report
(plugins/module_utils/service/link_check.py). A refusal (EngineModelError) reaches Ansible as
AnsibleFilterError with the same text."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.uma.vllm.plugins.module_utils.service import link_check
from ansible_collections.uma.vllm.plugins.module_utils.service.base import EngineModelError


def link_check_pairs(engines: Any, hostvars: Any, play_hosts: Any, port: Any = 29590) -> Any:
    try:
        return link_check.pairs(engines, hostvars, play_hosts, port)
    except EngineModelError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    def filters(self):
        return {"link_check_pairs": link_check_pairs, "link_check_report": link_check.report}
