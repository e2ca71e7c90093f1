"""`bert-suite ablation STUDY.yaml --output_dir OUT --status`: where a study stands, read from its folder alone
(nothing is built, trained or written, so it is safe beside the processes that run the study): each
pre-training's state and step, the time the unfinished ones still need at the paces measured so far, and the
fine-tuning grids done and under way."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

from .finetune import checkpoints_of, fine_tuning_config, tagger_settings
from .locks import holder, variant_lock_path
from .stages import (
    Progress,
    donor_checkpoint,
    finished_steps,
    measured_pace,
    minutes_of,
    missing_snapshots,
    resume_step,
    run_starts,
    seconds_left,
)
from .study import AblationError, Study, load_study


def study_status(path: str | Path, output_dir: str | Path) -> dict:
    """{title, output_dir, steps, runs: [{run, variant, seed, state, step, ...}], pretraining_seconds_left, pace,
    grids: {compare: {...}, curve: {...}[, features: {...}]}, left_out, record}. A run's state is "done",
    "training" (a live process holds its lock: `by` names it), "stopped" (it has steps, no process on it) or "not
    started" (with `starts_from` where its first steps will be another run's). A folder made by another study
    file (other runs, steps or seeds) is an error."""
    study = load_study(path, run_checks=False)  # no torch: a study's state in a moment
    out = Path(output_dir).resolve()
    if not (out / "stages").is_dir():
        raise AblationError(f"--output_dir {output_dir}: no study there yet (no stages/ folder); expected the folder "
                            f"a `bert-suite ablation {path} --output_dir ...` run writes")
    steps = planned_steps(study, out)
    every = {run.name: run for run in study.runs()}
    paths = {name: out / "pretraining" / name for name in every}
    others = check_folder(study, out, steps, every)
    starts = expected_starts(study, out, steps, paths) if steps else {}
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
            by = lock_holder(lock, folder)
            entry.update(state="training" if by else "stopped" if step else "not started", step=step,
                         checkpoint=checkpoint)
            if by:
                entry["by"] = by
                launch = current_launch(folder, out / "logs" / f"pretraining-{name}.log")
                if launch is not None:
                    entry["steps_per_minute"] = round(launch[1] / launch[0] * 60, 1)
                    total = recent.setdefault(run.variant, [0.0, 0])  # two runs of a variant side by side: both
                    total[0], total[1] = total[0] + launch[0], total[1] + launch[1]
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
            "grids": grid_status(grid_folders(study, out, steps, starts), study), "left_out": list(study.left_out),
            "other_runs": others,
            "record": (out / "ablation.json").is_file()}


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


PACE_AFTER = 120  # seconds a launch runs before its own pace is taken (it loads, resumes, then trains)
LOG_TAIL = 8 << 20  # bytes of a recipe's log read for the step a launch began at (an older timing entry)


def current_launch(run: Path, log: Path) -> tuple[float, int] | None:
    """(seconds, steps) of the run's launch under way: its timing.json entry's seconds brought up to now (the
    launcher rewrites it every TIMING_EVERY), and the steps logged since the step it began at: the entry's
    `from_step`, else the "resumed from" / "started from ... at step N" line of its log, else (past PACE_AFTER
    with neither) step 0. None in its first PACE_AFTER seconds, before it logged a step, when its log no longer
    holds its start within LOG_TAIL, or when the last launch finished."""
    try:
        timing = run / "timing.json"
        launch = json.loads(timing.read_text())[-1]
        seconds = float(launch["seconds"]) + max(0.0, time.time() - timing.stat().st_mtime)
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None
    if "finished" in launch or seconds < PACE_AFTER:
        return None
    first = launch.get("from_step")
    if first is None:
        try:
            with open(log, "rb") as handle:
                handle.seek(0, 2)
                start = max(0, handle.tell() - LOG_TAIL)
                handle.seek(start)
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return None
        header = text.rfind("\n$ ") + 1 if "\n$ " in text else (0 if start == 0 and text.startswith("$ ") else -1)
        if header < 0:
            return None  # the launch's first lines are further back than the tail read
        found = re.search(r"^(?:resumed|started) from .* at step (\d+)", text[header:], re.MULTILINE)
        first = int(found.group(1)) if found else 0
    steps = last_logged_step(run) - int(first)
    return (seconds, steps) if steps > 0 else None


def lock_holder(path: Path, run: Path) -> str | None:
    """Who trains the run, from its lock's holder line (written when taken, emptied when let go), never taking the
    lock (a study deciding whether to pass a run over must not see it held by this reader): a process on this
    machine while it lives; one on another machine while the run's timing.json is kept fresh (its launcher rewrites
    it every TIMING_EVERY seconds)."""
    from .launch import TIMING_EVERY

    try:
        found = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        found = {}
    if not found:
        return None
    if found.get("host") == socket.gethostname():
        try:
            os.kill(int(found["pid"]), 0)
        except ProcessLookupError:
            return None  # killed without letting go: the kernel's lock went with it
        except (PermissionError, KeyError, TypeError, ValueError):
            pass
        return holder(path)
    try:
        launch = json.loads((run / "timing.json").read_text())[-1]
        fresh = time.time() - (run / "timing.json").stat().st_mtime < 3 * TIMING_EVERY
    except (OSError, ValueError, IndexError, TypeError):
        return None
    return holder(path) if fresh and "finished" not in launch else None


def check_folder(study: Study, out: Path, steps: int | None, every: dict) -> list[str]:
    """The folder is this study's: each of its runs' stage records names the study's steps and the run's seed, a
    finished run has those steps, and some record is of one of its runs where there are records (another study
    file, or this one changed in a way its runs would refuse). Returns the runs recorded here that the study does
    not have (a variant or seed since left out of the file: the study leaves them be)."""
    records, others = {}, []
    for record in sorted((out / "stages").glob("pretraining-*.json")):
        name = record.stem.removeprefix("pretraining-")
        try:
            records[name] = json.loads(record.read_text())["settings"]["recipe"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if name not in every:
            others.append(name)
            continue
        wanted = {"max_steps": steps, "seed": every[name].seed}
        differ = [f"{k} {records[name].get(k)} (the study: {v})" for k, v in wanted.items()
                  if v is not None and k in records[name] and records[name][k] != v]
        if differ:
            raise AblationError(f"--output_dir {out}: {record.name}: {', '.join(differ)}; expected the folder this "
                                f"study file made ({study.path})")
    if records and len(others) == len(records):
        raise AblationError(f"--output_dir {out}: its runs ({', '.join(others)}) are none of this study's "
                            f"({', '.join(every)}); expected the folder this study file made ({study.path})")
    for name in every:
        done = finished_steps(out / "pretraining" / name)
        if steps is not None and done is not None and done != steps:
            raise AblationError(f"--output_dir {out}: pretraining/{name} is a finished run of {done:,} steps, not "
                                f"the study's {steps:,}; expected the folder this study file made ({study.path})")
    return others


def expected_starts(study: Study, out: Path, steps: int, paths: dict[str, Path]) -> dict[str, tuple[str, int]]:
    """`run_starts` less the starts that did not or will not happen (`pretrain`, `reused_start`): a run that began
    from its donor's checkpoint (its started_from.json, or a finished run's record) keeps it; one with steps of its
    own does not; one not started takes the donor's checkpoint at the switch where it is written with the donor's
    snapshots up to it, or where the donor, short of the switch, is trained first (held by a process, or before
    it in the study's order) and will write them."""
    order = [run.name for run in study.runs()]
    variant_of = {run.name: run.variant for run in study.runs()}
    found = {}
    for name, (donor, step) in run_starts(study, steps).items():
        wanted = [s for s in study.pretraining.checkpoints if s <= step and s < steps] \
            if variant_of[name] in study.curve_variants else []
        if finished_steps(paths[name]) is not None:
            results = json.loads((paths[name] / "pretrain_results.json").read_text())
            if (paths[name] / "started_from.json").is_file() or results.get("started_from"):
                found[name] = (donor, step)
        elif (paths[name] / "started_from.json").is_file():
            found[name] = (donor, step)
        elif resume_step(paths[name], 0) or (wanted and variant_of[donor] not in study.curve_variants):
            continue  # its own steps, or a donor with no snapshots to copy: it trains them itself
        elif donor_checkpoint(paths[donor], step) is not None:
            if not missing_snapshots(paths[donor], wanted):
                found[name] = (donor, step)
        elif finished_steps(paths[donor]) is None and resume_step(paths[donor], 0) < step and (
                order.index(donor) < order.index(name)
                or lock_holder(variant_lock_path(out, donor), paths[donor]) is not None):
            found[name] = (donor, step)
    return found


def grid_folders(study: Study, out: Path, steps: int | None, starts: dict[str, tuple[str, int]]) -> dict:
    """{kind: [folder]} of the fine-tuning the study runs: compare's grids (each task x checkpoint, less the random
    twins that take another's), the curve's (each snapshot x curve task; the last step is compare's grid where the
    task is one of compare's, and the snapshots that runs share, a biphasic run's first steps copied from its
    donor's, are one grid, of the first such run in the curve's order) and the feature route's folder of taggers
    for each checkpoint on an NER task (`features`, where the study has one)."""
    tuned = list(dict.fromkeys(t.key for t in study.tasks if not t.feature_based))
    labels = [label for label, *_ in checkpoints_of(study)]
    variant_of = {run.name: run.variant for run in study.runs()}
    order = list(dict.fromkeys(study.curve_variants))
    copies = set()  # (run, step): a snapshot that is another curve run's, whose grid the first in the curve's order has
    for step in study.pretraining.checkpoints:
        for donor in dict.fromkeys(d for d, _ in starts.values()):
            shared = [donor, *(n for n, (d, switch) in starts.items() if d == donor and step <= switch)]
            shared = sorted((n for n in shared if variant_of[n] in order), key=lambda n: order.index(variant_of[n]))
            if step != steps and variant_of[donor] in order:
                copies.update((n, step) for n in shared[1:])
    shared_twins = same_twins(study, out)
    folders: dict[str, list[Path]] = {
        "compare": [out / "compare" / key / label for key in tuned for label in labels if label not in shared_twins],
        "curve": []}
    for name in order:
        for key in dict.fromkeys(study.curve_tasks):
            for step in study.pretraining.checkpoints:
                if step == steps and key in tuned:
                    continue
                folders["curve"] += [out / "curve" / key / f"{run.name}@{step}" for run in study.runs([name])
                                     if (run.name, step) not in copies]
    featured = [t for t in study.tasks if t.feature_based]
    if featured:
        from ..cards import load_card

        folders["features"] = [out / "features" / load_card(t.key.partition("@")[0]).name / label
                               for t in featured for label in labels]
    return folders


def grid_status(folders: dict[str, list[Path]], study: Study) -> dict:
    """Per kind of `grid_folders`: how many grids, how many done (best_trial.json written; every tagger trained),
    under way (trials finished, workers or a study started; features extracted), and the trials (taggers)
    finished."""
    found = {}
    for kind, grids in folders.items():
        if kind == "features":
            from ..cards import load_card

            wanted = {}  # taggers a checkpoint's folder gets on each feature-based task (by its card's name)
            for task in (t for t in study.tasks if t.feature_based):
                rates, epochs, _ = tagger_settings(task)
                wanted[load_card(task.key.partition("@")[0]).name] = len(rates) * len(epochs) * len(study.compare.seeds)
            trials = {f: len(list(f.glob("tagger-*/all_results.json"))) for f in grids}
            done = {f for f in grids if trials[f] >= wanted[f.parent.name]}
            going = [f for f in grids if f not in done and f.is_dir()]
        else:
            trials = {f: len(list(f.glob("trials/trial-*/all_results.json"))) for f in grids}
            done = {f for f in grids if (f / "best_trial.json").is_file()}
            going = [f for f in grids if f not in done and (trials[f] or (f / "grid.db").is_file()
                                                            or (f / ".grid_workers").is_dir())]
        found[kind] = {"grids": len(grids), "done": len(done), "under_way": len(going), "trials": sum(trials.values())}
    return found


def same_twins(study: Study, out: Path) -> set[str]:
    """The random twins that take an earlier one's grids (compare's `same_models`: the same fine-tuning config and
    vocabulary files, the same draw), read from their source runs' final folders, the baseline's row first; a twin
    whose run is not finished counts as its own."""
    from ..compare import RANDOM_TWIN_FILES

    seen, shared = set(), set()
    rows = sorted(checkpoints_of(study), key=lambda c: c[1] != study.compare.baseline)
    for label, name, run, position in rows:
        variant, final = study.variants[name], out / "pretraining" / run.name / "final"
        if not variant.random_init or not (final / "config.json").is_file():
            continue
        config = fine_tuning_config(final, study.size(run.variant))
        files = {f.name: f.read_bytes() for f in final.iterdir() if f.name in RANDOM_TWIN_FILES or f.suffix == ".model"}
        if config is not None:  # the twin folder's config (fine_tuning_checkpoint writes it so)
            files["config.json"] = json.dumps(config, indent=2).encode()
        key = (variant.bilstm, position, *sorted(files.items()))
        if key in seen:
            shared.add(label)
        seen.add(key)
    return shared


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
    if status["other_runs"]:
        lines.append(f"recorded here, not in the study file: {', '.join(status['other_runs'])}")
    if status["left_out"]:
        lines.append(f"left out (their data is not found from this shell): {', '.join(status['left_out'])}")
    lines.append("record: " + ("written (ablation.json)" if status["record"] else
                               "not yet (written when every grid is done)"))
    return "\n".join(lines)
