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
    """Seconds per named phase, each counted once (nested phases are subtracted from the phase around them): wall
    time, and this process's CPU time (user + system, all its threads), which a machine shared with other jobs
    inflates far less than the wall time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self._nested: list[list[float]] = []       # per open phase: the [wall, cpu] seconds of its nested phases

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, cpu_start = time.perf_counter(), time.process_time()
        self._nested.append([0.0, 0.0])
        try:
            yield
        finally:
            took, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            nested, nested_cpu = self._nested.pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + took - nested
            self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + cpu - nested_cpu
            if self._nested:
                self._nested[-1][0] += took
                self._nested[-1][1] += cpu

    def to_json(self) -> dict[str, dict[str, float]]:
        return {name: {"wall_s": round(self.seconds[name], 4), "cpu_s": round(self.cpu_seconds[name], 4)}
                for name in self.seconds}


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
