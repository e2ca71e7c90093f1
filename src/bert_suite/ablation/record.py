"""The study's record: the pre-training facts of each variant, its questions as paired differences (per task
and along the curve), and ablation.json, ablation.md and ablation.png (again as STEM.* in --results_dir)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..io import atomic_write_text, save_figure
from .stages import data_stats, minutes_of
from .study import Study


def evaluations(run: Path) -> list[dict]:
    """The held-out evaluations in a recipe run's metrics.jsonl, in step order."""
    return [e for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if any(k.startswith("eval_mlm_") for k in e)]


def pretraining_record(study: Study, runs: dict[str, Path], data: dict | None, steps: int) -> dict:
    """Per pre-trained variant whose runs are in `runs` (run name -> folder): `run_facts` of its run (one seed), or with several seeds `seeds`, `by_seed` ({seed:
    run_facts}) and, at the top, each fact the runs share and the mean of those they do not (minutes, held-out
    accuracy and perplexity)."""
    record = {}
    for name in (n for n in study.pretrained if all(r.name in runs for r in study.runs([n]))):  # those given
        facts = {str(run.seed): run_facts(study, runs[run.name], (data or {}).get(name), steps)
                 for run in study.runs([name])}
        if len(facts) == 1:
            record[name] = {**next(iter(facts.values())), "seeds": study.seeds_of(name)}
            continue
        first = next(iter(facts.values()))
        shared = {k: v for k, v in first.items() if all(f.get(k) == v for f in facts.values())}
        means = {k: round(sum(f[k] for f in facts.values()) / len(facts), 6)
                 for k in ("minutes", "held_out_accuracy", "held_out_perplexity") if k not in shared}
        record[name] = {**shared, **means, "seeds": study.seeds_of(name), "by_seed": facts}
    return record


def run_facts(study: Study, run: Path, data, steps: int) -> dict:
    """One run: steps, minutes, tokens (steps x batch x mean instance length, per phase), held-out accuracy of the
    last evaluation (MLM accuracy at masked positions, or next-token accuracy for a left-to-right model: not
    comparable), its kind, the NotNext share of its instances and its precision; in a study whose variants differ
    in data, also which data it used (`data_facts`)."""
    results = json.loads((run / "pretrain_results.json").read_text())
    config = results["config"]
    first = math.ceil(steps * config["phase1_fraction"]) if config.get("train_data_phase2") else steps
    phases = [(first, config["per_device_train_batch_size"], data_stats(Path(config["train_data"])))]
    if config.get("train_data_phase2"):
        phases.append((steps - first, config["per_device_train_batch_size_phase2"] or
                       config["per_device_train_batch_size"], data_stats(Path(config["train_data_phase2"]))))
    last = evaluations(run)[-1]
    facts = {"steps": steps, "minutes": round(minutes_of(run), 2),
             "tokens": int(sum(s * b * st["mean_instance_length"] for s, b, st in phases)),
             "held_out_accuracy": last["eval_mlm_accuracy"],
             "held_out_perplexity": last["eval_mlm_perplexity"],  # Table 6's column (MLM models)
             "accuracy_kind": "next_token" if config["causal_attention"] else "mlm",
             "not_next_share": round(sum(s * st["not_next_share"] for s, _, st in phases) / steps, 4),
             "precision": results.get("precision")}
    if "pretrained_on" in results:  # pre-trained on another machine (tools/study_transfer.py install)
        facts["pretrained_on"] = results["pretrained_on"]["device"]
    if len(results.get("objectives") or []) > 1:  # an objective schedule: which objective when
        facts["objectives"] = results["objectives"]
    if "started_from" in results:  # its first steps are another run's (stages.reused_start)
        start = Path(results["started_from"]["checkpoint"])
        donor = start.parent.parent.name
        facts["started_from"] = {"variant": next((r.variant for r in study.runs() if r.name == donor), donor),
                                 "step": results["started_from"]["step"]}
    if study.data_variants and data:
        facts["data"] = data_facts(data)
    return facts


def data_facts(data) -> dict:
    """Which corpus, vocabulary and instances a variant used (their stage folders), with the corpus's documents
    and tokens, the instances (phase 1's) and their NotNext share, and the vocabulary's size."""
    from .stages import vocab_size

    stats = data_stats(data.instances[data.lengths[0]])
    return {"corpus": f"corpus{data.labels['corpus']}",
            "vocabulary": str(data.vocab) if data.vocab.is_file() else f"vocabulary{data.labels['vocabulary']}",
            "instances": f"instances{data.labels['instances']}", "documents": stats["documents"],
            "corpus_tokens": stats["corpus_tokens"], "instance_count": stats["instances"],
            "not_next_share": round(stats["not_next_share"], 4), "vocab_size": vocab_size(data.vocab)}


def contrast(first: dict, second: dict, seeds: list | None) -> dict:
    """`seeded_comparison` of two rows (a task's entries, or two points of the curve), on their common
    pre-training seeds (`paired_on` names them where either row has others)."""
    from ..report import common_comparison, seed_table

    return common_comparison(seed_table(first, seeds), seed_table(second, seeds))


def contrasts_of(study: Study, result: dict, curve: dict) -> tuple[dict, dict]:
    """The study's questions as paired differences (first minus second; `seeded_comparison`: by pre-training seed
    when there are several, else by fine-tuning seed): per compared task, and along the curve where both variants
    have one ({label: {task: {"ahead_from": step or None, "points": [...]}}})."""
    seeds = result.get("seeds")
    per_task, along = {}, {}
    for c in study.contrasts:
        per_task[c.label] = {key: contrast(entry["models"][c.first], entry["models"][c.second], seeds)
                             for key, entry in result["tasks"].items()}
        first, second = curve.get(c.first, {}), curve.get(c.second, {})
        for key in [k for k in first if k in second]:  # the curve's order, so a rerun writes the same bytes
            points = [{"step": a["step"], **contrast(a, b, seeds)} for a, b in zip(first[key], second[key], strict=True)]
            ahead = [p["step"] for i, p in enumerate(points) if all(q["verdict"] == "ahead" for q in points[i:])]
            along.setdefault(c.label, {})[key] = {"ahead_from": ahead[0] if ahead else None, "points": points}
    return per_task, along


def curve_unit(record: dict) -> str:
    """What the curve table's ± counts, in one sentence: pre-trainings where a variant has several, else the
    fine-tuning seeds of its one checkpoint."""
    seeds = ", ".join(map(str, record.get("seeds") or []))
    counts = {name: max((len(p.get("pretraining_scores") or {}) for points in by_task.values() for p in points),
                        default=1) for name, by_task in record["curve"].items()}
    several = {name: n for name, n in counts.items() if n > 1}
    if several and len(set(counts.values())) == 1:
        return (f"Each cell: the mean ± SE over the variant's {max(several.values())} pre-trainings, each "
                f"pre-training's score the mean over fine-tuning seeds {seeds} at that step: the SE counts "
                "pre-trainings (the recipes).")
    if several:
        single = [name for name in counts if name not in several]
        return (f"Each cell: the mean ± SE over the variant's pre-trainings "
                f"({', '.join(f'{name}: {n}' for name, n in several.items())}), each pre-training's score the mean "
                f"over fine-tuning seeds {seeds} at that step: the SE counts pre-trainings (the recipes)"
                + (f"; over fine-tuning seeds {seeds} for a variant of one pre-training ({', '.join(single)}): that "
                   "checkpoint" if single else "") + ".")
    return (f"Each cell: the mean ± SE over fine-tuning seeds {seeds} of one pre-training a variant: these "
            "checkpoints, not the recipes that made them.")


def spread_rows(record: dict) -> list[list[str]]:
    """Per task, the standard deviation of a variant's score across pre-trainings (of its per-pre-training means)
    and across fine-tuning seeds within a pre-training, as the root mean square over the pre-trained variants that
    have several pre-trainings (a random twin's spread is of its random draws, not of pre-training)."""
    rows = []
    random = {name for name, model in record.get("models", {}).items() if model.get("random_init")}
    for key, entry in record["tasks"].items():
        found = [m for name, m in entry["models"].items() if m.get("sd_finetuning") is not None and name not in random]
        if found:
            rms = [math.sqrt(sum(m[k] ** 2 for m in found) / len(found)) for k in ("sd_pretraining", "sd_finetuning")]
            rows.append([key, f"{rms[0]:.2f}", f"{rms[1]:.2f}", str(len(found))])
    return rows


def markdown(record: dict, study: Study, decontamination: dict | None) -> str:
    """ablation.md; `decontamination`: {corpus stage: its counts} of the corpora that were decontaminated."""
    from ..compare import markdown_table, same_model_lines, unit_text
    from ..report import degrees_text, md_table, scopes_text

    lines = [f"# {study.title}", "", f"`{record['command']}`", "", *markdown_table(record), "",
             unit_text(record) + " Each model's setting is the one with the best mean dev score over its seeds and "
             "pre-trainings (per-seed scores and settings: ablation.json).", "", *same_model_lines(record)]
    tasks = list(record["tasks"])
    if record["contrasts"]:
        rows = [[label, *(f"{d['difference']:+.1f} ± {d['se']:.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] "
                          f"{d['verdict']}" for d in (by_task[t] for t in tasks))]
                for label, by_task in record["contrasts"].items()]
        found = [d for by_task in record["contrasts"].values() for d in by_task.values()]
        lines += ["## The study's questions, paired by seed", "", *md_table(["question", *tasks], rows), "",
                  f"Each cell: first minus second, the mean paired difference ± its SE ({scopes_text(found)}) [95% "
                  f"interval, Student's t with {degrees_text(found)}], and the verdict: ahead or behind when "
                  "the interval lies wholly above or below zero, else level.", ""]
        subset = {label: by_task[tasks[0]]["paired_on"] for label, by_task in record["contrasts"].items()
                  if tasks and "paired_on" in by_task[tasks[0]]}
        if subset:
            pairs = "; ".join(f"{label} (seeds {', '.join(seeds)})" for label, seeds in subset.items())
            lines += [f"Paired on the pre-training seeds both variants have, not on every pre-training of either: "
                      f"{pairs}.", ""]
        one = [label for label, by_task in record["contrasts"].items()
               if any(d["scope"] == "checkpoints" for d in by_task.values())]
        if one:
            single = all(len(m.get("pretraining_scores") or {"1": 0}) == 1 for entry in record["tasks"].values()
                         for m in entry["models"].values())
            lines += [("One pre-training a variant: these verdicts are about these checkpoints" if single else
                       f"Paired on one pre-training ({', '.join(one)}): "
                       f"{'that verdict is' if len(one) == 1 else 'those verdicts are'} about those checkpoints") +
                      ", not about the recipes that made them (a second pre-training of one recipe can move a score as "
                      "much as the objectives under comparison do). A verdict about the recipes needs "
                      f"pretraining.seeds: two{' in common' * (not single)} at the least, three or more for a usable "
                      "interval (with 2, t has 1 degree of freedom: 12.7 SE on each side).", ""]
    spread = spread_rows(record)
    if spread:
        lines += ["## Two sources of noise", "", *md_table(["task", "SD across pre-trainings", "SD across fine-tuning "
                                                             "seeds", "variants"], spread), "",
                  "The standard deviation of a variant's score across its pre-trainings (each the mean over the "
                  "fine-tuning seeds) and across fine-tuning seeds within one pre-training (pooled), as the root mean "
                  "square over the pre-trained variants (not the random twins): where the first is not small "
                  "against the second, one pre-training a variant cannot rank the recipes.", ""]
    if record["curve"]:
        steps = sorted({p["step"] for by_task in record["curve"].values() for ps in by_task.values() for p in ps})
        rows = [[name, key, *(next((f"{p['mean']:.1f} ± {p['se']:.1f}" for p in points if p["step"] == s), "")
                              for s in steps)]
                for name, by_task in record["curve"].items() for key, points in by_task.items()]
        lines += ["## Fine-tuning score against pre-training steps", "",
                  *md_table(["variant", "task", *(f"{s:,}" for s in steps)], rows), "", curve_unit(record), ""]
        contrasts = record.get("curve_contrasts", {})
        points = [p for by_task in contrasts.values() for f in by_task.values() for p in f["points"]]
        if points:
            lines += [f"Paired differences along the curve, first minus second ± SE ({scopes_text(points)}):", ""]
        for label, by_task in contrasts.items():
            for key, found in sorted(by_task.items()):
                where = (f"ahead (95% interval above zero) from step {found['ahead_from']:,} on" if found["ahead_from"]
                         else f"not ahead to the end ({found['points'][-1]['step']:,} steps)")
                diffs = ", ".join(f"{p['step']:,}: {p['difference']:+.1f} ± {p['se']:.1f}" for p in found["points"])
                lines.append(f"- {label}, {key}: {where} ({diffs})")
        for name, by_task in record["curve"].items():
            given = sorted({(p["from"], p["step"]) for ps in by_task.values() for p in ps if "from" in p})
            for donor in dict.fromkeys(d for d, _ in given):
                at = ", ".join(f"{s:,}" for d, s in given if d == donor)
                lines += ["", f"{name}'s points at {at} steps are {donor}'s: its snapshots there are byte for byte "
                          f"{donor}'s (a run started from {donor}'s checkpoint has copies of them), so they were not "
                          "fine-tuned again."]
        lines.append("")
    rows = [[name, seed, f"{f['steps']:,}", f"{f['minutes']:.1f}", f"{f['tokens']:,}",
             f"{100 * f['held_out_accuracy']:.1f}%", f["accuracy_kind"], f"{f['not_next_share']:.3f}",
             str(f.get("precision"))]
            for name, facts in record["pretraining"].items()
            for seed, f in (facts.get("by_seed") or {str(facts["seeds"][0]): facts}).items()]
    lines += ["## Pre-training", "", *md_table(["variant", "seed", "steps", "minutes", "tokens", "held-out accuracy",
                                                "kind", "NotNext share", "precision"], rows), ""]
    elsewhere = {name: f["pretrained_on"] for name, f in record["pretraining"].items() if "pretrained_on" in f}
    if elsewhere:
        lines += ["Pre-trained on another machine and brought back in bf16 (weights back in fp32): " + ", ".join(
            f"{name} on {device}" for name, device in elsewhere.items()) + "; the others here. The precision column "
            "says each run's arithmetic.", ""]
    for name, facts in record["pretraining"].items():
        f = next((f for f in (facts.get("by_seed") or {"": facts}).values() if "started_from" in f), {})
        if "started_from" in f:
            start = f["started_from"]
            lines += [f"{name}'s first {start['step']:,} steps are {start['variant']}'s: the same computation (data, "
                      f"schedule, seed, weights drawn alike), so it started from {start['variant']}'s checkpoint at step "
                      f"{start['step']:,} rather than train them again; its minutes are those of its own steps.", ""]
    if any(f.get("accuracy_kind") == "next_token" for f in record["pretraining"].values()):
        lines += ["MLM accuracy (at masked positions) and next-token accuracy are not comparable: a masked model sees "
                  "both sides of the token it predicts, a left-to-right one only the left.", ""]
    if study.data_variants:
        rows = [[name, f["data"]["corpus"], f"{f['data']['documents']:,}", f"{f['data']['corpus_tokens']:,}",
                 f["data"]["vocabulary"], f"{f['data']['vocab_size']:,}", f["data"]["instances"],
                 f"{f['data']['instance_count']:,}", f"{f['data']['not_next_share']:.3f}"]
                for name, f in record["pretraining"].items() if "data" in f]
        lines += ["## Data", "", *md_table(["variant", "corpus", "documents", "tokens", "vocabulary", "pieces",
                                            "instances", "count (phase 1)", "NotNext share"], rows), ""]
    for stage, counts in (decontamination or {}).items():
        named = f" ({stage})" if len(decontamination) > 1 else ""
        lines += [f"Corpus{named}: {counts['sentences_removed']:,} of {counts['sentences']:,} sentences "
                  f"removed by {counts['ngram']}-gram decontamination.", ""]
    if record.get("left_out"):
        lines += [f"Left out (optional tasks with no data in compare.data_dir): {', '.join(record['left_out'])}.", ""]
    if study.notes:
        lines += [study.notes.strip(), ""]
    return "\n".join(lines)


def plot(record: dict, path: Path) -> Path:
    """Bars per task (each variant's mean ± SE) and, with a curve, a panel per curve task: score against
    pre-training steps per variant."""
    from matplotlib.figure import Figure

    from ..compare import bars

    curve_tasks = list(dict.fromkeys(key for by_task in record["curve"].values() for key in by_task))
    width = 1.6 + 1.3 * len(record["tasks"]) * max(1, len(record["models"])) / 3
    fig = Figure(figsize=(width + 4.2 * len(curve_tasks), 4.2), layout="constrained")
    grid = fig.add_gridspec(1, 1 + len(curve_tasks), width_ratios=[width] + [4.2] * len(curve_tasks))
    bars(fig.add_subplot(grid[0, 0]), record)
    models = list(record["models"])
    for i, key in enumerate(curve_tasks, start=1):
        ax = fig.add_subplot(grid[0, i])
        for j, (name, by_task) in enumerate(record["curve"].items()):
            if key in by_task:  # its bars' colour (a curve variant is compared); shrinking markers and other dashes keep equal points in view
                points = by_task[key]
                ax.errorbar([p["step"] for p in points], [p["mean"] for p in points],
                            yerr=[p["se"] or 0 for p in points], marker="osD^v"[j % 5], markersize=max(3, 8 - 2 * j),
                            linestyle=("-", "--", ":", "-.")[j % 4], capsize=3, label=name,
                            color=f"C{models.index(name)}")
        steps = sorted({p["step"] for by_task in record["curve"].values() for p in by_task.get(key, [])})
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(steps, labels=[f"{s:,}" for s in steps])
        ax.set(xlabel="pre-training steps", ylabel="dev score (0-100)", title=f"{key}: score against steps")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def write_record(record: dict, study: Study, out: Path, data: dict, results_dir: Path | None) -> None:
    """The record in OUT/ablation.{json,md,png} (and RESULTS_DIR/STEM.*); `data`: each variant's stages.Data."""
    decontamination = {f"corpus{d.labels['corpus']}": d.decontamination for name, d in data.items()
                       if study.data_of(name)[0].decontaminate}
    text = markdown(record, study, decontamination)
    targets = [(out, "ablation")] + ([(results_dir, study.stem)] if results_dir else [])
    for folder, stem in targets:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / f"{stem}.json", json.dumps(record, indent=2) + "\n")
        atomic_write_text(folder / f"{stem}.md", text)
        plot(record, folder / f"{stem}.png")
    print(text)
    print(f"[ablation] wrote {', '.join(str(folder / stem) + '.{json,md,png}' for folder, stem in targets)}")
