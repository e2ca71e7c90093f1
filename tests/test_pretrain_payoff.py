"""benchmarks/pretrain_payoff.py's code on data the tests write (the long run itself is a benchmark): grid
results read per setting and seed, the setting chosen by its mean over seeds (not by its best trial),
standard errors against hand-computed numbers, the record's exact shape, the summary, the recipe
overrides and the token count."""

import json
import math
import sys
from pathlib import Path

import pytest

from bert_suite.pretraining.config import PretrainConfig, load_pretrain_config
from bert_suite.report import write_grid_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import pretrain_payoff as payoff  # noqa: E402

SEEDS = [1, 2, 3]


def trial_records(scores: dict, column="eval_accuracy", beside=None) -> list[dict]:
    """Grid trial records ({(lr, batch, epochs): [score per seed or None for a failed trial]}), as the grid
    keeps them; `beside` adds a second metric (MRPC's F1) = score - 0.1."""
    records = []
    for (lr, batch, epochs), values in scores.items():
        for seed, value in zip(SEEDS, values, strict=True):
            failed = value is None
            metrics = {} if failed else {column: value, "eval_loss": 0.5, **({beside: value - 0.1} if beside else {})}
            records.append({"trial": len(records), "learning_rate": lr, "per_device_train_batch_size": batch,
                            "num_train_epochs": epochs, "seed": seed, "state": "failed" if failed else "complete",
                            "error": "FloatingPointError: non-finite result" if failed else None, "metrics": metrics})
    return records


def grid_csv(folder: Path, scores: dict, column="eval_accuracy", beside=None) -> Path:
    """grid_results.csv written by the grid's own report writer."""
    write_grid_report(trial_records(scores, column, beside), column, folder, task="t")
    return folder / "grid_results.csv"


# Setting (1e-4, 32, 3) holds the best single trial (0.90) but the lower mean (0.70); (3e-4, 32, 3) the best
# mean (0.75); (1e-3, 32, 3) an even better mean on two seeds, but its third seed failed.
DISAGREE = {(1e-4, 32, 3.0): [0.90, 0.60, 0.60], (3e-4, 32, 3.0): [0.75, 0.74, 0.76],
            (1e-3, 32, 3.0): [0.95, 0.95, None]}


def test_reads_the_grid_results_per_setting_and_seed_leaving_failed_trials_out(tmp_path):
    scores = payoff.read_grid_scores(grid_csv(tmp_path, DISAGREE), "eval_accuracy")
    assert scores == {(1e-4, 32, 3.0): {1: 0.90, 2: 0.60, 3: 0.60}, (3e-4, 32, 3.0): {1: 0.75, 2: 0.74, 3: 0.76},
                      (1e-3, 32, 3.0): {1: 0.95, 2: 0.95}}
    with pytest.raises(ValueError, match=r"grid_results.csv: no column 'eval_f1'; expected a grid whose trials"):
        payoff.read_grid_scores(tmp_path / "grid_results.csv", "eval_f1")


def test_a_grid_with_no_complete_trial_is_an_error_naming_the_file(tmp_path):
    path = grid_csv(tmp_path, {(1e-4, 32, 3.0): [None, None, None]})
    with pytest.raises(ValueError, match=r"grid_results.csv: no complete trial \(3 rows\)"):
        payoff.read_grid_scores(path, "eval_accuracy")


def test_the_setting_is_chosen_by_its_mean_over_seeds_not_its_best_trial(tmp_path):
    scores = payoff.read_grid_scores(grid_csv(tmp_path, DISAGREE), "eval_accuracy")
    assert payoff.choose_setting(scores, SEEDS) == (3e-4, 32, 3.0)
    # ties go to the first setting in grid order; no setting with every seed: None
    assert payoff.choose_setting({(1, 1, 1.0): {1: 0.5, 2: 0.5}, (2, 1, 1.0): {1: 0.4, 2: 0.6}}, [1, 2]) == (1, 1, 1.0)
    assert payoff.choose_setting({(1, 1, 1.0): {1: 0.5}}, [1, 2]) is None


def test_standard_errors_against_hand_computed_numbers():
    mean, se = payoff.mean_se([0.80, 0.82, 0.84])  # sample std 0.02
    assert mean == pytest.approx(0.82) and se == pytest.approx(0.02 / math.sqrt(3))
    assert payoff.mean_se([0.7]) == (0.7, None)
    # paired by seed: differences 0.10, 0.11, 0.09 -> mean 0.10, sample std 0.01, se 0.01 / sqrt(3)
    d = payoff.difference([0.80, 0.82, 0.84], [0.70, 0.71, 0.75])
    assert d["difference"] == pytest.approx(0.10) and d["difference_se"] == pytest.approx(0.01 / math.sqrt(3))
    assert d["beyond_2se"] is True
    # differences 0.05, 0.12, -0.02 -> mean 0.05, deviations 0, 0.07, -0.07 -> std 0.07, se 0.040415 > 0.05 / 2
    d = payoff.difference([0.80, 0.90, 0.70], [0.75, 0.78, 0.72])
    assert d["difference"] == pytest.approx(0.05) and d["difference_se"] == pytest.approx(0.07 / math.sqrt(3))
    assert d["beyond_2se"] is False
    # the unpaired formula would call the first pair's gap far noisier: sqrt(0.0004/3 + 0.0007/3) = 0.0191
    assert math.sqrt(0.0004 / 3 + 0.0007 / 3) > 3 * payoff.difference([0.80, 0.82, 0.84], [0.70, 0.71, 0.75])["difference_se"]
    with pytest.raises(ValueError, match="one per seed on both sides: got 3 and 2"):
        payoff.difference([0.80, 0.82, 0.84], [0.70, 0.80])
    assert payoff.difference([0.8], [0.7]) == {"difference": pytest.approx(0.1), "difference_se": None,
                                               "beyond_2se": False}


def compared(grids: dict[str, dict]) -> dict:
    """`bert-suite compare`'s entries for one task ({model: {"setting", "scores" 0-100, ...}}) from grid scores,
    as compare.build_result makes them (each model's setting chosen by its mean over the seeds)."""
    from bert_suite.compare import Model, Task, build_result

    models = {name: Model(name, name, name, False, False) for name in grids}
    task = Task("t", type("Card", (), {"name": "t"})(), None, "accuracy", None)
    return build_result("random", SEEDS, models, {"t": task}, {"t": grids})["tasks"]["t"]["models"]


def test_a_task_entry_holds_each_models_scores_at_its_own_chosen_setting(tmp_path):
    pretrained = payoff.read_grid_scores(grid_csv(tmp_path / "p", DISAGREE, beside="eval_f1"), "eval_accuracy")
    f1 = payoff.read_grid_scores(tmp_path / "p" / "grid_results.csv", "eval_f1")
    random_ = {(1e-4, 32, 3.0): {1: 0.70, 2: 0.71, 3: 0.69}, (3e-4, 32, 3.0): {1: 0.60, 2: 0.80, 3: 0.50}}
    entry = payoff.task_entry("mrpc", compared({"pretrained": pretrained, "random": random_}), SEEDS,
                              beside={"pretrained": f1, "random": {k: {s: v - 0.1 for s, v in d.items()}
                                                                   for k, d in random_.items()}})
    assert entry["metric"] == "accuracy"
    assert entry["pretrained"] == pytest.approx([0.75, 0.74, 0.76]) and entry["random"] == pytest.approx([0.70, 0.71, 0.69])
    assert entry["chosen"] == {"pretrained": {"learning_rate": 3e-4, "batch_size": 32, "epochs": 3.0},
                               "random": {"learning_rate": 1e-4, "batch_size": 32, "epochs": 3.0}}
    assert entry["f1"]["pretrained"] == pytest.approx([0.65, 0.64, 0.66])
    # paired: differences 0.05, 0.03, 0.07 -> se 0.02 / sqrt(3) = 0.011547
    assert entry["difference"] == pytest.approx(0.05) and entry["difference_se"] == pytest.approx(0.02 / math.sqrt(3))
    assert entry["beyond_2se"] is True


def valid_record() -> dict:
    pretraining = {"device": "cpu (2 cores)", "minutes": 59.5, "model_size": "tiny", "vocab_size": 8192, "steps": 4000,
                   "tokens": 31_000_000, "corpus": "gutenberg + wikitext", "held_out_mlm_perplexity": 120.5,
                   "held_out_nsp_accuracy": 0.93, "held_out_mlm_accuracy": 0.26, "frequent_token_accuracy": 0.06,
                   "precision": "fp32", "decontamination": {"ngram": 8, "sentences": 250_000, "sentences_removed": 812}}
    tasks = {"sst2": {"metric": "accuracy", "pretrained": [0.8, 0.81, 0.82], "random": [0.7, 0.72, 0.71]},
             "stsb": {"metric": "spearman", "pretrained": [0.3, 0.32, 0.31], "random": [0.1, 0.12, 0.11]}}
    curve = {"sst2": {"500": {"metric": "accuracy", "pretrained": [0.6, 0.62, 0.61], "random": [0.55, 0.56, 0.57]},
                      "1000": {"pretrained": [0.65, 0.66, 0.64], "random": [0.58, 0.57, 0.59]}}}
    return payoff.build_record("python benchmarks/pretrain_payoff.py --steps 4000", pretraining,
                               {"learning_rates": [1e-4]}, tasks, curve)


def test_the_record_has_exactly_the_issues_shape():
    record = json.loads(json.dumps(valid_record()))  # as read back from payoff.json
    assert list(record) == ["command", "pretraining", "grid", "tasks", "curve"]
    assert list(record["pretraining"]) == list(payoff.PRETRAINING_KEYS)
    assert {"held_out_mlm_accuracy", "frequent_token_accuracy", "precision", "decontamination"} <= set(record["pretraining"])
    assert record["pretraining"]["decontamination"] == {"ngram": 8, "sentences": 250_000, "sentences_removed": 812}
    assert list(record["curve"]["sst2"]) == ["500", "1000"]
    assert record["curve"]["sst2"]["1000"] == {"pretrained": [0.65, 0.66, 0.64], "random": [0.58, 0.57, 0.59]}
    assert payoff.check_record(record) is record


@pytest.mark.parametrize("change, message", [
    (lambda r: r["pretraining"].pop("steps"), "payoff.json: pretraining.steps: missing key"),
    (lambda r: r.pop("grid"), "payoff.json: grid: missing key"),
    (lambda r: r["tasks"]["sst2"].pop("random"), "payoff.json: tasks.sst2.random: missing key"),
    (lambda r: r.update(notes="x"), "payoff.json: notes: unexpected key"),
    (lambda r: r["pretraining"].update(wall=1.0), "payoff.json: pretraining.wall: unexpected key"),
    (lambda r: r["pretraining"].update(tokens=3.1e7), "payoff.json: pretraining.tokens: expected int"),
    (lambda r: r["pretraining"].update(held_out_nsp_accuracy=float("nan")),
     "payoff.json: pretraining.held_out_nsp_accuracy: expected a finite number"),
    (lambda r: r["tasks"]["stsb"].update(metric="spearmanr"), "payoff.json: tasks.stsb.metric: expected 'spearman'"),
    (lambda r: r["tasks"].update(qnli=r["tasks"]["sst2"]), "payoff.json: tasks.qnli: unknown task"),
    (lambda r: r["tasks"]["sst2"].update(pretrained=[]), "payoff.json: tasks.sst2.pretrained: expected a non-empty"),
    (lambda r: r["tasks"]["sst2"].update(random=[0.7]), "payoff.json: tasks.sst2: pretrained and random have"),
    (lambda r: r.pop("curve"), "payoff.json: curve: missing key"),
    (lambda r: r["pretraining"].pop("frequent_token_accuracy"),
     "payoff.json: pretraining.frequent_token_accuracy: missing key"),
    (lambda r: r["pretraining"].update(precision=None), "payoff.json: pretraining.precision: expected str"),
    (lambda r: r["pretraining"]["decontamination"].pop("ngram"),
     "payoff.json: pretraining.decontamination: expected exactly the keys ngram, sentences, sentences_removed"),
    (lambda r: r["pretraining"]["decontamination"].update(sentences_removed=-1),
     "payoff.json: pretraining.decontamination.sentences_removed: expected a count"),
    (lambda r: r["curve"]["sst2"].update({"1k": r["curve"]["sst2"]["500"]}),
     "payoff.json: curve.sst2.1k: expected a label count"),
    (lambda r: r["curve"]["sst2"]["500"].update(random=[0.5]), "payoff.json: curve.sst2.500: pretrained and random"),
    (lambda r: r["curve"]["sst2"]["1000"].pop("pretrained"), "payoff.json: curve.sst2.1000.pretrained: missing key"),
    (lambda r: r["curve"].update(qnli={}), "payoff.json: curve.qnli: unknown task"),
])
def test_the_shape_check_rejects_a_broken_record(change, message):
    record = valid_record()
    change(record)
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.").replace("(", r"\(")):
        payoff.check_record(record)


def test_build_record_makes_float_fields_floats_and_keeps_extra_task_keys():
    record = valid_record()
    record["pretraining"]["minutes"] = 60
    record["tasks"]["sst2"]["chosen"] = {"pretrained": {}}
    rebuilt = payoff.build_record(record["command"], record["pretraining"], record["grid"], record["tasks"],
                                  record["curve"])
    assert isinstance(rebuilt["pretraining"]["minutes"], float) and "chosen" in rebuilt["tasks"]["sst2"]


def test_the_summary_states_the_protocol_and_a_table_per_task(tmp_path):
    pretrained = payoff.read_grid_scores(grid_csv(tmp_path, DISAGREE, beside="eval_f1"), "eval_accuracy")
    f1 = payoff.read_grid_scores(tmp_path / "grid_results.csv", "eval_f1")
    random_ = {(1e-4, 32, 3.0): {1: 0.74, 2: 0.76, 3: 0.60}}
    tasks = {"mrpc": payoff.task_entry("mrpc", compared({"pretrained": pretrained, "random": random_}), SEEDS,
                                       beside={"pretrained": f1, "random": random_})}
    record = payoff.build_record("cmd", valid_record()["pretraining"], {"seeds": SEEDS}, tasks)
    text = payoff.summary_markdown(record, "Payoff", ["SST-2: the first 20,000 sentences."])
    assert "the setting with the best mean dev score over the seeds is chosen (not the best single trial)" in text
    assert "the mean of the per-seed differences, with standard error sd(differences) / sqrt(n)" in text
    assert "- SST-2: the first 20,000 sentences." in text
    assert "tiny, vocabulary 8,192, 4,000 steps, 31,000,000 tokens, 59.5 minutes on cpu (2 cores)" in text
    assert "| model | chosen setting | per-seed accuracy | mean ± SE | f1 at that setting (mean) |" in text
    assert "| pre-trained | lr 0.0003, batch 32, epochs 3 | 75.00, 74.00, 76.00 | 75.00 ± 0.58 | 65.00 |" in text
    assert "| random init | lr 0.0001, batch 32, epochs 3 | 74.00, 76.00, 60.00 | 70.00 ± 5.03 | 70.00 |" in text
    # per-seed differences 0.01, -0.02, 0.16: std 0.096437, se 0.055678
    assert "pre-trained - random init: 5.00 ± 5.57: **not beyond 2 SE**" in text
    assert text.rstrip().endswith("Pre-trained ahead of random init by more than 2 SE on 0 of 1 tasks.")
    tapt = payoff.summary_markdown(record, "TAPT", names={"pretrained": "task-adaptive"})
    assert "| task-adaptive | lr 0.0003" in tapt and "Task-adaptive ahead of random init" in tapt


def test_the_summary_gives_the_learning_curve_per_label_count_in_numeric_order():
    entry = lambda p, r: {"metric": "accuracy", "seeds": SEEDS, "pretrained": p, "random": r,  # noqa: E731
                          "chosen": {"pretrained": {"learning_rate": 1e-3, "batch_size": 32, "epochs": 3.0},
                                     "random": {"learning_rate": 3e-4, "batch_size": 32, "epochs": 3.0}}}
    curve = {"sst2": {"1000": entry([0.72, 0.74, 0.73], [0.65, 0.66, 0.64]),
                      "500": entry([0.70, 0.70, 0.68], [0.56, 0.70, 0.69]),
                      "2000": {"pretrained": [0.75, 0.76, 0.80], "random": [0.74, 0.74, 0.74]}}}
    del curve["sst2"]["1000"]["metric"]  # an entry without the key: the others' metric names the table
    base = valid_record()
    record = payoff.build_record("cmd", base["pretraining"], {"seeds": SEEDS}, base["tasks"], curve)
    text = payoff.summary_markdown(record, "Payoff")
    lines = text.splitlines()
    start = lines.index("## sst2 learning curve (accuracy, first N training examples, the same for both models)")
    # 1000: differences .07 .08 .09 -> 8.00 ± 0.58; 500: .14 .00 -.01 -> mean 4.33, sd 8.39, se 4.84
    assert lines[start + 4] == ("| 500 | 69.33 ± 0.67 | lr 0.001 | 65.00 ± 4.51 | lr 0.0003 | 4.33 ± 4.84 | "
                                "not beyond 2 SE |")
    assert lines[start + 2] == ("| labels | pre-trained | setting | random init | setting | difference ± SE | "
                                "verdict |")
    assert lines[start + 5] == ("| 1,000 | 73.00 ± 0.58 | lr 0.001 | 65.00 ± 0.58 | lr 0.0003 | 8.00 ± 0.58 | "
                                "ahead by more than 2 SE |")
    # 2000: differences .01 .02 .06 -> mean 3.00, sd 2.65, se 1.53: 1.96 SE, just short of 2
    assert lines[start + 6] == "| 2,000 | 77.00 ± 1.53 |  | 74.00 ± 0.00 |  | 3.00 ± 1.53 | not beyond 2 SE |"
    assert len(lines) == start + 7


def test_recipe_overrides_pass_dropout_only_when_given_and_the_recipe_config_accepts_them(tmp_path):
    data = {128: tmp_path / "data128", 512: tmp_path / "data512"}
    args = payoff.parse_args(["--masking_rate", "0.2", "--batch_size", "32"])
    overrides = payoff.recipe_overrides(args, data, tmp_path / "vocab", tmp_path / "out", 1000, 1e-3)
    assert not any("dropout" in o for o in overrides)
    assert len({o.split("=")[0] for o in overrides}) == len(overrides)
    cfg = load_pretrain_config(None, overrides)
    assert (cfg.max_steps, cfg.warmup_steps, cfg.mlm_probability, cfg.max_predictions_per_seq) == (1000, 60, 0.2, 26)
    assert (cfg.phase1_fraction, cfg.train_data_phase2, cfg.resume_from_checkpoint) == (1.0, None, "auto")

    args = payoff.parse_args(["--pretrain_dropout", "0", "--phase2", "--pretrain_override", "whole_word_mask=true"])
    overrides = payoff.recipe_overrides(args, data, tmp_path / "vocab", tmp_path / "out", 100, 1e-3,
                                        init_from=tmp_path / "general", eval_batches=1)
    assert {"hidden_dropout_prob=0.0", "attention_probs_dropout_prob=0.0", "whole_word_mask=true",
            f"init_from={tmp_path / 'general'}", f"train_data_phase2={data[512]}", "phase1_fraction=0.9",
            "per_device_train_batch_size_phase2=16", "eval_batches=1"} <= set(overrides)
    assert "eval_batches=20" not in overrides
    if "hidden_dropout_prob" in PretrainConfig.__dataclass_fields__:  # the recipe's dropout keys have landed
        assert load_pretrain_config(None, overrides).hidden_dropout_prob == 0.0


def test_tokens_are_steps_times_batch_times_mean_length_per_phase_and_eval_is_the_last(tmp_path):
    for name, mean, share in (("data128", 100.0, 0.6), ("data512", 400.0, 0.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "pretrain_data_stats.json").write_text(json.dumps({"mean_instance_length": mean,
                                                                               "not_next_share": share}))
    run = tmp_path / "pretrain"
    run.mkdir()
    logs = [{"step": 50, "mlm_loss": 5.0},
            {"step": 100, "eval_mlm_perplexity": 300.0, "eval_nsp_accuracy": 0.8, "eval_mlm_accuracy": 0.1,
             "eval_frequent_token_accuracy": 0.05},
            {"step": 150, "eval_mlm_perplexity": 200.0, "eval_nsp_accuracy": 0.9, "eval_mlm_accuracy": 0.22,
             "eval_frequent_token_accuracy": 0.06}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in logs))
    (run / "pretrain_results.json").write_text(json.dumps({"step": 150, "precision": "bf16"}))
    args = payoff.parse_args(["--phase2", "--batch_size", "64"])
    phases = payoff.phase_steps(args, 150)
    assert phases == [(135, 64), (15, 16)]
    counts = {"ngram": 8, "sentences": 10, "sentences_removed": 1}
    facts = payoff.pretraining_facts(args, run, [tmp_path / "data128", tmp_path / "data512"], phases, 8192, "c",
                                     12.345, "cpu (2 cores)", counts)
    assert facts["tokens"] == 135 * 64 * 100 + 15 * 16 * 400 and facts["steps"] == 150
    assert (facts["held_out_mlm_perplexity"], facts["held_out_nsp_accuracy"], facts["minutes"]) == (200.0, 0.9, 12.35)
    assert (facts["held_out_mlm_accuracy"], facts["frequent_token_accuracy"]) == (0.22, 0.06)
    assert facts["precision"] == "bf16" and facts["decontamination"] == counts
    assert facts["not_next_share"] == pytest.approx((135 * 0.6 + 15 * 0.5) / 150)  # the instances it trained on


def test_the_plateau_is_left_at_the_first_evaluation_above_the_threshold(tmp_path):
    logs = [{"step": s, "eval_mlm_accuracy": a, "eval_frequent_token_accuracy": 0.06}
            for s, a in ((500, 0.12), (1000, 0.155), (1500, 0.21), (2000, 0.19), (2500, 0.27))]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(x) + "\n" for x in [{"step": 10, "mlm_loss": 7.0}, *logs]))
    standing = payoff.plateau(metrics, 0.20)
    assert standing == {"left_at_step": 1500, "threshold": 0.20, "step": 2500, "mlm_accuracy": 0.27,
                        "best_mlm_accuracy": 0.27, "frequent_token_accuracy": 0.06}
    assert payoff.plateau_line(standing).startswith("left the plateau at step 1,500 (held-out MLM accuracy >= 20%)")
    stuck = payoff.plateau(metrics, 0.30)
    assert stuck["left_at_step"] is None
    assert "did NOT leave the plateau (held-out MLM accuracy below 30% throughout; best 27.0%)" in \
        payoff.plateau_line(stuck)
    assert payoff.plot_plateau(metrics, 0.2, tmp_path / "plateau.png").read_bytes()[:4] == b"\x89PNG"


def test_a_label_count_above_the_train_size_is_an_error_naming_both_numbers():
    payoff.check_label_counts([500, 67349], "sst2", 67349)
    with pytest.raises(SystemExit, match=r"--label_counts 80000: above sst2's train size \(67,349 examples\)"):
        payoff.check_label_counts([500, 80000], "sst2", 67349)
    with pytest.raises(SystemExit, match="--label_counts 0: expected a positive number"):
        payoff.check_label_counts([0], "sst2", 67349)


def test_the_label_count_check_reads_the_train_split_as_the_grid_does(tmp_path):
    folder = tmp_path / "glue" / "SST-2"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"film {i} was fine\t{i % 2}\n" for i in range(7)))
    (tmp_path / "corpus").mkdir()
    with pytest.raises(SystemExit, match=r"--label_counts 8: above sst2's train size \(7 examples\)"):
        payoff.main(["--data", str(tmp_path), "--output_dir", str(tmp_path / "out"), "--label_counts", "5", "8"])
    assert not (tmp_path / "out").exists()  # refused before any work


def test_the_learning_curve_plot_has_a_point_per_label_count(tmp_path):
    curve = valid_record()["curve"]["sst2"]
    assert payoff.plot_curve(curve, "sst2", "accuracy", tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"


def test_without_the_shared_data_it_skips_cleanly(tmp_path, capsys):
    assert payoff.main(["--data", str(tmp_path / "nowhere"), "--output_dir", str(tmp_path / "out")]) is None
    assert f"no GLUE folders or corpus under {tmp_path / 'nowhere'}: skipping" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


def test_a_minute_budget_is_planned_from_the_calibration_with_its_time_and_the_start_up_in_it(tmp_path, capsys):
    out = tmp_path / "calibration"
    out.mkdir()
    (out / "calibration.json").write_text(json.dumps({"seconds_per_step": {"1": 0.5, "2": 1.0},
                                                      "wall_seconds": 30.0, "steps": 20}))
    args = payoff.parse_args(["--phase2"])  # 10% of the steps in phase 2
    data = {128: tmp_path / "data128", 512: tmp_path / "data512"}
    with pytest.raises(SystemExit, match="the calibration stage has outputs but no record of its settings"):
        payoff.calibrate(args, data, tmp_path / "tok", out)
    overrides = payoff.recipe_overrides(args, data, tmp_path / "tok", out / "run", 40, args.learning_rate,
                                        logging_steps=10, eval_steps=40, save_steps=40, eval_batches=1,
                                        resume_from_checkpoint="null", phase1_fraction=0.5)
    payoff.check_stage(tmp_path, "calibration", {"overrides": overrides}, started=False)  # as the run recorded it
    per_step, wall, overhead = payoff.calibrate(args, data, tmp_path / "tok", out)  # read back, nothing run
    # 0.9 x 0.5 + 0.1 x 1.0; the 20 steps ran half in each phase: 30 - 20 x 0.75 = 15 s around them
    assert (per_step, wall, overhead) == (pytest.approx(0.55), 30.0, pytest.approx(15.0))
    assert "0.500 s a phase-1 step, 1.000 s a phase-2 step; 15 s start-up" in capsys.readouterr().out
    assert payoff.planned_steps(60, 0.55, 30.0, 15.0, 0.95) == int((3600 - 45) * 0.95 / 0.55) == 6140
    assert payoff.planned_steps(0.5, 0.55, 30.0, 15.0, 0.95) == 1  # nothing left: one step, not zero


def test_a_checkpoint_pretrained_without_dropout_fine_tunes_with_the_presets_dropout(tmp_path):
    final = tmp_path / "final"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"weights")
    (final / "config.json").write_text(json.dumps({"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}))
    assert payoff.fine_tuning_checkpoint(final, "tiny") == final  # the preset's dropout: used as it is
    (final / "config.json").write_text(json.dumps({"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
                                                   "hidden_size": 128}))
    twin = payoff.fine_tuning_checkpoint(final, "tiny")
    assert twin == tmp_path / "final-finetune" and (twin / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((twin / "config.json").read_text()) == {"hidden_dropout_prob": 0.1,
                                                              "attention_probs_dropout_prob": 0.1, "hidden_size": 128}


def test_an_output_dir_made_from_another_corpus_is_refused_not_reused(tmp_path):
    (tmp_path / "glue" / "STS-B").mkdir(parents=True)
    (tmp_path / "glue" / "STS-B" / "dev.tsv").write_text("x\n")
    out = tmp_path / "out"
    (out / "corpus" / "clean").mkdir(parents=True)
    report = out / "corpus" / "clean" / "decontamination.json"
    report.write_text(json.dumps({"ngram": 8, "sentences": 10, "sentences_removed": 1}))
    args = payoff.parse_args(["--data", str(tmp_path), "--no_task_text"])
    with pytest.raises(SystemExit, match=r"the corpus stage has outputs but no record of its settings"):
        payoff.clean_corpus(args, out, ["a.txt"], ["stsb"])  # made by hand or an older version: not trusted
    wanted = {"input": ["a.txt"], "against": [str(tmp_path / "glue" / "STS-B" / "dev.tsv")], "ngram": 8}
    (out / "stages").mkdir()
    (out / "stages" / "corpus.json").write_text(json.dumps(wanted))
    # a corpus made before the task texts were read as one document per example (issue 27's) is not reused
    with pytest.raises(SystemExit, match=r"the corpus stage was made with other settings \(task_text_format; "):
        payoff.clean_corpus(args, out, ["a.txt"], ["stsb"])
    (out / "stages" / "corpus.json").write_text(json.dumps({**wanted, "task_text_format": "lines"}))
    files, counts = payoff.clean_corpus(args, out, ["a.txt"], ["stsb"])  # the same inputs: reused, nothing run
    assert files == [out / "corpus" / "clean" / "a.txt"] and counts == {"ngram": 8, "sentences": 10,
                                                                        "sentences_removed": 1}
    args = payoff.parse_args(["--data", str(tmp_path), "--no_task_text", "--ngram", "13"])
    with pytest.raises(SystemExit, match=r"the corpus stage was made with other settings \(ngram; see "):
        payoff.clean_corpus(args, out, ["a.txt"], ["stsb"])


def test_a_stage_records_its_settings_before_it_runs_and_refuses_others(tmp_path):
    payoff.check_stage(tmp_path, "data64", {"dupe_factor": 5, "tokenizer": tmp_path / "tok"}, started=False)
    assert json.loads((tmp_path / "stages" / "data64.json").read_text()) == {"dupe_factor": 5,
                                                                              "tokenizer": str(tmp_path / "tok")}
    payoff.check_stage(tmp_path, "data64", {"dupe_factor": 5, "tokenizer": tmp_path / "tok"}, started=True)
    with pytest.raises(SystemExit, match=r"the data64 stage was made with other settings \(dupe_factor; "):
        payoff.check_stage(tmp_path, "data64", {"dupe_factor": 10, "tokenizer": tmp_path / "tok"}, started=True)
    # a killed run resumed with another learning rate would continue the first run's schedule: refused too
    overrides = ["learning_rate=0.002", "max_steps=100"]
    payoff.check_stage(tmp_path, "pretrain", {"overrides": overrides}, started=False)
    with pytest.raises(SystemExit, match=r"the pretrain stage was made with other settings \(overrides; "):
        payoff.check_stage(tmp_path, "pretrain", {"overrides": ["learning_rate=0.001", "max_steps=100"]}, started=True)


def test_pretraining_facts_are_checked_before_the_grids_and_nsp_may_be_absent():
    pre = dict(valid_record()["pretraining"], held_out_nsp_accuracy=None)  # pre-trained without NSP

    def bad(where, why):
        raise SystemExit(f"{where}: {why}")

    assert payoff.check_pretraining(pre, bad) is pre
    with pytest.raises(SystemExit, match="pretraining.frequent_token_accuracy: expected a finite number, got nan"):
        payoff.check_pretraining(dict(pre, frequent_token_accuracy=float("nan")), bad)


def test_phase_two_may_be_shorter_than_the_papers_512(tmp_path):
    data = {64: tmp_path / "data64", 128: tmp_path / "data128"}
    args = payoff.parse_args(["--max_seq_length", "64", "--phase2", "--phase2_length", "128", "--masking_rate", "0.3"])
    overrides = payoff.recipe_overrides(args, data, tmp_path / "vocab", tmp_path / "out", 2000, 2e-3)
    cfg = load_pretrain_config(None, overrides)
    assert (cfg.train_data, cfg.train_data_phase2) == (str(data[64]), str(data[128]))
    assert (cfg.max_predictions_per_seq, cfg.max_predictions_per_seq_phase2, cfg.phase1_steps) == (20, 39, 1800)


def test_the_grids_are_one_bert_suite_compare_of_the_checkpoint_and_its_random_twin(tmp_path, monkeypatch):
    """The payoff is a user of `bert-suite compare`: one call with the model and random:MODEL, the record's grid,
    its metrics (MRPC accuracy, STS-B Spearman) and TASK@N label subsets (SST-2's first 20,000, the curve's N)."""
    args = payoff.parse_args(["--data", str(tmp_path), "--tasks", "stsb", "mrpc", "sst2", "--label_counts", "500",
                              "--seeds", "1", "2", "--learning_rates", "1e-3"])
    specs = {t: payoff.task_spec(args, t) for t in args.tasks}
    assert specs == {"stsb": "stsb", "mrpc": "mrpc", "sst2": "sst2@20000"}
    assert payoff.task_spec(args, "sst2", 500) == "sst2@500"
    seen = []

    def fake_run(cmd, log, what):
        seen.append([str(c) for c in cmd])
        (tmp_path / "compare").mkdir(exist_ok=True)
        (tmp_path / "compare" / "compare.json").write_text(json.dumps({"seeds": [1, 2]}))

    monkeypatch.setattr(payoff, "run", fake_run)
    result = payoff.compare(args, tmp_path, {"pretrained": "ckpt", "random": "random:ckpt"},
                            [*specs.values(), "sst2@500", "sst2@500"], "fine-tuning")
    assert result == {"seeds": [1, 2]}
    cmd = seen[0]
    assert cmd[1:2] == ["compare"] and cmd[cmd.index("--model") + 1: cmd.index("--baseline")] == \
        ["pretrained=ckpt", "random=random:ckpt"]
    assert cmd[cmd.index("--baseline") + 1] == "random"
    assert cmd[cmd.index("--task") + 1: cmd.index("--data_dir")] == ["stsb", "mrpc", "sst2@20000", "sst2@500"]
    assert cmd[cmd.index("--metric") + 1: cmd.index("--learning_rates")] == \
        ["stsb=spearmanr", "mrpc=accuracy", "sst2=accuracy"]
    assert cmd[cmd.index("--seeds") + 1: cmd.index("--max_seq_length")] == ["1", "2"]
