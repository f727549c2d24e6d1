"""``inspect`` / ``simulate`` predict the requests of a job, and the prediction meets the server's log."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import torch_dataloader_utils.discovery.dataset as discovery_dataset
from tests.fixtures.s3 import S3Server
from tests.fixtures.stores import ServerLog
from tests.io.test_requests import FILES, GROUP_ROWS, GROUPS, ROWS, fresh_data
from torch_dataloader_utils import create_dataloader
from torch_dataloader_utils.cli import main
from torch_dataloader_utils.storage.requests import RequestCounts
from torch_dataloader_utils.tools.cost import predict_requests
from torch_dataloader_utils.tools.plan import plan_of


def _kinds(counts: RequestCounts) -> Counter[str]:
    return +Counter({"LIST": counts.lists, "HEAD": counts.heads, "GET": counts.gets, "PUT": counts.puts})


def _predicted_and_measured(
    server: S3Server, log: ServerLog, ranks: int, workers: int, **options: Any
) -> tuple[RequestCounts, Counter[str]]:
    """Every rank builds its dataset alone and reads one epoch; the prediction of rank 0's dataset."""
    prefix = fresh_data(server)
    log.clear()
    predicted: RequestCounts | None = None
    ids: list[int] = []
    for rank in range(ranks):
        options.setdefault("split_rows", GROUP_ROWS)
        loader, dataset = create_dataloader(
            f"s3://{prefix}",
            storage_options=server.options(),
            num_ranks=ranks,
            rank=rank,
            num_workers=workers,
            batch_size=500,
            output_format="arrow",
            **({"multiprocessing_context": "fork"} if workers else {}),
            **options,
        )
        if predicted is None:
            view = plan_of(dataset, 0, max(1, workers))
            plan = predict_requests(
                dataset,
                view.chunks_for,
                ranks,
                workers,
                startup=dataset.metrics.discovery_requests,
                process_group=False,
            )
            predicted = plan.total()
        ids.extend(i for batch in loader for i in batch.column("id").to_pylist())
    assert sorted(ids) == list(range(ROWS))
    assert predicted is not None
    return predicted, log.counts()


@pytest.mark.slow
@pytest.mark.parametrize("columns", [None, ["id", "b"]], ids=["all_columns", "a_gap"])
def test_the_prediction_is_what_the_server_receives(
    moto_server: S3Server, moto_log: ServerLog, columns: list[str] | None
) -> None:
    predicted, seen = _predicted_and_measured(moto_server, moto_log, 2, 2, columns=columns)
    assert _kinds(predicted) == seen  # footers in hand: exact


@pytest.mark.slow
def test_readers_fetching_footers_are_predicted_within_five_percent(
    moto_server: S3Server, moto_log: ServerLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dataset whose footers are not handed to the readers: each reading process fetches them."""
    monkeypatch.setattr(discovery_dataset, "KEEP_FOOTERS_FILES", 2)  # fewer than FILES
    predicted, seen = _predicted_and_measured(moto_server, moto_log, 1, 2, split_rows=2 * GROUP_ROWS)
    assert seen["HEAD"] == 0
    assert seen["GET"] > 1 + FILES + FILES * GROUPS // 2  # the readers read footers too
    assert abs(predicted.total - sum(seen.values())) <= 0.05 * sum(seen.values())
    assert _kinds(predicted) == seen  # here the model is exact too (all columns, whole row groups)


@pytest.mark.slow
def test_inspect_prices_the_requests(
    moto_server: S3Server, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    prefix = fresh_data(moto_server)
    endpoint = moto_server.options()
    args = [
        "inspect",
        f"s3://{prefix}",
        "--num-ranks",
        "2",
        "--num-workers",
        "2",
        "--split-rows",
        str(GROUP_ROWS),
    ]
    args += ["--batch-size", "500"]
    for key in ("key", "secret", "endpoint_url"):
        args += ["--storage-option", f"{key}={endpoint[key]}"]
    args += ["--price-per-1000", "0.4", "--list-price-per-1000", "5"]
    assert main(args) == 0
    text = capsys.readouterr().out
    # Building it: the manifest probe, one listing page, the footers, and one more footer
    # (the first file's, read by rank 1): 1 LIST at 5 and 7 GETs at 0.4 per 1,000.
    assert "building the dataset: 8 requests (1 LIST, 0 HEAD, 7 GET, 0 PUT)" in text
    assert f"cost {(5 + 7 * 0.4) / 1000:.6g}" in text
    # One epoch: every row group once, one GET each (all columns are adjacent), no HEAD.
    assert f"one epoch: {FILES * GROUPS} requests (0 LIST, 0 HEAD, {FILES * GROUPS} GET, 0 PUT)" in text
    assert f"cost {FILES * GROUPS * 0.4 / 1000:.6g}" in text
