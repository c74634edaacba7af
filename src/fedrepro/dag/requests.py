"""What each GPU job asks SLURM for: runtime and GPU memory from a measured throughput table, host memory from the
run's own estimate (:mod:`fedrepro.cost`).

The profile names each GPU rule's GPU model (set-resources: <rule>: gpu_model, workflow/profiles/slurm); where
benchmarks/gpu/ holds that GPU's table (benchmarks/train_step.py --device cuda), the jobs ask for the runtime and
GPU memory its rates give, with the margins of :mod:`fedrepro.cost.runtime`; else for ``FALLBACK_RUNTIME``,
unmeasured guesses. CPU rules (image_cache) read the train rule's table, taken on the GPU nodes' CPUs. Each request
is planned once per job (Snakemake asks for each resource separately).
"""

from __future__ import annotations

from typing import Callable

from .. import paths
from ..cost import runtime as cost
from ..cost.throughput import ThroughputError, for_gpu

FALLBACK_MEMORY = {"mem_mb": 32000, "gpu_mem_mb": 0}   # when a run's model cannot be estimated
TABLE_RULES = ("train", "features", "downstream", "image_cache")


def per_attempt(base: int):
    """A resource that grows with each retry: a job killed for time or memory gets more on its next
    attempt (the SLURM profile sets `retries`). Values here are cluster-independent; account,
    partition, GPU model and QoS live only in workflow/profiles/slurm."""
    return lambda wildcards, attempt: base * attempt


class Requests:
    """The SLURM requests of one configuration's jobs. ``gpu_model_of(rule)``: the GPU model the profile asks for
    ``rule`` (None without one); ``error``: the exception a table that cannot be read raises; ``say``: where the
    notes go (stderr, one line each)."""

    def __init__(self, dag, gpu_model_of: Callable[[str], str | None], error: type[Exception], say: Callable[[str], None]):
        self.dag, self.say = dag, say
        self.image_run_threads = dag.project.config["image_run_threads"]
        self.tables = self._throughput_tables(gpu_model_of, error)
        self._runs: dict[str, dict] = {}
        self._features: dict[tuple, cost.Request] = {}
        self._downstream: dict[str, cost.Request] = {}
        self._failures: set[str] = set()

    def _throughput_tables(self, gpu_model_of, error) -> dict:
        tables, notes = {}, {}
        for name in TABLE_RULES:
            model = gpu_model_of(name)
            try:
                tables[name], why = for_gpu(model)
            except ThroughputError as exc:
                raise error(f"a throughput table in {paths.throughput_dir()}/ cannot be read: {exc}")
            if model:
                notes[why if tables[name] else f"{why}; runtime and GPU memory requests are unmeasured guesses"] = True
        for note in notes:
            self.say(f"fedrepro: SLURM requests: {note}")
        return tables

    def run_resources(self, wildcards) -> dict:
        """{"mem_mb", "gpu_mem_mb", "runtime"} of a run: host memory from its estimate (fedrepro.cost.memory) with the
        rule's loader workers; GPU memory and runtime from the measured rates where a table is here (fedrepro.cost)."""
        path = self.dag.run_key(wildcards).path
        if path not in self._runs:
            self._runs[path] = self._run_resources(path)
        return self._runs[path]

    def _run_resources(self, path: str) -> dict:
        from ..cost.memory import planned

        project, key = self.dag.project, self.dag.runs[path]
        guess = cost.FALLBACK_RUNTIME["train_features" if project.resolver.run_config(key)["input"] == "features" else "train_images"]
        try:
            est = planned(project, key, workers=self.image_run_threads - 1)
        except Exception as error:  # noqa: BLE001 - planning never fails on an estimate
            self.say(f"fedrepro: no memory estimate for {path} ({error}); asking for {FALLBACK_MEMORY}")
            return {**FALLBACK_MEMORY, "runtime": guess}
        if "error" in est.profile:      # said once per failure, not once per run and seed
            if est.profile["error"] not in self._failures:
                self._failures.add(est.profile["error"])
                self.say(f"fedrepro: no memory estimate: {est.profile['error']}. Its jobs (the first: {path}) ask "
                         f"for the fallback mem_mb={FALLBACK_MEMORY['mem_mb']}; fix it and plan again (a failure is "
                         f"never cached)")
            return {**FALLBACK_MEMORY, "runtime": guess}
        request = cost.train_request(project, key, est, self.tables["train"])
        return {"mem_mb": est.host_mb(), "gpu_mem_mb": request.gpu_mem_mb, "runtime": request.runtime}

    def features_request(self, wildcards, threads: int) -> cost.Request:
        """Runtime and GPU memory of a feature cache: one encoder pass, decoded by the job's workers (threads - 1)."""
        key = (wildcards.dataset, wildcards.key, threads)
        if key not in self._features:
            encoder = self.dag.features[f"{wildcards.dataset}/{wildcards.key}"]["encoder"]
            self._features[key] = cost.features_request(self.tables["features"], wildcards.dataset, encoder,
                                                        max(1, threads - 1))
        return self._features[key]

    def image_cache_request(self, wildcards, threads: int) -> cost.Request:
        return cost.image_cache_request(self.tables["image_cache"], wildcards.dataset, threads)

    def downstream_request(self, wildcards) -> cost.Request:
        name = self.dag.downstream_key(wildcards)
        if name not in self._downstream:
            table = self.tables["downstream"]       # without one, the guess: no job config to build
            job = self.dag.project.resolver.downstream_config(*self.dag.downstream_jobs[name]) if table else None
            self._downstream[name] = cost.downstream_request(table, job)
        return self._downstream[name]
