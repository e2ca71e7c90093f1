"""The pre-training recipe's configuration: one flat, typed dataclass read from YAML plus
`key=value` overrides. An unknown key, a wrong type or an impossible value is an error naming
the file and the key, like the task cards; the recipe reads every field, so none is decorative."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# configuration_bert_suite.PRESETS's names (a test in tests/test_ablation.py keeps them equal): that file imports
# transformers and torch, and reading a config (a study's --status) should not
MODEL_SIZES = ("tiny", "mini", "small", "medium", "base", "large")


class PretrainConfigError(ValueError):
    """A recipe config that cannot be used; the message names the file and the key."""


@dataclass
class PretrainConfig:
    # --- data: `bert-suite pretrain-data` outputs (phase 1 at length 128, phase 2 at 512)
    train_data: str = ""
    train_data_phase2: str | None = None
    eval_data: str | None = None  # held-out instances; default: eval_fraction split off train_data
    eval_fraction: float = 0.01
    tokenizer: str = ""  # tokenizer folder or vocab.txt; saved with the final checkpoint
    # --- model: a size preset (BERT paper Table 6 and the released miniatures) and the Table 5 ablation switches
    model_size: str = "tiny"
    use_nsp: bool = True  # False: Table 5 "No NSP"
    causal_attention: bool = False  # True (with use_nsp False): Table 5 "LTR & No NSP"
    init_from: str | None = None  # start from a checkpoint instead of random weights (with this config's objective)
    # --- objective schedule: the first steps as a left-to-right LM (next token, no NSP), then the objective above
    # (MLM, with NSP when use_nsp): the biphasic schedule of Gisserot-Boukhlef et al. (2025). One of the two, as
    # phase1_fraction is to the length phases: a share of max_steps, or a step; 0 / null: no causal phase
    causal_fraction: float = 0.0
    causal_steps: int | None = None
    hidden_dropout_prob: float | None = None  # null: the preset's (0.1); 0 turns dropout off (cramming, MosaicBERT)
    attention_probs_dropout_prob: float | None = None  # null: the preset's (0.1)
    # --- masking (Table 8 mixes: mask_ratio / random_ratio, the rest unchanged)
    mlm_probability: float = 0.15
    mask_ratio: float = 0.8
    random_ratio: float = 0.1
    max_predictions_per_seq: int = 20
    max_predictions_per_seq_phase2: int = 80
    whole_word_mask: bool = False
    # --- optimisation (the paper's: Adam 1e-4, betas 0.9/0.999, wd 0.01, warmup 10k, linear decay)
    learning_rate: float = 1e-4
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 10_000
    max_steps: int = 1_000_000  # optimizer steps over both phases
    phase1_fraction: float = 0.9  # share of max_steps at phase 1's length
    per_device_train_batch_size: int = 256
    per_device_train_batch_size_phase2: int | None = None  # default: same as phase 1
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    # auto: bf16 autocast where the CPU does bf16 natively (fp32 elsewhere), the accelerate config's choice on
    # a GPU; no, bf16, fp16 (accelerate's names) choose explicitly (bert_suite.precision)
    mixed_precision: str = "auto"
    # --- speed (bert_suite.pretraining.step). auto: on a CUDA device, off on the CPU, where the eager path that
    # drops padding itself was measured fastest (benchmarks/RESULTS.md)
    # every batch padded to its phase's length, the masked positions a (batch, max_predictions_per_seq) tensor,
    # no attention mask without padding: no host sync, one compiled graph (auto: also whenever compiling/graphing)
    static_shapes: bool | str = "auto"
    torch_compile: bool | str = "auto"  # compile the embeddings, the encoder layers and the heads in place
    torch_compile_backend: str = "inductor"  # any torch.compile backend (aot_eager: trace only, no codegen)
    # the whole step (micro-batches, clipping, AdamW) as one CUDA graph replayed each step; auto: on one GPU
    cuda_graph: bool | str = "auto"
    # the 80/10/10 masks made inside the step from token ids (the loader ships ids, lengths, the first segment's
    # length and the NSP label: one indexed read a batch), the same masks bit for bit; auto: on with CUDA.
    # Whole-word masks and masks made offline (pretrain-data --static_masking) stay in the loader
    mask_in_step: bool | str = "auto"
    # under bf16 autocast, the residual stream in bf16 (each LayerNorm computes in fp32 inside and hands on bf16)
    # instead of fp32: half the bytes for the elementwise work between the matmuls; auto: on with CUDA. Off by
    # default: it cost 0.12 nats of held-out MLM loss over the demo's 2,000 steps (benchmarks/RESULTS.md)
    bf16_residual: bool | str = False
    # --- bookkeeping
    output_dir: str = "runs/pretrain"
    seed: int = 42
    logging_steps: int = 100
    eval_steps: int = 1000
    eval_batches: int = 20
    per_device_eval_batch_size: int = 64
    save_steps: int = 1000
    save_total_limit: int = 2
    # steps at which the model is also saved as a from_pretrained folder, output_dir/snapshots/step-N, and kept
    # (a curve of fine-tuning scores against pre-training steps: the paper's Figure 5); the last step is final/
    snapshot_steps: list[int] = field(default_factory=list)
    # steps whose checkpoints (with the optimizer) are also saved and never rotated away: another run may start
    # from them (a left-to-right run's checkpoint at a biphasic run's switch, `start_from_checkpoint`)
    keep_checkpoints: list[int] = field(default_factory=list)
    # a fresh run starts from another run's complete checkpoint whose steps were this run's own (the same data,
    # schedule, seed and objective up to that step: a left-to-right run's at a biphasic run's switch): its
    # weights, optimizer state, schedule and random states; parameters the other run lacks (the NSP head) keep
    # this run's first values
    start_from_checkpoint: str | None = None
    resume_from_checkpoint: str | None = "auto"  # auto: latest in output_dir/checkpoints; null: start over
    report_to: str = "tensorboard"  # tensorboard, none, or any accelerate tracker name
    # processes that pad, mask and count the batches ahead of the step; auto: 0 on the CPU, up to 4 beside a GPU
    dataloader_num_workers: int | str = "auto"
    push_to_hub: bool = False
    hub_model_id: str | None = None
    extra: dict = field(default_factory=dict)  # free-form notes copied into the results (e.g. table name)

    @property
    def phase1_steps(self) -> int:
        return self.max_steps if not self.train_data_phase2 else math.ceil(self.max_steps * self.phase1_fraction)

    @property
    def causal_until(self) -> int:
        """The step at which the objective switches from left-to-right to the run's own (0: no causal phase)."""
        return self.causal_steps or math.ceil(self.max_steps * self.causal_fraction)

    def causal_at(self, step: int) -> bool:
        """Whether step `step` (0-based) trains left-to-right."""
        return self.causal_attention or step < self.causal_until

    def objective_at(self, step: int) -> str:
        """causal, mlm or mlm_nsp: what step `step` (0-based) trains."""
        return "causal" if self.causal_at(step) else "mlm_nsp" if self.use_nsp else "mlm"

    def objectives(self) -> list[dict]:
        """The objective schedule: [{objective, from_step, to_step}] (steps as counted in the logs: to_step the
        last step of the phase)."""
        switch = self.causal_until if not self.causal_attention else 0
        phases = [("causal", 0, switch)] if switch else []
        phases.append((self.objective_at(self.max_steps - 1), switch, self.max_steps))
        return [{"objective": o, "from_step": a + 1, "to_step": b} for o, a, b in phases]


_FIELDS = {f.name: f for f in dataclasses.fields(PretrainConfig)}
_HINTS = typing.get_type_hints(PretrainConfig)


def _coerce(source: str, key: str, value, hint=None):
    """Check (and, for command-line strings, convert) `value` against the field's type (`hint`: a list's items)."""
    hint = hint or _HINTS[key]
    options = (hint,) if typing.get_origin(hint) is list else typing.get_args(hint) or (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise PretrainConfigError(f"{source}: {key} cannot be null")
    for kind in options:
        if kind is type(None):
            continue
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                return value.lower() in ("true", "1", "yes")
        elif kind is int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lstrip("-").isdigit():
                return int(value)
            if isinstance(value, float) and value.is_integer():
                return int(value)
        elif kind is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            try:
                return float(value)
            except (TypeError, ValueError):
                pass
        elif kind is str:
            if isinstance(value, str):
                return value
        elif kind is dict:
            if isinstance(value, dict):
                return value
        elif typing.get_origin(kind) is list:  # a YAML list, or from the command line 2500,5000 or [2500, 5000]
            items = value
            if isinstance(value, str):
                items = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
            if isinstance(items, (list, tuple)):
                try:
                    return [_coerce(source, key, v, typing.get_args(kind)[0]) for v in items]
                except PretrainConfigError:
                    pass
    names = " or ".join("null" if k is type(None) else "a list of " + typing.get_args(k)[0].__name__
                        if typing.get_origin(k) is list else k.__name__ for k in options)
    raise PretrainConfigError(f"{source}: {key} must be {names}, got {type(value).__name__} {value!r}")


def load_pretrain_config(path: str | None, overrides: list[str] = ()) -> PretrainConfig:
    """Read a YAML config (or none) and apply `key=value` overrides (strings from the command line;
    `null` means None)."""
    values: dict = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            raise PretrainConfigError(f"{path}: cannot read the config ({err})") from None
        if not isinstance(loaded, dict):
            raise PretrainConfigError(f"{path}: a config is a mapping of keys to values")
        for key, value in loaded.items():
            values[key] = (path, value)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise PretrainConfigError(f"override {item!r}: expected key=value")
        values[key.strip()] = (f"override {item!r}", None if value.strip() in ("null", "None") else value.strip())
    config = {}
    for key, (source, value) in values.items():
        if key not in _FIELDS:
            close = sorted(k for k in _FIELDS if k[:4] == key[:4])
            raise PretrainConfigError(f"{source}: unknown key {key!r}; "
                                      + (f"did you mean {', '.join(close)}?" if close else
                                         "the recipe reads " + ", ".join(_FIELDS)))
        config[key] = _coerce(source, key, value)
    return validate(PretrainConfig(**config), path or "<overrides>")


def validate(cfg: PretrainConfig, source: str) -> PretrainConfig:
    def bad(key, why):
        raise PretrainConfigError(f"{source}: {key} {why} (got {getattr(cfg, key)!r})")

    if not cfg.train_data:
        bad("train_data", "is required: a folder written by `bert-suite pretrain-data`")
    if not cfg.tokenizer:
        bad("tokenizer", "is required: the tokenizer folder or vocab.txt the data was made with")
    if cfg.model_size not in MODEL_SIZES:
        bad("model_size", f"must be one of {', '.join(MODEL_SIZES)}")
    for key in ("max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "logging_steps",
                "eval_steps", "save_steps", "eval_batches", "per_device_eval_batch_size", "max_predictions_per_seq",
                "max_predictions_per_seq_phase2"):
        if getattr(cfg, key) < 1:
            bad(key, "must be at least 1")
    if cfg.warmup_steps < 0 or cfg.warmup_steps > cfg.max_steps:
        bad("warmup_steps", f"must be between 0 and max_steps ({cfg.max_steps})")
    if not 0 < cfg.phase1_fraction <= 1:
        bad("phase1_fraction", "must be in (0, 1]")
    if cfg.phase1_fraction < 1 and not cfg.train_data_phase2:
        bad("phase1_fraction", "is below 1 but train_data_phase2 (the length-512 data) is not set; "
                               "set it, or phase1_fraction=1")
    if not 0 < cfg.mlm_probability <= 1:
        bad("mlm_probability", "must be in (0, 1]")
    if min(cfg.mask_ratio, cfg.random_ratio) < 0 or cfg.mask_ratio + cfg.random_ratio > 1:
        bad("mask_ratio", "and random_ratio must be >= 0 with a sum <= 1")
    if not 0 <= cfg.eval_fraction < 1:
        bad("eval_fraction", "must be in [0, 1)")
    if cfg.mixed_precision not in ("auto", "no", "fp16", "bf16"):
        bad("mixed_precision", "must be auto, no, bf16 or fp16")
    if cfg.learning_rate <= 0:
        bad("learning_rate", "must be positive")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        if getattr(cfg, key) is not None and not 0 <= getattr(cfg, key) < 1:
            bad(key, "must be in [0, 1) or null")
    for key in ("snapshot_steps", "keep_checkpoints"):
        if any(not 1 <= s <= cfg.max_steps for s in getattr(cfg, key)):
            bad(key, f"must be steps between 1 and max_steps ({cfg.max_steps})")
    if cfg.start_from_checkpoint and cfg.init_from:
        bad("start_from_checkpoint", "and init_from are both set: a run starts from one of them")
    if cfg.push_to_hub and not cfg.hub_model_id:
        bad("hub_model_id", "is required with push_to_hub")
    if isinstance(cfg.dataloader_num_workers, str) and cfg.dataloader_num_workers != "auto" \
            or isinstance(cfg.dataloader_num_workers, int) and cfg.dataloader_num_workers < 0:
        bad("dataloader_num_workers", "must be auto or a number of processes (0: the main process)")
    for key in ("static_shapes", "torch_compile", "cuda_graph", "mask_in_step", "bf16_residual"):
        if isinstance(getattr(cfg, key), str) and getattr(cfg, key) != "auto":
            bad(key, "must be auto, true or false")
    for key in ("torch_compile", "cuda_graph"):
        if getattr(cfg, key) is True and cfg.static_shapes is False:
            bad("static_shapes", f"must be true or auto with {key}=true (a compiled or captured step needs "
                                 "the same shapes every step)")
    if cfg.causal_steps is not None and cfg.causal_fraction:
        bad("causal_steps", "and causal_fraction are both set: two causal phases covering the same steps; give one (the "
                            "switch as a step, or as a share of max_steps)")
    if not 0 <= cfg.causal_fraction < 1:
        bad("causal_fraction", "must be in [0, 1): the share of max_steps trained left-to-right before the switch")
    if cfg.causal_steps is not None and not 1 <= cfg.causal_steps < cfg.max_steps:
        bad("causal_steps", f"must be a step from 1 to {cfg.max_steps - 1} (max_steps - 1): the switch must leave "
                            "steps for the masked phase")
    if cfg.causal_until >= cfg.max_steps:
        bad("causal_fraction", f"leaves no step for the masked phase: the switch at step {cfg.causal_until} is not "
                               f"before max_steps ({cfg.max_steps})")
    if cfg.causal_until and cfg.causal_attention:
        bad("causal_attention", "is true, so every step is left-to-right and a causal phase (causal_steps, "
                                "causal_fraction) would cover the same steps; set causal_attention false: it is the "
                                "objective after the switch")
    if cfg.causal_attention and cfg.use_nsp:
        # The paper's LTR model has no NSP; a causal encoder's [CLS] sees only itself.
        bad("use_nsp", "must be false with causal_attention (the paper's LTR & No NSP)")
    return cfg
