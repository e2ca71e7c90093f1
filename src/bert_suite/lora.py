"""LoRA fine-tuning (Hu et al., 2021) through peft: low-rank updates on some of the encoder's linear
layers, trained with the task head while every other weight stays frozen.

`LoraSettings` holds what `--lora_r`, `--lora_alpha`, `--lora_dropout` and `--lora_target_modules` say;
`apply_lora` wraps a model with a head for training, `save_lora` writes the adapter (OUT/adapter) and
the merged model (OUT itself), so that predict, export and the Hub push take a LoRA run's folder as
they take any other checkpoint."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TARGETS = ("query", "value")  # as the LoRA paper (Section 7.1) and peft's BERT default
ADAPTER_FOLDER = "adapter"


class LoraError(ValueError):
    """LoRA settings that cannot work; the message says which flag and what would."""


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA configuration. `alpha` None means 2 x r: the update's scale alpha/r stays 2 for every rank,
    so a grid over ranks compares ranks, not scales."""

    r: int
    alpha: float | None = None
    dropout: float = 0.1
    target_modules: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self):
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise LoraError(f"--lora_r {self.r}: the LoRA rank must be a whole number of at least 1 (leave --lora_r "
                            "out for full fine-tuning)")
        if self.alpha is not None and not self.alpha > 0:
            raise LoraError(f"--lora_alpha {self.alpha}: must be positive (default: 2 x --lora_r)")
        if not 0 <= self.dropout < 1:
            raise LoraError(f"--lora_dropout {self.dropout}: must be in [0, 1)")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise LoraError(f"--lora_target_modules {list(self.target_modules)}: give one or more module names, "
                            "e.g. query,value")

    @property
    def scale_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.r

    def with_rank(self, r: int) -> LoraSettings:
        return dataclasses.replace(self, r=int(r))

    def record(self) -> dict:
        """The settings as run_manifest.json, all_results.json and the model card keep them."""
        return {"lora_r": self.r, "lora_alpha": self.scale_alpha, "lora_dropout": self.dropout,
                "lora_target_modules": list(self.target_modules)}


def lora_settings(r: int | None, alpha: float | None = None, dropout: float | None = None,
                  target_modules: list[str] | str | None = None) -> LoraSettings | None:
    """The settings the flags give, None without --lora_r (or --lora_ranks on a grid); `target_modules`
    may be names or comma-separated names (query,value)."""
    if r is None:
        given = [flag for flag, value in (("--lora_alpha", alpha), ("--lora_dropout", dropout),
                                          ("--lora_target_modules", target_modules)) if value is not None]
        if given:
            raise LoraError(f"{', '.join(given)}: LoRA settings without --lora_r (the rank, which turns LoRA on)")
        return None
    names = target_modules.split(",") if isinstance(target_modules, str) else \
        [part for item in (target_modules or []) for part in item.split(",")]
    return LoraSettings(r=r, alpha=alpha, dropout=0.1 if dropout is None else dropout,
                        target_modules=tuple(n.strip() for n in names if n.strip()) or DEFAULT_TARGETS)


def head_modules(model) -> list[str]:
    """The task head: the model's top-level modules with parameters besides the encoder (classifier,
    qa_outputs), trained in full next to the LoRA matrices."""
    return [name for name, child in model.named_children()
            if name != model.base_model_prefix and any(True for _ in child.parameters())]


def check_targets(model, targets: tuple[str, ...]) -> None:
    """Every target must name a linear layer of the encoder (as peft matches: the module name or its last
    parts); an error lists the names that exist."""
    import torch

    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in linear)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n in linear if n.startswith(model.base_model_prefix + ".")})
        raise LoraError(f"--lora_target_modules: {', '.join(missing)} matches no linear layer of "
                        f"{type(model).__name__}; its linear layers are named {', '.join(leaves)} "
                        "(e.g. query,value or query,key,value,dense)")


def apply_lora(model, settings: LoraSettings):
    """`model` (with its head) wrapped by peft: LoRA matrices on the target layers and the head trainable,
    everything else frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise LoraError("--lora_r needs peft: pip install peft (a dependency of bert_suite; was it removed?)") from None
    check_targets(model, settings.target_modules)
    config = LoraConfig(r=settings.r, lora_alpha=settings.scale_alpha, lora_dropout=settings.dropout,
                        target_modules=list(settings.target_modules), modules_to_save=head_modules(model),
                        bias="none")  # no task_type: see below
    # peft's task-type wrappers are left out on purpose: PeftModelForQuestionAnswering (peft 0.21) does not pass
    # token_type_ids on to the model, so SQuAD would train and predict without segment ids. The plain PeftModel
    # passes every input through, for every head (tests/test_lora.py checks the outputs against stock + peft).
    return get_peft_model(model, config)


def trainable_parameters(model) -> tuple[int, int]:
    """(trainable, all) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def describe(model, settings: LoraSettings) -> str:
    trainable, total = trainable_parameters(model)
    return (f"LoRA r={settings.r} alpha={settings.scale_alpha:g} dropout={settings.dropout:g} on "
            f"{', '.join(settings.target_modules)}: {trainable:,} trainable parameters of {total:,} "
            f"({100 * trainable / total:.2f}%)")


def save_lora(model, folder: str | Path, tokenizer=None) -> Path:
    """Write the adapter to FOLDER/adapter (peft's adapter_config.json + adapter_model.safetensors) and the
    merged model, a plain checkpoint, to FOLDER. Merging changes `model` in place: call it last."""
    folder = Path(folder)
    model.save_pretrained(folder / ADAPTER_FOLDER)
    merged = model.merge_and_unload()
    merged.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
        tokenizer.save_pretrained(folder / ADAPTER_FOLDER)
    return folder
