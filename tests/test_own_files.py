"""The user's own files: --train_file/--validation_file/--test_file on a card, card-less tasks built from CSV,
JSON Lines and Parquet files (classification and regression, as run_glue.py reads them), the card a run
saves (task_card.yaml) and reads back, --max_*_samples, and the family detection of --task_family."""

import csv
import json
import random
from pathlib import Path

import datasets
import pytest
import yaml

from bert_suite.adapters.common import DataError
from bert_suite.cards import load_card
from bert_suite.cli import main as cli_main
from bert_suite.own_files import card_from_files, with_data_files
from bert_suite_cli import _give_back_flag_value, build_parser
from helpers import write_records_csv

WORDS = "apple berry cherry grape lemon mango olive peach".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def sentiment_rows(n: int, rng: random.Random, labelled: bool = True) -> list[dict]:
    """The label is the half of the vocabulary the review's last word comes from; the first words are noise,
    and a numeric column (stars) that is not text sits between the text and the label."""
    rows = []
    for _ in range(n):
        positive = rng.random() < 0.5
        row = {"review": " ".join(rng.sample(WORDS, 3) + [rng.choice(WORDS[:4] if positive else WORDS[4:])]),
               "stars": rng.randint(1, 5)}
        if labelled:
            row["label"] = "pos" if positive else "neg"
        rows.append(row)
    return rows


def score_rows(n: int, rng: random.Random) -> list[dict]:
    """A pair regression task: the score is 1.5 x the number of 'first half' words in sentence2, plus 0.25."""
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(3)]
        rows.append({"sentence1": " ".join(rng.sample(WORDS, 2)), "sentence2": " ".join(words),
                     "label": 1.5 * sum(w in WORDS[:4] for w in words) + 0.25})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    return path


@pytest.fixture
def vocab(tmp_path) -> Path:
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return path


def train_flags(vocab: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", "preset:tiny", "--tokenizer", str(vocab), "--output_dir", str(out), "--disable_tqdm", "true",
            "--learning_rate", "1e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "16",
            "--max_seq_length", "32", *extra]


# ------------------------------------------------------------------------------------- card-less, end to end


def test_cardless_csv_classification_learns_saves_its_card_and_predict_reads_it_back(tmp_path, vocab, capsys):
    rng = random.Random(0)
    train = write_records_csv(tmp_path / "train.csv", sentiment_rows(300, rng))  # all right from 200 (3 data seeds)
    dev = write_records_csv(tmp_path / "dev.csv", sentiment_rows(200, rng))
    test = write_records_csv(tmp_path / "test.csv", sentiment_rows(40, rng, labelled=False))
    out = tmp_path / "run"
    assert cli_main(["finetune", "--train_file", str(train), "--validation_file", str(dev),
                     *train_flags(vocab, out)]) == 0
    said = capsys.readouterr().out
    assert "text review, label label, 2 classes (neg, pos)" in said  # stars is a number, not a text column
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_accuracy"] > 0.9 and "eval_f1" in results  # chance is 0.5; F1 for two classes
    card = yaml.safe_load((out / "task_card.yaml").read_text())
    assert card["labels"] == ["neg", "pos"] and card["text_columns"] == ["review"] and card["select"] == "accuracy"
    assert card["splits"]["train"]["data_file"] == str(train.resolve())
    manifest = json.loads((out / "run_manifest.json").read_text())
    assert manifest["card"] == str(out / "task_card.yaml")
    assert manifest["data_files"] == {"train": str(train.resolve()), "validation": str(dev.resolve())}

    # predict finds the card beside the checkpoint; --test_file adds the test split
    assert cli_main(["predict", "--model", str(out), "--test_file", str(test), "--output_dir", str(tmp_path / "p"),
                     "--max_seq_length", "32"]) == 0
    lines = (tmp_path / "p" / "predictions" / "test.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 41
    truth = ["pos" if r.split(",")[0].split()[-1] in WORDS[:4] else "neg" for r in test.read_text().splitlines()[1:]]
    predicted = [line.split("\t")[1] for line in lines[1:]]
    assert sum(p == t for p, t in zip(predicted, truth, strict=True)) >= 36
    # glue-package reads the run's card through its manifest: the task's dev score is in the summary
    assert cli_main(["glue-package", str(out), "--output_dir", str(tmp_path / "package")]) == 0
    summary = json.loads((tmp_path / "package" / "package.json").read_text())
    assert summary["dev"][card["name"]]["dev"] == pytest.approx(100 * results["eval_accuracy"])

    # the saved card repeats the run: on its own, with --max_*_samples
    again = tmp_path / "again"
    assert cli_main(["finetune", str(out / "task_card.yaml"), *train_flags(vocab, again, "--num_train_epochs", "1"),
                     "--max_train_samples", "50", "--max_eval_samples", "30"]) == 0
    results = json.loads((again / "all_results.json").read_text())
    assert results["train_samples"] == 50 and results["eval_samples"] == 30
    assert json.loads((again / "run_manifest.json").read_text())["max_samples"] == {"train": 50, "eval": 30}


def test_labelled_test_file_is_scored_by_finetune_and_by_the_grids_best_trial(tmp_path, vocab, capsys):
    """A test file with labels (the usual way to keep a test set) is predicted and scored: test_<metric> in
    all_results.json, computed on the predictions written; the grid scores its best trial only, after the
    choice on dev, and says so in its report."""
    rng = random.Random(5)
    train = write_records_csv(tmp_path / "train.csv", sentiment_rows(300, rng))
    dev = write_records_csv(tmp_path / "dev.csv", sentiment_rows(200, rng))
    test = write_records_csv(tmp_path / "test.csv", sentiment_rows(120, rng))
    out = tmp_path / "run"
    assert cli_main(["finetune", "--train_file", str(train), "--validation_file", str(dev), "--test_file", str(test),
                     *train_flags(vocab, out)]) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "all_results.json").read_text())
    assert results["test_accuracy"] > 0.9 and "test_f1" in results and "eval_accuracy" in results  # chance: 0.5
    assert '"test_accuracy"' in printed
    lines = (out / "predictions" / "test.tsv").read_text().splitlines()[1:]
    truth = [row["label"] for row in csv.DictReader(test.open())]
    written = sum(line.split("\t")[1] == t for line, t in zip(lines, truth, strict=True)) / len(truth)
    assert results["test_accuracy"] == pytest.approx(written)
    assert json.loads((out / "predictions" / "test_results.json").read_text())["accuracy"] == results["test_accuracy"]

    grid = tmp_path / "grid"
    assert cli_main(["grid", "--train_file", str(train), "--validation_file", str(dev), "--test_file", str(dev),
                     "--model", "preset:tiny", "--tokenizer", str(vocab), "--output_dir", str(grid),
                     "--disable_tqdm", "true", "--max_seq_length", "32", "--learning_rates", "1e-3", "3e-5",
                     "--batch_sizes", "16", "--epochs", "2"]) == 0
    best = json.loads((grid / "best_trial.json").read_text())
    # the test file is the dev file here: the best trial's test score is its dev score, to the digit
    assert best["test_metrics"]["test_accuracy"] == pytest.approx(best["metrics"]["eval_accuracy"])
    assert json.loads((grid / "best" / "predictions" / "test_results.json").read_text())["accuracy"] == \
        best["test_metrics"]["test_accuracy"]
    report = (grid / "grid_results.md").read_text()
    assert "## Test set (best trial only)" in report and f"Trial {best['trial']}, chosen on dev" in report
    assert f"| accuracy | {100 * best['test_metrics']['test_accuracy']:.2f} |" in report
    # a second worker finishing the same grid replaces the section, it does not add one
    from bert_suite.cli import _record_grid_test_scores

    _record_grid_test_scores(grid, {"best": best, "files": {}}, best["test_metrics"])
    assert (grid / "grid_results.md").read_text().count("## Test set (best trial only)") == 1


def test_a_labelled_test_file_may_name_its_label_as_the_train_split_does(tmp_path):
    """STS-B's card reads the label from a column named score: a CSV test file with that column is labelled."""
    from bert_suite.adapters.classification import read_file_split

    card = with_data_files(load_card("stsb"), test_file=str(write_records_csv(
        tmp_path / "test.csv", [{"sentence1": "a man", "sentence2": "a woman", "score": 3.5}])))
    dataset, _ = read_file_split(card, "test", tmp_path / "test.csv")
    assert dataset["label"] == [3.5]


def test_cardless_jsonl_regression_learns(tmp_path, vocab, capsys):
    rng = random.Random(1)
    train = write_jsonl(tmp_path / "scores_train.jsonl", score_rows(500, rng))
    dev = write_jsonl(tmp_path / "scores_dev.jsonl", score_rows(150, rng))
    test = write_jsonl(tmp_path / "new.jsonl", [{k: v for k, v in r.items() if k != "label"}
                                                 for r in score_rows(30, rng)])
    out = tmp_path / "run"
    assert cli_main(["finetune", "--train_file", str(train), "--validation_file", str(dev), "--test_file", str(test),
                     *train_flags(vocab, out, "--num_train_epochs", "4")]) == 0
    assert "regression (float scores)" in capsys.readouterr().out
    card = load_card(out / "task_card.yaml")
    assert card.is_regression and card.name == "scores_train" and card.text_columns == ["sentence1", "sentence2"]
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_pearson"] > 0.8 and results["eval_spearmanr"] > 0.8  # chance is 0
    # --test_file is predicted after training, as the example scripts' --do_predict
    scores = [float(line.split("\t")[1]) for line in (out / "predictions" / "test.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 30 and 0 < min(scores) and max(scores) < 6


def test_cardless_parquet_three_classes_through_the_grid(tmp_path, vocab):
    """Three classes from Parquet (labels are integers: sorted numerically), a two-point grid, and predict
    from the grid's best checkpoint without naming the task."""
    rng = random.Random(2)

    def rows(n):
        out = []
        for _ in range(n):
            label = rng.choice([3, 10, 20])
            cue = {3: WORDS[0], 10: WORDS[3], 20: WORDS[6]}[label]
            out.append({"idx": len(out), "text": " ".join(rng.sample(WORDS, 2) + [cue]), "label": label})
        return out

    train = write_parquet(tmp_path / "train.parquet", rows(225))  # all right at 225 (3 data seeds)
    dev = write_parquet(tmp_path / "dev.parquet", rows(120))
    out = tmp_path / "grid"
    flags = ["--model", "preset:tiny", "--tokenizer", str(vocab), "--output_dir", str(out), "--disable_tqdm", "true",
             "--max_seq_length", "32"]
    assert cli_main(["grid", "--train_file", str(train), "--validation_file", str(dev), *flags,
                     "--learning_rates", "1e-3", "2e-3", "--batch_sizes", "16", "--epochs", "3"]) == 0
    best = json.loads((out / "best_trial.json").read_text())
    assert best["metrics"]["eval_accuracy"] > 0.9  # chance is 1/3
    card = load_card(out / "best" / "task_card.yaml")
    assert card.labels == ["3", "10", "20"] and card.metric == "accuracy"
    assert cli_main(["predict", "--model", str(out / "best"), "--split", "dev", "--output_dir",
                     str(tmp_path / "p"), "--max_predict_samples", "25"]) == 0
    lines = (tmp_path / "p" / "predictions" / "dev.tsv").read_text().splitlines()
    assert len(lines) == 26 and {line.split("\t")[1] for line in lines[1:]} <= {"3", "10", "20"}


# ------------------------------------------------------------------------------------- files on a shipped card


def test_files_override_the_card_split_by_split_and_combine_with_data_dir(tmp_path, vocab):
    """rte: train from a GLUE-layout TSV (--train_file), dev from JSON Lines with Hub-style class ids
    (--validation_file), test from --data_dir."""
    rng = random.Random(3)
    data = tmp_path / "RTE"
    data.mkdir()

    def pair(i):
        positive = rng.random() < 0.5
        return i, " ".join(rng.sample(WORDS, 3)), rng.choice(WORDS[:4] if positive else WORDS[4:]), positive

    train = tmp_path / "mine.tsv"
    train.write_text("index\tsentence1\tsentence2\tlabel\n" + "".join(
        f"{i}\t{a}\t{b}\t{'entailment' if p else 'not_entailment'}\n" for i, a, b, p in map(pair, range(300))))
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"sentence1": a, "sentence2": b, "label": 0 if p else 1, "idx": i}
                                               for i, a, b, p in map(pair, range(80))])
    (data / "test.tsv").write_text("index\tsentence1\tsentence2\n" + "".join(
        f"{i}\t{a}\t{b}\n" for i, a, b, _ in map(pair, range(20))))
    out = tmp_path / "run"
    assert cli_main(["finetune", "rte", "--train_file", str(train), "--validation_file", str(dev), "--data_dir",
                     str(data), *train_flags(vocab, out, "--num_train_epochs", "2")]) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_samples"] == 300 and results["eval_samples"] == 80
    assert results["eval_accuracy"] > 0.85  # class ids 0/1 were read as entailment/not_entailment
    assert cli_main(["predict", "rte", "--model", str(out), "--data_dir", str(data), "--max_seq_length", "32"]) == 0
    assert len((out / "predictions" / "test.tsv").read_text().splitlines()) == 21


def test_validation_file_replaces_all_dev_splits_and_test_file_adds_a_test_split(tmp_path, capsys):
    for name in ("dev.csv", "new.json"):
        (tmp_path / name).write_text("{}")
    mnli = with_data_files(load_card("mnli"), None, str(tmp_path / "dev.csv"), None)
    assert mnli.eval_splits == ["validation_matched"]
    assert mnli.splits["validation_matched"].data_file == str((tmp_path / "dev.csv").resolve())
    assert "replaces the card's validation splits validation_matched, validation_mismatched" in capsys.readouterr().out
    squad = with_data_files(load_card("squad"), None, None, str(tmp_path / "new.json"))
    assert squad.test_splits == ["test"] and squad.splits["test"].data_file.endswith("new.json")
    assert load_card("squad").test_splits == []  # the card itself is untouched


# ------------------------------------------------------------------------------------- building the card


@pytest.mark.parametrize("columns, chosen, expected", [
    ({"sentence1": "a", "sentence2": "b", "premise": "c", "label": "x"}, None, ["sentence1", "sentence2"]),
    ({"id": 1, "title": "a", "body": "b", "extra": "c", "label": "x"}, None, ["title", "body"]),  # first two texts
    ({"idx": 0, "n": 3, "text": "a", "label": "x"}, None, ["text"]),  # numbers and idx are not text
    ({"title": "a", "body": "b", "label": "x"}, ["body"], ["body"]),  # --text_columns
])
def test_text_columns_as_run_glue_chooses_them(tmp_path, columns, chosen, expected):
    rows = [dict(columns, label=lab) for lab in ("x", "y", "x")]
    for name in ("t.jsonl", "d.jsonl"):
        write_jsonl(tmp_path / name, rows)
    card = card_from_files(str(tmp_path / "t.jsonl"), str(tmp_path / "d.jsonl"), text_columns=chosen)
    assert card.text_columns == expected and card.labels == ["x", "y"]


def test_label_kinds_ids_floats_and_label_column(tmp_path):
    def build(labels, dev_labels=None, column="label", **kwargs):
        rows = [{"text": "apple", column: v} for v in labels]
        write_records_csv(tmp_path / "t.csv", rows)
        write_records_csv(tmp_path / "d.csv", [{"text": "apple", column: v} for v in (dev_labels or labels)])
        return card_from_files(str(tmp_path / "t.csv"), str(tmp_path / "d.csv"), **kwargs)

    assert build([2, 10, 1, 10]).labels == ["1", "2", "10"]  # numerically, as run_glue sorts them
    card = build([0.5, 1.0, 4.25])
    assert card.is_regression and card.metric == "pearson_spearman" and card.select == "spearmanr"
    card = build(["b", "a", "c"], column="gold", label_column="gold")
    assert card.labels == ["a", "b", "c"] and card.metric == "accuracy" and card.label_column == "gold"
    with pytest.raises(DataError, match=r"d\.csv: row 2: label 'z' does not occur in the train file .*t\.csv"):
        build(["a", "b"], dev_labels=["a", "z"])
    with pytest.raises(DataError, match=r"t\.csv: column 'label' mixes numbers \(row 1: '1'\) and text \(row 2: 'pos'\)"):
        build(["1", "pos"])
    with pytest.raises(DataError, match=r"holds one value \('a'\) in every row; expected two or more classes"):
        build(["a", "a"])


def test_task_family_reads_the_settings_from_the_files(tmp_path):
    official = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "the red apple", "qas": [
        {"id": "q1", "question": "which?", "answers": [{"text": "red", "answer_start": 4}], "is_impossible": False},
        {"id": "q2", "question": "who?", "answers": [], "is_impossible": True}]}]}]}
    (tmp_path / "v2.json").write_text(json.dumps(official))
    del official["data"][0]["paragraphs"][0]["qas"][1]
    (tmp_path / "v1.json").write_text(json.dumps(official))
    flat = [{"id": "q1", "context": "the red apple", "question": "which?", "answers": {"text": [], "answer_start": []}}]
    write_jsonl(tmp_path / "flat.jsonl", flat)
    for train, version_2 in (("v2.json", True), ("v1.json", False), ("flat.jsonl", True)):
        card = card_from_files(str(tmp_path / train), str(tmp_path / train), family="squad")
        assert card.options["version_2_with_negative"] is version_2 and card.hub is None and not card.paper

    (tmp_path / "mc.csv").write_text(",sent1,sent2,ending0,ending1,ending2,label\n0,a,b,c,d,e,1\n")
    card = card_from_files(str(tmp_path / "mc.csv"), str(tmp_path / "mc.csv"), family="multiple_choice")
    assert card.options["endings"] == ["ending0", "ending1", "ending2"]

    (tmp_path / "ner.txt").write_text("EU NNP B-NP I-GENE\nrejects VBZ B-VP O\n\nGerman JJ B-NP B-CELL\n")
    card = card_from_files(str(tmp_path / "ner.txt"), str(tmp_path / "ner.txt"), family="ner")
    assert card.labels == ["O", "B-CELL", "I-CELL", "B-GENE", "I-GENE"]
    write_jsonl(tmp_path / "ner.jsonl", [{"tokens": ["EU", "rejects"], "ner_tags": ["B-ORG", "O"]}])
    assert card_from_files(str(tmp_path / "ner.jsonl"), str(tmp_path / "ner.jsonl"), family="ner").labels == \
        ["O", "B-ORG", "I-ORG"]


def test_flat_squad_records_read_as_the_official_file(tmp_path):
    from bert_suite.adapters.squad import read_squad_file, read_squad_json

    official = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "the red apple is here", "qas": [
        {"id": "a", "question": "which?", "answers": [{"text": "red", "answer_start": 4}]},
        {"id": "b", "question": "what?", "answers": [{"text": "apple", "answer_start": 8},
                                                     {"text": "red apple", "answer_start": 4}]}]}]}]}
    (tmp_path / "o.json").write_text(json.dumps(official))
    rows = [{"id": qa["id"], "title": "T", "context": "the red apple is here", "question": qa["question"],
             "answers": {"text": [a["text"] for a in qa["answers"]],
                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for qa in official["data"][0]["paragraphs"][0]["qas"]]
    card = load_card("squad")
    expected = read_squad_json(tmp_path / "o.json")[0].to_list()
    for path in (write_jsonl(tmp_path / "f.jsonl", rows), write_parquet(tmp_path / "f.parquet", rows)):
        assert read_squad_file(card, "train", path)[0].to_list() == expected


# ------------------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("argv, task, rest", [
    (["finetune", "--model", "m", "--train_file", "t.csv", "--learning_rate", "1e-3"], None,
     ["--learning_rate", "1e-3"]),
    (["finetune", "rte", "--model", "m", "--learning_rate", "1e-3"], "rte", ["--learning_rate", "1e-3"]),
    (["finetune", "--model", "m", "rte", "--seed", "3"], "rte", ["--seed", "3"]),
])
def test_a_flag_value_is_never_taken_for_the_task(argv, task, rest):
    args, left = build_parser().parse_known_args(argv)
    _give_back_flag_value(args, argv, left)
    assert args.task == task and left == rest


def test_the_parser_offers_every_family():
    from bert_suite.cards import FAMILIES
    from bert_suite_cli import FAMILY_NAMES

    assert FAMILY_NAMES == FAMILIES  # the parser cannot import the package (no torch at --help)
