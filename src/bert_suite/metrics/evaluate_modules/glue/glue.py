"""GLUE metrics as an `evaluate` module that loads from the installed bert_suite package, offline.

Usage: `evaluate.load(bert_suite.metrics.evaluate_module_path("glue"), "rte")`, the GLUE task
being the config name, as with the Hub's `glue` module, whose result fields it returns.
"""

# `import evaluate`, not `from evaluate import Metric`: evaluate instantiates the first concrete
# Metric class found in this module's namespace, which would then be evaluate's own base class.
import datasets
import evaluate

# evaluate copies this file alone into its modules cache and imports it from there, so the
# metric logic is imported from the installed package rather than from a sibling file.
from bert_suite.metrics.glue import GLUE_METRIC_FIELDS, glue_metrics

_DESCRIPTION = """\
Metrics of the GLUE benchmark (Wang et al., 2019) as reported in the BERT paper (Devlin et al., 2019):
Matthews correlation for CoLA, Pearson and Spearman correlation for STS-B, accuracy and binary F1
of class 1 for MRPC and QQP, and accuracy for the other tasks (SST-2, MNLI, QNLI, RTE, WNLI, AX, HANS).
Values are fractions in [0, 1] (correlations in [-1, 1]), not percentages.
"""

_CITATION = """\
@inproceedings{wang2019glue,
  title = {{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author = {Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle = {International Conference on Learning Representations},
  year = {2019}
}
@inproceedings{devlin2019bert,
  title = {{BERT}: Pre-training of Deep Bidirectional Transformers for Language Understanding},
  author = {Devlin, Jacob and Chang, Ming-Wei and Lee, Kenton and Toutanova, Kristina},
  booktitle = {Proceedings of NAACL-HLT 2019},
  pages = {4171--4186},
  year = {2019}
}
"""

_INPUTS_DESCRIPTION = """
Args:
    predictions: one predicted label id per example (int), or one similarity score per example
        (float) for stsb.
    references: the gold label ids, or gold similarity scores for stsb; same length as predictions.
Returns, depending on the task (the config name):
    cola: matthews_correlation.
    stsb: pearson, spearmanr (0.0 when either side is constant).
    mrpc, qqp: accuracy, f1.
    sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli, ax, hans: accuracy.
Example:
    >>> glue = evaluate.load(bert_suite.metrics.evaluate_module_path("glue"), "mrpc")
    >>> glue.compute(predictions=[1, 0, 1], references=[1, 0, 0])
    {'accuracy': 0.6666666666666666, 'f1': 0.6666666666666666}
"""


class Glue(evaluate.Metric):
    """GLUE metric of the task given as `config_name`, delegating to `bert_suite.metrics.glue_metrics`."""

    def _info(self):
        if self.config_name not in GLUE_METRIC_FIELDS:
            # evaluate names a missing config "default".
            raise KeyError(
                f"unknown GLUE config_name {self.config_name!r}; pass the task as config_name, one of: "
                f"{', '.join(GLUE_METRIC_FIELDS)}"
            )
        dtype = "float32" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(dtype), "references": datasets.Value(dtype)}),
            homepage="https://gluebenchmark.com/",
            reference_urls=["https://arxiv.org/abs/1804.07461", "https://arxiv.org/abs/1810.04805"],
            format="numpy",
        )

    def _compute(self, predictions, references):
        return glue_metrics(self.config_name, predictions, references)
