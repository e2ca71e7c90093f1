"""SQuAD-small (`bert-suite squad-small`, the squad_small card): SQuAD v1.1's dev set split by article, no
article and so no paragraph on both sides, deterministic, about 80% of the questions for training, readable by
the task's adapter and the official-equal scorer, and its dev text removable from a pre-training corpus."""

import json
import random

import pytest

from bert_suite.adapters import adapter_for
from bert_suite.cards import load_card
from bert_suite.cli import main as cli_main
from bert_suite.pretraining.decontaminate import decontaminate
from bert_suite.squad_small import SquadSmallError, build_squad_small


def write_official(path, articles=20, seed=0, **question_extra):
    """An official-layout v1.1 file: articles with 1-4 paragraphs of 2-9 questions each."""
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paragraphs = []
        for p in range(rng.randint(1, 4)):
            context = f"Article {a} paragraph {p} says that the answer number {a * 10 + p} is written right here."
            qas = [{"id": f"{a}-{p}-{q}", "question": f"What number does article {a} paragraph {p} give, asked {q}?",
                    "answers": [{"text": f"{a * 10 + p}", "answer_start": context.index(f" {a * 10 + p} ") + 1}],
                    **question_extra} for q in range(rng.randint(2, 9))]
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"Article_{a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


def sides(folder):
    return [json.loads((folder / name).read_text())["data"] for name in ("train.json", "dev.json")]


def test_the_split_is_by_article_about_80_percent_of_questions_and_deterministic(tmp_path):
    source = write_official(tmp_path / "dev-v1.1.json")
    report = build_squad_small(source, tmp_path / "a")
    train, dev = sides(tmp_path / "a")
    titles = [{a["title"] for a in side} for side in (train, dev)]
    contexts = [{p["context"] for a in side for p in a["paragraphs"]} for side in (train, dev)]
    assert not titles[0] & titles[1] and not contexts[0] & contexts[1]
    assert len(titles[0]) + len(titles[1]) == 20
    questions = [sum(len(p["qas"]) for a in side for p in a["paragraphs"]) for side in (train, dev)]
    assert questions == [report["train"]["questions"], report["dev"]["questions"]]
    share = questions[0] / sum(questions)
    largest = max(sum(len(p["qas"]) for p in a["paragraphs"]) for a in train + dev) / sum(questions)
    assert 0.8 - largest <= share <= 0.8  # dev takes whole articles until it holds at least 20%
    assert report["source_sha256"] and sorted(report["dev"]["titles"]) == sorted(titles[1])
    # the same file gives the same bytes; so does the file with its articles in another order (a hash orders them)
    build_squad_small(source, tmp_path / "b")
    for name in ("train.json", "dev.json", "split.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    shuffled = json.loads(source.read_text())
    shuffled["data"].reverse()
    (tmp_path / "reversed.json").write_text(json.dumps(shuffled))
    build_squad_small(tmp_path / "reversed.json", tmp_path / "c")
    assert {a["title"] for a in sides(tmp_path / "c")[1]} == titles[1]


def test_the_card_reads_both_sides_and_other_shares_and_seeds_move_the_split(tmp_path, capsys):
    source = write_official(tmp_path / "dev-v1.1.json")
    assert cli_main(["squad-small", "--input", str(source), "--output_dir", str(tmp_path / "out")]) == 0
    assert "no article on both sides" in capsys.readouterr().out
    card = load_card("squad_small")
    adapter = adapter_for(card.family)
    train = adapter.load_split(card, "train", str(tmp_path / "out"))
    dev = adapter.load_split(card, "validation", str(tmp_path / "out"))
    split = json.loads((tmp_path / "out" / "split.json").read_text())
    assert (len(train), len(dev)) == (split["train"]["questions"], split["dev"]["questions"])
    assert not set(train["title"]) & set(dev["title"])
    half = build_squad_small(source, tmp_path / "half", train_share=0.5)
    assert half["dev"]["questions"] > split["dev"]["questions"]
    other = build_squad_small(source, tmp_path / "seed", seed=1)
    assert other["dev"]["titles"] != split["dev"]["titles"]


def test_the_dev_articles_text_is_removed_from_a_corpus_and_the_train_articles_is_not(tmp_path):
    build_squad_small(write_official(tmp_path / "dev-v1.1.json"), tmp_path / "small")
    train, dev = sides(tmp_path / "small")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{dev[0]['paragraphs'][0]['context']}\nA sentence of its own, about nothing at all.\n\n"
                      f"{train[0]['paragraphs'][0]['context']}\n")
    report = decontaminate([str(corpus)], [str(tmp_path / "small" / "dev.json")], str(tmp_path / "clean"))
    kept = (tmp_path / "clean" / "corpus.txt").read_text()
    assert report.sentences_removed == 1 and dev[0]["paragraphs"][0]["context"] not in kept
    assert train[0]["paragraphs"][0]["context"] in kept


@pytest.mark.parametrize("case, message", [
    ("v2", r"unanswerable questions \(SQuAD v2.0\); expected a v1.1 file"),
    ("twice", r"article title 'Article_0' occurs more than once"),
    ("one", r"1 article\(s\): the dev side took them all"),
    ("share", r"--train_share must be between 0 and 1"),
    ("missing", r"cannot read it"),
])
def test_bad_input_is_one_clear_error(tmp_path, case, message):
    source = tmp_path / "dev-v1.1.json"
    share = 0.8
    if case == "v2":
        write_official(source, is_impossible=True)
    elif case == "twice":
        write_official(source)
        data = json.loads(source.read_text())
        data["data"][1]["title"] = "Article_0"
        source.write_text(json.dumps(data))
    elif case == "one":
        write_official(source, articles=1)
    elif case == "share":
        write_official(source)
        share = 1.0
    with pytest.raises(SquadSmallError, match=message):
        build_squad_small(source, tmp_path / "out", train_share=share)
    assert not (tmp_path / "out").exists()
