"""BatchConverter: every row of the type table; nulls; packing for worker transfers."""

from __future__ import annotations

import datetime as dt
import decimal
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch

from torch_dataloader_utils.config import OutputConfig, OutputFormat
from torch_dataloader_utils.convert import BatchConverter
from torch_dataloader_utils.errors import ConversionError, NullValueError
from torch_dataloader_utils.transfer import PackedBatch, pack

TORCH = OutputFormat.TORCH
NUMPY = OutputFormat.NUMPY


def _conv(batch: pa.RecordBatch, output: OutputFormat = TORCH, null_fill: object = None) -> dict:  # type: ignore[type-arg]
    return BatchConverter(batch.schema, OutputConfig(output_format=output, null_fill=null_fill))(batch)  # type: ignore[no-any-return]


def _one(array: pa.Array, output: OutputFormat = TORCH, null_fill: object = None) -> object:  # type: ignore[type-arg]
    return _conv(pa.record_batch([array], ["c"]), output, null_fill)["c"]


@pytest.mark.parametrize(
    ("arrow_type", "torch_dtype"),
    [
        (pa.int8(), torch.int8),
        (pa.int16(), torch.int16),
        (pa.int32(), torch.int32),
        (pa.int64(), torch.int64),
        (pa.uint8(), torch.uint8),
        (pa.float16(), torch.float16),
        (pa.float32(), torch.float32),
        (pa.float64(), torch.float64),
    ],
)
def test_numbers_keep_their_dtype(arrow_type: pa.DataType, torch_dtype: torch.dtype) -> None:
    array = pa.array([1, 2, 3], pa.int64()).cast(arrow_type)
    t = _one(array)
    assert isinstance(t, torch.Tensor)
    assert t.dtype == torch_dtype
    assert t.tolist() == [1, 2, 3]
    n = _one(array, NUMPY)
    assert isinstance(n, np.ndarray)
    assert n.tolist() == [1, 2, 3]


def test_numeric_conversion_is_zero_copy() -> None:
    array = pa.array(np.arange(1000, dtype=np.int64))
    t = _one(array)
    assert isinstance(t, torch.Tensor)
    assert t.data_ptr() == array.buffers()[1].address
    n = _one(array, NUMPY)
    assert isinstance(n, np.ndarray)
    assert n.ctypes.data == array.buffers()[1].address


def test_sliced_array_is_zero_copy_at_its_offset() -> None:
    array = pa.array(np.arange(100, dtype=np.float32)).slice(10, 20)
    t = _one(array)
    assert isinstance(t, torch.Tensor)
    assert t.tolist() == list(range(10, 30))
    assert t.data_ptr() == array.buffers()[1].address + 10 * 4


def test_bool() -> None:
    t = _one(pa.array([True, False, True]))
    assert isinstance(t, torch.Tensor)
    assert t.dtype == torch.bool
    assert t.tolist() == [True, False, True]
    assert _one(pa.array([True, False]), NUMPY).dtype == np.bool_  # type: ignore[attr-defined]


def test_strings_and_binary() -> None:
    assert _one(pa.array(["a", "bé", ""])) == ["a", "bé", ""]
    assert _one(pa.array(["a", "b"], pa.large_string())) == ["a", "b"]
    assert _one(pa.array([b"\x00", b"xy"])) == [b"\x00", b"xy"]
    n = _one(pa.array(["a", "b"]), NUMPY)
    assert isinstance(n, np.ndarray)
    assert n.dtype == object
    assert n.tolist() == ["a", "b"]


def test_strings_keep_nulls_as_none() -> None:
    assert _one(pa.array(["a", None])) == ["a", None]


def test_dictionary_strings_are_decoded() -> None:
    array = pa.array(["x", "y", "x"]).dictionary_encode()
    assert _one(array) == ["x", "y", "x"]


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamps_are_int64_in_their_unit(unit: str) -> None:
    moment = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    array = pa.array([moment, None], pa.timestamp(unit, tz="UTC")).fill_null(0)
    t = _one(array)
    assert isinstance(t, torch.Tensor)
    assert t.dtype == torch.int64
    per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
    assert t.tolist() == [int(moment.timestamp()) * per_second, 0]


def test_date32_is_int32_days() -> None:
    t = _one(pa.array([dt.date(1970, 1, 1), dt.date(2000, 3, 1)], pa.date32()))
    assert isinstance(t, torch.Tensor)
    assert t.dtype == torch.int32
    assert t.tolist() == [0, (dt.date(2000, 3, 1) - dt.date(1970, 1, 1)).days]


def test_duration_is_int64() -> None:
    t = _one(pa.array([dt.timedelta(seconds=2)], pa.duration("ms")))
    assert isinstance(t, torch.Tensor)
    assert t.tolist() == [2000]


def test_fixed_size_list_is_2d() -> None:
    array = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float32(), 2))
    t = _one(array)
    assert isinstance(t, torch.Tensor)
    assert t.shape == (3, 2)
    assert t.dtype == torch.float32
    assert t.tolist() == [[1, 2], [3, 4], [5, 6]]
    n = _one(array, NUMPY)
    assert isinstance(n, np.ndarray)
    assert n.shape == (3, 2)


def test_fixed_size_list_of_a_slice() -> None:
    array = pa.array([[i, i] for i in range(6)], pa.list_(pa.int64(), 2)).slice(2, 3)
    t = _one(array)
    assert isinstance(t, torch.Tensor)
    assert t.tolist() == [[2, 2], [3, 3], [4, 4]]


def test_variable_list_is_a_jagged_nested_tensor_by_default() -> None:
    array = pa.array([[1, 2, 3], [], [4]], pa.list_(pa.int64()))
    out = _one(array)
    assert isinstance(out, torch.Tensor)
    assert out.is_nested
    assert out.layout is torch.jagged
    assert out.values().dtype == torch.int64
    assert out.values().tolist() == [1, 2, 3, 4]
    assert out.offsets().tolist() == [0, 3, 3, 4]
    n = _one(array, NUMPY)  # numpy keeps its object array of arrays
    assert isinstance(n, np.ndarray)
    assert n.dtype == object
    assert [a.tolist() for a in n] == [[1, 2, 3], [], [4]]


def test_variable_list_of_a_slice() -> None:
    array = pa.array([[0], [1, 1], [2, 2, 2], [3]], pa.list_(pa.int32())).slice(1, 2)
    out = _one(array)
    assert isinstance(out, torch.Tensor)
    assert out.values().tolist() == [1, 1, 2, 2, 2]
    assert out.offsets().tolist() == [0, 2, 5]
    n = _one(array, NUMPY)
    assert [a.tolist() for a in n] == [[1, 1], [2, 2, 2]]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("array", "kind"),
    [
        (pa.array([decimal.Decimal("1.5")], pa.decimal128(4, 1)), "decimal128"),
        (pa.array([{"a": 1}]), "struct"),
        (pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())), "map"),
        (pa.array([["a"]], pa.list_(pa.string())), "list<item: string>"),
        (pa.array([[[1]]], pa.list_(pa.list_(pa.int32()))), "variable-length lists"),
    ],
)
@pytest.mark.parametrize("output", [TORCH, NUMPY])
def test_unsupported_types_fail_at_construction(array: pa.Array, kind: str, output: OutputFormat) -> None:  # type: ignore[type-arg]
    schema = pa.schema([pa.field("bad", array.type)])
    with pytest.raises(ConversionError, match=r"column 'bad' has type") as exc:
        BatchConverter(schema, OutputConfig(output_format=output))
    assert kind in str(exc.value)
    assert "output_format='arrow'" in str(exc.value)
    assert f"output_format={output.value!r}" in str(exc.value)


def test_arrow_and_dict_outputs_hold_everything() -> None:
    batch = pa.record_batch(
        [
            pa.array([decimal.Decimal("1.5"), None], pa.decimal128(4, 1)),
            pa.array([{"a": 1}, None]),
            pa.array([1, None]),
        ],
        ["d", "s", "n"],
    )
    assert BatchConverter(batch.schema, OutputConfig(output_format=OutputFormat.ARROW))(batch) is batch
    out = BatchConverter(batch.schema, OutputConfig(output_format=OutputFormat.DICT))(batch)
    assert out == {"d": [decimal.Decimal("1.5"), None], "s": [{"a": 1}, None], "n": [1, None]}


# -- nulls ---------------------------------------------------------------------------------


@pytest.mark.parametrize("output", [TORCH, NUMPY])
def test_null_in_numeric_column_names_the_column(output: OutputFormat) -> None:
    batch = pa.record_batch([pa.array([1, 2]), pa.array([1, None], pa.int32())], ["ok", "weight"])
    with pytest.raises(NullValueError, match=r"column 'weight' has 1 null") as exc:
        _conv(batch, output)
    assert "null_fill={'weight': <value>}" in str(exc.value)
    assert isinstance(exc.value, ConversionError)


def test_null_fill_scalar_keeps_dtype() -> None:
    batch = pa.record_batch([pa.array([1, None], pa.int32()), pa.array([None, 2.5])], ["i", "f"])
    out = _conv(batch, null_fill=0)
    assert out["i"].dtype == torch.int32
    assert out["i"].tolist() == [1, 0]
    assert out["f"].tolist() == [0.0, 2.5]


def test_null_fill_mapping_only_for_named_columns() -> None:
    batch = pa.record_batch([pa.array([1, None]), pa.array([None, 2.0])], ["a", "b"])
    with pytest.raises(NullValueError, match="column 'b'"):
        _conv(batch, null_fill={"a": -1})
    out = _conv(batch, null_fill={"a": -1, "b": float("nan")})
    assert out["a"].tolist() == [1, -1]
    assert np.isnan(out["b"][0].item())


def test_null_fill_bool_and_timestamp() -> None:
    batch = pa.record_batch([pa.array([True, None]), pa.array([1, None], pa.timestamp("ms"))], ["flag", "ts"])
    out = _conv(batch, null_fill={"flag": False, "ts": 0})
    assert out["flag"].tolist() == [True, False]
    assert out["ts"].tolist() == [1, 0]


def test_null_inside_lists() -> None:
    fixed = pa.array([[1, None], [3, 4]], pa.list_(pa.int64(), 2))
    with pytest.raises(NullValueError, match="column 'c'"):
        _one(fixed)
    assert _one(fixed, null_fill=0).tolist() == [[1, 0], [3, 4]]  # type: ignore[attr-defined]
    missing_list = pa.array([[1], None], pa.list_(pa.int64()))
    with pytest.raises(NullValueError, match="column 'c' has 1 null list") as exc:
        _one(missing_list)
    assert "null_fill={'c': <value>}" in str(exc.value)


def test_null_fill_names_unknown_column() -> None:
    schema = pa.schema([("a", pa.int64())])
    with pytest.raises(ConversionError, match=r"null_fill names columns \['zz'\]"):
        BatchConverter(schema, OutputConfig(null_fill={"zz": 0}))


# -- packing -------------------------------------------------------------------------------


def test_pack_round_trip_through_pickle() -> None:
    batch = {
        "a": torch.arange(5, dtype=torch.int64),
        "b": torch.ones(3, 2, dtype=torch.float32),
        "c": torch.tensor([True, False]),
        "s": ["x", "y"],
        "lists": [torch.tensor([1, 2]), torch.tensor([], dtype=torch.int64)],
        "nested": {"t": (torch.tensor([7.0]), 3)},
    }
    packed = pack(batch)
    assert isinstance(packed, PackedBatch)
    out = pickle.loads(pickle.dumps(packed))
    assert type(out) is dict
    assert list(out) == list(batch)
    assert torch.equal(out["a"], batch["a"])
    assert torch.equal(out["b"], batch["b"])
    assert torch.equal(out["c"], batch["c"])
    assert out["s"] == ["x", "y"]
    assert [t.tolist() for t in out["lists"]] == [[1, 2], []]
    assert out["nested"]["t"][1] == 3
    assert torch.equal(out["nested"]["t"][0], torch.tensor([7.0]))


def test_pack_puts_all_tensors_in_one_buffer() -> None:
    batch = {"a": torch.arange(300_000), "b": torch.zeros(400_000)}  # > 1 MiB: shared memory
    packed = pack(batch)
    assert isinstance(packed, PackedBatch)
    out = pickle.loads(pickle.dumps(packed))
    assert set(out) == {"a", "b"}
    assert torch.equal(out["a"], batch["a"])
    assert torch.equal(out["b"], batch["b"])


def test_pack_round_trips_a_single_tensor_and_plain_values() -> None:
    batch = {"a": torch.arange(3), "s": ["x"]}
    out = pickle.loads(pickle.dumps(pack(batch)))
    assert torch.equal(out["a"], batch["a"])
    assert out["s"] == ["x"]


@pytest.mark.parametrize("output", list(OutputFormat))
def test_converter_pickles_for_spawned_workers(output: OutputFormat) -> None:
    batch = pa.record_batch([pa.array([1, None]), pa.array(["a", "b"])], ["n", "s"])
    converter = BatchConverter(batch.schema, OutputConfig(output_format=output, null_fill={"n": 7}))
    clone = pickle.loads(pickle.dumps(converter))
    if output is OutputFormat.ARROW:
        assert clone(batch) is batch
    elif output is OutputFormat.DICT:
        assert clone(batch) == {"n": [1, None], "s": ["a", "b"]}
    else:
        out = clone(batch)
        assert out["n"].tolist() == [1, 7]
        assert list(out["s"]) == ["a", "b"]
