"""Processes a study starts: the pre-training recipe (`accelerate launch recipes/pretrain.py`, one run per
pre-trained variant, or a short calibration run) and the `--workers` helpers on the grids.

Each starts in its own process group, so that stopping the study stops everything it started: `stopping()` turns SIGTERM and SIGHUP into an exception like Ctrl-C's, and on the way out every group
still running gets SIGTERM, is waited for, and gets SIGKILL after STOP_GRACE seconds. A launch's time is
recorded while it runs and when it stops, however it stops."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..io import atomic_write_text

# the process-group helpers, shared with the grid (its --workers_per_gpu workers)
from ..processes import STOP_GRACE, Stopped, start, stop_group, stopping  # noqa: F401  (also this module's API)
from ..processes import group_alive as _alive
from .study import AblationError, Study

TIMING_EVERY = 30  # seconds between updates of a running pre-training's entry in timing.json
PAUSED_AFTER = 120  # seconds between two of those updates beyond which the launcher did not run (stopped with
# SIGSTOP, a suspended machine or VM): the time beyond one update's interval is not counted as the run's


def recipe_overrides(study: Study, name: str, data, output_dir: Path, steps: int, **replace) -> dict:
    """recipes/pretrain.py keys for one pre-trained variant: its data stages (stages.Data) and the study's
    steps, the shared recipe keys, the variant's own, then `replace`."""
    instances = study.data_of(name)[2]
    first, second = instances.max_seq_length, instances.phase2_length
    values = {"train_data": data.instances[first], "tokenizer": data.vocab, "output_dir": output_dir, "max_steps": steps,
              "report_to": "none", "resume_from_checkpoint": "auto", "phase1_fraction": 1.0,
              "logging_steps": max(1, min(50, steps // 20)), "eval_steps": max(1, steps // 10),
              # a checkpoint every 2.5% of the run (every 100 steps or 10% at least): a killed one loses little
              "save_steps": max(1, steps // 40, min(100, steps // 10))}
    if second:
        values.update(train_data_phase2=data.instances[second], phase1_fraction=1 - instances.phase2_fraction)
    if study.pretraining.warmup_fraction is not None:
        values["warmup_steps"] = round(study.pretraining.warmup_fraction * steps)
    if study.pretraining.checkpoints and name in study.curve_variants:
        values["snapshot_steps"] = ",".join(str(s) for s in study.pretraining.checkpoints if s < steps) or "[]"
    values.update({**study.recipe_of(name), **replace})
    values.setdefault("warmup_steps", min(steps, 10_000))  # the recipe's 10,000 would outlast a short run
    return values


def config_value(overrides: dict, key: str):
    """A recipe key's value as the recipe reads it (the preset's default when the overrides leave it out)."""
    from ..pretraining.config import load_pretrain_config

    return getattr(load_pretrain_config(None, [f"{k}={v}" for k, v in overrides.items()]), key)


def launch_recipe(overrides: dict, log: Path, timing: Path | None = None, first_step: int | None = None) -> float:
    """`accelerate launch recipes/pretrain.py KEY=VALUE...` with its output in `log`; returns its seconds. A
    failure is an error naming the log, after its last lines. `timing` (a list of {seconds, started, finished,
    from_step: `first_step`, the step it resumes from}) gets this launch's entry at once and its seconds every TIMING_EVERY while it runs, so a run killed with its
    caller (the end of a session) still counts the time it spent; a launch stopped with the study says so. Time
    in which this process did not run (more than PAUSED_AFTER between two updates: SIGSTOP, a suspended machine)
    is left out of its seconds and named in the entry's `paused_seconds`."""
    recipe = Path(__file__).resolve().parents[3] / "recipes" / "pretrain.py"
    if not recipe.is_file():
        raise AblationError(f"{recipe}: the pre-training recipe is not here; run from a clone of the repository "
                            "(pip install -e .)")
    config = os.environ.get("BERT_SUITE_ACCELERATE_CONFIG") or str(recipe.parent / "configs" / "accelerate" / (
        "gpu.yaml" if _cuda() else "cpu.yaml"))
    # the interpreter's own module, not a script beside it (a `pip install --user` or a Python whose packages are on
    # its path has none there)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, str(recipe),
           *(f"{k}={v}" for k, v in overrides.items())]
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    started = time.time()
    clock = {"last": started, "paused": 0.0}  # the last update, and the seconds the launcher did not run
    earlier = json.loads(timing.read_text()) if timing is not None and timing.is_file() else []
    entry = {"seconds": 0.0, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
             **({"from_step": first_step} if first_step is not None else {})}  # where it resumes (its pace: --status)

    def running_seconds() -> float:
        now = time.time()
        if now - clock["last"] > max(PAUSED_AFTER, 3 * TIMING_EVERY):  # stopped with the run: not the run's time
            clock["paused"] += now - clock["last"] - TIMING_EVERY
        clock["last"] = now
        return now - started - clock["paused"]

    def record(done: bool, stopped: bool = False) -> None:
        seconds = running_seconds()
        if timing is not None:
            entry["seconds"] = seconds
            if clock["paused"]:
                entry["paused_seconds"] = round(clock["paused"], 1)
            if done:
                entry["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            if stopped:
                entry["stopped"] = True
            timing.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(timing, json.dumps([*earlier, entry], indent=2))

    with open(log, "a") as handle:
        handle.write(("\n" if _torn(log) else "") + f"$ {shlex.join(cmd)}\n")  # after a killed run's last line
        handle.flush()
        child = start(cmd, handle, env)
        stopped = False
        try:
            while child.poll() is None:
                record(False)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=TIMING_EVERY)
            code = child.returncode
        finally:
            if child.poll() is None or _alive(child.pid):  # this process is being stopped: so is its recipe
                stopped = True
                print(f"[ablation] stopping the pre-training (process group {child.pid})", file=sys.stderr, flush=True)
                stop_group(child)
            record(True, stopped)
    if code:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise AblationError(f"pre-training failed (exit {code}); see {log}")
    return running_seconds()


def _torn(log: Path) -> bool:
    """Whether the log ends inside a line (a run killed in the middle of a progress bar's)."""
    with open(log, "rb") as handle:
        if handle.seek(0, os.SEEK_END) == 0:
            return False
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) != b"\n"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def start_helpers(path, out: Path, workers: int, storage: str | None) -> list[subprocess.Popen]:
    """workers - 1 helper processes on the same grids, each with its share of the cores (this process keeps
    one share): tiny models use one core better than two, so two workers of one thread finish sooner."""
    if workers == 1:
        return []
    import torch

    threads = max(1, (os.cpu_count() or 2) // workers)
    torch.set_num_threads(threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "bert_suite", "ablation", str(path), "--output_dir", str(out), "--worker",
           *(["--storage", storage] if storage else [])]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    helpers = []
    for k in range(1, workers):
        with open(out / "logs" / f"compare-w{k}.log", "a") as log:
            helpers.append(start(cmd, log, env))
    return helpers


@contextlib.contextmanager
def helpers_running(path, out: Path, workers: int, storage: str | None):
    """The --workers helpers while the block runs: waited for when it ends, stopped with their groups when it
    fails or the study is stopped. A helper that failed is an error naming its log."""
    helpers = start_helpers(path, out, workers, storage)
    try:
        yield helpers
    except BaseException:
        for helper in helpers:
            stop_group(helper)
        raise
    codes = [h.wait() for h in helpers]
    if any(codes):
        raise AblationError(f"a --workers helper failed (exit codes {codes}); see {out / 'logs'}/compare-w*.log")
