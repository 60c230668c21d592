"""Tests for runtime/serving/choice_memo.py: one decision per key and steering environment."""

from __future__ import annotations

import pytest

from runtime.cpu import choice
from runtime.serving.choice_memo import ChoiceMemo


def test_each_key_is_decided_once_and_again_when_the_steering_variables_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(choice.ENV, raising=False)
    calls: list[str] = []
    memo = ChoiceMemo()

    def decide(answer: str) -> str:
        calls.append(answer)
        return answer

    assert memo.get("a", lambda: decide("x")) == "x"
    assert memo.get("a", lambda: decide("y")) == "x"
    assert memo.get("b", lambda: decide("y")) == "y"
    monkeypatch.setenv(choice.ENV, "dot=torch")
    assert memo.get("a", lambda: decide("z")) == "z"
    monkeypatch.setenv("RECCOMPILE_CACHE_DIR", "/elsewhere")
    assert memo.get("a", lambda: decide("w")) == "w"
    assert calls == ["x", "y", "z", "w"]
