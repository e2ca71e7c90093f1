# Command: python benchmarks/gpu_check_summary.py --parts runs/gpu-check/parts --out runs/gpu-check [--status NAME=STATE ...]
"""The last step of benchmarks/gpu_check.sh: every part's JSON merged into OUT/gpu_check.json, and
OUT/summary.md with the tables and issue 49's goals, each met or missed with the figure:
- BERT-base at 128: MFU >= 0.45; at 512: >= 0.40 (the best form of the recipe's step);
- tiny and mini at 128 x 128: >= 5x the tokens/s of the step before (the `before` variant measured in the
  same run when the bundle held one, else the H100 figures of the first GPU measurement, named as such);
- fine-tuning base on RTE in bf16: >= 2x stock's examples/s."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# The first GPU measurement (H100 80GB HBM3, main 4889d2e): tokens/s at 16,384 tokens a step
FIRST_MEASURED = {"tiny": 1_545_162, "mini": 986_840}
GOALS = {("base", 128): 0.45, ("base", 512): 0.40}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--status", nargs="*", default=[], help="NAME=STATE of each step, as gpu_check.sh ran it")
    return p.parse_args(argv)


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return "" if value is None else str(value)


def table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]]


def goals(parts: dict) -> list[dict]:
    """Each goal with what was measured and whether it was met (None: not measured)."""
    out = []
    pretrain = {name: part for name, part in parts.items() if name.startswith("pretrain-")}
    ours = ("eager", "compiled", "graph", "compiled+graph")
    for (preset, length), target in GOALS.items():
        rows = [r for p in pretrain.values() for r in p.get("rows", [])
                if r["preset"] == preset and r["seq_len"] == length and r["variant"] in ours]
        best = max(rows, key=lambda r: r["mfu"], default=None)
        out.append({"goal": f"{preset} at {length}: MFU >= {target}",
                    "measured": f"{best['mfu']:.3f} ({best['variant']})" if best else "not measured",
                    "met": None if best is None else best["mfu"] >= target})
    for preset, first in FIRST_MEASURED.items():
        rows = [r for p in pretrain.values() for r in p.get("rows", []) if r["preset"] == preset and r["seq_len"] == 128]
        best = max((r for r in rows if r["variant"] in ours), key=lambda r: r["tokens_per_s"], default=None)
        before = next((r for r in rows if r["variant"] == "before"), None)
        reference, source = (before["tokens_per_s"], "before, this run") if before else (first, "first H100 run")
        out.append({"goal": f"{preset}: >= 5x the earlier tokens/s ({reference:,.0f}, {source})",
                    "measured": f"{best['tokens_per_s']:,.0f} tokens/s = {best['tokens_per_s'] / reference:.1f}x "
                                f"({best['variant']})" if best else "not measured",
                    "met": None if best is None else best["tokens_per_s"] >= 5 * reference})
    fine = parts.get("finetune", {}).get("tasks", {}).get("rte")
    ratio = fine["train"]["ratio_by_precision"].get("bf16") if fine else None
    out.append({"goal": "fine-tuning base on RTE, bf16: >= 2x stock examples/s",
                "measured": f"{ratio:.2f}x" if ratio else "not measured", "met": None if ratio is None else ratio >= 2})
    return out


def summary(parts: dict, status: list[str]) -> str:
    lines = ["# make gpu-check", ""]
    machine = next((p["machine"] for p in parts.values() if isinstance(p, dict) and "machine" in p), {})
    lines += [f"Device: {machine.get('gpu', 'no GPU')}; torch {machine.get('torch')}, transformers "
              f"{machine.get('transformers')}; CPU {machine.get('cpu')} ({machine.get('cores')} cores).", ""] \
        if machine else ["Device: not recorded by the steps that ran (the recipe's alone); see the log.", ""]
    if status:
        lines += ["Steps: " + "; ".join(status), ""]
    lines += ["## Goals", "", *table(["goal", "measured", "met"],
                                     [[g["goal"], g["measured"], {True: "yes", False: "NO", None: "-"}[g["met"]]]
                                      for g in goals(parts)]), ""]
    rows = [r for name, p in sorted(parts.items()) if name.startswith("pretrain-") for r in p.get("rows", [])]
    if rows:
        lines += ["## Pre-training step (tokens/s, MFU vs 989 TFLOP/s)", "", *table(
            ["preset", "length", "batch", "variant", "precision", "tokens/s", "MFU", "ms/step", "vs stock", "vs before",
             "peak MiB", "warm-up s"],
            [[r["preset"], r["seq_len"], r["batch"], r["variant"], r.get("precision"), r["tokens_per_s"], r["mfu"],
              r["step_ms"], r.get("vs_stock"), r.get("vs_before"), r.get("peak_mib"), r.get("warm_up_s")]
             for r in rows]), ""]
    for name, part in sorted((n, p) for n, p in parts.items() if n.startswith("pretrain-")):
        for key, found in [("errors", part.get("errors")), *part.get("checks", {}).items()]:
            if found:
                lines.append(f"- {name} {key}: {json.dumps(found, default=str)[:600]}")
        best = max((r for r in part.get("rows", []) if "profile" in r), key=lambda r: r["tokens_per_s"], default=None)
        if best:  # the device is busy ms_per_step of the step's ms/step (every run's profile: the log)
            found, total = best["profile"], sum(best["profile"]["by_kind"].values()) or 1
            lines += [f"- {name}, {best['variant']}'s step: {found['ms_per_step']:.2f} ms busy of "
                      f"{best['step_ms']:.2f}, {found['calls_per_step']:.0f} calls; " + ", ".join(
                          f"{kind} {100 * spent / total:.0f}%" for kind, spent in found["by_kind"].items()),
                      "", "```", *found["top"], "```"]
    fine = parts.get("finetune", {}).get("tasks", {})
    for task, result in fine.items():
        lines += ["", f"## Fine-tuning ({task})", "", *table(
            ["measurement", *result["train"]["examples_per_s"], "ours/stock"],
            [[name, *result[name]["examples_per_s"].values(), json.dumps(result[name]["ratio_by_precision"])]
             for name in ("train", "predict")])]
    correct = parts.get("correctness", {})
    if correct.get("rows"):
        keys = [k for k in correct["rows"][0] if k != "head" and not k.startswith("kernels")]
        lines += ["", "## Correctness (max |ours - stock|; compile/export against eager)", "",
                  *table(["head", *keys], [[r["head"], *[r.get(k) for k in keys]] for r in correct["rows"]]), ""]
        first = correct["rows"][0]
        lines += [f"- SDPA kernels ({first['head']}): " + "; ".join(
            f"{k.removeprefix('kernels ')}: {v}" for k, v in first.items() if k.startswith("kernels"))]
    recipe = parts.get("recipe")
    if recipe:
        lines += ["", "## The recipe", "", f"- step form: {recipe.get('step_form')}; tokens/s (last interval): "
                  f"{fmt(recipe.get('tokens_per_second'))}; data: {recipe.get('data')}",
                  f"- killed and resumed: {json.dumps(recipe.get('resume'), default=str)}"]
    return "\n".join(lines) + "\n"


def read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        return {"unreadable": str(err)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    parts = {path.stem: read(path) for path in sorted(args.parts.glob("*.json"))}
    merged = {"status": dict(s.split("=", 1) for s in args.status if "=" in s), "goals": goals(parts), **parts}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(merged, indent=2, default=str) + "\n")
    text = summary(parts, args.status)
    (args.out / "summary.md").write_text(text)
    print(text)
    return merged


if __name__ == "__main__":
    main()
