"""GLUE metrics as reported in the BERT paper, computed offline with scikit-learn and scipy.

Field names and scales (fractions, not percentages) are those of the Hub's `glue` evaluate module,
so results from either are interchangeable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# scipy and scikit-learn are imported where they are used: task cards read GLUE_METRIC_FIELDS, and
# every command reads a card.

_ACC = ("accuracy",)
_ACC_F1 = ("accuracy", "f1")

GLUE_METRIC_FIELDS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": _ACC,
    "mrpc": _ACC_F1,
    "stsb": ("pearson", "spearmanr"),
    "qqp": _ACC_F1,
    "mnli": _ACC,
    "mnli_matched": _ACC,
    "mnli_mismatched": _ACC,
    "qnli": _ACC,
    "rte": _ACC,
    "wnli": _ACC,
    "ax": _ACC,
    "hans": _ACC,
}
# Every metric a classification card may name: GLUE's, and those of a task without a GLUE name (a card
# built from the user's files), computed by the same scorers.
METRIC_FIELDS: dict[str, tuple[str, ...]] = {
    **GLUE_METRIC_FIELDS,
    "accuracy": _ACC,
    "accuracy_f1": _ACC_F1,  # F1 of label id 1 (the second of two sorted labels)
    "pearson_spearman": ("pearson", "spearmanr"),
}


def glue_metrics(task: str, predictions: Sequence | np.ndarray, references: Sequence | np.ndarray) -> dict[str, float]:
    """Score `predictions` against `references` with the metrics of the GLUE task `task`.

    Classification tasks take one label id per example; stsb takes one similarity score per
    example. Returns a dict with the fields `GLUE_METRIC_FIELDS[task]`, as python floats.
    Raises ValueError for an unknown task, 2-D (e.g. logit) inputs, inputs of different
    lengths, empty inputs, and non-finite stsb scores.
    """
    if task not in METRIC_FIELDS:
        raise ValueError(f"unknown GLUE task {task!r}; known tasks: {', '.join(METRIC_FIELDS)}")
    preds, refs = np.asarray(predictions), np.asarray(references)
    for name, values in (("predictions", preds), ("references", refs)):
        if values.ndim != 1:
            raise ValueError(
                f"{name} must be 1-D (one value per example), got shape {values.shape}; "
                "for classification pass label ids (argmax of the logits), not logits"
            )
    if len(preds) != len(refs):
        raise ValueError(
            f"predictions and references must have the same length, got {len(preds)} predictions "
            f"and {len(refs)} references"
        )
    if len(preds) == 0:
        raise ValueError(f"predictions and references are empty; {task} needs at least one example")

    if "spearmanr" in METRIC_FIELDS[task]:  # stsb, and regression tasks of the user's own
        return _correlations(preds, refs)
    from sklearn.metrics import f1_score, matthews_corrcoef

    if task == "cola":
        # sklearn already returns 0.0 (not NaN) when a side holds a single class.
        return {"matthews_correlation": float(matthews_corrcoef(refs, preds))}
    scores = {"accuracy": float(np.mean(preds == refs))}
    if "f1" in METRIC_FIELDS[task]:
        # zero_division=0.0 is the value sklearn's default gives too, minus a warning on every
        # evaluation of a model that never predicts (or never meets) the positive class.
        scores["f1"] = float(f1_score(refs, preds, pos_label=1, average="binary", zero_division=0.0))
    return scores


def _correlations(preds: np.ndarray, refs: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation of stsb scores."""
    # scipy computes in the inputs' precision (float32 in, float32 out); float64 makes the result
    # independent of the caller's dtype.
    from scipy.stats import pearsonr, spearmanr

    preds, refs = preds.astype(np.float64), refs.astype(np.float64)
    for name, values in (("predictions", preds), ("references", refs)):
        if not np.isfinite(values).all():
            raise ValueError(f"stsb {name} contain NaN or infinite values")
    # A correlation is undefined when either side does not vary (a collapsed regression head, or a
    # single example): scipy then warns and returns NaN, or raises below two examples. Report 0.0,
    # "no association", so task averages and best-checkpoint selection keep working.
    if (preds == preds[0]).all() or (refs == refs[0]).all():
        return {"pearson": 0.0, "spearmanr": 0.0}
    return {"pearson": float(pearsonr(preds, refs)[0]), "spearmanr": float(spearmanr(preds, refs)[0])}
