"""`make demo` reaches every outcome it promises (the three examples, as the README shows
them): run on a cluster of its own, as a user runs it."""

from __future__ import annotations

import pytest
from e2e.devcluster.demo import run_demo

pytestmark = pytest.mark.cluster


def test_the_demo_reaches_every_outcome(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_demo(name="demo-test")
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "All outcomes reached" in out
    assert "fallback (Incompatible) requested -> awq" in out  # before anything is deployed
    assert "fallback (Refused) requested -> auto" in out  # the engine's own refusal
