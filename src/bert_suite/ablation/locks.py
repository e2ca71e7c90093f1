"""File locks of a study's folder: the data stages, and one per pre-trained variant, so that several processes
(`--variant` runs, a plain run beside them, machines sharing the folder) never build or train the same thing
at once. The lock is the kernel's (flock): it dies with its process, so a lock left by a dead process is simply
taken over; the file names the holder, for the line a waiting process prints."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

from .study import AblationError


@contextlib.contextmanager
def file_lock(path: Path, what: str, wait: bool = True):
    """Hold `path`'s lock while the block runs. Held by another process: print one line naming it and wait for
    it (`wait`), or refuse with that line."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            line = f"{what}: held by {holder(path)} ({path})"
            if not wait:
                raise AblationError(f"{line}; wait for it, or stop that process") from None
            print(f"[ablation] waiting for {line}", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle, fcntl.LOCK_UN)


def holder(path: Path) -> str:
    """"process PID on HOST since TIME", as the holder wrote it."""
    try:
        found = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        found = {}
    if not found:
        return "another process"
    return f"process {found.get('pid')} on {found.get('host')} since {found.get('since')}"


def held_elsewhere(path: Path) -> bool:
    """Whether another process holds `path`'s lock now (taken and let go at once when free)."""
    import fcntl

    if not path.is_file():
        return False
    with open(path, "rb") as handle:  # read only: flock needs no write access, and nothing is written
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def data_lock(out: Path):
    """The data stages (squad_small, corpus, vocabulary, instances, calibration), one process at a time."""
    return file_lock(out / ".data.lock", "the data stages")


def variant_lock_path(out: Path, name: str) -> Path:
    return out / "pretraining" / f".{name}.lock"


def variant_lock(out: Path, name: str):
    """A pre-trained variant's run: one process trains it, the others wait and then find it done."""
    return file_lock(variant_lock_path(out, name), f"the pre-training of {name}")


def task_lock(out: Path, key: str, name: str):
    """One variant's feature-based route on one task (not shared through a grid's study)."""
    return file_lock(out / "features" / f".{key.replace('/', '-')}-{name}.lock", f"the features of {name} on {key}")
