"""BertSuiteConfig: the BERT architecture of Devlin et al. (2018), with named size presets and the
switches the paper's ablations need (left-to-right attention, NSP head on/off).

This file is self-contained (torch/transformers imports only) because saved checkpoints ship a
copy of it for `trust_remote_code=True` loading where bert_suite is not installed.
"""

from __future__ import annotations

import difflib
from functools import cache

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# Sizes from the paper (Table 6: BASE, LARGE) and the released miniatures (heads = H / 64).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2},
    "mini": {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4},
    "small": {"num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8},
    "medium": {"num_hidden_layers": 8, "hidden_size": 512, "num_attention_heads": 8},
    "base": {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12},
    "large": {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16},
}

# Keys of stock `transformers.BertConfig` that are not fields here; a stock config.json carries them.
# With the PreTrainedConfig fields and ours, they are what a near-miss (typo) is checked against.
_STOCK_BERT_KEYS = frozenset(
    {
        "use_cache", "is_decoder", "add_cross_attention", "bos_token_id", "eos_token_id",
        "position_embedding_type", "gradient_checkpointing", "tokenizer_class", "finetuning_task",
        "task_specific_params", "sep_token_id", "decoder_start_token_id", "torchscript",
        "pruned_heads", "num_labels", "output_attentions", "attn_implementation", "torch_dtype",
        "name_or_path", "auto_map", "tie_encoder_decoder", "cross_attention_hidden_size", "output_past",
        "directionality", "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
        "pooler_size_per_head", "pooler_type", "prefix", "use_bfloat16", "tf_legacy_loss",
        "return_dict_in_generate", "output_scores",
    }
)
# Other architectures' spellings that transformers' tooling sets on any config (its tests make
# every norm epsilon 1.0 this way): keys, not typos of ours, although close to `layer_norm_eps`.
_OTHER_MODELS_KEYS = frozenset(
    {"layer_norm_epsilon", "norm_eps", "norm_epsilon", "rms_norm_eps", "post_norm_eps", "batch_norm_eps"}
)
# A key closer than this to a known key (difflib ratio) is taken for a typo of it: "hiden_size"
# scores 0.95 against "hidden_size", while keys that tools add ("quantization_config") score < 0.7.
_NEAR_MISS = 0.85


@cache
def _known_keys() -> tuple[str, ...]:
    fields = set(BertSuiteConfig.__dataclass_fields__) | set(PreTrainedConfig.__dataclass_fields__)
    return tuple(sorted(fields | _STOCK_BERT_KEYS))


class BertSuiteConfigError(ValueError):
    """A config that cannot describe a BertSuite model; the message names the file and the key."""


@strict
class BertSuiteConfig(PreTrainedConfig):
    """Configuration of a BertSuite model. Field names are those of `transformers.BertConfig`, so a
    stock BERT `config.json` (model_type `bert`) loads directly.

    Extra fields:
        causal_attention: left-to-right attention (the paper's "LTR" ablation, Table 5).
        use_nsp: build the next-sentence-prediction head in `BertSuiteForPreTraining` ("No NSP").
        unpad_inputs: run the dense layers on the real tokens only when a batch is padded (the
            attention itself still sees the padded layout, so every real position's output is
            the same); outputs at padding positions are then zeros instead of stock BERT's
            values computed from the padding tokens. False: the stock computation everywhere. It
            applies on the CPU: deciding reads the mask's values, a host sync on an accelerator,
            where the model reads none unless `forward(unpad=True)` asks.
        bilstm: a randomly initialised one-layer BiLSTM between the encoder and every head,
            added at fine-tuning (the paper's "+ BiLSTM" row of Table 5); stock BERT has none.
    """

    model_type = "bert_suite"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    classifier_dropout: float | int | None = None
    causal_attention: bool = False
    use_nsp: bool = True
    unpad_inputs: bool = True
    bilstm: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        # Stock BERT spells the left-to-right switch `is_decoder` (causal self-attention: the same
        # computation as `causal_attention`); cross-attention would be a different model.
        if kwargs.pop("is_decoder", False):
            self.causal_attention = True
        if kwargs.get("add_cross_attention"):
            raise BertSuiteConfigError(
                "add_cross_attention=True is not supported: bert_suite is encoder-only (the paper's BERT); "
                "use transformers.BertLMHeadModel / EncoderDecoderModel for a decoder"
            )
        position_type = kwargs.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise BertSuiteConfigError(
                f"position_embedding_type={position_type!r} is not supported; expected 'absolute'"
            )
        kwargs.pop("model_type", None)  # a class attribute, not a per-instance value
        # As any PreTrainedConfig, unknown keys are kept (saved and reloaded): tools add their own
        # (quantization_config, architectures, ...). Only a near-miss of a known key is refused.
        for key in kwargs:
            if key not in _STOCK_BERT_KEYS and key not in _OTHER_MODELS_KEYS and not key.startswith("_"):
                match = difflib.get_close_matches(key, _known_keys(), n=1, cutoff=_NEAR_MISS)
                if match:
                    raise BertSuiteConfigError(f"unknown config key {key!r}; did you mean {match[0]!r}?")
        super().__post_init__(**kwargs)

    @property
    def is_decoder(self) -> bool:
        """Stock BERT's name for causal (left-to-right) self-attention; here `causal_attention`."""
        return self.causal_attention

    @is_decoder.setter
    def is_decoder(self, value: bool) -> None:
        self.causal_attention = bool(value)

    def check_sizes(self) -> None:
        """The model's own checks (made when a model is built, as stock BERT does, so that a config
        can hold any values while it is edited field by field)."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) <= 0:
                raise BertSuiteConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise BertSuiteConfigError(
                f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )

    @classmethod
    def from_preset(cls, name: str, **overrides) -> BertSuiteConfig:
        """A config of one of the paper's sizes (tiny, mini, small, medium, base, large);
        intermediate size 4H. `overrides` replace any field (e.g. vocab_size)."""
        if name not in PRESETS:
            raise BertSuiteConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        sizes = dict(PRESETS[name])
        sizes["intermediate_size"] = 4 * sizes["hidden_size"]
        sizes.update(overrides)
        return cls(**sizes)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs) -> BertSuiteConfig:
        """Load a bert_suite config, or a stock BERT one (model_type `bert`, or the original
        `bert_config.json` with no model_type), which describes the same architecture."""
        config_dict, kwargs = cls.get_config_dict(pretrained_model_name_or_path, **kwargs)
        where = f"{pretrained_model_name_or_path}/config.json"
        model_type = config_dict.get("model_type", cls.model_type)
        if model_type not in ("bert", cls.model_type):
            raise BertSuiteConfigError(
                f"{where}: model_type {model_type!r} is not a BERT checkpoint; expected 'bert' or '{cls.model_type}'"
            )
        config_dict["model_type"] = cls.model_type
        try:
            return cls.from_dict(config_dict, **kwargs)
        except BertSuiteConfigError as err:
            raise BertSuiteConfigError(f"{where}: {err}") from None

    def to_bert_dict(self) -> dict:
        """The same architecture as a stock `transformers.BertConfig` dictionary (model_type bert)."""
        out = self.to_dict()
        for key in ("causal_attention", "use_nsp", "unpad_inputs", "bilstm", "auto_map", "model_type", "architectures", "dtype"):
            out.pop(key, None)
        out["is_decoder"] = self.causal_attention
        return out


__all__ = ["BertSuiteConfig", "BertSuiteConfigError", "PRESETS"]
