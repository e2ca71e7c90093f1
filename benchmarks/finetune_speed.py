# Command: .venv/bin/python benchmarks/finetune_speed.py [--device cpu|cuda] [--data ../shared/data] [--tasks rte mrpc] [--quick] [--profile] [--precisions fp32 bf16] [--grid]
"""Fine-tuning and prediction speed of our fine-tuning path vs the stock transformers GLUE recipe.

OURS = `bert-suite finetune`'s path: the runner's features (truncated to 128, unpadded), collator (dynamic padding),
BertSuiteForSequenceClassification (dense layers on real tokens only) and SuiteTrainer (batches of similar length in
random order; prediction over length-sorted batches). STOCK = the transformers GLUE example: every example padded to
128, default_data_collator, BertForSequenceClassification (sdpa), transformers.Trainer with the same arguments but
the random order. One process, the same weights and threads; a warm-up each (ours: a whole epoch, timed: the first
epoch, compilation and capture included, over the steady median), then the runs alternate, every epoch from the same
weights, a fresh optimizer and seed. On GLUE RTE/MRPC: an epoch of trainer.train() and trainer.predict(dev) in
examples/s (median) and ours/stock, in each of --precisions (TrainingArguments' bf16); real vs padded tokens; the dev
logits from the same weights (must agree); peak RSS per side in a child process; --profile: where a training step and
a prediction batch spend their time. --device cpu (use_cpu, even beside a GPU) or cuda (and peak GPU memory).
--grid: a subset of the paper's RTE grid (--learning_rates x --batch_sizes, --epochs, seed 1) by `bert-suite grid rte`
with its defaults, against a loop of stock runs over the same points, a process a point as a user runs run_glue.py
(the stock side above, TrainingArguments' defaults but the point's, dev scored each epoch), both from one folder of
random --preset weights and the --vocab tokenizer, in one of --precisions (bf16 on CUDA): seconds from the start to
the last dev score (ours: its study's last trial) and stock / ours. Skips (exit 0) without the data or the device.
Result: runs/bench/<--out>.json (--grid: written after each side)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
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


def side_of(run: str) -> str:  # runs: "ours", "stock" (fp32), "ours bf16", "stock bf16"
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
    p.add_argument("--grid", action="store_true", help="bert-suite grid rte against a loop of stock runs")
    p.add_argument("--learning_rates", nargs="+", type=float, default=[5e-5, 3e-5, 2e-5], help="--grid's")
    p.add_argument("--batch_sizes", nargs="+", type=int, default=[16, 32], help="--grid's")
    p.add_argument("--epochs", type=int, default=2, help="--grid's")
    p.add_argument("--memory-child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--stock-point", nargs=3, metavar=("MODEL", "LR", "BATCH"), help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.grid or args.stock_point:
        if len(args.precisions or ["one"]) > 1:
            p.error("--grid runs in one of --precisions")
        args.tasks, args.precisions = ["rte"], args.precisions or ["bf16" if args.device == "cuda" else "fp32"]
    args.vocab = args.vocab or args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    args.train_limit = args.limit or (256 if args.quick else None)
    args.repeats = 3 if args.quick else args.repeats
    if args.precisions is None:
        from bert_suite.precision import native_bf16_flag

        emulated = args.device == "cpu" and native_bf16_flag() is None
        args.precisions = ["fp32"] if args.quick and emulated else ["fp32", "bf16"]
    args.runs = [side if p == "fp32" else f"{side} {p}" for p in args.precisions for side in SIDES]
    return args


def first(dataset, n):
    """The first n rows (all when n is None)."""
    return dataset.select(range(min(n, len(dataset)))) if n else dataset


def padded(rows, tok, card):
    """The stock GLUE example's features: every example padded to 128."""
    return rows.map(lambda b: tok(*[b[c] for c in card.text_columns], padding="max_length", max_length=MAX_LEN,
                                  truncation=True), batched=True, remove_columns=list(card.text_columns))


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
        feats["stock"] = {s: padded(first(prep.raw[s], n), tok, card) for s, n in limits.items()}
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
    kinds = {"ours": (runner.SuiteTrainer, {}), "stock": (transformers.Trainer, {"train_sampling_strategy": "random"})}
    def overrides(run):  # TrainingArguments' bf16 (and use_cpu, which bf16 needs without a GPU), as the runner sets them
        values = {**OVERRIDES, **kinds[side_of(run)][1], "use_cpu": args.device == "cpu"}
        runner.apply_precision(values, Precision(precision_of(run), "--precisions"))
        return values

    collators, trainers = {}, {}
    for r in runs:  # each run's arguments, then its Trainer (which sets up accelerate's state for its precision)
        arguments = runner.training_arguments(card, f"{tmp}/{task}-{r.replace(' ', '-')}", overrides(r))
        # ours pads as `bert-suite finetune` does on this device (to a multiple of runner.LENGTH_BUCKET on CUDA)
        collators[r] = runner.batch_collator(runner.adapter_for(card), tok, arguments, MAX_LEN) \
            if side_of(r) == "ours" else transformers.default_data_collator
        trainers[r] = kinds[side_of(r)][0](model=models[r], data_collator=collators[r], processing_class=tok,
                                           args=arguments, train_dataset=feats[side_of(r)]["train"])
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


def warm_up(setup, device) -> tuple[dict, dict]:
    """Before the timed runs: ours' first epoch, timed (compilation, capture, first shapes: what a user's first epoch
    pays), stock a short training run; then the dev logits of every run from the initial weights. Returns the
    seconds of ours' first epoch per run and the largest |ours - stock| of the logits per precision."""
    logits, first_epoch = {}, {}
    for run in setup.runs:
        trainer = setup.trainers[run]
        full = trainer.train_dataset
        if side_of(run) == "stock":
            trainer.train_dataset = first(full, 64)
        (seconds,) = common.alternate({run: partial(train, setup, run)}, 1, device)[run]
        trainer.train_dataset = full
        if side_of(run) == "ours":
            first_epoch[run] = seconds
        setup.models[run].load_state_dict(setup.initial[run])
        logits[run] = predict(setup, run)
    return first_epoch, {precision_of(r): float(np.abs(logits[r] - logits[r.replace("ours", "stock")]).max())
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
    train_batch, dev_batch = ({k: v.to(model.device) for k, v in setup.collators[run](
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
    first_epoch, diffs = warm_up(setup, args.device)
    result = {"training_arguments": shown, "state_dict": setup.state_dict, "logit_max_abs_diff": diffs}
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
    # ours' first epoch (the process's first) against its steady ones (the median above), per precision
    result["train"]["first_epoch_s"] = first_epoch
    result["train"]["first_over_steady"] = {precision_of(r): s / result["train"]["median_s"][r]
                                            for r, s in first_epoch.items()}
    # per side, from its runs of the first precision (the batches do not depend on the precision)
    result["tokens"] = {side_of(r): token_counts(setup, r) for r in runs if precision_of(r) == precision_of(runs[0])}
    if args.profile:
        result["profile"] = {k: v for r in runs for k, v in profile(setup, r).items()}
    if not args.no_memory:
        # The peak comes from the longest batches: a 128-example epoch (RTE and MRPC reach 128 tokens) will do.
        passed = ["--data", str(args.data), "--vocab", str(args.vocab), "--preset", args.preset, "--task", task,
                  "--device", args.device, "--limit", str(min(args.limit or 128, 128))]
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
    print(json.dumps(out := {"peak_rss_mib": common.max_rss_mib(), "baseline_rss_mib": baseline, **(
        {"peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20} if args.device == "cuda" else {})}))
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
        print(f"{task}: ours' first epoch over a steady one: " + ", ".join(
            f"{p} {v:.2f}x" for p, v in r["train"]["first_over_steady"].items()))
        print(f"{task}: TrainingArguments: {r['training_arguments']}")
        if "profile" in r:
            print(f"\n{task}, one step / batch:\n" + common.breakdown_table(r["profile"]))
    print(f"machine: {payload['machine']}")


def grid_stock_point(args) -> dict:
    """One stock run of --grid, in a process of its own: prints the time of its last dev score and the scores."""
    model, lr, batch = args.stock_point
    card, tok = load_card("rte"), transformers.AutoTokenizer.from_pretrained(model)
    train, dev = (padded(first(runner.adapter_for(card).load_split(card, split, str(args.data / "glue" / "RTE"), False),
                               args.limit), tok, card) for split in (card.train_split, card.eval_splits[0]))
    transformers.set_seed(1)
    trainer = transformers.Trainer(
        model=transformers.BertForSequenceClassification.from_pretrained(model, num_labels=2),
        args=transformers.TrainingArguments(
            output_dir=f"{model}-{lr}-{batch}", learning_rate=float(lr), per_device_train_batch_size=int(batch),
            num_train_epochs=args.epochs, eval_strategy="epoch", save_strategy="no", logging_strategy="epoch", seed=1,
            report_to="none", bf16=args.precisions == ["bf16"], use_cpu=args.device == "cpu", disable_tqdm=True),
        train_dataset=train, eval_dataset=dev, data_collator=transformers.default_data_collator,
        compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
    trainer.train()
    print(json.dumps(found := {"last_score_at": time.time(), "scores": [
        e["eval_accuracy"] for e in trainer.state.log_history if "eval_accuracy" in e]}))
    return found


def grid(args, tmp: str) -> dict:
    """--grid: `bert-suite grid rte`, then the loop of stock runs (grid_stock_point), from one saved model."""
    import optuna

    model, out, limit = Path(tmp) / "model", Path(tmp) / "grid", [f"--limit={args.limit}"] if args.limit else []
    tok = transformers.BertTokenizerFast(vocab_file=str(args.vocab), do_lower_case=True)
    torch.manual_seed(0)
    transformers.BertForPreTraining(transformers.BertConfig(**BertSuiteConfig.from_preset(
        args.preset, vocab_size=len(tok)).to_bert_dict())).save_pretrained(model)
    tok.save_pretrained(model)
    env, payload = common.child_env(args.device), {"machine": common.machine(), "precision": args.precisions[0],
                                                   "settings": {k: str(v) for k, v in vars(args).items()}}
    started, points = time.time(), len(args.learning_rates) * len(args.batch_sizes)
    proc = subprocess.run([sys.executable, "-m", "bert_suite", "grid", "rte", "--model", str(model), "--data_dir",
                           str(args.data / "glue" / "RTE"), "--tokenizer", str(model), "--output_dir", str(out),
                           "--learning_rates", *map(str, args.learning_rates), "--batch_sizes",
                           *map(str, args.batch_sizes), "--epochs", str(args.epochs), "--seeds", "1", "--precision",
                           args.precisions[0], *[f"--max_{s}_samples={args.limit}" for s in ("train", "eval") if limit]],
                          capture_output=True, text=True, env=env)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    done = [] if proc.returncode else optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'grid.db'}") \
        .get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < points:  # a failed trial is a line in the grid's output, not an exit code
        common.write_result(args.out, {**payload, "ours": {"error": proc.stderr[-3000:]}})
        raise SystemExit(f"finetune_speed --grid: bert-suite grid (exit {proc.returncode}) completed {len(done)} of "
                         f"{points} points:\n{proc.stderr[-3000:]}")
    payload["ours"] = {"seconds": max(t.datetime_complete.timestamp() for t in done) - started,
                       "wall_s": time.time() - started, "points": [{**t.params, "score": t.value} for t in done]}
    started, runs = time.time(), []
    for lr, batch in ((lr, batch) for lr in args.learning_rates for batch in args.batch_sizes):
        common.write_result(args.out, payload)  # a step cut short keeps what it measured
        runs.append({"learning_rate": lr, "per_device_train_batch_size": batch, **common.run_child(
            [__file__, "--stock-point", str(model), str(lr), str(batch), "--device", args.device, "--data",
             str(args.data), "--epochs", str(args.epochs), "--precisions", args.precisions[0], *limit], env=env)})
        payload["stock"] = {"seconds": runs[-1]["last_score_at"] - started, "points": runs}
    payload["ratio"] = payload["stock"]["seconds"] / payload["ours"]["seconds"]
    print(f"grid of {points} points, {args.precisions[0]}, seconds to the last dev score: ours (bert-suite grid) "
          f"{payload['ours']['seconds']:.1f}, the stock loop {payload['stock']['seconds']:.1f}; stock / ours "
          f"{payload['ratio']:.2f}; written: {common.write_result(args.out, payload)}")
    return payload


def main(argv=None) -> dict:
    """Run the benchmark (or, with --memory-child, one side's memory run); returns the result."""
    args = parse(argv)
    tasks = [args.task] if args.memory_child else args.tasks
    common.need([*(args.data / "glue" / load_card(t).data_folder / f"{s}.tsv" for t in tasks for s in ("train", "dev")),
                 args.vocab], args.device == "cuda")
    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")  # CPU: pinning is a no-op
    if args.stock_point:
        return grid_stock_point(args)
    with tempfile.TemporaryDirectory(prefix="finetune-speed-") as tmp:
        if args.memory_child or args.grid:
            return (memory_child if args.memory_child else grid)(args, tmp)
        settings = {k: v for k, v in vars(args).items() if k not in ("memory_child", "task")}
        payload = {"machine": common.machine(), "settings": settings,
                   "tasks": {task: measure(task, args, tmp) for task in args.tasks}}
    report(payload)
    print(f"written: {common.write_result(args.out, payload)}")
    return payload


if __name__ == "__main__":
    main()
