"""`bert-suite glue-package`: the GLUE test-server submission from finished runs.

Every run folder (a `finetune` or `grid` output) names its task in `run_manifest.json`. Its
test predictions are taken from `predictions/test*.tsv` (written by `bert-suite predict`), or
made here with the run's checkpoint when missing. AX is predicted with the MNLI model; WNLI is
the card's majority class unless a WNLI run is given (the paper's choice). Each server file is
checked against the test file (same indices) or, without data, the card's row count, then all
are zipped. Beside the zip, a dev summary puts each task's dev score next to the paper's Table 1.
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .adapters import classification as adapter
from .adapters import split_file_stem
from .cards import TaskCard, load_card
from .io import atomic_write_bytes, atomic_write_text, atomic_write_with
from .runner import predict

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax")
ZIP_NAME = "glue_submission.zip"


class PackageError(ValueError):
    """A run folder or prediction file that cannot go into the submission."""


@dataclass
class Run:
    card: TaskCard
    run_dir: Path
    model_dir: Path
    data_dir: str | None
    dev_metrics: dict


def read_run(run_dir: str | Path) -> Run:
    """A finetune folder (model at the top) or a grid folder (model in best/)."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "run_manifest.json"
    if not manifest_path.is_file():
        raise PackageError(f"{run_dir}: not a finetune or grid output folder (no run_manifest.json)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except ValueError as err:  # not JSON, or not UTF-8
        raise PackageError(f"{manifest_path}: {err}; expected the JSON manifest a finetune or grid run writes") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("task"), str):
        raise PackageError(f"{manifest_path}: no \"task\"; expected the JSON manifest a finetune or grid run writes "
                           "(with the task's name)")
    card_ref = manifest.get("card")
    card = load_card(card_ref if card_ref and Path(card_ref).is_file() else manifest["task"])
    best = run_dir / "best"
    model_dir = best if (best / "config.json").is_file() else run_dir
    if (run_dir / "best_trial.json").is_file():
        metrics = json.loads((run_dir / "best_trial.json").read_text()).get("metrics", {})
    elif (run_dir / "all_results.json").is_file():
        metrics = json.loads((run_dir / "all_results.json").read_text())
    else:
        metrics = {}
    return Run(card, run_dir, model_dir, manifest.get("data_dir"), metrics)


def task_data_dir(card: TaskCard, glue_root: str | None, recorded: str | None) -> str | None:
    """The folder with the task's files: GLUE_ROOT/<data_folder> (or GLUE_ROOT itself), else the
    folder the run was trained from; None means the Hub."""
    if glue_root:
        sub = Path(glue_root) / (card.data_folder or "")
        return str(sub if sub.is_dir() else Path(glue_root))
    return recorded


def read_predictions(path: Path, card: TaskCard) -> tuple[list[str], list[str]]:
    """Parse a server-format TSV, checking the header and every prediction's value."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != "index\tprediction":
        raise PackageError(f"{path}: line 1: expected the header 'index<TAB>prediction', got {lines[:1]}")
    indices, values = [], []
    for number, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 2:
            raise PackageError(f"{path}: line {number}: expected 'index<TAB>prediction', got {line!r}")
        index, value = parts
        if card.labels is not None and value not in card.labels:
            raise PackageError(f"{path}: line {number}: prediction {value!r} is not one of {card.labels}")
        if card.labels is None:
            try:
                ok = math.isfinite(float(value))
            except ValueError:
                ok = False
            if not ok:
                raise PackageError(f"{path}: line {number}: prediction {value!r} is not a finite number")
        indices.append(index)
        values.append(value)
    return indices, values


def expected_indices(card: TaskCard, split: str, data_dir: str | None) -> list[str] | None:
    """The test file's index column when the file is at hand; None otherwise."""
    spec = card.splits[split]
    if data_dir is None or not spec.file or not (Path(data_dir) / spec.file).is_file():
        return None
    return [str(i) for i in adapter.load_split(card, split, data_dir)["idx"]]


def check_rows(path: Path, card: TaskCard, split: str, data_dir: str | None, expected: list[str] | None) -> dict:
    """Same indices as the test file (`expected`, from `expected_indices`), or the card's row count
    when the file is not at hand."""
    indices, _ = read_predictions(path, card)
    if expected is not None:
        if len(indices) != len(expected) or set(indices) != set(expected):
            missing = sorted(set(expected) - set(indices), key=str)[:5]
            raise PackageError(f"{path}: {len(indices)} predictions but the test file "
                               f"{Path(data_dir) / card.splits[split].file} has {len(expected)} rows"
                               + (f" (missing indices {missing}...)" if missing else ""))
        return {"rows": len(indices), "checked_against": str(Path(data_dir) / card.splits[split].file)}
    rows = card.splits[split].rows
    if rows is not None and len(indices) != rows:
        raise PackageError(f"{path}: {len(indices)} predictions, but {card.name} {split} has {rows} rows "
                           f"(card {card.path})")
    return {"rows": len(indices), "checked_against": f"card rows ({rows})" if rows is not None else None}


def _find_predictions(run: Run, split: str) -> Path | None:
    stem = split_file_stem(split)
    for folder in (run.model_dir, run.run_dir):
        path = folder / "predictions" / f"{stem}.tsv"
        if path.is_file():
            return path
    return None


def _majority_file(card: TaskCard, split: str, indices: list[str] | None, work: Path) -> Path:
    if indices is None:
        if card.splits[split].rows is None:
            raise PackageError(f"{card.name}: the majority-class file needs the test file (--data_dir) "
                               "or the card's rows")
        indices = [str(i) for i in range(card.splits[split].rows)]
    path = work / card.name / f"{split_file_stem(split)}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "index\tprediction\n" + "".join(f"{i}\t{card.majority_label}\n" for i in indices))
    return path


_EVAL_SUFFIX = {"validation_matched": ("m", "base"), "validation_mismatched": ("mm", "base_mismatched")}


def dev_scores(run: Run) -> list[tuple[str, float, float | None]]:
    """(column, dev score x100, paper BASE test score) per reported number; MNLI gives m and mm."""
    card, metrics = run.card, run.dev_metrics
    if len(card.eval_splits) == 1:
        value = metrics.get(f"eval_{card.select}")
        return [] if value is None else [(card.name, 100 * value, card.paper.get("base"))]
    out = []
    for split in card.eval_splits:
        suffix, paper_key = _EVAL_SUFFIX.get(split, (split_file_stem(split), None))
        value = metrics.get(f"eval_{split}_{card.select}")
        if value is not None:
            out.append((f"{card.name}-{suffix}", 100 * value, card.paper.get(paper_key) if paper_key else None))
    return out


def package(run_dirs: list[str], output_dir: str, glue_root: str | None = None,
            tokenizer: str | None = None) -> dict:
    """Write the server files, the zip and the dev summary into output_dir; return a summary."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    runs: dict[str, Run] = {}
    for run_dir in run_dirs:
        run = read_run(run_dir)
        if run.card.name in runs:
            raise PackageError(f"two runs for {run.card.name}: {runs[run.card.name].run_dir} and {run_dir}")
        runs[run.card.name] = run
    if not runs:
        raise PackageError("give at least one run folder")

    files, checks = {}, {}
    cards = {name: load_card(name) for name in GLUE_TASKS}
    for name, card in cards.items():
        run = runs.get(name) or (runs.get(card.predict_with) if card.predict_with else None)
        if run is None and card.majority_label is None:
            continue
        for split in card.test_splits:
            spec = card.splits[split]
            if not spec.server_file:
                continue
            if run is None:
                recorded = None
            else:
                recorded = run.data_dir if run.card.name == name else _sibling(run.data_dir, card)
            data_dir = task_data_dir(card, glue_root, recorded)
            expected = expected_indices(card, split, data_dir)  # read once, for the majority file and the check
            if run is None:
                path, source = _majority_file(card, split, expected, work), f"majority class {card.majority_label!r}"
            elif run.card.name == name and (found := _find_predictions(run, split)):
                path, source = found, str(found)
            else:
                path = predict(card, str(run.model_dir), split, data_dir, str(work / name), tokenizer).path
                source = f"predicted with {run.model_dir}"
            checks[spec.server_file] = {"task": name, "split": split, "source": source,
                                        **check_rows(path, card, split, data_dir, expected)}
            target = out / spec.server_file
            atomic_write_bytes(target, path.read_bytes())
            files[spec.server_file] = target
    all_files = [cards[n].splits[s].server_file for n in GLUE_TASKS for s in cards[n].test_splits]
    missing = [f for f in all_files if f not in files]

    def write_zip(f) -> None:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as archive:
            for name in sorted(files):
                archive.write(files[name], arcname=name)

    atomic_write_with(out / ZIP_NAME, write_zip)
    summary = {"files": checks, "missing": missing, "zip": str(out / ZIP_NAME),
               "dev": {row[0]: {"dev": row[1], "paper_base_test": row[2]}
                       for run in runs.values() for row in dev_scores(run)}}
    atomic_write_text(out / "dev_summary.md", dev_summary_markdown(summary))
    atomic_write_text(out / "package.json", json.dumps(summary, indent=2))
    return summary


def _sibling(data_dir: str | None, card: TaskCard) -> str | None:
    """AX's folder beside the MNLI folder a run was trained from (GLUE layout)."""
    if data_dir is None or card.data_folder is None:
        return None
    return str(Path(data_dir).parent / card.data_folder)


def dev_summary_markdown(summary: dict) -> str:
    rows = summary["dev"]
    lines = ["# GLUE dev summary", "",
             "Dev scores of the runs packaged (x100: accuracy, or F1 for MRPC/QQP, Spearman for STS-B, "
             "Matthews corr. for CoLA) next to BERT-BASE's GLUE test scores from the paper's Table 1.", "",
             "| task | dev | paper BASE (test) |", "|---|---:|---:|"]
    for task, row in rows.items():
        paper = "" if row["paper_base_test"] is None else f"{row['paper_base_test']:.1f}"
        lines.append(f"| {task} | {row['dev']:.1f} | {paper} |")
    scored = [r for t, r in rows.items() if not t.startswith("wnli")]
    if scored:
        ours = sum(r["dev"] for r in scored) / len(scored)
        with_paper = [r["paper_base_test"] for r in scored if r["paper_base_test"] is not None]
        paper = f"{sum(with_paper) / len(with_paper):.1f}" if len(with_paper) == len(scored) else ""
        lines.append(f"| **average** (without WNLI, as the paper) | {ours:.1f} | {paper} |")
    lines += ["", "## Server files", "", "| file | task | rows | checked against | source |", "|---|---|---:|---|---|"]
    for name, check in sorted(summary["files"].items()):
        lines.append(f"| {name} | {check['task']} | {check['rows']} | {check['checked_against'] or 'unchecked'} "
                     f"| {check['source']} |")
    if summary["missing"]:
        lines += ["", f"Missing (the GLUE server wants all eleven files): {', '.join(summary['missing'])}"]
    return "\n".join(lines) + "\n"
