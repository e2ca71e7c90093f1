# Command: .venv/bin/python benchmarks/pretrain_batches.py [--batch 128] [--workers 0 2] [--count 20]
"""How long the pre-training recipe takes to make one batch (`recipes/pretrain.py`'s loader: rows read,
padded, masked, counted, put in the static form a GPU step takes), in the main process and in worker
processes (`dataloader_num_workers`). On a GPU the step of a small model takes a few milliseconds
(benchmarks/RESULTS.md, issue 49): a batch made in the main process after each step is then what bounds
the run. Instances: `pretrain-data` at length 128 from the Brown Corpus sample of ../shared/data with the
released uncased vocabulary; skips cleanly without them. Median of --count batches after two warm-up ones."""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=common.DEFAULT_DATA)
    p.add_argument("--batch", type=int, default=128, help="the mini preset's batch")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--count", type=int, default=20)
    args = p.parse_args(argv)
    vocab, corpus = args.data / "vocab/bert-base-uncased/vocab.txt", args.data / "corpus/nltk/brown.txt"
    for path in (vocab, corpus):
        if not path.is_file():
            common.skip(f"{path} not found")
    import datasets
    import torch

    from bert_suite.pretraining.config import load_pretrain_config
    from bert_suite.pretraining.instances import build_pretraining_dataset
    from bert_suite.pretraining.masking import MaskingCollator
    from bert_suite.tokenization import load_pretraining_tokenizer

    spec = importlib.util.spec_from_file_location("pretrain_recipe", common.ROOT / "recipes" / "pretrain.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "corpus.txt"  # the first 2 MB of whole texts
        with open(corpus, encoding="utf-8") as source, open(text, "w", encoding="utf-8") as sample:
            for line in source:
                sample.write(line)
                if not line.strip() and sample.tell() > 2_000_000:
                    break
        build_pretraining_dataset([str(text)], str(vocab), f"{tmp}/data", max_seq_length=128, num_proc=1)
        data = datasets.load_from_disk(f"{tmp}/data")
        collator = MaskingCollator(load_pretraining_tokenizer(str(vocab)), max_predictions_per_seq=20)
        place = SimpleNamespace(process_index=0, num_processes=1, device=torch.device("cpu"))
        for workers in args.workers:
            cfg = load_pretrain_config(None, ["train_data=-", "tokenizer=-", "phase1_fraction=1"])
            stream = recipe.batches(data, collator, cfg, 0, 0, place, args.batch, (recipe.static_length(data), 20),
                                    workers)
            next(stream), next(stream)
            seconds = []
            for _ in range(args.count):
                start = time.perf_counter()
                next(stream)
                seconds.append(time.perf_counter() - start)
            rows.append({"workers": workers, "ms_per_batch": 1e3 * statistics.median(seconds),
                         "batches_per_s": 1 / statistics.median(seconds)})
    payload = {"machine": common.machine(), "batch": f"{args.batch} x 128", "instances": len(data), "rows": rows}
    common.write_result("pretrain_batches", payload)
    print(json.dumps(payload["machine"]))
    print(common.table(rows, [("workers", "workers"), ("ms_per_batch", "ms a batch"), ("batches_per_s", "batches/s")]))
    return payload


if __name__ == "__main__":
    main()
