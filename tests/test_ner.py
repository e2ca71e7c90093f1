"""CoNLL-2003 NER adapter on data the tests write: reading (IOB1/IOB2 detection and conversion, documents,
errors naming file and line), windows over documents and sentences (no word ever dropped, max-context
choice), conlleval-style entity scores, the prediction file, and a tiny model trained through the runner."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import datasets
import numpy as np
import pytest
import transformers
import yaml
from seqeval.metrics.sequence_labeling import precision_recall_fscore_support

from bert_suite.adapters import DataError, max_context_windows, ner, window_starts
from bert_suite.cards import SplitSpec, load_card
from bert_suite.cli import main as cli_main
from helpers import LABELS, conll_text, write_synthetic

LETTERS = "abcdefghijklmnopqrstuvwxyz"
UNIT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *LETTERS, *(f"##{c}" for c in LETTERS), ".", ",",
              "the", "went", "to", "Paris", "Alice", "Berlin", "Acme", "Corp", "EU", "German", "Bob", "Carla",
              "Dana", "Eve", "Frank"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(UNIT_VOCAB)) + "\n", encoding="utf-8")
    return transformers.BertTokenizer(vocab=str(path), do_lower_case=False)


def card_with(**options):
    card = load_card("conll2003")
    return dataclasses.replace(card, options={**card.options, **options}, hub={"path": "bert-suite-tests/none"},
                               splits={"train": SplitSpec(hub="train", file="train.txt"),
                                       "validation": SplitSpec(hub="validation", file="valid.txt"),
                                       "test": SplitSpec(hub="test", file="test.txt")})


def write(tmp_path: Path, text: str, name="data.txt") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------------------
# Card, schemes, reading


def test_card_loads_with_the_hub_label_order_and_paper_numbers():
    card = load_card("conll2003")
    assert card.family == "ner" and card.labels == LABELS and card.select == "f1"
    assert ner.ner_options(card) == {"context": "document", "label_all_subtokens": False}
    assert card.paper == {"base_dev": 96.4, "large_dev": 96.6} and card.defaults["max_seq_length"] == 128
    kwargs = ner.model_kwargs(card)
    assert kwargs["num_labels"] == 9 and kwargs["id2label"][1] == "B-PER" and kwargs["label2id"]["I-MISC"] == 8
    assert ner.output_path(Path("p"), card, "validation") == Path("p/dev.conll")
    with pytest.raises(ValueError, match="options.contxt"):
        ner.ner_options(dataclasses.replace(card, options={"contxt": "document"}))
    with pytest.raises(ValueError, match="context must be one of"):
        ner.ner_options(dataclasses.replace(card, options={"context": "paragraph"}))


@pytest.mark.parametrize("iob1, iob2", [
    (["I-PER", "I-PER", "O"], ["B-PER", "I-PER", "O"]),  # I- at sentence start
    (["I-PER", "B-PER", "I-PER"], ["B-PER", "B-PER", "I-PER"]),  # B- between adjacent same-type entities
    (["I-PER", "I-ORG", "I-ORG"], ["B-PER", "B-ORG", "I-ORG"]),  # type change
    (["O", "I-LOC", "O", "I-LOC", "I-LOC", "B-LOC"], ["O", "B-LOC", "O", "B-LOC", "I-LOC", "B-LOC"]),
    (["O", "O"], ["O", "O"]),
])
def test_iob1_to_iob2_hand_cases(iob1, iob2):
    assert ner.iob1_to_iob2(iob1) == iob2
    assert ner.iob1_to_iob2(iob2) == iob2  # IOB2 input is a fixed point


def test_scheme_detection():
    assert ner.detect_scheme([["O", "I-PER"], ["I-LOC", "B-LOC"]])[0] == "IOB1"
    assert ner.detect_scheme([["O", "B-PER", "I-PER"], ["B-LOC", "B-LOC"]])[0] == "IOB2"
    assert ner.detect_scheme([["O"], ["O", "O"]])[0] == "IOB2"  # no entities: nothing to convert
    scheme, i_start, b_start = ner.detect_scheme([["O", "B-PER"], ["O"], ["O", "I-ORG"]])
    assert (scheme, i_start, b_start) == ("mixed", (2, 1), (0, 1))
    # B- right after a same-type token is valid in both schemes: no evidence either way
    assert ner.detect_scheme([["I-PER", "B-PER"]])[:2] == ("IOB1", (0, 0))


def test_iob1_file_is_converted_and_documents_are_kept(tmp_path, capsys):
    docs = [[[("EU", "I-ORG"), ("rejects", "O"), ("German", "I-MISC"), ("call", "O")],
             [("Peter", "I-PER"), ("Blackburn", "I-PER")]],
            [[("Alice", "I-PER"), ("Bob", "B-PER"), ("went", "O")]]]
    path = write(tmp_path, conll_text(docs), "train.txt")
    dataset, info = ner.read_conll(path, LABELS)
    assert info == {"source": str(path), "scheme": "IOB1", "converted": True, "sentences": 3, "documents": 2,
                    "words": 9, "skipped": 0, "skipped_documents": 0}
    assert dataset["tokens"][0] == ["EU", "rejects", "German", "call"]
    tags = [[LABELS[i] for i in s] for s in dataset["ner_tags"]]
    assert tags == [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER"], ["B-PER", "B-PER", "O"]]
    assert list(dataset["doc_id"]) == [0, 0, 1] and list(dataset["doc_start"]) == [True, False, True]
    assert list(dataset["id"]) == [0, 1, 2] and list(dataset["line"]) == [3, 8, 13]
    assert ner.load_split(card_with(), "train", str(tmp_path)) is not None
    assert capsys.readouterr().out.strip() == (f"[bert_suite] {path}: IOB1 tags detected, converted to IOB2 "
                                               "(3 sentences, 2 documents)")


def test_iob2_file_is_used_as_is_and_a_words_only_file_has_no_tags(tmp_path):
    docs = [[[("EU", "B-ORG"), ("rejects", "O")], [("Peter", "B-PER"), ("Blackburn", "I-PER")]]]
    dataset, info = ner.read_conll(write(tmp_path, conll_text(docs)), LABELS)
    assert (info["scheme"], info["converted"]) == ("IOB2", False)
    assert [[LABELS[i] for i in s] for s in dataset["ner_tags"]] == [["B-ORG", "O"], ["B-PER", "I-PER"]]
    # no -DOCSTART- at all: one document, nothing to restore
    dataset, info = ner.read_conll(write(tmp_path, conll_text(docs, docstart=False)), LABELS)
    assert info["documents"] == 1 and list(dataset["doc_start"]) == [False, False]
    words_only = write(tmp_path, "-DOCSTART-\n\nEU\nrejects\n\nPeter\n", "words.txt")
    dataset, info = ner.read_conll(words_only, LABELS)
    assert info["scheme"] is None and "ner_tags" not in dataset.column_names
    assert dataset["tokens"] == [["EU", "rejects"], ["Peter"]]
    with pytest.raises(DataError, match=r"words.txt:3: training data needs NER tags"):
        ner.read_conll(words_only, LABELS, require_tags=True)


@pytest.mark.parametrize("text, line, expectation", [
    ("EU NNP I-NP B-ORG\nrejects VBZ B-VP\n", 2, "expected 4 whitespace-separated columns"),
    ("EU NNP I-NP B-ORG extra\n", 1, "expected 4 whitespace-separated columns"),
    ("EU NNP I-NP B-ORG\nrejects VBZ B-VP B-FOO\n", 2, "tag 'B-FOO' is not O or B-/I- followed by one of"),
    ("EU NNP I-NP E-ORG\n", 1, "tag 'E-ORG' is not O or B-/I-"),
    ("EU NNP I-NP PER\n", 1, "tag 'PER' is not O"),
    ("EU NNP I-NP B-ORG\n\nsays VBZ B-VP O\nPeter NNP I-NP I-PER\n", 4,
     r"I-PER starts an entity \(IOB1 style\), but .*data.txt:1: B-ORG starts an entity"),
    ("EU NNP I-NP I-ORG\n\nsays VBZ B-VP O\nPeter NNP I-NP B-PER\n", 4,
     r"B-PER starts an entity after O.*IOB2 style.*but .*data.txt:1: I-ORG starts an entity"),
    ("-DOCSTART- -X- -X- O\n\nEU NNP I-NP B-ORG\n\n-DOCSTART- -X- -X- O\n\n-DOCSTART- -X- -X- O\n\nx X X O\n", 5,
     "-DOCSTART- starts an empty document"),
    ("-DOCSTART- -X- -X- O\n\nEU NNP I-NP B-ORG\n\n-DOCSTART- -X- -X- O\n\n", 5,
     "-DOCSTART- starts an empty document .no sentence before the next -DOCSTART- or the end"),
])
def test_bad_input_names_file_line_and_expectation(tmp_path, text, line, expectation):
    path = write(tmp_path, text)
    with pytest.raises(DataError, match=rf"data.txt:{line}: {expectation}"):
        ner.read_conll(path, LABELS)


def test_skip_bad_rows_counts_bad_sentences_and_empty_documents(tmp_path):
    text = ("-DOCSTART- -X- -X- O\n\nEU NNP I-NP B-ORG\nrejects VBZ B-VP\n\nPeter NNP I-NP B-PER\n\n"
            "-DOCSTART- -X- -X- O\n\n-DOCSTART- -X- -X- O\n\nAlice NNP I-NP B-FOO\n\nBob NNP I-NP B-PER\n")
    dataset, info = ner.read_conll(write(tmp_path, text), LABELS, skip_bad_rows=True)
    assert (info["skipped"], info["skipped_documents"], info["sentences"], info["documents"]) == (2, 1, 2, 2)
    assert dataset["tokens"] == [["Peter"], ["Bob"]] and list(dataset["id"]) == [1, 3]
    assert list(dataset["doc_start"]) == [True, True]
    assert "skipped 2 malformed sentences and 1 empty documents" in ner.describe(info)


def test_hub_rows_mark_documents_with_docstart_rows():
    names = datasets.ClassLabel(names=LABELS)
    features = datasets.Features({"id": datasets.Value("string"), "tokens": datasets.List(datasets.Value("string")),
                                  "ner_tags": datasets.List(names)})
    rows = datasets.Dataset.from_dict({
        "id": ["0", "1", "2", "3", "4"],
        "tokens": [["-DOCSTART-"], ["EU", "rejects"], ["Peter", "Blackburn"], ["-DOCSTART-"], ["Paris"]],
        "ner_tags": [[0], [3, 0], [1, 2], [0], [5]]}, features=features)
    dataset, info = ner.rows_to_dataset(rows, LABELS, "hub split train")
    assert (info["scheme"], info["documents"], info["sentences"]) == ("IOB2", 2, 3)
    assert list(dataset["doc_id"]) == [0, 0, 1] and list(dataset["doc_start"]) == [True, False, True]
    assert [[LABELS[i] for i in s] for s in dataset["ner_tags"]] == [["B-ORG", "O"], ["B-PER", "I-PER"], ["B-LOC"]]
    empty = rows.select([0, 3, 4])
    with pytest.raises(DataError, match="hub split train row 0: -DOCSTART- starts an empty document"):
        ner.rows_to_dataset(empty, LABELS, "hub split train")
    assert ner.rows_to_dataset(empty, LABELS, "h", skip_bad_rows=True)[1]["skipped_documents"] == 1


# --------------------------------------------------------------------------------------------------------------
# Windows


def test_windows_and_max_context_on_a_hand_built_case():
    # 10 sub-tokens, windows of 6 starting every 3: [0, 6), [3, 9), [6, 10)
    assert window_starts(10, 6, 3).tolist() == [0, 3, 6]
    assert window_starts(6, 6, 3).tolist() == [0] and window_starts(7, 6, 3).tolist() == [0, 3]
    # position 4: min(4, 1) = 1 in window 0, min(1, 4) = 1 in window 1 -> tie -> first window
    # position 5: 0 in window 0, 2 in window 1; position 7: 1 in window 1, 1 in window 2 -> window 1
    assert max_context_windows(np.arange(10), 10, 6, 3).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]


def brute_force_windows(length, window, stride):
    starts = [0]
    while starts[-1] + window < length:
        starts.append(starts[-1] + stride)
    return starts


def brute_force_best(p, length, window, stride):
    best, best_score = None, -1
    for k, begin in enumerate(brute_force_windows(length, window, stride)):
        end = min(begin + window, length)
        if begin <= p < end and min(p - begin, end - 1 - p) > best_score:
            best, best_score = k, min(p - begin, end - 1 - p)
    return best


def test_max_context_matches_a_brute_force_search():
    rng = random.Random(1)
    for _ in range(200):
        window, length = rng.randint(1, 12), rng.randint(1, 40)
        stride = rng.randint(1, window)
        positions = np.arange(length)
        expected = [brute_force_best(p, length, window, stride) for p in positions]
        assert max_context_windows(positions, length, window, stride).tolist() == expected, (window, stride)


def test_words_are_tokenised_as_is_split_into_words_does(tok):
    words = ["Alice", "went", "to", "Parisss", ".", "xyz", "EU"]
    lengths, flat = ner.word_subtokens(tok, words)
    encoded = tok(words, is_split_into_words=True, add_special_tokens=False)
    assert flat.tolist() == encoded["input_ids"]
    assert lengths.tolist() == [encoded.word_ids().count(i) for i in range(len(words))]
    # a word the tokenizer removes entirely (a soft hyphen) stands as [UNK] instead of vanishing
    lengths, flat = ner.word_subtokens(tok, ["to", "\xad", "to"])
    assert lengths.tolist() == [1, 1, 1] and flat[1] == tok.unk_token_id


def reference_features(sentences, groups, tok, max_seq_length):
    """Windows and each word's chosen feature, computed the slow obvious way."""
    window = max_seq_length - 2
    stride = max(1, window // 2)
    ids, chosen = [], {}
    for _, members in itertools.groupby(range(len(sentences)), key=lambda i: groups[i]):
        members = list(members)
        stream, first = [], {}
        for i in members:
            for w, word in enumerate(sentences[i]):
                pieces = tok(word, add_special_tokens=False)["input_ids"] or [tok.unk_token_id]
                first[(i, w)] = len(stream)
                stream += pieces
        starts = brute_force_windows(len(stream), window, stride)
        for (i, w), p in first.items():
            chosen[(i, w)] = len(ids) + brute_force_best(p, len(stream), window, stride)
        ids += [[tok.cls_token_id, *stream[b:b + window], tok.sep_token_id] for b in starts]
    return ids, chosen


def invariant_examples():
    rng = random.Random(0)
    filler = ["the", "went", "to", ".", "Alice", "xyzzy", "Parisss", "\xad"]
    sentences = [[rng.choice(filler) for _ in range(rng.randint(1, 6))] for _ in range(30)]
    sentences[3] = [rng.choice(filler) for _ in range(40)]  # a sentence longer than any window
    sentences[7] = ["Paris" + "s" * 50]  # one word of 51 sub-tokens, longer than a window
    sentences[8] = ["the", "Parisssssssssssssssssssss", "went"]
    tags = [[rng.randrange(len(LABELS)) for _ in s] for s in sentences]
    doc_ids = [min(i // 6, 3) for i in range(len(sentences))]  # documents of 6 sentences, the last of 12
    return datasets.Dataset.from_dict({"id": list(range(len(sentences))), "doc_id": doc_ids,
                                       "doc_start": [i % 6 == 0 and i < 24 for i in range(len(sentences))],
                                       "tokens": sentences, "ner_tags": tags})


@pytest.mark.parametrize("context", ["document", "sentence"])
@pytest.mark.parametrize("max_seq_length", [8, 16, 40])
def test_every_word_gets_exactly_one_prediction_from_its_max_context_window(tok, context, max_seq_length):
    examples = invariant_examples()
    card = card_with(context=context)
    features = ner.preprocess(examples, card, tok, max_seq_length, train=False)
    rows = examples.to_dict()
    groups = rows["doc_id"] if context == "document" else list(range(len(examples)))
    ids, chosen = reference_features(rows["tokens"], groups, tok, max_seq_length)
    assert features.to_dict()["input_ids"] == ids
    assert all(len(x) <= max_seq_length for x in ids)
    width = max(map(len, ids))
    # labels as logits: the gold tag of every word comes back, one per word
    labels = np.full((len(ids), width), -100)
    for f, row in enumerate(features["labels"]):
        labels[f, :len(row)] = row
    one_hot = np.where((labels >= 0)[..., None], np.eye(len(LABELS))[np.maximum(labels, 0)], 0.0)
    predicted = ner.word_predictions(examples, features, one_hot)
    assert [len(p) for p in predicted] == [len(s) for s in rows["tokens"]]
    assert predicted == rows["ner_tags"]
    # logits that name their window: each word is read from the window the reference chose
    by_window = np.broadcast_to(np.eye(len(ids))[:, None, :], (len(ids), width, len(ids)))
    predicted = ner.word_predictions(examples, features, by_window)
    assert predicted == [[chosen[(i, w)] for w in range(len(s))] for i, s in enumerate(rows["tokens"])]


def test_labels_on_first_subtokens_or_all_subtokens_and_training_features(tok):
    examples = datasets.Dataset.from_dict({"id": [0], "doc_id": [0], "tokens": [["Parisss", "went", "Alice"]],
                                           "ner_tags": [[5, 0, 1]]})
    feature = ner.preprocess(examples, card_with(), tok, 16, train=False)[0]
    pieces = tok.convert_ids_to_tokens(feature["input_ids"])
    assert pieces == ["[CLS]", "Paris", "##s", "##s", "went", "Alice", "[SEP]"]
    assert feature["labels"] == [-100, 5, -100, -100, 0, 1, -100]
    assert feature["word_position"] == [1, 4, 5] and feature["word_index"] == [0, 1, 2]
    assert feature["word_sentence"] == [0, 0, 0] and feature["word_is_max_context"] == [True, True, True]
    assert set(feature["token_type_ids"]) == {0} and set(feature["attention_mask"]) == {1}
    every = ner.preprocess(examples, card_with(label_all_subtokens=True), tok, 16, train=False)[0]
    assert every["labels"] == [-100, 5, 6, 6, 0, 1, -100]  # B-LOC continues as I-LOC
    train = ner.preprocess(examples, card_with(), tok, 16, train=True)
    assert train.column_names == ["input_ids", "token_type_ids", "attention_mask", "labels"]
    # training labels each word once (its max-context window) and leaves out windows without labels
    long = datasets.Dataset.from_dict({"id": [0], "doc_id": [0], "tokens": [["Paris" + "s" * 30, "went"]],
                                       "ner_tags": [[5, 0]]})
    evaluation = ner.preprocess(long, card_with(), tok, 8, train=False)
    training = ner.preprocess(long, card_with(), tok, 8, train=True)
    assert len(training) < len(evaluation)
    assert sum(x != -100 for row in training["labels"] for x in row) == 2


def test_collator_pads_labels_with_minus_100(tok):
    batch = ner.collator(tok)([{"input_ids": [2, 5, 3], "token_type_ids": [0, 0, 0], "attention_mask": [1, 1, 1],
                                "labels": [-100, 1, -100], "word_position": [1]},
                               {"input_ids": [2, 3], "token_type_ids": [0, 0], "attention_mask": [1, 1],
                                "labels": [-100, -100]}])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[2, 5, 3], [2, 3, tok.pad_token_id]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 1, -100], [-100, -100, -100]]


# --------------------------------------------------------------------------------------------------------------
# Scores and the prediction file


@pytest.mark.parametrize("gold, predicted, expected", [
    # a predicted entity with the right span but the wrong type is wrong: 1 of 2 right each way
    ([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-ORG"]],
     {"precision": 0.5, "recall": 0.5, "f1": 0.5, "accuracy": 0.75, "PER_f1": 1.0, "LOC_recall": 0.0,
      "ORG_precision": 0.0}),
    # an invalid I- after O starts an entity (conlleval): it matches the gold B- I-
    ([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]], {"precision": 1.0, "recall": 1.0, "f1": 1.0}),
    # I- at sentence start starts an entity; the sentence boundary ends one
    ([["B-LOC"], ["B-LOC", "I-LOC"]], [["I-LOC"], ["I-LOC", "I-LOC"]], {"f1": 1.0, "accuracy": 1 / 3}),
    ([["B-PER"], ["B-PER"]], [["B-PER"], ["I-PER"]], {"f1": 1.0}),
    # a type change inside I- tags ends one entity and starts another
    ([["B-PER", "B-ORG"]], [["I-PER", "I-ORG"]], {"precision": 1.0, "recall": 1.0, "PER_f1": 1.0, "ORG_f1": 1.0}),
    # boundaries: one gold entity predicted as two -> nothing right
    ([["B-PER", "I-PER"]], [["B-PER", "B-PER"]], {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 0.5}),
    # gold 3 entities, predicted 4, 2 right: P 1/2, R 2/3, F1 4/7
    ([["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "O"]], [["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-ORG", "B-MISC"]],
     {"precision": 0.5, "recall": 2 / 3, "f1": 4 / 7}),
    ([["O", "O"]], [["O", "O"]], {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0}),
])
def test_entity_scores_on_hand_computed_cases(gold, predicted, expected):
    scores = ner.ner_scores(gold, predicted)
    for key, value in expected.items():
        assert scores[key] == pytest.approx(value), key


def test_entity_scores_agree_with_seqeval_default_mode():
    rng = random.Random(2)
    gold = [[rng.choice(LABELS) for _ in range(rng.randint(1, 12))] for _ in range(300)]
    predicted = [[rng.choice(LABELS) if rng.random() < 0.4 else t for t in s] for s in gold]
    scores = ner.ner_scores(gold, predicted)
    p, r, f, _ = precision_recall_fscore_support(gold, predicted, average="micro")
    assert (scores["precision"], scores["recall"], scores["f1"]) == pytest.approx((p, r, f))
    per = precision_recall_fscore_support(gold, predicted, average=None)
    assert [scores[f"{t}_f1"] for t in ("LOC", "MISC", "ORG", "PER")] == pytest.approx(per[2].tolist())


def read_prediction_file(path: Path):
    lines = path.read_text(encoding="utf-8").split("\n")
    words = [line.split() for line in lines if line and not line.startswith("-DOCSTART-")]
    return lines, words


def test_prediction_file_keeps_docstart_lines_and_one_line_per_word(tmp_path, tok):
    text = conll_text([[[("EU", "B-ORG"), ("rejects", "O")], [("Peter", "B-PER"), ("Blackburn", "I-PER")]],
                       [[("Paris", "B-LOC")]]])
    path = write(tmp_path, text, "valid.txt")
    examples, _ = ner.read_conll(path, LABELS)
    card = card_with()
    features = ner.preprocess(examples, card, tok, 8, train=False)
    logits = np.zeros((len(features), 8, len(LABELS)))
    logits[..., 1] = 1.0  # B-PER everywhere
    assert ner.write_outputs(tmp_path / "predictions", card, "validation", examples, features, logits, {}) == {}
    out = ner.output_path(tmp_path / "predictions", card, "validation")
    assert out.name == "dev.conll"
    lines, words = read_prediction_file(out)
    assert lines == ["-DOCSTART- O O", "", "EU B-ORG B-PER", "rejects O B-PER", "", "Peter B-PER B-PER",
                     "Blackburn I-PER B-PER", "", "-DOCSTART- O O", "", "Paris B-LOC B-PER", "", ""]
    assert len(words) == 5 and all(len(w) == 3 for w in words)
    # words-only data: gold is O
    examples, _ = ner.read_conll(write(tmp_path, "EU\nrejects\n", "test.txt"), LABELS)
    features = ner.preprocess(examples, card, tok, 8, train=False)
    ner.write_outputs(tmp_path / "predictions", card, "test", examples, features, np.zeros((len(features), 8, 9)), {})
    assert (tmp_path / "predictions" / "test.conll").read_text() == "EU O O\nrejects O O\n\n"


def test_metric_fn_scores_the_words_from_logits(tmp_path, tok):
    text = conll_text([[[("EU", "B-ORG"), ("rejects", "O")], [("Peter", "B-PER"), ("Blackburn", "I-PER")]]])
    examples, _ = ner.read_conll(write(tmp_path, text), LABELS)
    card = card_with()
    features = ner.preprocess(examples, card, tok, 8, train=False)
    labels = np.array([row + [-100] * (8 - len(row)) for row in features.to_dict()["labels"]])
    logits = np.where(labels[..., None] >= 0, np.eye(9)[np.maximum(labels, 0)], 0.0)
    logits = np.concatenate([logits, np.full((len(labels), 3, 9), -100.0)], axis=1)  # Trainer's padding
    scores = ner.metric_fn(card, examples, features)(transformers.EvalPrediction(logits, labels))
    assert scores["f1"] == 1.0 and scores["accuracy"] == 1.0 and scores["PER_f1"] == 1.0


# --------------------------------------------------------------------------------------------------------------
# End to end through the runner


def test_tiny_model_learns_entities_with_document_windows_and_predicts_a_test_file(tmp_path, capsys, report):
    data = write_synthetic(tmp_path / "data")
    card = yaml.safe_load(Path("tasks/conll2003.yaml").read_text())
    card["defaults"]["max_seq_length"] = 32  # documents of ~40 sub-tokens: 2-3 windows each
    card_path = tmp_path / "card.yaml"
    card_path.write_text(yaml.safe_dump(card))
    out = tmp_path / "run"
    assert cli_main(["finetune", str(card_path), "--model", "preset:tiny", "--tokenizer", str(data / "vocab.txt"),
                     "--train_file", str(data / "train.txt"), "--validation_file", str(data / "valid.txt"),
                     "--output_dir", str(out), "--disable_tqdm", "true", "--learning_rate", "2e-3", "--num_train_epochs", "3", "--per_device_train_batch_size", "8",
                     "--warmup_steps", "0", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert f"{data / 'train.txt'}: IOB1 tags detected, converted to IOB2" in printed
    assert f"{data / 'valid.txt'}: IOB2 tags detected, used as they are" in printed
    results = json.loads((out / "all_results.json").read_text())
    report("CoNLL-like dev entity F1 (tiny, 3 epochs)", f"{100 * results['eval_f1']:.1f}")
    assert results["eval_f1"] > 0.8  # tagging every word O scores 0; random tags far below 0.1
    assert {"eval_precision", "eval_recall", "eval_accuracy", "eval_PER_f1", "eval_ORG_f1"} <= set(results)
    # the dev file written beside the model scores the same
    lines, words = read_prediction_file(out / "predictions" / "dev.conll")
    gold_lines = [line for line in (data / "valid.txt").read_text().split("\n") if line and "DOCSTART" not in line]
    assert [w[0] for w in words] == [line.split()[0] for line in gold_lines]
    assert lines.count("-DOCSTART- O O") == 20
    sentences = [list(group) for blank, group in itertools.groupby(lines, key=lambda x: x == "" or
                                                                   x.startswith("-DOCSTART-")) if not blank]
    scores = ner.ner_scores([[x.split()[1] for x in s] for s in sentences], [[x.split()[2] for x in s] for s in sentences])
    assert scores["f1"] == pytest.approx(results["eval_f1"])

    assert cli_main(["predict", str(card_path), "--model", str(out), "--split", "test", "--data_dir", str(data),
                     "--output_dir", str(tmp_path / "pred")]) == 0
    lines, words = read_prediction_file(tmp_path / "pred" / "predictions" / "test.conll")
    test_lines = [line for line in (data / "test.txt").read_text().split("\n") if line and "DOCSTART" not in line]
    assert len(words) == len(test_lines) and [w[0] for w in words] == [line.split()[0] for line in test_lines]
    assert lines.count("-DOCSTART- O O") == 10
    # test.txt has gold tags, so it is scored: the entity F1 of the very file written
    scored = json.loads((tmp_path / "pred" / "predictions" / "test_results.json").read_text())
    sentences = [list(group) for blank, group in itertools.groupby(lines, key=lambda x: x == "" or
                                                                   x.startswith("-DOCSTART-")) if not blank]
    written = ner.ner_scores([[x.split()[1] for x in s] for s in sentences], [[x.split()[2] for x in s] for s in sentences])
    assert scored["f1"] == pytest.approx(written["f1"]) and scored["f1"] > 0.6
