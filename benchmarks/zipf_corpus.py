"""Synthetic pre-training corpora of any size with a realistic vocabulary growth.

Word ranks are drawn from a Zipf-Mandelbrot law, P(rank k) ~ (k + Q)^-A with A = 1.4 and Q = 10:
the most frequent word is ~3.4% of the tokens (English "the": ~6%) and the number of distinct words
grows as Heaps' law with exponent ~0.7 (English text: 0.4-0.7, web text at the top), measured:
116k distinct words at 10 MB, 246k at 30 MB. Rank k is spelt from syllables (digits of a
scrambled k in base 100), short for frequent words. Documents are 5-40 sentences of 4-30 words,
one sentence per line, a blank line between documents (the reference format, `--format lines`),
first word capitalised, a comma now and then, a full stop at the end. Deterministic for a seed.

    python benchmarks/zipf_corpus.py OUT.txt --mb 100 [--seed 0]
"""

from __future__ import annotations

import argparse
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output", type=Path)
    p.add_argument("--mb", type=float, required=True, help="size in MB (10^6 bytes)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(write_zipf_corpus(args.output, int(args.mb * 1e6), args.seed))


if __name__ == "__main__":
    main()
