"""gunicorn's ``post_fork`` hook: what a new worker does first, before gevent and the app.

Until a worker sets its own signal handlers (after gevent has patched it, a
tenth of a second or so), it has the master's, copied by the fork, which
only queue the signal for a master loop the worker does not run: a stop
asked in that moment would be lost, and the worker would run on until the
master's graceful timeout killed it. The default action stops it at once,
and a worker that has loaded nothing has nothing to finish.
"""

from __future__ import annotations

import signal
from typing import Any, Final

from gateway.serving import affinity

# By name, so the benchmark's bare baseline can take it from JSON.
POST_FORK: Final = "gateway.serving.forks.worker_forked"


def worker_forked(arbiter: Any, worker: Any) -> None:
    """Stop signals stop the new worker outright; a worker given a CPU is pinned to it."""
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, signal.SIG_DFL)
    if getattr(worker, "cpu", None) is not None:  # affinity.assign_cpu gave it one
        affinity.pin_worker(arbiter, worker)
