"""SWAG multiple choice: the official CSV reader (quoting, index column, unlabelled test, bad rows),
the Hub layout, the four-sequence encoding, the collator, and a tiny model learning a synthetic
SWAG-like task end to end through `finetune` and `predict`."""

import csv
import json
import random
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
import transformers
import yaml

from bert_suite.adapters import DataError
from bert_suite.adapters import multiple_choice as mc
from bert_suite.cards import load_card
from bert_suite.cli import main as cli_main

HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]
COLORS = {"red": "apple", "green": "leaf", "blue": "sky", "yellow": "banana"}  # colour cue -> the right object
FILLER = "the man woman then slowly walks looks holds at a near and".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *COLORS, *COLORS.values(), *FILLER, ",", '"', "."]
SAMPLE = Path(__file__).resolve().parents[2] / "shared" / "data" / "samples" / "swag" / "sample.json"


@pytest.fixture(scope="module")
def card():
    return load_card("swag")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    vocab = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    return transformers.BertTokenizer(vocab=str(vocab), do_lower_case=True)


def write_csv(path: Path, rows: list[list], header=HEADER) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        if header is not None:
            writer.writerow(header)
        writer.writerows(rows)
    return path


def row(i, sent1="A man holds a red apple.", sent2="The man", endings=("walks.", "looks.", "holds.", "smiles."),
        label=0, labelled=True):
    out = [i, f"video{i}", 100 + i, f"{sent1} {sent2}", sent1, sent2, "gold", *endings]
    return out + [label] if labelled else out


# ---------------------------------------------------------------------------------------------------------------
# Reading the official CSV files


def test_reads_quoted_text_index_column_and_labels(tmp_path, card):
    write_csv(tmp_path / "val.csv", [
        row(7, sent1='She says "hello, world", then waves.', sent2="A man, smiling,",
            endings=('says "yes".', "walks, then runs.", "looks\nup.", "sits."), label=2),
        row(8, label="3"),
    ])
    data = mc.load_split(card, "validation", tmp_path)
    assert data.column_names == ["idx", "sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"]
    assert data["idx"] == [7, 8] and data["label"] == [2, 3]
    first = data[0]
    assert first["sent1"] == 'She says "hello, world", then waves.' and first["sent2"] == "A man, smiling,"
    assert first["ending0"] == 'says "yes".' and first["ending2"] == "looks\nup."
    # one .csv file as --data_dir works too; without the index column idx is the row's position
    plain = write_csv(tmp_path / "plain.csv", [r[1:] for r in (row(5), row(6, label=1))], header=HEADER[1:])
    data = mc.load_split(card, "validation", plain)
    assert data["idx"] == [0, 1] and data["label"] == [0, 1]


def test_unlabelled_test_file_has_no_label_column(tmp_path, card):
    write_csv(tmp_path / "test.csv", [row(i, labelled=False) for i in range(3)], header=HEADER[:-1])
    data = mc.load_split(card, "test", tmp_path)
    assert "label" not in data.column_names and data["idx"] == [0, 1, 2]


BAD_ROWS = {
    "empty ending": (row(1, endings=("a.", "", "c.", "d.")), ["'ending1'", "empty"]),
    "label out of range": (row(1, label=4), ["label 4", "0..3"]),
    "label not an integer": (row(1, label="1.0"), ["'1.0'", "not an integer"]),
    "empty sent1": (row(1, sent1="  "), ["'sent1'", "empty"]),
    "too few fields": (row(1)[:-2], ["expected 12", "found 10"]),
    "bad index": (["x", *row(1)[1:]], ["index 'x'", "not an integer"]),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_bad_row_names_file_line_and_expectation(tmp_path, card, case):
    bad, words = BAD_ROWS[case]
    # a quoted line break in row 0 makes the bad record start on line 4, not 3
    path = write_csv(tmp_path / "train.csv", [row(0, endings=("a\nb.", "b.", "c.", "d.")), bad, row(2)])
    with pytest.raises(DataError) as err:
        mc.load_split(card, "train", tmp_path)
    message = str(err.value)
    assert message.startswith(f"{path}:4: ")
    for word in words:
        assert word in message


def test_missing_header_column_and_missing_file(tmp_path, card):
    path = write_csv(tmp_path / "train.csv", [row(0)[:-1]], header=HEADER[:-1])  # no label column
    with pytest.raises(DataError, match=re.escape(f"{path}:1: header has no column 'label'")):
        mc.load_split(card, "train", tmp_path)
    with pytest.raises(DataError, match="val.csv: file not found"):
        mc.load_split(card, "validation", tmp_path)
    (tmp_path / "test.csv").write_text("")
    with pytest.raises(DataError, match="empty file"):
        mc.load_split(card, "test", tmp_path)


def test_skip_bad_rows_counts_and_reports(tmp_path, card, capsys):
    write_csv(tmp_path / "train.csv", [row(0), row(1, label=9), row(2, endings=("a.", "b.", "c.", " ")), row(3)])
    with pytest.raises(DataError):
        mc.load_split(card, "train", tmp_path)
    data = mc.load_split(card, "train", tmp_path, skip_bad_rows=True)
    assert data["idx"] == [0, 3]
    assert "skipped 2 malformed rows" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------------------
# The Hub layout (allenai/swag, regular)


def hub_rows(n, label=1):
    return [{"video-id": f"v{i}", "fold-ind": str(i), "startphrase": "x", "sent1": f"Someone sits {i}.",
             "sent2": "The man", "gold-source": "gold", "ending0": "a.", "ending1": "b.", "ending2": "c.",
             "ending3": "d.", "label": label} for i in range(n)]


def test_hub_layout_through_load_split(card, monkeypatch):
    loaded = {}

    def fake_load(path, name, split):
        loaded[split] = (path, name)
        return datasets.Dataset.from_list(hub_rows(3, label=-1 if split == "test" else 1))

    monkeypatch.setattr(mc.datasets, "load_dataset", fake_load)
    dev = mc.load_split(card, "validation")
    assert loaded["validation"] == ("allenai/swag", "regular")
    assert dev["idx"] == [0, 1, 2] and dev["label"] == [1, 1, 1] and dev[0]["sent1"] == "Someone sits 0."
    test = mc.load_split(card, "test")  # unlabelled: the -1 labels are not read
    assert "label" not in test.column_names and len(test) == 3
    monkeypatch.setattr(mc.datasets, "load_dataset",
                        lambda *a, **k: datasets.Dataset.from_list(hub_rows(2)).remove_columns("ending3"))
    with pytest.raises(DataError, match="allenai/swag .*split validation: no column 'ending3'"):
        mc.load_split(card, "validation")
    monkeypatch.setattr(mc.datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(hub_rows(2, 5)))
    with pytest.raises(DataError, match="split train, record 0: label 5 is out of range"):
        mc.load_split(card, "train")


@pytest.mark.skipif(not SAMPLE.is_file(), reason="no shared SWAG sample")
def test_shared_hub_sample_reads(card):
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    data, skipped = mc.build_dataset(mc.hub_records(datasets.Dataset.from_list(rows), "sample", card, True), card,
                                     labelled=True)
    assert skipped == 0 and len(data) == len(rows)
    assert data["label"] == [r["label"] for r in rows] and data[0]["ending0"] == rows[0]["ending0"]


# ---------------------------------------------------------------------------------------------------------------
# Encoding and batching


def test_encoding_four_pairs_segments_and_truncation(card, tokenizer):
    examples = datasets.Dataset.from_list([
        {"idx": 4, "sent1": "the red man", "sent2": "a woman", "ending0": "holds apple", "ending1": "looks",
         "ending2": "walks near the sky", "ending3": "holds " + "banana " * 30, "label": 3},
    ])
    encoded = mc.preprocess(examples, card, tokenizer, max_seq_length=16, train=True)
    assert set(encoded.column_names) == {"idx", "input_ids", "token_type_ids", "attention_mask", "labels"}
    feature = encoded[0]
    assert feature["idx"] == 4 and feature["labels"] == 3
    assert [len(x) for x in feature["input_ids"]] == [10, 9, 12, 16]  # no padding; the long one truncated
    decoded = [tokenizer.decode(ids) for ids in feature["input_ids"]]
    assert decoded[0] == "[CLS] the red man [SEP] a woman holds apple [SEP]"
    assert decoded[3].startswith("[CLS] the red man [SEP] a woman holds banana") and decoded[3].endswith("[SEP]")
    assert feature["token_type_ids"][0] == [0] * 5 + [1] * 5  # segment A up to and including the first [SEP]
    assert all(set(mask) == {1} for mask in feature["attention_mask"])
    # longest-first: the long ending loses tokens; the short sentence is kept whole
    assert feature["token_type_ids"][3].count(0) == 5
    unlabelled = mc.preprocess(examples.remove_columns("label"), card, tokenizer, 16)
    assert "labels" not in unlabelled.column_names


def test_collator_pads_choices_to_the_longest_and_keeps_labels(card, tokenizer):
    examples = datasets.Dataset.from_list([
        {"idx": 0, "sent1": "red", "sent2": "", "ending0": "apple", "ending1": "sky", "ending2": "leaf",
         "ending3": "banana", "label": 0},
        {"idx": 1, "sent1": "the blue man", "sent2": "then", "ending0": "looks at the sky", "ending1": "walks",
         "ending2": "holds a leaf", "ending3": "holds", "label": 2},
    ])
    encoded = mc.preprocess(examples, card, tokenizer, 32)
    assert tokenizer.decode(encoded[0]["input_ids"][0]) == "[CLS] red [SEP] apple [SEP]"  # empty sent2
    batch = mc.collator(tokenizer)([encoded[0], encoded[1]])
    longest = max(len(ids) for f in encoded for ids in f["input_ids"])
    for key in ("input_ids", "token_type_ids", "attention_mask"):
        assert tuple(batch[key].shape) == (2, 4, longest)
    assert batch["labels"].tolist() == [0, 2]
    short = len(encoded[0]["input_ids"][0])
    assert batch["input_ids"][0, 0, short:].eq(tokenizer.pad_token_id).all()
    assert batch["attention_mask"][0, 0].tolist() == [1] * short + [0] * (longest - short)
    assert batch["input_ids"][1, 0].tolist() == encoded[1]["input_ids"][0]
    nolabels = mc.collator(tokenizer)([{k: v for k, v in encoded[0].items() if k != "labels"}])
    assert "labels" not in nolabels and tuple(nolabels["input_ids"].shape)[:2] == (1, 4)


def test_accuracy_and_prediction_file(tmp_path, card):
    logits = np.array([[0.1, 2.0, 0.0, 0.0], [3.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    metric = mc.metric_fn(card, None, None)(transformers.EvalPrediction(predictions=logits,
                                                                        label_ids=np.array([1, 0, 2])))
    assert metric == {"accuracy": pytest.approx(2 / 3)}
    features = {"idx": [10, 11, 12]}
    assert mc.write_outputs(tmp_path, card, "validation", None, features, logits, {}) == {}
    assert (tmp_path / "dev.csv").read_text() == "idx,prediction\n10,1\n11,0\n12,3\n"
    assert mc.output_path(tmp_path, card, "test") == tmp_path / "test.csv"


# ---------------------------------------------------------------------------------------------------------------
# End to end


def write_swag_like(folder: Path, n_train=240, n_dev=80, n_test=30, seed=0) -> Path:
    """sent1 names a colour among filler words; the right ending names that colour's object, the three
    distractors name no object. A tiny model learns this per-ending cue in a few dozen steps; a task
    only the (sentence, ending) pair decides (distractors naming the other colours' objects) is an
    interaction a random tiny model did not pick up in 120 steps, too slow for a fast test. Even so the
    test checks what can break: four sequences per example, labels aligned with their choices, the
    softmax over choices and the idx -> prediction file. Written as the official CSVs: unnamed index
    column, quoted text with commas and quotes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    rng = random.Random(seed)

    def rows(n, labelled=True):
        out = []
        for i in range(n):
            color = rng.choice(list(COLORS))
            words = rng.sample(FILLER, 2)
            words.insert(rng.randrange(3), color)
            sent1 = f"{words[0]}, {' '.join(words[1:])}."
            label = rng.randrange(4)
            endings = [f"{rng.choice(FILLER)} {COLORS[color] if k == label else rng.choice(FILLER)}."
                       for k in range(4)]
            out.append(row(i, sent1=sent1, sent2=f'"{rng.choice(FILLER)}"', endings=endings, label=label,
                           labelled=labelled))
        return out

    write_csv(folder / "train.csv", rows(n_train))
    write_csv(folder / "val.csv", rows(n_dev))
    write_csv(folder / "test.csv", rows(n_test, labelled=False), header=HEADER[:-1])
    return folder


def small_card(folder: Path) -> Path:
    card = yaml.safe_load(Path("tasks/swag.yaml").read_text())
    card["splits"]["validation"]["file"] = "dev_split.csv"  # a renamed local file
    card["defaults"]["max_seq_length"] = 24
    path = folder / "card.yaml"
    path.write_text(yaml.safe_dump(card))
    return path


def test_tiny_model_learns_a_swag_like_task_and_predicts_test(tmp_path, report):
    data = write_swag_like(tmp_path / "data")
    (data / "val.csv").rename(data / "dev_split.csv")
    card_path = small_card(tmp_path)
    out = tmp_path / "run"
    assert cli_main(["finetune", str(card_path), "--model", "preset:tiny", "--tokenizer", str(data / "vocab.txt"),
                     "--train_file", str(data / "train.csv"), "--validation_file", str(data / "dev_split.csv"),
                     "--output_dir", str(out), "--disable_tqdm", "true", "--learning_rate", "1e-3", "--num_train_epochs", "2", "--per_device_train_batch_size", "16",
                     "--seed", "1"]) == 0
    results = json.loads((out / "all_results.json").read_text())
    report("SWAG-like dev accuracy (tiny, 2 epochs)", f"{100 * results['eval_accuracy']:.1f}")
    assert results["eval_accuracy"] > 0.8  # chance is 0.25
    assert results["train_samples"] == 240 and results["eval_samples"] == 80
    with open(out / "predictions" / "dev.csv", newline="") as f:
        dev = list(csv.reader(f))
    assert dev[0] == ["idx", "prediction"] and len(dev) == 81
    with open(data / "dev_split.csv", newline="") as f:
        gold = {r[0]: r[-1] for r in csv.reader(f)}
    accuracy = np.mean([gold[i] == p for i, p in dev[1:]])
    assert accuracy == pytest.approx(results["eval_accuracy"])

    assert cli_main(["predict", str(card_path), "--model", str(out), "--split", "test", "--data_dir", str(data),
                     "--output_dir", str(tmp_path / "pred")]) == 0
    with open(tmp_path / "pred" / "predictions" / "test.csv", newline="") as f:
        test = list(csv.reader(f))
    assert test[0] == ["idx", "prediction"] and [r[0] for r in test[1:]] == [str(i) for i in range(30)]
    assert {r[1] for r in test[1:]} <= {"0", "1", "2", "3"}
    assert not (tmp_path / "pred" / "predictions" / "test_results.json").exists()  # unlabelled: nothing to score

    # a labelled test file (here the dev file again) is predicted and scored: the dev score, to the digit
    assert cli_main(["predict", str(card_path), "--model", str(out), "--test_file", str(data / "dev_split.csv"),
                     "--output_dir", str(tmp_path / "labelled")]) == 0
    scored = json.loads((tmp_path / "labelled" / "predictions" / "test_results.json").read_text())
    assert scored == {"accuracy": pytest.approx(results["eval_accuracy"])}
