"""`bert-suite ablation STUDY.yaml --output_dir OUT --status`: where a study stands, read from its folder alone
(nothing is built, trained or written, so it is safe beside the processes that run the study): each
pre-training's state and step, the time the unfinished ones still need at the paces measured so far, and the
fine-tuning grids done and under way."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .finetune import checkpoints_of, tagger_settings
from .locks import held_elsewhere, holder, variant_lock_path
from .stages import Progress, finished_steps, measured_pace, minutes_of, resume_step, run_starts, seconds_left
from .study import AblationError, Study, load_study


def study_status(path: str | Path, output_dir: str | Path) -> dict:
    """{title, output_dir, steps, runs: [{run, variant, seed, state, step, ...}], pretraining_seconds_left,
    grids: {compare: {...}, curve: {...}}, record}. A run's state is "done", "training" (another process holds
    its lock: `by` names it), "stopped" (it has steps of its own, no process on it) or "not started" (with
    `starts_from` where its first steps are another run's)."""
    study = load_study(path)
    out = Path(output_dir).resolve()
    if not (out / "stages").is_dir():
        raise AblationError(f"--output_dir {output_dir}: no study there yet (no stages/ folder); expected the folder "
                            f"a `bert-suite ablation {path} --output_dir ...` run writes")
    steps = planned_steps(study, out)
    every = {run.name: run for run in study.runs()}
    paths = {name: out / "pretraining" / name for name in every}
    starts = run_starts(study, steps) if steps else {}
    runs, left, recent = [], [], {}
    for name, run in every.items():
        folder, lock = paths[name], variant_lock_path(out, name)
        entry: dict = {"run": name, "variant": run.variant, "seed": run.seed}
        done = finished_steps(folder)
        if done is not None:
            entry.update(state="done", step=done, minutes=round(minutes_of(folder), 1))
        else:
            checkpoint = resume_step(folder, 0)
            step = max(checkpoint, last_logged_step(folder))
            training = held_elsewhere(lock)
            entry.update(state="training" if training else "stopped" if step else "not started", step=step,
                         checkpoint=checkpoint)
            if training:
                entry["by"] = holder(lock)
                launch = current_launch(folder, out / "logs" / f"pretraining-{name}.log")
                if launch is not None:
                    entry["steps_per_minute"] = round(launch[1] / launch[0] * 60, 1)
                    recent[run.variant] = list(launch)
            if name in starts and not checkpoint:
                entry["starts_from"] = {"run": starts[name][0], "step": starts[name][1]}
            if steps:
                left.append((run.variant, steps - resume_step(folder, starts.get(name, ("", 0))[1])))
        runs.append(entry)
    pace = {**measured_pace(every, paths), **recent}  # a run under way: today's pace, the machine as busy as now
    return {"title": study.title, "output_dir": str(out), "steps": steps, "runs": runs,
            "pretraining_seconds_left": (seconds_left(left, pace) if left else 0.0) if steps else None,
            "pace": {variant: {"seconds_per_step": round(seconds / count, 3),
                               "from": "the run under way" if variant in recent else "the finished runs"}
                     for variant, (seconds, count) in pace.items() if count > 0},
            "grids": grid_status(study, out, steps, starts), "record": (out / "ablation.json").is_file()}


def planned_steps(study: Study, out: Path) -> int | None:
    """pretraining.steps, or the steps a `minutes` study planned (its runs' stage records hold them); None before
    it planned them."""
    if study.pretraining.steps is not None:
        return study.pretraining.steps
    for record in sorted((out / "stages").glob("pretraining-*.json")):
        try:
            return int(json.loads(record.read_text())["settings"]["recipe"]["max_steps"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def last_logged_step(run: Path) -> int:
    """The step of the run's last metrics line (0 without one): where a run is, between its checkpoints."""
    try:
        with open(run / "metrics.jsonl", "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - 4096))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return 0


def current_launch(run: Path, log: Path) -> tuple[float, int] | None:
    """(seconds, steps) of the run's launch under way: the seconds its timing.json entry holds so far and the
    steps it has logged since the step it resumed (or started) from, which its log's lines name; None before it
    logged a step, or when the last launch finished."""
    try:
        launch = json.loads((run / "timing.json").read_text())[-1]
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - (8 << 20)))
            text = handle.read().decode("utf-8", "replace")
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None
    text = text[text.rfind("\n$ ") + 1:] if "\n$ " in text else text
    first = re.search(r"^(?:resumed|started) from .* at step (\d+)", text, re.MULTILINE)
    steps = last_logged_step(run) - (int(first.group(1)) if first else 0)
    if "finished" in launch or steps <= 0 or not launch.get("seconds"):
        return None
    return float(launch["seconds"]), steps


def grid_status(study: Study, out: Path, steps: int | None, starts: dict[str, tuple[str, int]]) -> dict:
    """The fine-tuning grids the study runs, as folders: compare's (each task x checkpoint) and the curve's (each
    snapshot x curve task; the last step is compare's grid where the task is one of compare's, and a snapshot
    copied from a curve variant's run, a biphasic run's first steps, is that run's grid), and the feature route's
    taggers of each checkpoint on an NER task (`features`, where the study has one). Per kind: how many are done
    (best_trial.json written; every tagger trained), under way (trials finished, or a study started), and the
    trials (taggers) finished."""
    tuned = [t.key for t in study.tasks if not t.feature_based]
    labels = [label for label, *_ in checkpoints_of(study)]
    variant_of = {run.name: run.variant for run in study.runs()}
    order = study.curve_variants
    copies = set()  # (run, step): a snapshot that is another curve run's, whose grid the first in the file's order has
    for name, (donor, switch) in starts.items():
        if variant_of[donor] in order and variant_of[name] in order:
            second = name if order.index(variant_of[name]) > order.index(variant_of[donor]) else donor
            for step in study.pretraining.checkpoints:
                if step <= switch and step != steps and same_snapshot(out, name, donor, step):
                    copies.add((second, step))
    shared = same_twins(study, out)
    folders = {"compare": [out / "compare" / key / label for key in tuned for label in labels if label not in shared],
               "curve": []}
    for name in order:
        for key in study.curve_tasks:
            for step in study.pretraining.checkpoints:
                if step == steps and key in tuned:
                    continue
                folders["curve"] += [out / "curve" / key / f"{run.name}@{step}" for run in study.runs([name])
                                     if (run.name, step) not in copies]
    found = {}
    for kind, grids in folders.items():
        done = sum((folder / "best_trial.json").is_file() for folder in grids)
        trials = {folder: len(list(folder.glob("trials/trial-*/all_results.json"))) for folder in grids}
        going = [f for f in grids if not (f / "best_trial.json").is_file() and (trials[f] or (f / "grid.db").is_file())]
        found[kind] = {"grids": len(grids), "done": done, "under_way": len(going), "trials": sum(trials.values())}
    featured = [t for t in study.tasks if t.feature_based]  # the feature route: a folder of taggers per checkpoint
    if featured:
        from ..cards import load_card

        taggers = {}
        for entry in featured:
            rates, epochs, _ = tagger_settings(entry)
            card = load_card(entry.key.partition("@")[0])
            for label in labels:
                taggers[out / "features" / card.name / label] = len(rates) * len(epochs) * len(study.compare.seeds)
        trained = {folder: len(list(folder.glob("tagger-*/all_results.json"))) for folder in taggers}
        found["features"] = {"grids": len(taggers), "done": sum(trained[f] >= n for f, n in taggers.items()),
                             "under_way": sum(0 < trained[f] < n for f, n in taggers.items()),
                             "trials": sum(trained.values())}
    return found


def same_twins(study: Study, out: Path) -> set[str]:
    """The random twins that take an earlier one's grids (compare's `same_models`: the same config and vocabulary
    files, the same draw), read from their source runs' final folders, baseline first; a twin whose run is not
    finished counts as its own."""
    from ..compare import RANDOM_TWIN_FILES

    seen, shared = set(), set()
    rows = sorted(checkpoints_of(study), key=lambda c: c[1] != study.compare.baseline)
    for label, name, run, position in rows:
        variant, final = study.variants[name], out / "pretraining" / run.name / "final"
        if not variant.random_init or not (final / "config.json").is_file():
            continue
        files = sorted(f for f in final.iterdir() if f.name in RANDOM_TWIN_FILES or f.suffix == ".model")
        key = (variant.bilstm, position, *((f.name, f.read_bytes()) for f in files))
        if key in seen:
            shared.add(label)
        seen.add(key)
    return shared


def same_snapshot(out: Path, name: str, donor: str, step: int) -> bool:
    """Whether run `name`'s snapshot at `step` is its donor's (a biphasic run started from the donor's checkpoint
    has copies of its snapshots): the same bytes where both are written, else what the start plans."""
    from .finetune import snapshot_digest

    digests = [snapshot_digest(out / "pretraining" / run / "snapshots" / f"step-{step}") for run in (name, donor)]
    return None in digests or digests[0] == digests[1]


def format_status(status: dict) -> str:
    """The status as the lines `--status` prints."""
    runs, steps = status["runs"], status["steps"]
    done = sum(r["state"] == "done" for r in runs)
    seconds = status["pretraining_seconds_left"]
    lines = [f"{status['title']}: {status['output_dir']}"]
    if steps is None:
        lines.append(f"pre-training: {done} of {len(runs)} runs done; steps not planned yet (pretraining.minutes: the "
                     "study plans them when it runs)")
    else:
        when = "" if done == len(runs) else "; " + (
            "the time left is estimated once a run has finished or is under way" if seconds is None else
            Progress.left(seconds).replace(" left", "") + " of pre-training left in all (runs side by side share it; "
            "at the pace of each variant's run under way, else of its finished runs)")
        lines.append(f"pre-training, {steps:,} steps a run: {done} of {len(runs)} runs done{when}")
    width = max(len(r["run"]) for r in runs)
    for r in runs:
        line = f"  {r['run']:<{width}}  {r['state']:<11}  {r['step']:>8,}"
        if r["state"] == "done":
            line += f"  {r['minutes']:,.1f} min"
        else:
            notes = [f"checkpoint {r['checkpoint']:,}"] if r["checkpoint"] else []
            if "starts_from" in r:
                notes.append(f"its first {r['starts_from']['step']:,} steps are {r['starts_from']['run']}'s")
            if "steps_per_minute" in r:
                rate = r["steps_per_minute"]
                notes.append(f"{rate:,.0f} steps a minute" if rate >= 10 else f"{rate:.1f} steps a minute")
            if "by" in r:
                notes.append(r["by"])
            line += "  " + "; ".join(notes) if notes else ""
        lines.append(line.rstrip())
    grids = status["grids"]
    parts = [f"{kind}: {g['done']} of {g['grids']} done" + (f", {g['under_way']} under way" if g["under_way"] else "")
             for kind, g in grids.items() if g["grids"]]
    trials = sum(g["trials"] for g in grids.values())
    lines.append(f"fine-tuning grids: {'; '.join(parts)} ({trials:,} trials finished)")
    lines.append("record: " + ("written (ablation.json)" if status["record"] else
                               "not yet (written when every grid is done)"))
    return "\n".join(lines)
