# Command:
#   python recipes/table7_feature_based.py --model google-bert/bert-base-cased --data_dir CONLL_DIR \
#       --output_dir runs/table7 [--rows last_hidden concat_last_four ...] [--epochs 4] [--keep_features]
"""The rows of the paper's Table 7: CoNLL-2003 NER without fine-tuning. For each row, per-word
features of train and dev come from the frozen model's chosen layers (document context, each word
from its max-context window), a two-layer BiLSTM tagger is trained on them, and its best dev
entity F1 is reported next to the paper's. Writes OUTPUT/table7.md and table7.json; each row's
tagger folder holds all_results.json and predictions/dev.conll (the conlleval layout).

CONLL_DIR holds train.txt and valid.txt in the distributed format (IOB1 or IOB2). Features are
large (BERT-base, concat of four layers: about 2.5 GB for train), so they are deleted after each
row unless --keep_features.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import datasets

from bert_suite.cards import load_card
from bert_suite.feature_based import TABLE7_PAPER_DEV_F1, TABLE7_ROWS, extract_features, train_tagger
from bert_suite.io import atomic_write_text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a cased BERT checkpoint (folder or Hub id)")
    parser.add_argument("--data_dir", required=True, help="folder with train.txt and valid.txt")
    parser.add_argument("--output_dir", default="runs/table7")
    parser.add_argument("--tokenizer")
    parser.add_argument("--rows", nargs="+", choices=list(TABLE7_ROWS), default=list(TABLE7_ROWS))
    parser.add_argument("--context", choices=["document", "sentence"], default="document")
    parser.add_argument("--max_seq_length", type=int)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=768, help="LSTM units per direction")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--keep_features", action="store_true")
    args = parser.parse_args()

    card = load_card("conll2003")
    out = Path(args.output_dir)
    results = {}
    for row in args.rows:
        layers, pool = TABLE7_ROWS[row]
        folder = out / row
        for split, file in (("train", "train.txt"), ("dev", "valid.txt")):
            if not (folder / "features" / split / "dataset_info.json").is_file():
                print(f"[table7] {row}: extracting {split} features (layers {layers}, {pool})")
                extract_features(args.model, Path(args.data_dir) / file, folder / "features" / split, card, layers,
                                 pool, args.tokenizer, args.context, args.max_seq_length, args.batch_size)
        train, dev = (datasets.load_from_disk(str(folder / "features" / s)) for s in ("train", "dev"))
        result = train_tagger(train, dev, card.labels, folder / "tagger", args.epochs, args.learning_rate,
                              args.batch_size, args.hidden, args.seed)
        results[row] = {"dev_f1": 100 * result["eval_f1"], "paper_dev_f1": TABLE7_PAPER_DEV_F1[row],
                        "best_epoch": result["best_epoch"], "layers": layers, "pool": pool}
        print(f"[table7] {row}: dev F1 {results[row]['dev_f1']:.2f} (paper {TABLE7_PAPER_DEV_F1[row]})")
        if not args.keep_features:
            shutil.rmtree(folder / "features", ignore_errors=True)
    lines = [f"# Table 7, feature-based NER with {args.model} ({args.context} context)", "",
             "| row | layers | pool | dev F1 | paper dev F1 |", "|---|---|---|---:|---:|"]
    lines += [f"| {r} | {v['layers']} | {v['pool']} | {v['dev_f1']:.2f} | {v['paper_dev_f1']} |"
              for r, v in results.items()]
    atomic_write_text(out / "table7.md", "\n".join(lines) + "\n")
    atomic_write_text(out / "table7.json", json.dumps(results, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, OSError) as err:  # bad files, layers the model lacks: one line, as the CLI does
        print(f"table7: error: {err}", file=sys.stderr)
        sys.exit(2)
