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
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .io import atomic_write_text
from .pretraining.text_files import iter_documents
from .report import choose_setting, one_checkpoint, paired_difference, seed_scores, seeded_comparison

REPO = Path(__file__).resolve().parents[2]
HELDOUT_SHARE = 0.3  # of the stdlib's documents, kept out of pre-training for the task
TASK_SHARES = (0.3, 0.55)  # of the held-out sentences: train, dev (the rest: test)
VOCAB_SIZE = 8000
PRETRAIN_STEPS = 2000
# A short run learns faster with dropout off (as cramming and MosaicBERT pre-train) and 30% of the
# tokens masked (more predictions per sequence; Wettig et al. 2023): held-out MLM accuracy after
# 600 steps rose from 13.2% to 15.6%. Fine-tuning puts the preset's dropout back (see run_demo).
PRETRAIN_OVERRIDES = ["learning_rate=0.002", "per_device_train_batch_size=64", "per_device_train_batch_size_phase2=32",
                      "hidden_dropout_prob=0", "attention_probs_dropout_prob=0", "mlm_probability=0.3",
                      "max_predictions_per_seq=20", "max_predictions_per_seq_phase2=40"]
FINETUNE_DROPOUT = 0.1  # the tiny preset's, for both models


def _documents(path: Path) -> list[list[str]]:
    """The held-out documents; whitespace runs (tabs included) become one space: the task files are TSV."""
    return [[" ".join(s.split()) for s in doc] for doc in iter_documents(str(path), "lines")]


def build_task(heldout: Path, out: Path, seed: int = 0, replaced: int = 2,
               shares: tuple[float, float] = TASK_SHARES) -> dict:
    """train/dev/test TSVs of doc-intact: each sentence (6+ words) of the held-out documents, half
    of them with `replaced` words swapped for words drawn uniformly from the held-out vocabulary
    (so mostly rare ones). Documents never cross splits: in a shuffled order, they go to train
    until `shares[0]` of the sentences are there, then to dev until `shares[0] + shares[1]`, then
    to test (few labels, a large dev set: the regime where pre-training should show)."""
    docs = [d for d in _documents(heldout) if len(d) >= 2]
    rng = random.Random(seed)
    rng.shuffle(docs)
    words = sorted({w for doc in docs for sentence in doc for w in sentence.split()})
    total = sum(len(d) for d in docs)
    parts: dict[str, list] = {"train": [], "dev": [], "test": []}
    train_end, dev_end = round(shares[0] * total), round((shares[0] + shares[1]) * total)
    before = 0
    for doc in docs:
        parts["train" if before < train_end else "dev" if before < dev_end else "test"].append(doc)
        before += len(doc)
    counts = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, part in parts.items():
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


def verdict(pretrained: list[float], random_init: list[float], n: int) -> str:
    """The mean paired difference in points with its standard error and 95% interval, so that a gap within the
    noise of fine-tuning is not read as a win: "beats" only when the interval lies above zero (`seeded_comparison`:
    one pre-training, so a verdict about this checkpoint)."""
    seeds = list(range(1, len(pretrained) + 1))
    found = seeded_comparison(one_checkpoint([100 * v for v in pretrained], seeds),
                              one_checkpoint([100 * v for v in random_init], seeds))
    gap, se, (low, high) = found["difference"], found["se"], found["ci95"]
    word = "beats" if found["verdict"] == "ahead" else "does not clearly beat" if gap > 0 else "does not beat"
    return (f"Pre-trained {word} random initialisation: {gap:+.1f} points (mean paired difference over "
            f"{len(pretrained)} seeds), standard error {se:.1f}, 95% interval [{low:+.1f}, {high:+.1f}] (dev set of "
            f"{n:,} sentences).")


def _setting_text(setting: tuple) -> str:
    lr, batch, epochs = setting
    return f"lr {lr:g}, batch {batch}, {epochs:g} epochs"


def run_demo(output_dir: str = "runs/demo", max_steps: int | None = None, vocab_size: int = VOCAB_SIZE,
             precision: str | None = None, seeds: list[int] | None = None, max_train_samples: int | None = None) -> str:
    """`precision` (auto, bf16, fp32; default auto): pre-training and fine-tuning both in bf16
    autocast where the CPU does bf16 natively, fp32 elsewhere (bert_suite.precision). `max_steps`,
    `seeds` (default: the card's, 1 2 3) and `max_train_samples` (the first N task sentences) make
    a quicker, smaller demo (the tests)."""
    from .cards import load_card
    from .grid import run_grid, search_space
    from .precision import resolve
    from .pretraining.corpus import build_embedded_corpus
    from .pretraining.instances import build_pretraining_dataset, format_stats
    from .pretraining.tokenizer import train_tokenizer

    if seeds is not None and len(seeds) < 2:
        raise ValueError(f"seeds {seeds}: the verdict pairs the models seed by seed and needs two or more")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    chosen = resolve(precision)
    print(f"[demo] {chosen.describe()}", flush=True)
    started = time.time()
    timings = {}

    def step(name):
        timings[name] = time.time() - started - sum(timings.values())
        print(f"[demo] {name} done ({timings[name]:.0f} s)", flush=True)

    corpus = build_embedded_corpus(out / "corpus", heldout_share=HELDOUT_SHARE)
    print(f"[demo] corpus: {corpus}")
    step("corpus")
    train_tokenizer([str(out / "corpus" / "pretrain.txt")], vocab_size, True, str(out / "tokenizer"))
    step("tokenizer")
    # The paper's 128/512 phases shrink to 64/128 here: the demo task is about single sentences,
    # and 2 CPU cores get twice the sequences per minute (make pretrain keeps 128/512).
    instances = {}
    for length in (64, 128):
        stats = build_pretraining_dataset([str(out / "corpus" / "pretrain.txt")], str(out / "tokenizer"),
                                          str(out / "data" / str(length)), max_seq_length=length,
                                          dupe_factor=5 if length == 64 else 1)
        print(format_stats(stats))
        instances[length] = {k: stats[k] for k in ("instances", "not_next_share", "mean_instance_length")}
    step("instances")
    recipe = REPO / "recipes" / "pretrain.py"
    if not recipe.is_file():
        raise RuntimeError(f"{recipe} not found: run the demo from a bert_suite checkout (make demo)")
    steps = max_steps or PRETRAIN_STEPS
    overrides = [f"train_data={out / 'data' / '64'}", f"train_data_phase2={out / 'data' / '128'}",
                 f"tokenizer={out / 'tokenizer'}", f"output_dir={out / 'pretrain'}", "report_to=none",
                 f"max_steps={steps}", f"warmup_steps={max(1, steps // 10)}", f"eval_steps={max(1, steps // 10)}",
                 "resume_from_checkpoint=null", f"mixed_precision={'bf16' if chosen.bf16 else 'no'}",
                 *PRETRAIN_OVERRIDES]
    _run([sys.executable, "-m", "accelerate.commands.launch", "--config_file",
          str(REPO / "recipes" / "configs" / "accelerate" / "cpu.yaml"), str(recipe),
          "--config", str(REPO / "recipes" / "configs" / "pretrain" / "tiny.yaml"), *overrides], out / "pretrain.log")
    pretrain = json.loads((out / "pretrain" / "pretrain_results.json").read_text())
    # Both models fine-tune with the same configuration: the preset's dropout, off only while pre-training.
    config_file = out / "pretrain" / "final" / "config.json"
    config = json.loads(config_file.read_text())
    config.update(hidden_dropout_prob=FINETUNE_DROPOUT, attention_probs_dropout_prob=FINETUNE_DROPOUT)
    atomic_write_text(config_file, json.dumps(config, indent=2, sort_keys=True) + "\n")
    plot = plot_pretraining(out / "pretrain" / "metrics.jsonl", out / "pretraining_curves.png")
    step("pre-training")

    task = build_task(out / "corpus" / "heldout.txt", out / "task")
    card = load_card("doc-intact")
    space = search_space(card, seed=seeds)
    seeds = list(space["seed"])
    chosen_settings, per_seed = {}, {}
    for label, model, tokenizer in (("pre-trained", str(out / "pretrain" / "final"), None),
                                    ("random init", "preset:tiny", str(out / "tokenizer"))):
        grid_dir = out / f"grid-{label.split()[0]}"
        # A finished study in the folder would hand back the previous run's scores for this new checkpoint.
        shutil.rmtree(grid_dir, ignore_errors=True)
        grid = run_grid(card, model, str(grid_dir), str(out / "task"), tokenizer, space=space,
                        overrides={"disable_tqdm": True}, precision=chosen, max_samples={"train": max_train_samples})
        scores = seed_scores(grid["records"], "eval_accuracy")
        chosen_settings[label] = choose_setting(scores, seeds)
        if chosen_settings[label] is None:
            raise RuntimeError(f"{label}: no grid setting finished on every seed {seeds}; see {grid_dir / 'grid_results.md'}")
        per_seed[label] = [scores[chosen_settings[label]][s] for s in seeds]
    step("fine-tuning")

    means = {k: sum(v) / len(v) for k, v in per_seed.items()}
    mean, se = paired_difference(per_seed["pre-trained"], per_seed["random init"])
    table = "\n".join([
        "# bert_suite demo: pre-trained vs randomly initialised (tiny, L2/H128)", "",
        f"Embedded corpus: {corpus['pretrain_documents']} stdlib modules/topics, {corpus['pretrain_sentences']:,} "
        f"sentences; task: doc-intact on {corpus['heldout_documents']} held-out documents "
        f"(train {task['train']:,}, dev {task['dev']:,} sentences; chance 50%).", "",
        "Dev accuracy at each model's setting chosen by its mean over the seeds (same grid, seeds, data order "
        "and labels for both):", "",
        f"| model | setting | {' | '.join(f'seed {s}' for s in seeds)} | mean |",
        "|---|---|" + "---:|" * (len(seeds) + 1),
        *(f"| {k} | {_setting_text(chosen_settings[k])} | {' | '.join(f'{100 * v:.1f}' for v in per_seed[k])} "
          f"| {100 * means[k]:.1f} |" for k in per_seed), "",
        verdict(per_seed["pre-trained"], per_seed["random init"], task["dev"]), "",
        f"Pre-training: {pretrain['step']} steps; held-out MLM accuracy "
        f"{100 * pretrain.get('eval_mlm_accuracy', float('nan')):.1f}% (perplexity "
        f"{pretrain.get('eval_mlm_perplexity', float('nan')):.1f}), NSP accuracy "
        f"{100 * pretrain.get('eval_nsp_accuracy', float('nan')):.1f}%. Curves: {plot}", "",
        f"Precision (pre-training and fine-tuning): {chosen.label} ({chosen.reason}).",
    ])
    atomic_write_text(out / "demo_results.md", table + "\n")
    atomic_write_text(out / "demo_results.json", json.dumps({
        "dev_accuracy": means, "seeds": seeds, "per_seed": per_seed,
        "settings": {k: dict(zip(("learning_rate", "per_device_train_batch_size", "num_train_epochs"), v,
                                 strict=True)) for k, v in chosen_settings.items()},
        "paired_difference": {"mean": mean, "standard_error": se},
        "pretraining": pretrain, "instances": instances, "task": task, "corpus": corpus, "timings": timings,
        **chosen.record()},
        indent=2, default=str))
    # The time is printed apart from the table: the same checkout prints the same table on every run.
    print("[demo] time: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
          + f"; total {time.time() - started:.0f} s", flush=True)
    return table
