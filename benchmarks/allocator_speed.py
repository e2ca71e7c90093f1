# Command: .venv/bin/python benchmarks/allocator_speed.py [--presets tiny mini base] [--repeats 3] [--quick]
"""Training speed with glibc's allocator as it comes and as `bert_suite.allocator.tune()` sets it (what the
recipe and the runner do on a CPU; BERT_SUITE_ALLOCATOR=default turns it off).

Each measurement is a process of its own, started with BERT_SUITE_ALLOCATOR=default or without it, the two
alternating `--repeats` times:
- the pre-training step of `BertSuiteForPreTraining` (recipe settings: masked positions only, fused AdamW,
  clipping; the precision `auto` picks on this CPU) at each preset, on batches of 128 tokens that the parent
  builds once from WikiText-2 with the released uncased vocabulary (benchmarks/pretrain_step.py's batches and
  step): tokens a second over --steps steps after one warm-up step;
- a fine-tuning run, `bert-suite finetune rte` (mini, 512 RTE examples, one epoch; the runner's own path,
  where tune() is called): training examples a second from its all_results.json.
Result: runs/bench/<--out>.json and a table of medians with tuned / default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HERE = Path(__file__).resolve()
BATCH = {"tiny": 32, "mini": 32, "small": 32, "base": 16}
STEPS = {"tiny": 6, "mini": 6, "small": 4, "base": 3}
MODES = {"default": {"BERT_SUITE_ALLOCATOR": "default"}, "tuned": {}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=common.DEFAULT_DATA)
    p.add_argument("--presets", nargs="+", default=["tiny", "mini", "base"])
    p.add_argument("--repeats", type=int, default=3, help="processes per allocator setting and measurement")
    p.add_argument("--quick", action="store_true", help="2 repeats")
    p.add_argument("--no-finetune", dest="finetune", action="store_false")
    p.add_argument("--out", default="allocator_speed")
    p.add_argument("--child", nargs=2, metavar=("PRESET", "BATCHES"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 2
    return args


def child(preset: str, batches_file: str) -> None:
    """One process: build the model, tune the allocator unless told not to, time the steps; print tokens/s."""
    import torch

    from bert_suite.allocator import tune
    from bert_suite.precision import resolve

    memory = tune()
    batches = torch.load(batches_file)
    import pretrain_step

    _, ours, _ = pretrain_step.build_models(preset, int(batches[0]["vocab_size"]), only="ours")
    batches = [{k: v for k, v in b.items() if k != "vocab_size"} for b in batches]
    precision = resolve("auto")
    autocast = pretrain_step.bf16_autocast() if precision.bf16 else None
    run = pretrain_step.stepper(ours, batches, True, autocast)
    run(batches[:1])  # warm-up: the first step allocates everything once
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(json.dumps({"tokens_per_second": tokens / seconds, "allocator": memory["allocator"],
                      "precision": precision.label}))


def measure(cmd: list[str], mode: str) -> str:
    """Run `cmd` in a process of its own with the allocator `mode`; its standard output."""
    env = {k: v for k, v in os.environ.items() if k != "BERT_SUITE_ALLOCATOR"} | MODES[mode] | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise SystemExit(f"allocator_speed: {' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def finetune(args, tmp: Path, mode: str, number: int) -> dict:
    """`bert-suite finetune rte` in a process of its own: training examples a second."""
    out = tmp / f"ft-{mode}-{number}"
    vocab = args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    cmd = [str(Path(sys.executable).parent / "bert-suite"), "finetune", "rte", "--model", "preset:mini",
           "--tokenizer", str(vocab), "--data_dir", str(args.data / "glue" / "RTE"), "--max_train_samples", "512",
           "--max_eval_samples", "32", "--num_train_epochs", "1", "--output_dir", str(out), "--disable_tqdm", "true",
           "--save_strategy", "no"]
    measure(cmd, mode)
    results = json.loads((out / "all_results.json").read_text())
    return {"examples_per_second": results["train_samples"] / results["train_runtime"]}  # with its one dev pass


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        child(*args.child)
        return {}
    vocab = args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    corpus = args.data / "corpus" / "wikitext-2-raw" / "wiki.test.raw"
    for path in (vocab, corpus):
        if not path.is_file():
            common.skip(f"{path} not found (pass --data)")
    import pretrain_step
    import torch

    from bert_suite.tokenization import load_pretraining_tokenizer

    tokenizer = load_pretraining_tokenizer(str(vocab))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for preset in args.presets:
            batch_args = argparse.Namespace(corpus=corpus, seq_len=128)
            batches = pretrain_step.make_batches(batch_args, tokenizer, STEPS[preset], BATCH[preset])
            batches[0]["vocab_size"] = torch.tensor(len(tokenizer))
            torch.save(batches, tmp / f"{preset}.pt")
            found = {mode: [] for mode in MODES}
            for _ in range(args.repeats):
                for mode in MODES:
                    out = measure([sys.executable, str(HERE), "--child", preset, str(tmp / f"{preset}.pt")], mode)
                    found[mode].append(json.loads(out.strip().splitlines()[-1]))
            rows.append(row(f"pre-training step, {preset} ({BATCH[preset]} x 128, "
                            f"{found['tuned'][0]['precision']})", "tokens/s", found, "tokens_per_second"))
        if args.finetune:
            found = {mode: [] for mode in MODES}
            for number in range(args.repeats):
                for mode in MODES:
                    found[mode].append(finetune(args, tmp, mode, number))
            rows.append(row("fine-tuning, bert-suite finetune rte (mini, 512 examples, 1 epoch)", "examples/s", found,
                            "examples_per_second"))
    payload = {"machine": common.machine(), "repeats": args.repeats, "rows": rows,
               "settings": {k: str(v) for k, v in vars(args).items()}}
    common.write_result(args.out, payload)
    machine = payload["machine"]
    print(f"CPU: {machine['cpu']}, flags {' '.join(machine['flags'])}: {machine['kind']}")
    print(common.table(rows, [("what", "measurement"), ("unit", "unit"), ("default", "default (median)"),
                              ("tuned", "tuned (median)"), ("ratio", "tuned / default"), ("runs", "runs (default; tuned)")]))
    return payload


def row(what: str, unit: str, found: dict, key: str) -> dict:
    values = {mode: [r[key] for r in found[mode]] for mode in MODES}
    medians = {mode: statistics.median(v) for mode, v in values.items()}
    return {"what": what, "unit": unit, **medians, "ratio": medians["tuned"] / medians["default"],
            "runs": "; ".join(", ".join(f"{x:,.0f}" for x in values[mode]) for mode in MODES)}


if __name__ == "__main__":
    main()
