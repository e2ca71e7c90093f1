"""Does pre-training pay off on real GLUE tasks? Pre-train with the recipe, then fine-tune the
pre-trained checkpoint and its randomly initialised twin (same config, vocabulary, grid, seeds and
label subsets) on GLUE, and compare them seed by seed: STS-B, MRPC, RTE and CoLA on their full train
sets, and SST-2 as a learning curve over 500 to 5,000 labelled sentences.

    .venv/bin/python benchmarks/pretrain_payoff.py --output_dir runs/payoff --pretrain_minutes 60
    .venv/bin/python benchmarks/pretrain_payoff.py --output_dir runs/payoff --steps 4000 --tapt

Protocol: every grid setting (learning rate x batch size x epochs) runs with every seed; for each model
separately the setting with the best MEAN dev score over the seeds is chosen (not the best single
trial); the reported score is the per-seed list at that setting, its mean and standard error (sample
std / sqrt(n)). Both models run the same seeds, so the difference is the mean of the per-seed
differences, with standard error sd(differences) / sqrt(n); the pre-trained model counts as ahead when
it exceeds two of them. Before any grid, the run must have left the unigram plateau (held-out MLM
accuracy >= --plateau_accuracy), or the grids are not worth their time.

Stages, each skipped when its output exists (rerun the same command to resume; the recipe resumes
from its last checkpoint and the grids from their studies); OUT/stages/*.json record each stage's
settings, and a stage made with other settings is refused rather than reused:
  OUT/corpus            the shared corpora + the tasks' train texts, decontaminated (corpus/clean)
  OUT/tokenizer         a WordPiece vocabulary trained on the corpus (or --released_vocab)
  OUT/data128, data512  pretrain-data instances (the second: only with --phase2, at --phase2_length)
  OUT/calibration       a short run that measures seconds per step (only with --pretrain_minutes)
  OUT/pretrain          `accelerate launch recipes/pretrain.py` (final/, metrics.jsonl)
  OUT/compare          `bert-suite compare` of the pre-trained model and its random twin (random:PATH): a grid per
                       task and model in OUT/compare/TASK[@N]/MODEL, the curve's label counts as TASK@N
  OUT/payoff.json, OUT/summary.md; --results_dir/NAME.json, NAME_curve.png, NAME_plateau.png
With --tapt also OUT/tapt/ (the tasks' train texts via `bert-suite corpus --from_task`, continued
pre-training from OUT/pretrain/final, its grids) and OUT/payoff_tapt.json, OUT/summary_tapt.md.
Reads ../shared/data (GLUE folders, corpus, released vocabulary); skips cleanly when it is absent.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bert_suite.report import choose_setting, mean_se, paired_comparison  # noqa: F401 (choose_setting: tests)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
BIN = Path(sys.executable).parent  # bert-suite and accelerate beside the interpreter (.venv/bin)

# task -> (GLUE folder, metric name in the record, the grid's column for it)
TASKS = {"sst2": ("SST-2", "accuracy", "eval_accuracy"), "stsb": ("STS-B", "spearman", "eval_spearmanr"),
         "mrpc": ("MRPC", "accuracy", "eval_accuracy"), "rte": ("RTE", "accuracy", "eval_accuracy"),
         "cola": ("CoLA", "matthews_correlation", "eval_matthews_correlation")}
BESIDE = {"mrpc": ("f1", "eval_f1")}  # reported next to the selection metric, not selected on
PRETRAINING_KEYS = {"device": str, "minutes": float, "model_size": str, "vocab_size": int, "steps": int,
                    "tokens": int, "corpus": str, "held_out_mlm_perplexity": float, "held_out_nsp_accuracy": float,
                    "held_out_mlm_accuracy": float, "frequent_token_accuracy": float, "precision": str,
                    "decontamination": dict}
OPTIONAL_PRETRAINING_KEYS = ("not_next_share",)  # a share in [0, 1], in every record since issue 36; issue 27's predates it
DECONTAMINATION_KEYS = ("ngram", "sentences", "sentences_removed")
RECORD_KEYS = ("command", "pretraining", "grid", "tasks", "curve")
# The shared corpora pre-trained on (under --data), beside the measured tasks' train texts.
SHARED_CORPORA = ("corpus/gutenberg/*.txt", "corpus/wikitext-2-raw/wiki.test.raw", "corpus/nltk/movie_reviews.txt",
                  "corpus/nltk/brown.txt", "corpus/nltk/state_union/*.txt")
PLATEAU_ACCURACY = 0.20  # held-out MLM accuracy a run must reach to be worth fine-tuning (tiny BERTs stall near 15%)


# ------------------------------------------------------------------------------------ reading the grids

def read_grid_scores(path: str | Path, column: str) -> dict[tuple, dict[int, float]]:
    """A `bert-suite grid` results file (grid_results.csv) as {(learning_rate, batch_size, epochs): {seed: score}},
    from its complete trials; failed trials (diverged, crashed) have no score and are left out."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    complete = [row for row in rows if row.get("state") == "complete"]
    if not complete:
        raise ValueError(f"{path}: no complete trial ({len(rows)} rows); expected a finished `bert-suite grid`")
    if column not in complete[0]:
        raise ValueError(f"{path}: no column {column!r}; expected a grid whose trials report it")
    if "lora_r" in complete[0]:  # a setting here is (lr, batch, epochs): ranks would overwrite each other
        raise ValueError(f"{path}: a grid over LoRA ranks (column lora_r); expected a full fine-tuning grid")
    scores: dict[tuple, dict[int, float]] = {}
    for row in complete:
        if row[column] in ("", "nan"):
            continue
        setting = (float(row["learning_rate"]), int(row["per_device_train_batch_size"]),
                   float(row["num_train_epochs"]))
        scores.setdefault(setting, {})[int(row["seed"])] = float(row[column])
    return scores


def difference(ahead: list[float], behind: list[float]) -> dict:
    """The record's paired difference ahead - behind (both lists in seed order: the same seeds, data order and
    label subset), from report.paired_comparison: its standard error and whether it exceeds two of them. One
    seed: no standard error."""
    if len(ahead) != len(behind):
        raise ValueError(f"paired scores need one per seed on both sides: got {len(ahead)} and {len(behind)}")
    if len(ahead) < 2:
        return {"difference": ahead[0] - behind[0], "difference_se": None, "beyond_2se": False}
    d = paired_comparison(ahead, behind)
    return {"difference": d["difference"], "difference_se": d["se"], "beyond_2se": d["verdict"] == "ahead"}


def task_entry(task: str, models: dict[str, dict], seeds: list[int], beside: dict[str, dict] | None = None) -> dict:
    """One task's record entry from `bert-suite compare`'s entries for it ({model: {"setting", "scores" (0-100,
    in seed order), ...}}, with "pretrained" and "random" among the models): the per-seed scores as fractions at
    each model's own chosen setting, mean and standard error, and pretrained - random (and pretrained - general,
    when "general" is there). `beside` (MRPC's F1: {model: {setting: {seed: score}}}) is reported at the same
    chosen settings."""
    entry: dict = {"metric": TASKS[task][1], "seeds": list(seeds), "chosen": {}, "mean": {}, "se": {}}
    for model, found in models.items():
        entry[model] = [score / 100 for score in found["scores"]]
        entry["chosen"][model] = dict(found["setting"])
        entry["mean"][model], entry["se"][model] = mean_se(entry[model])
        if beside:
            setting = tuple(found["setting"][k] for k in ("learning_rate", "batch_size", "epochs"))
            entry.setdefault(BESIDE[task][0], {})[model] = [beside[model][setting][s] for s in seeds]
    entry.update(difference(entry["pretrained"], entry["random"]))
    if "general" in models:
        entry["vs_general"] = difference(entry["pretrained"], entry["general"])
    return entry


def check_record(record: dict, name: str = "payoff.json") -> dict:
    """The record has exactly the issue's shape (command, pretraining, grid, tasks, curve): a ValueError names
    the first key that is missing, unexpected or of the wrong type. Task and curve entries may carry more keys
    than the per-seed lists."""
    def bad(where, why):
        raise ValueError(f"{name}: {where}: {why}")

    if not isinstance(record, dict):
        bad("the record", "expected an object")
    for key in RECORD_KEYS:
        if key not in record:
            bad(key, "missing key")
    extra = sorted(set(record) - set(RECORD_KEYS))
    if extra:
        bad(extra[0], f"unexpected key; expected only {', '.join(RECORD_KEYS)}")
    if not isinstance(record["command"], str) or not record["command"]:
        bad("command", "expected the command that made it (a string)")
    check_pretraining(record["pretraining"], bad)
    if not isinstance(record["grid"], dict):
        bad("grid", "expected an object (the grid's settings)")
    tasks = record["tasks"]
    if not isinstance(tasks, dict) or not tasks:
        bad("tasks", "expected an object with at least one task")
    for task, entry in tasks.items():
        if task not in TASKS:
            bad(f"tasks.{task}", f"unknown task; expected one of {', '.join(TASKS)}")
        if not isinstance(entry, dict):
            bad(f"tasks.{task}", "expected an object")
        if "metric" not in entry:
            bad(f"tasks.{task}.metric", "missing key")
        if entry["metric"] != TASKS[task][1]:
            bad(f"tasks.{task}.metric", f"expected {TASKS[task][1]!r}, got {entry['metric']!r}")
        _check_paired(entry, f"tasks.{task}", bad)
    curve = record["curve"]
    if not isinstance(curve, dict):
        bad("curve", "expected an object: {task: {label count: {pretrained: [...], random: [...]}}}")
    for task, points in curve.items():
        if task not in TASKS:
            bad(f"curve.{task}", f"unknown task; expected one of {', '.join(TASKS)}")
        if not isinstance(points, dict) or not points:
            bad(f"curve.{task}", "expected an object with at least one label count")
        for count, entry in points.items():
            if not (isinstance(count, str) and count.isdigit() and int(count) > 0):
                bad(f"curve.{task}.{count}", "expected a label count (a positive whole number, as a string)")
            if not isinstance(entry, dict):
                bad(f"curve.{task}.{count}", "expected an object")
            _check_paired(entry, f"curve.{task}.{count}", bad)
    return record


def check_pretraining(pre: dict, bad) -> dict:
    """The record's "pretraining" object (checked right after pre-training too, before hours of grids):
    `bad(where, why)` raises. NSP accuracy may be null: a run pre-trained without NSP (Table 5's "No NSP")."""
    if not isinstance(pre, dict):
        bad("pretraining", "expected an object")
    for key, kind in PRETRAINING_KEYS.items():
        if key not in pre:
            bad(f"pretraining.{key}", "missing key")
        value = pre[key]
        if value is None and key == "held_out_nsp_accuracy":
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            if kind is float else isinstance(value, kind) and not isinstance(value, bool)
        if not ok:
            bad(f"pretraining.{key}", f"expected {'a finite number' if kind is float else kind.__name__}, "
                f"got {value!r}")
    for key in OPTIONAL_PRETRAINING_KEYS:
        value = pre.get(key, 0.5)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1):
            bad(f"pretraining.{key}", f"expected a share between 0 and 1, got {value!r}")
    extra = sorted(set(pre) - set(PRETRAINING_KEYS) - set(OPTIONAL_PRETRAINING_KEYS))
    if extra:
        bad(f"pretraining.{extra[0]}", f"unexpected key; expected only {', '.join(PRETRAINING_KEYS)} "
            f"(and {', '.join(OPTIONAL_PRETRAINING_KEYS)})")
    decontamination = pre["decontamination"]
    if sorted(decontamination) != sorted(DECONTAMINATION_KEYS):
        bad("pretraining.decontamination", f"expected exactly the keys {', '.join(DECONTAMINATION_KEYS)}, got "
            f"{', '.join(decontamination) or 'none'}")
    for key, value in decontamination.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            bad(f"pretraining.decontamination.{key}", f"expected a count (int >= 0), got {value!r}")
    return pre


def _check_paired(entry: dict, where: str, bad) -> None:
    """Both models' per-seed scores: finite numbers, one per seed on each side."""
    for model in ("pretrained", "random"):
        if model not in entry:
            bad(f"{where}.{model}", "missing key")
        scores = entry[model]
        if not (isinstance(scores, list) and scores and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in scores)):
            bad(f"{where}.{model}", f"expected a non-empty list of per-seed scores, got {scores!r}")
    if len(entry["pretrained"]) != len(entry["random"]):
        bad(where, "pretrained and random have different numbers of seeds")


def build_record(command: str, pretraining: dict, grid: dict, tasks: dict, curve: dict | None = None) -> dict:
    """The payoff record, checked: {"command", "pretraining", "grid", "tasks", "curve"}."""
    pretraining = {key: (float(pretraining[key]) if kind is float else pretraining[key])
                   for key, kind in PRETRAINING_KEYS.items() if key in pretraining} | \
                  {k: v for k, v in pretraining.items() if k not in PRETRAINING_KEYS}
    return check_record({"command": command, "pretraining": pretraining, "grid": grid, "tasks": tasks,
                         "curve": curve or {}})


# ------------------------------------------------------------------------------------ the summary

PROTOCOL = (
    "Protocol: every grid setting (learning rate x batch size x epochs) is fine-tuned with every seed. For each "
    "model separately, the setting with the best mean dev score over the seeds is chosen (not the best single "
    "trial); a setting with a failed seed does not compete. A model's score is the per-seed list at its chosen "
    "setting, with its mean and standard error (sample std / sqrt(n)). Both models fine-tune with the same seeds, "
    "so the same data order and label subset: the difference is the mean of the per-seed differences, with "
    "standard error sd(differences) / sqrt(n); the pre-trained model is ahead when it exceeds two of them. "
    "Dev sets are used whole; scores are percentages.")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def _standing(d: dict) -> str:
    """A paired difference's verdict in words (`difference`'s result)."""
    if d["difference_se"] is None:
        return "one seed: no standard error"
    return "ahead by more than 2 SE" if d["beyond_2se"] else "not beyond 2 SE"


def _verdict(d: dict, ahead: str, behind: str) -> str:
    if d["difference_se"] is None:
        return f"{ahead} - {behind}: {_pct(d['difference'])} ({_standing(d)})"
    return f"{ahead} - {behind}: {_pct(d['difference'])} ± {_pct(d['difference_se'])}: **{_standing(d)}**"


def summary_markdown(record: dict, title: str, notes: list[str] = (), names: dict | None = None) -> str:
    """The summary: the protocol, the pre-training, then a table per task (model, chosen setting, per-seed
    scores, mean ± SE) and the difference ± SE with its verdict. `names` renames models in the text."""
    names = {"pretrained": "pre-trained", "random": "random init", "general": "general", **(names or {})}
    pre, grid = record["pretraining"], record["grid"]
    lines = [f"# {title}", "", f"`{record['command']}`", "", PROTOCOL, "",
             f"Pre-training: {pre['model_size']}, vocabulary {pre['vocab_size']:,}, {pre['steps']:,} steps, "
             f"{pre['tokens']:,} tokens, {pre['minutes']:.1f} minutes on {pre['device']}; corpus: {pre['corpus']}. "
             f"Held-out MLM perplexity {pre['held_out_mlm_perplexity']:.1f}, MLM accuracy "
             f"{100 * pre['held_out_mlm_accuracy']:.1f}% (always the most frequent token: "
             f"{100 * pre['frequent_token_accuracy']:.1f}%), NSP accuracy "
             + ("none (no NSP)" if pre["held_out_nsp_accuracy"] is None else
                f"{100 * pre['held_out_nsp_accuracy']:.1f}%") + f"; precision {pre['precision']}; "
             f"{pre['decontamination']['sentences_removed']:,} of {pre['decontamination']['sentences']:,} corpus "
             f"sentences removed by {pre['decontamination']['ngram']}-gram decontamination.", "",
             "Grid: " + ", ".join(f"{k} {v}" for k, v in grid.items()) + ".", *[f"- {n}" for n in notes], ""]
    ahead = 0
    for task, entry in record["tasks"].items():
        models = ["pretrained", "random", *(["general"] if "general" in entry else [])]
        beside = BESIDE.get(task)
        header = "| model | chosen setting | per-seed " + entry["metric"] + " | mean ± SE |"
        if beside:
            header += f" {beside[0]} at that setting (mean) |"
        lines += [f"## {task} ({entry['metric']})", "", header, "|---|---|---|---:|" + ("---:|" if beside else "")]
        for model in models:
            chosen = entry.get("chosen", {}).get(model)
            setting = (f"lr {chosen['learning_rate']:g}, batch {chosen['batch_size']}, epochs {chosen['epochs']:g}"
                       if chosen else "")
            mean, se = mean_se(entry[model])
            row = f"| {names[model]} | {setting} | {', '.join(_pct(v) for v in entry[model])} | {_pct(mean)} ± {_pct(se)} |"
            if beside:
                row += f" {_pct(statistics.fmean(entry[beside[0]][model]))} |" if beside[0] in entry else " |"
            lines.append(row)
        d = difference(entry["pretrained"], entry["random"])
        ahead += d["beyond_2se"]
        lines += ["", _verdict(d, names["pretrained"], names["random"])]
        if "general" in entry:
            lines.append(_verdict(difference(entry["pretrained"], entry["general"]), names["pretrained"],
                                  names["general"]))
        lines.append("")
    lines.append(f"{names['pretrained'].capitalize()} ahead of {names['random']} by more than 2 SE on {ahead} of "
                 f"{len(record['tasks'])} tasks.")
    for task, by_count in (record.get("curve") or {}).items():
        lines += curve_lines(task, by_count, names)
    return "\n".join(lines) + "\n"


def curve_lines(task: str, by_count: dict, names: dict) -> list[str]:
    """The learning curve as a table: per label count, each model's chosen setting and mean ± SE, then the
    paired difference ± SE and its verdict (the per-seed scores are in the record)."""
    metric = next((e["metric"] for e in by_count.values() if e.get("metric")), TASKS.get(task, ("", ""))[1])
    lines = ["", f"## {task} learning curve ({metric}, first N training examples, the same for both models)", "",
             f"| labels | {names['pretrained']} | setting | {names['random']} | setting | difference ± SE | verdict |",
             "|---:|---:|---|---:|---|---:|---|"]
    for count, entry in sorted(by_count.items(), key=lambda kv: int(kv[0])):
        cells = [f"{int(count):,}"]
        for model in ("pretrained", "random"):
            mean, se = mean_se(entry[model])
            chosen = entry.get("chosen", {}).get(model)
            cells += [f"{_pct(mean)} ± {_pct(se)}", f"lr {chosen['learning_rate']:g}" if chosen else ""]
        d = difference(entry["pretrained"], entry["random"])
        cells += [f"{_pct(d['difference'])} ± {_pct(d['difference_se'])}", _standing(d)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ------------------------------------------------------------------------------------ running the stages

def run(cmd: list[str], log: Path, what: str) -> float:
    """Run a stage's command with its output in `log`; returns its wall seconds. A failure exits with one
    line naming the stage and the log, after the log's last lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"), "TOKENIZERS_PARALLELISM": "false"}
    print(f"[payoff] {what}: {shlex.join(map(str, cmd))}", flush=True)
    started = time.time()
    with open(log, "a") as out:
        code = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if code:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        raise SystemExit(f"pretrain_payoff: {what} failed (exit {code}); see {log}")
    return time.time() - started


def pretraining_data(args, out: Path, corpus: list[Path], vocab: Path, balance_nsp: bool = False) -> dict[int, Path]:
    """OUT/dataLENGTH: `bert-suite pretrain-data` instances at --max_seq_length (--dupe_factor passes) and, with
    --phase2, at --phase2_length (one pass); `balance_nsp` passes --balance_nsp. Returns {length: folder}."""
    data = {args.max_seq_length: out / f"data{args.max_seq_length}"}
    if args.phase2:
        data[args.phase2_length] = out / f"data{args.phase2_length}"
    for length, folder in data.items():
        dupe_factor = args.dupe_factor if length == args.max_seq_length else 1
        settings = {"input": corpus, "tokenizer": vocab, "max_seq_length": length, "dupe_factor": dupe_factor}
        if balance_nsp:  # only when set: the stage records of earlier runs stay valid
            settings["balance_nsp"] = True
        check_stage(out, folder.name, settings, (folder / "pretrain_data_stats.json").is_file())
        if not (folder / "pretrain_data_stats.json").is_file():
            run([BIN / "bert-suite", "pretrain-data", "--input", *corpus, "--format", "lines", "--tokenizer", vocab,
                 "--max_seq_length", length, "--dupe_factor", dupe_factor, "--num_proc", 2, "--output_dir", folder,
                 *(["--balance_nsp"] if balance_nsp else [])],
                out / "logs" / f"data{length}.log", f"pre-training data ({length})")
    return data


def check_stage(out: Path, name: str, wanted: dict, started: bool) -> None:
    """A stage reruns only with the inputs it was made from: OUT/stages/NAME.json records them before the
    stage runs; a stage already started (or finished) from other inputs, or with no record of them, is
    refused, naming what differs, rather than silently reused (its outputs feed every later stage)."""
    marker = out / "stages" / f"{name}.json"
    wanted = json.loads(json.dumps(wanted, default=str))
    recorded = json.loads(marker.read_text()) if marker.is_file() else None
    if recorded is not None and recorded != wanted:
        differing = sorted(k for k in {**recorded, **wanted} if recorded.get(k) != wanted.get(k))
        raise SystemExit(f"pretrain_payoff: {out}: the {name} stage was made with other settings ({', '.join(differing)}; "
                         f"see {marker}); give another --output_dir, or the same settings")
    if recorded is None and started:
        raise SystemExit(f"pretrain_payoff: {out}: the {name} stage has outputs but no record of its settings "
                         f"({marker}); give another --output_dir")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(wanted, indent=2))


def default_corpus(data_root: Path) -> list[str]:
    """The shared corpora's files (SHARED_CORPORA under --data), in a fixed order."""
    files = [str(p) for pattern in SHARED_CORPORA for p in sorted(data_root.glob(pattern))]
    if not files:
        raise SystemExit(f"pretrain_payoff: no corpus files under {data_root} ({', '.join(SHARED_CORPORA)})")
    return files


def clean_corpus(args, out: Path, sources: list[str], tasks: list[str], also_against: tuple = ()
                 ) -> tuple[list[Path], dict]:
    """OUT/corpus: `sources` plus the train texts of `tasks` (`bert-suite corpus --from_task`; never their dev or
    test text), with every sentence sharing an --ngram-word sequence with those tasks' dev and test files (and the
    evaluation files `also_against`) removed (`bert-suite decontaminate`). Returns the clean files and the
    record's decontamination counts."""
    corpus = out / "corpus"
    texts = []
    for task in ([] if args.no_task_text else tasks):
        text = corpus / "tasks" / f"{task}-train.txt"
        if not text.is_file():
            run([BIN / "bert-suite", "corpus", "--from_task", task, "--data_dir", glue_folder(args, task),
                 "--output_dir", corpus / "tasks"], corpus / "logs" / "tasks.log", f"train text of {task}")
        texts.append(str(text))
    clean, clean_tasks = corpus / "clean", corpus / "clean_tasks"
    against = [str(f) for task in tasks for f in (glue_folder(args, task) / "dev.tsv",
                                                  glue_folder(args, task) / "test.tsv") if f.is_file()]
    against += [str(f) for f in also_against]
    # The task texts are decontaminated on their own, read as `lines`: one document per example (auto-detection
    # takes a file of one-line documents for raw text, one document, and would run its examples together).
    parts = [(clean, sources, "auto"), *([(clean_tasks, texts, "lines")] if texts else [])]
    check_stage(out, "corpus", {"input": [*sources, *texts], "against": against, "ngram": args.ngram,
                                "task_text_format": "lines"},
                any((folder / "decontamination.json").is_file() for folder, _, _ in parts))
    totals = dict.fromkeys(("sentences", "sentences_removed"), 0)
    for folder, files, fmt in parts:
        if not (folder / "decontamination.json").is_file():
            run([BIN / "bert-suite", "decontaminate", "--input", *files, "--against", *against, "--ngram", args.ngram,
                 "--format", fmt, "--output_dir", folder], corpus / "logs" / "decontaminate.log", "decontamination")
        report = json.loads((folder / "decontamination.json").read_text())
        for key in totals:
            totals[key] += report[key]
    print(f"[payoff] decontamination: {totals['sentences_removed']:,} of {totals['sentences']:,} corpus sentences "
          f"removed ({args.ngram}-word matches with {len(against)} dev and test files: "
          f"{', '.join(Path(a).parent.name + '/' + Path(a).name for a in against)})")
    return ([clean / Path(f).name for f in sources] + [clean_tasks / Path(f).name for f in texts],
            {"ngram": args.ngram, **totals})


def glue_folder(args, task: str) -> Path:
    return Path(args.data) / "glue" / TASKS[task][0]


def train_size(args, task: str) -> int:
    """The examples in the task's train split, as the grid reads them."""
    from bert_suite.adapters import adapter_for
    from bert_suite.cards import load_card

    card = load_card(task)
    return len(adapter_for(card.family).load_split(card, card.train_split, str(glue_folder(args, task))))


def check_label_counts(counts: list[int], task: str, size: int) -> None:
    """Every --label_counts value is a positive number of examples the task's train split has."""
    for count in counts:
        if count < 1:
            raise SystemExit(f"pretrain_payoff: --label_counts {count}: expected a positive number of examples")
        if count > size:
            raise SystemExit(f"pretrain_payoff: --label_counts {count}: above {task}'s train size ({size:,} examples); "
                             f"expected at most {size:,}")


def evaluations(metrics_file: Path) -> list[dict]:
    """The held-out evaluations among a recipe run's metrics.jsonl lines, in step order."""
    return [e for e in map(json.loads, metrics_file.read_text().splitlines())
            if any(k.startswith("eval_mlm_") for k in e)]


def plateau(metrics_file: Path, threshold: float) -> dict:
    """Where a run stands against the unigram plateau, from its held-out evaluations: the first step whose MLM
    accuracy reached `threshold` (None: never), and the last evaluation's MLM and frequent-token accuracy."""
    evals = evaluations(metrics_file)
    if not evals:
        raise SystemExit(f"pretrain_payoff: {metrics_file} has no evaluation (eval_mlm_accuracy)")
    left = next((e["step"] for e in evals if e["eval_mlm_accuracy"] >= threshold), None)
    last = evals[-1]
    return {"left_at_step": left, "threshold": threshold, "step": last["step"],
            "mlm_accuracy": last["eval_mlm_accuracy"], "best_mlm_accuracy": max(e["eval_mlm_accuracy"] for e in evals),
            "frequent_token_accuracy": last.get("eval_frequent_token_accuracy", float("nan"))}


def plateau_line(p: dict) -> str:
    where = (f"left the plateau at step {p['left_at_step']:,} (held-out MLM accuracy >= {100 * p['threshold']:.0f}%)"
             if p["left_at_step"] is not None else
             f"did NOT leave the plateau (held-out MLM accuracy below {100 * p['threshold']:.0f}% throughout; best "
             f"{100 * p['best_mlm_accuracy']:.1f}%)")
    return (f"{where}; at step {p['step']:,}: MLM accuracy {100 * p['mlm_accuracy']:.1f}% against "
            f"{100 * p['frequent_token_accuracy']:.1f}% for always predicting the most frequent token")


def plot_plateau(metrics_file: Path, threshold: float, path: Path) -> Path:
    """Held-out MLM accuracy and the frequent-token accuracy against the step, with the threshold."""
    from matplotlib.figure import Figure

    from bert_suite.io import save_figure

    evals = evaluations(metrics_file)
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.add_subplot()
    steps = [e["step"] for e in evals]
    ax.plot(steps, [100 * e["eval_mlm_accuracy"] for e in evals], marker="o", label="held-out MLM accuracy")
    ax.plot(steps, [100 * e.get("eval_frequent_token_accuracy", float("nan")) for e in evals], linestyle="--",
            label="always the most frequent token")
    ax.axhline(100 * threshold, color="grey", linewidth=0.8, label=f"{100 * threshold:.0f}%: off the plateau")
    ax.set(xlabel="step", ylabel="accuracy at masked positions (%)", title="Pre-training against the unigram plateau")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_curve(curve: dict, task: str, metric: str, path: Path) -> Path:
    """Dev score against the number of labelled examples, both models, mean over seeds with SE bars."""
    from matplotlib.figure import Figure

    from bert_suite.io import save_figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    counts = sorted(curve, key=int)
    for model, label in (("pretrained", "pre-trained"), ("random", "random init")):
        stats = [mean_se(curve[c][model]) for c in counts]
        ax.errorbar([int(c) for c in counts], [100 * m for m, _ in stats], yerr=[100 * (e or 0) for _, e in stats],
                    marker="o", capsize=3, label=label)
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks([int(c) for c in counts], labels=[f"{int(c):,}" for c in counts])
    ax.set(xlabel=f"labelled {task} training examples", ylabel=f"dev {metric} (%)",
           title=f"{task}: pre-trained vs random init (mean ± SE over seeds)")
    ax.legend()
    return save_figure(fig, path)


def device_name() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({len(os.sched_getaffinity(0))} cores)"


def recipe_overrides(args, data: dict[str, Path], vocab: Path, output_dir: Path, steps: int,
                     learning_rate: float, init_from: Path | None = None, **replace) -> list[str]:
    """recipes/pretrain.py key=value overrides for a run of `steps` steps (`replace`: other values for some)."""
    length = args.max_seq_length
    values = {"model_size": args.model_size, "train_data": data[length], "tokenizer": vocab, "output_dir": output_dir,
              "max_steps": steps, "warmup_steps": max(0, round(args.warmup_fraction * steps)),
              "learning_rate": learning_rate, "per_device_train_batch_size": args.batch_size,
              "mlm_probability": args.masking_rate, "max_predictions_per_seq": math.ceil(args.masking_rate * length),
              "seed": args.seed, "mixed_precision": args.mixed_precision, "report_to": "none",
              "resume_from_checkpoint": "auto", "logging_steps": max(1, min(50, steps // 20)),
              "eval_steps": max(1, steps // 10), "save_steps": max(1, steps // 10), "eval_batches": args.eval_batches,
              "phase1_fraction": 1.0}
    if args.phase2:
        values.update(train_data_phase2=data[args.phase2_length], phase1_fraction=1 - args.phase2_fraction,
                      per_device_train_batch_size_phase2=max(1, args.batch_size // 4),
                      max_predictions_per_seq_phase2=math.ceil(args.masking_rate * args.phase2_length))
    if init_from is not None:
        values["init_from"] = init_from
    if args.pretrain_dropout is not None:  # both only when given: the recipe's default is the preset's
        values.update(hidden_dropout_prob=args.pretrain_dropout, attention_probs_dropout_prob=args.pretrain_dropout)
    values.update(replace)
    return [f"{k}={v}" for k, v in values.items()] + list(args.pretrain_override)


def pretrain(args, overrides: list[str], out: Path, steps: int, what: str) -> None:
    """Run (or resume) the recipe unless it has finished; each invocation's wall time is added to
    out/payoff_timing.json. A run started with other overrides is refused (see check_stage)."""
    check_stage(out.parent, out.name, {"overrides": overrides}, out.is_dir() and any(out.iterdir()))
    done = finished_steps(out)
    if done == steps:
        return
    if done is not None:  # resumed from its checkpoints, it would continue under another schedule
        raise SystemExit(f"pretrain_payoff: {out} holds a finished run of {done} steps, not {steps}; give the "
                         "same steps or another --output_dir")
    what = f"{what} ({steps} steps)"
    cmd = [BIN / "accelerate", "launch", "--config_file", args.accelerate_config, ROOT / "recipes" / "pretrain.py",
           *overrides]
    seconds = run(cmd, out.parent / "logs" / f"{out.name}.log", what)
    timing_file = out / "payoff_timing.json"
    timing = json.loads(timing_file.read_text()) if timing_file.is_file() else []
    timing.append({"seconds": seconds, "finished": time.strftime("%Y-%m-%d %H:%M:%S")})
    timing_file.write_text(json.dumps(timing, indent=2))


def finished_steps(out: Path) -> int | None:
    results = out / "pretrain_results.json"
    if results.is_file() and (out / "final" / "config.json").is_file():
        return json.loads(results.read_text())["step"]
    return None


def data_stats(folder: Path) -> dict:
    return json.loads((folder / "pretrain_data_stats.json").read_text())


def calibrate(args, data, vocab, out: Path, **replace) -> tuple[float, float, float]:
    """From a short run with the same settings: seconds per optimizer step of the planned run (phases
    weighted by their share), from the tokens per second of the last logged window of each phase (the
    first window holds the start-up); the calibration's own wall seconds; and the start-up and saving
    around the steps (its wall time minus its steps), which the planned run pays too."""
    result_file = out / "calibration.json"
    steps = args.calibration_steps
    overrides = recipe_overrides(args, data, vocab, out / "run", steps, args.learning_rate,
                                 logging_steps=max(1, steps // (4 if args.phase2 else 2)), eval_steps=steps,
                                 save_steps=steps, eval_batches=1, resume_from_checkpoint="null",
                                 **({"phase1_fraction": 0.5} if args.phase2 else {}), **replace)
    check_stage(out.parent, "calibration", {"overrides": overrides}, result_file.is_file())
    if not result_file.is_file():
        seconds = run([BIN / "accelerate", "launch", "--config_file", args.accelerate_config,
                       ROOT / "recipes" / "pretrain.py", *overrides], out / "calibration.log", "calibration")
        logs = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
        per_step = {}
        for phase, length, batch in ((1, args.max_seq_length, args.batch_size),
                                     (2, args.phase2_length, max(1, args.batch_size // 4))):
            windows = [log for log in logs if log["phase"] == phase]
            if windows:
                per_step[phase] = batch * data_stats(data[length])["mean_instance_length"] / windows[-1]["tokens_per_second"]
        result_file.write_text(json.dumps({"seconds_per_step": per_step, "wall_seconds": seconds,
                                           "steps": steps}, indent=2))
    result = json.loads(result_file.read_text())
    per_step = {int(k): v for k, v in result["seconds_per_step"].items()}
    share2 = args.phase2_fraction if args.phase2 else 0.0
    mean_step = (1 - share2) * per_step[1] + share2 * per_step.get(2, per_step[1])
    stepping = result["steps"] * statistics.fmean(per_step.values())  # its steps: half in each phase with phase 2
    overhead = max(0.0, result["wall_seconds"] - stepping)
    print(f"[payoff] calibration: {per_step[1]:.3f} s a phase-1 step" + (f", {per_step[2]:.3f} s a phase-2 step"
          if 2 in per_step else "") + f"; {overhead:.0f} s start-up ({result['wall_seconds']:.0f} s in all)")
    return mean_step, result["wall_seconds"], overhead


def planned_steps(minutes: float, per_step: float, calibration_seconds: float, overhead: float,
                  safety: float) -> int:
    """The steps that fit a budget of `minutes` which also holds the calibration run and the planned run's own
    start-up (`overhead`); `safety` keeps a share back for evaluations and checkpoints."""
    return max(1, int((minutes * 60 - calibration_seconds - overhead) * safety / per_step))


def fine_tuning_checkpoint(final: Path, size: str) -> Path:
    """The checkpoint the grids start from: `final`, or, when it was pre-trained with other dropout than the
    preset's, a twin folder (links to its files) whose config has the preset's dropout, so the pre-trained
    model and its random twin fine-tune with the same config."""
    from bert_suite import BertSuiteConfig

    preset = BertSuiteConfig.from_preset(size)
    config = json.loads((final / "config.json").read_text())
    keys = ("hidden_dropout_prob", "attention_probs_dropout_prob")
    if all(config.get(k) == getattr(preset, k) for k in keys):
        return final
    twin = final.parent / "final-finetune"
    twin.mkdir(exist_ok=True)
    for path in final.iterdir():
        if path.name != "config.json" and not (twin / path.name).exists():
            (twin / path.name).symlink_to(path.resolve())
    config.update({k: getattr(preset, k) for k in keys})
    (twin / "config.json").write_text(json.dumps(config, indent=2))
    return twin


def task_spec(args, task: str, samples: int | None = None) -> str:
    """The task as `bert-suite compare --task` takes it: TASK@N for its first N training examples."""
    samples = samples or args.max_train_samples or (args.sst2_train_samples if task == "sst2" else None)
    return f"{task}@{samples}" if samples else task


def compare(args, out: Path, models: dict[str, str], specs: list[str], what: str) -> dict:
    """`bert-suite compare` of `models` ({name: --model value}, "random" the baseline) on the task specs, with the
    record's grid, seeds and length, in OUT/compare (resumable; a model's grids are reused by every comparison
    that names it alike). Returns compare.json."""
    specs = list(dict.fromkeys(specs))
    tasks = list(dict.fromkeys(spec.split("@")[0] for spec in specs))
    run([BIN / "bert-suite", "compare", "--model", *(f"{name}={model}" for name, model in models.items()),
         "--baseline", "random", "--task", *specs, "--data_dir", Path(args.data) / "glue",
         "--metric", *(f"{t}={TASKS[t][2].removeprefix('eval_')}" for t in tasks),
         "--learning_rates", *args.learning_rates, "--batch_sizes", *args.batch_sizes, "--epochs", *args.epochs,
         "--seeds", *args.seeds, "--max_seq_length", args.ft_max_seq_length, "--output_dir", out / "compare",
         "--disable_tqdm", "true"], out / "logs" / "compare.log", what)
    return json.loads((out / "compare" / "compare.json").read_text())


def pretraining_facts(args, out: Path, data_folders: list[Path], steps_by_phase: list[tuple[int, int]],
                      vocab_size: int, corpus: str, minutes: float, device: str, decontamination: dict) -> dict:
    """The record's "pretraining": tokens = sum over phases of steps x batch x mean instance length (the
    non-padding tokens the model saw); held-out MLM perplexity and accuracy, the frequent-token accuracy on the
    same positions and NSP accuracy of the last evaluation; the precision the recipe ran in; the NotNext share
    of the instances it trained on (phases weighted by their steps)."""
    evals = evaluations(out / "metrics.jsonl")
    if not evals:
        raise SystemExit(f"pretrain_payoff: {out}/metrics.jsonl has no evaluation (eval_mlm_perplexity)")
    stats = [data_stats(folder) for folder in data_folders]
    tokens = sum(steps * batch * st["mean_instance_length"] for st, (steps, batch) in zip(stats, steps_by_phase,
                                                                                           strict=True))
    not_next = sum(steps * st["not_next_share"] for st, (steps, _) in zip(stats, steps_by_phase, strict=True)) / \
        max(1, sum(steps for steps, _ in steps_by_phase))
    results = json.loads((out / "pretrain_results.json").read_text()) if (out / "pretrain_results.json").is_file() \
        else {}
    return {"device": device, "minutes": round(minutes, 2), "model_size": args.model_size, "vocab_size": vocab_size,
            "steps": sum(s for s, _ in steps_by_phase), "tokens": int(tokens), "corpus": corpus,
            "held_out_mlm_perplexity": evals[-1]["eval_mlm_perplexity"],
            "held_out_nsp_accuracy": evals[-1].get("eval_nsp_accuracy"),  # None: pre-trained without NSP
            "held_out_mlm_accuracy": evals[-1].get("eval_mlm_accuracy", float("nan")),
            "frequent_token_accuracy": evals[-1].get("eval_frequent_token_accuracy", float("nan")),
            "precision": results.get("precision", args.mixed_precision), "decontamination": decontamination,
            "not_next_share": round(not_next, 4)}


def phase_steps(args, steps: int) -> list[tuple[int, int]]:
    """(steps, batch) per phase, as the recipe splits max_steps (phase1_steps = ceil(max_steps x fraction))."""
    if not args.phase2:
        return [(steps, args.batch_size)]
    first = math.ceil(steps * (1 - args.phase2_fraction))
    return [(first, args.batch_size), (steps - first, max(1, args.batch_size // 4))]


def minutes_of(out: Path) -> float:
    timing = out / "payoff_timing.json"
    return sum(t["seconds"] for t in json.loads(timing.read_text())) / 60 if timing.is_file() else 0.0


def collect(args, out: Path, result: dict, names: dict[str, str], specs: dict[str, str]) -> dict:
    """Every task's record entry from compare.json (`names`: the record's model name for each compared model;
    `specs`: task -> its compare spec), MRPC's F1 read beside from the grids' results."""
    tasks = {}
    for task, spec in specs.items():
        models = {names[m]: found for m, found in result["tasks"][spec]["models"].items() if m in names}
        beside = {names[m]: read_grid_scores(out / "compare" / spec / m / "grid_results.csv", BESIDE[task][1])
                  for m in names} if task in BESIDE else None
        tasks[task] = task_entry(task, models, result["seeds"], beside)
    return tasks


def write_outputs(out: Path, name: str, record: dict, title: str, notes: list[str], names: dict | None = None) -> None:
    (out / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
    text = summary_markdown(record, title, notes, names)
    (out / f"summary{name[len('payoff'):]}.md").write_text(text)
    print(text)
    print(f"[payoff] wrote {out / f'{name}.json'}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="runs/pretrain-payoff", help="where every stage writes (resumable)")
    p.add_argument("--data", default=str(DEFAULT_DATA), help="the shared data folder (glue/, corpus/, vocab/)")
    p.add_argument("--corpus", nargs="+", help="pre-training text files (default: under --data, "
                   + ", ".join(SHARED_CORPORA) + ")")
    p.add_argument("--no_task_text", action="store_true", help="leave the measured tasks' train texts out of the "
                   "corpus (by default they are in it: unlabelled, and never their dev or test text)")
    p.add_argument("--ngram", type=int, default=8, help="decontamination: drop every corpus sentence sharing this "
                   "many consecutive words with a measured task's dev or test set")
    p.add_argument("--results_dir", default=str(ROOT / "benchmarks" / "results"),
                   help="where the record and the plots are copied at the end")
    p.add_argument("--name", default="pretrain_payoff", help="file names there: NAME.json, NAME_curve.png, "
                   "NAME_plateau.png (another name keeps an attempt beside the record)")
    g = p.add_argument_group("vocabulary and pre-training data")
    g.add_argument("--vocab_size", type=int, default=8192, help="WordPiece vocabulary trained on the corpus (lowercase)")
    g.add_argument("--released_vocab", action="store_true", help="use the released bert-base-uncased vocabulary "
                   "(30,522) instead of training one")
    g.add_argument("--max_seq_length", type=int, default=128, help="phase-1 instance length")
    g.add_argument("--dupe_factor", type=int, default=5, help="pretrain-data passes over the corpus (new segments "
                   "each)")
    g.add_argument("--phase2", action="store_true", help="also a phase 2 at --phase2_length (batch / 4)")
    g.add_argument("--phase2_length", type=int, default=512, help="phase-2 instance length (the paper's 512)")
    g.add_argument("--phase2_fraction", type=float, default=0.1, help="share of the steps in phase 2")
    g.add_argument("--masking_rate", type=float, default=0.15, help="share of tokens predicted (mlm_probability)")
    g = p.add_argument_group("pre-training (recipes/pretrain.py)")
    g.add_argument("--model_size", default="tiny", help="the preset (tiny, mini, small, medium, base, large)")
    g.add_argument("--steps", type=int, help="optimizer steps (wins over --pretrain_minutes)")
    g.add_argument("--pretrain_minutes", type=float, help="wall-time budget: the steps are planned from a "
                   "calibration run's seconds per step (its time counted in the budget)")
    g.add_argument("--calibration_steps", type=int, default=40, help="steps of the calibration run")
    g.add_argument("--budget_safety", type=float, default=0.9, help="share of the budget planned for steps "
                   "(the rest: evaluations, checkpoints, and the calibration's short window reading a few percent "
                   "faster than a long run sustains; at 0.95, two 60-minute plans took 61.9 and 63.4 minutes)")
    g.add_argument("--batch_size", type=int, default=64, help="phase-1 batch (per process)")
    g.add_argument("--learning_rate", type=float, default=1e-3)
    g.add_argument("--warmup_fraction", type=float, default=0.06, help="warmup steps as a share of the steps")
    g.add_argument("--pretrain_dropout", type=float, help="hidden and attention dropout during pre-training "
                   "(default: the preset's; fine-tuning always uses the preset's)")
    g.add_argument("--eval_batches", type=int, default=20, help="held-out batches of 64 per evaluation")
    g.add_argument("--mixed_precision", default="auto", choices=["auto", "no", "fp16", "bf16"],
                   help="the recipe's: auto = bf16 autocast where the CPU does bf16 natively, fp32 elsewhere")
    g.add_argument("--accelerate_config", help="accelerate config (default: recipes/configs/accelerate/cpu.yaml, "
                   "gpu.yaml when CUDA is available)")
    g.add_argument("--pretrain_override", nargs="*", default=[], metavar="KEY=VALUE",
                   help="more recipe overrides (e.g. whole_word_mask=true)")
    g.add_argument("--seed", type=int, default=42, help="pre-training seed")
    g.add_argument("--plateau_accuracy", type=float, default=PLATEAU_ACCURACY, help="held-out MLM accuracy a run "
                   "must reach before its grids are worth running (tiny BERTs sit near 15%% for thousands of steps)")
    g.add_argument("--finetune_on_plateau", action="store_true", help="run the grids even when the pre-training "
                   "never reached --plateau_accuracy")
    g = p.add_argument_group("fine-tuning (bert-suite grid, the same for every model)")
    g.add_argument("--tasks", nargs="+", default=["stsb", "mrpc", "rte", "cola"], choices=list(TASKS),
                   help="tasks fine-tuned on their full train sets (SST-2: --sst2_train_samples)")
    g.add_argument("--curve_task", default="sst2", choices=list(TASKS), help="the task of the learning curve")
    g.add_argument("--label_counts", nargs="*", type=int, default=[500, 1000, 2000, 5000],
                   help="the learning curve's training-set sizes (the first N examples; none: no curve)")
    g.add_argument("--learning_rates", nargs="+", default=["1e-4", "3e-4", "1e-3"])
    g.add_argument("--batch_sizes", nargs="+", default=["32"])
    g.add_argument("--epochs", nargs="+", default=["3"])
    g.add_argument("--seeds", nargs="+", default=["1", "2", "3", "4", "5"], help="the same for both models "
                   "(paired); at least 3 for a standard error worth the name")
    g.add_argument("--sst2_train_samples", type=int, default=20000, help="SST-2: the first N of its 67,349 "
                   "training sentences (0: all)")
    g.add_argument("--max_train_samples", type=int, help="every task: the first N training examples (quick runs)")
    g.add_argument("--ft_max_seq_length", type=int, default=128)
    g = p.add_argument_group("task-adaptive pre-training (second row)")
    g.add_argument("--tapt", action="store_true", help="continue pre-training from the general checkpoint on the "
                   "tasks' train texts (`bert-suite corpus --from_task`), fine-tune it the same way")
    g.add_argument("--tapt_steps", type=int, default=1000)
    g.add_argument("--tapt_learning_rate", type=float, help="default: half of --learning_rate")
    g.add_argument("--tapt_dupe_factor", type=int, default=5)
    g.add_argument("--tapt_with_general", action="store_true", help="mix the general corpus into the TAPT text")
    return p.parse_args(argv)


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    command = "python benchmarks/pretrain_payoff.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    data_root = Path(args.data)
    if not (data_root / "glue").is_dir() or not (data_root / "corpus").is_dir():
        print(f"no GLUE folders or corpus under {data_root}: skipping")
        return None
    if args.label_counts:  # before any work: a count the task cannot give fails at once
        check_label_counts(args.label_counts, args.curve_task, train_size(args, args.curve_task))
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    device = device_name()
    args.accelerate_config = args.accelerate_config or str(
        ROOT / "recipes" / "configs" / "accelerate" / ("cpu.yaml" if device.startswith("cpu") else "gpu.yaml"))
    args.seeds = [int(s) for s in args.seeds]
    measured = list(dict.fromkeys([*args.tasks, *([args.curve_task] if args.label_counts else [])]))

    # Corpus: the shared corpora and the measured tasks' train texts, without their dev and test text
    sources = args.corpus or default_corpus(data_root)
    corpus, decontamination = clean_corpus(args, out, sources, measured)
    corpus_name = (", ".join(Path(c).name for c in args.corpus) if args.corpus else
                   f"../shared/data/corpus ({len(sources)} files: Gutenberg, WikiText-2 test, film reviews, Brown, "
                   "State of the Union)") + ("" if args.no_task_text else f" + train text of {', '.join(measured)}") + \
        f"; {decontamination['ngram']}-gram decontaminated against their dev and test sets"

    # Vocabulary
    if args.released_vocab:
        vocab = data_root / "vocab" / "bert-base-uncased" / "vocab.txt"
    else:
        vocab = out / "tokenizer"
        check_stage(out, "tokenizer", {"input": corpus, "vocab_size": args.vocab_size, "lowercase": True},
                    (vocab / "vocab.txt").is_file())
        if not (vocab / "vocab.txt").is_file():
            run([BIN / "bert-suite", "tokenizer", "--input", *corpus, "--vocab_size", args.vocab_size, "--lowercase",
                 "--output_dir", vocab], out / "logs" / "tokenizer.log", "vocabulary")
    vocab_size = sum(1 for _ in open(vocab / "vocab.txt" if vocab.is_dir() else vocab, encoding="utf-8"))

    data = pretraining_data(args, out, corpus, vocab)

    # Pre-training, with steps from --steps or planned from the budget
    notes = []
    steps = args.steps
    if steps is None:
        if args.pretrain_minutes is None:
            raise SystemExit("pretrain_payoff: give --steps or --pretrain_minutes")
        per_step, calibration_seconds, overhead = calibrate(args, data, vocab, out / "calibration")
        steps = planned_steps(args.pretrain_minutes, per_step, calibration_seconds, overhead, args.budget_safety)
        command += f" --steps {steps}"  # what reruns it exactly
        notes.append(f"Steps planned from a {args.calibration_steps}-step calibration run ({calibration_seconds:.0f} s,"
                     f" {per_step:.3f} s a step, {overhead:.0f} s start-up) to fit {args.pretrain_minutes:g} minutes "
                     f"with the calibration in them.")
    general = out / "pretrain"
    pretrain(args, recipe_overrides(args, data, vocab, general, steps, args.learning_rate), general, steps,
             "pre-training")
    minutes = minutes_of(general)
    if args.pretrain_minutes and minutes > args.pretrain_minutes:
        notes.append(f"Pre-training took {minutes:.1f} minutes, over the {args.pretrain_minutes:g}-minute budget.")
    facts = pretraining_facts(args, general, list(data.values()), phase_steps(args, steps), vocab_size,
                              corpus_name, minutes, device, decontamination)

    def unusable(where, why):  # before hours of grids, not after
        raise SystemExit(f"pretrain_payoff: {general}: {where}: {why}")

    check_pretraining(facts, unusable)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    standing = plateau(general / "metrics.jsonl", args.plateau_accuracy)
    plot_plateau(general / "metrics.jsonl", args.plateau_accuracy, results / f"{args.name}_plateau.png")
    print(f"[payoff] pre-training {plateau_line(standing)}; curve: {results / f'{args.name}_plateau.png'}", flush=True)
    notes.append(f"Pre-training {plateau_line(standing)}.")
    if standing["left_at_step"] is None and not args.finetune_on_plateau:
        raise SystemExit(f"pretrain_payoff: the pre-training never reached {100 * args.plateau_accuracy:.0f}% held-out "
                         "MLM accuracy, so there is little to transfer: change the design (objective, masking, length, "
                         "batch, learning rate, model size) before fine-tuning, or pass --finetune_on_plateau")

    # Fine-tuning: the pre-trained checkpoint and its random twin, same grid, seeds and label subsets
    start = fine_tuning_checkpoint(general / "final", args.model_size)

    specs = {task: task_spec(args, task) for task in args.tasks}
    curve_specs = {str(n): task_spec(args, args.curve_task, n) for n in args.label_counts}
    names = {"pretrained": "pretrained", "random": "random"}
    result = compare(args, out, {"pretrained": str(start), "random": f"random:{start}"},
                     [*specs.values(), *curve_specs.values()], "fine-tuning (bert-suite compare)")
    settings = {"learning_rates": [float(x) for x in args.learning_rates],
                "batch_sizes": [int(x) for x in args.batch_sizes], "epochs": [float(x) for x in args.epochs],
                "seeds": args.seeds, "max_seq_length": args.ft_max_seq_length,
                "train_samples": {t: args.max_train_samples or (args.sst2_train_samples if t == "sst2" else None)
                                  or "all" for t in args.tasks},
                "curve_train_samples": {args.curve_task: args.label_counts} if args.label_counts else {},
                "selection": "per model, the setting with the best mean dev score over the seeds"}
    curve = {args.curve_task: {n: task_entry(args.curve_task, result["tasks"][spec]["models"], result["seeds"])
                               for n, spec in curve_specs.items()}} if curve_specs else {}
    record = build_record(command, facts, settings, collect(args, out, result, names, specs), curve)
    write_outputs(out, "payoff", record, "Pre-trained vs random initialisation on GLUE", notes)
    (results / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    if curve:
        plot_curve(curve[args.curve_task], args.curve_task, TASKS[args.curve_task][1],
                   results / f"{args.name}_curve.png")
    print(f"[payoff] wrote {results / f'{args.name}.json'}" + (f" and {results / f'{args.name}_curve.png'}"
                                                               if curve else ""))

    if args.tapt:
        record = task_adaptive(args, out, vocab, vocab_size, corpus, corpus_name, general, start, specs, settings,
                               command, device, notes, decontamination)
    return record


def task_adaptive(args, out, vocab, vocab_size, corpus, corpus_name, general, start, specs, settings, command,
                  device, notes, decontamination) -> dict:
    """Task-adaptive pre-training: the general checkpoint continued on the tasks' train texts (+ the general
    corpus with --tapt_with_general), fine-tuned with the same protocol; the general model's and the random
    twin's grids are reused (the same names and --model values in the same compare folder)."""
    tapt = out / "tapt"
    texts = []
    for task in args.tasks:
        text = tapt / "text" / f"{task}-train.txt"
        if not text.is_file():
            run([BIN / "bert-suite", "corpus", "--from_task", task, "--data_dir",
                 Path(args.data) / "glue" / TASKS[task][0], "--output_dir", tapt / "text"],
                tapt / "logs" / "text.log", f"train text of {task}")
        texts.append(text)
    if args.tapt_with_general:  # in the lines format, so one pretrain-data call reads both
        general_lines = tapt / "text" / "general.txt"
        if not general_lines.is_file():
            from bert_suite.pretraining.text_files import iter_documents

            docs = ["\n".join(doc) for path in corpus for doc in iter_documents(path) if doc]
            general_lines.write_text("\n\n".join(docs) + "\n")
        texts.append(general_lines)
    data = {args.max_seq_length: tapt / f"data{args.max_seq_length}"}
    if not (data[args.max_seq_length] / "pretrain_data_stats.json").is_file():
        run([BIN / "bert-suite", "pretrain-data", "--input", *texts, "--tokenizer", vocab, "--format", "lines",
             "--max_seq_length", args.max_seq_length, "--dupe_factor", args.tapt_dupe_factor, "--num_proc", 2,
             "--output_dir", data[args.max_seq_length]], tapt / "logs" / "data.log", "TAPT data")
    run_dir = tapt / "pretrain"
    steps = args.tapt_steps
    phase2, args.phase2 = args.phase2, False  # task text is short: length 128 only
    overrides = recipe_overrides(args, data, vocab, run_dir, steps, args.tapt_learning_rate or args.learning_rate / 2,
                                 init_from=general / "final")
    args.phase2 = phase2
    pretrain(args, overrides, run_dir, steps, "task-adaptive pre-training")
    base = pretraining_facts(args, general, [out / f"data{args.max_seq_length}"] + ([out / f"data{args.phase2_length}"] if phase2 else []),
                             phase_steps(args, finished_steps(general)), vocab_size, corpus_name, 0, device,
                             decontamination)
    own = pretraining_facts(args, run_dir, [data[args.max_seq_length]], [(steps, args.batch_size)], vocab_size, "", 0,
                            device, decontamination)
    minutes = minutes_of(general) + minutes_of(run_dir)
    text_name = " + ".join([corpus_name if args.tapt_with_general else "", "train text of " + ", ".join(args.tasks)])
    facts = {**own, "minutes": round(minutes, 2), "steps": base["steps"] + steps, "tokens": base["tokens"] + own["tokens"],
             "corpus": f"{corpus_name}, then {text_name.strip(' +')}"}
    adapted = fine_tuning_checkpoint(run_dir / "final", args.model_size)
    result = compare(args, out, {"tapt": str(adapted), "pretrained": str(start), "random": f"random:{start}"},
                     list(specs.values()), "task-adaptive fine-tuning (bert-suite compare)")
    command += " --tapt" if " --tapt" not in command else ""
    names = {"tapt": "pretrained", "pretrained": "general", "random": "random"}
    record = build_record(command, facts, settings, collect(args, out, result, names, specs))
    tapt_notes = [*notes, f"Task-adaptive: {steps} more steps from the general checkpoint on the tasks' train "
                  "texts; its held-out perplexity and NSP accuracy are on that text. 'general only' is the general "
                  "checkpoint's row of payoff.json; in the record, 'pretrained' is the task-adaptive model."]
    write_outputs(out, "payoff_tapt", record, "Task-adaptive pre-training vs random initialisation",
                  tapt_notes, {"pretrained": "task-adaptive", "general": "general only"})
    return record


if __name__ == "__main__":
    main()
