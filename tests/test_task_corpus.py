"""`bert-suite corpus --from_task`: a task's train texts as pre-training documents, on GLUE-layout
folders the tests write. Every train text is written, no dev or test text ever is (a dev or test
split is refused before anything is read), and the file is what `pretrain-data --format lines` reads:
one document per example, a sentence pair as two lines of one document."""

import pytest

from bert_suite.pretraining.instances import build_pretraining_dataset
from bert_suite_cli import main as cli_main

# Each split draws its words from its own set, so a single leaked word names the split it came from.
TRAIN_WORDS = [f"train{c}" for c in "abcdefghij"]
DEV_WORDS = [f"dev{c}" for c in "abcdefghij"]
TEST_WORDS = [f"test{c}" for c in "abcdefghij"]


def _sentence(words, i, salt):
    return " ".join(words[(i * salt + k) % len(words)] for k in range(4)) + f" n{i} ."


def write_pair_task(folder, n_train=30, n_dev=10, n_test=10):
    """RTE's layout (index, sentence1, sentence2, label); returns the train pairs."""
    folder.mkdir(parents=True)
    pairs = {}
    for split, words, n in (("train", TRAIN_WORDS, n_train), ("dev", DEV_WORDS, n_dev), ("test", TEST_WORDS, n_test)):
        rows = [(_sentence(words, i, 3), _sentence(words, i, 7)) for i in range(n)]
        pairs[split] = rows
        header = "index\tsentence1\tsentence2" + ("" if split == "test" else "\tlabel")
        lines = [f"{i}\t{a}\t{b}" + ("" if split == "test" else "\tentailment") for i, (a, b) in enumerate(rows)]
        (folder / f"{split}.tsv").write_text("\n".join([header, *lines]) + "\n")
    return pairs["train"]


def documents(path):
    return [doc.split("\n") for doc in path.read_text().strip().split("\n\n")]


def test_writes_every_train_pair_as_one_document_and_no_dev_or_test_text(tmp_path, capsys):
    train = write_pair_task(tmp_path / "RTE")
    assert cli_main(["corpus", "--from_task", "rte", "--data_dir", str(tmp_path / "RTE"),
                     "--output_dir", str(tmp_path / "out")]) == 0
    path = tmp_path / "out" / "rte-train.txt"
    assert documents(path) == [[a, b] for a, b in train]
    text = path.read_text()
    assert not any(word in text for word in DEV_WORDS + TEST_WORDS)
    assert f"wrote {path}: 30 train examples of rte -> 30 documents, 60 lines" in capsys.readouterr().out


@pytest.mark.parametrize("split", ["dev", "validation", "test", "validation_matched"])
def test_a_dev_or_test_split_is_refused_before_anything_is_read(tmp_path, capsys, split):
    write_pair_task(tmp_path / "RTE")
    assert cli_main(["corpus", "--from_task", "rte", "--split", split, "--data_dir", str(tmp_path / "RTE"),
                     "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bert-suite corpus: error: --split {split}: only the task's train split (train) may become "
                   "pre-training text, never dev or test text (the scores would be measured on text the model was "
                   "trained on)")
    assert not (tmp_path / "out").exists()


def test_one_text_task_on_own_csv_is_one_line_per_document(tmp_path, capsys):
    rows = [_sentence(TRAIN_WORDS, i, 3) for i in range(12)]
    own = tmp_path / "reviews.csv"
    own.write_text("sentence,label\n" + "".join(f"{s},{i % 2}\n" for i, s in enumerate(rows)) + ",1\n")
    assert cli_main(["corpus", "--from_task", "sst2", "--train_file", str(own), "--output_dir", str(tmp_path)]) == 2
    assert "reviews.csv: row 13: empty or non-text 'sentence'" in capsys.readouterr().err
    assert cli_main(["corpus", "--from_task", "sst2", "--train_file", str(own), "--output_dir", str(tmp_path),
                     "--skip_bad_rows"]) == 0
    assert documents(tmp_path / "sst2-train.txt") == [[s] for s in rows]
    out = capsys.readouterr().out
    assert "skipped 1 malformed rows" in out and "12 train examples of sst2 -> 12 documents, 12 lines" in out


def test_flags_that_need_from_task_and_a_data_file_as_data_dir_are_errors(tmp_path, capsys):
    write_pair_task(tmp_path / "RTE")
    assert cli_main(["corpus", "--output_dir", str(tmp_path / "out"), "--split", "train"]) == 2
    assert "--split: only with --from_task TASK" in capsys.readouterr().err
    assert cli_main(["corpus", "--from_task", "rte", "--data_dir", str(tmp_path / "RTE" / "dev.tsv"),
                     "--output_dir", str(tmp_path / "out")]) == 2
    assert "expected the task's folder" in capsys.readouterr().err
    assert cli_main(["corpus", "--from_task", "rte", "--heldout_share", "0.1", "--output_dir", str(tmp_path)]) == 2
    assert "--heldout_share: for the embedded corpus" in capsys.readouterr().err


def test_pretrain_data_reads_the_file_as_the_documents_written(tmp_path):
    train = write_pair_task(tmp_path / "RTE", n_train=40)
    assert cli_main(["corpus", "--from_task", "rte", "--data_dir", str(tmp_path / "RTE"),
                     "--output_dir", str(tmp_path)]) == 0
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *TRAIN_WORDS,
                                *(f"n{i}" for i in range(40))]) + "\n")
    stats = build_pretraining_dataset([str(tmp_path / "rte-train.txt")], str(vocab), str(tmp_path / "data"),
                                      max_seq_length=32, fmt="lines")
    assert (stats["documents"], stats["sentences"]) == (40, 80)
    # every word known: 4 words, a number and a full stop per sentence, nothing read as [UNK]
    assert stats["corpus_tokens"] == sum(len(a.split()) + len(b.split()) for a, b in train)
