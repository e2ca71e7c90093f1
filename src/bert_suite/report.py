"""Report of a hyper-parameter grid: best trial, CSV, Markdown summary and PNG plots.

A trial record is a plain dict (see `REQUIRED_KEYS`; `metrics`, `history`, `train_runtime` and
`error` are optional). Scores are fractions as the Trainer writes them; the Markdown shows them
as percentages with two decimals, the way the BERT paper prints its tables.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import statistics
from pathlib import Path

from .io import atomic_write_text, save_figure

logger = logging.getLogger(__name__)

REQUIRED_KEYS = ("trial", "learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed", "state")
SETTING_KEYS = ("learning_rate", "per_device_train_batch_size", "num_train_epochs")
LORA_KEY = "lora_r"  # present in the trials of a grid over LoRA ranks
# Trainer metrics that are bookkeeping or losses, not scores: never shown as percentages.
_NOT_SCORE_MARKERS = ("loss", "runtime", "per_second", "epoch", "thresh", "total")


def _validate(trials: list[dict], metric: str) -> None:
    for i, t in enumerate(trials):
        missing = [k for k in REQUIRED_KEYS if k not in t]
        if not missing and t["state"] == "complete" and metric not in (t.get("metrics") or {}):
            missing = [f"metrics[{metric!r}]"]
        if missing:
            raise ValueError(f"trials[{i}] (trial {t.get('trial', '?')}): missing key {missing[0]!r}")


def _score(trial: dict, metric: str) -> float | None:
    """The trial's selection score, or None when it cannot be ranked (not complete, or NaN)."""
    if trial["state"] != "complete":
        return None
    value = (trial.get("metrics") or {}).get(metric)
    return None if value is None or math.isnan(value) else float(value)


def select_best(trials: list[dict], metric: str) -> dict | None:
    """The complete trial with the highest `metric`; ties go to the lower trial number."""
    _validate(trials, metric)
    ranked = [(s, t) for t in trials if (s := _score(t, metric)) is not None]
    if not ranked:
        return None
    return max(ranked, key=lambda st: (st[0], -st[1]["trial"]))[1]


def seed_scores(trials: list[dict], metric: str) -> dict[tuple, dict[int, float]]:
    """(learning rate, batch size, epochs) -> {seed: score} from the complete trials (a failed
    trial, diverged or crashed, has no score)."""
    scores: dict[tuple, dict[int, float]] = {}
    for t in trials:
        if (s := _score(t, metric)) is not None:
            scores.setdefault(tuple(t[k] for k in SETTING_KEYS), {})[t["seed"]] = s
    return scores


def choose_setting(scores: dict[tuple, dict[int, float]], seeds: list[int]) -> tuple | None:
    """The setting with the highest mean over `seeds` (ties: the first listed), as a model is compared
    with another over restarts: by its setting's mean, not by its luckiest seed. Only settings scored
    on every seed compete (one with a failed seed is not comparable); None when none has them all."""
    full = {setting: by_seed for setting, by_seed in scores.items() if set(seeds) <= set(by_seed)}
    if not full:
        return None
    return max(full, key=lambda setting: statistics.fmean(full[setting][s] for s in seeds))


def paired_difference(first: list[float], second: list[float]) -> tuple[float, float]:
    """Mean of the per-seed differences first - second, and its standard error (the differences'
    sample standard deviation over the square root of their number). Pairing by seed removes what
    both models share on a seed: data order, label subset, the head's initialisation."""
    if len(first) != len(second) or len(first) < 2:
        raise ValueError(f"paired scores need the same number (two or more) for both: got {len(first)} and "
                         f"{len(second)}")
    diffs = [a - b for a, b in zip(first, second, strict=True)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and standard error (sample standard deviation / sqrt(n)); the error is None for one value."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None)


BOOTSTRAP_FROM = 5  # pre-training seeds from which a Multi-Bootstrap interval is given beside the t interval
BOOTSTRAP_DRAWS = 2000


def seeded_comparison(first: dict, second: dict) -> dict:
    """first - second, two tables {pre-training seed: {fine-tuning seed: score}} of the same seeds: the quantity of
    interest is a recipe's expected score over pre-training seeds (the MultiBERTs' view, Sellam et al. 2021), so
    the arms pair by pre-training seed and a pre-training's score is the mean over its fine-tuning runs.

    - Two or more pre-training seeds (`scope` "recipes"): d_s = the mean over fine-tuning seeds of first - second
      for pre-training seed s; `difference` = mean of d_s, `se` = sd(d_s) / sqrt(n), `df` = n - 1.
    - One (`scope` "checkpoints"): the per-seed differences over fine-tuning seeds; `df` = their number - 1.
    `ci95` is Student's t interval with `df`; `verdict` "ahead" when all of it is above zero, "behind" when below,
    else "level", so a verdict never disagrees with its interval. Beside them: `pretrainings` and `finetunings`
    (seeds per pre-training), `sd_pretraining` (of d_s; None with one), `sd_finetuning` (of the per-seed
    differences within a pre-training, pooled), `first_ahead_in` (pre-trainings with d_s > 0) and, from
    BOOTSTRAP_FROM pre-training seeds, `bootstrap95`: a Multi-Bootstrap percentile interval (pre-training seeds
    and, within each, fine-tuning seeds drawn with replacement, the same draw for both arms)."""
    from scipy.stats import t

    tables = [{str(k): {str(f): float(v) for f, v in dict(by_seed).items()} for k, by_seed in dict(x).items()}
              for x in (first, second)]
    if set(tables[0]) != set(tables[1]):
        differ = sorted(set(tables[0]) ^ set(tables[1]))
        raise ValueError(f"the two tables pair by pre-training seed, but seeds {', '.join(differ)} are in one only; "
                         "expected the same pre-training seeds in both")
    if not tables[0]:
        raise ValueError("no pre-training seed: expected {pre-training seed: {fine-tuning seed: score}}")
    pretrainings = list(tables[0])
    for seed in pretrainings:
        a, b = tables[0][seed], tables[1][seed]
        if set(a) != set(b) or not a:
            differ = sorted(set(a) ^ set(b))
            raise ValueError(f"pre-training seed {seed}: fine-tuning seeds {', '.join(differ) or '(none)'} are in one "
                             "table only; expected the same fine-tuning seeds for both")
    diffs = {s: [tables[0][s][f] - tables[1][s][f] for f in tables[0][s]] for s in pretrainings}
    within = [statistics.variance(d) for d in diffs.values() if len(d) > 1]
    sd_finetuning = math.sqrt(statistics.fmean(within)) if within else None
    if len(pretrainings) > 1:
        units, scope = [statistics.fmean(d) for d in diffs.values()], "recipes"
    else:
        units, scope = diffs[pretrainings[0]], "checkpoints"
        if len(units) < 2:
            raise ValueError("one pre-training seed and one fine-tuning seed: a standard error needs two or more "
                             "seeds of either kind")
    n = len(units)
    difference, sd = statistics.fmean(units), statistics.stdev(units)
    se, df = sd / math.sqrt(n), n - 1
    half = float(t.ppf(0.975, df)) * se
    ci95 = [difference - half, difference + half]
    means = [statistics.fmean(d) for d in diffs.values()]
    result = {"difference": difference, "se": se, "ci95": ci95, "df": df, "scope": scope,
              "verdict": "ahead" if ci95[0] > 0 else "behind" if ci95[1] < 0 else "level",
              "pretrainings": len(pretrainings), "finetunings": max(len(d) for d in diffs.values()),
              "sd_pretraining": statistics.stdev(means) if len(means) > 1 else None, "sd_finetuning": sd_finetuning,
              "first_ahead_in": sum(m > 0 for m in means)}
    if len(pretrainings) >= BOOTSTRAP_FROM:
        result["bootstrap95"] = multi_bootstrap([diffs[s] for s in pretrainings])
    return result


def multi_bootstrap(diffs: list[list[float]], draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> list[float]:
    """The 95% percentile interval of the mean paired difference when the pre-training seeds, and within each its
    fine-tuning seeds, are drawn again with replacement (`diffs`: per pre-training seed, its per-fine-tuning-seed
    differences)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    width = max(map(len, diffs))
    table = np.array([d + [np.nan] * (width - len(d)) for d in diffs])  # (pre-training seeds, fine-tuning seeds)
    counts = np.array([len(d) for d in diffs])
    rows = rng.integers(0, len(diffs), size=(draws, len(diffs)))  # (draws, n): the pre-trainings drawn
    cols = (rng.random((draws, len(diffs), width)) * counts[rows][..., None]).astype(int)  # within each, its seeds
    picked = table[rows[..., None], cols]  # (draws, n, width)
    keep = np.arange(width)[None, None, :] < counts[rows][..., None]  # a shorter row draws only its own seeds
    stats = (np.where(keep, picked, 0).sum(-1) / counts[rows]).mean(-1)
    low, high = np.percentile(stats, [2.5, 97.5])
    return [float(low), float(high)]


def one_checkpoint(scores: list[float], seeds: list) -> dict:
    """A list of per-seed scores as seeded_comparison's table of one pre-training: {"1": {seed: score}}."""
    return {"1": dict(zip(map(str, seeds), scores, strict=True))}


def seed_table(entry: dict, seeds: list | None) -> dict:
    """A row of compare.json or ablation.json (its pretraining_scores, {pre-training: per-seed scores}; a record
    without them: its `scores`, one pre-training) as seeded_comparison's table; `seeds` the fine-tuning seeds
    (None: 1, 2, ...)."""
    table = entry.get("pretraining_scores") or {"1": entry["scores"]}
    return {k: dict(zip(map(str, seeds or range(1, len(v) + 1)), v, strict=True)) for k, v in table.items()}


def common_comparison(first: dict, second: dict) -> dict:
    """`seeded_comparison` on the pre-training seeds both tables have (a variant with seeds of its own beside a
    baseline's). Where either has seeds the other lacks, `paired_on` lists the seeds the comparison used, so a
    reader sees that it is not over every pre-training of either; none in common is a ValueError naming both
    sides' seeds."""
    first, second = ({str(k): v for k, v in dict(x).items()} for x in (first, second))
    common = [k for k in first if k in second]
    if not common:
        raise ValueError(f"no pre-training seed in common (first: {', '.join(first)}; second: {', '.join(second)}); "
                         "expected shared pre-training seeds to pair by")
    result = seeded_comparison({k: first[k] for k in common}, {k: second[k] for k in common})
    if len(common) != len(first) or len(common) != len(second):
        result["paired_on"] = common
    return result


def scope_text(comparison: dict) -> str:
    """What a verdict's SE counts, for a table's note: "SE over 3 pre-trainings x 5 fine-tuning seeds", or "these
    checkpoints: SE over 5 fine-tuning seeds"."""
    if comparison["scope"] == "recipes":
        return f"SE over {comparison['pretrainings']} pre-trainings x {comparison['finetunings']} fine-tuning seeds"
    return f"these checkpoints: SE over {comparison['finetunings']} fine-tuning seeds"


def scopes_text(comparisons: list[dict]) -> str:
    """`scope_text` of several comparisons (a table's): one where they agree, else each unit once (a variant with
    pre-training seeds of its own pairs on the seeds it shares with the other side)."""
    texts = list(dict.fromkeys(scope_text(c) for c in comparisons))
    if len(texts) == 1:
        return texts[0]
    parts = list(dict.fromkeys(f"SE over {c['pretrainings']} pre-trainings x {c['finetunings']} fine-tuning seeds"
                               for c in comparisons if c["scope"] == "recipes"))
    parts += list(dict.fromkeys(f"SE over {c['finetunings']} fine-tuning seeds where the two share one pre-training "
                                "(these checkpoints)" for c in comparisons if c["scope"] != "recipes"))
    return "each pair on the pre-trainings both sides have: " + ", or ".join(parts)


def degrees_text(comparisons: list[dict]) -> str:
    """The degrees of freedom of a table's comparisons: "4 degrees of freedom", or "1 or 2 degrees of freedom"
    where they differ."""
    found = sorted({c["df"] for c in comparisons})
    return f"{' or '.join(map(str, found))} degree{'s' * (found != [1])} of freedom"


def _is_score(key: str) -> bool:
    return not any(marker in key for marker in _NOT_SCORE_MARKERS)


def _fmt(value, percent: bool = False) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{100 * value:.2f}" if percent else f"{value:g}"
    return str(value)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table as lines (pipes and newlines in cells escaped), for reports and benchmark results."""
    def cell(text: str) -> str:  # a pipe or newline would break the table layout
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def _setting_keys(trials: list[dict]) -> tuple[str, ...]:
    """What makes a setting (seeds aside): learning rate, batch size, epochs, and the LoRA rank in a grid
    over ranks (--lora_ranks)."""
    return SETTING_KEYS + ((LORA_KEY,) if any(LORA_KEY in t for t in trials) else ())


def _settings(trials: list[dict], metric: str) -> dict[tuple, list[float]]:
    """(lr, batch, epochs[, lora rank]) -> selection scores of its complete trials, in first-seen order."""
    groups: dict[tuple, list[float]] = {}
    keys = _setting_keys(trials)
    for t in trials:
        if (s := _score(t, metric)) is not None:
            groups.setdefault(tuple(t[k] for k in keys), []).append(s)
    return groups


def _columns(metric_keys: list[str], trials: list[dict] | None = None) -> list[str]:
    lora = [LORA_KEY] if trials and LORA_KEY in _setting_keys(trials) else []
    return ["trial", *REQUIRED_KEYS[1:4], *lora, *REQUIRED_KEYS[4:], *metric_keys, "train_runtime", "best", "error"]


TEST_HEADING = "## Test set (best trial only)"


def test_section(best: dict, scores: dict[str, float]) -> str:
    """The grid report's section for a labelled test set, scored once with the best trial (chosen on dev)."""
    rows = [[key.removeprefix("test_"), _fmt(value, _is_score(key))] for key, value in sorted(scores.items())]
    return "\n".join([TEST_HEADING, "",
                      f"Trial {best['trial']}, chosen on dev, scored once on the labelled test set; the test scores "
                      "played no part in the choice.", "", *md_table(["metric (test)", "value"], rows), ""])


def _markdown(trials, metric, task, metric_keys, best, paper, plot_note) -> str:
    lines = [f"# Grid search: {task}", "", f"Selection metric: `{metric}` (dev set, higher is better).", ""]
    if not trials:
        return "\n".join(lines + ["No trials ran.", ""])
    lines += ["## Trials", ""]
    columns = _columns(metric_keys, trials)
    rows = []
    for t in trials:
        star = t is best
        row = [f"**{t['trial']} ★**" if star else str(t["trial"])]
        metrics = t.get("metrics") or {}
        row += [_fmt(t.get(k)) for k in columns[1:columns.index("state") + 1]]
        row += [_fmt(metrics.get(k), _is_score(k)) for k in metric_keys]
        row.append(_fmt(t.get("train_runtime")))
        rows.append(row + ["★" if star else "", t.get("error") or ""])
    lines += md_table(columns, rows) + [""]

    lines += ["## Mean ± std across seeds per setting", ""]
    lora = LORA_KEY in _setting_keys(trials)
    rows = [[f"{key[0]:g}", str(key[1]), f"{key[2]:g}", *([str(key[3])] if lora else []), str(len(v)),
             f"{100 * statistics.fmean(v):.2f} ± {100 * statistics.pstdev(v):.2f}"]
            for key, v in _settings(trials, metric).items()]
    lines += md_table(["learning_rate", "batch size", "epochs", *(["LoRA rank"] if lora else []), "seeds",
                        f"{metric} mean ± std"], rows)
    lines += ["", "std is the population std (ddof=0), so a single seed shows 0.00.", ""]

    failed = [t for t in trials if t["state"] != "complete"]
    if failed:
        lines += ["## Failed trials", ""]
        lines += [f"- trial {t['trial']} ({t['state']}): {' '.join(str(t.get('error') or 'no reason recorded').split())}"
                  for t in failed]
        lines.append("")
    if best is None:
        lines += ["No complete trial: nothing to select.", ""]
    else:
        top = 100 * _score(best, metric)
        lines += [f"Best: trial {best['trial']}, {metric} = {top:.2f} (dev).", ""]
        if paper:
            quoted = ", ".join(f"{name} {value} ({top - value:+.2f})" for name, value in paper.items())
            note = "" if all("dev" in name for name in paper) else (
                " Note: the paper's GLUE numbers are test-set scores, so they are not directly comparable "
                "with a dev score.")
            lines += [f"Best dev {top:.2f} vs the paper's BERT: {quoted}.{note}", ""]
    if plot_note:
        lines += [plot_note, ""]
    return "\n".join(lines)


def heatmap_title(metric: str, epochs: float, rank: int | None = None) -> str:
    """`eval_accuracy, 1 epoch (mean over seeds)`; a grid over LoRA ranks names the rank too."""
    return (f"{metric}, {epochs:g} epoch{'' if epochs == 1 else 's'}" + (f", LoRA rank {rank}" if rank is not None
            else "") + " (mean over seeds)")


def _plots(trials: list[dict], metric: str, best: dict | None, out: Path) -> dict[str, Path]:
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    written: dict[str, Path] = {}
    groups = _settings(trials, metric)
    # one heat map (learning rate x batch size) per number of epochs, and per LoRA rank in a grid over ranks
    for panel in sorted({key[2:] for key in groups}):
        cells = {key[:2]: values for key, values in groups.items() if key[2:] == panel}
        lrs = sorted({lr for lr, _ in cells})
        sizes = sorted({bs for _, bs in cells})
        grid = np.full((len(lrs), len(sizes)), np.nan)
        for (lr, bs), values in cells.items():
            grid[lrs.index(lr), sizes.index(bs)] = 100 * statistics.fmean(values)
        epochs, rank = panel[0], (panel[1] if len(panel) > 1 else None)
        fig = Figure(figsize=(2.5 + 1.2 * len(sizes), 1.5 + 0.8 * len(lrs)), layout="constrained")
        ax = fig.add_subplot()
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        fig.colorbar(image, ax=ax, label=f"{metric} (%)")
        ax.set(xticks=range(len(sizes)), xticklabels=[str(s) for s in sizes], xlabel="batch size",
               yticks=range(len(lrs)), yticklabels=[f"{lr:g}" for lr in lrs], ylabel="learning rate",
               title=heatmap_title(metric, epochs, rank))
        middle = np.nanmean([np.nanmin(grid), np.nanmax(grid)])
        for (r, c), value in np.ndenumerate(grid):
            if not np.isnan(value):  # dark text on the bright end of viridis, light on the dark end
                ax.text(c, r, f"{value:.2f}", ha="center", va="center", color="k" if value > middle else "w")
        name = f"heatmap_epochs{epochs:g}" + (f"_r{rank}" if rank is not None else "") + ".png"
        written[name] = save_figure(fig, out / name)

    points = [(h["epoch"], h[metric]) for h in (best or {}).get("history") or [] if "epoch" in h and metric in h]
    if points:
        fig = Figure(figsize=(5, 3.5), layout="constrained")
        ax = fig.add_subplot()
        ax.plot([e for e, _ in points], [100 * v for _, v in points], marker="o")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="epoch", ylabel=f"{metric} (%)", title=f"best trial {best['trial']}: dev {metric}")
        written["best_trial_curve.png"] = save_figure(fig, out / "best_trial_curve.png")
    elif best is not None:
        logger.warning("best trial %s has no per-epoch %s in its history: no curve plotted", best["trial"], metric)
    return written


def write_grid_report(trials: list[dict], metric: str, output_dir: str | Path, task: str,
                      paper: dict | None = None) -> dict[str, Path]:
    """Write grid_results.csv, grid_results.md and the PNG plots into `output_dir`.

    Returns file name -> path for every file written. Plots are skipped, with a logged warning
    and a note in the Markdown, when no trial completed or matplotlib is not installed.
    """
    _validate(trials, metric)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    best = select_best(trials, metric)
    metric_keys = sorted({k for t in trials for k in (t.get("metrics") or {})})
    columns = _columns(metric_keys, trials)

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for t in trials:
        values = {**(t.get("metrics") or {}), **t, "best": int(t is best), "error": t.get("error") or ""}
        writer.writerow([values.get(c, "") for c in columns])
    written = {"grid_results.csv": atomic_write_text(out / "grid_results.csv", buffer.getvalue())}

    plot_note = ""
    if best is None:
        plot_note = "No plots: no trial completed."
    else:
        try:
            written.update(_plots(trials, metric, best, out))
        except ImportError:
            plot_note = "No plots: matplotlib is not installed."
    if plot_note:
        logger.warning("%s (%s)", plot_note, out)
    text = _markdown(trials, metric, task, metric_keys, best, paper, plot_note)
    written["grid_results.md"] = atomic_write_text(out / "grid_results.md", text)
    return written
