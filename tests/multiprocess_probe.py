"""Run the pre-training recipe or the CLI in one process of a launched group, and record what it
saw and wrote, for tests/test_multiprocess.py:

    accelerate launch --multi_gpu --num_processes 2 tests/multiprocess_probe.py recipe|cli ARGS...

PROBE_DIR/rank<R>.json gets this process's batches (pre-training: the example indices of each
micro-batch; fine-tuning: each example of each step as its token ids) and every file it wrote
under the run's output folder. Writes are seen through Python's audit hook (open for writing,
rename, replace) and through torch.save / safetensors, which open their files in native code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RANK = int(os.environ.get("RANK", "0"))
written: list[str] = []
batches: list = []


def _record(path) -> None:
    try:
        written.append(str(Path(os.fsdecode(path)).resolve()))
    except (TypeError, ValueError):
        pass


def _audit(event: str, args) -> None:
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        if (mode and any(c in mode for c in "wax+")) or (mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
            _record(args[0])
    elif event in ("os.rename", "os.replace"):
        _record(args[1])


def _watch_native_writers() -> None:
    import accelerate.utils.other
    import safetensors.torch
    import torch
    import transformers.modeling_utils

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            _record(f)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save
    for module in (safetensors.torch, accelerate.utils.other, transformers.modeling_utils):
        for name in ("save_file", "safe_save_file"):
            real = getattr(module, name, None)
            if real is not None:
                def wrapped(tensors, filename, *args, _real=real, **kwargs):
                    _record(filename)
                    return _real(tensors, filename, *args, **kwargs)
                setattr(module, name, wrapped)


def record_step_batches(recipe, into: list) -> None:
    """The recipe's sampler appends each micro-batch's example indices to `into`."""
    real_iter = recipe.StepBatches.__iter__

    def recorded(self):
        for micro, indices in real_iter(self):
            into.append(indices)
            yield micro, indices

    recipe.StepBatches.__iter__ = recorded


def record_training_batches(into: list):
    """SuiteTrainer appends each training step's examples (token ids without padding) to `into`; returns
    the original training_step, to put back."""
    from bert_suite import runner

    real_step = runner.SuiteTrainer.training_step

    def recorded(self, model, inputs, *args, **kwargs):
        lengths = inputs["attention_mask"].sum(1).tolist()
        into.append([row[:n] for row, n in zip(inputs["input_ids"].tolist(), lengths, strict=True)])
        return real_step(self, model, inputs, *args, **kwargs)

    runner.SuiteTrainer.training_step = recorded
    return real_step


def run_recipe(argv: list[str]) -> None:
    spec = importlib.util.spec_from_file_location("pretrain_recipe", REPO / "recipes" / "pretrain.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    record_step_batches(recipe, batches)
    recipe.main(argv)


def run_cli(argv: list[str]) -> None:
    from bert_suite.cli import main

    record_training_batches(batches)
    if main(argv) != 0:
        raise SystemExit(1)


if __name__ == "__main__":
    what, argv = sys.argv[1], sys.argv[2:]
    _watch_native_writers()
    sys.addaudithook(_audit)
    (run_recipe if what == "recipe" else run_cli)(argv)
    probe = Path(os.environ["PROBE_DIR"])
    probe.mkdir(parents=True, exist_ok=True)
    from accelerate.state import PartialState  # the group accelerate formed, not what the launcher asked for

    (probe / f"rank{RANK}.json").write_text(json.dumps({"batches": batches, "written": sorted(set(written)),
                                                        "world_size": PartialState().num_processes}))
