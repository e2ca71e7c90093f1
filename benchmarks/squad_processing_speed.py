# Command: .venv/bin/python benchmarks/squad_processing_speed.py [--data ../shared/data] [--repeat 3]
"""SQuAD pre- and post-processing time on the full official v1.1 dev set (10,570 questions).

Reading: the JSON file -> questions (validated). Pre-processing: questions -> evaluation features (windows of 384
tokens, doc_stride 128, questions cut to 64 tokens, offsets and max-context flags), with the released vocabulary.
Logits: one forward pass of a random `tiny` BertSuiteForQuestionAnswering over every feature (not timed as
processing). Post-processing: logits -> n-best 20 spans a question (at most 30 tokens) -> answer texts, then the
official-equivalent scorer. Each stage runs --repeat times (datasets' cache off); the median with features per
second. A sanity line scores the first gold answers as the predictions (100 / 100). Skips (exit 0) without the file.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def timed(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=128, help="forward batch for the logits")
    args = parser.parse_args()
    dev = args.data / "squad" / "dev-v1.1.json"
    vocab = args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    if not (dev.is_file() and vocab.is_file()):
        print(f"skipping: {dev} or {vocab} not found")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets
    import numpy as np
    import torch
    import transformers

    from bert_suite.adapters import squad
    from bert_suite.cards import load_card
    from bert_suite.configuration_bert_suite import BertSuiteConfig
    from bert_suite.metrics import squad as scorer
    from bert_suite.modeling_bert_suite import BertSuiteForQuestionAnswering
    from bert_suite.tokenization import wordpiece_tokenizer

    datasets.disable_caching()
    datasets.disable_progress_bars()
    card = load_card("squad")
    tokenizer = wordpiece_tokenizer(vocab)
    read_s, (examples, _) = timed(lambda: squad.read_squad_json(dev), args.repeat)
    pre_s, features = timed(lambda: squad.preprocess(examples, card, tokenizer, 384, train=False), args.repeat)

    torch.manual_seed(0)
    model = BertSuiteForQuestionAnswering(BertSuiteConfig.from_preset("tiny", vocab_size=len(tokenizer))).eval()
    inputs = features.select_columns(["input_ids", "token_type_ids", "attention_mask"])
    start_logits = np.full((len(features), 384), -100.0, dtype=np.float32)
    end_logits = start_logits.copy()
    forward_start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(inputs), args.batch_size):
            batch = tokenizer.pad(inputs[i:i + args.batch_size], return_tensors="pt")
            out = model(**batch)
            rows, width = out.start_logits.shape
            start_logits[i:i + rows, :width] = out.start_logits.numpy()
            end_logits[i:i + rows, :width] = out.end_logits.numpy()
    forward_s = time.perf_counter() - forward_start

    post_s, result = timed(lambda: squad.postprocess(examples, features, start_logits, end_logits, 20, 30), args.repeat)
    gold = scorer.gold_from_examples(examples.select_columns(["id", "answers"]))
    score_s, scores = timed(lambda: scorer.evaluate_v1(gold, result["predictions"]), args.repeat)
    sanity = scorer.evaluate_v1(gold, {g["id"]: g["answers"][0] for g in gold})

    n = len(features)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}")
    print(f"command: {' '.join(sys.argv)}")
    print(f"questions {len(examples):,}, features {n:,} (windows of 384, doc_stride 128)")
    print("| stage | median s | features/s |\n|---|---:|---:|")
    for name, seconds in (("read + validate JSON", read_s), ("pre-process (tokenise, windows)", pre_s),
                          ("post-process (n-best, texts)", post_s), ("score (official-equivalent)", score_s)):
        print(f"| {name} | {seconds:.2f} | {n / seconds:,.0f} |")
    print(f"(tiny model forward for the logits, not processing: {forward_s:.1f} s)")
    print(f"tiny random model: EM {scores['exact_match']:.2f} F1 {scores['f1']:.2f}; "
          f"first gold answer as prediction: EM {sanity['exact_match']:.2f} F1 {sanity['f1']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
