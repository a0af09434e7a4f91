# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node-preparation modules' logic: uma_sysctl (``sysctl``), readahead_window (``readahead``),
drop_cache_loop (``guard_service``), node_facts (``platform``)."""
