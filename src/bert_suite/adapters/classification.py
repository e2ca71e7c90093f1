"""Sentence and sentence-pair classification/regression (GLUE and any task a card describes).

load -> `datasets.Dataset` per split with the card's text columns, `label` (class id, float for
regression, absent for unlabelled test data) and `idx`; preprocess -> token ids (no padding:
the collator pads per batch); postprocess -> label strings as in the card's label list.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np

from ..cards import TaskCard
from ..io import atomic_write_text
from ..metrics import glue_metrics
from .common import DataError, load_hub_split, read_text, split_file_stem
from .files import check_columns, check_extension, data_file_of, label_text, read_data_file, row_index


def __getattr__(name: str):
    """MODEL_CLASS (BertSuiteForSequenceClassification), imported when asked for: reading a split needs no torch."""
    if name == "MODEL_CLASS":
        from ..modeling_bert_suite import BertSuiteForSequenceClassification

        return BertSuiteForSequenceClassification
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METRICS_USE_EXAMPLES = False  # metric_fn needs the predictions and labels only


def model_kwargs(card: TaskCard) -> dict:
    """The head's size and label names, stored in the checkpoint's config."""
    kwargs = dict(num_labels=card.num_labels)
    if card.labels:
        kwargs.update(id2label=dict(enumerate(card.labels)), label2id={v: i for i, v in enumerate(card.labels)})
    return kwargs


def read_tsv_split(card: TaskCard, split: str, path: Path, skip_bad_rows: bool = False) -> tuple[datasets.Dataset, int]:
    """Read one split from a tab-separated file laid out as the card says. Quote characters are
    text, never quoting (QQP/MNLI contain them). Returns the dataset and the number of rows
    skipped (only with `skip_bad_rows`; otherwise a bad row is an error naming file and line)."""
    spec = card.splits[split]
    lines = read_text(path, f"the TSV file of split {split!r} of task {card.name!r}").splitlines()
    if not lines:
        raise DataError(f"{path}: empty file; expected {'a header and ' if spec.header else ''}rows")
    first_row = 1
    if spec.header:
        header = lines[0].split("\t")
        first_row = 2
        missing = [col for col in spec.columns.values() if col not in header]
        if missing:
            raise DataError(f"{path}:1: header has no column {missing[0]!r}; expected the columns "
                            f"{', '.join(map(str, spec.columns.values()))} (found: {', '.join(header)})")
        positions = {name: header.index(col) for name, col in spec.columns.items()}
        width = len(header)
        gold = _test_label_column(card, split)  # a labelled test file in the train split's layout is scored
        if gold is not None and card.label_column not in positions and gold in header:
            positions[card.label_column] = header.index(gold)
    else:
        positions = dict(spec.columns)
        width = None
    needed = max(positions.values()) + 1
    wanted_label = card.label_column in positions
    columns: dict[str, list] = {name: [] for name in [*card.text_columns, "idx"]}
    if wanted_label:
        columns["label"] = []
    skipped = 0
    label_ids = {label: i for i, label in enumerate(card.labels or [])}
    row_number = -1  # position among data rows: the index when the file has no index column
    for line_no, line in enumerate(lines[first_row - 1:], start=first_row):
        if not line.strip():
            continue
        row_number += 1
        fields = line.split("\t")
        try:
            if (width is not None and len(fields) != width) or len(fields) < needed:
                raise DataError(f"{path}:{line_no}: expected {width or needed} tab-separated fields, found {len(fields)}")
            row = {name: fields[pos] for name, pos in positions.items()}
            for name in card.text_columns:
                if not row[name].strip():
                    raise DataError(f"{path}:{line_no}: empty text in column {spec.columns[name]!r}; expected non-empty "
                                    "text")
            if wanted_label:
                raw = row[card.label_column].strip()
                if card.is_regression:
                    try:
                        label = float(raw)
                    except ValueError:
                        raise DataError(f"{path}:{line_no}: label {raw!r} is not a number; expected a score") from None
                elif raw in label_ids:
                    label = label_ids[raw]
                else:
                    raise DataError(f"{path}:{line_no}: label {raw!r} is not one of the card's labels {card.labels}")
            if "idx" in row and not row["idx"].strip().isdigit():  # it names the row in the server files
                raise DataError(f"{path}:{line_no}: index {row['idx']!r} is not a number; expected the row's index "
                                f"(column {spec.columns['idx']!r}), 0, 1, ...")
        except DataError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        for name in card.text_columns:
            columns[name].append(row[name])
        columns["idx"].append(int(row["idx"]) if "idx" in row else row_number)
        if wanted_label:
            columns["label"].append(label)
    if not columns["idx"] and skipped:
        raise DataError(f"{path}: all {skipped} data rows are malformed and were skipped (--skip_bad_rows); "
                        "expected at least one good row")
    if not columns["idx"]:
        raise DataError(f"{path}: no data rows (header only?); expected at least one row")
    return datasets.Dataset.from_dict(columns), skipped


def _test_label_column(card: TaskCard, split: str) -> str | None:
    """For a test split: the label's column name in the train split's layout (a TSV test file with that
    column is labelled), else None."""
    if split not in card.test_splits or card.train_split not in card.splits:
        return None
    name = card.splits[card.train_split].columns.get(card.label_column, card.label_column)
    return name if isinstance(name, str) else None


FILE_EXTENSIONS = (".csv", ".tsv", ".json", ".jsonl", ".parquet")


def read_file_split(card: TaskCard, split: str, path: Path, skip_bad_rows: bool = False
                    ) -> tuple[datasets.Dataset, int]:
    """One split from a data file: a TSV laid out as the card's split says (the GLUE files), or any
    CSV/TSV/JSON/JSON Lines/Parquet file whose columns are the card's text and label columns (or the
    names the card's split maps them to). A test file with labels is scored. Returns the dataset in the
    layout of `read_tsv_split` and the number of rows skipped."""
    spec = card.splits[split]
    suffix = check_extension(path, FILE_EXTENSIONS, "classification", "a CSV, TSV, JSON, JSON Lines or Parquet file")
    if suffix == ".tsv" and spec.columns:
        return read_tsv_split(card, split, path, skip_bad_rows)
    expected = f"rows with the text column{'s' if len(card.text_columns) > 1 else ''} " \
               f"{', '.join(card.text_columns)}" + ("" if split in card.test_splits else f" and {card.label_column}")
    table = read_data_file(path, expected)
    columns = {name: name if name in table.column_names or not isinstance(spec.columns.get(name), str)
               else spec.columns[name] for name in [*card.text_columns, card.label_column]}
    gold = _test_label_column(card, split)  # a test file may name its label as the train split does (STS-B: score)
    if gold is not None and columns[card.label_column] not in table.column_names and gold in table.column_names:
        columns[card.label_column] = gold
    labelled = split not in card.test_splits or columns[card.label_column] in table.column_names
    wanted = [columns[c] for c in card.text_columns] + ([columns[card.label_column]] if labelled else [])
    check_columns(table, path, wanted, "the task's text" + (" and label columns" if labelled else " columns"))
    values = table.select_columns(wanted).to_dict()
    ids = row_index(table, path)
    out: dict[str, list] = {name: [] for name in [*card.text_columns, "idx", *(["label"] if labelled else [])]}
    skipped = 0
    for row in range(len(table)):
        where = f"{path}: row {row + 1}"
        try:
            texts = [values[columns[name]][row] for name in card.text_columns]
            for name, text in zip(card.text_columns, texts, strict=True):
                if not isinstance(text, str) or not text.strip():
                    raise DataError(f"{where}: empty or non-text {columns[name]!r} ({text!r}); expected non-empty text")
            label = label_id(card, values[columns[card.label_column]][row], where) if labelled else None
        except DataError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        for name, text in zip(card.text_columns, texts, strict=True):
            out[name].append(text)
        out["idx"].append(ids[row])
        if labelled:
            out["label"].append(label)
    if not out["idx"]:
        raise DataError(f"{path}: all {skipped} rows are malformed and were skipped (--skip_bad_rows); expected at "
                        "least one good row")
    return datasets.Dataset.from_dict(out), skipped


def label_id(card: TaskCard, value, where: str) -> int | float:
    """A label as the file holds it -> the class id (or score for regression). Class names match as text
    (1 and "1" alike); plain class ids 0..n-1 (as the Hub stores them) are taken when no label name is a
    number, so that names and ids cannot be confused."""
    if card.is_regression:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
            return float(value)
        try:
            score = float(str(value).strip())
        except ValueError:
            score = float("nan")
        if not np.isfinite(score):
            raise DataError(f"{where}: label {value!r} is not a number; expected a score (a regression task)")
        return score
    names = card.labels
    text = label_text(value)
    if text in names:
        return names.index(text)
    numeric_names = any(name.lstrip("-").isdigit() for name in names)
    if isinstance(value, int) and not isinstance(value, bool) and not numeric_names and 0 <= value < len(names):
        return value
    raise DataError(f"{where}: label {value!r} is not one of the task's labels {names}"
                    + ("" if numeric_names else f" (or a class id 0..{len(names) - 1})"))


def load_split(card: TaskCard, split: str, data_dir: str | Path | None = None,
               skip_bad_rows: bool = False) -> datasets.Dataset:
    """One split, from `data_dir` (the task's original files) when given, else from the Hub."""
    spec = card.splits[split]
    data_file = data_file_of(card, split)
    if data_file is not None:
        dataset, skipped = read_file_split(card, split, data_file, skip_bad_rows)
        if skipped:
            print(f"[bert_suite] {data_file}: skipped {skipped} malformed rows (--skip_bad_rows)")
        return dataset
    if data_dir is not None:
        if spec.file is None:
            raise DataError(f"{card.path}: split {split!r} has no local file; remove --data_dir to use the Hub")
        dataset, skipped = read_tsv_split(card, split, Path(data_dir) / spec.file, skip_bad_rows)
        if skipped:
            print(f"[bert_suite] {Path(data_dir) / spec.file}: skipped {skipped} malformed rows (--skip_bad_rows)")
        return dataset
    dataset, source = load_hub_split(card, split, "the task's local files")
    missing = [c for c in card.text_columns if c not in dataset.column_names]
    if missing:
        raise DataError(f"{source}: no column {missing[0]!r}")
    if "label" in dataset.column_names and (min(dataset["label"]) < 0 if not card.is_regression
                                            else set(dataset["label"]) == {-1.0}):
        dataset = dataset.remove_columns("label")  # the Hub marks unlabelled test rows with -1 (STS-B too)
    return dataset


def preprocess(dataset: datasets.Dataset, card: TaskCard, tokenizer, max_seq_length: int,
               train: bool = False) -> datasets.Dataset:
    """Tokenise once (single sentences or pairs), truncating to max_seq_length; no padding. Train
    and evaluation rows are encoded alike."""

    def encode(batch):
        texts = [batch[c] for c in card.text_columns]
        return tokenizer(*texts, truncation=True, max_length=max_seq_length)

    keep = {"label", "idx"}
    return dataset.map(encode, batched=True, remove_columns=[c for c in dataset.column_names if c not in keep],
                       desc=f"tokenising {card.name}")


def postprocess(card: TaskCard, logits: np.ndarray) -> np.ndarray:
    """Logits -> class ids (argmax), or scores for regression."""
    logits = np.asarray(logits)
    return logits.reshape(-1) if card.is_regression else logits.argmax(-1)


def label_strings(card: TaskCard, predictions: np.ndarray) -> list[str]:
    """Predictions as written in prediction files: the card's label strings, or the float score."""
    if card.is_regression:
        return [f"{float(p):.3f}" for p in predictions]
    return [card.labels[int(p)] for p in predictions]


def compute_metrics(card: TaskCard, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    return glue_metrics(card.metric, predictions, references)


def collator(tokenizer, pad_to_multiple_of: int | None = None):
    """Dynamic padding to the longest sequence of each batch (rounded up to a multiple of `pad_to_multiple_of`)."""
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def metric_fn(card: TaskCard, examples=None, features=None):
    """Trainer's compute_metrics: logits and label ids -> the card's metrics."""

    def compute(eval_pred):
        return compute_metrics(card, postprocess(card, eval_pred.predictions), np.asarray(eval_pred.label_ids))

    return compute


def score_predictions(card: TaskCard, examples, features, predictions, settings: dict) -> dict[str, float]:
    """The card's metrics on a predicted split whose rows have labels (a labelled test file); {} without."""
    if "label" not in features.column_names:
        return {}
    return compute_metrics(card, postprocess(card, predictions), np.asarray(features["label"]))


def output_path(directory: Path, card: TaskCard, split: str) -> Path:
    return directory / f"{split_file_stem(split)}.tsv"


def write_outputs(directory: Path, card: TaskCard, split: str, examples, features, predictions,
                  settings: dict) -> dict:
    """`index<TAB>prediction` with the card's label strings (the GLUE server format). Nothing is
    chosen on dev for this family, so no settings are returned."""
    path = output_path(directory, card, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = label_strings(card, postprocess(card, predictions))
    rows = [f"{i}\t{p}" for i, p in zip(features["idx"], labels, strict=True)]
    atomic_write_text(path, "index\tprediction\n" + "\n".join(rows) + "\n")
    return {}
