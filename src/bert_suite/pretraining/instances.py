"""Plain-text corpus -> documents -> next-sentence-prediction instances -> a `datasets` dataset on disk.

Instances follow the reference create_pretraining_data algorithm (BERT paper, Section 3.1 and Appendix A.2; google-research/bert's create_pretraining_data.py), with its
known flaw fixed: a NotNext segment B never comes from the document segment A came from.

Corpus files are read by `text_files` (formats, encodings, sentence splitting).

Memory is bounded by working shard by shard: a shard is a run of whole documents (at most
`docs_per_shard` documents, cut sooner at ~16 MiB of text, never fewer than two documents) that
is read, tokenised and turned into instances on its own, in a worker process when `num_proc` > 1.
The instances can also be built in parts (`num_shards`, `shard_index`): runs of whole shards, each a
dataset folder of its own, built by separate processes or machines; `load_parts` puts them together.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..io import atomic_write_text
from ..tokenization import check_bert_vocabulary, check_max_seq_length, load_wordpiece
from .pools import datasets_pools
from .text_files import check_input_files, document_spans, file_encoding, read_piece, resolve_format

SHARD_BYTES = 16 << 20  # text per shard; as Python lists of token ids and instances a worker holds ~15-20x this
TOKENIZE_BATCH = 4096  # sentences per tokenizer call: large enough for the Rust side to parallelise
MASK_BATCH = 256  # instances padded and masked together for static masking
STATS_FILE = "pretrain_data_stats.json"

Piece = tuple[str, str, str, int, int]  # (path, format, encoding, start byte, end byte) of whole documents


def plan_shards(paths: list[Path], fmt: str = "auto", docs_per_shard: int = 2000,
                shard_bytes: int = SHARD_BYTES) -> tuple[list[list[Piece]], dict[str, dict[str, str]], int]:
    """Cut the corpus into shards of whole documents: (shards as lists of pieces, the format and
    encoding of each file, the number of documents with text). Every shard has at least two
    documents with text, so NotNext segments can be drawn inside it."""
    shards: list[list[Piece]] = []
    files: dict[str, dict[str, str]] = {}
    pieces: list[Piece] = []
    shard_docs = shard_size = total_docs = 0
    for path in paths:
        fmt_here, encoding = resolve_format(path, fmt), file_encoding(path)
        files[str(path)] = {"format": fmt_here, "encoding": encoding}
        piece_start = piece_end = None
        for start, end, has_text in document_spans(path, fmt_here, encoding):
            piece_start = start if piece_start is None else piece_start
            piece_end = end
            shard_docs += has_text
            total_docs += has_text
            shard_size += end - start
            if shard_docs >= 2 and (shard_docs >= docs_per_shard or shard_size >= shard_bytes):
                shards.append([*pieces, (str(path), fmt_here, encoding, piece_start, piece_end)])
                pieces, piece_start, shard_docs, shard_size = [], None, 0, 0
        if piece_start is not None:
            pieces.append((str(path), fmt_here, encoding, piece_start, piece_end))
    if pieces:
        # A tail with fewer than two documents could not draw NotNext segments: it joins the last shard.
        if shard_docs >= 2 or not shards:
            shards.append(pieces)
        else:
            shards[-1].extend(pieces)
    if total_docs < 2:
        raise ValueError(f"{', '.join(str(p) for p in paths)}: {total_docs} document(s) with text; next-sentence "
                         "prediction needs at least two (check the format: 'lines' and 'paragraphs' separate "
                         "documents by blank lines, 'raw' makes each file one document)")
    return shards, files, total_docs


# ----------------------------------------------------------------------------- instance creation

def truncated_lengths(len_a: int, len_b: int, max_num_tokens: int) -> tuple[int, int]:
    """Segment lengths after the reference truncation, which removes one token at a time from the
    longer segment (from B on a tie) until the pair fits: computed directly instead of looping."""
    excess = len_a + len_b - max_num_tokens
    if excess <= 0:
        return len_a, len_b
    cut = min(excess, abs(len_a - len_b))
    if len_a > len_b:
        len_a -= cut
    else:
        len_b -= cut
    excess -= cut
    # Equal lengths now: the tie takes from B, then A is longer by one, and so on alternately.
    return len_a - excess // 2, len_b - (excess + 1) // 2


def _trim(tokens: list[int], keep: int, rng: random.Random) -> list[int]:
    """Keep `keep` tokens; each removed token came from the front or the back with equal
    probability, so the number from the front is Binomial(removed, 1/2), drawn in one call."""
    removed = len(tokens) - keep
    if removed <= 0:
        return tokens
    front = rng.getrandbits(removed).bit_count()
    return tokens[front: front + keep]


def instances_from_document(documents: list[list[list[int]]], index: int, max_num_tokens: int,
                            short_seq_prob: float, rng: random.Random, balance_nsp: bool = False
                            ) -> Iterator[tuple[list[int], list[int], int, bool, bool]]:
    """(segment A, segment B, label 0 IsNext / 1 NotNext, truncated, short target) tuples from
    document `index`, by the reference algorithm. NotNext segments come from another document of
    `documents`; "short target" says the document drew a shortened target length.

    The reference makes every chunk of one sentence NotNext (there is no second sentence to continue
    it), so a corpus of one-sentence documents (a task's single-sentence examples) gives far more
    NotNext than IsNext pairs. With `balance_nsp`, such a chunk is IsNext with probability 1/2 like
    any other, its B being the sentence's own continuation: A = its first k tokens, B = the rest (k
    uniform in 1..n-1). Off (the default), the random draws and the output are the reference's."""
    document = documents[index]
    target_length = max_num_tokens
    short = rng.random() < short_seq_prob
    if short:
        target_length = rng.randint(2, max_num_tokens)
    chunk: list[list[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
            if balance_nsp and len(chunk) == 1 and len(chunk[0]) >= 2 and rng.random() >= 0.5:
                split = rng.randint(1, len(chunk[0]) - 1)  # IsNext inside the one sentence
                tokens_a, tokens_b, label = chunk[0][:split], chunk[0][split:], 0
            elif len(chunk) == 1 or rng.random() < 0.5:
                label = 1
                # The fix: draw among the OTHER documents (the reference may pick this one and
                # still label the pair NotNext).
                other = rng.randrange(len(documents) - 1)
                other += other >= index
                random_document = documents[other]
                target_b = target_length - len(tokens_a)
                tokens_b = []
                for sentence in random_document[rng.randrange(len(random_document)):]:
                    tokens_b.extend(sentence)
                    if len(tokens_b) >= target_b:
                        break
                i -= len(chunk) - a_end  # the unused sentences go back for the next instance
            else:
                label = 0
                tokens_b = [t for sentence in chunk[a_end:] for t in sentence]
            len_a, len_b = truncated_lengths(len(tokens_a), len(tokens_b), max_num_tokens)
            truncated = len_a + len_b < len(tokens_a) + len(tokens_b)
            if truncated:
                tokens_a, tokens_b = _trim(tokens_a, len_a, rng), _trim(tokens_b, len_b, rng)
            yield tokens_a, tokens_b, label, truncated, short
            chunk, chunk_length = [], 0
        i += 1


def _derived_seed(*parts) -> int:
    """A 63-bit seed from (seed, shard, round, ...) that is the same in every process."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little") >> 1


def _tokenize_shard(pieces, tokenizer, counts: dict) -> list[list[list[int]]]:
    """The shard's documents as lists of sentence token ids; empty sentences/documents counted."""
    sentences: list[str] = []
    bounds: list[int] = [0]
    for piece in pieces:
        for doc in read_piece(*piece):
            if doc:
                sentences.extend(doc)
                bounds.append(len(sentences))
            else:
                counts["skipped_empty_documents"] += 1
    ids: list[list[int]] = []
    for i in range(0, len(sentences), TOKENIZE_BATCH):
        ids.extend(tokenizer(sentences[i: i + TOKENIZE_BATCH], add_special_tokens=False,
                             return_attention_mask=False, return_token_type_ids=False)["input_ids"])
    documents = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        doc = [sentence for sentence in ids[start:end] if sentence]
        counts["skipped_empty_sentences"] += end - start - len(doc)
        if doc:
            documents.append(doc)
            counts["sentences"] += len(doc)
            counts["corpus_tokens"] += sum(map(len, doc))
        else:
            counts["skipped_empty_documents"] += 1
    counts["documents"] += len(documents)
    return documents


def _generate(shards: list, settings: dict, tokenizer) -> Iterator[dict]:
    """datasets generator: the examples of the given shards, in shard order. Statistics of each
    shard go to a JSON file in settings["stats_dir"] (workers cannot return values)."""
    masker = None
    if settings["static_masking"]:
        import torch

        from .masking import MaskingCollator

        masker = MaskingCollator(tokenizer, mlm_probability=settings["masked_lm_prob"],
                                 max_predictions_per_seq=settings["max_predictions_per_seq"],
                                 whole_word_mask=settings["whole_word_mask"])
    cls_id, sep_id = settings["cls_id"], settings["sep_id"]
    max_num_tokens = settings["max_seq_length"] - 3
    for shard_index, pieces, neighbour in shards:
        counts = dict.fromkeys(("documents", "skipped_empty_documents", "sentences", "skipped_empty_sentences",
                                "corpus_tokens", "instances", "not_next", "short_seq", "truncated", "tokens",
                                "document_passes", "short_target_passes"), 0)
        # NotNext segments are drawn from this shard's documents only, not the whole corpus as in the
        # reference (which holds every document in memory): memory stays bounded by one shard, and a
        # shard of up to docs_per_shard documents is a wide enough pool for random segments.
        documents = _tokenize_shard(pieces, tokenizer, counts)
        own = len(documents)
        if own < 2 and neighbour:
            # Documents whose text gave no tokens left this shard a single document: NotNext segments
            # are borrowed from the neighbouring shard (its documents make no instances here).
            documents += _tokenize_shard(neighbour, tokenizer, dict.fromkeys(counts, 0))
        if len(documents) < 2:
            where = ", ".join(f"{p} bytes {s}-{e}" for p, _, _, s, e in pieces)
            raise ValueError(f"{where}: {len(documents)} document(s) with tokens; next-sentence prediction needs "
                             "at least two")
        for dupe_round in range(settings["dupe_factor"]):
            # Shard-local randomness: the output depends on (seed, shard, round) only, never on which
            # process builds the shard, so every num_proc gives the same dataset.
            rng = random.Random(_derived_seed(settings["seed"], shard_index, dupe_round))
            examples = []
            for index in range(own):
                counts["document_passes"] += 1
                first = True
                for tokens_a, tokens_b, label, truncated, short in instances_from_document(
                        documents, index, max_num_tokens, settings["short_seq_prob"], rng,
                        settings["balance_nsp"]):
                    counts["short_target_passes"] += short and first
                    first = False
                    examples.append({"input_ids": [cls_id, *tokens_a, sep_id, *tokens_b, sep_id],
                                     "token_type_ids": [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
                                     "next_sentence_label": label})
                    counts["not_next"] += label
                    counts["short_seq"] += short
                    counts["truncated"] += truncated
                    counts["tokens"] += len(tokens_a) + len(tokens_b) + 3
            # The reference shuffles its instances; here within a shard and round (bounded memory).
            rng.shuffle(examples)
            counts["instances"] += len(examples)
            if masker is not None:
                generator = torch.Generator().manual_seed(_derived_seed("mask", settings["seed"], shard_index,
                                                                        dupe_round))
                for start in range(0, len(examples), MASK_BATCH):
                    batch = examples[start: start + MASK_BATCH]
                    masked = masker.mask(masker.pad(batch), generator=generator)
                    # Back to unpadded rows: one tolist per batch, then slices (pad() pads on the right,
                    # so a row's real tokens are its first attention_mask.sum() positions).
                    lengths = masked["attention_mask"].sum(dim=1).tolist()
                    ids, labels = masked["input_ids"].tolist(), masked["labels"].tolist()
                    for row, example in enumerate(batch):
                        example["input_ids"], example["labels"] = ids[row][: lengths[row]], labels[row][: lengths[row]]
            yield from examples
        with open(Path(settings["stats_dir"]) / f"shard-{shard_index:06d}.json", "w", encoding="utf-8") as f:
            json.dump(counts, f)


# ----------------------------------------------------------------------------- the dataset

def _features(static_masking: bool):
    from datasets import Features, List, Value

    columns = {"input_ids": List(Value("int32")), "token_type_ids": List(Value("int8")),
               "next_sentence_label": Value("int8")}
    if static_masking:
        columns["labels"] = List(Value("int32"))
    return Features(columns)


def _check_build_arguments(max_seq_length: int, short_seq_prob: float, dupe_factor: int, static_masking: bool,
                           max_predictions_per_seq: int, masked_lm_prob: float, docs_per_shard: int,
                           num_shards: int, shard_index: int | None) -> None:
    check_max_seq_length(max_seq_length)
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor must be at least 1, got {dupe_factor}")
    if not 0 <= short_seq_prob <= 1:
        raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
    if static_masking and (not 0 < masked_lm_prob <= 1 or max_predictions_per_seq < 1):
        raise ValueError(f"masked_lm_prob must be in (0, 1] and max_predictions_per_seq at least 1, got "
                         f"{masked_lm_prob} and {max_predictions_per_seq}")
    if docs_per_shard < 2:
        raise ValueError(f"docs_per_shard must be at least 2 (NotNext segments come from the same shard), "
                         f"got {docs_per_shard}")
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    if shard_index is not None and shard_index < 0:
        raise ValueError(f"shard_index must be at least 0, got {shard_index}")
    if shard_index is not None and shard_index >= num_shards:
        raise ValueError(f"shard_index {shard_index} is not below num_shards {num_shards}: the parts are numbered "
                         f"0 to {num_shards - 1}")


def part_name(num_shards: int, shard_index: int) -> str:
    """The folder name of part `shard_index` of `num_shards`: part-00001-of-00004."""
    return f"part-{shard_index:05d}-of-{num_shards:05d}"


def part_range(num_shards: int, shard_index: int, internal_shards: int) -> tuple[int, int]:
    """The internal shards [first, end) that part `shard_index` of `num_shards` builds: contiguous runs
    as even as whole shards allow, so the parts in order are the internal shards in order."""
    return shard_index * internal_shards // num_shards, (shard_index + 1) * internal_shards // num_shards


def _plan_digest(paths: list[Path], shards: list[list[Piece]]) -> str:
    """The plan by file position (not path, which may differ between the machines building the parts),
    format, encoding and byte ranges: parts with the same digest cut the same corpus the same way."""
    position = {str(p): i for i, p in enumerate(paths)}
    plan = [[(position[p], fmt, enc, start, end) for p, fmt, enc, start, end in pieces] for pieces in shards]
    return hashlib.sha256(repr(([p.stat().st_size for p in paths], plan)).encode()).hexdigest()[:16]


def build_pretraining_dataset(files: list[str], tokenizer, output_dir: str, max_seq_length: int = 128,
                              short_seq_prob: float = 0.1, dupe_factor: int = 1, static_masking: bool = False,
                              max_predictions_per_seq: int = 20, masked_lm_prob: float = 0.15,
                              whole_word_mask: bool = False, seed: int = 12345, num_proc: int | None = None,
                              fmt: str = "auto", docs_per_shard: int = 2000, balance_nsp: bool = False,
                              num_shards: int = 1, shard_index: int | None = None) -> dict | list[dict]:
    """Turn text files into NSP instances saved with `datasets` (`load_from_disk(output_dir)`), and
    return (and write to output_dir/pretrain_data_stats.json) the statistics.

    Columns: input_ids (int32), token_type_ids (int8), next_sentence_label (int8: 0 IsNext,
    1 NotNext); with `static_masking`, input_ids hold the masked ids and `labels` (int32) the
    original id at predicted positions, -100 elsewhere, with new masks in each of the
    `dupe_factor` rounds. `whole_word_mask`, `max_predictions_per_seq` and `masked_lm_prob` only
    apply to static masking. `balance_nsp`: one-sentence chunks are IsNext half the time (see
    `instances_from_document`). The same seed gives the same dataset for any `num_proc`.

    In parts: the corpus is planned into internal shards as always, and part I of `num_shards` N is the
    contiguous run `part_range(N, I, S)` of its S shards, written as a complete dataset folder
    output_dir/part-IIIII-of-NNNNN (`part_name`) with its own statistics. With `shard_index`, only that
    part is built and its statistics returned (see `build_part`); without it and with N > 1, all N parts
    are built one after another and the list of their statistics returned. The parts concatenated in
    order (`load_parts`) are the rows of the one-folder build with the same settings, whatever the
    `num_proc` of each part."""
    paths = check_input_files(files)
    _check_build_arguments(max_seq_length, short_seq_prob, dupe_factor, static_masking, max_predictions_per_seq,
                           masked_lm_prob, docs_per_shard, num_shards, shard_index)
    if isinstance(tokenizer, (str, Path)):  # without transformers: this command and its workers need no torch
        tokenizer = load_wordpiece(str(tokenizer))
    special = check_bert_vocabulary(tokenizer)

    shards, file_info, _ = plan_shards(paths, fmt, docs_per_shard, SHARD_BYTES)
    if num_shards > len(shards):
        raise ValueError(f"num_shards {num_shards}: the corpus is too small for {num_shards} parts; it makes "
                         f"{len(shards)} internal shard(s) (runs of whole documents, up to {docs_per_shard} "
                         f"documents or {SHARD_BYTES >> 20} MiB of text each), and a part is at least one")
    # Each job: (shard index, its pieces, the pieces of a neighbouring shard to borrow NotNext from),
    # from the whole corpus's plan, so a part's shards are built exactly as in the one-folder build.
    jobs = [(i, pieces, shards[i + 1] if i + 1 < len(shards) else shards[i - 1] if i else [])
            for i, pieces in enumerate(shards)]
    arguments = dict(max_seq_length=max_seq_length, short_seq_prob=short_seq_prob, dupe_factor=dupe_factor,
                     seed=seed, static_masking=static_masking, whole_word_mask=whole_word_mask,
                     max_predictions_per_seq=max_predictions_per_seq, masked_lm_prob=masked_lm_prob,
                     docs_per_shard=docs_per_shard, balance_nsp=balance_nsp)
    build = dict(paths=paths, file_info=file_info, arguments=arguments, tokenizer=tokenizer, special=special,
                 num_proc=num_proc)
    out = Path(output_dir)
    if num_shards == 1 and shard_index is None:
        out.mkdir(parents=True, exist_ok=True)
        for old in [*out.glob("data-*.arrow"), out / "state.json", out / "dataset_info.json", out / STATS_FILE]:
            old.unlink(missing_ok=True)  # what a previous build left; save_to_disk keeps unlisted files
        stats = _build(jobs, out, **build)
        atomic_write_text(out / STATS_FILE, json.dumps(stats, indent=2) + "\n")
        return stats
    digest = _plan_digest(paths, shards)
    built = [_build_part(jobs, out, num_shards, index, digest, build)
             for index in ([shard_index] if shard_index is not None else range(num_shards))]
    return built[0] if shard_index is not None else built


def build_part(files: list[str], tokenizer, output_dir: str, num_shards: int, shard_index: int, **settings) -> dict:
    """Build part `shard_index` (0 to num_shards - 1) of the corpus into output_dir/part-IIIII-of-NNNNN
    and return its statistics; `settings` are build_pretraining_dataset's keywords. Parts are independent
    (each plans the whole corpus, which only scans its bytes), so separate processes or machines can
    build them at the same time into one folder. A part is written into a hidden temporary sibling
    (.part-IIIII-of-NNNNN.tmp-XXXXXXXX) and renamed into place when complete, replacing a finished
    part of the same name: a build killed midway leaves no folder `load_parts` takes as a part."""
    if shard_index is None:
        raise ValueError("build_part needs a shard_index (build_pretraining_dataset builds all parts)")
    return build_pretraining_dataset(files, tokenizer, output_dir, num_shards=num_shards, shard_index=shard_index,
                                     **settings)


def build_parts_on_dask(files: list[str], tokenizer: str, output_dir: str, address: str,
                        num_shards: int | None = None, **settings) -> list[dict]:
    """Build the parts of the corpus as Dask tasks on the cluster at `address` (one `build_part` per
    task, num_proc 1 in each) and return their statistics in part order. `num_shards`: default the
    cluster's threads, at most the corpus's internal shards. `tokenizer` is a path every worker can
    read, as are `files` and `output_dir`. The parts in order are the one-process build's rows."""
    from .cluster import dask_client, run_in_order, total_threads

    paths = check_input_files(files)
    if not isinstance(tokenizer, (str, Path)):
        raise ValueError("--dask_scheduler: give --tokenizer as a path the workers can read")
    client = dask_client(address)
    try:
        if num_shards is None:
            shards, _, _ = plan_shards(paths, settings.get("fmt", "auto"), settings.get("docs_per_shard", 2000),
                                       SHARD_BYTES)
            num_shards = max(1, min(total_threads(client), len(shards)))
        settings = {**settings, "num_proc": 1}
        names = [str(p.resolve()) for p in paths]
        return list(run_in_order(client, build_part, [names] * num_shards, [str(tokenizer)] * num_shards,
                                 [str(Path(output_dir).resolve())] * num_shards, [num_shards] * num_shards,
                                 list(range(num_shards)), **settings))
    finally:
        client.close()


def _build_part(jobs: list, out: Path, num_shards: int, index: int, digest: str, build: dict) -> dict:
    first, end = part_range(num_shards, index, len(jobs))
    name = part_name(num_shards, index)
    part = {"num_shards": num_shards, "shard_index": index, "internal_shards": [first, end],
            "corpus_shards": len(jobs), "plan_digest": digest}
    out.mkdir(parents=True, exist_ok=True)
    temporary = out / f".{name}.tmp-{secrets.token_hex(4)}"
    temporary.mkdir()
    try:
        stats = _build(jobs[first:end], temporary, part=part, **build)
        atomic_write_text(temporary / STATS_FILE, json.dumps(stats, indent=2) + "\n")
        final = out / name
        for _ in range(5):  # another build of the same part may finish in between: then replace that one
            try:
                os.rename(temporary, final)
                break
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            aside = out / f".{name}.old-{secrets.token_hex(4)}"
            try:
                os.rename(final, aside)
            except FileNotFoundError:
                continue
            shutil.rmtree(aside, ignore_errors=True)
        else:
            raise OSError(f"{final}: could not be replaced (other builds of this part keep writing it)")
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return stats


def _build(jobs: list, out: Path, paths: list[Path], file_info: dict, arguments: dict, tokenizer, special: dict,
           num_proc: int | None, part: dict | None = None) -> dict:
    """Build the shards of `jobs` into the dataset folder `out` (save_to_disk) and return the statistics."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError

    static_masking = arguments["static_masking"]
    workers = max(1, min(num_proc or 1, len(jobs)))
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as scratch:
        settings = dict(arguments, stats_dir=scratch, cls_id=special["[CLS]"], sep_id=special["[SEP]"])
        identity = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]
        key = (identity, file_info, arguments, len(tokenizer), tokenizer.name_or_path)
        fingerprint = hashlib.sha256(repr(key if part is None else (*key, part)).encode()).hexdigest()[:16]
        try:
            # A fresh cache_dir: the generator must really run so that the shard statistics get written.
            with datasets_pools():  # its workers are started safely in a process that runs threads (pools.py)
                dataset = Dataset.from_generator(_generate, features=_features(static_masking),
                                                 cache_dir=os.path.join(scratch, "cache"),
                                                 gen_kwargs={"shards": jobs, "settings": settings,
                                                             "tokenizer": tokenizer},
                                                 num_proc=workers if workers > 1 else None, fingerprint=fingerprint)
        except DatasetGenerationError as err:
            # Bad input found by a worker: re-raise its ValueError as is, not datasets' generic wrapper
            # (from a worker process the original survives only as the text of its traceback).
            cause = err.__cause__
            while cause is not None and not isinstance(cause, ValueError):
                cause = cause.__cause__
            if cause is not None:
                raise ValueError(str(cause)) from err
            remote = re.findall(r"^ValueError: (.*)$", str(err.__cause__ or ""), flags=re.MULTILINE)
            if remote:
                raise ValueError(remote[-1]) from err
            raise
        totals: dict[str, int] = {}
        stats_files = sorted(Path(scratch).glob("shard-*.json"))
        if len(stats_files) != len(jobs):
            raise RuntimeError(f"{len(stats_files)} of {len(jobs)} shards reported statistics")
        for stats_file in stats_files:
            for key, value in json.loads(stats_file.read_text()).items():
                totals[key] = totals.get(key, 0) + value
        if totals["instances"] != len(dataset):
            raise RuntimeError(f"the dataset has {len(dataset)} rows but the shards made {totals['instances']}")
        arrow_files = max(workers, math.ceil(dataset.data.nbytes / (256 << 20)))
        dataset.save_to_disk(str(out), num_shards=min(arrow_files, len(dataset)))
        del dataset

    instances = totals["instances"]
    return {
        "instances": instances,
        "not_next_share": totals["not_next"] / instances,
        "short_seq_share": totals["short_seq"] / instances,
        "short_target_document_share": totals["short_target_passes"] / totals["document_passes"],
        "tokens": totals["tokens"],
        "mean_instance_length": totals["tokens"] / instances,
        "corpus_tokens": totals["corpus_tokens"],
        "truncated": totals["truncated"],
        "documents": totals["documents"],
        "skipped_empty_documents": totals["skipped_empty_documents"],
        "sentences": totals["sentences"],
        "skipped_empty_sentences": totals["skipped_empty_sentences"],
        "shards": len(jobs),
        **(part or {}),
        "files": [str(p) for p in paths],
        "formats": {name: info["format"] for name, info in file_info.items()},
        "not_utf8_files": {name: info["encoding"] for name, info in file_info.items() if info["encoding"] != "utf-8"},
        **arguments,
        "masked_lm": "static" if static_masking else "dynamic (at training time)",
        "tokenizer": tokenizer.name_or_path or "BertTokenizer",  # a bare vocab.txt: what transformers named it
        "tokenizer_vocab_size": len(tokenizer),
        "special_token_ids": special,
    }


# ----------------------------------------------------------------------------- a folder of parts

_PART = re.compile(r"part-(\d{5})-of-(\d{5})")
_UNFINISHED_PART = re.compile(r"\.part-(\d{5})-of-(\d{5})\.tmp-\w+")
# What every part of one build has in common (besides num_shards): a part that differs was built
# from another corpus, plan or set of flags, and its rows do not continue the others'.
PART_SETTINGS = ("max_seq_length", "seed", "dupe_factor", "static_masking", "balance_nsp", "tokenizer_vocab_size",
                 "short_seq_prob", "whole_word_mask", "max_predictions_per_seq", "masked_lm_prob", "docs_per_shard",
                 "corpus_shards", "plan_digest")


def find_parts(path: str | Path) -> list[tuple[Path, dict]]:
    """The parts of a folder written with num_shards (part-IIIII-of-NNNNN sub-folders), in part order,
    each with its statistics; [] when the folder holds a dataset itself or no parts at all.

    Raises ValueError when the parts are not one complete build: some of parts 0 to N-1 missing or
    unfinished (named by index; hidden .part-*.tmp-* folders are builds killed or still running),
    part folders of different N, or a part whose settings (PART_SETTINGS) differ from part 0's."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    finished: dict[int, Path] = {}
    counts: dict[int, list[str]] = {}
    unfinished = []
    for entry in sorted(folder.iterdir()):
        if not entry.is_dir():
            continue
        if match := _PART.fullmatch(entry.name):
            finished[int(match[1])] = entry
            counts.setdefault(int(match[2]), []).append(entry.name)
        elif _UNFINISHED_PART.fullmatch(entry.name):
            unfinished.append(entry.name)
    if (folder / "state.json").is_file():
        if finished:
            names = ", ".join(finished[i].name for i in sorted(finished))
            raise ValueError(f"holds both a dataset (state.json) and part folders ({names}); keep one of them")
        return []
    if not finished and not unfinished:
        return []
    if len(counts) > 1:
        raise ValueError("part folders of different builds: " + "; ".join(
            f"{len(names)} of {n} parts ({names[0]}, ...)" for n, names in sorted(counts.items())))
    total = next(iter(counts)) if counts else int(_UNFINISHED_PART.fullmatch(unfinished[0])[2])
    beyond = [finished[i].name for i in sorted(finished) if i >= total]
    if beyond:
        raise ValueError(f"{', '.join(beyond)}: a part index must be below the number of parts")
    missing = [i for i in range(total) if i not in finished or not (finished[i] / STATS_FILE).is_file()]
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (f", ... ({len(missing)} in all)" if len(missing) > 20 else "")
        raise ValueError(f"part(s) {shown} of {total} missing or unfinished (expected {part_name(total, 0)} to "
                         f"{part_name(total, total - 1)}, each with {STATS_FILE})"
                         + (f"; unfinished builds (killed, or still running): {', '.join(unfinished)}"
                            if unfinished else ""))
    parts = [(finished[i], json.loads((finished[i] / STATS_FILE).read_text())) for i in range(total)]
    first_name, reference = parts[0][0].name, parts[0][1]
    covered = 0
    for index, (where, stats) in enumerate(parts):
        if (stats.get("num_shards"), stats.get("shard_index")) != (total, index):
            raise ValueError(f"{where.name}: its {STATS_FILE} says part {stats.get('shard_index')} of "
                             f"{stats.get('num_shards')} parts (a renamed folder?)")
        for key in PART_SETTINGS:
            if stats.get(key) != reference.get(key):
                raise ValueError(f"{where.name}: {key} {stats.get(key)!r} differs from {first_name}'s "
                                 f"{reference.get(key)!r}: the parts come from different builds (rebuild it with "
                                 "the same corpus and settings)")
        first, end = stats.get("internal_shards", [None, None])
        if first != covered:
            raise ValueError(f"{where.name}: starts at internal shard {first}, not {covered} where the part before "
                             "it ended")
        covered = end
    if covered != reference.get("corpus_shards"):
        raise ValueError(f"the parts end at internal shard {covered} of {reference.get('corpus_shards')}")
    return parts


def load_parts(path: str | Path):
    """The parts of a folder of parts (see `find_parts`, which checks them) loaded with
    `datasets.load_from_disk` and concatenated in part order: the rows of the one-folder build."""
    from datasets import concatenate_datasets, load_from_disk

    parts = find_parts(path)
    if not parts:
        raise ValueError(f"{path}: no part-IIIII-of-NNNNN folders")
    datasets = []
    for where, stats in parts:
        data = load_from_disk(str(where))
        if len(data) != stats["instances"]:
            raise ValueError(f"{where.name}: {len(data)} rows, but its {STATS_FILE} says {stats['instances']}")
        datasets.append(data)
    return concatenate_datasets(datasets) if len(datasets) > 1 else datasets[0]


def format_stats(stats: dict) -> str:
    """A few human-readable lines about a build."""
    return "\n".join([
        f"{stats['instances']:,} instances (length <= {stats['max_seq_length']}, dupe_factor "
        f"{stats['dupe_factor']}, {stats['masked_lm']} masking) from {stats['documents']:,} documents, "
        f"{stats['sentences']:,} sentences, {stats['corpus_tokens']:,} corpus tokens in {stats['shards']} shard(s)",
        f"NotNext share {stats['not_next_share']:.3f}; short-target share {stats['short_seq_share']:.3f}; "
        f"truncated {stats['truncated']:,} ({stats['truncated'] / stats['instances']:.1%}); "
        f"mean length {stats['mean_instance_length']:.1f} tokens",
        f"skipped: {stats['skipped_empty_documents']:,} empty documents, {stats['skipped_empty_sentences']:,} "
        "sentences without tokens",
        *[f"not UTF-8, read as {encoding}: {name}" for name, encoding in stats.get("not_utf8_files", {}).items()],
        *([f"part {stats['shard_index']} of parts 0-{stats['num_shards'] - 1}: internal shards "
           f"{stats['internal_shards'][0]}-{stats['internal_shards'][1] - 1} of {stats['corpus_shards']}"]
          if "shard_index" in stats else []),
    ])


__all__ = ["PART_SETTINGS", "build_part", "build_pretraining_dataset", "find_parts", "format_stats",
           "instances_from_document", "load_parts", "part_name", "part_range", "plan_shards", "truncated_lengths"]
