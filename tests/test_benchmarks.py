"""The benchmarks on data the tests write: the FLOPs formula by hand, the pre-training step benchmark's rows on
the CPU (same batches, same loss without dropout, ours does less work) and its goals, `make gpu-check`'s script
at toy size on the CPU, the data pipeline benchmark's corpora and summary; clean skips when the data or the GPU is
absent."""

import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
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
                                  "--repeats", "1", "--profile", "--precisions", *precisions,
                                  "--matmul_size", "128"])  # 2048 in bf16 without native bf16: minutes
    rows = {(r["variant"], r["precision"]): r for r in payload["rows"]}
    assert set(rows) == {(side, p) for side in ("ours", "stock") for p in precisions}
    ours, stock = rows["ours", "fp32"], rows["stock", "fp32"]
    assert ours["tokens"] == stock["tokens"] > 0 and 0 < ours["masked"] <= 2 * 4 * 5  # the same batches
    assert payload["checks"]["tiny"]["loss_diff_no_dropout"] < 1e-5  # the same computation
    assert ours["tokens_per_s"] > 0 and stock["vs_stock"] == pytest.approx(1.0) and ours["vs_stock"] > 0
    # each side timed in its own process as its users run it: stock with glibc's defaults, ours tuned as the recipe
    assert stock["allocator"] == "default" and ours["allocator"] in ("glibc tuned", "not glibc")
    assert all(0 < r["mfu"] and r["peak_mib"] > r["model_mib"] > 0 for r in rows.values())
    assert all("matmul" in r["profile"]["by_kind"] and r["profile"]["top"] for r in rows.values())
    assert all(v > 0 for v in [*payload["peak_flops"].values(), *payload["peak_flops_after"].values()])
    assert (corpus / "results" / "pretrain_step.json").is_file()
    machine = payload["machine"]  # the kind of CPU the figures belong to, and the goals judged for it
    assert set(machine["flags"]) <= set(common.SPEED_FLAGS) and machine["kind"].startswith(("native bf16", "no native"))
    goals = [g["goal"].split(" >=")[0].split(" (")[0] for g in payload["goals"]]
    if precisions == ["fp32"]:
        assert goals == ["ours/stock fp32"]
        return
    # both precisions in the same run: bf16 rows, their ratios, and each precision's own matmul peak
    assert rows["stock", "bf16"]["allocator"] == "default" and rows["ours", "bf16"]["bf16/fp32"] > 0
    assert set(payload["peak_flops"]) == {"fp32", "bf16"}
    assert goals == ["ours/stock fp32", "ours bf16/fp32" if machine["native_bf16"] else "auto never slower than fp32",
                     "ours/stock bf16"]


def test_pretrain_step_goals_per_kind_of_cpu():
    """The goals of a preset's rows: fp32 against stock everywhere; where bf16 is native, bf16 over fp32 and bf16
    against stock at least fp32's ratio; where it is emulated, auto keeps fp32 (1.0x of fp32 by construction)."""
    def rows(bf16_over_fp32):
        ours = {"preset": "mini", "variant": "ours"}
        return [{**ours, "precision": "fp32", "vs_stock": 4.2},
                {**ours, "precision": "bf16", "vs_stock": 4.0, "bf16/fp32": bf16_over_fp32}]

    native = pretrain_step.goals(rows(2.3), "avx512_bf16")
    assert [(g["goal"], round(g["measured"], 2), g["met"]) for g in native] == [
        ("ours/stock fp32 >= 4.0", 4.2, True), ("ours bf16/fp32 >= 2.0", 2.3, True),
        ("ours/stock bf16 >= fp32's 4.20", 4.0, False)]
    emulated = pretrain_step.goals(rows(0.4), None)
    assert emulated[1] == {"preset": "mini", "goal": "auto never slower than fp32 (auto = fp32: bf16 emulated, 0.40x "
                                                     "of fp32)", "measured": 1.0, "met": True}
    assert emulated[2]["met"] is None  # emulated bf16 against stock: a figure, not a goal
    base = {"preset": "base", "variant": "ours", "precision": "fp32", "vs_stock": 1.5}
    assert pretrain_step.goals([base], None) == [
        {"preset": "base", "goal": "ours/stock fp32 >= 1.6", "measured": 1.5, "met": False}]


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
    assert {r["precision"] for r in rows.values()} == {"fp32"} and not record["pretrain-tiny-32"]["errors"]
    assert all(r["tokens_per_s"] > 0 and r["mfu"] > 0 for r in rows.values())
    summary = (out / "summary.md").read_text()
    assert "| base at 128: MFU >= 0.45 | not measured | - |" in summary and "## Pre-training step" in summary
    return record


def test_gpu_check_runs_a_step_and_its_summary_on_the_cpu(tmp_path):
    """`make gpu-check`'s script on the CPU with one step (--only pretrain-tiny: the recipe's step forms, CUDA-graph
    body included, against stock and an earlier bert_suite, timed as on CUDA), so that the script cannot rot while no
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
    test writes (a bundle without wheels: this Python has the packages), the correctness and recipe steps as
    tests/test_gpu.py told the device (BERT_SUITE_TEST_DEVICE=cpu). Each step ends ok; at most 8 files come out;
    the merged record holds every part, and the summary the tests' tables."""
    record = run_gpu_check(tmp_path)
    assert record["status"].keys() == {"pretrain-tiny", "finetune", "correctness", "recipe"}
    assert record["finetune"]["tasks"]["rte"]["train"]["ratio_by_precision"]["fp32"] > 0
    assert [r["head"] for r in record["correctness"]["rows"]] == ["Model", "ForPreTraining"]
    assert record["correctness"]["device"] == "cpu" and record["recipe"]["step_form"] == "eager"
    assert record["recipe"]["uninterrupted"]["exit"] == 0 and record["recipe"]["tokens_per_second"] > 0
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Correctness" in summary and "## The recipe" in summary


def test_random_batches_have_a_fixed_number_of_masks_inside_the_sequence():
    import torch

    (batch,) = pretrain_step.random_batches(2000, 128, 3, 1)
    chosen = batch["labels"] != -100
    assert chosen.sum(1).tolist() == [19, 19, 19]  # 15% of 128, under the cap of 20
    assert not chosen[:, 0].any() and not chosen[:, -1].any()
    assert torch.all(batch["input_ids"][chosen] == 103)


def test_pretrain_step_on_cuda_skips_without_cuda_and_refuses_what_cannot_run(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        pretrain_step.main(["--device", "cuda"])
    assert exit_info.value.code == 0 and "no CUDA" in capsys.readouterr().out
    for argv, message in ((["--variants", "before"], "needs --before"),
                          (["--variants", "eager"], "one precision a process")):  # fp32 and bf16 by default
        with pytest.raises(SystemExit) as exit_info:
            pretrain_step.parse_args(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


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
