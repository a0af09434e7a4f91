# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter of the uma.vllm.vllm_service role: each engine's watchdog config on this node, a
thin wrapper over plugins/module_utils/service/watchdog.py (checked by the watchdog's
own validation before anything is written)."""

from __future__ import annotations

from ansible_collections.uma.vllm.plugins.filter.vllm_service import lazy

# imported at the first call (it pulls in the whole node package: the configs carry its fingerprint),
# see lazy() in vllm_service.py
watchdog_configs = lazy("service.watchdog:watchdog_configs")


class FilterModule:
    def filters(self):
        return {"vllm_service_watchdog_configs": watchdog_configs}
