"""Two processes on the CPU (`accelerate launch --multi_gpu --num_processes 2`, joined with gloo),
for the pre-training recipe and `bert-suite finetune`: each process takes its own half of every
global batch, the losses equal one process's with the same global batch (dropout off), only rank 0
writes, and a run killed mid-way resumes to the same losses as one that was not.

Each launch runs tests/multiprocess_probe.py, which records each rank's batches and file writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, WORDS, fresh_state, load_recipe, recipe_args, write_rte_like
from multiprocess_probe import record_step_batches, record_training_batches

PROBE = REPO / "tests" / "multiprocess_probe.py"
ACCELERATE = Path(sys.executable).parent / "accelerate"


def launch(what: str, argv: list[str], probe: Path, processes: int = 2, fault: str | None = None):
    env = {**os.environ, "PROBE_DIR": str(probe), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "BERT_SUITE_FAILPOINT": fault or ""}
    done = subprocess.run([str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", str(processes),
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "--main_process_port", "0", str(PROBE), what, *argv],
                          capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    if fault is None:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in range(processes)]
        assert all(r["world_size"] == processes for r in ranks)
        return done.stdout + done.stderr, ranks
    assert done.returncode != 0 and f"failpoint {fault.split(':')[0]}" in done.stderr, done.stderr[-3000:]
    return done.stdout + done.stderr, None


def curve(out: Path, *keys: str) -> list[tuple]:
    """(step, *keys) of each logged step that has the keys."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [tuple(row[k] for k in ("step", *keys)) for row in rows if all(k in row for k in keys)]


def under(folder: Path, written: list[str]) -> list[str]:
    """Files written in `folder`, named as they end up (a checkpoint or the final model is written
    into NAME.incomplete, then renamed)."""
    root = str(folder.resolve())
    return sorted({str(Path(w).relative_to(root)).replace(".incomplete", "") for w in written if w.startswith(root)})


# ------------------------------------------------------------------------------- pre-training


@pytest.fixture(scope="module")
def pretrain_runs(pretrain_setup, tmp_path_factory):
    """A 2-process run with batch 8 per process and a 1-process run with batch 16, dropout off."""
    tmp = tmp_path_factory.mktemp("mp-pretrain")
    common = ["max_steps=6", "phase1_fraction=0.5", "save_steps=2", "eval_fraction=0.1", "eval_steps=3", "logging_steps=1",
              "hidden_dropout_prob=0", "attention_probs_dropout_prob=0", "per_device_train_batch_size_phase2=4"]
    two = recipe_args(pretrain_setup, tmp / "two", *common, "per_device_train_batch_size=8")
    log, ranks = launch("recipe", two, tmp / "probe-two")

    recipe = load_recipe()
    seen = []
    record_step_batches(recipe, seen)
    fresh_state()
    args = recipe_args(pretrain_setup, tmp / "one", *common, "per_device_train_batch_size=16",
                       "per_device_train_batch_size_phase2=8")
    recipe.main(args)
    fresh_state()  # and 1 process x 8 x 2 accumulation steps: the same global batch once more
    recipe.main(recipe_args(pretrain_setup, tmp / "accumulated", *common, "per_device_train_batch_size=8",
                            "gradient_accumulation_steps=2"))
    return {"tmp": tmp, "two": two, "log": log, "ranks": ranks, "one": seen}


def test_two_processes_split_each_global_batch_and_train_as_one_process(pretrain_runs):
    tmp, (rank0, rank1) = pretrain_runs["tmp"], pretrain_runs["ranks"]
    assert "world size 2 (MULTI_CPU" in pretrain_runs["log"]
    one = pretrain_runs["one"]
    assert len(rank0["batches"]) >= 6 and len(one) >= 6
    for step in range(6):  # 3 steps at length 32, 3 at 64 (a new order per phase)
        a, b = rank0["batches"][step], rank1["batches"][step]
        assert len(a) == len(b) == (8 if step < 3 else 4)
        assert not set(a) & set(b)  # disjoint shares ...
        assert a + b == one[step]  # ... that make up the one-process batch, in its order
    # with dropout off the losses are one process's, up to float rounding (all-reduce order)
    # the gradient norm (before clipping) too: a loss scaled by a constant would show there, not in Adam's steps
    keys = ("mlm_loss", "nsp_loss", "grad_norm")
    two, single, accumulated = (curve(tmp / run, *keys) for run in ("two", "one", "accumulated"))
    assert [s[0] for s in two] == [1, 2, 3, 4, 5, 6]
    for a, b, c in zip(two, single, accumulated, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6) and c == pytest.approx(b, rel=1e-5, abs=1e-6)
    # held-out evaluation (steps 3 and 6) on two processes: the same numbers as on one
    evals = [[row for row in curve(tmp / run, "eval_mlm_loss", "eval_nsp_accuracy")] for run in ("two", "one")]
    assert [row[0] for row in evals[0]] == [3, 6]
    for a, b in zip(*evals, strict=True):
        assert a == pytest.approx(b, rel=1e-5)
    assert single[-1][1] < single[0][1] - 0.2  # and it learned: the check compares moving numbers


def test_only_rank_0_writes_checkpoints_logs_and_the_final_model(pretrain_runs):
    out = pretrain_runs["tmp"] / "two"
    rank0, rank1 = (under(out, r["written"]) for r in pretrain_runs["ranks"])
    for wanted in ("metrics.jsonl", "pretrain_results.json", "final/model.safetensors", "final/config.json",
                   "checkpoints/step-4/progress.json"):
        assert wanted in rank0, (wanted, rank0)
    assert "checkpoints/step-4/model.safetensors" in rank0
    # rank 1 writes only its own random-number state into each checkpoint (exact resume needs it)
    assert rank1 and all(Path(w).name == "random_states_1.pkl" for w in rank1), rank1
    assert not any("random_states_1" in w for w in rank0)


@pytest.mark.slow  # two more launches (27 s): make test-all
def test_a_killed_two_process_run_resumes_exactly(pretrain_runs):
    tmp, argv = pretrain_runs["tmp"], pretrain_runs["two"]
    killed = [a.replace(str(tmp / "two"), str(tmp / "killed")) for a in argv]
    launch("recipe", killed, tmp / "probe-killed", fault="pretrain.step:5")  # after the step-4 checkpoint
    assert sorted(p.name for p in (tmp / "killed" / "checkpoints").iterdir() if p.name.startswith("step-")) \
        == ["step-2", "step-4"]
    log, _ = launch("recipe", killed, tmp / "probe-resumed")
    assert "resumed from" in log and "step-4 at step 4" in log
    whole, resumed = curve(tmp / "two", "mlm_loss", "nsp_loss"), curve(tmp / "killed", "mlm_loss", "nsp_loss")
    assert [r[0] for r in resumed] == [1, 2, 3, 4, 5, 6]  # the log has no step twice
    for a, b in zip(whole, resumed, strict=True):
        assert a == pytest.approx(b, rel=1e-6, abs=1e-7)


# -------------------------------------------------------------------------------- fine-tuning


@pytest.fixture(scope="module")
def finetune_runs(tmp_path_factory):
    """`bert-suite finetune` on 2 processes with batch 8 and on 1 with batch 16, from a checkpoint
    without dropout, random training order (the length-bucketed order is one process's)."""
    import torch

    from bert_suite import BertSuiteConfig, BertSuiteForPreTraining

    tmp = tmp_path_factory.mktemp("mp-finetune")
    data = write_rte_like(tmp / "rte", n_train=300, n_dev=40)
    header, *rows = (data / "train.tsv").read_text().splitlines()
    unique = list({tuple(r.split("\t")[1:3]): r for r in rows}.values())  # rows tell examples apart
    (data / "train.tsv").write_text("\n".join([header, *unique[:192]]) + "\n")
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset("tiny", vocab_size=5 + len(WORDS), hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
    BertSuiteForPreTraining(config).save_pretrained(tmp / "start")

    def argv(out, batch, *extra):
        return ["finetune", "rte", "--model", str(tmp / "start"), "--tokenizer", str(data / "vocab.txt"),
                "--data_dir", str(data), "--output_dir", str(tmp / out), "--disable_tqdm", "true",
                "--num_train_epochs", "3", "--learning_rate", "2e-3", "--per_device_train_batch_size", str(batch),
                "--logging_strategy", "steps", "--logging_steps", "1", "--train_sampling_strategy", "random",
                "--save_strategy", "steps", "--save_steps", "12", "--resume_from_checkpoint", "auto",
                "--test_file", str(data / "test.tsv"), *extra]  # predicted after training: rank 1 must wait for rank 0

    log, ranks = launch("cli", argv("two", 8), tmp / "probe-two")
    from bert_suite import runner
    from bert_suite.cli import main

    seen = []
    real_step = record_training_batches(seen)
    try:
        fresh_state()
        assert main(argv("one", 16)) == 0
    finally:
        runner.SuiteTrainer.training_step = real_step
    return {"tmp": tmp, "argv": argv, "log": log, "ranks": ranks, "one": seen}


def losses(out: Path) -> list[float]:
    last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry]


def test_finetune_on_two_processes_splits_batches_and_trains_as_one_process(finetune_runs):
    tmp, (rank0, rank1), one = finetune_runs["tmp"], finetune_runs["ranks"], finetune_runs["one"]
    assert len(one) == 36 and len(rank0["batches"]) == len(rank1["batches"]) == 36  # 192 / 16 x 3 epochs
    for step in range(36):
        a, b = rank0["batches"][step], rank1["batches"][step]
        assert len(a) == len(b) == 8
        assert not {tuple(r) for r in a} & {tuple(r) for r in b}  # the data's rows are all different
        assert sorted(a + b) == sorted(one[step])
    two, single = losses(tmp / "two"), losses(tmp / "one")
    assert len(two) == len(single) == 36
    assert two == pytest.approx(single, rel=1e-4, abs=1e-5)
    assert sum(single[-6:]) / 6 < single[0] - 0.2  # it learned, so equal curves are not flat ones
    a = json.loads((tmp / "two" / "all_results.json").read_text())
    b = json.loads((tmp / "one" / "all_results.json").read_text())
    assert a["eval_accuracy"] == pytest.approx(b["eval_accuracy"], abs=1 / 40) and b["eval_accuracy"] > 0.75


def test_finetune_writes_from_rank_0_only(finetune_runs):
    out = finetune_runs["tmp"] / "two"
    rank0, rank1 = (under(out, r["written"]) for r in finetune_runs["ranks"])
    for wanted in ("all_results.json", "run_manifest.json", "task_card.yaml", "model.safetensors",
                   "predictions/dev.tsv", "predictions/test.tsv", "checkpoint-12/model.safetensors"):
        assert wanted in rank0, (wanted, rank0)
    # rank 1 saves only its random-number state in each checkpoint (what an exact resume reads)
    assert rank1 and all(Path(w).name == "rng_state_1.pth" for w in rank1), rank1


@pytest.mark.slow  # two more launches (26 s): make test-all
def test_a_killed_two_process_finetune_resumes_exactly(finetune_runs):
    tmp, argv = finetune_runs["tmp"], finetune_runs["argv"]
    launch("cli", argv("killed", 8), tmp / "probe-killed", fault="finetune.step:15")  # after checkpoint-12
    assert sorted(p.name for p in (tmp / "killed").glob("checkpoint-*")) == ["checkpoint-12"]
    log, _ = launch("cli", argv("killed", 8), tmp / "probe-resumed")
    assert "resuming from" in log and "checkpoint-12" in log
    assert losses(tmp / "killed") == pytest.approx(losses(tmp / "two"), rel=1e-6, abs=1e-7)
    a = json.loads((tmp / "two" / "all_results.json").read_text())
    b = json.loads((tmp / "killed" / "all_results.json").read_text())
    assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6)


def test_global_batches_are_the_same_however_they_are_split_across_epochs():
    """StepBatches: 1 process x 8, 1 process x 4 x 2 accumulation steps and 2 processes x 4 (x 2 steps) take
    the same examples at every step, also across epoch boundaries (44 examples: 5 steps of 8 an epoch, the
    last 4 left out, a new order each epoch; 11 micro-batches of 4 do not split into whole steps)."""
    recipe = load_recipe()

    def steps(batch, accumulation, world, count=20):
        streams = [iter(recipe.StepBatches(44, batch, accumulation, 7, 0, rank, world)) for rank in range(world)]
        return [sorted(i for _ in range(accumulation) for s in streams for i in next(s)[1]) for _ in range(count)]

    whole = steps(8, 1, 1)
    assert steps(4, 2, 1) == whole and steps(4, 1, 2) == whole and steps(2, 2, 2) == whole
    assert sorted(sum(whole[:5], [])) != sorted(sum(whole[5:10], []))  # each epoch leaves out other examples
    assert len(set(sum(whole[:5], []))) == 40  # and none twice within an epoch
    starts = [next(iter(recipe.StepBatches(44, 8, 1, 7, k, 0, 1))) for k in (5, 6, 13)]
    assert [sorted(indices) for _, indices in starts] == [whole[5], whole[6], whole[13]]  # without replaying
    assert [micro for micro, _ in starts] == [5, 6, 13]  # each keyed by its micro-step (the masks' step)


def test_the_epochs_order_is_drawn_once_so_a_step_of_a_huge_dataset_costs_no_permutation():
    """The order of an epoch is the same permutation as before (a CPU run's batches and losses unchanged), drawn
    once per epoch: at step 700,000 of 100M instances (no data), each further batch is a slice (well under a
    millisecond), where a draw per step took about a second."""
    import time

    import torch

    recipe = load_recipe()
    small = iter(recipe.StepBatches(44, 8, 1, 7, 0, 0, 1))
    for step in range(12):  # two epoch boundaries
        epoch, position = divmod(step, 5)
        order = torch.randperm(44, generator=torch.Generator().manual_seed(7 * 100_003 + epoch))
        assert next(small)[1] == order[position * 8: position * 8 + 8].tolist()
    huge = iter(recipe.StepBatches(100_000_000, 128, 1, 7, 700_000, 0, 1))
    micro, first = next(huge)  # the epoch's one draw
    assert micro == 700_000 and len(first) == 128
    started = time.perf_counter()
    later = [next(huge) for _ in range(50)]
    per_batch = (time.perf_counter() - started) / 50
    assert per_batch < 2e-3, per_batch
    assert [m for m, _ in later] == list(range(700_001, 700_051))
