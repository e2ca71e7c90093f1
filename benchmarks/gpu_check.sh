#!/usr/bin/env bash
# Command (on a GPU machine, in the repository root, with the tree and .gpu-bundle/ copied there):
#   bash benchmarks/gpu_check.sh                 (= make gpu-check; results in $OUT, default runs/gpu-check/)
#   bash benchmarks/gpu_check.sh --device cpu --quick --bundle DIR --out DIR   (every step at toy size: a test)
#   bash benchmarks/gpu_check.sh --only pretrain-base-128,recipe         (some steps: the names of the step lines)
#
# Everything the project measures on a GPU, in one command of 9 minutes (--budget 530 s; the steps' limits sum to
# more, so a second call with --only runs what the budget skipped), in this order: fine-tuning, base on RTE in bf16,
# ours against stock, the first epoch against steady ones, and a profile (finetune_speed.py); the recipe end to end
# (recipe_speed.py); the pre-training step (pretrain_step.py: tiny and mini at 128 against an earlier bert_suite when
# the bundle holds one, tiny's captured steps against uncaptured ones; base at 128 with the host-sync check and a
# profile, its bf16 residual stream in a process of its own, and 512); the RTE grid subset, `bert-suite grid`
# against a loop of stock runs (finetune_speed.py --grid); fine-tuning with the encoder compiled; then every head against stock on the device and the
# recipe killed and resumed (tests/test_gpu.py's correctness and recipe checks). First the
# bundle's wheels (`make gpu-bundle`) into a private folder when the machine lacks them; last the summary
# (gpu_check_summary.py): gpu_check.json (every step's result), gpu_record.json (the figures of issues 62 and 63, to
# file in benchmarks/results/gpu/) and summary.md (tables, goals). A step is a line `step NAME LIMIT command...`
# below, its figures the JSON files it writes into $PARTS (the tests through BERT_SUITE_GPU_RECORD), run within its
# limit and the budget left, so that one slow or failing step cannot sink the rest. 4 files come out (at most 8).
set -uo pipefail

DEVICE=cuda QUICK=0 BUNDLE=.gpu-bundle OUTDIR=${OUT:-runs/gpu-check} BUDGET=530 ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --bundle) BUNDLE=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --only) ONLY=",$2,"; shift 2 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "gpu_check: unknown option $1 (expected --device, --quick, --bundle, --out, --budget, --only)" >&2
           exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PARTS=$OUTDIR/parts
rm -rf "$PARTS" && mkdir -p "$PARTS"
rm -f "$OUTDIR/gpu_check.json" "$OUTDIR/gpu_record.json" "$OUTDIR/summary.md"
LOG=$OUTDIR/gpu_check.log && : > "$LOG"
START=$(date +%s)
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    HF_EVALUATE_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
STATUS=()

step() {  # step NAME LIMIT command...: within LIMIT seconds and the budget left; never stops the script
    local name=$1 limit=$2 left t0 rc state
    shift 2
    if [ -n "$ONLY" ] && [ "$name" != install ] && [[ "$ONLY" != *",$name,"* ]]; then return; fi
    left=$((BUDGET - ($(date +%s) - START) - 15))  # 15 s kept for the summary
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        STATUS+=("$name=skipped: budget spent")
        echo "== $name: skipped (budget spent)" | tee -a "$LOG"
        return
    fi
    echo "== $name (limit ${limit}s): $*" | tee -a "$LOG"
    t0=$(date +%s)
    timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]} state="failed (exit $rc)"
    ((rc == 0)) && state=ok
    ((rc == 124 || rc == 137)) && state="timed out"
    STATUS+=("$name=$state in $(($(date +%s) - t0))s")
    echo "== ${STATUS[-1]/=/: }" | tee -a "$LOG"
}

if ! $PY -c "import torch" 2>/dev/null; then
    echo "gpu_check: $PY cannot import torch (set PYTHON to the interpreter that has it)" | tee -a "$LOG" >&2
    exit 2
fi
if [ "$DEVICE" = cuda ] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "gpu_check: no CUDA device here (this is for a GPU machine); on a CPU, --device cpu --quick runs every" \
        "step at toy size" | tee -a "$LOG" >&2
    exit 2
fi
# --- install: what the machine lacks, from the bundle (no network there)
PIN=$(grep -i '^transformers==' constraints.txt | cut -d= -f3)
if ! $PY -c "import datasets, evaluate, seqeval, optuna, pytest, transformers as t; assert t.__version__ == '$PIN'" \
    2>/dev/null; then
    SITE=${SITE:-/tmp/bert-suite-site}
    if ls "$BUNDLE"/wheels/*.whl >/dev/null 2>&1; then
        step install 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" "$BUNDLE"/wheels/*.whl
        export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH#"$PWD/src"}"
    else
        echo "== install: $BUNDLE/wheels has no wheels and this Python lacks datasets/evaluate/seqeval/optuna/pytest" \
            "or transformers $PIN: run make gpu-bundle where pip works, and copy .gpu-bundle/ here" | tee -a "$LOG"
    fi
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '')" 2>&1 | tee -a "$LOG"

BEFORE=()
[ -d "$BUNDLE/before/bert_suite_before" ] && BEFORE=(--before "$BUNDLE/before")
PRE=(benchmarks/pretrain_step.py --device "$DEVICE" --in_process --peak_tflops 989)  # MFU as on an H100/H200
# the GPU checks are tests (skipped without CUDA unless told the device); they write their parts themselves
TESTS=(env BERT_SUITE_TEST_DEVICE="$DEVICE" BERT_SUITE_TEST_QUICK="$QUICK" BERT_SUITE_TEST_DATA="$BUNDLE/data"
    BERT_SUITE_GPU_RECORD="$PARTS" $PY -m pytest tests/test_gpu.py tests/test_gpu_steps.py -q -x -p no:cacheprovider)
FINE=(benchmarks/finetune_speed.py --device "$DEVICE" --data "$BUNDLE/data" --tasks rte --no-memory)
RECIPE=(benchmarks/recipe_speed.py --device "$DEVICE" --corpus "$BUNDLE/data/corpus.txt" \
    --vocab "$BUNDLE/data/vocab/bert-base-uncased/vocab.txt")
if ((QUICK)); then  # toy sizes, fp32, no compilation (minutes of code generation on a small CPU)
    PRE+=(--precisions fp32 --steps 1 --repeats 1 --tokens 128)
    RECIPE+=(--quick --seq_len 32 --batch_size 4)  # 128 tokens a step, as pretrain-tiny's
    FINE+=(--preset tiny --limit 32 --precisions fp32) TUNE=(--repeats 1) GRID=(--learning_rates 5e-5 --batch_sizes 16
        --epochs 1)
else  # the limits: estimates of each step on an H100/H200 machine with a few seconds to spare
    FINE+=(--preset base --precisions bf16) TUNE=(--repeats 2 --profile) GRID=()
fi
# the issues' goals first (fine-tuning, the recipe against its step), the base step's MFU next, the grid and the
# checks last; a compiled variant a process where compiling several would outrun the limit
step finetune 110 $PY "${FINE[@]}" "${TUNE[@]}" --out "$PARTS/finetune.json"
step recipe-speed 120 $PY "${RECIPE[@]}" --out "$PARTS/recipe-speed.json"
if ((QUICK)); then
    step pretrain-tiny 120 $PY "${PRE[@]}" --preset tiny --seq_len 32 --variants stock ${BEFORE:+before} eager graph \
        "${BEFORE[@]}" --out "$PARTS/pretrain-tiny-32.json"
else
    SMALL=(--seq_len 128 --check "${BEFORE[@]}" --variants stock ${BEFORE:+before} graph compiled+graph)
    step pretrain-tiny-128 50 $PY "${PRE[@]}" --preset tiny "${SMALL[@]}" --check_graph \
        --out "$PARTS/pretrain-tiny-128.json"  # and captured steps against uncaptured ones
    step pretrain-mini-128 45 $PY "${PRE[@]}" --preset mini "${SMALL[@]}" --out "$PARTS/pretrain-mini-128.json"
    step pretrain-base-128 110 $PY "${PRE[@]}" --preset base --seq_len 128 --check --profile \
        --variants stock eager compiled+graph --out "$PARTS/pretrain-base-128.json"
    step pretrain-base-128-bf16res 60 $PY "${PRE[@]}" --preset base --seq_len 128 --profile \
        --variants compiled+graph+bf16res --out "$PARTS/pretrain-base-128-bf16res.json"
    step pretrain-base-512 50 $PY "${PRE[@]}" --preset base --seq_len 512 --variants stock compiled+graph \
        --out "$PARTS/pretrain-base-512.json"
fi
step grid 240 $PY "${FINE[@]}" --grid "${GRID[@]}" --out "$PARTS/grid.json"
# the encoder compiled (BERT_SUITE_COMPILE_FINETUNE=1) against the default's eager kernels for RTE's short run (CUDA
# only: the CPU compiles nothing either way)
((QUICK)) || step finetune-compiled 110 env BERT_SUITE_COMPILE_FINETUNE=1 $PY "${FINE[@]}" "${TUNE[@]}" \
    --out "$PARTS/finetune-compiled.json"
step correctness 90 "${TESTS[@]}" -k "test_correctness or test_masks_made or test_the_captured or test_a_kept_step or test_predictions_through"
step recipe 150 "${TESTS[@]}" -k test_recipe

# --- summary: the JSON files and one Markdown file from the parts (the parts stay if this fails)
COMMIT=$(git rev-parse HEAD 2>/dev/null || cat "$BUNDLE/commit" 2>/dev/null)  # make gpu-bundle writes the latter
timeout 60 $PY benchmarks/gpu_check_summary.py --parts "$PARTS" --out "$OUTDIR" --device "$DEVICE" \
    ${COMMIT:+--commit "$COMMIT"} --status "${STATUS[@]}" 2>&1 | tee -a "$LOG"
if [ "${PIPESTATUS[0]}" = 0 ]; then rm -rf "$PARTS"; fi
echo "gpu_check: $(($(date +%s) - START)) s; results in $OUTDIR" | tee -a "$LOG"
