"""`bert-suite ...`: argument parsing only; the work lives in the modules it calls.

Errors the user can fix (bad files, bad flags) are printed as one line and exit with status 2;
set BERT_SUITE_DEBUG=1 to see the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from .io import atomic_write_text


def _export(args: argparse.Namespace, rest: list[str]) -> None:
    from .export import export_to_bert

    dst = export_to_bert(args.src, args.dst)
    print(f"exported {args.src} -> {dst} (stock transformers BERT)")


def _training_overrides(rest: list[str]) -> dict:
    """TrainingArguments flags given on the command line (only those, so card defaults apply to
    the rest), parsed and type-checked by HfArgumentParser."""
    if not rest:
        return {}
    import dataclasses
    import difflib

    from transformers import HfArgumentParser, TrainingArguments

    given = {a[2:].split("=", 1)[0] for a in rest if a.startswith("--")}
    fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    names = {}
    for flag in given:
        name = flag.replace("-", "_")  # HfArgumentParser takes --learning-rate too
        # ... and --no_X for a boolean X that defaults to true.
        names[flag] = name[3:] if name not in fields and name.startswith("no_") and name[3:] in fields else name
    for flag, name in sorted(names.items()):
        if name not in fields:  # argparse would take an abbreviation (--learning_rat) and the value be lost
            close = difflib.get_close_matches(name, fields, n=1)
            raise ValueError(f"--{flag}: not a TrainingArguments flag"
                             + (f" (did you mean --{close[0]}?)" if close else "")
                             + "; expected the full name of a bert-suite or TrainingArguments option")
    try:
        (parsed,) = HfArgumentParser(TrainingArguments, exit_on_error=False).parse_args_into_dataclasses(
            rest + ["--output_dir", "unused"], look_for_args_file=False)
    except argparse.ArgumentError as err:
        raise ValueError(f"{err}; expected a value of the flag's type (TrainingArguments)") from None
    except SystemExit:  # argparse has printed why
        raise ValueError(f"bad TrainingArguments flags: {' '.join(rest)}") from None
    return {name: getattr(parsed, name) for name in names.values()}


# Flags whose values are checked before anything is read: name -> smallest allowed value.
_FLAG_MINIMUMS = {"batch_size": 1, "hidden": 1, "num_proc": 1, "max_steps": 1}


def _check_flags(args: argparse.Namespace) -> None:
    """Values no command can use, named by their flag (the commands check the rest)."""
    from .tokenization import check_max_seq_length

    if getattr(args, "max_seq_length", None) is not None:
        check_max_seq_length(args.max_seq_length, "--max_seq_length")
    for name, least in _FLAG_MINIMUMS.items():
        value = getattr(args, name, None)
        if isinstance(value, int) and value < least:
            raise ValueError(f"--{name} must be at least {least}, got {value}")
    if args.command == "feature-ner" and args.epochs < 1:
        raise ValueError(f"--epochs must be at least 1, got {args.epochs}")


def _needs_hub(*sources: str | None) -> None:
    """Fail fast offline: when a source is neither a local path nor a preset, and the Hub does not
    answer, go offline so a missing cache entry errors at once (naming --data_dir / --model)."""
    if any(s is None or not (s.startswith("preset:") or Path(s).exists()) for s in sources):
        from .hub import offline_unless_reachable

        offline_unless_reachable()


def _check_push(args: argparse.Namespace, card) -> None:
    """Before any training: --push_to_hub needs a repository id, a card with a Hub dataset (for the
    model card's metadata) and a reachable Hub."""
    if not args.push_to_hub:
        return
    if not args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id (e.g. user/bert-base-rte)")
    if not (card.hub or {}).get("path"):
        raise ValueError(f"--push_to_hub: the card {card.path} has no hub.path (the dataset's Hub id), which the "
                         "model card's metadata needs")
    from .hub import offline_unless_reachable

    if offline_unless_reachable():
        raise ValueError("--push_to_hub: the Hugging Face Hub cannot be reached (or HF_HUB_OFFLINE is set); "
                         "run without it and push the output folder later")


def _finetune(args: argparse.Namespace, rest: list[str]) -> None:
    from .runner import prepare, train_and_evaluate, training_arguments, write_manifest

    card = _load_card(args)
    overrides = _training_overrides(rest)  # flags first: a typo must not wait on the network
    _check_push(args, card)
    _needs_hub(args.model, args.data_dir, args.tokenizer or args.model)
    output_dir = args.output_dir or f"runs/{card.name}"
    training = training_arguments(card, output_dir, overrides)
    prepared = prepare(card, args.model, args.data_dir, args.tokenizer, args.max_seq_length,
                       skip_bad_rows=args.skip_bad_rows)
    result = train_and_evaluate(prepared, args.model, training)
    write_manifest(Path(output_dir) / "run_manifest.json", prepared, args.model, args.data_dir, training)
    if args.push_to_hub:
        _push(card, output_dir, args, result["metrics"], training)
    print(json.dumps({k: v for k, v in result["metrics"].items() if k.startswith("eval_")}, indent=2))


# TrainingArguments fields a grid axis owns -> the grid flag that sets them
GRID_AXES = {"learning_rate": "--learning_rates", "per_device_train_batch_size": "--batch_sizes",
             "num_train_epochs": "--epochs", "seed": "--seeds"}


def _grid(args: argparse.Namespace, rest: list[str]) -> None:
    from .grid import run_grid, search_space

    card = _load_card(args)
    overrides = _training_overrides(rest)  # flags first: a typo must not wait on the network
    owned = [f"--{name} (use {flag})" for name, flag in GRID_AXES.items() if name in overrides]
    if owned:  # the grid would overwrite it with its own values
        raise ValueError(f"{', '.join(owned)}: the grid sets this for every trial; give its values with the grid flag")
    _check_push(args, card)
    _needs_hub(args.model, args.data_dir, args.tokenizer or args.model)
    output_dir = args.output_dir or f"runs/{card.name}-grid"
    space = search_space(card, args.grid, learning_rate=args.learning_rates,
                         per_device_train_batch_size=args.batch_sizes, num_train_epochs=args.epochs, seed=args.seeds)
    result = run_grid(card, args.model, output_dir, args.data_dir, args.tokenizer, args.max_seq_length, space,
                      args.storage, args.keep_all, overrides)
    print(Path(result["files"]["grid_results.md"]).read_text() if "grid_results.md" in result["files"] else result)
    if args.push_to_hub and result["best"] is not None:
        _push(card, str(Path(output_dir) / "best"), args, result["best"]["metrics"], None, result)


def _push(card, folder, args, metrics, training, grid_result=None) -> None:
    from .hub import model_card, push_to_hub

    best = (grid_result or {}).get("best") or {}
    hparams = {k: best.get(k, getattr(training, k, None)) for k in
               ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed")}
    task_types = {"classification": "text-classification", "squad": "question-answering",
                  "multiple_choice": "multiple-choice", "ner": "token-classification"}
    info = {"model_id": args.hub_model_id, "base_model": args.model, "task": card.name,
            "task_type": task_types.get(card.family, "text-classification"),
            "dataset": {"id": card.hub["path"], "config": card.hub.get("name"), "split": card.eval_splits[0]},
            "dev_metrics": metrics, "hyperparameters": hparams,
            "seeds": sorted({r["seed"] for r in (grid_result or {}).get("records", [])}) or [hparams["seed"]]}
    if grid_result and "grid_results.md" in grid_result["files"]:
        info["grid"] = Path(grid_result["files"]["grid_results.md"]).read_text()
    atomic_write_text(Path(folder) / "README.md", model_card(info))
    print(f"pushed to {push_to_hub(folder, args.hub_model_id)}")


def _predict(args: argparse.Namespace, rest: list[str]) -> None:
    from .runner import predict

    card = _load_card(args)
    _needs_hub(args.model, args.data_dir)
    splits = card.test_splits if args.split == "test" else card.eval_splits if args.split == "dev" else [args.split]
    if not splits:
        raise ValueError(f"task {card.name} has no test split; predict new data with --split dev --data_dir FILE")
    settings = {}
    if args.null_score_diff_threshold is not None:
        settings["null_score_diff_threshold"] = args.null_score_diff_threshold
    for split in splits:
        if split not in card.splits:
            raise ValueError(f"task {card.name} has no split {split!r} (splits: {', '.join(card.splits)})")
        path = predict(card, args.model, split, args.data_dir, args.output_dir or args.model, args.tokenizer,
                       settings=settings, max_seq_length=args.max_seq_length,
                       options={"context": args.context} if args.context else None)
        print(f"wrote {path}")


def _score(args: argparse.Namespace, rest: list[str]) -> None:
    from .metrics.squad import score_files

    result = score_files(args.data, args.predictions, args.na_probs, args.na_prob_thresh, args.version)
    text = json.dumps(result)
    if args.out_file:
        atomic_write_text(args.out_file, text)
    print(text)


def _glue_package(args: argparse.Namespace, rest: list[str]) -> None:
    from .glue_package import package

    _needs_hub(args.data_dir)
    summary = package(args.run_dirs, args.output_dir, args.data_dir, args.tokenizer)
    print(Path(args.output_dir, "dev_summary.md").read_text())
    print(f"wrote {summary['zip']} ({len(summary['files'])} files"
          + (f"; missing {', '.join(summary['missing'])})" if summary["missing"] else ")"))


def _tokenizer(args: argparse.Namespace, rest: list[str]) -> None:
    from .pretraining.tokenizer import train_tokenizer

    tok = train_tokenizer(args.input, args.vocab_size, args.lowercase, args.output_dir, args.min_frequency)
    print(f"wrote {args.output_dir}: WordPiece vocabulary of {len(tok)} tokens")


def _pretrain_data(args: argparse.Namespace, rest: list[str]) -> None:
    from .pretraining.instances import build_pretraining_dataset, format_stats

    stats = build_pretraining_dataset(
        args.input, args.tokenizer, args.output_dir, max_seq_length=args.max_seq_length,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, static_masking=args.static_masking,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        whole_word_mask=args.whole_word_mask, seed=args.seed, num_proc=args.num_proc, fmt=args.format)
    print(format_stats(stats))


def _corpus(args: argparse.Namespace, rest: list[str]) -> None:
    from .pretraining.corpus import build_embedded_corpus

    counts = build_embedded_corpus(args.output_dir, args.heldout_share)
    print(f"wrote {args.output_dir}/pretrain.txt and heldout.txt: {counts}")


def _demo(args: argparse.Namespace, rest: list[str]) -> None:
    from .demo import run_demo

    print(run_demo(args.output_dir, args.max_steps))


def _extract_features(args: argparse.Namespace, rest: list[str]) -> None:
    from .cards import load_card
    from .feature_based import extract_features

    _needs_hub(args.model, args.tokenizer or args.model)
    data = extract_features(args.model, args.input, args.output_dir, load_card(args.task), args.layers, args.pool,
                            args.tokenizer, args.context, args.max_seq_length, args.batch_size)
    print(f"wrote {args.output_dir}: {len(data):,} sentences, {sum(len(t) for t in data['tokens']):,} words")


def _feature_ner(args: argparse.Namespace, rest: list[str]) -> None:
    import datasets

    from .cards import load_card
    from .feature_based import train_tagger

    train, dev = (datasets.load_from_disk(p) for p in (args.train_features, args.dev_features))
    result = train_tagger(train, dev, load_card(args.task).labels, args.output_dir, args.epochs, args.learning_rate,
                          args.batch_size, args.hidden, args.seed)
    print(json.dumps({k: v for k, v in result.items() if k.startswith("eval_")}, indent=2))


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", help="task card name (rte, glue/mnli, ...) or path to a card YAML")
    p.add_argument("--model", required=True,
                   help="Hub id or local checkpoint (stock BERT or bert_suite), or preset:NAME for random weights")
    p.add_argument("--data_dir", help="folder with the task's original files (default: the Hub)")
    p.add_argument("--output_dir", help="output folder (default: runs/TASK)")
    p.add_argument("--tokenizer", help="tokenizer folder or vocab.txt (default: the model's)")
    p.add_argument("--max_seq_length", type=int, help="default: the card's (128 for GLUE)")
    p.add_argument("--skip_bad_rows", action="store_true", help="skip malformed rows (counted and reported)")
    p.add_argument("--push_to_hub", action="store_true", help="push the final/best checkpoint with a model card")
    p.add_argument("--hub_model_id", help="Hub repository for --push_to_hub")
    _add_context_flag(p)


def _add_context_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context", choices=["sentence", "document"],
                   help="NER: encode each sentence alone, or inside windows over its document (default: the card's)")


def _load_card(args: argparse.Namespace):
    """The card, with the family options given on the command line."""
    from .cards import load_card

    card = load_card(args.task)
    if getattr(args, "context", None):
        if card.family != "ner":
            raise ValueError(f"--context applies to NER cards; {card.name} is a {card.family} task")
        card.options = {**card.options, "context": args.context}
    return card


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bert-suite", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    export = sub.add_parser("export", help="convert a bert_suite checkpoint to another format")
    export.add_argument("--to", choices=["bert"], required=True, help="target format (stock transformers BERT)")
    export.add_argument("src", help="bert_suite checkpoint folder")
    export.add_argument("dst", help="output folder")
    export.set_defaults(func=_export)

    finetune = sub.add_parser("finetune", help="one fine-tuning run; extra flags are TrainingArguments "
                              "(e.g. --learning_rate 3e-5 --num_train_epochs 2)")
    _add_run_flags(finetune)
    finetune.set_defaults(func=_finetune, takes_training_flags=True)

    grid = sub.add_parser("grid", help="the exhaustive learning-rate x batch-size x epochs grid with restarts")
    _add_run_flags(grid)
    grid.add_argument("--grid", choices=["paper", "paper-glue"], help="a preset grid (default: the card's)")
    grid.add_argument("--learning_rates", type=float, nargs="+")
    grid.add_argument("--batch_sizes", type=int, nargs="+")
    grid.add_argument("--epochs", type=float, nargs="+")
    grid.add_argument("--seeds", type=int, nargs="+", help="random restarts (default: 42)")
    grid.add_argument("--storage", help="Optuna storage URL (default: sqlite file in the output folder)")
    grid.add_argument("--keep_all", action="store_true", help="keep every trial's checkpoint, not only the best")
    grid.set_defaults(func=_grid, takes_training_flags=True)

    pred = sub.add_parser("predict", help="predict a split with a fine-tuned checkpoint")
    pred.add_argument("task")
    pred.add_argument("--model", required=True, help="fine-tuned checkpoint folder")
    pred.add_argument("--split", default="test", help="test (all test splits), dev, or a split name")
    pred.add_argument("--data_dir")
    pred.add_argument("--tokenizer")
    pred.add_argument("--output_dir", help="default: the model folder")
    pred.add_argument("--max_seq_length", type=int, help="default: the card's")
    _add_context_flag(pred)
    pred.add_argument("--null_score_diff_threshold", type=float,
                      help="SQuAD v2: predict no answer when null score - best span score exceeds this "
                      "(default: the threshold chosen on dev and saved with the checkpoint, else 0)")
    pred.set_defaults(func=_predict)

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
    score.set_defaults(func=_score)

    package = sub.add_parser("glue-package", help="GLUE server files + zip + dev summary from finetune/grid runs")
    package.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="finetune or grid output folders")
    package.add_argument("--output_dir", required=True, help="where the server files and the zip go")
    package.add_argument("--data_dir", help="GLUE root (RTE/, MNLI/, diagnostic/, ...) for test files and "
                         "row checks (default: the folders the runs were trained from)")
    package.add_argument("--tokenizer", help="tokenizer, if the checkpoints lack one")
    package.set_defaults(func=_glue_package)

    feats = sub.add_parser("extract-features", help="per-word features of a CoNLL file from frozen layers "
                           "(the feature-based route of Table 7)")
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
    feats.set_defaults(func=_extract_features)

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
    tagger.set_defaults(func=_feature_ner)

    tok = sub.add_parser("tokenizer", help="train a WordPiece vocabulary on text files")
    tok.add_argument("--input", nargs="+", required=True, help="text files")
    tok.add_argument("--vocab_size", type=int, default=30522)
    tok.add_argument("--lowercase", action="store_true", help="uncased vocabulary (as bert-base-uncased)")
    tok.add_argument("--min_frequency", type=int, default=2)
    tok.add_argument("--output_dir", required=True)
    tok.set_defaults(func=_tokenizer)

    data = sub.add_parser("pretrain-data", help="documents -> NSP instances (a datasets folder for the recipe)")
    data.add_argument("--input", nargs="+", required=True,
                      help="text files: one sentence per line and a blank line between documents, or raw text")
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
    data.add_argument("--seed", type=int, default=12345)
    data.add_argument("--num_proc", type=int, help="worker processes (default: 1)")
    data.add_argument("--format", default="auto", choices=["auto", "lines", "raw", "wikitext"],
                      help="input layout (auto detects)")
    data.set_defaults(func=_pretrain_data)

    corpus = sub.add_parser("corpus", help="write the embedded corpus (stdlib documentation) as text files")
    corpus.add_argument("--output_dir", required=True)
    corpus.add_argument("--heldout_share", type=float, default=0.2, help="documents kept out for the demo task")
    corpus.set_defaults(func=_corpus)

    demo = sub.add_parser("demo", help="the embedded demo: corpus -> vocabulary -> pre-training -> fine-tuning")
    demo.add_argument("--output_dir", default="runs/demo")
    demo.add_argument("--max_steps", type=int, help="pre-training steps (default: 700)")
    demo.set_defaults(func=_demo)

    # No abbreviations: `grid --learning_rate X` would otherwise be read as --learning_rates, and an
    # abbreviated TrainingArguments flag be taken for one of ours.
    for command in (parser, *sub.choices.values()):
        command.allow_abbrev = False
    return parser


_EXPONENT_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _plain_negative_numbers(argv: list[str]) -> list[str]:
    """-1e-5 -> -0.00001 (the same number): argparse reads a word starting with '-' as a flag unless it
    looks like a plain negative number, so `--learning_rate -1e-5` would fail as a missing value and
    never reach the check that names the flag."""
    from decimal import Decimal

    return [format(Decimal(a), "f") if _EXPONENT_NUMBER.fullmatch(a) else a for a in argv]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = _plain_negative_numbers(sys.argv[1:] if argv is None else list(argv))
    try:  # argparse prints its usage and message, then exits; return that status instead
        args, rest = parser.parse_known_args(argv)
        if rest and not getattr(args, "takes_training_flags", False):
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 2
    try:
        _check_flags(args)
        args.func(args, rest)
    except (ValueError, OSError, KeyError, RuntimeError) as err:
        if os.environ.get("BERT_SUITE_DEBUG"):
            raise
        print(f"bert-suite {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
