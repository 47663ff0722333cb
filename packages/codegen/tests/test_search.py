"""BEAM search (`xgrad_codegen.search`): results match numpy, the disk cache is hit, keyed and bypassed as documented,
chosen actions are always legal, and BEAM=0 changes nothing. Sizes and the beam are tiny: every candidate compiles."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from kernel_helpers import data, kernel_asts

from xgrad import Tensor
from xgrad.device import Device
from xgrad.helpers import Context
from xgrad.uop.ops import UOp
from xgrad_codegen import search
from xgrad_codegen.opt import apply_opt, kernel_ranges
from xgrad_codegen.pipeline import full_rewrite


@pytest.fixture
def beam_env(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A private BEAM cache dir (the compile cache stays shared), one search step, one timing run, at most 16 lanes,
    fresh counters."""
    monkeypatch.setattr(search, "_cache_path", lambda key: tmp_path / "beam" / f"{key}.json")
    search.stats.reset()
    with Context(PARALLEL=2, BEAM_MAX_STEPS=1, BEAM_RUNS=1, BEAM_UPCAST_MAX=16):
        yield tmp_path


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    out = np.zeros((n, co, h - kh + 1, wd - kw + 1), np.float32)
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", x[:, :, i : i + out.shape[2], j : j + out.shape[3]], w[:, :, i, j])
    return out


A, B, X, W = data(6, 8), data(8, 4, seed=1), data(2, 3, 6, 6, seed=2), data(4, 3, 3, 3, seed=3)
OPS: dict[str, tuple[Callable[[str], Tensor], np.ndarray]] = {
    "elementwise": (lambda d: (Tensor(A, device=d) * 2 + 1).relu(), np.maximum(A * 2 + 1, 0)),
    "reduce": (lambda d: Tensor(A, device=d).sum(axis=1), A.sum(axis=1)),
    "matmul": (lambda d: Tensor(A, device=d) @ Tensor(B, device=d), A @ B),
    "conv2d": (lambda d: Tensor(X, device=d).conv2d(Tensor(W, device=d)), conv2d(X, W)),
    "softmax": (lambda d: Tensor(A, device=d).softmax(), softmax(A)),
}


@pytest.mark.parametrize("op", list(OPS))
def test_beam_results_match_numpy_on_sample_ops(xgrad_device: str, beam_env: pathlib.Path, op: str) -> None:
    build, want = OPS[op]
    with Context(BEAM=2):
        got = build(xgrad_device).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert search.stats.searches >= 1 and search.stats.compiled >= 2


def _matmul_ast() -> UOp:
    with Context(BEAM=0):
        return kernel_asts(lambda: Tensor(data(8, 12)) @ Tensor(data(12, 8, seed=1)))[-1]


def test_beam_cache_hit_the_second_time_compiles_nothing(beam_env: pathlib.Path) -> None:
    ast, dev = _matmul_ast(), Device["CPU"]
    first = search.beam_opts(ast, dev, 2)
    compiled, timed = search.stats.compiled, search.stats.timed
    assert first is not None and search.stats.searches == 1 and compiled > 0
    assert list((beam_env / "beam").glob("*.json"))
    second = search.beam_opts(ast, dev, 2)
    assert second == first
    assert (search.stats.searches, search.stats.cache_hits) == (1, 1)
    assert (search.stats.compiled, search.stats.timed) == (compiled, timed)


def test_beam_cache_key_changes_with_code_changing_knob() -> None:
    ast, dev = _matmul_ast(), Device["CPU"]
    plain = search.cache_key(ast, dev, 2)
    assert search.cache_key(ast, dev, 2) == plain
    with Context(TRANSCENDENTAL=2):
        assert search.cache_key(ast, dev, 2) != plain
    with Context(BEAM_MAX_STEPS=3):  # the search's own knobs are declared CODEGEN too
        assert search.cache_key(ast, dev, 2) != plain
    assert search.cache_key(ast, dev, 3) != plain
    assert search.cache_key(ast, Device["PYTHON"], 2) != plain


def test_ignore_beam_cache_searches_again(beam_env: pathlib.Path) -> None:
    ast, dev = _matmul_ast(), Device["CPU"]
    search.beam_opts(ast, dev, 2)
    with Context(IGNORE_BEAM_CACHE=1):
        search.beam_opts(ast, dev, 2)
    assert (search.stats.searches, search.stats.cache_hits) == (2, 0)


def test_cachelevel_zero_writes_and_reads_no_beam_cache(beam_env: pathlib.Path) -> None:
    ast, dev = _matmul_ast(), Device["CPU"]
    with Context(CACHELEVEL=0):
        search.beam_opts(ast, dev, 2)
        search.beam_opts(ast, dev, 2)
    assert not (beam_env / "beam").exists()
    assert (search.stats.searches, search.stats.cache_hits) == (2, 0)


def test_beam_off_never_searches(beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("BEAM=0 must not search")

    monkeypatch.setattr(search, "beam_opts", fail)
    with Context(BEAM=0):
        got = (Tensor(A) @ Tensor(B) + 1).numpy()
    np.testing.assert_allclose(got, A @ B + 1, rtol=1e-5, atol=1e-6)
    assert search.beam_opts is fail and search.stats.searches == 0


def test_beam_off_renders_the_heuristic_program() -> None:
    ast, dev = _matmul_ast(), Device["CPU"]
    with Context(BEAM=0):
        prg = dev.compile(ast)
    assert prg.info.src == dev.renderer.render(prg.info.name, full_rewrite(ast, dev.renderer))


FUZZ_SHAPES = [
    (lambda: Tensor(data(7, 5)).sum(axis=0), lambda: data(7, 5).sum(axis=0)),
    (lambda: Tensor(data(3, 13)).max(axis=1), lambda: data(3, 13).max(axis=1)),
    (lambda: Tensor(data(12, 1)) + Tensor(data(1, 10, seed=1)), lambda: data(12, 1) + data(1, 10, seed=1)),
    (lambda: Tensor(data(5, 6)).permute(1, 0) * 3, lambda: data(5, 6).T * 3),
    (lambda: Tensor(data(4, 6)) @ Tensor(data(6, 9, seed=1)), lambda: data(4, 6) @ data(6, 9, seed=1)),
]


@pytest.mark.parametrize("case", range(len(FUZZ_SHAPES)))
def test_beam_never_chooses_an_illegal_action(beam_env: pathlib.Path, case: int) -> None:
    build, want = FUZZ_SHAPES[case]
    dev = Device["CPU"]
    with Context(BEAM=0):
        asts = kernel_asts(build)
    for ast in asts:
        base = search.before_optimize(ast)
        opts = search.beam_opts(ast, dev, 2)
        if opts is None:
            continue
        for opt in opts:  # every action applies, in order, to the ranges it names
            ids = {r.arg[0] for r in kernel_ranges(base)}
            assert opt.op in ("PACK", "TC") or opt.axis in ids, f"{opt} names a range the kernel lacks (ids {ids})"
            base = apply_opt(base, opt)
        heur = search.heuristic(search.before_optimize(ast), dev.renderer)
        assert search._lanes(base) <= search.SearchKnobs.read().lanes_max or opts == heur
    with Context(BEAM=2):
        np.testing.assert_allclose(build().numpy(), want(), rtol=1e-5, atol=1e-6)


def test_own_candidates_all_apply() -> None:
    base = search.before_optimize(_matmul_ast())
    cands = search.own_candidates(base)
    assert {o.op for o in cands} >= {"UPCAST", "UNROLL"}
    for opt in cands:
        apply_opt(base, opt)  # raises if illegal


def _fake_times(monkeypatch: pytest.MonkeyPatch, ast: UOp, confirm_s: float) -> list[search.Opt]:
    """Make every candidate but the heuristic look 2x faster during the search, and take `confirm_s` (heuristic:
    1 s) when the final check times it again (the only timing without a cutoff)."""
    dev = Device["CPU"]
    heur = search.heuristic(search.before_optimize(ast), dev.renderer)
    heur_src = search._render(search.before_optimize(ast), dev, heur)[1]

    def fake(prg: search.CompiledProgram, scratch: search.Scratch, runs: int, cutoff: float) -> float:
        if prg.info.src == heur_src:
            return 1.0
        return confirm_s if cutoff == math.inf else 0.5

    monkeypatch.setattr(search, "time_program", fake)
    return heur


def test_beam_picks_a_faster_kernel_after_checking_its_outputs(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ast = _matmul_ast()
    heur = _fake_times(monkeypatch, ast, 0.5)
    opts = search.beam_opts(ast, Device["CPU"], 2)
    assert opts is not None and opts != heur and search.stats.rejected == 0


def test_verification_failure_keeps_the_heuristic(beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ast = _matmul_ast()
    heur = _fake_times(monkeypatch, ast, 0.5)
    monkeypatch.setattr(search, "same_outputs", lambda *args: False)
    assert search.beam_opts(ast, Device["CPU"], 2) == heur
    assert search.stats.rejected >= 1 and search.stats.retimed == 0  # every finalist but the heuristic dropped


def test_slower_on_the_second_timing_keeps_the_heuristic(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ast = _matmul_ast()
    heur = _fake_times(monkeypatch, ast, 2.0)
    assert search.beam_opts(ast, Device["CPU"], 2) == heur
    assert search.stats.rejected == 0


def test_verify_accepts_a_legal_choice_and_rejects_a_different_kernel(beam_env: pathlib.Path) -> None:
    dev = Device["CPU"]
    base = search.before_optimize(_matmul_ast())
    scratch = search.make_scratch(base, dev)
    assert scratch is not None
    try:
        ranges = kernel_ranges(base)
        assert search.verify(base, dev, [search.Opt("UPCAST", 0, 2)], [], scratch)
        assert search.verify(base, dev, [search.Opt("UNROLL", ranges[-1].arg[0], 4)], [], scratch)
    finally:
        search.free_scratch(scratch)
    assert not search._close(np.array([1.0, 2.0]), np.array([1.0, 2.5]), Tensor([1.0]).dtype)
    assert search._close(np.array([1.0, np.nan]), np.array([1.0 + 1e-6, np.nan]), Tensor([1.0]).dtype)


def test_outputs_are_compared_on_ties_too(beam_env: pathlib.Path) -> None:
    # two kernels that differ only where two inputs are equal: (a == b) and (a != a), which is all zeros; random floats
    # never tie, so only the second contents (floats from a few values) tell them apart
    a, b = Tensor(data(64)).realize(), Tensor(data(64, seed=1)).realize()
    (eq,) = kernel_asts(lambda: (a == b).cast(a.dtype))
    (never,) = kernel_asts(lambda: (a != a).cast(a.dtype) * b)
    dev = Device["CPU"]
    scratch = search.make_scratch(search.before_optimize(eq), dev)
    assert scratch is not None
    try:
        prg_eq, prg_never = dev.compile(eq), dev.compile(never)
        assert search.same_outputs(prg_eq, prg_eq, scratch)
        assert not search.same_outputs(prg_eq, prg_never, scratch)
        scratch.ties = scratch.initial  # without the ties the check cannot see the difference
        assert search.same_outputs(prg_eq, prg_never, scratch)
    finally:
        search.free_scratch(scratch)


def test_gather_kernels_are_not_searched(beam_env: pathlib.Path) -> None:
    idx = Tensor(np.array([2, 0, 1], np.int32))
    table = Tensor(data(4, 3))
    with Context(BEAM=0):
        asts = kernel_asts(lambda: table[idx])
    reasons = [search._unsearchable(search.before_optimize(a)) for a in asts]
    with Context(BEAM=2):
        got = table[idx].numpy()
    np.testing.assert_allclose(got, data(4, 3)[[2, 0, 1]])
    assert all(r is None or "loaded" in r for r in reasons)


def test_debug_2_prints_one_line_per_searched_kernel(
    beam_env: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Context(DEBUG=2):
        search.beam_opts(_matmul_ast(), Device["CPU"], 2)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("BEAM ")]
    assert len(lines) == 1 and " us -> " in lines[0] and "tried" in lines[0]


def test_tinyjit_replays_beam_programs(beam_env: pathlib.Path) -> None:
    from xgrad import TinyJit

    f = TinyJit(lambda x, y: (x @ y).relu())
    with Context(BEAM=2):
        for i in range(3):
            a, b = data(4, 6, seed=i), data(6, 5, seed=i + 10)
            got = f(Tensor(a).realize(), Tensor(b).realize()).numpy()
            np.testing.assert_allclose(got, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
    assert search.stats.searches >= 1


@Context(JITBEAM=2)
def test_jitbeam_searches_only_the_kernels_a_jit_replays(beam_env: pathlib.Path) -> None:
    from xgrad import TinyJit

    before = search.stats.searches
    f = TinyJit(lambda x, y: (x @ y).relu() * 2)
    a, b = data(5, 7, seed=3), data(7, 3, seed=4)
    (Tensor(a) @ Tensor(b)).relu().realize()  # BEAM=0 outside a JIT: no search
    assert search.stats.searches == before
    for i in range(3):
        a, b = data(5, 7, seed=i), data(7, 3, seed=i + 10)
        got = f(Tensor(a).realize(), Tensor(b).realize()).numpy()
        np.testing.assert_allclose(got, np.maximum(a @ b, 0) * 2, rtol=1e-5, atol=1e-6)
    assert search.stats.searches > before  # the capture compiled its kernels with BEAM=JITBEAM


def test_search_failure_raises_under_spec_and_falls_back_without(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(search, "make_scratch", boom)
    with pytest.raises(RuntimeError, match="boom"):
        search.beam_opts(_matmul_ast(), Device["CPU"], 2)
    with Context(SPEC=0):
        assert search.beam_opts(_matmul_ast(), Device["CPU"], 2) is None
        with Context(BEAM=2):
            got = (Tensor(A) @ Tensor(B) * 3).numpy()
    np.testing.assert_allclose(got, A @ B * 3, rtol=1e-5, atol=1e-6)
    assert search.stats.crashed >= 2


def _crash_on_render(monkeypatch: pytest.MonkeyPatch, ast: UOp, error: Exception) -> list[search.Opt]:
    """Make rendering every candidate but the heuristic's (and no actions) raise `error`."""
    heur = search.heuristic(search.before_optimize(ast), Device["CPU"].renderer)
    render = search._render

    def crashing(base: UOp, device: object, opts: list[search.Opt]) -> tuple[list[UOp], str]:
        if opts and opts != heur:
            raise error
        return render(base, device, opts)  # type: ignore[arg-type]

    monkeypatch.setattr(search, "_render", crashing)
    return heur


def test_candidate_crash_fails_loudly_under_spec(beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ast = _matmul_ast()
    _crash_on_render(monkeypatch, ast, KeyError("a codegen bug"))
    with pytest.raises(KeyError, match="a codegen bug") as info:
        search.beam_opts(ast, Device["CPU"], 2)
    assert any("crashed while rendering" in note for note in info.value.__notes__)
    assert search.stats.crashed == 1


def test_candidate_crash_is_counted_and_dropped_without_spec(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ast = _matmul_ast()
    heur = _crash_on_render(monkeypatch, ast, KeyError("a codegen bug"))
    with Context(SPEC=0):
        opts = search.beam_opts(ast, Device["CPU"], 2)
    assert opts in (heur, [])  # only the seeds rendered
    assert search.stats.crashed >= 1


def test_candidate_that_does_not_apply_is_dropped_quietly(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ast = _matmul_ast()
    heur = _crash_on_render(monkeypatch, ast, search.OptError("not here"))
    assert search.beam_opts(ast, Device["CPU"], 2) in (heur, [])
    assert search.stats.crashed == 0


def test_heuristic_is_a_candidate_and_the_pick_retimes_the_finalists(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search times the heuristic's program like any candidate; the final pick times every finalist again, in
    turn, and goes by those times: here the finalist the search timed slowest is the fastest when timed again."""
    ast, dev = _matmul_ast(), Device["CPU"]
    heur = search.heuristic(search.before_optimize(ast), dev.renderer)
    heur_src = search._render(search.before_optimize(ast), dev, heur)[1]
    search_s: dict[str, float] = {}
    final_runs: list[str] = []

    def fake(prg: search.CompiledProgram, scratch: search.Scratch, runs: int, cutoff: float) -> float:
        src = prg.info.src
        if cutoff == math.inf:  # only the final pick times without a cutoff
            final_runs.append(src)
            return 1.0 if src == heur_src else 1.2 - search_s[src]
        return search_s.setdefault(src, 1.0 if src == heur_src else 0.5 + 0.001 * len(search_s))

    finals: list[list[search.Candidate]] = []
    pick = search.final_pick

    def spy(base: UOp, beam: list[search.Candidate], *args: object) -> search.Candidate:
        finals.append(list(beam))
        return pick(base, beam, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(search, "time_program", fake)
    monkeypatch.setattr(search, "final_pick", spy)
    opts = search.beam_opts(ast, dev, 2)
    assert heur_src in search_s  # timed during the search like every other candidate
    (beam,) = finals
    others = [c for c in beam if c.opts != heur]
    assert len(others) == 2
    srcs = [heur_src] + [c.program.info.src for c in others if c.program is not None]
    runs = max(search.SearchKnobs.read().runs, search.CONFIRM_RUNS)
    assert sorted(final_runs) == sorted(s for s in srcs for _ in range(runs))  # each finalist, best of `runs`
    assert search.stats.retimed == 3
    slowest_in_search = max(others, key=lambda c: search_s[c.program.info.src] if c.program else 0.0)
    assert opts == slowest_in_search.opts


def test_search_grows_the_heuristics_actions_before_its_pack(
    beam_env: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No action may follow a PACK, and a matmul's heuristic ends with one, while the start from no actions is far too
    slow to keep (a 1024 matmul: 12 s a launch): BEAM searched nothing but its two seeds and always returned the
    heuristic. The heuristic's actions before its PACK are a seed too (timed 0.9 s here); every kernel grown from it
    times 0.8 s, so one of those wins."""
    with Context(BEAM=0):
        ast = kernel_asts(lambda: Tensor(data(96, 96)) @ Tensor(data(96, 96, seed=1)))[-1]
    dev = Device["CPU"]
    base = search.before_optimize(ast)
    heur = search.heuristic(base, dev.renderer)
    cut = [o.op for o in heur].index("PACK")
    seeds = {search._render(base, dev, opts)[1]: s for opts, s in ((heur, 1.0), ([], 100.0), (heur[:cut], 0.9))}
    monkeypatch.setattr(search, "time_program", lambda prg, *args: seeds.get(prg.info.src, 0.8))
    with Context(BEAM_UPCAST_MAX=256):  # the default: the heuristic's 16 x 6 tile is over beam_env's 16 lanes
        opts = search.beam_opts(ast, dev, 2)
    assert opts is not None and opts != heur and opts[:cut] == heur[:cut] and len(opts) > cut
    assert search.stats.compiled > 3 and search.stats.rejected == 0  # more than the three seeds
