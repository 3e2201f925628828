"""Every scenario of scenarios.py, for every agent that runs (see the
report header: which agents ran, which were not found)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import scenarios
from cluster import Cluster
from fenced_store import FencedStore


@pytest.mark.parametrize("scenario", scenarios.ALL, ids=lambda f: f.__name__)
def test_scenario(scenario: Callable[..., None], agents: Any, cluster: Cluster, store: FencedStore) -> None:
    scenario(agents, cluster, store)
