"""`make demo`: the whole paper in miniature, offline, on any machine with Python.

embedded corpus (stdlib documentation) -> WordPiece vocabulary -> NSP instances (128 and 512)
-> `accelerate launch recipes/pretrain.py` (tiny, two phases) -> fine-tuning grid on an embedded
task built from documents the model never saw -> pre-trained vs randomly initialised, with the
pre-training curves as plots.

The task (`tasks/demo/doc-intact.yaml`): is a sentence from the held-out modules' docs intact,
or were two of its words replaced by random words of that vocabulary? Telling needs a sense of
which words are plausible where, which masked-LM pre-training on the other modules gives and
two thousand labelled sentences do not. (A first design, "does sentence 2 follow sentence 1",
did not separate the two at this budget: NSP reaches only ~60% in 700 tiny steps.)
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from .io import atomic_write_text
from .pretraining.text_files import iter_documents

REPO = Path(__file__).resolve().parents[2]


def _documents(path: Path) -> list[list[str]]:
    """The held-out documents; whitespace runs (tabs included) become one space: the task files are TSV."""
    return [[" ".join(s.split()) for s in doc] for doc in iter_documents(str(path), "lines")]


def build_task(heldout: Path, out: Path, seed: int = 0, replaced: int = 2) -> dict:
    """train/dev/test TSVs of doc-intact: each sentence (6+ words) of the held-out documents, half
    of them with `replaced` words swapped for words drawn uniformly from the held-out vocabulary
    (so mostly rare ones). Documents never cross splits."""
    docs = [d for d in _documents(heldout) if len(d) >= 2]
    rng = random.Random(seed)
    rng.shuffle(docs)
    words = sorted({w for doc in docs for sentence in doc for w in sentence.split()})
    cut1, cut2 = int(0.6 * len(docs)), int(0.8 * len(docs))
    counts = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", docs[:cut1]), ("dev", docs[cut1:cut2]), ("test", docs[cut2:])):
        rows = []
        for sentence in (s for doc in part for s in doc):
            tokens = sentence.split()
            if len(tokens) < 6:
                continue
            if rng.random() < 0.5:
                for i in rng.sample(range(len(tokens)), replaced):
                    tokens[i] = rng.choice(words)
                rows.append((" ".join(tokens), "corrupted"))
            else:
                rows.append((sentence, "intact"))
        rng.shuffle(rows)
        labelled = name != "test"
        header = "index\tsentence" + ("\tlabel" if labelled else "")
        lines = [f"{i}\t{s}" + (f"\t{label}" if labelled else "") for i, (s, label) in enumerate(rows)]
        atomic_write_text(out / f"{name}.tsv", header + "\n" + "\n".join(lines) + "\n")
        counts[name] = len(rows)
    return counts


def _run(command: list[str], log: Path) -> None:
    """A step as a subprocess (as a user would run it); its output goes to a log, named on failure."""
    with open(log, "w") as f:
        done = subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"step failed ({' '.join(command)}); see {log}:\n{tail}")


def plot_pretraining(metrics_file: Path, out: Path) -> Path:
    from matplotlib.figure import Figure

    from .io import save_figure

    rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    fig = Figure(figsize=(11, 3.2), layout="constrained")
    panels = (("mlm_loss", "eval_mlm_loss", "MLM loss"), ("nsp_accuracy", "eval_nsp_accuracy", "NSP accuracy"),
              ("mlm_accuracy", "eval_mlm_accuracy", "MLM accuracy"))
    for n, (train_key, eval_key, title) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, 3, n)
        for key, label in ((train_key, "train"), (eval_key, "held-out")):
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o" if label == "held-out" else None, label=label)
        ax.set(title=title, xlabel="step")
        ax.legend()
    return save_figure(fig, out)


def verdict(pretrained: float, random_init: float, n: int) -> str:
    """The difference in points with its standard error (two independent accuracies on n items),
    so that a gap within the noise of a small dev set is not read as a win."""
    se = 100 * math.sqrt((pretrained * (1 - pretrained) + random_init * (1 - random_init)) / n)
    gap = 100 * (pretrained - random_init)
    word = "beats" if gap > 2 * se else "does not clearly beat" if gap > 0 else "does not beat"
    return (f"Pre-trained {word} random initialisation: {gap:+.1f} points, standard error of the difference "
            f"{se:.1f} (dev set of {n} sentences).")


def run_demo(output_dir: str = "runs/demo", max_steps: int | None = None, vocab_size: int = 8000,
             precision: str | None = None) -> str:
    """`precision` (auto, bf16, fp32; default auto): pre-training and fine-tuning both in bf16
    autocast where the CPU does bf16 natively, fp32 elsewhere (bert_suite.precision)."""
    from .cards import load_card
    from .grid import run_grid, search_space
    from .precision import resolve
    from .pretraining.corpus import build_embedded_corpus
    from .pretraining.instances import build_pretraining_dataset, format_stats
    from .pretraining.tokenizer import train_tokenizer

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen = resolve(precision)
    print(f"[demo] {chosen.describe()}", flush=True)
    started = time.time()
    timings = {}

    def step(name):
        timings[name] = time.time() - started - sum(timings.values())
        print(f"[demo] {name} done ({timings[name]:.0f} s)", flush=True)

    corpus = build_embedded_corpus(out / "corpus")
    print(f"[demo] corpus: {corpus}")
    step("corpus")
    train_tokenizer([str(out / "corpus" / "pretrain.txt")], vocab_size, True, str(out / "tokenizer"))
    step("tokenizer")
    # The paper's 128/512 phases shrink to 64/128 here: the demo task is about single sentences,
    # and 2 CPU cores get twice the sequences per minute (make pretrain keeps 128/512).
    for length in (64, 128):
        stats = build_pretraining_dataset([str(out / "corpus" / "pretrain.txt")], str(out / "tokenizer"),
                                          str(out / "data" / str(length)), max_seq_length=length,
                                          dupe_factor=5 if length == 64 else 1)
        print(format_stats(stats))
    step("instances")
    recipe = REPO / "recipes" / "pretrain.py"
    if not recipe.is_file():
        raise RuntimeError(f"{recipe} not found: run the demo from a bert_suite checkout (make demo)")
    steps = max_steps or 700
    overrides = [f"train_data={out / 'data' / '64'}", f"train_data_phase2={out / 'data' / '128'}",
                 f"tokenizer={out / 'tokenizer'}", f"output_dir={out / 'pretrain'}", "report_to=none",
                 f"max_steps={steps}", f"warmup_steps={max(1, steps // 10)}", "learning_rate=0.002",
                 "per_device_train_batch_size=64", "per_device_train_batch_size_phase2=32",
                 "max_predictions_per_seq=10", "max_predictions_per_seq_phase2=20", "eval_steps=200",
                 "resume_from_checkpoint=null", f"mixed_precision={'bf16' if chosen.bf16 else 'no'}"]
    _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
          str(REPO / "recipes" / "configs" / "accelerate" / "cpu.yaml"), str(recipe),
          "--config", str(REPO / "recipes" / "configs" / "pretrain" / "tiny.yaml"), *overrides], out / "pretrain.log")
    pretrain = json.loads((out / "pretrain" / "pretrain_results.json").read_text())
    plot = plot_pretraining(out / "pretrain" / "metrics.jsonl", out / "pretraining_curves.png")
    step("pre-training")

    task = build_task(out / "corpus" / "heldout.txt", out / "task")
    card = load_card("doc-intact")
    space = search_space(card)
    results = {}
    for label, model, tokenizer in (("pre-trained", str(out / "pretrain" / "final"), None),
                                    ("random init", "preset:tiny", str(out / "tokenizer"))):
        grid = run_grid(card, model, str(out / f"grid-{label.split()[0]}"), str(out / "task"), tokenizer,
                        space=space, overrides={"disable_tqdm": True}, precision=chosen)
        results[label] = grid["best"]["metrics"]["eval_accuracy"]
    step("fine-tuning")

    table = "\n".join([
        "# bert_suite demo: pre-trained vs randomly initialised (tiny, L2/H128)", "",
        f"Embedded corpus: {corpus['pretrain_documents']} stdlib modules/topics, {corpus['pretrain_sentences']} "
        f"sentences; task: doc-intact on {corpus['heldout_documents']} held-out documents "
        f"(train {task['train']}, dev {task['dev']} sentences; chance 50%).", "",
        "| model | doc-intact dev accuracy (best of grid) |", "|---|---:|",
        *(f"| {k} | {100 * v:.1f} |" for k, v in results.items()), "",
        verdict(results["pre-trained"], results["random init"], task["dev"]), "",
        f"Pre-training: {pretrain['step']} steps; held-out MLM perplexity "
        f"{pretrain.get('eval_mlm_perplexity', float('nan')):.1f}, NSP accuracy "
        f"{100 * pretrain.get('eval_nsp_accuracy', float('nan')):.1f}%. Curves: {plot}", "",
        f"Precision (pre-training and fine-tuning): {chosen.label} ({chosen.reason}).", "",
        "Time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + f"; total {time.time() - started:.0f} s.",
    ])
    atomic_write_text(out / "demo_results.md", table + "\n")
    atomic_write_text(out / "demo_results.json", json.dumps({"dev_accuracy": results, "pretraining": pretrain,
                                                              "task": task, "corpus": corpus, "timings": timings,
                                                              **chosen.record()},
                                                             indent=2, default=str))
    return table
