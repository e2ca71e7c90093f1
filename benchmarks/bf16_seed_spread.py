# Command: .venv/bin/python benchmarks/bf16_seed_spread.py [--seeds 1 2 3 4 5 6] [--steps 200] [--bf16_weights]
"""Where the bounds of tests/test_precision.py's bf16 recipe test come from: the recipe in bf16 autocast
and in fp32 from the same seed (same initial weights, data order and masks), for several seeds, on the
topic corpus the test trains on (tests/helpers.write_pretrain_setup).

Per seed it reports the mean MLM loss over the last quarter of the steps (steps 151-200 of 200) in each
precision and their paired difference, and the largest per-step difference over steps 1-20, before the two
trajectories part. Over the seeds: the mean and standard deviation of the paired difference and the
fp32 loss's spread from seed to seed, which are what the test's bounds are derived from. The seed, not
the machine, decides most of the difference: two chaotic trajectories drift apart after a few dozen
steps, so a single seed's difference is a draw from this distribution.

--bf16_weights casts the model itself to bf16 in the bf16 runs (no fp32 master weights: updates smaller
than bf16's resolution are lost), the kind of fault the test has to catch; its rows show how far such a run
lands from the fp32 one. Results: runs/bench/bf16_seed_spread.json and a table; the CPU's flags are in both,
since the bf16 arithmetic (native or emulated) differs with them."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

sys.path.insert(0, str(common.ROOT / "tests"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    p.add_argument("--steps", type=int, default=200, help="recipe steps per run (the test: 200)")
    p.add_argument("--early_steps", type=int, default=20, help="the steps before the trajectories part (the test: 20)")
    p.add_argument("--bf16_weights", action="store_true", help="the bf16 runs without fp32 master weights (a fault)")
    p.add_argument("--out", default="bf16_seed_spread")
    return p.parse_args(argv)


def run_recipe(recipe, setup: Path, out: Path, steps: int, precision: str, seed: int) -> list[float]:
    from helpers import fresh_state, recipe_args

    fresh_state()
    history = recipe.main(recipe_args(setup, out, f"max_steps={steps}", "phase1_fraction=1", "train_data_phase2=null",
                                      "save_steps=100000", "eval_fraction=0", f"mixed_precision={precision}",
                                      f"seed={seed}"))
    return [h["mlm_loss"] for h in history]


def summary(rows: list[dict]) -> dict:
    diffs = [r["difference"] for r in rows]
    spread = len(rows) > 1
    return {"seeds": len(rows), "mean_difference": statistics.mean(diffs),
            "sd_difference": statistics.stdev(diffs) if spread else None,
            "se_mean_difference": statistics.stdev(diffs) / len(diffs) ** 0.5 if spread else None,
            "max_abs_difference": max(abs(d) for d in diffs),
            "sd_fp32_over_seeds": statistics.stdev(r["fp32"] for r in rows) if spread else None,
            "max_early_difference": max(r["max_early_difference"] for r in rows)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch
    import transformers

    from helpers import load_recipe, write_pretrain_setup

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    recipe = load_recipe()
    if args.bf16_weights:
        fp32_model = recipe.BertSuiteForPreTraining

        class Bf16Weights(fp32_model):
            def __init__(self, config):
                super().__init__(config)
                self.to(torch.bfloat16)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        setup = write_pretrain_setup(Path(tmp))
        for seed in args.seeds:
            if args.bf16_weights:
                recipe.BertSuiteForPreTraining = Bf16Weights
            bf16 = run_recipe(recipe, setup, setup / f"bf16-{seed}", args.steps, "bf16", seed)
            if args.bf16_weights:
                recipe.BertSuiteForPreTraining = fp32_model
            fp32 = run_recipe(recipe, setup, setup / f"fp32-{seed}", args.steps, "no", seed)
            last = args.steps - args.steps // 4
            tail = {name: statistics.mean(losses[last:]) for name, losses in (("bf16", bf16), ("fp32", fp32))}
            rows.append({"seed": seed, **tail, "difference": tail["bf16"] - tail["fp32"],
                         "max_early_difference": max(abs(a - b) for a, b in zip(bf16[:args.early_steps],
                                                                                 fp32[:args.early_steps], strict=True))})
            print(json.dumps(rows[-1]), flush=True)
    payload = {"machine": common.machine(), "settings": vars(args), "tail_steps": f"{last + 1}-{args.steps}",
               "rows": rows, "summary": summary(rows)}
    common.write_result(args.out, payload)
    print(f"CPU: {payload['machine']['cpu']}; flags {' '.join(payload['machine']['flags'])}; "
          f"{payload['machine']['kind']}" + ("; bf16 runs WITHOUT fp32 master weights" if args.bf16_weights else ""))
    print(common.table(rows, [("seed", "seed"), ("bf16", f"bf16 MLM loss {payload['tail_steps']}"),
                              ("fp32", "fp32"), ("difference", "bf16 - fp32"),
                              ("max_early_difference", f"max |diff| steps 1-{args.early_steps}")]))
    print(json.dumps(payload["summary"], indent=1))
    return payload


if __name__ == "__main__":
    main()
