"""The `bert-suite` command line: argument parsing and help, without importing torch or transformers.

`bert-suite --help`, a subcommand's `--help` and usage errors answer at once; each command's work
(bert_suite.cli and the modules it calls) is imported only when the command runs. This module sits
outside the bert_suite package because importing anything inside it registers the model family
with the transformers Auto classes, which imports torch (seconds)."""

from __future__ import annotations

import argparse
import os
import re
import sys

# Command -> what it does (the help lists them in these groups).
GROUPS = {
    "fine-tuning": ("finetune", "grid", "compare", "dashboard", "predict", "tasks", "squad-small"),
    "results and scoring": ("glue-package", "score"),
    "pre-training": ("tokenizer", "corpus", "decontaminate", "pretrain-data", "demo", "ablation"),
    "feature-based (Table 7)": ("extract-features", "feature-ner"),
    "export": ("export",),
}

EXAMPLES = {
    "finetune": "bert-suite finetune rte --model bert-base-uncased --data_dir glue/RTE --learning_rate 2e-5",
    "grid": "bert-suite grid rte --model bert-base-uncased --learning_rates 2e-5 3e-5 --seeds 1 2 3",
    "predict": "bert-suite predict rte --model runs/rte-grid/best --split test",
    "compare": "bert-suite compare --model mlm=runs/mlm/final ltr=runs/ltr/final random=random:runs/mlm/final "
               "--baseline mlm \\\n      --task mrpc sst2@1000 --data_dir glue --seeds 1 2 3 4 5 "
               "--learning_rates 3e-4 1e-3 --output_dir runs/compare",
    "tasks": "bert-suite tasks",
    "squad-small": "bert-suite squad-small --input dev-v1.1.json --output_dir data/squad_small\n"
                   "  bert-suite grid squad_small --model runs/pretrain/final --data_dir data/squad_small "
                   "--max_seq_length 128",
    "glue-package": "bert-suite glue-package runs/rte-grid runs/mrpc-grid --output_dir glue_submission",
    "score": "bert-suite score squad --data dev-v2.0.json --predictions runs/squad/predictions/dev/predictions.json",
    "tokenizer": "bert-suite tokenizer --input corpus.txt --vocab_size 30522 --lowercase --output_dir vocab",
    "pretrain-data": "bert-suite pretrain-data --input corpus.txt --tokenizer vocab --output_dir data128",
    "corpus": "bert-suite corpus --output_dir corpus\n"
              "  bert-suite corpus --from_task sst2 --data_dir glue/SST-2 --output_dir tapt",
    "demo": "bert-suite demo --output_dir runs/demo",
    "ablation": "bert-suite ablation recipes/ablations/table5.yaml --output_dir runs/table5 --workers 2\n"
                "  bert-suite ablation my_study.yaml --output_dir runs/study --variant mlm --until pretraining  "
                "(one machine per variant)\n"
                "  bert-suite ablation recipes/ablations/table5.yaml --output_dir runs/table5 --status  (where it stands)",
    "decontaminate": "bert-suite decontaminate --input corpus/*.txt --against glue/SST-2/dev.tsv --output_dir clean",
    "extract-features": "bert-suite extract-features --model bert-base-cased --input valid.txt --layers all "
                        "--pool weighted --output_dir feats/dev",
    "feature-ner": "bert-suite feature-ner --train_features feats/train --dev_features feats/dev --output_dir tagger",
    "export": "bert-suite export --to bert runs/rte/ stock_rte/\n"
              "  bert-suite export --to onnx runs/rte/ runs/rte-onnx/",
    "dashboard": "bert-suite dashboard runs/rte-grid --port 8080",
}

_HELP: dict[str, str] = {}  # filled by build_parser from each command's help
DEBUG_HELP = "show the traceback of an error instead of one line (or BERT_SUITE_DEBUG=1)"


def _overview() -> str:
    return """BERT (Devlin et al., 2018) pre-training and fine-tuning on the Hugging Face stack: the paper's
GLUE grid with restarts, SQuAD v1.1/v2.0, SWAG, CoNLL-2003 NER, NSP pre-training. Works offline.

start here:
  bert-suite demo                                  the paper in miniature on a CPU: corpus -> vocabulary
                                                   -> pre-training -> fine-tuning grid (offline)
  bert-suite grid rte --model bert-base-uncased    GLUE RTE with the paper's learning-rate x batch size
                                                   x epochs grid and random restarts
  bert-suite finetune --model bert-base-uncased --train_file train.csv --validation_file dev.csv
                                                   fine-tune on your own CSV, JSON Lines or Parquet
                                                   files (no task card needed)

`bert-suite COMMAND --help` shows a command's flags and an example."""


def _command_list() -> str:
    lines = []
    for group, names in GROUPS.items():
        lines.append(f"{group}:")
        lines += [f"  {name:<18}{_HELP[name]}" for name in names]
    return "\n".join(lines)


FAMILY_NAMES = ("classification", "squad", "multiple_choice", "ner")  # = bert_suite.cards.FAMILIES (tested)
PRECISIONS = ("auto", "bf16", "fp32")  # = bert_suite.precision.CHOICES (tested)


def _add_precision_flag(p: argparse.ArgumentParser, what: str = "train and evaluate") -> None:
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help=f"{what} in bf16 autocast (fp32 master weights) or fp32; auto (default): bf16 where the CPU "
                   "does bf16 natively (avx512_bf16, AMX), fp32 elsewhere; on a GPU, TrainingArguments' --bf16 decides. "
                   "Env BERT_SUITE_PRECISION sets the default")


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", nargs="?", help="task card name (rte, glue/mnli, ...) or path to a card YAML; leave it "
                   "out to fine-tune on --train_file/--validation_file without a card")
    p.add_argument("--model", required=True,
                   help="Hub id or local checkpoint (stock BERT or bert_suite), or preset:NAME for random weights; "
                   "random:PATH is PATH's config and vocabulary with fresh weights (its random twin)")
    p.add_argument("--bilstm", action="store_true",
                   help="a randomly initialised BiLSTM between the encoder and the head, for every task family "
                   "(the paper's Table 5 '+ BiLSTM' row, on a left-to-right model); the same as --model bilstm:MODEL")
    p.add_argument("--data_dir", help="folder with the task's original files (default: the Hub)")
    _add_file_flags(p, "train", "validation", "test")
    p.add_argument("--max_train_samples", type=int, help="keep the first N training examples (quick runs)")
    p.add_argument("--max_eval_samples", type=int, help="keep the first N examples of each dev split")
    p.add_argument("--task_family", choices=FAMILY_NAMES,
                   help="without a card: the kind of task the files hold (default: classification; squad reads "
                   "SQuAD JSON, multiple_choice SWAG-style CSV, ner CoNLL files)")
    p.add_argument("--text_columns", nargs="+", metavar="COLUMN",
                   help="without a card: the one or two text columns (default: sentence1 sentence2 when present, "
                   "else the first one or two text columns)")
    p.add_argument("--label_column", help="without a card: the label column (default: label)")
    p.add_argument("--output_dir", help="output folder (default: runs/TASK)")
    p.add_argument("--tokenizer", help="tokenizer folder or vocab.txt (default: the model's)")
    p.add_argument("--max_seq_length", type=int, help="default: the card's (128 for GLUE)")
    p.add_argument("--skip_bad_rows", action="store_true", help="skip malformed rows (counted and reported)")
    p.add_argument("--push_to_hub", action="store_true", help="push the final/best checkpoint with a model card")
    p.add_argument("--hub_model_id", help="Hub repository for --push_to_hub")
    _add_precision_flag(p)
    _add_context_flag(p)
    _add_lora_flags(p)


def _add_lora_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora_r", type=int, metavar="N",
                   help="LoRA (peft): train rank-N updates of the target layers and the task head only, all else "
                   "frozen; saves the adapter (OUTPUT/adapter) and the merged model (default: full fine-tuning)")
    p.add_argument("--lora_alpha", type=float, help="LoRA scale numerator (default: 2 x the rank, a scale of 2)")
    p.add_argument("--lora_dropout", type=float, help="dropout on the LoRA input (default: 0.1)")
    p.add_argument("--lora_target_modules", nargs="+", metavar="NAME",
                   help="the linear layers LoRA adapts, as names or one comma-separated list (default: query,value)")


def _add_file_flags(p: argparse.ArgumentParser, *roles: str) -> None:
    what = {"train": "training data", "validation": "dev data (metrics, model selection)",
            "test": "data to predict; with labels, scored too (test_<metric>)"}
    for role in roles:
        p.add_argument(f"--{role}_file", metavar="FILE",
                       help=f"{what[role]}: CSV, TSV, JSON, JSON Lines or Parquet (or the family's own format: "
                       "SQuAD JSON, SWAG CSV, CoNLL text); overrides the card's source for this split")


def _add_context_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", choices=["sentence", "document"],
                   help="NER: encode each sentence alone, or inside windows over its document (default: the card's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bert-suite", description=_overview(),
                                     usage="bert-suite [-h] [--debug] COMMAND ...",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS,
                                prog="bert-suite")

    export = sub.add_parser("export", help="convert a checkpoint to stock BERT, or to ONNX for deployment")
    export.add_argument("--to", choices=["bert", "onnx"], required=True,
                        help="bert: stock transformers BERT; onnx: model.onnx (dynamic batch and length) with the "
                        "tokenizer and config.json, checked in onnxruntime against eager (needs bert_suite[onnx])")
    export.add_argument("--opset", type=int, help="ONNX opset (--to onnx; default 18, supported 14..22)")
    export.add_argument("src", metavar="RUN_DIR", help="checkpoint folder (a finetune run, a grid's best/)")
    export.add_argument("dst", metavar="OUT_DIR", help="output folder")
    export.set_defaults(func="_export")

    finetune = sub.add_parser("finetune", help="one fine-tuning run (extra flags are TrainingArguments)")
    _add_run_flags(finetune)
    finetune.set_defaults(func="_finetune", takes_training_flags=True)

    grid = sub.add_parser("grid", help="the exhaustive learning-rate x batch-size x epochs grid with restarts")
    _add_run_flags(grid)
    grid.add_argument("--grid", choices=["paper", "paper-glue"], help="a preset grid (default: the card's)")
    grid.add_argument("--learning_rates", type=float, nargs="+")
    grid.add_argument("--batch_sizes", type=int, nargs="+")
    grid.add_argument("--epochs", type=float, nargs="+")
    grid.add_argument("--seeds", type=int, nargs="+", help="random restarts (default: 42)")
    grid.add_argument("--lora_ranks", type=int, nargs="+", metavar="N",
                      help="LoRA ranks as a grid axis (every point trains with LoRA at each rank; see --lora_r)")
    grid.add_argument("--storage", help="Optuna storage URL shared by all workers of the grid: sqlite:///FILE for "
                      "workers on one machine, postgresql+psycopg://USER@HOST/DB (or mysql://) across machines "
                      "(default: grid.db in the output folder)")
    grid.add_argument("--study_name", help="the study's name in --storage, shared by the grid's workers (default: "
                      "the task and a digest of the grid, so another grid is another study)")
    grid.add_argument("--heartbeat_interval", type=int, default=30,
                      help="seconds between a running trial's heartbeats in the study (default: 30)")
    grid.add_argument("--grace_period", type=int, default=120,
                      help="seconds without a heartbeat after which another worker takes the trial's point over "
                      "(default: 120)")
    grid.add_argument("--keep_all", action="store_true", help="keep every trial's checkpoint, not only the best "
                      "(without it a trial that cannot beat the best finished one writes no checkpoint)")
    grid.add_argument("--workers_per_gpu", type=int, metavar="K",
                      help="start K worker processes per GPU of --gpus on this grid (each sees only its GPU: "
                      "CUDA_VISIBLE_DEVICES), wait for them, then write the report once; their output comes here, "
                      "each line prefixed with its worker's name ([gpu0.w1] ...); Ctrl-C or SIGTERM stops them all "
                      "and the same command resumes (default: 1 per GPU once --gpus is given; without CUDA only 1)")
    grid.add_argument("--gpus", metavar="0,1,...",
                      help="the GPUs the workers of --workers_per_gpu run on, numbered as torch numbers them here "
                      "(default: every visible one, torch.cuda.device_count()); refused without CUDA")
    grid.add_argument("--grid_worker", action="store_true", help=argparse.SUPPRESS)  # a worker that --gpus started
    grid.set_defaults(func="_grid", takes_training_flags=True)

    comp = sub.add_parser("compare", help="several checkpoints on the same tasks, grid and seeds, each against a "
                          "baseline seed by seed (a pre-training ablation; extra flags are TrainingArguments)")
    comp.add_argument("--model", action="extend", nargs="+", required=True, metavar="NAME=PATH[,PATH...]",
                      help="a model to compare (two or more; repeat the flag or list them): a checkpoint folder or Hub "
                      "id; random:PATH is PATH's config and vocabulary with fresh weights (its random twin); "
                      "bilstm:PATH adds a randomly initialised BiLSTM before the head (Table 5's + BiLSTM). "
                      "NAME=PATH1,PATH2,PATH3: one recipe's checkpoints from different pre-training seeds (every model "
                      "as many; they pair by position), so a verdict speaks about the recipes, not one checkpoint each")
    comp.add_argument("--baseline", required=True, metavar="NAME", help="the model every other is compared with")
    comp.add_argument("--task", dest="tasks", action="extend", nargs="+", required=True, metavar="TASK[@LABELS]",
                      help="task cards to fine-tune on; TASK@N keeps the first N training examples (the same N for "
                      "every model and seed), e.g. sst2@1000")
    comp.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5],
                      help="random restarts, the same for every model: data order, label subset and head "
                      "initialisation are paired by seed (at least 2; default: 1 2 3 4 5)")
    comp.add_argument("--data_dir", nargs="+", metavar="DIR",
                      help="folders with the tasks' files: a folder that holds a task's data folder (a GLUE root with "
                      "RTE/, SST-2/, ...) or its files, or TASK=DIR for one task (default: the Hub)")
    comp.add_argument("--metric", nargs="+", metavar="TASK=METRIC",
                      help="compare and choose settings on this metric instead of the card's (e.g. mrpc=accuracy)")
    comp.add_argument("--output_dir", default="runs/compare", help="OUT/TASK/NAME per grid; compare.json, compare.md "
                      "and compare.png (default: runs/compare)")
    comp.add_argument("--grid", choices=["paper", "paper-glue"], help="a preset grid (default: each card's)")
    comp.add_argument("--learning_rates", type=float, nargs="+")
    comp.add_argument("--batch_sizes", type=int, nargs="+")
    comp.add_argument("--epochs", type=float, nargs="+")
    comp.add_argument("--max_seq_length", type=int, help="default: each card's (128 for GLUE)")
    comp.add_argument("--max_eval_samples", type=int, help="keep the first N examples of each dev split (quick runs)")
    comp.add_argument("--storage", help="Optuna storage URL shared by every worker (default: grid.db in each grid's "
                      "folder); start the same command on several machines to share the work")
    comp.add_argument("--heartbeat_interval", type=int, default=30, help="as grid's (default: 30)")
    comp.add_argument("--grace_period", type=int, default=120, help="as grid's (default: 120)")
    _add_precision_flag(comp)
    comp.set_defaults(func="_compare", takes_training_flags=True)

    dash = sub.add_parser("dashboard", help="watch a grid in the browser (optuna-dashboard): trials, learning curves")
    dash.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="the grid's --output_dir (its grid.db)")
    dash.add_argument("--storage", help="the grid's --storage URL instead (sqlite:///FILE, postgresql+psycopg://...)")
    dash.add_argument("--study_name", help="the study to open first (default: the newest)")
    dash.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1, this machine only)")
    dash.add_argument("--port", type=int, default=8080, help="default: 8080")
    dash.set_defaults(func="_dashboard")

    pred = sub.add_parser("predict", help="predict a split with a fine-tuned checkpoint")
    pred.add_argument("task", nargs="?", help="task card name or path (default: the task_card.yaml saved with "
                      "the checkpoint)")
    pred.add_argument("--model", required=True, help="fine-tuned checkpoint folder")
    pred.add_argument("--split", default="test", help="test (all test splits), dev, or a split name")
    pred.add_argument("--data_dir")
    _add_file_flags(pred, "test", "validation")
    pred.add_argument("--max_predict_samples", type=int, help="predict the first N examples only")
    pred.add_argument("--tokenizer")
    pred.add_argument("--output_dir", help="default: the model folder")
    pred.add_argument("--max_seq_length", type=int, help="default: the card's")
    _add_context_flag(pred)
    pred.add_argument("--null_score_diff_threshold", type=float,
                      help="SQuAD v2: predict no answer when null score - best span score exceeds this "
                      "(default: the threshold chosen on dev and saved with the checkpoint, else 0)")
    _add_precision_flag(pred, "predict")
    pred.set_defaults(func="_predict")

    score = sub.add_parser("score", help="score predictions like the official scripts (squad: evaluate-v1.1/v2.0)")
    score.add_argument("benchmark", choices=["squad"])
    score.add_argument("--data", required=True, help="the official dataset JSON (e.g. dev-v2.0.json)")
    score.add_argument("--predictions", required=True, help="predictions.json: question id -> answer text")
    # also the official evaluate-v2.0 spellings (--na-prob-file, --na-prob-thresh, --out-file)
    score.add_argument("--na_probs", "--na-prob-file", "--na_prob_file", dest="na_probs",
                       help="v2: null_odds.json, question id -> no-answer score")
    score.add_argument("--na_prob_thresh", "--na-prob-thresh", dest="na_prob_thresh", type=float, default=1.0,
                       help="v2: count a question as answered 'no answer' when its na_probs value is above this "
                       "(default 1.0, as the official script; our predictions.json is already thresholded, so "
                       "with null_odds.json pass the run's threshold or a large value)")
    score.add_argument("--version", help="1.1 or 2.0 (default: from the data file)")
    score.add_argument("--out_file", "--out-file", dest="out_file", help="also write the JSON here")
    score.set_defaults(func="_score")

    package = sub.add_parser("glue-package", help="GLUE server files + zip + dev summary from finetune/grid runs")
    package.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finetune or grid output folders")
    package.add_argument("--output_dir", required=True, help="where the server files and the zip go")
    package.add_argument("--data_dir", help="GLUE root (RTE/, MNLI/, diagnostic/, ...) for test files and "
                         "row checks (default: the folders the runs were trained from)")
    package.add_argument("--tokenizer", help="tokenizer, if the checkpoints lack one")
    package.set_defaults(func="_glue_package")

    feats = sub.add_parser("extract-features", help="per-word features of a CoNLL file from frozen layers")
    feats.add_argument("--model", required=True, help="checkpoint folder or Hub id (stock BERT or bert_suite)")
    feats.add_argument("--input", required=True, help="a CoNLL file (word [POS chunk NER] per line)")
    feats.add_argument("--output_dir", required=True)
    feats.add_argument("--layers", default="-1", help="hidden states: 0 = embeddings, -1 = last, comma list, or all")
    feats.add_argument("--pool", default="sum", choices=["concat", "sum", "weighted"],
                       help="combine the layers: concatenate, sum, or keep them for a learned weighted sum")
    feats.add_argument("--task", default="conll2003", help="the NER card (labels, window settings)")
    feats.add_argument("--tokenizer")
    feats.add_argument("--max_seq_length", type=int)
    feats.add_argument("--batch_size", type=int, default=32)
    _add_context_flag(feats)
    feats.set_defaults(func="_extract_features")

    tagger = sub.add_parser("feature-ner", help="train the BiLSTM tagger on extracted features (Table 7)")
    tagger.add_argument("--train_features", required=True)
    tagger.add_argument("--dev_features", required=True)
    tagger.add_argument("--output_dir", required=True)
    tagger.add_argument("--task", default="conll2003")
    tagger.add_argument("--epochs", type=int, default=4)
    tagger.add_argument("--learning_rate", type=float, default=1e-3)
    tagger.add_argument("--batch_size", type=int, default=32)
    tagger.add_argument("--hidden", type=int, default=768, help="LSTM units per direction")
    tagger.add_argument("--seed", type=int, default=42)
    tagger.set_defaults(func="_feature_ner")

    tok = sub.add_parser("tokenizer", help="train a WordPiece vocabulary on text files")
    tok.add_argument("--input", nargs="+", required=True, help="text files")
    tok.add_argument("--vocab_size", type=int, default=30522)
    tok.add_argument("--lowercase", action="store_true", help="uncased vocabulary (as bert-base-uncased)")
    tok.add_argument("--min_frequency", type=int, default=2)
    tok.add_argument("--output_dir", required=True)
    tok.add_argument("--num_proc", type=int, help="processes counting words (default: the machine's cores); the "
                     "vocabulary is the same bytes for every value")
    tok.add_argument("--max_word_types", type=int, metavar="N",
                     help="cap the word table at the N most frequent distinct words (ties by text), for corpora "
                     "whose distinct words would not fit in memory (in the spirit of sentencepiece's "
                     "input_sentence_size): the table is cut back to N whenever it passes 2N, and what was dropped is "
                     "reported and saved in tokenizer_report.json (default: no cap, every word counts)")
    tok.add_argument("--dask_scheduler", metavar="ADDRESS",
                     help="count words as tasks on this Dask cluster (e.g. tcp://scheduler:8786; every worker must "
                     "read --input at the same path); needs pip install \"bert_suite[cluster]\"")
    tok.add_argument("--count_task_bytes", type=int, help=argparse.SUPPRESS)  # tests: many tasks
    tok.set_defaults(func="_tokenizer")

    decon = sub.add_parser("decontaminate", help="drop corpus sentences that share an N-word sequence with "
                           "evaluation files")
    decon.add_argument("--input", nargs="+", required=True, metavar="FILE", help="the corpus text files")
    decon.add_argument("--against", nargs="+", required=True, metavar="FILE",
                       help="evaluation files: GLUE TSVs (by their card's text columns), SQuAD JSON, CoNLL, plain text")
    decon.add_argument("--ngram", type=int, default=8,
                       help="N: words a sentence must share in a row to be removed, after lowercasing and "
                       "splitting punctuation (default 8; 13-grams miss short sentences such as SST-2's)")
    decon.add_argument("--format", default="auto", choices=["auto", "lines", "paragraphs", "raw", "wikitext"],
                       help="the --input files' layout, as pretrain-data's (auto detects it per file; give lines for "
                       "files of one-sentence documents, such as `corpus --from_task` writes for single-sentence "
                       "tasks, which auto takes for raw text)")
    decon.add_argument("--output_dir", required=True, help="the cleaned files (same names) and decontamination.json")
    decon.set_defaults(func="_decontaminate")

    data = sub.add_parser("pretrain-data", help="documents -> NSP instances (a datasets folder for the recipe)")
    data.add_argument("--input", nargs="+", required=True,
                      help="text files: one sentence (or one paragraph) per line and a blank line between "
                      "documents, raw text, or WikiText (see --format)")
    data.add_argument("--tokenizer", required=True, help="tokenizer folder or vocab.txt")
    data.add_argument("--output_dir", required=True)
    data.add_argument("--max_seq_length", type=int, default=128)
    data.add_argument("--short_seq_prob", type=float, default=0.1)
    data.add_argument("--dupe_factor", type=int, default=1, help="passes over the corpus (each with new masks "
                      "when --static_masking)")
    data.add_argument("--static_masking", action="store_true", help="mask once here (the reference) instead of "
                      "anew every epoch in the collator")
    data.add_argument("--max_predictions_per_seq", type=int, default=20)
    data.add_argument("--masked_lm_prob", type=float, default=0.15)
    data.add_argument("--whole_word_mask", action="store_true")
    data.add_argument("--balance_nsp", action="store_true",
                      help="a chunk of one sentence is IsNext half the time (A and B: the sentence cut at a random "
                      "token) instead of always NotNext, so corpora of one-sentence documents (a task's "
                      "single-sentence examples) give a NotNext share near 0.5 (default: the reference algorithm)")
    data.add_argument("--seed", type=int, default=12345)
    data.add_argument("--num_proc", type=int, help="worker processes (default: 1)")
    data.add_argument("--format", default="auto", choices=["auto", "lines", "paragraphs", "raw", "wikitext"],
                      help="input layout: lines (a sentence a line), paragraphs (a paragraph a line, split into "
                      "sentences), raw (a file one document), wikitext; auto detects it per file (default)")
    data.add_argument("--num_shards", type=int, metavar="N",
                      help="build the instances in N parts, each a dataset folder OUTPUT_DIR/part-IIIII-of-NNNNN "
                      "(a run of whole internal shards); in order they are the rows of the one-folder build, and "
                      "the recipe takes OUTPUT_DIR as its data (default: 1, one dataset in OUTPUT_DIR; with "
                      "--dask_scheduler, the cluster's threads)")
    data.add_argument("--shard_index", type=int, metavar="I",
                      help="build only part I (0 to N-1) of --num_shards N, e.g. one per process or machine, "
                      "all into the same --output_dir (default: all N parts, one after another)")
    data.add_argument("--docs_per_shard", type=int, default=2000,
                      help="documents per internal shard (cut sooner at 16 MiB of text): a shard is built on its own "
                      "and draws its NotNext segments from its own documents; the unit of --num_proc and of parts "
                      "(default: 2000)")
    data.add_argument("--dask_scheduler", metavar="ADDRESS",
                      help="build the N parts as tasks on this Dask cluster (e.g. tcp://scheduler:8786); every worker "
                      "must read --input and --tokenizer and write --output_dir at the same paths (a shared file "
                      "system); needs pip install \"bert_suite[cluster]\"")
    data.set_defaults(func="_pretrain_data")

    corpus = sub.add_parser("corpus", help="write the embedded corpus (stdlib documentation), or a task's train "
                            "texts (--from_task), as pre-training text files")
    corpus.add_argument("--output_dir", required=True)
    corpus.add_argument("--heldout_share", type=float,
                        help="embedded corpus: share of documents kept out for the demo task (default: 0.2)")
    corpus.add_argument("--from_task", metavar="TASK",
                        help="write this task's train texts instead (a card name or path), for task-adaptive "
                        "pre-training: OUTPUT_DIR/TASK-train.txt, one example per document; dev and test text never")
    corpus.add_argument("--split", help="with --from_task: the split to write; only the card's train split is "
                        "accepted (default: it)")
    corpus.add_argument("--data_dir", help="with --from_task: folder with the task's original files (default: the Hub)")
    _add_file_flags(corpus, "train")
    corpus.add_argument("--skip_bad_rows", action="store_true", help="skip malformed rows (counted and reported)")
    corpus.set_defaults(func="_corpus")

    demo = sub.add_parser("demo", help="the embedded demo: corpus -> vocabulary -> pre-training -> fine-tuning")
    demo.add_argument("--output_dir", default="runs/demo")
    demo.add_argument("--max_steps", type=int, help="pre-training steps (default: 2000)")
    _add_precision_flag(demo, "pre-train and fine-tune")
    demo.set_defaults(func="_demo")

    abl = sub.add_parser("ablation", help="a pre-training study from one file: corpus -> vocabulary -> instances -> "
                         "N pre-trainings -> the same grid and seeds for each -> paired differences (Tables 5, 6, 8)")
    abl.add_argument("study", metavar="ABLATION.yaml", help="the study file (recipes/ablations/*.yaml, or your own: "
                     "docs/ablation.md); its paths are relative to it")
    abl.add_argument("--output_dir", required=True, help="every stage's folder; rerun the command to resume (a stage "
                     "made with other settings or inputs is refused; Ctrl-C, SIGTERM or SIGHUP stops the study and "
                     "everything it started)")
    abl.add_argument("--until", choices=["pretraining", "compare"], default="compare",
                     help="stop after this stage (default: compare, the whole study and its record)")
    abl.add_argument("--variant", nargs="+", metavar="NAME", help="pre-train only these variants, then stop (one "
                     "machine or GPU per variant, sharing --output_dir: a variant another process trains is waited "
                     "for, not trained twice; rerun without it to fine-tune)")
    abl.add_argument("--pretraining_seeds", nargs="+", type=int, metavar="SEED", help="with pretraining.seeds: "
                     "pre-train only these seeds (of --variant, or of every variant), then stop: one core or GPU per "
                     "run")
    abl.add_argument("--workers", type=int, default=1, help="processes sharing the fine-tuning grids, each with its "
                     "share of the cores (default: 1)")
    abl.add_argument("--storage", help="Optuna storage URL shared by every worker, as compare's (default: grid.db in "
                     "each grid's folder)")
    abl.add_argument("--results_dir", metavar="DIR", help="also write the record there as STEM.json, STEM.md and "
                     "STEM.png (STEM: the study file's name)")
    abl.add_argument("--status", nargs="?", const="text", choices=["text", "json"], help="print where the study in "
                     "--output_dir stands (each pre-training's state and step, the time left, the grids done) and "
                     "exit, as lines or (--status json) one JSON object; it reads the folder only, so it is safe "
                     "beside the processes running the study")
    abl.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a --workers helper: grids only
    abl.set_defaults(func="_ablation")

    small = sub.add_parser("squad-small", help="split SQuAD v1.1's dev set by article into the squad_small task's "
                           "train.json and dev.json")
    small.add_argument("--input", required=True, metavar="FILE", help="the official dev-v1.1.json")
    small.add_argument("--output_dir", required=True, help="where train.json, dev.json and split.json go (the "
                       "task's --data_dir)")
    small.add_argument("--train_share", type=float, default=0.8,
                       help="share of the questions on the train side, whole articles each side (default: 0.8)")
    small.add_argument("--seed", type=int, default=0, help="orders the articles (by a hash of seed and title)")
    small.set_defaults(func="_squad_small")

    tasks = sub.add_parser("tasks", help="list the shipped task cards: family, metric, data source")
    tasks.set_defaults(func="_tasks")

    _HELP.update({action.dest: action.help for action in sub._choices_actions})
    for name, command in sub.choices.items():
        command.formatter_class = argparse.RawDescriptionHelpFormatter
        command.description = _HELP[name]
        command.epilog = f"example:\n  {EXAMPLES[name]}"
        # before or after the command; SUPPRESS: a command's default must not undo `bert-suite --debug COMMAND`.
        # Ours, so it never reaches TrainingArguments (whose own --debug this hides)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    # No abbreviations: `grid --learning_rate X` would otherwise be read as --learning_rates, and an
    # abbreviated TrainingArguments flag be taken for one of ours.
    for command in (parser, *sub.choices.values()):
        command.allow_abbrev = False
    parser.epilog = _command_list()
    return parser


_NUMBER_LIST = re.compile(r"-\d+(,-?\d+)+")  # a comma list of numbers starting with a minus
_EXPONENT_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _plain_negative_numbers(argv: list[str]) -> list[str]:
    """-1e-5 -> -0.00001 (the same number): argparse reads a word starting with '-' as a flag unless it
    looks like a plain negative number, so `--learning_rate -1e-5` would fail as a missing value and
    never reach the check that names the flag."""
    from decimal import Decimal

    out: list[str] = []
    for a in argv:
        if _NUMBER_LIST.fullmatch(a) and out and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={a}"  # --layers -1,-2,-3,-4: a list of numbers, not a flag
        else:
            out.append(format(Decimal(a), "f") if _EXPONENT_NUMBER.fullmatch(a) else a)
    return out


def _status_before_study(argv: list[str]) -> list[str]:
    """`ablation --status STUDY.yaml ...`: --status takes an optional word (text or json), so argparse would take
    the study file for it and refuse it as a format; a study file there (a .yaml name, or a file) is the study,
    and --status the text form. Any other word is left to argparse, which names the formats."""
    if "ablation" not in argv or "--status" not in argv:
        return argv
    at = argv.index("--status")
    word = argv[at + 1] if at + 1 < len(argv) else ""
    if word not in ("text", "json") and (word.endswith((".yaml", ".yml")) or os.path.isfile(word)):
        return argv[:at] + ["--status=text"] + argv[at + 1:]
    return argv


def _give_back_flag_value(args: argparse.Namespace, argv: list[str], rest: list[str]) -> None:
    """TASK is optional (a card-less run names its files instead), so argparse takes the first stray word for
    it, e.g. the 1e-3 of `finetune --train_file f.csv --learning_rate 1e-3` (a TrainingArguments flag it does
    not know). Such a word is the value of the unknown flag before it: hand it back to that flag."""
    task = getattr(args, "task", None)
    if task is None or not rest or args.command not in argv:
        return
    where = argv.index(task, argv.index(args.command) + 1)
    before = argv[where - 1]
    if before.startswith("--") and "=" not in before and before in rest:
        rest.insert(rest.index(before) + 1, task)
        args.task = None


def main(argv: list[str] | None = None) -> int:
    """Run `bert-suite ARGS`; returns the exit status (2: a usage or input error, printed as one line; with
    --debug or BERT_SUITE_DEBUG=1 an input error raises, its traceback shown)."""
    parser = build_parser()
    argv = _status_before_study(_plain_negative_numbers(sys.argv[1:] if argv is None else list(argv)))
    try:  # argparse prints its usage and message, then exits; return that status instead
        args, rest = parser.parse_known_args(argv)
        args.argv = argv  # what `grid --gpus` starts its workers with
        _give_back_flag_value(args, argv, rest)
        if rest and not getattr(args, "takes_training_flags", False):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 2
    try:
        from bert_suite import cli as commands  # torch, transformers: only once a command runs

        commands.run(args, rest)
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        if args.debug or os.environ.get("BERT_SUITE_DEBUG"):
            raise
        print(f"bert-suite {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
