"""Tasks on the user's own files, as the transformers example scripts take them.

`with_data_files` points a card's splits at `--train_file`, `--validation_file` and `--test_file`
(they win over `--data_dir` and the Hub, split by split). `card_from_files` builds the card of a
task that has none from its files, as run_glue.py does: text columns `sentence1`/`sentence2` when
present, else the first one or two text columns; labels from the train file's label column (sorted;
float labels make a regression task); accuracy (+ F1 for two classes) or Pearson/Spearman. Other
families (`--task_family`) start from the shipped card of their benchmark (SQuAD, SWAG, CoNLL-2003)
with the files' own settings: v2.0 when a question is unanswerable, the ending columns, the tag set.
A run saves the card it used as `task_card.yaml`, so `bert-suite finetune OUTPUT/task_card.yaml`
repeats it and `predict` finds it beside the checkpoint."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

from .adapters.common import DataError
from .adapters.files import check_columns, check_extension, label_text, read_data_file
from .cards import CARD_FILE, SplitSpec, TaskCard, load_card

FAMILY_TEMPLATES = {"squad": "squad/v1", "squad_v2": "squad/v2", "multiple_choice": "swag", "ner": "conll2003"}
# Classification settings of the paper (Section 4.1, A.3): batch 32, 3 epochs, 128 tokens, and its grid.
CLASSIFICATION_DEFAULTS = {"learning_rate": 2e-5, "per_device_train_batch_size": 32, "num_train_epochs": 3,
                           "max_seq_length": 128, "warmup_steps": 0.1, "weight_decay": 0.01}
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def with_data_files(card: TaskCard, train_file: str | None = None, validation_file: str | None = None,
                    test_file: str | None = None) -> TaskCard:
    """A copy of the card whose train, (first) dev and (first) test splits read the given files. A file for
    a role the card has no split for adds the split; the card's other dev or test splits are dropped (the
    user's file replaces them: MNLI's matched and mismatched dev sets become one)."""
    card = copy.deepcopy(card)
    for flag, path in (("--train_file", train_file), ("--validation_file", validation_file), ("--test_file", test_file)):
        if path and not Path(path).expanduser().is_file():
            raise DataError(f"{path}: file not found ({flag}); expected a data file")
    if train_file:
        if card.train_split is None:
            raise DataError(f"--train_file: task {card.name} is predict-only ({card.path}: no train split)")
        card.splits[card.train_split].data_file = str(Path(train_file).expanduser().resolve())
    for role, path in (("validation", validation_file), ("test", test_file)):
        if not path:
            continue
        names = card.eval_splits if role == "validation" else card.test_splits
        split = names[0] if names else role
        if len(names) > 1:
            print(f"[bert_suite] --{role}_file replaces the card's {role} splits {', '.join(names)} with {split}")
        spec = card.splits.get(split) or SplitSpec()
        spec.data_file = str(Path(path).expanduser().resolve())
        card.splits[split] = spec
        if role == "validation":
            card.eval_splits = [split]
        else:
            card.test_splits = [split]
    return card


def task_name(train_file: str) -> str:
    """train.csv in data/reviews/ -> 'reviews'; reviews_train.jsonl -> 'reviews_train'."""
    path = Path(train_file).resolve()
    stem = path.name.split(".")[0]
    name = path.parent.name if stem.lower() in ("train", "training", "data") and path.parent.name else stem
    return re.sub(r"[^\w.-]+", "_", name) or "task"


def card_from_files(train_file: str, validation_file: str, test_file: str | None = None,
                    family: str = "classification", text_columns: list[str] | None = None,
                    label_column: str | None = None) -> TaskCard:
    """The card of a task given only by its files (see the module docstring). Prints one line saying what
    it found (columns, labels, metric) so a wrong guess is seen at once."""
    if family == "classification":
        card = _classification_card(Path(train_file), Path(validation_file), text_columns, label_column,
                                    Path(test_file) if test_file else None)
    else:
        if text_columns or label_column:
            if family != "multiple_choice":
                raise DataError(f"--text_columns/--label_column: the {family} family reads fixed columns "
                                "(squad: id, context, question, answers; ner: tokens, ner_tags)")
        card = _family_card(Path(train_file), family, text_columns, label_column)
    card = with_data_files(card, train_file, validation_file, test_file)
    if not test_file:
        card.test_splits = []
        card.splits.pop("test", None)
    print(f"[bert_suite] task {card.name!r} from {train_file}: {describe(card)}")
    return card


def describe(card: TaskCard) -> str:
    what = (f"text {' + '.join(card.text_columns)}, label {card.label_column}, "
            + ("regression (float scores)" if card.is_regression else f"{len(card.labels)} classes "
               f"({', '.join(card.labels[:10])}{', ...' if len(card.labels) > 10 else ''})"))
    if card.family != "classification":
        what = f"{card.family} family" + (f", {len(card.labels)} tags" if card.family == "ner" else "")
        if card.family == "squad":
            what += ", v2.0 (unanswerable questions)" if card.options.get("version_2_with_negative") else ", v1.1"
    return f"{what}; selects on {card.select}"


# ---------------------------------------------------------------------------------------------- classification

_TEXT_TYPES = ("string", "large_string")


def _classification_card(train: Path, validation: Path, text_columns: list[str] | None,
                         label_column: str | None, test: Path | None = None) -> TaskCard:
    from .adapters.classification import FILE_EXTENSIONS

    expected = "a CSV, TSV, JSON, JSON Lines or Parquet file"
    for path in (train, validation, *([test] if test else [])):
        check_extension(path, FILE_EXTENSIONS, "classification", expected)
    label = label_column or "label"
    table = read_data_file(train, "rows of text columns and a label column")
    if label not in table.column_names:
        raise DataError(f"{train}: no label column {label!r} (found: {', '.join(table.column_names)}); expected "
                        "a column named label, or name yours with --label_column")
    texts = _text_columns(table, train, label, text_columns)
    values = table[label]
    regression = _is_regression(table, label, values, train)
    labels = None if regression else _sorted_labels(values)
    if labels is not None and len(labels) < 2:
        raise DataError(f"{train}: column {label!r} holds one value ({labels[0]!r}) in every row; expected two or "
                        "more classes (or float scores, for regression)")
    dev = read_data_file(validation, "rows with the same columns as the train file")
    check_columns(dev, validation, [*texts, label], "the train file's text and label columns")
    _check_dev_labels(dev[label], validation, train, label, labels)
    if test is not None and test.is_file():  # scored when labelled: train's kind and classes (missing: later error)
        table = read_data_file(test, "rows with the train file's text columns (and, to be scored, its label column)")
        if label in table.column_names:
            _check_dev_labels(table[label], test, train, label, labels)
    if regression:
        metric, select = "pearson_spearman", "spearmanr"
    else:
        metric, select = ("accuracy_f1" if len(labels) == 2 else "accuracy"), "accuracy"
    positive = f"; F1 of {labels[1]!r}" if labels and len(labels) == 2 else ""
    return TaskCard(
        name=task_name(str(train)), family="classification", text_columns=texts, label_column=label, metric=metric,
        select=select, labels=labels, hub=None,
        splits={"train": SplitSpec(), "validation": SplitSpec(), "test": SplitSpec()},
        description=f"{'regression' if regression else 'classification'} on {train.name} "
                    f"(card built from the files{positive})",
        defaults=dict(CLASSIFICATION_DEFAULTS), path=str(train))


def _text_columns(table, path: Path, label: str, chosen: list[str] | None) -> list[str]:
    """--text_columns, else sentence1/sentence2, else the first one or two text columns other than the label
    (and idx)."""
    if chosen:
        if not 1 <= len(chosen) <= 2:
            raise DataError(f"--text_columns: give one or two columns, got {len(chosen)}")
        check_columns(table, path, chosen, "the columns named by --text_columns")
        return list(chosen)
    names = [c for c in table.column_names if c not in (label, "idx")]
    if "sentence1" in names and "sentence2" in names:
        return ["sentence1", "sentence2"]
    textual = [c for c in names if getattr(table.features[c], "dtype", None) in _TEXT_TYPES]
    if not textual:
        raise DataError(f"{path}: no text column besides the label {label!r} (found: "
                        f"{', '.join(table.column_names)}); expected one or two columns of text")
    return textual[:2]


def _kind(value) -> str | None:
    """'number', 'text' or None (missing) of one label value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return "number" if isinstance(value, str) and _NUMBER.fullmatch(value.strip()) else "text"


def _check_kinds(values, path: Path, label: str) -> str:
    """The kind of every label in a column: one kind, no missing values; else a DataError naming rows."""
    first: dict[str, int] = {}
    for row, value in enumerate(values, start=1):
        kind = _kind(value)
        if isinstance(value, (list, dict)):
            raise DataError(f"{path}: row {row}: label {value!r} is a {type(value).__name__}; expected a class name, "
                            "a class id or a score")
        if kind is None:
            raise DataError(f"{path}: row {row}: no label in column {label!r}; expected a label in every row")
        first.setdefault(kind, row)
    if len(first) > 1:
        raise DataError(f"{path}: column {label!r} mixes numbers (row {first['number']}: "
                        f"{values[first['number'] - 1]!r}) and text (row {first['text']}: "
                        f"{values[first['text'] - 1]!r}); expected labels of one type: class names, class ids, "
                        "or float scores")
    return next(iter(first))


def _is_regression(table, label: str, values, path: Path) -> bool:
    _check_kinds(values, path, label)
    dtype = getattr(table.features[label], "dtype", None)
    return dtype in ("float16", "float32", "float64") or (
        dtype not in _TEXT_TYPES and any(isinstance(v, float) and not v.is_integer() for v in values))


def _sorted_labels(values) -> list[str]:
    """The distinct labels as text, sorted as run_glue sorts them (numbers numerically)."""
    distinct = {label_text(v) for v in values}
    numeric = all(_NUMBER.fullmatch(v) for v in distinct)
    return sorted(distinct, key=float) if numeric else sorted(distinct)


def _check_dev_labels(values, validation: Path, train: Path, label: str, labels: list[str] | None) -> None:
    kind = _check_kinds(values, validation, label)
    if labels is None:
        if kind != "number":
            raise DataError(f"{validation}: column {label!r} holds text, but the train file {train} has float "
                            "scores (regression); expected scores")
        return
    if kind == "number" and not all(_NUMBER.fullmatch(name) for name in labels):
        first = next(iter(values))
        raise DataError(f"{validation}: column {label!r} holds numbers (row 1: {first!r}), but the train file {train} "
                        f"has class names ({', '.join(labels)}); expected labels of the train file's type")
    known = set(labels)
    for row, value in enumerate(values, start=1):
        if label_text(value) not in known:
            raise DataError(f"{validation}: row {row}: label {value!r} does not occur in the train file {train} "
                            f"(labels: {', '.join(labels)}); expected one of them")


# ---------------------------------------------------------------------------------------------- other families


def _family_card(train: Path, family: str, text_columns: list[str] | None, label_column: str | None) -> TaskCard:
    if family == "squad":
        family = "squad_v2" if _has_unanswerable(train) else "squad"
    template = load_card(FAMILY_TEMPLATES[family])
    card = copy.deepcopy(template)
    card.name, card.hub, card.paper, card.path = task_name(str(train)), None, {}, str(train)
    card.splits = {"train": SplitSpec(), "validation": SplitSpec(), "test": SplitSpec()}
    card.train_split, card.eval_splits, card.test_splits = "train", ["validation"], ["test"]
    card.index_column = template.index_column
    card.description = f"{template.family} task on {train.name} (card built from the files, settings of " \
                       f"{template.name})"
    if family == "multiple_choice":
        if text_columns:
            card.text_columns = list(text_columns)
        if label_column:
            card.label_column = label_column
        endings = _ending_columns(train)
        if endings:
            card.options = {**card.options, "endings": endings}
    if family == "ner":
        card.labels = _tag_set(train)
    return card


def _has_unanswerable(path: Path) -> bool:
    """A SQuAD file with an unanswerable question (is_impossible, or empty answers) is a v2.0 task."""
    from .adapters.squad import FILE_EXTENSIONS, is_official_json

    suffix = check_extension(path, FILE_EXTENSIONS, "squad", "the official SQuAD JSON, or id/context/question/answers "
                             "records in JSON, JSON Lines or Parquet")
    if suffix == ".json" and is_official_json(path):
        return re.search(r'"is_impossible"\s*:\s*true', path.read_text(encoding="utf-8-sig")) is not None
    table = read_data_file(path, "question records with id, context, question and answers")
    check_columns(table, path, ["id", "context", "question", "answers"], "the question-answering columns")
    return any(not answers["text"] for answers in table["answers"] if isinstance(answers, dict))


def _ending_columns(path: Path) -> list[str]:
    """ending0, ending1, ... of the file's header (records), in order; [] to keep the card's."""
    if path.suffix.lower() == ".csv":
        import csv
        import io

        from .adapters.common import read_text

        header = next(csv.reader(io.StringIO(read_text(path, "a multiple-choice CSV"), newline="")), [])
    else:
        header = read_data_file(path, "multiple-choice records").column_names
    found = sorted((int(m.group(1)), c) for c in header if (m := re.fullmatch(r"ending(\d+)", c)))
    return [c for _, c in found]


def _tag_set(path: Path) -> list[str]:
    """O, then B-/I- of every entity type the train file tags (sorted): the card's labels."""
    from .adapters.ner import CONLL_EXTENSIONS, DOCSTART, FILE_EXTENSIONS

    suffix = check_extension(path, FILE_EXTENSIONS, "ner", "a CoNLL file, or tokens/ner_tags records in JSON, "
                             "JSON Lines or Parquet")
    tags: set[str] = set()
    if suffix in CONLL_EXTENSIONS:
        from .adapters.common import read_text

        for line in read_text(path, "a CoNLL file (word ... NER per line)").splitlines():
            fields = line.split()
            if len(fields) > 1 and fields[0] != DOCSTART:
                tags.add(fields[-1])
    else:
        table = read_data_file(path, "sentence records with tokens and ner_tags")
        check_columns(table, path, ["tokens", "ner_tags"], "the token-classification columns")
        inner = getattr(table.features["ner_tags"], "feature", None)
        names = getattr(inner, "names", None)
        for row, sentence in enumerate(table["ner_tags"], start=1):
            for tag in sentence:
                if isinstance(tag, int) and names is None:
                    raise DataError(f"{path}: row {row}: ner_tags holds class ids ({tag}) without names; expected "
                                    "tag names (B-PER, I-PER, O, ...) for a task without a card")
                tags.add(names[tag] if isinstance(tag, int) else str(tag))
    if not tags:
        raise DataError(f"{path}: no NER tags found; expected training data with a tag per word")
    types = sorted({t[2:] for t in tags if t[:2] in ("B-", "I-") and len(t) > 2})
    odd = sorted(t for t in tags if t != "O" and not (t[:2] in ("B-", "I-") and len(t) > 2))
    if odd:
        raise DataError(f"{path}: tag {odd[0]!r} is not O, B-TYPE or I-TYPE; expected IOB1 or IOB2 tags")
    return ["O", *[f"{p}-{t}" for t in types for p in ("B", "I")]]


def load_run_card(model: str) -> TaskCard:
    """The card saved beside a fine-tuned checkpoint (or in its run folder: a grid's best/ sits inside it)."""
    for folder in (Path(model), Path(model).parent):
        if (folder / CARD_FILE).is_file():
            return load_card(folder / CARD_FILE)
    raise DataError(f"{model}: no {CARD_FILE} beside the checkpoint; give the TASK (a card name or path), or a "
                    "--model folder written by finetune or grid")
