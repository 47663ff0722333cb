"""Memory instructions: ld/ldu/st (vector forms too), cvta, atom/red over the state spaces (PTX ISA 9.7.9).

In: one parsed instruction. Out: a step. Spaces: `.global`/`.const` go to the emulated device memory (its faults
name the address; the step names the kernel); `.shared` is one byte array per block of the chunk; `.local` one per
thread; `.param` the kernel's packed arguments; no space means a generic address, sorted per lane into the shared
window (`SHARED_WINDOW + offset`), the local window or global memory. Only the lanes of the mask touch memory.
Atomics run lane after lane in lane order (one vector step per round of distinct addresses; `add` in one step).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xgrad_nv.emulate.parse import TYPE_BYTES, Instruction, Operand
from xgrad_nv.emulate.values import NP, Array, Decoder, Mask, Step, bf16_to_f32, f32_to_bf16, is_float

OPS: dict[str, Callable[[Instruction, Decoder], Step]] = {}
SHARED_WINDOW = 1 << 56
LOCAL_WINDOW = 1 << 57
SPACES = ("global", "shared", "local", "param", "const")
Addr = Callable[[Any], Array]


def space_of(ins: Instruction) -> str:
    """The state space named in the opcode ('' for generic)."""
    for part in ins.op[1:]:
        base = part.split("::")[0]
        if base in SPACES:
            return base
    return ""


def address(op: Operand, dec: Decoder, space: str) -> Addr:
    """A reader of `[base+offset]` as uint64 addresses in `space` (generic addresses when `space` is '')."""
    if op.kind != "addr":
        raise dec.error(f"expected an address [..], found {op}")
    off = np.uint64(int(op.value) & (2**64 - 1))
    base = op.name
    if not base:
        return lambda st: np.asarray(off)
    if base.startswith("%"):
        r = dec.src(Operand("reg", base), "u64")
        return lambda st: r(st) + off
    sym_space = dec.symbols.get(base)
    if sym_space is None:
        raise dec.error(f"unknown variable {base}")
    window = np.uint64(0)
    if space == "" and sym_space == "shared":
        window = np.uint64(SHARED_WINDOW)
    elif space == "" and sym_space in ("local", "callparam"):
        window = np.uint64(LOCAL_WINDOW)
    return lambda st: np.asarray(np.uint64(st.symbol(base)) + off + window)


def _rows_access(arr: Array, rows: Array, offs: Array, dt: np.dtype[Any], st: Any, what: str) -> Array:
    n = arr.shape[1]
    k = dt.itemsize
    offs = offs.astype(np.int64)
    if offs.size and (offs.min() < 0 or offs.max() + k > n):
        bad = offs[(offs < 0) | (offs + k > n)][0]
        raise st.fault(f"{what} access of {k} bytes at offset {int(bad):#x} is outside its {n} bytes")
    flat: Array = rows.astype(np.int64) * n + offs
    return flat


def _gather(arr: Array, flat: Array, dt: np.dtype[Any]) -> Array:
    k = dt.itemsize
    if arr.shape[1] % k == 0 and not (flat % k).any():
        out: Array = arr.reshape(-1).view(dt)[flat // k]
        return out
    raw: Array = arr.reshape(-1)[flat[:, None] + np.arange(k)]
    return raw.copy().view(dt).reshape(-1)


def _scatter(arr: Array, flat: Array, vals: Array) -> None:
    k = vals.dtype.itemsize
    if arr.shape[1] % k == 0 and not (flat % k).any():
        arr.reshape(-1).view(vals.dtype)[flat // k] = vals
    else:
        arr.reshape(-1)[flat[:, None] + np.arange(k)] = np.ascontiguousarray(vals).view(np.uint8).reshape(-1, k)


def _param_rows(st: Any) -> Array:
    return np.frombuffer(st.params, np.uint8).reshape(1, -1) if st.params else np.zeros((1, 0), np.uint8)


def load(st: Any, space: str, addrs: Array, lanes: Array, dt: np.dtype[Any]) -> Array:
    """Load one `dt` per lane of `lanes` from `addrs` (uint64, one per listed lane) in `space`."""
    if space in ("global", "const"):
        loaded: Array = st.global_load(addrs, dt)
        return loaded
    if space == "shared":
        return _gather(st.shared, _rows_access(st.shared, st.blk[lanes], addrs, dt, st, "shared"), dt)
    if space == "local":
        return _gather(st.local, _rows_access(st.local, lanes, addrs, dt, st, "local"), dt)
    if space == "param":
        rows = _param_rows(st)
        return _gather(rows, _rows_access(rows, np.zeros(lanes.size, np.int64), addrs, dt, st, "param"), dt)
    out = np.empty(addrs.size, dt)
    for sp, sel, sub in _generic(addrs):
        out[sel] = load(st, sp, sub, lanes[sel], dt)
    return out


def store(st: Any, space: str, addrs: Array, lanes: Array, vals: Array) -> None:
    """Store `vals` (one per lane of `lanes`) at `addrs` in `space`."""
    if space in ("global", "const"):
        st.global_store(addrs, vals)
    elif space == "shared":
        _scatter(st.shared, _rows_access(st.shared, st.blk[lanes], addrs, vals.dtype, st, "shared"), vals)
    elif space == "local":
        _scatter(st.local, _rows_access(st.local, lanes, addrs, vals.dtype, st, "local"), vals)
    elif space == "param":
        raise st.fault("a store to kernel parameters (.param) is not supported")
    else:
        for sp, sel, sub in _generic(addrs):
            store(st, sp, sub, lanes[sel], vals[sel])


def _generic(addrs: Array) -> list[tuple[str, Array, Array]]:
    a = addrs.astype(np.uint64)
    if a.size == 0 or a.max() < SHARED_WINDOW:
        return [("global", np.arange(a.size), a)]
    out = []
    loc = a >= LOCAL_WINDOW
    sh = (a >= SHARED_WINDOW) & ~loc
    gl = ~(loc | sh)
    for sp, sel, base in (("global", gl, 0), ("shared", sh, SHARED_WINDOW), ("local", loc, LOCAL_WINDOW)):
        if sel.any():
            idx = np.nonzero(sel)[0]
            out.append((sp, idx, a[idx] - np.uint64(base)))
    return out


def _lanes(st: Any, mask: Mask) -> Array:
    return np.arange(st.n) if mask is None else np.nonzero(mask)[0]


def _per_lane(v: Array, st: Any, lanes: Array) -> Array:
    v = np.asarray(v)
    if v.ndim == 0:
        return np.broadcast_to(v, (lanes.size,))
    return v if lanes.size == st.n else v[lanes]


def _vec_items(op: Operand) -> tuple[Operand, ...]:
    return op.items if op.kind == "vec" else (op,)


def effective_space(ins: Instruction, op: Operand, dec: Decoder) -> str:
    """The instruction's state space; `.param` accesses of a call's slots go to local memory."""
    space = space_of(ins)
    if space == "param" and dec.symbols.get(op.name) == "callparam":
        return "local"
    return space


def _ld(ins: Instruction, dec: Decoder) -> Step:
    t = next((p for p in reversed(ins.op) if p in TYPE_BYTES), None)
    if t is None:
        raise dec.error("ld needs a type")
    space = effective_space(ins, ins.operands[1], dec)
    addr = address(ins.operands[1], dec, space)
    items = _vec_items(ins.operands[0])
    dt = NP[t]
    k = TYPE_BYTES[t]
    ws = [dec.dst(it, t) for it in items]

    def step(st: Any, m: Mask) -> None:
        lanes = _lanes(st, m)
        base = _per_lane(addr(st), st, lanes)
        for j, w in enumerate(ws):
            vals = load(st, space, base + np.uint64(j * k), lanes, dt)
            if m is not None:
                full = np.zeros(st.n, dt)
                full[lanes] = vals
                vals = full
            w(st, vals, m)

    return step


def _st(ins: Instruction, dec: Decoder) -> Step:
    t = next((p for p in reversed(ins.op) if p in TYPE_BYTES), None)
    if t is None:
        raise dec.error("st needs a type")
    space = effective_space(ins, ins.operands[0], dec)
    addr = address(ins.operands[0], dec, space)
    srcs = [dec.src(it, t) for it in _vec_items(ins.operands[1])]
    k = TYPE_BYTES[t]
    dt = NP[t]

    def step(st: Any, m: Mask) -> None:
        lanes = _lanes(st, m)
        base = _per_lane(addr(st), st, lanes)
        for j, s in enumerate(srcs):
            store(st, space, base + np.uint64(j * k), lanes, np.ascontiguousarray(_per_lane(s(st), st, lanes), dt))

    return step


def _cvta(ins: Instruction, dec: Decoder) -> Step:
    t = next((p for p in reversed(ins.op) if p in TYPE_BYTES), "u64")
    to = "to" in ins.op
    space = space_of(ins)
    window = {"shared": SHARED_WINDOW, "local": LOCAL_WINDOW}.get(space, 0)
    a = dec.src(ins.operands[1], "u64")
    w = dec.dst(ins.operands[0], t)
    delta = np.uint64(window)
    if to:
        return lambda st, m: w(st, (a(st) - delta).astype(NP[t]), m)
    return lambda st, m: w(st, (a(st) + delta).astype(NP[t]), m)


def _atomic_fn(op: str, t: str) -> Callable[[Array, Array, Array | None], Array]:
    if op == "add":
        return lambda old, b, c: old + b
    if op == "min":
        return lambda old, b, c: np.fmin(old, b) if is_float(t) else np.minimum(old, b)
    if op == "max":
        return lambda old, b, c: np.fmax(old, b) if is_float(t) else np.maximum(old, b)
    if op == "and":
        return lambda old, b, c: old & b
    if op == "or":
        return lambda old, b, c: old | b
    if op == "xor":
        return lambda old, b, c: old ^ b
    if op == "exch":
        return lambda old, b, c: b
    if op == "inc":
        return lambda old, b, c: np.where(old >= b, 0, old + 1).astype(old.dtype)
    if op == "dec":
        return lambda old, b, c: np.where((old == 0) | (old > b), b, old - 1).astype(old.dtype)
    if op == "cas":
        return lambda old, b, c: np.where(old == b, old if c is None else c, old)
    raise KeyError(op)


def _atom(ins: Instruction, dec: Decoder) -> Step:
    red = ins.op[0] == "red"
    t = next((p for p in reversed(ins.op) if p in TYPE_BYTES), None)
    op = next(
        (p for p in ins.op[1:] if p in ("add", "min", "max", "and", "or", "xor", "exch", "inc", "dec", "cas")), ""
    )
    if t is None or not op or "v2" in ins.op or "v4" in ins.op or "v8" in ins.op:
        raise dec.error(f"unsupported atomic {'.'.join(ins.op)}")
    space = space_of(ins) or ""
    ops = ins.operands if not red else [Operand("sink"), *ins.operands]
    addr = address(ops[1], dec, space)
    b = dec.src(ops[2], t)
    c = dec.src(ops[3], t) if op == "cas" else None
    w = dec.dst(ops[0], t)
    dt = NP[t]
    bf = t == "bf16"
    f = _atomic_fn(op, "f32" if bf else t)

    def apply(old: Array, bv: Array, cv: Array | None) -> Array:
        if bf:
            return f32_to_bf16(f(bf16_to_f32(old), bf16_to_f32(bv), cv).astype(np.float32))
        return np.asarray(f(old, bv, cv), dt)

    def step(st: Any, m: Mask) -> None:
        lanes = _lanes(st, m)
        addrs = _per_lane(addr(st), st, lanes).astype(np.uint64)
        bv = np.ascontiguousarray(_per_lane(b(st), st, lanes), dt)
        cv = np.ascontiguousarray(_per_lane(c(st), st, lanes), dt) if c is not None else None
        olds = np.zeros(lanes.size, dt)
        if op == "add" and not bf and lanes.size:
            _atomic_add(st, space, addrs, lanes, bv, olds)
        else:
            todo = np.arange(lanes.size)
            while todo.size:
                _, first = np.unique(addrs[todo], return_index=True)
                sel = np.sort(todo[first])
                old = load(st, space, addrs[sel], lanes[sel], dt)
                store(st, space, addrs[sel], lanes[sel], apply(old, bv[sel], cv[sel] if cv is not None else None))
                olds[sel] = old
                todo = np.setdiff1d(todo, sel, assume_unique=True)
        if not red:
            full = np.zeros(st.n, dt)
            full[lanes] = olds
            w(st, full, m)

    return step


def _atomic_add(st: Any, space: str, addrs: Array, lanes: Array, bv: Array, olds: Array) -> None:
    """Lanes adding to one address take turns in lane order: each sees the sum of the earlier lanes' values.
    Integers (wrapping, so order does not matter): one segmented prefix sum. Floats add in lane order: one cumsum
    per address while addresses are few, else rounds of one lane per address (as many rounds as lanes share one)."""
    order = np.argsort(addrs, kind="stable")
    sa = addrs[order]
    starts = np.r_[True, sa[1:] != sa[:-1]]
    first = np.nonzero(starts)[0]
    group = np.cumsum(starts) - 1
    base = load(st, space, sa[first], lanes[order][first], olds.dtype)
    vals = bv[order]
    if vals.dtype.kind in "iu":
        run = np.cumsum(vals, dtype=vals.dtype)
        before = run - vals  # sum of the earlier lanes overall
        acc = base[group] + (before - before[first][group])
        base = base + (run[np.r_[first[1:] - 1, vals.size - 1]] - before[first])
    elif first.size <= 64:
        acc = np.empty_like(vals)
        for g, s in enumerate(first):
            e = first[g + 1] if g + 1 < first.size else vals.size
            part = np.cumsum(np.r_[base[g], vals[s:e]].astype(vals.dtype), dtype=vals.dtype)
            acc[s:e] = part[:-1]
            base[g] = part[-1]
    else:
        rank = np.arange(vals.size) - first[group]
        acc = np.empty_like(vals)
        for r in range(int(rank.max()) + 1):
            sel = rank == r
            acc[sel] = base[group[sel]]
            base[group[sel]] = base[group[sel]] + vals[sel]
    olds[order] = acc
    store(st, space, sa[first], lanes[order][first], base)


def _xg_copy(ins: Instruction, dec: Decoder) -> Step:
    """A call's argument or result copy between two per-thread slots (made by `inline.py`)."""
    dst, src, size = ins.operands[0].name, ins.operands[1].name, int(ins.operands[2].value)

    def step(st: Any, m: Mask) -> None:
        d, s = st.symbol(dst), st.symbol(src)
        if m is None:
            st.local[:, d : d + size] = st.local[:, s : s + size]
        else:
            rows = np.nonzero(m)[0]
            st.local[rows, d : d + size] = st.local[rows, s : s + size]

    return step


def _isspacep(ins: Instruction, dec: Decoder) -> Step:
    """isspacep.space p, a: whether generic address a lies in that state space's window."""
    space = space_of(ins)
    a = dec.src(ins.operands[1], "u64")
    w = dec.dst(ins.operands[0], "pred")
    sw, lw = np.uint64(SHARED_WINDOW), np.uint64(LOCAL_WINDOW)

    def step(st: Any, m: Mask) -> None:
        v = np.broadcast_to(a(st), (st.n,))
        if space == "shared":
            r = (v >= sw) & (v < lw)
        elif space == "local":
            r = v >= lw
        elif space in ("global", "const"):
            r = v < sw
        else:
            raise st.fault(f"isspacep.{space} is not supported")
        w(st, r, m)

    return step


OPS.update(
    {
        "isspacep": _isspacep,
        "xg": _xg_copy,
        "ld": _ld,
        "ldu": _ld,
        "st": _st,
        "cvta": _cvta,
        "atom": _atom,
        "red": _atom,
    }
)
