"""`bert-suite dashboard RUN_DIR`: a grid's Optuna study in the browser (optuna-dashboard), while its workers
run or after: every trial's parameters, state and dev metric, and the learning curve each trial reports
epoch by epoch (grid._EpochReporter), with the task, metric, seed, run folder and a failed trial's reason
as user attributes. The dependency is the `dashboard` extra: pip install "bert_suite[dashboard]"."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

EXTRA = 'pip install "bert_suite[dashboard]"'


class DashboardError(ValueError):
    """The dashboard cannot start; the message names the folder, URL (without its password) or port."""


def study_storage(run_dir: str | None, storage: str | None) -> str:
    """The storage URL to serve: --storage, else the grid.db a `bert-suite grid` writes into its folder."""
    if storage and run_dir:
        raise DashboardError(f"{run_dir} and --storage {storage.split('@')[-1]}: give one, the grid's output folder "
                             "or the --storage URL its workers share")
    if storage:
        if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).is_file():
            raise DashboardError(f"--storage {storage}: no such database file; expected the grid's grid.db (or "
                                 "the --storage the grid was given)")
        return storage
    if run_dir is None:
        raise DashboardError("give the grid's output folder (RUN_DIR) or --storage URL")
    folder = Path(run_dir)
    database = folder / "grid.db"
    if not database.is_file():
        found = ", ".join(sorted(p.name for p in folder.iterdir())[:6]) if folder.is_dir() else "no such folder"
        raise DashboardError(f"{run_dir}: no grid study (no grid.db; found: {found or 'nothing'}); expected the "
                             "--output_dir of a `bert-suite grid` run, or --storage URL for a grid stored elsewhere")
    return f"sqlite:///{database.resolve()}"


def open_storage(url: str):
    """The study storage, read-only in spirit (the dashboard writes notes only); an unreachable or unreadable
    storage is an error naming the URL without its password."""
    import optuna

    from .grid import engine_kwargs, safe_url

    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs(url), skip_table_creation=True) \
            if "://" in url else None
        if storage is None:
            raise ValueError("not a database URL")
        summaries = optuna.get_all_study_summaries(storage)
    except Exception as err:  # the driver's own error, said in one line
        reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise DashboardError(f"--storage {safe_url(url)}: cannot read the grid study there ({reason}); expected "
                             "a reachable database that a `bert-suite grid` wrote") from None
    return storage, summaries


def check_port(host: str, port: int) -> None:
    """Bind once to see that the port is free: the server's own failure would come after the URL was printed."""
    if not 1 <= port <= 65535:
        raise DashboardError(f"--port {port}: expected a port number from 1 to 65535")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is not "in use"
        try:
            probe.bind((host, port))
        except OSError as err:
            what = "is in use" if err.errno == errno.EADDRINUSE else f"cannot be opened ({err.strerror})"
            raise DashboardError(f"--port {port}: {host}:{port} {what}; expected a free port (e.g. --port "
                                 f"{port + 1})") from None


def serve(run_dir: str | None, storage: str | None = None, study_name: str | None = None, host: str = "127.0.0.1",
          port: int = 8080, log=print) -> None:
    """Serve the grid's study until interrupted (Ctrl-C)."""
    url = study_storage(run_dir, storage)
    try:
        import optuna_dashboard
    except ImportError:
        raise DashboardError(f"dashboard needs optuna-dashboard: {EXTRA}") from None
    backend, summaries = open_storage(url)
    names = [s.study_name for s in summaries]
    if study_name and study_name not in names:
        from .grid import safe_url

        raise DashboardError(f"--study_name {study_name}: no such study in {safe_url(url)} (studies: "
                             f"{', '.join(names) or 'none'})")
    if not names:
        raise DashboardError(f"{run_dir or url}: the storage holds no study yet; expected a grid that has started")
    check_port(host, port)
    newest = max(summaries, key=lambda s: s._study_id)
    shown = study_name or newest.study_name
    study_id = next(s._study_id for s in summaries if s.study_name == shown)
    address = f"[{host}]" if ":" in host else host
    log(f"optuna-dashboard for {run_dir or 'the grid'}: http://{address}:{port}/dashboard/studies/{study_id} "
        f"(study {shown}; {len(names)} in the storage; Ctrl-C stops it)")
    optuna_dashboard.run_server(backend, host=host, port=port)
