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
sys.path.insert(0, str(BENCH.parent / "tools"))  # zipf_corpus.py, the synthetic corpora

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


RECORD_FIGURES = {"finetune_rte_base_bf16_over_stock", "finetune_first_epoch_over_steady", "grid_rte_base_bf16_over_stock",
                  "recipe_over_step_tiny", "recipe_over_step_mini", "recipe_over_step_base", "pretrain_base_128_mfu",
                  "pretrain_base_512_mfu"}


def run_gpu_check(tmp_path: Path, *extra: str) -> dict:
    """`gpu_check.sh --device cpu --quick` on a bundle the test writes: it ends well, at most 8 files come out
    (here 4), and the merged record (returned) has the pre-training step's rows for every variant; gpu_record.json
    is a CPU's (device cpu, today, the commit checked out here) with every figure of issues 62 and 63."""
    import datetime
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
    assert sorted(p.name for p in files) == ["gpu_check.json", "gpu_check.log", "gpu_record.json", "summary.md"]
    record = json.loads((out / "gpu_check.json").read_text())
    filed = json.loads((out / "gpu_record.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    assert filed == record["record"] and filed["device"] == "cpu" and filed["commit"] == (head or None)
    assert filed["date"] == datetime.date.today().isoformat() and set(filed["figures"]) == RECORD_FIGURES
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
    assert all(value is None for value in record["record"]["figures"].values())  # none of issue 62's or 63's
    bad = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--devise", "cpu"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown option --devise" in bad.stderr
    if not torch.cuda.is_available():  # `make gpu-check` where there is no GPU: one line, nothing run
        bare = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--out", str(tmp_path / "bare")],
                              capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
        assert bare.returncode == 2 and "no CUDA device here" in bare.stderr
        assert not (tmp_path / "bare" / "gpu_check.json").exists()


@pytest.mark.slow  # eleven processes, 85 s on 2 cores at a load of 5: make test-all; one step above
def test_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    """`benchmarks/gpu_check.sh --device cpu --quick`: every step of `make gpu-check` at toy size on data the
    test writes (a bundle without wheels: this Python has the packages), the correctness and recipe steps as
    tests/test_gpu.py told the device (BERT_SUITE_TEST_DEVICE=cpu). Each step ends ok; at most 8 files come out;
    the merged record holds every part, and the summary the tests' tables."""
    record = run_gpu_check(tmp_path)
    assert record["status"].keys() == {"pretrain-tiny", "recipe-speed", "finetune", "grid", "correctness", "recipe"}
    assert record["finetune"]["tasks"]["rte"]["train"]["ratio_by_precision"]["fp32"] > 0
    # the toy run's figures (tiny, fp32; the recipe at pretrain-tiny's 32 x 4); base's step is not measured
    figures = record["record"]["figures"]
    measured = {"finetune_rte_base_bf16_over_stock", "finetune_first_epoch_over_steady", "grid_rte_base_bf16_over_stock",
                "recipe_over_step_tiny"}
    assert all(isinstance(figures[k], float) and figures[k] > 0 for k in measured), figures
    assert all(figures[k] is None for k in RECORD_FIGURES - measured), figures
    recipe = record["recipe-speed"]["presets"]["tiny"]
    assert recipe["exit"] == 0 and recipe["step_form"] == "eager" and recipe["intervals"] == 8  # 10 lines, 2 dropped
    assert record["grid"]["ours"]["points"][0]["learning_rate"] == record["grid"]["stock"]["points"][0]["learning_rate"]
    assert [r["head"] for r in record["correctness"]["rows"]] == ["Model", "ForPreTraining"]
    assert record["correctness"]["device"] == "cpu" and record["recipe"]["step_form"] == "eager"
    assert record["recipe"]["uninterrupted"]["exit"] == 0 and record["recipe"]["tokens_per_second"] > 0
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "## Correctness" in summary and "## The recipe" in summary and "## RTE grid subset" in summary
    assert "not a GPU's record" in summary


def test_gpu_check_summary_figures_goals_and_record_from_hand_made_parts(tmp_path, capsys):
    """gpu_check_summary.py on parts written by hand: the recipe's padded tokens/s over the best of its step's forms
    at the same length and tokens a step (not stock's, not another batch's), base's best MFU at each length, the
    bf16 fine-tuning and grid ratios; the goals met or missed from them; gpu_record.json with the GPU's name and
    the one line that files it."""
    import json

    import gpu_check_summary as summary

    def row(preset, length, batch, variant, tokens_per_s, mfu=0.1):
        return {"preset": preset, "seq_len": length, "batch": batch, "variant": variant, "precision": "bf16",
                "tokens_per_s": tokens_per_s, "mfu": mfu, "step_ms": 1.0}

    parts = {
        "pretrain-base-128": {"machine": {"gpu": "NVIDIA H200"}, "rows": [
            row("base", 128, 128, "stock", 900_000, 0.5), row("base", 128, 128, "eager", 400_000, 0.30),
            row("base", 128, 128, "compiled+graph", 600_000, 0.46), row("base", 128, 256, "compiled+graph", 700_000)]},
        "pretrain-base-512": {"rows": [row("base", 512, 32, "compiled+graph", 500_000, 0.38)]},
        "pretrain-tiny-128": {"rows": [row("tiny", 128, 128, "graph", 4e6), row("tiny", 128, 128, "compiled+graph", 8e6),
                                       row("tiny", 128, 128, "before", 1e6)]},
        "recipe-speed": {"presets": {
            "tiny": {"seq_len": 128, "batch": 128, "tokens_per_step": 16384, "padded_tokens_per_second": 7.6e6},
            "base": {"seq_len": 128, "batch": 128, "tokens_per_step": 16384, "padded_tokens_per_second": 480_000},
            "mini": {"seq_len": 128, "batch": 128, "tokens_per_step": 16384, "error": "exit 1"}}},
        "finetune": {"tasks": {"rte": {
            "train": {"examples_per_s": {"ours bf16": 320.0, "stock bf16": 100.0}, "ratio_by_precision": {"bf16": 3.2},
                      "first_over_steady": {"bf16": 1.8}},
            "predict": {"examples_per_s": {"ours bf16": 900.0, "stock bf16": 450.0}, "ratio_by_precision": {"bf16": 2.0}}}}},
        "grid": {"ratio": 4.0, "precision": "bf16", "ours": {"seconds": 50.0, "points": [{}] * 6},
                 "stock": {"seconds": 200.0}}}
    for name, part in parts.items():
        (tmp_path / "parts").mkdir(exist_ok=True)
        (tmp_path / "parts" / f"{name}.json").write_text(json.dumps(part))
    merged = summary.main(["--parts", str(tmp_path / "parts"), "--out", str(tmp_path / "out"), "--commit", "abc123"])
    figures = merged["record"]["figures"]
    assert figures == {"finetune_rte_base_bf16_over_stock": 3.2, "finetune_first_epoch_over_steady": 1.8,
                       "grid_rte_base_bf16_over_stock": 4.0, "recipe_over_step_tiny": pytest.approx(0.95),
                       "recipe_over_step_mini": None, "recipe_over_step_base": pytest.approx(0.8),
                       "pretrain_base_128_mfu": 0.46, "pretrain_base_512_mfu": 0.38}
    met = {g["goal"].split(":")[0]: g["met"] for g in merged["goals"]}
    assert met == {"base at 128": True, "base at 512": False, "the recipe, tiny": True, "the recipe, mini": None,
                   "the recipe, base": False, "fine-tuning base on RTE, bf16": True, "fine-tuning": False,
                   "RTE grid subset, base, bf16": False, "tiny": True, "mini": None}
    filed = json.loads((tmp_path / "out" / "gpu_record.json").read_text())
    assert filed == {"device": "NVIDIA H200", "date": filed["date"], "commit": "abc123", "figures": figures}
    assert f"cp {tmp_path / 'out'}/gpu_record.json benchmarks/results/gpu/{filed['date']}-nvidia-h200.json" in \
        capsys.readouterr().out
    # two calls (one call's budget covers part of the steps): the second's parts merged with the first's record
    first, second = tmp_path / "first", tmp_path / "second"
    for folder, names in ((first, ("pretrain-base-128", "recipe-speed", "finetune")),
                          (second, ("pretrain-base-512", "pretrain-tiny-128", "grid"))):
        (folder / "parts").mkdir(parents=True)
        for name in names:
            (folder / "parts" / f"{name}.json").write_text(json.dumps(parts[name]))
    summary.main(["--parts", str(first / "parts"), "--out", str(first), "--commit", "abc123", "--status", "finetune=ok"])
    joined = summary.main(["--parts", str(second / "parts"), "--out", str(second), "--merge",
                           str(first / "gpu_check.json"), "--status", "grid=ok"])
    assert joined["record"]["figures"] == figures and joined["record"]["commit"] == "abc123"
    assert joined["status"] == {"finetune": "ok", "grid": "ok"}
    with pytest.raises(SystemExit, match="one record measures one commit"):
        summary.main(["--parts", str(second / "parts"), "--out", str(second), "--merge", str(first / "gpu_check.json"),
                      "--commit", "def456"])
    (second / "parts" / "pretrain-base-512.json").write_text(json.dumps({**parts["pretrain-base-512"],
                                                                         "machine": {"gpu": "NVIDIA H100 80GB HBM3"}}))
    with pytest.raises(SystemExit, match="one record measures one GPU"):  # a second call that got another machine
        summary.main(["--parts", str(second / "parts"), "--out", str(second), "--merge", str(first / "gpu_check.json")])
    # a CPU run of one precision gives that precision's figures; no device, no commit: null, and nothing to file
    assert summary.in_precision({"fp32": 2.0}) == 2.0 and summary.in_precision({"fp32": 2.0, "bf16": 3.0}) == 3.0
    assert summary.record({}, "cuda", None) == {"device": None, "date": filed["date"], "commit": None,
                                                "figures": dict.fromkeys(figures)}


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


def test_objective_step_times_each_objective_on_the_recipes_cpu_path_and_it_learns_its_batch():
    import objective_step

    rows = objective_step.main(["--steps", "3", "--vocab_size", "300", "--batch_size", "4", "--seq_len", "16"])
    causal, masked = rows
    assert (causal["objective"], masked["objective"]) == ("causal", "mlm_nsp")
    assert causal["positions"] > 2 * masked["positions"] > 0  # every real token against about 15.6% of them
    for row in rows:
        assert row["seconds_a_step"] > 0 and len(row["losses"]) == 3
        assert row["losses"][-1] < row["losses"][0]  # the same batch three times: its loss falls
