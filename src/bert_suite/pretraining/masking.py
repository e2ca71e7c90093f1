"""Masked-LM collator: pads NSP instances and draws BERT's masks (reference count, 80/10/10 mix, whole-word)."""

from __future__ import annotations

import math

import torch

IGNORE_INDEX = -100


_M32 = 0xFFFFFFFF


def _hash32(x):
    """A 32-bit integer mixer on Python ints or int64 tensors holding values below 2**32. Both multipliers are below
    2**31, so no product overflows int64."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def example_keys(seed: int, step, offsets: torch.Tensor) -> torch.Tensor:
    """One key per example: a function of the run's seed, the step and the example's place in the
    step's global batch (all processes, all micro-batches). It does not depend on how that batch is
    split, so 1 process with batch 2B and 2 processes with batch B draw the same masks. `step`: an int, or
    a 0-d tensor on the offsets' device (a captured step reads it from a device buffer)."""
    seeded = _hash32(seed & _M32)  # a Python int: the mixer runs on ints as on tensors
    base = _hash32(seeded ^ (torch.as_tensor(step, device=offsets.device) & _M32))
    return _hash32(base ^ offsets.long())


def keyed_bits(keys: torch.Tensor, length: int, draw: int) -> torch.Tensor:
    """Integers in [0, 2**32), (len(keys), length), on the keys' device: `keyed_uniform`'s numbers times 2**32."""
    row = _hash32(keys ^ (draw * 0x9E3779B1 & _M32))
    return _hash32(row[:, None] ^ torch.arange(length, device=keys.device))


def keyed_uniform(keys: torch.Tensor, length: int, draw: int) -> torch.Tensor:
    """Uniform [0, 1) numbers, (len(keys), length), each a function of (key, position, draw) only:
    the same for a row whatever its batch or padding."""
    return keyed_bits(keys, length, draw).double() / 2.0**32


def below(fraction: float) -> int:
    """The integer threshold t with bits < t exactly when bits / 2**32 < fraction (bits an integer)."""
    return math.ceil(fraction * 2.0**32)


def _as_long(values) -> torch.Tensor:
    """A 1-D int64 tensor from a list of ints, a numpy array (any int dtype) or a tensor."""
    return torch.as_tensor(values).to(torch.long)


class MaskingCollator:
    """Pads pre-training instances and masks them as the reference create_pretraining_data does.

    Written here because transformers' DataCollatorForLanguageModeling draws a Bernoulli per token (so the
    count per sequence varies and cannot be capped by max_predictions_per_seq), may draw special tokens as
    RANDOM replacements, needs offset mappings for whole-word masking and takes no per-call generator.
    """

    def __init__(self, tokenizer, mlm_probability: float = 0.15, mask_ratio: float = 0.8, random_ratio: float = 0.1,
                 max_predictions_per_seq: int | None = None, whole_word_mask: bool = False,
                 pad_to_multiple_of: int | None = None, seed: int | None = None):
        missing = [name for name in ("mask", "cls", "sep", "pad") if getattr(tokenizer, f"{name}_token_id") is None]
        if missing:
            raise ValueError(f"MaskingCollator: the tokenizer has no {', '.join(t + '_token' for t in missing)}")
        if not 0.0 < mlm_probability <= 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1], got {mlm_probability}")
        if not (0.0 <= mask_ratio <= 1.0 and 0.0 <= random_ratio <= 1.0 and mask_ratio + random_ratio <= 1.0 + 1e-9):
            raise ValueError(f"mask_ratio and random_ratio must be in [0, 1] with sum <= 1, "
                             f"got {mask_ratio} and {random_ratio}")
        if max_predictions_per_seq is not None and max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq must be >= 1 or None, got {max_predictions_per_seq}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1 or None, got {pad_to_multiple_of}")
        self.mlm_probability, self.mask_ratio, self.random_ratio = mlm_probability, mask_ratio, random_ratio
        self.max_predictions_per_seq, self.whole_word_mask = max_predictions_per_seq, whole_word_mask
        self.pad_to_multiple_of = pad_to_multiple_of
        self.mask_id, self.pad_id = tokenizer.mask_token_id, tokenizer.pad_token_id
        special = {tokenizer.cls_token_id, tokenizer.sep_token_id, self.pad_id, self.mask_id,
                   *tokenizer.all_special_ids}
        vocab = tokenizer.get_vocab()
        size = max(max(vocab.values()), *special) + 1
        self.special_ids = torch.tensor(sorted(special), dtype=torch.long)
        # RANDOM draws exclude special tokens: the reference could put [CLS]/[PAD] mid-sequence.
        self.random_pool = torch.tensor(sorted(set(vocab.values()) - special), dtype=torch.long)
        if len(self.random_pool) == 0:
            raise ValueError("MaskingCollator: the tokenizer's vocabulary has no non-special token")
        self.is_continuation = torch.zeros(size, dtype=torch.bool)
        self.is_continuation[[i for t, i in vocab.items() if t.startswith("##")]] = True
        self.generator = torch.Generator()
        self.generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, (1,)).item()))

    def pad(self, features: list[dict]) -> dict[str, torch.Tensor]:
        """Pad a list of examples (input_ids, token_type_ids, optional next_sentence_label, optional labels) to the
        longest; returns input_ids, token_type_ids, attention_mask (1 = real token), next_sentence_label when given,
        labels (padded with -100) when given."""
        lengths = torch.tensor([len(f["input_ids"]) for f in features])
        length = int(lengths.max())
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of

        def stack(key: str, fill: int) -> torch.Tensor:
            out = torch.full((len(features), length), fill, dtype=torch.long)
            for row, f in enumerate(features):
                if key in f:
                    values = _as_long(f[key])
                    out[row, : len(values)] = values
            return out

        batch = {"input_ids": stack("input_ids", self.pad_id), "token_type_ids": stack("token_type_ids", 0),
                 "attention_mask": (torch.arange(length) < lengths[:, None]).long()}
        if "next_sentence_label" in features[0]:
            batch["next_sentence_label"] = torch.tensor([int(f["next_sentence_label"]) for f in features])
        if "labels" in features[0]:
            batch["labels"] = stack("labels", IGNORE_INDEX)
        return batch

    def _counts(self, attention_mask: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """The reference's number of predictions per sequence, capped by the number of candidates."""
        n = attention_mask.sum(dim=1).double()  # float64 and half-to-even rounding, as Python's round
        count = torch.round(n * self.mlm_probability).long().clamp(min=1)
        if self.max_predictions_per_seq is not None:
            count = count.clamp(max=self.max_predictions_per_seq)
        return torch.minimum(count, candidates.sum(dim=1))

    def _whole_words(self, input_ids, candidates, counts, word_order) -> torch.Tensor:
        """Pick words in random order, each whole and only if it still fits in the sequence's count."""
        continuation = self.is_continuation[input_ids.clamp(0, len(self.is_continuation) - 1)] & candidates
        previous = torch.nn.functional.pad(candidates[:, :-1], (1, 0), value=False)
        starts = candidates & ~(continuation & previous)  # a `##` piece after a non-candidate starts a word
        word = torch.cumsum(starts.long(), dim=1) - 1  # word index of each position within its row
        chosen = torch.zeros_like(candidates)
        for row in range(input_ids.shape[0]):
            positions = candidates[row].nonzero().squeeze(1)
            sizes = torch.bincount(word[row, positions]).tolist() if len(positions) else []
            budget, picked = int(counts[row]), []
            for w in word_order(row, starts[row].nonzero().squeeze(1)):
                if budget == 0:
                    break
                if sizes[w] <= budget:  # the reference skips a word that would overshoot the count
                    picked.append(w)
                    budget -= sizes[w]
            chosen[row, positions] = torch.isin(word[row, positions], torch.tensor(picked, dtype=torch.long))
        return chosen

    def mask(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None,
             keys: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """A NEW dict: input_ids with the chosen positions replaced, labels = original id at chosen positions, -100
        elsewhere; every other key unchanged (attention_mask, token_type_ids, next_sentence_label).

        Draws come from `generator` (default: the collator's), or, with `keys` (one int per row, see
        `example_keys`), from a hash of (key, position): a row's masks then do not depend on the rows
        batched with it or on padding, which makes a run's masks independent of the number of processes."""
        generator = generator if generator is not None else self.generator
        input_ids = batch["input_ids"].long()
        device, shape = input_ids.device, input_ids.shape
        input_ids = input_ids.cpu()  # draws happen on the generator's device (CPU) so results are reproducible
        attention_mask = batch.get("attention_mask")
        attention_mask = (input_ids != self.pad_id) if attention_mask is None else attention_mask.cpu().bool()
        candidates = attention_mask & ~torch.isin(input_ids, self.special_ids)
        counts = self._counts(attention_mask, candidates)
        if keys is None:
            def uniform(draw):
                return torch.rand(shape, generator=generator)
        else:
            keys = torch.as_tensor(keys, dtype=torch.long).cpu()

            def uniform(draw):
                return keyed_uniform(keys, shape[1], draw)
        if self.whole_word_mask:
            if keys is None:
                def word_order(row, starts):
                    return torch.randperm(len(starts), generator=generator).tolist()
            else:
                scores = uniform(0)

                def word_order(row, starts):  # words ranked by the score of their first piece
                    return scores[row, starts].argsort(descending=True, stable=True).tolist()
            chosen = self._whole_words(input_ids, candidates, counts, word_order)
        else:
            # Rank random scores with non-candidates last; the `count` best-ranked positions are chosen.
            scores = uniform(0).masked_fill(~candidates, -1.0)
            order = scores.argsort(dim=1, descending=True, stable=True)
            chosen = torch.zeros_like(candidates).scatter_(1, order, torch.arange(shape[1]) < counts[:, None])
        # One uniform draw per position decides MASK / RANDOM / SAME (per token, also under whole-word).
        kind = uniform(1)
        to_mask = chosen & (kind < self.mask_ratio)
        to_random = chosen & (kind >= self.mask_ratio) & (kind < self.mask_ratio + self.random_ratio)
        if keys is None:
            picks = torch.randint(len(self.random_pool), shape, generator=generator)
        else:
            picks = (uniform(2) * len(self.random_pool)).long().clamp(max=len(self.random_pool) - 1)
        random_ids = self.random_pool[picks]
        masked = input_ids.masked_fill(to_mask, self.mask_id).where(~to_random, random_ids)
        out = dict(batch)
        out["input_ids"] = masked.to(device)
        out["labels"] = input_ids.masked_fill(~chosen, IGNORE_INDEX).to(device)
        return out

    def static(self, batch: dict[str, torch.Tensor], seq_len: int, predictions: int | None) -> dict[str, torch.Tensor]:
        """`static_batch` with this collator's padding id."""
        return static_batch(batch, seq_len, predictions, self.pad_id)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        """pad, then mask with self.generator — unless the features already carry `labels` (static masks made
        offline): then only pad."""
        batch = self.pad(features)
        return batch if "labels" in batch else self.mask(batch)


def static_batch(batch: dict[str, torch.Tensor], seq_len: int, predictions: int | None,
                 pad_id: int = 0) -> dict[str, torch.Tensor]:
    """A masked batch (from `pad` and `mask`) in the static form a compiled or graph-captured step takes, made
    on the CPU so that the device step reads no tensor value:
    - every tensor padded to `seq_len` (the phase's max_seq_length), so one shape serves every batch;
    - `masked_positions` (batch, predictions) and `labels` (batch, predictions): the labelled positions of
      each row in order, then position 0 with label -100 (the original BERT's max_predictions_per_seq
      tensors); with `predictions` None, `labels` stay (batch, seq_len) (a left-to-right model predicts
      every position);
    - no `attention_mask` when no position is padding, so that attention needs no mask (flash kernels).
    A row with more labelled positions than `predictions` is an error naming both counts."""
    length = batch["input_ids"].shape[1]
    if length > seq_len:
        raise ValueError(f"a batch of length {length} is longer than the static length {seq_len}")
    fills = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX}
    out = {k: torch.nn.functional.pad(v, (0, seq_len - length), value=fills[k]) if k in fills else v
           for k, v in batch.items()}
    if predictions is not None:
        labels = out["labels"]
        chosen = labels != IGNORE_INDEX
        counts = chosen.sum(1)
        if int(counts.max()) > predictions:
            row = int(counts.argmax())
            raise ValueError(f"row {row} of the batch has {int(counts[row])} masked positions, more than "
                             f"max_predictions_per_seq ({predictions}); raise it or rebuild the data with that cap")
        # the labelled positions first, in order (a stable sort of not-chosen), then anything: cut to the cap
        order = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :predictions]
        order = torch.nn.functional.pad(order, (0, predictions - order.shape[1]))  # seq_len < predictions
        used = torch.arange(predictions) < counts[:, None]
        out["masked_positions"] = order.where(used, 0)
        out["labels"] = labels.gather(1, order).where(used, IGNORE_INDEX)
    if "attention_mask" in out and bool(out["attention_mask"].all()):
        del out["attention_mask"]
    return out


class StepMasker:
    """The collator's keyed masks, made inside the step from what an ids-only loader ships (`ids_batch`): token
    ids padded with [PAD], `lengths` (absent when no row is padded), `first_lengths` (the first segment's,
    [CLS] and its [SEP] included), `next_sentence_label`, and the step and the first row's place in the step's
    global batch as 0-d tensors (`mask_step`, `mask_first`). Every operation runs on the ids' device with
    integers (the hashes compared with integer thresholds, the RANDOM pick a shift), reads no value on the host
    and makes no shape from values, so it can be compiled and captured with the step; its batch equals, bit for
    bit, `MaskingCollator.mask(keys=example_keys(...))` then `static_batch` (or the dynamic form with
    `predictions` None and `static` False). `causal`: next-token labels instead (a left-to-right phase).
    Whole-word masking ranks words in a Python loop: it stays in the loader (`mask_in_step` falls back)."""

    def __init__(self, collator: MaskingCollator, seed: int, static: bool, predictions: int | None,
                 causal: bool = False):
        if collator.whole_word_mask and not causal:
            raise ValueError("whole-word masking cannot be made inside the step; its masks are made in the loader")
        self.collator, self.seed, self.static, self.predictions, self.causal = collator, seed, static, predictions, causal
        self.mask_below = below(collator.mask_ratio)
        self.random_below = below(collator.mask_ratio + collator.random_ratio)
        self._on: dict = {}

    def _tensors(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """A table id -> special (a lookup, where `isin` may sort and read a count on the host) and the RANDOM pool
        on `device`, copied once (not inside a captured step)."""
        if device not in self._on:
            special = self.collator.special_ids
            table = torch.zeros(max(len(self.collator.is_continuation), int(special.max()) + 1), dtype=torch.bool)
            table[special] = True
            self._on[device] = (table.to(device), self.collator.random_pool.to(device))
        return self._on[device]

    def __call__(self, shipped: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids = shipped["input_ids"].long()
        rows, length = ids.shape
        device = ids.device
        positions = torch.arange(length, device=device)
        lengths = shipped.get("lengths")
        real = positions < lengths[:, None] if lengths is not None else torch.ones_like(ids, dtype=torch.bool)
        batch = {"input_ids": ids, "token_type_ids": ((positions >= shipped["first_lengths"][:, None]) & real).long()}
        if lengths is not None or not self.static:  # the static form has no mask where no row is padded
            batch["attention_mask"] = real.long()
        if "next_sentence_label" in shipped:
            batch["next_sentence_label"] = shipped["next_sentence_label"].long()
        if self.causal:
            labels = torch.full_like(ids, IGNORE_INDEX)
            labels[:, :-1] = ids[:, 1:].masked_fill(~real[:, 1:], IGNORE_INDEX)
            return {**batch, "labels": labels}
        special, pool = self._tensors(device)
        keys = example_keys(self.seed, shipped["mask_step"], shipped["mask_first"] + torch.arange(rows, device=device))
        candidates = real & ~special[ids]
        counts = self.collator._counts(real, candidates)
        scores = keyed_bits(keys, length, 0).masked_fill(~candidates, -1)
        order = scores.argsort(dim=1, descending=True, stable=True)
        chosen = torch.zeros_like(candidates).scatter_(1, order, positions < counts[:, None])
        kind = keyed_bits(keys, length, 1)
        to_mask = chosen & (kind < self.mask_below)
        to_random = chosen & (kind >= self.mask_below) & (kind < self.random_below)
        picks = (keyed_bits(keys, length, 2) * len(pool)) >> 32  # floor(uniform * pool size), exactly
        batch["input_ids"] = ids.masked_fill(to_mask, self.collator.mask_id).where(~to_random, pool[picks])
        labels = ids.masked_fill(~chosen, IGNORE_INDEX)
        if not self.static or self.predictions is None:
            return {**batch, "labels": labels}
        # static_batch's positions: the labelled ones first, in order, then position 0 with label -100
        order = torch.argsort((~chosen).to(torch.int8), dim=1, stable=True)[:, :self.predictions]
        order = torch.nn.functional.pad(order, (0, self.predictions - order.shape[1]))
        used = torch.arange(self.predictions, device=device) < chosen.sum(1, keepdim=True)
        return {**batch, "masked_positions": order.where(used, 0), "labels": labels.gather(1, order).where(used, IGNORE_INDEX)}
