# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter of playbooks/status.yml: what a node's engines are doing, per engine and rank, as data and as
lines to print (plugins/module_utils/service/status_report.py)."""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.filter.vllm_service import lazy

# imported at the first call: see lazy() in vllm_service.py
status_report = lazy("service.status_report:status_report", refusals=False)


class FilterModule:
    def filters(self):
        return {"status_report": status_report}
