"""Task adapters: one module per task family, each meeting `TaskAdapter`, found through `ADAPTERS`.

The runner (runner.py) does everything that is the same for every task: tokenizer, model, Trainer,
evaluation, prediction files, manifests. An adapter does what differs between families: reading
the data, encoding it, scoring predictions and writing them in the task's own format. To add a task
of an existing family, write a card (tasks/*.yaml); to add a family, write a module that meets
`TaskAdapter`, add it to `ADAPTERS` and to `cards.FAMILIES` (tests/test_architecture.py checks both).

What the adapters share (the data error, split file names, windows and the max-context rule) is in
`common`; its names are re-exported here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from . import classification, multiple_choice, ner, squad
from .common import (  # noqa: F401  (re-exported: the adapters' shared API)
    DataError,
    family_options,
    load_hub_split,
    max_context_windows,
    num_windows,
    read_text,
    split_file_stem,
    window_starts,
)

if TYPE_CHECKING:
    import datasets

    from ..cards import TaskCard


@runtime_checkable
class TaskAdapter(Protocol):
    """What the runner calls on a family's module (the module itself is the adapter)."""

    MODEL_CLASS: type
    """The model class with the family's head (a BertSuiteFor... class)."""

    METRICS_USE_EXAMPLES: bool
    """True when `metric_fn` reads a split's own examples (SQuAD, NER): the runner then scores only the first
    dev split per epoch, since Trainer's compute_metrics cannot tell which split it scores."""

    def model_kwargs(self, card: TaskCard) -> dict:
        """Keyword arguments for the head (num_labels, id2label, ...) taken from the card."""

    def load_split(self, card: TaskCard, split: str, data_dir: str | Path | None = None,
                   skip_bad_rows: bool = False) -> datasets.Dataset:
        """One split as raw examples, from --data_dir files or the card's Hub dataset; bad input is a DataError."""

    def preprocess(self, dataset: datasets.Dataset, card: TaskCard, tokenizer, max_seq_length: int,
                   train: bool) -> datasets.Dataset:
        """Raw examples -> model features (input_ids, ..., labels); `train` drops what only evaluation needs."""

    def collator(self, tokenizer, pad_to_multiple_of: int | None = None):
        """The batch collator for the features: padding to the batch's longest, rounded up to a multiple of
        `pad_to_multiple_of` (length buckets: a few shapes a run, for a compiled or captured step)."""

    def metric_fn(self, card: TaskCard, examples, features):
        """A compute_metrics function for Trainer, scoring one split's predictions with the card's metric."""

    def score_predictions(self, card: TaskCard, examples, features, predictions, settings: dict) -> dict:
        """The card's metrics on a predicted split whose examples carry gold labels (a labelled test file),
        with the settings chosen on dev applied; {} for unlabelled data."""

    def output_path(self, directory: Path, card: TaskCard, split: str) -> Path:
        """The main prediction file that `write_outputs` writes for a split (what `predict` returns)."""

    def write_outputs(self, directory: Path, card: TaskCard, split: str, examples, features, predictions,
                      settings: dict) -> dict:
        """Write the split's prediction files; return settings chosen on dev (e.g. SQuAD v2's null threshold),
        which `settings` passes back in when predicting other splits or new data."""


ADAPTERS: dict[str, TaskAdapter] = {
    "classification": classification,
    "squad": squad,
    "multiple_choice": multiple_choice,
    "ner": ner,
}


def adapter_for(family: str) -> TaskAdapter:
    """The adapter of a family; an unknown family is an error listing the known ones."""
    try:
        return ADAPTERS[family]
    except KeyError:
        raise ValueError(f"no task adapter for family {family!r}; known families: {', '.join(ADAPTERS)}") from None
