"""Where shards run: this process, a pool of worker processes, or Ray Data.

Each engine takes the planned shards and yields their :class:`ShardResult` in shard order, so the
output is the same row for row whichever engine made it.

* **local**: ``workers`` processes (spawned, so no thread state is forked), each loading the codec once;
  at most two shards per worker are in flight, so memory stays flat however large the input;
* **ray**: Ray Data, ``from_items(shards) -> map_batches(format) -> iter_batches``, on the cluster
  ``ray.init()`` finds (``RAY_ADDRESS``) or a local instance. A shard whose worker dies is run again by
  Ray (Ray Data retries tasks lost to system failures); its result is whole or absent, so no row is lost
  or repeated. A formatting error never fails a task: it is a reject.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ..exceptions import ChatcodecError, InputError
from .formatting import Formatter
from .readers import Shard
from .shards import ShardResult, run_shard

__all__ = ["ENGINES", "local_results", "one_thread_each", "ray_results"]

ENGINES = ("local", "ray")

#: in each worker process: the formatters seen, so that a codec is loaded once per process, not per shard
_FORMATTERS: dict[tuple[str, ...], Formatter] = {}


def _cached(formatter: Formatter) -> Formatter:
    kind = type(formatter)
    key = (kind.__module__, kind.__qualname__, repr(formatter.__getstate__()))
    return _FORMATTERS.setdefault(key, formatter)


# --- local ------------------------------------------------------------------------------------------


def one_thread_each() -> None:
    """A worker process is one core's worth: the tokenizers library must not start a thread pool in each.

    Its pool spins while it waits, which on a busy machine costs more CPU than it saves.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _work(shard: Shard, formatter: Formatter, pack_length: int | None) -> ShardResult:
    return run_shard(shard, _cached(formatter), pack_length)


def local_results(
    shards: Sequence[Shard], formatter: Formatter, pack_length: int | None, *, workers: int
) -> Iterator[ShardResult]:
    """Run the shards in this process (``workers=1``) or in a pool of worker processes, in order."""
    if workers < 1:
        raise InputError(f"workers must be at least 1, not {workers}.")
    if workers == 1 or len(shards) <= 1:
        for shard in shards:
            yield run_shard(shard, formatter, pack_length)
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=min(workers, len(shards)), mp_context=context, initializer=one_thread_each
    ) as pool:
        pending: deque[Future[ShardResult]] = deque()
        upcoming = iter(shards)
        try:
            for shard in upcoming:
                pending.append(pool.submit(_work, shard, formatter, pack_length))
                if len(pending) >= 2 * workers:
                    break
            while pending:
                result = pending.popleft().result()
                following = next(upcoming, None)
                if following is not None:
                    pending.append(pool.submit(_work, following, formatter, pack_length))
                yield result
        except BrokenProcessPool:
            raise ChatcodecError(
                "A worker process died (killed, or out of memory); nothing after the last finished shard was written."
                " Run again with fewer --workers, or with --engine ray, which retries lost work."
            ) from None
        finally:
            for future in pending:
                future.cancel()


# --- ray --------------------------------------------------------------------------------------------


def _ray_batch(batch: Any, *, formatter: Formatter, pack_length: int | None) -> Any:
    import pyarrow as pa

    one_thread_each()
    results = []
    for data in batch.column("shard").to_pylist():
        result = run_shard(pickle.loads(data), _cached(formatter), pack_length)
        results.append(pickle.dumps(result, protocol=5))
    return pa.table({"result": pa.array(results, pa.binary())})


def ray_results(shards: Sequence[Shard], formatter: Formatter, pack_length: int | None) -> Iterator[ShardResult]:
    """Run the shards on Ray Data, in order: a task per shard, run again by Ray if its worker dies."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise InputError("The Ray engine needs Ray Data: pip install 'chatcodec[ray]'.") from None
    from functools import partial

    if not shards:
        return
    if not ray.is_initialized():
        ray.init(logging_level=logging.ERROR, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    items = [{"shard": pickle.dumps(shard)} for shard in shards]
    dataset = ray.data.from_items(items, override_num_blocks=len(shards))
    formatted = dataset.map_batches(
        partial(_ray_batch, formatter=formatter, pack_length=pack_length),
        batch_size=1,
        batch_format="pyarrow",
    )
    batch: Any
    for batch in formatted.iter_batches(batch_size=None, batch_format="pyarrow"):
        for data in batch.column("result").to_pylist():
            yield pickle.loads(data)
