"""The checks that need a GPU: every head against stock transformers BERT on the device, the pre-training recipe
killed and resumed there, and an ablation's pre-training stopped and resumed there. Skipped without CUDA (`make
test-gpu` runs them; `make gpu-check` runs the first two as its correctness and recipe steps).

Environment: BERT_SUITE_TEST_DEVICE (default cuda; cpu runs the checks on the CPU: gpu_check.sh --device cpu
--quick, the plumbing), BERT_SUITE_TEST_QUICK=1 (two heads without compile or export; the recipe a few steps
without a kill), BERT_SUITE_TEST_DATA (a folder holding corpus.txt and vocab/bert-base-uncased/vocab.txt, as
.gpu-bundle/data does; default: .gpu-bundle/data where it exists, else a small corpus the test writes) and
BERT_SUITE_GPU_RECORD (a folder: the figures of the checks as correctness.json and recipe.json, the parts that
benchmarks/gpu_check_summary.py summarises)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from helpers import REPO, write_ablation_data, write_pretrain_setup

DEVICE = os.environ.get("BERT_SUITE_TEST_DEVICE", "cuda")
CUDA = DEVICE.startswith("cuda")
QUICK = os.environ.get("BERT_SUITE_TEST_QUICK") == "1"
on_the_device = pytest.mark.skipif(CUDA and not torch.cuda.is_available(),
                                   reason="no CUDA device (BERT_SUITE_TEST_DEVICE=cpu runs these checks on the CPU)")
RECORDED: dict[str, dict] = {}


def record(name: str, **figures) -> None:
    """Add `figures` to the check's record, written to BERT_SUITE_GPU_RECORD/NAME.json when that is set."""
    RECORDED.setdefault(name, {"device": torch.cuda.get_device_name() if CUDA else DEVICE}).update(figures)
    folder = os.environ.get("BERT_SUITE_GPU_RECORD")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{name}.json").write_text(json.dumps(RECORDED[name], indent=2, default=str) + "\n")


def child_env(**extra) -> dict:
    """A subprocess's environment on the device under test; the recipe's own precision (not the suite's fp32)."""
    env = {k: v for k, v in os.environ.items() if k not in ("BERT_SUITE_PRECISION", "BERT_SUITE_FAILPOINT")}
    hidden = {} if CUDA else {"CUDA_VISIBLE_DEVICES": ""}  # told the CPU: the CPU even beside a GPU
    return {**env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **hidden, **extra}


# ------------------------------------------------------------------ every head against stock, on the device

# ours -> (stock class, config extra, fields compared)
HEADS = {
    "BertSuiteModel": ("BertModel", {}, ["last_hidden_state", "pooler_output"]),
    "BertSuiteForPreTraining": ("BertForPreTraining", {}, ["prediction_logits", "seq_relationship_logits"]),
    "BertSuiteForMaskedLM": ("BertForMaskedLM", {}, ["logits"]),
    "BertSuiteForNextSentencePrediction": ("BertForNextSentencePrediction", {}, ["logits"]),
    "BertSuiteForSequenceClassification": ("BertForSequenceClassification", {"num_labels": 3}, ["logits"]),
    "BertSuiteForQuestionAnswering": ("BertForQuestionAnswering", {}, ["start_logits", "end_logits"]),
    "BertSuiteForMultipleChoice": ("BertForMultipleChoice", {}, ["logits"]),
    "BertSuiteForTokenClassification": ("BertForTokenClassification", {"num_labels": 5}, ["logits"]),
}
LIMIT = 1e-5  # fp32 parity with stock, and compiled / exported against eager; bf16 is reported only
LIMITED = ("fp32 padded", "fp32 full", "compile", "export")
SIZE = dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def head_batch(padded: bool, choices: int | None = None) -> dict:
    """8 x 128 on the device: lengths in [24, 128] (padded) or all 128 (full); pairs of choices for multiple choice."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(24, 129, (8,), generator=g) if padded else torch.full((8,), 128)
    mask = (torch.arange(128)[None] < lengths[:, None]).long()
    ids = torch.randint(999, 30522, (8, 128), generator=g) * mask
    types = ((torch.arange(128)[None] >= lengths[:, None] // 2) & mask.bool()).long()
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if choices:
        out = {k: v.view(4, choices, 128) for k, v in out.items()}
    return {k: v.to(DEVICE) for k, v in out.items()}


def max_diff(a, b, fields, mask) -> float:
    """The largest |a - b| over the fields, at real tokens only for per-token outputs (the CPU's unpadded path
    leaves zeros at padding)."""
    worst = 0.0
    for f in fields:
        x, y = getattr(a, f).float(), getattr(b, f).float()
        if x.shape[: mask.dim()] == mask.shape:
            x, y = x[mask.bool()], y[mask.bool()]
        worst = max(worst, (x - y).abs().max().item())
    return worst


def bf16_is_fast(device: str) -> bool:
    """bf16 on a GPU, or on a CPU that does it natively; elsewhere it is emulated at a small fraction of fp32's
    speed (benchmarks/RESULTS.md, "bf16 on every CPU"), and the bf16 figures are left out."""
    from bert_suite.precision import native_bf16_flag

    return device != "cpu" or native_bf16_flag() is not None


def sdpa_kernels(model, inputs) -> str:
    """The attention kernels of a forward pass, under bf16 autocast where bf16 is fast (flash attention takes
    half precision only)."""
    from torch.profiler import ProfilerActivity, profile

    device = next(model.parameters()).device.type
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16_is_fast(device)), \
            profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        model(**inputs)
    hits = sorted({e.key for e in prof.key_averages()
                   if any(w in e.key.lower() for w in ("flash", "efficient_attention", "fmha", "cudnn", "scaled_dot"))})
    return "; ".join(hits[:3]) or "none"


def test_bf16_figures_are_left_out_where_bf16_is_emulated(monkeypatch):
    import bert_suite.precision

    monkeypatch.setattr(bert_suite.precision, "native_bf16_flag", lambda: None)
    assert not bf16_is_fast("cpu") and bf16_is_fast("cuda")
    monkeypatch.setattr(bert_suite.precision, "native_bf16_flag", lambda: "avx512_bf16")
    assert bf16_is_fast("cpu")


@pytest.fixture
def fp32_matmuls():
    """fp32 parity means fp32 matmuls: no TF32 during the test."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@on_the_device
@pytest.mark.parametrize("name", list(HEADS)[:2] if QUICK else list(HEADS))
def test_correctness_of_every_head_against_stock_on_the_device(name, tmp_path, fp32_matmuls):
    """Same weights (stock saved, ours loaded from it), dropout off: fp32 within 1e-5 of stock padded and full;
    bf16 autocast (each side under it) reported; torch.compile(fullgraph) and torch.export with a mask within
    1e-5 of eager (not with BERT_SUITE_TEST_QUICK); the SDPA kernels that ran for padded, full and unmasked
    batches. On a GPU the model takes the padded path by default (deciding to unpad reads the mask: a sync)."""
    import transformers

    import bert_suite

    stock_name, extra, fields = HEADS[name]
    torch.manual_seed(0)
    stock = getattr(transformers, stock_name)(transformers.BertConfig(**SIZE, **extra, attn_implementation="sdpa"))
    stock.save_pretrained(tmp_path)
    ours = getattr(bert_suite, name).from_pretrained(tmp_path).to(DEVICE).eval()
    stock = stock.to(DEVICE).eval()
    choices = 2 if "MultipleChoice" in name else None
    row = {"head": name.removeprefix("BertSuite")}
    for padded in (True, False):
        inputs, tag = head_batch(padded, choices), "padded" if padded else "full"
        with torch.no_grad():
            row[f"fp32 {tag}"] = max_diff(ours(**inputs), stock(**inputs), fields, inputs["attention_mask"])
            if bf16_is_fast(DEVICE):
                with torch.autocast(DEVICE.split(":")[0], dtype=torch.bfloat16):
                    row[f"bf16 {tag}"] = max_diff(ours(**inputs), stock(**inputs), fields, inputs["attention_mask"])
        row[f"kernels {tag}"] = sdpa_kernels(ours, inputs)
    # what the pre-training pipeline sends a batch without padding: no mask at all (flash / cuDNN may run)
    row["kernels no mask"] = sdpa_kernels(ours, {k: v for k, v in head_batch(False, choices).items()
                                                  if k != "attention_mask"})
    if not QUICK:
        inputs = head_batch(True, choices)
        with torch.no_grad():
            eager = ours(**inputs, **({"unpad": False} if name == "BertSuiteModel" else {}))
            torch._dynamo.reset()
            row["compile"] = max_diff(torch.compile(ours, fullgraph=True)(**inputs), eager, fields,
                                      inputs["attention_mask"])
            program = torch.export.export(ours, (), inputs)
            row["export"] = max_diff(program.module()(**inputs), eager, fields, inputs["attention_mask"])
    record("correctness", rows=[*RECORDED.get("correctness", {}).get("rows", []), row])
    over = {k: row[k] for k in LIMITED if k in row and row[k] > LIMIT}
    assert not over, f"{name}: over {LIMIT:g}: {over}"


# ------------------------------------------------------------------ the recipe, killed and resumed, on the device


def recipe_data(tmp_path: Path) -> tuple[Path, Path]:
    """(corpus, vocabulary): BERT_SUITE_TEST_DATA's or .gpu-bundle/data's (the Brown Corpus sample and the released
    vocabulary), else a small corpus with its own vocabulary."""
    folder = Path(os.environ.get("BERT_SUITE_TEST_DATA") or REPO / ".gpu-bundle" / "data")
    corpus, vocab = folder / "corpus.txt", folder / "vocab" / "bert-base-uncased" / "vocab.txt"
    if corpus.is_file() and vocab.is_file():
        return corpus, vocab
    assert "BERT_SUITE_TEST_DATA" not in os.environ, f"{corpus} or {vocab} not found (make gpu-bundle writes them)"
    tmp_path.mkdir(parents=True, exist_ok=True)
    setup = write_pretrain_setup(tmp_path)
    return setup / "corpus.txt", setup / "vocab.txt"


def run_recipe(out: Path, data: Path, vocab: Path, steps: int, save_steps: int, fail_at: int | None = None):
    """recipes/pretrain.py with the mini preset's config and its defaults (on CUDA: static step, compiled, CUDA
    graph) in a child process: (exit code, its metrics.jsonl, its output)."""
    overrides = [f"train_data={data}", "train_data_phase2=null", "phase1_fraction=1", f"tokenizer={vocab}",
                 f"output_dir={out}", f"max_steps={steps}", f"warmup_steps={min(10, steps)}", "report_to=none",
                 f"logging_steps={max(1, steps // 6)}", f"eval_steps={steps}", "eval_batches=2",
                 f"save_steps={save_steps}"]
    if QUICK:
        overrides += ["model_size=tiny", "per_device_train_batch_size=8", "mixed_precision=no"]
    env = child_env(**({"BERT_SUITE_FAILPOINT": f"pretrain.step:{fail_at}"} if fail_at else {}))
    proc = subprocess.run([sys.executable, str(REPO / "recipes" / "pretrain.py"), "--config",
                           str(REPO / "recipes" / "configs" / "pretrain" / "mini.yaml"), *overrides],
                          capture_output=True, text=True, env=env)
    metrics = out / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return proc.returncode, lines, proc.stdout + proc.stderr


@on_the_device
def test_recipe_runs_and_resumes_after_a_kill_on_the_device(tmp_path):
    """`pretrain-data` on the corpus, then the recipe for 120 steps uninterrupted; again, killed by SIGKILL after
    step 80 (a failpoint) and resumed from its step-80 checkpoint with the same command: the resumed losses within
    1e-3 of the uninterrupted run's (dropout on; the GPU's kernels are not bit-exact). Records the recipe's own
    tokens/s (its last logging interval, past compilation) and the step form it chose. BERT_SUITE_TEST_QUICK: the
    tiny model for 4 steps, no kill."""
    from bert_suite.pretraining.instances import build_pretraining_dataset

    steps, kill_at = (4, 0) if QUICK else (120, 80)
    save_steps = max(1, kill_at // 2)
    corpus, vocab = recipe_data(tmp_path / "setup")
    started = time.time()
    stats = build_pretraining_dataset([str(corpus)], str(vocab), str(tmp_path / "data"), max_seq_length=128,
                                      dupe_factor=1 if QUICK else 2, num_proc=1 if QUICK else None)
    record("recipe", steps=steps, data={"corpus": str(corpus), "instances": stats.get("instances"),
                                        "seconds": time.time() - started})
    started = time.time()
    code, whole, output = run_recipe(tmp_path / "whole", tmp_path / "data", vocab, steps, save_steps)
    form = [line.split("step:", 1)[1].strip() for line in output.splitlines()
            if line.startswith("world size") and "step:" in line]
    record("recipe", uninterrupted={"exit": code, "seconds": time.time() - started, "last": (whole or [None])[-1]},
           step_form=(form or [None])[0], tokens_per_second=whole[-1]["tokens_per_second"] if whole else None)
    assert code == 0 and whole, output[-3000:]
    assert whole[-1]["step"] == steps and whole[-1]["tokens_per_second"] > 0
    if not kill_at:
        return
    killed, _, _ = run_recipe(tmp_path / "killed", tmp_path / "data", vocab, steps, save_steps, fail_at=kill_at + 1)
    code, resumed, output = run_recipe(tmp_path / "killed", tmp_path / "data", vocab, steps, save_steps)
    resumed_from = kill_at // save_steps * save_steps  # the last checkpoint before the kill
    same = {line["step"]: line for line in whole}
    pairs = [(same[line["step"]], line) for line in resumed if line["step"] in same and line["step"] > resumed_from]
    resume = {"killed_exit": killed, "exit": code, "resumed_from": resumed_from,
              "steps_compared": [a["step"] for a, _ in pairs]}
    for loss in ("mlm_loss", "nsp_loss"):
        resume[f"max_{loss}_diff"] = max((abs(a[loss] - b[loss]) for a, b in pairs), default=None)
    record("recipe", resume=resume)
    assert killed == -signal.SIGKILL and code == 0, output[-3000:]
    assert resume["steps_compared"] and max(resume["max_mlm_loss_diff"], resume["max_nsp_loss_diff"]) < 1e-3, resume


# ------------------------------------------------------------------ an ablation's pre-training, stopped and resumed


def descendants(pid: int) -> list[int]:
    """The processes below `pid` now, from each process's parent in /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        children = [child for child, parent in parents.items() if parent == pid]
        found += children
        todo += children
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gpu_processes() -> set[int]:
    """The processes that hold a CUDA context now (nvidia-smi's compute apps; none known without it)."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {int(pid) for pid in listed.split() if pid.isdigit()}


@on_the_device
def test_ablation_pretraining_stopped_by_sigterm_leaves_no_process_and_resumes_on_the_device(tmp_path):
    """`bert-suite ablation STUDY --until pretraining --variant pre` launches the recipe with the accelerate config
    of the device (gpu.yaml on CUDA) and the recipe runs there; SIGTERM to the study while the recipe runs (it
    hangs at step 5, after step 4's checkpoint) stops every process it started (none left, none holding the GPU),
    exits 143 and marks the launch stopped in timing.json; the same command again resumes from the checkpoint and
    finishes. (tests/test_ablation.py checks the same on the CPU, with the fine-tuning.)"""
    data, steps = write_ablation_data(tmp_path / "data"), 8
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({
        "corpus": {"files": [str(data / "corpus" / "nltk" / "brown.txt")], "task_texts": [], "decontaminate": False},
        "vocabulary": {"vocab_size": 60, "lowercase": True}, "instances": {"max_seq_length": 32, "dupe_factor": 2},
        "pretraining": {"steps": steps, "model_size": "tiny", "per_device_train_batch_size": 8,
                        "max_predictions_per_seq": 6, "eval_batches": 1},
        "variants": {"pre": {}, "random": {"from": "pre", "random_init": True}},
        "compare": {"baseline": "pre", "seeds": [1, 2], "tasks": ["rte"], "data_dir": [str(data / "glue")]}}))
    out = tmp_path / "out"
    command = [sys.executable, "-c", "import sys; from bert_suite_cli import main; sys.exit(main())", "ablation",
               str(study), "--output_dir", str(out), "--until", "pretraining", "--variant", "pre"]
    log, run = out / "logs" / "pretraining-pre.log", out / "pretraining" / "pre"
    output = tmp_path / "study.log"  # a file, not a pipe: nothing blocks on a full pipe while the test waits
    with open(output, "w") as handle:
        study_process = subprocess.Popen(command, env=child_env(BERT_SUITE_FAILPOINT="pretrain.step:5:hang"),
                                         stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while not (log.is_file() and "hanging until killed" in log.read_text(errors="replace")):
            assert study_process.poll() is None, output.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the recipe did not reach step 5 in 600 s: {log}"
            time.sleep(0.5)
        tree = descendants(study_process.pid)
        on_gpu = gpu_processes() & set(tree) if CUDA else set()
        study_process.send_signal(signal.SIGTERM)
        study_process.wait(timeout=180)
    finally:  # a check that failed must not leave the recipe hanging at its failpoint: SIGTERM stops its group
        if study_process.poll() is None:
            study_process.terminate()
            study_process.wait(timeout=180)
    err = output.read_text(errors="replace")
    assert study_process.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err[-3000:]
    deadline = time.monotonic() + 30  # the data stages' pool helpers end on their own once their parent is gone
    while [pid for pid in tree if running(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in tree if running(pid)] and not gpu_processes() & set(tree)
    assert any(entry.get("stopped") for entry in json.loads((run / "timing.json").read_text()))
    text = log.read_text(errors="replace")
    assert f"accelerate/{'gpu' if CUDA else 'cpu'}.yaml" in text and f", {DEVICE.split(':')[0]}): global batch" in text
    again = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    results = json.loads((run / "pretrain_results.json").read_text())
    assert "resumed from" in log.read_text(errors="replace") and results["step"] == steps
    record("ablation", processes_on_gpu_before_the_stop=sorted(on_gpu), step_form=results.get("step_form"))
