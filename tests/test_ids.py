"""Sort keys: 14 characters, increasing, told apart from earlier releases' 16 hex ones."""

from __future__ import annotations

import time

import pytest
from freezegun import freeze_time

from dramatiq_redisson import _ids
from dramatiq_redisson._ids import (
    SORT_KEY_LENGTH,
    message_id_of,
    next_sort_keys,
    same_sort_key,
    sort_key_length,
)


def test_keys_are_short_increasing_and_sort_after_earlier_releases_keys() -> None:
    keys = next_sort_keys(5000) + next_sort_keys(3)
    assert all(len(k) == SORT_KEY_LENGTH == sort_key_length(k) for k in keys)
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    earlier = f"{int(time.time() * 1000) << 20:016x}"  # an earlier release's key, offered now
    assert sort_key_length(earlier) == 16 and earlier < keys[0]


def test_keys_last_until_2109_and_keep_order_across_their_first_character(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ids, "_last", 0)  # (restored after: later keys of this process stay in 2026)
    with freeze_time("2109-01-01"):
        (late,) = next_sort_keys(1)
    assert len(late) == SORT_KEY_LENGTH and late[0] == "v"
    # the top hex digit 7 -> 8 (g..v) keeps the order
    assert "ng" < "o0" and min("ghijklmnopqrstuv") > "f"


def test_members_and_payloads_split_by_their_key_length() -> None:
    (key,) = next_sort_keys(1)
    old = "1a2123f48fc00000"
    for sort_key in (key, old):
        member = sort_key + "8f19a939-bfc3-48ce-8d43-d6268e40e374"
        assert message_id_of(member) == "8f19a939-bfc3-48ce-8d43-d6268e40e374"
        assert message_id_of(member.encode()) == "8f19a939-bfc3-48ce-8d43-d6268e40e374"
        assert same_sort_key((sort_key + "\x1ebody").encode(), member.encode())
    assert not same_sort_key((old + "\x1ebody").encode(), (key + "x").encode())
