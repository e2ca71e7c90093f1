"""Shared pieces of the benchmarks: the machine record, the measured matmul peak, alternating timed repetitions
(ours, stock, ours, ...: a slow stretch of a shared machine hits both), model FLOPs, runs in child processes, peak
memory, profiles and result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
RESULTS_DIR = ROOT / "runs" / "bench"  # generated, git-ignored; RESULTS.md quotes them


# The CPU flags that decide how fast each precision runs: AVX-512 for fp32, native bf16 dot products
# (avx512_bf16) and AMX tiles for bf16; without the last two, bf16 is emulated (slower than fp32).
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_kind() -> dict:
    """The kind of CPU a speed figure belongs to: its model, which of SPEED_FLAGS it reports, and
    `native_bf16` (the flag `--precision auto` chooses bf16 by, or None: emulated)."""
    from bert_suite.precision import cpu_flags, cpu_model, native_bf16_flag

    flags, native = cpu_flags(), native_bf16_flag()
    return {"cpu": cpu_model(), "flags": [f for f in SPEED_FLAGS if f in flags], "native_bf16": native,
            "kind": f"native bf16 ({native})" if native else "no native bf16 (bf16 emulated)"}


def machine() -> dict:
    """CPU model, flags and kind (cpu_kind), cores, threads and library versions (and the GPU when one is used)."""
    import torch
    import transformers

    return {**cpu_kind(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "command": " ".join([Path(sys.executable).name, *sys.argv]),
            **({"gpu": torch.cuda.get_device_name()} if torch.cuda.is_available() else {})}


def sync(device) -> None:
    if str(device).startswith("cuda"):
        __import__("torch").cuda.synchronize()


def matmul_flops_per_second(dtype=None, size: int = 2048, repeats: int = 5) -> float:
    """The CPU's own dense matmul throughput: the median FLOP/s of size x size x size products (2 n^3 FLOPs
    each) in `dtype` (fp32 by default) with the current thread count."""
    import torch

    a, b = (torch.randn(size, size, dtype=dtype or torch.float32) for _ in range(2))
    return 2 * size**3 / statistics.median(alternate({"mm": lambda: a @ b}, repeats + 2)["mm"][2:])  # 2 warm up


def alternate(runs: dict, repeats: int, device="cpu") -> dict[str, list[float]]:
    """Call each `runs[name]()` once per repetition, alternating names, and return the seconds of
    each call. Warm-up is the caller's job (one untimed call each before)."""
    seconds = {name: [] for name in runs}
    for rep in range(repeats):
        for name in list(runs) if rep % 2 == 0 else list(reversed(runs)):
            sync(device)
            start = time.perf_counter()
            runs[name]()
            sync(device)
            seconds[name].append(time.perf_counter() - start)
    return seconds


median = statistics.median


def encoder_flops(config, lengths, masked: int, nsp: bool = True) -> float:
    """Model FLOPs of one forward pass of a BERT pre-training model, matmuls only (2 FLOPs per multiply-add); a
    training step (forward + backward) is 3x this.

    per real token, per layer:    2 * (4 H^2 + 2 H I)        Q, K, V, output; feed-forward in, out
    per sequence of length L:     2 * 2 * L^2 * H per layer  scores Q K^T and the weighted sum P V
    per masked position:          2 * (H^2 + H V)            MLM transform and vocabulary decoder
    per sequence (with NSP):      2 * (H^2 + 2 H)            pooler and NSP classifier

    `lengths` are the real lengths of the sequences (padding is work, not model FLOPs), `masked` the number of
    predicted positions: the MLM loss needs the decoder there only, so ours and stock are held to the same count
    and the FLOPs ratio equals the speed ratio."""
    h, i, v, layers = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_hidden_layers
    tokens = sum(lengths)
    dense = 2 * (4 * h * h + 2 * h * i) * tokens * layers
    attention = 4 * h * sum(n * n for n in lengths) * layers
    head = 2 * (h * h + h * v) * masked
    pooled = 2 * (h * h + 2 * h) * len(lengths) if nsp else 0
    return float(dense + attention + head + pooled)


def child_env(device: str = "") -> dict:
    """A child process's environment: tokenizers' threads off; told the CPU, no GPU even beside one."""
    return {**os.environ, "TOKENIZERS_PARALLELISM": "false", **({"CUDA_VISIBLE_DEVICES": ""} if device == "cpu" else {})}


def run_child(args: list[str], timeout: float = 1800, env: dict | None = None) -> dict:
    """Run a benchmark's own script in a child process (`args` select one run and mode) and return the JSON it
    prints last: peak resident memory is per process (and so is glibc's allocator), so each run gets its own."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def max_rss_mib() -> float:
    """This process's peak resident set size so far (MiB): VmHWM on Linux, which starts afresh
    at exec (ru_maxrss would carry the parent's peak into a child)."""
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.is_file() else []:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def write_result(name: str, payload: dict) -> Path:
    """runs/bench/<name>.json, or the file `name` names when it ends in .json, written atomically
    (temporary file, then rename)."""
    from bert_suite.io import atomic_write_text

    target = Path(name) if str(name).endswith(".json") else RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(target, json.dumps(payload, indent=2, default=str) + "\n")


def table(rows: list, columns: list) -> str:
    """A markdown table of dicts under (key, heading) columns, or of lists under headings; floats get 3 significant
    digits (whole numbers from 1,000), None an empty cell."""
    from bert_suite.report import md_table

    def cell(value):
        return ("" if value is None else str(value)) if not isinstance(value, float) else \
            f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if columns and isinstance(columns[0], tuple):
        rows, columns = [[r.get(k) for k, _ in columns] for r in rows], [h for _, h in columns]
    return "\n".join(md_table(columns, [[cell(c) for c in row] for row in rows]))


def skip(message: str) -> None:
    """A clear skip (exit 0) when the real data is not on this machine."""
    print(f"skipped: {message}")
    raise SystemExit(0)


def need(paths=(), cuda: bool = False, hint: str = "") -> None:
    """Skip without a CUDA device when `cuda`, or naming the first of `paths` that is not a file (and `hint`)."""
    if cuda and not __import__("torch").cuda.is_available():
        skip("no CUDA device here (--device cpu measures the CPU)")
    for path in paths:
        if not Path(path).is_file():
            skip(f"{path} not found{hint}")


# Profile categories: where a step's time goes, by CPU operator or GPU kernel name (lower-cased; first match wins).
CATEGORIES = [
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm", "gemm",
                "nvjet", "cutlass", "xmma", "cublas", "sm90_")),
    ("attention kernel", ("scaled_dot_product", "flash", "efficient_attention", "fmha", "attention", "cudnn")),
    ("compiled (triton)", ("triton",)),
    ("dropout / RNG", ("bernoulli", "dropout", "aten::rand", "uniform_", "philox")),
    ("softmax / loss", ("softmax", "cross_entropy", "nll", "logsumexp")),
    ("layer norm", ("layer_norm", "layernorm")),
    ("gelu / tanh", ("gelu", "tanh")),
    ("optimizer", ("adam", "_foreach", "_fused", "multi_tensor", "foreach")),
    ("embedding / gather", ("embedding", "index", "gather", "nonzero", "masked_select", "scatter", "radix", "sort")),
    ("copies / layout", ("copy", "contiguous", "clone", "cat", "fill", "zero", "cast")),
    ("reductions", ("reduce",)),
    ("elementwise", ("add", "mul", "div", "sub", "sum", "mean", "where", "sqrt", "pow", "clamp")),
]


def profile(fn, device="cpu", steps: int = 1, top: int = 12) -> dict:
    """Where one call of `fn` (`steps` steps) spends its time, from torch.profiler: on the CPU the operators'
    self time, on a GPU the kernels' (those a CUDA graph launches included). Seconds per category of
    CATEGORIES (`other` for the rest), milliseconds and calls per step, and the `top` names with their share."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as trace

    cuda = str(device).startswith("cuda")
    with trace(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        sync(device)
    events = [(e, spent) for e in prof.key_averages() if e.device_type == (DeviceType.CUDA if cuda else DeviceType.CPU)
              and (spent := (e.self_device_time_total if cuda else e.self_cpu_time_total) / 1e6) > 0]
    total = sum(spent for _, spent in events) or 1.0
    by_kind: dict[str, float] = {}
    for e, spent in events:
        name = e.key.lower()
        kind = next((c for c, keys in CATEGORIES if any(k in name for k in keys)), "other")
        by_kind[kind] = by_kind.get(kind, 0.0) + spent
    ranked = sorted(events, key=lambda pair: -pair[1])[:top]
    return {"ms_per_step": 1e3 * total / steps, "calls_per_step": sum(e.count for e, _ in events) / steps,
            "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top": [f"{100 * spent / total:5.1f}% x{e.count // steps:<4d} {e.key[:100]}" for e, spent in ranked]}


def breakdown_table(profiles: dict[str, dict]) -> str:
    """Markdown: one row per category, one column per profiled run (`profile`'s results; seconds and share)."""
    profiles = {name: found["by_kind"] for name, found in profiles.items()}
    totals = {n: sum(p.values()) or 1.0 for n, p in profiles.items()}
    lines = ["| where the time goes | " + " | ".join(profiles) + " |", "|---|" + "---:|" * len(profiles)]
    largest = {c: max(p.get(c, 0) for p in profiles.values()) for found in profiles.values() for c in found}
    for c in sorted(largest, key=lambda c: -largest[c]):
        lines.append(f"| {c} | " + " | ".join(f"{p.get(c, 0) * 1e3:,.0f} ms ({100 * p.get(c, 0) / totals[n]:.0f}%)"
                                             for n, p in profiles.items()) + " |")
    totals = " | ".join(f"{t * 1e3:,.0f} ms" for t in totals.values())
    return "\n".join([*lines, f"| total (profiled) | {totals} |"])


def create_database(server: str, name: str) -> str:
    """CREATE DATABASE `name` on the PostgreSQL server of `server` (a storage URL without its database);
    returns the new database's storage URL (same driver). The PostgreSQL tests' (tests/helpers.py)."""
    import psycopg

    with psycopg.connect(server.replace("postgresql+psycopg://", "postgresql://") + "/postgres",
                         autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"{server}/{name}"
