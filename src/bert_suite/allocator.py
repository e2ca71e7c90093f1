"""glibc's allocator, set for training on a CPU.

Each training step frees its activations and allocates them again. glibc serves blocks above its mmap
threshold (128 KiB, raised dynamically up to 32 MiB) with fresh mmap calls and returns freed memory above
the trim threshold to the kernel, so every step pays page faults and zero-filling for the same memory
again: 15 to 25% of a CPU training step (benchmarks/RESULTS.md, issue 44). Keeping the memory instead
(blocks up to 32 MiB from the heap, no trimming, a large top pad) lets the allocator reuse it. glibc reads
the same settings from MALLOC_MMAP_THRESHOLD_ and friends at start-up; mallopt sets them from inside.

`tune()` is called when training or fine-tuning starts on a CPU (recipes/pretrain.py, the runner);
BERT_SUITE_ALLOCATOR=default keeps glibc's defaults. Elsewhere (musl, macOS, Windows) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ENV = "BERT_SUITE_ALLOCATOR"  # "default": leave glibc's settings alone
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # <malloc.h>
SETTINGS = {  # what measured best (issue 44); 32 MiB is the largest mmap threshold glibc takes on 64-bit
    "M_MMAP_THRESHOLD": (M_MMAP_THRESHOLD, 32 << 20),
    "M_TRIM_THRESHOLD": (M_TRIM_THRESHOLD, 2**31 - 1),  # mallopt takes an int: 2 GiB, in effect never
    "M_TOP_PAD": (M_TOP_PAD, 512 << 20),
}
_done: dict | None = None


def tune() -> dict:
    """Set SETTINGS with mallopt (once per process) unless BERT_SUITE_ALLOCATOR=default; returns what was done,
    for run records: {"allocator": "glibc tuned" | "default" | "not glibc", ...}."""
    global _done
    if _done is not None:
        return _done
    if os.environ.get(ENV, "").lower() == "default":
        _done = {"allocator": "default", "reason": f"{ENV}=default"}
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        gnu = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        _done = {"allocator": "not glibc", "reason": "no mallopt to call"}
        return _done
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    gnu.restype = ctypes.c_char_p
    failed = [name for name, (option, value) in SETTINGS.items() if mallopt(option, value) != 1]
    _done = {"allocator": "glibc tuned" if not failed else "glibc partly tuned",
             "glibc": gnu().decode(), **{name: value for name, (_, value) in SETTINGS.items() if name not in failed}}
    return _done
