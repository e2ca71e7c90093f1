"""Tests of the offline GLUE metrics and of the shipped `glue` evaluate module."""

import os

# Before evaluate is imported: it reads these once, at import time.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")

import math  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from bert_suite.metrics import GLUE_METRIC_FIELDS, evaluate_module_path, glue_metrics  # noqa: E402

# 6 binary examples. Confusion for class 1: TP=3 (0,1,2), FN=1 (3), FP=1 (4), TN=1 (5).
#   accuracy = 4/6;  F1 = 2TP / (2TP + FP + FN) = 6/8;  (F1 of class 0 would be 2/4)
#   MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (3 - 1) / sqrt(4*4*2*2) = 1/4
BIN_REFS = [1, 1, 1, 1, 0, 0]
BIN_PREDS = [1, 1, 1, 0, 1, 0]

# stsb: refs swap the ranks within each pair, so rank differences are all 1:
#   Spearman = 1 - 6 * 4 / (4 * (16 - 1)) = 0.6.  Pearson, with deviations from the mean 1.875
#   dx = (-1.375, -0.875, 0.125, 2.125), dy = (-0.875, -1.375, 2.125, 0.125):
#   sum(dx*dy) / sum(dx^2) = 2.9375 / 7.1875 = 47/115 (both sides have the same spread).
# All values are exact in float32, the dtype evaluate stores stsb inputs in.
STS_PREDS = [0.5, 1.0, 2.0, 4.0]
STS_REFS = [1.0, 0.5, 4.0, 2.0]

ACCURACY_TASKS = ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli", "ax", "hans")
HUB_FIELDS = {
    "cola": {"matthews_correlation"},
    "stsb": {"pearson", "spearmanr"},
    "mrpc": {"accuracy", "f1"},
    "qqp": {"accuracy", "f1"},
    **{task: {"accuracy"} for task in ACCURACY_TASKS},
}


def test_fields_per_task_match_the_hub_glue_module():
    assert {task: set(fields) for task, fields in GLUE_METRIC_FIELDS.items()} == HUB_FIELDS


@pytest.mark.parametrize("task", sorted(HUB_FIELDS))
def test_every_task_returns_its_fields_as_python_floats(task):
    preds, refs = (STS_PREDS, STS_REFS) if task == "stsb" else (BIN_PREDS, BIN_REFS)
    scores = glue_metrics(task, preds, refs)
    assert set(scores) == HUB_FIELDS[task]
    assert all(type(v) is float for v in scores.values())  # not np.float64, which subclasses float


def test_binary_metrics_match_hand_computed_values():
    assert glue_metrics("mrpc", BIN_PREDS, BIN_REFS) == pytest.approx({"accuracy": 4 / 6, "f1": 3 / 4})
    assert glue_metrics("qqp", np.array(BIN_PREDS), np.array(BIN_REFS)) == pytest.approx(
        {"accuracy": 4 / 6, "f1": 3 / 4}
    )
    assert glue_metrics("cola", BIN_PREDS, BIN_REFS)["matthews_correlation"] == pytest.approx(1 / 4)
    assert glue_metrics("rte", BIN_PREDS, BIN_REFS) == pytest.approx({"accuracy": 4 / 6})


def test_mnli_accuracy_is_three_way():
    # Wrong only at index 1 (2 for 1): 5/6.
    assert glue_metrics("mnli", [0, 2, 2, 2, 1, 0], [0, 1, 2, 2, 1, 0]) == pytest.approx({"accuracy": 5 / 6})


def test_stsb_correlations_match_hand_computed_values():
    scores = glue_metrics("stsb", STS_PREDS, STS_REFS)
    assert scores == pytest.approx({"pearson": 47 / 115, "spearmanr": 0.6})
    # A monotone but non-linear relation: Spearman 1, Pearson below 1.
    # x = 1..4, y = (1, 2, 3, 5): sum(dx*dy) = 6.5, sum(dx^2) = 5, sum(dy^2) = 8.75.
    scores = glue_metrics("stsb", [1, 2, 3, 4], [1, 2, 3, 5])
    assert scores == pytest.approx({"pearson": 6.5 / math.sqrt(5 * 8.75), "spearmanr": 1.0})


def test_stsb_result_does_not_depend_on_input_dtype():
    # evaluate hands stsb scores over as float32; scipy would then compute in float32.
    as32 = glue_metrics("stsb", np.array(STS_PREDS, np.float32), np.array(STS_REFS, np.float32))
    assert as32 == glue_metrics("stsb", STS_PREDS, STS_REFS)


@pytest.mark.parametrize(
    ("preds", "refs"),
    [([3.0, 3.0, 3.0], [1.0, 2.0, 5.0]), ([1.0, 2.0, 5.0], [4.0, 4.0, 4.0]), ([2.5], [1.0])],
    ids=["constant-predictions", "constant-references", "single-example"],
)
def test_stsb_undefined_correlation_is_zero_without_warning(preds, refs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy would warn (and return NaN) or raise here
        assert glue_metrics("stsb", preds, refs) == {"pearson": 0.0, "spearmanr": 0.0}


def test_single_class_edge_cases_are_zero_not_nan():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert glue_metrics("cola", [1, 1, 1, 1], [1, 0, 1, 0]) == {"matthews_correlation": 0.0}
        # No positive prediction nor reference: F1 is 0/0, reported 0.0.
        assert glue_metrics("mrpc", [0, 0, 0], [0, 0, 0]) == {"accuracy": 1.0, "f1": 0.0}


def test_unknown_task_names_it_and_the_known_tasks():
    with pytest.raises(ValueError, match=r"'mrcp'.*mrpc.*stsb"):
        glue_metrics("mrcp", [1], [1])


def test_length_mismatch_names_both_lengths():
    with pytest.raises(ValueError, match=r"3 predictions and 2 references"):
        glue_metrics("rte", [1, 0, 1], [1, 0])


def test_empty_inputs_are_rejected():
    with pytest.raises(ValueError, match="empty"):
        glue_metrics("sst2", [], [])


def test_logits_instead_of_label_ids_are_rejected():
    with pytest.raises(ValueError, match=r"predictions must be 1-D.*\(2, 3\)"):
        glue_metrics("mnli", np.zeros((2, 3)), [0, 1])


def test_non_finite_stsb_scores_are_rejected():
    with pytest.raises(ValueError, match="predictions contain NaN"):
        glue_metrics("stsb", [1.0, float("nan"), 3.0], [1.0, 2.0, 3.0])


def test_unknown_evaluate_module_names_the_shipped_ones():
    with pytest.raises(ValueError, match=r"'squad_v3'.*glue"):
        evaluate_module_path("squad_v3")


@pytest.fixture(scope="module")
def load_glue(offline_evaluate):
    """`evaluate.load` of the shipped glue module for a task, offline (conftest.offline_evaluate)."""
    return lambda task: offline_evaluate("glue", task)


@pytest.mark.parametrize(
    ("task", "preds", "refs"),
    [
        ("cola", BIN_PREDS, BIN_REFS),
        ("stsb", STS_PREDS, STS_REFS),
        ("mrpc", BIN_PREDS, BIN_REFS),
        ("mnli", [0, 2, 2, 2, 1, 0], [0, 1, 2, 2, 1, 0]),
    ],
)
def test_evaluate_module_loads_offline_and_agrees(load_glue, task, preds, refs):
    metric = load_glue(task)
    assert metric.info.features["predictions"].dtype == ("float32" if task == "stsb" else "int64")
    assert metric.compute(predictions=preds, references=refs) == glue_metrics(task, preds, refs)


def test_evaluate_module_batches_agree(load_glue):
    metric = load_glue("mrpc")
    metric.add_batch(predictions=BIN_PREDS[:3], references=BIN_REFS[:3])
    metric.add_batch(predictions=BIN_PREDS[3:], references=BIN_REFS[3:])
    assert metric.compute() == glue_metrics("mrpc", BIN_PREDS, BIN_REFS)


def test_evaluate_module_rejects_unknown_config(load_glue):
    with pytest.raises(KeyError, match=r"'mrcp'.*mrpc"):
        load_glue("mrcp")
    with pytest.raises(KeyError, match=r"'default'.*config_name"):
        load_glue(None)
