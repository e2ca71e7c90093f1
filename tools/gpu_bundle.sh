#!/usr/bin/env bash
# Command: make gpu-bundle   (BEFORE=<git revision> for the earlier step to measure against; default 4889d2e)
#
# Writes .gpu-bundle/ (git-ignored, at most 40 MB): what a bare GPU machine without network needs to run
# `make gpu-check` (benchmarks/gpu_check.sh), made here where pip works:
#   wheels/   what such a machine lacks (seen: python 3.12, torch, accelerate, tokenizers, safetensors,
#             pyarrow, scikit-learn present; datasets, evaluate, seqeval, dill, multiprocess, optuna absent;
#             transformers older than constraints.txt's pin), and pytest, pinned as constraints.txt and .venv
#             have them
#   project/  bert_suite as a wheel (for a machine that runs it outside this tree)
#   data/     the few real files the checks read: the released uncased vocabulary, GLUE RTE train/dev,
#             a corpus.txt of about 2 MB cut from the Brown Corpus (whole texts) for the recipe check
#   before/   bert_suite_before/: the modeling files of revision BEFORE, the step to measure against
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_BUNDLE:-.gpu-bundle}
DATA=${BERT_SUITE_DATA:-../shared/data}
BEFORE=${BEFORE:-4889d2e}
PY=${PYTHON:-.venv/bin/python}
LIMIT_MB=40

for need in "$DATA/vocab/bert-base-uncased/vocab.txt" "$DATA/glue/RTE/train.tsv" "$DATA/glue/RTE/dev.tsv" \
    "$DATA/corpus/nltk/brown.txt"; do
    [ -f "$need" ] || { echo "gpu-bundle: $need not found (set BERT_SUITE_DATA to the shared data folder)" >&2; exit 2; }
done
pinned() {  # NAME==VERSION from constraints.txt, else as installed in .venv
    local line
    line=$(grep -i "^$1==" constraints.txt || true)
    [ -n "$line" ] && { echo "$line"; return; }
    $PY -m pip show "$1" 2>/dev/null | awk -v n="$1" '/^Version:/ {print n "==" $2}'
}
rm -rf "$OUT"
mkdir -p "$OUT/wheels" "$OUT/project" "$OUT/data/vocab/bert-base-uncased" "$OUT/data/glue/RTE" \
    "$OUT/before/bert_suite_before"

specs=()
# tokenizers: the machine's (0.23.2 seen) is older than the pin, and a vocabulary a study learns there must be
# the one it learns here; pytest and its dependencies: gpu_check.sh's correctness and recipe steps are tests/test_gpu.py
for name in transformers tokenizers datasets evaluate optuna dill multiprocess alembic colorlog SQLAlchemy Mako \
    pytest pluggy iniconfig Pygments; do
    spec=$(pinned "$name")
    [ -n "$spec" ] || { echo "gpu-bundle: no version of $name in constraints.txt or .venv" >&2; exit 2; }
    specs+=("$spec")
done
echo "wheels for Python 3.12 on x86-64 Linux: ${specs[*]}"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$OUT/wheels" "${specs[@]}"
$PY -m pip wheel -q --no-deps -w "$OUT/wheels" "$(pinned seqeval)"  # an sdist only: built here (pure Python)
$PY -m pip wheel -q --no-deps --no-build-isolation -w "$OUT/project" .

cp "$DATA/vocab/bert-base-uncased/vocab.txt" "$OUT/data/vocab/bert-base-uncased/"
cp "$DATA/glue/RTE/train.tsv" "$DATA/glue/RTE/dev.tsv" "$OUT/data/glue/RTE/"
# whole texts (a blank line ends each) up to about 2 MB
awk 'BEGIN {size = 0} {print; size += length($0) + 1} /^$/ && size > 2000000 {exit}' \
    "$DATA/corpus/nltk/brown.txt" > "$OUT/data/corpus.txt"

for name in modeling_bert_suite.py configuration_bert_suite.py; do
    git show "$BEFORE:src/bert_suite/$name" > "$OUT/before/bert_suite_before/$name"
done
echo "\"\"\"bert_suite's modeling files at $BEFORE (benchmarks/pretrain_step.py --before).\"\"\"" \
    > "$OUT/before/bert_suite_before/__init__.py"

size=$(du -sm "$OUT" | cut -f1)
if ((size > LIMIT_MB)); then
    echo "gpu-bundle: $OUT is $size MB, over $LIMIT_MB MB" >&2
    exit 1
fi
echo "wrote $OUT ($size MB): $(ls "$OUT/wheels" | wc -l) wheels, the project, data, bert_suite at $BEFORE"
