"""Entity-level sequence labelling scores as an `evaluate` module that loads from the installed
bert_suite package, offline.

Usage: `evaluate.load(bert_suite.metrics.evaluate_module_path("seqeval"))`; inputs and result fields
are those of the Hub's `seqeval` module in its default mode (conlleval's counting).
"""

# `import evaluate`, not `from evaluate import Metric`: evaluate instantiates the first concrete
# Metric class found in this module's namespace, which would then be evaluate's own base class.
import datasets
import evaluate

# evaluate copies this file alone into its modules cache and imports it from there, so the
# scorer is imported from the installed package rather than from a sibling file.
from bert_suite.metrics.ner import entity_counts, ner_scores

_DESCRIPTION = """\
Entity-level precision, recall and F1, overall (micro-averaged) and per entity type, and token accuracy,
for IOB-tagged sequences, counted as the CoNLL shared tasks' conlleval script counts them (seqeval's
default mode): an entity starts at B-, or at an I- after O or after another type, and a predicted entity
is right when its type and both boundaries match a gold entity. Used for CoNLL-2003 NER in the BERT paper
(Devlin et al., 2019, Table 7). Scores are fractions in [0, 1], 0 where undefined.
"""

_CITATION = """\
@inproceedings{tjong-kim-sang-de-meulder-2003-introduction,
  title = {Introduction to the {CoNLL}-2003 Shared Task: Language-Independent Named Entity Recognition},
  author = {Tjong Kim Sang, Erik F. and De Meulder, Fien},
  booktitle = {Proceedings of CoNLL-2003},
  pages = {142--147},
  year = {2003}
}
@misc{seqeval,
  title = {{seqeval}: A Python framework for sequence labeling evaluation},
  author = {Nakayama, Hiroki},
  year = {2018},
  url = {https://github.com/chakki-works/seqeval}
}
"""

_INPUTS_DESCRIPTION = """
Args:
    predictions: one list of predicted tags per sentence, e.g. ["B-PER", "I-PER", "O"].
    references: one list of gold tags per sentence, each as long as its predicted list.
    The Hub module's other arguments are accepted at their default only, as this module always
    scores in seqeval's default mode: suffix=False (the prefix comes first, as in B-PER),
    scheme=None, mode=None (or "default"; "strict" is not supported), sample_weight=None, and
    zero_division="warn" or 0 (undefined scores are 0, without a warning). Other values raise ValueError.
Returns:
    For each entity type in the references or the predictions, a dict {"precision", "recall", "f1",
    "number"}, number being how many entities of that type the references hold; then
    overall_precision, overall_recall, overall_f1 (micro over all entities) and overall_accuracy
    (over tokens).
Example:
    >>> seqeval = evaluate.load(bert_suite.metrics.evaluate_module_path("seqeval"))
    >>> results = seqeval.compute(predictions=[["B-PER", "I-PER", "O", "B-ORG"]],
    ...                           references=[["B-PER", "I-PER", "O", "B-LOC"]])
    >>> list(results)
    ['LOC', 'ORG', 'PER', 'overall_precision', 'overall_recall', 'overall_f1', 'overall_accuracy']
    >>> results["PER"], results["overall_f1"], results["overall_accuracy"]
    ({'precision': 1.0, 'recall': 1.0, 'f1': 1.0, 'number': 1}, 0.5, 0.75)
"""


def _check_default_mode(suffix, scheme, mode, sample_weight, zero_division):
    """ValueError for an argument of the Hub module that asks for something other than the default mode."""
    # 0 and "warn" both give 0 where a score is undefined, which is what ner_scores does.
    zero_division_ok = zero_division == "warn" or (type(zero_division) in (int, float) and zero_division == 0)
    checks = {
        "suffix": (suffix, suffix is False),
        "scheme": (scheme, scheme is None),
        "mode": (mode, mode is None or mode == "default"),
        "sample_weight": (sample_weight, sample_weight is None),
        "zero_division": (zero_division, zero_division_ok),
    }
    wrong = [f"{name}={value!r}" for name, (value, ok) in checks.items() if not ok]
    if wrong:
        raise ValueError(
            f"bert_suite's seqeval module scores in seqeval's default mode only (conlleval's counting); "
            f"unsupported: {', '.join(wrong)}. Leave these arguments at their defaults (suffix=False, scheme=None, "
            "mode=None, sample_weight=None, zero_division='warn' or 0), or use the Hub's seqeval module."
        )


class Seqeval(evaluate.Metric):
    """Entity-level scores, delegating to `bert_suite.metrics.ner.ner_scores`."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Sequence(datasets.Value("string", id="label"), id="sequence"),
                    "references": datasets.Sequence(datasets.Value("string", id="label"), id="sequence"),
                }
            ),
            homepage="https://github.com/chakki-works/seqeval",
            reference_urls=["https://www.clips.uantwerpen.be/conll2003/ner/", "https://arxiv.org/abs/1810.04805"],
        )

    def _compute(self, predictions, references, suffix=False, scheme=None, mode=None, sample_weight=None,
                 zero_division="warn"):
        _check_default_mode(suffix, scheme, mode, sample_weight, zero_division)
        scores = ner_scores(references, predictions)
        gold_counts = entity_counts(references)
        kinds = sorted(gold_counts.keys() | entity_counts(predictions).keys())
        result = {
            kind: {
                "precision": scores[f"{kind}_precision"],
                "recall": scores[f"{kind}_recall"],
                "f1": scores[f"{kind}_f1"],
                "number": gold_counts.get(kind, 0),
            }
            for kind in kinds
        }
        result.update(
            overall_precision=scores["precision"],
            overall_recall=scores["recall"],
            overall_f1=scores["f1"],
            overall_accuracy=scores["accuracy"],
        )
        return result
