"""The processes a command starts, each in a process group of its own, so that stopping the command stops
all they started (data-loader workers included): grid workers (grid.run_workers) and a study's recipe and
helpers (ablation/launch.py). Standard library only, so that a command that only reads a folder (`bert-suite
ablation --status`) imports no torch."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

STOP_GRACE = 20  # seconds a stopped group has to exit on SIGTERM before SIGKILL


class Stopped(KeyboardInterrupt):
    """The process was sent SIGTERM or SIGHUP: it stops as on Ctrl-C, stopping what it started."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.code = 128 + signum


@contextlib.contextmanager
def stopping():
    """SIGTERM and SIGHUP (a closed terminal) raise Stopped in the main thread while the block runs, so its
    `finally`s run: the processes it started are stopped with their groups."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)

    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def start(cmd: list[str], log, env: dict, die_with_parent: bool = False) -> subprocess.Popen:
    """`cmd` in a process group of its own (in this session: a niced study's recipe stays niced, as a new
    session would start a scheduler group of its own), its output in the open file `log` (or a pipe:
    subprocess.PIPE). `die_with_parent`: the kernel sends it SIGTERM when this process dies, however it dies
    (Linux), so not even a SIGKILL of this process leaves it running."""
    preexec = None
    if die_with_parent and sys.platform.startswith("linux"):
        import ctypes

        prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # bound here: the child runs no import

        def preexec():
            prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the parent died before the line above: nobody would stop this one
                os.kill(os.getpid(), signal.SIGTERM)

    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0, preexec_fn=preexec)


def stop_group(child: subprocess.Popen, grace: float | None = None) -> None:
    """SIGTERM to the child's whole group, then wait for every process in it (SIGKILL after `grace` seconds)."""
    grace = STOP_GRACE if grace is None else grace
    group = child.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=grace)
    while group_alive(group):  # the leader's children (the recipe, its loader workers) outlive it by a moment
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
            deadline = float("inf")
        time.sleep(0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=5)


def group_alive(group: int) -> bool:
    """Whether any process of the process group is left."""
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
