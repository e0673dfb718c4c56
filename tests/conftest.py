"""Shared fixtures. Tests mirror the package: tests/<subpackage>/test_<module>.py."""

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tools/ and analysis/ are run as modules from the repo root
    sys.path.insert(0, str(ROOT))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test starts with torch.compile's caches empty: the suite compiles Decoder.forward for
    many models, and a test must not fail on the recompile limit because of the tests before it."""
    torch._dynamo.reset()
    yield


@pytest.fixture
def root() -> Path:
    return ROOT
