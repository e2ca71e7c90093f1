"""`bert-suite ablation STUDY.yaml`: a pre-training ablation as data, the protocol of the paper's Tables 5, 6
and 8 (Section 5): N pre-trainings that differ in one thing, then the same fine-tuning grid, seeds and label
subsets for every one of them, and each question the study asks as a paired difference.

The parts, one file each:

  study.py     the file read into dataclasses, every key checked before anything is written
  stages.py    the data stages (squad_small/, corpus/, vocabulary/, instances/LENGTH/, calibration/NAME/) and
               the pre-training of each variant (pretraining/NAME/), each recording its exact settings and
               inputs in stages/NAME.json and refusing a resume that differs
  locks.py     one process at a time on the data stages and on each variant
  launch.py    the processes a study starts (the recipe, the --workers helpers), in groups it stops with itself
  finetune.py  every variant through compare's grids (compare/), the curve (curve/TASK/NAME@STEP/), the
               feature-based route (features/)
  record.py    ablation.json, ablation.md, ablation.png
  status.py    `--status`: where a study stands, read from its folder

`run_ablation` below runs them in that order; a finished stage is skipped and an interrupted one resumed (the
recipe from its last checkpoint, a grid from its study).
"""

from __future__ import annotations

import time
from pathlib import Path

from .finetune import check_study_tasks, early_grids, fine_tune, fine_tuning_checkpoint
from .launch import TIMING_EVERY, helpers_running, launch_recipe, stopping
from .locks import data_lock
from .record import contrasts_of, pretraining_record, write_record
from .stages import (
    Progress,
    build_data,
    finished_steps,
    minutes_of,
    passed_over,
    plan_steps,
    pretrain,
    run_starts,
    task_data,
)
from .study import AblationError, Study, load_study

WAIT_POLL = 5  # seconds between looks at the locks of variants that other processes pre-train

__all__ = ["TIMING_EVERY", "AblationError", "Study", "contrasts_of", "fine_tuning_checkpoint", "launch_recipe",
           "load_study", "minutes_of", "pretraining_record", "run_ablation"]


def run_ablation(path: str | Path, output_dir: str | Path, until: str = "compare", only: list[str] | None = None,
                 workers: int = 1, storage: str | None = None, results_dir: str | Path | None = None,
                 worker: bool = False, command: str = "", seeds: list[int] | None = None) -> dict | None:
    """Run (or resume) the study in `output_dir`; returns the record (None when it stops before it). `only`,
    `seeds`: pre-train these variants (at these of their seeds) and stop. SIGTERM and SIGHUP stop it as Ctrl-C
    does, with everything it started."""
    study = load_study(path)
    for name in only or []:
        if name not in study.variants or study.variants[name].source is not None:
            raise AblationError(f"--variant {name}: not a pre-trained variant of {study.path}; expected one of "
                                f"{', '.join(study.pretrained)}")
    if seeds:
        only = only or study.pretrained
        for seed in seeds:
            if not any(seed in study.seeds_of(name) for name in only):
                raise AblationError(f"--pretraining_seeds {seed}: not a pre-training seed of {', '.join(only)} in "
                                    f"{study.path}; expected one of "
                                    f"{', '.join(map(str, dict.fromkeys(s for n in only for s in study.seeds_of(n))))}")
    if workers < 1:
        raise AblationError(f"--workers {workers}: expected at least 1")
    out = Path(output_dir).resolve()
    progress = Progress()
    with stopping():
        with data_lock(out):
            data_dirs = task_data(study, out, progress)
            # corpus, vocabulary, instances (a --variant run with given steps: its variants' alone)
            data = build_data(study, out, data_dirs, progress,
                              only if study.pretraining.steps is not None else None)
            check_study_tasks(study, data_dirs, data)
            steps = plan_steps(study, out, data, progress)
        runs = {run.name: out / "pretraining" / run.name for run in study.runs()}
        if worker:  # a --workers helper: the grids only (those ready, while others still pre-train)
            if all(finished_steps(run) == steps for run in runs.values()):
                fine_tune(study, out, runs, steps, data_dirs, storage, progress, worker=True)
            else:
                early_grids(study, out, runs, steps, data_dirs, storage, progress, worker=True)
            return None
        for key, why in study.left_out.items():
            progress.stage("compare", f"left out: {key} (optional: {why})")
        while held := pretrain(study, out, data, steps, only, progress, pass_held=not only and until == "compare",
                               seeds=seeds):
            # other processes pre-train these: fine-tune what is ready meanwhile, then wait for one of them
            with helpers_running(path, out, workers, storage):
                ran = early_grids(study, out, runs, steps, data_dirs, storage, progress)
            progress.stage("pretraining", f"waiting for {', '.join(held)}: pre-trained by another process, or starting "
                           "from the checkpoint of one" + (f" (the {ran} grids ready so far are done)" if ran else ""))
            starts = run_starts(study, steps)
            while all(passed_over(out, name, starts) for name in held):
                time.sleep(WAIT_POLL)
        if only:
            left = [n for n, run in runs.items() if finished_steps(run) is None]
            done = [r.name for r in study.runs(only, seeds)]
            progress.stage("pretraining", f"{', '.join(done)} done" + (
                f"; not yet pre-trained: {', '.join(left)}" if left else "; every run is pre-trained"))
            return None
        facts = pretraining_record(study, runs, data, steps)
        if until == "pretraining":
            return None
        with helpers_running(path, out, workers, storage):
            result, curve = fine_tune(study, out, runs, steps, data_dirs, storage, progress)
        contrasts, along = contrasts_of(study, result, curve)
        record = {**result, "pretraining": facts, "contrasts": contrasts, "curve": curve, "curve_contrasts": along,
                  "left_out": list(study.left_out), "ablation": study.raw, "command": command}
        write_record(record, study, out, data, Path(results_dir) if results_dir else None)
        progress.stage("record", f"done ({out / 'ablation.json'})")
        return record
