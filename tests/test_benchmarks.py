"""The pre-training step benchmarks on data the tests write: the FLOPs formula by hand, the CPU
benchmark's rows (same batches, same loss without dropout, ours does less work), and the GPU
benchmark's variants run on CPU; clean skips when the data or the GPU is absent."""

import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bf16_seed_spread  # noqa: E402
import common  # noqa: E402
import compile_speed  # noqa: E402
import gpu_correctness  # noqa: E402
import gpu_pretrain_step  # noqa: E402
import pretrain_step  # noqa: E402

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()


def test_encoder_flops_by_hand():
    config = SimpleNamespace(hidden_size=2, intermediate_size=8, vocab_size=10, num_hidden_layers=1)
    # dense 2*(4*4 + 2*2*8)*3 = 288; attention 4*2*3^2 = 72; MLM head 2*(4 + 20)*1 = 48; pooler+NSP 2*(4 + 4) = 16
    assert common.encoder_flops(config, [3], masked=1) == 288 + 72 + 48 + 16
    assert common.encoder_flops(config, [3], masked=1, nsp=False) == 288 + 72 + 48


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + " ." for _ in range(8))
            for _ in range(40)]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs) + "\n")
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *WORDS]) + "\n")
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path / "results")
    return tmp_path


# fp32 alone: two timed processes; with bf16, four (make test-all): bf16's goals are checked by the test below
@pytest.mark.parametrize("precisions", [["fp32"], pytest.param(["fp32", "bf16"], marks=pytest.mark.slow)],
                         ids=["fp32", "fp32-bf16"])
def test_pretrain_step_benchmark_rows(corpus, precisions):
    payload = pretrain_step.main(["--corpus", str(corpus / "corpus.txt"), "--vocab", str(corpus / "vocab.txt"),
                                  "--presets", "tiny", "--batch_size", "4", "--seq_len", "32", "--steps", "2",
                                  "--repeats", "1", "--no-memory", "--profile", "--precisions", *precisions,
                                  "--matmul_size", "128"])  # 2048 in bf16 without native bf16: minutes
    (row,) = payload["rows"]
    assert row["tokens"] > 0 and 0 < row["masked"] <= 2 * 4 * 20
    assert row["loss_diff_no_dropout"] < 1e-5  # the same computation
    assert row["ours_tokens_per_s"] > 0 and row["stock_tokens_per_s"] > 0 and row["speedup"] > 0
    # each side timed in its own process as its users run it: stock with glibc's defaults, ours tuned as the recipe
    assert row["allocator"]["stock"] == "default" and row["allocator"]["ours"] in ("glibc tuned", "not glibc")
    assert 0 < row["ours_mfu"] and 0 < row["stock_mfu"]
    assert "matmul" in row["profile"]["ours step"] and "matmul" in row["profile"]["stock step"]
    assert all(v > 0 for v in payload["matmul_bf16_flops"] + payload["matmul_fp32_flops"])
    assert (corpus / "results" / "pretrain_step.json").is_file()
    machine = payload["machine"]  # the kind of CPU the figures belong to, and the goals judged for it
    assert set(machine["flags"]) <= set(common.SPEED_FLAGS) and machine["kind"].startswith(("native bf16", "no native"))
    goals = [g["goal"].split(" >=")[0].split(" (")[0] for g in payload["goals"]]
    if precisions == ["fp32"]:
        assert "ours bf16_tokens_per_s" not in row and "ours bf16 step" not in row["profile"]
        assert goals == ["ours/stock fp32"]
        return
    # both precisions in the same run: bf16 rows, their ratios, and each precision's own matmul peak
    assert row["allocator"]["stock bf16"] == "default"
    assert row["ours bf16_tokens_per_s"] > 0 and row["speedup bf16"] > 0 and row["ours bf16/fp32"] > 0
    assert 0 < row["ours bf16_mfu"] and "matmul" in row["profile"]["ours bf16 step"]
    assert goals == ["ours/stock fp32", "ours bf16/fp32" if machine["native_bf16"] else "auto never slower than fp32",
                     "ours/stock bf16"]


def test_pretrain_step_goals_per_kind_of_cpu():
    """The goals of a row: fp32 against stock everywhere; where bf16 is native, bf16 over fp32 and bf16 against
    stock at least fp32's ratio; where it is emulated, auto keeps fp32 (1.0x of fp32 by construction)."""
    row = {"preset": "mini", "speedup": 4.2, "speedup bf16": 4.0, "ours bf16/fp32": 2.3}
    native = pretrain_step.goals([row], "avx512_bf16")
    assert [(g["goal"], round(g["measured"], 2), g["met"]) for g in native] == [
        ("ours/stock fp32 >= 4.0", 4.2, True), ("ours bf16/fp32 >= 2.0", 2.3, True),
        ("ours/stock bf16 >= fp32's 4.20", 4.0, False)]
    emulated = pretrain_step.goals([{**row, "ours bf16/fp32": 0.4}], None)
    assert emulated[1] == {"preset": "mini", "goal": "auto never slower than fp32 (auto = fp32: bf16 emulated, 0.40x "
                                                     "of fp32)", "measured": 1.0, "met": True}
    assert emulated[2]["met"] is None  # emulated bf16 against stock: a figure, not a goal
    assert pretrain_step.goals([{"preset": "base", "speedup": 1.5}], None) == [
        {"preset": "base", "goal": "ours/stock fp32 >= 1.6", "measured": 1.5, "met": False}]


def test_bf16_seed_spread_pairs_the_precisions_seed_by_seed(tmp_path, monkeypatch):
    """The benchmark behind the bf16 recipe test's bounds, in small: per seed both precisions from the same
    start (the first steps agree to bf16 rounding), the paired differences and their spread over seeds."""
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    payload = bf16_seed_spread.main(["--seeds", "1", "2", "--steps", "8", "--early_steps", "4"])
    assert [r["seed"] for r in payload["rows"]] == [1, 2] and payload["tail_steps"] == "7-8"
    for row in payload["rows"]:
        assert row["difference"] == pytest.approx(row["bf16"] - row["fp32"]) and row["max_early_difference"] < 0.01
    summary = payload["summary"]
    assert summary["seeds"] == 2 and summary["sd_difference"] >= 0 and summary["max_early_difference"] < 0.01
    assert summary["mean_difference"] == pytest.approx(sum(r["difference"] for r in payload["rows"]) / 2)
    assert payload["rows"][0]["fp32"] != payload["rows"][1]["fp32"]  # another seed, another run
    assert (tmp_path / "bf16_seed_spread.json").is_file() and payload["machine"]["kind"]


def test_pretrain_step_skips_without_data(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        pretrain_step.main(["--data", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 0 and str(tmp_path / "nowhere") in capsys.readouterr().out


def gpu_check_bundle(tmp_path: Path) -> Path:
    """A bundle for `gpu_check.sh --device cpu --quick` without wheels (this Python has the packages): RTE-like
    data, a corpus with its vocabulary, and an "earlier" bert_suite (today's modeling files)."""
    import shutil

    from helpers import REPO, write_pretrain_setup, write_rte_like

    bundle = tmp_path / "bundle"
    write_rte_like(bundle / "data" / "glue" / "RTE", n_train=64, n_dev=32)
    (tmp_path / "setup").mkdir()
    setup = write_pretrain_setup(tmp_path / "setup")
    (bundle / "data" / "vocab" / "bert-base-uncased").mkdir(parents=True)
    vocab = (bundle / "data" / "glue" / "RTE" / "vocab.txt").read_text().splitlines()
    words = [w for w in (setup / "vocab.txt").read_text().splitlines() if w not in vocab]
    (bundle / "data" / "vocab" / "bert-base-uncased" / "vocab.txt").write_text("\n".join(vocab + words) + "\n")
    shutil.copy(setup / "corpus.txt", bundle / "data" / "corpus.txt")
    before = bundle / "before" / "bert_suite_before"  # an "earlier" modeling file: today's
    before.mkdir(parents=True)
    for name in ("modeling_bert_suite.py", "configuration_bert_suite.py"):
        shutil.copy(REPO / "src" / "bert_suite" / name, before / name)
    (before / "__init__.py").write_text("")
    return bundle


def run_gpu_check(tmp_path: Path, *extra: str) -> dict:
    """`gpu_check.sh --device cpu --quick` on a bundle the test writes: it ends well, at most 8 files come out
    (here 3), and the merged record (returned) has the pre-training step's rows for every variant."""
    import json
    import os
    import subprocess

    from helpers import REPO

    bundle, out = gpu_check_bundle(tmp_path), tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--device", "cpu", "--quick",
                           "--bundle", str(bundle), "--out", str(out), *extra], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHON": sys.executable}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert sorted(p.name for p in files) == ["gpu_check.json", "gpu_check.log", "summary.md"]
    record = json.loads((out / "gpu_check.json").read_text())
    assert all(state.startswith("ok") for state in record["status"].values()), record["status"]
    rows = {r["variant"]: r for r in record["pretrain-tiny-32"]["rows"]}
    assert set(rows) == {"stock", "before", "eager", "graph"} and rows["stock"]["vs_stock"] == pytest.approx(1.0)
    assert all(r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in rows.values())
    summary = (out / "summary.md").read_text()
    assert "| base at 128: MFU >= 0.45 | not measured | - |" in summary and "## Pre-training step" in summary
    return record


def test_gpu_check_runs_a_step_and_its_summary_on_the_cpu(tmp_path):
    """`make gpu-check`'s script on the CPU with one step (--only pretrain-tiny: the GPU benchmark's variants,
    CUDA-graph body included, against stock and an earlier bert_suite), so that the script cannot rot while no
    GPU is at hand: the step ends ok, the steps not asked for are left out, the summary is written from the one
    part; a mistyped option and a machine without CUDA are one line each, with nothing run. Every step at toy
    size: the slow test below (make test-all)."""
    import os
    import subprocess

    import torch

    from helpers import REPO

    record = run_gpu_check(tmp_path, "--only", "pretrain-tiny")
    assert record["status"].keys() == {"pretrain-tiny"}
    bad = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--devise", "cpu"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown option --devise" in bad.stderr
    if not torch.cuda.is_available():  # `make gpu-check` where there is no GPU: one line, nothing run
        bare = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--out", str(tmp_path / "bare")],
                              capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
        assert bare.returncode == 2 and "no CUDA device here" in bare.stderr
        assert not (tmp_path / "bare" / "gpu_check.json").exists()


@pytest.mark.slow  # five processes, 35-50 s on 2 cores (more under load): make test-all; one step above
def test_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    """`benchmarks/gpu_check.sh --device cpu --quick`: every step of `make gpu-check` at toy size on data the
    test writes (a bundle without wheels: this Python has the packages). Each step ends ok; at most 8 files come
    out; the merged record holds every part."""
    record = run_gpu_check(tmp_path)
    assert record["status"].keys() == {"pretrain-tiny", "finetune", "correctness", "recipe"}
    assert record["finetune"]["tasks"]["rte"]["train"]["ratio_by_precision"]["fp32"] > 0
    assert [r["head"] for r in record["correctness"]["rows"]] == ["Model", "ForPreTraining"]
    assert record["recipe"]["uninterrupted"]["exit"] == 0 and record["recipe"]["tokens_per_second"] > 0


def test_gpu_correctness_leaves_out_bf16_where_it_is_emulated(monkeypatch):
    import bert_suite.precision

    monkeypatch.setattr(bert_suite.precision, "native_bf16_flag", lambda: None)
    assert not gpu_correctness.bf16_is_fast("cpu") and gpu_correctness.bf16_is_fast("cuda")
    monkeypatch.setattr(bert_suite.precision, "native_bf16_flag", lambda: "avx512_bf16")
    assert gpu_correctness.bf16_is_fast("cpu")


def test_batch_benchmark_skips_without_data(tmp_path, capsys):
    import pretrain_batches

    with pytest.raises(SystemExit) as exit_info:
        pretrain_batches.main(["--data", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 0 and "nowhere" in capsys.readouterr().out


def test_gpu_batches_have_a_fixed_number_of_masks_inside_the_sequence():
    import torch

    config = SimpleNamespace(vocab_size=2000)
    (batch,) = gpu_pretrain_step.make_batches(config, 128, 3, 1, "cpu")
    chosen = batch["labels"] != -100
    assert chosen.sum(1).tolist() == [19, 19, 19]  # 15% of 128, under the cap of 20
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert torch.all(batch["input_ids"][chosen] == 103)


def test_gpu_benchmark_skips_without_cuda(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        gpu_pretrain_step.main([])
    assert exit_info.value.code == 0 and "no CUDA" in capsys.readouterr().out


def test_gpu_correctness_skips_without_cuda(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        gpu_correctness.main([])
    assert exit_info.value.code == 0 and "no CUDA" in capsys.readouterr().out


def test_compile_benchmark_rows_on_cpu(tmp_path, monkeypatch):
    """Every variant runs a pre-training step (the fine-tuning step is the same code with another
    head); the compiled ones compile with aot_eager: the trace without inductor's code generation."""
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    payload = compile_speed.main(["--presets", "tiny", "--device", "cpu", "--batch", "2", "--steps", "1",
                                  "--repeats", "1", "--backend", "aot_eager", "--vocab_size", "1200",
                                  "--jobs", "pretrain"])
    rows = {(r["job"], r["variant"]): r for r in payload["rows"]}
    variants = {"ours unpad", "ours pad", "ours + compile", "stock", "stock + compile"}
    assert set(rows) == {("pretrain", v) for v in variants}
    assert all(r["steps_per_s"] > 0 and r["attention"] for r in rows.values())
    assert rows["pretrain", "stock"]["vs_stock_eager"] == pytest.approx(1.0)
    assert (tmp_path / "compile_speed.json").is_file()


def test_zipf_corpus_is_deterministic_nested_and_grows_its_vocabulary_as_heaps_law(tmp_path):
    import zipf_corpus

    small = zipf_corpus.write_zipf_corpus(tmp_path / "a.txt", 400_000, seed=0)
    again = zipf_corpus.write_zipf_corpus(tmp_path / "b.txt", 400_000, seed=0)
    large = zipf_corpus.write_zipf_corpus(tmp_path / "c.txt", 1_600_000, seed=0)
    assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes() and small == again
    assert (tmp_path / "c.txt").read_bytes().startswith((tmp_path / "a.txt").read_bytes())  # one seed: nested
    growth = large["distinct_words"] / small["distinct_words"]
    exponent = math.log(growth) / math.log(large["words"] / small["words"])
    assert 0.5 < exponent < 0.9, exponent  # Heaps' law, as in web text; not linear, not flat
    text = (tmp_path / "a.txt").read_text()
    assert "\n\n" in text and text.split("\n", 1)[0].endswith(".")  # documents of sentences, the lines format


def test_the_letters_corpus_is_deterministic_nested_and_spelt_by_english_letter_frequency(tmp_path):
    """The low-structure corpus: words of letters drawn independently, so no stem or suffix recurs."""
    from collections import Counter

    import zipf_corpus

    small = zipf_corpus.write_letters_corpus(tmp_path / "a.txt", 300_000, seed=0, types=200_000)
    again = zipf_corpus.write_letters_corpus(tmp_path / "b.txt", 300_000, seed=0, types=200_000)
    large = zipf_corpus.write_letters_corpus(tmp_path / "c.txt", 2_000_000, seed=0, types=200_000)
    assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes() and small == again
    assert (tmp_path / "c.txt").read_bytes().startswith((tmp_path / "a.txt").read_bytes())
    assert large["distinct_words"] > 1.4 * small["distinct_words"]  # a long tail of new words
    spellings = {word for word in (tmp_path / "c.txt").read_text().split() if word.isalpha()}
    letters = Counter(c for word in spellings for c in word)  # over the words, not the text (Zipf weights a few)
    assert [c for c, _ in letters.most_common(3)] == ["e", "t", "a"]  # English's most frequent letters


def test_pipeline_scale_summary_checks_the_goals_from_the_rows():
    import pipeline_scale

    def row(corpus, size, stage, tool, p, seconds, peak, worker=None):
        return {"corpus": corpus, "bytes": size, "stage": stage, "tool": tool, "num_proc": p, "seconds": seconds,
                "peak_mib": peak, "worker_peak_mib": worker or peak}

    rows = [row("zipf_100mb", 10**8, "instances", "bert_suite", 2, 40, 900, 400),
            row("zipf_1000mb", 10**9, "instances", "bert_suite", 2, 440, 950, 420),
            row("zipf_1000mb", 10**9, "vocabulary", "bert_suite", 2, 300, 2000),
            row("zipf_1000mb", 10**9, "vocabulary", "tokenizers", 2, 250, 2500),
            row("zipf_100mb", 10**8, "instances", "bert_suite", 1, 70, 500),
            row("real", 2 * 10**7, "instances", "bert_suite", 1, 7, 500)]
    summary = pipeline_scale.summarise(rows)
    assert summary["vocabulary_zipf_1000mb_np2"] == {"time_ratio_ours_over_tokenizers": 1.2,
                                                    "memory_ratio_ours_over_tokenizers": 0.8}
    assert summary["instances_np2"] == {"time_per_byte_ratio_large_over_small": 1.1,
                                        "worker_memory_ratio_large_over_small": 1.05}
    assert summary["instances_parallel_efficiency_zipf_100mb"] == 0.875
    assert "instances_np1" not in summary  # one size only: no slope
