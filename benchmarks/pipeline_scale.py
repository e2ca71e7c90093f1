# Command: .venv/bin/python benchmarks/pipeline_scale.py [--sizes_mb 100 300 1000] [--letters_sizes_mb 100 300] [--num_proc 1 2] [--work_dir /tmp/pipeline_scale]
"""The data pipeline against corpus size: `bert-suite tokenizer` beside `tokenizers`' WordPieceTrainer, and
`bert-suite pretrain-data`, in time and peak memory, at 100 MB, 300 MB and 1 GB.

Corpora, written once into --work_dir: synthetic Zipf text (tools/zipf_corpus.py); with --letters_sizes_mb, text with
little subword structure, where the merges touch most words; a real-text point, the shared corpora concatenated. Each
run is a process timed from start to exit (imports included), its memory sampled every 0.5 s: `peak_mib` the largest
sum of the process tree's proportional set sizes (PSS: pages shared by forked workers count once), `worker_peak_mib`
the largest process's, `anon_peak_mib` / `worker_anon_peak_mib` of anonymous memory only (file pages such as mapped
Arrow output count in PSS, but the kernel can drop them). Vocabulary: 30,522, uncased, min_frequency 2, both trainers
on the same file and cores (`--num_proc` P; RAYON_NUM_THREADS=P for `tokenizers`). Instances: length 128, dupe_factor
1, dynamic masking, our vocabulary. Rows go to benchmarks/results/pipeline_scale.json as they finish (a rerun skips
the rows it has; `--redo vocabulary` measures a stage's again), each naming its CPU, and the table to its .md."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import common  # noqa: E402
from zipf_corpus import write_letters_corpus, write_zipf_corpus  # noqa: E402

RESULTS = common.ROOT / "benchmarks" / "results"
HF_TRAINER = """
import sys
from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
from tokenizers.models import WordPiece
tok = Tokenizer(WordPiece(unk_token="[UNK]"))
tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                                            lowercase=True)
tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
trainer = trainers.WordPieceTrainer(vocab_size=int(sys.argv[2]), min_frequency=2, show_progress=False,
                                    special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
tok.train([sys.argv[1]], trainer)
tok.save(sys.argv[3])
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes_mb", type=float, nargs="*", default=[100, 300, 1000])
    p.add_argument("--letters_sizes_mb", type=float, nargs="*", default=[],
                   help="also low-structure corpora of these sizes (letters drawn independently)")
    p.add_argument("--redo", nargs="*", default=[], choices=["vocabulary", "instances"],
                   help="measure these stages' rows again for the corpora asked for (other rows are kept)")
    p.add_argument("--num_proc", type=int, nargs="+", default=[1, 2])
    p.add_argument("--hf_num_proc", type=int, nargs="+", help="threads for tokenizers' trainer (default: --num_proc)")
    p.add_argument("--instances_num_proc", type=int, nargs="+", help="pretrain-data's num_proc (default: --num_proc)")
    p.add_argument("--instances_max_mb", type=float, default=float("inf"),
                   help="build instances only on corpora up to this size")
    p.add_argument("--vocab_size", type=int, default=30522)
    p.add_argument("--data", type=Path, default=common.DEFAULT_DATA, help="shared data (the real-text point)")
    p.add_argument("--no_real", action="store_true", help="leave out the real-text point")
    p.add_argument("--work_dir", type=Path, default=Path(tempfile.gettempdir()) / "pipeline_scale",
                   help="where the corpora and outputs go (1.4 GB of text plus the outputs)")
    p.add_argument("--out", type=Path, default=RESULTS / "pipeline_scale.json")
    p.add_argument("--fresh", action="store_true", help="measure every row again")
    p.add_argument("--report_only", action="store_true", help="summary, table and plot from the record; no runs")
    return p.parse_args(argv)


def run_measured(command: list[str], env: dict | None = None, timeout: float = 7200) -> dict:
    """Run a command; its wall time and the peak PSS of its process tree (all and largest process)."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})})
    root = psutil.Process(proc.pid)
    peak = worker_peak = anon_peak = worker_anon_peak = 0.0
    while proc.poll() is None:
        try:
            sizes = [found for member in [root, *root.children(recursive=True)] if (found := _pss_mib(member.pid))]
        except psutil.NoSuchProcess:
            break
        peak, anon_peak = max(peak, sum(s[0] for s in sizes)), max(anon_peak, sum(s[1] for s in sizes))
        worker_peak = max([worker_peak, *(s[0] for s in sizes)])
        worker_anon_peak = max([worker_anon_peak, *(s[1] for s in sizes)])
        if time.perf_counter() - start > timeout:
            proc.kill()
            raise RuntimeError(f"{' '.join(command)}: over {timeout} s")
        time.sleep(0.5)
    output = proc.stdout.read()
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{output[-3000:]}")
    return {"seconds": round(time.perf_counter() - start, 2), "peak_mib": round(peak, 1),
            "worker_peak_mib": round(worker_peak, 1), "anon_peak_mib": round(anon_peak, 1),
            "worker_anon_peak_mib": round(worker_anon_peak, 1), "output_tail": output.strip().splitlines()[-3:]}


def _pss_mib(pid: int) -> tuple[float, float] | None:
    """A process's proportional set size, all and anonymous (MiB), from /proc/PID/smaps_rollup (one
    read; psutil's memory_full_info parses the whole smaps, which took half a core to sample torch's
    processes). Anonymous: the heap, what the process really holds; the rest is file pages (shared
    libraries, memory-mapped Arrow files) that the kernel can drop."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            values = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in f
                      if line.startswith(("Pss:", "Pss_Anon:"))}
    except OSError:
        return None
    return (values["Pss"], values.get("Pss_Anon", values["Pss"])) if "Pss" in values else None


def real_corpus(data: Path, work: Path) -> Path | None:
    files = [*sorted((data / "corpus" / "gutenberg").glob("*.txt")), *sorted((data / "corpus").glob("wikitext-2-raw/*")),
             data / "corpus" / "nltk" / "movie_reviews.txt", data / "corpus" / "nltk" / "brown.txt",
             *sorted((data / "corpus" / "nltk" / "state_union").glob("*"))]
    files = [f for f in files if f.is_file()]
    if not files:
        return None
    from bert_suite.pretraining.text_files import file_encoding

    out = work / "real.txt"
    if not out.exists():
        with open(out, "w", encoding="utf-8", newline="\n") as f:
            for name in files:  # some books are Windows-1252: all UTF-8 here; each file ends a document
                f.write(name.read_bytes().decode(file_encoding(name)).lstrip("\ufeff").rstrip("\n") + "\n\n")
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    record = json.loads(args.out.read_text()) if args.out.is_file() and not args.fresh else {"rows": []}
    asked = {f"zipf_{size:g}mb" for size in args.sizes_mb} | {f"letters_{size:g}mb" for size in args.letters_sizes_mb} \
        | ({"real"} if not args.no_real else set())
    record["rows"] = [r for r in record["rows"] if not (r["stage"] in args.redo and r["corpus"] in asked)]
    done = {(r["corpus"], r["stage"], r["tool"], r["num_proc"]) for r in record["rows"]}
    if args.report_only:
        return report(record, args.out)
    from bert_suite import __version__  # noqa: F401  (the package must import before hours of work)

    corpora = []
    if not args.no_real and (real := real_corpus(args.data, args.work_dir)):
        corpora.append(("real", real))
    for kind, sizes, write in (("zipf", args.sizes_mb, write_zipf_corpus), ("letters", args.letters_sizes_mb,
                                                                              write_letters_corpus)):
        for size in sizes:
            path = args.work_dir / f"{kind}_{size:g}mb.txt"
            if not path.exists():
                print(f"writing {path} ...", flush=True)
                partial = path.with_suffix(".partial")
                info = write(partial, int(size * 1e6), seed=0)  # one seed: each corpus starts as the smaller ones
                partial.rename(path)
                (args.work_dir / f"{kind}_{size:g}mb.json").write_text(json.dumps(info))
            corpora.append((f"{kind}_{size:g}mb", path))
    bert_suite, kind = [sys.executable, "-m", "bert_suite.cli"], common.cpu_kind()
    (hf_script := args.work_dir / "hf_trainer.py").write_text(HF_TRAINER)
    record["machine"] = {"cpu": kind["cpu"], "cores": os.cpu_count(), "cpu_flags": kind["flags"],
                         "native_bf16": kind["native_bf16"], "python": sys.version.split()[0]}

    def measure(corpus: str, path: Path, stage: str, tool: str, num_proc: int, command, env=None):
        if (corpus, stage, tool, num_proc) in done:
            return
        print(f"{corpus} {stage} {tool} num_proc={num_proc} ...", flush=True)
        result = run_measured(command, env)
        row = {"corpus": corpus, "bytes": path.stat().st_size, "stage": stage, "tool": tool, "num_proc": num_proc,
               "cpu": kind["cpu"], "cpu_flags": kind["flags"], **result}
        info = args.work_dir / f"{corpus}.json"
        if info.exists():
            row["distinct_words"] = json.loads(info.read_text())["distinct_words"]
        report = args.work_dir / "out" / f"{corpus}_vocab_{num_proc}" / "tokenizer_report.json"
        if tool == "bert_suite" and stage == "vocabulary" and report.exists():
            row["word_types"] = json.loads(report.read_text())["word_types"]
        print(f"  {row['seconds']:.1f} s, peak {row['peak_mib']:.0f} MiB (largest process {row['worker_peak_mib']:.0f})",
              flush=True)
        record["rows"].append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")

    out = args.work_dir / "out"
    for corpus, path in corpora:
        for p in args.num_proc:
            measure(corpus, path, "vocabulary", "bert_suite", p,
                    [*bert_suite, "tokenizer", "--input", str(path), "--vocab_size", str(args.vocab_size),
                     "--lowercase", "--num_proc", str(p), "--output_dir", str(out / f"{corpus}_vocab_{p}")])
        vocab = out / f"{corpus}_vocab_{args.num_proc[0]}"
        for p in args.hf_num_proc or args.num_proc:
            measure(corpus, path, "vocabulary", "tokenizers", p,
                    [sys.executable, str(hf_script), str(path), str(args.vocab_size), str(out / f"{corpus}_hf.json")],
                    env={"RAYON_NUM_THREADS": str(p), "TOKENIZERS_PARALLELISM": "true"})
        if path.stat().st_size / 1e6 <= args.instances_max_mb:
            for p in args.instances_num_proc or args.num_proc:
                measure(corpus, path, "instances", "bert_suite", p,
                        [*bert_suite, "pretrain-data", "--input", str(path), "--tokenizer", str(vocab),
                         "--num_proc", str(p), "--format", "lines", "--output_dir", str(out / f"{corpus}_instances_{p}")])
    report(record, args.out)


def report(record: dict, out: Path) -> None:
    """The summary into the record, and the table (pipeline_scale.md)."""
    record["summary"] = summarise(record["rows"])
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(text := markdown(record))
    out.with_suffix(".md").write_text(text)


def markdown(record: dict) -> str:
    machine = record.get("machine", {})
    lines = [f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, flags {' '.join(machine.get('cpu_flags', []))}; "
             "time from start to exit (imports included), peak PSS of the process tree (largest process).", "",
             "| corpus | MB | distinct words | stage | tool | proc | seconds | peak MiB (largest) | anonymous (largest) | CPU |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---|"]
    for r in sorted(record["rows"], key=lambda r: (r["bytes"], r["stage"] != "vocabulary", r["tool"], r["num_proc"])):
        words = r.get("word_types") or r.get("distinct_words")
        anon = (f"{r['anon_peak_mib']:,.0f} ({r['worker_anon_peak_mib']:,.0f})" if "anon_peak_mib" in r else "")
        lines.append(f"| {r['corpus']} | {r['bytes'] / 1e6:,.0f} | {f'{words:,}' if words else ''} | {r['stage']} | "
                     f"{r['tool']} | {r['num_proc']} | {r['seconds']:.1f} | {r['peak_mib']:,.0f} "
                     f"({r['worker_peak_mib']:,.0f}) | {anon} | {r.get('cpu')} ({' '.join(r.get('cpu_flags') or [])}) |")
    lines += ["", "Summary: " + json.dumps(record.get("summary", {}))]
    return "\n".join(lines) + "\n"


def summarise(rows: list[dict]) -> dict:
    """The goals: vocabulary time and memory against tokenizers' at the largest corpus, the same
    cores; instances' time per byte (largest against smallest synthetic corpus), memory per worker
    flatness, and parallel efficiency 1 -> 2 processes."""
    index = {(r["corpus"], r["stage"], r["tool"], r["num_proc"]): r for r in rows}

    def by_size(family):
        return sorted({r["corpus"] for r in rows if r["corpus"].startswith(family)},
                      key=lambda c: next(r["bytes"] for r in rows if r["corpus"] == c))

    synthetic = by_size("zipf")
    summary: dict = {}
    for corpus in [*by_size("zipf"), *by_size("letters")]:  # the vocabulary against tokenizers', at every size
        for p in sorted({r["num_proc"] for r in rows}):
            ours, theirs = (index.get((corpus, "vocabulary", tool, p)) for tool in ("bert_suite", "tokenizers"))
            if ours and theirs and ours.get("cpu") == theirs.get("cpu"):
                summary[f"vocabulary_{corpus}_np{p}"] = {
                    "time_ratio_ours_over_tokenizers": round(ours["seconds"] / theirs["seconds"], 3),
                    "memory_ratio_ours_over_tokenizers": round(ours["peak_mib"] / theirs["peak_mib"], 3)}
    if not synthetic:
        return summary
    small, large = synthetic[0], synthetic[-1]
    for p in sorted({r["num_proc"] for r in rows}):
        a, b = index.get((small, "instances", "bert_suite", p)), index.get((large, "instances", "bert_suite", p))
        if a and b and a is not b:
            summary[f"instances_np{p}"] = {
                "time_per_byte_ratio_large_over_small": round((b["seconds"] / b["bytes"]) / (a["seconds"] / a["bytes"]), 3),
                "worker_memory_ratio_large_over_small": round(b["worker_peak_mib"] / a["worker_peak_mib"], 3)}
            if "worker_anon_peak_mib" in a and "worker_anon_peak_mib" in b:
                summary[f"instances_np{p}"]["worker_anon_memory_ratio_large_over_small"] = round(
                    b["worker_anon_peak_mib"] / a["worker_anon_peak_mib"], 3)
    for corpus in synthetic:
        for stage in ("instances", "vocabulary"):
            one, two = index.get((corpus, stage, "bert_suite", 1)), index.get((corpus, stage, "bert_suite", 2))
            if one and two:
                summary[f"{stage}_parallel_efficiency_{corpus}"] = round(one["seconds"] / (2 * two["seconds"]), 3)
    return summary


if __name__ == "__main__":
    main()
