"""The core README's index of where each public Tensor method is defined matches the code, no public method is
defined twice along Tensor's mixins (one name, one definition), and the mixins are flat: each builds on TensorBase
alone and Tensor lists them all."""

from __future__ import annotations

import pathlib
import re

from xgrad import Tensor
from xgrad.mixin.base import TensorBase

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
ROW = re.compile(r"^\| `([\w/]+\.py)` \| (\w+) \| ([\w, ]+) \|$")
# properties a mixin refines on purpose: MultiMixin.device also names the devices of a multi-device tensor (a tuple)
REFINED = {"device"}


def index_from_code() -> dict[tuple[str, str], list[str]]:
    rows: dict[tuple[str, str], list[str]] = {}
    for cls in Tensor.__mro__[:-1]:
        names = sorted(n for n, v in vars(cls).items() if not n.startswith("_") and n != "mro" and _is_api(v))
        if names:
            rows[(cls.__module__.removeprefix("xgrad.").replace(".", "/") + ".py", cls.__name__)] = names
    return rows


def _is_api(v: object) -> bool:
    return callable(v) or isinstance(v, (property, classmethod, staticmethod))


def test_the_readme_index_lists_every_method_where_it_is_defined() -> None:
    found = {}
    for line in README.read_text().splitlines():
        if m := ROW.match(line):
            found[(m[1], m[2])] = [n.strip() for n in m[3].split(",")]
    want = index_from_code()
    expected = "\n".join(f"| `{f}` | {c} | {', '.join(n)} |" for (f, c), n in want.items())
    assert found == want, f"update the README's method index to:\n{expected}"


def test_no_public_method_is_defined_twice_along_the_mixins() -> None:
    seen: dict[str, str] = {}
    twice = []
    for (_, cls), names in index_from_code().items():
        for n in names:
            if n in seen and n not in REFINED:
                twice.append(f"{n}: {seen[n]} and {cls}")
            seen.setdefault(n, cls)
    assert twice == []


def test_every_mixin_builds_on_the_base_alone_and_tensor_lists_them_all() -> None:
    assert Tensor.__mro__[-2:] == (TensorBase, object)
    mixins = Tensor.__mro__[1:-2]
    assert Tensor.__bases__ == mixins, "Tensor must list every mixin itself (no mixin reached through another)"
    chained = {cls.__name__: [b.__name__ for b in cls.__bases__] for cls in mixins if cls.__bases__ != (TensorBase,)}
    assert chained == {}, "a mixin subclasses only TensorBase; call other mixins' methods through self._t()"
