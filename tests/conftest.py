"""Test-wide settings: offline, quiet, caches inside the test run, parity figures in the summary; and the
fixtures that several test modules use (pytest finds them here without imports)."""

import atexit
import os
import shutil
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_EVALUATE_OFFLINE"] = "1"
os.environ["TRANSFORMERS_VERBOSITY"] = "error"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
if "HF_HOME" not in os.environ:  # a cache of the run's own, removed at exit (one per pytest process)
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="bert_suite_hf_home_")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
# The same numbers on every machine: `auto` would train in bf16 on a CPU with native bf16 and in fp32 on
# one without, so the suite pins fp32 (subprocesses inherit it); tests/test_precision.py tests auto itself
# (both kinds of CPU) and runs bf16 explicitly. BERT_SUITE_PRECISION=bf16 make test runs everything in bf16.
os.environ.setdefault("BERT_SUITE_PRECISION", "fp32")
# `make test` runs two workers (pytest-xdist), each on one core: one thread each, and so the processes they start
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"

import socket  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from huggingface_hub import constants  # noqa: E402

from bert_suite import hub  # noqa: E402
from helpers import FakeApi, write_pretrain_setup  # noqa: E402

torch.set_num_threads(1 if XDIST_WORKER else min(2, torch.get_num_threads()))

# Figures that tests report (name -> value); printed at the end of the run (a worker's go to the controller).
REPORTED: dict[str, str] = {}


def pytest_sessionfinish(session):
    if XDIST_WORKER and hasattr(session.config, "workeroutput"):
        session.config.workeroutput["bert_suite_figures"] = dict(REPORTED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    REPORTED.update(getattr(node, "workeroutput", {}).get("bert_suite_figures", {}))


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


# Fixtures that several test modules use (shared builders and constants are in helpers.py).


@pytest.fixture(scope="module")
def pretrain_setup(tmp_path_factory):
    """A corpus where documents have their own topic words, its vocabulary and NSP instances."""
    return write_pretrain_setup(tmp_path_factory.mktemp("pretrain"))


@pytest.fixture
def online(monkeypatch):
    """Online mode as far as push_to_hub can tell, with HfApi faked so nothing reaches the network."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HfApi", FakeApi)
    monkeypatch.setattr(FakeApi, "calls", [])
    monkeypatch.setattr(FakeApi, "fail_with", None)
    return FakeApi


@pytest.fixture(scope="module")
def offline_evaluate(tmp_path_factory):
    """`load(name, config_name=None)`: `evaluate.load` of a module shipped in bert_suite/metrics, with
    evaluate's caches in a tmp dir and the network cut (a connection attempt fails the test)."""
    evaluate = pytest.importorskip("evaluate")
    from bert_suite.metrics import evaluate_module_path

    cache = tmp_path_factory.mktemp("hf_cache")
    # evaluate resolves its cache folders from HF_HOME when it is imported, so setting the env now
    # would be too late; its config attributes are read at each load, so patch those instead.
    # The modules cache is also put on sys.path and imported as the package `evaluate_modules`,
    # whose location is fixed once imported: start from, and leave behind, a clean slate.
    saved_modules = {k: sys.modules.pop(k) for k in list(sys.modules) if k.split(".")[0] == "evaluate_modules"}
    attempts = []

    def no_network(target, *args, **kwargs):
        attempts.append(target)
        raise OSError(f"network access attempted: {target}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluate.config, "HF_MODULES_CACHE", cache / "modules")
        mp.setattr(evaluate.config, "HF_METRICS_CACHE", cache / "metrics")
        mp.setattr(sys, "path", list(sys.path))
        # Name lookups too: without them a connection by host name fails before any connect().
        mp.setattr(socket, "getaddrinfo", no_network)
        mp.setattr(socket.socket, "connect", lambda sock, address: no_network(address))
        yield lambda name, config_name=None: evaluate.load(evaluate_module_path(name), config_name)
    for k in [k for k in sys.modules if k.split(".")[0] == "evaluate_modules"]:
        del sys.modules[k]
    sys.modules.update(saved_modules)
    assert attempts == []


# A real PostgreSQL server for the tests of Optuna storages shared by several grid workers.

POSTGRES_BIN = "/usr/lib/postgresql/15/bin"
POSTGRES_TEST_DB = "bert_suite_test"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_url():
    """`postgresql+psycopg://postgres@127.0.0.1:PORT/bert_suite_test`: a PostgreSQL 15 server of its own
    (a temporary data folder, 127.0.0.1 on a free port, trust authentication, fsync off), started once
    per session (about 1.5 s) and stopped at the end. The explicit `+psycopg` driver names psycopg 3
    whatever the SQLAlchemy version (SQLAlchemy < 2.1 maps a plain `postgresql://` to psycopg2).
    As root the server runs as the `postgres` user (it refuses root); as any other user, as that user.
    Skipped where the server binaries, the `postgres` user (as root) or psycopg are missing."""
    import importlib.util
    import pwd
    import shlex
    import shutil
    import subprocess
    import time

    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg not installed: pip install 'bert-suite[postgres]'")
    missing = [b for b in ("initdb", "pg_ctl", "postgres") if not os.access(os.path.join(POSTGRES_BIN, b), os.X_OK)]
    if missing:
        pytest.skip(f"PostgreSQL 15 server binaries not found in {POSTGRES_BIN} ({', '.join(missing)}): "
                    "install the postgresql-15 package")
    as_postgres = os.geteuid() == 0
    if as_postgres:
        try:
            pg_user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` system user to run the PostgreSQL server as")

    import psycopg

    def run(*args: str) -> subprocess.CompletedProcess:
        cmd = [os.path.join(POSTGRES_BIN, args[0]), *args[1:]]
        if as_postgres:
            cmd = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(cmd)]
        # stdin closed and the server's output in its log file, so that nothing holds our pipes open.
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)

    root = tempfile.mkdtemp(prefix="bs_pg_")  # short: the socket path must stay under ~107 characters
    if as_postgres:
        os.chown(root, pg_user.pw_uid, pg_user.pw_gid)
    os.chmod(root, 0o700)
    data, log = os.path.join(root, "data"), os.path.join(root, "server.log")
    started = False
    try:
        t0 = time.perf_counter()
        done = run("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
        if done.returncode != 0:
            pytest.fail(f"initdb failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        for _attempt in range(3):  # another process may take the free port between its choice and the bind
            port = _free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={data} "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            done = run("pg_ctl", "-D", data, "-l", log, "-w", "-t", "30", "-o", options, "start")
            if done.returncode == 0:
                started = True
                break
            server_log = open(log).read() if os.path.exists(log) else ""
            if "could not bind" not in server_log and "already in use" not in server_log:
                break
        if not started:
            pytest.fail(f"PostgreSQL did not start ({done.returncode}):\n{done.stdout}\n{done.stderr}\n{server_log}")
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {POSTGRES_TEST_DB}")
        REPORTED["PostgreSQL fixture start-up (initdb + start + createdb)"] = f"{time.perf_counter() - t0:.2f} s"
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/{POSTGRES_TEST_DB}"
    finally:
        if started:
            run("pg_ctl", "-D", data, "-m", "immediate", "stop")
        # A database is 8 MB of small files, and the run makes a dozen: removing them took 5-13 s on a slow disk
        # at the very end of the run, so a process of its own removes them while pytest exits.
        try:
            subprocess.Popen(["rm", "-rf", root], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            shutil.rmtree(root, ignore_errors=True)
