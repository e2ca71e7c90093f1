"""Secrets and safety (docs/RELIABILITY.md): a Hub token in the environment during a full run
(fine-tuning with TensorBoard logs and a push, a grid, pre-training with checkpoints, logs and a
push, model cards, manifests) appears in no output and no file; weights are written as
safetensors; pickled weights are never unpickled with code execution; remote code in a
checkpoint is never run."""

import ast
import json
import logging
from pathlib import Path

import torch
import transformers

from bert_suite import BertSuiteConfig, BertSuiteForSequenceClassification, hub
from bert_suite.cli import main as cli_main
from helpers import fresh_state, load_recipe, recipe_args, run_args, write_rte_like

REPO = Path(__file__).resolve().parents[1]
TOKEN = "hf_" + "tOkEn" * 7  # shaped like a user access token


def files_holding(root: Path, secret: str) -> list[str]:
    needles = (secret.encode(), secret.encode("utf-16-le"))
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*"))
            if p.is_file() and any(n in p.read_bytes() for n in needles)]


def test_a_hub_token_in_the_environment_appears_in_no_output_and_no_file(
        online, pretrain_setup, tmp_path, monkeypatch, capfd, caplog):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", TOKEN)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)
    caplog.set_level(logging.DEBUG)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_info()
    try:
        data = write_rte_like(tmp_path / "data", n_train=32, n_dev=16)
        assert cli_main(["finetune", "rte", *run_args(data, tmp_path / "finetune", "--max_steps", "2"),
                         "--report_to", "tensorboard", "--logging_steps", "1", "--push_to_hub",
                         "--hub_model_id", "someone/rte"]) == 0
        assert cli_main(["grid", "rte", *run_args(data, tmp_path / "grid", "--max_steps", "1"), "--learning_rates",
                         "1e-3", "5e-4", "--batch_sizes", "8", "--epochs", "1", "--push_to_hub",
                         "--hub_model_id", "someone/rte-grid"]) == 0
        fresh_state()
        load_recipe().main(recipe_args(pretrain_setup, tmp_path / "pretrain", "max_steps=4", "phase1_fraction=1",
                                       "save_steps=2", "report_to=tensorboard", "push_to_hub=true",
                                       "hub_model_id=someone/tiny"))
    finally:
        transformers.logging.set_verbosity(verbosity)
    out, err = capfd.readouterr()
    assert [c[0] for c in online.calls].count("upload_folder") == 3  # the three pushes happened
    assert TOKEN not in out and TOKEN not in err and TOKEN not in caplog.text
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"run_manifest.json", "README.md", "grid_results.md", "pretrain_results.json", "metrics.jsonl"} <= written
    assert any(name.startswith("events.out.tfevents") for name in written)  # TensorBoard logs were written
    assert files_holding(tmp_path, TOKEN) == []
    # the scan finds a token wherever it is, so the check above can fail
    (tmp_path / "grid" / "canary.bin").write_bytes(b"\0x" + TOKEN.encode("utf-16-le"))
    assert files_holding(tmp_path, TOKEN) == ["grid/canary.bin"]

    # weights: safetensors in every model folder, and no pickled weights anywhere
    models = [p.parent for p in tmp_path.rglob("config.json")]  # finetune, grid best, pretrain final
    models += list((tmp_path / "pretrain" / "checkpoints").glob("step-*"))  # accelerate save_state
    assert len(models) == 4 and all((m / "model.safetensors").is_file() for m in models)
    assert not [p for p in tmp_path.rglob("*") if p.name in ("pytorch_model.bin", "model.bin", "tf_model.h5")]


class Planted:
    """Unpickling this runs code (it writes a file), as a malicious checkpoint would."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def tiny_checkpoint(folder: Path, vocab: Path) -> Path:
    config = BertSuiteConfig(vocab_size=len(vocab.read_text().split()), hidden_size=32, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_labels=2)
    BertSuiteForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_pickled_weights_that_would_run_code_are_refused(tmp_path, capsys):
    data = write_rte_like(tmp_path / "data", n_train=8, n_dev=8)
    folder = tiny_checkpoint(tmp_path / "ckpt", data / "vocab.txt")
    state = {k: v for k, v in BertSuiteForSequenceClassification.from_pretrained(folder).state_dict().items()}
    (folder / "model.safetensors").unlink()
    torch.save({**state, "planted": Planted(tmp_path / "pwned")}, folder / "pytorch_model.bin")
    code = cli_main(["finetune", "rte", "--model", str(folder), "--tokenizer", str(data / "vocab.txt"),
                     "--data_dir", str(data), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
                     "--max_seq_length", "64"])
    err = capsys.readouterr().err
    assert not (tmp_path / "pwned").exists()  # the planted code never ran
    assert code == 2 and "Traceback" not in err
    assert "pytorch_model.bin" in err and "weights_only" in err
    # the same file without the planted object loads (weights_only=True reads plain tensors)
    torch.save(state, folder / "pytorch_model.bin")
    assert BertSuiteForSequenceClassification.from_pretrained(folder).config.hidden_size == 32


def test_remote_code_in_a_checkpoint_is_never_run(tmp_path, capsys):
    data = write_rte_like(tmp_path / "data", n_train=16, n_dev=8)
    folder = tiny_checkpoint(tmp_path / "ckpt", data / "vocab.txt")
    marker = tmp_path / "pwned"
    (folder / "evil.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('code ran')\n"
                                    "from transformers import PretrainedConfig as EvilConfig, PreTrainedModel as Evil\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForSequenceClassification": "evil.Evil"}
    (folder / "config.json").write_text(json.dumps(config))
    transformers.BertTokenizerFast(vocab_file=str(data / "vocab.txt")).save_pretrained(folder)
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))

    code = cli_main(["finetune", "rte", "--model", str(folder), "--data_dir", str(data), "--output_dir",
                     str(tmp_path / "out"), "--max_steps", "1", "--max_seq_length", "64"])
    err = capsys.readouterr().err
    assert not marker.exists()  # neither the model's nor the tokenizer's remote code ran
    assert code == 0 or ("trust_remote_code" in err and "Traceback" not in err), err


def test_the_toolkit_never_turns_on_trust_remote_code():
    """No call in the package or the recipes passes trust_remote_code other than False."""
    found = []
    for path in [*(REPO / "src").rglob("*.py"), *(REPO / "recipes").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            for keyword in getattr(node, "keywords", []) if isinstance(node, ast.Call) else []:
                if keyword.arg == "trust_remote_code" and not (
                        isinstance(keyword.value, ast.Constant) and keyword.value.value is False):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []
