"""A task's training text as a pre-training corpus, for task-adaptive pre-training (continued
pre-training on the task's own unlabelled text; Gururangan et al. 2020, "Don't Stop Pretraining").

Only the card's train split is ever read. Dev and test text must never reach pre-training: the dev
scores choose and report the fine-tuned model, and a model that has seen the dev sentences would be
scored on text it was trained on. The file is in the pre-training reference format (one sentence
per line, a blank line between documents), which `bert-suite pretrain-data --format lines` and
`bert-suite tokenizer` read. What one example becomes, by family:
- classification: one document per example, its one or two texts one line each (a sentence pair
  stays together, so next-sentence prediction sees sentence 2 follow sentence 1);
- squad: one document per context, its sentences, then the questions asked about it;
- multiple_choice: one document per example, the context sentence, then the start of the next
  sentence with the correct ending;
- ner: one document per source document, a sentence per line (its words joined by spaces).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from .adapters import DataError, adapter_for
from .cards import TaskCard
from .io import atomic_write_text
from .pretraining.text_files import split_sentences


def train_split_of(card: TaskCard, split: str | None = None) -> str:
    """The split to read: the card's train split; any other (`dev`, `validation_matched`, `test`) is refused."""
    if card.train_split is None:
        raise DataError(f"{card.path}: task {card.name} has no train split (predict-only), so it has no text to "
                        "pre-train on")
    if split not in (None, "train", card.train_split):
        raise DataError(f"--split {split}: only the task's train split ({card.train_split}) may become pre-training "
                        "text, never dev or test text (the scores would be measured on text the model was trained on)")
    return card.train_split


def _line(text) -> str:
    """One line of text: line breaks and tabs inside a field would split it into sentences or documents."""
    return " ".join(str(text).split()) if text is not None else ""


def task_documents(card: TaskCard, examples) -> Iterator[list[str]]:
    """The documents (lists of lines, possibly empty) of a split's examples, by the card's family."""
    rows = examples.to_dict()
    count = len(examples)
    if card.family == "classification":
        for i in range(count):
            yield [_line(rows[c][i]) for c in card.text_columns]
    elif card.family == "squad":
        questions: dict[str, list[str]] = {}  # context -> its questions, contexts in order of first appearance
        for context, question in zip(rows["context"], rows["question"], strict=True):
            questions.setdefault(context, []).append(_line(question))
        for context, asked in questions.items():
            yield [*split_sentences(_line(context)), *asked]
    elif card.family == "multiple_choice":
        from .adapters.multiple_choice import endings

        names = endings(card)
        first, start = card.text_columns
        for i in range(count):
            label = rows["label"][i] if "label" in rows else None
            ending = rows[names[label]][i] if label is not None and 0 <= label < len(names) else ""
            yield [_line(rows[first][i]), _line(f"{rows[start][i]} {ending}")]
    elif card.family == "ner":
        by_document: dict[int, list[str]] = {}
        for doc_id, words in zip(rows["doc_id"], rows["tokens"], strict=True):
            by_document.setdefault(doc_id, []).append(_line(" ".join(words)))
        yield from by_document.values()
    else:
        raise DataError(f"{card.path}: no task-text corpus for family {card.family!r}")


def write_task_corpus(card: TaskCard, output_dir: str | Path, data_dir: str | Path | None = None,
                      split: str | None = None, skip_bad_rows: bool = False) -> dict:
    """Write the train split's texts to OUTPUT_DIR/<task>-train.txt; return what was written: the file,
    examples read, documents and lines written, and documents left out because they held no text."""
    split = train_split_of(card, split)
    examples = adapter_for(card.family).load_split(card, split, data_dir, skip_bad_rows)
    documents, lines, empty = [], 0, 0
    for doc in task_documents(card, examples):
        doc = [line for line in doc if line]
        if not doc:
            empty += 1
            continue
        documents.append("\n".join(doc))
        lines += len(doc)
    if not documents:
        raise DataError(f"{card.path}: the {split} split of task {card.name} holds no text")
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    path = atomic_write_text(Path(output_dir) / f"{card.name}-{split}.txt", "\n\n".join(documents) + "\n")
    return {"file": str(path), "task": card.name, "split": split, "examples": len(examples),
            "documents": len(documents), "lines": lines, "empty_documents": empty}
