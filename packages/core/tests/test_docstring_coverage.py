"""Every public attribute of `Tensor` carries a docstring with a runnable `>>>` example (test_docstrings.py runs them).

Public means: not starting with `_`, found on `Tensor` or any mixin it inherits from (methods, properties,
classmethods, staticmethods). The allowlist below holds the few names where an example is impossible, each with the
reason; keep it short.
"""

from __future__ import annotations

import inspect
from typing import Any

from xgrad.tensor import Tensor

# name -> why it carries no `>>>` example
ALLOWLIST: dict[str, str] = {
    "grad": "a __slots__ attribute (member descriptor) cannot carry a docstring; Tensor's class docstring shows it",
    "is_param": "a __slots__ attribute (member descriptor): no docstring; Tensor's class docstring shows it",
    "uop": "a __slots__ attribute (member descriptor): no docstring; Tensor's class docstring shows it",
}


def _docstring(name: str) -> str | None:
    attr: Any = inspect.getattr_static(Tensor, name)
    if isinstance(attr, (classmethod, staticmethod)):
        attr = attr.__func__
    if isinstance(attr, property):
        attr = attr.fget
    attr = inspect.unwrap(attr) if callable(attr) else attr
    doc = getattr(attr, "__doc__", None)
    return doc if isinstance(doc, str) else None


def _owner(name: str) -> str:
    for klass in Tensor.__mro__:
        if name in vars(klass):
            return f"{klass.__module__}.{klass.__qualname__}"
    return "?"


def _public_names() -> list[str]:
    return sorted(n for n in dir(Tensor) if not n.startswith("_"))


def test_every_public_tensor_attribute_has_docstring_example() -> None:
    missing = [
        f"{name} ({_owner(name)})"
        for name in _public_names()
        if name not in ALLOWLIST and ">>>" not in (_docstring(name) or "")
    ]
    assert not missing, f"{len(missing)} public Tensor attributes lack a docstring with a >>> example: {missing}"


def test_docstring_allowlist_names_exist_and_lack_examples() -> None:
    names = set(_public_names())
    stale = [n for n in ALLOWLIST if n not in names or ">>>" in (_docstring(n) or "")]
    assert not stale, f"allowlist entries that no longer apply (remove them): {stale}"


def test_slot_attributes_are_shown_in_tensor_class_docstring() -> None:
    doc = Tensor.__doc__ or ""
    assert all(f"x.{name}" in doc or f"`{name}`" in doc for name in ALLOWLIST) and ">>>" in doc


def test_public_tensor_api_is_large() -> None:
    # guards the listing itself: a broken dir() walk would make the coverage test pass vacuously
    names = _public_names()
    assert len(names) > 200 and {"matmul", "shape", "arange", "backward"} <= set(names)
