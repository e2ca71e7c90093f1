"""BertSuiteConfig: the BERT architecture of Devlin et al. (2018), with named size presets and the
switches the paper's ablations need (left-to-right attention, NSP head on/off).

This file is self-contained (torch/transformers imports only) because saved checkpoints ship a
copy of it for `trust_remote_code=True` loading where bert_suite is not installed.
"""

from __future__ import annotations

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

# Keys that stock BERT config files carry and that have no effect on this architecture.
_INERT_KEYS = frozenset(
    {
        "_name_or_path", "gradient_checkpointing", "use_cache", "output_past", "directionality",
        "pooler_fc_size", "pooler_num_attention_heads", "pooler_num_fc_layers",
        "pooler_size_per_head", "pooler_type", "tokenizer_class", "finetuning_task",
        "task_specific_params", "bos_token_id", "eos_token_id", "sep_token_id", "prefix",
        "torchscript", "use_bfloat16", "tf_legacy_loss", "pruned_heads", "tie_encoder_decoder",
        "cross_attention_hidden_size", "decoder_start_token_id", "model_type",
        "return_dict_in_generate", "output_scores", "_commit_hash", "transformers_version",
    }
)
# Keys the base class consumes itself (loading options and generation leftovers).
_BASE_KWARGS = frozenset(
    {
        "name_or_path", "auto_map", "num_labels", "torch_dtype", "output_attentions", "attn_implementation",
        "experts_implementation", "per_layer_config", "max_length", "min_length", "do_sample",
        "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature",
        "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "num_return_sequences", "forced_bos_token_id", "forced_eos_token_id",
        "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
        "begin_suppress_tokens",
    }
)


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
            values computed from the padding tokens. False: the stock computation everywhere.
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
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        where = kwargs.get("name_or_path") or kwargs.get("_name_or_path")
        where = f"{where}/config.json" if where else "BertSuiteConfig"
        # Stock BERT spells the left-to-right switch `is_decoder`; anything we cannot honour is an
        # error rather than a silently different model.
        if kwargs.pop("is_decoder", False):
            self.causal_attention = True
        if kwargs.pop("add_cross_attention", False):
            raise BertSuiteConfigError(f"{where}: add_cross_attention=True is not supported (encoder only)")
        position_type = kwargs.pop("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise BertSuiteConfigError(
                f"{where}: position_embedding_type={position_type!r} is not supported; expected 'absolute'"
            )
        for key in list(kwargs):
            if key in _INERT_KEYS:
                kwargs.pop(key)
            elif key not in _BASE_KWARGS:
                raise BertSuiteConfigError(
                    f"{where}: unknown config key {key!r}; known keys: "
                    + ", ".join(BertSuiteConfig.__annotations__)
                    + " (and the common PreTrainedConfig keys)"
                )
        if self.hidden_size % self.num_attention_heads != 0:
            raise BertSuiteConfigError(
                f"{where}: hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads})"
            )
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if getattr(self, name) <= 0:
                raise BertSuiteConfigError(f"{where}: {name} must be positive, got {getattr(self, name)}")
        super().__post_init__(**kwargs)

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
        model_type = config_dict.get("model_type", cls.model_type)
        if model_type not in ("bert", cls.model_type):
            raise BertSuiteConfigError(
                f"{pretrained_model_name_or_path}/config.json: model_type {model_type!r} is not a BERT "
                f"checkpoint; expected 'bert' or '{cls.model_type}'"
            )
        config_dict["model_type"] = cls.model_type
        kwargs.setdefault("name_or_path", str(pretrained_model_name_or_path))
        return cls.from_dict(config_dict, **kwargs)

    def to_bert_dict(self) -> dict:
        """The same architecture as a stock `transformers.BertConfig` dictionary (model_type bert)."""
        out = self.to_dict()
        for key in ("causal_attention", "use_nsp", "unpad_inputs", "auto_map", "model_type", "architectures", "dtype"):
            out.pop(key, None)
        out["is_decoder"] = self.causal_attention
        return out


__all__ = ["BertSuiteConfig", "BertSuiteConfigError", "PRESETS"]
