"""benchmarks/finetune_speed.py on a tiny RTE-like folder: both sides do the same examples in both
precisions, the logits agree, stock pads more; and a clean skip when the data or the CUDA device is absent."""

import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import finetune_speed  # noqa: E402

from helpers import count_kept_steps  # noqa: E402

WORDS = ("the cat dog man woman sat ran on a mat in park city house big small red old new quickly slowly "
         "yesterday today and was is not who near river").split()


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def write_rte(path: Path, rows: int, seed: int) -> None:
    """RTE's layout: index, sentence1, sentence2, label (entailment / not_entailment)."""
    rng = random.Random(seed)
    lines = ["index\tsentence1\tsentence2\tlabel"]
    for i in range(rows):
        label = "entailment" if i % 2 else "not_entailment"
        lines.append(f"{i}\t{sentence(rng, 3, 40)}\t{sentence(rng, 2, 12)}\t{label}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def data(tmp_path, monkeypatch):
    write_rte(tmp_path / "glue" / "RTE" / "train.tsv", 40, seed=1)
    write_rte(tmp_path / "glue" / "RTE" / "dev.tsv", 24, seed=2)
    vocab = tmp_path / "vocab" / "bert-base-uncased" / "vocab.txt"
    vocab.parent.mkdir(parents=True)
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *WORDS]) + "\n")
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    return tmp_path


def test_same_examples_same_logits_stock_pads_more(data):
    payload = finetune_speed.main(["--data", str(data), "--tasks", "rte", "--preset", "tiny", "--repeats", "1",
                                   "--no-memory", "--out", "test_finetune_speed"])
    rte = payload["tasks"]["rte"]
    for name, n in (("train", 40), ("predict", 24)):
        assert rte[name]["examples"] == n
        assert rte["tokens"]["ours"][name]["examples"] == rte["tokens"]["stock"][name]["examples"] == n
        assert rte["tokens"]["ours"][name]["real_tokens"] == rte["tokens"]["stock"][name]["real_tokens"]
        assert rte["tokens"]["stock"][name]["padded_tokens"] == 128 * n
        assert rte["tokens"]["stock"][name]["padded_tokens"] > rte["tokens"]["ours"][name]["padded_tokens"]
        assert isinstance(rte[name]["ratio"], float) and rte[name]["ratio"] > 0
        assert set(rte[name]["examples_per_s"]) == {"ours", "stock", "ours bf16", "stock bf16"}
        assert all(v > 0 for v in rte[name]["examples_per_s"].values())
        assert set(rte[name]["ratio_by_precision"]) == {"fp32", "bf16"} and rte[name]["bf16_over_fp32"]["ours"] > 0
    assert rte["logit_max_abs_diff"]["fp32"] < 1e-4  # bf16: ours' scores fp32, stock's rounded to bf16
    assert rte["logit_max_abs_diff"]["bf16"] < 2e-2
    assert rte["training_arguments"]["ours bf16"]["bf16"] is True and rte["training_arguments"]["ours"]["bf16"] is False
    assert rte["state_dict"]["missing"] == []
    assert (data / "results" / "test_finetune_speed.json").is_file()


def test_ours_is_timed_on_the_path_a_gpu_runs_buckets_and_the_captured_step(data, monkeypatch):
    """With the captured step and length buckets switched on (the CUDA defaults; their body runs on the CPU), ours'
    batches are padded to the bucket's multiples as `bert-suite finetune` pads them, and every timed epoch trains
    through the captured step made in the first, adopted by each later epoch's new optimizer (one AdamW step a batch:
    tests/test_finetune_step.py, train() called again)."""
    from bert_suite import finetune_step

    made, adopted = count_kept_steps(monkeypatch)  # the captured step on
    monkeypatch.setenv("BERT_SUITE_LENGTH_BUCKET", "32")
    widths, real = [], finetune_step.FinetuneStep.step
    monkeypatch.setattr(finetune_step.FinetuneStep, "step",
                        lambda self, batch: widths.append(batch["input_ids"].shape[1]) or real(self, batch))
    payload = finetune_speed.main(["--data", str(data), "--tasks", "rte", "--preset", "tiny", "--repeats", "1",
                                   "--precisions", "fp32", "--no-memory", "--out", "test_finetune_speed_gpu_path"])
    rte = payload["tasks"]["rte"]
    assert widths and set(widths) <= {32, 64} and len(widths) % 2 == 0  # 40 examples of 3-52 words; epochs alike
    # one step made in the first epoch; the timed epoch's new optimizer adopts it (its graphs, on a GPU, replayed)
    assert (len(made), len(adopted)) == (1, 1)
    ours = rte["tokens"]["ours"]
    for name, n in (("train", 40), ("predict", 24)):
        assert ours[name]["examples"] == n and ours[name]["padded_tokens"] % 32 == 0
        assert ours[name]["padded_tokens"] < rte["tokens"]["stock"][name]["padded_tokens"]
    assert rte["logit_max_abs_diff"]["fp32"] < 1e-4


def test_missing_data_skips(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        finetune_speed.main(["--data", str(tmp_path / "nowhere"), "--tasks", "rte"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "skipped" in out and str(tmp_path / "nowhere") in out


def test_cuda_skips_without_a_gpu(data, capsys, monkeypatch):
    monkeypatch.setattr(finetune_speed.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        finetune_speed.main(["--device", "cuda", "--data", str(data), "--tasks", "rte"])
    assert exit_info.value.code == 0 and "no CUDA device" in capsys.readouterr().out
