# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stop request that a signal, a test or a program's own loop can raise (the guard's and the watchdog's).

Node-side (stdlib only).
"""

from __future__ import annotations

import os
import select
from typing import Any, Optional


class Stopper:
    """Stop request shared by signal handlers, tests and the wait in the loop.

    A self-pipe makes a signal end a wait at once, whatever the interval.
    """

    def __init__(self) -> None:
        self.requested = False
        self.signal: Optional[int] = None
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def handler(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        self.set()

    def set(self) -> None:
        self.requested = True
        try:
            os.write(self._w, b"x")
        except OSError:  # pipe full: a wake-up is already pending
            pass

    def wait(self, timeout: float, fd: Optional[int] = None) -> bool:
        """Sleep up to ``timeout``; True when ``fd`` became readable."""
        if self.requested:
            return False
        rlist = [self._r] if fd is None else [self._r, fd]
        ready = select.select(rlist, [], [], max(0.0, timeout))[0]
        return fd is not None and fd in ready

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
