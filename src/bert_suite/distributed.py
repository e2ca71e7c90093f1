"""Where this process stands in a launched group (torchrun, `accelerate launch`, mpirun), read from the
launcher's environment before accelerate starts, so the recipe and the runner can set accelerate up.

accelerate forms a process group on the CPU only when told to use the CPU: on a machine without a GPU,
`accelerate launch --multi_gpu --num_processes 2` or `torchrun` would otherwise start two unconnected
copies of the run, each of world size 1 and each writing the same files."""

from __future__ import annotations

import os

_WORLD = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")  # as accelerate reads them
_RANK = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_GROUPABLE = ("cuda", "xpu", "npu", "mlu", "musa", "hpu")  # accelerators accelerate runs multi-process on


def _first_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def launched_processes() -> int:
    """The number of processes the launcher started (1 when run directly)."""
    return _first_int(_WORLD, 1)


def is_main_process() -> bool:
    """True in a single process, and in the global rank 0 of a launched group: the one that writes."""
    return _first_int(_RANK, 0) == 0


def needs_cpu_group() -> bool:
    """Whether a launched group must be joined on the CPU (gloo): several processes, and no accelerator
    accelerate can run several processes on (none, or Apple MPS)."""
    import torch

    if launched_processes() <= 1:
        return False
    device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return device is None or device.type not in _GROUPABLE
