"""Reading corpus text files for pre-training: encodings, formats, documents and sentences.

Corpus formats (`fmt`):
- `lines`: the reference format: one sentence per line, a blank line between documents.
- `raw`: plain prose (e.g. Project Gutenberg books): the whole file is one document; hard-wrapped
  lines are joined into paragraphs (blank-line separated) and split into sentences.
- `wikitext`: WikiText raw: a ` = Title = ` line starts a document, ` = = Section = = ` headings
  are dropped, each other line is a paragraph split into sentences; the `@-@`, `@,@`, `@.@`
  joiners are undone.
- `paragraphs`: a paragraph a line, a blank line between documents (as the NLTK sample's State of
  the Union addresses are): each line is split into sentences.
- `auto` (per file): `wikitext` when the first non-empty line is a ` = Title = ` line; `lines` when
  blank lines, if any, separate groups averaging two or more lines, and the lines are single sentences
  (`sentence_lines`: fewer than 10% of them, or fewer than 3, hold a sentence boundary) of which
  either at least 80% (of the first MiB) end with . ! or ? (closing quotes allowed) or which fill no
  fixed width (`hard_wrapped`: a sentence a line without final punctuation, as headlines, captions or
  lower-cased task sentences are); `paragraphs` when such groups' lines end with . ! or ? (80%) but
  are not single sentences (10% of them, and 3 or more, hold a boundary); `raw` otherwise (a file of
  paragraphs whose title lines bring the share ending with . ! or ? under 80% included: the whole file
  one document). Read as raw, a sentence-a-line file would run its lines together into a few very long
  "sentences"; read as lines, a paragraph-a-line file would make each paragraph one "sentence": either
  way the instances are cut at max_seq_length, and decontamination drops whole paragraphs for one
  shared N-gram.
Files are read as UTF-8, or as Windows-1252 when they are not UTF-8 (reported in the statistics).
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

FORMATS = ("auto", "lines", "paragraphs", "raw", "wikitext")
LINE_FORMATS = ("lines", "paragraphs")  # a blank line between documents, a line a sentence or paragraph


def check_input_files(files: list[str]) -> list[Path]:
    """The files as paths; a missing, non-regular or empty file is a ValueError naming it."""
    if isinstance(files, (str, Path)):
        files = [files]
    if not files:
        raise ValueError("no input files given")
    paths = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        if path.stat().st_size == 0:
            raise ValueError(f"{path}: the file is empty; expected text")
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------- sentence splitting

_CLOSERS = "\"'”’)]»"
_OPENERS = "\"'“‘([«"
# Candidate boundary: sentence-final punctuation, optional closing quotes/brackets, white space.
_BOUNDARY = re.compile(r"[.!?]+[\"'”’)\]»]*\s+")
# Words that end in a full stop without ending a sentence (compared lower-cased, final "." removed).
_ABBREVIATIONS = frozenset(
    "mr mrs ms messrs dr prof rev hon st mt jr sr capt col gen lt sgt gov vs etc cf viz al fig".split())


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences: after . ! or ? (optionally followed by closing quotes or
    brackets) when white space and then an upper-case letter, a digit or an opening quote follow.
    A full stop after a known abbreviation (Mr. Dr. etc.), a single capital (an initial) or a word
    with inner full stops (e.g. i.e. U.S.) does not end a sentence."""
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        end = match.end()
        if end >= len(text):
            break
        following = text[end]
        if not (following.isupper() or following.isdigit() or following in _OPENERS):
            continue
        punct = match.start()
        if text[punct] == "." and (end - punct < 2 or text[punct + 1] not in ".!?"):
            word = text[text.rfind(" ", start, punct) + 1: punct].lstrip(_OPENERS)
            if (word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper()) or "." in word):
                continue
        sentence = text[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = end
    rest = text[start:].strip()
    if rest:
        sentences.append(rest)
    return sentences


# ----------------------------------------------------------------------------- reading documents

_TITLE = re.compile(r"= [^=](?:.*[^=])? =")  # a stripped ` = Title = ` line (one `=` each side)
_TITLE_BYTES = re.compile(rb"= [^=](?:.*[^=])? =")
_WIKI_JOINERS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))
_BOM = b"\xef\xbb\xbf"


def _is_heading(stripped) -> bool:
    """A stripped ` = = Section = = ` line (str or bytes)."""
    mark = b"= =" if isinstance(stripped, bytes) else "= ="
    return stripped.startswith(mark) and stripped.endswith(mark)


def detect_format(path: str | Path) -> str:
    """`wikitext`, `lines`, `paragraphs` or `raw` for a file, by the rules in this module's docstring."""
    with open(path, "rb") as f:
        sample = f.read(1 << 20).decode("utf-8-sig", errors="replace")
    lines = [line.strip() for line in sample.split("\n")[:20000]]
    nonempty = [line for line in lines if line]
    if not nonempty:
        return "raw"
    if _TITLE.fullmatch(nonempty[0]):
        return "wikitext"
    final = sum(line.rstrip(_CLOSERS).endswith((".", "!", "?")) for line in nonempty) / len(nonempty)
    groups = sum(1 for i, line in enumerate(lines) if line and (i == 0 or not lines[i - 1]))
    if len(nonempty) / groups < 2:
        return "raw"
    if sentence_lines(nonempty):
        return "lines" if final >= 0.8 or not hard_wrapped(nonempty) else "raw"
    return "paragraphs" if final >= 0.8 else "raw"


MULTI_SENTENCE_LINES = 3  # lines of several sentences that make a file paragraphs (with 10% of its lines)
WRAP_SAMPLE = 100  # fewer non-empty lines than this tell no width (their 99th percentile is the longest line):
# taken as wrapped (raw, as before)


def sentence_lines(lines: list[str]) -> bool:
    """Whether the lines are single sentences: fewer than 10% of them, or fewer than MULTI_SENTENCE_LINES, hold a
    sentence boundary (a file of a paragraph a line, as most State of the Union addresses in the NLTK sample are,
    is `paragraphs` or raw text; a short file with one line of two sentences stays a sentence a line)."""
    several = sum(len(split_sentences(line)) > 1 for line in lines)
    return several < 0.1 * len(lines) or several < MULTI_SENTENCE_LINES


def hard_wrapped(lines: list[str]) -> bool:
    """Whether lines fill a fixed width, as prose wrapped at a column does (Project Gutenberg's 70 or so):
    the 90th percentile of their lengths at least 80% of the 99th. Lines that are sentences spread wider:
    GLUE's STS-B sentences 0.61, SST-2's 0.60, STS-B's headlines alone 0.74; the Gutenberg books of the NLTK
    sample, verse and plays included, 0.84-1.0."""
    if len(lines) < WRAP_SAMPLE:
        return True
    lengths = sorted(len(line) for line in lines)
    return lengths[int(0.9 * len(lengths))] >= 0.8 * lengths[int(0.99 * len(lengths))]


def _documents_from_lines(lines: Iterable[str], fmt: str) -> Iterator[list[str]]:
    """Documents (lists of sentences) of one file's lines in a resolved format; an empty list is an
    empty document (a WikiText title without text, a blank raw file) for the caller to count."""
    if fmt in LINE_FORMATS:
        doc: list[str] = []
        for line in lines:
            line = line.strip()
            if line:
                doc.extend(split_sentences(line) if fmt == "paragraphs" else [line])
            elif doc:
                yield doc
                doc = []
        if doc:
            yield doc
    elif fmt == "raw":
        doc, paragraph = [], []
        for line in lines:
            line = line.strip()
            if line:
                paragraph.append(line)
            elif paragraph:
                doc.extend(split_sentences(" ".join(paragraph)))
                paragraph = []
        if paragraph:
            doc.extend(split_sentences(" ".join(paragraph)))
        yield doc  # the whole file is one document, even an empty one (counted by the caller)
    elif fmt == "wikitext":
        doc, titled = [], False
        for line in lines:
            line = line.strip()
            if _TITLE.fullmatch(line):
                if doc or titled:
                    yield doc
                doc, titled = [], True
            elif line and not _is_heading(line):
                for joiner, plain in _WIKI_JOINERS:
                    line = line.replace(joiner, plain)
                doc.extend(split_sentences(line))
        if doc or titled:
            yield doc
    else:
        raise ValueError(f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}")


_VISIBLE = re.compile(rb"[!-~]")  # a printable ASCII character: a line holding one has text in either encoding


def _blank(stripped: bytes, encoding: str) -> bool:
    """Whether a line (its bytes stripped of ASCII white space) is blank as the text readers see it: str.strip
    also removes Unicode white space, such as a no-break space, which bytes.strip keeps."""
    return not stripped or (not _VISIBLE.search(stripped) and not stripped.decode(encoding, "replace").strip())


def document_spans(path: Path, fmt: str, encoding: str = "utf-8") -> Iterator[tuple[int, int, bool]]:
    """(start byte, end byte, has text) of each document of a file, found without splitting sentences (and
    without decoding, but for lines with no printable ASCII character), so that shards can be planned cheaply
    and re-read by workers: the same documents as the text readers find."""
    with open(path, "rb") as f:
        offset = 3 if f.read(3) == _BOM else 0
        f.seek(offset)
        if fmt == "raw":
            has_text = any(not _blank(line.strip(), encoding) for line in f)  # stops at the first line with text
            yield offset, path.stat().st_size, has_text
            return
        start, has_text = None, False
        for line in f:
            stripped = line.strip()
            blank = not stripped or (not 0x20 < stripped[0] < 0x7f and _blank(stripped, encoding))  # most: printable
            if fmt in LINE_FORMATS:
                if not blank and start is None:
                    start = offset
                elif blank and start is not None:
                    yield start, offset, True
                    start = None
            elif _TITLE_BYTES.fullmatch(stripped):
                if start is not None:
                    yield start, offset, has_text
                start, has_text = offset, False
            elif not blank and not _is_heading(stripped):
                if start is None:  # text before the first title is a document of its own
                    start = offset
                has_text = True
            offset += len(line)
        if start is not None:
            yield start, offset, (fmt in LINE_FORMATS or has_text)


def file_encoding(path: str | Path) -> str:
    """`utf-8`, or `cp1252` for a file that is not UTF-8 but decodes as Windows-1252/Latin-1 (older
    Project Gutenberg texts are such); anything else, and a file holding NUL bytes (binary data,
    which both encodings would decode silently), is a ValueError naming the file and byte."""
    for encoding in ("utf-8", "cp1252"):
        decoder = codecs.getincrementaldecoder(encoding)()
        offset = 0
        try:
            with open(path, "rb") as f:
                while block := f.read(1 << 22):
                    if encoding == "utf-8" and (nul := block.find(b"\x00")) >= 0:
                        raise ValueError(f"{path}: {_where(path, offset + nul)}: a NUL byte, so not a text corpus "
                                         "(a binary file, or UTF-16 text); expected a text file in UTF-8 or "
                                         "Windows-1252")
                    decoder.decode(block)
                    offset += len(block)
                decoder.decode(b"", final=True)
            return encoding
        except UnicodeDecodeError as err:
            if encoding == "utf-8":
                first_error = f"{_where(path, offset + err.start)}: {err.reason}"
    raise ValueError(f"{path}: {first_error}: the file is neither UTF-8 nor Windows-1252 text; expected a text file "
                     "(a binary file?)")


def _where(path: str | Path, offset: int) -> str:
    """`line L (byte B)` of a byte offset, for error messages."""
    with open(path, "rb") as f:
        line = 1
        while offset > f.tell():
            line += f.read(min(1 << 22, offset - f.tell())).count(b"\n")
    return f"line {line} (byte {offset})"


def read_piece(path: str, fmt: str, encoding: str, start: int, end: int) -> Iterator[list[str]]:
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return _documents_from_lines(data.decode(encoding).split("\n"), fmt)


def resolve_format(path: Path, fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return detect_format(path) if fmt == "auto" else fmt


def iter_documents(path: str, fmt: str = "auto", counts: dict | None = None) -> Iterator[list[str]]:
    """Stream the documents of a file, one list of sentences at a time. Empty documents are skipped
    and counted in `counts["skipped_empty_documents"]` when a dict is given."""
    path = check_input_files([path])[0]
    fmt, encoding = resolve_format(path, fmt), file_encoding(path)
    # newline="\n": lines split exactly as the shard workers split them (not at form feeds and such).
    with open(path, encoding="utf-8-sig" if encoding == "utf-8" else encoding, newline="\n") as f:
        for doc in _documents_from_lines(f, fmt):
            if doc:
                yield doc
            elif counts is not None:
                counts["skipped_empty_documents"] = counts.get("skipped_empty_documents", 0) + 1
