"""What `--model` names (`ModelSpec`) and the error of a run that cannot start (`RunError`): standard library
only, so that commands that only read files (`bert-suite ablation --status`, a study file's checks) import no
torch."""

from __future__ import annotations

from dataclasses import dataclass


class RunError(ValueError):
    """A run that cannot start (bad model, tokenizer or flags); the message says what to change."""


@dataclass(frozen=True)
class ModelSpec:
    """What --model names: a checkpoint (a folder or a Hub id) or `preset:NAME` (random weights of a paper
    size), after any of two prefixes: `random:` (the checkpoint's config and vocabulary with fresh weights: its
    random twin, the floor a pre-trained model is compared with) and `bilstm:` (a randomly initialised BiLSTM
    between the encoder and the head: the "+ BiLSTM" row of the paper's Table 5). E.g. `random:runs/x/final`,
    `bilstm:runs/ltr/final`. `random@K:PATH` is the K-th draw of the twin (K = 1: `random:`): one draw per
    pre-training when a row has several checkpoints of one config, so its twins differ as its checkpoints do."""

    source: str
    random: bool = False
    bilstm: bool = False
    draw: int = 1

    @classmethod
    def parse(cls, model: str) -> ModelSpec:
        flags, rest, draw = {"random": False, "bilstm": False}, model, 1
        while ":" in rest and ((prefix := rest.split(":", 1)[0]) in flags or prefix.startswith("random@")):
            if prefix.startswith("random@"):
                count = prefix.removeprefix("random@")
                if not count.isdigit() or int(count) < 1:
                    raise RunError(f"--model {model}: {prefix}: expected random@K with K a draw number (1, 2, ...)")
                prefix, draw = "random", int(count)
            flags[prefix], rest = True, rest.split(":", 1)[1]
        if not rest:
            raise RunError(f"--model {model}: no checkpoint after the prefix; expected e.g. random:runs/x/final")
        if flags["random"] and rest.startswith("preset:"):
            raise RunError(f"--model {model}: a preset is random weights already; give preset:NAME, or random:PATH "
                           "for a checkpoint's random twin")
        return cls(rest, **flags, draw=draw)


def checkpoint_of(model: str) -> str:
    """The checkpoint (or preset) a --model value reads its config and tokenizer from (prefixes removed)."""
    return ModelSpec.parse(model).source
