"""The runner's speed paths change how much padding is computed, never the results: length-sorted
evaluation returns outputs in dataset order, and the length-bucketed training order is a fresh
random order of homogeneous batches."""

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
from bert_suite.runner import LengthBucketSampler, SuiteTrainer, example_lengths


def lengths_dataset(n=120, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 40, size=n).tolist()
    rows = {"input_ids": [[2] + rng.integers(5, 60, size=k - 2).tolist() + [3] for k in lengths],
            "labels": rng.integers(0, 2, size=n).tolist()}
    return Dataset.from_dict(rows), lengths


def test_bucket_sampler_visits_every_example_once_in_homogeneous_shuffled_batches():
    _, lengths = lengths_dataset(1000)
    sampler = LengthBucketSampler(lengths, batch_size=8, seed=1, pool_batches=10)
    first, second = list(sampler), list(sampler)
    assert sorted(first) == list(range(1000)) and sorted(second) == list(range(1000))
    assert first != second  # a new order every epoch
    batches = [first[i:i + 8] for i in range(0, 1000, 8)]
    spread = np.mean([max(lengths[j] for j in b) - min(lengths[j] for j in b) for b in batches])
    random_spread = np.mean([max(lengths[j] for j in b) - min(lengths[j] for j in b)
                             for b in np.random.default_rng(0).permutation(1000).reshape(125, 8)])
    assert spread < random_spread / 3  # batches of similar length: little padding
    longest = [max(lengths[j] for j in b) for b in batches]
    assert longest != sorted(longest) and longest != sorted(longest, reverse=True)  # not ordered by length
    assert LengthBucketSampler(lengths, 8, seed=1, pool_batches=10).__iter__().__next__() == first[0]  # seeded


def test_bucket_sampler_keeps_the_short_batch_last():
    lengths = list(range(1, 22))  # 21 examples, batches of 4: the last batch has one example
    order = list(LengthBucketSampler(lengths, batch_size=4, seed=0))
    assert len(order) == 21 and sorted(order) == list(range(21))
    whole = [order[i:i + 4] for i in range(0, 20, 4)]
    assert all(len(b) == 4 for b in whole)


def _model():
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=64, num_labels=2, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
    return BertSuiteForSequenceClassification(config).eval()


def _collate(rows):
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, :len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([r["labels"] for r in rows])}


@pytest.mark.parametrize("batch_size", [7, 16])
def test_sorted_prediction_and_metrics_come_back_in_dataset_order(tmp_path, batch_size):
    data, lengths = lengths_dataset(90)
    seen = {}

    def metric(p):
        seen["labels"] = p.label_ids.tolist()
        seen["predictions"] = p.predictions
        return {"n": len(p.label_ids)}

    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=batch_size, report_to="none",
                             disable_tqdm=True)
    model = _model()
    plain = Trainer(model=model, args=args, data_collator=_collate).predict(data)
    suite = SuiteTrainer(model=model, args=args, data_collator=_collate, compute_metrics=metric)
    sorted_out = suite.predict(data)
    assert suite._eval_inverse is not None  # the sorted path really ran
    assert np.allclose(sorted_out.predictions, plain.predictions, atol=1e-5)
    assert sorted_out.label_ids.tolist() == data["labels"]
    assert seen["labels"] == data["labels"] and np.allclose(seen["predictions"], plain.predictions, atol=1e-5)
    # the batches were built from sorted lengths: far fewer padded positions than in dataset order
    loader = suite.get_eval_dataloader(data)
    padded = sum(b["input_ids"].numel() for b in loader)
    plain_padded = sum(b["input_ids"].numel() for b in plain_loader(data, batch_size))
    assert padded < 0.8 * plain_padded and sum(lengths) <= padded


def plain_loader(data, batch_size):
    return torch.utils.data.DataLoader(data, batch_size=batch_size, collate_fn=_collate)


def test_example_lengths_of_multiple_choice_rows_use_the_longest_choice():
    data = Dataset.from_dict({"input_ids": [[[1, 2, 3], [1, 2]], [[1], [1, 2, 3, 4]]]})
    assert example_lengths(data) == [3, 4]
