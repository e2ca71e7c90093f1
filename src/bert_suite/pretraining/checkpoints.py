"""Pre-training checkpoints that survive a crash at any moment, including during their own write.

A checkpoint is written into `step-N.incomplete`, marked by `progress.json` (the step and the
learning-rate schedule's state), then renamed to `step-N`: a rename is atomic, so `step-N` is
either absent or complete, and only complete ones are ever loaded. Nothing in a checkpoint is
unpickled: accelerate reads the model (safetensors), optimizer and RNG states with
`weights_only=True`, and the schedule's state is JSON (accelerate would read a registered
scheduler object with `weights_only=False`).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ..faults import failpoint
from ..io import atomic_write_text

PROGRESS = "progress.json"
_COMPLETE = re.compile(r"step-(\d+)")


def complete_checkpoints(folder: str | Path) -> list[Path]:
    """The complete checkpoints in `folder`, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(folder).glob("step-*")
             if (m := _COMPLETE.fullmatch(p.name)) and (p / PROGRESS).is_file()]
    return [p for _, p in sorted(found)]


def save_checkpoint(accelerator, folder: str | Path, step: int, scheduler, keep: int, kept: tuple = ()) -> Path:
    """accelerate `save_state` + the schedule, atomically as `folder/step-{step}`; keeps the
    newest `keep` checkpoints, and those of the steps in `kept`."""
    folder = Path(folder)
    target, staging = folder / f"step-{step}", folder / f"step-{step}.incomplete"
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    failpoint("pretrain.checkpoint_write")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        atomic_write_text(staging / PROGRESS, json.dumps({"step": step, "scheduler": scheduler.state_dict()},
                                                         default=_number))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        rotated = [p for p in complete_checkpoints(folder) if int(p.name.split("-")[1]) not in kept]
        for old in [*rotated[:-keep], *folder.glob("step-*.incomplete")]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return target


def _number(value):
    """A one-element tensor in the schedule's state as its number: a CUDA-graph step keeps the learning rate
    as a device tensor, which the scheduler fills in place (bert_suite/pretraining/step.py)."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
        return value.item()
    raise TypeError(f"{type(value).__name__} in the learning-rate schedule's state is not JSON")


def load_checkpoint(accelerator, path: str | Path, scheduler) -> int:
    """Restore a checkpoint written by `save_checkpoint`; returns its step."""
    path = Path(path)
    if not (path / PROGRESS).is_file():
        raise ValueError(f"{path}: not a complete checkpoint (no {PROGRESS}); checkpoints are the step-N folders "
                         "under OUTPUT_DIR/checkpoints")
    progress = json.loads((path / PROGRESS).read_text())
    accelerator.load_state(str(path))
    scheduler.load_state_dict(progress["scheduler"])
    return int(progress["step"])


def start_from_checkpoint(accelerator, path: str | Path, model, optimizer, scheduler) -> int:
    """Start a fresh run from another run's complete checkpoint (`save_checkpoint`'s): its weights by name,
    its optimizer state mapped onto this run's parameters by name, its schedule and random states; returns its
    step. This run may have parameters the other lacks (a left-to-right run has no NSP head): they keep their
    values, and the optimizer holds no state for them (none of them had a gradient in the other run's steps).
    Anything else that differs is an error naming it."""
    import random

    import numpy as np
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / PROGRESS).is_file():
        raise ValueError(f"start_from_checkpoint {path}: not a complete checkpoint (no {PROGRESS})")
    progress = json.loads((path / PROGRESS).read_text())
    unwrapped = accelerator.unwrap_model(model)
    weights = load_file(path / "model.safetensors", device=str(accelerator.device))
    named = dict(unwrapped.named_parameters())  # shared (tied) parameters once, under their first name
    absent = [n for n in named if n not in weights]
    unknown = [n for n in weights if n not in unwrapped.state_dict()]
    if unknown:
        raise ValueError(f"start_from_checkpoint {path}: {unknown[0]} is not a parameter of this model")
    unwrapped.load_state_dict(weights, strict=False)
    saved = torch.load(path / "optimizer.bin", map_location=accelerator.device, weights_only=False)
    groups = optimizer.param_groups
    if len(saved["param_groups"]) != len(groups):
        raise ValueError(f"start_from_checkpoint {path}: {len(saved['param_groups'])} parameter groups, this run has "
                         f"{len(groups)}")
    name_of = {id(p): n for n, p in named.items()}
    state, mapped_groups, index = {}, [], 0
    for number, (mine, theirs) in enumerate(zip(groups, saved["param_groups"], strict=True)):
        names = [name_of[id(p)] for p in mine["params"]]
        shared = [i for i, n in enumerate(names) if n not in absent]  # this group's parameters the other run had
        if len(shared) != len(theirs["params"]):
            raise ValueError(f"start_from_checkpoint {path}: parameter group {number} holds {len(theirs['params'])} "
                             f"parameters, this run's the same less {', '.join(n for n in names if n in absent)}: "
                             f"{len(shared)}")
        for i, old in zip(shared, theirs["params"], strict=True):
            if old in saved["state"]:
                state[index + i] = saved["state"][old]
        how = {k: mine[k] for k in ("fused", "foreach", "capturable", "differentiable") if k in mine}  # this device's
        mapped_groups.append({**theirs, **how, "params": list(range(index, index + len(names)))})
        index += len(names)
    optimizer.load_state_dict({"state": state, "param_groups": mapped_groups})
    scheduler.load_state_dict(progress["scheduler"])
    rng = torch.load(path / f"random_states_{accelerator.process_index}.pkl", weights_only=False)
    random.setstate(rng["random_state"])
    np.random.set_state(rng["numpy_random_seed"])
    torch.set_rng_state(rng["torch_manual_seed"])
    if torch.cuda.is_available() and "torch_cuda_manual_seed" in rng:
        torch.cuda.set_rng_state_all(rng["torch_cuda_manual_seed"])
    return int(progress["step"])


def load_initial_model(source: str, **config_overrides):
    """`init_from`: a checkpoint folder, or a Hub id (offline when the Hub cannot be reached, so a
    missing model fails at once, naming the local alternative); `config_overrides` (e.g. dropout)
    replace the checkpoint's config values."""
    from .. import BertSuiteForPreTraining

    if not Path(source).is_dir():
        from ..hub import offline_unless_reachable

        offline_unless_reachable()
    try:
        return BertSuiteForPreTraining.from_pretrained(source, **config_overrides)
    except OSError as err:
        raise ValueError(f"init_from {source!r}: cannot load a checkpoint ({str(err).splitlines()[0][:200]}); "
                         "offline, set init_from to a local checkpoint folder (save_pretrained output)") from None


def trim_log(path: str | Path, step: int) -> None:
    """Drop the lines of a JSON-lines log written after `step` (by a run that died after its last
    checkpoint), so that a resumed run's curve has each step once."""
    path = Path(path)
    if path.is_file():
        lines = path.read_text().splitlines()
        kept = [line for line in lines if (logged := _step(line)) is not None and logged <= step]
        if len(kept) != len(lines):
            atomic_write_text(path, "".join(f"{line}\n" for line in kept))


def _step(line: str) -> int | None:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return None  # a line torn by a crash mid-write
