"""The seconds of an ablation study's corpus stage (reading, decontamination, task texts), the data stage a GPU
lease waits on first. Writes nothing into the repository; the stage runs in a temporary folder.

  BERT_SUITE_DATA=../shared/data .venv/bin/python benchmarks/corpus_stage_speed.py [recipes/ablations/corpus.yaml]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bert_suite.ablation import load_study
from bert_suite.ablation.stages import Progress, build_corpus, task_data


def main() -> None:
    study = load_study(sys.argv[1] if len(sys.argv) > 1 else "recipes/ablations/corpus.yaml")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        data_dirs = task_data(study, out, Progress())
        started = time.perf_counter()
        build_corpus(study, out, study.corpus, "", data_dirs, Progress())
        print(f"corpus stage of {study.path.name}: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
