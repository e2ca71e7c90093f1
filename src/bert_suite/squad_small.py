"""SQuAD-small: a SQuAD v1.1 task small enough to measure pre-training on, made from the official dev set.

Only `dev-v1.1.json` (48 articles, 10,570 questions) is needed: its articles are split into a train and a dev
side, whole articles on each side, so no article (and so no paragraph, no passage a question was written about)
is on both. The split is a pure function of the file's article titles and `seed`: articles are ordered by a
hash of (seed, title), and taken into dev in that order until dev holds at least `1 - train_share` of the
questions; the rest is train. Both sides are written in the official layout, so the official-equal scorer
(`bert-suite score squad --data dev.json`) reads them, and `bert-suite decontaminate --against dev.json` removes
the dev articles' text from a pre-training corpus.

Its scores are not comparable with the official dev set's (Table 2): fewer training questions (about 8.4k of
87.6k), another dev set (about 2.2k questions of 10 articles), and dev questions with three answers each where
the official train set has one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .io import atomic_write_text

FILES = ("train.json", "dev.json")  # what tasks/squad/small.yaml reads from --data_dir
REPORT = "split.json"


class SquadSmallError(ValueError):
    """An input the split cannot use; the message names the file and what was expected."""


def _questions(article: dict) -> int:
    return sum(len(p.get("qas", [])) for p in article.get("paragraphs", []))


def split_articles(articles: list[dict], train_share: float = 0.8, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train articles, dev articles), each in the file's order. Dev takes articles in the order of
    sha256(seed, title) until it holds at least 1 - train_share of the questions."""
    if not 0 < train_share < 1:
        raise SquadSmallError(f"--train_share must be between 0 and 1 (exclusive), got {train_share}")
    titles = [a.get("title", "") for a in articles]
    twice = sorted({t for t in titles if titles.count(t) > 1})
    if twice:
        raise SquadSmallError(f"article title {twice[0]!r} occurs more than once; expected one article per title (the split is "
                              "by article)")
    total = sum(map(_questions, articles))
    order = sorted(range(len(articles)),
                   key=lambda i: hashlib.sha256(f"{seed}\0{titles[i]}".encode()).hexdigest())
    dev, held = set(), 0
    for i in order:
        if held >= (1 - train_share) * total:
            break
        dev.add(i)
        held += _questions(articles[i])
    if len(dev) == len(articles):
        raise SquadSmallError(f"{len(articles)} article(s): the dev side took them all; expected more articles "
                              "(one article cannot be on both sides)")
    return ([a for i, a in enumerate(articles) if i not in dev], [a for i, a in enumerate(articles) if i in dev])


def _side(articles: list[dict]) -> dict:
    return {"articles": len(articles), "paragraphs": sum(len(a.get("paragraphs", [])) for a in articles),
            "questions": sum(map(_questions, articles)), "titles": [a.get("title", "") for a in articles]}


def build_squad_small(source: str | Path, output_dir: str | Path, train_share: float = 0.8, seed: int = 0) -> dict:
    """Write OUTPUT_DIR/train.json, dev.json (the official layout) and split.json (what went where, and the
    source's sha256); returns split.json's content."""
    source = Path(source)
    try:
        raw = source.read_bytes()
        document = json.loads(raw.decode("utf-8-sig"))
    except OSError as err:
        raise SquadSmallError(f"{source}: cannot read it ({err.strerror}); expected the official SQuAD v1.1 "
                              "dev-v1.1.json") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SquadSmallError(f"{source}: not JSON ({err}); expected the official SQuAD v1.1 dev-v1.1.json") from None
    articles = document.get("data") if isinstance(document, dict) else None
    if not isinstance(articles, list) or not all(isinstance(a, dict) and isinstance(a.get("paragraphs"), list)
                                                 for a in articles):
        raise SquadSmallError(f'{source}: expected {{"data": [articles with "title" and "paragraphs"]}} (the SQuAD '
                              "layout)")
    if any(qa.get("is_impossible") for a in articles for p in a["paragraphs"] for qa in p.get("qas", [])):
        raise SquadSmallError(f"{source}: holds unanswerable questions (SQuAD v2.0); expected a v1.1 file")
    train, dev = split_articles(articles, train_share, seed)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    version = document.get("version", "1.1")
    for name, side in zip(FILES, (train, dev), strict=True):
        atomic_write_text(out / name, json.dumps({"version": version, "data": side}, ensure_ascii=False))
    report = {"source": str(source), "source_sha256": hashlib.sha256(raw).hexdigest(), "train_share": train_share,
              "seed": seed, "train": _side(train), "dev": _side(dev),
              "note": "split by article: no article, so no paragraph, is on both sides; not comparable with the "
                      "official SQuAD v1.1 dev set"}
    atomic_write_text(out / REPORT, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report
