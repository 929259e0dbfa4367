"""Each gunicorn worker process kept on one CPU of its own.

A worker pinned to a CPU keeps its memory in that CPU's caches, and two
workers never take turns on one CPU while the other idles. Pinning paid most
under threaded workers, whose threads handed the interpreter lock between
CPUs at every statement and TLS write (bench/HISTORY.md has the runs); a
gevent worker runs one thread, so that cost is gone and pinning is a
smaller matter.

Only ``gateway serve --pin-workers`` pins, since a pinned worker cannot move
off a CPU that other busy programs on the host share. The CPUs are those the
server was started on (``taskset``, a container's cpuset), and workers are
pinned only when there is at least one for each of them: a server with fewer
workers than CPUs leaves its workers' placement to the kernel, so that
several such servers on one host never crowd the same CPUs while others idle
(start one under ``taskset`` with as many CPUs as workers to pin it).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Final

# gunicorn's hooks, by name: the benchmark hands the same settings as JSON to
# its bare baseline's gunicorn, which imports them from here.
# (The worker pins itself in gateway.serving.forks, gunicorn's post_fork.)
PRE_FORK: Final = "gateway.serving.affinity.assign_cpu"


def pins(workers: int) -> bool:
    """Whether ``workers`` workers are pinned: on Linux, with 2 or more CPUs, none left over."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    return 1 < len(os.sched_getaffinity(0)) <= workers


def assign_cpu(arbiter: Any, worker: Any) -> None:
    """gunicorn's ``pre_fork``, in the server: the least used CPU for the worker to start.

    A worker started to replace one that died takes the CPU it left.
    """
    cpus = sorted(os.sched_getaffinity(0))
    used = Counter(getattr(other, "cpu", None) for other in arbiter.WORKERS.values())
    worker.cpu = min(cpus, key=lambda cpu: (used[cpu], cpu))


def pin_worker(arbiter: Any, worker: Any) -> None:
    """In the new worker (gunicorn's ``post_fork``): it and what it starts stay on its CPU."""
    os.sched_setaffinity(0, {worker.cpu})
