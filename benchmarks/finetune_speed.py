# Command: .venv/bin/python benchmarks/finetune_speed.py [--data ../shared/data] [--tasks rte mrpc] [--quick] [--profile]
"""Fine-tuning and prediction speed of our fine-tuning path vs the stock transformers GLUE recipe.

OURS = `bert-suite finetune`'s path: the runner's features (truncated to 128, unpadded), its
collator (dynamic padding), BertSuiteForSequenceClassification (unpad_inputs: dense layers on real
tokens only), runner.SuiteTrainer (training batches of similar length in random order; prediction
over length-sorted batches, outputs in dataset order) with runner.training_arguments. STOCK = the
transformers GLUE example's default: every example padded to 128, default_data_collator,
BertForSequenceClassification (sdpa), transformers.Trainer with the same arguments except the
training order, which is the stock random one. Same process, weights and threads; one untimed
warm-up each, then the two alternate; every timed epoch starts from the same initial weights, a
fresh optimizer and the same seed. Measured on real GLUE RTE/MRPC: one epoch of trainer.train()
and trainer.predict(dev) in examples/s (median) and ours/stock; real vs padded tokens; the dev
logits of both from the same weights (must agree); peak RSS per side in a child process; with
--profile, where one training step and one prediction batch spend their time. Skips (exit 0)
without the data. Result: runs/bench/<--out>.json.
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

SIDES = ("ours", "stock")
SEED = 42
MAX_LEN = 128
OVERRIDES = dict(num_train_epochs=1, per_device_train_batch_size=32, per_device_eval_batch_size=64, learning_rate=2e-5,
                 eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
                 seed=SEED, dataloader_num_workers=0)
SHOWN_ARGS = ("learning_rate", "warmup_steps", "weight_decay", "lr_scheduler_type", "optim", "train_sampling_strategy",
              "per_device_train_batch_size", "per_device_eval_batch_size", "num_train_epochs", "seed", "max_grad_norm",
              "remove_unused_columns", "dataloader_drop_last")


def parse(argv) -> argparse.Namespace:
    """Command-line options; --quick = the first 256 train examples (dev whole) and --repeats 3."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=common.DEFAULT_DATA, help="folder holding glue/RTE, glue/MRPC")
    p.add_argument("--vocab", type=Path, help="vocab.txt (default DATA/vocab/bert-base-uncased/vocab.txt)")
    p.add_argument("--tasks", nargs="+", default=["rte", "mrpc"])
    p.add_argument("--preset", default="mini")
    p.add_argument("--limit", type=int, help="first N train and first N dev examples only")
    p.add_argument("--repeats", type=int, default=3)
    for flag in ("--quick", "--no-memory", "--profile", "--bf16"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--out", default="finetune_speed", help="result name: runs/bench/NAME.json")
    p.add_argument("--memory-child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--task", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.vocab = args.vocab or args.data / "vocab" / "bert-base-uncased" / "vocab.txt"
    args.train_limit = args.limit or (256 if args.quick else None)
    args.repeats = 3 if args.quick else args.repeats
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


def build(task, args, tmp, sides=SIDES) -> SimpleNamespace:
    """Features, both models from the same initial weights, and one Trainer per side in `sides`."""
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
    models = {s: make[s]() for s in sides}  # a memory child builds its own side only
    keys = SimpleNamespace(missing_keys=[], unexpected_keys=[])
    if len(models) == 2:
        keys = models["stock"].load_state_dict(models["ours"].state_dict(), strict=False)
        if keys.missing_keys:
            raise RuntimeError(f"stock model: weights missing from ours' state_dict: {keys.missing_keys}")
    collators = {"ours": runner.adapter_for(card).collator(tok), "stock": transformers.default_data_collator}
    kinds = {"ours": (runner.SuiteTrainer, {}), "stock": (transformers.Trainer, {"train_sampling_strategy": "random"})}
    trainers = {s: kinds[s][0](model=models[s], data_collator=collators[s], processing_class=tok,
                               args=runner.training_arguments(card, f"{tmp}/{task}-{s}",
                                                              {**OVERRIDES, **kinds[s][1], "bf16": args.bf16}),
                               train_dataset=feats[s]["train"])
                for s in sides}
    for trainer in trainers.values():
        trainer.remove_callback(transformers.PrinterCallback)  # quiet: no end-of-training metrics print
    return SimpleNamespace(models=models, feats=feats, collators=collators, trainers=trainers,
                           initial={s: {k: v.clone() for k, v in models[s].state_dict().items()} for s in sides},
                           state_dict={"missing": keys.missing_keys, "unexpected": keys.unexpected_keys})


def train(setup, side) -> None:
    """One epoch from the initial weights with a fresh optimizer and the seed reset (same work every time)."""
    setup.models[side].load_state_dict(setup.initial[side])
    setup.trainers[side].optimizer = None  # Trainer keeps its optimizer (and Adam state) across train() calls
    transformers.set_seed(SEED)  # train() does not reseed: the same example order each time
    setup.trainers[side].train()


def predict(setup, side) -> np.ndarray:
    """trainer.predict over the dev split; the logits."""
    return setup.trainers[side].predict(setup.feats[side]["validation"]).predictions


def warm_up(setup) -> float:
    """Untimed: dev logits of both sides from the initial weights, then a short training run each.
    Returns the largest absolute difference of the logits."""
    logits = {}
    for side in SIDES:
        setup.models[side].load_state_dict(setup.initial[side])
        logits[side] = predict(setup, side)
        trainer = setup.trainers[side]
        full, trainer.train_dataset = trainer.train_dataset, first(trainer.train_dataset, 64)
        train(setup, side)
        trainer.train_dataset = full
    return float(np.abs(logits["ours"] - logits["stock"]).max())


def token_counts(setup, side) -> dict:
    """Examples, real and padded tokens of the batches the Trainer's dataloaders build (train: same seed)."""
    trainer = setup.trainers[side]
    transformers.set_seed(SEED)
    counts = {}
    for name, loader in (("train", trainer.get_train_dataloader()),
                         ("predict", trainer.get_test_dataloader(setup.feats[side]["validation"]))):
        examples = real = padded = 0
        for batch in loader:
            mask = batch["attention_mask"]
            examples, real, padded = examples + mask.shape[0], real + int(mask.sum()), padded + mask.numel()
        counts[name] = {"examples": examples, "real_tokens": real, "padded_tokens": padded, "real_share": real / padded}
    return counts


def profile(setup, side) -> dict:
    """Where one training step (32 examples, fused AdamW as Trainer's default) and one prediction batch (64) spend time."""
    model = setup.models[side]
    train_batch, dev_batch = (setup.collators[side](list(first(setup.feats[side][s], n).remove_columns("idx")))
                              for s, n in (("train", 32), ("validation", 64)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)

    def step():
        model.train()
        model(**train_batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    def forward():
        model.eval()
        with torch.no_grad():
            model(**dev_batch)

    step()  # warm-up: optimizer state, first-call costs
    forward()
    return {f"{side} train": common.profile_breakdown(step), f"{side} predict": common.profile_breakdown(forward)}


def measure(task, args, tmp) -> dict:
    """Everything for one task: timings, token counts, logit check, memory and profiles."""
    setup = build(task, args, tmp)
    shown = {s: {k: getattr(getattr(t.args, k), "value", getattr(t.args, k)) for k in SHOWN_ARGS}
             for s, t in setup.trainers.items()}
    result = {"training_arguments": shown,
              "state_dict": setup.state_dict, "logit_max_abs_diff": warm_up(setup)}
    for name, fn, split in (("train", train, "train"), ("predict", predict, "validation")):
        seconds = common.alternate({s: partial(fn, setup, s) for s in SIDES}, args.repeats)
        n, medians = len(setup.feats["ours"][split]), {s: common.median(seconds[s]) for s in SIDES}
        result[name] = {"examples": n, "seconds": seconds, "median_s": medians,
                        "examples_per_s": {s: n / medians[s] for s in SIDES}, "ratio": medians["stock"] / medians["ours"]}
    result["tokens"] = {s: token_counts(setup, s) for s in SIDES}
    if args.profile:
        result["profile"] = {k: v for s in SIDES for k, v in profile(setup, s).items()}
    if not args.no_memory:
        passed = ["--data", str(args.data), "--vocab", str(args.vocab), "--preset", args.preset, "--task", task]
        # The peak comes from the longest batches: a 128-example epoch (RTE and MRPC reach 128 tokens) will do.
        passed += ["--limit", str(min(args.limit or 128, 128))]
        result["memory"] = {s: common.peak_memory_child([str(Path(__file__).resolve()), "--memory-child", s, *passed])
                            for s in SIDES}
    return result


def memory_child(args, tmp) -> dict:
    """One side only: build, one epoch, one prediction; print peak and pre-training RSS (MiB) last."""
    setup = build(args.task, args, tmp, sides=(args.memory_child,))
    baseline = common.max_rss_mib()
    train(setup, args.memory_child)
    predict(setup, args.memory_child)
    out = {"peak_rss_mib": common.max_rss_mib(), "baseline_rss_mib": baseline}
    print(json.dumps(out))
    return out


def report(payload) -> None:
    """Markdown table, then per task: token shares, logit check, memory, training arguments, profiles."""
    rows = [{"task": task, "what": "fine-tuning epoch" if name == "train" else "predict dev", "n": r[name]["examples"],
             "ratio": r[name]["ratio"], **r[name]["examples_per_s"],
             **{f"{s} rss": m["peak_rss_mib"] for s, m in r.get("memory", {}).items()}}
            for task, r in payload["tasks"].items() for name in ("train", "predict")]
    print(common.table(rows, [("task", "task"), ("what", "measurement"), ("n", "examples"), ("ours", "ours ex/s"),
                              ("stock", "stock ex/s"), ("ratio", "ratio ours/stock"), ("ours rss", "peak RSS MiB ours"),
                              ("stock rss", "peak RSS MiB stock")]))
    print("(peak RSS: one child process per side, running one epoch and one prediction)")
    for task, r in payload["tasks"].items():
        counts = [(f"{name} {s}", r["tokens"][s][name]) for name in ("train", "predict") for s in SIDES]
        print(f"{task}: real/padded tokens: " + ", ".join(f"{k} {c['real_tokens']:,}/{c['padded_tokens']:,} "
                                                          f"({100 * c['real_share']:.0f}%)" for k, c in counts)
              + " (ours' dense layers run on the real tokens only)")
        print(f"{task}: dev logits, same weights: max |ours - stock| = {r['logit_max_abs_diff']:.2e} "
              f"({'OK' if r['logit_max_abs_diff'] < 1e-4 else 'MISMATCH'} at 1e-4)")
        if "memory" in r:
            peaks = {s: r["memory"][s]["peak_rss_mib"] for s in SIDES}
            print(f"{task}: peak RSS ours {peaks['ours']:.0f} MiB vs stock {peaks['stock']:.0f} MiB: "
                  f"ours {'<=' if peaks['ours'] <= peaks['stock'] else '>'} stock")
        print(f"{task}: TrainingArguments: {r['training_arguments']}")
        if "profile" in r:
            print(f"\n{task}, one step / batch:\n" + common.breakdown_table(r["profile"]))
    print(f"machine: {payload['machine']}")


def main(argv=None) -> dict:
    """Run the benchmark (or, with --memory-child, one side's memory run); returns the result."""
    args = parse(argv)
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
