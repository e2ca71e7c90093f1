"""`bert-suite decontaminate`: a pre-training corpus with no evaluation text in it.

Every sentence of the --input documents that shares an N-word sequence with any sentence of the --against
files is dropped; the words are compared after BERT's normalisation (lowercase, accents stripped,
punctuation split off: the uncased tokenizer's normaliser and pre-tokenizer), so "Great film!" and
"great film !" are the same three words. The against files are read by what they are: GLUE TSVs by their
task card's text columns (the card whose data_folder and split file match, else the header's text columns),
SQuAD JSON (contexts and questions), CoNLL files (one token per line) and plain text (one sentence per line).

The default N is 8. The 13-grams used against long web documents (GPT-3's decontamination) miss short
evaluation sentences: SST-2's dev sentences have 20.9 words on average after this normalisation, 21% have
fewer than 13 (6% fewer than 8), and its phrases are tokenised otherwise than review text ("does n't"
against "doesn't"), which breaks long runs. Measured against the 2,000 film reviews of ../shared/data
(64,720 sentences) with SST-2 dev + test: 13-grams remove no sentence at all, 8-grams remove 45 (e.g.
"you 're the kind of person who", "the good , the bad and the ugly"). `--ngram` changes it, 3 at the least."""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..io import atomic_write_text
from .text_files import _documents_from_lines, check_input_files, file_encoding, resolve_format

DEFAULT_NGRAM = 8
MIN_NGRAM = 3
MAX_MATCHES = 20  # matches listed in decontamination.json (all are counted)


class DecontaminationError(ValueError):
    """Input the command cannot use; the message names the file (or flag) and what was expected."""


def _normaliser():
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()

    def words(text: str) -> list[str]:
        return [w for w, _ in pre.pre_tokenize_str(norm.normalize_str(text))]

    return words


def ngrams(words: list[str], n: int) -> Iterator[tuple[str, ...]]:
    for i in range(len(words) - n + 1):
        yield tuple(words[i:i + n])


# ------------------------------------------------------------------------------------------- the against side


def _line_of(text: str, needle: str, start: int = 0) -> int:
    """1-based line of `needle` in `text` (searched from `start`), or 0."""
    at = text.find(needle[:60], start)
    return text.count("\n", 0, at) + 1 if at >= 0 else 0


def _glue_columns(path: Path) -> tuple[list, bool] | None:
    """(text columns as names or positions, header?) of the task card whose data folder and split file are
    this file's, else None."""
    from ..cards import available_cards, load_card

    for card_path in sorted(set(available_cards().values())):
        card = load_card(card_path)
        if card.data_folder != path.parent.name:
            continue
        for spec in card.splits.values():
            if spec.file == path.name:
                return [spec.columns[c] for c in card.text_columns if c in spec.columns], bool(spec.header)
    return None


def against_sentences(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every sentence an evaluation file holds; an unreadable file is an error naming it."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise DecontaminationError(f"{path}: cannot read it ({reason}) (--against); expected a GLUE TSV, SQuAD JSON, "
                                   "CoNLL or plain text file") from None
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DecontaminationError(f"{path}:{err.lineno}: not valid JSON ({err.msg}) (--against); expected SQuAD "
                                       "JSON") from None
        if not (isinstance(data, dict) and isinstance(data.get("data"), list)):
            raise DecontaminationError(f"{path}: no top-level \"data\" list (--against); expected SQuAD JSON")
        at = 0
        for article in data["data"]:
            for paragraph in article.get("paragraphs", []):
                context = paragraph.get("context", "")
                line = _line_of(text, json.dumps(context)[1:-1], at) or 1
                yield line, context
                for qa in paragraph.get("qas", []):
                    yield _line_of(text, json.dumps(qa.get("question", ""))[1:-1], at) or line, qa.get("question", "")
        return
    if suffix == ".tsv":
        rows = list(csv.reader(io.StringIO(text), delimiter="\t", quoting=csv.QUOTE_NONE))
        layout = _glue_columns(path)
        if layout is None and rows:  # another TSV: its text columns by header name
            header = rows[0]
            names = {"sentence", "sentence1", "sentence2", "question", "question1", "question2", "text", "premise",
                     "hypothesis"}
            layout = ([c for c in header if c in names], True)
            if not layout[0]:
                raise DecontaminationError(f"{path}:1: no text column in the header ({', '.join(header)}) (--against); "
                                           "expected a GLUE TSV (its task card names the columns) or columns named "
                                           "sentence, sentence1/2, question, text")
        columns, header = layout
        positions = [rows[0].index(c) if isinstance(c, str) else int(c) for c in columns] if header else \
            [int(c) for c in columns]
        for number, row in enumerate(rows[1 if header else 0:], start=2 if header else 1):
            for pos in positions:
                if pos < len(row) and row[pos].strip():
                    yield number, row[pos]
        return
    lines = text.split("\n")
    conll = any(line.startswith("-DOCSTART-") for line in lines[:5]) or suffix == ".conll"
    if conll:  # one token per line (first column), sentences separated by blank lines
        words, first = [], 0
        for number, line in enumerate(lines + [""], start=1):
            if line.strip() and not line.startswith("-DOCSTART-"):
                words.append(line.split()[0])
                first = first or number
            elif words:
                yield first, " ".join(words)
                words, first = [], 0
        return
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield number, line.strip()


# ------------------------------------------------------------------------------------------------ the input side


def input_documents(path: Path, fmt: str = "auto") -> Iterator[list[tuple[int, str]]]:
    """The documents of a corpus file as the pre-training readers see them in format `fmt` (auto: detected),
    each sentence with the line where it starts."""
    fmt, encoding = resolve_format(path, fmt), file_encoding(path)
    seen: list[tuple[int, str]] = []

    def numbered():
        with open(path, encoding="utf-8-sig" if encoding == "utf-8" else encoding, newline="\n") as f:
            for number, line in enumerate(f, start=1):
                seen.append((number, line))
                yield line

    for doc in _documents_from_lines(numbered(), fmt):
        # the document's lines as one text (a sentence may run over a line break), searched forward from the
        # last sentence found: str.find, not a scan of the lines in Python (a long book's missed probes made
        # this quadratic: 59 of the 93 s of the miniature studies' corpus stage)
        lines, out, cursor, at = list(seen), [], 0, 0
        seen.clear()
        text = " ".join(line.rstrip("\r\n") for _, line in lines)
        starts = list(itertools.accumulate((len(line.rstrip("\r\n")) + 1 for _, line in lines[:-1]), initial=0))
        for sentence in doc:
            found = text.find(sentence[:30], at)
            if found >= 0:
                at, cursor = found, bisect.bisect_right(starts, found) - 1
            out.append((lines[cursor][0] if lines else 0, sentence))
        if out:
            yield out


@dataclass
class Report:
    ngram: int
    inputs: list[str] = field(default_factory=list)
    against: dict = field(default_factory=dict)
    documents: int = 0
    documents_removed: int = 0
    sentences: int = 0
    sentences_removed: int = 0
    matches: list = field(default_factory=list)
    formats: dict = field(default_factory=dict)  # input: the format it was read in (auto resolved per file)

    def record(self) -> dict:
        return {"ngram": self.ngram, "documents": self.documents, "documents_removed": self.documents_removed,
                "sentences": self.sentences, "sentences_removed": self.sentences_removed, "inputs": self.inputs,
                "formats": self.formats, "against": self.against, "matches": self.matches}


def decontaminate(inputs: list[str], against: list[str], output_dir: str, ngram: int = DEFAULT_NGRAM,
                  log=print, fmt: str = "auto") -> Report:
    """Write each input file, without its contaminated sentences, to OUTPUT_DIR (one sentence per line,
    a blank line between documents; a document left empty is dropped) and decontamination.json. The inputs
    are read in format `fmt` (as `pretrain-data --format`; auto detects it per file). A file of one-sentence
    documents (a task's single-sentence examples, as `corpus --from_task` writes them) is detected as raw
    text, one document, so give it `lines` to keep its documents apart."""
    if ngram < MIN_NGRAM:
        raise DecontaminationError(f"--ngram {ngram}: below {MIN_NGRAM}; shorter sequences match common phrases "
                                   f"everywhere (default {DEFAULT_NGRAM})")
    paths = check_input_files(inputs)
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise DecontaminationError(f"--input: two files named {next(n for n in names if names.count(n) > 1)}; "
                                   "expected distinct file names (each is written to --output_dir under its name)")
    words = _normaliser()
    grams: dict[tuple[str, ...], str] = {}
    report = Report(ngram, inputs=[str(p) for p in paths])
    for name in against:
        path = Path(name)
        if not path.is_file():
            raise DecontaminationError(f"{name}: file not found (--against); expected a GLUE TSV, SQuAD JSON, CoNLL or "
                                       "plain text file")
        count = short = 0
        for line, text in against_sentences(path):
            tokens = words(text)
            count += 1
            short += len(tokens) < ngram
            for gram in ngrams(tokens, ngram):
                grams.setdefault(gram, f"{path}:{line}")
        if count == 0:
            raise DecontaminationError(f"{path}: no text found (--against); expected sentences to remove from the corpus")
        report.against[str(path)] = {"sentences": count, f"shorter_than_{ngram}_words": short}
        log(f"[decontaminate] {path}: {count:,} sentences ({short:,} shorter than {ngram} words cannot match)")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept_total = 0
    for path in paths:
        kept_docs = []
        # resolved once here (auto reads a sample of the file) and recorded: a study's corpus says how each file
        # was split into sentences and documents, which a change of detection would otherwise hide
        report.formats[str(path)] = read_as = resolve_format(path, fmt)
        for doc in input_documents(path, read_as):
            report.documents += 1
            kept = []
            for line, sentence in doc:
                report.sentences += 1
                hit = next((g for g in ngrams(words(sentence), ngram) if g in grams), None)
                if hit is None:
                    kept.append(sentence)
                    continue
                report.sentences_removed += 1
                if len(report.matches) < MAX_MATCHES:
                    report.matches.append({"input": f"{path}:{line}", "against": grams[hit], "ngram": " ".join(hit)})
            if kept:
                kept_docs.append("\n".join(kept))
            else:
                report.documents_removed += 1
        kept_total += len(kept_docs)
        atomic_write_text(out / path.name, "\n\n".join(kept_docs) + ("\n" if kept_docs else ""))
    if kept_total == 0:
        raise DecontaminationError(f"--input: every one of the {report.sentences:,} sentences shares a {ngram}-word "
                                   "sequence with the --against files, so nothing is left; expected a corpus other "
                                   "than the evaluation data itself (or a larger --ngram)")
    atomic_write_text(out / "decontamination.json", json.dumps(report.record(), indent=2))
    log(f"[decontaminate] removed {report.sentences_removed:,} of {report.sentences:,} sentences "
        f"({report.documents_removed:,} of {report.documents:,} documents emptied) with {ngram}-word matches; "
        f"wrote {out}")
    return report
