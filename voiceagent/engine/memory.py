"""Keep freed memory in the process, so a turn reuses pages an earlier one touched.

A turn's flow state is hundreds of buffers of a few MB (the estimator's keys/values,
`flow_encoder.append`). glibc's malloc gives memory back to the system when such
buffers are freed: a thread's arena deletes a heap that empties, the main heap is
trimmed, and the next turn's buffers are new pages, each costing a page fault on first
write. On this project's VMs that is about 8 µs a page: a first flow chunk at full size
took 20,000-33,000 faults (100-130 MB) on every turn, and the warm-up's first chunk
(`AcousticWorker._rehearse`) did not spare the first real turn its faults.

`retain_freed_memory()` sets three mallopt parameters once for the process: one arena
for all threads (M_ARENA_MAX 1: the main heap, which the next two govern), no trimming
(M_TRIM_THRESHOLD at its maximum) and a fixed mmap threshold of 32 MB (larger blocks
still go straight back to the system). Measured at full size on the worker thread: a
repeated first chunk took 0-300 faults instead of 26,000-33,000. The cost: the process
keeps its high-water mark of heap memory (reused by later turns, not returned), and
threads share one arena lock.

It is the program's choice, not the engine's: `serve`, `say` and `bench` make it before
any engine thread allocates; code that embeds the engine keeps its own malloc (the
tests' in-process servers, where every thread of the test process sharing one arena
made the suite half again as slow and its timing checks fail).

Only glibc has these parameters; elsewhere (musl, macOS) this does nothing.
`VOICEAGENT_MALLOC=system` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
_done: bool | None = None


def retain_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory (once per process); False where it could
    not (not glibc, or `VOICEAGENT_MALLOC=system`)."""
    global _done
    if _done is None:
        _done = _set()
    return _done


def _set() -> bool:
    if os.environ.get("VOICEAGENT_MALLOC") == "system":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_ARENA_MAX, 1),
            (M_TRIM_THRESHOLD, 2**31 - 1),
            (M_MMAP_THRESHOLD, 32 << 20),
        )
    )
    if not ok:
        log.warning("malloc tuning refused by this libc: freed memory may go back to the system")
    return ok
