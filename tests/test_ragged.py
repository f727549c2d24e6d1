"""Ragged list columns, string layouts and feature packing: values exactly, in every layout.

Each layout is read back into plain Python rows and compared with Arrow's own
``to_pylist()``: through the converter (``num_workers=0``), through ``pack`` and a
pickle round trip (what a DataLoader queue does), and end to end through real workers.
"""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies_ragged import list_arrays
from torch_dataloader_utils import (
    ConfigError,
    ConversionError,
    FeaturePack,
    FlatList,
    IncompatibleOptionsError,
    NullValueError,
    PaddedList,
    RaggedLayout,
    StringLayout,
    UnknownColumnError,
    create_dataloader,
)
from torch_dataloader_utils.config import OutputConfig, OutputFormat
from torch_dataloader_utils.convert import BatchConverter, JaggedParts
from torch_dataloader_utils.transfer import PackedBatch, pack, pack_group

LAYOUTS = list(RaggedLayout)


def _roundtrip(obj: Any) -> Any:
    return pickle.loads(bytes(ForkingPickler.dumps(obj)))


def _converter(schema: pa.Schema, **options: Any) -> BatchConverter:
    return BatchConverter(schema, OutputConfig(**options))


def _rows(out: Any, layout: RaggedLayout | None, pad: Any = 0) -> list[Any]:
    """A list column's output in any layout, as Python rows (checking the padding)."""
    if layout is RaggedLayout.JAGGED:
        assert isinstance(out, torch.Tensor)
        assert out.is_nested
        assert out.layout is torch.jagged
        assert out.offsets().dtype == torch.int64
        values, offsets = out.values(), out.offsets().tolist()
        return [values[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    if layout is RaggedLayout.OFFSETS:
        assert isinstance(out, FlatList)
        offsets = out.offsets.tolist()
        assert offsets[0] == 0
        assert out.offsets.dtype in (torch.int64, np.int64)
        return [out.values[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    if layout is RaggedLayout.PADDED:
        assert isinstance(out, PaddedList)
        lengths = out.lengths.tolist()
        assert out.lengths.dtype in (torch.int64, np.int64)
        assert out.values.shape[1] == max(lengths, default=0)
        rows = []
        for i, n in enumerate(lengths):
            rows.append(out.values[i, :n].tolist())
            rest = out.values[i, n:]
            assert (rest == pad).all(), f"row {i} is not padded with {pad!r}"
        return rows
    assert isinstance(out, np.ndarray)
    assert out.dtype == object
    return [a.tolist() for a in out]


def _expected(array: pa.Array, empty_nulls: bool = False, fill: Any = None) -> list[Any]:  # type: ignore[type-arg]
    rows = array.to_pylist()

    def fix(v: Any) -> Any:
        if isinstance(v, list):
            return [fix(x) for x in v]
        return fill if v is None else v

    return [[] if r is None and empty_nulls else fix(r) for r in rows]


# -- arrays every layout must round-trip ---------------------------------------------------

CASES = {
    "int32_with_empty": pa.array([[1, 2, 3], [], [4], [], [5, 6]], pa.list_(pa.int32())),
    "sliced": pa.array([[0], [1, 1], [], [3, 3, 3], [4]], pa.list_(pa.int64())).slice(1, 3),
    "large_list_float": pa.array([[0.5], [], [1.5, 2.5]], pa.large_list(pa.float64())),
    "bool": pa.array([[True, False], [True]], pa.list_(pa.bool_())),
    "uint8": pa.array([[255, 0], [], [7]], pa.list_(pa.uint8())),
    "vectors": pa.array([[[1, 2]], [], [[3, 4], [5, 6]]], pa.list_(pa.list_(pa.float32(), 2))),
    "all_empty": pa.array([[], []], pa.list_(pa.int16())),
    "no_rows": pa.array([], pa.list_(pa.int32())),
    "sliced_large_vectors": pa.array(
        [[[i, i]] * (i % 3) for i in range(9)], pa.large_list(pa.list_(pa.int32(), 2))
    ).slice(2, 5),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_round_trips_values(case: str, layout: RaggedLayout) -> None:
    array = CASES[case]
    batch = pa.record_batch([array], ["c"])
    conv = _converter(batch.schema, ragged=layout)
    direct = conv(batch)["c"]
    assert _rows(direct, layout) == _expected(array)
    sent = _roundtrip(pack(conv.convert_for_transfer(batch)))["c"]
    assert _rows(sent, layout) == _expected(array)
    # The item dtype survives.
    item = array.type.value_type
    while pa.types.is_fixed_size_list(item):
        item = item.value_type
    values = direct.values() if layout is RaggedLayout.JAGGED else direct.values
    assert values.dtype == torch.from_numpy(np.zeros(0, item.to_pandas_dtype())).dtype


@pytest.mark.parametrize("case", ["int32_with_empty", "sliced", "vectors", "no_rows"])
@pytest.mark.parametrize("layout", [RaggedLayout.PADDED, RaggedLayout.OFFSETS, None])
def test_numpy_layouts(case: str, layout: RaggedLayout | None) -> None:
    array = CASES[case]
    batch = pa.record_batch([array], ["c"])
    conv = _converter(batch.schema, output_format=OutputFormat.NUMPY, ragged=layout)
    out = conv(batch)["c"]
    if layout is not None:
        assert isinstance(out.values, np.ndarray)
    assert _rows(out, layout) == _expected(array)
    assert _rows(_roundtrip(pack(conv.convert_for_transfer(batch)))["c"], layout) == _expected(array)


def test_jagged_and_offsets_are_views_of_arrow_memory() -> None:
    array = pa.array([[0], [1, 1], [2, 2, 2]], pa.list_(pa.int64())).slice(1, 2)
    batch = pa.record_batch([array], ["c"])
    base = array.values.buffers()[1].address + 1 * 8  # items of the slice start at item 1
    jagged = _converter(batch.schema)(batch)["c"]
    assert jagged.values().data_ptr() == base
    flat = _converter(batch.schema, ragged="offsets")(batch)["c"]
    assert flat.values.data_ptr() == base


def test_padded_options() -> None:
    array = pa.array([[1, 2, 3, 4], [5], []], pa.list_(pa.int32()))
    batch = pa.record_batch([array], ["c"])
    out = _converter(batch.schema, ragged="padded", pad_value=-1)(batch)["c"]
    assert out.values.dtype == torch.int32
    assert out.values.tolist() == [[1, 2, 3, 4], [5, -1, -1, -1], [-1, -1, -1, -1]]
    assert out.lengths.tolist() == [4, 1, 0]
    cut = _converter(batch.schema, ragged="padded", max_length=2, pad_value=9)(batch)["c"]
    assert cut.values.tolist() == [[1, 2], [5, 9], [9, 9]]
    assert cut.lengths.tolist() == [2, 1, 0]
    wide = _converter(batch.schema, ragged="padded", max_length=10)(batch)["c"]
    assert wide.values.shape == (3, 4)  # the longest list of the batch, not max_length


def test_padded_truncation_of_vectors_through_transfer() -> None:
    array = pa.array([[[1, 1], [2, 2], [3, 3]], [[4, 4]]], pa.list_(pa.list_(pa.float32(), 2)))
    batch = pa.record_batch([array], ["c"])
    conv = _converter(batch.schema, ragged="padded", max_length=2)
    out = _roundtrip(pack(conv.convert_for_transfer(batch)))["c"]
    assert isinstance(out, PaddedList)
    assert out.values.shape == (2, 2, 2)
    assert out.values.tolist() == [[[1, 1], [2, 2]], [[4, 4], [0, 0]]]
    assert out.lengths.tolist() == [2, 1]


@pytest.mark.parametrize(
    ("item", "pad"), [(pa.uint8(), -1), (pa.int32(), 1.5), (pa.bool_(), 2), (pa.int8(), 300)]
)
def test_pad_value_the_items_cannot_hold(item: pa.DataType, pad: Any) -> None:
    schema = pa.schema([("tokens", pa.list_(item))])
    with pytest.raises(ConversionError, match=rf"pad_value={pad!r} cannot be stored in column 'tokens'"):
        _converter(schema, ragged="padded", pad_value=pad)


# -- nulls ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_null_lists_need_null_fill_and_read_as_empty(layout: RaggedLayout) -> None:
    array = pa.array([[1, 2], None, [], [3]], pa.list_(pa.int32())).slice(1, 3)
    batch = pa.record_batch([array], ["c"])
    with pytest.raises(NullValueError, match=r"column 'c' has 1 null list\(s\)") as exc:
        _converter(batch.schema, ragged=layout)(batch)
    assert "null_fill={'c': <value>}" in str(exc.value)
    conv = _converter(batch.schema, ragged=layout, null_fill={"c": 0})
    assert _rows(conv(batch)["c"], layout) == [[], [], [3]]
    assert _rows(_roundtrip(pack(conv.convert_for_transfer(batch)))["c"], layout) == [[], [], [3]]


def test_null_list_backed_by_items_reads_empty() -> None:
    # Arrow allows a null list whose offsets span items: they must not leak into the row.
    values = pa.array([1, 2, 3, 4], pa.int32())
    offsets = pa.array([0, 2, 4], pa.int32())
    mask = pa.array([False, True])
    array = pa.ListArray.from_arrays(offsets, values, mask=mask)
    batch = pa.record_batch([array], ["c"])
    for layout in LAYOUTS:
        out = _converter(batch.schema, ragged=layout, null_fill=0)(batch)["c"]
        assert _rows(out, layout) == [[1, 2], []]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_null_items_are_filled_or_an_error(layout: RaggedLayout) -> None:
    array = pa.array([[1, None], [None], [3]], pa.list_(pa.float32()))
    batch = pa.record_batch([array], ["c"])
    with pytest.raises(NullValueError, match=r"column 'c' has 2 null\(s\)"):
        _converter(batch.schema, ragged=layout)(batch)
    out = _converter(batch.schema, ragged=layout, null_fill={"c": -7.0})(batch)["c"]
    assert _rows(out, layout) == [[1.0, -7.0], [-7.0], [3.0]]


def test_fixed_size_lists_stay_dense_in_every_layout() -> None:
    array = pa.array([[1, 2], None, [5, 6]], pa.list_(pa.int64(), 2)).slice(0, 3)
    batch = pa.record_batch([array], ["c"])
    for layout in LAYOUTS:
        with pytest.raises(NullValueError, match="null list"):
            _converter(batch.schema, ragged=layout)(batch)
        conv = _converter(batch.schema, ragged=layout, null_fill={"c": -1})
        for out in (conv(batch)["c"], _roundtrip(pack(conv.convert_for_transfer(batch)))["c"]):
            assert isinstance(out, torch.Tensor)
            assert not out.is_nested
            assert out.tolist() == [[1, 2], [-1, -1], [5, 6]]


def test_nested_fixed_size_lists_are_dense() -> None:
    array = pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]]], pa.list_(pa.list_(pa.int16(), 2), 2))
    out = _converter(pa.schema([("c", array.type)]))(pa.record_batch([array], ["c"]))["c"]
    assert out.shape == (2, 2, 2)
    assert out.dtype == torch.int16
    assert out.tolist() == array.to_pylist()


# -- options at the edge -------------------------------------------------------------------


def test_option_values_are_checked_at_the_edge(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": [1, 2], "tokens": pa.array([[1], [2, 3]], pa.list_(pa.int32()))}), path)

    def build(**options: Any) -> None:
        create_dataloader(str(path), num_workers=0, **options)

    with pytest.raises(
        ConfigError, match=r"ragged='ragged' is not supported; use one of 'jagged', 'padded', 'offsets'"
    ):
        build(ragged="ragged")
    with pytest.raises(
        ConfigError, match=r"strings='utf8' is not supported; use one of 'list', 'arrow', 'bytes'"
    ):
        build(strings="utf8")
    with pytest.raises(
        IncompatibleOptionsError, match=r"pad_value=-1 applies to padded lists, but ragged=None"
    ):
        build(pad_value=-1)
    with pytest.raises(
        IncompatibleOptionsError, match=r"max_length=8 applies to padded lists, but ragged='jagged'"
    ):
        build(ragged="jagged", max_length=8)
    with pytest.raises(ConfigError, match=r"max_length=0 must be >= 1"):
        build(ragged="padded", max_length=0)
    with pytest.raises(ConfigError, match=r"pad_value='x' must be a number"):
        build(ragged="padded", pad_value="x")
    with pytest.raises(IncompatibleOptionsError, match=r"ragged='jagged' makes torch nested tensors"):
        build(ragged="jagged", output_format="numpy")
    with pytest.raises(
        IncompatibleOptionsError, match=r"ragged='padded' applies to output_format 'torch' or 'numpy'"
    ):
        build(ragged="padded", output_format="arrow")
    with pytest.raises(IncompatibleOptionsError, match=r"strings='bytes' applies to output_format"):
        build(strings="bytes", output_format="dict")
    with pytest.raises(ConfigError, match=r"pack_features=\['id'\] must be a FeaturePack"):
        build(pack_features=["id"])
    with pytest.raises(ConversionError, match=r"pack_features column 'tokens' has type list<"):
        build(pack_features=FeaturePack(["id", "tokens"]))
    # Strings and enum members are both accepted.
    build(ragged=RaggedLayout.PADDED, strings=StringLayout.BYTES, pad_value=0, max_length=4)
    build(ragged="Offsets", strings="arrow")


def test_feature_pack_checks_itself() -> None:
    with pytest.raises(ConfigError, match=r"columns='f0' must be a non-empty list"):
        FeaturePack("f0")
    with pytest.raises(ConfigError, match=r"columns=\[\] must be a non-empty list"):
        FeaturePack([])
    with pytest.raises(ConfigError, match=r"names \['a'\] more than once"):
        FeaturePack(["a", "b", "a"])
    with pytest.raises(ConfigError, match=r"dtype='complex64' is not supported; use one of 'float16'"):
        FeaturePack(["a"], dtype="complex64")
    with pytest.raises(ConfigError, match=r"dtype=None is not supported"):
        FeaturePack(["a"], dtype=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"key='' must be a non-empty str"):
        FeaturePack(["a"], key="")
    assert FeaturePack(["a"], dtype=torch.float64).dtype == "float64"
    assert FeaturePack(["a"], dtype=np.dtype(np.int16)).dtype == "int16"
    assert FeaturePack(["a", "b"]).columns == ("a", "b")
    with pytest.raises(IncompatibleOptionsError, match=r"puts column 'a' in two packs \('x' and 'y'\)"):
        OutputConfig(pack_features=(FeaturePack(["a"], key="x"), FeaturePack(["b", "a"], key="y")))
    with pytest.raises(IncompatibleOptionsError, match=r"uses the key\(s\) \['x'\] for two packs"):
        OutputConfig(pack_features=(FeaturePack(["a"], key="x"), FeaturePack(["b"], key="x")))


# -- feature packing -----------------------------------------------------------------------


def _features_batch() -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array([10, 11, 12], pa.int64()),
            "f0": pa.array([0.5, 1.5, 2.5], pa.float32()),
            "i0": pa.array([1, 2, 3], pa.int32()),
            "flag": pa.array([True, False, True]),
            "vec": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.float64(), 2)),
            "s": pa.array(["a", "b", "c"]),
        }
    )


@pytest.mark.parametrize("output", [OutputFormat.TORCH, OutputFormat.NUMPY])
def test_feature_pack_stacks_columns_in_order(output: OutputFormat) -> None:
    batch = _features_batch()
    pack_ = FeaturePack(["i0", "vec", "f0", "flag"], key="x", dtype="float32")
    conv = _converter(batch.schema, output_format=output, pack_features=(pack_,))
    for out in (conv(batch), _roundtrip(pack(conv.convert_for_transfer(batch)))):
        assert list(out) == ["id", "x", "s"]  # the pack sits where its first column was
        assert out["x"].dtype in (torch.float32, np.float32)
        assert out["x"].tolist() == [[1, 1, 2, 0.5, 1], [2, 3, 4, 1.5, 0], [3, 5, 6, 2.5, 1]]
        assert out["id"].tolist() == [10, 11, 12]


def test_feature_pack_is_a_view_for_one_column_of_its_dtype() -> None:
    batch = _features_batch()
    vec = batch.column("vec")
    out = _converter(batch.schema, pack_features=(FeaturePack(["vec"], dtype="float64"),))(batch)
    assert out["features"].shape == (3, 2)
    assert out["features"].data_ptr() == vec.values.buffers()[1].address
    one = _converter(batch.schema, pack_features=(FeaturePack(["f0"]),))(batch)["features"]
    assert one.shape == (3, 1)
    assert one.data_ptr() == batch.column("f0").buffers()[1].address
    cast = _converter(batch.schema, pack_features=(FeaturePack(["vec"], dtype="float16"),))(batch)["features"]
    assert cast.dtype == torch.float16
    assert cast.tolist() == [[1, 2], [3, 4], [5, 6]]


def test_several_packs_and_nulls() -> None:
    batch = pa.record_batch({"a": pa.array([1.0, None]), "b": pa.array([3, 4]), "c": pa.array([5, 6])})
    packs = (FeaturePack(["a", "b"], key="x"), FeaturePack(["c"], key="y", dtype=torch.int64))
    with pytest.raises(NullValueError, match="column 'a'"):
        _converter(batch.schema, pack_features=packs)(batch)
    out = _converter(batch.schema, pack_features=packs, null_fill={"a": -1.0})(batch)
    assert list(out) == ["x", "y"]
    assert out["x"].tolist() == [[1, 3], [-1, 4]]
    assert out["y"].dtype == torch.int64
    assert out["y"].tolist() == [[5], [6]]


def test_feature_pack_errors() -> None:
    schema = _features_batch().schema
    with pytest.raises(
        UnknownColumnError, match=r"pack_features key 'features' names column\(s\) \['nope'\]"
    ):
        _converter(schema, pack_features=(FeaturePack(["f0", "nope"]),))
    with pytest.raises(ConversionError, match=r"pack_features column 's' has type string"):
        _converter(schema, pack_features=(FeaturePack(["s"]),))
    with pytest.raises(ConversionError, match=r"column 'f0' \(float\) cannot become dtype='int32'"):
        _converter(schema, pack_features=(FeaturePack(["f0"], dtype="int32"),))
    with pytest.raises(IncompatibleOptionsError, match=r"key 'id' is also a column of the output"):
        _converter(schema, pack_features=(FeaturePack(["f0"], key="id"),))
    # The key may reuse the name of a column the pack consumes.
    out = _converter(schema, pack_features=(FeaturePack(["f0", "i0"], key="f0"),))(_features_batch())
    assert out["f0"].shape == (3, 2)


@pytest.mark.parametrize(
    ("array", "dtype", "value"),
    [
        (pa.array([1, 2**31 + 5, 3], pa.int64()), "int32", 2**31 + 5),
        (pa.array([1, -(2**31) - 1], pa.int64()), "int32", -(2**31) - 1),
        (pa.array([0, 2**63 + 7], pa.uint64()), "int64", 2**63 + 7),
        (pa.array([[1, 2], [300, 4]], pa.list_(pa.int32(), 2)), "int8", 300),
        (pa.array([1, 40000], pa.uint16()), "int16", 40000),
    ],
)
@pytest.mark.parametrize("together", [False, True])
def test_feature_pack_refuses_integers_that_do_not_fit(
    array: pa.Array,  # type: ignore[type-arg]
    dtype: str,
    value: int,
    together: bool,
) -> None:
    # numpy would wrap them (2**31 + 5 -> -2147483643): a silent wrong value.
    batch = pa.record_batch({"a": array, "b": pa.array([7] * len(array), pa.int8())})
    columns = ["b", "a"] if together else ["a"]
    conv = _converter(batch.schema, pack_features=(FeaturePack(columns, key="x", dtype=dtype),))
    expected = rf"column 'a' holds the value {value}, which does not fit"
    for convert in (conv, conv.convert_for_transfer):
        with pytest.raises(ConversionError, match=expected) as exc:
            convert(batch)
        assert f"dtype={dtype!r} of the pack 'x'" in str(exc.value)
        assert "dtype='int64'" in str(exc.value)


def test_feature_pack_narrows_integers_that_fit() -> None:
    batch = pa.record_batch(
        {
            "a": pa.array([-(2**31), 2**31 - 1], pa.int64()),
            "u": pa.array([0, 2**63 - 1], pa.uint64()),
            "f": pa.array([True, False]),
        }
    )
    out = _converter(batch.schema, pack_features=(FeaturePack(["a"], key="x", dtype="int32"),))(batch)
    assert out["x"].dtype == torch.int32
    assert out["x"].tolist() == [[-(2**31)], [2**31 - 1]]
    both = _converter(batch.schema, pack_features=(FeaturePack(["u", "f"], key="y", dtype="int64"),))(batch)
    assert both["y"].tolist() == [[0, 1], [2**63 - 1, 0]]


# -- strings -------------------------------------------------------------------------------

TEXTS = {
    "string": pa.array(["a", "", "héllo", None, "x" * 50]),
    "large_string": pa.array(["a", None, "bc"], pa.large_string()),
    "binary": pa.array([b"\x00\x01", None, b""]),
    "sliced": pa.array([f"s{i}" if i % 4 else None for i in range(30)]).slice(5, 11),
    "string_view": pa.array(["v", None, "ww"], pa.string_view()),
    "dictionary": pa.array(["u", None, "v", "u"]).dictionary_encode(),
    "no_rows": pa.array([], pa.string()),
}


def _decoded(array: pa.Array) -> list[Any]:  # type: ignore[type-arg]
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array.to_pylist()  # type: ignore[no-any-return]


def _flat_bytes(out: Any) -> list[bytes]:
    assert isinstance(out, FlatList)
    assert out.values.dtype in (torch.uint8, np.uint8)
    data = bytes(out.values.tolist())
    o = out.offsets.tolist()
    return [data[o[i] : o[i + 1]] for i in range(len(o) - 1)]


@pytest.mark.parametrize("case", list(TEXTS))
@pytest.mark.parametrize("output", [OutputFormat.TORCH, OutputFormat.NUMPY])
def test_string_layouts_round_trip(case: str, output: OutputFormat) -> None:
    array = TEXTS[case]
    batch = pa.record_batch([array], ["s"])
    expected = _decoded(array)
    as_bytes = [(v.encode() if isinstance(v, str) else v) if v is not None else b"" for v in expected]
    for layout in StringLayout:
        conv = _converter(batch.schema, output_format=output, strings=layout, null_fill={"s": ""})
        if pa.types.is_binary(array.type):
            conv = _converter(batch.schema, output_format=output, strings=layout, null_fill={"s": b""})
        for out in (conv(batch)["s"], _roundtrip(pack(conv.convert_for_transfer(batch)))["s"]):
            if layout is StringLayout.LIST:
                assert list(out) == expected
                assert isinstance(out, list) if output is OutputFormat.TORCH else out.dtype == object
            elif layout is StringLayout.ARROW:
                assert isinstance(out, pa.Array)
                assert out.to_pylist() == expected
            else:
                assert _flat_bytes(out) == as_bytes


def test_bytes_strings_need_null_fill() -> None:
    batch = pa.record_batch([pa.array(["a", None])], ["s"])
    with pytest.raises(NullValueError, match=r"column 's' has 1 null string\(s\)") as exc:
        _converter(batch.schema, strings="bytes")(batch)
    assert "null_fill={'s': ''}" in str(exc.value)
    with pytest.raises(ConversionError, match=r"null_fill value 0 for column 's' is not a string"):
        _converter(batch.schema, strings="bytes", null_fill=0)
    # With strings='list' a scalar null_fill for every column leaves strings alone, as before.
    assert _converter(batch.schema, null_fill=0)(batch)["s"] == ["a", None]


def test_bytes_values_are_a_view_of_arrow_memory() -> None:
    array = pa.array(["abc", "de", "f"]).slice(1, 2)
    out = _converter(pa.schema([("s", pa.string())]), strings="bytes")(pa.record_batch([array], ["s"]))["s"]
    assert out.values.data_ptr() == array.buffers()[2].address + 3
    assert out.offsets.tolist() == [0, 2, 3]


# -- transfer ------------------------------------------------------------------------------


def _buffers_in(layout: Any) -> int:
    """Byte ranges a packed layout points into (tensors and Arrow buffers)."""
    if isinstance(layout, tuple) and layout and layout[0] in ("n", "t"):
        return 1
    if isinstance(layout, (list, tuple)):
        return sum(_buffers_in(x) for x in layout)
    return 0


def test_a_ragged_batch_is_a_few_buffers_not_a_tensor_per_row() -> None:
    rows = 4096
    tokens = pa.array([list(range(i % 50)) for i in range(rows)], pa.list_(pa.int32()))
    batch = pa.record_batch([pa.array(range(rows)), tokens], ["id", "tokens"])
    for layout in LAYOUTS:
        conv = _converter(batch.schema, ragged=layout)
        converted = conv.convert_for_transfer(batch)
        if layout is RaggedLayout.JAGGED:
            assert isinstance(converted["tokens"], JaggedParts)
        packed = pack(converted)
        assert isinstance(packed, PackedBatch)
        assert _buffers_in(packed.layout) == 3  # id; values + offsets (or lengths)
        assert _rows(_roundtrip(packed)["tokens"], layout) == tokens.to_pylist()


def test_nested_tensors_from_a_collate_fn_travel_as_values_and_offsets() -> None:
    values = torch.arange(10, dtype=torch.float32)
    offsets = torch.tensor([2, 5, 5, 9], dtype=torch.int64)  # a view starting at item 2
    nt = torch.nested.nested_tensor_from_jagged(values, offsets)
    got = _roundtrip(pack({"x": nt, "y": [nt, torch.ones(2)]}))
    for out in (got["x"], got["y"][0]):
        assert out.is_nested
        assert out.offsets().tolist() == [0, 3, 3, 7]
        assert out.values().tolist() == list(range(2, 9))


def test_group_of_ragged_batches() -> None:
    batch = pa.record_batch(
        [pa.array([[1], [2, 3]], pa.list_(pa.int32())), pa.array(["a", None])], ["l", "s"]
    )
    conv = _converter(batch.schema, strings="arrow")
    got = _roundtrip(pack_group([conv.convert_for_transfer(batch) for _ in range(3)]))
    assert len(got) == 3
    for b in got:
        assert _rows(b["l"], RaggedLayout.JAGGED) == [[1], [2, 3]]
        assert b["s"].to_pylist() == ["a", None]


@given(array=list_arrays(), layout=st.sampled_from(LAYOUTS), workers=st.booleans())
def test_random_list_arrays_round_trip(array: pa.Array, layout: RaggedLayout, workers: bool) -> None:  # type: ignore[type-arg]
    batch = pa.record_batch([array], ["c"])
    conv = _converter(batch.schema, ragged=layout, null_fill={"c": 0})
    out = _roundtrip(pack(conv.convert_for_transfer(batch)))["c"] if workers else conv(batch)["c"]
    assert _rows(out, layout) == _expected(array, empty_nulls=True, fill=0)


# -- end to end through the loader ---------------------------------------------------------


def _write_ragged(root: Path) -> dict[int, tuple[list[int], str, list[float]]]:
    root.mkdir()
    expected = {}
    for part in range(3):
        ids = list(range(part * 700, part * 700 + 700))
        tokens = [list(range(i % 13)) if i % 11 else [] for i in ids]
        words = [f"w{i}" * (i % 4) for i in ids]
        feats = [[i * 0.5, i * 0.25] for i in ids]
        table = pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "tokens": pa.array(tokens, pa.list_(pa.int32())),
                "word": pa.array(words),
                "vec": pa.array(feats, pa.list_(pa.float32(), 2)),
                "x": pa.array([i * 2.0 for i in ids], pa.float64()),
            }
        )
        pq.write_table(table, root / f"part-{part}.parquet", row_group_size=250)
        expected.update(
            {i: (t, w, [*f, i * 2.0]) for i, t, w, f in zip(ids, tokens, words, feats, strict=True)}
        )
    return expected


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_loader_delivers_every_row_once_in_every_layout(
    tmp_path: Path, layout: RaggedLayout, workers: int
) -> None:
    expected = _write_ragged(tmp_path / "data")
    loader, _ = create_dataloader(
        str(tmp_path / "data"),
        batch_size=128,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
        ragged=layout,
        strings="bytes" if layout is RaggedLayout.OFFSETS else "list",
        pack_features=FeaturePack(["vec", "x"], key="features", dtype="float64"),
        timeout=60 if workers else 0,
    )
    seen: list[int] = []
    for batch in loader:
        assert list(batch) == ["id", "tokens", "word", "features"]
        ids = batch["id"].tolist()
        tokens = _rows(batch["tokens"], layout)
        words = (
            [w.decode() for w in _flat_bytes(batch["word"])]
            if layout is RaggedLayout.OFFSETS
            else batch["word"]
        )
        assert batch["features"].dtype == torch.float64
        for j, i in enumerate(ids):
            assert tokens[j] == expected[i][0]
            assert words[j] == expected[i][1]
            assert batch["features"][j].tolist() == expected[i][2]
        seen += ids
    assert sorted(seen) == sorted(expected)  # every row exactly once


def test_numpy_and_arrow_outputs_keep_their_layouts(tmp_path: Path) -> None:
    expected = _write_ragged(tmp_path / "data")
    for workers in (0, 2):
        loader, _ = create_dataloader(
            str(tmp_path / "data"), batch_size=300, num_workers=workers, output_format="numpy"
        )
        rows = {i: t.tolist() for b in loader for i, t in zip(b["id"].tolist(), b["tokens"], strict=True)}
        assert rows == {i: e[0] for i, e in expected.items()}
        loader, _ = create_dataloader(
            str(tmp_path / "data"), batch_size=300, num_workers=workers, output_format="arrow"
        )
        batches = list(loader)
        assert all(
            isinstance(b, pa.RecordBatch) and b.schema.field("tokens").type == pa.list_(pa.int32())
            for b in batches
        )
        assert sum(b.num_rows for b in batches) == len(expected)


class _Pair(NamedTuple):
    a: Any
    b: Any


def test_named_tuples_keep_their_type_unless_local() -> None:
    got = _roundtrip(pack({"p": _Pair(torch.arange(3), "x")}))
    assert type(got["p"]) is _Pair
    assert got["p"].a.tolist() == [0, 1, 2]
    assert got["p"].b == "x"

    class Local(NamedTuple):
        a: Any

    plain = _roundtrip(pack({"p": Local(torch.arange(2))}))  # a local class cannot be pickled
    assert type(plain["p"]) is tuple
    assert plain["p"][0].tolist() == [0, 1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_jagged_batches_pad_to_their_longest_row(tmp_path: Path, num_workers: int) -> None:
    """Issue 28, item 3: ``to_padded_tensor`` gave ``[32, 9180]`` (the batch's items) for ``[32, ~590]``."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 60, size=320)
    tokens = [list(range(n)) for n in lengths]
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"id": np.arange(320), "tokens": tokens}), path, row_group_size=100)
    loader, _ = create_dataloader(str(path), batch_size=32, num_workers=num_workers)
    batches = 0
    for batch in loader:
        ids = batch["id"].tolist()
        padded = torch.nested.to_padded_tensor(batch["tokens"], 0)
        longest = int(max(lengths[ids]))
        assert padded.shape == (len(ids), longest)
        assert batch["tokens"]._maybe_max_seqlen == longest  # what attention kernels read
        assert batch["tokens"]._maybe_min_seqlen == int(min(lengths[ids]))
        batches += 1
    assert batches == 10


def test_jagged_from_offsets_knows_its_bounds() -> None:
    from torch_dataloader_utils.upstream.torch import jagged

    empty_rows = jagged(torch.zeros(0), torch.tensor([0, 0, 0]))
    assert torch.nested.to_padded_tensor(empty_rows, 0.0).shape == (2, 0)
    assert jagged(torch.zeros(0), torch.tensor([0])).size(0) == 0  # no rows
    moved = _roundtrip(jagged(torch.arange(10.0), torch.tensor([0, 3, 5, 10])))
    assert torch.nested.to_padded_tensor(moved, 0.0).shape == (3, 5)


_FRESH_JAGGED = """
import sys
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from torch_dataloader_utils import create_dataloader
path = sys.argv[1]
pq.write_table(pa.table({"id": np.arange(8), "tokens": [[1] * n for n in range(8)]}), path)
loader, _ = create_dataloader(path, batch_size=4, num_workers=int(sys.argv[2]))
batch = next(iter(loader))
nt, ids = batch["tokens"], batch["id"].tolist()  # row i holds i tokens
assert (nt._maybe_min_seqlen, nt._maybe_max_seqlen) == (min(ids), max(ids)), (nt._maybe_min_seqlen, ids)
print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
"""


@pytest.mark.parametrize("num_workers", [0, 2])
def test_first_jagged_batch_imports_no_compiler(tmp_path: Path, num_workers: int) -> None:
    """Issue 33, item 26: the cached min/max seqlen imported ``torch._dynamo`` and sympy (1-1.6 s).

    Checked in a fresh process, where nothing else imported them: the lengths are still
    cached (what ``to_padded_tensor`` and attention kernels read), and no compiler module
    was imported to get there.
    """
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{root / 'src'}:{root}"}
    script = tmp_path / "first.py"
    script.write_text(_FRESH_JAGGED)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "t.parquet"), str(num_workers)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    ).stdout
    assert "torch._dynamo" not in out


def test_jagged_lengths_are_marked_dynamic_once_the_compiler_is_loaded() -> None:
    """With ``torch._dynamo`` imported (``torch.compile`` in use), torch marks the lengths itself."""
    import torch._dynamo

    from torch_dataloader_utils.upstream.torch import jagged

    nt = jagged(torch.arange(10.0), torch.tensor([0, 3, 5, 10]))
    assert (nt._maybe_min_seqlen, nt._maybe_max_seqlen) == (2, 5)
    assert nt._max_seqlen_tensor._dynamo_dynamic_indices == {0}
    assert nt._min_seqlen_tensor._dynamo_dynamic_indices == {0}
