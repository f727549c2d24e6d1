"""Hostile case 9: two filters that print the same are two filters.

``str()`` of a pyarrow expression abbreviates an ``is_in`` of 22 or more values to its
first and last ten, and the library identified filters by that text. A metadata cache
pruned for one filter was then reused for the other (rows missing), a resume state saved
with one filter loaded into a loader with the other, and ``reshard`` with the second
filter reported the first filter's output as "done before". Every filter identity is now
a digest of the serialized expression (``storage/expressions.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from torch_dataloader_utils import DestinationConflictError, StateMismatchError, create_dataloader, reshard

HEAD, TAIL = list(range(10)), list(range(990, 1000))
VALUES_A = [*HEAD, 150, 151, *TAIL]
VALUES_B = [*HEAD, 550, 551, *TAIL]
FILTER_A = pc.field("id").isin(VALUES_A)
FILTER_B = pc.field("id").isin(VALUES_B)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """1,000 ids in one file of 10 row groups of 100 (row-group statistics prune by id)."""
    root = tmp_path / "data"
    root.mkdir()
    pq.write_table(
        pa.table({"id": pa.array(np.arange(1000), pa.int64())}), root / "a.parquet", row_group_size=100
    )
    return root


def _ids(loader: object) -> list[int]:
    return sorted(i for batch in loader for i in batch["id"].tolist())  # type: ignore[attr-defined]


def test_the_two_filters_print_the_same_but_have_different_keys() -> None:
    from torch_dataloader_utils.storage.expressions import filter_key

    assert str(FILTER_A) == str(FILTER_B)
    assert filter_key(FILTER_A) != filter_key(FILTER_B)
    assert filter_key(FILTER_A) == filter_key(pc.field("id").isin(list(VALUES_A)))


def test_case_9_metadata_cache_of_one_filter_is_not_used_for_the_other(data: Path, tmp_path: Path) -> None:
    cache = tmp_path / "meta.arrow"
    loader, _ = create_dataloader(str(data), filters=FILTER_A, metadata_cache=str(cache), num_workers=0)
    assert _ids(loader) == sorted(VALUES_A)
    with pytest.warns(UserWarning, match="another filter that prints the same"):
        loader, _ = create_dataloader(str(data), filters=FILTER_B, metadata_cache=str(cache), num_workers=0)
    assert _ids(loader) == sorted(VALUES_B)


def test_case_9_resume_state_of_one_filter_does_not_load_with_the_other(data: Path) -> None:
    loader, _ = create_dataloader(str(data), filters=FILTER_A, batch_size=4, num_workers=0)
    batches = iter(loader)
    next(batches)
    state = loader.dataset.state_dict()
    other, _ = create_dataloader(str(data), filters=FILTER_B, batch_size=4, num_workers=0)
    with pytest.raises(StateMismatchError, match="option filters_sha256"):
        other.load_state_dict(state)
    same, _ = create_dataloader(str(data), filters=FILTER_A, batch_size=4, num_workers=0)
    same.load_state_dict(state)  # the same filter still resumes


def test_case_9_reshard_with_the_other_filter_is_not_done_before(data: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out"
    first = reshard(str(data), str(dst), filters=FILTER_A)
    assert first.num_rows == len(VALUES_A)
    with pytest.raises(DestinationConflictError, match="filters_sha256"):
        reshard(str(data), str(dst), filters=FILTER_B)
    again = reshard(str(data), str(dst), filters=FILTER_A)
    assert again.shards_written == 0


def test_a_state_saved_before_filters_had_a_key_still_loads_when_its_text_is_whole(data: Path) -> None:
    small = pc.field("id") < 20
    loader, _ = create_dataloader(str(data), filters=small, batch_size=4, num_workers=0)
    next(iter(loader))
    state = loader.dataset.state_dict()
    del state["fingerprint"]["options"]["filters_sha256"]  # as an older version saved it
    again, _ = create_dataloader(str(data), filters=small, batch_size=4, num_workers=0)
    again.load_state_dict(state)
    assert _ids(again) == list(range(4, 20))
