"""Tests of the grid report: selection, CSV, Markdown statistics, plots and atomic writes."""

import csv
import logging
import math
import os
import statistics

import pytest

from bert_suite import io as suite_io
from bert_suite.io import atomic_write_text
from bert_suite.report import select_best, write_grid_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
METRIC = "eval_accuracy"


def trial(n, acc=None, lr=2e-5, bs=32, epochs=3, seed=1, state="complete", error=None, **metrics):
    """A trial record as the grid runner writes it; `acc` None means no metrics at all."""
    record = {"trial": n, "learning_rate": lr, "per_device_train_batch_size": bs, "num_train_epochs": epochs,
              "seed": seed, "state": state, "error": error, "train_runtime": 10.0 + n}
    if acc is not None:
        record["metrics"] = {METRIC: acc, **metrics}
        record["history"] = [{"epoch": float(e), METRIC: acc - 0.05 * (epochs - e)} for e in range(1, epochs + 1)]
    return record


@pytest.fixture
def grid():
    """lr 2e-5 has two seeds (0.6, 0.8) -> 70.00 ± 10.00; lr 3e-5 one seed; one failed trial; 2 epoch counts."""
    return [
        trial(1, 0.6, seed=1, eval_f1=0.5),
        trial(2, 0.8, seed=2, eval_f1=0.9),
        trial(3, 0.75, lr=3e-5, seed=1),
        trial(4, 0.7, lr=3e-5, epochs=2, seed=1),
        trial(5, lr=5e-5, seed=1, state="failed", error="CUDA out of memory"),
    ]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_select_best_takes_highest_and_breaks_ties_by_lower_trial_number():
    trials = [trial(5, 0.8), trial(3, 0.7), trial(2, 0.8), trial(9, 0.79)]
    assert select_best(trials, METRIC)["trial"] == 2


def test_select_best_ignores_failed_and_nan_trials():
    failed = trial(1, 0.99, state="failed", error="boom")  # metrics of a failed run must not win
    assert select_best([failed, trial(2, float("nan")), trial(3, 0.5)], METRIC)["trial"] == 3
    assert select_best([failed, trial(4, state="failed")], METRIC) is None
    assert select_best([], METRIC) is None


@pytest.mark.parametrize("key", ["seed", "learning_rate", "state"])
def test_missing_key_names_trial_index_and_key(key, tmp_path):
    trials = [trial(1, 0.5), trial(2, 0.6)]
    del trials[1][key]
    with pytest.raises(ValueError, match=rf"trials\[1\].*'{key}'"):
        write_grid_report(trials, METRIC, tmp_path, "mrpc")


def test_complete_trial_without_selection_metric_is_an_error():
    with pytest.raises(ValueError, match=r"trials\[0\].*eval_f1"):
        select_best([trial(1, 0.5)], "eval_f1")


def test_csv_has_one_row_per_trial_sorted_metric_union_and_best_flag(grid, tmp_path):
    written = write_grid_report(grid, METRIC, tmp_path, "mrpc")
    rows = read_csv(written["grid_results.csv"])
    assert list(rows[0]) == ["trial", "learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed",
                             "state", "eval_accuracy", "eval_f1", "train_runtime", "best", "error"]
    assert [r["trial"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r["best"] for r in rows] == ["0", "1", "0", "0", "0"]
    assert float(rows[1][METRIC]) == 0.8 and rows[2]["eval_f1"] == ""  # raw fractions; absent metric is blank
    assert rows[4]["state"] == "failed" and rows[4]["error"] == "CUDA out of memory"


def test_markdown_mean_std_per_setting_failures_and_paper(grid, tmp_path):
    text = write_grid_report(grid, METRIC, tmp_path, "mrpc", paper={"base": 84.9})["grid_results.md"].read_text()
    assert text.startswith("# Grid search: mrpc")
    assert "| 2e-05 | 32 | 3 | 2 | 70.00 ± 10.00 |" in text  # seeds 0.6 and 0.8, population std
    assert "| 3e-05 | 32 | 3 | 1 | 75.00 ± 0.00 |" in text  # one seed -> std 0
    assert "5e-05" not in text.split("## Mean")[1].split("## Failed")[0]  # failed trial adds no setting
    assert "- trial 5 (failed): CUDA out of memory" in text
    assert "**2 ★**" in text and "| 80.00 | 90.00 |" in text  # best row marked, metrics as percentages
    assert "84.9 (-4.90)" in text and "test-set" in text


def test_heatmaps_per_epoch_count_and_best_curve_are_real_pngs(grid, tmp_path):
    written = write_grid_report(grid, METRIC, tmp_path, "mrpc")
    pngs = {"heatmap_epochs2.png", "heatmap_epochs3.png", "best_trial_curve.png"}
    assert pngs <= set(written)
    for name in pngs:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name


def test_no_complete_trial_skips_plots_with_a_warning(tmp_path, caplog):
    trials = [trial(1, state="failed", error="diverged"), trial(2, state="failed", error=None)]
    with caplog.at_level(logging.WARNING, logger="bert_suite.report"):
        written = write_grid_report(trials, METRIC, tmp_path, "rte")
    assert set(written) == {"grid_results.csv", "grid_results.md"}
    assert not list(tmp_path.glob("*.png"))
    assert "No plots" in caplog.text
    text = written["grid_results.md"].read_text()
    assert "No plots" in text and "trial 1 (failed): diverged" in text and "no reason recorded" in text


def test_empty_trial_list_writes_a_report_saying_so(tmp_path):
    written = write_grid_report([], METRIC, tmp_path, "cola")
    assert "No trials ran." in written["grid_results.md"].read_text()
    assert read_csv(written["grid_results.csv"]) == []


def test_report_leaves_no_temp_files(grid, tmp_path):
    written = write_grid_report(grid, METRIC, tmp_path, "mrpc")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)


def test_atomic_write_keeps_old_content_and_no_temp_file_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "out.md"
    atomic_write_text(target, "old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(suite_io.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.md"]


def test_heatmap_titles_count_epochs_in_english():
    from bert_suite.report import heatmap_title

    assert heatmap_title("eval_accuracy", 1) == "eval_accuracy, 1 epoch (mean over seeds)"
    assert heatmap_title("eval_accuracy", 2.0) == "eval_accuracy, 2 epochs (mean over seeds)"
    assert heatmap_title("eval_f1", 0.5, 8) == "eval_f1, 0.5 epochs, LoRA rank 8 (mean over seeds)"


# ------------------------------------------------------------------------- verdicts about recipes (seeded_comparison)


def table(rows: dict) -> dict:
    """{pre-training seed: [score per fine-tuning seed 1, 2, ...]} as seeded_comparison's table."""
    return {seed: {f: v for f, v in enumerate(scores, start=1)} for seed, scores in rows.items()}


def test_one_pre_training_is_the_paired_difference_over_fine_tuning_seeds_about_these_checkpoints():
    # differences 5, 2, 6 -> mean 4.3333, sd 2.0817, SE 1.2019; t(0.975, 2) = 4.30265 -> half-width 5.17119
    from bert_suite.report import seeded_comparison

    d = seeded_comparison(table({42: [75.0, 74.0, 80.0]}), table({42: [70.0, 72.0, 74.0]}))
    assert d["difference"] == pytest.approx(13 / 3) and d["se"] == pytest.approx(1.20185, abs=1e-5)
    assert d["ci95"] == pytest.approx([13 / 3 - 5.17119, 13 / 3 + 5.17119], abs=1e-4)
    assert (d["df"], d["scope"], d["verdict"], d["pretrainings"], d["finetunings"]) == (2, "checkpoints", "level", 1, 3)
    assert d["sd_pretraining"] is None and d["sd_finetuning"] == pytest.approx(2.0817, abs=1e-4)


def test_several_pre_trainings_count_them_and_where_their_spread_dominates_the_verdict_is_level():
    """The pre-trainings differ by 5, 1 and 3 points, each repeated faithfully by its fine-tuning seeds: the six
    pooled pairs would say ahead (+3.1, t(5) interval above zero), the three pre-trainings say level."""
    from scipy.stats import t

    from bert_suite.report import seeded_comparison

    first = table({42: [75.0, 75.2], 43: [71.0, 71.2], 44: [73.0, 73.2]})
    second = table({42: [70.0, 70.0], 43: [70.0, 70.0], 44: [70.0, 70.0]})
    d = seeded_comparison(first, second)
    means = [5.1, 1.1, 3.1]  # d_s: the mean over fine-tuning seeds per pre-training
    se = statistics.stdev(means) / math.sqrt(3)
    assert d["difference"] == pytest.approx(3.1) and d["se"] == pytest.approx(se) and d["df"] == 2
    assert d["ci95"] == pytest.approx([3.1 - t.ppf(0.975, 2) * se, 3.1 + t.ppf(0.975, 2) * se])
    assert (d["scope"], d["verdict"], d["first_ahead_in"], d["pretrainings"]) == ("recipes", "level", 3, 3)
    assert d["sd_pretraining"] == pytest.approx(2.0) and d["sd_finetuning"] == pytest.approx(math.sqrt(0.02))
    pooled = [a - b for s in first for a, b in zip(first[s].values(), second[s].values(), strict=True)]
    half = t.ppf(0.975, len(pooled) - 1) * statistics.stdev(pooled) / math.sqrt(len(pooled))
    assert statistics.fmean(pooled) - half > 0  # what counting the fine-tuning seeds alone would have claimed
    assert "bootstrap95" not in d  # fewer than five pre-trainings


def test_the_verdict_never_disagrees_with_its_interval_and_five_pre_trainings_add_a_multi_bootstrap():
    import random

    from bert_suite.report import seeded_comparison

    rng = random.Random(0)
    for _ in range(200):
        n, m, shift = rng.choice([1, 2, 3, 5]), rng.choice([2, 3]), rng.uniform(-3, 3)
        first = table({s: [rng.gauss(70 + shift, 2) for _ in range(m)] for s in range(n)})
        second = table({s: [rng.gauss(70, 2) for _ in range(m)] for s in range(n)})
        d = seeded_comparison(first, second)
        low, high = d["ci95"]
        assert d["verdict"] == ("ahead" if low > 0 else "behind" if high < 0 else "level")
        if n >= 5:
            boot = d["bootstrap95"]
            assert boot[0] <= d["difference"] <= boot[1]
            assert boot == seeded_comparison(first, second)["bootstrap95"]  # the same draws every time


def test_tables_that_do_not_pair_are_refused_naming_the_seeds():
    from bert_suite.report import seeded_comparison

    with pytest.raises(ValueError, match="seeds 44 are in one only"):
        seeded_comparison(table({42: [1.0, 2.0], 44: [1.0, 2.0]}), table({42: [1.0, 2.0]}))
    with pytest.raises(ValueError, match="pre-training seed 42: fine-tuning seeds 3 are in one table only"):
        seeded_comparison(table({42: [1.0, 2.0, 3.0]}), table({42: [1.0, 2.0]}))
    with pytest.raises(ValueError, match="a standard error needs two or more"):
        seeded_comparison(table({42: [1.0]}), table({42: [2.0]}))


def test_a_comparison_on_the_common_pre_trainings_names_them_where_a_side_has_others():
    """A variant with seeds of its own beside the baseline's: the pair is made on the seeds both have, and
    `paired_on` says which; with the same seeds it is seeded_comparison unchanged; none in common is refused."""
    from bert_suite.report import common_comparison, seeded_comparison

    first = table({42: [75.0, 76.0], 43: [70.0, 71.0], 44: [72.0, 73.0]})
    second = table({42: [70.0, 70.0], 44: [71.0, 70.0]})
    d = common_comparison(first, second)
    assert d["paired_on"] == ["42", "44"] and (d["pretrainings"], d["df"], d["scope"]) == (2, 1, "recipes")
    assert d["difference"] == pytest.approx(((75.5 - 70) + (72.5 - 70.5)) / 2)  # seed 43 left out
    same = table({42: [70.0, 71.0], 43: [69.0, 70.0], 44: [70.0, 72.0]})
    assert common_comparison(first, same) == seeded_comparison(first, same)  # no paired_on
    with pytest.raises(ValueError, match=r"no pre-training seed in common \(first: 42, 43, 44; second: 7\)"):
        common_comparison(first, table({7: [1.0, 2.0]}))


def test_the_multi_bootstrap_interval_is_the_spread_of_pre_trainings_drawn_again():
    """Five pre-trainings, one 10 points ahead and four level (d_s = 10, 0, 0, 0, 0; their fine-tuning seeds
    agree): a draw's statistic is the mean of five pre-trainings drawn with replacement, whose exact 2.5% and
    97.5% points (0 and 6) come from the 5^5 draws; the Multi-Bootstrap lands on them, where an interval of the
    normal or t kind (2 ± 1.96 x 1.79) would run below zero."""
    import itertools

    import numpy as np

    from bert_suite.report import seeded_comparison

    ahead = [10.0, 0.0, 0.0, 0.0, 0.0]
    first = table({s: [70.0 + d, 70.0 + d] for s, d in enumerate(ahead)})
    second = table({s: [70.0, 70.0] for s in range(5)})
    found = seeded_comparison(first, second)
    exact = np.percentile([sum(c) / 5 for c in itertools.product(ahead, repeat=5)], [2.5, 97.5])
    assert list(exact) == [0.0, 6.0] and found["bootstrap95"] == pytest.approx([0.0, 6.0], abs=1e-9)
    assert found["ci95"][0] < 0  # the t interval's lower end


def test_a_tables_unit_names_each_kind_of_pair_once_and_its_degrees_of_freedom():
    """A table whose pairs count different pre-trainings (a variant with seeds of its own) names each unit once,
    recipes first; one unit is said as it is; degrees of freedom ascending, singular for one."""
    from bert_suite.report import common_comparison, degrees_text, scopes_text

    three = common_comparison(table({42: [60.0, 61.0], 43: [62.0, 60.0], 44: [59.0, 58.0]}),
                              table({42: [55.0, 56.0], 43: [57.0, 55.0], 44: [56.0, 54.0]}))
    one = common_comparison(table({42: [60.0, 61.0], 43: [62.0, 60.0]}), table({42: [55.0, 57.0]}))
    assert (three["scope"], three["df"], one["scope"], one["df"], one["paired_on"]) == ("recipes", 2, "checkpoints",
                                                                                        1, ["42"])
    assert scopes_text([three, three]) == "SE over 3 pre-trainings x 2 fine-tuning seeds"
    assert scopes_text([one, three, one]) == ("each pair on the pre-trainings both sides have: SE over 3 "
                                              "pre-trainings x 2 fine-tuning seeds, or SE over 2 fine-tuning seeds "
                                              "where the two share one pre-training (these checkpoints)")
    assert degrees_text([three, one, three]) == "1 or 2 degrees of freedom"
    assert (degrees_text([one]), degrees_text([three])) == ("1 degree of freedom", "2 degrees of freedom")
