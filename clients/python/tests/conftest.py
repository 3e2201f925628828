import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_server import FakeServer  # noqa: E402


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.stop()


@pytest.fixture
def fake2() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.stop()
