"""Running the data pipeline's parts on a Dask cluster (`--dask_scheduler ADDRESS`), as NVIDIA's BERT
data pipeline (LDDL) does: the parts are ordinary functions of this package, sent as Dask tasks, and
their results come back in task order, so the output is the single-machine run's. Every worker must
see the input files (and, for `pretrain-data`, the output folder) at the same paths: a shared file
system, as on any cluster that trains on one corpus.
"""

from __future__ import annotations


def dask_client(address: str, timeout: str | None = None):
    """A client of the Dask scheduler at `address`; a clear error when Dask is not installed or no
    scheduler answers there within `timeout` (default: Dask's connect timeout, 30 s, set with
    DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT)."""
    try:
        from distributed import Client
    except ImportError:
        raise ValueError(f"--dask_scheduler {address}: Dask is not installed; pip install \"bert_suite[cluster]\"") \
            from None
    try:
        client = Client(address, **({"timeout": timeout} if timeout else {}))  # no timeout: Dask's configured one
    except (OSError, TimeoutError) as err:
        raise ValueError(f"--dask_scheduler {address}: no Dask scheduler answered ({err}); start one with "
                         "`dask scheduler` and workers with `dask worker ADDRESS`, or leave the flag out to run on "
                         "this machine") from None
    if not client.scheduler_info().get("workers"):
        client.wait_for_workers(1, timeout=60)
    return client


def run_in_order(client, function, *iterables, **kwargs):
    """function(*args, **kwargs) for each row of `iterables`, as Dask tasks; yields the results in
    the rows' order, releasing each task's result as soon as it is taken."""
    futures = client.map(function, *iterables, pure=False, **kwargs)
    for future in futures:
        yield future.result()
        future.release()


def total_threads(client) -> int:
    return sum(client.nthreads().values())
