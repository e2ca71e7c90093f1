"""LoRA against full fine-tuning on a real task, same checkpoint, data, seeds and epochs: trainable
parameters, time per step, peak memory (each run in its own process) and dev score.

    python benchmarks/lora_vs_full.py --model runs/demo/pretrain/final \\
        [--task sst2 --data_dir ../shared/data/glue/SST-2] [--lora_r 8] [--seeds 1 2 3]

The model is any checkpoint; `make demo` leaves a pre-trained tiny one in runs/demo/pretrain/final. Each
arm uses its own learning rate (LoRA's updates need a larger one: --lora_lr, --full_lr). Writes
runs/bench/lora_vs_full.json and prints a Markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEFAULT_DATA, machine, max_rss_mib, peak_memory_child, write_result  # noqa: E402


def child(argv: list[str]) -> None:
    """One fine-tuning run in this process; prints its results and this process's peak memory."""
    from bert_suite.cli import main

    out = Path(argv[argv.index("--output_dir") + 1])
    if main(argv) != 0:
        raise SystemExit(1)
    print(json.dumps({"results": json.loads((out / "all_results.json").read_text()), "peak_mib": max_rss_mib()}))


def run_arm(args, arm: str, seed: int) -> dict:
    out = Path(args.output_dir) / f"{arm}-seed{seed}"
    lr = args.lora_lr if arm == "lora" else args.full_lr
    argv = [args.task, "--model", args.model, "--tokenizer", args.tokenizer or args.model, "--data_dir", args.data_dir,
            "--output_dir", str(out), "--seed", str(seed), "--learning_rate", str(lr), "--num_train_epochs",
            str(args.epochs), "--per_device_train_batch_size", str(args.batch_size), "--max_seq_length",
            str(args.max_seq_length), "--save_strategy", "no", "--eval_strategy", "no", "--disable_tqdm", "true",
            "--precision", args.precision, "--report_to", "none"]
    if args.max_train_samples:
        argv += ["--max_train_samples", str(args.max_train_samples)]
    if arm == "lora":
        argv += ["--lora_r", str(args.lora_r)]
    got = peak_memory_child([__file__, "--child", "finetune", *argv], timeout=7200)
    results = got["results"]
    steps = math.ceil(results["train_samples"] / args.batch_size) * args.epochs
    record = {"seed": seed, "learning_rate": lr, "dev": results[f"eval_{args.metric}"],
              "trainable_parameters": results["trainable_parameters"], "parameters": results["parameters"],
              "seconds_per_step": results["train_runtime"] / steps, "train_runtime": results["train_runtime"],
              "peak_mib": got["peak_mib"]}
    print(f"[lora_vs_full] {arm} seed {seed}: {json.dumps(record)}", flush=True)
    return record


def summary(runs: list[dict]) -> dict:
    dev = [r["dev"] for r in runs]
    return {"dev_mean": statistics.fmean(dev), "dev_per_seed": dev,
            "trainable_parameters": runs[0]["trainable_parameters"], "parameters": runs[0]["parameters"],
            "seconds_per_step": statistics.median(r["seconds_per_step"] for r in runs),
            "peak_mib": max(r["peak_mib"] for r in runs)}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return {}
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="runs/demo/pretrain/final")
    p.add_argument("--tokenizer", help="default: the model's folder")
    p.add_argument("--task", default="sst2")
    p.add_argument("--data_dir", default=str(DEFAULT_DATA / "glue" / "SST-2"))
    p.add_argument("--metric", default="accuracy")
    p.add_argument("--max_train_samples", type=int)
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_seq_length", type=int, default=64)
    p.add_argument("--lora_r", type=int, default=8)
    p.add_argument("--lora_lr", type=float, default=1e-3)
    p.add_argument("--full_lr", type=float, default=1e-4)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--precision", default="auto")
    p.add_argument("--output_dir", default="runs/bench/lora_vs_full")
    p.add_argument("--name", default="lora_vs_full", help="the result file: runs/bench/NAME.json")
    args = p.parse_args(argv)
    if not args.model.startswith("preset:") and not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"{args.model}: no checkpoint there; run `make demo` first (it leaves runs/demo/pretrain/"
                         "final), or pass --model")
    runs = {"full": [], "lora": []}
    for seed in args.seeds:  # the arms alternate, so a slow stretch of the machine hits both
        for arm in runs:
            runs[arm].append(run_arm(args, arm, seed))
    diffs = [b["dev"] - a["dev"] for a, b in zip(runs["full"], runs["lora"], strict=True)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    payload = {"command": "python benchmarks/lora_vs_full.py " + " ".join(argv), "machine": machine(),
               "settings": {k: v for k, v in vars(args).items()},
               "full": summary(runs["full"]), "lora": summary(runs["lora"]), "runs": runs,
               "lora_minus_full": {"mean": statistics.fmean(diffs), "se": se, "per_seed": diffs}}
    path = write_result(args.name, payload)
    f, lo = payload["full"], payload["lora"]
    print(f"\n| | trainable parameters | s/step | peak memory | dev {args.metric} (mean of {len(args.seeds)} seeds) |")
    print("|---|---:|---:|---:|---:|")
    for name, s in (("full fine-tuning", f), (f"LoRA r={args.lora_r} (query, value)", lo)):
        print(f"| {name} | {s['trainable_parameters']:,} of {s['parameters']:,} | {s['seconds_per_step']:.4f} | "
              f"{s['peak_mib']:.0f} MiB | {100 * s['dev_mean']:.2f} |")
    print(f"\nLoRA - full: {100 * payload['lora_minus_full']['mean']:+.2f} points (SE {100 * se:.2f}); wrote {path}")
    return payload


if __name__ == "__main__":
    main()
