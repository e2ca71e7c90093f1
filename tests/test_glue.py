"""GLUE end to end on data the tests write: readers, cards, the runner learning a pair task, the
resumable grid."""

import csv
import json
from pathlib import Path

import pytest

from bert_suite import grid as grid_module
from bert_suite.adapters.classification import DataError, read_tsv_split
from bert_suite.cards import CardError, available_cards, card_from_dict, load_card
from bert_suite.cli import main as cli_main
from helpers import run_args, write_rte_like


def test_finetune_learns_a_pair_task_and_writes_its_outputs(tmp_path, capsys):
    data = write_rte_like(tmp_path / "data", n_train=300)  # all right from 200 examples (3 data seeds); 150: 0.86
    out = tmp_path / "run"
    assert cli_main(["finetune", "rte", *run_args(data, out, "--learning_rate", "1e-3", "--num_train_epochs", "3",
                                                   "--per_device_train_batch_size", "16")]) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_accuracy"] > 0.9  # chance is 0.5
    assert results["train_samples"] == 300 and results["eval_samples"] == 200
    with open(out / "predictions" / "dev.tsv") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and len(rows) == 201
    assert {r[1] for r in rows[1:]} <= {"entailment", "not_entailment"}
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert manifest["training_arguments"]["learning_rate"] == 1e-3
    assert manifest["training_arguments"]["warmup_steps"] == 0.1  # from the card
    assert set(manifest["dataset_fingerprints"]) == {"train", "validation"}
    assert (out / "model.safetensors").is_file()
    # the fine-tuned checkpoint predicts the unlabelled test split
    assert cli_main(["predict", "rte", "--model", str(out), "--split", "test", "--data_dir", str(data)]) == 0
    test_rows = (out / "predictions" / "test.tsv").read_text().splitlines()
    assert len(test_rows) == 51 and test_rows[1].startswith("0\t")
    check_predict_uses_the_checkpoints_id2label(out, data, test_rows, capsys)


def check_predict_uses_the_checkpoints_id2label(out: Path, data: Path, test_rows: list[str], capsys) -> None:
    """Labels are named by the checkpoint's id2label: the same names in another order (classifier rows
    swapped with them) give the same predictions; other names are one clear error."""
    import shutil

    from safetensors.torch import load_file, save_file

    swapped = out.parent / "swapped"
    shutil.copytree(out, swapped)
    config = json.loads((swapped / "config.json").read_text())
    config["id2label"] = {"0": config["id2label"]["1"], "1": config["id2label"]["0"]}
    config["label2id"] = {v: int(k) for k, v in config["id2label"].items()}
    (swapped / "config.json").write_text(json.dumps(config))
    weights = load_file(swapped / "model.safetensors")
    for key in ("classifier.weight", "classifier.bias"):
        weights[key] = weights[key].flip(0).contiguous()
    save_file(weights, swapped / "model.safetensors", metadata={"format": "pt"})
    assert cli_main(["predict", "rte", "--model", str(swapped), "--split", "test", "--data_dir", str(data)]) == 0
    assert (swapped / "predictions" / "test.tsv").read_text().splitlines() == test_rows
    config["id2label"] = {"0": "yes", "1": "no"}
    (swapped / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert cli_main(["predict", "rte", "--model", str(swapped), "--split", "test", "--data_dir", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "id2label ['yes', 'no'] does not match the labels of task card" in err[0]
    assert "['entailment', 'not_entailment']" in err[0]


def test_grid_resumes_only_missing_trials_and_records_failures(tmp_path, monkeypatch):
    data = write_rte_like(tmp_path / "data", n_train=64, n_dev=32)
    out = tmp_path / "grid"
    argv = ["grid", "rte", *run_args(data, out, "--max_steps", "2"), "--learning_rates", "1e-3", "5e-4",
            "--batch_sizes", "16", "--epochs", "1", "--seeds", "1", "2"]
    real = grid_module.train_and_evaluate
    calls = []

    def interrupted(prepared, model, args, save_to=None, **kwargs):
        calls.append(args.learning_rate)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the grid process dies mid-trial
        return real(prepared, model, args, save_to, **kwargs)

    monkeypatch.setattr(grid_module, "train_and_evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cli_main(argv)
    calls.clear()
    monkeypatch.setattr(grid_module, "train_and_evaluate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    assert cli_main(argv) == 0
    assert len(calls) == 2  # the interrupted trial and the one never started
    with open(out / "grid_results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and sum(r["best"] == "1" for r in rows) == 1
    assert (out / "best" / "model.safetensors").is_file()
    assert not list((out / "trials").rglob("model.safetensors"))  # only the best checkpoint is kept
    assert (out / "heatmap_epochs1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    calls.clear()
    assert cli_main(argv) == 0 and calls == []  # nothing left to do

    # a trial that raises is recorded as failed with its reason and the grid goes on
    def flaky(prepared, model, args, save_to=None, **kwargs):
        if args.learning_rate == 5e-4:
            raise RuntimeError("loss exploded")
        return real(prepared, model, args, save_to, **kwargs)

    monkeypatch.setattr(grid_module, "train_and_evaluate", flaky)
    out2 = tmp_path / "grid2"
    argv2 = ["grid", "rte", *run_args(data, out2, "--max_steps", "2"), "--learning_rates", "1e-3", "5e-4",
             "--batch_sizes", "16", "--epochs", "1"]
    assert cli_main(argv2) == 0
    with open(out2 / "grid_results.csv") as f:
        rows = {r["learning_rate"]: r for r in csv.DictReader(f)}
    assert rows["0.0005"]["state"] == "failed" and "loss exploded" in rows["0.0005"]["error"]
    assert rows["0.001"]["state"] == "complete" and rows["0.001"]["best"] == "1"
    assert "loss exploded" in (out2 / "grid_results.md").read_text()


@pytest.mark.parametrize("flag, value, grid_flag", [("--learning_rate", "1e-5", "--learning_rates"),
                                                     ("--per_device_train_batch_size", "8", "--batch_sizes"),
                                                     ("--num_train_epochs", "2", "--epochs"), ("--seed", "3", "--seeds")])
def test_grid_refuses_a_flag_its_axis_owns_before_touching_the_network(flag, value, grid_flag, tmp_path, capsys,
                                                                        monkeypatch):
    """The grid sets these for every trial, so the flag would be silently overwritten: a usage error
    (exit 2) naming the grid flag, before any Hub probe (a Hub id as model would otherwise probe)."""
    from bert_suite import hub

    def no_network():
        raise AssertionError("the Hub was probed before the flags were checked")

    monkeypatch.setattr(hub, "offline_unless_reachable", no_network)
    argv = ["grid", "rte", "--model", "google-bert/bert-base-uncased", "--output_dir", str(tmp_path), flag, value]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} (use {grid_flag})" in err[0]
    # finetune too checks its flags first: a typo is reported without waiting on the Hub
    assert cli_main(["finetune", "rte", "--model", "google-bert/bert-base-uncased", "--learning_rat", "1e-5"]) == 2
    assert "did you mean --learning_rate" in capsys.readouterr().err


def test_grid_rejects_empty_axis_and_negative_learning_rate(tmp_path, capsys):
    data = write_rte_like(tmp_path / "data", n_train=8, n_dev=8)
    assert cli_main(["grid", "rte", *run_args(data, tmp_path / "g"), "--learning_rates", "-0.00001"]) == 2
    assert "learning_rate must be positive" in capsys.readouterr().err
    assert cli_main(["finetune", "rte", *run_args(data, tmp_path / "f"), "--learning_rate", "-1"]) == 2
    assert "learning_rate must be positive" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- readers


def test_cola_without_header_and_mrpc_with_bom_and_quotes(tmp_path):
    cola = load_card("cola")
    (tmp_path / "train.tsv").write_text("gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode the the.\n")
    data, skipped = read_tsv_split(cola, "train", tmp_path / "train.tsv")
    assert data["sentence"] == ["The sailors rode.", "Rode the the."] and data["label"] == [1, 0] and skipped == 0
    mrpc = load_card("mrpc")
    (tmp_path / "dev.tsv").write_text(
        "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\t\"He said\tShe \"said\" so\n", encoding="utf-8")
    data, _ = read_tsv_split(mrpc, "validation", tmp_path / "dev.tsv")
    assert data["sentence1"] == ['"He said'] and data["sentence2"] == ['She "said" so'] and data["label"] == [1]


def test_stsb_float_labels_and_unlabelled_test(tmp_path):
    stsb = load_card("stsb")
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    (tmp_path / "dev.tsv").write_text(header + "\tscore\n0\tg\tf\ty\t0\tn\tn\tA man.\tA guy.\t4.750\n")
    data, _ = read_tsv_split(stsb, "validation", tmp_path / "dev.tsv")
    assert data["label"] == [4.75]
    (tmp_path / "test.tsv").write_text(header + "\n7\tg\tf\ty\t0\tn\tn\tA man.\tA guy.\n")
    data, _ = read_tsv_split(stsb, "test", tmp_path / "test.tsv")
    assert "label" not in data.column_names and data["idx"] == [7]


@pytest.mark.parametrize(
    "content, message",
    [
        ("index\tsentence1\tlabel\n0\ta\tentailment\n", r"train.tsv:1: header has no column 'sentence2'"),
        ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n", r"train.tsv:2: label 'maybe' is not one of"),
        ("index\tsentence1\tsentence2\tlabel\n0\t \tb\tentailment\n", r"train.tsv:2: empty text in column 'sentence1'"),
        ("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\textra\n", r"train.tsv:2: expected 4 tab-separated fields, found 5"),
        ("", r"train.tsv: empty file"),
        ("index\tsentence1\tsentence2\tlabel\n", r"train.tsv: no data rows"),
    ],
    ids=["missing-column", "unknown-label", "empty-text", "extra-tab", "empty-file", "header-only"],
)
def test_bad_tsv_rows_name_file_line_and_expectation(tmp_path, content, message):
    (tmp_path / "train.tsv").write_text(content)
    with pytest.raises(DataError, match=message):
        read_tsv_split(load_card("rte"), "train", tmp_path / "train.tsv")


def test_non_utf8_bytes_and_skip_bad_rows(tmp_path):
    rte = load_card("rte")
    (tmp_path / "train.tsv").write_bytes(b"index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\t\xff\tb\tentailment\n")
    with pytest.raises(DataError, match=r"train.tsv:3: not valid UTF-8"):
        read_tsv_split(rte, "train", tmp_path / "train.tsv")
    (tmp_path / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\n2\tc\td\tnot_entailment\n")
    data, skipped = read_tsv_split(rte, "train", tmp_path / "train.tsv", skip_bad_rows=True)
    assert skipped == 1 and data["idx"] == [0, 2]


# ------------------------------------------------------------------------------------- cards


def test_every_glue_card_loads():
    names = {k for k in available_cards() if k.startswith("glue/")}
    assert names == {f"glue/{t}" for t in ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli", "ax")}
    for name in names:
        card = load_card(name)
        assert card.server_name and all(card.splits[s].server_file for s in card.test_splits)
    assert load_card("stsb").is_regression and load_card("mnli").num_labels == 3


def test_card_errors_name_the_key(tmp_path):
    good = json.loads(json.dumps(load_card("rte").__dict__, default=lambda o: o.__dict__))
    good.pop("path")
    with pytest.raises(CardError, match="unknown key 'metrik'"):
        card_from_dict({**good, "metrik": "x"}, "my.yaml")
    with pytest.raises(CardError, match="missing required key 'metric'"):
        card_from_dict({k: v for k, v in good.items() if k != "metric"}, "my.yaml")
    with pytest.raises(CardError, match="text_columns must be"):
        card_from_dict({**good, "text_columns": "sentence1"}, "my.yaml")
    with pytest.raises(CardError, match="unknown task 'rtee'"):
        load_card("rtee")


def test_user_card_on_own_files_needs_no_code(tmp_path):
    """A sentiment task on the user's CSV-free TSV, described only by a card."""
    card = tmp_path / "mood.yaml"
    card.write_text(
        "name: mood\nfamily: classification\ntext_columns: [text]\nlabel_column: label\nlabels: [sad, happy]\n"
        "metric: sst2\nselect: accuracy\nsplits:\n  train: {file: train.tsv, columns: {text: text, label: mood}}\n"
        "  validation: {file: dev.tsv, columns: {text: text, label: mood}}\n  test: {file: test.tsv, columns: {text: text}}\n")
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("text\tmood\nmango\thappy\nolive\tsad\n")
    loaded = load_card(card)
    data, _ = read_tsv_split(loaded, "train", tmp_path / "train.tsv")
    assert data["text"] == ["mango", "olive"] and data["label"] == [1, 0]


def test_a_changed_grid_in_the_same_folder_runs_as_its_own_study(tmp_path):
    data = write_rte_like(tmp_path / "data", n_train=32, n_dev=16)
    out = tmp_path / "grid"
    base = ["grid", "rte", *run_args(data, out, "--max_steps", "1"), "--batch_sizes", "16", "--epochs", "1"]
    assert cli_main([*base, "--learning_rates", "1e-3"]) == 0
    # Optuna refuses a new value set for a parameter inside one study; a new grid gets its own
    assert cli_main([*base, "--learning_rates", "1e-3", "5e-4", "--seeds", "1"]) == 0
    with open(out / "grid_results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["learning_rate"] for r in rows) == ["0.0005", "0.001"] and {r["seed"] for r in rows} == {"1"}


def test_labels_follow_the_checkpoint_by_name(tmp_path):
    """Same names in another order: the card takes the checkpoint's order (predicting and
    fine-tuning alike). Other names: an error when predicting; fine-tuning keeps the card's (a
    checkpoint of another task starts a new one). No names (LABEL_i) or a preset: the card's."""
    from bert_suite.runner import RunError, labels_of_checkpoint

    card = load_card("rte")

    def folder(names):
        path = tmp_path / "_".join(names)
        path.mkdir()
        path.joinpath("config.json").write_text(json.dumps({"model_type": "bert", "id2label": dict(enumerate(names))}))
        return str(path)

    swapped = folder(["not_entailment", "entailment"])
    assert labels_of_checkpoint(card, swapped, strict=True).labels == ["not_entailment", "entailment"]
    assert labels_of_checkpoint(card, swapped, strict=False).labels == ["not_entailment", "entailment"]
    other = folder(["yes", "no"])
    with pytest.raises(RunError, match=r"id2label \['yes', 'no'\] does not match"):
        labels_of_checkpoint(card, other, strict=True)
    assert labels_of_checkpoint(card, other, strict=False).labels == card.labels
    assert labels_of_checkpoint(card, folder(["LABEL_0", "LABEL_1"]), strict=True).labels == card.labels
    assert labels_of_checkpoint(card, "preset:tiny", strict=True).labels == card.labels
