"""Entity-level NER scores with the conlleval script's counting (CoNLL-2003, Table 7)."""

from __future__ import annotations

from collections import Counter


def ner_scores(gold_tags: list[list[str]], predicted_tags: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (micro over all entities, and per type as TYPE_precision,
    TYPE_recall, TYPE_f1 for every type in the gold or predicted tags) and token accuracy, all fractions (0 where
    undefined). Entities are read as conlleval reads them, with seqeval's default-mode chunker: an entity starts
    at B-, or at an I- after O, after another type or at a sentence start, so an invalid predicted I- still
    counts; a predicted entity is correct when its type and both boundaries match a gold entity. Equal to
    seqeval's precision/recall/f1 (default mode), computed from one pass over each side."""
    if len(gold_tags) != len(predicted_tags) or any(len(g) != len(p) for g, p in zip(gold_tags, predicted_tags,
                                                                                   strict=True)):
        raise ValueError("gold and predicted tags must have the same sentences and lengths")
    gold, predicted = _entities(gold_tags), _entities(predicted_tags)
    words = sum(map(len, gold_tags))
    right = sum(g == p for gs, ps in zip(gold_tags, predicted_tags, strict=True) for g, p in zip(gs, ps, strict=True))
    scores = _prf(len(gold & predicted), len(predicted), len(gold))
    scores["accuracy"] = right / words if words else 0.0
    per_gold, per_predicted = Counter(e[0] for e in gold), Counter(e[0] for e in predicted)
    per_correct = Counter(e[0] for e in gold & predicted)
    for kind in sorted(per_gold | per_predicted):
        prf = _prf(per_correct[kind], per_predicted[kind], per_gold[kind])
        scores.update({f"{kind}_{name}": value for name, value in prf.items()})
    return scores


def entity_counts(tags: list[list[str]]) -> dict[str, int]:
    """Number of entities of each type in `tags` (one tag sequence per sentence), read as `ner_scores` reads them:
    the per-type support that seqeval's classification report calls "support" and the `evaluate` module "number"."""
    return dict(Counter(kind for kind, _, _ in _entities(tags)))


def _entities(tags: list[list[str]]) -> set[tuple[str, int, int]]:
    """(type, first, last) of every entity, offsets running over the sentences joined (seqeval's default mode)."""
    # imported here: seqeval imports scikit-learn (1-2 s), which a process that never scores NER need not pay
    from seqeval.metrics.sequence_labeling import get_entities

    return set(get_entities([list(t) for t in tags]))


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
