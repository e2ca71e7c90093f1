"""Task cards: one YAML file per task, the only place a task's facts live (data sources and file
layouts, columns, labels, metric, default hyper-parameters, grid, the paper's numbers).

A card is found by name (`rte`, `glue/rte`) under the `tasks/` folder, or given as a path, so a
user adds a classification or regression task on their own files by writing a card.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class CardError(ValueError):
    """A card that cannot be used; the message names the file and the key."""


@dataclass
class SplitSpec:
    """Where one split comes from: the Hub split name and the local file, with the mapping from
    the card's column names to the file's columns (header names, or 0-based positions when the
    file has no header)."""

    hub: str | None = None
    file: str | None = None
    header: bool = True
    columns: dict[str, str | int] = field(default_factory=dict)
    server_file: str | None = None  # GLUE test server file name (test splits)
    rows: int | None = None  # expected row count (test splits: checked by glue-package)
    # A data file read for this split whatever --data_dir says (CSV, TSV, JSON, JSON Lines, Parquet, or the
    # family's own format), relative to the card's folder or absolute: what --train_file/--validation_file/
    # --test_file set, and what the card a card-less run writes (task_card.yaml) keeps.
    data_file: str | None = None


@dataclass
class TaskCard:
    name: str
    family: str
    text_columns: list[str]
    label_column: str
    metric: str  # the metrics function's task name (e.g. a GLUE config name)
    select: str  # the metric field used to pick the best trial, e.g. "accuracy"
    splits: dict[str, SplitSpec]
    labels: list[str] | None = None  # None = regression (one output)
    train_split: str | None = "train"  # None: predict-only task (AX)
    eval_splits: list[str] = field(default_factory=lambda: ["validation"])
    test_splits: list[str] = field(default_factory=lambda: ["test"])
    hub: dict[str, str] | None = None  # {"path": ..., "name": ...} for datasets.load_dataset
    index_column: str = "idx"
    server_name: str | None = None  # the task's name in the GLUE server package (e.g. "RTE")
    predict_with: str | None = None  # e.g. AX is predicted with the MNLI model
    majority_label: str | None = None  # WNLI: the paper submits the majority class, not a model
    data_folder: str | None = None  # the task's folder in the GLUE distribution (RTE, SST-2, diagnostic)
    defaults: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # the family's own settings (SQuAD: doc_stride, ...)
    grid: dict[str, list] = field(default_factory=dict)
    paper: dict[str, float] = field(default_factory=dict)
    description: str = ""
    path: str = ""

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


CARD_FILE = "task_card.yaml"  # the card a run used, saved in its output folder and beside its checkpoint
FAMILIES = ("classification", "squad", "multiple_choice", "ner")  # = adapter module names
_SPLIT_KEYS = {f.name for f in dataclasses.fields(SplitSpec)}
_CARD_KEYS = {f.name for f in dataclasses.fields(TaskCard)} - {"path"}
_REQUIRED = ("name", "family", "text_columns", "label_column", "metric", "select", "splits")


def tasks_dir() -> Path:
    """The `tasks/` folder: beside the source tree in a checkout, or shipped inside the package."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "tasks", here / "tasks"):
        if candidate.is_dir():
            return candidate
    raise CardError(f"no tasks/ folder found near {here}")


def available_cards() -> dict[str, Path]:
    """Card name -> path, for every card under tasks/ (glue/rte.yaml is 'rte' and 'glue/rte')."""
    found = {}
    root = tasks_dir()
    for path in sorted(root.rglob("*.yaml")):
        found[path.relative_to(root).with_suffix("").as_posix()] = path
        found.setdefault(path.stem, path)
        # The card's own name (squad/v2.yaml is 'squad_v2'), read without parsing the whole YAML.
        named = re.search(r"^name:\s*['\"]?([\w.-]+)", path.read_text(encoding="utf-8"), re.MULTILINE)
        if named:
            found.setdefault(named.group(1).lower(), path)
    return found


def load_card(name_or_path: str | Path) -> TaskCard:
    """Load and validate a card by name (`rte`, `glue/rte`) or path to a YAML file."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        cards = available_cards()
        key = str(name_or_path).lower()
        if key not in cards:
            names = sorted(k for k in cards if "/" not in k)
            raise CardError(f"unknown task {str(name_or_path)!r}: not a card file, and no card of that name "
                            f"(known: {', '.join(names)})")
        path = cards[key]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:  # one line: file:line:column and what the parser expected
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = "; ".join(str(x) for x in (getattr(err, "context", None), getattr(err, "problem", None)) if x)
        raise CardError(f"{where}: not valid YAML ({what or str(err).splitlines()[0]})") from None
    return card_from_dict(data, str(path))


def _expect(path: str, key: str, value, kind, what: str):
    if not isinstance(value, kind):
        raise CardError(f"{path}: {key} must be {what}, got {type(value).__name__} {value!r}")
    return value


def card_from_dict(data: Any, path: str = "<card>") -> TaskCard:
    """Validate a parsed card: unknown keys, missing keys and wrong types are errors naming the key."""
    _expect(path, "the card", data, dict, "a mapping")
    unknown = sorted(set(data) - _CARD_KEYS)
    if unknown:
        raise CardError(f"{path}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(_CARD_KEYS))}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise CardError(f"{path}: missing required key {missing[0]!r}")
    if data["family"] not in FAMILIES:
        raise CardError(f"{path}: family {data['family']!r} is not one of {', '.join(FAMILIES)}")
    _expect(path, "text_columns", data["text_columns"], list, "a list of one or two column names")
    if not 1 <= len(data["text_columns"]) <= 2:
        raise CardError(f"{path}: text_columns must name one or two columns, got {data['text_columns']}")
    for key in ("name", "label_column", "metric", "select"):
        _expect(path, key, data[key], str, "a string")
    if data["family"] == "classification":  # the other families compute their metric whatever its name
        from .metrics.glue import METRIC_FIELDS

        fields = METRIC_FIELDS.get(data["metric"])
        if fields is None:
            raise CardError(f"{path}: metric {data['metric']!r} is not a classification metric; expected one of "
                            f"{', '.join(METRIC_FIELDS)}")
        if data["select"] not in fields:
            raise CardError(f"{path}: select {data['select']!r} is not reported by metric {data['metric']!r}; "
                            f"expected one of the fields of metric {data['metric']!r}: {', '.join(fields)}")
    if data.get("labels") is not None:
        labels = _expect(path, "labels", data["labels"], list, "a list of label strings (or null for regression)")
        data["labels"] = [str(x) for x in labels]
        if len(set(data["labels"])) != len(labels) or len(labels) < 2:
            raise CardError(f"{path}: labels must be two or more distinct values, got {labels}")
    for key in ("defaults", "options", "grid", "paper"):
        _expect(path, key, data.get(key, {}), dict, "a mapping")
    for axis, values in data.get("grid", {}).items():
        if not isinstance(values, list) or not values:
            raise CardError(f"{path}: grid.{axis} must be a non-empty list, got {values!r}")
    splits = {}
    for split, spec in _expect(path, "splits", data["splits"], dict, "a mapping of split names").items():
        _expect(path, f"splits.{split}", spec, dict, "a mapping")
        bad = sorted(set(spec) - _SPLIT_KEYS)
        if bad:
            raise CardError(f"{path}: splits.{split}: unknown key {bad[0]!r}; known keys: {', '.join(sorted(_SPLIT_KEYS))}")
        splits[split] = SplitSpec(**spec)
        if not splits[split].header and any(not isinstance(v, int) for v in splits[split].columns.values()):
            raise CardError(f"{path}: splits.{split}: a file without header needs integer column positions")
    data["splits"] = splits
    card = TaskCard(**data, path=path)
    for split in [card.train_split, *card.eval_splits, *card.test_splits]:
        if split is not None and split not in splits:
            raise CardError(f"{path}: split {split!r} is used but not described under splits")
    return card


def card_to_dict(card: TaskCard) -> dict[str, Any]:
    """The card as `card_from_dict` reads it (unset split keys left out)."""
    data = {}
    for f in dataclasses.fields(TaskCard):
        value = getattr(card, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name != "path" and (f.name in _REQUIRED or value != default):
            data[f.name] = value
    default_spec = SplitSpec()
    data["splits"] = {name: {k: v for k, v in dataclasses.asdict(spec).items() if v != getattr(default_spec, k)}
                      for name, spec in card.splits.items()}
    return data


def save_card(card: TaskCard, path: str | Path) -> Path:
    """Write the card as YAML (a run's `task_card.yaml`: `bert-suite finetune PATH` repeats the run)."""
    from .io import atomic_write_text

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# The task card of a bert-suite run: `bert-suite finetune {path} --model ...` repeats it.\n"
    atomic_write_text(path, header + yaml.safe_dump(card_to_dict(card), sort_keys=False, allow_unicode=True))
    return path
