"""The user's own data files (`--train_file`, `--validation_file`, `--test_file`, or a card split's
`data_file`): CSV, TSV, JSON, JSON Lines and Parquet, read with the `datasets` loaders into a dataset
in the Hub layout of the task's family, which the family's adapter then checks and converts as it
does data from the Hub. Families with a format of their own (SQuAD's nested JSON, SWAG's CSV,
CoNLL text files) read those files themselves and call `data_file_of` to find them.

Records are named by their row, counted from 1 after any header (JSON Lines: the line)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .common import DataError

# extension -> the `datasets` loader that reads it
LOADERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
ROLE_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}


def flag_of(card, split: str) -> str:
    """The command-line flag that gives this split a file (error messages)."""
    if split == card.train_split:
        return ROLE_FLAGS["train"]
    return ROLE_FLAGS["test"] if split in card.test_splits else ROLE_FLAGS["validation"]


def data_file_of(card, split: str) -> Path | None:
    """The split's `data_file` (relative to the card's folder), or None when the split has none."""
    name = card.splits[split].data_file
    if not name:
        return None
    path = Path(name).expanduser()
    if not path.is_absolute() and card.path and Path(card.path).is_file():
        path = Path(card.path).resolve().parent / path
    return path


def check_extension(path: Path, readable: tuple[str, ...], family: str, expected: str) -> str:
    """The file's extension (lower case) when the family reads it; else one DataError saying what it reads."""
    suffix = path.suffix.lower()
    if suffix in readable:
        return suffix
    if suffix not in LOADERS and suffix not in readable:
        what = f"unknown extension {suffix!r}" if suffix else "no extension"
    else:
        what = f"the {family} family cannot read {suffix} files"
    raise DataError(f"{path}: {what}; expected {expected} ({', '.join(readable)})")


def read_data_file(path: Path, expected: str) -> datasets.Dataset:  # noqa: F821
    """A CSV/TSV/JSON/JSON Lines/Parquet file as a dataset (its own columns). A missing or empty file,
    a file with no rows and a file the loader cannot parse are one DataError each, naming the file."""
    import datasets

    if not path.is_file():
        raise DataError(f"{path}: file not found; expected {expected}")
    if path.stat().st_size == 0:
        raise DataError(f"{path}: empty file; expected {expected}")
    suffix = path.suffix.lower()
    kwargs: dict = {}
    if suffix == ".tsv":  # tab-separated; quote characters are text, as in the GLUE files
        kwargs = {"delimiter": "\t", "quoting": 3}
    elif suffix == ".json":
        kwargs = _json_field(path)
    quiet = logging.getLogger("datasets")  # the loaders log a traceback before raising; our message says it
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        dataset = datasets.load_dataset(LOADERS[suffix], data_files=str(path), split="train", **kwargs)
    except ValueError as err:
        if "corresponds to no data" in str(err):  # a header and no rows
            raise DataError(f"{path}: no data rows (header only?); expected {expected}") from None
        raise _unreadable(path, suffix, err) from None
    except Exception as err:  # the loaders' parse errors are many types (pandas, pyarrow, json)
        if suffix in (".json", ".jsonl"):  # the loader's message has no line; find the line ourselves
            problem = _json_problem(path)
            if problem:
                raise problem from None
        raise _unreadable(path, suffix, err) from None
    finally:
        quiet.setLevel(level)
    if len(dataset) == 0:
        raise DataError(f"{path}: no data rows; expected {expected}")
    return dataset


def _json_field(path: Path) -> dict:
    """`field="data"` for a JSON object holding its records under "data" (as the transformers examples
    write them); a JSON list of objects and JSON Lines need nothing."""
    with open(path, encoding="utf-8-sig") as f:
        head = f.read(1 << 16).lstrip()
    if not head.startswith("{"):
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}  # JSON Lines (one object per line), or broken: the loader says which
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        return {"field": "data"}
    return {}


def _json_problem(path: Path) -> DataError | None:
    """The first line of a JSON (Lines) file that breaks it: not JSON, not an object, or a value of another
    type than the same field's earlier values (the loader needs one type per column)."""
    text = path.read_text(encoding="utf-8-sig")
    try:
        json.loads(text)
        return None  # one JSON document: the loader's message stands
    except json.JSONDecodeError as whole:
        first = next((line for line in text.splitlines() if line.strip()), "")
        try:
            json.loads(first)
        except json.JSONDecodeError:  # not JSON Lines either: the document's own error, with its line
            return DataError(f"{path}:{whole.lineno}:{whole.colno}: not valid JSON ({whole.msg}); expected a JSON "
                             "list of records, {\"data\": [...]}, or JSON Lines (one object per line)")
    kinds: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            return DataError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno}); expected one JSON "
                             "object per line")
        if not isinstance(record, dict):
            return DataError(f"{path}:{number}: a JSON {type(record).__name__}, not an object; expected one JSON "
                             "object per line")
        for key, value in record.items():
            if value is None:
                continue
            kind = "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__
            seen = kinds.setdefault(key, (kind, number))
            if seen[0] != kind:
                return DataError(f"{path}:{number}: field {key!r} is a {kind}, but a {seen[0]} on line {seen[1]}; "
                                 "expected one type per field")
    return None


def _unreadable(path: Path, suffix: str, err: Exception) -> DataError:
    cause = err
    while cause.__cause__ is not None or cause.__context__ is not None:  # the parser's own message
        cause = cause.__cause__ or cause.__context__
    reason = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else type(cause).__name__
    kind = {".csv": "CSV", ".tsv": "TSV", ".json": "JSON (or JSON Lines)", ".jsonl": "JSON Lines",
            ".parquet": "Parquet"}[suffix]
    layout = "with a header of column names" if suffix in (".csv", ".tsv") else "of records (one object per row)"
    return DataError(f"{path}: cannot read it as {kind} ({type(cause).__name__}: {reason}); expected a {kind} file "
                     f"{layout}")


def check_columns(dataset, path: Path, wanted: list[str], what: str) -> None:
    """Each of `wanted` is a column of the file; else one DataError naming the column and those found."""
    missing = [c for c in wanted if c not in dataset.column_names]
    if missing:
        raise DataError(f"{path}: no column {missing[0]!r}; expected {what} ({', '.join(wanted)}; found: "
                        f"{', '.join(dataset.column_names)})")


def label_text(value) -> str:
    """A label as text: 1, 1.0 and "1" alike (CSV readers and JSON give class names and ids either way)."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value).strip()


def row_index(dataset, path: Path) -> list[int]:
    """The rows' `idx` column (integers, e.g. GLUE's test index) when the file has one, else 0, 1, ..."""
    if "idx" not in dataset.column_names:
        return list(range(len(dataset)))
    out = []
    for row, value in enumerate(dataset["idx"], start=1):
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().isdigit():
                value = int(value)
            else:
                raise DataError(f"{path}: row {row}: idx {value!r} is not an integer; expected the row's index "
                                "(or no idx column: rows are numbered 0, 1, ...)")
        out.append(value)
    return out
