# Command (on a GPU machine): python benchmarks/gpu_recipe_check.py --data .gpu-bundle/data [--out FILE]
"""The pre-training recipe as a user runs it, on this machine's accelerator: `pretrain-data` on a small
bundled corpus (DATA/corpus.txt, one sentence per line, blank lines between documents) with the released
vocabulary (DATA/vocab/bert-base-uncased/vocab.txt), then `recipes/pretrain.py` with the mini preset's
config and its defaults (on CUDA: static step, compiled, CUDA graph) for --steps steps, uninterrupted; then
again, killed by SIGKILL after step --kill_at (a failpoint) and resumed from its checkpoint with the same
command. Reports the recipe's own tokens/s (its last logging interval, past compilation), the step form it
chose, and how far the resumed run's losses are from the uninterrupted run's (dropout on). --quick: tiny
model, a few steps, no kill (a test's run on the CPU). Result: --out (JSON)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, required=True, help="folder holding corpus.txt and vocab/bert-base-uncased")
    p.add_argument("--device", default="cuda", help="cuda, or cpu (then the recipe runs on the CPU)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--kill_at", type=int, default=200, help="SIGKILL after this step (checkpoints every 100)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "gpu_recipe_check.json")
    return p.parse_args(argv)


def recipe(out: Path, data: Path, vocab: Path, args, fail_at: int | None = None) -> tuple[int, list[dict], str]:
    """Run the recipe in a child process: (exit code, its metrics.jsonl, its output)."""
    overrides = [f"train_data={data}", "train_data_phase2=null", "phase1_fraction=1", f"tokenizer={vocab}",
                 f"output_dir={out}", f"max_steps={args.steps}", f"warmup_steps={min(10, args.steps)}", "report_to=none",
                 f"logging_steps={max(1, args.steps // 6)}", f"eval_steps={args.steps}", "eval_batches=2",
                 f"save_steps={max(1, args.kill_at // 2)}"]
    if args.quick:
        overrides += ["model_size=tiny", "per_device_train_batch_size=8", "mixed_precision=no"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if fail_at:
        env["BERT_SUITE_FAILPOINT"] = f"pretrain.step:{fail_at}"
    proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "pretrain.py"), "--config",
                           str(ROOT / "recipes" / "configs" / "pretrain" / "mini.yaml"), *overrides],
                          capture_output=True, text=True, env=env)
    metrics = out / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return proc.returncode, lines, proc.stdout + proc.stderr


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.quick:
        args.steps, args.kill_at = 4, 0
    from bert_suite.pretraining.instances import build_pretraining_dataset

    vocab = args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    corpus = args.data / "corpus.txt"
    for path in (vocab, corpus):
        if not path.is_file():
            raise SystemExit(f"gpu_recipe_check: {path} not found (make gpu-bundle writes it)")
    result: dict = {"steps": args.steps, "device": args.device}
    with tempfile.TemporaryDirectory(prefix="gpu-recipe-") as tmp:
        tmp = Path(tmp)
        started = time.time()
        stats = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp / "data"), max_seq_length=128,
                                          dupe_factor=1 if args.quick else 2, num_proc=1 if args.quick else None)
        result["data"] = {"instances": stats.get("instances"), "seconds": time.time() - started}
        started = time.time()
        code, whole, output = recipe(tmp / "whole", tmp / "data", vocab, args)
        result["uninterrupted"] = {"exit": code, "seconds": time.time() - started, "last": whole[-1] if whole else None}
        form = [line for line in output.splitlines() if line.startswith("world size") and "step:" in line]
        result["step_form"] = form[0].split("step:", 1)[1].strip() if form else None
        if code != 0:
            result["error"] = output[-3000:]
        elif whole:
            result["tokens_per_second"] = whole[-1]["tokens_per_second"]
        if code == 0 and args.kill_at:
            killed, _, _ = recipe(tmp / "killed", tmp / "data", vocab, args, fail_at=args.kill_at + 1)
            code, resumed, output = recipe(tmp / "killed", tmp / "data", vocab, args)
            save = max(1, args.kill_at // 2)
            resumed_from = args.kill_at // save * save  # the last checkpoint before the kill
            both = {line["step"]: line for line in whole}
            pairs = [(both[line["step"]], line) for line in resumed if line["step"] in both and line["step"] > resumed_from]
            result["resume"] = {"killed_exit": killed, "exit": code, "resumed_from": resumed_from,
                                "steps_compared": [a["step"] for a, _ in pairs],
                                "max_mlm_loss_diff": max((abs(a["mlm_loss"] - b["mlm_loss"]) for a, b in pairs),
                                                         default=None),
                                "max_nsp_loss_diff": max((abs(a["nsp_loss"] - b["nsp_loss"]) for a, b in pairs),
                                                         default=None)}
            if code != 0:
                result["resume"]["error"] = output[-3000:]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "error"}, default=str))
    if "error" in result:
        print(result["error"], file=sys.stderr)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
