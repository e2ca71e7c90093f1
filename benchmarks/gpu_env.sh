# Sourced by the GPU scripts (gpu_ablation_check.sh, gpu_study_pretraining.sh): the interpreter, the wheels a
# bare GPU machine lacks (BUNDLE/wheels, no network there), and `accelerate` and `bert-suite` beside the
# interpreter, as the ablation package expects. Needs BUNDLE, TREE, WRAP, LOG and a function `say`; sets PY and BIN.
# --- the interpreter, and the wheels it lacks (no network on the GPU machine)
PY=${PYTHON:-python3}
PY=$(command -v "$PY") || { echo "${0##*/}: no $PY" >&2; exit 2; }
case $PY in /*) ;; *) PY=$PWD/$PY ;; esac
PIN=$(grep -i '^transformers==' constraints.txt | cut -d= -f3)
TOKENIZERS=$(grep -i '^tokenizers==' constraints.txt | cut -d= -f3)
# Two scripts at once on one machine share the installed wheels and the wrapper: made once, under a lock, and reused
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
# --- accelerate and bert-suite beside sys.executable, as the package expects
BIN=$(dirname "$PY")
if ((WRAP)) || [ ! -x "$BIN/accelerate" ] || [ ! -x "$BIN/bert-suite" ]; then
    VENV=/tmp/bert-suite-venv
    if [ ! -x "$VENV/bin/bert-suite" ] || [ "$(readlink "$VENV/bin/python3")" != "$PY" ]; then
        rm -rf "$VENV" && mkdir -p "$VENV/bin"
        ln -s "$PY" "$VENV/bin/python3"
        if [ -f "$BIN/../pyvenv.cfg" ]; then  # a venv's interpreter finds its packages from pyvenv.cfg next to bin/
            ln -s "$(cd "$BIN/.." && pwd)/pyvenv.cfg" "$VENV/pyvenv.cfg"
            for lib in lib lib64; do [ -e "$BIN/../$lib" ] && ln -s "$(cd "$BIN/../$lib" && pwd)" "$VENV/$lib"; done
        fi
        printf '#!/bin/sh\nexec %s -m accelerate.commands.accelerate_cli "$@"\n' "$VENV/bin/python3" > "$VENV/bin/accelerate"
        printf '#!/bin/sh\nexec %s -c "import sys; from bert_suite_cli import main; sys.exit(main())" "$@"\n' \
            "$VENV/bin/python3" > "$VENV/bin/bert-suite"
        chmod +x "$VENV/bin/accelerate" "$VENV/bin/bert-suite"
    fi
    BIN=$VENV/bin
    say "wrapper $BIN (python3 -> $PY, accelerate, bert-suite)"
fi
flock -u 9
"$BIN/python3" -c "import sys, torch, accelerate, transformers, bert_suite; print('python', sys.version.split()[0], \
sys.executable, '| torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() \
if torch.cuda.is_available() else '', '| accelerate', accelerate.__version__, '| transformers', \
transformers.__version__, '| bert_suite', bert_suite.__file__)" 2>&1 | tee -a "$LOG"
"$BIN/accelerate" --help > /dev/null 2>&1 || say "FAILED: $BIN/accelerate --help"
