"""Test-wide settings: offline, quiet, caches inside the test run, parity figures in the summary."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_EVALUATE_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="bert_suite_hf_home_"))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

# Figures that tests report (name -> value); printed at the end of the run.
REPORTED: dict[str, str] = {}


def pytest_terminal_summary(terminalreporter):
    if REPORTED:
        terminalreporter.section("bert_suite figures")
        for name, value in REPORTED.items():
            terminalreporter.write_line(f"{name}: {value}")


@pytest.fixture
def report():
    def _report(name: str, value) -> None:
        REPORTED[name] = value

    return _report
