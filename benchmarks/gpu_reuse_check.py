"""Issue 51's reuse on a GPU (compiled, CUDA graph): a biphasic run trained whole against the same run started
from a left-to-right run's checkpoint at the switch (`keep_checkpoints`, `start_from_checkpoint`). Each recipe
run is its own process (`python recipes/pretrain.py`), its log kept; $OUT/reuse.json holds the losses, the final
weights' largest difference and each run's exit code. On the CPU the two agree exactly (tests/
test_objective_schedule.py); on a GPU kernels are not bitwise deterministic, so expect small differences.

  python benchmarks/gpu_reuse_check.py [--steps 400] [--switch 200] [--dropout 0.1] [--out DIR]

Seen on an H200 (2026-11-27), three runs in one process at dropout 0.1: `RuntimeError: Offset increment outside
graph capture encountered unexpectedly` in an Inductor kernel's dropout seed, which of the runs unknown; this
script separates them (and their dropout) to find out. First, in a process of its own, it checks the cure for
what a failed capture leaves behind (`step.end_failed_capture`): a capture made to fail, a dropout outside any
graph after it (expected to fail), the cure, a dropout again (expected to work): $OUT/reuse.json's
"failed_capture".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


FAILED_CAPTURE = """
import json, torch
from bert_suite.pretraining.step import end_failed_capture
device, x, seen = torch.device("cuda"), torch.ones(4096, device="cuda"), {}
def eager_dropout():
    try:
        torch.nn.functional.dropout(x, 0.1).sum().item()
        return "ok"
    except RuntimeError as err:
        return str(err).splitlines()[0]
try:
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        torch.nn.functional.dropout(x, 0.1).sum().item()  # a host sync: the capture cannot hold it
    seen["capture"] = "succeeded (not the failure meant)"
except RuntimeError as err:
    seen["capture"] = "failed: " + str(err).splitlines()[0]
seen["dropout_after_failure"] = eager_dropout()
end_failed_capture(device)
seen["dropout_after_cure"] = eager_dropout()
print(json.dumps(seen))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--switch", type=int, default=200)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "runs/gpu-reuse")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/bert-suite-reuse"))
    args = parser.parse_args()
    from helpers import recipe_args, write_pretrain_setup

    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "setup").mkdir(exist_ok=True)
    setup = write_pretrain_setup(args.work / "setup")
    common = [f"max_steps={args.steps}", "phase1_fraction=1", "train_data_phase2=null", f"save_steps={args.switch // 2}",
              "warmup_steps=10", "eval_fraction=0", f"logging_steps={max(1, args.switch // 10)}",
              f"hidden_dropout_prob={args.dropout}", f"attention_probs_dropout_prob={args.dropout}"]
    start = args.work / "ltr" / "checkpoints" / f"step-{args.switch}"
    runs = {"whole": [f"causal_steps={args.switch}"],
            "ltr": ["use_nsp=false", "causal_attention=true", f"keep_checkpoints={args.switch}"],
            "bi": [f"causal_steps={args.switch}", f"start_from_checkpoint={start}"]}
    record: dict = {"steps": args.steps, "switch": args.switch, "dropout": args.dropout}
    probe = subprocess.run([sys.executable, "-c", FAILED_CAPTURE], capture_output=True, text=True)
    record["failed_capture"] = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 \
        else {"exit_code": probe.returncode, "error": probe.stderr.strip().splitlines()[-1:]}
    print("failed capture:", record["failed_capture"], flush=True)
    for name, extra in runs.items():
        began = time.time()
        cmd = [sys.executable, str(ROOT / "recipes" / "pretrain.py"), *recipe_args(setup, args.work / name, *common, *extra)]
        with open(args.out / f"{name}.log", "w") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
        metrics = args.work / name / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
        record[name] = {"exit_code": code, "seconds": round(time.time() - began, 1),
                        "losses": [(m["step"], m["objective"], m["mlm_loss"]) for m in lines]}
        print(name, code, record[name]["seconds"], flush=True)
    finals = [args.work / n / "final" / "model.safetensors" for n in ("whole", "bi")]
    if all(f.is_file() for f in finals):
        from safetensors.torch import load_file

        a, b = (load_file(str(f)) for f in finals)
        record["final_max_abs_diff"] = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        record["same_keys"] = a.keys() == b.keys()
    (args.out / "reuse.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k not in runs}))


if __name__ == "__main__":
    main()
