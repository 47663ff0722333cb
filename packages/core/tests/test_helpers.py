from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from xgrad.errors import KnobError
from xgrad.helpers import BEAM, DEBUG, KNOBS, Context, ContextVar, Effect, changed_knobs, getenv, knob, knobs_key


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
        knob("DEBUG", 0, "again", Effect.NONE)


def test_every_knob_has_one_line_help() -> None:
    for k in KNOBS.values():
        assert k.help and "\n" not in k.help, k.name


def test_every_knob_declares_one_effect() -> None:
    for k in KNOBS.values():
        assert k.affects in Effect.__members__.values(), k.name  # one declared effect, not a union


def test_knobs_key_holds_exactly_the_knobs_of_the_effects_asked() -> None:
    for effects in (Effect.SCHEDULE, Effect.CODEGEN | Effect.COMPILE, Effect.COMPILE):
        names = {part.split("=")[0] for part in knobs_key(effects).split(",")}
        assert names == {k.name for k in KNOBS.values() if k.affects & effects}
    assert "SPLIT_REDUCEOP=" in knobs_key(Effect.SCHEDULE) and "NOOPT=" not in knobs_key(Effect.SCHEDULE)
    assert "NOOPT=" in knobs_key(Effect.CODEGEN) and "DEBUG=" not in knobs_key(Effect.CODEGEN | Effect.SCHEDULE)


def test_knobs_key_follows_context_and_direct_writes() -> None:
    before = knobs_key(Effect.CODEGEN)
    with Context(NOOPT=1):
        assert "NOOPT=1" in knobs_key(Effect.CODEGEN)
    assert knobs_key(Effect.CODEGEN) == before
    with Context(DEBUG=DEBUG.value + 1):  # a knob of no effect leaves every key alone
        assert knobs_key(Effect.CODEGEN) == before
    old = BEAM.value
    try:
        BEAM.value = old + 5
        assert f"BEAM={old + 5}" in knobs_key(Effect.CODEGEN)
    finally:
        BEAM.value = old
    assert knobs_key(Effect.CODEGEN) == before


def test_former_plain_getenv_knobs_are_registered() -> None:
    for name in ("BEAM_MAX_STEPS", "BEAM_UPCAST_MAX", "BEAM_TIMEOUT_SEC", "BEAM_RUNS", "JITBEAM", "OPTIM_DTYPE"):
        assert name in KNOBS
    for name in ("CONST_LR", "REWRITE_STACK_LIMIT"):
        with Context(**{name: KNOBS[name].default}):
            pass
