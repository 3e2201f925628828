"""Routing rules (the same as crates/client/src/router.rs)."""

import pytest

from fencelock import InvalidArgumentError, Reason
from fencelock._policy import classify
from fencelock._router import Router, normalize
from fencelock.errors import ErrorDetail


def test_endpoints_are_validated_normalised_and_deduplicated() -> None:
    r = Router(["127.0.0.1:7001", "http://127.0.0.1:7002", "127.0.0.1:7001"], tls=False)
    assert r.seeds == ["http://127.0.0.1:7001", "http://127.0.0.1:7002"]
    assert Router(["10.0.0.1:7001"], tls=True).seeds == ["https://10.0.0.1:7001"]
    for bad in (["x"], [""], ["ftp://a:1"], ["http://"], [f"10.0.0.{i}:1" for i in range(17)], []):
        with pytest.raises(InvalidArgumentError):
            Router(bad, tls=False)
    assert normalize("localhost:1", tls=True) == "https://localhost:1"


def test_hints_are_learned_per_shard_and_failures_move_on() -> None:
    r = Router(["a:1", "b:2", "c:3"], tls=False)
    assert r.target("acme/x") == "http://a:1"
    hint = classify("UNAVAILABLE", "", ErrorDetail(reason=int(Reason.NOT_LEADER), leader_address="c:3", shard_id=5))
    assert r.reroute(hint, "acme/x", 5, "http://a:1") == "http://c:3"
    assert r.target("acme/x") == "http://c:3" and r.target_for_shard(5) == "http://c:3"
    # The leader dies: forgotten, and the next seed is used.
    down = classify("UNAVAILABLE", "connection refused", None)
    assert r.reroute(down, "acme/x", 5, "http://c:3") == "http://a:1"
    # The preferred seed dies too: move to the next one.
    assert r.reroute(down, "acme/x", 5, "http://a:1") == "http://b:2"
    # EPOCH_NOT_MATCH drops what was known of the resource's shard.
    r.learn("acme/y", 7, "http://c:3")
    stale = classify("ABORTED", "", ErrorDetail(reason=int(Reason.EPOCH_NOT_MATCH), shard_id=7))
    assert r.reroute(stale, "acme/y", 7, "http://c:3") == "http://b:2"
    # A detail-less failure that is not a transport failure stays put (and fails).
    assert r.reroute(classify("UNIMPLEMENTED", "", None), "acme/y", None, "http://b:2") == "http://b:2"
