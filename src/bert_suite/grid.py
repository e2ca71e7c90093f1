"""The paper's exhaustive fine-tuning grid (learning rate x batch size x epochs) with random
restarts (seeds), recorded in an Optuna study so that it is resumable and shareable.

Every trial is recorded in the study (SQLite in the output folder by default, or any database
URL: several `bert-suite grid` processes pointed at one database share the grid). Rerunning the
same command skips finished trials; a trial killed mid-run is picked up again after the
unvisited ones. Data are tokenised once for the whole grid.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
from pathlib import Path

import optuna
from optuna.samplers import GridSampler
from optuna.trial import TrialState
from tqdm.auto import tqdm

from .cards import TaskCard
from .report import atomic_write_text, select_best, write_grid_report
from .runner import RunError, prepare, selection_key, train_and_evaluate, training_arguments, write_manifest

AXES = ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed")
PRESETS = {
    # Appendix A.3: works well across tasks.
    "paper": {"learning_rate": [5e-5, 3e-5, 2e-5], "per_device_train_batch_size": [16, 32],
              "num_train_epochs": [2, 3, 4]},
    # Section 4.1: the GLUE experiments (batch 32, 3 epochs, lr chosen on dev).
    "paper-glue": {"learning_rate": [5e-5, 4e-5, 3e-5, 2e-5], "per_device_train_batch_size": [32],
                   "num_train_epochs": [3]},
}


class _GridSampler(GridSampler):
    """GridSampler that leaves stopping to our loop: its own `study.stop()` only works inside
    `study.optimize`, and we drive trials with ask/tell to record failures with their reasons."""

    def after_trial(self, study, trial, state, values):
        pass


def search_space(card: TaskCard, preset: str | None = None, **axes) -> dict[str, list]:
    """Grid axes: explicit values win, then the preset, then the card's grid, then the paper's."""
    base = dict(PRESETS["paper"])
    base.update(card.grid)
    if preset:
        if preset not in PRESETS:
            raise RunError(f"unknown grid preset {preset!r}; choose one of {', '.join(PRESETS)}")
        base.update(PRESETS[preset])
    base.setdefault("seed", [42])
    for axis, values in axes.items():
        if values is not None:
            base[axis] = list(values)
    for axis in AXES:
        values = base.get(axis)
        if not values:
            raise RunError(f"grid axis {axis} is empty; give at least one value")
        if axis != "seed" and any(float(v) <= 0 for v in values):
            raise RunError(f"grid axis {axis} must be positive, got {values}")
        if len(set(values)) != len(values):
            raise RunError(f"grid axis {axis} repeats a value: {values}")
    return {axis: base[axis] for axis in AXES}


def study_name(card: TaskCard, space: dict[str, list]) -> str:
    """One study per (task, grid): Optuna cannot change a parameter's value set inside a study, so
    a changed grid (another learning rate, more seeds) or changed card options in the same folder
    or database is its own study; rerunning the same grid finds its study and skips what is done."""
    key = {k: sorted(map(float, v)) for k, v in space.items()}
    if card.options:  # e.g. NER's context or SQuAD's doc_stride: other data, so another study
        key["options"] = card.options
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()
    return f"{card.name}-grid-{digest[:10]}"


def _point(params: dict) -> tuple:
    return tuple(params[a] for a in AXES)


def trial_records(study: optuna.Study) -> list[dict]:
    """One record per grid point: its latest finished trial (complete or failed)."""
    latest: dict[tuple, optuna.trial.FrozenTrial] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if set(AXES) <= set(t.params) and "skipped" not in t.user_attrs:
            latest[_point(t.params)] = t
    records = []
    for t in sorted(latest.values(), key=lambda t: t.number):
        records.append({
            "trial": t.number, **{a: t.params[a] for a in AXES},
            "state": "complete" if t.state == TrialState.COMPLETE else "failed",
            "error": t.user_attrs.get("error"),
            "metrics": t.user_attrs.get("metrics", {}),
            "history": t.user_attrs.get("history", []),
            "train_runtime": t.user_attrs.get("train_runtime"),
        })
    return records


def run_grid(card: TaskCard, model: str, output_dir: str, data_dir: str | None = None, tokenizer: str | None = None,
             max_seq_length: int | None = None, space: dict[str, list] | None = None, storage: str | None = None,
             keep_all: bool = False, overrides: dict | None = None) -> dict:
    """Run every grid point not yet finished; keep the best checkpoint in output_dir/best; write
    the report. Returns {"best": record or None, "records": [...], "files": {...}}."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    space = space or search_space(card)
    storage = storage or f"sqlite:///{(out / 'grid.db').resolve()}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name(card, space), storage=storage, load_if_exists=True,
                                direction="maximize", sampler=_GridSampler(space, seed=0))
    points = set(itertools.product(*space.values()))
    metric = selection_key(card)
    prepared = None
    bar = tqdm(total=len(points), desc=f"grid {card.name}", unit="trial")
    while True:
        done = {_point(r) for r in trial_records(study) if _point(r) in points}
        bar.n = len(done)
        bar.refresh()
        if len(done) >= len(points):
            break
        prepared = prepared or prepare(card, model, data_dir, tokenizer, max_seq_length)
        trial = study.ask()
        params = {axis: trial.suggest_categorical(axis, values) for axis, values in space.items()}
        if _point(params) in done:  # another worker finished this point meanwhile
            trial.set_user_attr("skipped", True)
            study.tell(trial, state=TrialState.PRUNED)
            continue
        trial_dir = out / "trials" / f"trial-{trial.number:03d}"
        try:
            args = training_arguments(card, str(trial_dir), {**(overrides or {}), **params})
            result = train_and_evaluate(prepared, model, args, save_to=trial_dir / "checkpoint")
            value = result["metrics"].get(metric)
            loss = result["metrics"].get("train_loss")
            if value is None or not math.isfinite(value) or (loss is not None and not math.isfinite(loss)):
                raise FloatingPointError(f"non-finite result: {metric}={value}, train_loss={loss}")
        except Exception as err:  # a failed trial is recorded with its reason; the grid goes on
            trial.set_user_attr("error", f"{type(err).__name__}: {str(err)[:500]}")
            study.tell(trial, state=TrialState.FAIL)
            shutil.rmtree(trial_dir / "checkpoint", ignore_errors=True)
            tqdm.write(f"[grid] trial {trial.number} {params} failed: {type(err).__name__}: {err}")
            continue
        result["metrics"] = {k: v for k, v in result["metrics"].items() if k in (metric, "train_loss")
                             or (k.startswith("eval_") and not k.endswith(("runtime", "_per_second", "samples")))}
        for key in ("metrics", "history", "train_runtime"):
            trial.set_user_attr(key, json.loads(json.dumps(result[key], default=float)))
        study.tell(trial, value)
        _keep_if_best(study, trial.number, trial_dir, out, keep_all)
        write_manifest(out / "run_manifest.json", prepared, model, data_dir, args,
                       {"grid": space, "study_storage": storage.split("///")[0] + "///...", "selection": metric})
    bar.close()
    records = trial_records(study)
    files = write_grid_report(records, metric, out, task=card.name, paper=card.paper or None)
    best = select_best(records, metric)
    if best is not None:
        atomic_write_text(out / "best_trial.json", json.dumps(best, indent=2, default=float))
    return {"best": best, "records": records, "files": files}


def _keep_if_best(study: optuna.Study, number: int, trial_dir: Path, out: Path, keep_all: bool) -> None:
    """Move (or copy, with keep_all) the trial's checkpoint to out/best when it is the best so far."""
    checkpoint = trial_dir / "checkpoint"
    best = study.best_trial
    if best.number == number:
        staging = out / "best.incoming"
        shutil.rmtree(staging, ignore_errors=True)
        (shutil.copytree if keep_all else shutil.move)(str(checkpoint), str(staging))
        atomic_write_text(staging / "best_trial.json", json.dumps({"trial": number, **best.params}, default=float))
        shutil.rmtree(out / "best", ignore_errors=True)
        staging.rename(out / "best")
    elif not keep_all:
        shutil.rmtree(checkpoint, ignore_errors=True)
