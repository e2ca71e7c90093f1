"""Multiple choice (SWAG, and any task a card lays out the same way): a context sentence, the start of
its continuation and N candidate endings (the card's `options.endings`, four for SWAG); the model
scores each `[CLS] sent1 [SEP] sent2 ending_i [SEP]` with one vector dot the pooled [CLS] output and
a softmax over the choices picks the ending.

load -> `datasets.Dataset` per split with columns `idx` (the file's leading unnamed index column,
else the record's position in the split), the card's two text columns (`sent1`, `sent2`), the
endings (`ending0`..`ending3`) and `label` (the right ending's index, int; absent for test splits,
which are unlabelled). Local files are the official SWAG CSVs (`train.csv`, `val.csv`, `test.csv`:
a header row, fields quoted where they hold commas or quotes); the Hub source is `allenai/swag`
(`regular`), whose test split marks every label -1.

preprocess -> one feature per example: `input_ids`, `token_type_ids`, `attention_mask`, each a list
of N token lists (segment A = sent1, segment B = sent2 + " " + ending_i, truncated longest-first to
max_seq_length, no padding), `labels` (int, when labelled) and `idx`. The collator pads the choices
of a batch to its longest sequence.

outputs -> `predictions/<dev|test>.csv`: header `idx,prediction`, one row per example with the
chosen ending's index. This is our format (the SWAG leaderboard took a CSV of predictions; its
exact columns are not reproduced here).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ..cards import TaskCard
from ..io import atomic_write_text
from .common import DataError, family_options, load_hub_split, read_text, split_file_stem
from .files import check_extension, data_file_of, read_data_file


def __getattr__(name: str):
    """MODEL_CLASS (BertSuiteForMultipleChoice), imported when asked for: reading a split needs no torch."""
    if name == "MODEL_CLASS":
        from ..modeling_bert_suite import BertSuiteForMultipleChoice

        return BertSuiteForMultipleChoice
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METRICS_USE_EXAMPLES = False  # metric_fn needs the predictions and labels only
DEFAULT_ENDINGS = ["ending0", "ending1", "ending2", "ending3"]
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
_INTEGER = re.compile(r"[+-]?\d+")


def model_kwargs(card: TaskCard) -> dict:
    """The head has one output (a score per choice) whatever the number of choices."""
    return {}


def endings(card: TaskCard) -> list[str]:
    """The card's ending columns (`options.endings`), in choice order."""
    if len(card.text_columns) != 2:
        raise DataError(f"{card.path}: text_columns must name the context sentence and the continuation's start "
                        f"(two columns, e.g. [sent1, sent2]), got {card.text_columns}")
    names = family_options(card, {"endings": DEFAULT_ENDINGS}, "multiple-choice")["endings"]
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) and n for n in names):
        raise DataError(f"{card.path}: options.endings must list two or more column names, got {names!r}")
    return names


def is_labelled(card: TaskCard, split: str, path: Path | None = None) -> bool:
    """Every split but a test split has labels. A test split (SWAG's test.csv has no label column) is
    labelled, and then scored, when its file `path` has the label column."""
    if split not in card.test_splits:
        return True
    if path is None:
        return False
    label = str(card.splits[split].columns.get(card.label_column, card.label_column))
    if path.suffix.lower() == ".csv":
        header = next(csv.reader(io.StringIO(read_text(path, "the official SWAG CSV"), newline="")), [])
        return label in header
    return label in read_data_file(path, "multiple-choice records").column_names


# ----------------------------------------------------------------------------------------------------------------
# Reading

Record = tuple[str, int, dict[str, Any], str | None]  # where, idx, row, problem found before the row is checked


def check_row(where: str, row: dict[str, Any], card: TaskCard, labelled: bool) -> dict[str, Any]:
    """One example as the dataset holds it, or a DataError naming `where` and what was expected."""
    names = endings(card)
    first, second = card.text_columns
    out: dict[str, Any] = {}
    for name in [first, second, *names]:
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            raise DataError(f"{where}: column {name!r} must be text, got {type(value).__name__} {value!r}")
        value = value or ""
        if not value.strip() and name != second:  # sent2 (the continuation's start) may be empty
            raise DataError(f"{where}: empty {name!r}; expected a non-empty {'ending' if name != first else 'sentence'}")
        out[name] = value
    if labelled:
        raw = row.get(card.label_column)
        count = len(names)
        if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()):
            raw = int(raw.strip())
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise DataError(f"{where}: label {raw!r} is not an integer; expected the right ending's index 0..{count - 1}")
        if not 0 <= raw < count:
            raise DataError(f"{where}: label {raw} is out of range; expected the right ending's index 0..{count - 1}")
        out["label"] = raw
    return out


def build_dataset(records: Iterable[Record], card: TaskCard, labelled: bool,
                  skip_bad_rows: bool = False) -> tuple[datasets.Dataset, int]:
    """Checked records -> dataset; a bad record is an error, or with `skip_bad_rows` left out and counted."""
    names = ["idx", *required_columns(card, False), *(["label"] if labelled else [])]
    columns: dict[str, list] = {name: [] for name in names}
    skipped = 0
    for where, idx, row, problem in records:
        try:
            if problem:
                raise DataError(f"{where}: {problem}")
            example = check_row(where, row, card, labelled)
        except DataError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        columns["idx"].append(idx)
        for name, value in example.items():
            columns[name].append(value)
    features = datasets.Features({name: datasets.Value("int64" if name in ("idx", "label") else "string")
                                  for name in names})
    return datasets.Dataset.from_dict(columns, features=features), skipped


def csv_records(path: Path, card: TaskCard, split: str, labelled: bool) -> Iterator[Record]:
    """The rows of an official SWAG CSV file as records, located by file and line. The header names the
    columns (the card's split `columns` may rename them); a leading unnamed column is the row index."""
    text = read_text(path, "the official SWAG CSV")
    # csv, not str.split: SWAG text holds commas, quotes and (quoted) line breaks.
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as err:
        raise DataError(f"{path}:1: cannot parse the header ({err})") from None
    if not header:
        raise DataError(f"{path}: empty file; expected a header row ({', '.join(required_columns(card, labelled))}) "
                        "and rows")
    rename = card.splits[split].columns
    positions = {}
    for name in required_columns(card, labelled):
        column = str(rename.get(name, name))
        if column not in header:
            raise DataError(f"{path}:1: header has no column {column!r}; expected the columns "
                            f"{', '.join(str(rename.get(n, n)) for n in required_columns(card, labelled))} "
                            f"(found: {', '.join(header)})")
        positions[name] = header.index(column)
    has_index = header[0].strip() == ""
    row_number = -1
    line_no = 1  # last physical line read: a record starts on the line after the previous one
    while True:
        start = line_no + 1
        try:
            fields = next(reader, None)
        except csv.Error as err:
            raise DataError(f"{path}:{start}: cannot parse the CSV record ({err})") from None
        line_no = reader.line_num
        if fields is None:
            return
        if not fields or fields == [""]:
            continue  # a blank line
        row_number += 1
        where = f"{path}:{start}"
        if len(fields) != len(header):
            yield where, row_number, {}, f"expected {len(header)} comma-separated fields (as the header), found {len(fields)}"
            continue
        idx = row_number
        if has_index:
            if not _INTEGER.fullmatch(fields[0].strip()):
                yield where, row_number, {}, f"index {fields[0]!r} (the first, unnamed column) is not an integer"
                continue
            idx = int(fields[0])
        yield where, idx, {name: fields[pos] for name, pos in positions.items()}, None


def required_columns(card: TaskCard, labelled: bool) -> list[str]:
    ends = endings(card)
    return [*card.text_columns, *ends, *([card.label_column] if labelled else [])]


def hub_records(dataset: datasets.Dataset, source: str, card: TaskCard, labelled: bool) -> Iterator[Record]:
    """Rows of a dataset in the Hub layout (allenai/swag) as records, located by their position."""
    wanted = required_columns(card, labelled)
    missing = [c for c in wanted if c not in dataset.column_names]
    if missing:
        raise DataError(f"{source}: no column {missing[0]!r}; expected the columns {', '.join(wanted)} "
                        f"(found: {', '.join(dataset.column_names)})")
    values = dataset.select_columns(wanted).to_dict()
    ids = dataset.select_columns(["idx"]).to_dict()["idx"] if "idx" in dataset.column_names else range(len(dataset))
    for i, idx in enumerate(ids):
        yield f"{source}, record {i}", int(idx), {c: values[c][i] for c in wanted}, None


FILE_EXTENSIONS = (".csv", ".json", ".jsonl", ".parquet")


def file_records(card: TaskCard, split: str, path: Path, labelled: bool) -> Iterator[Record]:
    """Records of a data file: a CSV in the official SWAG layout (its own reader: SWAG text holds quotes and
    line breaks), or JSON, JSON Lines or Parquet records with the same columns (the Hub layout). A test
    file may have labels (then it is scored: `is_labelled`)."""
    suffix = check_extension(path, FILE_EXTENSIONS, "multiple_choice",
                             "the SWAG CSV layout, or the same columns as JSON, JSON Lines or Parquet records")
    if suffix == ".csv":
        return csv_records(path, card, split, labelled)
    table = read_data_file(path, f"records with the columns {', '.join(required_columns(card, labelled))}")
    return hub_records(table, str(path), card, labelled)


def load_split(card: TaskCard, split: str, data_dir: str | Path | None = None,
               skip_bad_rows: bool = False) -> datasets.Dataset:
    """One split: from `data_dir` (the folder with the card's CSV files, or one .csv file) when given,
    else from the Hub (or its cache)."""
    spec = card.splits[split]
    labelled = is_labelled(card, split)
    data_file = data_file_of(card, split)
    if data_file is not None:
        source = str(data_file)
        check_extension(data_file, FILE_EXTENSIONS, "multiple_choice",
                        "the SWAG CSV layout, or the same columns as JSON, JSON Lines or Parquet records")
        labelled = is_labelled(card, split, Path(data_file))
        records = file_records(card, split, data_file, labelled)
    elif data_dir is not None:
        path = Path(data_dir)
        if not (path.suffix.lower() == ".csv" and not path.is_dir()):
            if spec.file is None:
                raise DataError(f"{card.path}: split {split!r} has no local file; remove --data_dir to use the Hub")
            path = path / spec.file
        if not path.is_file():
            raise DataError(f"{path}: file not found (split {split!r} of task {card.name!r}; expected the "
                            "official SWAG CSV)")
        source = str(path)
        labelled = is_labelled(card, split, path)
        records = csv_records(path, card, split, labelled)
    else:
        hub, source = load_hub_split(card, split, "the official CSV files (train.csv, val.csv, test.csv)")
        records = hub_records(hub, source, card, labelled)
    dataset, skipped = build_dataset(records, card, labelled, skip_bad_rows)
    if skipped:
        print(f"[bert_suite] {source}: skipped {skipped} malformed rows (--skip_bad_rows)")
    if len(dataset) == 0:
        raise DataError(f"{source}: no usable rows (header only?)")
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Encoding


def preprocess(dataset: datasets.Dataset, card: TaskCard, tokenizer, max_seq_length: int,
               train: bool = False) -> datasets.Dataset:
    """Tokenise every (sentence, continuation + ending) pair once; train and evaluation rows alike."""
    names = endings(card)
    first, second = card.text_columns
    count = len(names)

    def encode(batch):
        n = len(batch[first])
        heads = [batch[first][i] for i in range(n) for _ in names]
        tails = [" ".join(p for p in (batch[second][i].strip(), batch[e][i].strip()) if p)
                 for i in range(n) for e in names]
        flat = tokenizer(heads, tails, truncation="longest_first", max_length=max_seq_length)
        out = {key: [flat[key][i * count:(i + 1) * count] for i in range(n)] for key in INPUT_KEYS}
        if "label" in batch:
            out["labels"] = batch["label"]
        return out

    return dataset.map(encode, batched=True, remove_columns=[c for c in dataset.column_names if c != "idx"],
                       desc=f"tokenising {card.name}")


class MultipleChoiceCollator:
    """Pads every choice of a batch to the batch's longest sequence (tensors [batch, choices, length]) and
    keeps `labels`. Written here because transformers ships no collator for nested choices; the padding
    itself is the tokenizer's."""

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = None):
        self.tokenizer, self.pad_to_multiple_of = tokenizer, pad_to_multiple_of

    def __call__(self, features: list[dict]) -> dict:
        import torch

        count = len(features[0]["input_ids"])
        keys = [k for k in INPUT_KEYS if k in features[0]]
        flat = [{k: f[k][c] for k in keys} for f in features for c in range(count)]
        batch = dict(self.tokenizer.pad(flat, padding="longest", pad_to_multiple_of=self.pad_to_multiple_of,
                                        return_tensors="pt"))
        batch = {k: v.view(len(features), count, -1) for k, v in batch.items()}
        if "labels" in features[0]:
            batch["labels"] = torch.tensor([int(f["labels"]) for f in features], dtype=torch.long)
        return batch


def collator(tokenizer, pad_to_multiple_of: int | None = None) -> MultipleChoiceCollator:
    return MultipleChoiceCollator(tokenizer, pad_to_multiple_of)


# ----------------------------------------------------------------------------------------------------------------
# Scoring and outputs


def postprocess(predictions) -> np.ndarray:
    """Scores [examples, choices] -> the chosen ending's index per example."""
    scores = predictions[0] if isinstance(predictions, (tuple, list)) else predictions
    return np.asarray(scores).argmax(-1)


def metric_fn(card: TaskCard, examples=None, features=None):
    """Trainer's compute_metrics: accuracy (a fraction) of the highest-scoring ending."""

    def compute(eval_pred):
        if eval_pred.label_ids is None:
            return {}
        chosen = postprocess(eval_pred.predictions)
        return {"accuracy": float(np.mean(chosen == np.asarray(eval_pred.label_ids).reshape(-1)))}

    return compute


def score_predictions(card: TaskCard, examples, features, predictions, settings: dict) -> dict[str, float]:
    """Accuracy on a predicted split whose examples have labels (a labelled test file); {} without."""
    if "labels" not in features.column_names:
        return {}
    return {"accuracy": float(np.mean(postprocess(predictions) == np.asarray(features["labels"]).reshape(-1)))}


def output_path(directory: Path, card: TaskCard, split: str) -> Path:
    return Path(directory) / f"{split_file_stem(split)}.csv"


def write_outputs(directory: Path, card: TaskCard, split: str, examples, features, predictions,
                  settings: dict) -> dict:
    """`idx,prediction` rows (the chosen ending's index); nothing is chosen on dev, so no settings."""
    path = output_path(directory, card, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [f"{int(i)},{int(p)}" for i, p in zip(features["idx"], postprocess(predictions), strict=True)]
    atomic_write_text(path, "idx,prediction\n" + "".join(f"{r}\n" for r in rows))
    return {}
