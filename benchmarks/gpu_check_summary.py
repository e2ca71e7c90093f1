# Command: python benchmarks/gpu_check_summary.py --parts runs/gpu-check/parts --out runs/gpu-check [--device cuda] [--commit HASH] [--status NAME=STATE ...] [--merge EARLIER/gpu_check.json ...]
"""The last step of benchmarks/gpu_check.sh: every part's JSON merged into OUT/gpu_check.json; the figures of issues
62 and 63 into OUT/gpu_record.json ({device, date, commit, figures}, a figure not measured null: the file
benchmarks/results/gpu/ keeps); OUT/summary.md with the tables and the goals (GOALS; and issue 49's, tiny and mini at
128 x 128 >= 5x the tokens/s of the step before: the `before` variant of this run, else the first GPU measurement),
each met or missed. A step's figures are its best form's (pretrain_step.py's eager, compiled, graph, compiled+graph);
the recipe's against its step's at the same length and tokens a step. A --quick run on the CPU fills the same figures
at its toy sizes in fp32 (device "cpu": never filed). --merge: the gpu_check.json of earlier calls on the same machine
and commit (one call's budget covers part of the steps), their parts and steps beside this run's, into one record."""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path

from common import table

# The first GPU measurement (H100 80GB HBM3, main 4889d2e): tokens/s at 16,384 tokens a step
FIRST_MEASURED = {"tiny": 1_545_162, "mini": 986_840}
FORMS = ("eager", "compiled", "graph", "compiled+graph")  # the recipe's step (pretrain_step.py's variants)
# figure -> (goal, target, whether the figure must be at least the target (else at most)): issues 49, 62 and 63
GOALS = {"pretrain_base_128_mfu": ("base at 128: MFU >= 0.45", 0.45, True),
         "pretrain_base_512_mfu": ("base at 512: MFU >= 0.40", 0.40, True),
         **{f"recipe_over_step_{p}": (f"the recipe, {p}: padded tokens/s >= 0.9x its step's", 0.9, True)
            for p in ("tiny", "mini", "base")},
         "finetune_rte_base_bf16_over_stock": ("fine-tuning base on RTE, bf16: >= 3x stock's examples/s", 3, True),
         "finetune_first_epoch_over_steady": ("fine-tuning: the first epoch <= 1.5x a steady one", 1.5, False),
         "grid_rte_base_bf16_over_stock": ("RTE grid subset, base, bf16: the stock loop's time >= 5x ours", 5, True)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", type=Path, help="the step's JSON files (gpu_check.sh's OUT/parts)")
    p.add_argument("--merge", type=Path, nargs="*", default=[],
                   help="earlier calls' gpu_check.json (a part of this run's of the same name replaces theirs)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda", help="the device gpu_check.sh was told (cpu: the record's device)")
    p.add_argument("--commit", help="the commit of the measured tree (git rev-parse HEAD, or the bundle's)")
    p.add_argument("--status", nargs="*", default=[], help="NAME=STATE of each step, as gpu_check.sh ran it")
    args = p.parse_args(argv)
    return args if args.parts or args.merge else p.error("give --parts, --merge or both")


def step_rows(parts: dict, preset: str, length: int | None = None, tokens: int | None = None,
              variants: tuple = FORMS) -> list[dict]:
    """The pre-training parts' rows of `preset` and `variants` (at a length and tokens a step, where given)."""
    return [r for name, part in parts.items() if name.startswith("pretrain-") for r in part.get("rows", [])
            if r["preset"] == preset and r["variant"] in variants and length in (None, r["seq_len"])
            and tokens in (None, r["seq_len"] * r["batch"])]


def best(rows: list[dict], key: str) -> dict | None:
    return max(rows, key=lambda r: r[key], default=None)


def in_precision(by_precision: dict) -> float | None:
    """bf16's figure; a run of one precision only (the CPU's --quick: fp32) gives that one's."""
    return by_precision.get("bf16", next(iter(by_precision.values())) if len(by_precision) == 1 else None)


def figures(parts: dict) -> dict:
    """The record's figures from the parts (None: not measured)."""
    train = parts.get("finetune", {}).get("tasks", {}).get("rte", {}).get("train", {})
    out = {"finetune_rte_base_bf16_over_stock": in_precision(train.get("ratio_by_precision", {})),
           "finetune_first_epoch_over_steady": in_precision(train.get("first_over_steady", {})),
           "grid_rte_base_bf16_over_stock": parts.get("grid", {}).get("ratio")}
    for preset in ("tiny", "mini", "base"):
        recipe = parts.get("recipe-speed", {}).get("presets", {}).get(preset, {})
        step = best(step_rows(parts, preset, recipe.get("seq_len"), recipe.get("tokens_per_step")), "tokens_per_s")
        out[f"recipe_over_step_{preset}"] = recipe["padded_tokens_per_second"] / step["tokens_per_s"] \
            if step and "padded_tokens_per_second" in recipe else None
    for length in (128, 512):
        row = best(step_rows(parts, "base", length), "mfu")
        out[f"pretrain_base_{length}_mfu"] = row["mfu"] if row else None
    return out


def goals(parts: dict, found: dict) -> list[dict]:
    """Each goal with what was measured and whether it was met (None: not measured)."""
    out = [{"goal": goal, "measured": "not measured" if found[key] is None else f"{found[key]:.3g}",
            "met": None if found[key] is None else found[key] >= target if least else found[key] <= target}
           for key, (goal, target, least) in GOALS.items()]
    for preset, first in FIRST_MEASURED.items():
        top = best(step_rows(parts, preset, 128), "tokens_per_s")
        before = next(iter(step_rows(parts, preset, 128, variants=("before",))), None)
        reference, source = (before["tokens_per_s"], "before, this run") if before else (first, "first H100 run")
        out.append({"goal": f"{preset}: >= 5x the earlier tokens/s ({reference:,.0f}, {source})",
                    "measured": f"{top['tokens_per_s']:,.0f} tokens/s = {top['tokens_per_s'] / reference:.1f}x "
                                f"({top['variant']})" if top else "not measured",
                    "met": None if top is None else top["tokens_per_s"] >= 5 * reference})
    return out


def record(parts: dict, device: str, commit: str | None) -> dict:
    """gpu_record.json: the GPU's name (any part's), the date, the measured commit and the figures."""
    names = [p.get("machine", {}).get("gpu") or p.get("device") for p in parts.values() if isinstance(p, dict)]
    name = next((n for n in names if n and n != "cpu"), None) or ("cpu" if device == "cpu" else None)
    return {"device": name, "date": datetime.date.today().isoformat(), "commit": commit or None,
            "figures": figures(parts)}


def summary(parts: dict, status: list[str], found: list[dict], filed: str) -> str:
    lines = ["# make gpu-check", ""]
    machine = next((p["machine"] for p in parts.values() if isinstance(p, dict) and "machine" in p), {})
    lines += [f"Device: {machine.get('gpu', 'no GPU')}; torch {machine.get('torch')}, transformers "
              f"{machine.get('transformers')}; CPU {machine.get('cpu')} ({machine.get('cores')} cores).", ""] \
        if machine else ["Device: not recorded by the steps that ran (the recipe's alone); see the log.", ""]
    if status:
        lines += ["Steps: " + "; ".join(status), ""]
    lines += ["## Goals", "", table([[g["goal"], g["measured"], {True: "yes", False: "NO", None: "-"}[g["met"]]]
                                     for g in found], ["goal", "measured", "met"]), "", filed, ""]
    rows = [r for name, p in sorted(parts.items()) if name.startswith("pretrain-") for r in p.get("rows", [])]
    if rows:
        lines += ["## Pre-training step (tokens/s, MFU vs 989 TFLOP/s)", "", table(rows, [
            ("preset", "preset"), ("seq_len", "length"), ("batch", "batch"), ("variant", "variant"),
            ("precision", "precision"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"), ("step_ms", "ms/step"),
            ("vs_stock", "vs stock"), ("vs_before", "vs before"), ("peak_mib", "peak MiB"), ("warm_up_s", "warm-up s")]),
                  ""]
    for name, part in sorted((n, p) for n, p in parts.items() if n.startswith("pretrain-")):
        for key, problem in [("partial", part.get("partial")), ("errors", part.get("errors")),
                             *part.get("checks", {}).items()]:
            if problem:
                lines.append(f"- {name} {key}: {json.dumps(problem, default=str)[:600]}")
        top = max((r for r in part.get("rows", []) if "profile" in r), key=lambda r: r["tokens_per_s"], default=None)
        if top:  # the device is busy ms_per_step of the step's ms/step (every run's profile: the log)
            profiled, total = top["profile"], sum(top["profile"]["by_kind"].values()) or 1
            lines += [f"- {name}, {top['variant']}'s step: {profiled['ms_per_step']:.2f} ms busy of "
                      f"{top['step_ms']:.2f}, {profiled['calls_per_step']:.0f} calls; " + ", ".join(
                          f"{kind} {100 * spent / total:.0f}%" for kind, spent in profiled["by_kind"].items()),
                      "", "```", *profiled["top"], "```"]
    recipe = parts.get("recipe-speed", {})
    if recipe.get("presets"):  # beside its step's rows above
        lines += ["", "## The recipe end to end (median of its steady logging intervals)", "", table(
            [{"preset": p, **r} for p, r in recipe["presets"].items()], [("preset", "preset"), ("seq_len", "length"), (
                "batch", "batch"), ("step_form", "step"), ("padded_tokens_per_second", "padded tokens/s"), (
                "tokens_per_second", "real tokens/s"), ("error", "error")]), f"- data: {recipe.get('data')}"]
    for task, result in parts.get("finetune", {}).get("tasks", {}).items():
        lines += ["", f"## Fine-tuning ({task})", "", table(
            [[name, *result[name]["examples_per_s"].values(), json.dumps(result[name]["ratio_by_precision"])]
             for name in ("train", "predict")], ["measurement", *result["train"]["examples_per_s"], "ours/stock"]),
            f"- ours' first epoch over a steady one: {json.dumps(result['train'].get('first_over_steady'))}"]
    grid = parts.get("grid", {})
    if "ours" in grid:
        lines += ["", f"## RTE grid subset: {len(grid['ours'].get('points', []))} points, {grid.get('precision')}", "",
                  f"- to the last dev score: bert-suite grid {grid['ours'].get('seconds', float('nan')):.1f} s, the "
                  f"stock loop {grid.get('stock', {}).get('seconds', float('nan')):.1f} s; {grid['ours'].get('error', '')}"]
    correct = parts.get("correctness", {})
    if correct.get("rows"):
        keys = [k for k in correct["rows"][0] if k != "head" and not k.startswith("kernels")]
        lines += ["", "## Correctness (max |ours - stock|; compile/export against eager)", "",
                  table([[r["head"], *[r.get(k) for k in keys]] for r in correct["rows"]], ["head", *keys]), ""]
        first = correct["rows"][0]
        lines += [f"- SDPA kernels ({first['head']}): " + "; ".join(
            f"{k.removeprefix('kernels ')}: {v}" for k, v in first.items() if k.startswith("kernels"))]
    if parts.get("recipe"):
        found = parts["recipe"]
        lines += ["", "## The recipe killed and resumed", "", f"- step form: {found.get('step_form')}; data: "
                  f"{found.get('data')}", f"- killed and resumed: {json.dumps(found.get('resume'), default=str)}"]
    return "\n".join(lines) + "\n"


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        return {"unreadable": str(err)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    parts, status, commits = {}, {}, []
    for path in args.merge:
        earlier = read(path)
        status.update(earlier.get("status", {}))
        commits.append((earlier.get("record") or {}).get("commit"))
        parts.update({k: v for k, v in earlier.items() if k not in ("status", "goals", "record")})
    if args.parts:
        parts.update({path.stem: read(path) for path in sorted(args.parts.glob("*.json"))})
    status.update(dict(s.split("=", 1) for s in args.status if "=" in s))
    if len({c for c in [args.commit, *commits] if c}) > 1:
        raise SystemExit(f"gpu_check_summary: --merge of other commits ({sorted({c for c in [args.commit, *commits] if c})}): "
                         "one record measures one commit")
    gpus = {p["machine"]["gpu"] for p in parts.values() if isinstance(p, dict) and (p.get("machine") or {}).get("gpu")}
    if len(gpus) > 1:
        raise SystemExit(f"gpu_check_summary: parts from several GPUs ({sorted(gpus)}): one record measures one GPU")
    kept = record(parts, args.device, args.commit or next((c for c in commits if c), None))
    found = goals(parts, kept["figures"])
    merged = {"status": status, "goals": found, "record": kept, **parts}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(merged, indent=2, default=str) + "\n")
    (args.out / "gpu_record.json").write_text(json.dumps(kept, indent=2) + "\n")
    slug = re.sub(r"[^a-z0-9]+", "-", (kept["device"] or "unknown").lower()).strip("-")
    filed = f"File the record: `cp {args.out}/gpu_record.json benchmarks/results/gpu/{kept['date']}-{slug}.json`" \
        if kept["device"] not in (None, "cpu") else "gpu_record.json: not a GPU's record (not for benchmarks/results/gpu/)"
    text = summary(parts, [f"{k}={v}" for k, v in status.items()], found, filed)
    (args.out / "summary.md").write_text(text)
    print(text)
    return merged


if __name__ == "__main__":
    main()
