"""The BERT paper's Table 5 (Section 5.1, "Effect of Pre-training Tasks") in miniature: three pre-trainings
that differ only in their objective, then `bert-suite compare` on the same grid, seeds and label subsets.

    .venv/bin/python benchmarks/table5_small.py --output_dir runs/table5      (= make table5)

Rows (the paper's names): MLM + NSP (BERT: `mlm_nsp`), No NSP (MLM only: `mlm`), LTR & No NSP (a left-to-right
LM predicting the next token: `ltr`), + BiLSTM (the LTR model with a randomly initialised BiLSTM between the
encoder and the head, fine-tuning only: `ltr_bilstm`), and the random twin (`mlm_nsp`'s config and vocabulary
with fresh weights: `random`) as a floor. Same corpus, vocabulary, size, steps, batch, schedule and seed for the
three pre-trainings: equal steps, not equal minutes (the LTR model predicts every token, so its steps are the
slowest; the steps are planned so that it fits --pretrain_minutes).

Stages, each resumed or skipped when done (rerun the command after a kill); OUT/stages/*.json record each
stage's settings and a stage made with others is refused:
  OUT/squad_small     `bert-suite squad-small` from ../shared/data/squad/dev-v1.1.json
  OUT/corpus          the shared corpora + the GLUE tasks' train texts, decontaminated against their dev and
                      test sets and SQuAD-small's dev articles (as benchmarks/pretrain_payoff.py)
  OUT/tokenizer, OUT/data64, OUT/data128   vocabulary and instances (--balance_nsp: NotNext share 0.5)
  OUT/calibration     a short LTR run: seconds per step, for the planned steps (unless --steps)
  OUT/pretrain/NAME   the recipe, once per objective
  OUT/compare_squad   `bert-suite compare` on SQuAD-small@3000 (3,000 training questions, about 8.4k windows
                      of 128 tokens an epoch) with its own grid (1e-3, 2 epochs), --workers processes sharing
                      its grids; first, since it is the task the table turns on
  OUT/compare         the same on MRPC, STS-B, RTE and SST-2@1000 (learning rates 3e-4 and 1e-3, 3 epochs)
Then --results_dir/NAME.json (the two compare.json merged, + "contrasts" (the paper's questions as paired
differences: bidirectional against LTR, NSP, BiLSTM, pre-training) + "pretraining" + "command"), NAME.md and NAME.png.
Reads ../shared/data; skips cleanly when it is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pretrain_payoff as payoff

ROOT = payoff.ROOT
BIN = payoff.BIN
OBJECTIVES = {  # name -> recipe overrides (Table 5's first three rows)
    "mlm_nsp": {},
    "mlm": {"use_nsp": "false"},
    "ltr": {"use_nsp": "false", "causal_attention": "true"},
}
CORPUS_TASKS = ["stsb", "mrpc", "rte", "cola", "sst2"]  # issue 27's corpus: these tasks' train texts
TASKS = ["squad_small@3000", "mrpc", "stsb", "sst2@1000", "rte"]  # the paper's columns first (RTE is not in Table 5)
MODELS = ("mlm_nsp", "mlm", "ltr", "ltr_bilstm", "random")
PAPER = {  # Table 5, BERT-BASE, dev: MNLI-m, QNLI, MRPC, SST-2 accuracy; SQuAD v1.1 F1
    "mlm_nsp": {"MNLI-m": 84.4, "QNLI": 88.4, "MRPC": 86.7, "SST-2": 92.7, "SQuAD": 88.5},
    "mlm": {"MNLI-m": 83.9, "QNLI": 84.9, "MRPC": 86.5, "SST-2": 92.6, "SQuAD": 87.9},
    "ltr": {"MNLI-m": 82.1, "QNLI": 84.3, "MRPC": 77.5, "SST-2": 92.1, "SQuAD": 77.8},
    "ltr_bilstm": {"MNLI-m": 82.1, "QNLI": 84.1, "MRPC": 75.7, "SST-2": 91.6, "SQuAD": 84.9},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="runs/table5", help="where every stage writes (resumable)")
    p.add_argument("--data", default=str(payoff.DEFAULT_DATA), help="the shared data folder (glue/, squad/, corpus/)")
    p.add_argument("--results_dir", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--name", default="table5_small", help="the record's file names: NAME.json, NAME.md, NAME.png")
    p.add_argument("--until", choices=["pretraining", "compare"], default="compare",
                   help="stop after this stage (default: the whole table)")
    g = p.add_argument_group("pre-training (the same for the three objectives)")
    g.add_argument("--model_size", default="tiny")
    g.add_argument("--vocab_size", type=int, default=8192)
    g.add_argument("--max_seq_length", type=int, default=64, help="phase-1 instance length")
    g.add_argument("--phase2_length", type=int, default=128, help="phase-2 instance length")
    g.add_argument("--phase2_fraction", type=float, default=0.1)
    g.add_argument("--dupe_factor", type=int, default=5)
    g.add_argument("--masking_rate", type=float, default=0.3, help="MLM: share of tokens predicted")
    g.add_argument("--batch_size", type=int, default=64)
    g.add_argument("--learning_rate", type=float, default=2e-3)
    g.add_argument("--warmup_fraction", type=float, default=0.06)
    g.add_argument("--pretrain_dropout", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--steps", type=int, help="optimizer steps of every pre-training (default: planned from a "
                   "calibration of the LTR model to fit --pretrain_minutes)")
    g.add_argument("--pretrain_minutes", type=float, default=60, help="the slowest objective's budget")
    g.add_argument("--budget_safety", type=float, default=0.85, help="share of the budget planned for steps")
    g.add_argument("--calibration_steps", type=int, default=40)
    g.add_argument("--eval_batches", type=int, default=20)
    g.add_argument("--mixed_precision", default="auto", choices=["auto", "no", "fp16", "bf16"])
    g.add_argument("--accelerate_config", help="default: recipes/configs/accelerate/cpu.yaml (gpu.yaml with CUDA)")
    g = p.add_argument_group("fine-tuning (bert-suite compare: the same grid, seeds and subsets for every model)")
    g.add_argument("--tasks", nargs="+", default=TASKS)
    g.add_argument("--seeds", nargs="+", default=["1", "2", "3", "4", "5"])
    g.add_argument("--learning_rates", nargs="+", default=["3e-4", "1e-3"])
    g.add_argument("--batch_sizes", nargs="+", default=["32"])
    g.add_argument("--epochs", nargs="+", default=["3"])
    g.add_argument("--ft_max_seq_length", type=int, default=128)
    g.add_argument("--squad_learning_rates", nargs="+", default=["1e-3"], help="SQuAD-small's grid (its fine-tuning "
                   "costs several times a GLUE task's: 2.8 windows of 128 tokens a question)")
    g.add_argument("--squad_epochs", nargs="+", default=["2"])
    g.add_argument("--workers", type=int, default=2, help="compare workers, one thread each")
    args = p.parse_args(argv)
    # what pretrain_payoff's stages read
    args.phase2, args.ngram, args.no_task_text, args.pretrain_override = True, 8, False, []
    return args


def pretraining_record(args, runs: dict[str, Path], data: dict[int, Path], steps: int) -> dict:
    """The record's "pretraining": per objective its steps, minutes, tokens (steps x batch x mean instance
    length per phase), held-out accuracy of the last evaluation (MLM accuracy at masked positions, or next-token
    accuracy for LTR: not comparable) and the NotNext share of the instances it was trained on."""
    phases = payoff.phase_steps(args, steps)
    stats = [payoff.data_stats(folder) for folder in data.values()]
    tokens = int(sum(s * b * st["mean_instance_length"] for (s, b), st in zip(phases, stats, strict=True)))
    share = sum(s * st["not_next_share"] for (s, _), st in zip(phases, stats, strict=True)) / steps
    record = {}
    for name, run in runs.items():
        last = payoff.evaluations(run / "metrics.jsonl")[-1]
        record[name] = {"steps": steps, "minutes": round(payoff.minutes_of(run), 2), "tokens": tokens,
                        "held_out_accuracy": last["eval_mlm_accuracy"],
                        "accuracy_kind": "next_token" if OBJECTIVES[name].get("causal_attention") else "mlm",
                        "not_next_share": round(share, 4)}
    return record


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    command = "python benchmarks/table5_small.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    data_root = Path(args.data)
    squad_dev = data_root / "squad" / "dev-v1.1.json"
    if not (data_root / "glue").is_dir() or not squad_dev.is_file():
        print(f"no GLUE folders or SQuAD dev set under {data_root}: skipping")
        return None
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = payoff.device_name()
    args.accelerate_config = args.accelerate_config or str(
        ROOT / "recipes" / "configs" / "accelerate" / ("cpu.yaml" if device.startswith("cpu") else "gpu.yaml"))

    # SQuAD-small: the task, and its dev articles for the decontamination
    small = out / "squad_small"
    payoff.check_stage(out, "squad_small", {"input": squad_dev}, (small / "split.json").is_file())
    if not (small / "split.json").is_file():
        payoff.run([BIN / "bert-suite", "squad-small", "--input", squad_dev, "--output_dir", small],
                   out / "logs" / "squad_small.log", "SQuAD-small")

    # Corpus, vocabulary, instances
    corpus, decontamination = payoff.clean_corpus(args, out, payoff.default_corpus(data_root), CORPUS_TASKS,
                                                  also_against=(small / "dev.json",))
    vocab = out / "tokenizer"
    payoff.check_stage(out, "tokenizer", {"input": corpus, "vocab_size": args.vocab_size, "lowercase": True},
                       (vocab / "vocab.txt").is_file())
    if not (vocab / "vocab.txt").is_file():
        payoff.run([BIN / "bert-suite", "tokenizer", "--input", *corpus, "--vocab_size", args.vocab_size,
                    "--lowercase", "--output_dir", vocab], out / "logs" / "tokenizer.log", "vocabulary")
    data = payoff.pretraining_data(args, out, corpus, vocab, balance_nsp=True)
    shares = {length: payoff.data_stats(folder)["not_next_share"] for length, folder in data.items()}
    print("[table5] NotNext share: " + ", ".join(f"{share:.3f} at {length}" for length, share in shares.items()))

    # Pre-training: equal steps, planned on the slowest objective (LTR)
    steps = args.steps
    if steps is None:
        per_step, _, overhead = payoff.calibrate(args, data, vocab, out / "calibration", **OBJECTIVES["ltr"])
        steps = max(1, int((args.pretrain_minutes * 60 - overhead) * args.budget_safety / per_step))
        print(f"[table5] {steps:,} steps for every objective (LTR: {per_step:.3f} s a step)")
    command += f" --steps {steps}" if "--steps" not in command else ""
    runs = {}
    for name, overrides in OBJECTIVES.items():
        run = out / "pretrain" / name
        payoff.pretrain(args, payoff.recipe_overrides(args, data, vocab, run, steps, args.learning_rate, **overrides),
                        run, steps, f"pre-training {name}")
        runs[name] = run
    pretraining = pretraining_record(args, runs, data, steps)
    for name, facts in pretraining.items():
        print(f"[table5] {name}: {facts['minutes']:.1f} minutes, held-out {facts['accuracy_kind']} accuracy "
              f"{100 * facts['held_out_accuracy']:.1f}%")
    over = [n for n, f in pretraining.items() if f["minutes"] > args.pretrain_minutes]
    if over:
        print(f"[table5] over the {args.pretrain_minutes:g}-minute budget: {', '.join(over)}")
    if args.until == "pretraining":
        return None

    # Fine-tuning: bert-suite compare, the same grid for every model (SQuAD-small's own: a window costs more)
    start = {name: payoff.fine_tuning_checkpoint(run / "final", args.model_size) for name, run in runs.items()}
    models = [f"mlm_nsp={start['mlm_nsp']}", f"mlm={start['mlm']}", f"ltr={start['ltr']}",
              f"ltr_bilstm=bilstm:{start['ltr']}", f"random=random:{start['mlm_nsp']}"]
    squad = [t for t in args.tasks if t.split("@")[0] == "squad_small"]
    glue = [t for t in args.tasks if t not in squad]
    parts = [("compare_squad", squad, args.squad_learning_rates, args.squad_epochs),  # first: the deciding task
             ("compare", glue, args.learning_rates, args.epochs)]
    results = {}
    for folder, tasks, rates, epochs in parts:
        if tasks:
            results[folder] = compare(args, out / folder, models, tasks, rates, epochs, small, data_root / "glue")
    record = merge([results[folder] for folder, tasks, _, _ in parts if tasks], args.tasks)
    record["contrasts"] = contrasts(record)
    record["pretraining"] = pretraining
    record["command"] = command
    grids = {folder: f"learning rates {' '.join(rates)}, batch {' '.join(args.batch_sizes)}, epochs {' '.join(epochs)}"
             for folder, _, rates, epochs in parts}
    record_dir = Path(args.results_dir)
    record_dir.mkdir(parents=True, exist_ok=True)
    (record_dir / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (record_dir / f"{args.name}.md").write_text(summary(record, decontamination, grids))
    from bert_suite.compare import plot

    plot(record, record_dir / f"{args.name}.png")
    print((record_dir / f"{args.name}.md").read_text())
    return record


def compare(args, out: Path, models: list[str], tasks: list[str], rates: list[str], epochs: list[str], small: Path,
            glue: Path) -> dict:
    """`bert-suite compare` in OUT with --workers processes of one thread each (tiny models use one core better
    than two: the grid hands each worker its own trials), each worker logging to OUT/../logs/NAME-wK.log."""
    cmd = [str(c) for c in [BIN / "bert-suite", "compare", "--model", *models, "--baseline", "mlm_nsp", "--task", *tasks,
                            "--data_dir", small, glue, "--seeds", *args.seeds, "--learning_rates", *rates,
                            "--batch_sizes", *args.batch_sizes, "--epochs", *epochs, "--max_seq_length",
                            args.ft_max_seq_length, *metrics_for(tasks), "--output_dir", out, "--disable_tqdm", "true"]]
    logs = out.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // args.workers))}
    print(f"[table5] {out.name} ({args.workers} workers): {shlex.join(cmd)}", flush=True)
    workers = []
    for k in range(args.workers):
        with open(logs / f"{out.name}-w{k}.log", "a") as log:
            workers.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
        time.sleep(5)  # the first creates the studies' databases
    codes = [w.wait() for w in workers]
    if any(codes):
        raise SystemExit(f"table5_small: {out.name} failed (exit codes {codes}); see {logs}/{out.name}-w*.log")
    return json.loads((out / "compare.json").read_text())


def metrics_for(tasks: list[str]) -> list[str]:
    """--metric for these tasks: the paper's Table 5 reports MRPC accuracy (the card selects on F1); none when
    every task keeps its card's metric (an empty --metric is an error)."""
    return ["--metric", "mrpc=accuracy"] if any(t.split("@")[0] == "mrpc" for t in tasks) else []


def merge(parts: list[dict], order: list[str]) -> dict:
    """One compare.json from comparisons of the same models, seeds and baseline on other tasks, tasks in `order`."""
    first = parts[0]
    for part in parts[1:]:
        if (part["baseline"], part["seeds"], part["models"]) != (first["baseline"], first["seeds"], first["models"]):
            raise SystemExit("table5_small: the comparisons to merge have other models, seeds or baseline")
    tasks = {key: entry for part in parts for key, entry in part["tasks"].items()}
    return {**first, "tasks": {key: tasks[key] for key in order}}


CONTRASTS = {  # name -> (first, second, what it asks): first minus second, paired by seed
    "bidirectional_mlm_nsp": ("mlm_nsp", "ltr", "MLM + NSP against LTR & No NSP (the title claim)"),
    "bidirectional_mlm": ("mlm", "ltr", "MLM only against LTR & No NSP"),
    "nsp": ("mlm_nsp", "mlm", "what NSP adds (MLM + NSP minus MLM only)"),
    "bilstm": ("ltr_bilstm", "ltr", "what the BiLSTM adds to the LTR model"),
    "pretraining": ("mlm_nsp", "random", "what pre-training adds (MLM + NSP minus its random twin)"),
}


def contrasts(record: dict) -> dict:
    """The paper's questions as paired differences per task (report.paired_comparison on the per-seed scores):
    {NAME: {"first", "second", "tasks": {TASK: {"difference", "se", "ci95", "verdict"}}}} for each of CONTRASTS
    whose two models the record has."""
    from bert_suite.report import paired_comparison

    out = {}
    for name, (first, second, _) in CONTRASTS.items():
        if first in record["models"] and second in record["models"]:
            out[name] = {"first": first, "second": second,
                         "tasks": {key: paired_comparison(entry["models"][first]["scores"],
                                                          entry["models"][second]["scores"])
                                   for key, entry in record["tasks"].items()}}
    return out


def goal(record: dict) -> dict:
    """Issue 36's goal: MLM + NSP and MLM only each ahead of LTR (> 2 SE of the paired difference) on SQuAD-small
    and on at least two of the GLUE tasks. {"met": bool, NAME: {"squad": bool, "glue_ahead": [TASK...]}}."""
    pairs, result = record.get("contrasts") or contrasts(record), {}
    for name in ("bidirectional_mlm_nsp", "bidirectional_mlm"):
        tasks = pairs[name]["tasks"]
        squad = [k for k in tasks if k.split("@")[0] == "squad_small"]
        result[name] = {"squad": bool(squad) and all(tasks[k]["verdict"] == "ahead" for k in squad),
                        "glue_ahead": [k for k in tasks if k not in squad and tasks[k]["verdict"] == "ahead"]}
    result["met"] = all(r["squad"] and len(r["glue_ahead"]) >= 2 for r in result.values())
    return result


def paired_section(record: dict) -> list[str]:
    """The contrasts as a table (questions as rows, tasks as columns) and the goal's verdict."""
    pairs = record.get("contrasts") or contrasts(record)
    if not pairs:
        return []
    tasks = list(record["tasks"])
    lines = ["## The paper's questions, paired by seed", "", "| question | " + " | ".join(tasks) + " |",
             "|---|" + "---:|" * len(tasks)]
    for name, pair in pairs.items():
        cells = [f"{d['difference']:+.1f} ± {d['se']:.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] {d['verdict']}"
                 for d in (pair["tasks"][t] for t in tasks)]
        lines.append(f"| {CONTRASTS[name][2]} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: first minus second, the mean over the paired seeds ± its SE [95% interval, t with n - 1 "
              "degrees of freedom], and the verdict at 2 SE."]
    if {"bidirectional_mlm_nsp", "bidirectional_mlm"} <= set(pairs):
        met = goal(record)
        lines[-1] += (" Goal (MLM + NSP and MLM only each ahead of LTR on SQuAD-small and on at least two GLUE "
                      "tasks): **" + ("met" if met["met"] else "not met") + "** ("
                      + "; ".join(f"{CONTRASTS[n][0]}: SQuAD-small {'ahead' if r['squad'] else 'not ahead'}, GLUE "
                                  f"ahead on {', '.join(r['glue_ahead']) or 'none'}"
                                  for n, r in met.items() if n != "met") + ").")
    return lines + [""]


def summary(record: dict, decontamination: dict | None = None, grids: dict | None = None) -> str:
    """The record's table (compare.md's shape: models as rows, tasks as columns), then the pre-training facts and
    the paper's Table 5 beside it."""
    from bert_suite.compare import markdown_table

    lines = ["# Table 5 in miniature", "", f"`{record['command']}`", "", *markdown_table(record), "",
             f"Mean ± standard error over seeds {', '.join(map(str, record['seeds']))} (0-100); in brackets the mean "
             f"per-seed difference from {record['baseline']} ± its SE and the verdict at 2 SE. Each model's setting "
             "is the one with the best mean dev score over the seeds (per-seed scores, settings and 95% intervals: "
             "the .json)."
             + ("" if not grids else " Grids: " + "; ".join(f"{k}: {v}" for k, v in grids.items()) + "."), "",
             *paired_section(record),
             "## Pre-training", "", "| model | steps | minutes | tokens | held-out accuracy | kind | NotNext share |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for name, f in record["pretraining"].items():
        lines.append(f"| {name} | {f['steps']:,} | {f['minutes']:.1f} | {f['tokens']:,} | "
                     f"{100 * f['held_out_accuracy']:.1f}% | {f['accuracy_kind']} | {f['not_next_share']:.3f} |")
    lines += ["", "MLM accuracy (at masked positions) and next-token accuracy are not comparable: the masked model "
              "sees both sides of the token it predicts, the left-to-right one only the left.", ""]
    if decontamination:
        lines += [f"Corpus: {decontamination['sentences_removed']:,} of {decontamination['sentences']:,} sentences "
                  f"removed by {decontamination['ngram']}-gram decontamination.", ""]
    lines += ["## The paper's Table 5 (BERT-BASE, dev)", "", "| model | MNLI-m | QNLI | MRPC | SST-2 | SQuAD F1 |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " |" for name, row in PAPER.items()]
    lines += ["", "MNLI and QNLI have no train sets in ../shared/data, so they are not measured here; SQuAD-small "
              "is not the official dev set (its scores are not comparable with the paper's)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
