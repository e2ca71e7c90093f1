"""SQuAD v1.1 scores as an `evaluate` module that loads from the installed bert_suite package, offline.

Usage: `evaluate.load(bert_suite.metrics.evaluate_module_path("squad"))`; inputs and result fields
are those of the Hub's `squad` module, the scores those of the official `evaluate-v1.1.py`.
"""

# `import evaluate`, not `from evaluate import Metric`: evaluate instantiates the first concrete
# Metric class found in this module's namespace, which would then be evaluate's own base class.
import datasets
import evaluate

# evaluate copies this file alone into its modules cache and imports it from there, so the
# scorer is imported from the installed package rather than from a sibling file.
from bert_suite.metrics.squad import evaluate_v1, gold_from_examples, predictions_by_id

_logger = evaluate.logging.get_logger(__name__)

_DESCRIPTION = """\
Exact match and token F1 of the Stanford Question Answering Dataset v1.1 (Rajpurkar et al., 2016),
as the official evaluation script computes them: answers are compared after lower-casing and deleting
punctuation, articles and extra white space, and each question scores its best match over its gold
answers. Scores are percentages (0-100), as in the BERT paper (Devlin et al., 2019, Table 2).
"""

_CITATION = """\
@inproceedings{rajpurkar2016squad,
  title = {{SQuAD}: 100,000+ Questions for Machine Comprehension of Text},
  author = {Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle = {Proceedings of EMNLP 2016},
  pages = {2383--2392},
  year = {2016}
}
"""

_INPUTS_DESCRIPTION = """
Args:
    predictions: one dict per question, {"id": question id, "prediction_text": answer text}.
    references: one dict per question, {"id": question id, "answers": {"text": [gold answer, ...],
        "answer_start": [character offset, ...]}}, the layout of the Hub dataset `rajpurkar/squad`;
        answer_start is not used in scoring.
    A reference without a prediction scores 0 (and is logged); predictions for ids that are not in
    the references are ignored. Two predictions for one id, or two references with one id, are errors.
Returns:
    exact_match: percentage of questions whose prediction equals a gold answer after normalisation.
    f1: mean over questions of the best token F1 against the gold answers, as a percentage.
Example:
    >>> squad = evaluate.load(bert_suite.metrics.evaluate_module_path("squad"))
    >>> squad.compute(predictions=[{"id": "q1", "prediction_text": "the Broncos"}],
    ...               references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}])
    {'exact_match': 0.0, 'f1': 66.66666666666666}
"""


class Squad(evaluate.Metric):
    """SQuAD v1.1 exact match and F1, delegating to `bert_suite.metrics.squad.evaluate_v1`."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                    "references": {
                        "id": datasets.Value("string"),
                        "answers": datasets.Sequence(
                            {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
                        ),
                    },
                }
            ),
            homepage="https://rajpurkar.github.io/SQuAD-explorer/",
            reference_urls=["https://arxiv.org/abs/1606.05250", "https://arxiv.org/abs/1810.04805"],
        )

    def _compute(self, predictions, references):
        return evaluate_v1(
            gold_from_examples(references), predictions_by_id(predictions, "prediction_text"), warn=_logger.warning
        )
