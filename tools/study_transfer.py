"""An ablation study's pre-training on a GPU machine, fine-tuned here: the files in between.

A GPU machine without network brings nothing from here but the working tree and a few carried folders,
and sends back at most 8 files of 16 MiB. So the study's data go there as one archive of the raw files it reads,
each variant is pre-trained there by `bert-suite ablation STUDY --until pretraining --variant NAME` (see
tools/gpu_study_pretraining.sh), and its models come back in bf16 with everything needed to check them:

  pack-data STUDY ARCHIVE          here: the raw files STUDY reads (corpus files, task folders), relative to
                                   BERT_SUITE_DATA, as ARCHIVE (tar.xz)
  collect STUDY WORK OUT           there: per run (a variant at each pre-training seed, NAME or NAME.seedS, in
                                   WORK/VARIANT, the --output_dir of the variant's process) the run's record
                                   (pretrain_results.json, metrics.jsonl, timing.json, the recipe's log, the stage
                                   records, the vocabulary's SHA-256 and the instances' statistics) in
                                   OUT/records.tar.gz and its final model and snapshots in bf16 in OUT/models-K.tar
                                   (each under 16 MiB); OUT/summary.json says what came out
  install STUDY OUTPUT_DIR FROM    here: each run FROM holds into OUTPUT_DIR/pretraining/NAME (its seed the
                                   study's for that run), after checking that it was trained on the data this
                                   folder's stages hold (the vocabulary's SHA-256, the instances' counts); the
                                   weights back in fp32; the pre-training stage's record written as the study
                                   writes it; a run already there is moved to OUTPUT_DIR/pretraining-replaced/NAME.
                                   `bert-suite ablation STUDY --output_dir OUTPUT_DIR` then finds the runs
                                   pre-trained and fine-tunes them.

bf16 halves the files (a tiny model's 6.2 MB to 3.1 MB); a weight rounded to bf16 is within 0.4% of the trained
one, and every pre-trained variant of a study comes back the same way (the random twins start from fresh weights).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tarfile
from pathlib import Path

LIMIT = 15 << 20  # a file that comes back: under 16 MiB
RECORD_FILES = ("pretrain_results.json", "metrics.jsonl", "timing.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def data_stats(folder: Path) -> dict:
    """The instances' statistics that identify them (their file list names paths, which differ by machine)."""
    stats = json.loads((folder / "pretrain_data_stats.json").read_text())
    return {k: stats[k] for k in ("instances", "tokens", "not_next_share", "corpus_tokens", "documents", "sentences")
            if k in stats}


def study_data(study_path: str):
    from bert_suite.ablation.study import load_study

    return load_study(study_path)


# ------------------------------------------------------------------------------------------- here: pack-data


def pack_data(study_path: str, archive: Path) -> None:
    root = Path(os.environ.get("BERT_SUITE_DATA") or Path(study_path).resolve().parents[3] / "shared" / "data").resolve()
    study = study_data(study_path)
    files: set[Path] = set()
    for name in study.pretrained:
        files.update(Path(f).resolve() for f in study.data_of(name)[0].files)
    folders = {Path(d.folder).resolve() for d in study.compare.data_dirs}  # task texts, decontamination, grids
    outside = [p for p in [*files, *folders] if root not in p.parents and p != root]
    if outside:
        sys.exit(f"pack-data: {outside[0]} is outside BERT_SUITE_DATA ({root}); set BERT_SUITE_DATA to the folder "
                 "that holds every file the study reads")
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for path in sorted(files | folders):
            tar.add(path, arcname=str(path.relative_to(root)))
    print(f"{archive}: {len(files)} corpus files and {len(folders)} task folders from {root}, "
          f"{archive.stat().st_size / 2**20:.1f} MiB")


# ------------------------------------------------------------------------------------------- there: collect


def folders(study_path: str, target: Path, names: list[str]) -> None:
    """The variants to run (`names`, or every pre-trained one) on stdout, and WORK/folders.json: the folder
    each runs in, the first variant with the same data (corpus, vocabulary, instances)."""
    from dataclasses import asdict

    study = study_data(study_path)
    names = names or study.pretrained
    unknown = [n for n in names if n not in study.pretrained]
    if unknown:
        sys.exit(f"--variants: {unknown[0]} is not a pre-trained variant of {study_path} "
                 f"({', '.join(study.pretrained)})")
    first: dict[str, str] = {}
    chosen = {n: first.setdefault(json.dumps([asdict(x) for x in study.data_of(n)], default=str, sort_keys=True), n)
              for n in names}
    target.write_text(json.dumps(chosen))
    # a biphasic variant whose first steps are a left-to-right one's waits for that one's checkpoint at the switch
    # (then the study starts it there: stages.reused_starts): WORK/waits.json, {variant: the file to wait for}
    from bert_suite.ablation.stages import reused_starts

    steps = study.pretraining.steps
    waits = {name: f"{chosen[donor]}/pretraining/{donor}/checkpoints/step-{step}/progress.json"
             for name, (donor, step) in (reused_starts(study, steps).items() if steps else ())
             if name in chosen and donor in chosen}
    target.with_name("waits.json").write_text(json.dumps(waits))
    print(" ".join(names))



def cast_folder(folder: Path, target: Path, dtype) -> None:
    """`folder`'s files in `target`, the floating-point tensors of its safetensors files cast to `dtype` (bf16
    to send a model back, fp32 to read it here)."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.suffix == ".safetensors":
            tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(f).items()}
            save_file(tensors, target / f.name, metadata={"format": "pt"})
        elif f.is_file():
            shutil.copyfile(f, target / f.name)


def folder_of(work: Path, name: str) -> Path:
    """The --output_dir variant `name` ran in: variants with the same data share one (WORK/folders.json)."""
    folders = json.loads((work / "folders.json").read_text()) if (work / "folders.json").is_file() else {}
    return work / folders.get(name, name)


def runs_of(study_path: str, names: list[str]) -> list:
    """The pre-trainings of `names` (study.runs: a variant once per pre-training seed, in NAME or NAME.seedS)."""
    return study_data(study_path).runs(names)


def variant_summary(name: str, work: Path, variant: str | None = None) -> dict:
    """One run's facts (`name`: the run, in the folder of its `variant`, by default the run's own name)."""
    variant = variant or name
    run = folder_of(work, variant) / "pretraining" / name
    results = json.loads((run / "pretrain_results.json").read_text()) if (run / "pretrain_results.json").is_file() else {}
    windows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] \
        if (run / "metrics.jsonl").is_file() else []
    rates = [w["tokens_per_second"] for w in windows[1:] if "tokens_per_second" in w]
    config = results.get("config", {})
    vocab = Path(config["tokenizer"]) / "vocab.txt" if config.get("tokenizer") else None
    instances = {key: Path(config[key]) for key in ("train_data", "train_data_phase2") if config.get(key)}
    timing = json.loads((run / "timing.json").read_text()) if (run / "timing.json").is_file() else []
    exit_file = work / f"{variant}.exit"  # the exit code of the variant's process, which trains all its seeds
    return {
        "variant": variant, "seed": config.get("seed"),
        "exit_code": int(exit_file.read_text()) if exit_file.is_file() else None,
        "finished_step": results.get("step") if (run / "final" / "config.json").is_file() else None,
        "seconds": sum(t["seconds"] for t in timing),
        "tokens_per_second_median": statistics.median(rates) if rates else None,
        "step_form": results.get("step_form"), "objectives": results.get("objectives"),
        "last_window": windows[-1] if windows else None,
        "vocab_sha256": sha256(vocab) if vocab and vocab.is_file() else None,
        "instances": {key: data_stats(path) for key, path in instances.items()
                      if (path / "pretrain_data_stats.json").is_file()},
        "snapshots": sorted(p.name for p in (run / "snapshots").iterdir()) if (run / "snapshots").is_dir() else [],
    }


def collect(study_path: str, work: Path, out: Path, names: list[str]) -> None:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    runs = runs_of(study_path, names)  # every pre-training seed of each variant: NAME, NAME.seedS
    summary = {"study": study_path, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "variants": {r.name: variant_summary(r.name, work, r.variant) for r in runs}}
    records = []  # (path, arcname) for records.tar.gz, written last with summary.json
    for r in runs:
        folder = folder_of(work, r.variant)
        run = folder / "pretraining" / r.name
        for path, arcname in [*((run / f, f) for f in RECORD_FILES),
                              (folder / "logs" / f"pretraining-{r.name}.log", f"logs/pretraining-{r.name}.log"),
                              (folder / "stages", "stages"), (work / f"{r.variant}.log", "ablation.log")]:
            if path.exists():
                records.append((path, f"{r.name}/{arcname}"))
    half = work / "bf16"
    shutil.rmtree(half, ignore_errors=True)
    models = []  # (arcname, folder) of every model that came out of a run
    for name in (r.name for r in runs):
        run = folder_of(work, summary["variants"][name]["variant"]) / "pretraining" / name
        if (run / "final" / "config.json").is_file():
            models.append((f"{name}/final", run / "final"))
        for snap in sorted((run / "snapshots").glob("step-*")) if (run / "snapshots").is_dir() else []:
            models.append((f"{name}/snapshots/{snap.name}", snap))
    archives, size, tar = [], 0, None
    for arcname, folder in models:
        cast_folder(folder, half / arcname, torch.bfloat16)
        weight = 0.8 * sum(f.stat().st_size for f in (half / arcname).iterdir())  # gzip: bf16 weights to ~0.75
        if tar is None or size + weight > LIMIT:
            if tar is not None:
                tar.close()
            archives.append(out / f"models-{len(archives) + 1}.tar.gz")
            tar, size = tarfile.open(archives[-1], "w:gz"), 0
        tar.add(half / arcname, arcname=arcname)
        size += weight
    if tar is not None:
        tar.close()
    summary["archives"] = {a.name: a.stat().st_size for a in archives}
    summary["models"] = [a for a, _ in models]
    if len(archives) + 1 > 8:
        summary["warning"] = f"{len(archives) + 1} files: more than the 8 that come back"
    (work / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    with tarfile.open(out / "records.tar.gz", "w:gz") as tar:
        for path, arcname in [*records, (work / "run.log", "run.log"), (work / "summary.json", "summary.json")]:
            if path.exists():
                tar.add(path, arcname=arcname)
    print(json.dumps({n: {k: v[k] for k in ("exit_code", "finished_step", "seconds", "tokens_per_second_median")}
                      for n, v in summary["variants"].items()}, indent=1))


# ------------------------------------------------------------------------------------------- here: install


PATH_KEYS = ("train_data", "train_data_phase2", "tokenizer", "output_dir")


def localized(results: dict, overrides: dict, device: str) -> dict:
    """pretrain_results.json of a run made on another machine, its paths (the data, the tokenizer, the run)
    those of this folder, which the study reads; the other machine's kept under pretrained_on."""
    config = results["config"]
    theirs = {k: config.get(k) for k in PATH_KEYS if config.get(k) is not None}
    config.update({k: str(overrides[k]) for k in PATH_KEYS if k in overrides})
    results["pretrained_on"] = {"device": device, "weights": "bf16 copy of the final fp32 weights, back in fp32",
                                "paths_there": theirs, **{k: v for k, v in results.get("pretrained_on", {}).items()
                                                          if k == "paths_there"}}
    return results


def install(study_path: str, output_dir: Path, source: Path, names: list[str] | None, device: str | None) -> None:
    import torch

    from bert_suite.ablation.locks import data_lock, variant_lock
    from bert_suite.ablation.stages import (
        Progress,
        build_data,
        check_pretraining,
        data_starts,
        plan_steps,
        run_overrides,
        task_data,
    )

    for archive in sorted(source.glob("*.tar*")):  # records.tar.gz and models-K.tar, unpacked beside them
        with tarfile.open(archive) as tar:
            tar.extractall(source / "unpacked", filter="data")
    unpacked = source / "unpacked"
    summary = json.loads((unpacked / "summary.json").read_text())
    study = study_data(study_path)
    runs = {r.name: r for r in study.runs()}  # a variant at each pre-training seed: NAME, NAME.seedS
    came = [n for n in summary["variants"] if (unpacked / n / "final").is_dir()]
    for name in names or []:  # --variants: a variant (each of its runs) or a run (NAME.seedS), come back
        if name not in study.pretrained and name not in runs:
            sys.exit(f"install: --variants {name}: not a pre-trained variant or run of {study_path} (its runs: "
                     f"{', '.join(runs)})")
        if not [n for n in came if n == name or runs.get(n) and runs[n].variant == name]:
            sys.exit(f"install: --variants {name}: no final model of it came back in {source} (came back: "
                     f"{', '.join(came) or 'none'})")
    chosen = [n for n in came if not names or n in names or n in runs and runs[n].variant in names]
    strange = [n for n in chosen if n not in runs]
    if strange:
        sys.exit(f"install: {strange[0]} came back but is no run of {study_path} (its runs: {', '.join(runs)})")
    if not chosen:
        sys.exit(f"install: no final model came back in {source}; expected NAME/final folders from `collect`")
    names = chosen
    out = output_dir.resolve()
    progress = Progress()
    with data_lock(out):
        data = build_data(study, out, task_data(study, out, progress), progress,
                          only=list(dict.fromkeys(runs[n].variant for n in names)))
        steps = plan_steps(study, out, data, progress)
    for name in names:
        facts, variant, seed = summary["variants"][name], runs[name].variant, runs[name].seed
        if facts.get("seed") not in (None, seed):
            sys.exit(f"install: {name} came back pre-trained with seed {facts['seed']}, not the study's {seed}")
        if facts["finished_step"] != steps:
            sys.exit(f"install: {name} came back at step {facts['finished_step']}, not the study's {steps:,}")
        here = sha256(data[variant].vocab / "vocab.txt" if data[variant].vocab.is_dir() else data[variant].vocab)
        if facts["vocab_sha256"] != here:
            sys.exit(f"install: {name} was trained with another vocabulary (SHA-256 {facts['vocab_sha256']}, this "
                     f"folder's {here})")
        lengths = data[variant].lengths
        for key, length in zip(("train_data", "train_data_phase2"), lengths, strict=False):
            mine = data_stats(data[variant].instances[length])
            theirs = facts["instances"].get(key)
            if theirs != mine:
                sys.exit(f"install: {name}'s {key} ({length} tokens) differs from this folder's: {theirs} against "
                         f"{mine}")
        run = out / "pretraining" / name
        # the stage's own keys, with what a donor keeps for its biphasic runs: the study then takes it as its own
        overrides = run_overrides(study, runs[name], data, run, steps, data_starts(study, steps, data))
        with variant_lock(out, name):
            if run.exists():
                aside = out / "pretraining-replaced" / name
                shutil.rmtree(aside, ignore_errors=True)
                aside.parent.mkdir(parents=True, exist_ok=True)
                run.rename(aside)
                print(f"{run} moved to {aside}")
            check_pretraining(out, name, overrides, False)
            staging = run.with_name(f".{name}.installing")
            shutil.rmtree(staging, ignore_errors=True)
            for folder in [unpacked / name / "final", *sorted((unpacked / name / "snapshots").glob("step-*"))]:
                # back in fp32, the dtype the study's models are read in
                cast_folder(folder, staging / folder.relative_to(unpacked / name), torch.float32)
            for f in RECORD_FILES:
                if (unpacked / name / f).is_file():
                    shutil.copyfile(unpacked / name / f, staging / f)
            timing = json.loads((staging / "timing.json").read_text())
            for entry in timing:
                entry["device"] = device or summary["device"]
            (staging / "timing.json").write_text(json.dumps(timing, indent=2))
            results = localized(json.loads((staging / "pretrain_results.json").read_text()), overrides,
                                device or summary["device"])
            (staging / "pretrain_results.json").write_text(json.dumps(results, indent=2))
            log = unpacked / name / "logs" / f"pretraining-{name}.log"
            if log.is_file():
                (out / "logs").mkdir(exist_ok=True)
                shutil.copyfile(log, out / "logs" / f"pretraining-{name}.log")
            staging.rename(run)
        print(f"{name}: installed in {run} ({steps:,} steps on {device or summary['device']}, "
              f"{sum(t['seconds'] for t in timing) / 60:.1f} minutes)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack-data")
    p.add_argument("study")
    p.add_argument("archive", type=Path)
    p = sub.add_parser("folders")
    p.add_argument("study")
    p.add_argument("target", type=Path)
    p.add_argument("variants", nargs="*")
    p = sub.add_parser("collect")
    p.add_argument("study")
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--variants", nargs="+", required=True)
    p = sub.add_parser("install")
    p.add_argument("study")
    p.add_argument("output_dir", type=Path)
    p.add_argument("source", type=Path)
    p.add_argument("--variants", nargs="+")
    p.add_argument("--device", help="the device's name in the records (default: the one summary.json gives)")
    args = parser.parse_args(argv)
    if args.command == "pack-data":
        pack_data(args.study, args.archive)
    elif args.command == "folders":
        folders(args.study, args.target, args.variants)
    elif args.command == "collect":
        collect(args.study, args.work, args.out, args.variants)
    else:
        install(args.study, args.output_dir, args.source, args.variants, args.device)


if __name__ == "__main__":
    main()
