"""Deadline: one time budget as a value, when it ends on a monotonic clock (or never), passed as is from the agent
session (agent.max_wall_s) to its model calls, evaluations, gate and bench jobs.

Seconds left are read off it where they are used (a sandbox job's timeout_s, a socket timeout), never carried:
a float of seconds goes stale the moment it is computed. The one float crossing is where the budget leaves this
process: gate.verify's time_left_s (cluster.py may run it on another machine, whose monotonic clock is its own).
`clock` is the session's (tests inject a fake one); it is not part of the value's identity.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Deadline:
    at: float | None = None  # the clock's reading when the time runs out; None: no limit
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    @classmethod
    def after(cls, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """`seconds` from now on `clock`; None or inf: no limit."""
        return cls(None if seconds is None or math.isinf(seconds) else clock() + seconds, clock)

    @classmethod
    def none(cls) -> Deadline:
        return cls()

    def left(self) -> float:
        """Seconds left, never negative; inf where there is no limit."""
        return math.inf if self.at is None else max(0.0, self.at - self.clock())

    def expired(self) -> bool:
        return self.left() <= 0

    def within(self, seconds: float) -> Deadline:
        """The earlier of this deadline and `seconds` from now."""
        end = self.clock() + seconds
        return Deadline(end if self.at is None else min(self.at, end), self.clock)
