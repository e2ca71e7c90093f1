"""The work of each `bert-suite` command, imported once a command runs (the parsing and help are in
`bert_suite_cli`, which starts without torch). Each `_command(args, rest)` checks its flags, then
calls the modules that do the work.

Errors the user can fix (bad files, bad flags) are printed as one line and exit with status 2;
`--debug` (on any command, before or after it) or BERT_SUITE_DEBUG=1 shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .io import atomic_write_text


def _export(args: argparse.Namespace, rest: list[str]) -> None:
    if args.to == "onnx":
        from .onnx_export import DEFAULT_OPSET, export_to_onnx

        done = export_to_onnx(args.src, args.dst, DEFAULT_OPSET if args.opset is None else args.opset)
        print(f"exported {args.src} -> {done.path} (ONNX; outputs {', '.join(done.outputs)})")
        return
    if args.opset is not None:
        raise ValueError("--opset is for --to onnx; --to bert writes a transformers checkpoint")
    from .export import export_to_bert

    dst = export_to_bert(args.src, args.dst)
    print(f"exported {args.src} -> {dst} (stock transformers BERT)")


def _decontaminate(args: argparse.Namespace, rest: list[str]) -> None:
    from .pretraining.decontaminate import decontaminate

    decontaminate(args.input, args.against, args.output_dir, args.ngram, fmt=args.format)


def _dashboard(args: argparse.Namespace, rest: list[str]) -> None:
    from .dashboard import serve

    serve(args.run_dir, args.storage, args.study_name, args.host, args.port)


def _training_overrides(rest: list[str]) -> dict:
    """TrainingArguments flags given on the command line (only those, so card defaults apply to
    the rest), parsed and type-checked by HfArgumentParser."""
    if not rest:
        return {}
    import dataclasses
    import difflib

    from transformers import HfArgumentParser, TrainingArguments

    from .precision import on_cpu

    fields = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}
    # --no_X for a boolean X that defaults to false (--no_bf16): HfArgumentParser makes --no_X only for
    # those that default to true, so it becomes --X false (an explicit fp32 where auto would pick bf16).
    off = {f.name for f in dataclasses.fields(TrainingArguments) if f.init and f.default is False}
    rest = [part for a in rest for part in
            ((f"--{a[5:]}", "false") if a.startswith("--no_") and a[5:] in off else (a,))]
    given = {a[2:].split("=", 1)[0] for a in rest if a.startswith("--")}
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
        # TrainingArguments refuses --bf16 on a machine without an accelerator unless use_cpu is set (the run
        # sets it: runner.apply_precision); for this parse too, of which only the given flags are kept
        cpu_bf16 = "bf16" in names.values() and "use_cpu" not in names.values() and on_cpu()
        (parsed,) = HfArgumentParser(TrainingArguments, exit_on_error=False).parse_args_into_dataclasses(
            rest + ["--output_dir", "unused", *(["--use_cpu", "true"] if cpu_bf16 else [])], look_for_args_file=False)
    except argparse.ArgumentError as err:
        raise ValueError(f"{err}; expected a value of the flag's type (TrainingArguments)") from None
    except SystemExit:  # argparse has printed why
        raise ValueError(f"bad TrainingArguments flags: {' '.join(rest)}") from None
    return {name: getattr(parsed, name) for name in names.values()}


# Flags whose values are checked before anything is read: name -> smallest allowed value.
_FLAG_MINIMUMS = {"batch_size": 1, "hidden": 1, "num_proc": 1, "max_steps": 1, "max_train_samples": 1,
                  "max_eval_samples": 1, "max_predict_samples": 1, "heartbeat_interval": 1, "grace_period": 1,
                  "num_shards": 1, "shard_index": 0}


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


def run(args: argparse.Namespace, rest: list[str]) -> None:
    """Check the flags' values, then run the command `bert_suite_cli` parsed."""
    _check_flags(args)
    globals()[args.func](args, rest)
    _leave_group()


def _leave_group() -> None:
    """In a launched group, wait until every process is done, then close the group: a process that
    simply exits while another still writes (rank 0's predictions) tears gloo's threads down under it
    and aborts ("terminate called without an active exception")."""
    if "torch" not in sys.modules:  # a command that never imported torch (the data commands) has no group
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _tasks(args: argparse.Namespace, rest: list[str]) -> None:
    from .cards import available_cards, load_card, tasks_dir

    rows = [("task", "family", "metric", "data", "card")]
    for path in sorted(set(available_cards().values())):
        card = load_card(path)
        hub = card.hub or {}
        source = (f"Hub {hub['path']}" + (f" ({hub['name']})" if hub.get("name") else "")) if hub.get("path") \
            else "local files (--data_dir)"
        rows.append((card.name, card.family, card.select, source, path.relative_to(tasks_dir()).as_posix()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print(f"\n{len(rows) - 1} task cards in {tasks_dir()}; run one with `bert-suite finetune TASK --model ...`")


def _data_source(card, data_dir: str | None, splits: list[str] | None = None) -> str | None:
    """Where the run's data comes from, for `_needs_hub`: --data_dir, a data file when every split read
    has one, else None (the Hub)."""
    if data_dir:
        return data_dir
    splits = splits or [s for s in [card.train_split, *card.eval_splits] if s]
    files = [card.splits[s].data_file for s in splits if s in card.splits]
    return files[0] if files and len(files) == len(splits) and all(files) else None


def _save_run_card(card, args: argparse.Namespace, output_dir: str):
    """Save the run's card as OUTPUT/task_card.yaml; a card built from the files is named by it from now on."""
    from .cards import CARD_FILE, save_card
    from .distributed import is_main_process

    path = Path(output_dir) / CARD_FILE
    if is_main_process():  # the other processes of a launched group only read it
        save_card(card, path)
    if args.task is None:
        card.path = str(path)
    return card


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
    from .distributed import is_main_process
    from .runner import prepare, train_and_evaluate, training_arguments, training_precision, write_manifest

    overrides = _training_overrides(rest)  # flags first: a typo must not wait on the network
    card = _load_card(args)
    _check_push(args, card)
    _model_flags(args, card)
    output_dir = args.output_dir or f"runs/{card.name}"
    precision = training_precision(overrides, args.precision)  # sets TrainingArguments' bf16 in overrides
    lora = _lora(args)
    card = _save_run_card(card, args, output_dir)
    training = training_arguments(card, output_dir, overrides)
    samples = {"train": args.max_train_samples, "eval": args.max_eval_samples}
    prepared = prepare(card, args.model, args.data_dir, args.tokenizer, args.max_seq_length,
                       skip_bad_rows=args.skip_bad_rows, max_samples=samples)
    _announce(precision)
    result = train_and_evaluate(prepared, args.model, training, lora=lora)
    write_manifest(Path(output_dir) / "run_manifest.json", prepared, args.model, args.data_dir, training,
                   {"max_samples": samples, **precision.record(), **(lora.record() if lora else {})})
    test_scores = _predict_test_files(card, output_dir, args, precision)
    _record_test_scores(output_dir, test_scores)
    if not is_main_process():
        return
    if args.push_to_hub:
        _push(card, output_dir, args, result["metrics"], training, precision=precision, test_scores=test_scores,
              lora=lora)
    print(json.dumps({k: v for k, v in {**result["metrics"], **test_scores}.items()
                      if k.startswith(("eval_", "test_"))}, indent=2))


def _model_flags(args: argparse.Namespace, card) -> None:
    """--bilstm as the model's `bilstm:` prefix (runner.ModelSpec); then the Hub, when the checkpoint, the data
    or the tokenizer is not local."""
    from .runner import checkpoint_of

    if args.bilstm and not args.model.startswith("bilstm:"):
        args.model = f"bilstm:{args.model}"
    source = checkpoint_of(args.model)
    _needs_hub(source, _data_source(card, args.data_dir), args.tokenizer or source)


def _lora(args: argparse.Namespace, grid_ranks: list[int] | None = None):
    """The run's LoRA settings from --lora_r and its companions (None: full fine-tuning); on a grid,
    --lora_ranks turns LoRA on, its first rank standing in until each trial sets its own."""
    from .lora import lora_settings

    if grid_ranks is not None and args.lora_r is not None:
        raise ValueError("--lora_r with --lora_ranks: the grid sets the rank of every trial; give the ranks with "
                         "--lora_ranks only")
    rank = grid_ranks[0] if grid_ranks else args.lora_r
    for value in grid_ranks or []:
        lora_settings(value)  # each rank checked: --lora_ranks 0 is named like --lora_r 0
    return lora_settings(rank, args.lora_alpha, args.lora_dropout, args.lora_target_modules)


def _announce(precision) -> None:
    """The run's precision line, once the inputs have been read (an input error comes alone)."""
    from .distributed import is_main_process

    if is_main_process():
        print(precision.describe(), file=sys.stderr, flush=True)


# TrainingArguments fields a grid axis owns -> the grid flag that sets them
GRID_AXES = {"learning_rate": "--learning_rates", "per_device_train_batch_size": "--batch_sizes",
             "num_train_epochs": "--epochs", "seed": "--seeds"}


def _grid(args: argparse.Namespace, rest: list[str]) -> None:
    from .grid import run_grid, run_workers, search_space, worker_devices
    from .runner import training_precision

    overrides = _training_overrides(rest)  # flags first: a typo must not wait on the network
    workers = [] if args.grid_worker else worker_devices(args.gpus, args.workers_per_gpu)
    from .distributed import launched_processes

    if launched_processes() > 1:
        raise ValueError("grid runs whole trials, one per process: start one `bert-suite grid` per GPU or machine "
                         "with the same --storage instead of a launcher (docs/scaling-out.md)")
    card = _load_card(args)
    owned = [f"--{name} (use {flag})" for name, flag in GRID_AXES.items() if name in overrides]
    if owned:  # the grid would overwrite it with its own values
        raise ValueError(f"{', '.join(owned)}: the grid sets this for every trial; give its values with the grid flag")
    if not args.grid_worker:  # the process that started the workers checked it
        _check_push(args, card)
    _model_flags(args, card)
    output_dir = args.output_dir or f"runs/{card.name}-grid"
    precision = training_precision(overrides, args.precision)
    _announce(precision)
    lora = _lora(args, args.lora_ranks)
    card = _save_run_card(card, args, output_dir)
    space = search_space(card, args.grid, learning_rate=args.learning_rates,
                         per_device_train_batch_size=args.batch_sizes, num_train_epochs=args.epochs, seed=args.seeds,
                         lora_r=args.lora_ranks)
    if workers:  # every check above has passed: the workers run the points, this process then writes the report
        try:
            run_workers(args.argv, workers)
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP (grid.Stopped): every worker was stopped
            print(f"bert-suite grid: {str(stop) or 'interrupted'}; its workers were stopped; rerun the same command to "
                  "resume (finished trials are kept)", file=sys.stderr)
            raise SystemExit(getattr(stop, "code", 130)) from None
    result = run_grid(card, args.model, output_dir, args.data_dir, args.tokenizer, args.max_seq_length, space,
                      args.storage, args.keep_all, overrides,
                      max_samples={"train": args.max_train_samples, "eval": args.max_eval_samples},
                      heartbeat_interval=args.heartbeat_interval, grace_period=args.grace_period,
                      name=args.study_name, precision=precision, lora=lora, report=not args.grid_worker)
    if args.grid_worker:
        return
    print(Path(result["files"]["grid_results.md"]).read_text() if "grid_results.md" in result["files"] else result)
    test_scores = {}
    if result["best"] is not None:
        test_scores = _predict_test_files(card, str(Path(output_dir) / "best"), args, precision)
        _record_grid_test_scores(Path(output_dir), result, test_scores)
    if args.push_to_hub and result["best"] is not None:
        best_lora = lora.with_rank(result["best"].get("lora_r", lora.r)) if lora else None
        _push(card, str(Path(output_dir) / "best"), args, result["best"]["metrics"], None, result, precision,
              test_scores, best_lora)


def _compare(args: argparse.Namespace, rest: list[str]) -> None:
    from .compare import (
        CompareError,
        check_seeds,
        check_tasks,
        grid_space,
        parse_models,
        parse_tasks,
        run_compare,
        vocabulary_of,
    )
    from .runner import training_precision

    overrides = _training_overrides(rest)  # flags first: a typo must not wait on the network
    owned = [f"--{name} (use {flag})" for name, flag in GRID_AXES.items() if name in overrides]
    if owned:
        raise ValueError(f"{', '.join(owned)}: the grid sets this for every trial; give its values with the grid flag")
    # every check before anything is written or trained
    models = parse_models(args.model)
    rows = list(dict.fromkeys(m.row for m in models.values()))
    if args.baseline not in rows:
        raise CompareError(f"--baseline {args.baseline}: not one of the models; expected one of {', '.join(rows)}")
    check_seeds(args.seeds)
    tasks = parse_tasks(args.tasks, args.data_dir, args.metric)
    for model in models.values():
        vocabulary_of(model)  # a PATH that is not a checkpoint fails here
    _needs_hub(*(m.path for m in models.values()), *(t.data_dir for t in tasks.values()))
    check_tasks(tasks, next(iter(models.values())), args.max_seq_length)
    spaces = {key: grid_space(task, args.seeds, args.learning_rates, args.batch_sizes, args.epochs, args.grid)
              for key, task in tasks.items()}
    precision = training_precision(overrides, args.precision)
    _announce(precision)
    result = run_compare(models, tasks, args.baseline, args.seeds, spaces, args.output_dir, args.storage,
                         args.max_seq_length, args.max_eval_samples, overrides, precision,
                         args.heartbeat_interval, args.grace_period)
    print(Path(args.output_dir, "compare.md").read_text())
    print(f"wrote {Path(args.output_dir) / 'compare.json'} and compare.png ({len(result['tasks'])} tasks x "
          f"{len(result['models'])} models" + (f", {len(models)} checkpoints" if len(models) > len(rows) else "") + ")")


def _record_grid_test_scores(out: Path, result: dict, scores: dict) -> None:
    """A labelled test set's scores for the grid's best trial: in best_trial.json (`test_metrics`) and a
    section of grid_results.md, marked as test: scored once, after the choice (best/predictions/ holds the
    predictions and test_results.json)."""
    from .distributed import is_main_process
    from .report import TEST_HEADING, test_section

    if not scores or not is_main_process():
        return
    result["best"]["test_metrics"] = scores
    atomic_write_text(out / "best_trial.json", json.dumps(result["best"], indent=2, default=float))
    report = Path(result["files"].get("grid_results.md", out / "grid_results.md"))
    if report.is_file():  # every worker of a shared grid gets here: the section is replaced, never added twice
        text = report.read_text().split("\n" + TEST_HEADING, 1)[0].rstrip("\n")
        atomic_write_text(report, text + "\n\n" + test_section(result["best"], scores))
    print(test_section(result["best"], scores))


def _predict_test_files(card, model_dir: str, args: argparse.Namespace, precision=None) -> dict:
    """--test_file on finetune/grid: predict it with the trained (grid: best) checkpoint, as the example
    scripts' --do_predict; the files go to the checkpoint folder's predictions/. A labelled test file is
    scored: returns its metrics as test_<metric> (empty when no test file has labels)."""
    from .distributed import is_main_process
    from .runner import predict, test_metrics_prefix

    scores = {}
    for split in card.test_splits:
        if card.splits[split].data_file:
            done = predict(card, model_dir, split, None, model_dir, args.tokenizer, max_seq_length=args.max_seq_length,
                           precision=precision)
            prefix = test_metrics_prefix(card, split)
            scores.update({f"{prefix}_{k}": v for k, v in done.scores.items()})
            if is_main_process():
                print(f"wrote {done.path}")
    return scores


def _record_test_scores(folder: str | Path, scores: dict) -> None:
    """Add a labelled test set's scores to the run's all_results.json (beside the eval_ metrics)."""
    from .distributed import is_main_process

    path = Path(folder) / "all_results.json"
    if scores and is_main_process():
        results = json.loads(path.read_text()) if path.is_file() else {}
        atomic_write_text(path, json.dumps({**results, **scores}, indent=2, sort_keys=True))


def _push(card, folder, args, metrics, training, grid_result=None, precision=None, test_scores=None,
          lora=None) -> None:
    from .hub import model_card, push_to_hub

    info = card_info(card, args, metrics, training, grid_result, precision, test_scores, lora)
    atomic_write_text(Path(folder) / "README.md", model_card(info))
    print(f"pushed to {push_to_hub(folder, args.hub_model_id)}")


def card_info(card, args, metrics, training, grid_result=None, precision=None, test_scores=None,
              lora=None) -> dict:
    """What the model card of a finetune run or a grid's best trial says (hub.model_card's `info`);
    `test_scores` (test_<metric>) of a labelled test set go in a section of their own."""
    best = (grid_result or {}).get("best") or {}
    hparams = {k: best.get(k, getattr(training, k, None)) for k in
               ("learning_rate", "per_device_train_batch_size", "num_train_epochs", "seed")}
    if precision is not None:
        hparams["precision"] = f"{precision.record()['precision']} ({precision.reason})"
    if lora is not None:  # the checkpoint is the merged model; the adapter alone is in adapter/
        hparams.update({k: ", ".join(v) if isinstance(v, list) else v for k, v in lora.record().items()})
    task_types = {"classification": "text-classification", "squad": "question-answering",
                  "multiple_choice": "multiple-choice", "ner": "token-classification"}
    # dev scores and the training loss only: not the run's bookkeeping (sample counts, parameter counts, LoRA's
    # settings, which are hyper-parameters above)
    metrics = {k: v for k, v in metrics.items() if (k.startswith("eval_") and not k.endswith("_samples"))
               or k == "train_loss"}
    info = {"model_id": args.hub_model_id, "base_model": args.model, "task": card.name,
            "task_type": task_types.get(card.family, "text-classification"),
            "dataset": {"id": card.hub["path"], "config": card.hub.get("name"), "split": card.eval_splits[0]},
            "dev_metrics": metrics, "hyperparameters": hparams,
            "seeds": sorted({r["seed"] for r in (grid_result or {}).get("records", [])}) or [hparams["seed"]]}
    if test_scores:
        info["test_metrics"] = dict(test_scores)
    if grid_result and "grid_results.md" in grid_result["files"]:
        info["grid"] = Path(grid_result["files"]["grid_results.md"]).read_text()
    return info


def _predict(args: argparse.Namespace, rest: list[str]) -> None:
    from .runner import predict, training_precision

    card = _load_card(args)
    splits = card.test_splits if args.split == "test" else card.eval_splits if args.split == "dev" else [args.split]
    if not splits:
        raise ValueError(f"task {card.name} has no test split; predict new data with --test_file FILE")
    _needs_hub(args.model, _data_source(card, args.data_dir, splits))
    precision = training_precision({}, args.precision)  # said by predict once the data are read
    settings = {}
    if args.null_score_diff_threshold is not None:
        settings["null_score_diff_threshold"] = args.null_score_diff_threshold
    for number, split in enumerate(splits):
        if split not in card.splits:
            raise ValueError(f"task {card.name} has no split {split!r} (splits: {', '.join(card.splits)})")
        done = predict(card, args.model, split, args.data_dir, args.output_dir or args.model, args.tokenizer,
                       settings=settings, max_seq_length=args.max_seq_length,
                       options={"context": args.context} if args.context else None,
                       max_samples=args.max_predict_samples, precision=precision, announce=number == 0)
        print(f"wrote {done.path}")
        if done.scores:  # the split had gold labels
            print(json.dumps({f"{split}_{k}": v for k, v in done.scores.items()}, indent=2))


def _squad_small(args: argparse.Namespace, rest: list[str]) -> None:
    from .squad_small import build_squad_small

    report = build_squad_small(args.input, args.output_dir, args.train_share, args.seed)
    print(f"wrote {args.output_dir}/train.json ({report['train']['articles']} articles, "
          f"{report['train']['questions']:,} questions) and dev.json ({report['dev']['articles']} articles, "
          f"{report['dev']['questions']:,} questions); no article on both sides (split.json). Fine-tune with "
          f"`bert-suite grid squad_small --data_dir {args.output_dir}`")


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

    report: dict = {}
    tok = train_tokenizer(args.input, args.vocab_size, args.lowercase, args.output_dir, args.min_frequency,
                          num_proc=args.num_proc, max_word_types=args.max_word_types,
                          dask_scheduler=args.dask_scheduler, report=report, count_task_bytes=args.count_task_bytes)
    print(f"wrote {args.output_dir}: WordPiece vocabulary of {len(tok)} tokens from {report['word_types']:,} distinct "
          f"words ({report['occurrences']:,} occurrences)")
    if report["dropped_word_types"]:
        print(f"--max_word_types {args.max_word_types:,}: dropped {report['dropped_word_types']:,} rarer distinct words "
              f"with {report['dropped_occurrences']:,} occurrences ({report['dropped_share']:.2%} of all), the most "
              f"frequent of them seen {report['dropped_max_count']:,} times")


def _pretrain_data(args: argparse.Namespace, rest: list[str]) -> None:
    from .pretraining.instances import build_parts_on_dask, build_pretraining_dataset, format_stats, part_name

    settings = dict(max_seq_length=args.max_seq_length, short_seq_prob=args.short_seq_prob,
                    dupe_factor=args.dupe_factor, static_masking=args.static_masking,
                    max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
                    whole_word_mask=args.whole_word_mask, seed=args.seed, fmt=args.format,
                    balance_nsp=args.balance_nsp, docs_per_shard=args.docs_per_shard)
    if args.dask_scheduler:
        if args.shard_index is not None or args.num_proc:
            raise ValueError(f"--dask_scheduler builds every part on the cluster, one task each: leave out "
                             f"{'--shard_index' if args.shard_index is not None else '--num_proc'}")
        stats = build_parts_on_dask(args.input, args.tokenizer, args.output_dir, args.dask_scheduler,
                                    args.num_shards, **settings)
    else:
        stats = build_pretraining_dataset(args.input, args.tokenizer, args.output_dir, num_proc=args.num_proc,
                                          num_shards=args.num_shards or 1, shard_index=args.shard_index, **settings)
    if isinstance(stats, dict) and "shard_index" not in stats:  # one dataset in --output_dir, as before parts
        print(format_stats(stats))
        return
    for part in stats if isinstance(stats, list) else [stats]:
        print(format_stats(part))
        print(f"wrote {Path(args.output_dir, part_name(part['num_shards'], part['shard_index']))}")


def _corpus(args: argparse.Namespace, rest: list[str]) -> None:
    if args.from_task:
        return _task_corpus(args)
    given = [f"--{name}" for name in ("split", "data_dir", "train_file") if getattr(args, name)]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --from_task TASK (the task whose train text to write)")
    from .pretraining.corpus import build_embedded_corpus

    share = 0.2 if args.heldout_share is None else args.heldout_share
    counts = build_embedded_corpus(args.output_dir, share)
    print(f"wrote {args.output_dir}/pretrain.txt and heldout.txt: {counts}")


def _task_corpus(args: argparse.Namespace) -> None:
    """--from_task: the task's train texts as pre-training documents (never its dev or test text)."""
    from .cards import load_card
    from .own_files import with_data_files
    from .task_corpus import train_split_of, write_task_corpus

    if args.heldout_share is not None:
        raise ValueError("--heldout_share: for the embedded corpus; --from_task writes the train split only")
    card = load_card(args.from_task)
    split = train_split_of(card, args.split)  # before anything is read: dev and test text are refused at once
    if args.data_dir and Path(args.data_dir).is_file():  # one file would be read whatever split it holds
        raise ValueError(f"--data_dir {args.data_dir}: expected the task's folder (its train file is read from "
                         "it); give a single file with --train_file")
    card = with_data_files(card, args.train_file)
    _needs_hub(_data_source(card, args.data_dir, [split]))
    done = write_task_corpus(card, args.output_dir, args.data_dir, split, args.skip_bad_rows)
    empty = f"; {done['empty_documents']:,} examples without text left out" if done["empty_documents"] else ""
    print(f"wrote {done['file']}: {done['examples']:,} {split} examples of {card.name} -> {done['documents']:,} "
          f"documents, {done['lines']:,} lines{empty} (read it with `bert-suite pretrain-data --format lines`)")


def _ablation(args: argparse.Namespace, rest: list[str]) -> None:
    import shlex

    from .ablation import run_ablation
    from .ablation.launch import Stopped

    if args.status:
        from .ablation.status import format_status, study_status

        given = [f"--{flag}" for flag in ("variant", "pretraining_seeds", "storage", "results_dir")
                 if getattr(args, flag)] + (["--workers"] if args.workers != 1 else []) + \
            (["--until"] if args.until != "compare" else [])
        if given:
            raise ValueError(f"--status reads the folder only; it takes none of {', '.join(given)}")
        status = study_status(args.study, args.output_dir)
        print(json.dumps(status, indent=2) if args.status == "json" else format_status(status))
        return

    words = ["bert-suite", "ablation", args.study, "--output_dir", args.output_dir]  # what reruns it
    for flag in ("workers", "storage", "results_dir"):
        value = getattr(args, flag)
        if value not in (None, 1):
            words += [f"--{flag}", str(value)]
    command = shlex.join(words)
    try:
        run_ablation(args.study, args.output_dir, args.until, args.variant, args.workers, args.storage,
                     args.results_dir, args.worker, command, args.pretraining_seeds)
    except Stopped as stop:  # SIGTERM or SIGHUP: everything it started is stopped; rerun the command to resume
        print(f"bert-suite ablation: {stop}; rerun `{command}` to resume", file=sys.stderr)
        raise SystemExit(stop.code) from None


def _demo(args: argparse.Namespace, rest: list[str]) -> None:
    from .demo import run_demo

    print(run_demo(args.output_dir, args.max_steps, precision=args.precision))


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


def _load_card(args: argparse.Namespace):
    """The run's card: TASK's (predict: the one saved with the checkpoint), or one built from --train_file
    and --validation_file; its splits pointed at the data-file flags; the family options given on the
    command line."""
    from .cards import load_card
    from .own_files import card_from_files, load_run_card, with_data_files

    files = {role: getattr(args, f"{role}_file", None) for role in ("train", "validation", "test")}
    family = getattr(args, "task_family", None)
    columns = {"text_columns": getattr(args, "text_columns", None), "label_column": getattr(args, "label_column", None)}
    if args.task is None and args.command == "predict":
        card = with_data_files(load_run_card(args.model), *files.values())
    elif args.task is None:
        if not files["train"]:
            raise ValueError("give a TASK (a card name or path; `bert-suite tasks` lists them), or --train_file and "
                             "--validation_file to fine-tune on your own files without a card")
        if not files["validation"]:
            raise ValueError("--validation_file: a task without a card needs a dev file (the metrics, and the "
                             "grid's choice, are computed on it)")
        card = card_from_files(files["train"], files["validation"], files["test"], family or "classification",
                               **columns)
    else:
        card = load_card(args.task)
        if family and family != card.family:
            raise ValueError(f"--task_family {family}: {card.path} is a {card.family} task; --task_family is for "
                             "tasks without a card")
        given = [f"--{name}" for name, value in columns.items() if value]
        if given:
            raise ValueError(f"{', '.join(given)}: for tasks without a card; {card.path} names its columns "
                             "(text_columns, label_column)")
        card = with_data_files(card, *files.values())
    if getattr(args, "context", None):
        if card.family != "ner":
            raise ValueError(f"--context applies to NER cards; {card.name} is a {card.family} task")
        card.options = {**card.options, "context": args.context}
    return card


from bert_suite_cli import build_parser, main  # noqa: E402,F401  (`python -m bert_suite.cli`, tests)

if __name__ == "__main__":
    sys.exit(main())
