"""Extractive question answering on SQuAD v1.1 / v2.0 (and any file in the official SQuAD JSON layout).

load -> `datasets.Dataset` of questions in the Hub (`rajpurkar/squad`) layout: id, title, context, question,
answers = {"text": [...], "answer_start": [...]} (empty lists for an unanswerable v2.0 question).

preprocess -> features, one per window of the context: `[CLS] question [SEP] window [SEP]`, token_type_ids 0 up
to and including the first [SEP], 1 after it, no padding (the collator pads per batch), labels
`start_positions` / `end_positions` (the first answer's tokens when the window holds all of it, else 0, the
[CLS] index). Evaluation features also carry `example_id`, `offset_mapping` (character span of each window
token in the original context, [-1, -1] for question and special tokens) and `token_is_max_context`.

Windows follow the reference meaning of `doc_stride`: the step between the starts of consecutive windows.
With a question of q tokens, a window holds `max_seq_length - q - 3` context tokens and the next window starts
`min(window length, doc_stride)` tokens later. The tokenizer's own `stride` argument means something else, the
number of tokens shared by consecutive windows, i.e. `window length - doc_stride`; since the window length
depends on each question's length, no single `stride` value gives the reference windows, so they are built here
from separately tokenised questions and contexts.

postprocess -> answer texts: candidate spans from each feature's top `n_best_size` start and end logits, only
inside the context, `end >= start`, at most `max_answer_length` tokens, starting on a token whose window is its
max-context window; candidates of all windows of a question are pooled and ranked by start + end logit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from ..cards import TaskCard
from ..io import atomic_write_text
from ..metrics import squad as scorer
from .common import DataError, family_options, load_hub_split, max_context_windows, read_text, split_file_stem
from .common import window_starts as shared_window_starts
from .files import check_columns, check_extension, data_file_of, read_data_file


def __getattr__(name: str):
    """MODEL_CLASS (BertSuiteForQuestionAnswering), imported when asked for: reading a split needs no torch."""
    if name == "MODEL_CLASS":
        from ..modeling_bert_suite import BertSuiteForQuestionAnswering

        return BertSuiteForQuestionAnswering
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METRICS_USE_EXAMPLES = True  # metric_fn reads the split's examples (see runner.train_and_evaluate)
THRESHOLD_KEY = "null_score_diff_threshold"

OPTION_DEFAULTS: dict[str, Any] = {
    "version_2_with_negative": False,
    "doc_stride": 128,
    "max_query_length": 64,
    "n_best_size": 20,
    "max_answer_length": 30,
}
# Stands in for "no answer span at all" in null_odds.json, where +inf cannot be written (JSON has no infinity):
# larger than any real score difference, so the question is predicted unanswerable at any sane threshold.
NO_SPAN_SCORE_DIFF = 1e9
MAX_REPORTED_EXAMPLES = 5

SQUAD_FEATURES = datasets.Features({
    "id": datasets.Value("string"),
    "title": datasets.Value("string"),
    "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": {"text": datasets.List(datasets.Value("string")),
                "answer_start": datasets.List(datasets.Value("int32"))},
})


def squad_options(card: TaskCard) -> dict[str, Any]:
    """The card's SQuAD settings (`card.options`) over the reference defaults."""
    return family_options(card, OPTION_DEFAULTS, "SQuAD")


# ----------------------------------------------------------------------------------------------------------------
# Reading


def answer_is_bad(context: str, text: Any, start: Any) -> bool:
    """True when an answer cannot be located: empty text, `answer_start` out of range, or the text differs
    from the context at `answer_start`."""
    if not isinstance(text, str) or not text or not isinstance(start, int) or isinstance(start, bool):
        return True
    return start < 0 or start + len(text) > len(context) or context[start:start + len(text)] != text


def _new_report() -> dict[str, Any]:
    return {"bad_answers": 0, "examples": [], "skipped_questions": 0}


def _note_bad_answer(report: dict, qid: str, title: str, context: str, text: str, start: int) -> None:
    report["bad_answers"] += 1
    if len(report["examples"]) < MAX_REPORTED_EXAMPLES:
        found = context[start:start + len(text)] if isinstance(start, int) and 0 <= start <= len(context) else None
        report["examples"].append({"id": qid, "title": title, "text": text, "answer_start": start,
                                   "context_at_answer_start": found})


def read_squad_json(path: str | Path, skip_bad: bool = True, *, skip_bad_rows: bool = False,
                    require_answers: bool = True) -> tuple[datasets.Dataset, dict[str, Any]]:
    """Read an official SQuAD v1.1 / v2.0 JSON file into the Hub layout.

    Returns the dataset and a report `{"bad_answers": n, "examples": [...up to 5], "skipped_questions": m}`.
    A bad answer (empty text, `answer_start` out of range, text not equal to the context there) is counted and
    kept when `skip_bad` (evaluation only uses answer texts; training drops such questions in `preprocess`),
    and is an error otherwise. A malformed question (empty question, empty context, duplicate id, answerable
    without answers, unless `require_answers` is off: new data to predict) is an error naming the file and the
    question, or, with `skip_bad_rows`, left out and counted in `skipped_questions`. Questions marked `is_impossible` get empty answers (plausible answers are
    not kept)."""
    path = Path(path)
    text = read_text(path, "a SQuAD JSON file (e.g. train-v1.1.json, dev-v1.1.json)")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}:{err.colno}: not valid JSON ({err.msg}); expected the SQuAD layout "
                        '{"version": ..., "data": [...]}') from None
    if not isinstance(document, dict) or not isinstance(document.get("data"), list):
        raise DataError(f'{path}: expected a JSON object with a "data" list of articles (the SQuAD layout)')
    report = _new_report()

    def questions():
        for a_index, article in enumerate(document["data"]):
            yield from _article_questions(path, a_index, article, report, skip_bad, require_answers)

    return _collect(path, questions(), report, skip_bad_rows), report


def _article_questions(path: Path, a_index: int, article: Any, report: dict, skip_bad: bool, require_answers: bool):
    """Readers of one article's questions (each raises a DataError for a bad question); a malformed article or
    a question without an id is an error at once."""
    if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
        raise DataError(f'{path}: article {a_index} ({_title_of(article)!r}): expected an object with a '
                        '"paragraphs" list')
    title = _title_of(article)
    for p_index, paragraph in enumerate(article["paragraphs"]):
        where = f"{path}: article {title!r}, paragraph {p_index}"
        if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
            raise DataError(f'{where}: expected an object with "context" and a "qas" list')
        context = paragraph.get("context")
        if not isinstance(context, str):
            raise DataError(f'{where}: "context" must be a string, got {type(context).__name__}')
        for qa in paragraph["qas"]:
            if not isinstance(qa, dict):
                raise DataError(f"{where}: expected question objects in qas, got {type(qa).__name__}")
            qid = qa.get("id")
            if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
                raise DataError(f'{where}: a question has no "id" (expected a non-empty string)')
            yield lambda seen, qa=qa, qid=str(qid), context=context: _read_question(
                path, title, context, qa, qid, seen, report, skip_bad, require_answers)


def _collect(path: Path, questions, report: dict, skip_bad_rows: bool) -> datasets.Dataset:
    """Run each question's reader (given the ids seen so far) into a dataset in the Hub layout; a bad
    question is an error, or with `skip_bad_rows` left out and counted in the report."""
    columns: dict[str, list] = {"id": [], "title": [], "context": [], "question": [], "answers": []}
    seen: dict[str, str] = {}  # question id -> title of its article
    for read in questions:
        try:
            record = read(seen)
        except DataError:
            if not skip_bad_rows:
                raise
            report["skipped_questions"] += 1
            continue
        seen[record["id"]] = record["title"]
        for name, value in record.items():
            columns[name].append(value)
    if not columns["id"]:
        raise DataError(f"{path}: no usable questions in the file")
    info = datasets.DatasetInfo(description=str(path), features=SQUAD_FEATURES)  # preprocess names the file by it
    return datasets.Dataset.from_dict(columns, features=SQUAD_FEATURES, info=info)


def _title_of(article: Any) -> str:
    title = article.get("title", "") if isinstance(article, dict) else ""
    return title if isinstance(title, str) else str(title)


def _read_question(path: Path, title: str, context: str, qa: dict, qid: str, seen: dict[str, str],
                   report: dict, skip_bad: bool, require_answers: bool = True) -> dict[str, Any]:
    """One validated question record; raises a DataError naming the file, article and question id."""
    where = f"{path}: question {qid!r} (article {title!r})"
    if qid in seen:
        raise DataError(f"{where}: duplicate question id (first seen in article {seen[qid]!r}); ids must be unique")
    if not context.strip():
        raise DataError(f"{where}: empty context; expected the paragraph text")
    question = qa.get("question")
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: empty question; expected the question text")
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise DataError(f'{where}: "is_impossible" must be true or false, got {impossible!r}')
    answers = qa.get("answers", [])
    if not isinstance(answers, list) or not all(isinstance(a, dict) for a in answers):
        raise DataError(f'{where}: "answers" must be a list of {{"text", "answer_start"}} objects')
    texts, starts = [], []
    if not impossible:
        if not answers and require_answers:
            raise DataError(f"{where}: answerable question (no is_impossible: true) without answers; expected at "
                            "least one answer")
        for answer in answers:
            text, start = answer.get("text"), answer.get("answer_start")
            if not isinstance(text, str) or not isinstance(start, int) or isinstance(start, bool):
                raise DataError(f'{where}: an answer needs a string "text" and an integer "answer_start", got '
                                f"{answer!r}")
            if answer_is_bad(context, text, start):
                if not skip_bad:
                    raise DataError(f"{where}: answer {text!r} does not match the context at answer_start {start} "
                                    f"(found {context[start:start + len(text)]!r})")
                _note_bad_answer(report, qid, title, context, text, start)
            texts.append(text)
            starts.append(start)
    return {"id": qid, "title": title, "context": context, "question": question,
            "answers": {"text": texts, "answer_start": starts}}


def answer_report(dataset: datasets.Dataset) -> dict[str, Any]:
    """Count bad answers (see `answer_is_bad`) of a dataset in the Hub layout (e.g. loaded from the Hub)."""
    report = _new_report()
    has_title = "title" in dataset.column_names
    for batch in dataset.select_columns([c for c in ("id", "title", "context", "answers")
                                         if c != "title" or has_title]).iter(batch_size=1000):
        titles = batch["title"] if has_title else [""] * len(batch["id"])
        for qid, title, context, answers in zip(batch["id"], titles, batch["context"], batch["answers"],
                                                strict=True):
            for text, start in zip(answers["text"], answers["answer_start"], strict=True):
                if answer_is_bad(context, text, start):
                    _note_bad_answer(report, qid, title, context, text, start)
    return report


FILE_EXTENSIONS = (".json", ".jsonl", ".parquet")
HUB_COLUMNS = ("id", "context", "question", "answers")


_PARAGRAPHS_KEY = re.compile(r'(?<!\\)"paragraphs"\s*:')


def is_official_json(path: Path) -> bool:
    """Whether a .json file is in the official nested layout ({"data": [{"title": ..., "paragraphs": ...}]}),
    from its first 64 KB (the first article's "paragraphs" key), so that the file is parsed once, by its
    reader; a flat record file has no such key."""
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            head = f.read(1 << 16)
    except OSError:
        return False  # not there: the generic reader names the problem
    return head.lstrip().startswith("{") and _PARAGRAPHS_KEY.search(head) is not None


def read_squad_file(card: TaskCard, split: str, path: Path, skip_bad_rows: bool = False
                    ) -> tuple[datasets.Dataset, dict[str, Any]]:
    """One split from a data file: the official nested JSON, or flat records in the Hub layout (id, context,
    question, answers = {"text": [...], "answer_start": [...]}; title optional) as JSON, JSON Lines or Parquet,
    as the transformers question-answering example reads them. Each record is checked as a question of the
    official file is; in a v2.0 task, empty answers mark an unanswerable question."""
    suffix = check_extension(path, FILE_EXTENSIONS, "squad",
                             "the official SQuAD JSON, or id/context/question/answers records in JSON, JSON Lines "
                             "or Parquet")
    training = split == card.train_split
    if suffix == ".json" and is_official_json(path):
        return read_squad_json(path, skip_bad=True, skip_bad_rows=skip_bad_rows, require_answers=training)
    table = read_data_file(path, "question records with id, context, question and answers")
    labelled = "answers" in table.column_names
    check_columns(table, path, list(HUB_COLUMNS if labelled or training else HUB_COLUMNS[:3]),
                  "the question-answering columns")
    version_2 = bool(squad_options(card)["version_2_with_negative"])
    report = _new_report()
    has_title = "title" in table.column_names

    def question(row: int, record: dict):
        """The reader of one record (see `_collect`): the official file's checks, on the record's fields."""
        def read(seen):
            title = str(record["title"]) if has_title and record["title"] is not None else ""
            qid = record["id"]
            if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid) == "":
                raise DataError(f"{path}: row {row}: no id; expected a non-empty question id")
            context, answers = record["context"], record.get("answers") if labelled else None
            if not isinstance(context, str):
                raise DataError(f"{path}: row {row} (question {qid!r}): context must be text, got {context!r}")
            if answers is not None and not (isinstance(answers, dict) and isinstance(answers.get("text"), list)
                                            and isinstance(answers.get("answer_start"), list)
                                            and len(answers["text"]) == len(answers["answer_start"])):
                raise DataError(f'{path}: row {row} (question {qid!r}): answers must be {{"text": [...], '
                                f'"answer_start": [...]}} of equal length, got {answers!r}')
            pairs = [] if answers is None else [{"text": t, "answer_start": a}
                                                for t, a in zip(answers["text"], answers["answer_start"], strict=True)]
            qa = {"question": record["question"], "answers": pairs, "is_impossible": version_2 and not pairs}
            return _read_question(Path(f"{path}: row {row}"), title, context, qa, str(qid), seen, report,
                                  skip_bad=True, require_answers=training)
        return read

    questions = (question(row, record) for row, record in enumerate(table, start=1))
    return _collect(path, questions, report, skip_bad_rows), report


def load_split(card: TaskCard, split: str, data_dir: str | Path | None = None,
               skip_bad_rows: bool = False) -> datasets.Dataset:
    """One split of questions: from `data_dir` (the folder with the card's JSON files, or one .json file) when
    given, else from the Hub. Prints the number of bad answers when there are any."""
    spec = card.splits[split]
    data_file = data_file_of(card, split)
    if data_file is not None:
        dataset, report = read_squad_file(card, split, data_file, skip_bad_rows)
        source = str(data_file)
    elif data_dir is not None:
        path = Path(data_dir)
        if not (path.suffix.lower() == ".json" and not path.is_dir()):
            if spec.file is None:
                raise DataError(f"{card.path}: split {split!r} has no local file; pass the .json file itself as "
                                "--data_dir or remove --data_dir to use the Hub")
            path = path / spec.file
        dataset, report = read_squad_json(path, skip_bad=True, skip_bad_rows=skip_bad_rows,
                                          require_answers=split == card.train_split)
        source = str(path)
    else:
        dataset, source = load_hub_split(card, split, "the SQuAD JSON files (e.g. dev-v1.1.json)")
        missing = [c for c in ("id", "context", "question", "answers") if c not in dataset.column_names]
        if missing:
            raise DataError(f"{source}: no column {missing[0]!r}; expected the rajpurkar/squad layout")
        dataset.info.description = source  # preprocess names the data by it in its messages
        report = answer_report(dataset)
    if report["bad_answers"]:
        print(f"[bert_suite] {source}: {report['bad_answers']} answers do not match the context at answer_start "
              f"(first: {report['examples'][0]['id']}); kept for evaluation, a training question whose first "
              "answer is one of them is skipped")
    if report["skipped_questions"]:
        print(f"[bert_suite] {source}: skipped {report['skipped_questions']} malformed questions (--skip_bad_rows)")
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Pre-processing


def window_starts(num_tokens: int, window_length: int, doc_stride: int) -> list[int]:
    """Start positions of the windows over `num_tokens` context tokens: 0, then steps of
    min(window_length, doc_stride), ending with the first window that reaches the last token (one window,
    possibly empty, when the context has no tokens)."""
    if window_length < 1 or doc_stride < 1:
        raise ValueError(f"window length ({window_length}) and doc_stride ({doc_stride}) must be positive")
    return shared_window_starts(num_tokens, window_length, min(window_length, doc_stride)).tolist()


def answer_token_span(token_starts: np.ndarray, token_ends: np.ndarray, char_start: int,
                      char_end: int) -> tuple[int, int] | None:
    """Context token indices (inclusive) covering characters [char_start, char_end): from the token containing
    (or, on white space, following) the first character to the token containing the last one, so an answer
    that ends inside a word includes that word's token. None when no token overlaps the answer."""
    first = int(np.searchsorted(token_ends, char_start, side="right"))  # first token ending after char_start
    last = int(np.searchsorted(token_starts, char_end, side="left")) - 1  # last token starting before char_end
    if first >= len(token_starts) or last < first:
        return None
    return first, last


def _first_answer(context: str, answers: dict) -> tuple[int, int] | None:
    """Character span of the first answer, None for an unanswerable question or a bad first answer."""
    if not answers["text"]:
        return None
    text, start = answers["text"][0], answers["answer_start"][0]
    return None if answer_is_bad(context, text, start) else (start, start + len(text))


def _scan_training_answers(dataset: datasets.Dataset, version_2: bool, source: str) -> int:
    """Number of training questions whose first answer is bad (they are skipped); a v1 card's training data
    must not contain unanswerable questions."""
    bad = 0
    for batch in dataset.select_columns(["id", "context", "answers"]).iter(batch_size=1000):
        for qid, context, answers in zip(batch["id"], batch["context"], batch["answers"], strict=True):
            if not answers["text"]:
                if not version_2:
                    raise DataError(f"{source}: question {qid!r} has no answer, but the card is SQuAD v1 "
                                    "(version_2_with_negative false); use a v2.0 card for unanswerable questions")
                continue
            bad += _first_answer(context, answers) is None
    return bad


def preprocess(dataset: datasets.Dataset, card: TaskCard, tokenizer, max_seq_length: int, train: bool, *,
               source: str | None = None) -> datasets.Dataset:
    """Questions -> features (one per context window), with labels; see the module docstring.

    Training drops the questions whose first answer is bad (counted and printed once, naming `source`, by
    default the file or Hub split the dataset was loaded from); evaluation keeps every question."""
    options = squad_options(card)
    doc_stride, max_query_length = int(options["doc_stride"]), int(options["max_query_length"])
    if doc_stride < 1 or max_query_length < 1:
        raise ValueError(f"doc_stride ({doc_stride}) and max_query_length ({max_query_length}) must be positive")
    if max_seq_length - max_query_length - 3 < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the context after a question of up "
                         f"to max_query_length {max_query_length} tokens and 3 special tokens; raise "
                         "max_seq_length or lower max_query_length")
    source = source or dataset.info.description or f"{card.name} data"
    if train:
        skipped = _scan_training_answers(dataset, bool(options["version_2_with_negative"]), source)
        if skipped:
            print(f"[bert_suite] {source}: skipped {skipped} training questions whose answer does not match the "
                  "context at answer_start")

    def encode(batch: dict[str, list]) -> dict[str, list]:
        return _encode_batch(batch, tokenizer, max_seq_length, doc_stride, max_query_length, train)

    features = dataset.map(encode, batched=True, remove_columns=dataset.column_names,
                           desc=f"tokenising {card.name} ({'train' if train else 'eval'})")
    if len(features) == 0:
        why = f"all {len(dataset)} skipped: their first answer does not match the context at answer_start" \
            if train and skipped == len(dataset) else "no features"
        raise DataError(f"{source}: no usable questions left after pre-processing ({why}); expected at least one "
                        "question whose answer text is found at its answer_start")
    return features


def _encode_batch(batch: dict[str, list], tokenizer, max_seq_length: int, doc_stride: int, max_query_length: int,
                  train: bool) -> dict[str, list]:
    questions = tokenizer(batch["question"], add_special_tokens=False, truncation=True, max_length=max_query_length,
                          return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    # Several questions share a paragraph (about five in SQuAD): tokenise each distinct context once.
    slot: dict[str, int] = {}
    context_slot = [slot.setdefault(c, len(slot)) for c in batch["context"]]
    encoded = tokenizer(list(slot), add_special_tokens=False, return_offsets_mapping=True,
                        return_attention_mask=False, return_token_type_ids=False, verbose=False)
    offsets = [np.asarray(o, dtype=np.int64).reshape(-1, 2) for o in encoded["offset_mapping"]]
    offset_lists = [o.tolist() for o in offsets] if not train else None
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    out: dict[str, list] = {"input_ids": [], "token_type_ids": [], "attention_mask": [], "start_positions": [],
                            "end_positions": []}
    if not train:
        out.update(example_id=[], offset_mapping=[], token_is_max_context=[])
    for i, question in enumerate(questions):
        k = context_slot[i]
        context_ids, context_offsets = encoded["input_ids"][k], offsets[k]
        num_tokens = len(context_ids)
        answer = _first_answer(batch["context"][i], batch["answers"][i])
        if train and answer is None and batch["answers"][i]["text"]:
            continue  # bad first answer: not a training example (counted in preprocess)
        span = None
        if answer is not None:
            span = answer_token_span(context_offsets[:, 0], context_offsets[:, 1], *answer)
        window_length = max_seq_length - len(question) - 3
        starts = window_starts(num_tokens, window_length, doc_stride)
        best_window = None if train else max_context_windows(  # the window each token is read from
            np.arange(num_tokens), num_tokens, window_length, min(window_length, doc_stride), length_bonus=True)
        prefix = [cls_id, *question, sep_id]
        shift = len(prefix)  # position of the window's first token in the sequence
        for w, begin in enumerate(starts):
            end = min(begin + window_length, num_tokens)
            ids = prefix + context_ids[begin:end] + [sep_id]
            out["input_ids"].append(ids)
            out["token_type_ids"].append([0] * shift + [1] * (end - begin + 1))
            out["attention_mask"].append([1] * len(ids))
            if span is not None and begin <= span[0] and span[1] < end:
                out["start_positions"].append(span[0] - begin + shift)
                out["end_positions"].append(span[1] - begin + shift)
            else:
                out["start_positions"].append(0)
                out["end_positions"].append(0)
            if not train:
                out["example_id"].append(batch["id"][i])
                out["offset_mapping"].append([[-1, -1]] * shift + offset_lists[k][begin:end] + [[-1, -1]])
                out["token_is_max_context"].append([False] * shift + (best_window[begin:end] == w).tolist()
                                                   + [False])
    return out


# ----------------------------------------------------------------------------------------------------------------
# Post-processing


def _list_column(features: Any, name: str) -> pa.Array:
    """A list-valued column as one Arrow list array (row order as the dataset shows it)."""
    if isinstance(features, datasets.Dataset):
        column = features.with_format("arrow")[name]
        column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    else:
        column = pa.array(list(features[name]))
    return column


def _row_lengths(column: pa.Array) -> np.ndarray:
    bounds = column.offsets.to_numpy()
    return np.diff(bounds).astype(np.int64)


def postprocess(examples: Any, features: Any, start_logits: np.ndarray, end_logits: np.ndarray,
                n_best_size: int = 20, max_answer_length: int = 30, version_2: bool = False,
                null_threshold: float = 0.0) -> dict[str, dict]:
    """Logits of evaluation features -> answers per question.

    `examples` has columns id and context; `features` (from `preprocess(train=False)`, same order as the
    logits) has example_id, offset_mapping and token_is_max_context; logits are [num_features, padded length],
    positions past a feature's length (Trainer's -100 padding) are ignored.

    Returns {"predictions": id -> text, "nbest": id -> [{"text", "probability", "start_logit", "end_logit"}, ...]
    best first (probabilities: softmax over the listed entries' start + end logits), "best_non_null": id -> text,
    and for v2 "null_odds": id -> score_diff}.

    v2: the null score of a question is the minimum over its windows of start_logit[CLS] + end_logit[CLS];
    score_diff = null score - best non-null span score, and the prediction is "" (no answer) when
    score_diff > null_threshold. This is the convention of the reference's --null_score_diff_threshold; the
    paper's tau (predict the span when s_span > s_null + tau) is its negative. The null entry is listed in the
    n-best list at its score (so the list may hold n_best_size + 1 entries).

    A question without any valid span (or without features) gets best_non_null "" and, in v1, the prediction "";
    its n-best list is a single empty answer with logits 0 (v1) and its score_diff is NO_SPAN_SCORE_DIFF (1e9, a
    finite stand-in for +inf so null_odds.json stays valid JSON)."""
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    if start_logits.ndim != 2 or start_logits.shape != end_logits.shape:
        raise ValueError(f"start/end logits must be two arrays of the same 2-D shape, got {start_logits.shape} and "
                         f"{end_logits.shape}")
    num_features, width = start_logits.shape
    example_ids = [str(x) for x in examples["id"]]
    contexts = list(examples["context"])
    index_of = {qid: i for i, qid in enumerate(example_ids)}
    feature_example_ids = list(features["example_id"])
    if len(feature_example_ids) != num_features:
        raise ValueError(f"{len(feature_example_ids)} features but logits for {num_features}")
    try:
        feature_example = np.fromiter((index_of[str(x)] for x in feature_example_ids), dtype=np.int64,
                                      count=num_features)
    except KeyError as err:
        raise ValueError(f"feature of question {err.args[0]!r}, which is not among the examples") from None

    # Shapes: F features, L = width (padded length), Q questions, K = min(n_best_size, L), C candidate spans.
    # 1. Per-feature token tables [F, L] padded to the logits' width: character offsets (-1: not a context
    #    token) and the max-context flags, scattered from the flat Arrow values in one step.
    offset_column = _list_column(features, "offset_mapping")
    lengths = _row_lengths(offset_column)
    if num_features and lengths.max(initial=0) > width:
        raise ValueError(f"a feature has {lengths.max()} tokens but the logits only {width} positions")
    valid = np.arange(width)[None, :] < lengths[:, None]
    flat_offsets = offset_column.flatten().flatten().to_numpy(zero_copy_only=False).reshape(-1, 2)
    char_start = np.full((num_features, width), -1, dtype=np.int64)
    char_end = np.full((num_features, width), -1, dtype=np.int64)
    char_start[valid], char_end[valid] = flat_offsets[:, 0], flat_offsets[:, 1]
    max_context = np.zeros((num_features, width), dtype=bool)
    flags = _list_column(features, "token_is_max_context").flatten().to_numpy(zero_copy_only=False)
    max_context[valid] = flags.astype(bool)
    in_context = char_start >= 0

    # 2. Candidates: the K best starts x the K best ends of each feature [F, K, K], kept when both lie in the
    #    context, the span is short enough, and its start is read from its max-context window.
    masked_start = np.where(valid, start_logits, -np.inf)
    masked_end = np.where(valid, end_logits, -np.inf)
    k = max(1, min(n_best_size, width))
    top_start = np.argsort(-masked_start, axis=1, kind="stable")[:, :k]  # ties: the lower position first
    top_end = np.argsort(-masked_end, axis=1, kind="stable")[:, :k]
    rows = np.arange(num_features)[:, None, None]
    s = top_start[:, :, None]
    e = top_end[:, None, :]
    ok = (in_context[rows, s] & in_context[rows, e] & (e >= s) & (e - s + 1 <= max_answer_length)
          & max_context[rows, s])
    feature, a, b = np.nonzero(ok)  # [C] each
    cand_start, cand_end = top_start[feature, a], top_end[feature, b]
    cand_score = masked_start[feature, cand_start] + masked_end[feature, cand_end]
    cand_example = feature_example[feature]
    # 3. Pool the candidates of all windows of a question: sort by question, then best score first; the
    #    candidates of question i are then [bounds[i], bounds[i + 1]).
    order = np.lexsort((-cand_score, cand_example))  # by question, then best score first (stable on ties)
    feature, cand_start, cand_end = feature[order], cand_start[order], cand_end[order]
    cand_example, cand_score = cand_example[order], cand_score[order]
    bounds = np.searchsorted(cand_example, np.arange(len(example_ids) + 1))

    # 4. v2: each question's null score comes from its feature with the lowest start[CLS] + end[CLS].
    if version_2 and num_features:
        null_scores = start_logits[:, 0] + end_logits[:, 0]
        by_null = np.lexsort((null_scores, feature_example))  # per question, the feature with the lowest null first
        first = np.ones(num_features, dtype=bool)
        first[1:] = feature_example[by_null][1:] != feature_example[by_null][:-1]
        null_feature = dict(zip(feature_example[by_null][first].tolist(), by_null[first].tolist(), strict=True))
    else:
        null_feature = {}

    # 5. Per question: the n-best texts, the null entry at its rank (v2), the threshold, the probabilities.
    predictions, nbest, best_non_null, null_odds = {}, {}, {}, {}
    for i, qid in enumerate(example_ids):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        hi = min(hi, lo + n_best_size)
        context = contexts[i]
        entries = [{"text": context[char_start[f, st]:char_end[f, en]], "start_logit": float(start_logits[f, st]),
                    "end_logit": float(end_logits[f, en]), "score": float(sc)}
                   for f, st, en, sc in zip(feature[lo:hi].tolist(), cand_start[lo:hi].tolist(),
                                            cand_end[lo:hi].tolist(), cand_score[lo:hi].tolist(), strict=True)]
        best_non_null[qid] = entries[0]["text"] if entries else ""
        if version_2:
            f = null_feature.get(i)
            if f is None:
                score_diff = NO_SPAN_SCORE_DIFF
            else:
                null = {"text": "", "start_logit": float(start_logits[f, 0]), "end_logit": float(end_logits[f, 0])}
                null["score"] = null["start_logit"] + null["end_logit"]
                score_diff = null["score"] - entries[0]["score"] if entries else NO_SPAN_SCORE_DIFF
                at = next((j for j, entry in enumerate(entries) if entry["score"] < null["score"]), len(entries))
                entries.insert(at, null)
            null_odds[qid] = float(score_diff)
            predictions[qid] = "" if score_diff > null_threshold else best_non_null[qid]
        else:
            predictions[qid] = best_non_null[qid]
        if not entries:
            entries = [{"text": "", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0}]
        nbest[qid] = _with_probabilities(entries)
    result = {"predictions": predictions, "nbest": nbest, "best_non_null": best_non_null}
    if version_2:
        result["null_odds"] = null_odds
    return result


def _with_probabilities(entries: list[dict]) -> list[dict]:
    """Entries with "probability" (softmax of their scores) in place of "score"."""
    scores = np.array([entry["score"] for entry in entries], dtype=np.float64)
    weights = np.exp(scores - scores.max())
    probabilities = weights / weights.sum()
    return [{"text": entry["text"], "probability": float(p), "start_logit": entry["start_logit"],
             "end_logit": entry["end_logit"]} for entry, p in zip(entries, probabilities, strict=True)]


def write_prediction_files(out_dir: str | Path, result: dict[str, dict], version_2: bool) -> list[Path]:
    """Write predictions.json (id -> text), nbest_predictions.json and, for v2, null_odds.json (the official
    scorer's --na-prob-file input) into `out_dir`, UTF-8 and atomically. Returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[tuple[str, dict]] = [("predictions.json", result["predictions"]),
                                     ("nbest_predictions.json", result["nbest"])]
    if version_2:
        files.append(("null_odds.json", result["null_odds"]))
    written = []
    for name, content in files:
        try:  # allow_nan=False: Infinity/NaN are not JSON, and the scorer cannot read them
            text = json.dumps(content, ensure_ascii=False, indent=2, allow_nan=False) + "\n"
        except ValueError as err:
            raise ValueError(f"{out_dir / name}: cannot write non-finite scores as JSON ({err})") from None
        written.append(atomic_write_text(out_dir / name, text))
    return written


# ----------------------------------------------------------------------------------------------------------------
# The runner's family contract (see runner.py)


def model_kwargs(card: TaskCard) -> dict:
    return {}


def _logits(predictions) -> tuple[np.ndarray, np.ndarray]:
    start, end = predictions[:2] if isinstance(predictions, (tuple, list)) else predictions
    return np.asarray(start), np.asarray(end)


def _score(card: TaskCard, examples, result: dict) -> dict[str, float]:
    """Official-equivalent dev scores as fractions (like the GLUE metrics; reports print percentages).
    v2: EM/F1 at threshold 0 over the best non-null answers and their score differences, plus the best
    threshold's (every threshold searched honestly, since every question's best span is scored)."""
    gold = scorer.gold_from_examples(examples.select_columns(["id", "answers"]))
    quiet = lambda message: None  # noqa: E731  (every question has a prediction here)
    if squad_options(card)["version_2_with_negative"]:
        raw = scorer.evaluate_v2(gold, result["best_non_null"], result["null_odds"], na_prob_thresh=0.0, warn=quiet)
    else:
        labelled = [g for g in gold if g["answers"]]
        if not labelled:
            return {}
        raw = scorer.evaluate_v1(labelled, result["predictions"], warn=quiet)
    return {k: (v if k.endswith(("thresh", "total")) else v / 100.0) for k, v in raw.items()}


def _result(card: TaskCard, examples, features, predictions, threshold: float = 0.0) -> dict:
    options = squad_options(card)
    start, end = _logits(predictions)
    return postprocess(examples, features, start, end, int(options["n_best_size"]), int(options["max_answer_length"]),
                       bool(options["version_2_with_negative"]), threshold)


def collator(tokenizer, pad_to_multiple_of: int | None = None):
    """Dynamic padding to the longest window of each batch, rounded up to a multiple of `pad_to_multiple_of`
    (evaluation-only columns are dropped by Trainer)."""
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


def metric_fn(card: TaskCard, examples, features):
    """Trainer's compute_metrics at each dev evaluation: logits of every window -> answers -> scores."""

    def compute(eval_pred):
        return _score(card, examples, _result(card, examples, features, eval_pred.predictions))

    return compute


def score_predictions(card: TaskCard, examples, features, predictions, settings: dict) -> dict[str, float]:
    """Official-equivalent scores (fractions) of a predicted split with answers (a labelled test file); {}
    without. v2 applies the null threshold chosen on dev (`settings`), as the prediction files do: no
    threshold is searched on the split scored."""
    if not any(len(a["text"]) for a in examples["answers"]):
        return {}
    result = _result(card, examples, features, predictions)
    gold = scorer.gold_from_examples(examples.select_columns(["id", "answers"]))
    quiet = lambda message: None  # noqa: E731
    if squad_options(card)["version_2_with_negative"]:
        raw = scorer.evaluate_v2(gold, result["best_non_null"], result["null_odds"],
                                 na_prob_thresh=float(settings.get(THRESHOLD_KEY, 0.0)), warn=quiet)
        raw = {k: v for k, v in raw.items() if not k.startswith("best_")}
    else:
        raw = scorer.evaluate_v1([g for g in gold if g["answers"]], result["predictions"], warn=quiet)
    return {k: (v if k.endswith(("thresh", "total")) else v / 100.0) for k, v in raw.items()}


def output_path(directory: Path, card: TaskCard, split: str) -> Path:
    return Path(directory) / split_file_stem(split) / "predictions.json"


def _chosen_threshold(card: TaskCard, examples, result: dict) -> float:
    """The best-F1 threshold of the official walk, as a threshold that reproduces that F1 when applied.
    The walk reports 0.0 when answering nothing is best, but at 0.0 every question with score_diff <= 0
    still gets its span; then the threshold goes below every score_diff, so that nothing is answered."""
    best = _score(card, examples, result)
    threshold = float(best["best_f1_thresh"])
    gold = scorer.gold_from_examples(examples.select_columns(["id", "answers"]))
    applied = scorer.evaluate_v2(gold, result["best_non_null"], result["null_odds"], na_prob_thresh=threshold,
                                 warn=lambda message: None)
    if applied["f1"] / 100.0 < best["best_f1"] - 1e-9:
        threshold = min(result["null_odds"].values()) - 1.0
    return threshold


def write_outputs(directory: Path, card: TaskCard, split: str, examples, features, predictions,
                  settings: dict) -> dict:
    """predictions.json, nbest_predictions.json and (v2) null_odds.json under directory/<split>/.

    v2 needs a null threshold: `settings` gives it (`predict`: the one saved with the checkpoint, or the
    user's); otherwise, on a labelled dev split, the threshold with the best F1 is chosen here, the files are
    written with it, and it is returned so the runner keeps it beside the checkpoint."""
    version_2 = bool(squad_options(card)["version_2_with_negative"])
    chosen = {}
    result = _result(card, examples, features, predictions)
    if version_2:
        threshold = float(settings.get(THRESHOLD_KEY, 0.0))
        # chosen on a labelled dev split only: on a test split (even a labelled one) the default applies
        if THRESHOLD_KEY not in settings and split not in card.test_splits \
                and any(len(a["text"]) for a in examples["answers"]):
            threshold = chosen[THRESHOLD_KEY] = _chosen_threshold(card, examples, result)
        # The threshold only decides between each question's best span and no answer: no second pass.
        result["predictions"] = {qid: "" if result["null_odds"][qid] > threshold else text
                                 for qid, text in result["best_non_null"].items()}
    write_prediction_files(output_path(directory, card, split).parent, result, version_2)
    return chosen
