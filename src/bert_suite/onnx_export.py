"""Export a checkpoint (a finetune or grid run folder, any head) to ONNX for deployment, and check the
exported graph in ONNX Runtime against the eager model before saying it is done.

    bert-suite export --to onnx RUN_DIR OUT_DIR [--opset N]

OUT_DIR gets model.onnx (inputs input_ids, attention_mask, token_type_ids, int64; batch and length
dynamic, and the number of choices for multiple choice), the tokenizer and config.json. The exporter is
torch.onnx's dynamo exporter; the dependencies are the `onnx` extra (pip install "bert_suite[onnx]")."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_OPSET = 18  # torch.onnx's own default
# Exported and run here: onnxruntime 1.32 fails on the Attention operator that opsets 23 and 24 emit for
# the masked attention, and the exporter writes invalid graphs from 26 on; 25 works but stands alone.
SUPPORTED_OPSETS = range(14, 23)
TOLERANCE = 1e-4
EXTRA = 'pip install "bert_suite[onnx]"'


class OnnxExportError(ValueError):
    """The checkpoint cannot be exported, or the graph does not match the eager model; the message says why."""


@dataclass
class Exported:
    path: Path
    outputs: list[str]
    max_difference: float
    checked_shape: tuple[int, ...]


def _requirements():
    try:
        import onnx  # noqa: F401
        import onnxruntime
        import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter writes the graph with it)
    except ImportError as err:
        raise OnnxExportError(f"export --to onnx needs onnx, onnxruntime and onnxscript ({err.name} is missing): "
                              f"{EXTRA}") from None
    return onnxruntime


def load_checkpoint(run_dir: Path):
    """The model of a checkpoint folder with the class its config.json names (any bert_suite head, or a
    stock BERT class), in eval mode and fp32."""
    import transformers

    import bert_suite

    if not (run_dir / "config.json").is_file():
        found = ", ".join(sorted(p.name for p in run_dir.iterdir())[:6]) if run_dir.is_dir() else "no such folder"
        raise OnnxExportError(f"{run_dir}: not a checkpoint (found: {found or 'nothing'}); expected a folder with "
                              "config.json and model.safetensors (a finetune output, or a grid's best/)")
    config = transformers.AutoConfig.from_pretrained(run_dir)
    arch = (config.architectures or ["BertSuiteModel"])[0]
    cls = getattr(bert_suite, arch, None) or getattr(transformers, arch, None)
    if cls is None:
        raise OnnxExportError(f"{run_dir}/config.json: unknown architecture {arch!r}; expected a bert_suite or "
                              "transformers BERT class")
    return cls.from_pretrained(run_dir, dtype="float32").eval()


def serving_config(config):
    """The config saved beside model.onnx: a stock BertConfig (model_type bert) for a bert_suite model, with
    its labels, so that a server reads it (and AutoTokenizer loads the folder) without bert_suite or its
    modeling code; the graph itself needs neither."""
    import transformers

    if config.model_type != "bert_suite":
        return config
    from .export import STOCK_CLASSES

    stock = transformers.BertConfig(**config.to_bert_dict())
    stock.architectures = [STOCK_CLASSES.get(a, a) for a in (config.architectures or [])]
    return stock


def sample_inputs(config, batch: int, length: int, choices: int | None, seed: int):
    """Token ids from the vocabulary past its first 100 entries (special and unused tokens), the last row
    padded to half its length, and the second half of each row in segment B."""
    import torch

    g = torch.Generator().manual_seed(seed)
    low = min(100, config.vocab_size - 1)
    shape = (batch, choices, length) if choices else (batch, length)
    ids = torch.randint(low, config.vocab_size, shape, generator=g)
    mask = torch.ones(shape, dtype=torch.long)
    mask[-1, ..., length // 2:] = 0
    ids = ids.masked_fill(mask == 0, config.pad_token_id or 0)
    types = torch.zeros(shape, dtype=torch.long)
    types[..., length // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}


def export_to_onnx(run_dir: str | Path, out_dir: str | Path, opset: int = DEFAULT_OPSET, log=print) -> Exported:
    """Export RUN_DIR's model to OUT_DIR/model.onnx with the tokenizer and config.json beside it, then run it in
    ONNX Runtime on a padded batch of another size than the export's and compare with eager: the largest
    difference (at real tokens, for per-token outputs) must be at most 1e-4."""
    if opset not in SUPPORTED_OPSETS:
        raise OnnxExportError(f"--opset {opset}: not supported; expected {SUPPORTED_OPSETS.start}.."
                              f"{SUPPORTED_OPSETS.stop - 1} (default {DEFAULT_OPSET}; 23 and up emit an Attention "
                              "operator that onnxruntime cannot run on this model)")
    ort = _requirements()
    import numpy as np
    import torch
    import transformers

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    model = load_checkpoint(run_dir)
    if getattr(model.config, "bilstm", False):  # packing each row's real tokens has data-dependent shapes
        raise OnnxExportError(f"{run_dir}: the model has a BiLSTM between the encoder and the head (bilstm=True), "
                              "which the ONNX export does not support; expected a checkpoint without --bilstm")
    choices = 2 if "MultipleChoice" in type(model).__name__ else None
    example = sample_inputs(model.config, 2, 16, choices, seed=0)
    with torch.no_grad():
        reference = model(**example)
    outputs = [k for k, v in reference.items() if isinstance(v, torch.Tensor)]
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length", max=model.config.max_position_embeddings)}
    if choices:
        dims = {0: dims[0], 1: torch.export.Dim("choices"), 2: dims[1]}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    log(f"exporting {type(model).__name__} from {run_dir} to {path} (opset {opset})")
    # The exporter narrates each stage and warns about things that do not concern a BERT (torchvision's
    # operators, axis names): kept for a failure, which prints them, and out of a successful run's output.
    chatter = io.StringIO()
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    try:
        quiet.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(chatter):
            warnings.simplefilter("ignore")
            program = torch.onnx.export(model, (), kwargs=example, input_names=list(INPUTS), output_names=outputs,
                                        dynamic_shapes={name: dict(dims) for name in INPUTS}, opset_version=opset,
                                        dynamo=True, verbose=False)
    except Exception as err:  # the exporter's own failure, said in one line with the model it was
        log(chatter.getvalue().rstrip())
        raise OnnxExportError(f"{run_dir}: torch.onnx.export failed for {type(model).__name__} at opset {opset}: "
                              f"{type(err).__name__}: {str(err).splitlines()[0][:300]}") from None
    finally:
        quiet.setLevel(level)
    program.save(str(path))
    serving_config(model.config).save_pretrained(out_dir)
    try:
        transformers.AutoTokenizer.from_pretrained(run_dir).save_pretrained(out_dir)
    except (OSError, ValueError):
        log(f"warning: {run_dir} has no tokenizer; copy one into {out_dir} before serving")

    # the check: another batch size and length than the export's, with padding
    check = sample_inputs(model.config, 3, 23, 3 if choices else None, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip(outputs, session.run(outputs, {k: v.numpy() for k, v in check.items()}), strict=True))
    with torch.no_grad():
        want = model(**check)
    real = check["attention_mask"].bool().numpy()
    worst = 0.0
    for name in outputs:
        expected, actual = want[name].numpy(), got[name]
        if actual.shape != expected.shape:
            raise OnnxExportError(f"{path}: output {name} has shape {actual.shape} in onnxruntime, {expected.shape} "
                                  "in eager; expected the same")
        if actual.shape[:real.ndim] == real.shape:  # per-token: padding positions carry no prediction
            expected, actual = expected[real], actual[real]
        worst = max(worst, float(np.abs(actual - expected).max()))
    shape = tuple(check["input_ids"].shape)
    log(f"onnxruntime {ort.__version__} vs eager on a padded batch of shape {shape}: max |difference| = "
        f"{worst:.2e} over {', '.join(outputs)} (tolerance {TOLERANCE:g})")
    if not worst <= TOLERANCE:
        raise OnnxExportError(f"{path}: onnxruntime's outputs differ from the eager model's by {worst:.2e}; expected "
                              f"at most {TOLERANCE:g} (try another --opset)")
    return Exported(path, outputs, worst, shape)
