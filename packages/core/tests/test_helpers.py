from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from xgrad.errors import KnobError
from xgrad.helpers import BEAM, DEBUG, KNOBS, Context, ContextVar, changed_knobs, getenv, knob


@pytest.mark.parametrize(("raw", "default", "value"), [("3", 0, 3), ("abc", "x", "abc"), ("0.5", 1.0, 0.5)])
def test_contextvar_parses_env_like_its_default(
    monkeypatch: pytest.MonkeyPatch, raw: str, default: int | str | float, value: int | str | float
) -> None:
    monkeypatch.setenv("XGRAD_TEST_KNOB", raw)
    assert ContextVar("XGRAD_TEST_KNOB", default).value == value


def test_contextvar_invalid_int_raises_knob_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XGRAD_TEST_KNOB", "two")
    with pytest.raises(KnobError, match=r"XGRAD_TEST_KNOB='two' is not a valid int"):
        ContextVar("XGRAD_TEST_KNOB", 0)


def test_import_with_bad_knob_fails_with_knob_error(run_xgrad: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = run_xgrad(code="import xgrad", DEBUG="lots")
    assert result.returncode != 0
    assert "KnobError: environment variable DEBUG='lots' is not a valid int" in result.stderr


def test_context_sets_and_restores_knobs() -> None:
    before = DEBUG.value
    with Context(DEBUG=before + 3, BEAM=2):
        assert DEBUG.value == before + 3
        assert BEAM.value == 2
    assert DEBUG.value == before


def test_context_restores_after_exception() -> None:
    before = DEBUG.value
    with pytest.raises(RuntimeError), Context(DEBUG=before + 1):
        raise RuntimeError("boom")
    assert DEBUG.value == before


def test_context_nested_restores_each_level() -> None:
    before = DEBUG.value
    with Context(DEBUG=5):
        with Context(DEBUG=6):
            assert DEBUG.value == 6
        assert DEBUG.value == 5
    assert DEBUG.value == before


def test_context_reused_object_restores_each_entry() -> None:
    ctx = Context(DEBUG=7)
    before = DEBUG.value
    with ctx:
        with ctx:
            assert DEBUG.value == 7
        assert DEBUG.value == 7
    assert DEBUG.value == before


def test_context_as_decorator_sets_knob_during_call() -> None:
    @Context(BEAM=BEAM.value + 3)
    def beam() -> int:
        return int(BEAM.value)

    before = BEAM.value
    assert beam() == before + 3
    assert BEAM.value == before


def test_context_unknown_knob_raises_knob_error() -> None:
    with pytest.raises(KnobError, match="unknown knob"):
        Context(NOT_A_KNOB=1)


def test_changed_knobs_lists_only_non_defaults() -> None:
    with Context(BEAM=2):
        changed = changed_knobs()
    assert changed["BEAM"] == 2
    assert all(KNOBS[name].default != value for name, value in changed.items())


def test_getenv_types_value_like_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XGRAD_TEST_GETENV_INT", "12")
    assert getenv("XGRAD_TEST_GETENV_INT", 0) == 12
    assert getenv("XGRAD_TEST_GETENV_MISSING", "dflt") == "dflt"


def test_knob_declared_twice_is_refused() -> None:
    with pytest.raises(AssertionError, match="declared twice"):
        knob("DEBUG", 0, "again")


def test_every_knob_has_one_line_help() -> None:
    for k in KNOBS.values():
        assert k.help and "\n" not in k.help, k.name
