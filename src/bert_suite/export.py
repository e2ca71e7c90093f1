"""Export a bert_suite checkpoint to the stock transformers BERT format (model_type `bert`), so
that `transformers.BertFor*.from_pretrained(dst)` loads it with identical outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import transformers

from . import modeling_bert_suite
from .configuration_bert_suite import BertSuiteConfig

# Our class -> the stock class with the same modules and parameter names.
STOCK_CLASSES = {
    "BertSuiteModel": "BertModel",
    "BertSuiteForPreTraining": "BertForPreTraining",
    "BertSuiteForMaskedLM": "BertForMaskedLM",
    "BertSuiteForNextSentencePrediction": "BertForNextSentencePrediction",
    "BertSuiteForSequenceClassification": "BertForSequenceClassification",
    "BertSuiteForQuestionAnswering": "BertForQuestionAnswering",
    "BertSuiteForMultipleChoice": "BertForMultipleChoice",
    "BertSuiteForTokenClassification": "BertForTokenClassification",
}
# Architectures whose outputs read the pooled vector: a causal model pools its last real token, stock BERT position 0.
POOLED = ("BertSuiteModel", "BertSuiteForPreTraining", "BertSuiteForNextSentencePrediction",
          "BertSuiteForSequenceClassification", "BertSuiteForMultipleChoice")
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


class ExportError(ValueError):
    """The checkpoint cannot be expressed in the target format; the message says why."""


def export_to_bert(src: str | Path, dst: str | Path) -> Path:
    """Write `src` (a bert_suite checkpoint) to `dst` as a stock BERT checkpoint: config.json with
    model_type `bert`, model.safetensors with the same tensor names, and the tokenizer files."""
    src, dst = Path(src), Path(dst)
    config = BertSuiteConfig.from_pretrained(src)
    arch = (config.architectures or ["BertSuiteModel"])[0]
    if arch not in STOCK_CLASSES:
        raise ExportError(f"{src}/config.json: architecture {arch!r} has no stock BERT equivalent; "
                          f"expected one of {', '.join(STOCK_CLASSES)}")
    if arch == "BertSuiteForPreTraining" and not config.use_nsp:
        raise ExportError(f"{src}: a pre-training checkpoint without the NSP head (use_nsp=False) has no "
                          "BertForPreTraining equivalent; load it as BertSuiteForMaskedLM and export that")
    if config.bilstm:
        raise ExportError(f"{src}: the model has a BiLSTM between the encoder and the head (bilstm=True), a layer "
                          "stock BERT does not have; expected a checkpoint without --bilstm")
    if config.causal_attention and arch in POOLED:
        # stock BERT's is_decoder gives the same causal attention, but its pooler would read position 0
        raise ExportError(f"{src}: a left-to-right model (causal_attention=True) pools its last real token, while "
                          f"stock {STOCK_CLASSES[arch]} pools position 0 ([CLS]), which in a left-to-right model "
                          "sees only itself: the exported model would give other pooled outputs and logits. Token-"
                          "level heads export with identical outputs (ForQuestionAnswering, ForTokenClassification, "
                          "ForMaskedLM, as stock is_decoder=True)")
    ours = getattr(modeling_bert_suite, arch).from_pretrained(src)
    stock = getattr(transformers, STOCK_CLASSES[arch])(transformers.BertConfig(**config.to_bert_dict()))
    result = stock.load_state_dict(ours.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ExportError(f"{src}: weights do not map onto {STOCK_CLASSES[arch]}: "
                          f"missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    stock.save_pretrained(dst)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    return dst
