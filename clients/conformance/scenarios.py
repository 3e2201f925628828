"""The conformance scenarios. Each takes an agent factory (one client
library), the cluster and the fenced store, and raises AssertionError when
the client breaks a rule. test_conformance.py runs them for every agent;
test_broken_clients.py runs them against deliberately broken clients and
expects them to FAIL."""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from agents import Agent
from cluster import Cluster
from fenced_store import FencedStore
from proxy import ReplyDroppingProxy

TENANT = "acme"


def fresh(name: str) -> str:
    return f"{TENANT}/conformance/{name}-{uuid.uuid4().hex[:10]}"


def wait_for(cond: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(step)


# ---- basics: grant, renew past the TTL, release -------------------------------------------

def renewals_keep_the_lease_past_its_ttl(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """A held lease is renewed in the background: after 2.5 TTLs it is still
    held by the same token, and the stop-by deadline moved forward."""
    a: Agent = agents()
    r = fresh("renew")
    got = a.ok("acquire", resource=r, ttl_ms=1500, wait_ms=0)
    token = int(got["token"])
    assert token > 0 and got["lease_ttl_ms"] == 1500 and got["deduplicated"] is False
    assert 0 < got["stop_by_in_ms"] < 1500, f"stop-by must keep a margin below the TTL: {got.data}"
    time.sleep(3.75)
    st = a.ok("status", handle=got["handle"])
    assert st["held"] is True and st["lost"] is False, f"the lease was not kept alive: {st.data}"
    assert st["stop_by_in_ms"] > 0
    g = cluster.get(r)
    assert g.held and g.fencing_token == token, f"the server does not show our holding: {g}"
    assert a.ok("release", handle=got["handle"])["released"] is True
    g = cluster.get(r)
    assert not g.held
    again = a.ok("acquire", resource=r, ttl_ms=1500, wait_ms=0)
    assert int(again["token"]) > token
    a.ok("release", handle=again["handle"])


# ---- request ids ---------------------------------------------------------------------------

def each_logical_acquire_has_its_own_request_id(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """Three acquire/release rounds on one resource: three request ids, three
    fresh grants with rising tokens, none deduplicated."""
    a: Agent = agents()
    r = fresh("ids")
    ids, tokens = [], []
    for _ in range(3):
        got = a.call("acquire", resource=r, ttl_ms=5000, wait_ms=0)
        assert got.ok, f"a new logical acquire after a release must be granted: {got.error}"
        assert got["deduplicated"] is False, "a new logical acquire was answered as a retry"
        ids.append(got["request_id"])
        tokens.append(int(got["token"]))
        assert a.ok("release", handle=got["handle"])["released"] is True
    assert len(set(ids)) == 3, f"request ids reused across logical acquires: {ids}"
    assert tokens == sorted(tokens) and len(set(tokens)) == 3, tokens
    # Two different resources acquired at the same time: different ids too.
    h1 = a.ok("acquire", resource=fresh("ids-a"), ttl_ms=5000, wait_ms=0)
    h2 = a.ok("acquire", resource=fresh("ids-b"), ttl_ms=5000, wait_ms=0)
    assert h1["request_id"] != h2["request_id"]
    for h in (h1, h2):
        a.ok("release", handle=h["handle"])


def explicit_request_id_retry_returns_the_same_lease(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """Retrying with the request id of a granted acquire (from another
    process of the same identity, as after a crash) returns the original
    lease, never a second one."""
    a: Agent = agents()
    b: Agent = agents()
    r = fresh("explicit")
    rid = uuid.uuid4().hex
    first = a.ok("acquire", resource=r, ttl_ms=5000, wait_ms=0, request_id=rid)
    assert first["request_id"] == rid
    retry = b.ok("acquire", resource=r, ttl_ms=5000, wait_ms=0, request_id=rid)
    assert retry["deduplicated"] is True, f"a retry was not recognised: {retry.data}"
    assert retry["token"] == first["token"], "a retry with the same request id made a second grant"
    g = cluster.get(r)
    assert g.held and g.fencing_token == int(first["token"]) and g.last_token == int(first["token"])
    a.ok("release", handle=first["handle"])


def lost_reply_is_retried_with_the_same_request_id(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """The acquire commits but its reply is lost (the proxy holds it, then
    cuts the connection): the client's retry must carry the same request id
    and come back with the original grant (deduplicated), not LOCK_HELD and
    not a second lease."""
    proxy = ReplyDroppingProxy(cluster.address(1))
    try:
        a: Agent = agents(endpoints=[proxy.address])
        r = fresh("lostreply")
        a.ok("get", resource=r, timeout=20)  # the connection is up before replies are held
        proxy.hold()
        pending = a.send("acquire", resource=r, ttl_ms=10_000, wait_ms=0)
        g = wait_for(lambda: (lambda x: x if x.held else None)(cluster.get(r)), 15,
                     "the acquire to be committed on the server")
        time.sleep(0.2)
        proxy.cut()
        got = a.wait(pending, 30)
        assert got.ok, f"the retry after a lost reply failed: {got.error}"
        assert got["deduplicated"] is True, f"the retry was not answered from the dedup table: {got.data}"
        assert int(got["token"]) == g.fencing_token, "the retry made a second grant"
        after = cluster.get(r)
        assert after.held and after.fencing_token == g.fencing_token and after.last_token == g.fencing_token
        a.ok("release", handle=got["handle"])
    finally:
        proxy.close()


# ---- pause past the TTL, fencing -----------------------------------------------------------

def paused_client_loses_and_its_stale_write_is_fenced(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """A holder is SIGSTOPped past its TTL; another client gets the lock and
    writes. On SIGCONT the old holder's library reports the lease not held
    (its stop-by passed), refuses a checked write, and a write that skips
    the check is rejected by the fenced store."""
    a: Agent = agents()
    b: Agent = agents()
    r = fresh("pause")
    t0 = time.monotonic()
    ga = a.ok("acquire", resource=r, ttl_ms=2000, wait_ms=0)
    a_stop_by_upper = time.monotonic() + ga["stop_by_in_ms"] / 1000.0  # in the suite's clock
    assert ga["stop_by_in_ms"] <= 2000 and time.monotonic() - t0 < 2.0
    w = a.ok("fenced_write", handle=ga["handle"], store=store.address, key=r, value="from-a")
    assert w["accepted"] is True

    a.pause()
    try:
        gb = b.ok("acquire", resource=r, ttl_ms=5000, wait_ms=15_000, timeout=40)
        b_granted_at = time.monotonic()
        assert int(gb["token"]) > int(ga["token"]), "a new grant must carry a greater token"
        assert a_stop_by_upper <= b_granted_at + 0.05, (
            "the paused client's stop-by was later than the next holder's grant: "
            f"stop-by {a_stop_by_upper - t0:.3f}s, next grant {b_granted_at - t0:.3f}s after the acquire")
        wb = b.ok("fenced_write", handle=gb["handle"], store=store.address, key=r, value="from-b")
        assert wb["accepted"] is True
    finally:
        a.resume()

    st = a.ok("status", handle=ga["handle"], timeout=10)
    assert st["held"] is False, f"a client past its stop-by still says it holds the lock: {st.data}"
    assert st["stop_by_in_ms"] <= 0
    lost = a.ok("wait_lost", handle=ga["handle"], timeout_ms=3000, timeout=10)
    assert lost["lost"] is True and lost["lost_reason"] in ("unconfirmed", "not_held"), lost.data
    checked = a.call("fenced_write", handle=ga["handle"], store=store.address, key=r, value="stale-checked")
    assert not checked.ok and checked.error.get("kind") == "lost", (
        f"a write after the lease was lost must be refused by the client: {checked.data}")
    stale = a.ok("fenced_write", handle=ga["handle"], store=store.address, key=r, value="stale",
                 check_lease=False)
    assert stale["accepted"] is False, "the fenced store accepted the paused holder's stale token"
    assert int(stale["highest"]) == int(gb["token"])
    assert store.value(r) == "from-b"
    b.ok("release", handle=gb["handle"])


def unconfirmed_lease_is_lost_at_its_stop_by(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """Every node is frozen (SIGSTOP): no renewal can be confirmed. The
    library must report the lease lost at its stop-by deadline (its own
    clock), not later, and never say held after it."""
    a: Agent = agents()
    r = fresh("unconfirmed")
    ga = a.ok("acquire", resource=r, ttl_ms=2000, wait_ms=0)
    cluster.pause_all()
    try:
        lost = a.ok("wait_lost", handle=ga["handle"], timeout_ms=6000, timeout=20)
        assert lost["lost"] is True and lost["lost_reason"] == "unconfirmed", (
            f"renewals could not be confirmed, yet no lost signal: {lost.data}")
        # Fired at stop-by: not before it without cause, and not much later
        # (a generous bound for a loaded machine).
        assert -1000 <= lost["stop_by_in_ms"] <= 50, f"lost fired {-lost['stop_by_in_ms']} ms after stop-by"
        st = a.ok("status", handle=ga["handle"])
        assert st["held"] is False and st["lost"] is True, st.data
    finally:
        cluster.resume_all()
    a.call("release", handle=ga["handle"], timeout=30)


# ---- leader kill -------------------------------------------------------------------------

def leader_kill_mid_renew_never_makes_two_holders(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    """kill -9 of the shard leader while a lease is held and renewed: the
    lease stays held (renewals fail over) or is reported lost, and never
    does another client get the lock while this one still says held."""
    a: Agent = agents()
    b: Agent = agents()
    r = fresh("leaderkill")
    ga = a.ok("acquire", resource=r, ttl_ms=3000, wait_ms=0)
    token = int(ga["token"])
    time.sleep(1.2)  # a renewal has happened
    leader = cluster.leader_of(r)
    cluster.kill(leader)
    try:
        end = time.monotonic() + 7.0  # more than two TTLs
        held_throughout = True
        while time.monotonic() < end:
            st = a.ok("status", handle=ga["handle"], timeout=10)
            if not st["held"]:
                held_throughout = False
                break
            # While A says held, nobody else may get the lock.
            c = b.call("acquire", resource=r, ttl_ms=3000, wait_ms=0, timeout=30)
            if c.ok:
                st2 = a.ok("status", handle=ga["handle"], timeout=10)
                raise AssertionError(
                    f"two holders: B was granted token {c['token']} while A (token {token}) "
                    f"said held (A now: {st2.data})")
            assert c.error.get("kind") in ("rejected", "unavailable"), c.data
            time.sleep(0.3)
        st = a.ok("status", handle=ga["handle"], timeout=10)
        print(f"leader kill: node {leader} killed; A {'kept' if held_throughout and st['held'] else 'lost'} "
              f"its lease (token {token}); A's last status {st.data}")
        if held_throughout and st["held"]:
            g = cluster.get(r, timeout=15)
            assert g.held and g.fencing_token == token, f"A says held but the cluster says {g}"
        else:
            lost = a.ok("wait_lost", handle=ga["handle"], timeout_ms=5000, timeout=15)
            assert lost["lost"] is True, f"A stopped saying held without reporting lost: {lost.data}"
        rel = a.call("release", handle=ga["handle"], timeout=30)
        assert rel.ok or rel.error.get("kind") in ("unavailable",), rel.data
    finally:
        cluster.restart(leader)


# ---- typed errors --------------------------------------------------------------------------

def wrong_tenant_and_bad_input_are_typed_errors(agents: Any, cluster: Cluster, store: FencedStore) -> None:
    a: Agent = agents()
    other = a.call("acquire", resource=f"beta/conformance/{uuid.uuid4().hex[:8]}", ttl_ms=5000, wait_ms=0)
    assert not other.ok
    assert other.error.get("kind") == "rejected" and other.error.get("reason") == "PERMISSION_DENIED", other.data
    assert other.error.get("code") == "PERMISSION_DENIED", other.data

    bad_name = a.call("acquire", resource="Acme/Upper", ttl_ms=5000, wait_ms=0)
    assert not bad_name.ok and bad_name.error.get("kind") == "rejected", bad_name.data
    assert bad_name.error.get("reason") == "INVALID_RESOURCE" and bad_name.error.get("code") == "INVALID_ARGUMENT"

    bad_ttl = a.call("acquire", resource=fresh("ttl"), ttl_ms=10, wait_ms=0)
    assert not bad_ttl.ok and bad_ttl.error.get("reason") == "TTL_OUT_OF_RANGE", bad_ttl.data

    too_long = a.call("acquire", resource=fresh("wait"), ttl_ms=5000, wait_ms=10_000_000)
    assert not too_long.ok, too_long.data
    assert (too_long.error.get("kind") == "invalid_argument"
            or too_long.error.get("reason") == "WAIT_TIMEOUT_OUT_OF_RANGE"), too_long.data

    r = fresh("held")
    h = a.ok("acquire", resource=r, ttl_ms=5000, wait_ms=0)
    b: Agent = agents()
    held = b.call("acquire", resource=r, ttl_ms=5000, wait_ms=0)
    assert not held.ok and held.error.get("reason") == "LOCK_HELD" and held.error.get("code") == "ABORTED", held.data
    waited = b.call("acquire", resource=r, ttl_ms=5000, wait_ms=300, timeout=30)
    assert not waited.ok and waited.error.get("reason") == "WAIT_TIMED_OUT", waited.data

    # Another identity of the same tenant cannot release A's lease: B's
    # library never has A's lease id; A's release works once, then is a no-op.
    assert a.ok("release", handle=h["handle"])["released"] is True
    g = cluster.get(r)
    assert not g.held

    # Another tenant's client cannot read or take acme's resources either.
    beta: Agent = agents(tenant="beta", worker="batch")
    denied = beta.call("get", resource=r)
    assert not denied.ok and denied.error.get("reason") == "PERMISSION_DENIED", denied.data


ALL = [
    renewals_keep_the_lease_past_its_ttl,
    each_logical_acquire_has_its_own_request_id,
    explicit_request_id_retry_returns_the_same_lease,
    lost_reply_is_retried_with_the_same_request_id,
    paused_client_loses_and_its_stale_write_is_fenced,
    unconfirmed_lease_is_lost_at_its_stop_by,
    leader_kill_mid_renew_never_makes_two_holders,
    wrong_tenant_and_bad_input_are_typed_errors,
]
