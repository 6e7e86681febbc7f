"""The Ray engine on a local Ray instance of 2 CPUs: the local engine's output, and lost work retried.

One Ray instance for the whole module (starting one takes seconds), and few runs, so CI stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chatcodec.dataset import Formatter, format_dataset
from chatcodec.dataset.engines import ray_results
from chatcodec.dataset.readers import plan
from chatcodec.dataset.shards import run_shard

from ..conftest import SHARED, require_shared
from .test_dataset import BAD, GOOD, TEMPLATE, _chat

ray = pytest.importorskip("ray")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    require_shared()
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import the tests package
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good and bad rows of every kind, several shards' worth."""
    folder = tmp_path_factory.mktemp("ray")
    rows: list[Any] = []
    for index in range(40):
        rows.append({"id": f"row{index}", "messages": _chat(f"Question {index}: " + "why " * (index % 9), "Because.")})
        if index % 4 == 0:
            rows.append(BAD[(index // 4) % len(BAD)][0])
    rows += GOOD
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    (folder / "rows.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "template.jinja").write_text(TEMPLATE, encoding="utf-8")
    return folder


def _options(folder: Path) -> dict[str, Any]:
    return dict(
        tokenizer=SHARED / "tokenizers" / "qwen3", template=folder / "template.jinja", content_special_tokens="reject",
        max_length=48, shard_rows=8,
    )  # fmt: skip


def test_ray_output_equals_the_local_engine(local_ray: None, dataset: Path, tmp_path: Path) -> None:
    for pack in (None, 96):
        local = format_dataset(dataset / "rows.jsonl", tmp_path / "local.parquet", workers=1, pack=pack,
                               **_options(dataset))  # fmt: skip
        remote = format_dataset(dataset / "rows.jsonl", tmp_path / "ray.parquet", engine="ray", pack=pack,
                                **_options(dataset))  # fmt: skip
        assert pq.read_table(tmp_path / "ray.parquet").equals(pq.read_table(tmp_path / "local.parquet"))
        assert (tmp_path / "ray.rejects.jsonl").read_text() == (tmp_path / "local.rejects.jsonl").read_text()
        assert remote == local and local.rows_out >= 40 and local.rejected_total >= 10


class KillOnce(Formatter):
    """Kills its own worker process at one row, the first time only (a marker file remembers it)."""

    def __init__(self, *args: Any, victim: str, marker: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.marker = victim, marker

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "victim": self.victim, "marker": self.marker}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.victim, self.marker = state.pop("victim"), state.pop("marker")
        super().__setstate__(state)

    def format(self, row: Any, row_id: str) -> Any:
        if row_id == self.victim and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()), encoding="utf-8")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().format(row, row_id)


def test_a_killed_worker_is_retried_without_losing_or_repeating_rows(
    local_ray: None, dataset: Path, tmp_path: Path
) -> None:
    options = _options(dataset)
    shard_rows = options.pop("shard_rows")
    tokenizer = options.pop("tokenizer")
    marker = tmp_path / "killed"
    killer = KillOnce(tokenizer, victim="row20", marker=str(marker), **options)
    shards = plan(dataset / "rows.jsonl", shard_rows=shard_rows)
    results = list(ray_results(shards, killer, None))
    assert marker.exists() and int(marker.read_text()) != os.getpid()  # a Ray worker really died mid-shard
    plain = Formatter(tokenizer, **options)
    expected = [run_shard(shard, plain) for shard in shards]
    assert [r.index for r in results] == [s.index for s in shards]
    for got, want in zip(results, expected, strict=True):
        assert got.table.equals(want.table) and got.rejects == want.rejects and got.summary == want.summary
    ids = [i for r in results for i in r.table.column("id").to_pylist()]
    assert len(ids) == len(set(ids)) and "row20" in ids
