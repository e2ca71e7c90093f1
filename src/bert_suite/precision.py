"""Which arithmetic a run uses: bf16 autocast where the hardware does bf16 natively, fp32 elsewhere.

On a CPU with native bf16 instructions (x86 `avx512_bf16` or AMX, Arm `bf16`) a bf16 matmul runs
several times faster than an fp32 one, so `auto` (the default of every command) trains and
evaluates under `torch.autocast("cpu", torch.bfloat16)`. A CPU without them emulates bf16, several
times *slower* than fp32 (benchmarks/RESULTS.md, "bf16 on the CPU"), so `auto` keeps fp32 there.
Either way the weights stay fp32 (autocast computes in bf16 and keeps fp32 master weights), and
checkpoints are saved in fp32.

On a GPU `auto` leaves the choice where it was: the accelerate launch config (`mixed_precision`)
for the recipe, TrainingArguments' `--bf16` for fine-tuning.

The choice, in order: an explicit request (`--precision bf16|fp32`, the recipe's
`mixed_precision=bf16|no`, TrainingArguments' `--bf16` / `--no_bf16`), then the environment variable
`BERT_SUITE_PRECISION` (the same values, for every command of a session or a test run), then the
hardware. `describe()` gives the one log line every command prints.
"""

from __future__ import annotations

import os
import platform
import warnings
from dataclasses import dataclass
from pathlib import Path

CHOICES = ("auto", "bf16", "fp32")
ENV = "BERT_SUITE_PRECISION"
# CPU flags (Linux /proc/cpuinfo) that mean bf16 arithmetic in hardware: AVX-512 BF16 dot products,
# AMX tiles (Sapphire Rapids and later), and Armv8.6 BF16 (Graviton 3, Neoverse V1/N2).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


class PrecisionError(ValueError):
    """A precision that cannot be used on this device (fp16 autocast on a CPU, an unknown name)."""


@dataclass(frozen=True)
class Precision:
    """The resolved choice: `bf16` (autocast, fp32 master weights) or `fp32`, and why."""

    name: str  # "bf16" or "fp32" (or "fp16": the recipe on a GPU whose accelerate config asks for it)
    reason: str  # "CPU has avx512_bf16", "--precision fp32", ...

    @property
    def bf16(self) -> bool:
        return self.name == "bf16"

    @property
    def label(self) -> str:
        return "fp32" if self.name == "fp32" else f"{self.name} autocast"

    def describe(self) -> str:
        """The log line: `precision: bf16 autocast (CPU has avx512_bf16)` / `precision: fp32 (...)`."""
        return f"precision: {self.label} ({self.reason})"

    def record(self) -> dict:
        """What run manifests, results files and model cards keep."""
        return {"precision": self.label, "precision_reason": self.reason}


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (x86 `flags`, Arm `Features`); empty elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def native_bf16_flag() -> str | None:
    """The flag that shows this CPU does bf16 in hardware, or None (emulated: slower than fp32)."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return _darwin_bf16()
    flags = cpu_flags()
    return next((f for f in NATIVE_BF16_FLAGS if f in flags), None)


def _darwin_bf16() -> str | None:
    import subprocess

    try:  # Apple M2 and later
        out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return "FEAT_BF16" if out.stdout.strip() == "1" else None


def check_choice(value: str | None, flag: str = "--precision") -> str:
    """`value` lower-cased if it is one of CHOICES; else a PrecisionError naming them."""
    value = (value or "auto").lower()
    if value not in CHOICES:
        raise PrecisionError(f"{flag} {value!r}: expected one of {', '.join(CHOICES)}")
    return value


def on_cpu(use_cpu: bool = False) -> bool:
    """Whether a run computes on the CPU: told so (`use_cpu`, or ACCELERATE_USE_CPU from an accelerate
    launch with use_cpu), or no accelerator is present (CUDA, Apple MPS, Intel XPU)."""
    import torch

    if use_cpu or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    mps, xpu = getattr(torch.backends, "mps", None), getattr(torch, "xpu", None)
    return not (torch.cuda.is_available() or (mps is not None and mps.is_available())
                or (xpu is not None and xpu.is_available()))


def explicit(name: str, reason: str, cpu: bool, expected: str = "bf16, fp32 or auto",
             instead_of_bf16: str = "--precision auto or fp32 (auto leaves a GPU in fp32 unless --bf16 or --fp16 "
                                    "is given)") -> Precision:
    """A precision the user asked for (`name` bf16, fp32 or fp16; `reason` says how). fp16 on a CPU is
    refused (`expected` names what to ask for instead); bf16 on a CPU that emulates it runs, correctly,
    after a warning that it is slow; bf16 on a GPU without it is refused (`instead_of_bf16` says what to ask for)."""
    if name == "fp16" and cpu:
        raise PrecisionError(f"{reason} on a CPU: fp16 autocast on a CPU is not supported (CPUs have no fast fp16 "
                             f"matmul, and fp16 needs loss scaling); expected {expected}")
    if name == "bf16" and cpu and native_bf16_flag() is None:
        warnings.warn(f"{reason}: this CPU ({cpu_model()}) has no native bf16 (no avx512_bf16, AMX or Arm bf16 "
                      "flag), so bf16 is emulated, several times slower than fp32 (a training step 2x to 15x slower on "
                      "the x86 CPUs measured); --precision auto picks fp32 here", stacklevel=3)
        reason += "; emulated: CPU has no native bf16"
    if name == "bf16" and not cpu:
        gpu_without_bf16(reason, instead_of_bf16)
    return Precision(name, reason)


def cpu_model() -> str:
    """The CPU's model name as Linux reports it, or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def gpu_without_bf16(reason: str, instead: str) -> None:
    """A PrecisionError when the CUDA GPU cannot compute in bf16 (compute capability below 8.0: V100,
    T4 and older), naming the GPU; elsewhere nothing (other accelerators check bf16 themselves)."""
    import torch

    if not torch.cuda.is_available() or torch.cuda.is_bf16_supported(including_emulation=False):
        return
    major, minor = torch.cuda.get_device_capability()
    raise PrecisionError(f"{reason}: the GPU {torch.cuda.get_device_name()} (compute capability {major}.{minor}) "
                         f"has no bf16 (it needs 8.0, Ampere or later); expected {instead}")


def resolve(requested: str | None = "auto", device: str = "cpu", source: str = "--precision") -> Precision:
    """The precision a run on `device` ("cpu", or an accelerator: "cuda", "mps", ...) uses for `requested`
    (auto, bf16, fp32); `source` names where an explicit request came from, for the log line. Off the
    CPU `auto` is fp32 here: callers there keep the launcher's or TrainingArguments' own choice."""
    requested = check_choice(requested, source)
    if requested == "auto" and os.environ.get(ENV):
        requested, source = check_choice(os.environ[ENV], ENV), f"{ENV}={os.environ[ENV]}"
    if requested != "auto":
        return explicit(requested, source if "=" in source else f"{source} {requested}", device == "cpu")
    if device != "cpu":
        return Precision("fp32", f"{device}: auto leaves the choice to --bf16 or the accelerate config")
    flag = native_bf16_flag()
    if flag is None:
        return Precision("fp32", "CPU has no native bf16")
    return Precision("bf16", f"CPU has {flag}")


ACCELERATE_NAMES = {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}  # accelerate's mixed_precision -> ours


def recipe_precision(value: str, cpu: bool) -> tuple[str, Precision]:
    """The pre-training recipe's `mixed_precision` (auto, no, bf16, fp16) -> (accelerate's value, the
    precision). Explicit values win; with auto: BERT_SUITE_PRECISION, then `accelerate launch`'s
    mixed_precision (its config or flag) when it asks for bf16 or fp16, then on the CPU the hardware,
    and on a GPU `no`, as before auto existed (the shipped GPU-sized configs say bf16 themselves)."""
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")  # set by `accelerate launch` only
    source = f"mixed_precision={value}"
    if value == "auto" and os.environ.get(ENV):
        choice = check_choice(os.environ[ENV], ENV)
        value, source = {"bf16": "bf16", "fp32": "no", "auto": "auto"}[choice], f"{ENV}={os.environ[ENV]}"
    if value == "auto" and launcher in ("bf16", "fp16"):
        value, source = launcher, f"accelerate config mixed_precision={launcher}"
    if value == "auto" and not cpu:
        return "no", Precision("fp32", f"GPU: accelerate's mixed_precision is {launcher or 'not set'}")
    if value == "auto":
        chosen = resolve("auto", "cpu")
        return ("bf16" if chosen.bf16 else "no"), chosen
    return value, explicit(ACCELERATE_NAMES[value], source, cpu, "mixed_precision=bf16, no or auto",
                           "mixed_precision=no (fp32) or fp16, in the recipe's config and accelerate's")

