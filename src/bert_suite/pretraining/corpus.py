"""The embedded corpus: real English text that exists wherever bert_suite is installed.

The documentation of the Python standard library ships with every Python: the docstrings of
each module (read with `ast`, nothing is imported or executed) and the language-reference topics
of `pydoc_data`. One module (or topic) is one document, written in the reference format (one
sentence per line, a blank line between documents). Documents are assigned to a split by a
stable hash of their name, so the demo's fine-tuning task is built from modules the model never
saw during pre-training.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tqdm.auto import tqdm

from .text_files import split_sentences

_SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib2to3", "turtledemo"}
_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\.|\.\. |:[a-z]+:|[-=~^*]{3,}\s*$)")


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs of a docstring: doctests, indented code, directives and rules dropped."""
    out, current = [], []
    for line in text.splitlines() + [""]:
        if not line.strip() or _CODE_LINE.match(line) or line.startswith(("    ", "\t")):
            if current:
                out.append(" ".join(current))
            current = []
            continue
        current.append(line.strip())
    # A paragraph is prose if it has a few words and is mostly letters (not a signature or a table).
    return [p for p in out if len(p.split()) >= 4 and sum(c.isalpha() or c.isspace() for c in p) > 0.8 * len(p)]


def module_document(path: Path) -> list[str]:
    """The sentences of a module's docstrings, in source order."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = (n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
    sentences = []
    for node in sorted(nodes, key=lambda n: getattr(n, "lineno", 0)):
        for paragraph in _paragraphs(ast.get_docstring(node) or ""):
            sentences += split_sentences(paragraph)
    return sentences


def iter_documents(root: str | None = None) -> Iterator[tuple[str, list[str]]]:
    """(name, sentences) for every stdlib module with prose, then every pydoc topic."""
    root_path = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root_path.rglob("*.py") if not _SKIP_PARTS & set(p.relative_to(root_path).parts))
    for path in tqdm(files, desc="reading stdlib docstrings", unit="module", mininterval=1):
        sentences = module_document(path)
        if len(sentences) >= 2:
            yield path.relative_to(root_path).with_suffix("").as_posix().replace("/", "."), sentences
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip it; the docstrings are enough
        return
    for name in sorted(topics):
        sentences = [s for p in _paragraphs(topics[name]) for s in split_sentences(p)]
        if len(sentences) >= 2:
            yield f"topic:{name}", sentences


def split_of(name: str, heldout_share: float) -> str:
    """'heldout' for a stable `heldout_share` of the documents, 'pretrain' for the rest."""
    bucket = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "heldout" if bucket < heldout_share else "pretrain"


def build_embedded_corpus(output_dir: str | Path, heldout_share: float = 0.2, root: str | None = None) -> dict:
    """Write `pretrain.txt` and `heldout.txt` (reference format) into output_dir; returns counts."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"pretrain": [0, 0], "heldout": [0, 0]}
    # under temporary names, renamed when complete: a crash never leaves a truncated corpus
    files = {name: open(out / f".{name}.txt.incomplete", "w", encoding="utf-8") for name in counts}
    try:
        for name, sentences in iter_documents(root):
            split = split_of(name, heldout_share)
            files[split].write("\n".join(sentences) + "\n\n")
            counts[split][0] += 1
            counts[split][1] += len(sentences)
    finally:
        for f in files.values():
            f.close()
    for name in counts:
        os.replace(out / f".{name}.txt.incomplete", out / f"{name}.txt")
    if counts["pretrain"][0] < 2:
        raise ValueError(f"the embedded corpus from {root or 'the stdlib'} has {counts['pretrain'][0]} documents; "
                         "pre-training needs at least two")
    return {f"{k}_{what}": v[i] for k, v in counts.items() for i, what in enumerate(("documents", "sentences"))}
