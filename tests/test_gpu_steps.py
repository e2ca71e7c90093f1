"""The captured steps on the device (issues 62 and 63): masks made inside a CUDA graph equal the loader's bit for
bit, and the captured fine-tuning step trains as the eager one without a host sync, also when a later trial's
model adopts it. Skipped without CUDA, as
tests/test_gpu.py (`make test-gpu`; BERT_SUITE_TEST_DEVICE=cpu runs the bodies on the CPU without a graph)."""

import contextlib
import os
from types import SimpleNamespace

import pytest
import torch

from helpers import PAD, IdsTokenizer, ids_instances, mask_loaders

DEVICE = os.environ.get("BERT_SUITE_TEST_DEVICE", "cuda")  # as tests/test_gpu.py
CUDA = DEVICE.startswith("cuda")
on_the_device = pytest.mark.skipif(CUDA and not torch.cuda.is_available(),
                                   reason="no CUDA device (BERT_SUITE_TEST_DEVICE=cpu runs these checks on the CPU)")


@pytest.fixture
def fp32_matmuls():
    """Exact fp32 matmuls (no TF32) during the test."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@contextlib.contextmanager
def no_sync():
    """Any host sync in the block is an error on CUDA (nothing on the CPU)."""
    if not CUDA:
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@on_the_device
def test_masks_made_in_a_captured_graph_equal_the_loaders_on_the_device():
    from bert_suite.pretraining.masking import MaskingCollator

    collator = MaskingCollator(IdsTokenizer(), max_predictions_per_seq=6, mask_ratio=0.7, random_ratio=0.2)
    masked, shipped, masker = mask_loaders(ids_instances(90, 48, seed=4), collator, True)
    keys = [(micro, [micro, micro + 7, micro + 30, micro + 55]) for micro in (0, 5, 13)]
    first, _ = shipped[keys[0]]
    buffers = {k: v.to(DEVICE) for k, v in first.items()}
    masker(buffers)  # the masker's device tensors, before a capture
    if CUDA:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            made = masker(buffers)
    for key in keys:
        ids, _ = shipped[key]
        if set(ids) != set(buffers):
            continue  # another batch structure (no padding): another graph in the recipe
        for name, value in ids.items():
            buffers[name].copy_(value)
        if CUDA:
            with no_sync():
                graph.replay()
        else:
            made = masker(buffers)
        expected, _ = masked[key]
        assert sorted(made) == sorted(expected)
        for name, value in expected.items():
            assert torch.equal(made[name].cpu(), value), (key, name)
    assert PAD == 0


@on_the_device
def test_the_captured_finetuning_step_trains_as_the_eager_one_without_a_host_sync(fp32_matmuls):
    from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
    from bert_suite.finetune_step import FinetuneStep, make_capturable

    def model_and_optimizer():
        torch.manual_seed(0)
        model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset(
            "tiny", vocab_size=100, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).to(DEVICE)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / 10)

    g = torch.Generator().manual_seed(1)
    batches = []
    for number in range(6):
        length = 32 if number % 2 else 64  # two buckets: two graphs sharing one pool
        lengths = torch.randint(5, length + 1, (8,), generator=g)
        mask = (torch.arange(length)[None] < lengths[:, None]).long()
        batches.append({"input_ids": torch.randint(5, 100, (8, length), generator=g) * mask, "attention_mask": mask,
                        "token_type_ids": torch.zeros(8, length, dtype=torch.long),
                        "labels": torch.randint(0, 3, (8,), generator=g)})
    model, optimizer, schedule = model_and_optimizer()
    eager = []
    for batch in batches:
        out = model(**{k: v.to(DEVICE) for k, v in batch.items()})
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        eager.append(float(out.loss))
    model, optimizer, schedule = model_and_optimizer()
    if CUDA:
        make_capturable(optimizer)
    step = FinetuneStep(SimpleNamespace(num_processes=1, scaler=None), model, optimizer, 0.5, graph=CUDA)
    losses = []
    for number, batch in enumerate(batches):
        batch = {k: v.to(DEVICE) for k, v in batch.items()}
        with no_sync() if number >= 2 else contextlib.nullcontext():  # both shapes captured by then
            loss = step.step(batch)
            schedule.step()
        losses.append(loss)
    assert len(step.captured) == 2
    for ours, theirs in zip(losses, eager, strict=True):
        assert abs(float(ours) - theirs) < 1e-4, (losses, eager)
    # a grid worker's next trial: a fresh model and optimizer adopt the kept step, and its graphs (no capture, no
    # host sync from the first batch) train them as the eager run trained the same start
    from bert_suite.finetune_step import adopt

    model, optimizer, schedule = model_and_optimizer()
    if CUDA:
        make_capturable(optimizer)
    adopt(step, model, optimizer)
    again = []
    with no_sync():
        for batch in batches:
            again.append(step.step({k: v.to(DEVICE) for k, v in batch.items()}))
            schedule.step()
    assert len(step.captured) == 2
    for ours, theirs in zip(again, eager, strict=True):
        assert abs(float(ours) - theirs) < 1e-4, (again, eager)
    assert all(p.data_ptr() == q.data_ptr() for p, q in zip(model.parameters(), step.model.parameters(), strict=True))


@on_the_device
def test_a_kept_step_trains_the_next_trial_as_a_fresh_step_with_dropout_on(fp32_matmuls):
    """A grid worker's next trial (another seed and learning rate, dropout on) through the step the trial before
    captured gives a fresh step's losses and weights: the same dropout draws (the warm-up and capture give the
    generator back its state) and no state of the trial before."""
    from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
    from bert_suite.finetune_step import FinetuneStep, adopt, make_capturable

    def trial(seed, lr):
        torch.manual_seed(seed)
        model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset(
            "tiny", vocab_size=100, num_labels=3, unpad_inputs=False)).to(DEVICE)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=CUDA or None)
        if CUDA:
            make_capturable(optimizer)
        return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / 10)

    g = torch.Generator().manual_seed(2)
    batches = [{"input_ids": torch.randint(5, 100, (8, length), generator=g),
                "attention_mask": torch.ones(8, length, dtype=torch.long),
                "token_type_ids": torch.zeros(8, length, dtype=torch.long),
                "labels": torch.randint(0, 3, (8,), generator=g)} for length in (32, 64, 32, 64, 32)]
    accelerator = SimpleNamespace(num_processes=1, scaler=None)

    def train(step, model, schedule):
        torch.manual_seed(7)  # the Trainer seeds every trial
        losses = []
        for batch in batches:
            losses.append(float(step.step({k: v.to(DEVICE) for k, v in batch.items()})))
            schedule.step()
        return losses, [p.detach().clone() for p in model.parameters()]

    model, optimizer, schedule = trial(2, 5e-4)
    fresh = train(FinetuneStep(accelerator, model, optimizer, 1.0, graph=CUDA), model, schedule)
    model, optimizer, schedule = trial(1, 1e-3)
    step = FinetuneStep(accelerator, model, optimizer, 1.0, graph=CUDA)
    train(step, model, schedule)  # the trial before: both shapes captured, its optimizer state made
    model, optimizer, schedule = trial(2, 5e-4)
    adopt(step, model, optimizer)
    kept = train(step, model, schedule)
    assert kept[0] == pytest.approx(fresh[0], rel=1e-4, abs=1e-5)
    for ours, theirs in zip(kept[1], fresh[1], strict=True):
        assert torch.allclose(ours, theirs, atol=1e-5)


@on_the_device
def test_the_captured_evaluation_forward_gives_the_eager_outputs_without_a_host_sync(fp32_matmuls):
    """Evaluation a graph a bucket (finetune_step.CapturedForward): the eager forward's loss and logits for each shape,
    replays with no host sync, and outputs that the next replay overwrites (the Trainer copies them)."""
    from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
    from bert_suite.finetune_step import CapturedForward

    torch.manual_seed(0)
    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset(
        "tiny", vocab_size=100, num_labels=3, unpad_inputs=False)).to(DEVICE).eval()
    g = torch.Generator().manual_seed(3)
    batches = [{"input_ids": torch.randint(5, 100, (16, length), generator=g).to(DEVICE),
                "attention_mask": torch.ones(16, length, dtype=torch.long, device=DEVICE),
                "labels": torch.randint(0, 3, (16,), generator=g).to(DEVICE)} for length in (32, 64, 32, 64)]
    with torch.no_grad():
        eager = [model(**batch) for batch in batches]
    forward = CapturedForward(model, graph=CUDA)
    outputs = []
    for number, (batch, expected) in enumerate(zip(batches, eager, strict=True)):
        with no_sync() if number >= 2 else contextlib.nullcontext():  # both shapes captured by then
            outputs.append(forward(batch))
            out = {k: v.clone() for k, v in outputs[-1].items()}
        assert torch.allclose(out["logits"], expected.logits, atol=1e-5)
        assert torch.allclose(out["loss"], expected.loss, atol=1e-5)
    assert len(forward.captured) == 2
    if CUDA:  # graphs, not the eager fallback: each shape's replays hand back the graph's own tensors
        assert all(graph is not None for _, graph, _ in forward.captured.values())
        assert outputs[2]["logits"] is outputs[0]["logits"] and outputs[3]["logits"] is outputs[1]["logits"]
    with torch.no_grad():  # weights changed in place (an optimizer step): the replays read them
        for p in model.parameters():
            p.mul_(0.9)
        expected = model(**batches[1])
    assert torch.allclose(forward(batches[1])["logits"], expected.logits, atol=1e-5)


@on_the_device
def test_predictions_through_the_captured_forward_are_the_trainers_in_bf16(monkeypatch, tmp_path):
    """SuiteTrainer.predict over two batches of one shape (the second replay overwrites the first's outputs, which
    the Trainer must have copied) under bf16 autocast: the Trainer's own predictions and loss."""
    import datasets
    import numpy
    import transformers

    from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
    from bert_suite.runner import SuiteTrainer

    g = torch.Generator().manual_seed(4)
    data = datasets.Dataset.from_dict({"input_ids": torch.randint(5, 100, (16, 32), generator=g).tolist(),
                                       "attention_mask": [[1] * 32] * 16, "labels": [0, 1, 2, 1] * 4})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=not CUDA, report_to="none", bf16=True,
                                          per_device_eval_batch_size=8)
    found = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", switch)
        torch.manual_seed(0)  # the same weights, a model of its own (accelerate wraps a model's forward once)
        model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=100, num_labels=3,
                                                                                unpad_inputs=False))
        trainer = SuiteTrainer(model=model, args=args)
        found[switch] = trainer.predict(data)
        assert (trainer._forward is not False) == (switch == "1")
        if CUDA and switch == "1":  # graphs, not the eager fallback of a capture that failed
            assert all(graph is not None for _, graph, _ in trainer._forward.captured.values())
    assert numpy.allclose(found["1"].predictions, found["0"].predictions, atol=2e-2)
    assert found["1"].metrics["test_loss"] == pytest.approx(found["0"].metrics["test_loss"], abs=2e-2)
    assert not numpy.allclose(found["1"].predictions[:8], found["1"].predictions[8:])  # two batches, two answers
