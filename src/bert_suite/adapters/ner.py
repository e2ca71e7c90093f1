"""Named entity recognition on CoNLL-2003 (and any file in its layout), with document context.

Reading -> `datasets.Dataset` of sentences in file order: `id` (index of the sentence in the file, counting
skipped ones), `doc_id` (0, 1, ... per document), `doc_start` (True on the first sentence of a document that
began with a `-DOCSTART-` line, so prediction files can restore those lines), `line` (file line of the
sentence's first word, or Hub row), `tokens` (the words) and `ner_tags` (IOB2 label ids into the card's labels;
absent for a words-only file). The distributed files are `word POS chunk NER` lines, blank lines between
sentences and `-DOCSTART- -X- -X- O` lines between documents; the original files tag in IOB1 and most copies in
IOB2: the scheme is detected per file and IOB1 converted to IOB2 (see `detect_scheme`). The Hub copy
(eriktks/conll2003) has one row per sentence and marks each document with a row whose tokens are
["-DOCSTART-"].

Pre-processing -> features, one per window of sub-tokens. Words are tokenised one by one (a fast tokenizer's
`is_split_into_words` does the same per word; doing it here lets a word that yields no sub-token at all, e.g.
a lone control character, stand as [UNK] instead of silently vanishing). With the card option
`context: document` (the paper's "maximal document context") the sub-tokens of a whole document are cut into
windows of max_seq_length - 2 sub-tokens starting every half window; with `context: sentence` each sentence is
cut alone the same way (a sentence longer than a window gets several windows, never truncated). Each window is
`[CLS] sub-tokens [SEP]`, token_type_ids 0. Every word is predicted from the window where it has the most
context: the largest min(sub-tokens to the left, sub-tokens to the right) of its first sub-token, ties to the
first window (`common.max_context_windows`, without SQuAD's length bonus). Since the windows cover every sub-token, every word's first sub-token
lies in some window: no word is ever dropped.

`labels`: the word's tag on its first sub-token in its max-context window, -100 elsewhere (other sub-tokens,
special tokens, and the same word seen in another window). With `label_all_subtokens: true`, the other
sub-tokens of the word carry its tag too (B-X turned into I-X, so the sub-token sequence stays valid IOB2).
Training labels each word in its max-context window only, not in every window that holds it: each word then
counts once per epoch, as in sentence-level training, and it is trained in the position (with the context) it
is predicted from; a word near a window's edge has little context there, and learning to tag it from that
truncated context is a task prediction never asks for. Training windows that carry no label are left out.

Evaluation features also carry, for each word whose first sub-token is in the window, aligned lists:
`word_position` (position in the feature's input_ids), `word_sentence` (row of the examples), `word_index`
(index of the word in its sentence) and `word_is_max_context`. `word_predictions` turns logits into exactly
one tag per word with them; `ner_scores` scores tags at entity level like conlleval (seqeval's default mode).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np
import pyarrow as pa

from ..cards import TaskCard
from ..io import atomic_write_text
from ..metrics.ner import ner_scores  # noqa: F401  (part of this module's API: the feature-based route)
from .common import (
    DataError,
    family_options,
    load_hub_split,
    max_context_windows,
    num_windows,
    read_text,
    split_file_stem,
)
from .files import check_extension, data_file_of, read_data_file

if TYPE_CHECKING:
    import torch


def __getattr__(name: str):
    """MODEL_CLASS (BertSuiteForTokenClassification), imported when asked for: reading a split needs no torch."""
    if name == "MODEL_CLASS":
        from ..modeling_bert_suite import BertSuiteForTokenClassification

        return BertSuiteForTokenClassification
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


METRICS_USE_EXAMPLES = True  # metric_fn reads the split's examples (see runner.train_and_evaluate)

DOCSTART = "-DOCSTART-"
IGNORE_INDEX = -100
OPTION_DEFAULTS: dict[str, Any] = {"context": "document", "label_all_subtokens": False}
CONTEXTS = ("document", "sentence")
LABELLED_COLUMNS, WORDS_ONLY_COLUMNS = 4, 1  # word POS chunk NER, or words to predict
MAPPING_COLUMNS = ("word_position", "word_sentence", "word_index", "word_is_max_context")


def ner_options(card: TaskCard) -> dict[str, Any]:
    """The card's NER settings over the defaults; unknown keys and bad values are errors naming the card."""
    options = family_options(card, OPTION_DEFAULTS, "NER")
    if options["context"] not in CONTEXTS:
        raise ValueError(f"{card.path}: options.context must be one of {', '.join(CONTEXTS)}, got "
                         f"{options['context']!r}")
    if not isinstance(options["label_all_subtokens"], bool):
        raise ValueError(f"{card.path}: options.label_all_subtokens must be true or false, got "
                         f"{options['label_all_subtokens']!r}")
    return options


# ----------------------------------------------------------------------------------------------------------------
# Tags and schemes


def entity_types(labels: Sequence[str]) -> list[str]:
    """Entity types of an IOB2 label list (O, B-X, I-X, ...), in order of first appearance. The list must hold
    O and both B- and I- of every type."""
    if not labels or "O" not in labels:
        raise ValueError(f"NER labels must include O, got {labels}")
    types: list[str] = []
    for label in labels:
        if label == "O":
            continue
        prefix, dash, kind = label.partition("-")
        if prefix not in ("B", "I") or not dash or not kind:
            raise ValueError(f"NER label {label!r} is not O, B-TYPE or I-TYPE")
        if kind not in types:
            types.append(kind)
    missing = [f"{p}-{t}" for t in types for p in "BI" if f"{p}-{t}" not in labels]
    if missing:
        raise ValueError(f"NER labels {list(labels)} lack {missing[0]} (each type needs B- and I-)")
    return types


def _tag_problem(tag: str, types: Sequence[str]) -> str | None:
    """Why `tag` is not O or B-/I- of a known type (None when it is)."""
    if tag == "O":
        return None
    prefix, dash, kind = tag.partition("-")
    if prefix in ("B", "I") and dash and kind in types:
        return None
    return f"tag {tag!r} is not O or B-/I- followed by one of the types {', '.join(types)}"


def _kind(tag: str) -> str | None:
    return None if tag == "O" else tag[2:]


def detect_scheme(sequences: Sequence[Sequence[str]]) -> tuple[str, tuple[int, int] | None, tuple[int, int] | None]:
    """The tagging scheme of sentences of IOB tags: "IOB1", "IOB2" or "mixed", with the (sentence, word) of the
    first I- tag that starts an entity (at sentence start, after O or after another type: IOB1 style, invalid
    in IOB2) and of the first B- tag that starts an entity not right after a token of its type (IOB2 style; in
    IOB1, B- only separates two adjacent entities of one type). Both kinds in one file: "mixed". Neither
    (e.g. no entities): "IOB2", nothing to convert."""
    i_start = b_start = None
    for s, tags in enumerate(sequences):
        previous = None
        for w, tag in enumerate(tags):
            kind = _kind(tag)
            if kind is not None and kind != previous:
                if tag[0] == "I" and i_start is None:
                    i_start = (s, w)
                elif tag[0] == "B" and b_start is None:
                    b_start = (s, w)
            previous = kind
        if i_start is not None and b_start is not None:
            break
    if i_start is not None and b_start is not None:
        return "mixed", i_start, b_start
    return ("IOB1" if i_start is not None else "IOB2"), i_start, b_start


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """One sentence's IOB1 tags as IOB2: an I-X that starts an entity (first word, after O or after another
    type) becomes B-X; everything else is kept (an IOB1 B-X, found only right after an X, starts a new entity
    in both schemes)."""
    out, previous = [], None
    for tag in tags:
        kind = _kind(tag)
        out.append(f"B-{kind}" if kind is not None and tag[0] == "I" and kind != previous else tag)
        previous = kind
    return out


# ----------------------------------------------------------------------------------------------------------------
# Reading


class _Collector:
    """Sentences and document boundaries as a reader meets them; bad sentences and empty documents are errors
    or, with skip_bad_rows, counted."""

    def __init__(self, skip_bad_rows: bool):
        self.skip_bad_rows = skip_bad_rows
        self.words: list[list[str]] = []
        self.tags: list[list[str]] = []
        self.doc_ids: list[int] = []
        self.doc_start: list[bool] = []
        self.lines: list[int] = []
        self.ids: list[int] = []
        self.sentences_seen = 0
        self.documents = 0
        self.skipped_sentences = 0
        self.skipped_documents = 0
        self.pending_docstart: str | None = None  # where a -DOCSTART- not yet followed by a sentence is
        self.new_document = True

    def bad(self, message: str) -> None:
        """A bad sentence: an error, or (skip_bad_rows) counted; the caller drops the sentence."""
        if not self.skip_bad_rows:
            raise DataError(message)
        self.skipped_sentences += 1
        self.sentences_seen += 1

    def docstart(self, where: str) -> None:
        self._close_document()
        self.pending_docstart = where
        self.new_document = True

    def sentence(self, words: list[str], tags: list[str] | None, line: int) -> None:
        if self.new_document:
            self.documents += 1
            self.doc_start.append(self.pending_docstart is not None)
            self.pending_docstart, self.new_document = None, False
        else:
            self.doc_start.append(False)
        self.words.append(words)
        if tags is not None:
            self.tags.append(tags)
        self.doc_ids.append(self.documents - 1)
        self.lines.append(line)
        self.ids.append(self.sentences_seen)
        self.sentences_seen += 1

    def finish(self) -> None:
        self._close_document()

    def _close_document(self) -> None:
        if self.pending_docstart is None:
            return
        if not self.skip_bad_rows:
            raise DataError(f"{self.pending_docstart}: -DOCSTART- starts an empty document (no sentence before the "
                            "next -DOCSTART- or the end of the data); expected at least one sentence")
        self.skipped_documents += 1
        self.pending_docstart = None


def read_conll(path: str | Path, labels: Sequence[str], skip_bad_rows: bool = False, *,
               require_tags: bool = False) -> tuple[datasets.Dataset, dict[str, Any]]:
    """Read a file in the CoNLL-2003 layout: `word POS chunk NER` per line (whitespace-separated), a blank line
    between sentences, `-DOCSTART- ...` lines between documents (sentences before the first one form a document
    of their own). A words-only file (one column) is new data to predict: no `ner_tags` then, unless
    `require_tags` (training data), which makes it an error.

    Errors name the file and line and say what was expected: a line whose column count differs from the file's
    (4, or 1 for words only), a tag that is not O or B-/I- of one of the labels' types, a file mixing the IOB1
    and IOB2 schemes, an empty document (-DOCSTART- followed by no sentence). With `skip_bad_rows` a sentence
    holding a bad line and an empty document are left out and counted instead (a mixed scheme is always an
    error: it concerns the whole file).

    Returns the dataset (see the module docstring; `dataset.info.description` is the path) and
    {"source", "scheme" ("IOB1"/"IOB2", None without tags), "converted" (IOB1 -> IOB2), "sentences",
    "documents", "words", "skipped" (sentences), "skipped_documents"}."""
    path = Path(path)
    types = entity_types(labels)
    text = read_text(path, "a CoNLL-2003 file (word POS chunk NER per line)")

    collector = _Collector(skip_bad_rows)
    columns: int | None = None
    words: list[str] = []
    tags: list[str] = []
    first_line = 0
    bad = False

    def end_sentence() -> None:
        nonlocal words, tags, bad
        if words and not bad:
            collector.sentence(words, tags if columns == LABELLED_COLUMNS else None, first_line)
        words, tags, bad = [], [], False

    for line_no, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            end_sentence()
            continue
        if fields[0] == DOCSTART:
            end_sentence()
            collector.docstart(f"{path}:{line_no}")
            continue
        if columns is None:
            if len(fields) not in (LABELLED_COLUMNS, WORDS_ONLY_COLUMNS):
                raise DataError(f"{path}:{line_no}: expected 4 whitespace-separated columns (word POS chunk NER), "
                                f"or 1 (words only, new data to predict), found {len(fields)}")
            columns = len(fields)
            if columns == WORDS_ONLY_COLUMNS and require_tags:
                raise DataError(f"{path}:{line_no}: training data needs NER tags; expected 4 columns "
                                "(word POS chunk NER), found 1")
        if not words:
            first_line = line_no
        if bad:
            continue
        problem = None
        if len(fields) != columns:
            problem = (f"expected {columns} whitespace-separated column{'s' if columns > 1 else ''}"
                       f"{' (word POS chunk NER)' if columns == LABELLED_COLUMNS else ''} like the file's first "
                       f"line, found {len(fields)}")
        elif columns == LABELLED_COLUMNS:
            problem = _tag_problem(fields[-1], types)
        if problem:
            collector.bad(f"{path}:{line_no}: {problem}")
            bad = True
            continue
        words.append(fields[0])
        if columns == LABELLED_COLUMNS:
            tags.append(fields[-1])
    end_sentence()
    collector.finish()

    def locate(s: int, w: int) -> str:
        return f"{path}:{collector.lines[s] + w}"

    return _build(collector, labels, str(path), locate, columns != WORDS_ONLY_COLUMNS)


def rows_to_dataset(rows: datasets.Dataset, labels: Sequence[str], source: str,
                    skip_bad_rows: bool = False) -> tuple[datasets.Dataset, dict[str, Any]]:
    """Sentences of a Hub dataset in the eriktks/conll2003 layout (`tokens`, `ner_tags` as class ids, names
    from the column's ClassLabel, else the card's label order; tag strings also accepted) into the reader's
    layout. A row whose tokens are ["-DOCSTART-"] starts a new document. Errors (and `skip_bad_rows`) as in
    `read_conll`, naming `source` and the row; returns the same (dataset, info)."""
    types = entity_types(labels)
    if "tokens" not in rows.column_names:
        raise DataError(f"{source}: no column 'tokens'; expected the eriktks/conll2003 layout")
    has_tags = "ner_tags" in rows.column_names
    names = None
    if has_tags:
        inner = getattr(rows.features["ner_tags"], "feature", None)
        names = list(inner.names) if isinstance(inner, datasets.ClassLabel) else list(labels)
    collector = _Collector(skip_bad_rows)
    data = rows.select_columns(["tokens", "ner_tags"] if has_tags else ["tokens"]).to_dict()
    for r, words in enumerate(data["tokens"]):
        if words == [DOCSTART]:
            collector.docstart(f"{source} row {r}")
            continue
        where = f"{source} row {r}"
        if not words:
            collector.bad(f"{where}: empty sentence; expected at least one token")
            continue
        blank = next((w for w, word in enumerate(words) if not word or any(c.isspace() for c in word)), None)
        if blank is not None:
            collector.bad(f"{where}, word {blank}: token {words[blank]!r} is empty or holds white space")
            continue
        tags = None
        if has_tags:
            raw = data["ner_tags"][r]
            if len(raw) != len(words):
                collector.bad(f"{where}: {len(words)} tokens but {len(raw)} NER tags; expected one tag per token")
                continue
            try:
                tags = [names[t] if isinstance(t, int) else str(t) for t in raw]
            except IndexError:
                collector.bad(f"{where}: tag id out of range 0..{len(names) - 1}")
                continue
            problem = next(((w, p) for w, t in enumerate(tags) if (p := _tag_problem(t, types))), None)
            if problem:
                collector.bad(f"{where}, word {problem[0]}: {problem[1]}")
                continue
        collector.sentence(list(words), tags, r)
    collector.finish()

    def locate(s: int, w: int) -> str:
        return f"{source} row {collector.lines[s]}, word {w}"

    return _build(collector, labels, source, locate, has_tags)


def _build(collector: _Collector, labels: Sequence[str], source: str, locate, has_tags: bool
           ) -> tuple[datasets.Dataset, dict[str, Any]]:
    """Check the scheme, convert IOB1, map tags to ids: the reader's dataset and info."""
    if not collector.words:
        raise DataError(f"{source}: no sentences; expected CoNLL-2003 data (word POS chunk NER per line)")
    scheme, converted = None, False
    tag_sequences = collector.tags if has_tags else None
    if tag_sequences is not None:
        scheme, i_start, b_start = detect_scheme(tag_sequences)
        if scheme == "mixed":
            i_text = f"{collector.tags[i_start[0]][i_start[1]]} starts an entity (IOB1 style)"
            b_text = f"{collector.tags[b_start[0]][b_start[1]]} starts an entity after O, another type or the " \
                     "sentence start (IOB2 style)"
            (first, first_text), (later, later_text) = sorted([(i_start, i_text), (b_start, b_text)])
            raise DataError(f"{locate(*later)}: {later_text}, but {locate(*first)}: {first_text}; expected one "
                            "tagging scheme per file (IOB2: every entity starts with B-; IOB1: entities start "
                            "with I-, B- only between two adjacent entities of one type)")
        if scheme == "IOB1":
            tag_sequences = [iob1_to_iob2(tags) for tags in tag_sequences]
            converted = True
    columns: dict[str, list] = {"id": collector.ids, "doc_id": collector.doc_ids, "doc_start": collector.doc_start,
                                "line": collector.lines, "tokens": collector.words}
    features = {"id": datasets.Value("int64"), "doc_id": datasets.Value("int64"), "doc_start": datasets.Value("bool"),
                "line": datasets.Value("int64"), "tokens": datasets.List(datasets.Value("string"))}
    if tag_sequences is not None:
        label_id = {label: i for i, label in enumerate(labels)}
        columns["ner_tags"] = [[label_id[t] for t in tags] for tags in tag_sequences]
        features["ner_tags"] = datasets.List(datasets.ClassLabel(names=list(labels)))
    schema = datasets.Features(features)
    info = datasets.DatasetInfo(description=source, features=schema)  # preprocess names the data by it
    dataset = datasets.Dataset.from_dict(columns, features=schema, info=info)
    return dataset, {"source": source, "scheme": scheme, "converted": converted, "sentences": len(collector.words),
                     "documents": collector.documents, "words": sum(map(len, collector.words)),
                     "skipped": collector.skipped_sentences, "skipped_documents": collector.skipped_documents}


def describe(info: dict[str, Any]) -> str:
    """The one line the loader prints about what it read."""
    if info["scheme"] is None:
        what = "no NER tags (words only)"
    elif info["converted"]:
        what = "IOB1 tags detected, converted to IOB2"
    else:
        what = "IOB2 tags detected, used as they are"
    text = f"[bert_suite] {info['source']}: {what} ({info['sentences']} sentences, {info['documents']} documents)"
    if info["skipped"] or info["skipped_documents"]:
        text += (f"; skipped {info['skipped']} malformed sentences and {info['skipped_documents']} empty documents "
                 "(--skip_bad_rows)")
    return text


CONLL_EXTENSIONS = (".txt", ".conll", ".iob", ".bio")
FILE_EXTENSIONS = (*CONLL_EXTENSIONS, ".json", ".jsonl", ".parquet")


def read_ner_file(card: TaskCard, split: str, path: Path, skip_bad_rows: bool = False
                  ) -> tuple[datasets.Dataset, dict[str, Any]]:
    """One split from a data file: CoNLL text (word ... NER per line) or sentence records with `tokens` and
    `ner_tags` (tag names, or ids in the card's label order) as JSON, JSON Lines or Parquet, as the
    transformers token-classification example reads them."""
    suffix = check_extension(path, FILE_EXTENSIONS, "ner",
                             "a CoNLL file, or tokens/ner_tags records in JSON, JSON Lines or Parquet")
    training = split == card.train_split
    if suffix in CONLL_EXTENSIONS:
        return read_conll(path, card.labels or [], skip_bad_rows, require_tags=training)
    rows = read_data_file(path, "sentence records with tokens and ner_tags")
    dataset, info = rows_to_dataset(rows, card.labels or [], str(path), skip_bad_rows)
    if training and info["scheme"] is None:
        raise DataError(f"{path}: training data needs NER tags (no column 'ner_tags'; found: "
                        f"{', '.join(rows.column_names)})")
    return dataset, info


def load_split(card: TaskCard, split: str, data_dir: str | Path | None = None,
               skip_bad_rows: bool = False) -> datasets.Dataset:
    """One split of sentences: from `data_dir` (the folder with the card's files, or one file) when given, else
    from the Hub. Prints one line saying which tagging scheme was found and whether it was converted."""
    spec = card.splits[split]
    labels = card.labels or []
    data_file = data_file_of(card, split)
    if data_file is not None:
        dataset, info = read_ner_file(card, split, data_file, skip_bad_rows)
    elif data_dir is not None:
        path = Path(data_dir)
        if path.is_dir():
            if spec.file is None:
                raise DataError(f"{card.path}: split {split!r} has no local file; pass the file itself as "
                                "--data_dir or remove --data_dir to use the Hub")
            path = path / spec.file
        dataset, info = read_conll(path, labels, skip_bad_rows, require_tags=split == card.train_split)
    else:
        rows, source = load_hub_split(card, split, "the CoNLL-2003 files (train.txt, valid.txt, test.txt)")
        dataset, info = rows_to_dataset(rows, labels, source, skip_bad_rows)
        if split == card.train_split and info["scheme"] is None:
            raise DataError(f"{info['source']}: training data needs NER tags (no column 'ner_tags')")
    print(describe(info))
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Windows


def default_stride(window_length: int) -> int:
    """Half a window (at least 1 sub-token)."""
    return max(1, window_length // 2)


def _exclusive_cumsum(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values), dtype=np.int64)
    np.cumsum(values[:-1], out=out[1:])
    return out


def _list_array(lengths: np.ndarray, values: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def word_subtokens(tokenizer, words: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Sub-token ids of each word (no special tokens), each distinct word tokenised once: (lengths per word,
    flat ids). A word that yields no sub-token (e.g. only characters the tokenizer removes) becomes [UNK]."""
    index: dict[str, int] = {}
    codes = np.fromiter((index.setdefault(w, len(index)) for w in words), dtype=np.int64, count=len(words))
    if not index:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ids = tokenizer(list(index), add_special_tokens=False, return_attention_mask=False,
                    return_token_type_ids=False, verbose=False)["input_ids"]
    unk = tokenizer.unk_token_id
    if unk is None and any(not x for x in ids):
        raise ValueError("a word yields no sub-token and the tokenizer has no unknown token to stand for it")
    ids = [x if x else [unk] for x in ids]
    unique_lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    unique_flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(unique_lengths.sum()))
    unique_offsets = _exclusive_cumsum(unique_lengths)
    lengths = unique_lengths[codes]
    within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(_exclusive_cumsum(lengths), lengths)
    return lengths, unique_flat[np.repeat(unique_offsets[codes], lengths) + within]


def encode_windows(sentences: Sequence[Sequence[str]], groups: Sequence[int] | np.ndarray, tokenizer,
                   max_seq_length: int, tags: Sequence[Sequence[int]] | None = None, *,
                   stride: int | None = None, label_all_subtokens: bool = False,
                   continuation: Sequence[int] | None = None, mapping: bool = True,
                   drop_unlabelled: bool = False) -> pa.Table:
    """Windows over groups of sentences -> a table of features (one row per window).

    `sentences`: words per sentence (row order kept); `groups`: one id per sentence; consecutive sentences with
    the same id are encoded as one sequence (document context: doc_id; sentence context: the row index).
    Windows hold max_seq_length - 2 sub-tokens and start every `stride` sub-tokens (default half a window).

    Columns: input_ids, token_type_ids (0), attention_mask (1), and with `tags` (label ids per word) `labels`:
    each word's id on its first sub-token in its max-context window, -100 elsewhere; with `label_all_subtokens`
    its other sub-tokens there carry `continuation[id]` (e.g. the I- id for a B- id). With `mapping`:
    word_position, word_sentence, word_index, word_is_max_context (see the module docstring). With
    `drop_unlabelled`, windows without any label are left out (training)."""
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    flat_tags = None
    if tags is not None:
        if len(tags) != len(sentences) or any(len(t) != n for t, n in zip(tags, lengths.tolist(), strict=True)):
            raise ValueError("tags must hold one label id per word")
        flat_tags = np.fromiter(itertools.chain.from_iterable(tags), dtype=np.int64, count=int(lengths.sum()))
    return _encode(list(itertools.chain.from_iterable(sentences)), lengths, groups, tokenizer, max_seq_length,
                   flat_tags, stride=stride, label_all_subtokens=label_all_subtokens, continuation=continuation,
                   mapping=mapping, drop_unlabelled=drop_unlabelled)


def _encode(words: list[str], sentence_lengths: np.ndarray, groups, tokenizer, max_seq_length: int,
            word_tag: np.ndarray | None, *, stride: int | None, label_all_subtokens: bool,
            continuation: Sequence[int] | None, mapping: bool, drop_unlabelled: bool) -> pa.Table:
    """encode_windows on flat words (and flat tag ids) with the number of words of each sentence.

    All work is on flat arrays, no Python loop over words or windows. Shapes below: S sentences, W words,
    T sub-tokens of all words (the stream), U units (runs of sentences encoded together), F features
    (windows), B window sub-tokens over all features, N = B + 2F tokens with [CLS] and [SEP]."""
    window_length = max_seq_length - 2
    if window_length < 1:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for sub-tokens between [CLS] and [SEP]")
    stride = default_stride(window_length) if stride is None else int(stride)
    if (sentence_lengths == 0).any():
        raise DataError(f"sentence row {int(np.argmin(sentence_lengths))} has no words; expected at least one")
    groups = np.asarray(groups)
    num_sentences, num_words = len(sentence_lengths), int(sentence_lengths.sum())
    if len(groups) != num_sentences or len(words) != num_words:
        raise ValueError(f"{len(groups)} group ids and {len(words)} words for {num_sentences} sentences of "
                         f"{num_words} words")

    # 1. Words -> sub-tokens: subtokens [W] (count per word), stream [T] (their ids, in order).
    subtokens, stream = word_subtokens(tokenizer, words)
    word_start = _exclusive_cumsum(subtokens)  # [W] first sub-token of each word in the whole stream
    word_sentence = np.repeat(np.arange(num_sentences, dtype=np.int64), sentence_lengths)  # [W]
    word_index = np.arange(num_words, dtype=np.int64) - np.repeat(_exclusive_cumsum(sentence_lengths),
                                                                   sentence_lengths)  # [W] index in its sentence

    # 2. Units: runs of sentences with one group id (a document, or one sentence), each encoded as one
    #    sequence of sub-tokens; every word's max-context window within its unit.
    new_unit = np.ones(num_sentences, dtype=bool)
    new_unit[1:] = groups[1:] != groups[:-1]
    sentence_unit = np.cumsum(new_unit) - 1
    word_unit = sentence_unit[word_sentence]
    unit_first_word = np.flatnonzero(new_unit[word_sentence] & (word_index == 0))
    unit_start = word_start[unit_first_word]  # [U] in the stream
    unit_length = np.diff(np.append(unit_start, len(stream)))  # [U] sub-tokens
    position = word_start - unit_start[word_unit]  # [W] first sub-token of each word within its unit
    best_window = max_context_windows(position, unit_length[word_unit], window_length, stride)  # [W] in its unit

    # 3. Features: window k of unit u covers the unit's sub-tokens [k * stride, k * stride + feature_length).

    windows_per_unit = num_windows(unit_length, window_length, stride)
    unit_first_feature = _exclusive_cumsum(windows_per_unit)
    num_features = int(windows_per_unit.sum())
    feature_unit = np.repeat(np.arange(len(unit_start), dtype=np.int64), windows_per_unit)
    feature_k = np.arange(num_features, dtype=np.int64) - unit_first_feature[feature_unit]
    feature_begin = feature_k * stride  # within the unit
    feature_length = np.minimum(window_length, unit_length[feature_unit] - feature_begin)  # [F]
    word_feature = unit_first_feature[word_unit] + best_window  # [W] the feature that predicts each word

    # 4. input_ids: [CLS] window [SEP] for all features in one flat array [N]; body_* [B] map each window
    #    sub-token to its place in that array (target) and in the stream (source).
    sequence_length = feature_length + 2
    sequence_offset = _exclusive_cumsum(sequence_length)
    within = np.arange(int(feature_length.sum()), dtype=np.int64) - np.repeat(_exclusive_cumsum(feature_length),
                                                                              feature_length)
    body_feature = np.repeat(np.arange(num_features, dtype=np.int64), feature_length)
    body_target = sequence_offset[body_feature] + 1 + within
    body_source = unit_start[feature_unit][body_feature] + feature_begin[body_feature] + within
    total = int(sequence_length.sum())
    input_ids = np.empty(total, dtype=np.int32)
    input_ids[sequence_offset] = tokenizer.cls_token_id
    input_ids[sequence_offset + sequence_length - 1] = tokenizer.sep_token_id
    input_ids[body_target] = stream[body_source]
    columns: dict[str, pa.Array] = {
        "input_ids": _list_array(sequence_length, input_ids),
        "token_type_ids": _list_array(sequence_length, np.zeros(total, dtype=np.int8)),
        "attention_mask": _list_array(sequence_length, np.ones(total, dtype=np.int8)),
    }
    keep = np.ones(num_features, dtype=bool)
    # 5. Labels [N]: a word's tag on its first sub-token, only in the feature that predicts it; -100 elsewhere.
    if word_tag is not None:
        token_label = np.full(len(stream), IGNORE_INDEX, dtype=np.int64)
        if label_all_subtokens:
            follow = np.asarray(continuation if continuation is not None else np.arange(word_tag.max(initial=0) + 1))
            token_label[:] = np.repeat(follow[word_tag], subtokens)
        token_label[word_start] = word_tag
        token_feature = np.repeat(word_feature, subtokens)  # the feature each sub-token is labelled in
        body_label = np.where(token_feature[body_source] == body_feature, token_label[body_source], IGNORE_INDEX)
        labels = np.full(total, IGNORE_INDEX, dtype=np.int32)
        labels[body_target] = body_label
        columns["labels"] = _list_array(sequence_length, labels)
        if drop_unlabelled:
            keep = np.bincount(body_feature[body_label != IGNORE_INDEX], minlength=num_features) > 0
    # 6. Mapping (evaluation): for each feature, the words whose first sub-token it holds, with their position
    #    in the sequence and whether this is the word's max-context feature (see word_predictions).
    if mapping:
        # Every window holding a word's first sub-token: the same candidates max_context_windows tried.
        low = np.maximum(0, -(-(position - window_length + 1) // stride))
        high = np.minimum(windows_per_unit[word_unit] - 1, position // stride)
        parts = []
        for j in range((window_length - 1) // stride + 1):
            k = low + j
            held = np.flatnonzero(k <= high)
            parts.append((unit_first_feature[word_unit[held]] + k[held], position[held] - k[held] * stride + 1,
                          held, k[held] == best_window[held]))
        feature_of, seq_position, word, is_max = (np.concatenate(x) for x in zip(*parts, strict=True))
        order = np.lexsort((seq_position, feature_of))
        counts = np.bincount(feature_of, minlength=num_features)
        columns["word_position"] = _list_array(counts, seq_position[order].astype(np.int32))
        columns["word_sentence"] = _list_array(counts, word_sentence[word[order]])
        columns["word_index"] = _list_array(counts, word_index[word[order]].astype(np.int32))
        columns["word_is_max_context"] = _list_array(counts, is_max[order])
    table = pa.table(columns)
    return table if keep.all() else table.take(pa.array(np.flatnonzero(keep)))


def preprocess(dataset: datasets.Dataset, card: TaskCard, tokenizer, max_seq_length: int,
               train: bool = False) -> datasets.Dataset:
    """Sentences -> window features (see the module docstring); the card's `context` option chooses document
    or sentence windows. Training features have no bookkeeping columns and leave out label-less windows."""
    options = ner_options(card)
    source = dataset.info.description or f"{card.name} data"
    has_tags = "ner_tags" in dataset.column_names
    if train and not has_tags:
        raise DataError(f"{source}: training data needs NER tags")
    if train and _lowercases(tokenizer):
        print("[bert_suite] note: the tokenizer lower-cases (an uncased model); the paper's NER results use a cased "
              "model")
    lengths, words = _flat_column(dataset, "tokens")
    if options["context"] == "document" and "doc_id" in dataset.column_names:
        groups = dataset.with_format("arrow")["doc_id"].to_numpy()
    else:
        groups = np.arange(len(dataset))
    labels = list(card.labels or [])
    entity_types(labels)
    continuation = [labels.index(f"I-{lab[2:]}") if lab.startswith("B-") else i for i, lab in enumerate(labels)]
    tags = _flat_column(dataset, "ner_tags")[1].astype(np.int64) if has_tags else None
    table = _encode(words.tolist(), lengths, groups, tokenizer, max_seq_length, tags,
                    stride=None, label_all_subtokens=options["label_all_subtokens"], continuation=continuation,
                    mapping=not train, drop_unlabelled=train)
    if table.num_rows == 0:
        raise DataError(f"{source}: no features after pre-processing")
    return datasets.Dataset(datasets.table.InMemoryTable(table))


def _lowercases(tokenizer) -> bool:
    """Whether the tokenizer lower-cases its input (an uncased model)."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    if normalizer is not None:
        return normalizer.normalize_str("Paris") == "paris"
    return bool(getattr(tokenizer, "do_lower_case", False))


@dataclass
class TokenClassificationCollator:
    """Pads input_ids (with the pad id), token_type_ids and attention_mask (0) and labels (-100) to the
    longest feature of the batch, rounded up to a multiple of `pad_to_multiple_of`; other columns are ignored."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        import torch  # here, not at the top: reading CoNLL files (corpus --from_task) needs no torch

        width = max(len(row["input_ids"]) for row in rows)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {}
        for key, pad in (("input_ids", self.pad_token_id), ("token_type_ids", 0), ("attention_mask", 0),
                         ("labels", IGNORE_INDEX)):
            if key not in rows[0]:
                continue
            out = torch.full((len(rows), width), pad, dtype=torch.long)
            for i, row in enumerate(rows):
                values = torch.as_tensor(row[key], dtype=torch.long)
                out[i, : len(values)] = values
            batch[key] = out
        return batch


def collator(tokenizer, pad_to_multiple_of: int | None = None) -> TokenClassificationCollator:
    return TokenClassificationCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
                                       pad_to_multiple_of)


# ----------------------------------------------------------------------------------------------------------------
# Post-processing and scores


def _flat_column(table: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(row lengths, flat values) of a list column of a Dataset, pyarrow table or mapping of lists."""
    if isinstance(table, datasets.Dataset):
        column = table.with_format("arrow")[name]
    elif isinstance(table, pa.Table):
        column = table[name]
    else:
        column = pa.array(list(table[name]))
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], type=column.type)
    offsets = column.offsets.to_numpy()
    values = column.flatten().to_numpy(zero_copy_only=False)
    return np.diff(offsets).astype(np.int64), values


def _lists(table: Any, name: str) -> list[list]:
    """A column as a Python list (through Arrow for a Dataset: its own row iteration is slow)."""
    if isinstance(table, datasets.Dataset):
        return table.with_format("arrow")[name].to_pylist()
    if isinstance(table, pa.Table):
        return table[name].to_pylist()
    return list(table[name])


def _columns_of(table: Any) -> list[str]:
    if isinstance(table, (datasets.Dataset, pa.Table)):
        return list(table.column_names)
    return list(table)


def word_slots(examples: Any, features: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each word is read from: (feature row, position in that feature, flat word index over all
    sentences) for every word's first sub-token in its max-context window, checked so that every word of
    `examples` appears exactly once. Used for tags (`word_predictions`) and for features (the feature-based
    route)."""
    sentence_lengths, _ = _flat_column(examples, "tokens")
    counts, positions = _flat_column(features, "word_position")
    _, sentences = _flat_column(features, "word_sentence")
    _, indices = _flat_column(features, "word_index")
    _, is_max = _flat_column(features, "word_is_max_context")
    chosen = is_max.astype(bool)
    feature = np.repeat(np.arange(len(counts), dtype=np.int64), counts)[chosen]
    sentence = sentences[chosen].astype(np.int64)
    if sentence.size and sentence.max() >= len(sentence_lengths):
        raise ValueError("features refer to sentences that are not among the examples")
    word = _exclusive_cumsum(sentence_lengths)[sentence] + indices[chosen]
    total = int(sentence_lengths.sum())
    seen = np.bincount(word, minlength=total)
    if len(seen) != total or (seen != 1).any():
        missing, twice = int((seen[:total] == 0).sum()), int((seen > 1).sum())
        raise ValueError(f"{missing} words without a prediction and {twice} with several; the features do not "
                         "match the examples")
    return feature, positions[chosen].astype(np.int64), word


def word_predictions(examples: Any, features: Any, logits: Any) -> list[list[int]]:
    """Logits of evaluation features -> one label id per word of each sentence, from the word's max-context
    window. `examples`: the sentences (column `tokens`); `features`: from preprocess(train=False) / encode_windows
    with mapping, in the logits' order; logits: [features, padded length, labels] (positions past a feature's
    length, e.g. Trainer's -100 padding, are never read). Raises ValueError unless every word gets exactly one
    prediction."""
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    logits = np.asarray(logits)
    num_features = len(_flat_column(features, "word_position")[0])
    if logits.ndim != 3 or logits.shape[0] != num_features:
        raise ValueError(f"logits of shape {logits.shape} for {num_features} features; expected "
                         "[features, length, labels]")
    feature, position, word = word_slots(examples, features)
    if position.size and position.max() >= logits.shape[1]:
        raise ValueError(f"a word sits at position {position.max()} but the logits hold {logits.shape[1]}")
    sentence_lengths, _ = _flat_column(examples, "tokens")
    out = np.empty(int(sentence_lengths.sum()), dtype=np.int64)
    out[word] = logits[feature, position].argmax(-1)
    return [part.tolist() for part in np.split(out, np.cumsum(sentence_lengths)[:-1])]


# ----------------------------------------------------------------------------------------------------------------
# The runner's family contract (see runner.py)


def model_kwargs(card: TaskCard) -> dict:
    """The head's size and label names, stored in the checkpoint's config."""
    labels = list(card.labels or [])
    entity_types(labels)
    return dict(num_labels=len(labels), id2label=dict(enumerate(labels)),
                label2id={label: i for i, label in enumerate(labels)})


def _tag_strings(card: TaskCard, ids: list[list[int]]) -> list[list[str]]:
    labels = card.labels or []
    return [[labels[i] for i in sentence] for sentence in ids]


def metric_fn(card: TaskCard, examples, features):
    """Trainer's compute_metrics: logits of every window -> one tag per word -> entity scores (none for data
    without gold tags)."""
    gold = _tag_strings(card, _lists(examples, "ner_tags")) if "ner_tags" in _columns_of(examples) else None

    def compute(eval_pred):
        if gold is None:
            return {}
        return ner_scores(gold, _tag_strings(card, word_predictions(examples, features, eval_pred.predictions)))

    return compute


def score_predictions(card: TaskCard, examples, features, predictions, settings: dict) -> dict[str, float]:
    """Entity scores of a predicted split with gold tags (CoNLL's test.txt); {} for data without tags."""
    from transformers import EvalPrediction

    return metric_fn(card, examples, features)(EvalPrediction(predictions=predictions, label_ids=None))


def output_path(directory: Path, card: TaskCard, split: str) -> Path:
    return Path(directory) / f"{split_file_stem(split)}.conll"


def write_outputs(directory: Path, card: TaskCard, split: str, examples, features, predictions,
                  settings: dict) -> dict:
    """`word gold predicted` per word (gold in IOB2, "O" for data without tags), a blank line after each
    sentence, and `-DOCSTART- O O` plus a blank line where the input had its -DOCSTART- lines: the layout the
    conlleval script reads. Nothing is chosen on dev, so no settings are returned."""
    predicted = _tag_strings(card, word_predictions(examples, features, predictions))
    write_conll(output_path(directory, card, split), examples, predicted, card.labels)
    return {}


def write_conll(path: Path, examples: Any, predicted: list[list[str]], labels: Sequence[str]) -> Path:
    """The conlleval layout: `word gold predicted` per word (gold in IOB2 from the examples' `ner_tags`, "O"
    for data without tags), a blank line after each sentence, `-DOCSTART- O O` and a blank line where the
    input had its -DOCSTART- lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    words = _lists(examples, "tokens")
    columns = _columns_of(examples)
    gold = [[labels[t] for t in row] for row in _lists(examples, "ner_tags")] if "ner_tags" in columns else None
    starts = _lists(examples, "doc_start") if "doc_start" in columns else [False] * len(words)
    lines: list[str] = []
    for s, sentence in enumerate(words):
        if starts[s]:
            lines += [f"{DOCSTART} O O", ""]
        golds = gold[s] if gold is not None else ["O"] * len(sentence)
        lines += [f"{w} {g} {p}" for w, g, p in zip(sentence, golds, predicted[s], strict=True)]
        lines.append("")
    return atomic_write_text(path, "\n".join(lines) + "\n")
