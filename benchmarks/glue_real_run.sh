#!/usr/bin/env bash
# The GLUE job end to end on the real GLUE files in ../shared/data/glue (RTE, MRPC, STS-B, CoLA):
# a small grid (2 learning rates x 2 seeds) per task, an interrupted-and-resumed grid, test
# predictions, and the server package with its dev summary. No pre-trained weights exist on the
# development machines, so the model is bert_suite's `tiny` preset from random initialisation:
# this checks the machinery on real data, not the paper's scores.
#
#   bash benchmarks/glue_real_run.sh [OUT=runs/glue-real]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data/glue}
OUT=${1:-runs/glue-real}
VOCAB=${VOCAB:-../shared/data/vocab/bert-base-uncased/vocab.txt}
BS="${BERT_SUITE:-.venv/bin/bert-suite}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ ! -d "$DATA/RTE" ]; then echo "no GLUE data at $DATA: skipping"; exit 0; fi
mkdir -p "$OUT"
GRID=(--model preset:tiny --tokenizer "$VOCAB" --batch_sizes 32 --seeds 1 2 --disable_tqdm true)
declare -A FOLDER=([rte]=RTE [mrpc]=MRPC [stsb]=STS-B [cola]=CoLA)

# RTE first, interrupted after its first trial, then resumed: only the three others must run.
if [ ! -d "$OUT/rte" ]; then
"$BS" grid rte --data_dir "$DATA/RTE" --output_dir "$OUT/rte" "${GRID[@]}" --learning_rates 1e-3 3e-4 --epochs 3 \
    > "$OUT/rte.interrupted.log" 2>&1 &
pid=$!
until [ -d "$OUT/rte/best" ]; do sleep 2; kill -0 $pid 2>/dev/null || break; done
# SIGTERM: the process dies mid-trial (background jobs ignore SIGINT)
sleep 5; kill -TERM $pid 2>/dev/null || true; wait $pid || true
before=$(ls "$OUT"/rte/trials | wc -l)
echo "interrupted the RTE grid: $before trial folder(s), one finished"
fi
before=${before:-4}
# The larger STS-B and CoLA get one learning rate (3e-4, the better one on RTE and MRPC) and one
# epoch, to keep the whole run near an hour on 2 cores.
declare -A LRS=([rte]="1e-3 3e-4" [mrpc]="1e-3 3e-4" [stsb]="3e-4" [cola]="3e-4")
declare -A EPOCHS=([rte]=3 [mrpc]=3 [stsb]=1 [cola]=1)
for task in rte mrpc stsb cola; do
  /usr/bin/time -f "$task grid: %e s" "$BS" grid "$task" --data_dir "$DATA/${FOLDER[$task]}" \
      --output_dir "$OUT/$task" "${GRID[@]}" --learning_rates ${LRS[$task]} --epochs ${EPOCHS[$task]} > "$OUT/$task.log" 2>&1
  tail -1 "$OUT/$task.log"
  "$BS" predict "$task" --model "$OUT/$task/best" --split test --data_dir "$DATA/${FOLDER[$task]}" > /dev/null 2>&1
done
echo "RTE trials run by the resumed grid: $(( $(ls "$OUT"/rte/trials | wc -l) - before )) (of 4)"
"$BS" glue-package "$OUT"/{rte,mrpc,stsb,cola} --output_dir "$OUT/package" --data_dir "$DATA" 2>/dev/null
