"""Schedule specs: parsing, tick arithmetic, DST through cronsim, JSON, catch-up. No server."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from dramatiq_redisson.periodic._spec import (
    CATCH_UP_POLICIES,
    InvalidSchedule,
    Policy,
    ScheduleSpec,
    catch_up_ticks,
    jitter_offset,
    parse_policy,
    parse_spec,
)

UTC = dt.timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, tz: dt.tzinfo = UTC) -> int:
    """Epoch ms of a wall-clock time (fold=0: the first pass of a repeated hour)."""
    return int(dt.datetime(year, month, day, hour, minute, second, tzinfo=tz).timestamp() * 1000)


def local(tick_ms: int, tz: dt.tzinfo) -> dt.datetime:
    return dt.datetime.fromtimestamp(tick_ms / 1000, tz=tz)


# -- parsing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "schedule"),
        ({"cron": "* * * * *", "every": 5}, "schedule"),
        ({"cron": "not a cron"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "0 */5 * * * *"}, "cron"),
        ({"cron": "0 0 12 * * ? 2026"}, "cron"),
        ({"cron": "* * * *"}, "cron"),
        ({"cron": ""}, "cron"),
        ({"cron": "@daily"}, "cron"),
        ({"every": 0}, "every"),
        ({"every": -5}, "every"),
        ({"every": 0.05}, "every"),
        ({"every": dt.timedelta(0)}, "every"),
        ({"every": dt.timedelta(milliseconds=99)}, "every"),
        ({"every": float("nan")}, "every"),
        ({"every": "5"}, "every"),
        ({"every": "0s"}, "every"),
        ({"every": "-5s"}, "every"),
        ({"every": "50ms"}, "every"),
        ({"every": "5 seconds"}, "every"),
        ({"every": True}, "every"),
        ({"every": 5, "tz": "Europe/Berlin"}, "tz"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus_Mons"}, "tz"),
        ({"cron": "* * * * *", "tz": "../etc/passwd"}, "tz"),
        ({"cron": "* * * * *", "tz": ""}, "tz"),
    ],
)
def test_parse_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        parse_spec(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith(field), str(info.value)
    assert isinstance(info.value, ValueError)


def test_parse_error_messages_say_what_is_wrong() -> None:
    with pytest.raises(InvalidSchedule, match="exactly one of cron and every"):
        parse_spec(cron="* * * * *", every="1s")
    with pytest.raises(InvalidSchedule, match="exactly one of cron and every"):
        parse_spec()
    with pytest.raises(InvalidSchedule, match=r"has 6 fields, expected 5"):
        parse_spec(cron="0 */5 * * * *")
    with pytest.raises(InvalidSchedule, match=r"'61 \* \* \* \*' is not a valid cron expression: Bad minute"):
        parse_spec(cron="61 * * * *")
    with pytest.raises(InvalidSchedule, match="@-aliases are not supported"):
        parse_spec(cron="@hourly")
    with pytest.raises(InvalidSchedule, match="greater than 0"):
        parse_spec(every="0s")
    with pytest.raises(InvalidSchedule, match="greater than 0"):
        parse_spec(every=dt.timedelta(seconds=-1.5))
    with pytest.raises(InvalidSchedule, match=r"at least 0\.1s"):
        parse_spec(every="50ms")
    with pytest.raises(InvalidSchedule, match=r"at least 0\.1s"):
        parse_spec(every=dt.timedelta(milliseconds=50))
    with pytest.raises(InvalidSchedule, match="tz applies to cron schedules only"):
        parse_spec(every="5s", tz="UTC")
    with pytest.raises(InvalidSchedule, match="unknown time zone 'Mars/Olympus_Mons'"):
        parse_spec(cron="* * * * *", tz="Mars/Olympus_Mons")


def test_parse_cron_normalises_text_and_defaults_to_utc() -> None:
    spec = parse_spec(cron="  */5\t*  * *   mon-fri ")
    assert spec == ScheduleSpec(cron="*/5 * * * MON-FRI", every_ms=None, tz="UTC")
    assert spec.cron == "*/5 * * * MON-FRI"
    assert spec.tz == "UTC"
    assert spec.every_ms is None
    # The constructor normalises too, so equal schedules are equal specs.
    assert ScheduleSpec(cron="*/5 * * * mon-fri") == spec


def test_parse_every_units() -> None:
    assert parse_spec(every="30s").every_ms == 30_000
    assert parse_spec(every="1.5s").every_ms == 1500
    assert parse_spec(every="100ms").every_ms == 100
    assert parse_spec(every="250ms").every_ms == 250
    assert parse_spec(every="5m").every_ms == 300_000
    assert parse_spec(every="1h30m").every_ms == 5_400_000
    assert parse_spec(every=" 2H ").every_ms == 7_200_000
    assert parse_spec(every=dt.timedelta(hours=2)).every_ms == 7_200_000
    assert parse_spec(every=dt.timedelta(milliseconds=250)).every_ms == 250
    spec = parse_spec(every="30s")
    assert spec.cron is None
    assert spec.tz == "UTC"


@pytest.mark.parametrize(
    ("every", "words"),
    [
        (2, 'every=2 has no unit: write every=timedelta(seconds=2) or every="2s"'),
        (0.5, 'every=0.5 has no unit: write every=timedelta(seconds=0.5) or every="0.5s"'),
        (30_000, 'every=30000 has no unit: write every=timedelta(seconds=30000) or every="30000s"'),
        ("2", "every: duration '2' needs a unit, e.g. 2s or 2ms"),
        (True, "every: expected a timedelta or a duration with its unit"),
        (None.__class__, "every: expected a timedelta or a duration with its unit"),
    ],
)
def test_a_bare_number_is_refused_with_both_forms(every: object, words: str) -> None:
    """every= has no default unit: the numbers every other time of the package takes are
    milliseconds, and every= once took seconds."""
    with pytest.raises(InvalidSchedule) as raised:
        parse_spec(every=every)  # type: ignore[arg-type]
    assert str(raised.value) == words or str(raised.value).startswith(words)


def test_constructor_rejects_invalid_specs() -> None:
    with pytest.raises(InvalidSchedule, match="every"):
        ScheduleSpec(cron=None, every_ms=99)
    with pytest.raises(InvalidSchedule, match="exactly one"):
        ScheduleSpec(cron="* * * * *", every_ms=1000)
    with pytest.raises(InvalidSchedule, match="tz applies to cron schedules only"):
        ScheduleSpec(cron=None, every_ms=1000, tz="Europe/Berlin")


# -- describe ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "every, text",
    [
        ("30s", "every 30s"),
        ("1.5s", "every 1.5s"),
        ("100ms", "every 0.1s"),
        ("250ms", "every 0.25s"),
        ("90s", "every 90s"),
        ("120s", "every 2m"),
        (dt.timedelta(hours=2), "every 2h"),
        (dt.timedelta(minutes=90), "every 90m"),
        ("1d", "every 24h"),
    ],
)
def test_describe_every(every: str | dt.timedelta, text: str) -> None:
    spec = parse_spec(every=every)
    assert spec.describe() == text
    # What describe() shows after "every " reads back as the same schedule.
    assert parse_spec(every=text.removeprefix("every ")) == spec


def test_describe_cron() -> None:
    assert parse_spec(cron="*/5 * * * *", tz="Europe/Berlin").describe() == "cron */5 * * * * (Europe/Berlin)"
    assert parse_spec(cron="0  9 * * *").describe() == "cron 0 9 * * * (UTC)"


# -- fixed intervals -----------------------------------------------------------------


def test_every_ticks_align_to_the_anchor() -> None:
    spec = parse_spec(every="10s")  # 10_000 ms
    anchor = 1_000_003
    # After the anchor.
    assert spec.next_after(1_000_004, anchor) == 1_010_003
    assert spec.next_after(1_025_000, anchor) == 1_030_003
    # Exactly on a tick: the next one, never the same.
    assert spec.next_after(1_010_003, anchor) == 1_020_003
    assert spec.next_after(anchor, anchor) == 1_010_003
    # Before the anchor: ticks extend backwards (k < 0).
    assert spec.next_after(980_000, anchor) == 980_003
    assert spec.next_after(980_003, anchor) == 990_003
    assert spec.next_after(anchor - 1, anchor) == anchor


def test_every_has_no_drift_far_from_the_anchor() -> None:
    spec = parse_spec(every="300ms")
    anchor = 7
    far = 10**15
    tick = spec.next_after(far, anchor)
    assert tick > far
    assert (tick - anchor) % 300 == 0
    assert tick - far <= 300


def test_every_from_timedelta_matches_seconds() -> None:
    a = parse_spec(every=dt.timedelta(minutes=1))
    b = parse_spec(every="60s")
    assert a == b
    assert a.next_after(59_999, 0) == 60_000
    assert a.next_after(60_000, 0) == 120_000


def test_every_ticks_between() -> None:
    spec = parse_spec(every="1s")
    assert spec.ticks_between(1000, 5000, 0, 100) == [2000, 3000, 4000, 5000]
    assert spec.ticks_between(999, 5000, 0, 100) == [1000, 2000, 3000, 4000, 5000]
    assert spec.ticks_between(1000, 5999, 500, 100) == [1500, 2500, 3500, 4500, 5500]
    # The last `limit`, ascending.
    assert spec.ticks_between(0, 10_000, 0, 3) == [8000, 9000, 10_000]
    assert spec.ticks_between(5000, 5000, 0, 10) == []
    assert spec.ticks_between(5000, 4000, 0, 10) == []
    assert spec.ticks_between(1001, 1999, 0, 10) == []
    # A huge range with a small limit is computed, not enumerated.
    assert spec.ticks_between(0, 10**15, 0, 2) == [10**15 - 1000, 10**15]
    with pytest.raises(ValueError):
        spec.ticks_between(0, 10_000, 0, 0)


# -- cron in UTC ---------------------------------------------------------------------


def test_cron_utc_next_after() -> None:
    spec = parse_spec(cron="*/5 * * * *")
    assert spec.next_after(ms(2026, 6, 1, 12, 3, 10), anchor_ms=123) == ms(2026, 6, 1, 12, 5)
    # Exactly on a tick: the next one.
    assert spec.next_after(ms(2026, 6, 1, 12, 5), 0) == ms(2026, 6, 1, 12, 10)
    # Just before a tick, with sub-second parts.
    assert spec.next_after(ms(2026, 6, 1, 12, 4, 59) + 999, 0) == ms(2026, 6, 1, 12, 5)
    assert spec.next_after(ms(2026, 6, 1, 12, 5) + 1, 0) == ms(2026, 6, 1, 12, 10)
    # The anchor is ignored for cron.
    assert spec.next_after(ms(2026, 6, 1, 12, 3), 7) == spec.next_after(ms(2026, 6, 1, 12, 3), 99_999)


def test_cron_utc_ticks_between() -> None:
    spec = parse_spec(cron="*/5 * * * *")
    start, end = ms(2026, 6, 1, 12), ms(2026, 6, 1, 13)
    ticks = spec.ticks_between(start, end, 0, 1000)
    assert len(ticks) == 12
    assert ticks[0] == ms(2026, 6, 1, 12, 5)
    assert ticks[-1] == end
    assert all(b - a == 300_000 for a, b in zip(ticks, ticks[1:], strict=False))
    # limit keeps the most recent ones.
    assert spec.ticks_between(start, end, 0, 3) == [ms(2026, 6, 1, 12, 50), ms(2026, 6, 1, 12, 55), end]
    assert spec.ticks_between(start, end, 0, 1) == [end]
    assert spec.ticks_between(end, end, 0, 5) == []


def test_cron_ticks_between_sparse_and_long_ranges() -> None:
    # Yearly: the window has to reach far back to find the last ticks.
    yearly = parse_spec(cron="0 0 1 1 *")
    assert yearly.ticks_between(ms(2000, 6, 1), ms(2026, 6, 1), 0, 2) == [ms(2025, 1, 1), ms(2026, 1, 1)]
    assert yearly.ticks_between(ms(2024, 6, 1), ms(2026, 6, 1), 0, 10) == [ms(2025, 1, 1), ms(2026, 1, 1)]
    # Every minute over ten years, last 3: no need to walk five million ticks.
    minutely = parse_spec(cron="* * * * *")
    until = ms(2026, 6, 1, 12, 0, 30)
    expected = [ms(2026, 6, 1, 11, 58), ms(2026, 6, 1, 11, 59), ms(2026, 6, 1, 12)]
    assert minutely.ticks_between(ms(2016, 1, 1), until, 0, 3) == expected
    # A bursty schedule: sixty ticks in one hour a day.
    bursty = parse_spec(cron="* 3 * * *")
    assert bursty.ticks_between(ms(2026, 1, 1), ms(2026, 6, 1, 12), 0, 2) == [
        ms(2026, 6, 1, 3, 58),
        ms(2026, 6, 1, 3, 59),
    ]


def test_cron_ticks_between_agrees_with_next_after() -> None:
    spec = parse_spec(cron="7,37 */3 * * MON-FRI", tz="Europe/Berlin")
    after, until = ms(2026, 3, 20), ms(2026, 4, 10)
    chained = []
    tick = spec.next_after(after, 0)
    while tick <= until:
        chained.append(tick)
        tick = spec.next_after(tick, 0)
    assert len(chained) > 50
    assert spec.ticks_between(after, until, 0, 10_000) == chained
    assert spec.ticks_between(after, until, 0, 7) == chained[-7:]


def test_cron_day_of_month_or_day_of_week() -> None:
    # Debian cron: both restricted -> either matches. 2026-06-01 is a Monday.
    spec = parse_spec(cron="0 12 15 * MON")
    assert spec.next_after(ms(2026, 5, 31), 0) == ms(2026, 6, 1, 12)
    assert spec.next_after(ms(2026, 6, 12), 0) == ms(2026, 6, 15, 12)  # the 15th, a Monday too
    assert spec.next_after(ms(2026, 6, 15, 12), 0) == ms(2026, 6, 22, 12)


# -- daylight-saving time ------------------------------------------------------------


def test_berlin_spring_forward_fixed_time_runs_once_after_the_gap() -> None:
    # 2026-03-29: 02:00 CET -> 03:00 CEST (01:00 UTC); 02:30 local does not exist.
    spec = parse_spec(cron="30 2 * * *", tz="Europe/Berlin")
    ticks = spec.ticks_between(ms(2026, 3, 27, 12), ms(2026, 3, 31, 12), 0, 100)
    assert ticks == [
        ms(2026, 3, 28, 1, 30),  # 02:30 CET
        ms(2026, 3, 29, 1, 0),  # 03:00 CEST: the first valid instant after the gap
        ms(2026, 3, 30, 0, 30),  # 02:30 CEST
        ms(2026, 3, 31, 0, 30),
    ]
    assert [local(t, BERLIN).strftime("%m-%d %H:%M %Z") for t in ticks] == [
        "03-28 02:30 CET",
        "03-29 03:00 CEST",
        "03-30 02:30 CEST",
        "03-31 02:30 CEST",
    ]
    assert spec.next_after(ms(2026, 3, 29, 0, 59, 59), 0) == ms(2026, 3, 29, 1, 0)
    assert spec.next_after(ms(2026, 3, 29, 1, 0), 0) == ms(2026, 3, 30, 0, 30)


def test_berlin_fall_back_fixed_time_runs_once_on_the_first_pass() -> None:
    # 2026-10-25: 03:00 CEST -> 02:00 CET (01:00 UTC); 02:30 local happens twice.
    spec = parse_spec(cron="30 2 * * *", tz="Europe/Berlin")
    ticks = spec.ticks_between(ms(2026, 10, 23, 12), ms(2026, 10, 27, 12), 0, 100)
    assert ticks == [
        ms(2026, 10, 24, 0, 30),  # 02:30 CEST
        ms(2026, 10, 25, 0, 30),  # 02:30 CEST, first pass; not again at 01:30 UTC (02:30 CET)
        ms(2026, 10, 26, 1, 30),  # 02:30 CET
        ms(2026, 10, 27, 1, 30),
    ]
    on_the_day = [t for t in ticks if local(t, BERLIN).date() == dt.date(2026, 10, 25)]
    assert on_the_day == [ms(2026, 10, 25, 0, 30)]


def test_berlin_fall_back_asked_from_the_second_pass() -> None:
    # cronsim walks fixed-time jobs in naive local time: asked at 02:15 CET (second
    # pass) it answers 02:30 CEST, which is earlier. The answer must be strictly later.
    spec = parse_spec(cron="30 2 * * *", tz="Europe/Berlin")
    second_pass = ms(2026, 10, 25, 1, 15)  # 02:15 CET
    assert local(second_pass, BERLIN).fold == 1
    assert spec.next_after(second_pass, 0) == ms(2026, 10, 26, 1, 30)
    assert spec.ticks_between(second_pass, ms(2026, 10, 26, 12), 0, 10) == [ms(2026, 10, 26, 1, 30)]
    # From inside the first pass, before 02:30 CEST, the day's tick is still ahead.
    assert spec.next_after(ms(2026, 10, 25, 0, 15), 0) == ms(2026, 10, 25, 0, 30)


def test_berlin_fall_back_wildcard_runs_by_real_time() -> None:
    spec = parse_spec(cron="*/30 * * * *", tz="Europe/Berlin")
    ticks = spec.ticks_between(ms(2026, 10, 24, 23), ms(2026, 10, 25, 3), 0, 100)
    assert len(ticks) == len(set(ticks))
    assert all(a < b for a, b in zip(ticks, ticks[1:], strict=False))
    # Every 30 real minutes straight through the change: both passes of 02:xx run.
    assert ticks == list(range(ms(2026, 10, 24, 23, 30), ms(2026, 10, 25, 3) + 1, 1_800_000))
    assert [local(t, BERLIN).strftime("%H:%M %Z") for t in ticks[1:5]] == [
        "02:00 CEST",
        "02:30 CEST",
        "02:00 CET",
        "02:30 CET",
    ]


def test_berlin_spring_forward_wildcard_runs_by_real_time() -> None:
    spec = parse_spec(cron="*/30 * * * *", tz="Europe/Berlin")
    ticks = spec.ticks_between(ms(2026, 3, 28, 23), ms(2026, 3, 29, 3), 0, 100)
    assert ticks == list(range(ms(2026, 3, 28, 23, 30), ms(2026, 3, 29, 3) + 1, 1_800_000))
    assert [local(t, BERLIN).strftime("%H:%M") for t in ticks[2:5]] == ["01:30", "03:00", "03:30"]


def test_berlin_wildcard_minute_in_a_skipped_hour_does_not_run() -> None:
    # Debian cron: a job with a wildcard field runs by the new time, so "*/30 2" has
    # no 02:xx on the spring-forward day, and both passes of 02:xx on fall-back day.
    spec = parse_spec(cron="*/30 2 * * *", tz="Europe/Berlin")
    assert spec.ticks_between(ms(2026, 3, 27, 12), ms(2026, 3, 30, 12), 0, 100) == [
        ms(2026, 3, 28, 1, 0),
        ms(2026, 3, 28, 1, 30),
        ms(2026, 3, 30, 0, 0),
        ms(2026, 3, 30, 0, 30),
    ]
    assert spec.ticks_between(ms(2026, 10, 24, 12), ms(2026, 10, 25, 12), 0, 100) == [
        ms(2026, 10, 25, 0, 0),
        ms(2026, 10, 25, 0, 30),
        ms(2026, 10, 25, 1, 0),
        ms(2026, 10, 25, 1, 30),
    ]


def test_new_york_dst() -> None:
    # 2026-03-08: 02:00 EST -> 03:00 EDT (07:00 UTC); 2026-11-01: 02:00 EDT -> 01:00 EST (06:00 UTC).
    spring = parse_spec(cron="30 2 * * *", tz="America/New_York")
    assert spring.ticks_between(ms(2026, 3, 7, 12), ms(2026, 3, 9, 12), 0, 10) == [
        ms(2026, 3, 8, 7, 0),  # 03:00 EDT: 02:30 does not exist that day
        ms(2026, 3, 9, 6, 30),  # 02:30 EDT
    ]
    fall = parse_spec(cron="30 1 * * *", tz="America/New_York")
    ticks = fall.ticks_between(ms(2026, 10, 31, 12), ms(2026, 11, 2, 12), 0, 10)
    assert ticks == [
        ms(2026, 11, 1, 5, 30),  # 01:30 EDT, first pass only (not 06:30 UTC, 01:30 EST)
        ms(2026, 11, 2, 6, 30),  # 01:30 EST
    ]
    assert [local(t, NEW_YORK).strftime("%m-%d %H:%M %Z") for t in ticks] == ["11-01 01:30 EDT", "11-02 01:30 EST"]


# -- JSON ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        parse_spec(every="1.5s"),
        parse_spec(every=dt.timedelta(hours=2)),
        parse_spec(cron="*/5 * * * *"),
        parse_spec(cron="30 2 * * MON-FRI", tz="Europe/Berlin"),
    ],
)
def test_json_round_trip(spec: ScheduleSpec) -> None:
    text = spec.to_json()
    assert " " not in text.replace(spec.cron or "", "")
    back = ScheduleSpec.from_json(text)
    assert back == spec
    assert back.to_json() == text
    assert ScheduleSpec.from_json(text.encode()) == spec


def test_json_is_canonical() -> None:
    assert parse_spec(every="30s").to_json() == '{"cron":null,"every_ms":30000,"tz":"UTC"}'
    assert (
        parse_spec(cron="*/5  *  * * *", tz="Europe/Berlin").to_json()
        == '{"cron":"*/5 * * * *","every_ms":null,"tz":"Europe/Berlin"}'
    )
    # Equal specs, equal text, however they were written.
    assert parse_spec(every=dt.timedelta(seconds=30)).to_json() == parse_spec(every="0.5m").to_json()
    assert parse_spec(cron="0 9 * * mon").to_json() == parse_spec(cron=" 0 9 * * MON").to_json()
    # Key order in the input does not matter.
    assert ScheduleSpec.from_json('{"tz":"UTC","every_ms":30000,"cron":null}') == parse_spec(every="30s")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        b"\xff\xfe",
        "[]",
        "null",
        "42",
        "{}",
        '{"cron":null,"every_ms":null,"tz":"UTC"}',
        '{"cron":"*/5 * * * *","every_ms":1000,"tz":"UTC"}',
        '{"cron":"61 * * * *","every_ms":null,"tz":"UTC"}',
        '{"cron":"* * * * *","every_ms":null,"tz":"Nowhere/Town"}',
        '{"cron":5,"every_ms":null,"tz":"UTC"}',
        '{"cron":null,"every_ms":"1000","tz":"UTC"}',
        '{"cron":null,"every_ms":1000.5,"tz":"UTC"}',
        '{"cron":null,"every_ms":true,"tz":"UTC"}',
        '{"cron":null,"every_ms":50,"tz":"UTC"}',
        '{"cron":null,"every_ms":1000,"tz":"Europe/Berlin"}',
        '{"cron":null,"every_ms":1000,"tz":7}',
        '{"cron":null,"every_ms":1000,"tz":"UTC","extra":1}',
    ],
)
def test_from_json_garbage(text: str | bytes) -> None:
    with pytest.raises(InvalidSchedule):
        ScheduleSpec.from_json(text)


# -- catch-up ------------------------------------------------------------------------


def test_catch_up_policies() -> None:
    spec = parse_spec(every="1s")
    assert CATCH_UP_POLICIES == ("one", "all", "none")
    assert catch_up_ticks(spec, 1000, 4500, 0, "one") == ([4000], 5000)
    assert catch_up_ticks(spec, 1000, 4500, 0, "all") == ([1000, 2000, 3000, 4000], 5000)
    assert catch_up_ticks(spec, 1000, 4500, 0, "none") == ([], 5000)
    assert catch_up_ticks(spec, 1000, 4500, 0, "all", limit=2) == ([3000, 4000], 5000)


def test_catch_up_now_exactly_on_a_tick() -> None:
    spec = parse_spec(every="1s")
    assert catch_up_ticks(spec, 1000, 4000, 0, "all") == ([1000, 2000, 3000, 4000], 5000)
    assert catch_up_ticks(spec, 1000, 1000, 0, "one") == ([1000], 2000)


def test_catch_up_nothing_missed_keeps_the_due_tick() -> None:
    spec = parse_spec(every="1s")
    for policy in CATCH_UP_POLICIES:
        assert catch_up_ticks(spec, 5000, 4500, 0, policy) == ([], 5000)
        assert catch_up_ticks(spec, 5000, 4999, 0, policy) == ([], 5000)


def test_a_chain_that_ran_out_resumed_in_the_same_millisecond_gets_no_tick_off_the_grid() -> None:
    # A chain that ran out of times after its tick at 5000 waits from 5001 (CI, 2026-12-07:
    # a windowed schedule resumed at 5000 ran a tick at 5001).
    every, cron = parse_spec(every="1s"), parse_spec(cron="0 * * * *")
    for policy in CATCH_UP_POLICIES:
        assert catch_up_ticks(every, 5001, 5000, 0, policy) == ([], 6000)
        assert catch_up_ticks(every, 5001, 5000, 500, policy) == ([], 5500)
        hour = ms(2026, 6, 1, 9)
        assert catch_up_ticks(cron, hour + 1, hour, 0, policy) == ([], ms(2026, 6, 1, 10))


def test_catch_up_cron() -> None:
    spec = parse_spec(cron="0 * * * *")
    last_due, now = ms(2026, 6, 1, 9), ms(2026, 6, 1, 12, 30)
    hours = [ms(2026, 6, 1, h) for h in (9, 10, 11, 12)]
    assert catch_up_ticks(spec, last_due, now, 0, "all") == (hours, ms(2026, 6, 1, 13))
    assert catch_up_ticks(spec, last_due, now, 0, "one") == ([ms(2026, 6, 1, 12)], ms(2026, 6, 1, 13))
    assert catch_up_ticks(spec, last_due, now, 0, "none") == ([], ms(2026, 6, 1, 13))


def test_catch_up_invalid_policy() -> None:
    with pytest.raises(InvalidSchedule, match="catch_up: unknown policy 'latest'"):
        catch_up_ticks(parse_spec(every="1s"), 1000, 4500, 0, "latest")


# -- policies (issue 50) ------------------------------------------------------------------


def test_a_policy_takes_durations_as_timedeltas_or_texts_with_a_unit_and_aware_datetimes() -> None:
    start = dt.datetime(2030, 1, 1, tzinfo=BERLIN)
    policy, errors = parse_policy(
        parse_spec(every="1m"),
        overlap="skip",
        jitter="30s",
        start_deadline=dt.timedelta(minutes=2),
        start=start,
        end=start + dt.timedelta(days=1),
        limit=10,
    )
    assert errors == []
    assert policy == Policy("skip", 30_000, 120_000, ms(2029, 12, 31, 23), ms(2030, 1, 1, 23), 10)
    assert Policy.from_stored({"actor": "a", **policy.stored()}) == policy  # type: ignore[union-attr]
    assert parse_policy(parse_spec(every="1m")) == (Policy(), [])
    assert Policy().stored() == {}  # the defaults are not stored


def test_every_bad_policy_value_is_named_once() -> None:
    policy, errors = parse_policy(
        parse_spec(every="10s"),
        overlap="forbid",
        jitter=1.5,
        start_deadline="soon",
        start=dt.datetime(2030, 1, 1),
        end=dt.date(2030, 1, 2),
        limit=True,
    )
    assert policy is None
    assert [e.split(":")[0].split("=")[0] for e in errors] == [
        "overlap",
        "jitter",
        "start_deadline",
        "start",
        "end",
        "limit",
    ]
    assert parse_policy(parse_spec(every="10s"), jitter="10s")[1] == [
        "jitter: must be shorter than the shortest time between two ticks (10000 ms for every 10s), got 10000 ms"
    ]
    # A cron expression's shortest gap: 9:00 and 9:05 every day
    assert "(300000 ms" in parse_policy(parse_spec(cron="0,5 9 * * *"), jitter="6m")[1][0]
    assert parse_policy(parse_spec(cron="0,5 9 * * *"), jitter="4m")[1] == []


def test_the_jitter_of_a_tick_is_the_same_every_time_within_its_bound_and_spread() -> None:
    offsets = [jitter_offset(f"s{n}", 1_800_000_000_000, 60_000) for n in range(1_000)]
    assert offsets == [jitter_offset(f"s{n}", 1_800_000_000_000, 60_000) for n in range(1_000)]
    assert 0 <= min(offsets) < 1_000 and 59_000 < max(offsets) < 60_000
    assert 400 < sum(o < 30_000 for o in offsets) < 600
    assert jitter_offset("s", 1, 0) == jitter_offset("s", 1, 1) == 0
    assert jitter_offset("s", 1_800_000_000_000, 60_000) != jitter_offset("s", 1_800_000_060_000, 60_000)
