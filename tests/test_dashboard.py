"""`bert-suite dashboard`: a grid's study in optuna-dashboard, checked in a real browser (Debian's chromium,
driven by playwright) while the grid runs and after; the per-epoch intermediate values and the user
attributes the grid records; and the three ways it refuses to start."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
import pytest

from bert_suite.cli import main as cli_main
from bert_suite.dashboard import DashboardError, check_port, serve, study_storage
from helpers import REPO, run_args, write_rte_like

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTEFACTS = REPO / "runs" / "test-artefacts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grid_argv(data: Path, out: Path) -> list[str]:
    return ["grid", "rte", *run_args(data, out), "--learning_rates", "1e-3", "5e-4", "--batch_sizes", "16",
            "--epochs", "2", "--seeds", "1", "2", "--max_seq_length", "32"]  # 4 trials of 2 epochs


def wait_for(condition, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_the_grid_reports_each_epoch_and_what_a_reader_needs(tmp_path):
    data = write_rte_like(tmp_path / "data", n_train=120, n_dev=40)
    out = tmp_path / "grid"
    argv = grid_argv(data, out)
    argv[argv.index("--seeds") + 1:argv.index("--seeds") + 3] = ["1"]  # 2 trials
    assert cli_main(argv) == 0
    storage = study_storage(str(out), None)
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    assert len(study.trials) == 2
    for trial in study.trials:
        assert sorted(trial.intermediate_values) == [1, 2]  # one dev score per epoch: the learning curve
        assert trial.intermediate_values[2] == pytest.approx(trial.value)  # the last epoch is the trial's score
        assert trial.user_attrs["task"] == "rte" and trial.user_attrs["metric"] == "eval_accuracy"
        assert trial.user_attrs["seed"] == trial.params["seed"]
        assert Path(trial.user_attrs["run_folder"]) == (out / "trials" / f"trial-{trial.number:03d}").resolve()


# A grid, a dashboard and a browser (25 s on 2 cores): make test-all. make test checks what the page loads, the
# dashboard's API, in the test on PostgreSQL below, and what the grid records for it in the test above.
@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (as root: apt-get install chromium; `make install` does it)")
def test_the_dashboard_shows_a_running_grid_in_a_browser(tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    data = write_rte_like(tmp_path / "data", n_train=160, n_dev=40)
    out = tmp_path / "grid"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("grid", "dashboard")}  # a pipe could fill up
    grid = subprocess.Popen([sys.executable, "-m", "bert_suite.cli", *grid_argv(data, out)], env=env,
                            stdout=logs["grid"], stderr=subprocess.STDOUT, text=True)
    port = free_port()
    dashboard = None
    try:
        # once a trial trains, the grid is frozen (SIGSTOP) so that the page is shown while it runs, whatever
        # the machine's speed; it goes on (SIGCONT) after the study is seen in the browser
        wait_for(lambda: _running_trials(out), 120, "a running trial of the grid")
        os.kill(grid.pid, signal.SIGSTOP)
        dashboard = subprocess.Popen([sys.executable, "-m", "bert_suite.cli", "dashboard", str(out), "--port", str(port)],
                                     env=env, stdout=logs["dashboard"], stderr=subprocess.STDOUT, text=True)
        url = f"http://127.0.0.1:{port}/dashboard"
        wait_for(lambda: _answers(url), 60, "the dashboard to answer")
        name = optuna.get_all_study_names(f"sqlite:///{out / 'grid.db'}")[0]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="networkidle")
            page.get_by_text(name).first.wait_for(timeout=30_000)  # the study is listed while the grid runs
            page.goto(f"{url}/studies/1/trials", wait_until="networkidle")
            page.get_by_text("Running").first.wait_for(timeout=30_000)  # with its trial in progress
            os.kill(grid.pid, signal.SIGCONT)
            assert grid.wait(timeout=300) == 0, (tmp_path / "grid.log").read_text()[-3000:]
            page.goto(f"{url}/studies/1/trials", wait_until="networkidle")
            page.get_by_text("4 Trials").wait_for(timeout=30_000)  # the trial count matches the grid
            page.get_by_text("Trial 0", exact=True).first.click()
            body = page.locator("body")
            body.get_by_text("Intermediate Values").wait_for(timeout=30_000)
            text = body.inner_text()
            ARTEFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTEFACTS / "dashboard.png"), full_page=True)
            browser.close()
        trial = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'grid.db'}").trials[0]
        assert "learning_rate 0.001" in text and "seed 1" in text  # the trial's parameters
        for step, value in trial.intermediate_values.items():  # its learning curve, epoch by epoch
            assert f"{step} {int(value) if value == int(value) else value!r}" in text  # as JavaScript prints it
        assert "metric eval_accuracy" in text and "task rte" in text and "run_folder" in text
        assert (ARTEFACTS / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        for proc in (grid, dashboard):
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.terminate()
                proc.wait(timeout=30)
    assert f"http://127.0.0.1:{port}/dashboard/studies/1" in (tmp_path / "dashboard.log").read_text()


def _running_trials(out: Path) -> int:
    if not (out / "grid.db").is_file():
        return 0
    storage = f"sqlite:///{out / 'grid.db'}"
    try:
        names = optuna.get_all_study_names(storage)
        trials = optuna.load_study(study_name=names[0], storage=storage).get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)) if names else []
    except Exception:  # the grid is creating its tables
        return 0
    return sum("worker" in t.user_attrs for t in trials)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_the_dashboard_serves_a_study_on_postgresql(postgres_url, tmp_path):
    """--storage URL: the grid's study on PostgreSQL, read by the dashboard's own API (what the page loads): the
    study, and a trial's parameters, learning curve and attributes (the browser shows them: make test-all)."""
    import json

    from helpers import fresh_database

    url = fresh_database(postgres_url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="rte-grid-pg", storage=url, direction="maximize")
    trial = study.ask({"learning_rate": optuna.distributions.CategoricalDistribution([1e-3])})
    trial.set_user_attr("task", "rte")
    trial.report(0.7, step=1)
    trial.report(0.75, step=2)
    study.tell(trial, 0.8)
    port = free_port()
    log = open(tmp_path / "dashboard.log", "w+")
    dashboard = subprocess.Popen([sys.executable, "-m", "bert_suite.cli", "dashboard", "--storage", url, "--port",
                                  str(port)], stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/dashboard"), 60, "the dashboard to answer")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as response:
            studies = json.loads(response.read())["study_summaries"]
        assert [s["study_name"] for s in studies] == ["rte-grid-pg"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}",
                                    timeout=10) as response:
            (served,) = json.loads(response.read())["trials"]
        assert [(p["name"], float(p["param_external_value"])) for p in served["params"]] == [("learning_rate", 1e-3)]
        assert [(v["step"], float(v["value"])) for v in served["intermediate_values"]] == [(1, 0.7), (2, 0.75)]
        assert {"key": "task", "value": "rte"} in served["user_attrs"] and served["state"] == "Complete"
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)
    assert "(study rte-grid-pg;" in (tmp_path / "dashboard.log").read_text()


def test_refusals_name_the_folder_the_url_and_the_port(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("not a grid")
    with pytest.raises(DashboardError, match=r"no grid study \(no grid\.db; found: notes\.txt\).*--output_dir of a"):
        serve(str(tmp_path))
    with pytest.raises(DashboardError) as err:
        serve(None, storage="postgresql+psycopg://grid:secret@127.0.0.1:1/db")
    assert "127.0.0.1:1/db" in str(err.value) and "secret" not in str(err.value) and "cannot read" in str(err.value)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DashboardError, match=rf"--port {port}: 127\.0\.0\.1:{port} is in use"):
            check_port("127.0.0.1", port)
    with pytest.raises(DashboardError, match=r"--port 70000: expected a port number from 1 to 65535"):
        check_port("127.0.0.1", 70000)
    with pytest.raises(DashboardError, match=r"give one, the grid's output folder or the --storage URL"):
        serve(str(tmp_path), storage="sqlite:///x.db")
    with pytest.raises(DashboardError, match=r"--storage sqlite:///\S*missing\.db: no such database file"):
        serve(None, storage=f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()  # a mistyped path creates no empty database
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)
    (tmp_path / "grid.db").write_text("")  # past the folder check, to the import
    with pytest.raises(DashboardError, match=r'pip install "bert_suite\[dashboard\]"'):
        serve(str(tmp_path))
