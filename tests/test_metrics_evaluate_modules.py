"""Tests of the shipped `squad`, `squad_v2` and `seqeval` evaluate modules: loaded offline, they give
the project's scorers' numbers, the hand-computed ones, in the Hub modules' input and output formats."""

import os

# Before evaluate is imported: it reads these once, at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

import warnings  # noqa: E402

import pytest  # noqa: E402
from seqeval.metrics import accuracy_score, classification_report  # noqa: E402

from bert_suite.metrics import evaluate_module_path  # noqa: E402
from bert_suite.metrics.ner import ner_scores  # noqa: E402
from bert_suite.metrics.squad import evaluate_v1, evaluate_v2  # noqa: E402


def _refs(answers_by_id):
    """Hub-layout references: {"id", "answers": {"text", "answer_start"}} (answer_start is never scored)."""
    return [{"id": qid, "answers": {"text": texts, "answer_start": [0] * len(texts)}} for qid, texts in answers_by_id]


# SQuAD v1.1, two questions:
#   q1: "the Eiffel Tower" normalises to "eiffel tower", the first gold answer: EM 1, F1 1.
#   q2: "in Paris France" -> tokens {in, paris, france}. Against "Paris": 1 shared token,
#       P = 1/3, R = 1, F1 = 2 * (1/3) / (4/3) = 1/2; against "city of Paris": P = R = 1/3, F1 = 1/3.
#       Best over the gold answers: EM 0, F1 1/2.
#   exact_match = 100 * 1/2 = 50.0; f1 = 100 * (1 + 1/2) / 2 = 75.0.
V1_ANSWERS = [("q1", ["Eiffel Tower", "tower"]), ("q2", ["Paris", "city of Paris"])]
V1_REFS = _refs(V1_ANSWERS)
V1_PREDS = [{"id": "q1", "prediction_text": "the Eiffel Tower"}, {"id": "q2", "prediction_text": "in Paris France"}]

# SQuAD v2.0, four questions (no-answer probabilities exact in float32, the dtype evaluate stores them in):
#   a: answerable "Denver Broncos", predicted "Broncos" (p 0.25): EM 0, F1 = 2 * 1 * (1/2) / (3/2) = 2/3.
#   b: unanswerable, predicted ""           (p 0.75): EM 1, F1 1.
#   c: unanswerable, predicted "Santa Clara" (p 0.5): EM 0, F1 0; 1 and 1 once answered "no answer".
#   d: answerable "Levi's Stadium", predicted so (p 0.125): EM 1, F1 1.
# no_answer_threshold 1.0 (no probability above it):
#   exact = 100 * (0 + 1 + 0 + 1) / 4 = 50;  f1 = 100 * (2/3 + 1 + 0 + 1) / 4 = 200/3
#   HasAns (a, d): exact 50, f1 100 * (2/3 + 1) / 2 = 250/3;  NoAns (b, c): exact 50, f1 50.
# no_answer_threshold 0.4 (b and c answered "no answer", both right):
#   exact = 100 * 3/4 = 75;  f1 = 100 * (2/3 + 3) / 4 = 275/3;  HasAns unchanged;  NoAns: 100, 100.
# Best thresholds, the same for any no_answer_threshold: start from "no answer" everywhere (b and c
# right: 2 of 4), then answer the questions by increasing probability: d, a, c, b.
#   EM: d +1 -> 3 (best, at 0.125); a +0 -> 3; c -1 -> 2; b: "" changes nothing.  best_exact 75 at 0.125.
#   F1: d +1 -> 3 (at 0.125); a +2/3 -> 11/3 (best, at 0.25); c -1; b 0.  best_f1 = 100 * (11/3) / 4 = 275/3 at 0.25.
V2_ANSWERS = [("a", ["Denver Broncos"]), ("b", []), ("c", []), ("d", ["Levi's Stadium"])]
V2_REFS = _refs(V2_ANSWERS)
V2_PREDS = [
    {"id": "a", "prediction_text": "Broncos", "no_answer_probability": 0.25},
    {"id": "b", "prediction_text": "", "no_answer_probability": 0.75},
    {"id": "c", "prediction_text": "Santa Clara", "no_answer_probability": 0.5},
    {"id": "d", "prediction_text": "Levi's Stadium", "no_answer_probability": 0.125},
]
V2_BEST = {"best_exact": 75.0, "best_exact_thresh": 0.125, "best_f1": 275 / 3, "best_f1_thresh": 0.25}
# The Hub module's field order.
V2_FIELDS = ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
             "NoAns_exact", "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]

# seqeval, one sentence: gold PER (0-1) and LOC (3); predicted PER (0-1), right, and ORG (3), wrong type.
#   1 right of 2 predicted and 2 gold: precision = recall = F1 = 1/2; tokens: 4 of 5 right, accuracy 0.8.
#   LOC: 1 gold, none predicted: 0/0/0, number 1.  ORG: 1 predicted, none gold: 0/0/0, number 0.
NER_REFS = [["B-PER", "I-PER", "O", "B-LOC", "O"]]
NER_PREDS = [["B-PER", "I-PER", "O", "B-ORG", "O"]]
# Two sentences, with a boundary error: the predicted I-MISC after O starts a one-token MISC (2-2),
# which does not match the gold MISC (1-2). Gold: PER, LOC, MISC; predicted: PER, ORG, MISC; 1 right.
#   precision = recall = F1 = 1/3; tokens: 3 of 4 and 2 of 3 right, accuracy 5/7.
NER_REFS_2 = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-MISC", "I-MISC"]]
NER_PREDS_2 = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "O", "I-MISC"]]


@pytest.fixture(scope="module")
def load_module(offline_evaluate):
    """`evaluate.load` of a shipped module by name, offline (conftest.offline_evaluate)."""
    return offline_evaluate


@pytest.fixture(scope="module")
def squad(load_module):
    return load_module("squad")


@pytest.fixture(scope="module")
def squad_v2(load_module):
    return load_module("squad_v2")


@pytest.fixture(scope="module")
def seqeval(load_module):
    return load_module("seqeval")


def test_unknown_module_names_every_shipped_one():
    with pytest.raises(ValueError, match=r"'squad_v3'; shipped modules: glue, seqeval, squad, squad_v2$"):
        evaluate_module_path("squad_v3")


# --------------------------------------------------------------------------------------------------
# squad
# --------------------------------------------------------------------------------------------------


def test_squad_matches_hand_computed_values_and_the_scorer(squad):
    result = squad.compute(predictions=V1_PREDS, references=V1_REFS)
    assert result == pytest.approx({"exact_match": 50.0, "f1": 75.0})
    gold = [{"id": qid, "answers": texts} for qid, texts in V1_ANSWERS]
    assert result == evaluate_v1(gold, {p["id"]: p["prediction_text"] for p in V1_PREDS})
    assert list(result) == ["exact_match", "f1"]


def test_squad_batches_agree(squad):
    for pred, ref in zip(V1_PREDS, V1_REFS, strict=True):
        squad.add_batch(predictions=[pred], references=[ref])
    assert squad.compute() == squad.compute(predictions=V1_PREDS, references=V1_REFS)


def test_squad_unanswered_question_scores_zero_and_unknown_ids_are_ignored(squad):
    # q1 scores 1 and 1; q2 has no prediction (the one for q9 is not a reference's): 0 and 0, and it
    # counts: exact_match = f1 = 100 * 1/2 = 50.
    predictions = [V1_PREDS[0], {"id": "q9", "prediction_text": "in Paris France"}]
    result = squad.compute(predictions=predictions, references=V1_REFS)
    assert result == pytest.approx({"exact_match": 50.0, "f1": 50.0})


def test_squad_rejects_v2_data_and_duplicate_predictions(squad):
    with pytest.raises(ValueError, match=r"'b' has no answer.*v2\.0"):
        squad.compute(predictions=[{"id": "b", "prediction_text": ""}], references=_refs([("b", [])]))
    with pytest.raises(ValueError, match=r"two predictions for the question id 'q1'"):
        squad.compute(predictions=[V1_PREDS[0], V1_PREDS[0]], references=V1_REFS)


# --------------------------------------------------------------------------------------------------
# squad_v2
# --------------------------------------------------------------------------------------------------


def _v2_scorer(preds, answers, threshold):
    gold = [{"id": qid, "answers": texts} for qid, texts in answers]
    return evaluate_v2(gold, {p["id"]: p["prediction_text"] for p in preds},
                       {p["id"]: p["no_answer_probability"] for p in preds}, threshold)


def test_squad_v2_default_threshold_matches_hand_computed_values_and_the_scorer(squad_v2):
    result = squad_v2.compute(predictions=V2_PREDS, references=V2_REFS)
    assert list(result) == V2_FIELDS
    assert result == pytest.approx({
        "exact": 50.0, "f1": 200 / 3, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 250 / 3, "HasAns_total": 2,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        **V2_BEST,
    })
    assert result == _v2_scorer(V2_PREDS, V2_ANSWERS, 1.0)
    assert squad_v2.compute(predictions=V2_PREDS, references=V2_REFS, no_answer_threshold=1.0) == result


def test_squad_v2_no_answer_threshold_turns_likely_no_answers_into_no_answer(squad_v2):
    result = squad_v2.compute(predictions=V2_PREDS, references=V2_REFS, no_answer_threshold=0.4)
    assert result == pytest.approx({
        "exact": 75.0, "f1": 275 / 3, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 250 / 3, "HasAns_total": 2,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
        **V2_BEST,
    })
    assert result == _v2_scorer(V2_PREDS, V2_ANSWERS, 0.4)
    # At 0.2, a (p 0.25) turns into "no answer" as well and loses its F1 of 2/3; d (p 0.125) stays:
    #   exact = f1 = 100 * (0 + 1 + 1 + 1) / 4 = 75;  HasAns (a, d): 50 and 50.
    assert squad_v2.compute(predictions=V2_PREDS, references=V2_REFS, no_answer_threshold=0.2) == pytest.approx({
        "exact": 75.0, "f1": 75.0, "total": 4,
        "HasAns_exact": 50.0, "HasAns_f1": 50.0, "HasAns_total": 2,
        "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 2,
        **V2_BEST,
    })


def test_squad_v2_groups_without_questions_are_left_out(squad_v2):
    # Answerable questions only (a, d): no NoAns_ fields; best: answering both, 100 * (0 + 1) / 2 and
    # 100 * (2/3 + 1) / 2, reached at a's probability, the last one answered.
    answerable = [V2_PREDS[0], V2_PREDS[3]]
    result = squad_v2.compute(predictions=answerable, references=_refs([V2_ANSWERS[0], V2_ANSWERS[3]]))
    assert not any(key.startswith("NoAns_") for key in result)
    assert result == pytest.approx({
        "exact": 50.0, "f1": 250 / 3, "total": 2, "HasAns_exact": 50.0, "HasAns_f1": 250 / 3, "HasAns_total": 2,
        "best_exact": 50.0, "best_exact_thresh": 0.125, "best_f1": 250 / 3, "best_f1_thresh": 0.25,
    })


def test_squad_v2_batches_agree(squad_v2):
    squad_v2.add_batch(predictions=V2_PREDS[:2], references=V2_REFS[:2])
    squad_v2.add_batch(predictions=V2_PREDS[2:], references=V2_REFS[2:])
    assert squad_v2.compute(no_answer_threshold=0.4) == _v2_scorer(V2_PREDS, V2_ANSWERS, 0.4)


# --------------------------------------------------------------------------------------------------
# seqeval
# --------------------------------------------------------------------------------------------------


def _hub_seqeval(predictions, references):
    """What the Hub's seqeval module computes in its default mode, from the seqeval library."""
    report = classification_report(references, predictions, output_dict=True, zero_division=0)
    overall = report.pop("micro avg")
    del report["macro avg"], report["weighted avg"]
    scores = {kind: {"precision": s["precision"], "recall": s["recall"], "f1": s["f1-score"], "number": s["support"]}
              for kind, s in report.items()}
    scores.update(overall_precision=overall["precision"], overall_recall=overall["recall"],
                  overall_f1=overall["f1-score"], overall_accuracy=accuracy_score(references, predictions))
    return scores


def test_seqeval_matches_hand_computed_values_and_the_scorer(seqeval):
    result = seqeval.compute(predictions=NER_PREDS, references=NER_REFS)
    zero = {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert result == {
        "LOC": {**zero, "number": 1},
        "ORG": {**zero, "number": 0},
        "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 1},
        "overall_precision": 0.5, "overall_recall": 0.5, "overall_f1": 0.5, "overall_accuracy": 0.8,
    }
    scores = ner_scores(NER_REFS, NER_PREDS)
    assert {key: result["overall_" + key] for key in ("precision", "recall", "f1", "accuracy")} == {
        key: scores[key] for key in ("precision", "recall", "f1", "accuracy")
    }
    for kind in ("LOC", "ORG", "PER"):
        assert {key: result[kind][key] for key in ("precision", "recall", "f1")} == {
            key: scores[f"{kind}_{key}"] for key in ("precision", "recall", "f1")
        }


@pytest.mark.parametrize(("preds", "refs"), [(NER_PREDS, NER_REFS), (NER_PREDS_2, NER_REFS_2)],
                         ids=["wrong-type", "wrong-boundary"])
def test_seqeval_equals_the_hub_modules_computation(seqeval, preds, refs):
    result = seqeval.compute(predictions=preds, references=refs)
    hub = _hub_seqeval(preds, refs)
    assert list(result) == list(hub)
    assert result == hub  # same divisions, so equal to the last bit


def test_seqeval_boundary_error_matches_hand_computed_values(seqeval):
    result = seqeval.compute(predictions=NER_PREDS_2, references=NER_REFS_2)
    assert result["MISC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "number": 1}
    assert result["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 1}
    overall = {key: result[f"overall_{key}"] for key in ("precision", "recall", "f1", "accuracy")}
    assert overall == pytest.approx({"precision": 1 / 3, "recall": 1 / 3, "f1": 1 / 3, "accuracy": 5 / 7})


def test_seqeval_accepts_the_hub_defaults_and_rejects_other_modes(seqeval):
    expected = seqeval.compute(predictions=NER_PREDS, references=NER_REFS)
    defaults = {"suffix": False, "scheme": None, "mode": None, "sample_weight": None, "zero_division": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert seqeval.compute(predictions=NER_PREDS, references=NER_REFS, **defaults) == expected
    for unsupported in ({"mode": "strict", "scheme": "IOB2"}, {"scheme": "IOB2"}, {"suffix": True},
                        {"sample_weight": [2]}, {"zero_division": 1}):
        with pytest.raises(ValueError, match="default mode only.*" + ".*".join(unsupported)):
            seqeval.compute(predictions=NER_PREDS, references=NER_REFS, **unsupported)
