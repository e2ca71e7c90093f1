"""SQuAD adapter on data the tests write: reading and its errors, windows, labels, the max-context rule,
character offsets through odd white space and accents, post-processing on hand-built logits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import transformers

from bert_suite.adapters import DataError, max_context_windows, squad
from bert_suite.cards import SplitSpec, TaskCard, load_card

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
EXTRA = ("what which who is the a of in le cafe naive resume zoe unbelievably un ##believ ##ably river city "
         "capital france paris at").split()
LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,?'-", *LETTERS, *(f"##{c}" for c in LETTERS),
             *WORDS, *EXTRA]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(dict.fromkeys(vocab)) + "\n", encoding="utf-8")
    return transformers.BertTokenizer(vocab=str(path), do_lower_case=True)


def make_card(**options) -> TaskCard:
    """The SQuAD v1 card with other options and local file names, and a Hub id that does not exist."""
    card = load_card("squad")
    return dataclasses.replace(card, name="squad-test", hub={"path": "bert-suite-tests/no-such-dataset"},
                               options={**card.options, **options},
                               splits={"train": SplitSpec(hub="train", file="train.json"),
                                       "validation": SplitSpec(hub="validation", file="dev.json")})


def qa(qid, question, answers=(), impossible=None):
    record = {"id": qid, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers]}
    if impossible is not None:
        record["is_impossible"] = impossible
    return record


def write_squad(path: Path, paragraphs, title="Test article") -> Path:
    """paragraphs: [(context, [qa records])] in one article."""
    articles = [{"title": title, "paragraphs": [{"context": c, "qas": q} for c, q in paragraphs]}]
    data = {"version": "test", "data": articles}
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def answered(context: str, qid: str, answer: str, question="what is it?", occurrence=0):
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return qa(qid, question, [(answer, start)])


def context_token_index(tok, context):
    """Character start of each context token -> its index in the whole-context tokenisation."""
    offsets = tok(context, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return {start: i for i, (start, _) in enumerate(offsets)}, len(offsets)


def window_token_range(feature, index):
    """(first, last) context token index of one feature's window."""
    starts = [index[s] for s, _ in feature["offset_mapping"] if s >= 0]
    return starts[0], starts[-1]


def span_text(context, feature):
    s, e = feature["start_positions"], feature["end_positions"]
    return context[feature["offset_mapping"][s][0]:feature["offset_mapping"][e][1]]


# ---------------------------------------------------------------------------------------------------------------
# Windows and labels


def test_windows_step_by_doc_stride_and_every_answer_is_reachable(tmp_path, tok):
    context = " ".join(WORDS[i % len(WORDS)] for i in range(150)) + " ."
    answers = ["alpha bravo", "xray yankee zulu", "golf", "november oscar"]
    qas = [answered(context, f"q{i}-{n}", a, occurrence=n) for i, a in enumerate(answers) for n in (0, 2, 4)]
    dataset, _ = squad.read_squad_json(write_squad(tmp_path / "long.json", [(context, qas)]))
    card = make_card(doc_stride=16, max_query_length=12)
    features = squad.preprocess(dataset, card, tok, 48, train=False)
    index, num_tokens = context_token_index(tok, context)
    question_tokens = len(tok("what is it?", add_special_tokens=False)["input_ids"])
    window_length = 48 - question_tokens - 3

    gold_answers = dict(zip(dataset["id"], dataset["answers"], strict=True))
    for qid, answers in gold_answers.items():
        windows = [f for f in features if f["example_id"] == qid]
        ranges = [window_token_range(f, index) for f in windows]
        assert [r[0] for r in ranges] == list(range(0, 16 * len(ranges), 16))
        assert all(last - first + 1 == window_length for first, last in ranges[:-1])
        assert ranges[-1][1] == num_tokens - 1 and ranges[-2][1] < num_tokens - 1
        assert all(len(f["input_ids"]) <= 48 for f in windows)
        gold = answers["text"][0]
        labelled = [f for f in windows if f["start_positions"] > 0]
        assert labelled, f"{qid}: answer reachable from no window"
        assert all(span_text(context, f) == gold for f in labelled)
        assert all(tok.decode(f["input_ids"][f["start_positions"]:f["end_positions"] + 1]) == gold for f in labelled)
    # the step is min(window length, doc_stride): a stride above the window length cannot skip tokens
    assert squad.window_starts(100, 10, 25) == list(range(0, 91, 10))
    assert squad.window_starts(10, 10, 4) == [0] and squad.window_starts(0, 10, 4) == [0]


def test_long_question_is_truncated_and_still_yields_windows(tmp_path, tok):
    context = " ".join(WORDS * 3)
    question = " ".join(["which"] * 90) + "?"
    dataset, _ = squad.read_squad_json(write_squad(tmp_path / "q.json", [(context, [
        answered(context, "long-q", "tango uniform", question=question, occurrence=1)])]))
    features = squad.preprocess(dataset, make_card(doc_stride=20), tok, 96, train=False)  # max_query_length 64
    index, num_tokens = context_token_index(tok, context)
    covered = set()
    for f in features:
        first_sep = f["input_ids"].index(tok.sep_token_id)
        assert first_sep == 65 and f["input_ids"][0] == tok.cls_token_id  # [CLS] + 64 question tokens
        assert f["token_type_ids"] == [0] * 66 + [1] * (len(f["input_ids"]) - 66)
        assert len(f["input_ids"]) <= 96 and f["input_ids"][-1] == tok.sep_token_id
        first, last = window_token_range(f, index)
        covered.update(range(first, last + 1))
    assert covered == set(range(num_tokens))
    assert {span_text(context, f) for f in features if f["start_positions"]} == {"tango uniform"}
    with pytest.raises(ValueError, match="max_query_length"):
        squad.preprocess(dataset, make_card(), tok, 64, train=False)


def test_answer_cut_by_a_window_boundary_is_labelled_cls_and_unanswerable_is_cls(tmp_path, tok):
    context = " ".join(WORDS[:20])  # 20 one-token words
    question = "what is the alpha"  # 4 tokens -> windows of 20 - 4 - 3 = 13 context tokens: [0,13) and [8,20)
    qas = [answered(context, "cut", "lima mike november oscar papa", question=question),  # tokens 11..15
           qa("none", question, impossible=True)]
    dataset, _ = squad.read_squad_json(write_squad(tmp_path / "v2.json", [(context, qas)]))
    card = make_card(doc_stride=8, version_2_with_negative=True, max_query_length=4)
    features = squad.preprocess(dataset, card, tok, 20, train=False)
    cut = [f for f in features if f["example_id"] == "cut"]
    assert len(cut) == 2
    assert (cut[0]["start_positions"], cut[0]["end_positions"]) == (0, 0)  # the first window ends at token 12
    assert span_text(context, cut[1]) == "lima mike november oscar papa"
    assert all((f["start_positions"], f["end_positions"]) == (0, 0) for f in features if f["example_id"] == "none")
    train = squad.preprocess(dataset, card, tok, 20, train=True)
    assert sorted(train.column_names) == ["attention_mask", "end_positions", "input_ids", "start_positions",
                                          "token_type_ids"]
    # second window: [CLS] + 4 question tokens + [SEP] precede its token 8, so tokens 11..15 sit at 9..13
    assert [(f["start_positions"], f["end_positions"]) for f in train] == [(0, 0), (9, 13), (0, 0), (0, 0)]
    assert all(set(f["attention_mask"]) == {1} for f in train)


def test_max_context_rule(tmp_path, tok):
    # windows [0,6) and [4,10): token 4 has 1 token of context on its short side in the first window and 0 in
    # the second; token 5 the reverse
    def rule(num_tokens, window_length, stride):
        return max_context_windows(np.arange(num_tokens), num_tokens, window_length, stride, length_bonus=True)

    best = rule(10, 6, 4)
    assert best.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    # windows [0,6) and [3,9): token 4 scores min(4, 1) = min(1, 4) in both; the tie goes to the first window
    assert rule(9, 6, 3).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert rule(5, 4, 2).tolist() == [0, 0, 0, 1, 1]
    # windows [0,300) and [150,310): token 225 has 74 tokens of context in the first and 75 in the short second,
    # but the first's 0.01 * 300 outweighs that (the reference's rule); NER's rule, without it, takes the second
    assert rule(310, 300, 150)[225] == 0
    assert max_context_windows([225], 310, 300, 150).tolist() == [1]

    context = " ".join(WORDS[:10])
    dataset, _ = squad.read_squad_json(write_squad(tmp_path / "mc.json", [(context, [
        qa("mc", "who", [("alpha", 0)])])]))
    features = squad.preprocess(dataset, make_card(doc_stride=4, max_query_length=1), tok, 10, train=False)  # 1+1+1+6+1
    index, _ = context_token_index(tok, context)
    flags = {}
    for w, f in enumerate(features):
        for (start, _), flag in zip(f["offset_mapping"], f["token_is_max_context"], strict=True):
            if start >= 0 and flag:
                assert index[start] not in flags, "a token is max-context in two windows"
                flags[index[start]] = w
            elif start < 0:
                assert not flag
    assert [flags[i] for i in range(10)] == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]


def test_offsets_survive_odd_white_space_and_accents(tmp_path, tok):
    context = "Le\u00a0Café  naïve\u2009Résumé\tat\n\nthe  Zoë’s  river,\u3000Paris"
    answers = ["naïve\u2009Résumé", "Café", "Zoë’s  river", "Paris", "Résumé\tat\n\nthe"]
    qas = [answered(context, f"u{i}", a) for i, a in enumerate(answers)]
    qas.append(qa("mid-word", "what", [("Caf", context.index("Caf"))]))  # ends inside the token "cafe"
    dataset, _ = squad.read_squad_json(write_squad(tmp_path / "u.json", [(context, qas)]))
    features = squad.preprocess(dataset, make_card(), tok, 384, train=False)
    assert len(features) == len(qas)
    for f, gold in zip(features, [*answers, "Café"], strict=True):
        assert span_text(context, f) == gold
    # post-processing slices the same characters out of the original context
    width = max(len(f["input_ids"]) for f in features)
    start = np.full((len(features), width), -100.0)
    end = np.full((len(features), width), -100.0)
    for i, f in enumerate(features):
        start[i, : len(f["input_ids"])] = 0.0
        end[i, : len(f["input_ids"])] = 0.0
        start[i, f["start_positions"]], end[i, f["end_positions"]] = 5.0, 5.0
    result = squad.postprocess(dataset, features, start, end)
    assert result["predictions"] == {f"u{i}": a for i, a in enumerate(answers)} | {"mid-word": "Café"}


# ---------------------------------------------------------------------------------------------------------------
# Post-processing on hand-built features and logits

CONTEXT = "alpha bravo charlie delta echo"
SPANS = [[0, 5], [6, 11], [12, 19], [20, 25], [26, 30]]


def hand_features(example_ids, flags=None):
    """Features laid out as [CLS] q [SEP] five context tokens [SEP] (9 tokens) for each example id."""
    flags = flags or [[True] * 5] * len(example_ids)
    return {"example_id": list(example_ids),
            "offset_mapping": [[[-1, -1]] * 3 + SPANS + [[-1, -1]] for _ in example_ids],
            "token_is_max_context": [[False] * 3 + list(f) + [False] for f in flags]}


def logits(rows, width=9):
    """rows: [{position: logit}] -> array with 0 elsewhere inside the feature and -100 padding after."""
    out = np.full((len(rows), width), -100.0)
    out[:, :9] = 0.0
    for i, row in enumerate(rows):
        for position, value in row.items():
            out[i, position] = value
    return out


def test_postprocess_picks_the_best_valid_span():
    examples = {"id": ["a"], "context": [CONTEXT]}
    features = hand_features(["a"])
    # best start 4 (bravo), best end 5 (charlie)
    result = squad.postprocess(examples, features, logits([{4: 3.0}]), logits([{5: 2.0}]))
    assert result["predictions"] == {"a": "bravo charlie"} and result["best_non_null"] == {"a": "bravo charlie"}
    nbest = result["nbest"]["a"]
    assert nbest[0] == {"text": "bravo charlie", "probability": nbest[0]["probability"], "start_logit": 3.0,
                        "end_logit": 2.0}
    assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)
    assert [e["probability"] for e in nbest] == sorted((e["probability"] for e in nbest), reverse=True)
    assert len(nbest) == 15  # every pair of the 5 context tokens with end >= start
    # longer than max_answer_length: alpha..echo (5 tokens) scores highest but only 2 tokens are allowed
    result = squad.postprocess(examples, features, logits([{3: 9.0, 6: 1.0}]), logits([{7: 9.0}]),
                               max_answer_length=2)
    assert result["predictions"]["a"] == "delta echo"
    result = squad.postprocess(examples, features, logits([{3: 9.0, 6: 1.0}]), logits([{7: 9.0}]),
                               max_answer_length=5)
    assert result["predictions"]["a"] == CONTEXT
    # a start on a token that is not max-context in this window is not a candidate
    result = squad.postprocess(examples, hand_features(["a"], [[True, False, True, True, True]]),
                               logits([{4: 9.0, 5: 1.0}]), logits([{5: 9.0}]))
    assert result["predictions"]["a"] == "charlie"
    # positions past the feature's length (padding) are never read, even with a large value there
    result = squad.postprocess(examples, features, logits([{4: 3.0, 10: 50.0}], width=12),
                               logits([{4: 1.0, 11: 50.0}], width=12))
    assert result["predictions"]["a"] == "bravo"


def test_postprocess_rejects_end_before_start():
    examples = {"id": ["a"], "context": [CONTEXT]}
    # the best start (echo, 7) lies after the best end (bravo, 4): that pair is rejected and the best valid pair
    # is start 4 with end 4 (2 + 5) against start 7 with end 7 (9 + 0)
    result = squad.postprocess(examples, hand_features(["a"]), logits([{7: 9.0, 4: 2.0}]), logits([{4: 9.5}]))
    assert result["predictions"]["a"] == "bravo"  # 2 + 9.5 = 11.5 beats echo..echo (9 + 0)
    assert all(e["start_logit"] + e["end_logit"] <= 11.5 for e in result["nbest"]["a"])  # (7, 4) never listed
    assert [e["text"] for e in result["nbest"]["a"][:3]] == ["bravo", "alpha bravo", "echo"]  # 11.5, 9.5, 9


def test_postprocess_v2_null_score_threshold_and_pooling_over_windows():
    examples = {"id": ["a", "b"], "context": [CONTEXT, CONTEXT]}
    features = hand_features(["a", "a", "b"], [[True, True, False, False, False], [False, False, True, True, True],
                                               [True] * 5])
    start = logits([{0: 4.0, 3: 2.0}, {0: 1.0, 6: 3.0}, {0: 8.0, 5: 1.0}])
    end = logits([{0: 4.0, 3: 2.0}, {0: 0.5, 6: 3.5}, {0: 8.0, 5: 1.0}])
    result = squad.postprocess(examples, features, start, end, version_2=True)
    # a: null = min(4 + 4, 1 + 0.5) = 1.5; best span delta (3 + 3.5 = 6.5, second window) beats alpha (4)
    assert result["null_odds"]["a"] == pytest.approx(1.5 - 6.5)
    assert result["predictions"]["a"] == "delta" and result["best_non_null"]["a"] == "delta"
    # b: null 16 against charlie 2: score_diff 14 > 0 -> no answer
    assert result["null_odds"]["b"] == pytest.approx(16.0 - 2.0)
    assert result["predictions"]["b"] == "" and result["best_non_null"]["b"] == "charlie"
    null_entry = [e for e in result["nbest"]["a"] if e["text"] == ""]
    assert len(null_entry) == 1 and (null_entry[0]["start_logit"], null_entry[0]["end_logit"]) == (1.0, 0.5)
    assert result["nbest"]["b"][0]["text"] == ""  # inserted by score: the null is b's best entry
    for entries in result["nbest"].values():
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
    # the threshold flips predictions: predict a span unless score_diff > threshold
    flipped = squad.postprocess(examples, features, start, end, version_2=True, null_threshold=20.0)
    assert flipped["predictions"] == {"a": "delta", "b": "charlie"}
    flipped = squad.postprocess(examples, features, start, end, version_2=True, null_threshold=-6.0)
    assert flipped["predictions"] == {"a": "", "b": ""}
    # no valid span at all: "" everywhere and a large finite score_diff
    none = squad.postprocess({"id": ["c"], "context": [CONTEXT]}, hand_features(["c"], [[False] * 5]),
                             logits([{}]), logits([{}]), version_2=True)
    assert none["predictions"] == {"c": ""} and none["best_non_null"] == {"c": ""}
    assert none["null_odds"]["c"] == squad.NO_SPAN_SCORE_DIFF
    v1 = squad.postprocess({"id": ["c"], "context": [CONTEXT]}, hand_features(["c"], [[False] * 5]),
                           logits([{}]), logits([{}]))
    assert v1["predictions"] == {"c": ""} and v1["nbest"]["c"][0]["probability"] == 1.0


def test_write_prediction_files(tmp_path):
    examples = {"id": ["a", "é"], "context": [CONTEXT, "Zoë\u00a0café"]}
    features = hand_features(["a"])
    features["example_id"].append("é")
    features["offset_mapping"].append([[-1, -1]] * 3 + [[0, 3], [4, 8]] + [[-1, -1]] * 4)
    features["token_is_max_context"].append([False] * 3 + [True, True] + [False] * 4)
    result = squad.postprocess(examples, features, logits([{4: 2.0}, {3: 2.0}]), logits([{4: 2.0}, {4: 2.0}]),
                               version_2=True, null_threshold=100.0)
    paths = squad.write_prediction_files(tmp_path / "out", result, version_2=True)
    assert [p.name for p in paths] == ["predictions.json", "nbest_predictions.json", "null_odds.json"]
    text = (tmp_path / "out" / "predictions.json").read_text(encoding="utf-8")
    assert json.loads(text) == {"a": "bravo", "é": "Zoë\u00a0café"} and "Zoë" in text
    assert set(json.loads((tmp_path / "out" / "null_odds.json").read_text())) == {"a", "é"}
    assert len(squad.write_prediction_files(tmp_path / "v1", result, version_2=False)) == 2


# ---------------------------------------------------------------------------------------------------------------
# Reading and bad input


@pytest.mark.parametrize("bad, message", [
    (qa("dup", "who", [("bravo", 6)]), "duplicate question id"),
    (qa("noq", "  ", [("alpha", 0)]), "empty question"),
    (qa("noans", "what", []), "without answers"),
    (qa("noans2", "what", [], impossible=False), "without answers"),
])
def test_bad_questions_are_errors_naming_file_and_id(tmp_path, bad, message):
    path = write_squad(tmp_path / "bad.json", [(CONTEXT, [qa("dup", "what", [("alpha", 0)]), bad])])
    with pytest.raises(DataError, match=message) as err:
        squad.read_squad_json(path)
    assert str(path) in str(err.value) and repr(bad["id"]) in str(err.value)
    dataset, report = squad.read_squad_json(path, skip_bad_rows=True)  # left out and counted instead
    assert report["skipped_questions"] == 1 and list(dataset["id"]) == ["dup"]


def test_empty_context_missing_file_and_not_json(tmp_path):
    path = write_squad(tmp_path / "ctx.json", [(" \n", [qa("q1", "what", [])])], title="Empty")
    with pytest.raises(DataError, match="empty context") as err:
        squad.read_squad_json(path)
    assert str(path) in str(err.value) and "'q1'" in str(err.value) and "'Empty'" in str(err.value)
    with pytest.raises(DataError, match="file not found"):
        squad.read_squad_json(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text('{"data": [', encoding="utf-8")
    with pytest.raises(DataError, match=r"broken\.json:1:\d+: not valid JSON"):
        squad.read_squad_json(tmp_path / "broken.json")
    (tmp_path / "latin1.json").write_bytes('{"data": [{"title": "Café"}]}'.encode("latin-1"))
    with pytest.raises(DataError, match="not valid UTF-8"):
        squad.read_squad_json(tmp_path / "latin1.json")
    (tmp_path / "nodata.json").write_text('{"version": "1.1"}', encoding="utf-8")
    with pytest.raises(DataError, match='"data" list'):
        squad.read_squad_json(tmp_path / "nodata.json")


def test_v2_file_reads_to_the_hub_layout(tmp_path):
    path = write_squad(tmp_path / "v2.json", [(CONTEXT, [
        qa("ans", "what", [("bravo", 6), ("bravo charlie", 6)], impossible=False),
        {**qa("imp", "who", impossible=True), "plausible_answers": [{"text": "echo", "answer_start": 26}]}])])
    dataset, report = squad.read_squad_json(path)
    assert dataset.column_names == ["id", "title", "context", "question", "answers"]
    assert dataset[0]["answers"] == {"text": ["bravo", "bravo charlie"], "answer_start": [6, 6]}
    assert dataset[1]["answers"] == {"text": [], "answer_start": []} and dataset[1]["title"] == "Test article"
    assert report["bad_answers"] == 0


def test_mismatched_answers_are_counted_and_training_questions_dropped(tmp_path, tok, capsys):
    qas = [qa("good", "what", [("bravo", 6)]),
           qa("shifted", "what", [("charlie", 13), ("charlie", 12)]),  # first answer one character off
           qa("outside", "what", [("echo", 40)]),
           qa("later-bad", "what", [("delta", 20), ("delta", 0)])]  # only a later answer is bad: kept
    folder = tmp_path / "data"
    folder.mkdir()
    write_squad(folder / "train.json", [(CONTEXT, qas)])
    _, report = squad.read_squad_json(folder / "train.json")
    assert report["bad_answers"] == 3 and [e["id"] for e in report["examples"]] == ["shifted", "outside", "later-bad"]
    with pytest.raises(DataError, match="'shifted'.*does not match the context"):
        squad.read_squad_json(folder / "train.json", skip_bad=False)

    card = make_card(max_query_length=8)
    dataset = squad.load_split(card, "train", folder)
    assert len(dataset) == 4 and "3 answers do not match" in capsys.readouterr().out
    train = squad.preprocess(dataset, card, tok, 64, train=True)
    out = capsys.readouterr().out
    assert out.count("skipped 2 training questions whose answer does not match the context at answer_start") == 1
    assert str(folder / "train.json") in out
    assert len(train) == 2  # good, later-bad
    evaluation = squad.preprocess(dataset, card, tok, 64, train=False)
    assert list(evaluation["example_id"]) == ["good", "shifted", "outside", "later-bad"]
    assert list(evaluation["start_positions"])[1:3] == [0, 0] and list(evaluation["start_positions"])[0] > 0
    # a v1 card refuses unanswerable training questions; evaluation keeps them
    unanswerable = squad.read_squad_json(write_squad(tmp_path / "v2.json", [(CONTEXT, [
        qa("imp", "who", impossible=True)])]))[0]
    with pytest.raises(DataError, match="'imp'.*v1"):
        squad.preprocess(unanswerable, card, tok, 64, train=True)
    assert list(squad.preprocess(unanswerable, card, tok, 64, train=False)["start_positions"]) == [0]


def test_load_split_sources(tmp_path):
    card = make_card()
    path = write_squad(tmp_path / "my-dev.json", [(CONTEXT, [qa("q", "what", [("alpha", 0)])])])
    assert list(squad.load_split(card, "validation", path)["id"]) == ["q"]  # --data_dir naming the file itself
    with pytest.raises(DataError, match="dev.json: file not found"):
        squad.load_split(card, "validation", tmp_path)
    with pytest.raises(DataError, match="--data_dir"):
        squad.load_split(card, "validation", None)
