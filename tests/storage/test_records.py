"""Record scanning of CSV lines: where a quoted field goes on past a line end."""

from __future__ import annotations

import csv
import io

import pyarrow as pa
import pyarrow.csv as pcsv
from hypothesis import given
from hypothesis import strategies as st

from torch_dataloader_utils.storage.records import ends_inside_quotes

# Quotes, commas and newlines are what quoting is about; letters keep fields apart.
fields = st.text(st.sampled_from(list('ab",\n ')), max_size=12)


@given(row=st.lists(fields, min_size=1, max_size=5))
def test_a_record_goes_on_past_its_first_line_exactly_when_a_quoted_field_holds_a_newline(
    row: list[str],
) -> None:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(row)  # quotes the fields holding "\n"
    record = out.getvalue()[:-1]
    first = record.split("\n", 1)[0]
    assert ends_inside_quotes(first.encode()) == ("\n" in record)
    names = [f"c{i}" for i in range(len(row))]
    table = pcsv.read_csv(  # the record as pyarrow reads it: one row, the fields written
        pa.BufferReader(record.encode() + b"\n"),
        read_options=pcsv.ReadOptions(column_names=names),
        convert_options=pcsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.string()),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    assert [list(r.values()) for r in table.to_pylist()] == [row]


def test_a_quote_inside_an_unquoted_field_is_an_ordinary_character() -> None:
    assert not ends_inside_quotes(b'3,line",6')
    assert not ends_inside_quotes(b'3,"a ""quoted"" word",6')
    assert ends_inside_quotes(b'2,"first')
    assert ends_inside_quotes(b'2,"a ""b')
    assert not ends_inside_quotes(b'"a,b",c')
