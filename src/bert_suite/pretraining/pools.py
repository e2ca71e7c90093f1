"""Process pools that are safe in a process that has started threads.

A fork copies the whole address space but only the forking thread: a lock that another thread held at
that moment (one of torch's OpenMP workers, Dask's event loop, tqdm's monitor) stays held in the child,
and a child that takes it waits forever in a futex. The data pipeline's pools (words counted by
`tokenizer --num_proc`, instances built by `pretrain-data --num_proc` through datasets) therefore fork
only from a process running one thread, which costs nothing at the command line; anywhere else (a
notebook that has trained a model, a test process, a Dask worker) they start their workers from a fresh
fork server, whose workers import this package's data modules anew (no torch: a fraction of a second).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading


def threads() -> int:
    """The threads of this process: the kernel's count (torch's OpenMP workers included), else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def start_method() -> str:
    """fork when this process runs one thread, else forkserver (spawn where there is no fork server)."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threads() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


@contextlib.contextmanager
def datasets_pools():
    """datasets' `num_proc` pools (the `multiprocess` package's default context) start their workers with
    `start_method()` inside this block; the default is restored after it."""
    import multiprocess

    method = start_method()
    previous = multiprocess.get_start_method(allow_none=True)
    if method == (previous or "fork"):
        yield
        return
    multiprocess.set_start_method(method, force=True)
    try:
        yield
    finally:
        multiprocess.set_start_method(previous, force=True)
