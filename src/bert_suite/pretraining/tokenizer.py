"""Train a WordPiece vocabulary for pre-training on a corpus (step 1 of the pre-training recipe).
Loading and checking any tokenizer, this one included, is in `tokenization`.

The vocabulary is learned here, not by the `tokenizers` library's WordPiece trainer: that trainer
breaks ties between equally frequent merges through hash maps seeded afresh in every process, so
the same corpus gave a different `vocab.txt` on every run (and every later step moved with it).
This trainer learns the same kind of vocabulary (WordPiece as trained in practice: BPE-style
merges of the most frequent adjacent pair, continuation pieces prefixed `##`) with a total order
on its choices: the most frequent pair first, ties to the pair (left, right) that sorts first. The same
corpus and flags give the same files, byte for byte. Normalisation and pre-tokenisation are
`tokenizers`' own BERT components, so text is split exactly as the saved tokenizer will split it.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from itertools import islice
from pathlib import Path

from tqdm.auto import tqdm

from ..io import atomic_write_text
from ..tokenization import SPECIAL_TOKENS
from .text_files import check_input_files, file_encoding

PREFIX = "##"


def train_tokenizer(files: list[str], vocab_size: int, lowercase: bool, output_dir: str, min_frequency: int = 2):
    """Train a BERT WordPiece tokenizer on text files and save it to `output_dir` (loadable with
    `AutoTokenizer.from_pretrained(output_dir)`, plus a `vocab.txt` for tools that want one).

    Special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]` get ids 0..4, then every character of the
    corpus (as a word start and as a `##` continuation, most frequent first), then the merged
    pieces in the order they were learned. `lowercase` also strips accents, as in the released
    uncased BERT vocabularies. A pair seen fewer than `min_frequency` times is never merged.
    Returns the saved transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import BertTokenizer

    paths = check_input_files(files)
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 1} (the {len(SPECIAL_TOKENS)} special "
                         f"tokens and one more), got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                            strip_accents=lowercase, lowercase=lowercase)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words = count_words(paths, normalizer, pre_tokenizer)
    if not words:
        raise ValueError(f"{', '.join(map(str, paths))}: no words to learn a vocabulary from")
    tokens = learn_wordpieces(words, vocab_size, min_frequency)

    backend = Tokenizer(WordPiece(vocab={t: i for i, t in enumerate(tokens)}, unk_token="[UNK]",
                                  continuing_subword_prefix=PREFIX))
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    cls_id, sep_id = tokens.index("[CLS]"), tokens.index("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    backend.decoder = decoders.WordPiece(prefix=PREFIX)

    # In transformers 5 BertTokenizer is the tokenizers-backed class; it rebuilds its pipeline from
    # the vocabulary and `do_lower_case`/`strip_accents` when loaded, so those must be saved too.
    tokenizer = BertTokenizer(tokenizer_object=backend, do_lower_case=lowercase, strip_accents=lowercase,
                              unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                              mask_token="[MASK]")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    atomic_write_text(out / "vocab.txt", "".join(f"{t}\n" for t in tokens))
    return tokenizer


def count_words(paths: list[Path], normalizer, pre_tokenizer, batch_lines: int = 2000) -> Counter:
    """How often each pre-tokenised word (after normalisation) occurs in the files. Lines are
    normalised in batches joined by newlines: a word never spans a line break."""
    counts: Counter = Counter()
    with tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, desc="counting words",
              mininterval=1) as bar:
        for path in paths:
            encoding = file_encoding(path)
            with open(path, encoding="utf-8-sig" if encoding == "utf-8" else encoding, newline="\n") as f:
                while True:
                    text = "".join(islice(f, batch_lines))
                    if not text:
                        break
                    counts.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
                    bar.update(len(text.encode(encoding, errors="replace")))
    return counts


def learn_wordpieces(word_counts: dict[str, int], vocab_size: int, min_frequency: int = 2,
                     specials: tuple[str, ...] = SPECIAL_TOKENS) -> list[str]:
    """The vocabulary, in id order: `specials`, the alphabet (by frequency, ties by text), then
    one piece per merge until `vocab_size` pieces or no pair is seen `min_frequency` times. The
    whole alphabet is always kept, so a corpus with more characters than `vocab_size` gives more.

    Each word starts as its characters (`w`, `##o`, `##r`, ...). A merge joins the most frequent
    adjacent pair in every word (`t` + `##h` -> `th`, `##i` + `##n` -> `##in`), left to right;
    ties go to the pair (left, right) that sorts first, so the result depends on the counts
    alone. Two pairs can spell the same piece (`th` + `##e`, `t` + `##he`); the piece is listed
    once. Pair counts are updated only in the words a merge touches, and the most frequent pair
    is kept in a heap whose stale entries are skipped when popped."""
    words: list[list[str]] = []
    freqs: list[int] = []
    alphabet: Counter = Counter()
    for word, count in sorted(word_counts.items()):
        symbols = [word[0], *(PREFIX + c for c in word[1:])]
        words.append(symbols)
        freqs.append(count)
        for symbol in symbols:
            alphabet[symbol] += count
    vocab = [*specials, *sorted((s for s in alphabet if s not in specials), key=lambda s: (-alphabet[s], s))]
    known = set(vocab)
    pair_counts: defaultdict[tuple[str, str], int] = defaultdict(int)
    pair_words: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for i, symbols in enumerate(words):
        for pair in zip(symbols, symbols[1:], strict=False):
            pair_counts[pair] += freqs[i]
            pair_words[pair].add(i)
    heap = [(-count, a, b) for (a, b), count in pair_counts.items()]
    heapq.heapify(heap)
    with tqdm(total=max(0, vocab_size - len(vocab)), desc="learning wordpieces", unit="piece", mininterval=1) as bar:
        while len(vocab) < vocab_size and heap:
            negative, a, b = heapq.heappop(heap)
            if pair_counts.get((a, b)) != -negative:
                continue  # a stale entry: the pair's count changed since it was pushed
            if -negative < min_frequency:
                break
            piece = a + b[len(PREFIX):]
            if piece not in known:
                vocab.append(piece)
                known.add(piece)
                bar.update(1)
            changed = set()
            for i in pair_words.pop((a, b)):
                old, count = words[i], freqs[i]
                new = _merge(old, a, b, piece)
                if new is old:
                    continue  # the word lost this pair to an earlier merge
                for pair in zip(old, old[1:], strict=False):
                    pair_counts[pair] -= count
                    changed.add(pair)
                for pair in zip(new, new[1:], strict=False):
                    pair_counts[pair] += count
                    pair_words[pair].add(i)
                    changed.add(pair)
                words[i] = new
            del pair_counts[(a, b)]
            changed.discard((a, b))
            for pair in changed:
                count = pair_counts[pair]
                if count > 0:
                    heapq.heappush(heap, (-count, *pair))
                else:
                    del pair_counts[pair]
                    pair_words.pop(pair, None)
    return vocab


def _merge(symbols: list[str], a: str, b: str, piece: str) -> list[str]:
    """`symbols` with every adjacent (a, b) joined into `piece`, left to right; the same list
    object when there is none."""
    out: list[str] = []
    i, n, merged = 0, len(symbols), False
    while i < n:
        if i + 1 < n and symbols[i] == a and symbols[i + 1] == b:
            out.append(piece)
            i += 2
            merged = True
        else:
            out.append(symbols[i])
            i += 1
    return out if merged else symbols
