"""Seeds and determinism.

One run seed derives independent random streams by *purpose*, round and client
(``derive_seed(seed, "shuffle", rnd, client)``), so that the shuffling of client 2 in round 7 does
not depend on what ran before it. This is also what makes resume exact: nothing random needs to be
restored from a checkpoint except what the checkpoint holds anyway (the models).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import sys

import numpy as np

PURPOSES = ("init", "sampling", "shuffle", "augment", "local", "server", "split")


def derive_seed(seed: int, purpose: str, *keys: int | str) -> int:
    """A 63-bit seed that depends only on (seed, purpose, keys)."""
    text = ":".join([str(int(seed)), purpose, *map(str, keys)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def numpy_rng(seed: int, purpose: str, *keys: int | str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *keys))


def torch_generator(seed: int, purpose: str, *keys: int | str):
    import torch

    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, *keys))
    return gen


def seed_global(seed: int, purpose: str, *keys: int | str) -> None:
    """Seed the global RNGs (python, numpy, torch) for code we do not control (dropout, timm init)."""
    import torch

    value = derive_seed(seed, purpose, *keys)
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


@contextlib.contextmanager
def kept_rng_state():
    """Run a block without changing the global RNGs' state (python, numpy, torch CPU and CUDA)."""
    import torch

    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def fixed_threads(threads: int):
    """Run a block with ``threads`` intra-op torch threads (then restore the job's). CPU matrix products of the
    same inputs differ with the thread count for some shapes (the BLAS splits the inner dimension across threads
    when the outer ones are small: 10 prompts x 384 -> 256 differ by up to 7e-7 between 1 and 2 threads), and
    Snakemake sets that count from ``--cores`` (OMP_NUM_THREADS); a block that must give the same bytes on every
    machine fixes it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def configure_determinism(enabled: bool) -> dict:
    """Switch torch to deterministic kernels; returns what was set, for the run manifest.

    ``CUBLAS_WORKSPACE_CONFIG`` must be set before CUDA initialises, so the Snakemake rule also
    exports it in the job's shell; setting it here covers direct CLI use.
    """
    import torch

    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # torch.use_deterministic_algorithms() also imports the inductor (about 4 s per job here) just to
    # configure torch.compile, which this project does not use; set the kernel switch directly and
    # the inductor flag only if the inductor happens to be loaded already.
    torch._C._set_deterministic_algorithms(enabled, warn_only=True)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = enabled
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = not enabled
    return {
        "deterministic": enabled,
        "torch.use_deterministic_algorithms": enabled,
        "deterministic_warn_only": True,
        "cudnn.deterministic": enabled,
        "cudnn.benchmark": not enabled,
        "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }
