"""bert_suite: the BERT paper end to end on the Hugging Face stack.

Importing the package registers the BertSuite family with the transformers Auto classes, so
`AutoModelForSequenceClassification.from_pretrained(dir)` works on a bert_suite checkpoint.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForNextSentencePrediction,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_bert_suite import PRESETS, BertSuiteConfig, BertSuiteConfigError
from .modeling_bert_suite import (
    BertSuiteForMaskedLM,
    BertSuiteForMultipleChoice,
    BertSuiteForNextSentencePrediction,
    BertSuiteForPreTraining,
    BertSuiteForQuestionAnswering,
    BertSuiteForSequenceClassification,
    BertSuiteForTokenClassification,
    BertSuiteModel,
    BertSuitePreTrainedModel,
    CheckpointMismatchError,
)

__version__ = "0.1.0"

AUTO_CLASSES = {
    AutoModel: BertSuiteModel,
    AutoModelForPreTraining: BertSuiteForPreTraining,
    AutoModelForMaskedLM: BertSuiteForMaskedLM,
    AutoModelForSequenceClassification: BertSuiteForSequenceClassification,
    AutoModelForQuestionAnswering: BertSuiteForQuestionAnswering,
    AutoModelForMultipleChoice: BertSuiteForMultipleChoice,
    AutoModelForNextSentencePrediction: BertSuiteForNextSentencePrediction,
    AutoModelForTokenClassification: BertSuiteForTokenClassification,
}

AutoConfig.register(BertSuiteConfig.model_type, BertSuiteConfig, exist_ok=True)
for _auto, _model in AUTO_CLASSES.items():
    _auto.register(BertSuiteConfig, _model, exist_ok=True)

__all__ = [
    "AUTO_CLASSES",
    "PRESETS",
    "BertSuiteConfig",
    "BertSuiteConfigError",
    "BertSuiteForMaskedLM",
    "BertSuiteForMultipleChoice",
    "BertSuiteForNextSentencePrediction",
    "BertSuiteForPreTraining",
    "BertSuiteForQuestionAnswering",
    "BertSuiteForSequenceClassification",
    "BertSuiteForTokenClassification",
    "BertSuiteModel",
    "BertSuitePreTrainedModel",
    "CheckpointMismatchError",
]
