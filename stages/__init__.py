"""The stages: plain functions `stage(wh, config, force) -> StageResult` over the warehouse, one module per
family (data, training, evaluation, report, knowledge), with their configs, registry and runner.

Importing the package also gives every thread of the process a malloc arena of its own (`malloc_arena_per_thread`):
every process that runs a stage (the `nkb` command, Prefect's flow runs, the benchmarks, the tests) imports it before
it starts threads, and the setting only holds if made before then.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_ARENA_MAX = -8  # glibc's <malloc.h>
# Room above glibc's default (8 per core) for the threads a stage process starts beside torch's: Prefect's (its event
# loop, its API and log workers, anyio's pool of up to 40) and the JVM's (about 17).
ARENAS_ABOVE_DEFAULT = 128


def malloc_arena_per_thread() -> None:
    """Raise glibc's limit on malloc arenas, unless the user set one (`MALLOC_ARENA_MAX`, `GLIBC_TUNABLES`).

    glibc gives each thread that allocates an arena of its own, up to 8 per core; past that, a new thread shares one.
    On 2 cores that is 16, and a demo's process has filled them before its injection starts (Prefect's threads,
    then the JVM's): torch's OpenMP worker, started with the first parallel operator, then shares the arena of the
    thread it works beside, and every tensor either allocates waits on the other's lock: injection steps slow down
    (docs/environment.md). The limit is fixed once glibc makes its ninth arena, so this runs at import, before
    threads."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ \
            or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc's (musl has no arenas to raise)
    if mallopt is not None:
        mallopt(M_ARENA_MAX, 8 * len(os.sched_getaffinity(0)) + ARENAS_ABOVE_DEFAULT)


malloc_arena_per_thread()
