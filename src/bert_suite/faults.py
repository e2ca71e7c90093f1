"""Fault injection for the reliability tests (docs/RELIABILITY.md).

`failpoint(name)` marks a moment where a crash would be most harmful (between a trial's end and
its record, in the middle of swapping the best checkpoint, inside a checkpoint write). With
`BERT_SUITE_FAILPOINT=NAME[:N]` in the environment, the process kills itself with SIGKILL the
N-th time (default: the first) it reaches that point, which is what a power cut or the OOM killer
does: no `finally`, no `atexit`, no flush. `NAME:N:hang` stops there instead (the process sleeps until it
is killed): the moment a test stops it from outside. Unset, a failpoint costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter

ENV = "BERT_SUITE_FAILPOINT"
_hits: Counter = Counter()


def failpoint(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, rest = spec.partition(":")
    if target != name:
        return
    nth, _, action = rest.partition(":")
    _hits[name] += 1
    if _hits[name] == int(nth or 1):
        _hang(name) if action == "hang" else _fire(name)


def _hang(name: str) -> None:
    import time

    sys.stderr.write(f"[bert_suite] failpoint {name}: hanging until killed\n")
    sys.stderr.flush()
    while True:
        time.sleep(60)


def _fire(name: str) -> None:
    sys.stderr.write(f"[bert_suite] failpoint {name}: killing this process (SIGKILL)\n")
    sys.stderr.flush()
    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
