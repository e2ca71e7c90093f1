"""Process pools that are safe in a process that has started threads.

A fork copies the whole address space but only the forking thread: a lock that another thread held at
that moment (one of torch's OpenMP workers, Dask's event loop, tqdm's monitor) stays held in the child,
and a child that takes it waits forever in a futex. The data pipeline's pools (words counted by
`tokenizer --num_proc`, instances built by `pretrain-data --num_proc` through datasets) therefore fork
only from a process running one thread, which costs nothing at the command line; anywhere else (a
notebook that has trained a model, a test process, a Dask worker) they start their workers from a fresh
fork server, whose workers import this package's data modules anew (no torch: a fraction of a second).
Such workers also import the program's main module: a script must keep its code under
`if __name__ == "__main__":` (Python's rule for spawned workers); one that does not is forked, with a warning.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
import warnings
from pathlib import Path


def threads() -> int:
    """The threads of this process: the kernel's count (torch's OpenMP workers included), else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def start_method() -> str:
    """fork when this process runs one thread, else forkserver (spawn where there is no fork server); fork, with
    a warning, from a script that a fresh worker cannot import without running it again."""
    methods = multiprocessing.get_all_start_methods()
    running = threads()
    if "fork" in methods and running == 1:
        return "fork"
    if "fork" in methods and not main_importable():
        warnings.warn(f"this process runs {running} threads, so its worker processes should start from a fork server, "
                      f"but then each would run the script {sys.modules['__main__'].__file__} again: it has no "
                      "`if __name__ == \"__main__\":` guard. Forking instead; put the script's code under that guard "
                      "to start them safely", RuntimeWarning, stacklevel=3)
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def main_importable() -> bool:
    """Whether a fresh worker can import this program's main module without running it: a session or
    `python -c` (no file), a module run with -m (imported by name), or a script that names `__main__` (the
    guard that keeps its code from running on import)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or getattr(main, "__spec__", None) is not None or path is None:
        return True
    try:
        return "__main__" in Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True


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
