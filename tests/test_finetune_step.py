"""The fine-tuning step's host-side costs (issue 62): batches padded to length buckets on a GPU (every task family),
the dev set evaluated after the last epoch not predicted a second time, the FLOPs estimate without a walk over the
parameters at every step, and no per-step host sync among a GPU run's defaults."""

import csv
import json

import numpy
import pytest
import torch
import transformers

from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification
from bert_suite.adapters import classification, multiple_choice, ner, squad
from bert_suite.cli import main as cli_main
from bert_suite.runner import CappedPadding, RunError, SuiteTrainer, batch_collator, device_defaults, length_bucket
from helpers import count_kept_steps, run_args, write_rte_like


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(40))]) + "\n")
    return transformers.BertTokenizer(vocab=str(path))


def rows(lengths):
    return [{"input_ids": [2, *range(5, 5 + n - 2), 3], "token_type_ids": [0] * n, "attention_mask": [1] * n}
            for n in lengths]


@pytest.mark.parametrize("family", ["classification", "squad", "multiple_choice", "ner"])
def test_every_familys_batches_pad_to_a_bucket_and_keep_their_tokens(tokenizer, family):
    module = {"classification": classification, "squad": squad, "multiple_choice": multiple_choice, "ner": ner}[family]
    lengths = [7, 33, 20]
    if family == "multiple_choice":
        features = [{k: [r[k] for r in rows([n, n - 2])] for k in ("input_ids", "token_type_ids", "attention_mask")}
                    | {"labels": 1} for n in lengths]
    else:
        features = [r | ({"labels": [0] * len(r["input_ids"])} if family == "ner" else {}) for r in rows(lengths)]
    plain = module.collator(tokenizer)(features)
    bucketed = module.collator(tokenizer, 32)(features)
    assert plain["input_ids"].shape[-1] == 33 and bucketed["input_ids"].shape[-1] == 64
    for key, value in plain.items():
        if value.dim() and value.shape[-1] == 33:
            assert torch.equal(bucketed[key][..., :33], value), key
            fill = {"input_ids": tokenizer.pad_token_id, "labels": -100}.get(key, 0)
            assert (bucketed[key][..., 33:] == fill).all(), key
        else:
            assert torch.equal(bucketed[key], value), key
    short = module.collator(tokenizer, 32)(features[:1])
    assert short["input_ids"].shape[-1] == 32  # a batch of 7 tokens: the first bucket
    # max_seq_length 40 (not a multiple of 32): the rounding stops there, the padding past it cut from every column
    capped = CappedPadding(module.collator(tokenizer, 32), 40)(features)
    assert capped["input_ids"].shape[-1] == 40
    for key, value in bucketed.items():
        assert torch.equal(capped[key], value[..., :40] if value.dim() >= 2 and value.shape[-1] == 64 else value), key


def test_a_bucketed_batch_gives_the_models_outputs_of_the_plain_one(tokenizer):
    torch.manual_seed(0)
    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=len(tokenizer))).eval()
    features = rows([7, 30, 12])
    plain, bucketed = (classification.collator(tokenizer, m)(features) for m in (None, 32))
    with torch.no_grad():
        assert torch.allclose(model(**plain).logits, model(**bucketed).logits, atol=1e-5)


def test_buckets_are_on_for_cuda_off_on_the_cpu_and_the_environment_overrides(monkeypatch, tmp_path):
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert length_bucket(args) is None
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "64")
    assert length_bucket(args) == 64
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "0")
    assert length_bucket(args) is None
    assert not isinstance(batch_collator(classification, None, args, 72), CappedPadding)  # no bucket: nothing to cap
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "32")
    assert isinstance(batch_collator(classification, None, args, 72), CappedPadding)
    assert not isinstance(batch_collator(classification, None, args, 128), CappedPadding)  # a multiple: never past it
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "many")
    with pytest.raises(RunError, match="BERT_SUITE_LENGTH_BUCKET must be a number of tokens"):
        length_bucket(args)


def test_a_gpu_runs_defaults_read_no_loss_a_step_and_copy_without_waiting():
    assert device_defaults({}, cuda=True) == {"logging_nan_inf_filter": False, "accelerator_config": {"non_blocking": True}}
    assert device_defaults({"logging_nan_inf_filter": True}, cuda=True)["logging_nan_inf_filter"] is True  # a flag wins
    assert device_defaults({}, cuda=False) == {}  # the CPU keeps the Trainer's defaults
    assert device_defaults({"use_cpu": True}, cuda=True) == {"use_cpu": True}


def test_the_dev_set_evaluated_after_the_last_epoch_is_not_predicted_again(tmp_path, monkeypatch):
    """The same all_results.json (but for timings) and predictions as predicting the dev set again, with one pass
    over it fewer."""
    data = write_rte_like(tmp_path / "data", n_train=96, n_dev=40)
    passes = []
    loop = SuiteTrainer.evaluation_loop

    def counted(self, dataloader, description, *args, **kwargs):
        passes.append(description)
        return loop(self, dataloader, description, *args, **kwargs)

    monkeypatch.setattr(SuiteTrainer, "evaluation_loop", counted)
    runs = {}
    for name in ("reused", "again"):
        if name == "again":
            monkeypatch.setattr(SuiteTrainer, "last_evaluation", lambda self, evaluated, prefix: None)
        passes.clear()
        out = tmp_path / name
        assert cli_main(["finetune", "rte", *run_args(data, out, "--learning_rate", "1e-3", "--num_train_epochs", "2",
                                                       "--per_device_train_batch_size", "16")]) == 0
        results = json.loads((out / "all_results.json").read_text())
        runs[name] = ({k: v for k, v in results.items() if not k.endswith(("runtime", "per_second"))},
                      (out / "predictions" / "dev.tsv").read_text(), list(passes))
    assert runs["reused"][0] == runs["again"][0]
    assert runs["reused"][1] == runs["again"][1]
    assert runs["reused"][2] == ["Evaluation"] * 2 and runs["again"][2] == ["Evaluation"] * 2 + ["Prediction"]


def test_the_flops_estimate_counts_the_parameters_once(tmp_path, monkeypatch):
    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=50))
    trainer = SuiteTrainer(model=model, args=transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                                                                            report_to="none"))
    expected = transformers.Trainer.floating_point_ops(trainer, {"input_ids": torch.zeros(4, 9, dtype=torch.long)})
    counted = []
    real = type(model).num_parameters
    monkeypatch.setattr(type(model), "num_parameters", lambda self, **kw: counted.append(1) or real(self, **kw))
    for _ in range(3):
        assert trainer.floating_point_ops({"input_ids": torch.zeros(4, 9, dtype=torch.long)}) == expected
    assert len(counted) == 1


def test_the_captured_steps_body_trains_as_the_trainers_step(tmp_path, monkeypatch, capsys):
    """BERT_SUITE_CAPTURED_STEP=1 on the CPU runs the captured step's body (forward, backward, clipping, AdamW on
    static buffers, a device learning rate) without a graph: with dropout on, the Trainer's eager losses at every
    step, its dev score and its weights; gradient accumulation falls back to the Trainer's step with one line."""
    from safetensors.torch import load_file

    data = write_rte_like(tmp_path / "data", n_train=80, n_dev=32)
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "16")  # a few shapes, as on a GPU
    from bert_suite import finetune_step

    steps, real = [], finetune_step.FinetuneStep.step
    monkeypatch.setattr(finetune_step.FinetuneStep, "step", lambda self, batch: steps.append(1) or real(self, batch))
    forwards, real_forward = [], finetune_step.CapturedForward.__call__
    monkeypatch.setattr(finetune_step.CapturedForward, "__call__",
                        lambda self, inputs: forwards.append(1) or real_forward(self, inputs))
    runs = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", switch)
        out = tmp_path / switch
        assert cli_main(["finetune", "rte", *run_args(data, out, "--learning_rate", "1e-3", "--num_train_epochs", "2",
                                                       "--per_device_train_batch_size", "16", "--logging_steps", "1",
                                                       "--logging_strategy", "steps", "--max_grad_norm", "0.5")]) == 0
        runs[switch] = (json.loads((out / "all_results.json").read_text()), load_file(out / "model.safetensors"),
                        len(steps), len(forwards), (out / "predictions" / "dev.tsv").read_text())
    eager, captured = runs["0"], runs["1"]
    assert eager[2] == 0 and captured[2] == 10  # 2 epochs of 5 batches, every one through the captured body
    assert eager[3] == 0 and captured[3] == 2  # 32 dev examples, one batch of 64 an evaluation, through its forward
    assert captured[4] == eager[4] and captured[0]["eval_accuracy"] == eager[0]["eval_accuracy"]
    assert captured[0]["train_loss"] == pytest.approx(eager[0]["train_loss"], rel=1e-6)
    assert captured[0]["eval_loss"] == pytest.approx(eager[0]["eval_loss"], rel=1e-5)
    for name, weight in eager[1].items():
        assert torch.allclose(captured[1][name], weight, atol=1e-6), name
    capsys.readouterr()
    monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", "1")
    assert cli_main(["finetune", "rte", *run_args(data, tmp_path / "accumulated", "--num_train_epochs", "1",
                                                   "--gradient_accumulation_steps", "2")]) == 0
    assert "captured step: off, gradient_accumulation_steps > 1" in capsys.readouterr().err


def test_train_called_again_steps_once_a_batch_with_its_new_optimizer(tmp_path, monkeypatch):
    """A Trainer's train() called again (as the speed benchmark repeats an epoch) makes a new optimizer: the step
    chosen for the old one is adopted by the new one (its graphs kept, the optimizer state zeroed), so each batch
    is one AdamW step (the old step as it was would step the old optimizer inside it and the Trainer the new one
    beside it). With a constant learning rate every epoch from the same weights and seed ends at the first's
    weights; so does one on the Trainer's own step after them (no gradient left over from the captured one)."""
    made, adopted = count_kept_steps(monkeypatch)
    torch.manual_seed(0)
    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=50))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (32, 12), generator=g)
    rows = [{"input_ids": i, "attention_mask": torch.ones(12, dtype=torch.long), "labels": int(i[0] % 2)}
            for i in ids]
    trainer = SuiteTrainer(model=model, train_dataset=rows, args=transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8, num_train_epochs=1,
        learning_rate=1e-2, lr_scheduler_type="constant", save_strategy="no", disable_tqdm=True))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    ends = []
    for switch in ("1", "1", "1", "0"):
        monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", switch)
        model.load_state_dict(initial)
        trainer.optimizer = None
        transformers.set_seed(0)
        trainer.train()
        ends.append({k: v.clone() for k, v in model.state_dict().items()})
    assert (len(made), len(adopted)) == (1, 2) and trainer._step is False
    assert any(not torch.equal(ends[0][k], initial[k]) for k in initial)  # it trained
    for end in ends[1:]:
        for name, weight in ends[0].items():
            assert torch.allclose(end[name], weight, atol=1e-6), name


def test_a_run_on_the_captured_step_stopped_after_a_checkpoint_resumes_to_the_same_weights(tmp_path, monkeypatch):
    """BERT_SUITE_CAPTURED_STEP=1 (its body on the CPU), dropout on: a run stopped at step 5 and rerun with
    --resume_from_checkpoint auto (from checkpoint-3: the optimizer state and random state it saved) ends at the
    uninterrupted run's weights and dev score."""
    from safetensors.torch import load_file

    from bert_suite import finetune_step, runner

    data = write_rte_like(tmp_path / "data", n_train=80, n_dev=32)
    monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", "1")
    captured, real = [], finetune_step.FinetuneStep.step
    monkeypatch.setattr(finetune_step.FinetuneStep, "step", lambda self, batch: captured.append(1) or real(self, batch))
    flags = ["--learning_rate", "1e-3", "--num_train_epochs", "2", "--per_device_train_batch_size", "16",
             "--save_strategy", "steps", "--save_steps", "3", "--resume_from_checkpoint", "auto"]
    assert cli_main(["finetune", "rte", *run_args(data, tmp_path / "whole", *flags)]) == 0

    class Stopped(Exception):
        pass

    steps = []

    def stop_at_five(name):
        steps.append(name)
        if len(steps) == 5:
            raise Stopped

    monkeypatch.setattr(runner, "failpoint", stop_at_five)
    with pytest.raises(Stopped):
        cli_main(["finetune", "rte", *run_args(data, tmp_path / "stopped", *flags)])
    assert sorted(p.name for p in (tmp_path / "stopped").glob("checkpoint-*")) == ["checkpoint-3"]
    steps.clear()
    monkeypatch.setattr(runner, "failpoint", steps.append)
    assert cli_main(["finetune", "rte", *run_args(data, tmp_path / "stopped", *flags)]) == 0
    assert len(steps) == 7  # steps 4-10: resumed, not started over (which would end at the same weights)
    assert len(captured) == 10 + 5 + 7  # every step of the three runs through the captured step's body
    whole, resumed = (json.loads((tmp_path / r / "all_results.json").read_text()) for r in ("whole", "stopped"))
    assert resumed["eval_accuracy"] == whole["eval_accuracy"]
    ours, theirs = (load_file(tmp_path / r / "model.safetensors") for r in ("stopped", "whole"))
    for name, weight in theirs.items():
        assert torch.allclose(ours[name], weight, atol=1e-6), name


def test_a_grid_on_the_captured_step_scores_every_point_as_the_trainers_step_and_picks_the_same(tmp_path,
                                                                                                  monkeypatch):
    """A tiny grid (2 learning rates x 2 batch sizes, one worker: its later trials adopt the first's step) with
    BERT_SUITE_CAPTURED_STEP=1 and =0: every point's dev score the same, the same best point."""
    from bert_suite import finetune_step

    data = write_rte_like(tmp_path / "data", n_train=32, n_dev=16)
    made, adopted = count_kept_steps(monkeypatch)
    steps, real = [], finetune_step.FinetuneStep.step
    monkeypatch.setattr(finetune_step.FinetuneStep, "step", lambda self, batch: steps.append(1) or real(self, batch))
    found = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", switch)
        out = tmp_path / switch
        assert cli_main(["grid", "rte", *run_args(data, out), "--learning_rates", "1e-3", "1e-5", "--batch_sizes",
                         "8", "16", "--epochs", "1", "--seeds", "1"]) == 0
        with open(out / "grid_results.csv") as f:
            rows = {(r["learning_rate"], r["per_device_train_batch_size"]): r for r in csv.DictReader(f)}
        best = json.loads((out / "best_trial.json").read_text())
        found[switch] = (rows, {k: best[k] for k in ("learning_rate", "per_device_train_batch_size")}, len(steps))
    (eager, eager_best, eager_steps), (captured, captured_best, captured_steps) = found["0"], found["1"]
    assert eager_steps == 0 and captured_steps == 4 + 2 + 4 + 2  # every batch of every point through its body
    assert (len(made), len(adopted)) == (1, 3)  # the first trial's step, adopted by the three after it
    assert captured_best == eager_best and len(captured) == 4 and captured.keys() == eager.keys()
    for point, row in eager.items():
        assert (captured[point]["eval_accuracy"], captured[point]["best"]) == (row["eval_accuracy"], row["best"]), point
        for key in ("eval_loss", "train_loss"):
            assert float(captured[point][key]) == pytest.approx(float(row[key]), rel=1e-5), (point, key)
    assert len({row["eval_loss"] for row in eager.values()}) == 4  # four different runs, not one four times


@pytest.mark.parametrize("head", ["qa", "tokens", "choice"])
def test_the_captured_evaluation_forward_gives_the_trainers_loss_logits_and_labels(tmp_path, monkeypatch, head):
    """Evaluation and prediction through `CapturedForward` (its body on the CPU): Trainer.prediction_step's loss,
    logits (a tuple of two for spans) and labels, with labels and without (a test set)."""
    from bert_suite import BertSuiteForMultipleChoice, BertSuiteForQuestionAnswering, BertSuiteForTokenClassification
    from bert_suite.finetune_step import CapturedForward

    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=50, num_labels=3)
    model = {"qa": BertSuiteForQuestionAnswering, "tokens": BertSuiteForTokenClassification,
             "choice": BertSuiteForMultipleChoice}[head](config).eval()
    shape = (4, 2, 16) if head == "choice" else (4, 16)
    batch = {"input_ids": torch.randint(5, 50, shape), "attention_mask": torch.ones(shape, dtype=torch.long),
             "token_type_ids": torch.zeros(shape, dtype=torch.long)}
    labels = {"qa": {"start_positions": torch.tensor([1, 2, 3, 0]), "end_positions": torch.tensor([2, 5, 3, 0])},
              "tokens": {"labels": torch.randint(0, 3, (4, 16)).masked_fill(torch.rand(4, 16) < 0.3, -100)},
              "choice": {"labels": torch.tensor([0, 1, 1, 0])}}[head]
    found = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", switch)
        trainer = SuiteTrainer(model=model, args=transformers.TrainingArguments(
            output_dir=str(tmp_path), use_cpu=True, report_to="none"))
        found[switch] = [trainer.prediction_step(model, {**batch, **labels}, prediction_loss_only=False),
                         trainer.prediction_step(model, dict(batch), prediction_loss_only=False),
                         trainer.prediction_step(model, {**batch, **labels}, prediction_loss_only=True)]
        assert isinstance(trainer._forward, CapturedForward) == (switch == "1")
    flat = lambda x: [] if x is None else [x] if torch.is_tensor(x) else [t for item in x for t in flat(item)]  # noqa: E731
    for ours, theirs in zip(found["1"], found["0"], strict=True):
        assert [t.shape for t in flat(ours)] == [t.shape for t in flat(theirs)]
        for a, b in zip(flat(ours), flat(theirs), strict=True):
            assert torch.allclose(a.float(), b.float(), atol=1e-6)
    assert found["1"][1][0] is None and found["1"][2][1] is None  # no labels: no loss; loss only: no logits
    assert isinstance(found["1"][0][1], tuple) == (head == "qa")  # start and end logits


def test_the_evaluation_graphs_are_made_again_when_the_weights_move(tmp_path, monkeypatch):
    """Graphs read the memory they were captured on: after the parameters get new storage (a kept step adopted by a
    later trial, `model.to(bf16)` for --bf16_full_eval) the next evaluation makes new ones; the same storage keeps
    them, and predictions are the Trainer's either way."""
    import datasets

    from bert_suite.finetune_step import CapturedForward

    monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", "1")
    torch.manual_seed(0)
    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=50, num_labels=2))
    g = torch.Generator().manual_seed(1)
    data = datasets.Dataset.from_dict({"input_ids": torch.randint(5, 50, (12, 16), generator=g).tolist(),
                                       "attention_mask": [[1] * 16] * 12, "labels": [0, 1] * 6})
    trainer = SuiteTrainer(model=model, args=transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_eval_batch_size=4))
    first = trainer.predict(data)
    made = trainer._forward
    assert isinstance(made, CapturedForward) and trainer.predict(data) is not None and trainer._forward is made
    for p in model.parameters():  # what adopt does: the same parameters, other storage
        p.data = p.data.clone()
    again = trainer.predict(data)
    assert trainer._forward is not made and isinstance(trainer._forward, CapturedForward)
    assert numpy.allclose(again.predictions, first.predictions, atol=1e-6)
    monkeypatch.setenv("BERT_SUITE_CAPTURED_STEP", "0")
    stock = SuiteTrainer(model=model, args=trainer.args).predict(data)
    assert numpy.allclose(stock.predictions, first.predictions, atol=1e-6) and stock.metrics["test_loss"] == \
        pytest.approx(first.metrics["test_loss"], rel=1e-6)


def test_a_grid_workers_later_trials_adopt_the_kept_step_and_train_as_a_fresh_run(tmp_path, monkeypatch):
    """A grid worker makes the captured step once: the next trial of the same model (another learning rate, batch
    size and seed) copies its fresh weights and zeroed optimizer state into the kept step's tensors and trains as
    the same point in a grid of its own (a fresh step): the same losses, dev scores and weights. Another clipping
    norm or head cannot adopt it (a graph holds them); weights and learning rates do not count."""
    from safetensors.torch import load_file

    from bert_suite import finetune_step

    data = write_rte_like(tmp_path / "data", n_train=80, n_dev=32)
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "16")
    made, adopted = count_kept_steps(monkeypatch)

    def grid(out, learning_rates, batch_sizes, seeds, *extra):
        argv = ["grid", "rte", *run_args(data, out), "--learning_rates", *learning_rates, "--batch_sizes",
                *batch_sizes, "--seeds", *seeds, "--epochs", "2", "--max_grad_norm", "0.5", "--logging_steps", "1",
                "--logging_strategy", "steps", "--keep_all", *extra]
        made.clear(), adopted.clear()
        assert cli_main(argv) == 0
        trials = {}  # (batch size, seed) -> (results but timings, weights)
        for row in csv.DictReader((out / "grid_results.csv").open()):
            folder = out / "trials" / f"trial-{int(row['trial']):03d}"
            point = json.loads((folder / "all_results.json").read_text())
            trials[row["per_device_train_batch_size"], row["seed"]] = (
                {k: v for k, v in point.items() if not k.endswith(("runtime", "per_second"))},
                load_file(folder / "checkpoint" / "model.safetensors"))
        return trials, len(made), len(adopted)

    kept, made_kept, adopted_kept = grid(tmp_path / "kept", ["1e-3"], ["16", "8"], ["1", "2"])
    assert (made_kept, adopted_kept) == (1, 3) and len(kept) == 4  # one step, adopted by the three trials after
    assert finetune_step._KEPT == {}  # released when the grid ended
    fresh, made_fresh, adopted_fresh = grid(tmp_path / "fresh", ["1e-3"], ["8"], ["2"])
    assert (made_fresh, adopted_fresh) == (1, 0)
    (point,) = fresh  # the last of the kept grid's trials: adopted after two batch sizes and seeds
    assert kept[point][0] == pytest.approx(fresh[point][0], rel=1e-6)
    for name, weight in fresh[point][1].items():
        assert torch.allclose(kept[point][1][name], weight, atol=1e-6), name
    # what decides: the model's shape and the step's fixed settings, not its weights or learning rate
    def model_and_optimizer(seed, lr, labels=2):
        torch.manual_seed(seed)
        model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=50, num_labels=labels))
        return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)

    first = finetune_step.signature(*model_and_optimizer(1, 1e-3), 0.5)
    assert finetune_step.signature(*model_and_optimizer(2, 5e-4), 0.5) == first
    assert finetune_step.signature(*model_and_optimizer(1, 1e-3), 1.0) != first
    assert finetune_step.signature(*model_and_optimizer(1, 1e-3, labels=3), 0.5) != first


def test_a_lora_grid_keeps_no_step_since_a_saved_trial_merges_its_model(tmp_path, monkeypatch):
    """A LoRA trial's saved model is merged in place (merge_and_unload): the step that trained it cannot serve the
    next trial of the same rank, which makes its own, and every trial completes."""

    data = write_rte_like(tmp_path / "data", n_train=48, n_dev=16)
    made, _ = count_kept_steps(monkeypatch)
    out = tmp_path / "grid"
    assert cli_main(["grid", "rte", *run_args(data, out), "--learning_rates", "5e-3", "--batch_sizes", "16",
                     "--epochs", "1", "--seeds", "1", "2", "--lora_ranks", "2"]) == 0
    states = [row["state"] for row in csv.DictReader((out / "grid_results.csv").open())]
    assert states == ["complete", "complete"] and len(made) == 2


@pytest.mark.slow  # compilation: 16 s on 2 cores
def test_a_workers_later_trials_reuse_the_first_ones_compiled_regions():
    """Each grid trial loads a fresh model; the compiled embeddings and layers of the first trial's shapes serve the
    next trials' (dynamo guards on the modules' code and shapes, not on the instances): a trial's fixed cost is not
    a new compilation."""
    from torch._dynamo.testing import CompileCounter

    from bert_suite.finetune_step import compile_encoder

    counter, compiled = CompileCounter(), []
    for trial in range(2):
        torch.manual_seed(trial)
        model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=100, num_labels=2,
                                                                                unpad_inputs=False))
        assert compile_encoder(model, backend=counter) == 1 + model.config.num_hidden_layers
        for length in (32, 64) if trial == 0 else (64,):  # the second trial: a bucket the first compiled
            ids = torch.randint(5, 100, (4, length))
            model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.zeros(4, dtype=torch.long)).loss.backward()
        compiled.append(counter.frame_count)
    assert compiled[0] > 0 and compiled == [compiled[0]] * 2, compiled


def test_the_encoder_is_compiled_for_long_runs_only_unless_told(monkeypatch):
    """Compilation costs a GPU run its first epoch (a graph per bucket); it pays only over many steps: auto compiles
    from COMPILE_FROM_STEPS on (RTE's grid, SQuAD: eager kernels, replayed); BERT_SUITE_COMPILE_FINETUNE decides."""
    from bert_suite.finetune_step import COMPILE_FROM_STEPS, compile_wanted

    monkeypatch.delenv("BERT_SUITE_COMPILE_FINETUNE", raising=False)
    assert not compile_wanted(234) and not compile_wanted(5_500) and compile_wanted(COMPILE_FROM_STEPS)
    monkeypatch.setenv("BERT_SUITE_COMPILE_FINETUNE", "1")
    assert compile_wanted(10)
    monkeypatch.setenv("BERT_SUITE_COMPILE_FINETUNE", "0")
    assert not compile_wanted(10**6)
    monkeypatch.setenv("BERT_SUITE_COMPILE_FINETUNE", "sometimes")
    with pytest.raises(ValueError, match="BERT_SUITE_COMPILE_FINETUNE must be auto, 1 or 0"):
        compile_wanted(10)


def test_what_the_captured_step_cannot_do_is_said_and_left_to_the_trainer(tmp_path):
    """A loss the Trainer computes outside the model (label smoothing), DataParallel, gradient checkpointing and the
    BiLSTM head keep the Trainer's step, each with its reason; the optimizer is made capturable in place."""
    from bert_suite.finetune_step import captured_step_problem, make_capturable

    model = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=50))

    def problem(**flags):
        args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **flags)
        trainer = SuiteTrainer(model=model, args=args)
        trainer.create_optimizer()
        return captured_step_problem(args, model, trainer.optimizer, trainer)

    assert problem() is None
    assert "label_smoothing_factor" in problem(label_smoothing_factor=0.1)
    assert "gradient_checkpointing" in problem(gradient_checkpointing=True)
    assert "gradient_accumulation_steps" in problem(gradient_accumulation_steps=2)
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    args._n_gpu = 2
    assert "DataParallel" in captured_step_problem(args, model, torch.optim.AdamW(model.parameters()))
    args._n_gpu = 1
    bilstm = BertSuiteForSequenceClassification(BertSuiteConfig.from_preset("tiny", vocab_size=50, bilstm=True))
    assert "BiLSTM" in captured_step_problem(args, bilstm, torch.optim.AdamW(bilstm.parameters()))
    # another optimizer, fp16 loss scaling, a compile mode with CUDA graphs of its own, a Trainer's own loss
    assert "the optimizer is SGD" in captured_step_problem(args, model, torch.optim.SGD(model.parameters(), lr=0.1))
    fp16 = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    fp16.fp16 = True  # (TrainingArguments refuses fp16 on the CPU itself; the check reads the flag)
    assert "fp16" in captured_step_problem(fp16, model, torch.optim.AdamW(model.parameters()))
    compiled = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    compiled.torch_compile, compiled.torch_compile_mode = True, "reduce-overhead"
    assert "torch_compile_mode reduce-overhead" in captured_step_problem(compiled, model,
                                                                         torch.optim.AdamW(model.parameters()))
    compiled.torch_compile_mode = "default"
    assert captured_step_problem(compiled, model, torch.optim.AdamW(model.parameters())) is None

    class OwnLoss(SuiteTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    own = OwnLoss(model=model, args=args)
    assert "a custom loss" in captured_step_problem(args, model, torch.optim.AdamW(model.parameters()), own)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=False)
    model(input_ids=torch.ones(2, 4, dtype=torch.long), labels=torch.zeros(2, dtype=torch.long)).loss.backward()
    optimizer.step()
    weight = next(model.parameters())
    step = optimizer.state[weight]["step"]
    make_capturable(optimizer)  # (a step on another device than its weight's, as a CPU-stepped checkpoint on a GPU, moves)
    assert optimizer.state[weight]["step"] is step and optimizer.param_groups[0]["capturable"]
