"""MaskingCollator: which positions, how many, what they become, whole-word, determinism, static masks."""

import numpy as np
import pytest
import torch
import transformers

from bert_suite.pretraining.masking import IGNORE_INDEX, MaskingCollator, example_keys

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "cat", "sat", "on", "mat", "un", "##aff", "##able", "play", "##ing", "run", "##s", "dog", "a"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SPECIALS + WORDS) + "\n")
    tok = transformers.BertTokenizer(vocab=str(path))  # transformers 5 ignores vocab_file=
    assert tok.tokenize("unaffable playing") == ["un", "##aff", "##able", "play", "##ing"]
    return tok


def instance(tok, length: int, nsp: int = 0) -> dict:
    """[CLS] A [SEP] B [SEP] with `length` tokens in all, ids drawn from the non-special words."""
    body = [tok.convert_tokens_to_ids(WORDS[i % len(WORDS)]) for i in range(length - 3)]
    a, b = body[: len(body) // 2], body[len(body) // 2:]
    ids = [tok.cls_token_id, *a, tok.sep_token_id, *b, tok.sep_token_id]
    return {"input_ids": ids, "token_type_ids": [0] * (len(a) + 2) + [1] * (len(b) + 1), "next_sentence_label": nsp}


def reference_count(n: int, p: float = 0.15, cap: int | None = None) -> int:
    count = max(1, int(round(n * p)))
    return count if cap is None else min(cap, count)


LENGTHS = [7, 10, 23, 40, 64, 100, 128]


@pytest.mark.parametrize("cap,p", [(None, 0.15), (5, 0.15), (None, 0.05)])  # 0.05: short rows round to 0 -> 1
def test_count_and_positions(tokenizer, cap, p):
    collator = MaskingCollator(tokenizer, mlm_probability=p, max_predictions_per_seq=cap, seed=0)
    features = [instance(tokenizer, n, nsp=i % 2) for i, n in enumerate(LENGTHS)]
    padded = collator.pad(features)
    special = torch.isin(padded["input_ids"], collator.special_ids) | (padded["attention_mask"] == 0)
    for _ in range(20):
        out = collator(features)
        chosen = out["labels"] != IGNORE_INDEX
        assert chosen.sum(1).tolist() == [reference_count(n, p, cap) for n in LENGTHS]
        assert not (chosen & special).any()
        # labels hold the original ids exactly where chosen; input_ids untouched elsewhere
        assert torch.equal(out["labels"][chosen], padded["input_ids"][chosen])
        assert torch.equal(out["input_ids"][~chosen], padded["input_ids"][~chosen])
        for key in ("attention_mask", "token_type_ids", "next_sentence_label"):
            assert torch.equal(out[key], padded[key])
        assert all(out[k].dtype == torch.long for k in ("input_ids", "labels", "attention_mask", "token_type_ids"))


def test_count_capped_by_candidates(tokenizer):
    # 4 tokens, 1 candidate: mlm_probability 1.0 asks for 4, only one can be chosen.
    collator = MaskingCollator(tokenizer, mlm_probability=1.0, seed=0)
    feature = instance(tokenizer, 4)
    out = collator([feature])
    assert (out["labels"] != IGNORE_INDEX).sum().item() == 1


def mix_counts(collator, tokenizer, draws: int = 30):
    features = [instance(tokenizer, 128) for _ in range(16)]
    padded = collator.pad(features)
    counts = {"mask": 0, "random": 0, "same": 0}
    for _ in range(draws):
        out = collator(features)
        chosen = out["labels"] != IGNORE_INDEX
        new, old = out["input_ids"][chosen], padded["input_ids"][chosen]
        assert not torch.isin(new[new != tokenizer.mask_token_id], collator.special_ids).any()
        counts["mask"] += (new == tokenizer.mask_token_id).sum().item()
        counts["same"] += (new == old).sum().item()
        counts["random"] += ((new != old) & (new != tokenizer.mask_token_id)).sum().item()
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def test_default_mix_is_80_10_10(tokenizer):
    shares = mix_counts(MaskingCollator(tokenizer, seed=1), tokenizer)
    # A RANDOM draw equals the original 1/len(pool) of the time and then reads as SAME.
    pool = len(WORDS)
    assert shares["mask"] == pytest.approx(0.8, abs=0.02)
    assert shares["random"] == pytest.approx(0.1 * (1 - 1 / pool), abs=0.015)
    assert shares["same"] == pytest.approx(0.1 + 0.1 / pool, abs=0.015)


@pytest.mark.parametrize("mask_ratio,random_ratio", [(0.8, 0.2), (0.0, 0.0), (1.0, 0.0), (0.8, 0.0)])
def test_other_mixes_are_honoured(tokenizer, mask_ratio, random_ratio):
    collator = MaskingCollator(tokenizer, mask_ratio=mask_ratio, random_ratio=random_ratio, seed=2)
    shares = mix_counts(collator, tokenizer, draws=10)
    assert shares["mask"] == pytest.approx(mask_ratio, abs=0.03)
    assert shares["random"] == pytest.approx(random_ratio * (1 - 1 / len(WORDS)), abs=0.03)
    if random_ratio == 0:
        assert shares["random"] == 0
    if mask_ratio == 0:
        assert shares["mask"] == 0


def test_whole_word_masking(tokenizer):
    collator = MaskingCollator(tokenizer, mlm_probability=0.3, whole_word_mask=True, seed=3)
    text = ["unaffable playing the cat runs", "a dog playing on the mat unaffable runs sat"]
    features = [{"input_ids": tokenizer(t)["input_ids"], "token_type_ids": [0] * len(tokenizer(t)["input_ids"]),
                 "next_sentence_label": 1} for t in text]
    padded = collator.pad(features)
    ids = padded["input_ids"]
    continuation = collator.is_continuation[ids]
    saw_word = False
    for _ in range(50):
        out = collator(features)
        chosen = out["labels"] != IGNORE_INDEX
        # a ## piece is chosen exactly when the piece before it is (chains reach the word's first piece)
        assert torch.equal(chosen[:, 1:][continuation[:, 1:]], chosen[:, :-1][continuation[:, 1:]])
        counts = [reference_count(int(n), p=0.3) for n in padded["attention_mask"].sum(1)]
        assert all(0 < c <= want for c, want in zip(chosen.sum(1).tolist(), counts, strict=True))
        assert not (chosen & (padded["attention_mask"] == 0)).any()
        assert not torch.isin(ids[chosen], collator.special_ids).any()
        assert torch.equal(out["attention_mask"], padded["attention_mask"])
        assert torch.equal(out["token_type_ids"], padded["token_type_ids"])
        saw_word |= bool((chosen & continuation).any())
    assert saw_word  # multi-piece words were really taken whole, not just avoided


def test_same_generator_same_masks_and_dynamic_by_default(tokenizer):
    features = [instance(tokenizer, n) for n in LENGTHS]
    first, second = MaskingCollator(tokenizer, seed=7), MaskingCollator(tokenizer, seed=7)
    a, b = first(features), second(features)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = first(features)  # next call on the same collator: new masks
    assert not torch.equal(a["labels"], c["labels"])
    batch = first.pad(features)
    g1, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    assert torch.equal(first.mask(batch, g1)["input_ids"], second.mask(batch, g2)["input_ids"])
    assert "labels" not in batch  # mask returns a new dict


def test_static_labels_are_only_padded(tokenizer):
    collator = MaskingCollator(tokenizer, pad_to_multiple_of=8, seed=0)
    mask = tokenizer.mask_token_id
    features = [
        {"input_ids": np.array([2, mask, 6, 3], dtype=np.int32), "token_type_ids": np.zeros(4, dtype=np.int8),
         "labels": [IGNORE_INDEX, 5, IGNORE_INDEX, IGNORE_INDEX], "next_sentence_label": 0},
        {"input_ids": [2, 7, mask, 8, 3, 9, 3], "token_type_ids": [0, 0, 0, 0, 0, 1, 1],
         "labels": [IGNORE_INDEX, IGNORE_INDEX, 9, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX],
         "next_sentence_label": 1},
    ]
    out = collator(features)
    assert out["input_ids"].shape == (2, 8) and out["input_ids"].dtype == torch.long
    assert out["input_ids"][0].tolist() == [2, mask, 6, 3, 0, 0, 0, 0]
    assert out["labels"][0].tolist() == [IGNORE_INDEX, 5] + [IGNORE_INDEX] * 6
    assert out["labels"][1, 2].item() == 9 and (out["labels"][1] != IGNORE_INDEX).sum() == 1
    assert out["attention_mask"].tolist() == [[1] * 4 + [0] * 4, [1] * 7 + [0]]
    assert out["token_type_ids"][1].tolist() == [0, 0, 0, 0, 0, 1, 1, 0]
    assert out["next_sentence_label"].tolist() == [0, 1]


@pytest.mark.parametrize("kwargs", [{"mask_ratio": 0.9, "random_ratio": 0.2}, {"mask_ratio": -0.1},
                                    {"random_ratio": 1.5}, {"mlm_probability": 0.0}, {"mlm_probability": 1.2}])
def test_bad_ratios_raise(tokenizer, kwargs):
    with pytest.raises(ValueError, match="ratio|probability"):
        MaskingCollator(tokenizer, **kwargs)


def test_tokenizer_without_mask_token_raises(tokenizer, tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(SPECIALS + WORDS) + "\n")
    no_mask = transformers.BertTokenizer(vocab=str(path), mask_token=None)
    with pytest.raises(ValueError, match="mask_token"):
        MaskingCollator(no_mask)


# --------------------------------------------------------------- keyed draws (the recipe's masks)


class KeyedCollator(MaskingCollator):
    """Masks each call as the recipe does: keys from (seed, step, place in the batch), a new step per call."""

    step = 0

    def __call__(self, features):
        self.step += 1
        return self.mask(self.pad(features), keys=example_keys(5, self.step, torch.arange(len(features))))


@pytest.mark.parametrize("whole_word", [False, True])
def test_keyed_masks_do_not_depend_on_the_rows_batched_together_or_on_padding(tokenizer, whole_word):
    """What lets N processes with batch B draw the masks of one process with batch N x B."""
    collator = MaskingCollator(tokenizer, mlm_probability=0.3, whole_word_mask=whole_word, seed=0)
    texts = ["unaffable playing the cat runs", "a dog", "the mat unaffable runs sat on a cat playing", "cat sat"]
    features = [{"input_ids": tokenizer(t)["input_ids"], "token_type_ids": [0] * len(tokenizer(t)["input_ids"])}
                for t in texts * 3]
    lengths = [len(f["input_ids"]) for f in features]
    whole = collator.mask(collator.pad(features), keys=example_keys(1, 9, torch.arange(len(features))))
    for first, size in [(0, 6), (6, 6), (0, 1), (5, 1), (3, 4)]:  # other batches, each padded to its own longest
        part = collator.mask(collator.pad(features[first:first + size]),
                             keys=example_keys(1, 9, first + torch.arange(size)))
        for row in range(size):
            n = lengths[first + row]
            for key in ("input_ids", "labels"):
                assert torch.equal(part[key][row, :n], whole[key][first + row, :n])
    other_step = collator.mask(collator.pad(features), keys=example_keys(1, 10, torch.arange(len(features))))
    other_seed = collator.mask(collator.pad(features), keys=example_keys(2, 9, torch.arange(len(features))))
    assert not torch.equal(other_step["labels"], whole["labels"])
    assert not torch.equal(other_seed["labels"], whole["labels"])
    # the same text at other places of the batch is masked differently
    assert not all(torch.equal(whole["labels"][i], whole["labels"][i + 4]) for i in range(4))


def test_keyed_masks_keep_the_reference_counts_and_the_80_10_10_mix(tokenizer):
    collator = KeyedCollator(tokenizer, max_predictions_per_seq=5, seed=0)
    features = [instance(tokenizer, n) for n in LENGTHS]
    for _ in range(5):
        chosen = collator(features)["labels"] != IGNORE_INDEX
        assert chosen.sum(1).tolist() == [reference_count(n, 0.15, 5) for n in LENGTHS]
    shares = mix_counts(KeyedCollator(tokenizer, seed=0), tokenizer)
    assert shares["mask"] == pytest.approx(0.8, abs=0.02)
    assert shares["random"] == pytest.approx(0.1 * (1 - 1 / len(WORDS)), abs=0.015)
    assert shares["same"] == pytest.approx(0.1 + 0.1 / len(WORDS), abs=0.015)
    # every position of a row is chosen about equally often (no bias from the hash)
    collator, hits = KeyedCollator(tokenizer, seed=0), torch.zeros(128)
    for _ in range(300):
        hits += (collator([instance(tokenizer, 128)] * 8)["labels"] != IGNORE_INDEX).sum(0)
    inner = hits[1:-1][hits[1:-1] > 0]
    assert len(inner) >= 124 and inner.std() / inner.mean() < 0.12
