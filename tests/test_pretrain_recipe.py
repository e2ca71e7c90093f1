"""The pre-training recipe: config validation, learning, exact resume, and a checkpoint that
fine-tunes; plus the embedded corpus and the demo task."""

import json
import math
from pathlib import Path

import pytest
import torch

from bert_suite.pretraining.config import PretrainConfigError, load_pretrain_config
from helpers import REPO, fresh_state, killed_and_resumed, load_recipe, recipe_args, write_rte_like

# -------------------------------------------------------------------------------------- config


def test_config_errors_name_the_key_and_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train_data: d\ntokenizer: t\nlearning_rte: 1e-4\n")
    with pytest.raises(PretrainConfigError, match=r"c.yaml: unknown key 'learning_rte'.*learning_rate"):
        load_pretrain_config(str(path))
    path.write_text("train_data: d\ntokenizer: t\nmax_steps: many\n")
    with pytest.raises(PretrainConfigError, match=r"c.yaml: max_steps must be int"):
        load_pretrain_config(str(path))
    with pytest.raises(PretrainConfigError, match="train_data_phase2"):
        load_pretrain_config(None, ["train_data=d", "tokenizer=t", "phase1_fraction=0.9"])
    with pytest.raises(PretrainConfigError, match="mask_ratio"):
        load_pretrain_config(None, ["train_data=d", "tokenizer=t", "phase1_fraction=1", "mask_ratio=0.9",
                                    "random_ratio=0.2"])
    with pytest.raises(PretrainConfigError, match="expected key=value"):
        load_pretrain_config(None, ["max_steps"])


def test_every_shipped_config_loads_and_overrides_are_typed():
    configs = sorted((REPO / "recipes" / "configs" / "pretrain").glob("*.yaml"))
    assert {c.stem for c in configs} >= {"tiny", "mini", "small", "medium", "base", "large", "table5-no-nsp",
                                         "table5-ltr-no-nsp", "table8-mask-100-0-0"}
    for config in configs:
        load_pretrain_config(str(config))
    base = load_pretrain_config(str(REPO / "recipes/configs/pretrain/base.yaml"), ["max_steps=10", "warmup_steps=1", "use_nsp=false"])
    assert base.max_steps == 10 and base.use_nsp is False and base.learning_rate == 1e-4
    assert base.phase1_steps == 9  # 90% at length 128
    mix = load_pretrain_config(str(REPO / "recipes/configs/pretrain/table8-mask-0-20-80.yaml"))
    assert (mix.mask_ratio, mix.random_ratio) == (0.0, 0.8)  # MASK 0, SAME 20, RND 80


# ------------------------------------------------------------------------------------- recipe


def test_recipe_learns_and_saves_a_checkpoint_that_fine_tunes(pretrain_setup, tmp_path):
    recipe = load_recipe()
    fresh_state()
    out = tmp_path / "run"
    history = recipe.main(["--config", str(REPO / "recipes/configs/pretrain/tiny.yaml"),
                           *recipe_args(pretrain_setup, out, "max_steps=60", "phase1_fraction=0.9", "save_steps=1000")])
    first, last = history[0], history[-1]
    assert last["step"] == 60 and last["phase"] == 2 and history[53]["phase"] == 1  # 54 steps at 32, 6 at 64
    assert last["mlm_loss"] < first["mlm_loss"] - 0.5  # the vocabulary is 13 tokens: ln 13 = 2.56 at the start
    assert last["eval_nsp_accuracy"] > 0.6 and "eval_mlm_perplexity" in last and last["tokens_per_second"] > 0
    # a document keeps to its topic's three words, so the model leaves the unigram plateau: it predicts
    # better than always the most frequent token at the same masked positions
    assert 0 < last["eval_frequent_token_accuracy"] < last["eval_mlm_accuracy"] - 0.1
    final = out / "final"
    assert (final / "model.safetensors").is_file() and (final / "tokenizer_config.json").is_file()
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[-1])["learning_rate"] == pytest.approx(0.0, abs=1e-9)

    # the checkpoint fine-tunes directly
    from bert_suite.cli import main as cli_main

    data = write_rte_like(tmp_path / "rte", n_train=300, n_dev=100)
    assert cli_main(["finetune", "rte", "--model", str(final), "--data_dir", str(data), "--output_dir",
                     str(tmp_path / "ft"), "--learning_rate", "1e-3", "--num_train_epochs", "3",
                     "--per_device_train_batch_size", "16", "--disable_tqdm", "true"]) == 0
    assert json.loads((tmp_path / "ft" / "all_results.json").read_text())["eval_accuracy"] > 0.85


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_recipe_learns_and_saves_eager_parameter_names(pretrain_setup, tmp_path, backend):
    """torch_compile=true compiles the encoder in place: it trains as the eager recipe does and its
    checkpoint has the eager model's tensor names (no `_orig_mod.` prefix), so it loads anywhere.
    aot_eager traces what inductor compiles, without its minute of code generation on 2 cores."""
    from safetensors import safe_open

    from bert_suite import BertSuiteForPreTraining

    recipe = load_recipe()
    fresh_state()
    torch._dynamo.reset()
    out = tmp_path / "compiled"
    history = recipe.main(recipe_args(pretrain_setup, out, "max_steps=30", "phase1_fraction=0.9", "save_steps=1000",
                                      "torch_compile=true", f"torch_compile_backend={backend}"))
    assert history[-1]["phase"] == 2 and history[-1]["mlm_loss"] < history[0]["mlm_loss"] - 0.3
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the encoder really was compiled
    with safe_open(out / "final" / "model.safetensors", "pt") as weights:
        assert not [k for k in weights.keys() if "_orig_mod" in k]
    BertSuiteForPreTraining.from_pretrained(out / "final")


def test_a_killed_run_resumes_exactly(pretrain_setup, tmp_path, monkeypatch):
    recipe = load_recipe()
    args = recipe_args(pretrain_setup, tmp_path / "whole", "max_steps=12", "phase1_fraction=0.75", "save_steps=4",
                       "eval_fraction=0")
    whole, resumed = killed_and_resumed(recipe, args, tmp_path / "whole", tmp_path / "killed", monkeypatch)
    assert sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir()) == ["step-4", "step-8"]
    assert [h["step"] for h in resumed] == [9, 10, 11, 12]
    for a, b in zip(whole[-4:], resumed, strict=True):
        assert a["mlm_loss"] == pytest.approx(b["mlm_loss"], rel=1e-6, abs=1e-7)
        assert a["nsp_loss"] == pytest.approx(b["nsp_loss"], rel=1e-6, abs=1e-7)
    fresh_state()
    # a completely different order would not match: the check above can fail
    other = recipe.main([a.replace(str(tmp_path / "whole"), str(tmp_path / "other")) for a in args] + ["seed=7"])
    assert other[-1]["mlm_loss"] != pytest.approx(whole[-1]["mlm_loss"], rel=1e-6)


def test_ltr_ablation_trains_a_left_to_right_lm():
    """Table 5 "LTR & No NSP": next-token targets at every real position, inputs left unmasked."""
    recipe = load_recipe()
    batch = {"input_ids": torch.tensor([[2, 7, 8, 9, 3], [2, 10, 3, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
             "token_type_ids": torch.zeros(2, 5, dtype=torch.long)}
    out = recipe.step_masks(None, batch, 42, 0, 0, causal=True)
    assert out["labels"].tolist() == [[7, 8, 9, 3, -100], [10, 3, -100, -100, -100]]
    assert torch.equal(out["input_ids"], batch["input_ids"])


def test_data_longer_than_the_models_positions_is_refused(pretrain_setup, tmp_path):
    recipe = load_recipe()
    fresh_state()
    with pytest.raises(SystemExit, match="exceeds the model's"):
        recipe.main(recipe_args(pretrain_setup, tmp_path / "r", "max_steps=2", "init_from=" + str(small_positions(tmp_path))))


def small_positions(tmp_path: Path) -> Path:
    from bert_suite import BertSuiteConfig, BertSuiteForPreTraining

    torch.manual_seed(0)
    model = BertSuiteForPreTraining(BertSuiteConfig.from_preset("tiny", vocab_size=13, max_position_embeddings=16))
    model.save_pretrained(tmp_path / "short")
    return tmp_path / "short"


# ------------------------------------------------------------------------ embedded corpus, demo


def test_embedded_corpus_reads_docstrings_without_importing_and_splits_stably(tmp_path):
    from bert_suite.pretraining.corpus import build_embedded_corpus, module_document, split_of

    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "boom.py").write_text('"""Explodes when imported. Never run it.\n\nThe docs say so twice."""\n'
                                  "raise SystemExit('imported!')\n")
    (root / "pkg" / "tools.py").write_text(
        '"""Tools for tests. They do useful things.\n\n>>> tools.run()\n42\n\n    indented_code(here)\n"""\n'
        'def run():\n    """Run the tool and return the answer. It is always the same."""\n')
    (root / "test" / "test_x.py").write_text('"""Tests are not documentation. They are skipped here."""\n')
    sentences = module_document(root / "pkg" / "tools.py")
    assert sentences == ["Tools for tests.", "They do useful things.", "Run the tool and return the answer.",
                         "It is always the same."]
    counts = build_embedded_corpus(tmp_path / "out", heldout_share=0.0, root=str(root))
    text = (tmp_path / "out" / "pretrain.txt").read_text()
    assert "Explodes when imported." in text and "Tests are not documentation" not in text and ">>>" not in text
    assert counts["pretrain_documents"] >= 2 and counts["heldout_documents"] == 0
    assert split_of("email.parser", 0.2) == split_of("email.parser", 0.2)  # stable across runs
    shares = [split_of(f"module{i}", 0.2) == "heldout" for i in range(2000)]
    assert 0.15 < sum(shares) / len(shares) < 0.25


def test_demo_task_keeps_documents_apart_and_corrupts_half(tmp_path):
    from bert_suite.adapters.classification import load_split
    from bert_suite.cards import load_card
    from bert_suite.demo import build_task

    docs = ["\n".join(f"doc{d} sentence number {s} says\tmany things." for s in range(8)) for d in range(40)]
    (tmp_path / "heldout.txt").write_text("\n\n".join(docs) + "\n")
    counts = build_task(tmp_path / "heldout.txt", tmp_path / "task", shares=(0.3, 0.55))
    card = load_card("doc-intact")
    train = load_split(card, "train", tmp_path / "task")
    dev = load_split(card, "validation", tmp_path / "task")
    # 320 sentences: train takes documents until 30% (12 docs), dev until 85% (22 docs), test the rest
    assert (len(train), len(dev), counts["test"]) == (counts["train"], counts["dev"], 48) == (96, 176, 48)
    assert 0.35 < sum(train["label"]) / len(train) < 0.65  # intact / corrupted about even
    intact = {f"doc{d} sentence number {s} says many things." for d in range(40) for s in range(8)}
    for sentence, label in zip(train["sentence"], train["label"], strict=True):
        if label == 0:
            assert sentence in intact
        else:  # two words replaced (a replacement may draw the same word, so at most two differ)
            original = min(intact, key=lambda o: sum(a != b for a, b in zip(o.split(), sentence.split(), strict=True)))
            assert 0 < sum(a != b for a, b in zip(original.split(), sentence.split(), strict=True)) <= 2
    docs_of = lambda split: {s.split()[0] for s, label in zip(split["sentence"], split["label"], strict=True) if label == 0}  # noqa: E731
    assert not docs_of(train) & docs_of(dev)


@pytest.mark.slow
def test_demo_runs_end_to_end_and_prints_the_same_table_twice(tmp_path):
    """`make demo` in small, twice (two minutes; make test-all): every step runs, the results name both
    models per seed, and the second run's table is the first's, digit for digit."""
    from bert_suite.demo import run_demo

    small = {"max_steps": 10, "seeds": [1, 2], "max_train_samples": 200}
    table = run_demo(str(tmp_path / "demo"), **small)
    results = json.loads((tmp_path / "demo" / "demo_results.json").read_text())
    assert set(results["dev_accuracy"]) == {"pre-trained", "random init"} and "| pre-trained |" in table
    assert results["seeds"] == [1, 2] and all(len(v) == 2 for v in results["per_seed"].values())
    assert results["dev_accuracy"]["pre-trained"] == pytest.approx(sum(results["per_seed"]["pre-trained"]) / 2)
    assert (tmp_path / "demo" / "pretraining_curves.png").read_bytes()[:4] == b"\x89PNG"
    # one precision for both stages, said in the table and recorded (conftest: BERT_SUITE_PRECISION=fp32)
    assert results["precision"] == "fp32" and results["precision_reason"] == "BERT_SUITE_PRECISION=fp32"
    assert results["pretraining"]["precision"] == "fp32" and "Precision (pre-training and fine-tuning): fp32" in table
    assert set(results["instances"]) == {"64", "128"} and 0 < results["instances"]["64"]["not_next_share"] < 1
    again = run_demo(str(tmp_path / "again"), **small)
    assert again.replace(str(tmp_path / "again"), "OUT") == table.replace(str(tmp_path / "demo"), "OUT")
    assert (tmp_path / "again" / "tokenizer" / "vocab.txt").read_bytes() == \
        (tmp_path / "demo" / "tokenizer" / "vocab.txt").read_bytes()


def test_paired_difference_and_its_standard_error_match_hand_computed_numbers():
    from bert_suite.report import paired_difference

    # differences 0.08, 0.03, 0.08: mean 0.19/3; deviations 1/60, -2/60, 1/60 -> variance 6/3600/2
    mean, se = paired_difference([0.70, 0.66, 0.68], [0.62, 0.63, 0.60])
    assert mean == pytest.approx(0.19 / 3) and se == pytest.approx(math.sqrt(6 / 3600 / 2 / 3))
    assert paired_difference([0.5, 0.6], [0.5, 0.6]) == (0.0, 0.0)
    with pytest.raises(ValueError, match="two or more"):
        paired_difference([0.7], [0.6])
    with pytest.raises(ValueError, match="got 3 and 2"):
        paired_difference([0.7, 0.6, 0.5], [0.6, 0.5])


def test_demo_verdict_does_not_call_noise_a_win():
    from bert_suite.demo import verdict

    line = verdict([0.70, 0.68, 0.69], [0.62, 0.61, 0.61], 2345)  # +7.7 ± 0.3: the interval above zero
    assert line == ("Pre-trained beats random initialisation: +7.7 points (mean paired difference over 3 seeds), "
                    "standard error 0.3, 95% interval [+6.2, +9.1] (dev set of 2,345 sentences).")
    # +6.3 with SE 1.7: beyond 2 SE, but with 3 seeds t is 4.3, so its interval [-1.0, +13.6] holds zero
    assert verdict([0.70, 0.66, 0.68], [0.62, 0.63, 0.60], 2345).startswith("Pre-trained does not clearly beat")
    assert verdict([0.48, 0.50, 0.49], [0.50, 0.51, 0.49], 2345).startswith("Pre-trained does not beat")


def test_a_models_setting_is_chosen_by_its_mean_over_seeds():
    from bert_suite.report import choose_setting, seed_scores

    def record(trial, lr, seed, accuracy, state="complete"):
        return {"trial": trial, "learning_rate": lr, "per_device_train_batch_size": 32, "num_train_epochs": 3,
                "seed": seed, "state": state, "metrics": {"eval_accuracy": accuracy} if state == "complete" else {}}

    records = [record(0, 3e-4, 2, 0.60), record(1, 3e-4, 1, 0.80), record(2, 3e-4, 3, 0.58),  # best run, mean 0.66
               record(3, 1e-4, 1, 0.70), record(4, 1e-4, 2, 0.69), record(5, 1e-4, 3, 0.68),  # mean 0.69
               record(6, 5e-5, 1, 0.90), record(7, 5e-5, 2, 0.0, state="failed"), record(8, 5e-5, 3, 0.90)]
    scores = seed_scores(records, "eval_accuracy")
    assert scores[(3e-4, 32, 3)] == {1: 0.80, 2: 0.60, 3: 0.58} and scores[(5e-5, 32, 3)] == {1: 0.90, 3: 0.90}
    assert choose_setting(scores, [1, 2, 3]) == (1e-4, 32, 3)  # a setting with a failed seed does not compete
    assert choose_setting(scores, [1, 3]) == (5e-5, 32, 3)
    assert choose_setting(scores, [1, 2, 3, 4]) is None


def test_evaluation_follows_eval_steps_whatever_the_logging_steps(pretrain_setup, tmp_path):
    recipe = load_recipe()
    fresh_state()
    history = recipe.main(recipe_args(pretrain_setup, tmp_path / "run", "max_steps=7", "phase1_fraction=1",
                                      "logging_steps=4", "eval_steps=3", "save_steps=1000"))
    assert [h["step"] for h in history] == [3, 4, 6, 7]  # a line per logging step and per evaluation
    assert [h["step"] for h in history if "eval_mlm_perplexity" in h] == [3, 6, 7]


def test_the_demo_help_states_the_demos_pre_training_steps():
    from bert_suite.demo import PRETRAIN_STEPS

    help_text = (REPO / "src" / "bert_suite_cli" / "__init__.py").read_text()
    assert f'help="pre-training steps (default: {PRETRAIN_STEPS})"' in help_text
