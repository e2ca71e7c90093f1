# Command: .venv/bin/python benchmarks/finetune_speed.py [--device cpu|cuda] [--data ../shared/data] [--tasks rte mrpc] [--quick] [--profile] [--precisions fp32 bf16]
"""Fine-tuning and prediction speed of our fine-tuning path vs the stock transformers GLUE recipe.

OURS = `bert-suite finetune`'s path: the runner's features (truncated to 128, unpadded), its collator (dynamic
padding), BertSuiteForSequenceClassification (dense layers on real tokens only), runner.SuiteTrainer (training
batches of similar length in random order; prediction over length-sorted batches). STOCK = the transformers GLUE
example's default: every example padded to 128, default_data_collator, BertForSequenceClassification (sdpa),
transformers.Trainer, the same arguments but the stock random order. Same process, weights and threads; one untimed
warm-up each, then the runs alternate, every timed epoch from the same weights, a fresh optimizer and the same seed.
On real GLUE RTE/MRPC: one epoch of trainer.train() and trainer.predict(dev) in examples/s (median) and ours/stock;
real vs padded tokens; the dev logits of both from the same weights (must agree); peak RSS per side in a child
process; --profile: where a training step and a prediction batch spend their time. Every side in every precision
of --precisions (default fp32 and bf16, TrainingArguments' bf16), all runs alternating. --device cpu (default:
use_cpu, even beside a GPU) or cuda (and the peak GPU memory). Skips (exit 0) without the data or the device.
Result: runs/bench/<--out>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only; before transformers is imported
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from bert_suite import runner  # noqa: E402
from bert_suite.cards import load_card  # noqa: E402
from bert_suite.configuration_bert_suite import BertSuiteConfig  # noqa: E402
from bert_suite.modeling_bert_suite import BertSuiteForSequenceClassification  # noqa: E402
from bert_suite.precision import Precision  # noqa: E402

SIDES = ("ours", "stock")


def side_of(run: str) -> str:
    """A run's side and precision: "ours", "stock" (fp32), "ours bf16", "stock bf16"."""
    return run.split()[0]


def precision_of(run: str) -> str:
    return run.split()[1] if " " in run else "fp32"


SEED = 42
MAX_LEN = 128
OVERRIDES = dict(num_train_epochs=1, per_device_train_batch_size=32, per_device_eval_batch_size=64, learning_rate=2e-5,
                 eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
                 seed=SEED, dataloader_num_workers=0)
SHOWN_ARGS = ("learning_rate", "warmup_steps", "weight_decay", "lr_scheduler_type", "optim", "train_sampling_strategy",
              "per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs", "seed", "max_grad_norm",
              "remove_unused_columns", "dataloader_drop_last", "bf16")


def parse(argv) -> argparse.Namespace:
    """Command-line options; --quick = the first 256 train examples (dev whole) and --repeats 3."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=common.DEFAULT_DATA, help="folder holding glue/RTE, glue/MRPC")
    p.add_argument("--vocab", type=Path, help="vocab.txt (default DATA/vocab/bert-base-uncased/vocab.txt)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--tasks", nargs="+", default=["rte", "mrpc"])
    p.add_argument("--preset", default="mini")
    p.add_argument("--limit", type=int, help="first N train and first N dev examples only")
    p.add_argument("--repeats", type=int, default=3)
    for flag in ("--quick", "--no-memory", "--profile"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"],
                   help="each side runs in each (bf16: TrainingArguments' bf16 autocast); default fp32 and bf16, "
                   "fp32 only with --quick on a CPU without native bf16 (make bench-full measures it there)")
    p.add_argument("--out", default="finetune_speed", help="result name: runs/bench/NAME.json (or a path.json)")
    p.add_argument("--memory-child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.vocab = args.vocab or args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    args.train_limit = args.limit or (256 if args.quick else None)
    args.repeats = 3 if args.quick else args.repeats
    if args.precisions is None:
        from bert_suite.precision import native_bf16_flag

        emulated = args.device == "cpu" and native_bf16_flag() is None
        args.precisions = ["fp32"] if args.quick and emulated else ["fp32", "bf16"]
    args.runs = [side if p == "fp32" else f"{side} {p}" for p in args.precisions for side in SIDES]
    return args


def check_data(args, tasks) -> None:
    """Skip (exit 0) naming the first missing file."""
    tsvs = [args.data / "glue" / load_card(t).data_folder / f"{s}.tsv" for t in tasks for s in ("train", "dev")]
    for path in [*tsvs, args.vocab]:
        if not path.is_file():
            common.skip(f"{path} not found")


def first(dataset, n):
    """The first n rows (all when n is None)."""
    return dataset.select(range(min(n, len(dataset)))) if n else dataset


def build(task, args, tmp, runs=None) -> SimpleNamespace:
    """Features, a model per run from the same initial weights (accelerate's bf16 wraps a model's forward
    in place, so each precision has its own), and one Trainer per run in `runs`."""
    runs = runs or args.runs
    sides = sorted({side_of(r) for r in runs}, key=SIDES.index)
    card = load_card(task)
    prep = runner.prepare(card, f"preset:{args.preset}", str(args.data / "glue" / card.data_folder), str(args.vocab), MAX_LEN)
    tok, limits = prep.tokenizer, {"train": args.train_limit, "validation": args.limit}
    feats = {"ours": {s: first(prep.encoded[s], n) for s, n in limits.items()}}
    if "stock" in sides:
        def pad_to_128(batch):
            return tok(*[batch[c] for c in card.text_columns], padding="max_length", max_length=MAX_LEN, truncation=True)
        feats["stock"] = {s: first(prep.raw[s], n).map(pad_to_128, batched=True, remove_columns=list(card.text_columns))
                          for s, n in limits.items()}
    torch.manual_seed(0)
    config = BertSuiteConfig.from_preset(args.preset, vocab_size=len(tok), num_labels=2)
    make = {"ours": lambda: BertSuiteForSequenceClassification(config),
            "stock": lambda: transformers.BertForSequenceClassification(
                transformers.BertConfig(**config.to_bert_dict(), attn_implementation="sdpa"))}
    first_ours = make["ours"]()
    models = {r: first_ours if r == "ours" else make[side_of(r)]() for r in runs}  # a memory child: its run only
    keys = SimpleNamespace(missing_keys=[], unexpected_keys=[])
    for run, model in models.items():
        if model is not first_ours:
            keys = model.load_state_dict(first_ours.state_dict(), strict=False)
            if keys.missing_keys:
                raise RuntimeError(f"{run} model: weights missing from ours' state_dict: {keys.missing_keys}")
    collators = {"ours": runner.adapter_for(card).collator(tok), "stock": transformers.default_data_collator}
    kinds = {"ours": (runner.SuiteTrainer, {}), "stock": (transformers.Trainer, {"train_sampling_strategy": "random"})}
    def overrides(run):  # TrainingArguments' bf16 (and use_cpu, which bf16 needs without a GPU), as the runner sets them
        values = {**OVERRIDES, **kinds[side_of(run)][1], "use_cpu": args.device == "cpu"}
        runner.apply_precision(values, Precision(precision_of(run), "--precisions"))
        return values

    trainers = {r: kinds[side_of(r)][0](
        model=models[r], data_collator=collators[side_of(r)], processing_class=tok,
        args=runner.training_arguments(card, f"{tmp}/{task}-{r.replace(' ', '-')}", overrides(r)),
        train_dataset=feats[side_of(r)]["train"]) for r in runs}
    for trainer in trainers.values():
        trainer.remove_callback(transformers.PrinterCallback)  # quiet: no end-of-training metrics print
    return SimpleNamespace(models=models, feats=feats, collators=collators, trainers=trainers, runs=runs,
                           initial={r: {k: v.clone() for k, v in models[r].state_dict().items()} for r in runs},
                           state_dict={"missing": keys.missing_keys, "unexpected": keys.unexpected_keys})


def train(setup, run) -> None:
    """One epoch from the initial weights with a fresh optimizer and the seed reset (same work every time)."""
    setup.models[run].load_state_dict(setup.initial[run])
    setup.trainers[run].optimizer = None  # Trainer keeps its optimizer (and Adam state) across train() calls
    transformers.set_seed(SEED)  # train() does not reseed: the same example order each time
    setup.trainers[run].train()


def predict(setup, run) -> np.ndarray:
    """trainer.predict over the dev split; the logits."""
    return setup.trainers[run].predict(setup.feats[side_of(run)]["validation"]).predictions


def warm_up(setup) -> float:
    """Untimed: dev logits of every run from the initial weights, then a short training run each.
    Returns the largest absolute difference of ours' and stock's logits in each precision."""
    logits = {}
    for run in setup.runs:
        setup.models[run].load_state_dict(setup.initial[run])
        logits[run] = predict(setup, run)
        trainer = setup.trainers[run]
        full, trainer.train_dataset = trainer.train_dataset, first(trainer.train_dataset, 64)
        train(setup, run)
        trainer.train_dataset = full
    return {precision_of(r): float(np.abs(logits[r] - logits[r.replace("ours", "stock")]).max())
            for r in setup.runs if side_of(r) == "ours"}


def token_counts(setup, side) -> dict:
    """Examples, real and padded tokens of the batches the Trainer's dataloaders build (train: same seed)."""
    trainer, counts = setup.trainers[side], {}
    transformers.set_seed(SEED)
    for name, loader in (("train", trainer.get_train_dataloader()),
                         ("predict", trainer.get_test_dataloader(setup.feats[side]["validation"]))):
        examples = real = padded = 0
        for batch in loader:
            mask = batch["attention_mask"]
            examples, real, padded = examples + mask.shape[0], real + int(mask.sum()), padded + mask.numel()
        counts[name] = {"examples": examples, "real_tokens": real, "padded_tokens": padded, "real_share": real / padded}
    return counts


def profile(setup, run) -> dict:
    """Where one training step (32 examples, fused AdamW as Trainer's default) and one prediction batch (64) spend
    time (the model's forward is the Trainer's, so bf16 runs under its autocast)."""
    side, model = side_of(run), setup.models[run]
    train_batch, dev_batch = ({k: v.to(model.device) for k, v in setup.collators[side](
        list(first(setup.feats[side][s], n).remove_columns("idx"))).items()}
        for s, n in (("train", 32), ("validation", 64)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
    autocast = torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=precision_of(run) == "bf16")

    def step():
        model.train()
        with autocast:
            loss = model(**train_batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def forward():
        model.eval()
        with torch.no_grad(), autocast:
            model(**dev_batch)

    step()  # warm-up: optimizer state, first-call costs
    forward()
    return {f"{run} train": common.profile(step, model.device), f"{run} predict": common.profile(forward, model.device)}


def measure(task, args, tmp) -> dict:
    """Everything for one task: timings, token counts, logit check, memory and profiles."""
    setup = build(task, args, tmp)
    shown = {s: {k: getattr(getattr(t.args, k), "value", getattr(t.args, k)) for k in SHOWN_ARGS}
             for s, t in setup.trainers.items()}
    result = {"training_arguments": shown, "state_dict": setup.state_dict, "logit_max_abs_diff": warm_up(setup)}
    runs = setup.runs
    for name, fn, split in (("train", train, "train"), ("predict", predict, "validation")):
        seconds = common.alternate({r: partial(fn, setup, r) for r in runs}, args.repeats, args.device)
        n, medians = len(setup.feats["ours"][split]), {r: common.median(seconds[r]) for r in runs}
        ratios = {p: medians[r.replace("ours", "stock")] / medians[r] for r in runs if side_of(r) == "ours"
                  for p in [precision_of(r)]}  # ours / stock (speed), per precision
        result[name] = {"examples": n, "seconds": seconds, "median_s": medians,
                        "examples_per_s": {r: n / medians[r] for r in runs}, "ratio": ratios.get("fp32"),
                        "ratio_by_precision": ratios,
                        "bf16_over_fp32": {s: medians[s] / medians[f"{s} bf16"] for s in SIDES
                                           if s in medians and f"{s} bf16" in medians}}
    # per side, from its runs of the first precision (the batches do not depend on the precision)
    result["tokens"] = {side_of(r): token_counts(setup, r) for r in runs if precision_of(r) == precision_of(runs[0])}
    if args.profile:
        result["profile"] = {k: v for r in runs for k, v in profile(setup, r).items()}
    if not args.no_memory:
        passed = ["--data", str(args.data), "--vocab", str(args.vocab), "--preset", args.preset, "--task", task,
                  "--device", args.device]
        # The peak comes from the longest batches: a 128-example epoch (RTE and MRPC reach 128 tokens) will do.
        passed += ["--limit", str(min(args.limit or 128, 128))]
        result["memory"] = {r: common.run_child([str(Path(__file__).resolve()), "--memory-child", side_of(r),
                                                "--precisions", precision_of(r), *passed]) for r in runs}
    return result


def memory_child(args, tmp) -> dict:
    """One side only: build, one epoch, one prediction; print peak and pre-training RSS (MiB) last (on CUDA, and
    the peak GPU memory)."""
    (run,) = [r for r in args.runs if side_of(r) == args.memory_child]
    setup = build(args.task, args, tmp, runs=[run])
    baseline = common.max_rss_mib()
    train(setup, run)
    predict(setup, run)
    out = {"peak_rss_mib": common.max_rss_mib(), "baseline_rss_mib": baseline}
    if args.device == "cuda":
        out["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print(json.dumps(out))
    return out


def report(payload) -> None:
    """Markdown table (examples/s per run, ours/stock per precision, bf16/fp32 per side), then per task:
    token shares, logit checks, memory, training arguments, profiles."""
    runs = payload["settings"]["runs"]
    rows = [{"task": task, "what": "fine-tuning epoch" if name == "train" else "predict dev",
             "n": r[name]["examples"], **r[name]["examples_per_s"],
             **{f"ratio {p}": v for p, v in r[name]["ratio_by_precision"].items()},
             **{f"{s} bf16/fp32": v for s, v in r[name]["bf16_over_fp32"].items()},
             **{f"{run} rss": m["peak_rss_mib"] for run, m in r.get("memory", {}).items()}}
            for task, r in payload["tasks"].items() for name in ("train", "predict")]
    precisions = payload["settings"]["precisions"]
    columns = [("task", "task"), ("what", "measurement"), ("n", "examples"), *[(run, f"{run} ex/s") for run in runs],
               *[(f"ratio {p}", f"ours/stock {p}") for p in precisions],
               *[(f"{s} bf16/fp32", f"{s} bf16/fp32") for s in SIDES if len(precisions) == 2],
               *[(f"{run} rss", f"peak MiB {run}") for run in runs]]
    print(common.table(rows, columns))
    print("(peak RSS: one child process per run, running one epoch and one prediction)")
    for task, r in payload["tasks"].items():
        counts = [(f"{name} {s}", r["tokens"][s][name]) for name in ("train", "predict") for s in r["tokens"]]
        print(f"{task}: real/padded tokens: " + ", ".join(f"{k} {c['real_tokens']:,}/{c['padded_tokens']:,} "
                                                          f"({100 * c['real_share']:.0f}%)" for k, c in counts)
              + " (ours' dense layers run on the real tokens only)")
        for p, diff in r["logit_max_abs_diff"].items():
            limit = 1e-4 if p == "fp32" else 2e-2  # bf16: stock rounds its logits to bf16, ours keeps them fp32
            print(f"{task}: dev logits {p}, same weights: max |ours - stock| = {diff:.2e} "
                  f"({'OK' if diff < limit else 'MISMATCH'} at {limit:g})")
        if "memory" in r:
            for p in precisions:
                run = "ours" if p == "fp32" else f"ours {p}"
                peaks = {s: r["memory"][run.replace("ours", s)]["peak_rss_mib"] for s in SIDES}
                print(f"{task}: peak RSS {p}: ours {peaks['ours']:.0f} MiB vs stock {peaks['stock']:.0f} MiB: "
                      f"ours {'<=' if peaks['ours'] <= peaks['stock'] else '>'} stock")
        print(f"{task}: TrainingArguments: {r['training_arguments']}")
        if "profile" in r:
            print(f"\n{task}, one step / batch:\n" + common.breakdown_table(r["profile"]))
    print(f"machine: {payload['machine']}")


def main(argv=None) -> dict:
    """Run the benchmark (or, with --memory-child, one side's memory run); returns the result."""
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        common.skip("no CUDA device here (--device cpu measures the CPU)")
    check_data(args, [args.task] if args.memory_child else args.tasks)
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")  # CPU: pinning is a no-op
    with tempfile.TemporaryDirectory(prefix="finetune-speed-") as tmp:
        if args.memory_child:
            return memory_child(args, tmp)
        settings = {k: v for k, v in vars(args).items() if k not in ("memory_child", "task")}
        payload = {"machine": common.machine(), "settings": settings,
                   "tasks": {task: measure(task, args, tmp) for task in args.tasks}}
    report(payload)
    print(f"written: {common.write_result(args.out, payload)}")
    return payload


if __name__ == "__main__":
    main()
