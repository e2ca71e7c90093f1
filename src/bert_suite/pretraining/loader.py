"""The pre-training recipe's batches: which examples each step takes, and the batch made of them.

Batches are a pure function of the step: the order of epoch e is a permutation seeded by (seed, phase, e),
and an example's masks are a hash of (seed, step, its place in the step's global batch), so a run killed at
step k and resumed gives the uninterrupted run's batches, on any number of processes and with any number of
DataLoader workers. Used by recipes/pretrain.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch

from ..io import atomic_write_text
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
        batch = self.collator.static(batch, *self.form) if self.form else batch
        return batch, (*counts, batch["input_ids"].numel())


class IdsTable:
    """A phase's instances as fixed-width arrays, built once from the Arrow columns (vectorised, chunk by chunk):
    token ids (instances, longest) padded with [PAD], lengths, the first segment's lengths (its [CLS] and [SEP]
    included) and the NSP labels, so that a batch is one indexed read of each (`take`). A dataset with an
    indices mapping (a split or a selection) is read through it. Two bytes a token slot for a vocabulary under
    65,536 ids (BERT's), four above. `cache`: a file the ids are written to and memory-mapped from (read back by a
    later run of the same data, e.g. after a resume), for tables larger than memory should hold (Wikipedia's
    128-token phase: about 25 GB); without it they are built in memory."""

    def __init__(self, data, pad_id: int, vocab_size: int | None = None, cache: Path | None = None):
        table = data.data
        self.length = static_length(data)
        size = table.num_rows
        dtype = np.uint16 if vocab_size is not None and vocab_size <= 65536 else np.int32
        self.lengths = np.zeros(size, dtype=np.int32)
        self.first = np.zeros(size, dtype=np.int32)
        self.nsp = np.zeros(size, dtype=np.int64)
        mapping = getattr(data, "_indices", None)
        self.rows = mapping.column(0).to_numpy() if mapping is not None else None
        stamp = {"fingerprint": getattr(data, "_fingerprint", None), "shape": [size, self.length],
                 "dtype": np.dtype(dtype).name, "pad_id": pad_id}
        aux = {name: cache.with_name(f"{cache.stem}.{name}.npy") for name in ("lengths", "first", "nsp")} if cache \
            else {}
        if cache is not None and cache.with_suffix(".json").is_file() and cache.is_file() and \
                all(path.is_file() for path in aux.values()) and \
                json.loads(cache.with_suffix(".json").read_text()) == stamp:
            self.ids = np.load(cache, mmap_mode="r")
            for name, path in aux.items():
                setattr(self, name, np.load(path, mmap_mode="r"))
            return
        # built under a name of its own and moved into place whole: several processes (ranks, nodes sharing the
        # disk) may build it at once, and one that mapped the file before never sees it change
        partial = cache.with_name(f"{cache.stem}.{os.getpid()}.partial.npy") if cache is not None else None
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            self.ids = np.lib.format.open_memmap(partial, mode="w+", dtype=dtype, shape=(size, self.length))
            self.ids[:] = pad_id
        else:
            self.ids = np.full((size, self.length), pad_id, dtype=dtype)
        row = 0
        types = table.column("token_type_ids").chunks
        labels = table.column("next_sentence_label").chunks
        for ids, segments, nsp in zip(table.column("input_ids").chunks, types, labels, strict=True):
            count = len(ids)
            if count == 0:
                continue
            offsets = ids.offsets.to_numpy()
            values = ids.values.to_numpy(zero_copy_only=False)
            if dtype == np.uint16 and len(values) and int(values.max()) > 65535:
                raise ValueError(f"instances {row} to {row + count - 1}: a token id of {int(values.max())}, beyond the "
                                 f"tokenizer's {vocab_size} ids; the data were made with another vocabulary")
            lengths = np.diff(offsets)
            spans = offsets[:-1, None] + np.arange(self.length)
            inside = np.arange(self.length) < lengths[:, None]
            self.ids[row: row + count][inside] = values[spans[inside]]
            second = np.concatenate([[0], np.cumsum(segments.values.to_numpy(zero_copy_only=False), dtype=np.int64)])
            type_offsets = segments.offsets.to_numpy()
            first = lengths - (second[type_offsets[1:]] - second[type_offsets[:-1]])
            # the step rebuilds token_type_ids from the first segment's length: they must be [0] * A + [1] * B
            types = segments.values.to_numpy(zero_copy_only=False)[(type_offsets[:-1, None] + np.arange(self.length))
                                                                     .clip(max=max(len(segments.values) - 1, 0))]
            wrong = ((types != (np.arange(self.length) >= first[:, None])) & inside).any(1) \
                | (np.diff(type_offsets) != lengths)
            if wrong.any():
                raise ValueError(f"instance {row + int(wrong.argmax())}: token_type_ids are not 0 for the first segment "
                                 "and 1 for the second (the layout of `bert-suite pretrain-data`); masks for such "
                                 "data are made in the loader (mask_in_step=false)")
            self.first[row: row + count] = first
            self.lengths[row: row + count] = lengths
            self.nsp[row: row + count] = nsp.to_numpy(zero_copy_only=False)
            row += count
        if cache is not None:  # the arrays, each moved into place whole, then the stamp that says they are
            self.ids.flush()
            del self.ids
            os.replace(partial, cache)
            for name, path in aux.items():
                mine = path.with_name(f"{path.stem}.{os.getpid()}.partial.npy")
                np.save(mine, getattr(self, name))
                os.replace(mine, path)
            atomic_write_text(cache.with_suffix(".json"), json.dumps(stamp))
            self.ids = np.load(cache, mmap_mode="r")

    def take(self, indices) -> dict:
        """The rows `indices` of the dataset (its own numbering): numpy arrays, one indexed read each."""
        rows = np.asarray(indices) if self.rows is None else self.rows[np.asarray(indices)]
        return {"input_ids": self.ids[rows], "lengths": self.lengths[rows], "first_lengths": self.first[rows],
                "next_sentence_label": self.nsp[rows]}


class IdsBatches(torch.utils.data.Dataset):
    """The micro-batch of a (micro-step, indices) key for masks made in the step (`StepMasker`): the token ids
    (padded to the phase's length, or for the eager CPU path to the batch's longest), the lengths (left out when
    no row is padded in the static form), the first segment's lengths, the NSP labels, and the step and the first
    row's place in the global batch; counted (the masked positions each row will have, a function of its length
    and its special tokens, and the real and padded tokens) on the host, where the counts cost no device read."""

    def __init__(self, table: IdsTable, collator, cfg, first_step: int, rank: int, world: int, static: bool,
                 causal: bool = False):
        self.table, self.collator, self.cfg, self.first_step, self.rank, self.world = \
            table, collator, cfg, first_step, rank, world
        self.static, self.causal = static, causal
        self.special = collator.special_ids.numpy()

    def __getitem__(self, key):
        micro, indices = key
        step, part = divmod(micro, self.cfg.gradient_accumulation_steps)
        rows = self.table.take(indices)
        lengths = rows["lengths"]
        width = self.table.length if self.static else int(lengths.max())
        ids = rows["input_ids"][:, :width].astype(np.int32)
        real = np.arange(width) < lengths[:, None]
        if self.causal:
            masked = int(np.minimum(lengths - 1, width - 1).clip(min=0).sum())
        else:
            candidates = torch.from_numpy(real & ~np.isin(ids, self.special))  # the collator's count, no mask drawn
            masked = int(self.collator._counts(torch.from_numpy(real), candidates).sum())
        batch = {"input_ids": torch.from_numpy(ids), "first_lengths": torch.from_numpy(rows["first_lengths"]),
                 "next_sentence_label": torch.from_numpy(rows["next_sentence_label"]),
                 "mask_step": torch.tensor(self.first_step + step),
                 "mask_first": torch.tensor((part * self.world + self.rank) * len(indices))}
        if not (self.static and bool(real.all())):
            batch["lengths"] = torch.from_numpy(lengths)
        return batch, (masked, int(lengths.sum()), ids.size)


def _as_is(item):
    return item


def batches(data, collator, cfg, phase, start, accelerator, batch_size, form, workers, causal=None, ids=None):
    """(batch, (masked, real, padded tokens)) for each micro-step from phase step `start` on; `causal`: next-token
    labels (default: cfg.causal_attention); `ids`: the phase's `IdsTable`, whose batches the step masks
    (`StepMasker`), instead of masked batches."""
    causal = cfg.causal_attention if causal is None else causal
    sampler = StepBatches(len(data), batch_size, cfg.gradient_accumulation_steps, cfg.seed + 7919 * phase,
                          start, accelerator.process_index, accelerator.num_processes)
    first = 0 if phase == 0 else cfg.phase1_steps
    if ids is not None:
        made = IdsBatches(ids, collator, cfg, first, accelerator.process_index, accelerator.num_processes,
                          form is not None, causal)
    else:
        made = Batches(data, collator, cfg, first, accelerator.process_index, accelerator.num_processes, form, causal)
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
