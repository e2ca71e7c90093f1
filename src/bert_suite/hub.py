"""Hugging Face Hub: the model card of a fine-tuned checkpoint, and pushing the checkpoint folder.

The token is only ever handed to `HfApi`; it is never printed, logged or written, and it is
scrubbed from any error message this module raises.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from huggingface_hub import HfApi, constants

from .io import atomic_write_text

logger = logging.getLogger(__name__)

REQUIRED_INFO = ("model_id", "base_model", "task", "dataset", "dev_metrics", "hyperparameters", "seeds")
TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_TOKEN_PATTERN = re.compile(r"hf_[A-Za-z0-9]{20,}")
# Trainer bookkeeping that is not a model metric.
_NOT_METRICS = ("_runtime", "_per_second", "epoch")

CITATION = """@article{devlin2018bert,
  title   = {{BERT}: Pre-training of Deep Bidirectional Transformers for Language Understanding},
  author  = {Devlin, Jacob and Chang, Ming-Wei and Lee, Kenton and Toutanova, Kristina},
  journal = {arXiv preprint arXiv:1810.04805},
  year    = {2018}
}"""


def scrub_secrets(text: str, extra: Iterable[str | None] = ()) -> str:
    """`text` with Hub tokens replaced by "***": the values of HF_TOKEN / HUGGING_FACE_HUB_TOKEN,
    the strings in `extra`, and anything shaped like a user access token (hf_ + 20 or more chars)."""
    secrets = [os.environ.get(name) for name in TOKEN_ENV_VARS] + list(extra)
    # Longest first so a token that contains another is replaced whole; short values are skipped
    # because no real token is that short and replacing e.g. "1" would mangle the text.
    for secret in sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _TOKEN_PATTERN.sub("***", text)


def _metric_name(key: str) -> str:
    return key.removeprefix("eval_")


def _cell(key: str, value: float) -> str:
    """A metric as the card's tables show it: scores in percent, losses as they are, counts and thresholds
    plainly."""
    if key.endswith(("total", "thresh")):
        return f"{value:g}"
    return f"{value:.4f}" if "loss" in key else f"{100 * value:.2f}"


def _dev_metrics(info: dict, scores_only: bool = False) -> dict[str, float]:
    """info["dev_metrics"] without Trainer bookkeeping (and, with `scores_only`, without the loss)."""
    skip = _NOT_METRICS + (("loss",) if scores_only else ())
    # float(): numpy scalars would make yaml.safe_dump fail.
    return {k: float(v) for k, v in info["dev_metrics"].items() if not any(m in k for m in skip)}


def _check(info: dict) -> None:
    for key in REQUIRED_INFO:
        if key not in info:
            raise ValueError(f"model card info is missing required key {key!r} (needs: {', '.join(REQUIRED_INFO)})")
    if not isinstance(info["dataset"], dict) or "id" not in info["dataset"]:
        raise ValueError("model card info['dataset'] is missing key 'id' (the dataset's Hub id, e.g. 'nyu-mll/glue')")


def _front_matter(info: dict) -> dict:
    # Scores only: the Hub reads front-matter metrics as evaluate metric ids, and "loss" is not one.
    dataset, task, metrics = info["dataset"], info["task"], _dev_metrics(info, scores_only=True)
    task_type = info.get("task_type", "text-classification")
    dataset_entry = {"type": dataset["id"], "name": dataset.get("name", f"{dataset['id']} {task}".strip())}
    if dataset.get("config"):
        dataset_entry["config"] = dataset["config"]
    dataset_entry["split"] = dataset.get("split", "validation")
    return {
        "library_name": "transformers",
        "license": info.get("license", "apache-2.0"),
        "language": info.get("language", "en"),
        "base_model": info["base_model"],
        "datasets": [dataset["id"]],
        "tags": ["bert_suite", "bert", task, task_type],
        "metrics": sorted({_metric_name(k) for k in metrics}),
        "model-index": [{
            "name": info["model_id"],
            "results": [{
                "task": {"type": task_type, "name": task_type.replace("-", " ").title()},
                "dataset": dataset_entry,
                "metrics": [{"type": _metric_name(k), "value": v, "name": f"dev {_metric_name(k)}"}
                            for k, v in metrics.items()],
            }],
        }],
    }


def _table(header: tuple[str, str], rows: Iterable[tuple[object, object]]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} |" for a, b in rows])


def _demote_headings(markdown: str) -> str:
    # The grid report starts at "#"; nested in the card it must sit below the card's "##".
    return "\n".join("##" + line if line.startswith("#") else line for line in markdown.splitlines())


def model_card(info: dict) -> str:
    """README.md text (YAML front matter + Markdown body) for a fine-tuned bert_suite checkpoint."""
    _check(info)
    model_id, task, dataset = info["model_id"], info["task"], info["dataset"]
    front = yaml.safe_dump(_front_matter(info), sort_keys=False, allow_unicode=True)
    hyper = dict(info["hyperparameters"])
    hyper["seeds tried"] = ", ".join(str(s) for s in info["seeds"])
    results = [(_metric_name(k), _cell(k, v)) for k, v in _dev_metrics(info).items()]
    source = f"dataset `{dataset['id']}`" + (f", config `{dataset['config']}`" if dataset.get("config") else "")
    parts = [
        f"---\n{front}---",
        f"# {model_id}",
        f"`{info['base_model']}` fine-tuned on **{task}** ({source}) with "
        "bert_suite, which reproduces the fine-tuning recipe of the BERT paper "
        "(Devlin et al., 2018).",
        "## Hyper-parameters",
        _table(("name", "value"), hyper.items()),
        f"## Dev results ({dataset.get('split', 'validation')} split)",
        "Scores are percentages; the paper's GLUE tables report test-set scores, so compare with care.",
        _table(("metric", "value"), results),
    ]
    tests = {k: float(v) for k, v in (info.get("test_metrics") or {}).items() if not any(m in k for m in _NOT_METRICS)}
    if tests:  # a labelled test set, scored once with the model chosen on dev
        parts += ["## Test results (labelled test set)",
                  "Scored once, with the model chosen on dev; the test set played no part in any choice.",
                  _table(("metric", "value"), [(k.removeprefix("test_"), _cell(k, v)) for k, v in tests.items()])]
    if info.get("grid"):
        parts += ["## Grid search", _demote_headings(info["grid"])]
    parts += [
        "## How to use",
        "```python\nimport bert_suite  # registers the BertSuite classes with the transformers Auto* classes\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n\n"
        f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")\n'
        f'model = AutoModelForSequenceClassification.from_pretrained("{model_id}")\n```',
        "Without bert_suite installed, pass `trust_remote_code=True` to `from_pretrained`; that only works "
        "when the repository ships the modeling code that `auto_map` in config.json names.",
        "## Citation",
        f"```bibtex\n{CITATION}\n```",
    ]
    return scrub_secrets("\n\n".join(parts) + "\n")


def _offline() -> bool:
    # constants.HF_HUB_OFFLINE is read once at import; the env var catches a later change.
    env = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(constants.HF_HUB_OFFLINE) or env in {"1", "ON", "YES", "TRUE"}


def push_to_hub(folder: str | Path, repo_id: str, token: str | None = None, private: bool = False,
                commit_message: str = "Upload fine-tuned bert_suite model", card: dict | None = None) -> str:
    """Upload `folder` to the Hub model repo `repo_id` (created if missing); returns the repo URL.

    With `card` (the info dict of `model_card`), README.md is (re)written from it first; otherwise
    the folder's README.md is kept as is and must exist. Raises RuntimeError when offline or when
    the Hub refuses, with the token scrubbed from the message.
    """
    if _offline():
        raise RuntimeError(f"cannot push {repo_id}: HF_HUB_OFFLINE=1 (offline mode); unset it to upload")
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"cannot push {repo_id}: {folder} is not a folder")
    readme = folder / "README.md"
    if card is not None:
        atomic_write_text(readme, model_card(card))
    elif not readme.is_file():
        raise ValueError(f"cannot push {repo_id}: {readme} does not exist; pass card=... to write it")
    else:
        text = readme.read_text(encoding="utf-8")
        if scrub_secrets(text, [token]) != text:  # never upload a card that carries a token
            atomic_write_text(readme, scrub_secrets(text, [token]))

    logger.info("pushing %s to the Hub repo %s (private=%s)", folder, repo_id, private)
    try:
        api = HfApi(token=token)
        url = api.create_repo(repo_id, exist_ok=True, private=private)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message)
    except Exception as err:
        message = scrub_secrets(f"{type(err).__name__}: {err}", [token])
        # `from None`: the original exception (and its traceback) may quote the token.
        raise RuntimeError(f"cannot push {folder} to {repo_id}: {message}") from None
    return str(url)


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub endpoint answers within `timeout` seconds (through any configured proxy)."""
    import urllib.error
    import urllib.request

    try:  # urllib honours the *_PROXY variables, as the Hub client does
        urllib.request.urlopen(urllib.request.Request(constants.ENDPOINT, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


def offline_unless_reachable(timeout: float = 3.0) -> bool:
    """Switch this process to offline mode when the Hub cannot be reached, so that cached files
    still load and anything missing fails at once with our message, instead of after a minute of
    retries. Returns True when the process is (now) offline."""
    if _offline():
        return True
    if hub_reachable(timeout):
        return False
    logger.warning("the Hugging Face Hub (%s) cannot be reached: working offline, from local files and the cache",
                   constants.ENDPOINT)
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    try:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    except ImportError:
        pass
    return True


def pretraining_card(model_id: str, results: dict) -> str:
    """README.md for a pre-trained (not fine-tuned) checkpoint: the recipe's config and the final
    training and held-out metrics."""
    config = results.get("config", {})
    front = {"library_name": "transformers", "pipeline_tag": "fill-mask",
             "tags": ["bert_suite", "bert", "pretraining", "masked-lm", "next-sentence-prediction"]}
    metrics = [(k, f"{v:.4f}") for k, v in results.items() if isinstance(v, float)]
    settings = [(k, config[k]) for k in ("model_size", "use_nsp", "causal_attention", "max_steps", "learning_rate",
                                          "per_device_train_batch_size", "warmup_steps", "mlm_probability",
                                          "mask_ratio", "random_ratio", "whole_word_mask", "seed") if k in config]
    parts = [f"---\n{yaml.safe_dump(front, sort_keys=False)}---", f"# {model_id}",
             "A BERT model pre-trained (masked LM + next-sentence prediction) with bert_suite's recipe, "
             "which follows the BERT paper (Devlin et al., 2018).",
             "## Recipe settings", _table(("name", "value"), settings),
             *(["## Objective schedule", _table(("objective", "steps"), [
                 (o["objective"], f"{o['from_step']:,} to {o['to_step']:,}") for o in results["objectives"]])]
               if len(results.get("objectives") or []) > 1 else []),
             f"## Metrics at step {results.get('step')}", _table(("metric", "value"), metrics),
             "## Citation", f"```bibtex\n{CITATION}\n```"]
    return scrub_secrets("\n\n".join(parts) + "\n")
