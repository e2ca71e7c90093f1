"""benchmarks/table5_small.py's own code on data the tests write (the run itself is a benchmark: hours): the
record's pre-training facts per objective, the merge of its two comparisons, the summary beside the paper's
Table 5, and a clean skip without the shared data."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import table5_small as table5  # noqa: E402


def comparison(tasks: dict[str, float], models=("mlm_nsp", "ltr")) -> dict:
    """A compare.json with the given tasks (each model's scores around `base`)."""
    entry = lambda base: {"metric": "accuracy", "labels": None,  # noqa: E731
                          "models": {m: {"setting": {"learning_rate": 1e-3, "batch_size": 32, "epochs": 3.0},
                                         "scores": [base - i, base - i + 1], "mean": base - i + 0.5, "se": 0.5}
                                     for i, m in enumerate(models)},
                          "vs_baseline": {"ltr": {"difference": -1.0, "se": 0.0, "ci95": [-1.0, -1.0],
                                                  "verdict": "behind"}}}
    return {"baseline": "mlm_nsp", "seeds": [1, 2], "models": {m: {"path": "p", "random_init": False, "bilstm": False}
                                                               for m in models},
            "tasks": {key: entry(base) for key, base in tasks.items()}}


def test_the_two_comparisons_merge_in_the_tasks_order_and_must_share_models_and_seeds():
    glue, squad = comparison({"mrpc": 70.0, "rte": 55.0}), comparison({"squad_small": 20.0})
    merged = table5.merge([glue, squad], ["squad_small", "mrpc", "rte"])
    assert list(merged) == ["baseline", "seeds", "models", "tasks"]
    assert list(merged["tasks"]) == ["squad_small", "mrpc", "rte"]
    assert merged["tasks"]["squad_small"] == squad["tasks"]["squad_small"]
    with pytest.raises(SystemExit, match="other models, seeds or baseline"):
        table5.merge([glue, {**squad, "seeds": [1, 2, 3]}], ["squad_small", "mrpc", "rte"])


def test_pretraining_facts_per_objective(tmp_path):
    args = table5.parse_args(["--batch_size", "64"])
    data = {}
    for length, mean, share in ((64, 60.0, 0.50), (128, 110.0, 0.52)):
        data[length] = tmp_path / f"data{length}"
        data[length].mkdir()
        (data[length] / "pretrain_data_stats.json").write_text(json.dumps({"mean_instance_length": mean,
                                                                           "not_next_share": share}))
    runs = {}
    for name, accuracy in (("mlm_nsp", 0.26), ("ltr", 0.31)):
        runs[name] = tmp_path / name
        runs[name].mkdir()
        (runs[name] / "metrics.jsonl").write_text(json.dumps({"step": 100, "eval_mlm_accuracy": accuracy,
                                                              "eval_mlm_perplexity": 9.0}) + "\n")
        (runs[name] / "payoff_timing.json").write_text(json.dumps([{"seconds": 600}, {"seconds": 300}]))
    record = table5.pretraining_record(args, runs, data, 100)
    assert record["ltr"] == {"steps": 100, "minutes": 15.0, "tokens": 90 * 64 * 60 + 10 * 16 * 110,
                             "held_out_accuracy": 0.31, "accuracy_kind": "next_token",
                             "not_next_share": pytest.approx((90 * 0.50 + 10 * 0.52) / 100)}
    assert record["mlm_nsp"]["accuracy_kind"] == "mlm"


def test_the_summary_has_the_table_the_pretraining_and_the_papers_table_5():
    record = {**comparison({"mrpc": 70.0}), "command": "python benchmarks/table5_small.py --steps 100",
              "pretraining": {"mlm_nsp": {"steps": 100, "minutes": 20.0, "tokens": 1000, "held_out_accuracy": 0.26,
                                          "accuracy_kind": "mlm", "not_next_share": 0.5}}}
    text = table5.summary(record, {"ngram": 8, "sentences": 100, "sentences_removed": 3}, {"compare": "lr 1e-3"})
    assert "| model | mrpc (accuracy) |" in text and "| ltr | 69.5 ± 0.5 (-1.0 ± 0.0, behind) |" in text
    assert "| mlm_nsp | 100 | 20.0 | 1,000 | 26.0% | mlm | 0.500 |" in text
    assert "| ltr | 82.1 | 84.3 | 77.5 | 92.1 | 77.8 |" in text  # the paper's LTR & No NSP row
    assert "not comparable" in text and "MNLI and QNLI have no train sets" in text


def test_without_the_shared_data_it_skips_cleanly(tmp_path, capsys):
    assert table5.main(["--data", str(tmp_path), "--output_dir", str(tmp_path / "out")]) is None
    assert "skipping" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tasks, metric", [(["squad_small@3000"], None), (["mrpc", "rte"], ["mrpc=accuracy"])])
def test_each_comparison_command_is_one_bert_suite_compare_accepts(tmp_path, monkeypatch, tasks, metric):
    """The SQuAD-only comparison has no --metric at all (an empty --metric is an argparse error that killed it)."""
    from bert_suite_cli import build_parser

    commands = []

    class Worker:
        def __init__(self, cmd, **kwargs):
            commands.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(table5.subprocess, "Popen", Worker)
    monkeypatch.setattr(table5.time, "sleep", lambda seconds: None)
    out = tmp_path / "compare"
    out.mkdir()
    (out / "compare.json").write_text(json.dumps(comparison({"rte": 55.0})))
    args = table5.parse_args(["--workers", "2", "--seeds", "1", "2"])
    table5.compare(args, out, ["a=x", "b=y"], tasks, ["1e-3"], ["2"], tmp_path / "small", tmp_path / "glue")
    assert len(commands) == 2 and commands[0] == commands[1]
    parsed, _ = build_parser().parse_known_args(commands[0][1:])
    assert parsed.tasks == tasks and parsed.metric == metric
    assert parsed.learning_rates == [1e-3] and parsed.seeds == [1, 2]


def scored(tasks: dict[str, dict[str, list[float]]]) -> dict:
    """A record whose tasks give each model these per-seed scores."""
    models = list(next(iter(tasks.values())))
    record = comparison({key: 50.0 for key in tasks}, models=models)
    for key, scores in tasks.items():
        for name, values in scores.items():
            record["tasks"][key]["models"][name]["scores"] = values
    return record


def test_the_papers_questions_are_paired_differences_and_the_goal_is_judged_from_them():
    ahead = {"mlm_nsp": [20.0, 22.0, 24.0], "mlm": [19.0, 22.0, 23.0], "ltr": [10.0, 11.0, 12.0]}
    level = {"mlm_nsp": [60.0, 61.0, 59.0], "mlm": [60.0, 60.0, 60.0], "ltr": [60.0, 62.0, 58.0]}
    record = scored({"squad_small@3000": ahead, "mrpc": ahead, "stsb": ahead, "rte": level})
    pairs = table5.contrasts(record)
    assert set(pairs) == {"bidirectional_mlm_nsp", "bidirectional_mlm", "nsp"}  # no ltr_bilstm, no random here
    bidirectional = pairs["bidirectional_mlm"]["tasks"]["mrpc"]  # mlm - ltr: 9, 11, 11
    assert bidirectional["difference"] == pytest.approx(31 / 3)
    assert bidirectional["se"] == pytest.approx((4 / 3) ** 0.5 / 3 ** 0.5)
    assert bidirectional["verdict"] == "ahead"
    nsp = pairs["nsp"]["tasks"]["squad_small@3000"]  # mlm_nsp - mlm: 1, 0, 1 -> 2/3 ± 1/3: exactly 2 SE, level
    assert (nsp["difference"], nsp["se"], nsp["verdict"]) == (pytest.approx(2 / 3), pytest.approx(1 / 3), "level")
    assert pairs["nsp"]["tasks"]["rte"]["ci95"][0] < 0 < pairs["nsp"]["tasks"]["rte"]["ci95"][1]
    assert table5.goal(record) == {"bidirectional_mlm_nsp": {"squad": True, "glue_ahead": ["mrpc", "stsb"]},
                                   "bidirectional_mlm": {"squad": True, "glue_ahead": ["mrpc", "stsb"]}, "met": True}
    short = scored({"squad_small@3000": ahead, "mrpc": ahead, "stsb": level, "rte": level})
    assert table5.goal(short)["met"] is False and table5.goal(short)["bidirectional_mlm"]["glue_ahead"] == ["mrpc"]
    text = "\n".join(table5.paired_section(short))
    assert "| MLM only against LTR & No NSP | +10.3 ± 0.7 [+7.5, +13.2] ahead |" in text
    assert "**not met**" in text and "GLUE ahead on mrpc" in text
