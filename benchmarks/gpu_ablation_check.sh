#!/usr/bin/env bash
# The pre-training of a small ablation study on a GPU, with `bert-suite ablation`, and what the
# ablation package promises there:
#   (a) the recipe is launched with recipes/configs/accelerate/gpu.yaml and runs on CUDA;
#   (b) SIGTERM to the `bert-suite ablation` process during pre-training stops the recipe's whole process group
#       (no process of it left, no compute app left in nvidia-smi), the command exits 143 and
#       pretraining/NAME/timing.json has an entry with "stopped": true;
#   (c) the same command again resumes from the last checkpoint ("resumed from" in logs/pretraining-NAME.log)
#       and finishes: the recipe's tokens/s (metrics.jsonl) and pretrain_results.json's step_form.
# The final model comes back as final-bf16.tar (its weights in bf16, to fit 16 MiB) for a fine-tuning on the CPU.
#
# Command (on a GPU machine, in the repository root, with the tree and .gpu-bundle/ (`make gpu-bundle`) copied
# there, e.g. the run tool with carry [".gpu-bundle"]):
#   bash benchmarks/gpu_ablation_check.sh                                   (results in $OUT, default
#                                                                            runs/gpu-ablation-check/)
#   PYTHON=.venv/bin/python bash benchmarks/gpu_ablation_check.sh --steps 20 --out /tmp/abl-cpu   (a dry run on a
#                                                                            CPU: every check at toy size)
# Options: --steps N (800), --size tiny|mini|... (tiny), --batch N (128), --work DIR (/tmp/bert-suite-ablation-check,
# emptied first), --out DIR, --bundle DIR (.gpu-bundle), --wrap (always use the interpreter wrapper below),
# --tree DIR (the bert_suite to run: DIR/src, recipes, tasks, e.g. `git archive HEAD src recipes tasks` extracted into
# .gpu-bundle/head while the working tree is being edited; default: this repository), --budget SECONDS (280:
# the first launch gets at most 130 s to reach a checkpoint, the second what is left less 15 s for the files).
#
# The package runs `Path(sys.executable).parent / "accelerate"` (and `.../bert-suite` for --workers helpers);
# a GPU machine's python3 has no venv around it, so when those are missing the script makes a folder with a
# symlink to the interpreter and two small scripts beside it, and runs the study through that symlink.
# At most 4 files come out: check.log, summary.json, artifacts.tar.gz (timing.json, metrics.jsonl,
# pretrain_results.json, the logs, the stage records, the study file) and final-bf16.tar.
set -uo pipefail

BUNDLE=.gpu-bundle OUTDIR=${OUT:-runs/gpu-ablation-check} STEPS=800 SIZE=tiny BATCH=128
WORK=/tmp/bert-suite-ablation-check WRAP=0 TREE=. FIRST_LIMIT=130 RESUME_LIMIT=150 BUDGET=280
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) STEPS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --bundle) BUNDLE=$2; shift 2 ;;
        --wrap) WRAP=1; shift ;;
        --tree) TREE=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        *) echo "gpu_ablation_check: unknown option $1" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE=$(cd "$BUNDLE" && pwd) || { echo "gpu_ablation_check: no bundle folder $BUNDLE (make gpu-bundle)" >&2; exit 2; }
TREE=$(cd "$TREE" && pwd) || exit 2
[ -f "$TREE/recipes/pretrain.py" ] && [ -d "$TREE/src/bert_suite/ablation" ] ||
    { echo "gpu_ablation_check: $TREE has no src/bert_suite/ablation or recipes/pretrain.py" >&2; exit 2; }
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/check.log
: > "$LOG"
T0=$(date +%s)
say() { echo "[check +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
export PYTHONPATH="$TREE/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    HF_EVALUATE_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

. "$(dirname "$0")/gpu_env.sh"  # PY, BIN: the interpreter with the wheels, accelerate and bert-suite

# --- the study: the bundle's corpus and released vocabulary, one pre-trained variant and its random twin
rm -rf "$WORK" && mkdir -p "$WORK"
STUDY=$WORK/study.yaml RUNS=$WORK/out NAME=mlm_nsp
cat > "$STUDY" <<EOF
title: GPU check of an ablation's pre-training
corpus:
  files: [$BUNDLE/data/corpus.txt]
  task_texts: []
  decontaminate: false
vocabulary:
  vocab_file: $BUNDLE/data/vocab/bert-base-uncased/vocab.txt
instances:
  max_seq_length: 128
  dupe_factor: 1
pretraining:
  steps: $STEPS
  model_size: $SIZE
  per_device_train_batch_size: $BATCH
  max_predictions_per_seq: 20
  eval_batches: 2
variants:
  mlm_nsp: {}
  random: {from: mlm_nsp, random_init: true}
compare:
  baseline: mlm_nsp
  seeds: [1, 2]
  tasks: [rte]
  data_dir: [$BUNDLE/data/glue]
EOF
CMD=("$BIN/bert-suite" ablation "$STUDY" --output_dir "$RUNS" --until pretraining --variant "$NAME")
RUN=$RUNS/pretraining/$NAME RECIPE_LOG=$RUNS/logs/pretraining-$NAME.log
say "command: ${CMD[*]}"
say "bert_suite from $TREE/src ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') checked out; \
$( [ "$TREE" = "$ROOT" ] && echo "working tree, $(git -C "$ROOT" status --short src recipes 2>/dev/null | wc -l) files changed" \
|| cat "$TREE/COMMIT" 2>/dev/null || echo 'a snapshot')"
procs_left() {  # procs_left GROUP TEXT: processes in process group GROUP, and those whose command line holds TEXT
    "$BIN/python3" - "$@" << 'EOF'
import os, sys
group, text = sys.argv[1], sys.argv[2].encode()
in_group, matching = [], []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    if group and stat.rsplit(")", 1)[1].split()[2] == group:
        in_group.append(pid)
    if text in cmdline and int(pid) != os.getpid():
        matching.append(pid)
print(" ".join(in_group) + "|" + " ".join(matching))
EOF
}
gpu_apps() { command -v nvidia-smi > /dev/null && nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr '\n' ' '; }

# --- (a, b) the first launch, stopped with SIGTERM once a checkpoint is complete
"${CMD[@]}" > "$WORK/first.log" 2>&1 &
PID=$!
DEADLINE=$(($(date +%s) + FIRST_LIMIT))
CHECKPOINT="" APPS_DURING=""
while kill -0 "$PID" 2> /dev/null && (($(date +%s) < DEADLINE)); do
    CHECKPOINT=$(ls -d "$RUN"/checkpoints/step-*/progress.json 2> /dev/null | head -1)
    [ -n "$CHECKPOINT" ] && break
    sleep 0.2
done
APPS_DURING=$(gpu_apps)
if kill -0 "$PID" 2> /dev/null; then
    say "SIGTERM to bert-suite ablation (pid $PID); checkpoint: ${CHECKPOINT:-none} (compute apps: ${APPS_DURING:-none})"
    kill -TERM "$PID"
    wait "$PID"
    RC1=$?
else
    wait "$PID"
    RC1=$?
    say "FAILED: the first launch ended (exit $RC1) before it could be stopped"
fi
GROUP=$(sed -n 's/.*stopping the pre-training (process group \([0-9]*\)).*/\1/p' "$WORK/first.log" | tail -1)
LEFT=$(procs_left "$GROUP" "output_dir=$RUN")
LEFT_GROUP=${LEFT%%|*} LEFT_RECIPE=${LEFT#*|}
APPS_AFTER=$(gpu_apps)
say "first launch: exit $RC1; group ${GROUP:-?}; left in the group: '${LEFT_GROUP}'; recipe processes left: \
'${LEFT_RECIPE}'; compute apps after: '${APPS_AFTER}'"
tail -n 4 "$WORK/first.log" | sed 's/^/    /' | tee -a "$LOG"

# --- (c) the same command again: resumed from the last complete checkpoint, to the end
LIMIT=$((BUDGET - ($(date +%s) - T0) - 15))
((LIMIT > RESUME_LIMIT)) && LIMIT=$RESUME_LIMIT
say "second launch (limit ${LIMIT}s)"
timeout -s TERM --kill-after=25 "$LIMIT" "${CMD[@]}" > "$WORK/second.log" 2>&1
RC2=$?
say "second launch: exit $RC2"
tail -n 4 "$WORK/second.log" | sed 's/^/    /' | tee -a "$LOG"
tr '\r' '\n' < "$RECIPE_LOG" 2> /dev/null | grep -a -E "resumed from|world size|accelerate launch --config_file|saved " | cut -c1-400 | sed 's/^/    /' | tee -a "$LOG"

# --- the figures, and the files that come back
"$BIN/python3" - "$RUNS" "$NAME" "$OUTDIR" "$RC1" "$RC2" "$GROUP" "$LEFT_GROUP" "$LEFT_RECIPE" "$APPS_DURING" \
    "$APPS_AFTER" "${CMD[*]}" << 'EOF' 2>&1 | tee -a "$LOG"
import json, re, statistics, sys, tarfile
from pathlib import Path
runs, name, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
rc1, rc2, group, left_group, left_recipe, apps_during, apps_after, command = sys.argv[4:12]
run, log = runs / "pretraining" / name, runs / "logs" / f"pretraining-{name}.log"
text = log.read_text(errors="replace") if log.is_file() else ""
timing = json.loads((run / "timing.json").read_text()) if (run / "timing.json").is_file() else []
results = json.loads((run / "pretrain_results.json").read_text()) if (run / "pretrain_results.json").is_file() else {}
windows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()] if (run / "metrics.jsonl").is_file() else []
resumed = re.findall(r"resumed from (\S+) at step (\d+)", text)
starts = {0, *(int(s) for _, s in resumed)}  # a launch's first window holds its start (compilation, capture)
first_of_launch = {min((w["step"] for w in windows if w["step"] > s), default=None) for s in starts}
steady = [w["tokens_per_second"] for w in windows if w["step"] not in first_of_launch]
summary = {
    "command": command,
    # (a launch's "$ accelerate launch ..." line may follow a progress bar left without its newline)
    "a_accelerate_config": re.findall(r"accelerate launch --config_file (\S+)", text),
    "a_world": re.findall(r"world size .*", text)[:2],
    "a_compute_apps_during": apps_during.split(),
    "b_exit_code": int(rc1), "b_process_group": group, "b_left_in_group": left_group.split(),
    "b_recipe_processes_left": left_recipe.split(), "b_compute_apps_after": apps_after.split(),
    "b_timing": timing, "b_stopped_entry": any(t.get("stopped") for t in timing),
    "c_exit_code": int(rc2), "c_resumed": [f"{p} at step {s}" for p, s in resumed],
    "c_final_step": results.get("step"), "c_step_form": results.get("step_form"),
    "tokens_per_second_median_steady": statistics.median(steady) if steady else None,
    "tokens_per_second_max": max(steady) if steady else None,
    "windows": [{k: w.get(k) for k in ("step", "tokens_per_second", "mlm_loss", "mlm_accuracy", "nsp_accuracy",
                                        "eval_mlm_accuracy", "eval_mlm_loss") if k in w} for w in windows],
    "last": {k: v for k, v in results.items() if k not in ("config",)},
}
summary["ok"] = {
    "a": any(c.endswith("accelerate/gpu.yaml") for c in summary["a_accelerate_config"]) and "cuda" in " ".join(summary["a_world"]),
    "b": summary["b_exit_code"] == 143 and not summary["b_left_in_group"] and not summary["b_recipe_processes_left"]
         and not summary["b_compute_apps_after"] and summary["b_stopped_entry"],
    "c": summary["c_exit_code"] == 0 and bool(resumed) and results.get("step") is not None}
(out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
with tarfile.open(out / "artifacts.tar.gz", "w:gz") as tar:
    for p in [run / "timing.json", run / "metrics.jsonl", run / "pretrain_results.json", runs / "logs", runs / "stages",
              runs.parent / "study.yaml", runs.parent / "first.log", runs.parent / "second.log"]:
        if p.exists():
            tar.add(p, arcname=str(p.relative_to(runs.parent)))
final = run / "final"
if (final / "config.json").is_file():
    import torch
    sys.path.insert(0, "benchmarks")  # the working directory is the repository root (the script cds there)
    from study_transfer import cast_folder
    half = runs.parent / "final-bf16"
    cast_folder(final, half, torch.bfloat16)
    size = sum(f.stat().st_size for f in half.iterdir())
    if size < 15 << 20:
        with tarfile.open(out / "final-bf16.tar", "w") as tar:
            tar.add(half, arcname="final-bf16")
    print(f"final model in bf16: {size / 2**20:.1f} MiB" + ("" if size < 15 << 20 else " (too big: not brought back)"))
print("summary:", json.dumps({k: summary[k] for k in ("ok", "b_exit_code", "c_exit_code", "c_resumed", "c_step_form",
                                                   "tokens_per_second_median_steady", "a_accelerate_config")}, default=str))
EOF
say "done"
