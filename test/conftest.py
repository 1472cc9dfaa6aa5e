from __future__ import annotations

import pytest

from mock import run_mock

FAST = dict(ttft_ms=0.0, tok_ms=0.0, tokens=8)


@pytest.fixture
async def mock():
    async with run_mock(**FAST) as m:
        yield m


@pytest.fixture
async def mock2():
    async with run_mock(**FAST) as m:
        yield m
