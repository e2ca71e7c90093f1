"""Tests of the SQuAD v1.1 / v2.0 scorer, on hand-computed examples and small JSON files."""

from __future__ import annotations

import json
import random

import pytest

from bert_suite.metrics.squad import (
    SquadScoreError,
    best_threshold,
    evaluate_v1,
    evaluate_v2,
    exact_match_score,
    f1_score,
    gold_from_examples,
    load_gold,
    main,
    normalize_answer,
    score_files,
)

V2_FIELDS = [
    "exact",
    "f1",
    "total",
    "HasAns_exact",
    "HasAns_f1",
    "HasAns_total",
    "NoAns_exact",
    "NoAns_f1",
    "NoAns_total",
]
BEST_FIELDS = ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def _quiet(message: str) -> None:
    pass


def _gold(*answers_per_question: list[str]) -> list[dict]:
    """Gold questions q0, q1, ... with the given answer texts."""
    return [{"id": f"q{i}", "answers": list(answers)} for i, answers in enumerate(answers_per_question)]


def _dataset(questions: list[dict], version: str = "1.1", impossible: bool = False) -> dict:
    """An official-layout dataset with one paragraph per question."""
    paragraphs = []
    for q in questions:
        qa = {"id": q["id"], "question": "?", "answers": [{"text": t, "answer_start": 0} for t in q["answers"]]}
        if impossible:
            qa["is_impossible"] = not q["answers"]
        paragraphs.append({"context": "c", "qas": [qa]})
    return {"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}


def _write(path, obj) -> str:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------------------------------
# Normalisation and per-answer metrics
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Cat", "cat"),
        ("An apple a day", "apple day"),
        ("a, an; the!", ""),
        ("theater another", "theater another"),  # articles only as whole words
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word of its own
        ("  Hello,\t  World!\n ", "hello world"),
        ("Anne's 3.5%", "annes 35"),
        ("Café “Über” — ÀN", "café “über” — àn"),  # non-ASCII punctuation and letters left alone
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_compares_normalised_strings():
    assert exact_match_score("The Broncos!", "broncos") == 1
    assert exact_match_score("Broncos", "Denver Broncos") == 0
    assert exact_match_score("the", "") == 1
    assert type(exact_match_score("a", "b")) is int


def test_f1_on_partial_overlaps():
    # pred tokens [cat, sat], gold [cat, sat, on, mat]: 2 common, P = 2/2, R = 2/4, F1 = 2*1*0.5/1.5 = 2/3
    assert f1_score("The cat sat.", "cat sat on a mat") == pytest.approx(2 / 3)
    # Bags, not sets: [x, x, y] & [x, y, y] = {x: 1, y: 1}, 2 common, P = R = 2/3, F1 = 2/3
    assert f1_score("x x y", "x y y") == pytest.approx(2 / 3)
    # pred [york], gold [new, york, city]: P = 1, R = 1/3, F1 = (2/3) / (4/3) = 1/2
    assert f1_score("York", "New York City") == 0.5
    assert f1_score("red", "blue") == 0.0
    assert f1_score("Paris", "paris.") == 1.0


def test_f1_of_empty_answers_differs_between_versions():
    # v1.1: no common token, so 0 even for two empty answers.
    assert f1_score("", "") == 0.0
    assert f1_score("the", ".") == 0.0
    # v2.0: when a side has no token, 1 iff both have none.
    assert f1_score("", "", version=2) == 1.0
    assert f1_score("the", ".", version=2) == 1.0
    assert f1_score("x", "", version=2) == 0.0
    assert f1_score("", "x", version=2) == 0.0
    assert f1_score("York", "New York City", version=2) == 0.5


# --------------------------------------------------------------------------------------------------
# v1.1
# --------------------------------------------------------------------------------------------------


def test_v1_max_over_golds_and_missing_question_scores_zero(capsys):
    gold = _gold(["Denver Broncos", "Broncos"], ["cat sat on mat"], ["blue"], ["anything"])
    predictions = {"q0": "The Broncos", "q1": "cat sat", "q2": "red"}
    result = evaluate_v1(gold, predictions)
    # q0: EM 1, F1 1 (against "Broncos"); q1: EM 0, F1 2/3; q2: 0, 0; q3 missing: 0, 0, still in the total of 4.
    assert list(result) == ["exact_match", "f1"]
    assert result["exact_match"] == 25.0
    assert result["f1"] == 100.0 * (0.0 + 1.0 + 2 / 3 + 0.0) / 4
    err = capsys.readouterr().err.splitlines()
    assert err == ["Unanswered question q3 will receive score 0.", "1 of 4 questions have no prediction"]


def test_v1_rejects_a_question_without_answers():
    with pytest.raises(SquadScoreError, match="'q1' has no answer"):
        evaluate_v1(_gold(["a b"], []), {"q0": "b", "q1": ""}, warn=_quiet)


# --------------------------------------------------------------------------------------------------
# v2.0
# --------------------------------------------------------------------------------------------------

# q0, q1 answerable; q2, q3 unanswerable.
V2_GOLD = _gold(["Paris"], ["New York City", "NYC"], [], [])
V2_PREDS = {"q0": "paris", "q1": "York", "q2": "", "q3": "London"}


def test_v2_scores_and_has_ans_no_ans_split():
    result = evaluate_v2(V2_GOLD, V2_PREDS)
    # EM: 1, 0, 1, 0.  F1: 1, max(1/2, 0), 1 (empty vs empty), 0.
    assert list(result) == V2_FIELDS
    assert result == {
        "exact": 50.0,
        "f1": 62.5,
        "total": 4,
        "HasAns_exact": 50.0,
        "HasAns_f1": 75.0,
        "HasAns_total": 2,
        "NoAns_exact": 50.0,
        "NoAns_f1": 50.0,
        "NoAns_total": 2,
    }
    assert type(result["total"]) is int


def test_v2_groups_only_present_when_they_have_questions():
    only_answerable = evaluate_v2(V2_GOLD[:2], V2_PREDS)
    assert list(only_answerable) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"]
    only_unanswerable = evaluate_v2(V2_GOLD[2:], V2_PREDS)
    assert list(only_unanswerable) == ["exact", "f1", "total", "NoAns_exact", "NoAns_f1", "NoAns_total"]
    assert only_unanswerable["exact"] == 50.0


def test_v2_answers_that_normalise_to_nothing_leave_empty_gold_but_count_as_answerable():
    # As in the official script: the gold becomes [""], yet has-answer follows the raw answer list.
    result = evaluate_v2(_gold(["The", "."]), {"q0": ""})
    assert result["exact"] == 100.0 and result["f1"] == 100.0
    assert result["HasAns_total"] == 1 and "NoAns_total" not in result


def test_v2_missing_prediction_is_left_out(capsys):
    result = evaluate_v2(V2_GOLD, {"q0": "Paris", "q2": "x"})
    assert result["total"] == 2 and result["exact"] == 50.0
    assert result["HasAns_total"] == 1 and result["NoAns_total"] == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["Missing prediction for q1", "Missing prediction for q3", "2 of 4 questions have no prediction"]


def test_v2_without_any_prediction_is_an_error():
    with pytest.raises(SquadScoreError, match="none of the questions"):
        evaluate_v2(V2_GOLD, {}, warn=_quiet)


def test_v2_na_prob_thresh_turns_questions_into_no_answer():
    na_probs = {"q0": 0.1, "q1": 0.9, "q2": 0.2, "q3": 0.8}
    result = evaluate_v2(V2_GOLD, V2_PREDS, na_probs, na_prob_thresh=0.5)
    # q1 (answerable) and q3 (unanswerable) are above 0.5: they score 0 and 1. EM and F1: 1, 0, 1, 1.
    assert list(result) == V2_FIELDS + BEST_FIELDS
    assert (result["exact"], result["f1"]) == (75.0, 75.0)
    assert (result["HasAns_exact"], result["HasAns_f1"]) == (50.0, 50.0)
    assert (result["NoAns_exact"], result["NoAns_f1"]) == (100.0, 100.0)
    # Walk from 2 (all null): q0 +1 -> 3 (thresh 0.1), q2 "" +0 -> 3, q3 "London" -1 -> 2, q1 +0 / +0.5.
    assert (result["best_exact"], result["best_exact_thresh"]) == (75.0, 0.1)
    assert (result["best_f1"], result["best_f1_thresh"]) == (75.0, 0.1)
    # The default threshold 1.0 leaves the raw scores; best_* do not depend on it.
    default = evaluate_v2(V2_GOLD, V2_PREDS, na_probs)
    assert (default["exact"], default["f1"], default["best_f1"]) == (50.0, 62.5, 75.0)


def test_v2_without_na_probs_a_negative_threshold_answers_nothing():
    # The official script uses 0.0 for every question without a probability file.
    result = evaluate_v2(V2_GOLD, V2_PREDS, na_prob_thresh=-0.5)
    assert (result["exact"], result["HasAns_exact"], result["NoAns_exact"]) == (50.0, 0.0, 100.0)
    assert "best_f1" not in result


def test_v2_na_probs_must_cover_scored_questions():
    with pytest.raises(SquadScoreError, match="1 scored question.*'q3'"):
        evaluate_v2(V2_GOLD, V2_PREDS, {"q0": 0.0, "q1": 0.0, "q2": 0.0})


# --------------------------------------------------------------------------------------------------
# Best threshold search
# --------------------------------------------------------------------------------------------------


def test_best_threshold_first_strictly_better_total_wins():
    gold = _gold([], ["a1"], ["a2"], [], ["a3"])
    preds = {"q0": "x", "q1": "a1", "q2": "a2", "q3": "y", "q4": "a3"}
    na_probs = {"q0": 0.1, "q1": 0.2, "q2": 0.3, "q3": 0.4, "q4": 0.5}
    # From 2 (two unanswerable): q0 -1 -> 1, q1 +1 -> 2 (ties the start, no move), q2 +1 -> 3 (best, 0.3),
    # q3 -1 -> 2, q4 +1 -> 3 (ties the best, no move).
    assert best_threshold(gold, preds, na_probs) == {
        "best_exact": 60.0,
        "best_exact_thresh": 0.3,
        "best_f1": 60.0,
        "best_f1_thresh": 0.3,
    }


def test_best_threshold_all_unanswerable_stays_at_no_answer():
    gold = _gold([], [])
    for preds in ({"q0": "x", "q1": ""}, {"q0": "", "q1": ""}):
        # From 2: "x" subtracts 1, "" adds 0, so nothing beats answering nothing.
        result = best_threshold(gold, preds, {"q0": 0.3, "q1": 0.7})
        assert result == {"best_exact": 100.0, "best_exact_thresh": 0.0, "best_f1": 100.0, "best_f1_thresh": 0.0}


def test_best_threshold_all_answerable():
    gold = _gold(["alpha"], ["new york city"], ["beta"])
    preds = {"q0": "alpha", "q1": "york", "q2": "gamma"}
    na_probs = {"q0": 0.5, "q1": 0.2, "q2": 0.9}
    # F1 walk from 0: q1 +0.5 -> 0.5 (0.2), q0 +1 -> 1.5 (0.5), q2 +0.  EM walk: q1 +0, q0 +1 -> 1 (0.5), q2 +0.
    result = best_threshold(gold, preds, na_probs)
    assert result == {"best_exact": 100.0 / 3, "best_exact_thresh": 0.5, "best_f1": 50.0, "best_f1_thresh": 0.5}


def test_best_threshold_in_the_middle_matches_applying_it():
    gold = _gold(["a1"], [], ["a2"], [], [], ["a3"])
    preds = {"q0": "a1", "q1": "", "q2": "a2", "q3": "x", "q4": "y", "q5": "a3"}
    na_probs = {"q0": -2.0, "q1": -1.0, "q2": 0.5, "q3": 1.0, "q4": 2.0, "q5": 3.0}
    # From 3: q0 +1 -> 4 (-2.0), q1 +0, q2 +1 -> 5 (0.5), q3 -1, q4 -1, q5 +1 -> 4.
    result = best_threshold(gold, preds, na_probs)
    assert result["best_exact_thresh"] == 0.5 and result["best_f1_thresh"] == 0.5
    assert result["best_exact"] == pytest.approx(500.0 / 6)
    applied = evaluate_v2(gold, preds, na_probs, na_prob_thresh=0.5)
    assert applied["exact"] == pytest.approx(result["best_exact"])
    assert applied["best_exact"] == result["best_exact"]


def test_best_threshold_breaks_ties_in_na_probs_order():
    # Equal probabilities are walked in the order of the na_probs mapping (a stable sort), as officially.
    gold = _gold(["a"], [])
    preds = {"q0": "a", "q1": "x"}
    assert best_threshold(gold, preds, {"q0": 0.5, "q1": 0.5})["best_exact"] == 100.0
    assert best_threshold(gold, preds, {"q1": 0.5, "q0": 0.5})["best_exact"] == 50.0


def test_best_threshold_is_the_best_of_all_thresholds():
    rng = random.Random(1234)
    vocab = ["x", "y", "z", "w"]

    def phrase() -> str:
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 3)))

    for _ in range(300):
        n = rng.randint(1, 8)
        gold = _gold(*([phrase() for _ in range(rng.randint(1, 2))] if rng.random() < 0.6 else [] for _ in range(n)))
        # Empty predictions are "" exactly: the walk tests the raw string, the scores the normalised one.
        preds = {q["id"]: ("" if rng.random() < 0.3 else phrase()) for q in gold}
        # Distinct values, so that every walk step is reachable with a threshold.
        na_probs = {q["id"]: v / 10 for q, v in zip(gold, rng.sample(range(-50, 50), n), strict=True)}

        best = best_threshold(gold, preds, na_probs)
        thresholds = [*na_probs.values(), min(na_probs.values()) - 1.0]  # the last one answers nothing
        brute = [evaluate_v2(gold, preds, na_probs, na_prob_thresh=t, warn=_quiet) for t in thresholds]
        for key in ("exact", "f1"):
            scores = [r[key] for r in brute]
            assert all(best[f"best_{key}"] >= s - 1e-9 for s in scores)
            assert best[f"best_{key}"] == pytest.approx(max(scores), rel=1e-12, abs=1e-12)
            all_null = brute[-1][key]
            if best[f"best_{key}"] > all_null + 1e-9:
                chosen = evaluate_v2(gold, preds, na_probs, best[f"best_{key}_thresh"], warn=_quiet)
                assert chosen[key] == pytest.approx(best[f"best_{key}"], rel=1e-12)
            else:
                assert best[f"best_{key}_thresh"] == 0.0


# --------------------------------------------------------------------------------------------------
# Gold loading
# --------------------------------------------------------------------------------------------------


def test_load_gold_reads_answers_and_detects_the_version(tmp_path):
    path = _write(tmp_path / "v1.json", _dataset(_gold(["A", "B"], ["C"])))
    assert load_gold(path) == ([{"id": "q0", "answers": ["A", "B"]}, {"id": "q1", "answers": ["C"]}], 1)
    path = _write(tmp_path / "v2.json", _dataset(_gold(["A"], []), version="v2.0"))
    assert load_gold(path)[1] == 2
    # is_impossible alone makes it v2, whatever the version string says.
    path = _write(tmp_path / "v2b.json", _dataset(_gold(["A"], []), version="1.1", impossible=True))
    assert load_gold(path) == ([{"id": "q0", "answers": ["A"]}, {"id": "q1", "answers": []}], 2)


def test_load_gold_errors_name_file_and_record(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json", encoding="utf-8")
    with pytest.raises(SquadScoreError, match="bad.json.*not valid UTF-8 JSON"):
        load_gold(bad_json)
    with pytest.raises(SquadScoreError, match="nodata.json.*'data' list"):
        load_gold(_write(tmp_path / "nodata.json", {"data": {}}))
    no_id = _dataset(_gold(["A"]))
    del no_id["data"][0]["paragraphs"][0]["qas"][0]["id"]
    with pytest.raises(SquadScoreError, match=r"noid.json: data\[0\].paragraphs\[0\].qas\[0\].*'id'"):
        load_gold(_write(tmp_path / "noid.json", no_id))
    dup = _dataset([{"id": "same", "answers": ["A"]}, {"id": "same", "answers": ["B"]}])
    with pytest.raises(SquadScoreError, match=r"dup.json: data\[0\].paragraphs\[1\].qas\[0\] repeats.*'same'"):
        load_gold(_write(tmp_path / "dup.json", dup))
    with pytest.raises(SquadScoreError, match="missing.json.*cannot read"):
        load_gold(tmp_path / "missing.json")


def test_gold_from_hub_layout_examples():
    examples = [
        {"id": "a", "context": "c", "answers": {"text": ["x", "y"], "answer_start": [0, 2]}},
        {"id": "b", "context": "c", "answers": {"text": [], "answer_start": []}},
    ]
    expected = [{"id": "a", "answers": ["x", "y"]}, {"id": "b", "answers": []}]
    assert gold_from_examples(examples) == expected
    datasets = pytest.importorskip("datasets")
    assert gold_from_examples(datasets.Dataset.from_list(examples)) == expected
    with pytest.raises(SquadScoreError, match="duplicate.*'a'"):
        gold_from_examples(examples + examples[:1])
    with pytest.raises(SquadScoreError, match=r"examples\[0\]"):
        gold_from_examples([{"id": "a", "answers": "x"}])


# --------------------------------------------------------------------------------------------------
# score_files and the command line
# --------------------------------------------------------------------------------------------------


def test_score_files_v1(tmp_path):
    data = _write(tmp_path / "dev.json", _dataset(_gold(["Denver Broncos"], ["cat sat on mat"])))
    preds = _write(tmp_path / "pred.json", {"q0": "the Denver Broncos", "q1": "cat sat"})
    assert score_files(data, preds) == {"exact_match": 50.0, "f1": 100.0 * (0.0 + 1.0 + 2 / 3) / 2}


def test_score_files_v2_with_na_probs(tmp_path):
    data = _write(tmp_path / "dev.json", _dataset(V2_GOLD, version="v2.0"))
    preds = _write(tmp_path / "pred.json", V2_PREDS)
    probs = _write(tmp_path / "na.json", {"q0": 0.1, "q1": 0.9, "q2": 0.2, "q3": 0.8})
    result = score_files(data, preds, probs, na_prob_thresh=0.5)
    assert result == evaluate_v2(V2_GOLD, V2_PREDS, {"q0": 0.1, "q1": 0.9, "q2": 0.2, "q3": 0.8}, 0.5)
    assert list(result) == V2_FIELDS + BEST_FIELDS
    # A v1.1 file forced to v2.0 scoring.
    v1_data = _write(tmp_path / "v1.json", _dataset(_gold(["Paris"])))
    assert list(score_files(v1_data, _write(tmp_path / "p1.json", {"q0": "Paris"}), version="v2.0")) == [
        "exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total"
    ]  # fmt: skip


def test_score_files_rejects_malformed_inputs(tmp_path):
    data = _write(tmp_path / "dev.json", _dataset(V2_GOLD, version="v2.0"))
    preds = _write(tmp_path / "pred.json", V2_PREDS)
    cases = [
        ({"predictions_path": _write(tmp_path / "list.json", ["q0"])}, "list.json: expected a JSON object"),
        (
            {"predictions_path": _write(tmp_path / "num.json", {"q0": 3})},
            "num.json: every answer must be a string.*'q0'",
        ),
        (
            {"predictions_path": _write(tmp_path / "unk.json", {"q0": "", **{f"z{i}": "" for i in range(7)}})},
            "unk.json: 7 id.*not questions of .*dev.json: 'z0', 'z1', 'z2', 'z3', 'z4' and 2 more",
        ),
        ({"na_probs_path": _write(tmp_path / "na_str.json", {"q0": "0.5"})}, "na_str.json: every probability"),
        ({"na_probs_path": _write(tmp_path / "na_unk.json", {**dict.fromkeys(V2_PREDS, 0.0), "zz": 0.0})}, "'zz'"),
        ({"na_probs_path": _write(tmp_path / "na_few.json", {"q0": 0.0})}, "na_few.json: no probability for 3"),
        ({"na_probs_path": _write(tmp_path / "na_ok.json", dict.fromkeys(V2_PREDS, 0.0)), "version": 1}, "only apply"),
        ({"version": "3"}, "version"),
    ]
    for overrides, message in cases:
        kwargs = {"data_path": data, "predictions_path": preds, **overrides}
        with pytest.raises(SquadScoreError, match=message):
            score_files(**kwargs)


def test_command_line(tmp_path, capsys):
    data = _write(tmp_path / "dev.json", _dataset(V2_GOLD, version="v2.0"))
    preds = _write(tmp_path / "pred.json", V2_PREDS)
    out = tmp_path / "eval.json"
    assert main([data, preds, "-o", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text(encoding="utf-8")) == evaluate_v2(V2_GOLD, V2_PREDS)
    assert main([data, str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_both_command_lines_take_both_spellings(tmp_path, capsys):
    """`python -m bert_suite.metrics.squad` (the official script's --na-prob-file ...) and `bert-suite
    score squad` (--na_probs ...) accept each other's spellings and give the same scores."""
    from bert_suite.cli import main as cli_main

    data = _write(tmp_path / "dev.json", _dataset(V2_GOLD, version="v2.0"))
    preds = _write(tmp_path / "pred.json", V2_PREDS)
    na = _write(tmp_path / "na.json", {"q0": 0.1, "q1": 0.9, "q2": 0.2, "q3": 0.8})
    expected = evaluate_v2(V2_GOLD, V2_PREDS, {"q0": 0.1, "q1": 0.9, "q2": 0.2, "q3": 0.8}, na_prob_thresh=0.5)
    runs = [
        lambda out: main([data, preds, "--na-prob-file", na, "--na-prob-thresh", "0.5", "--out-file", out]),
        lambda out: main([data, preds, "--na_probs", na, "--na_prob_thresh", "0.5", "--out_file", out]),
        lambda out: cli_main(["score", "squad", "--data", data, "--predictions", preds, "--na_probs", na,
                              "--na_prob_thresh", "0.5", "--out_file", out]),
        lambda out: cli_main(["score", "squad", "--data", data, "--predictions", preds, "--na-prob-file", na,
                              "--na-prob-thresh", "0.5", "--out-file", out]),
    ]
    for i, run in enumerate(runs):
        out = tmp_path / f"out{i}.json"
        assert run(str(out)) == 0
        assert json.loads(out.read_text(encoding="utf-8")) == expected, i
    capsys.readouterr()
