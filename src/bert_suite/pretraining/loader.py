"""The pre-training recipe's batches: which examples each step takes, and the batch made of them.

Batches are a pure function of the step: the order of epoch e is a permutation seeded by (seed, phase, e),
and an example's masks are a hash of (seed, step, its place in the step's global batch), so a run killed at
step k and resumed gives the uninterrupted run's batches, on any number of processes and with any number of
DataLoader workers. Used by recipes/pretrain.py.
"""

from __future__ import annotations

import torch

from .masking import example_keys

COLUMNS = ("input_ids", "token_type_ids", "next_sentence_label")


class StepBatches(torch.utils.data.Sampler):
    """(micro-step, index list) for steps start, start+1, ...: this process's share of each global batch.
    Any step's batch is computable without replaying the ones before it (exact resume)."""

    def __init__(self, size, batch_size, accumulation, seed, start, rank, world):
        self.size, self.batch, self.accumulation, self.seed = size, batch_size, accumulation, seed
        self.start, self.rank, self.world = start, rank, world
        self.per_epoch = size // (batch_size * world * accumulation)  # whole steps: none straddles two epochs
        if self.per_epoch < 1:
            raise ValueError(f"{size} instances do not fill one global batch of {batch_size * world * accumulation}")

    def __iter__(self):
        micro = self.start * self.accumulation
        while True:
            step, part = divmod(micro, self.accumulation)
            epoch, position = divmod(step, self.per_epoch)
            first = ((position * self.accumulation + part) * self.world + self.rank) * self.batch
            yield micro, self.order(epoch)[first: first + self.batch].tolist()
            micro += 1

    def order(self, epoch: int) -> torch.Tensor:
        """Epoch `epoch`'s permutation of the instances, drawn once per epoch (a draw is O(instances): about a
        second at 100M, once, not at every step)."""
        if getattr(self, "_epoch", None) != epoch:
            self._epoch = epoch
            self._order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
        return self._order


def as_features(rows: dict) -> list[dict]:
    """A datasets slice (column -> values) as the list of examples a collator takes."""
    return [dict(zip(rows, values, strict=True)) for values in zip(*rows.values(), strict=True)]


class Batches(torch.utils.data.Dataset):
    """The micro-batch of a (micro-step, indices) key, made where the loader runs (in its worker processes
    with dataloader_num_workers > 0, beside the GPU's step): padded, masked (a function of the run's seed,
    the global step and the rows' places in its global batch), counted (masked positions and real tokens,
    so that the step never reads them on the device) and, for a static step, in its static form. `causal`:
    next-token labels (a left-to-right phase) instead of masks."""

    def __init__(self, data, collator, cfg, first_step: int, rank: int, world: int, form, causal: bool = False):
        self.table = data.select_columns([c for c in (*COLUMNS, "labels") if c in data.column_names])
        self.collator, self.cfg, self.first_step, self.rank, self.world, self.form, self.causal = \
            collator, cfg, first_step, rank, world, form, causal

    def __getitem__(self, key):
        micro, indices = key
        step, part = divmod(micro, self.cfg.gradient_accumulation_steps)
        batch = self.collator.pad(as_features(self.table[indices]))
        first = (part * self.world + self.rank) * len(indices)
        batch = step_masks(self.collator, batch, self.cfg.seed, self.first_step + step, first, self.causal)
        counts = int((batch["labels"] != -100).sum()), int(batch["attention_mask"].sum())
        return (self.collator.static(batch, *self.form) if self.form else batch), counts


def _as_is(item):
    return item


def batches(data, collator, cfg, phase, start, accelerator, batch_size, form, workers, causal=None):
    """(batch, (masked, real tokens)) for each micro-step from phase step `start` on; `causal`: next-token
    labels (default: cfg.causal_attention)."""
    sampler = StepBatches(len(data), batch_size, cfg.gradient_accumulation_steps, cfg.seed + 7919 * phase,
                          start, accelerator.process_index, accelerator.num_processes)
    made = Batches(data, collator, cfg, 0 if phase == 0 else cfg.phase1_steps, accelerator.process_index,
                   accelerator.num_processes, form, cfg.causal_attention if causal is None else causal)
    # Its own generator: creating an iterator must not draw from the global RNG (dropout's), or a
    # resumed run, which creates it at a different step, would see different dropout masks.
    loader = torch.utils.data.DataLoader(made, sampler=sampler, batch_size=None, collate_fn=_as_is,
                                         num_workers=workers, pin_memory=accelerator.device.type == "cuda",
                                         generator=torch.Generator())
    return iter(loader)


def static_length(data) -> int:
    """The longest instance of a phase's data (its static length): read off the Arrow column, no Python loop."""
    import pyarrow.compute as pc

    return int(pc.max(pc.list_value_length(data.data.column("input_ids"))).as_py() or 0)


def most_labels(data) -> int:
    """The most masked positions of an instance masked offline (its `labels` column; 0 without one)."""
    import numpy as np

    if "labels" not in data.column_names:
        return 0
    column = data.data.column("labels").combine_chunks()
    labelled = (column.flatten().to_numpy(zero_copy_only=False) != -100).astype(np.int64)
    offsets = column.offsets.to_numpy()
    counts = np.add.reduceat(labelled, offsets[:-1]) if len(labelled) else np.zeros(1, np.int64)
    return int(counts[np.diff(offsets) > 0].max(initial=0))


def step_masks(collator, batch, seed, step, first, causal=False):
    """Labels for a batch whose rows sit at places first, first+1, ... of the step's global batch."""
    if causal:  # the paper's LTR model is a left-to-right LM: predict token i+1 at i, nothing masked
        labels = torch.full_like(batch["input_ids"], -100)
        labels[:, :-1] = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
        return {**batch, "labels": labels}
    if "labels" in batch:  # static masks from pretrain-data
        return batch
    offsets = first + torch.arange(len(batch["input_ids"]))
    return collator.mask(batch, keys=example_keys(seed, step, offsets))
