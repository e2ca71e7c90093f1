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

import contextlib
import heapq
import json
import os
from collections import Counter
from pathlib import Path

from tqdm.auto import tqdm

from ..io import atomic_write_text
from ..tokenization import SPECIAL_TOKENS, WordPiece, bert_backend
from .cluster import dask_client, run_in_order
from .text_files import check_input_files, file_encoding

PREFIX = "##"
_KEY = 1 << 24  # a pair's key: left id * _KEY + right id (symbol ids stay below it)
SMALL = 256  # a merge that adds and removes at most this many pairs updates the counts in Python
REPORT_FILE = "tokenizer_report.json"  # what was counted (and dropped by a cap), beside the vocabulary
TASK_BYTES = 32 << 20  # text per counting task at most (a worker's unit; the same for every num_proc)
MIN_TASK_BYTES = 4 << 20  # ... and at least, unless a file is smaller: a corpus is cut into ~16 tasks or more
BLOCK_BYTES = 4 << 20  # text a task splits at once (its peak memory is a few times this)


def train_tokenizer(files: list[str], vocab_size: int, lowercase: bool, output_dir: str, min_frequency: int = 2,
                    num_proc: int | None = None, max_word_types: int | None = None, dask_scheduler: str | None = None,
                    report: dict | None = None, count_task_bytes: int | None = None):
    """Train a BERT WordPiece tokenizer on text files and save it to `output_dir` (loadable with
    `AutoTokenizer.from_pretrained(output_dir)`, plus a `vocab.txt` for tools that want one).

    Special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]` get ids 0..4, then every character of the
    corpus (as a word start and as a `##` continuation, most frequent first), then the merged
    pieces in the order they were learned. `lowercase` also strips accents, as in the released
    uncased BERT vocabularies. A pair seen fewer than `min_frequency` times is never merged.

    Words are counted in `num_proc` processes (default: the machine's cores), or as tasks on the
    Dask cluster at `dask_scheduler` (e.g. tcp://scheduler:8786); the files are streamed, so
    memory is the word table plus a few blocks of text per process, and the output is the same
    bytes for every num_proc and route. `max_word_types` caps the word table (the most frequent
    words are kept; see `count_words`), for corpora whose distinct words would not fit in memory.
    `report`, when given, receives the counting report (distinct words, dropped words and their
    occurrences). Returns the tokenizer (a `tokenization.WordPiece`)."""
    paths = check_input_files(files)
    if vocab_size < len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must be at least {len(SPECIAL_TOKENS) + 1} (the {len(SPECIAL_TOKENS)} special "
                         f"tokens and one more), got {vocab_size}")
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be at least 1, got {min_frequency}")
    if max_word_types is not None and max_word_types < vocab_size:
        raise ValueError(f"max_word_types {max_word_types} is below vocab_size {vocab_size}: the word table must "
                         "hold at least as many words as the vocabulary has pieces (the cap is for corpora with "
                         "millions of distinct words; try 10 x vocab_size or more)")
    num_proc = num_proc or os.cpu_count() or 1
    if num_proc < 1:
        raise ValueError(f"num_proc must be at least 1, got {num_proc}")

    client = dask_client(dask_scheduler) if dask_scheduler else None
    try:
        words, counted = count_words(paths, lowercase, num_proc, max_word_types, client, count_task_bytes)
    finally:
        if client is not None:
            client.close()
    if not words:
        raise ValueError(f"{', '.join(map(str, paths))}: no words to learn a vocabulary from")
    counted["word_types"] = len(words)
    if report is not None:
        report.update(counted)
    tokens = learn_wordpieces(words, vocab_size, min_frequency, clear_input=True)

    # What transformers' BertTokenizer saves (5.x), written here without it: transformers imports torch, which would
    # cost this command seconds and hundreds of MB. AutoTokenizer.from_pretrained(output_dir) loads it (tested).
    tokenizer = WordPiece(bert_backend(tokens, lowercase, strip_accents=lowercase), str(output_dir))
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "tokenizer.json", tokenizer.backend_tokenizer.to_str(pretty=True))
    config = {"backend": "tokenizers", "cls_token": "[CLS]", "do_lower_case": lowercase, "mask_token": "[MASK]",
              "model_max_length": int(1e30), "pad_token": "[PAD]", "sep_token": "[SEP]", "strip_accents": lowercase,
              "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer", "unk_token": "[UNK]"}
    atomic_write_text(out / "tokenizer_config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    atomic_write_text(out / "vocab.txt", "".join(f"{t}\n" for t in tokens))
    atomic_write_text(out / REPORT_FILE, json.dumps({"files": [str(p) for p in paths], "vocab_size": vocab_size,
                                                      "lowercase": lowercase, "min_frequency": min_frequency,
                                                      **counted}, indent=2) + "\n")
    return tokenizer


# Characters BertNormalizer(clean_text=True) deletes that Python's str.split() takes for white space:
# they are removed before splitting, so that the split is exactly the normaliser's.
_DELETED_SPACES = dict.fromkeys(map(ord, "\x0b\x0c\x1c\x1d\x1e\x1f\x85"))


def plan_count_tasks(paths: list[Path], task_bytes: int | None = None) -> list[tuple[str, str, int, int]]:
    """(path, encoding, start byte, end byte) ranges of ~task_bytes that start and end at line
    breaks, covering every file once (a UTF-8 BOM left out). Default size: a sixteenth of the
    corpus within [4, 32] MiB, so that small corpora use several processes too. The ranges depend
    on the files only, never on the number of processes."""
    if task_bytes is None:
        total = sum(p.stat().st_size for p in paths)
        task_bytes = min(TASK_BYTES, max(MIN_TASK_BYTES, total // 16))
    tasks = []
    for path in paths:
        encoding, size = file_encoding(path), path.stat().st_size
        with open(path, "rb") as f:
            start = 3 if f.read(3) == b"\xef\xbb\xbf" else 0
            while start < size:
                f.seek(min(start + task_bytes, size))
                f.readline()  # to the end of the line the cut falls in
                end = min(f.tell(), size)
                tasks.append((str(path), encoding, start, end))
                start = end
    return tasks


def count_task(path: str, encoding: str, start: int, end: int, lowercase: bool) -> Counter:
    """How often each word (normalised and pre-tokenised as the saved tokenizer will do it) occurs
    in bytes [start, end) of a file. The text is split at white space in C (str.split) and counted;
    only the distinct tokens then go through the normaliser and the pre-tokeniser, which is exact
    because both act within white-space-separated tokens (BertNormalizer maps each character on
    its own, NFD never reorders across a space, and BertPreTokenizer splits at white space first)."""
    normalizer, pre_tokenizer = _bert_pipeline(lowercase)
    tokens: Counter = Counter()
    with open(path, "rb") as f:
        f.seek(start)
        while f.tell() < end:
            data = f.read(min(BLOCK_BYTES, end - f.tell()))
            if f.tell() < end:
                data += f.readline()  # whole lines only (a block never ends inside a character)
            text = data.decode(encoding).translate(_DELETED_SPACES)
            if lowercase and text.isascii():
                text = text.lower()  # the whole block in C; ASCII lower-casing is the normaliser's
            tokens.update(text.split())
    words: Counter = Counter()
    for token, count in tokens.items():
        if token.isascii() and token.isprintable():
            normal = token.lower() if lowercase else token
        else:  # accents, CJK, control characters: the normaliser itself
            normal = normalizer.normalize_str(token)
        if normal.isalnum():  # no punctuation inside (BERT's punctuation is never alphanumeric)
            words[normal] += count
        else:
            for word, _ in pre_tokenizer.pre_tokenize_str(normal):
                words[word] += count
    return words


def _bert_pipeline(lowercase: bool):
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                            strip_accents=lowercase, lowercase=lowercase)
    return normalizer, pre_tokenizers.BertPreTokenizer()


def count_words(paths: list[Path], lowercase: bool, num_proc: int = 1, max_word_types: int | None = None,
                dask_client=None, task_bytes: int | None = None) -> tuple[Counter, dict]:
    """(word counts, report) for the files. The counting tasks run in `num_proc` processes (or as
    tasks on a Dask cluster) and their counts are summed in task order, so the table is the same
    for every num_proc. `max_word_types`: when the table grows past twice the cap it is cut to the
    cap's most frequent words (ties by text), at the same points of the task order whatever the
    num_proc; the report says how many distinct words and occurrences were dropped."""
    tasks = plan_count_tasks(paths, task_bytes)
    total: Counter = Counter()
    report = {"tasks": len(tasks), "occurrences": 0, "max_word_types": max_word_types, "dropped_word_types": 0,
              "dropped_occurrences": 0, "dropped_max_count": 0, "pruned": 0}
    with _counts(tasks, lowercase, num_proc, dask_client) as counted:
        bar = tqdm(total=sum(end - start for _, _, start, end in tasks), unit="B", unit_scale=True,
                   desc="counting words", mininterval=1)
        for (_, _, start, end), counts in zip(tasks, counted, strict=True):
            total.update(counts)
            report["occurrences"] += sum(counts.values())
            bar.update(end - start)
            if max_word_types and len(total) > 2 * max_word_types:
                _prune(total, max_word_types, report)
        bar.close()
    if max_word_types and len(total) > max_word_types:
        _prune(total, max_word_types, report)
    report["dropped_share"] = report["dropped_occurrences"] / max(report["occurrences"], 1)
    return total, report


def _prune(table: Counter, keep: int, report: dict) -> None:
    ranked = sorted(table.items(), key=lambda item: (-item[1], item[0]))
    for word, count in ranked[keep:]:
        del table[word]
        report["dropped_occurrences"] += count
    if len(ranked) > keep:
        report["dropped_max_count"] = max(report["dropped_max_count"], ranked[keep][1])
    report["dropped_word_types"] += len(ranked) - keep
    report["pruned"] += 1


@contextlib.contextmanager
def _counts(tasks, lowercase: bool, num_proc: int, dask_client):
    """The counts of each task, in task order (an iterator). The pool starts first: the progress bar starts a
    thread, and a pool started after it would come from a fork server (pools.py), not a fork."""
    if dask_client is not None:
        yield run_in_order(dask_client, count_task, *zip(*tasks, strict=True), [lowercase] * len(tasks))
        return
    if num_proc <= 1 or len(tasks) == 1:
        yield (count_task(*task, lowercase) for task in tasks)
        return
    import multiprocessing

    from .pools import start_method

    with multiprocessing.get_context(start_method()).Pool(min(num_proc, len(tasks))) as pool:
        yield pool.imap(_count_packed, [(*task, lowercase) for task in tasks])


def _count_packed(args) -> Counter:
    return count_task(*args)


def learn_wordpieces(word_counts: dict[str, int], vocab_size: int, min_frequency: int = 2,
                     specials: tuple[str, ...] = SPECIAL_TOKENS, clear_input: bool = False) -> list[str]:
    """The vocabulary, in id order: `specials`, the alphabet (by frequency, ties by text), then
    one piece per merge until `vocab_size` pieces or no pair is seen `min_frequency` times. The
    whole alphabet is always kept, so a corpus with more characters than `vocab_size` gives more.

    Each word starts as its characters (`w`, `##o`, `##r`, ...). A merge joins the most frequent
    adjacent pair in every word (`t` + `##h` -> `th`, `##i` + `##n` -> `##in`), left to right;
    ties go to the pair (left, right) that sorts first, so the result depends on the counts
    alone. Two pairs can spell the same piece (`th` + `##e`, `t` + `##he`); the piece is listed
    once.

    The work scales with the positions a merge joins, not with all words, and runs in numpy: every
    character of every distinct word is a node of one array (its symbol, the next and previous node of
    its word, the word's count); each pair keeps the nodes where it starts, a merge joins those still
    valid, left to right (a linked list: the right node leaves its word), and updates only the pairs
    around them, a few of Python's dictionary operations per distinct pair rather than per word (an
    early merge joins in most words of a corpus of unrelated letters: hundreds of thousands). The
    most frequent pair comes from a heap. A pair whose count fell keeps its old, higher entry until
    that entry reaches the top, where it is put back with its current count (or dropped below
    `min_frequency`): every pair always has an entry at least as high as its count, so the first
    entry popped that matches its pair's count is the true maximum. `clear_input` empties
    `word_counts` once read (its memory is free for the merges)."""
    import numpy as np  # here: the module is imported by every data command, numpy by this step alone

    if not word_counts:
        return list(specials)
    # Every word's characters in one array, a node per character: its symbol id, the next and previous node of its
    # word (-1 at the ends; a merge unlinks the right node), and its word's count. The words' order does not
    # matter (a merge joins every occurrence; ties go by text). int32 where it fits: memory is the limit at scale.
    text = "".join(word_counts)
    lengths = np.fromiter(map(len, word_counts), dtype=np.int64, count=len(word_counts))
    counts = np.fromiter(word_counts.values(), dtype=np.int64, count=len(word_counts))
    if clear_input:
        word_counts.clear()
    n = len(text)
    if n >= 2**31 - 1:
        raise ValueError(f"{n:,} characters in the distinct words: more than this trainer holds; cap the word "
                         "table (--max_word_types)")
    weight = np.repeat(counts.astype(np.uint32 if counts.max() < 2**32 else np.int64), lengths)
    first = np.zeros(n, dtype=bool)
    first[np.cumsum(lengths) - lengths] = True
    del lengths, counts
    # a symbol: a code point (under 2^21) and whether it starts a word (bit 21 clear) or continues it (##)
    points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    del text
    kinds, sym = np.unique(points | (~first).astype(np.uint32) << 21, return_inverse=True)
    sym = sym.astype(np.int32)
    del points
    names = [chr(k & 0x1FFFFF) if k < 1 << 21 else PREFIX + chr(k & 0x1FFFFF) for k in kinds.tolist()]
    id_of = {name: i for i, name in enumerate(names)}
    alphabet = np.bincount(sym, weights=weight, minlength=len(names))
    vocab = [*specials, *sorted((s for s in names if s not in specials), key=lambda s: (-alphabet[id_of[s]], s))]
    known = set(vocab)
    nxt = np.arange(1, n + 1, dtype=np.int32)
    nxt[np.flatnonzero(first[1:])] = -1
    nxt[-1] = -1
    prv = np.arange(-1, n - 1, dtype=np.int32)
    prv[first] = -1
    del first
    # pair key -> count, and -> the nodes where it starts (arrays, appended to; stale entries are skipped)
    starts = np.flatnonzero(nxt >= 0).astype(np.int32)
    pair_counts, where = {}, {}
    _add_pairs(starts, _pair_keys(sym, nxt, starts), weight, pair_counts, where)
    del starts
    heap = [(-c, names[k // _KEY], names[k % _KEY], k) for k, c in pair_counts.items() if c >= min_frequency]
    heapq.heapify(heap)
    with tqdm(total=max(0, vocab_size - len(vocab)), desc="learning wordpieces", unit="piece", mininterval=1) as bar:
        while len(vocab) < vocab_size and heap:
            negative, a, b, key = heapq.heappop(heap)
            count = pair_counts.get(key, 0)
            if count != -negative:
                if count >= min_frequency:
                    heapq.heappush(heap, (-count, a, b, key))
                continue
            if count < min_frequency:
                break
            piece = a + b[len(PREFIX):]
            if piece not in known:
                vocab.append(piece)
                known.add(piece)
                bar.update(1)
            if piece not in id_of:
                id_of[piece] = len(names)
                names.append(piece)
            ia, ib, ip = key // _KEY, key % _KEY, id_of[piece]
            chunks = where.pop(key)
            nodes = chunks[0] if len(chunks) == 1 else np.unique(np.concatenate(chunks))
            after = nxt[nodes]
            nodes = nodes[(sym[nodes] == ia) & (after >= 0)]
            nodes = nodes[sym[nxt[nodes]] == ib]
            if ia == ib and len(nodes) > 1:  # a a a: join left to right, without overlap
                chained = np.r_[False, nodes[1:] == nxt[nodes[:-1]]]
                run = np.cumsum(~chained)
                offset = np.arange(len(nodes)) - np.flatnonzero(~chained)[run - 1]
                nodes = nodes[offset % 2 == 0]
            right = nxt[nodes]
            beyond = nxt[right]
            left = prv[nodes]
            # the pairs around each join go (those that start at its left neighbour and at its right half) ...
            gone = np.unique(np.concatenate([left[left >= 0], right[beyond >= 0]]))
            gone_keys = _pair_keys(sym, nxt, gone)
            # ... the join: the left node takes the piece, the right node leaves its word
            sym[nodes] = ip
            sym[right] = -1
            nxt[nodes] = beyond
            prv[beyond[beyond >= 0]] = nodes[beyond >= 0]
            # ... and the pairs around each new piece come
            left = prv[nodes]  # anew: a join's left neighbour may be the previous join's left half
            came = np.unique(np.concatenate([left[left >= 0], nodes[beyond >= 0]]))
            came_keys = _pair_keys(sym, nxt, came)
            pair_counts.pop(key, None)
            keep = gone_keys != key  # the joined pair itself is dropped whole
            grown = _add_pairs(came, came_keys, weight, pair_counts, where, gone[keep], gone_keys[keep])
            for k in grown:
                count = pair_counts.get(k, 0)
                if count >= min_frequency:
                    heapq.heappush(heap, (-count, names[k // _KEY], names[k % _KEY], k))
    return vocab


def _pair_keys(sym, nxt, starts):
    """The keys (int64) of the pairs that start at the nodes `starts`."""
    return sym[starts].astype("int64") * _KEY + sym[nxt[starts]]


def _add_pairs(starts, keys, weight, pair_counts, where, gone=None, gone_keys=None):
    """Add the pairs starting at `starts` (`keys`) to the counts, weighted by their words' counts, and to
    `where`; subtract those at `gone`. Returns the keys that were added."""
    import numpy as np

    if len(keys) + (0 if gone is None else len(gone)) <= SMALL:  # a late merge: a few nodes, Python is quicker
        deltas, added = {}, {}
        for k, w, at in zip(keys.tolist(), weight[starts].tolist(), starts.tolist(), strict=True):
            deltas[k] = deltas.get(k, 0) + w
            added.setdefault(k, []).append(at)
        if gone is not None:
            for k, w in zip(gone_keys.tolist(), weight[gone].tolist(), strict=True):
                deltas[k] = deltas.get(k, 0) - w
        _apply(deltas.items(), pair_counts, where)
        for k, at in added.items():
            where.setdefault(k, []).append(np.array(at, dtype=np.int32))
        return list(added)
    # one sort per side (the first call holds every pair of the corpus: memory counts), sums by run of equal keys
    order, added, bounds, sums = _runs(np, keys, weight[starts])
    deltas = dict(zip(added, sums, strict=True))
    if gone is not None and len(gone):
        _, taken, _, lost = _runs(np, gone_keys, weight[gone])
        for k, d in zip(taken, lost, strict=True):
            deltas[k] = deltas.get(k, 0) - d
    _apply(((k, int(round(d))) for k, d in deltas.items()), pair_counts, where)
    positions = starts[order]
    for k, lo, hi in zip(added, bounds, [*bounds[1:], len(positions)], strict=True):
        where.setdefault(k, []).append(positions[lo:hi])
    return added


def _runs(np, keys, weights):
    """(the order that sorts `keys`, the distinct keys, where each one's run starts, the weights' sum per run)."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64), [], [], []
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    bounds = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    sums = np.add.reduceat(weights[order].astype(np.float64), bounds)
    return order, ordered[bounds].tolist(), bounds.tolist(), sums.tolist()


def _apply(deltas, pair_counts, where) -> None:
    """Add each (key, delta) to the counts; a pair seen nowhere any more is forgotten."""
    for k, d in deltas:
        if d:
            total = pair_counts.get(k, 0) + d
            if total:
                pair_counts[k] = total
            else:  # seen nowhere any more
                del pair_counts[k]
                where.pop(k, None)

