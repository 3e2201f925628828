"""The error contract, checked against errors.proto itself."""

import re
from pathlib import Path

import pytest

from fencelock import Reason, RetryPolicy
from fencelock._policy import Advice, Backoff, Reroute, classify, default_retry, stop_by
from fencelock.errors import ErrorDetail
from fencelock.v1 import errors_pb2

PROTO = Path(__file__).resolve().parents[3] / "proto" / "fencelock" / "v1" / "errors.proto"


def test_reason_mirror_matches_the_generated_enum() -> None:
    generated = {v.name.removeprefix("REASON_"): v.number for v in errors_pb2.Reason.DESCRIPTOR.values}
    assert generated == {r.name: r.value for r in Reason}


def test_default_retry_matches_the_comments_in_errors_proto() -> None:
    text = PROTO.read_text()
    # Each reason's comment ends with "Retry: X" before "REASON_NAME = n;".
    blocks = re.findall(r"((?://[^\n]*\n\s*)+)REASON_([A-Z_]+) = (\d+);", text)
    assert len(blocks) == len(Reason)
    for comment, name, _ in blocks:
        m = re.search(r"Retry: (NEVER|IMMEDIATELY|BACKOFF|AFTER)", comment)
        assert m, name
        assert default_retry(Reason[name]) is RetryPolicy[m.group(1)], name


def d(reason: Reason, **kw: object) -> ErrorDetail:
    return ErrorDetail(reason=int(reason), **kw)  # type: ignore[arg-type]


def test_not_leader_with_a_hint_goes_there_at_once() -> None:
    f = classify("UNAVAILABLE", "", d(Reason.NOT_LEADER, leader_address="10.0.0.2:7001", shard_id=3))
    assert f.advice is Advice.NOW and f.reroute is Reroute.TO and f.to == "10.0.0.2:7001"


@pytest.mark.parametrize("reason", [Reason.LEASE_NOT_HELD, Reason.INVALID_RESOURCE, Reason.REQUEST_ID_REUSED,
                                    Reason.WAIT_CANCELLED, Reason.HOLD_LIMIT_REACHED, Reason.PERMISSION_DENIED])
def test_never_is_never_retried(reason: Reason) -> None:
    assert classify("X", "", d(reason)).advice is Advice.FAIL


def test_an_explicit_policy_wins_and_unknown_reasons_fall_back_on_the_code() -> None:
    assert classify("UNAVAILABLE", "", d(Reason.NO_QUORUM, retry=int(RetryPolicy.NEVER))).advice is Advice.FAIL
    assert classify("UNAVAILABLE", "", ErrorDetail(reason=9999)).advice is Advice.BACKOFF
    assert classify("FAILED_PRECONDITION", "", ErrorDetail(reason=9999)).advice is Advice.FAIL
    f = classify("UNAVAILABLE", "connection refused", None)
    assert f.advice is Advice.BACKOFF and f.reroute is Reroute.ELSEWHERE
    assert classify("UNIMPLEMENTED", "", None).advice is Advice.FAIL
    busy = classify("UNAVAILABLE", "", d(Reason.SERVER_BUSY, retry_after_ms=30))
    assert busy.advice is Advice.BACKOFF and busy.delay_s == pytest.approx(0.03)
    assert classify("ABORTED", "", d(Reason.EPOCH_NOT_MATCH)).reroute is Reroute.REFRESH


def test_backoff_doubles_within_bounds_after_the_immediate_retries() -> None:
    b = Backoff(0.1, 1.0)
    now = classify("UNAVAILABLE", "", d(Reason.OUTCOME_UNKNOWN))
    assert [b.delay(now) for _ in range(5)] == [0.0] * 5
    steps = [b.delay(now) for _ in range(8)]
    for i, s in enumerate(steps):
        step = min(0.1 * 2 ** i, 1.0)
        assert step / 2 <= s <= step, (i, s)


def test_stop_by_counts_from_the_send_time_minus_a_margin() -> None:
    assert stop_by(100.0, 30_000, 5) == pytest.approx(100.0 + 30.0 - 1.5)
    assert stop_by(0.0, 10, 5) == pytest.approx(0.009)  # margin never zero
