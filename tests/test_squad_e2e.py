"""SQuAD end to end on data the test writes: a tiny model learns an extractive task through the
runner (windows, labels, post-processing, official-equivalent scoring), v2 chooses the null
threshold on dev, keeps it with the checkpoint and `predict` applies it; `score squad` agrees."""

import json
from pathlib import Path

import pytest
import yaml

from bert_suite.cli import main as cli_main
from helpers import write_squad_like


def small_card(folder: Path, version_2: bool) -> Path:
    """The real card with short windows (max_seq_length 24, doc_stride 8, questions up to 4 tokens) and
    local file names."""
    card = yaml.safe_load(Path(f"tasks/squad/{'v2' if version_2 else 'v1'}.yaml").read_text())
    card["splits"]["train"]["file"] = "train.json"
    card["splits"]["validation"]["file"] = "dev.json"
    card["options"].update(doc_stride=8, max_query_length=4)
    card["defaults"]["max_seq_length"] = 24
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def finetune(data: Path, card: Path, out: Path, files: bool = False) -> dict:
    """One run on the folder (--data_dir), or on the two files (--train_file, --validation_file)."""
    source = ["--train_file", str(data / "train.json"), "--validation_file", str(data / "dev.json")] if files \
        else ["--data_dir", str(data)]
    assert cli_main(["finetune", str(card), "--model", "preset:tiny", "--tokenizer", str(data / "vocab.txt"),
                     *source, "--output_dir", str(out), "--disable_tqdm", "true",
                     "--learning_rate", "1e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "16",
                     "--seed", "3"]) == 0
    return json.loads((out / "all_results.json").read_text())


def test_v1_tiny_model_learns_spans_and_the_drop_in_scorer_agrees(tmp_path, capsys, report):
    data = write_squad_like(tmp_path / "data", version_2=False)
    out = tmp_path / "run"
    # a second evaluation split (a copy of dev): each split is post-processed with its own windows
    card = yaml.safe_load(small_card(tmp_path, False).read_text())
    card["splits"]["test"] = {"file": "dev-copy.json"}
    card["eval_splits"] = ["validation", "test"]
    (data / "dev-copy.json").write_text((data / "dev.json").read_text())
    (tmp_path / "card.yaml").write_text(yaml.safe_dump(card))
    results = finetune(data, tmp_path / "card.yaml", out)
    assert results["eval_test_f1"] == results["eval_validation_f1"]
    results = {k.replace("eval_validation_", "eval_"): v for k, v in results.items()}
    report("SQuAD-like v1 dev F1 (tiny, 3 epochs)", f"{100 * results['eval_f1']:.1f}")
    # A uniformly random valid span of at most 30 tokens in a 9-18 word context scores about 5 F1.
    assert results["eval_f1"] > 0.6
    predictions = json.loads((out / "predictions" / "dev" / "predictions.json").read_text())
    assert len(predictions) == 150 and all(isinstance(v, str) for v in predictions.values())
    nbest = json.loads((out / "predictions" / "dev" / "nbest_predictions.json").read_text())
    assert nbest["d0"][0]["text"] == predictions["d0"]
    assert sum(e["probability"] for e in nbest["d0"]) == pytest.approx(1.0, abs=1e-4)
    capsys.readouterr()
    assert cli_main(["score", "squad", "--data", str(data / "dev.json"),
                     "--predictions", str(out / "predictions" / "dev" / "predictions.json")]) == 0
    official = json.loads(capsys.readouterr().out)
    assert list(official) == ["exact_match", "f1"]
    assert official["f1"] == pytest.approx(100 * results["eval_f1"])
    assert official["exact_match"] == pytest.approx(100 * results["eval_exact_match"])


def test_v2_threshold_is_chosen_on_dev_saved_and_applied_by_predict(tmp_path, capsys, report):
    data = write_squad_like(tmp_path / "data", version_2=True)
    out = tmp_path / "run"
    results = finetune(data, small_card(tmp_path, True), out, files=True)
    report("SQuAD-like v2 dev best F1 (tiny, 3 epochs)", f"{100 * results['eval_best_f1']:.1f}")
    # Always answering "no answer" scores the unanswerable third, about 33 F1.
    assert results["eval_best_f1"] > 0.6
    assert results["eval_best_f1"] >= results["eval_f1"]  # tau = 0 is one of the thresholds searched
    tau = json.loads((out / "bert_suite_task.json").read_text())["null_score_diff_threshold"]
    assert tau == results["eval_best_f1_thresh"]
    dev = out / "predictions" / "dev"
    odds = json.loads((dev / "null_odds.json").read_text())
    capsys.readouterr()
    assert cli_main(["score", "squad", "--data", str(data / "dev.json"), "--predictions", str(dev / "predictions.json"),
                     "--na_probs", str(dev / "null_odds.json")]) == 0
    official = json.loads(capsys.readouterr().out)
    assert official["best_f1"] == pytest.approx(100 * results["eval_best_f1"])
    assert official["HasAns_total"] + official["NoAns_total"] == 150

    saved = json.loads((out / "bert_suite_task.json").read_text())
    assert saved["max_seq_length"] == 24 and saved["options"]["doc_stride"] == 8
    # predict on the dev file as new data, with the stock card: the saved windows and tau are applied
    assert cli_main(["predict", "squad_v2", "--model", str(out), "--split", "dev",
                     "--data_dir", str(data / "dev.json"), "--output_dir", str(tmp_path / "pred")]) == 0
    applied = json.loads((tmp_path / "pred" / "predictions" / "dev" / "predictions.json").read_text())
    for qid, text in applied.items():
        assert (text == "") == (odds[qid] > tau), qid
    assert cli_main(["predict", str(small_card(tmp_path, True)), "--model", str(out), "--split", "dev",
                     "--data_dir", str(data), "--output_dir", str(tmp_path / "pred"),
                     "--null_score_diff_threshold", "1e9"]) == 0
    never_null = json.loads((tmp_path / "pred" / "predictions" / "dev" / "predictions.json").read_text())
    assert sum(text == "" for text in never_null.values()) < sum(text == "" for text in applied.values())
    # a labelled test file (the dev file again) is scored at the saved tau, not at a threshold searched on it:
    # tau reproduces dev's best F1, and no best_* key is reported
    assert cli_main(["predict", "squad_v2", "--model", str(out), "--test_file", str(data / "dev.json"),
                     "--output_dir", str(tmp_path / "test")]) == 0
    scored = json.loads((tmp_path / "test" / "predictions" / "test_results.json").read_text())
    assert scored["f1"] == pytest.approx(results["eval_best_f1"]) and scored["NoAns_total"] > 0
    assert not [k for k in scored if k.startswith("best_")]


def test_threshold_reproduces_the_best_f1_when_answering_nothing_is_best():
    """The official walk reports threshold 0.0 when no answer at all is best; applied as is, every
    question with score_diff <= 0 would keep its (wrong) span. The chosen threshold must answer none."""
    import datasets

    from bert_suite.adapters import squad
    from bert_suite.cards import load_card

    examples = datasets.Dataset.from_dict({
        "id": ["a", "b", "c"], "context": ["x y z"] * 3,
        "answers": [{"text": [], "answer_start": []}, {"text": [], "answer_start": []},
                    {"text": ["z"], "answer_start": [4]}]})
    result = {"best_non_null": {"a": "x", "b": "y", "c": "x"}, "null_odds": {"a": -2.0, "b": -1.0, "c": -3.0}}
    tau = squad._chosen_threshold(load_card("squad_v2"), examples, result)
    assert tau < -3.0
    predicted = {q: "" if result["null_odds"][q] > tau else t for q, t in result["best_non_null"].items()}
    assert predicted == {"a": "", "b": "", "c": ""}  # F1 2/3, the best any threshold gives here
