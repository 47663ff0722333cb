"""Pattern matching over UOps: `UPat` describes a subgraph, `PatternMatcher` is a table of (pattern, rewrite function)
rules, and `graph_rewrite` applies a table to a whole graph until nothing matches (a fixpoint)."""

from __future__ import annotations

import inspect
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from xgrad.dtype import DType
from xgrad.helpers import REWRITE_STACK_LIMIT
from xgrad.uop.ops import GroupOp, Ops, UOp

Store = dict[str, UOp]
RewriteFn = Callable[..., Any]  # a node (or None) for rewrites; spec tables return bools
# (pattern, function, whether it takes ctx, ops its sources must include, the compiled pattern or None)
Rule = tuple["UPat", RewriteFn, bool, frozenset[Ops], "Callable[[UOp, Store], bool] | None"]
_NO_OPS: frozenset[Ops] = frozenset()


class UPat:
    """A pattern. `op` may be one op or a set; `src` is a tuple (in order), a list (any order: commutative ops) or
    a single UPat that every source must match; `name` binds the matched node for the rewrite function."""

    __slots__ = ("ops", "dtypes", "src", "arg", "name", "allow_any_len", "early_reject", "src_kind")

    def __init__(
        self,
        op: Ops | Iterable[Ops] | None = None,
        dtype: DType | Iterable[DType] | None = None,
        src: UPat | tuple[UPat, ...] | list[UPat] | None = None,
        arg: Any = None,
        name: str | None = None,
        allow_any_len: bool = False,
    ):
        self.ops: frozenset[Ops] | None = (
            frozenset((op,)) if isinstance(op, Ops) else frozenset(op) if op is not None else None
        )
        self.dtypes: frozenset[DType] | None = (
            frozenset((dtype,)) if isinstance(dtype, DType) else frozenset(dtype) if dtype is not None else None
        )
        self.arg = arg
        self.name = name
        self.allow_any_len = allow_any_len
        self.src_kind = (
            "none" if src is None else "all" if isinstance(src, UPat) else "perm" if isinstance(src, list) else "seq"
        )
        self.src: tuple[UPat, ...] = (src,) if isinstance(src, UPat) else tuple(src) if src is not None else ()
        # ops that must appear among the direct sources: a cheap test before the full match
        self.early_reject = (
            frozenset(next(iter(s.ops)) for s in self.src if s.ops is not None and len(s.ops) == 1)
            if self.src_kind in ("seq", "perm")
            else frozenset()
        )

    # ---- builders ----
    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype, name=name)

    @staticmethod
    def const(dtype: DType | Iterable[DType] | None, value: Any) -> UPat:
        return UPat(Ops.CONST, dtype, arg=value)

    def named(self, name: str) -> UPat:
        pat = UPat(self.ops, self.dtypes, None, self.arg, name, self.allow_any_len)
        pat.src, pat.src_kind, pat.early_reject = self.src, self.src_kind, self.early_reject
        return pat

    def _alu(self, op: Ops, other: UPat | int | float, commutative: bool) -> UPat:
        o = other if isinstance(other, UPat) else UPat.const(None, other)
        return UPat(op, src=[self, o] if commutative else (self, o))

    def __add__(self, x: UPat | int | float) -> UPat:
        return self._alu(Ops.ADD, x, True)

    def __mul__(self, x: UPat | int | float) -> UPat:
        return self._alu(Ops.MUL, x, True)

    def __floordiv__(self, x: UPat | int) -> UPat:
        return self._alu(Ops.IDIV, x, False)

    def __mod__(self, x: UPat | int) -> UPat:
        return self._alu(Ops.MOD, x, False)

    def lt(self, x: UPat | int | float) -> UPat:
        return self._alu(Ops.CMPLT, x, False)

    def ne(self, x: UPat | int | float) -> UPat:
        return self._alu(Ops.CMPNE, x, True)

    def maximum(self, x: UPat | int | float) -> UPat:
        return self._alu(Ops.MAX, x, True)

    def where(self, a: UPat | int | float, b: UPat | int | float) -> UPat:
        pa = a if isinstance(a, UPat) else UPat.const(None, a)
        pb = b if isinstance(b, UPat) else UPat.const(None, b)
        return UPat(Ops.WHERE, src=(self, pa, pb))

    def cast(self, dtype: DType | None = None) -> UPat:
        return UPat(Ops.CAST, dtype, (self,))

    # ---- matching ----
    def match(self, u: UOp, store: Store) -> list[Store]:
        if self.ops is not None and u.op not in self.ops:
            return []
        if self.dtypes is not None and u.dtype not in self.dtypes and u.dtype.scalar() not in self.dtypes:
            return []
        if self.arg is not None and u.arg != self.arg:
            return []
        if self.name is not None:
            if (bound := store.get(self.name)) is not None:
                return [store] if bound is u else []
            store = {**store, self.name: u}
        if self.src_kind == "none":
            return [store]
        if self.src_kind == "all":
            stores = [store]
            for s in u.src:
                stores = [st for prev in stores for st in self.src[0].match(s, prev)]
                if not stores:
                    break
            return stores
        if len(u.src) != len(self.src) and not (self.allow_any_len and len(u.src) >= len(self.src)):
            return []
        orders: Iterable[Sequence[UPat]] = (self.src,) if self.src_kind == "seq" else itertools.permutations(self.src)
        out: list[Store] = []
        for order in orders:
            stores = [store]
            for pat, s in zip(order, u.src):
                stores = [st for prev in stores for st in pat.match(s, prev)]
                if not stores:
                    break
            out.extend(stores)
        return out

    def compile(self) -> Callable[[UOp, Store], bool] | None:
        """This pattern as one function `(node, store) -> matched`, binding names into `store` as it goes; None when
        a list source (any order) makes it able to match one node in several ways (then `match` is used). `match`
        builds a list of stores per pattern node; the compiled form does no allocation, which is most of the cost of
        a table tried on every node of a graph. It answers what `match` answers: a failed match leaves `store`
        half-filled, so give it a fresh dict per attempt."""
        if self.src_kind == "perm":
            return None
        subs = [s.compile() for s in self.src]
        if any(m is None for m in subs):
            return None
        ops, dts, arg, name = self.ops, self.dtypes, self.arg, self.name
        kind, n, any_len = self.src_kind, len(self.src), self.allow_any_len
        sub = tuple(m for m in subs if m is not None)
        one = sub[0] if sub else None

        def matches(u: UOp, store: Store) -> bool:
            if ops is not None and u.op not in ops:
                return False
            if dts is not None and u.dtype not in dts and u.dtype.scalar() not in dts:
                return False
            if arg is not None and u.arg != arg:
                return False
            if name is not None:
                if (bound := store.get(name)) is not None:
                    return bound is u  # bound before: its sources were checked then
                store[name] = u
            if kind == "none":
                return True
            src = u.src
            if kind == "all":
                assert one is not None
                for s in src:
                    if not one(s, store):
                        return False
                return True
            if len(src) != n and not (any_len and len(src) >= n):
                return False
            for m, s in zip(sub, src):
                if not m(s, store):
                    return False
            return True

        return matches

    def __repr__(self) -> str:
        ops = "None" if self.ops is None else "|".join(sorted(o.name for o in self.ops))
        return f"UPat({ops}, name={self.name!r}, src={self.src!r})"


class PatternMatcher:
    """A rewrite table. Rules are indexed by the op they match, so a node only tries rules that could apply."""

    def __init__(self, rules: Sequence[tuple[UPat, RewriteFn]]):
        self.rules = list(rules)
        self.by_op: dict[Ops, list[Rule]] = defaultdict(list)
        for pat, fn in self.rules:
            wants_ctx = "ctx" in inspect.signature(fn).parameters
            rule = (pat, fn, wants_ctx, pat.early_reject, pat.compile())
            for op in pat.ops if pat.ops is not None else list(Ops):
                self.by_op[op].append(rule)
        # per op: whether a rule needs the set of its node's source ops (an early reject), built once per node then
        self.needs_src_ops = {op: any(r[3] for r in rules_) for op, rules_ in self.by_op.items()}
        # per op whose rules ask for their first source's op: first source's op -> the rules that can match (filled
        # on first use). A table of pushes, INDEX(node, ...) with one rule per op of node, tries one rule, not all.
        self.by_first: dict[Ops, dict[Ops | None, list[Rule]]] = {
            op: {} for op, rules_ in self.by_op.items() if any(_first_ops(r[0]) is not None for r in rules_)
        }

    def _narrow(self, op: Ops, first: Ops | None) -> list[Rule]:
        """The rules for `op` that can match a node whose first source has op `first` (None: a node without sources),
        in table order."""
        out = []
        for rule in self.by_op[op]:
            ops = _first_ops(rule[0])
            if ops is None or (first in ops if first is not None else rule[0].src_kind == "all"):
                out.append(rule)
        return out

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        """The first rule whose pattern matches and whose function returns a node; None if none does."""
        ret = self.first_result(u, ctx)
        return ret if isinstance(ret, UOp) else None

    def first_result(self, u: UOp, ctx: Any = None) -> Any:
        """What the first matching rule returns that is not None or `u` itself (spec tables return bools)."""
        candidates = self.by_op.get(u.op)
        if not candidates:
            return None
        if (by_first := self.by_first.get(u.op)) is not None:
            first = u.src[0].op if u.src else None
            if (narrowed := by_first.get(first)) is None:
                narrowed = by_first[first] = self._narrow(u.op, first)
            candidates = narrowed
        src_ops = {s.op for s in u.src} if self.needs_src_ops[u.op] else _NO_OPS
        for pat, fn, wants_ctx, early_reject, compiled in candidates:
            if early_reject and not early_reject <= src_ops:
                continue
            if compiled is not None:  # at most one way to match
                store: Store = {}
                if not compiled(u, store):
                    continue
                ret = fn(ctx=ctx, **store) if wants_ctx else fn(**store)
                if ret is not None and ret is not u:
                    return ret
                continue
            for store in pat.match(u, {}):
                ret = fn(ctx=ctx, **store) if wants_ctx else fn(**store)
                if ret is not None and ret is not u:
                    return ret
        return None


VISIT, BUILD, ALIAS = 0, 1, 2  # graph_rewrite's stages of a node on its stack


def _first_ops(pat: UPat) -> frozenset[Ops] | None:
    """The ops the first source of a node matching `pat` can have; None when any op (or no source) can match."""
    if pat.src_kind == "none" or not pat.src:
        return None
    firsts = pat.src if pat.src_kind == "perm" else pat.src[:1]  # any of a list's patterns may match the first
    if any(f.ops is None for f in firsts):
        return None
    return frozenset().union(*(f.ops for f in firsts if f.ops is not None))


class RewriteStats:
    """Counts rewrites per pass name (for bench/ and DEBUG)."""

    calls: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)


def graph_rewrite(
    root: UOp,
    pm: PatternMatcher,
    ctx: Any = None,
    name: str = "rewrite",
    bottom_up: bool = False,
    memo: dict[UOp, UOp] | None = None,
    last_source_first: bool = False,
) -> UOp:
    """Rewrite the graph under `root` until no rule of `pm` matches any node.

    Default order: a node is matched after its sources are rewritten. `bottom_up=True` matches a node first, before
    its sources (useful when a rule must see the original subgraph). Sources are visited first to last, or last to
    first with `last_source_first` (a ctx that numbers what its rules create sees them in that order). `memo` (node
    -> its final rewrite) is read and filled in place; share one across calls only for a table whose rules depend on
    nothing but the node (no ctx)."""
    start = time.perf_counter()
    replace: dict[UOp, UOp] = {} if memo is None else memo
    # stack entries: (node, stage, target). VISIT: match first if bottom_up, then visit the sources; BUILD: the
    # sources are done, rebuild the node on their results and match it; ALIAS: node becomes target's result
    stack: list[tuple[UOp, int, UOp]] = [(root, VISIT, root)]
    push = stack.append
    pop = stack.pop
    rewrite = pm.rewrite
    ruled = pm.by_op  # a node whose op no rule matches is not offered to the table (two calls less per node)
    limit = int(REWRITE_STACK_LIMIT.value)
    max_steps = limit * 8
    steps = 0
    while stack:
        steps += 1
        if steps > max_steps or len(stack) > limit:
            raise RuntimeError(f"graph_rewrite {name!r} does not terminate: a rule probably undoes another")
        node, stage, target = pop()
        if stage == ALIAS:
            replace[node] = replace[target]
            continue
        if node in replace:
            continue
        if stage == VISIT:
            if bottom_up and node.op in ruled and (new := rewrite(node, ctx)) is not None:
                # match the result at once, and its result, ...: a chain of rewrites is one step each
                while new not in replace and new.op in ruled and (again := rewrite(new, ctx)) is not None:
                    push((new, ALIAS, again))
                    new = again
                    steps += 1
                    if steps > max_steps:
                        raise RuntimeError(f"graph_rewrite {name!r} does not terminate: a rule probably undoes another")
                if new in replace:  # a result seen before (e.g. in a shared memo): nothing left to walk
                    replace[node] = replace[new]
                    continue
                push((node, ALIAS, new))
                node = new
            srcs = node.src if last_source_first else node.src[::-1]  # the stack pops the last pushed first
            todo = [(s, VISIT, s) for s in srcs if s not in replace]
            if todo:
                push((node, BUILD, node))
                stack.extend(todo)
                continue
            # no source left to rewrite: build the node now (what popping BUILD next would do)
        src = node.src
        new_src = tuple([replace[s] for s in src])
        if new_src != src:  # UOps compare by identity (hash-consed), so this is "some source changed"
            rebuilt = UOp(node.op, node.dtype, new_src, node.arg)
            if rebuilt in replace:
                replace[node] = replace[rebuilt]
            elif rebuilt.op not in ruled:  # nothing can match it: it is final (what its own BUILD would find)
                replace[node] = replace[rebuilt] = rebuilt
            else:
                push((node, ALIAS, rebuilt))
                push((rebuilt, BUILD, rebuilt))
            continue
        if node.op in ruled and (new := rewrite(node, ctx)) is not None:
            if new in replace:
                replace[node] = replace[new]
            else:
                push((node, ALIAS, new))
                push((new, VISIT, new))
            continue
        replace[node] = node
    RewriteStats.calls[name] += steps
    RewriteStats.seconds[name] += time.perf_counter() - start
    return replace[root]


def substitute(root: UOp, mapping: dict[UOp, UOp], name: str = "substitute", same_sizes: bool = False) -> UOp:
    """Replace nodes by identity (no pattern matching). `same_sizes`: every replacement has the shape and device of
    the node it replaces, so each new node takes the shape and device its original has already computed (sizing a
    few hundred new nodes one cached-property miss at a time costs milliseconds)."""
    memo: dict[UOp, UOp] = {}
    for u in root.toposort:
        if u in mapping:
            memo[u] = mapping[u]
            continue
        new_src = tuple(memo[s] for s in u.src)
        if all(a is b for a, b in zip(new_src, u.src)):
            memo[u] = u
            continue
        new = memo[u] = u.replace(src=new_src)
        if same_sizes:
            for attr in ("shape", "device"):
                if attr in u.__dict__ and attr not in new.__dict__:
                    new.__dict__[attr] = u.__dict__[attr]
    return memo[root]


__all__ = ["UPat", "PatternMatcher", "graph_rewrite", "substitute", "GroupOp", "RewriteStats"]
