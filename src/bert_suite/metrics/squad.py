"""SQuAD v1.1 and v2.0 scoring, equivalent to the official evaluation scripts.

`score_files` is the drop-in for `evaluate-v1.1.py` / `evaluate-v2.0.py`: same inputs (the dataset
JSON, a predictions JSON mapping question id to answer text, and for v2.0 an optional no-answer
probability JSON), same output fields in the same order, and the same values bit for bit: sums are
accumulated in data order with the same operations as the official scripts.

Deliberate differences, all on inputs the official scripts crash on or silently accept:
- v2.0 leaves questions without a prediction out of every score (the official script prints a
  message and then fails with a KeyError);
- predictions or no-answer probabilities for ids that are not in the data are errors, not ignored,
  and so is a prediction without a no-answer probability (the official script fails on it);
- after the per-question messages, one summary line counts the questions without a prediction.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import string
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
# Deletes ASCII punctuation only; other characters (accents, CJK, unicode quotes) are left alone.
_DELETE_PUNCTUATION = str.maketrans("", "", string.punctuation)
# How many offending ids an error message names.
_SHOWN_IDS = 5

Warn = Callable[[str], None]


class SquadScoreError(ValueError):
    """Inputs that cannot be scored: the message names the file (or argument) and what was expected."""


def print_to_stderr(message: str) -> None:
    """Default `warn` of the evaluation functions: print `message` on stderr."""
    print(message, file=sys.stderr)


# --------------------------------------------------------------------------------------------------
# Per-answer metrics
# --------------------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower case, delete ASCII punctuation, replace the articles a/an/the with a space, collapse white space."""
    text = text.lower().translate(_DELETE_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_score(prediction: str, gold: str) -> int:
    """1 if `prediction` and `gold` are equal after `normalize_answer`, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, *, version: int = 1) -> float:
    """Token F1 of `prediction` against `gold`, over the bags of their normalised tokens.

    0 when they share no token. `version=2` applies the v2.0 rule for empty answers: when either
    side normalises to no token at all, the score is 1 if both do and 0 otherwise (so a no-answer
    prediction is right on an unanswerable question); v1.1 scores that case 0.
    """
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if version == 2 and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    # Same operation order as the official scripts, so the float is identical.
    return (2 * precision * recall) / (precision + recall)


# --------------------------------------------------------------------------------------------------
# Gold answers
# --------------------------------------------------------------------------------------------------


def load_gold(path: str | Path) -> tuple[list[dict], int]:
    """Read an official SQuAD dataset JSON.

    Returns `([{"id": qid, "answers": [text, ...]}, ...], version)` in file order, with version 2
    when the top-level "version" is "v2.0" or any question carries "is_impossible", else 1.
    Raises SquadScoreError naming the file and the record for: unreadable or non-JSON files, no
    "data" list, a question without a string "id", a duplicate id, answers that are not a list of
    {"text": str} objects.
    """
    raw = _read_json(path, "SQuAD dataset")
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise SquadScoreError(f"{path}: expected a SQuAD dataset, a JSON object with a 'data' list of articles")
    gold: list[dict] = []
    seen: set[str] = set()
    is_v2 = raw.get("version") == "v2.0"
    for a, article in enumerate(raw["data"]):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise SquadScoreError(f"{path}: data[{a}] is not an article with a 'paragraphs' list")
        for p, paragraph in enumerate(paragraphs):
            qas = paragraph.get("qas") if isinstance(paragraph, dict) else None
            if not isinstance(qas, list):
                raise SquadScoreError(f"{path}: data[{a}].paragraphs[{p}] has no 'qas' list")
            for q, qa in enumerate(qas):
                where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise SquadScoreError(f"{path}: {where} is not a question with a string 'id'")
                qid = qa["id"]
                if qid in seen:
                    raise SquadScoreError(f"{path}: {where} repeats the question id {qid!r}")
                seen.add(qid)
                answers = qa.get("answers")
                if not isinstance(answers, list) or not all(
                    isinstance(ans, dict) and isinstance(ans.get("text"), str) for ans in answers
                ):
                    raise SquadScoreError(
                        f"{path}: {where} (id {qid!r}) needs 'answers', a list of objects with a string 'text'"
                    )
                is_v2 = is_v2 or "is_impossible" in qa
                gold.append({"id": qid, "answers": [ans["text"] for ans in answers]})
    return gold, 2 if is_v2 else 1


def predictions_by_id(predictions, field):
    """{id: prediction[field]} of Hub-layout prediction dicts ({"id", "prediction_text", ...}, as the evaluate
    modules take them); a SquadScoreError when an id comes twice."""
    by_id = {}
    for prediction in predictions:
        qid = prediction["id"]
        if qid in by_id:
            raise SquadScoreError(f"predictions: two predictions for the question id {qid!r}")
        by_id[qid] = prediction[field]
    return by_id


def gold_from_examples(examples: Iterable[Mapping[str, Any]]) -> list[dict]:
    """Gold answers of Hub-layout SQuAD examples (`rajpurkar/squad`, `rajpurkar/squad_v2`).

    `examples` is a `datasets.Dataset` or a list of dicts with the columns "id" and "answers", where
    answers is `{"text": [...], "answer_start": [...]}` (an unanswerable v2.0 question has an empty
    "text" list); the official layout, a list of `{"text": ...}` objects, is accepted too. Returns
    `[{"id": qid, "answers": [text, ...]}, ...]` in example order. Raises SquadScoreError for an
    example without an id or answers, and for duplicate ids.
    """
    column_names = getattr(examples, "column_names", None)
    if column_names is not None:
        # Two column reads instead of materialising every row with its context.
        missing = {"id", "answers"} - set(column_names)
        if missing:
            raise SquadScoreError(f"examples: dataset has no column {', '.join(sorted(missing))}")
        rows: Iterable[tuple[Any, Any]] = zip(examples["id"], examples["answers"], strict=True)
    else:
        rows = ((ex.get("id"), ex.get("answers")) for ex in examples)
    gold: list[dict] = []
    seen: set[str] = set()
    for i, (qid, answers) in enumerate(rows):
        if not isinstance(qid, str):
            raise SquadScoreError(f"examples[{i}]: expected a string 'id', got {qid!r}")
        if qid in seen:
            raise SquadScoreError(f"examples[{i}]: duplicate question id {qid!r}")
        seen.add(qid)
        gold.append({"id": qid, "answers": _answer_texts(answers, f"examples[{i}] (id {qid!r})")})
    return gold


def _answer_texts(answers: Any, where: str) -> list[str]:
    """Answer texts from the Hub layout {"text": [...]} or the official layout [{"text": ...}, ...]."""
    if isinstance(answers, Mapping) and isinstance(answers.get("text"), list | tuple):
        texts = list(answers["text"])
    elif isinstance(answers, list | tuple):
        texts = [ans.get("text") if isinstance(ans, Mapping) else ans for ans in answers]
    else:
        texts = None
    if texts is None or not all(isinstance(t, str) for t in texts):
        raise SquadScoreError(f"{where}: expected 'answers' as {{'text': [str, ...], 'answer_start': [...]}}")
    return texts


# --------------------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------------------


def evaluate_v1(gold: list[dict], predictions: Mapping[str, str], warn: Warn = print_to_stderr) -> dict:
    """Score `predictions` (id -> answer text) as `evaluate-v1.1.py` does.

    Each question scores the best EM and F1 over its gold answers; a question without a prediction
    scores 0 (with a message through `warn`) and still counts in the total. Returns
    `{"exact_match": ..., "f1": ...}` as percentages. Predictions for unknown ids are ignored.
    Raises SquadScoreError for no questions, or a question without any gold answer (v2.0 data).
    """
    _check_unique_ids(gold)
    if not gold:
        raise SquadScoreError("gold: no questions to score")
    exact_match = 0
    f1 = 0.0
    total = 0
    missing = 0
    for question in gold:
        qid = question["id"]
        total += 1
        if qid not in predictions:
            warn(f"Unanswered question {qid} will receive score 0.")
            missing += 1
            continue
        if not question["answers"]:
            raise SquadScoreError(
                f"gold: question {qid!r} has no answer; SQuAD v1.1 scoring needs one (is this v2.0 data?)"
            )
        prediction = predictions[qid]
        exact_match += max(exact_match_score(prediction, answer) for answer in question["answers"])
        # Accumulated one question at a time, in data order, as the official script does.
        f1 += max(f1_score(prediction, answer) for answer in question["answers"])
    _warn_missing_count(missing, total, warn)
    return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total}


def evaluate_v2(
    gold: list[dict],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
    warn: Warn = print_to_stderr,
) -> dict:
    """Score `predictions` (id -> answer text, "" for no answer) as `evaluate-v2.0.py` does.

    Gold answers are the answer texts that do not normalise to ""; with none left the only right
    answer is "". A question is answerable (HasAns) when its answer list is non-empty, as in the
    official script. A question without a prediction is reported through `warn` and left out of
    every score and total. With `na_probs` (id -> no-answer probability), a question with
    `na_probs[id] > na_prob_thresh` counts as answered "no answer", and the best thresholds of
    `best_threshold` are added. Returns exact, f1, total, HasAns_* / NoAns_* (for the groups that
    have scored questions), then best_exact, best_exact_thresh, best_f1, best_f1_thresh when
    `na_probs` is given; scores are percentages. Raises SquadScoreError when no question has a
    prediction, or `na_probs` lacks a scored question.
    """
    exact_raw, f1_raw, has_ans = _raw_scores_v2(gold, predictions, warn)
    if not exact_raw:
        raise SquadScoreError("predictions: none of the questions has a prediction, nothing to score")
    # Without na_probs the official script uses 0.0 for every question, so only a negative
    # threshold has an effect; kept for identical results.
    probs = _checked_na_probs(na_probs, exact_raw) if na_probs is not None else dict.fromkeys(exact_raw, 0.0)
    exact_thresh = _apply_no_answer_threshold(exact_raw, probs, has_ans, na_prob_thresh)
    f1_thresh = _apply_no_answer_threshold(f1_raw, probs, has_ans, na_prob_thresh)

    result = _eval_dict(exact_thresh, f1_thresh, list(exact_thresh))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid in exact_thresh if has_ans[qid] is wanted]
        if qids:
            for key, value in _eval_dict(exact_thresh, f1_thresh, qids).items():
                result[f"{prefix}_{key}"] = value
    if na_probs is not None:
        result.update(_best_thresholds(predictions, exact_raw, f1_raw, probs, has_ans))
    return result


def best_threshold(
    gold: list[dict],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float],
    warn: Warn = print_to_stderr,
) -> dict:
    """The no-answer thresholds that maximise EM and F1 on `gold`, as `evaluate-v2.0.py` finds them.

    For choosing the null threshold tau on dev: `predictions` holds the best non-null answer of
    every question and `na_probs` its score_diff (null score minus best non-null score). The model
    then predicts no answer when score_diff > tau, the convention of `--null_score_diff_threshold`.
    Returns `{"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"}`: scores are
    percentages, thresholds are score_diff values (0.0 when answering nothing is best).

    Walks the questions by increasing score_diff, answering one more at each step, and keeps the
    first strictly best total; ties in score_diff are walked in `na_probs` order, so with tied
    values the best total may fall inside a group that no threshold separates.
    """
    exact_raw, f1_raw, has_ans = _raw_scores_v2(gold, predictions, warn)
    if not exact_raw:
        raise SquadScoreError("predictions: none of the questions has a prediction, nothing to score")
    probs = _checked_na_probs(na_probs, exact_raw)
    return _best_thresholds(predictions, exact_raw, f1_raw, probs, has_ans)


def _raw_scores_v2(
    gold: list[dict], predictions: Mapping[str, str], warn: Warn
) -> tuple[dict[str, int], dict[str, float], dict[str, bool]]:
    """Per-question EM and F1 (before any threshold) of the questions with a prediction, and has-answer flags."""
    _check_unique_ids(gold)
    exact: dict[str, int] = {}
    f1: dict[str, float] = {}
    has_ans: dict[str, bool] = {}
    missing = 0
    for question in gold:
        qid = question["id"]
        # The official script decides answerability on the raw answer list, before normalisation.
        has_ans[qid] = bool(question["answers"])
        answers = [answer for answer in question["answers"] if normalize_answer(answer)] or [""]
        if qid not in predictions:
            warn(f"Missing prediction for {qid}")
            missing += 1
            continue
        prediction = predictions[qid]
        exact[qid] = max(exact_match_score(prediction, answer) for answer in answers)
        f1[qid] = max(f1_score(prediction, answer, version=2) for answer in answers)
    _warn_missing_count(missing, len(gold), warn)
    return exact, f1, has_ans


def _apply_no_answer_threshold(
    scores: dict[str, float], probs: Mapping[str, float], has_ans: dict[str, bool], thresh: float
) -> dict[str, float]:
    """Scores with every question whose no-answer probability exceeds `thresh` answered "no answer"."""
    return {qid: float(not has_ans[qid]) if probs[qid] > thresh else score for qid, score in scores.items()}


def _eval_dict(exact: dict[str, float], f1: dict[str, float], qids: list[str]) -> dict:
    """exact, f1 (percentages) and total over `qids`, summed in `qids` order."""
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[qid] for qid in qids) / total,
        "f1": 100.0 * sum(f1[qid] for qid in qids) / total,
        "total": total,
    }


def _best_thresholds(
    predictions: Mapping[str, str],
    exact_raw: dict[str, int],
    f1_raw: dict[str, float],
    probs: Mapping[str, float],
    has_ans: dict[str, bool],
) -> dict:
    """best_exact, best_exact_thresh, best_f1, best_f1_thresh (see `best_threshold`)."""
    best_exact, exact_thresh = _find_best_threshold(predictions, exact_raw, probs, has_ans)
    best_f1, f1_thresh = _find_best_threshold(predictions, f1_raw, probs, has_ans)
    return {
        "best_exact": best_exact,
        "best_exact_thresh": exact_thresh,
        "best_f1": best_f1,
        "best_f1_thresh": f1_thresh,
    }


def _find_best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    probs: Mapping[str, float],
    has_ans: dict[str, bool],
) -> tuple[float, float]:
    """Best total score over no-answer thresholds, as a percentage, and the threshold that reaches it."""
    # Start from answering "no answer" everywhere: 1 per unanswerable scored question.
    current = sum(1 for qid in scores if not has_ans[qid])
    best, best_thresh = current, 0.0
    # Stable sort over the caller's key order, which is how the official script breaks ties.
    for qid in sorted(probs, key=lambda k: probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            current += scores[qid]
        elif predictions[qid]:
            # The official script tests the raw prediction, so "the" or "." counts as an answer here.
            current -= 1
        if current > best:
            best, best_thresh = current, probs[qid]
    return 100.0 * best / len(scores), best_thresh


def _checked_na_probs(na_probs: Mapping[str, float], scored: Mapping[str, Any]) -> Mapping[str, float]:
    """`na_probs`, after checking that it has a number for every scored question."""
    missing = [qid for qid in scored if qid not in na_probs]
    if missing:
        raise SquadScoreError(
            f"na_probs: no no-answer probability for {len(missing)} scored question(s), e.g. {_first_ids(missing)}"
        )
    return na_probs


def _check_unique_ids(gold: list[dict]) -> None:
    """Raise SquadScoreError when two gold questions share an id (their scores would merge silently)."""
    seen: set[str] = set()
    for question in gold:
        if question["id"] in seen:
            raise SquadScoreError(f"gold: duplicate question id {question['id']!r}")
        seen.add(question["id"])


def _warn_missing_count(missing: int, total: int, warn: Warn) -> None:
    if missing:
        warn(f"{missing} of {total} questions have no prediction")


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def score_files(
    data_path: str | Path,
    predictions_path: str | Path,
    na_probs_path: str | Path | None = None,
    na_prob_thresh: float = 1.0,
    version: int | str | None = None,
) -> dict:
    """Score a predictions JSON against a SQuAD dataset JSON, like the official evaluation scripts.

    `predictions_path` holds a JSON object id -> answer text ("" for no answer); `na_probs_path`
    (v2.0 only) a JSON object id -> no-answer probability. `version` (1, 2, "1.1", "v2.0", ...)
    forces the scorer; by default it follows `load_gold`'s detection. Returns the dict of
    `evaluate_v1` or `evaluate_v2`. Raises SquadScoreError for malformed files, ids in the
    predictions or na_probs that are not in the data, and na_probs with v1.1.
    """
    gold, detected = load_gold(data_path)
    scorer = detected if version is None else _parse_version(version)
    known = {question["id"] for question in gold}

    predictions = _read_json(predictions_path, "predictions")
    if not isinstance(predictions, dict):
        raise SquadScoreError(f"{predictions_path}: expected a JSON object mapping question id to answer text")
    bad = [qid for qid, text in predictions.items() if not isinstance(text, str)]
    if bad:
        raise SquadScoreError(f"{predictions_path}: every answer must be a string; not so for {_first_ids(bad)}")
    _check_known_ids(predictions, known, predictions_path, data_path)

    na_probs = None
    if na_probs_path is not None:
        if scorer != 2:
            raise SquadScoreError(f"{na_probs_path}: no-answer probabilities only apply to SQuAD v2.0 scoring")
        na_probs = _read_json(na_probs_path, "no-answer probabilities")
        if not isinstance(na_probs, dict):
            raise SquadScoreError(f"{na_probs_path}: expected a JSON object mapping question id to a number")
        bad = [qid for qid, p in na_probs.items() if not _is_number(p)]
        if bad:
            raise SquadScoreError(
                f"{na_probs_path}: every probability must be a number (not NaN); not so for {_first_ids(bad)}"
            )
        _check_known_ids(na_probs, known, na_probs_path, data_path)
        unscored = [qid for qid in predictions if qid not in na_probs]
        if unscored:
            raise SquadScoreError(
                f"{na_probs_path}: no probability for {len(unscored)} predicted question(s): {_first_ids(unscored)}"
            )
    if scorer == 1:
        return evaluate_v1(gold, predictions)
    return evaluate_v2(gold, predictions, na_probs, na_prob_thresh)


def _parse_version(version: int | str) -> int:
    """1 or 2 from 1, 2, "1", "1.1", "v1.1", "2", "2.0", "v2.0"."""
    text = str(version).strip().lower().removeprefix("v")
    if text in ("1", "1.1"):
        return 1
    if text in ("2", "2.0"):
        return 2
    raise SquadScoreError(f"version: expected 1 / 1.1 or 2 / 2.0, got {version!r}")


def _read_json(path: str | Path, what: str) -> Any:
    """Parsed JSON of `path`; SquadScoreError naming the file when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise SquadScoreError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise SquadScoreError(f"{path}: expected a {what} JSON file, but it is not valid UTF-8 JSON: {exc}") from exc


def _check_known_ids(mapping: Mapping[str, Any], known: set[str], path: str | Path, data_path: str | Path) -> None:
    unknown = [qid for qid in mapping if qid not in known]
    if unknown:
        raise SquadScoreError(
            f"{path}: {len(unknown)} id(s) are not questions of {data_path}: {_first_ids(unknown)} "
            "(predictions of another split or dataset version?)"
        )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _first_ids(ids: list[str]) -> str:
    shown = ", ".join(repr(qid) for qid in ids[:_SHOWN_IDS])
    return shown + (f" and {len(ids) - _SHOWN_IDS} more" if len(ids) > _SHOWN_IDS else "")


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m bert_suite.metrics.squad DATA PRED [-n NA_PROBS] [-t THRESH] [-o OUT] [--version V]`.

    Prints the result JSON on stdout (and writes it to OUT when given); returns 0, or 2 with the
    error on stderr for inputs that cannot be scored.
    """
    parser = argparse.ArgumentParser(description="Official-equivalent SQuAD v1.1 / v2.0 scorer.")
    parser.add_argument("data_file", help="SQuAD dataset JSON")
    parser.add_argument("pred_file", help="predictions JSON: question id -> answer text")
    # The official script's spellings, and those of `bert-suite score squad` (--na_probs, ...), alike.
    parser.add_argument("--na-prob-file", "-n", "--na_probs", "--na_prob_file", dest="na_prob_file",
                        help="v2.0: JSON question id -> no-answer probability")
    parser.add_argument("--na-prob-thresh", "-t", "--na_prob_thresh", dest="na_prob_thresh", type=float, default=1.0,
                        help="predict no answer above this")
    parser.add_argument("--out-file", "-o", "--out_file", dest="out_file", help="also write the result JSON here")
    parser.add_argument("--version", help="force the scorer: 1.1 or 2.0 (default: detected from the data)")
    args = parser.parse_args(argv)
    try:
        result = score_files(args.data_file, args.pred_file, args.na_prob_file, args.na_prob_thresh, args.version)
    except SquadScoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.out_file:
        from ..io import atomic_write_text

        atomic_write_text(args.out_file, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
