"""Synthetic pre-training corpora of any size with a realistic vocabulary growth, for benchmarks/pipeline_scale.py.

Word ranks follow a Zipf-Mandelbrot law, P(rank k) ~ (k + Q)^-A, A = 1.4, Q = 10: the most frequent word ~3.4% of the
tokens (English "the": ~6%), distinct words growing as Heaps' law with exponent ~0.7 (English: 0.4-0.7; 116k at 10
MB, 246k at 30 MB); rank k spelt from syllables (digits of a scrambled k in base 100), short for frequent words.
Documents of 5-40 sentences of 4-30 words, a sentence a line, a blank line between documents (`--format lines`).
`write_letters_corpus`: little subword structure (names, identifiers, agglutinative text): Zipf ranks (exponent 1.1
over 8M types), each type 2-10 letters drawn by English frequency, so no piece recurs as stems and suffixes do (1.1M
distinct words at 100 MB); 15 words a line, a blank line every 40 lines. Deterministic for a seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

A, Q = 1.4, 10.0
_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwyz" + "q" for v in "aeiou"]  # 100 syllables


def _spell(rank: int) -> str:
    """A distinct word for each rank: 2 letters for the 30 most frequent, 4 up to rank 3,000, then
    6 and more; the base-100 digits are mixed (a bijection) so that neighbours look unrelated."""
    n = rank + 100 * (rank >= 30) + 10_000 * (rank >= 3000)  # increasing in rank, so distinct
    parts, previous, i = [], 0, 0
    while True:
        n, digit = divmod(n, 100)
        parts.append(_SYLLABLES[(digit * 37 + previous * 13 + i * 7) % 100])
        previous, i = digit, i + 1
        if n == 0:
            return "".join(parts)


def write_zipf_corpus(path: str | Path, size_bytes: int, seed: int = 0) -> dict:
    """Write about `size_bytes` of text to `path`; returns {"bytes", "words", "distinct_words"}."""
    rng = np.random.default_rng(seed)
    spelt: dict[int, str] = {}
    written = words = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        while written < size_bytes:
            lengths = rng.integers(4, 31, size=20_000)
            draws = (Q + 1) * rng.random(int(lengths.sum())) ** (-1 / (A - 1)) - Q
            ranks = np.floor(np.minimum(draws, 1e11)).astype(np.int64)
            unique, inverse = np.unique(ranks, return_inverse=True)
            for rank in unique.tolist():
                if rank not in spelt:
                    spelt[rank] = _spell(rank)
            table = np.array([spelt[r] for r in unique.tolist()], dtype=object)[inverse]
            commas = rng.random(len(table)) < 0.05
            table[commas] = table[commas] + ","
            doc_ends = set(np.cumsum(rng.integers(5, 41, size=len(lengths))).tolist())
            lines, start = [], 0
            for i, n in enumerate(lengths.tolist()):
                sentence = " ".join(table[start: start + n].tolist()).rstrip(",")
                lines.append(sentence[:1].upper() + sentence[1:] + ".")
                if i + 1 in doc_ends:
                    lines.append("")
                start += n
            text = "\n".join(lines) + "\n\n"
            f.write(text)
            written += len(text.encode())
            words += int(lengths.sum())
    return {"bytes": written, "words": words, "distinct_words": len(spelt)}


LETTER_FREQUENCY = {  # English, percent
    "a": 8.2, "b": 1.5, "c": 2.8, "d": 4.3, "e": 12.7, "f": 2.2, "g": 2.0, "h": 6.1, "i": 7.0, "j": 0.15, "k": 0.77,
    "l": 4.0, "m": 2.4, "n": 6.7, "o": 7.5, "p": 1.9, "q": 0.095, "r": 6.0, "s": 6.3, "t": 9.1, "u": 2.8, "v": 0.98,
    "w": 2.4, "x": 0.15, "y": 2.0, "z": 0.074}


def write_letters_corpus(path: str | Path, size_bytes: int, seed: int = 0, types: int = 8_000_000,
                         exponent: float = 1.1) -> dict:
    """Write about `size_bytes` of low-structure text to `path` (see the module's docstring); returns
    {"bytes", "words", "distinct_words"}. Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 11, size=types)
    ends = np.cumsum(lengths)
    p = np.array(list(LETTER_FREQUENCY.values()))
    letters = np.array(list(LETTER_FREQUENCY))[rng.choice(26, size=int(ends[-1]), p=p / p.sum())]
    spelling = "".join(letters.tolist())  # type k is spelling[ends[k] - lengths[k]: ends[k]]
    del letters
    cdf = np.cumsum(np.arange(1, types + 1, dtype=np.float64) ** -exponent)
    cdf /= cdf[-1]
    spelt: dict[int, str] = {}
    written = words = 0
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        while written < size_bytes:
            ranks = np.minimum(np.searchsorted(cdf, rng.random(200_000)), types - 1).tolist()
            table = []
            for k in ranks:
                word = spelt.get(k)
                if word is None:
                    word = spelt[k] = spelling[int(ends[k] - lengths[k]): int(ends[k])]
                table.append(word)
            lines = [" ".join(table[i: i + 15]) + " ." for i in range(0, len(table), 15)]
            text = "".join("\n".join(lines[i: i + 40]) + "\n\n" for i in range(0, len(lines), 40))
            f.write(text)
            written += len(text.encode())
            words += len(table)
    return {"bytes": written, "words": words, "distinct_words": len(set(spelt.values()))}
