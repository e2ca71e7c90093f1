# Command: .venv/bin/python benchmarks/pretrain_data_speed.py [--data ../shared/data] [--repeat 2]
"""Speed of pre-training data creation as a ratio to its floor.

Floor: read the corpus, split it into documents and sentences, and tokenise every sentence once with the same fast
tokenizer in the same batches: work any pipeline over this text must do. Pipeline: `build_pretraining_dataset`
(max_seq_length 128, dupe_factor 1, dynamic masking, num_proc 1) on the same files, which adds shard planning, NSP
instances and the Arrow files. ratio = pipeline / floor (goal: <= 2). Corpus: the Gutenberg books and WikiText-2
test split under shared/data/corpus with the released bert-base-uncased vocab.txt; skipped (exit 0) without them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def corpus_files(data: Path) -> list[Path]:
    corpus = data / "corpus"
    return sorted((corpus / "gutenberg").glob("*.txt")) + sorted((corpus / "wikitext-2-raw").glob("*.raw"))


def floor(files: list[Path], tokenizer) -> tuple[float, int, int]:
    """(seconds, sentences, tokens) to read, split and batch-tokenise the corpus."""
    from bert_suite.pretraining.instances import TOKENIZE_BATCH
    from bert_suite.pretraining.text_files import iter_documents

    start, sentences, tokens, batch = time.perf_counter(), 0, 0, []

    def flush():
        nonlocal tokens
        ids = tokenizer(batch, add_special_tokens=False, return_attention_mask=False,
                        return_token_type_ids=False)["input_ids"]
        tokens += sum(map(len, ids))
        batch.clear()

    for path in files:
        for document in iter_documents(str(path)):
            sentences += len(document)
            batch.extend(document)
            if len(batch) >= TOKENIZE_BATCH:
                flush()
    if batch:
        flush()
    return time.perf_counter() - start, sentences, tokens


def pipeline(files: list[Path], tokenizer) -> tuple[float, dict]:
    from bert_suite.pretraining.instances import build_pretraining_dataset

    with tempfile.TemporaryDirectory(prefix="pretrain-data-bench-") as out:
        start = time.perf_counter()
        stats = build_pretraining_dataset([str(f) for f in files], tokenizer, out, max_seq_length=128,
                                          dupe_factor=1, static_masking=False, num_proc=1)
        return time.perf_counter() - start, stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the fastest counts")
    args = parser.parse_args()
    vocab, files = args.data / "vocab" / "bert-base-uncased" / "vocab.txt", corpus_files(args.data)
    if not vocab.is_file() or not files:
        print(f"SKIP: no corpus or bert-base-uncased vocab under {args.data}; nothing measured")
        return 0

    import datasets

    from bert_suite.tokenization import load_pretraining_tokenizer

    datasets.disable_progress_bars()
    tokenizer = load_pretraining_tokenizer(str(vocab))
    floors, pipes = [], []
    for _ in range(max(1, args.repeat)):  # alternate, so drift in machine speed hits both alike
        (seconds, sentences, tokens), (built, stats) = floor(files, tokenizer), pipeline(files, tokenizer)
        floors, pipes = [*floors, seconds], [*pipes, built]
    if stats["corpus_tokens"] != tokens or stats["sentences"] != sentences:
        print(f"WARNING: floor saw {sentences} sentences / {tokens} tokens, the pipeline "
              f"{stats['sentences']} / {stats['corpus_tokens']}", file=sys.stderr)
    megabytes = sum(f.stat().st_size for f in files) / 1e6
    names = f"gutenberg ({sum('gutenberg' in str(f) for f in files)} books) + wikitext-2 test"
    print(f"floor = read + split into sentences + batched tokenisation ({len(files)} files); pipeline = "
          "build_pretraining_dataset(max_seq_length=128, dupe_factor=1, dynamic masking, num_proc=1); "
          f"best of {len(floors)} runs each\n")
    print("| corpus | MB | sentences | tokens | instances | floor s | pretrain-data s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {names} | {megabytes:.1f} | {sentences:,} | {tokens:,} | {stats['instances']:,} | {min(floors):.2f} "
          f"| {min(pipes):.2f} | {min(pipes) / min(floors):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
