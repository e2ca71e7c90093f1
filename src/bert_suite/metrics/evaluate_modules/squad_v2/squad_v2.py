"""SQuAD v2.0 scores as an `evaluate` module that loads from the installed bert_suite package, offline.

Usage: `evaluate.load(bert_suite.metrics.evaluate_module_path("squad_v2"))`; inputs, the
`no_answer_threshold` argument of `compute` and the result fields are those of the Hub's `squad_v2`
module, the scores those of the official `evaluate-v2.0.py`.
"""

# `import evaluate`, not `from evaluate import Metric`: evaluate instantiates the first concrete
# Metric class found in this module's namespace, which would then be evaluate's own base class.
import datasets
import evaluate

# evaluate copies this file alone into its modules cache and imports it from there, so the
# scorer is imported from the installed package rather than from a sibling file.
from bert_suite.metrics.squad import evaluate_v2, gold_from_examples, predictions_by_id

_logger = evaluate.logging.get_logger(__name__)

_DESCRIPTION = """\
Exact match and token F1 of the Stanford Question Answering Dataset v2.0 (Rajpurkar, Jia and Liang, 2018),
whose unanswerable questions are answered right by the empty answer, as the official evaluation script
computes them: overall, over the answerable (HasAns) and the unanswerable (NoAns) questions, and at the
no-answer probability threshold that maximises each score (best_*). Scores are percentages (0-100).
"""

_CITATION = """\
@inproceedings{rajpurkar2018know,
  title = {Know What You Don't Know: Unanswerable Questions for {SQuAD}},
  author = {Rajpurkar, Pranav and Jia, Robin and Liang, Percy},
  booktitle = {Proceedings of ACL 2018},
  pages = {784--789},
  year = {2018}
}
"""

_INPUTS_DESCRIPTION = """
Args:
    predictions: one dict per question, {"id": question id, "prediction_text": answer text ("" for
        no answer), "no_answer_probability": a number, the higher the likelier no answer}.
    references: one dict per question, {"id": question id, "answers": {"text": [gold answer, ...],
        "answer_start": [character offset, ...]}}, the layout of the Hub dataset `rajpurkar/squad_v2`:
        an unanswerable question has empty lists. answer_start is not used in scoring.
    no_answer_threshold: a question whose no_answer_probability is above it counts as answered with
        no answer, whatever its prediction_text (default 1.0).
    A reference without a prediction is left out of every score and total (and logged); predictions
    for ids not in the references are ignored. Two predictions for one id, or two references with one
    id, are errors.
Returns:
    exact, f1, total: exact match and F1 (percentages) over the scored questions, and their number.
    HasAns_exact, HasAns_f1, HasAns_total: the same over the answerable questions, when there are any.
    NoAns_exact, NoAns_f1, NoAns_total: the same over the unanswerable questions, when there are any.
    best_exact, best_exact_thresh, best_f1, best_f1_thresh: the best exact match and F1 over every
        no-answer threshold, and the threshold reaching each (no answer above it).
Example:
    >>> squad_v2 = evaluate.load(bert_suite.metrics.evaluate_module_path("squad_v2"))
    >>> result = squad_v2.compute(
    ...     predictions=[{"id": "q1", "prediction_text": "", "no_answer_probability": 0.5}],
    ...     references=[{"id": "q1", "answers": {"text": [], "answer_start": []}}],
    ... )
    >>> result["exact"], result["NoAns_total"], "HasAns_total" in result
    (100.0, 1, False)
"""


class SquadV2(evaluate.Metric):
    """SQuAD v2.0 scores, delegating to `bert_suite.metrics.squad.evaluate_v2`."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": {
                        "id": datasets.Value("string"),
                        "prediction_text": datasets.Value("string"),
                        "no_answer_probability": datasets.Value("float32"),
                    },
                    "references": {
                        "id": datasets.Value("string"),
                        "answers": datasets.Sequence(
                            {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
                        ),
                    },
                }
            ),
            homepage="https://rajpurkar.github.io/SQuAD-explorer/",
            reference_urls=["https://arxiv.org/abs/1806.03822", "https://arxiv.org/abs/1810.04805"],
        )

    def _compute(self, predictions, references, no_answer_threshold=1.0):
        return evaluate_v2(
            gold_from_examples(references),
            predictions_by_id(predictions, "prediction_text"),
            na_probs=predictions_by_id(predictions, "no_answer_probability"),
            na_prob_thresh=no_answer_threshold,
            warn=_logger.warning,
        )
