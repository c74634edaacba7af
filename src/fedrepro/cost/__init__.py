"""What a job costs, in one place: :mod:`.memory` (a run's host and GPU memory, estimated from its config on the
meta device), :mod:`.throughput` (a GPU's measured rates), :mod:`.runtime` (a job's device time and its SLURM
requests from those rates) and :mod:`.estimate` (what ``fedrepro estimate`` prints for a target's jobs). Nothing is
imported here: a job that checks its memory (``fedrepro.train``) loads :mod:`.memory` alone."""
