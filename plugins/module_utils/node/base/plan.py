# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory plan's contract: the part of ``uma.vllm.vllm_flags``' ``budget`` that crosses the wire.

The planner (``plan/budget.py``) emits the budget; the role sums the budgets of a node
(``plan/node_budget.py``); the launch config carries it to the node, where the launcher admits the
start on it (``node/launch/admission.py``) and sets the guard's line. Those three read it through
:class:`StartPlan`, defined here once, with the constants its figures are made of (the CUDA
context, with and without eager module loading). Each side checks it once:

- the planner, the budget it emits (``plan/budget.py`` ``final_budget``);
- the launcher, the copy it reads from the engine's config (``node/launch/config.py`` ``validate``),
  so a damaged or hand-made plan is refused naming its key, never an overflow later (1e308 bytes) nor
  a silent "no request" that admits unchecked.

Every other key of the budget (KV tokens, the tables, the version) is shown, recorded and
diagnosed, never computed with on the node: it is not part of the contract.

Node-side, stdlib only (shipped in the node package; the controller imports it too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from .common import UmaError

GIB = 1 << 30
GIB_F = float(GIB)

# A discrete GPU's CUDA context: the process's first CUDA call takes it from the card's free memory
# before vLLM's startup snapshot (free must be >= total x gpu_memory_utilization): 0.75 GiB, the default
# reserve_gib on a discrete GPU, and what the launcher's GPU admission adds where the plan has no
# cuda_context_bytes (evidence: docs/PLANNER-EVIDENCE.md, section 'The CUDA context of a discrete GPU').
CUDA_CONTEXT_BYTES = GIB * 3 // 4
# With CUDA_MODULE_LOADING=EAGER in the engine's environment every kernel of every loaded CUDA library is
# loaded at the first CUDA call: 1.5 GiB (vLLM's own kernel libraries, not measured, add more)
# (evidence: docs/PLANNER-EVIDENCE.md, section 'The CUDA context of a discrete GPU').
CUDA_CONTEXT_EAGER_BYTES = GIB * 3 // 2

MAX_BYTES = 1 << 50  # 1 PiB: no node comes near it, far below a float's precision
MAX_COUNT = 1024
# the contract's keys: byte counts (null or 0 .. 1 PiB), counts (null or 1 .. 1024), a boolean or null
BYTES_KEYS = (
    "requested_memory_bytes",
    "cuda_context_bytes",
    "weights_per_rank_bytes",
    "activation_reserve_bytes",
    "kv_cache_bytes",
    "total_memory_bytes",
    "reserve_bytes",
)
COUNT_KEYS = ("ranks_per_node", "gpus_per_node")
KEYS = BYTES_KEYS + COUNT_KEYS + ("unified_memory", "reserve_source")
FIX = "Write the plan uma.vllm.vllm_flags makes (a site.yml run does), or drop the key; nothing was started."


def eager_loading(env: Optional[Mapping[str, Any]]) -> bool:
    """Whether the engine's environment loads every CUDA module at the first call (CUDA_MODULE_LOADING=EAGER)."""
    return str((env or {}).get("CUDA_MODULE_LOADING", "")).strip().upper() == "EAGER"


def cuda_context_bytes(env: Optional[Mapping[str, Any]]) -> Tuple[int, str]:
    """The CUDA context a discrete GPU's engine takes before vLLM's startup snapshot, and why."""
    if eager_loading(env):
        return CUDA_CONTEXT_EAGER_BYTES, "the CUDA context with env CUDA_MODULE_LOADING=EAGER"
    return CUDA_CONTEXT_BYTES, "the CUDA context vLLM's startup check is taken after"


def _bytes(plan: Mapping[str, Any], key: str) -> Optional[int]:
    value = plan.get(key)
    if value is None:
        return None
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (number and math.isfinite(value) and 0 <= value <= MAX_BYTES):
        raise UmaError("plan." + key, value, "is not a number of bytes from 0 to 1 PiB", FIX)
    return int(value)


def _count(plan: Mapping[str, Any], key: str) -> Optional[int]:
    value = plan.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT):
        raise UmaError("plan." + key, value, "is not a whole number from 1 to %d" % MAX_COUNT, FIX)
    return value


@dataclass(frozen=True)
class StartPlan:
    """What the node and the node budget compute with: one engine's plan on one node.

    ``requested_memory_bytes``: one rank's startup request, ceil(total x gpu_memory_utilization)
    (vLLM's startup check compares it with the free memory); ``ranks_per_node``: the engine's ranks
    sharing this node's memory (1 on a discrete GPU, each rank has its own); ``gpus_per_node``: the
    GPUs the engine uses on the node; ``cuda_context_bytes``: a discrete GPU's context (null on unified
    memory); the per-rank footprint (weights, activations, KV cache); the node's total and reserve.
    """

    requested_memory_bytes: Optional[int] = None
    cuda_context_bytes: Optional[int] = None
    weights_per_rank_bytes: Optional[int] = None
    activation_reserve_bytes: Optional[int] = None
    kv_cache_bytes: Optional[int] = None
    total_memory_bytes: Optional[int] = None
    reserve_bytes: Optional[int] = None
    ranks_per_node: Optional[int] = None
    gpus_per_node: Optional[int] = None
    unified_memory: Optional[bool] = None
    reserve_source: str = ""

    @classmethod
    def read(cls, plan: Any) -> Optional[StartPlan]:
        """The plan (a budget of uma.vllm.vllm_flags, or null) checked key by key: a mapping; each
        number of the contract null or in range (bytes 0..1 PiB, counts 1..1024), unified_memory a
        boolean or null, reserve_source text or null. Raises UmaError naming ``plan.<key>``."""
        if plan is None:
            return None
        if not isinstance(plan, Mapping):
            raise UmaError("plan", plan, "is not a mapping", "Give the plan of uma.vllm.vllm_flags, or null.")
        fields: Dict[str, Any] = {key: _bytes(plan, key) for key in BYTES_KEYS}
        fields.update((key, _count(plan, key)) for key in COUNT_KEYS)
        if plan.get("unified_memory") not in (None, True, False):
            raise UmaError("plan.unified_memory", plan["unified_memory"], "is not true, false or null", FIX)
        source = plan.get("reserve_source")
        if source is not None and not isinstance(source, str):
            raise UmaError("plan.reserve_source", source, "is not text or null", FIX)
        return cls(unified_memory=plan.get("unified_memory"), reserve_source=source or "", **fields)

    @property
    def ranks(self) -> int:
        """The engine's ranks on this node (1 where the plan does not say)."""
        return self.ranks_per_node or 1

    @property
    def gpus(self) -> int:
        """The GPUs the engine uses on this node (1 where the plan does not say)."""
        return self.gpus_per_node or 1

    @property
    def request(self) -> Optional[int]:
        """One rank's startup request, or None where the plan has none (no total, or 0)."""
        return self.requested_memory_bytes or None

    def host_need(self) -> Tuple[Optional[int], str]:
        """What the node's MemAvailable must cover for the start (every rank's request), and from what."""
        if self.request is None:
            return None, "no startup request in the plan"
        return self.request * self.ranks, "plan requested_memory_bytes x %d rank(s)" % self.ranks

    def gpu_need(self, env: Optional[Mapping[str, Any]]) -> Tuple[Optional[int], str]:
        """The free bytes each of the engine's GPUs needs: one rank's request plus the CUDA context the
        snapshot is taken after (the plan's cuda_context_bytes, else CUDA_CONTEXT_BYTES; at least
        CUDA_CONTEXT_EAGER_BYTES where ``env`` says CUDA_MODULE_LOADING=EAGER, whatever the plan was made with)."""
        if self.request is None:
            return None, "no startup request in the plan"
        context = self.cuda_context_bytes
        context, said = (context, "plan cuda_context_bytes") if context is not None else (CUDA_CONTEXT_BYTES, "default")
        if eager_loading(env) and context < CUDA_CONTEXT_EAGER_BYTES:
            context, said = CUDA_CONTEXT_EAGER_BYTES, "env CUDA_MODULE_LOADING=EAGER; the plan kept less"
        return self.request + context, "plan requested_memory_bytes + CUDA context %.2f GiB (%s)" % (
            context / GIB_F, said)  # fmt: skip

    def footprint_bytes(self) -> int:
        """What the engine holds on the node once loaded: ranks x (weights + activations + KV cache)."""
        return self.ranks * sum(
            v or 0 for v in (self.weights_per_rank_bytes, self.activation_reserve_bytes, self.kv_cache_bytes)
        )

    def start_request_bytes(self) -> int:
        """What its start asks of the node's free memory: every rank's request (the launcher's host
        admission), never less than its footprint."""
        need = self.host_need()[0]
        footprint = self.footprint_bytes()
        return max(need if need is not None else footprint, footprint)

    def admission_memory(self) -> Tuple[str, str]:
        """The memory the launcher's admission compares where admission_memory is auto, and why."""
        if self.unified_memory is False:
            return "gpu", "auto: the plan says unified_memory false (a discrete GPU)"
        said = "unified memory" if self.unified_memory is True else "no unified_memory in the plan"
        return "host", "auto: " + said
