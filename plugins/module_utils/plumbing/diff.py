# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Before and after of what a module manages, for ``changed``, check mode and ``--diff``.

In the spirit of community.docker's ``DifferenceTracker``: a module's plan adds one entry per
thing it looks at (a file, the live values of a knob, a unit's state) with the value found and
the value it will leave; the tracker answers whether anything differs and renders the diff in
either of the two shapes Ansible shows:

- :meth:`DifferenceTracker.before_after` - ``{"before": {name: value}, "after": {name: value}}``
  (structured values; Ansible prints them as YAML/JSON),
- :meth:`DifferenceTracker.text_diffs` - a list of ``{"before_header", "after_header",
  "before", "after"}`` texts, one per entry (Ansible prints a unified diff of each).

Pure; no Ansible import.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple


def as_text(value: Any) -> str:
    """A value as diff text: strings as they are, None as nothing, anything else as sorted JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True) + "\n"


class DifferenceTracker:
    """Named (before, after) pairs, in the order they were added."""

    def __init__(self) -> None:
        self._entries: List[Tuple[str, Any, Any]] = []

    def add(self, name: str, before: Any, after: Any) -> DifferenceTracker:
        self._entries.append((name, before, after))
        return self

    def merge(self, other: DifferenceTracker) -> DifferenceTracker:
        self._entries.extend(other._entries)
        return self

    @property
    def changed(self) -> bool:
        """True when any entry's after differs from its before."""
        return any(before != after for _name, before, after in self._entries)

    def differs(self, name: str) -> bool:
        return any(before != after for entry, before, after in self._entries if entry == name)

    def changed_names(self) -> List[str]:
        return [name for name, before, after in self._entries if before != after]

    def before_after(self) -> Dict[str, Dict[str, Any]]:
        """Every entry as ``{"before": {name: before}, "after": {name: after}}``."""
        return {
            "before": {name: before for name, before, _after in self._entries},
            "after": {name: after for name, _before, after in self._entries},
        }

    def text_diffs(self, render: Optional[Callable[[Any], str]] = None) -> List[Dict[str, str]]:
        """Every entry as a header-and-text diff (``render`` turns a value into text; default as_text)."""
        show = render or as_text
        return [
            {"before_header": name, "after_header": name, "before": show(before), "after": show(after)}
            for name, before, after in self._entries
        ]
