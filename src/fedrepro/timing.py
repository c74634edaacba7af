"""Where a job's wall time goes, phase by phase (the run manifest's ``timings.phases``; benchmarks/job_profile.py).

A cluster pays every second of a job once per run of the grid, so the per-job costs that are not training (start-up,
model build, checkpoints, evaluation, a method's extra passes) must be visible, not guessed. Phases are exclusive: a
phase opened inside another (a method's client risks inside the server's aggregation) is counted in its own row and
not again in the outer one, so the rows add up to the time they cover.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Iterator


class Phases:
    """Seconds per named phase, each counted once (nested phases are subtracted from the phase around them)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._nested: list[float] = []       # per open phase: the seconds its nested phases took

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self._nested.append(0.0)
        try:
            yield
        finally:
            took = time.perf_counter() - start
            nested = self._nested.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + took - nested
            if self._nested:
                self._nested[-1] += took

    def to_json(self) -> dict[str, float]:
        return {name: round(seconds, 4) for name, seconds in self.seconds.items()}


def process_age() -> float | None:
    """Seconds since this process started (a fork-server child: since the fork), from /proc; None elsewhere.
    What a job spent before its own code ran: interpreter start-up and imports."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")      # field 22: start time, clock ticks after boot
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - started)
