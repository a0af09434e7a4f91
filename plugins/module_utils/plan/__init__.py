# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory planner (controller side): the model, vLLM releases, the KV cache, the budget of one
engine (``planner``) and of every engine of a node (``node_budget``)."""
