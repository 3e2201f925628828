"""The suite must be able to fail: the Python agent, deliberately broken
(FENCELOCK_AGENT_BROKEN, honoured only by that agent), must FAIL the
scenarios that check the broken rule. Runs whenever the python agent runs."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

import scenarios
from agents import AGENT_NAMES_FOR_META
from cluster import Cluster
from conftest import AgentFactory, make_factory
from fenced_store import FencedStore

pytestmark = pytest.mark.skipif(
    "python" not in AGENT_NAMES_FOR_META(), reason="the broken-client checks use the python agent, not selected"
)


@pytest.fixture
def broken(request: pytest.FixtureRequest, cluster: Cluster, workdir: Path) -> Iterator[Callable[[str], AgentFactory]]:
    made: list[AgentFactory] = []

    def make(mode: str) -> AgentFactory:
        f = make_factory("python", cluster, workdir, {"FENCELOCK_AGENT_BROKEN": mode})
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def test_a_client_that_does_not_renew_fails_the_suite(broken: Callable[[str], AgentFactory], cluster: Cluster,
                                                      store: FencedStore) -> None:
    with pytest.raises(AssertionError, match="not kept alive"):
        scenarios.renewals_keep_the_lease_past_its_ttl(broken("no-renew"), cluster, store)


def test_a_client_that_reuses_request_ids_fails_the_suite(broken: Callable[[str], AgentFactory], cluster: Cluster,
                                                          store: FencedStore) -> None:
    with pytest.raises(AssertionError, match="logical acquire|request ids reused"):
        scenarios.each_logical_acquire_has_its_own_request_id(broken("reuse-request-id"), cluster, store)


def test_a_client_that_ignores_its_stop_by_fails_the_suite(broken: Callable[[str], AgentFactory], cluster: Cluster,
                                                           store: FencedStore) -> None:
    with pytest.raises(AssertionError, match="no lost signal"):
        scenarios.unconfirmed_lease_is_lost_at_its_stop_by(broken("ignore-stop-by"), cluster, store)
