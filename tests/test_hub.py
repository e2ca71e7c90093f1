"""Tests of the model card and of push_to_hub, offline: the Hub API is replaced by a fake."""

import logging
import time

import numpy as np
import pytest
import yaml
from huggingface_hub import constants

from bert_suite import hub
from bert_suite.hub import model_card, push_to_hub, scrub_secrets
from helpers import run_args, write_rte_like

FAKE_TOKEN = "hf_FAKEFAKEFAKEFAKEFAKEFAKE1234"
REPO = "someone/bert-base-mrpc"


def info(**changes):
    base = {
        "model_id": REPO,
        "base_model": "google-bert/bert-base-uncased",
        "task": "mrpc",
        "dataset": {"id": "nyu-mll/glue", "config": "mrpc"},
        "dev_metrics": {"eval_accuracy": 0.71, "eval_f1": 0.8, "eval_loss": 0.55, "eval_runtime": 3.2, "epoch": 3.0},
        "hyperparameters": {"learning_rate": 2e-5, "per_device_train_batch_size": 32, "num_train_epochs": 3,
                            "seed": 42, "max_seq_length": 128},
        "seeds": [1, 2, 3],
    }
    return {**base, **changes}


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert_suite"}')
    return folder


def test_front_matter_parses_and_model_index_equals_the_dev_metrics():
    meta = front_matter(model_card(info()))
    assert meta["library_name"] == "transformers" and meta["license"] == "apache-2.0"
    assert meta["base_model"] == "google-bert/bert-base-uncased" and meta["datasets"] == ["nyu-mll/glue"]
    assert {"bert_suite", "bert", "mrpc"} <= set(meta["tags"])
    result = meta["model-index"][0]["results"][0]
    assert meta["model-index"][0]["name"] == REPO
    assert result["dataset"] == {"type": "nyu-mll/glue", "name": "nyu-mll/glue mrpc", "config": "mrpc",
                                 "split": "validation"}
    # Scores only: loss, runtime and epoch are not Hub metrics.
    assert {m["type"]: m["value"] for m in result["metrics"]} == {"accuracy": 0.71, "f1": 0.8}
    assert meta["metrics"] == ["accuracy", "f1"]


def test_card_accepts_numpy_metrics_and_a_license_override():
    meta = front_matter(model_card(info(dev_metrics={"eval_accuracy": np.float64(0.5)}, license="mit")))
    assert meta["license"] == "mit"
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 0.5


def test_card_body_has_hyperparameters_results_grid_usage_and_citation():
    card = model_card(info(grid="# Grid search: mrpc\n\n## Trials\n\n| trial |\n|---|\n| 1 |"))
    body = card.split("---\n", 2)[2]
    assert "| learning_rate | 2e-05 |" in body and "| max_seq_length | 128 |" in body
    assert "| seeds tried | 1, 2, 3 |" in body
    assert "| accuracy | 71.00 |" in body and "| loss | 0.5500 |" in body
    assert "### Grid search: mrpc" in body and "#### Trials" in body  # nested below the card's sections
    assert 'AutoModelForSequenceClassification.from_pretrained("someone/bert-base-mrpc")' in body
    assert "import bert_suite" in body and "trust_remote_code=True" in body
    assert "@article{devlin2018bert" in body and "arXiv:1810.04805" in body


def test_a_labelled_test_set_gets_its_own_section_and_stays_out_of_the_dev_results():
    card = model_card(info(test_metrics={"test_accuracy": 0.685, "test_f1": 0.75, "test_runtime": 2.0}))
    body = card.split("---\n", 2)[2]
    dev, test = body.split("## Test results (labelled test set)")
    assert "| accuracy | 68.50 |" in test and "| f1 | 75.00 |" in test and "runtime" not in test
    assert "68.50" not in dev and "played no part in any choice" in test
    metrics = front_matter(card)["model-index"][0]["results"][0]["metrics"]
    assert {m["type"]: m["value"] for m in metrics} == {"accuracy": 0.71, "f1": 0.8}  # dev only
    assert "Test results" not in model_card(info())


@pytest.mark.parametrize("key", hub.REQUIRED_INFO)
def test_missing_required_key_is_named(key):
    broken = info()
    del broken[key]
    with pytest.raises(ValueError, match=f"'{key}'"):
        model_card(broken)


def test_dataset_without_hub_id_is_an_error():
    with pytest.raises(ValueError, match="'id'"):
        model_card(info(dataset={"config": "mrpc"}))


def test_scrub_secrets_replaces_env_tokens_and_token_shaped_strings(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "s3cretvalue-not-hf-shaped")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "")  # empty must not turn every gap into ***
    text = f"a {FAKE_TOKEN} b s3cretvalue-not-hf-shaped c"
    assert scrub_secrets(text) == "a *** b *** c"
    assert scrub_secrets("hf_short stays") == "hf_short stays"
    assert scrub_secrets("x passed-token-123 y", ["passed-token-123", None]) == "x *** y"


def test_model_card_scrubs_a_token_that_slipped_into_the_info():
    card = model_card(info(grid=f"run with token {FAKE_TOKEN}"))
    assert FAKE_TOKEN not in card and "run with token ***" in card


def test_push_offline_raises_fast_without_touching_the_hub(checkpoint, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_api(*args, **kwargs):
        raise AssertionError("HfApi must not be created offline")

    monkeypatch.setattr(hub, "HfApi", no_api)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE=1"):
        push_to_hub(checkpoint, REPO, token=FAKE_TOKEN, card=info())
    assert time.monotonic() - start < 2
    assert not (checkpoint / "README.md").exists()


def test_push_creates_repo_uploads_folder_and_never_leaks_the_token(online, checkpoint, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    url = push_to_hub(checkpoint, REPO, token=FAKE_TOKEN, private=True, card=info())
    assert url == f"https://huggingface.co/{REPO}"
    assert online.calls[0] == ("init", FAKE_TOKEN)  # handed to the client, and only there
    assert online.calls[1] == ("create_repo", REPO, {"exist_ok": True, "private": True})
    upload = online.calls[2][1]
    assert upload["repo_id"] == REPO and str(upload["folder_path"]) == str(checkpoint)
    assert front_matter((checkpoint / "README.md").read_text())["base_model"] == "google-bert/bert-base-uncased"
    for path in checkpoint.rglob("*"):
        assert FAKE_TOKEN not in path.read_text(), path
    out, err = capfd.readouterr()
    assert FAKE_TOKEN not in out + err + caplog.text
    assert REPO in caplog.text  # the log line is there, just without the token


def test_push_error_names_repo_and_hides_the_token(online, checkpoint):
    online.fail_with = OSError(f"401 Unauthorized for token {FAKE_TOKEN}")
    with pytest.raises(RuntimeError, match=REPO) as caught:
        push_to_hub(checkpoint, REPO, token=FAKE_TOKEN, card=info())
    assert FAKE_TOKEN not in str(caught.value) and "401 Unauthorized" in str(caught.value)
    # The original exception quotes the token: it must not be chained into the traceback.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_push_keeps_an_existing_readme_and_requires_one(online, checkpoint):
    with pytest.raises(ValueError, match="README.md"):
        push_to_hub(checkpoint, REPO)
    (checkpoint / "README.md").write_text("my own card\n")
    push_to_hub(checkpoint, REPO)
    assert (checkpoint / "README.md").read_text() == "my own card\n"
    assert [c[0] for c in online.calls] == ["init", "create_repo", "upload_folder"]


# ------------------------------------------------------------------ through the CLI, and offline


def test_grid_push_uploads_the_best_checkpoint_with_its_card(online, tmp_path, monkeypatch, capfd):
    from bert_suite.cli import main as cli_main

    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: True)
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    data = write_rte_like(tmp_path / "data", n_train=32, n_dev=16)
    out = tmp_path / "grid"
    assert cli_main(["grid", "rte", *run_args(data, out, "--max_steps", "2"), "--learning_rates", "1e-3", "5e-4",
                     "--batch_sizes", "8", "--epochs", "1", "--push_to_hub", "--hub_model_id", REPO]) == 0
    uploads = [c[1] for c in online.calls if c[0] == "upload_folder"]
    assert len(uploads) == 1 and uploads[0]["folder_path"] == str(out / "best") and uploads[0]["repo_id"] == REPO
    card = (out / "best" / "README.md").read_text()
    meta = front_matter(card)
    results = meta["model-index"][0]["results"][0]
    assert results["dataset"]["type"] == "nyu-mll/glue" and results["metrics"]
    grid_section = card.split("## Grid search", 1)[1]
    assert "| 0.001 |" in grid_section and "| 0.0005 |" in grid_section  # both trials listed
    assert FAKE_TOKEN not in card and FAKE_TOKEN not in "".join(capfd.readouterr())


def test_push_is_refused_before_training_when_the_hub_is_unreachable(tmp_path, monkeypatch, capsys):
    from bert_suite.cli import main as cli_main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    data = write_rte_like(tmp_path / "data", n_train=8, n_dev=8)
    start = time.time()
    assert cli_main(["finetune", "rte", *run_args(data, tmp_path / "run"), "--push_to_hub", "--hub_model_id", REPO]) == 2
    assert "Hub cannot be reached" in capsys.readouterr().err and time.time() - start < 10
    assert not (tmp_path / "run" / "all_results.json").exists()  # nothing was trained
    assert constants.HF_HUB_OFFLINE is True and datasets.config.HF_HUB_OFFLINE is True  # switched to offline


def test_unreachable_hub_fails_fast_naming_the_local_way_out(tmp_path, monkeypatch, capsys):
    from bert_suite.cli import main as cli_main

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    start = time.time()
    assert cli_main(["finetune", "rte", "--model", "no-such-user/no-such-model", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert time.time() - start < 10 and "--model" in err and "--tokenizer" in err
    assert not (tmp_path / "all_results.json").exists()
