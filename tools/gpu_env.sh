# Sourced by tools/gpu_study_pretraining.sh: the interpreter and the wheels a bare GPU machine lacks (BUNDLE/wheels,
# no network there). The study starts its processes as `PY -m ...`, so nothing needs to be beside the interpreter.
# Needs BUNDLE, TREE, LOG and a function `say`; sets PY.
# --- the interpreter, and the wheels it lacks (no network on the GPU machine)
PY=${PYTHON:-python3}
PY=$(command -v "$PY") || { echo "${0##*/}: no $PY" >&2; exit 2; }
case $PY in /*) ;; *) PY=$PWD/$PY ;; esac
PIN=$(grep -i '^transformers==' constraints.txt | cut -d= -f3)
TOKENIZERS=$(grep -i '^tokenizers==' constraints.txt | cut -d= -f3)
# Two scripts at once on one machine share the installed wheels: installed once, under a lock, and reused
exec 9> /tmp/bert-suite-env.lock && flock 9
SITE=/tmp/bert-suite-site
has_pins() { PYTHONPATH="$1" "$PY" -c "import datasets, evaluate, seqeval, optuna, tokenizers as k, transformers as t; \
assert t.__version__ == '$PIN' and k.__version__ == '$TOKENIZERS'" 2> /dev/null; }
if ! has_pins "${PYTHONPATH:-}"; then
    if ! has_pins "$TREE/src:$SITE${PYTHONPATH#"$TREE/src"}"; then
        say "installing $BUNDLE/wheels into $SITE"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            "$BUNDLE"/wheels/*.whl 2>&1 | tail -5 | tee -a "$LOG"
    fi
    export PYTHONPATH="$TREE/src:$SITE${PYTHONPATH#"$TREE/src"}"
fi
flock -u 9
"$PY" -c "import sys, torch, accelerate, transformers, bert_suite; print('python', sys.version.split()[0], \
sys.executable, '| torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() \
if torch.cuda.is_available() else '', '| accelerate', accelerate.__version__, '| transformers', \
transformers.__version__, '| bert_suite', bert_suite.__file__)" 2>&1 | tee -a "$LOG"
"$PY" -m accelerate.commands.launch --help > /dev/null 2>&1 || say "FAILED: $PY -m accelerate.commands.launch --help"
