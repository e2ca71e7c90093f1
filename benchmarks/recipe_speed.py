# Command: python benchmarks/recipe_speed.py [--device cuda|cpu] [--presets tiny mini base] [--corpus FILE] [--vocab FILE] [--steps 300] [--quick] [--out FILE]
"""The pre-training recipe's own speed, end to end: recipes/pretrain.py (loader, masks, step, logging) in a child
process a preset, on NSP instances built once from --corpus (default: the GPU bundle's) by bert_suite's pretrain-data
builder. Phase 1 only, --batch_size sequences of --seq_len a step (128 x 128: pretrain_step.py's CUDA rows), bf16 on
CUDA, no evaluation or checkpoint, a log line every tenth of the steps: the median `padded_tokens_per_second` and
`tokens_per_second` (real tokens) over the steady intervals (the first two, compilation and capture, dropped) and the
step form it printed (gpu_check_summary.py divides the padded figure by the step's). --quick: tiny, 10 steps, fp32.
Result: runs/bench/<--out>.json, written after each preset."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BUNDLE = common.ROOT / ".gpu-bundle" / "data"


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--presets", nargs="+", help="default: tiny mini base (--quick: tiny)")
    p.add_argument("--corpus", type=Path, default=BUNDLE / "corpus.txt")
    p.add_argument("--vocab", type=Path, default=BUNDLE / "vocab" / "bert-base-uncased" / "vocab.txt")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--batch_size", type=int, default=128, help="sequences a step (one process)")
    p.add_argument("--steps", type=int, help="default 300 (--quick: 10), a multiple of 10")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="recipe_speed", help="runs/bench/NAME.json or a path.json")
    args = p.parse_args(argv)
    args.presets, args.steps = args.presets or ["tiny", "mini", "base"][:1 if args.quick else 3], args.steps or (
        10 if args.quick else 300)
    return args if args.steps % 10 == 0 else p.error(f"--steps {args.steps}: a multiple of 10 (10 log lines)")


def run_recipe(args, preset: str, data: str, out: Path) -> dict:
    """recipes/pretrain.py with the preset's config for --steps steps; the medians over the steady intervals."""
    overrides = [f"train_data={data}", "train_data_phase2=null", "phase1_fraction=1", f"tokenizer={args.vocab}",
                 f"output_dir={out}", f"max_steps={args.steps}", "warmup_steps=10", "eval_fraction=0",
                 f"per_device_train_batch_size={args.batch_size}", f"logging_steps={args.steps // 10}",
                 f"save_steps={args.steps}", "report_to=none", f"mixed_precision={'bf16' if args.device == 'cuda' else 'no'}"]
    started = time.time()
    proc = subprocess.run([sys.executable, str(common.ROOT / "recipes" / "pretrain.py"), "--config",
                           str(common.ROOT / "recipes" / "configs" / "pretrain" / f"{preset}.yaml"), *overrides],
                          capture_output=True, text=True, env=common.child_env(args.device))
    found = {"exit": proc.returncode, "seconds": time.time() - started, "seq_len": args.seq_len, "batch": args.batch_size,
             "tokens_per_step": args.seq_len * args.batch_size, "step_form": next((
                 line.split("step:", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith("world size")
                 and "step:" in line), None)}
    steady = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][2:] \
        if (out / "metrics.jsonl").is_file() else []
    if proc.returncode or not steady:
        return {**found, "error": f"{len(steady)} steady log lines; {(proc.stderr or proc.stdout)[-1500:]}"}
    return {**found, "intervals": len(steady), **{key: common.median([line[key] for line in steady])
                                                  for key in ("padded_tokens_per_second", "tokens_per_second")}}


def main(argv=None) -> dict:
    args = parse(argv)
    from bert_suite.pretraining.instances import build_pretraining_dataset

    common.need((args.corpus, args.vocab), args.device == "cuda", " (make gpu-bundle writes it; or --corpus, --vocab)")
    payload = {"machine": common.machine(), "settings": {k: str(v) for k, v in vars(args).items()}, "presets": {}}
    with tempfile.TemporaryDirectory(prefix="recipe-speed-") as tmp:
        started = time.time()
        stats = build_pretraining_dataset([str(args.corpus)], str(args.vocab), f"{tmp}/data", args.seq_len,
                                          dupe_factor=2)
        payload["data"] = {"corpus": str(args.corpus), "instances": stats["instances"], "seconds": time.time() - started}
        if stats["instances"] < args.batch_size:
            raise SystemExit(f"recipe_speed: {args.corpus} gives {stats['instances']} instances of length {args.seq_len}, "
                             f"fewer than one batch of {args.batch_size}: the recipe's batches (StepBatches) need at "
                             "least one global batch; pass a larger --corpus or a smaller --batch_size")
        for preset in args.presets:
            payload["presets"][preset] = found = run_recipe(args, preset, f"{tmp}/data", Path(tmp) / preset)
            print(f"{preset}: {json.dumps(found)}; written: {common.write_result(args.out, payload)}", flush=True)
    return payload


if __name__ == "__main__":
    main()
