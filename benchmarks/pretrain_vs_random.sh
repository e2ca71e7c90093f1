#!/usr/bin/env bash
# Does pre-training do what the paper says at small scale? Pre-train a small preset on
# ../shared/data/corpus (Gutenberg + WikiText-2 test) for a fixed step budget that fits 45 minutes
# of this machine, then fine-tune it and a randomly initialised twin on GLUE RTE, MRPC, STS-B and
# CoLA with the same grid; print both, with the held-out MLM perplexity and NSP accuracy.
# Goal: pre-trained beats random on at least 3 of 4.
#
#   bash benchmarks/pretrain_vs_random.sh [OUT=runs/pretrain-vs-random] [STEPS=1500] [LR=1e-3]
# Environment (defaults = the first, mini run in RESULTS.md):
#   SIZE=mini          model preset
#   VOCAB_SIZE=        empty: the released bert-base-uncased vocabulary; N: train an N-token
#                      lowercase WordPiece vocabulary on the corpus (`bert-suite tokenizer`)
#   BATCH=32           phase-1 batch at length 128 (phase 2: BATCH/4 at 512, the same tokens)
#   DUPE=3             pretrain-data --dupe_factor for the 128 set
#   FT_LRS="1e-4 3e-4" FT_EPOCHS=2   the fine-tuning grid (batch 32, seed 1), the same for both
# A mini step of 32 x 128 with the 30,522 vocabulary takes about 1.6 s on 2 CPU cores; a tiny
# step of 64 x 128 with an 8k vocabulary about 0.65 s. With so few steps the learning rate is
# above the paper's 1e-4 (as for the demo); results go to OUT/summary.md. A run that was stopped
# resumes from its last checkpoint (exact resume), so rerunning the command continues it.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
OUT=${1:-runs/pretrain-vs-random}
STEPS=${2:-1500}
LR=${3:-1e-3}
SIZE=${SIZE:-mini}
VOCAB_SIZE=${VOCAB_SIZE:-}
BATCH=${BATCH:-32}
DUPE=${DUPE:-3}
read -r -a FT_LRS <<< "${FT_LRS:-1e-4 3e-4}"
FT_EPOCHS=${FT_EPOCHS:-2}
BS=.venv/bin/bert-suite
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -d "$DATA/corpus" ]; then echo "no corpus at $DATA/corpus: skipping"; exit 0; fi
FILES=("$DATA"/corpus/gutenberg/*.txt "$DATA"/corpus/wikitext-2-raw/wiki.test.raw)
mkdir -p "$OUT"
if [ -z "$VOCAB_SIZE" ]; then
  VOCAB=$DATA/vocab/bert-base-uncased/vocab.txt
else
  VOCAB=$OUT/tokenizer
  [ -d "$VOCAB" ] || "$BS" tokenizer --input "${FILES[@]}" --vocab_size "$VOCAB_SIZE" --lowercase --output_dir "$VOCAB"
fi
[ -d "$OUT/data128" ] || "$BS" pretrain-data --input "${FILES[@]}" --tokenizer "$VOCAB" --max_seq_length 128 \
    --dupe_factor "$DUPE" --num_proc 2 --output_dir "$OUT/data128"
[ -d "$OUT/data512" ] || "$BS" pretrain-data --input "${FILES[@]}" --tokenizer "$VOCAB" --max_seq_length 512 \
    --num_proc 2 --output_dir "$OUT/data512"
/usr/bin/time -f "pre-training wall: %e s" .venv/bin/accelerate launch --config_file recipes/configs/accelerate/cpu.yaml \
    recipes/pretrain.py --config "recipes/configs/pretrain/$SIZE.yaml" train_data="$OUT/data128" \
    train_data_phase2="$OUT/data512" tokenizer="$VOCAB" output_dir="$OUT/pretrain" max_steps="$STEPS" learning_rate="$LR" \
    warmup_steps=$((STEPS / 10)) per_device_train_batch_size="$BATCH" per_device_train_batch_size_phase2=$((BATCH / 4)) \
    mixed_precision=no report_to=tensorboard logging_steps=50 eval_steps=250 save_steps=250 \
    resume_from_checkpoint=auto
declare -A FOLDER=([rte]=RTE [mrpc]=MRPC [stsb]=STS-B [cola]=CoLA)
GRID=(--learning_rates "${FT_LRS[@]}" --batch_sizes 32 --epochs "$FT_EPOCHS" --seeds 1 --disable_tqdm true)
for task in rte mrpc stsb cola; do
  "$BS" grid "$task" --model "$OUT/pretrain/final" --data_dir "$DATA/glue/${FOLDER[$task]}" \
      --output_dir "$OUT/$task-pretrained" "${GRID[@]}" > "$OUT/$task-pretrained.log" 2>&1
  "$BS" grid "$task" --model "preset:$SIZE" --tokenizer "$VOCAB" --data_dir "$DATA/glue/${FOLDER[$task]}" \
      --output_dir "$OUT/$task-random" "${GRID[@]}" > "$OUT/$task-random.log" 2>&1
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
pre = json.loads((out / "pretrain" / "pretrain_results.json").read_text())
rows = ["| task | metric | pre-trained | random init |", "|---|---|---:|---:|"]
wins = 0
for task in ("rte", "mrpc", "stsb", "cola"):
    a = json.loads((out / f"{task}-pretrained" / "best_trial.json").read_text())
    b = json.loads((out / f"{task}-random" / "best_trial.json").read_text())
    key = {"rte": "eval_accuracy", "mrpc": "eval_f1", "stsb": "eval_spearmanr", "cola": "eval_matthews_correlation"}[task]
    wins += a["metrics"][key] > b["metrics"][key]
    rows.append(f"| {task} | {key[5:]} | {100 * a['metrics'][key]:.2f} | {100 * b['metrics'][key]:.2f} |")
rows.append(f"\npre-trained wins {wins}/4; pre-training: {pre['step']} steps, held-out MLM perplexity "
            f"{pre.get('eval_mlm_perplexity', float('nan')):.1f}, NSP accuracy {100 * pre.get('eval_nsp_accuracy', 0):.1f}%")
(out / "summary.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
