"""Plumbing every room uses: results files written atomically (a temporary file beside the target,
then a rename), so a reader or a crash never sees half a file."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO


def atomic_write_with(path: str | Path, write: Callable[[IO[bytes]], object]) -> Path:
    """Call `write` on a temp file next to `path`, then rename it onto `path` (e.g. a zip archive)."""
    path = Path(path)
    # Same folder, so os.replace is a rename on one file system: readers see old or new, never half.
    # os.open with 0o666 rather than mkstemp so the file gets the usual umask mode, not 0600.
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; returns the path."""
    return atomic_write_with(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return atomic_write_with(path, lambda f: f.write(data))


def save_figure(fig, path: Path) -> Path:
    """A matplotlib Figure as a PNG, written atomically (Agg: no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)  # Agg explicitly: no display needed, no pyplot global state touched
    return atomic_write_with(path, lambda f: fig.savefig(f, format="png", dpi=100))
