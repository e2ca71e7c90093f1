#!/usr/bin/env bash
# An ablation study's pre-trainings on a GPU machine, all variants at once, their models back for the CPU's grids
# (docs/ablation.md, "Machines and workers"). Each variant runs as `bert-suite ablation STUDY --output_dir
# WORK/FOLDER --until pretraining --variant NAME`, all at once (a tiny model's step leaves the GPU mostly idle), in one folder per data setting
# (variants with other data build theirs side by side); a biphasic variant waits for its left-to-right twin's
# checkpoint at the switch and starts there. tools/study_transfer.py collect then writes
# $OUT/records.tar.gz (summary.json, the records, this script's log) and $OUT/models-K.tar.gz (the models in
# bf16); here, `study_transfer.py install` puts them into the study's folder.
#
# Here, first (the study's raw data as one archive, and the wheels):
#   make gpu-bundle && BERT_SUITE_DATA=../shared/data .venv/bin/python tools/study_transfer.py pack-data \
#       recipes/ablations/corpus.yaml .gpu-bundle/study-data.tar.xz
# There (on the GPU machine, with .gpu-bundle/ beside the tree):
#   bash tools/gpu_study_pretraining.sh --study recipes/ablations/corpus.yaml --budget 480
# Here, after (the files under DIR), then the study as usual:
#   .venv/bin/python tools/study_transfer.py install recipes/ablations/corpus.yaml runs/corpus DIR
# A dry run on the CPU, every part at toy size: PYTHON=.venv/bin/python bash tools/gpu_study_pretraining.sh \
#   --study recipes/ablations/corpus.yaml --steps 20 --variants general --out /tmp/gsp-out --work /tmp/gsp
# Options: --study FILE, --variants "A B" (default: every pre-trained variant), --steps N (a copy of the study with
# N steps and no snapshots: dry runs), --budget SECONDS (480: the runs are stopped then and what finished is
# collected), --work DIR (/tmp/bert-suite-study, emptied first), --out DIR ($OUT), --bundle DIR (.gpu-bundle).
set -uo pipefail

BUNDLE=.gpu-bundle OUTDIR=${OUT:-runs/gpu-study} WORK=/tmp/bert-suite-study STUDY="" VARIANTS="" STEPS="" BUDGET=480
while [ $# -gt 0 ]; do
    case "$1" in
        --study) STUDY=$2; shift 2 ;;
        --variants) VARIANTS=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --budget) BUDGET=$2; shift 2 ;;
        --work) WORK=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --bundle) BUNDLE=$2; shift 2 ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) echo "gpu_study_pretraining: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -n "$STUDY" ] || { echo "gpu_study_pretraining: --study FILE is required" >&2; exit 2; }
T0=$(date +%s)
cd "$(dirname "$0")/.."
TREE=$PWD
STUDY=$(cd "$(dirname "$STUDY")" && pwd)/$(basename "$STUDY")
BUNDLE=$(cd "$BUNDLE" && pwd) || { echo "gpu_study_pretraining: no bundle folder $BUNDLE (make gpu-bundle)" >&2; exit 2; }
mkdir -p "$OUTDIR" && OUTDIR=$(cd "$OUTDIR" && pwd)
rm -rf "$WORK" && mkdir -p "$WORK"
LOG=$WORK/run.log  # into records.tar.gz: the files that come back are few
: > "$LOG"
say() { echo "[study +$(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
export PYTHONPATH="$TREE/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    HF_EVALUATE_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
. "$(dirname "$0")/gpu_env.sh"  # PY: the interpreter with the wheels

if [ -f "$BUNDLE/study-data.tar.xz" ]; then
    mkdir -p "$WORK/data" && tar xJf "$BUNDLE/study-data.tar.xz" -C "$WORK/data" && export BERT_SUITE_DATA=$WORK/data
    say "data: $BUNDLE/study-data.tar.xz unpacked into $BERT_SUITE_DATA"
fi
if [ -n "$STEPS" ]; then  # a dry run: the study with fewer steps, its base and paths as the original's
    "$PY" - "$STUDY" "$WORK/study.yaml" "$STEPS" << 'EOF'
import sys, yaml
from pathlib import Path
source, target, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
raw = yaml.safe_load(source.read_text())
if "base" in raw:
    raw["base"] = str((source.parent / raw["base"]).resolve())
raw["pretraining"]["steps"] = steps
raw["pretraining"].pop("checkpoints", None)
raw.pop("curve", None)
target.write_text(yaml.safe_dump(raw, sort_keys=False))
EOF
    STUDY=$WORK/study.yaml
    sed -i "s#\.\./\.\./\.\./shared/data#${BERT_SUITE_DATA:-$TREE/../shared/data}#g" "$STUDY"
fi
# the variants, and the folder each runs in: variants with the same data share one (built once, under its lock)
VARIANTS=$("$PY" "$TREE/tools/study_transfer.py" folders "$STUDY" "$WORK/folders.json" $VARIANTS) ||
    { say "FAILED: the study or --variants"; exit 2; }
say "study $STUDY; variants: $VARIANTS; budget ${BUDGET}s"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"

declare -A PIDS WAIT
launch() {  # launch NAME: its `--variant` run, in the folder of its data
    local FOLDER
    FOLDER=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$WORK/folders.json" "$1")
    ( "$PY" -m bert_suite ablation "$STUDY" --output_dir "$WORK/$FOLDER" --until pretraining --variant "$1" \
        > "$WORK/$1.log" 2>&1; echo $? > "$WORK/$1.exit" ) &
    PIDS[$1]=$!
}
for NAME in $VARIANTS; do  # a variant that starts from another's checkpoint waits for it (waits.json)
    WAIT[$NAME]=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ''))" \
        "$WORK/waits.json" "$NAME")
    if [ -z "${WAIT[$NAME]}" ]; then launch "$NAME"; else say "$NAME waits for $WORK/${WAIT[$NAME]}"; fi
done
DEADLINE=$((T0 + BUDGET))
while (($(date +%s) < DEADLINE)); do
    running=0
    for NAME in $VARIANTS; do
        if [ -z "${PIDS[$NAME]:-}" ]; then  # waiting: launched once the checkpoint is there, or nothing runs
            if [ -f "$WORK/${WAIT[$NAME]}" ] || ! jobs -r > /dev/null || [ -z "$(jobs -r)" ]; then
                say "$NAME: launched"
                launch "$NAME"
            fi
        fi
        [ -n "${PIDS[$NAME]:-}" ] && kill -0 "${PIDS[$NAME]}" 2> /dev/null && running=$((running + 1))
    done
    ((running == 0)) && break
    sleep 5
done
for NAME in $VARIANTS; do
    if [ -n "${PIDS[$NAME]:-}" ] && kill -0 "${PIDS[$NAME]}" 2> /dev/null; then
        say "$NAME: still running at the budget's end: stopped"
        pkill -TERM -f -- "--variant $NAME\$" 2> /dev/null
    fi
done
wait
for NAME in $VARIANTS; do
    say "$NAME: exit $(cat "$WORK/$NAME.exit" 2> /dev/null || echo '?'); $(tail -n 1 "$WORK/$NAME.log" | tr '\r' '\n' | tail -n 1 | cut -c1-200)"
done
"$PY" "$TREE/tools/study_transfer.py" collect "$STUDY" "$WORK" "$OUTDIR" --variants $VARIANTS 2>&1 | tee -a "$LOG"
say "done; files: $(cd "$OUTDIR" && ls | tr '\n' ' ')"
