"""What a value handed to ``load_state_dict`` is instead of the state expected (issue 33, item 19)."""

from __future__ import annotations

import json
import re

import pytest

from torch_dataloader_utils import ResumeStateError
from torch_dataloader_utils.plan.state import merge_states
from torch_dataloader_utils.plan.state_kind import GATHERED_FORMAT, MIX_FORMAT, PLAIN_FORMAT, not_a_state

PLAIN = json.dumps({"format": PLAIN_FORMAT, "version": 2})
MIX = json.dumps({"format": MIX_FORMAT, "version": 1})


@pytest.mark.parametrize(
    ("value", "expected", "says"),
    [
        ({"rank00": PLAIN}, PLAIN_FORMAT, r"its keys \['rank00'\] are not rank keys: .* 'rank0', 'rank1'"),
        ({"Rank0": PLAIN, "Rank1": PLAIN}, PLAIN_FORMAT, r"its keys \['Rank0', 'Rank1'\] are not rank keys"),
        ({"rank0": PLAIN, "rank_1": PLAIN}, PLAIN_FORMAT, r"its keys \['rank_1'\] are not rank keys"),
        ({0: PLAIN}, MIX_FORMAT, r"its keys \[0\] are not rank keys"),
        ({"rank0": json.loads(PLAIN)}, PLAIN_FORMAT, r"its entry 'rank0' is a dict, not the JSON string"),
        ({"rank0": json.loads(MIX)}, MIX_FORMAT, r"entry 'rank0' is a dict.*json\.dumps it back"),
        (json.loads(MIX), PLAIN_FORMAT, r"it is the state of a mixed loader \(create_mixed_dataloader\)"),
        (
            json.loads(PLAIN),
            MIX_FORMAT,
            r"a loader of files .* into a loader of create_data",
        ),
        ({"format": GATHERED_FORMAT}, PLAIN_FORMAT, r"GatheredState\(loader\)\.load_state_dict\(\)"),
        ({"rank0": PLAIN}, GATHERED_FORMAT, r"it is a loader's own state_dict\(\) \(keys \['rank0'\]\)"),
        ({}, PLAIN_FORMAT, r"the state is an empty dict; pass what loader\.state_dict\(\) returned"),
        ([PLAIN], PLAIN_FORMAT, r"got a list, not the dict"),
        ({"model": 1, "optimizer": 2}, PLAIN_FORMAT, r"a dict with the keys \['model', 'optimizer'\] and no"),
        ({"format": "other"}, MIX_FORMAT, r"its format is 'other', not 'torch_dataloader_utils\.mix'"),
    ],
)
def test_the_message_says_what_the_value_is(value: object, expected: str, says: str) -> None:
    error = not_a_state(value, expected)
    assert isinstance(error, ResumeStateError)
    title = {
        PLAIN_FORMAT: "not a torch_dataloader_utils resume state",
        MIX_FORMAT: "not the resume state of a",
    }
    assert str(error).startswith(title.get(expected, "not a GatheredState"))
    assert re.search(says, str(error)), str(error)


def test_merge_states_says_it_too() -> None:
    with pytest.raises(ResumeStateError, match=r"its entry 'rank1' is a dict"):
        merge_states([{"rank0": PLAIN, "rank1": json.loads(PLAIN)}])
