"""Placement policies: which rows live in the hot tier, decided by the coordinator.

The sidecar's own eviction is LRU. A coordinator with a policy keeps the hot tier below its
capacity by deleting the policy's victims explicitly before each insert, so the sidecar never
has to choose. Policies rank hot rows by a priority (lowest is evicted first); pinned rows and
namespaces are never evicted.

    LRU()                              least recently used (a search hit or an insert uses a row)
    LFU(half_life=1000)                least frequently used, counts halve every half_life ticks
    RecencyWindow(rows_per_namespace=None)   newest rows by created_at; with rows_per_namespace,
                                       also at most that many rows of any one namespace;
                                       cold hits are not promoted (they would be evicted first)
    NamespacePolicy(half_life=1000, new_share=0.0, prior=0.0, popularity="counts")
                                       whole namespaces: keeps complete namespaces hot (so skip rule 1
                                       answers them exactly), chosen greedily by expected reads per row,
                                       (aged read count + prior) / rows (a knapsack filled by value per
                                       row; with prior > 0 a namespace never read yet is worth prior /
                                       rows, so small ones are kept whole by default and are complete at
                                       their first read; a fresh hot tier is warmed with the chosen
                                       namespaces), within the capacity left after pinning and
                                       the new-row reserve; a cold-path search of a chosen namespace
                                       loads all of it; other namespaces keep their newest rows in what
                                       room is left; new_share (0 <= new_share < 1) of the capacity is
                                       reserved for the most recently written small namespaces that
                                       are complete in the hot tier though not chosen (oldest leave
                                       first), so they are complete at their first read;
                                       popularity="zipf" values a namespace by its posterior mean
                                       read rate under a Zipf popularity law fitted to the reads
                                       seen (empirical Bayes) instead of (count + prior)

Each policy takes pin_namespaces=... and pin_ids=...; TieredMemory.pin / unpin change them later. A policy ranks
the rows of a HotSet (tiered_recall/coordinator/placement.py: what one process knows the hot tier holds).
Policy state is per process (see TieredMemory): with several writers the sidecar's LRU may evict.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable

import numpy as np

from .errors import InvalidInput

if TYPE_CHECKING:  # the table a policy ranks lives with the placement that keeps it
    from .coordinator.placement import HotSet


class Policy:
    """Base class: priority() ranks hot rows for eviction (lowest first)."""

    name = "policy"
    promote = True  # cold hits move into the hot tier

    def __init__(self, *, pin_namespaces: Iterable[str] = (), pin_ids: Iterable[int] = (),
                 promote: bool | None = None) -> None:
        self.pinned_namespaces: set[str] = set(pin_namespaces)
        self.pinned_ids: set[int] = {int(i) for i in pin_ids}
        if promote is not None:
            self.promote = bool(promote)

    def priority(self, table: "HotSet", rows: np.ndarray, now: int) -> np.ndarray:
        """Eviction priority of rows (slots of table) at tick now, (len(rows),) float64: the lowest is evicted first."""
        raise NotImplementedError

    admission = False  # when True, _place asks admit() how many new rows of a namespace may enter

    def per_namespace_cap(self) -> int | None:
        """At most this many hot rows of any one namespace (None: no cap); a batch's newest rows win."""
        return None

    # Hooks the coordinator calls; no-ops for row-granular policies.
    def observe(self, namespace: str, now: int) -> None:
        """A search of this namespace (tick now)."""

    def set_sizes(self, counts: dict[str, int], *, replace: bool = False) -> None:
        """Total rows per namespace (the cold tier's counts); replace=True forgets the others."""

    def whole_namespace(self, namespace: str, now: int, capacity: int) -> bool:
        """True when a cold-path search of this namespace should load the whole namespace hot."""
        return False

    def admit(self, table: "HotSet", namespace: str, m: int, now: int) -> int:
        """How many of m new rows of namespace may enter the hot tier (the newest ones win)."""
        return m

    def warm_namespaces(self, now: int, capacity: int) -> set[str] | None:
        """Namespaces to load whole when a fresh hot tier is warmed (sizes set first); None: the newest rows."""
        return None

    def is_pinned(self, row_id: int, namespace: str) -> bool:
        """True when the row or its namespace is pinned (never evicted)."""
        return row_id in self.pinned_ids or namespace in self.pinned_namespaces

    def describe(self) -> str:
        """The policy and its parameters, as TieredMemory.stats() reports it."""
        return self.name


class LRU(Policy):
    """Least recently used: a search hit or an insert uses a row, and the oldest use is evicted first."""

    name = "lru"

    def priority(self, table, rows, now):
        """Each row's tick of last use."""
        return table.last_use[rows].astype(np.float64)


class LFU(Policy):
    """Frequency with ageing: each use adds 1, and the count halves every half_life ticks (one
    tick per search or add), so yesterday's favourites make way for today's."""

    name = "lfu"

    def __init__(self, *, half_life: float = 1000.0, **kw) -> None:
        super().__init__(**kw)
        if not half_life > 0:
            raise InvalidInput(f"half_life must be > 0 ticks, got {half_life!r}")
        self.half_life = float(half_life)

    def priority(self, table, rows, now):
        """Each row's aged use count; ties go to the least recently used."""
        aged = table.freq[rows] * np.exp2(-(now - table.freq_at[rows]) / self.half_life)
        return aged + table.last_use[rows] * 1e-12  # ties: least recently used first

    def describe(self) -> str:
        """lfu with its half_life."""
        return f"lfu(half_life={self.half_life:g})"


class RecencyWindow(Policy):
    """Newest rows by created_at; with rows_per_namespace, also at most that many rows of any one namespace.
    Cold hits are not promoted (being older than the hot rows, they would be evicted first)."""

    name = "recency"
    promote = False

    def __init__(self, *, rows_per_namespace: int | None = None, **kw) -> None:
        super().__init__(**kw)
        if rows_per_namespace is not None and (not isinstance(rows_per_namespace, int) or rows_per_namespace < 1):
            raise InvalidInput(f"rows_per_namespace must be a positive int or None, got {rows_per_namespace!r}")
        self.rows_per_namespace = rows_per_namespace

    def priority(self, table, rows, now):
        """Each row's created_at (µs): the oldest is evicted first."""
        return table.created_us[rows].astype(np.float64)

    def per_namespace_cap(self) -> int | None:
        """rows_per_namespace (None: no cap)."""
        return self.rows_per_namespace

    def describe(self) -> str:
        """recency, with rows_per_namespace when set."""
        return "recency" if self.rows_per_namespace is None else f"recency(rows_per_namespace={self.rows_per_namespace})"


class NamespacePolicy(Policy):
    """Namespace-granular placement: the hot tier holds whole namespaces, so rule 1 ("complete")
    answers their searches exactly without the cold tier.

    Each search of a namespace adds 1 to its read count, which halves every half_life ticks (one
    tick per search or add). Its *density* is that count per row (count / total rows). The
    *chosen* namespaces are picked greedily by density, highest first, skipping any that does not
    fit, within capacity minus pinned rows: reading a small namespace often is worth more than
    reading a huge one as often. Eviction order (lowest first): rows of namespaces that are not
    chosen, by density, then rows of chosen namespaces; within a namespace the oldest row first
    (row-granular recency: a namespace too large to be chosen keeps its newest rows in the room
    left). A new row enters only when it would displace a row of lower rank (or there is room);
    rows of a chosen namespace always enter. A cold-path search of a chosen namespace that is not
    complete loads the whole namespace (the disk was read anyway); single cold hits are not
    promoted. Totals per namespace come from the coordinator (set_sizes), the same counts the
    sidecar publishes; whether a namespace is complete is always the sidecar's hot == total check.

    new_share: the share of the capacity (0 <= new_share < 1; default 0, no reserve) kept for
    namespaces that were written recently but never (or not enough) read. With R = floor(new_share
    * capacity) the chosen namespaces are picked within capacity - pinned - R; of the namespaces
    that are not chosen (nor pinned) and are complete in the hot tier, the reserve keeps the most
    recently written ones (by their newest hot row, greedily, skipping any that does not fit in
    what is left of R). Their rows rank above every other row that is not chosen and below the
    chosen ones, oldest first. New rows that make their namespace complete and that namespace is at
    most R rows always enter (displacing rows outside the reserve first, then the reserve's oldest);
    other new rows follow the admission rule above. A small namespace written recently is then
    complete when it is first read, before any read history could choose it.

    prior (>= 0; default 0): reads credited to every namespace with rows, so the density is (aged
    read count + prior) / total rows and namespaces never read are candidates too, valued by prior /
    rows: with no read history the greedy choice keeps the smallest namespaces whole (the most
    namespaces per row of capacity), and reads then move the choice towards the namespaces read most
    per row. The prior is the reads a namespace is expected to get before its read count says more:
    a small prior trusts history sooner, a large one keeps more small unread namespaces. A fresh hot
    tier is warmed with the chosen namespaces (warm_namespaces), not the newest rows.

    popularity ("counts" or "zipf"; default "counts"): how a read count becomes expected reads.
    "counts" is (aged count + prior) as above. "zipf" is empirical Bayes: it assumes the read
    popularity of the namespaces with rows follows a Zipf law p_r ~ r^-s (the usual shape of
    multi-tenant traffic), fits s so that the expected number of distinct namespaces read after
    the reads seen equals the number observed, and values each namespace by its posterior mean
    read rate given its count (zipf_read_rates). What a count is worth then depends on how many
    reads have gone by: over 200 namespaces, a namespace never read is worth 0.34 of one read
    once after 50 reads, and 0.97 after 5,000 (by then one read is the law's long tail too),
    where (count + prior) fixes that ratio at prior / (1 + prior). prior is not used with "zipf";
    warming a fresh tier still keeps the smallest namespaces whole (every unread namespace has
    the same rate).
    """

    name = "namespace"
    promote = False
    admission = True

    def __init__(self, *, half_life: float = 1000.0, new_share: float = 0.0, prior: float = 0.0,
                 popularity: str = "counts", **kw) -> None:
        super().__init__(**kw)
        if popularity not in POPULARITY_MODELS:
            raise InvalidInput(f"popularity must be one of {POPULARITY_MODELS}, got {popularity!r}")
        if isinstance(half_life, bool) or not isinstance(half_life, (int, float)) or not half_life > 0:
            raise InvalidInput(f"half_life must be > 0 ticks, got {half_life!r}")
        if isinstance(new_share, bool) or not isinstance(new_share, (int, float)) or not 0 <= new_share < 1:
            raise InvalidInput(f"new_share must be a share of the capacity in [0, 1), got {new_share!r}")
        if isinstance(prior, bool) or not isinstance(prior, (int, float)) or not 0 <= prior < math.inf:
            raise InvalidInput(f"prior must be a finite number of reads >= 0, got {prior!r}")
        self.half_life = float(half_life)
        self.new_share = float(new_share)
        self.prior = float(prior)
        self.popularity = popularity
        self._zipf_cache: dict = {}
        self.heat: dict[str, tuple[float, int]] = {}  # namespace -> (read count, tick it was last aged to)
        self.sizes: dict[str, int] = {}
        self._version = 0
        self._cached: tuple | None = None  # (now, capacity, version, chosen, ranks)

    def observe(self, namespace: str, now: int) -> None:
        """Adds one read to the namespace's aged read count (tick now); forgets namespaces whose reads aged away
        once many are tracked."""
        count, at = self.heat.get(namespace, (0.0, now))
        self.heat[namespace] = (count * 2.0 ** (-(now - at) / self.half_life) + 1.0, now)
        self._version += 1
        if len(self.heat) > 4 * max(64, len(self.sizes)):  # forget namespaces whose reads aged away
            self.heat = {ns: (c, t) for ns, (c, t) in self.heat.items()
                         if c * 2.0 ** (-(now - t) / self.half_life) > 1e-3}

    def set_sizes(self, counts: dict[str, int], *, replace: bool = False) -> None:
        """Records total rows per namespace (a count <= 0 forgets the namespace); replace=True forgets the others
        first."""
        if replace:
            self.sizes = {}
        for ns, n in counts.items():
            if n > 0:
                self.sizes[ns] = int(n)
            else:
                self.sizes.pop(ns, None)
        self._version += 1

    def density(self, namespace: str, now: int) -> float:
        """Expected reads per row: (aged read count + prior) / total rows, or with popularity="zipf"
        the posterior mean read rate / total rows."""
        if self.popularity == "zipf":
            return self._densities(now).get(namespace, 0.0)
        count, at = self.heat.get(namespace, (0.0, now))
        return (count * 2.0 ** (-(now - at) / self.half_life) + self.prior) / max(1, self.sizes.get(namespace, 1))

    def _densities(self, now: int) -> dict[str, float]:
        """density() of every namespace that counts: the read ones, and with a prior every one with rows."""
        names = list(self.heat)
        if self.prior > 0 or self.popularity == "zipf":
            names += [ns for ns in self.sizes if ns not in self.heat]
        if not names:
            return {}
        counts = np.array([self.heat.get(ns, (0.0, now))[0] for ns in names], dtype=np.float64)
        ats = np.array([self.heat.get(ns, (0.0, now))[1] for ns in names], dtype=np.float64)
        sizes = np.array([max(1, self.sizes.get(ns, 1)) for ns in names], dtype=np.float64)
        aged = counts * np.exp2(-(now - ats) / self.half_life)
        if self.popularity == "zipf":
            with_rows = np.array([self.sizes.get(ns, 0) > 0 for ns in names], dtype=bool)
            reads = aged[with_rows]
            expected = zipf_read_rates(reads, cache=self._zipf_cache)
            dens = np.zeros(len(names))
            dens[with_rows] = expected / sizes[with_rows]
        else:
            dens = (aged + self.prior) / sizes
        return dict(zip(names, dens.tolist()))

    def reserve(self, capacity: int) -> int:
        """Rows of a hot tier of this capacity kept for recently written namespaces that are not chosen."""
        return int(self.new_share * capacity)

    def _plan(self, now: int, capacity: int) -> tuple[set[str], dict[str, int]]:
        """(chosen namespaces, rank per namespace: higher is evicted later; unknown namespaces rank 0)."""
        c = self._cached
        if c is not None and c[:3] == (now, capacity, self._version):
            return c[3], c[4]
        budget = capacity - len(self.pinned_ids) - sum(self.sizes.get(ns, 0) for ns in self.pinned_namespaces) \
            - self.reserve(capacity)
        dens = self._densities(now)
        chosen: set[str] = set()
        for ns in sorted(dens, key=lambda n: (-dens[n], self.sizes.get(n, 0), n)):
            size = self.sizes.get(ns, 0)
            if dens[ns] <= 0 or ns in self.pinned_namespaces or size == 0:
                continue
            if size <= budget:
                chosen.add(ns)
                budget -= size
        keys = sorted({(ns in chosen, d) for ns, d in dens.items()} | {(False, 0.0)})
        rank_of = {key: r for r, key in enumerate(keys)}
        base = rank_of[(False, 0.0)]
        ranks = {ns: rank_of[(ns in chosen, d)] - base for ns, d in dens.items()}
        self._cached = (now, capacity, self._version, chosen, ranks)
        return chosen, ranks

    def chosen(self, now: int, capacity: int) -> set[str]:
        """The namespaces this policy keeps whole in a hot tier of this capacity (rows)."""
        return set(self._plan(now, capacity)[0])

    def priority(self, table, rows, now):
        """Each row's namespace rank (chosen namespaces highest, then the reserve's, then the others by density) plus
        less than 0.5 for its age, oldest lowest."""
        chosen, ranks = self._plan(now, table.capacity)
        names = [table.namespace[s] for s in rows]
        ns_rank = np.array([ranks.get(ns, 0) for ns in names], dtype=np.float64)
        created = table.created_us[rows]
        order = np.lexsort((table.ids[rows], created))  # oldest first, ties by id
        frac = np.empty(len(rows), dtype=np.float64)
        frac[order] = np.arange(len(rows)) / max(1, len(rows))
        reserve = self.reserve(table.capacity)
        if reserve > 0 and len(rows):
            # ranks are consecutive ints, chosen namespaces above the others: lift the chosen ones by
            # one and put the reserve in the gap, oldest first within it
            is_chosen = np.array([ns in chosen for ns in names], dtype=bool)
            kept = self._reserved(table, [names[j] for j in order[::-1] if not is_chosen[j]], reserve)
            if kept:
                top_other = max((r for ns, r in ranks.items() if ns not in chosen), default=0)
                ns_rank[is_chosen] += 1.0
                ns_rank[np.array([ns in kept for ns in names], dtype=bool)] = top_other + 1.0
        return ns_rank + 0.5 * frac

    def _reserved(self, table, newest_first: list, reserve: int) -> set:
        """The namespaces the reserve keeps: complete in the hot tier, taken greedily by their newest
        row (newest first), skipping any that does not fit in what is left of the reserve."""
        kept: set[str] = set()
        seen: set[str] = set()
        budget = reserve
        for ns in newest_first:
            if ns in seen:
                continue
            seen.add(ns)
            total = self.sizes.get(ns, 0)
            if 0 < total <= budget and table.per_namespace.get(ns, 0) == total:
                kept.add(ns)
                budget -= total
                if budget == 0:
                    break
        return kept

    def whole_namespace(self, namespace, now, capacity):
        """True for a chosen namespace that is not pinned."""
        return namespace not in self.pinned_namespaces and namespace in self._plan(now, capacity)[0]

    def warm_namespaces(self, now: int, capacity: int) -> set[str] | None:
        """The chosen namespaces and the pinned ones that have rows."""
        return self.chosen(now, capacity) | {ns for ns in self.pinned_namespaces if ns in self.sizes}

    def admit(self, table, namespace, m, now):
        """All m for a chosen or pinned namespace or when they fit the free room; else as many as the free room plus
        the hot rows of lower-ranked namespaces (and its own) make room for, or all m where they complete a namespace
        small enough for the reserve."""
        chosen, ranks = self._plan(now, table.capacity)
        free = table.capacity - len(table)
        if namespace in chosen or namespace in self.pinned_namespaces or m <= free:
            return m
        mine = ranks.get(namespace, 0)
        lower = sum(n for ns, n in table.per_namespace.items()
                    if ns not in self.pinned_namespaces and (ranks.get(ns, 0) < mine or ns == namespace))
        room = free + lower
        total = self.sizes.get(namespace, 0)
        if table.per_namespace.get(namespace, 0) + m == total <= self.reserve(table.capacity):
            room = max(room, m)  # the rows complete a namespace small enough for the reserve
        return max(0, min(m, room))

    def describe(self) -> str:
        """namespace with its half_life, and new_share, prior and popularity where they are not the defaults."""
        extra = "".join(f", {name}={v:g}" for name, v in (("new_share", self.new_share), ("prior", self.prior)) if v)
        if self.popularity != "counts":
            extra += f", popularity={self.popularity}"
        return f"namespace(half_life={self.half_life:g}{extra})"


POPULARITY_MODELS = ("counts", "zipf")


def _zipf_law(n: int, s: float) -> np.ndarray:
    p = np.arange(1, n + 1, dtype=np.float64) ** -s
    return p / p.sum()


def fit_zipf_exponent(namespaces: int, reads: float, distinct: int) -> float:
    """The Zipf exponent s in [0.05, 4] under which `reads` reads over `namespaces` namespaces are
    expected to touch `distinct` of them: E[distinct] = sum_r 1 - exp(-p_r * reads), which falls as
    s grows, solved by bisection to 0.01."""
    def expected_distinct(s: float) -> float:
        return float((1.0 - np.exp(-_zipf_law(namespaces, s) * reads)).sum())
    lo, hi = 0.05, 4.0
    if expected_distinct(lo) <= distinct:
        return lo
    if expected_distinct(hi) >= distinct:
        return hi
    while hi - lo > 0.01:
        mid = 0.5 * (lo + hi)
        if expected_distinct(mid) > distinct:
            lo = mid
        else:
            hi = mid
    return round(0.5 * (lo + hi), 2)


def zipf_read_rates(counts: np.ndarray, *, cache: dict | None = None) -> np.ndarray:
    """Posterior mean read rate (share of all reads) of each namespace given its read count, when the
    namespaces' popularities are a Zipf law (fit_zipf_exponent, from these counts) assigned to them in
    an unknown order: E[p | c] = sum_r p_r^(c+1) e^(-p_r t) / sum_r p_r^c e^(-p_r t), with t the reads
    seen (Poisson). Counts may be aged (non-integer). Every namespace gets the same rate before any read."""
    counts = np.asarray(counts, dtype=np.float64)
    n = len(counts)
    if n == 0:
        return counts
    cache = {} if cache is None else cache
    t = float(counts.sum())
    if t <= 0:
        return np.full(n, 1.0 / n)
    distinct = int((counts > 1e-9).sum())
    key = (n, round(t, 3), distinct)
    s = cache.get(key)
    if s is None:
        if len(cache) > 4096:
            cache.clear()
        s = cache[key] = fit_zipf_exponent(n, t, distinct)
    law = _zipf_law(n, s)
    log_law = np.log(law)
    values, inverse = np.unique(np.round(counts, 3), return_inverse=True)
    if len(values) <= _ZIPF_EXACT_COUNTS:
        return _posterior_rates(values, law, log_law, t)[inverse]
    # Aged counts are nearly all distinct: one row per count would make this O(namespaces^2) on every plan
    # (2,000 namespaces: ~120 ms). The posterior is smooth in the count, so evaluate it on a grid even in
    # log(1 + count) and interpolate.
    grid = np.expm1(np.linspace(0.0, np.log1p(values[-1]), _ZIPF_GRID))
    return np.interp(counts, grid, _posterior_rates(grid, law, log_law, t))


_ZIPF_EXACT_COUNTS = 256  # up to this many distinct counts (integer counts, half_life=inf) are evaluated exactly
_ZIPF_GRID = 64  # more (aged counts) are interpolated between this many grid points (max relative error ~0.1 %)


def _posterior_rates(values: np.ndarray, law: np.ndarray, log_law: np.ndarray, t: float) -> np.ndarray:
    exponent = values[:, None] * log_law[None, :] - law[None, :] * t
    weight = np.exp(exponent - exponent.max(axis=1, keepdims=True))
    return (weight * law[None, :]).sum(axis=1) / weight.sum(axis=1)


POLICIES = {"lru": LRU, "lfu": LFU, "recency": RecencyWindow, "namespace": NamespacePolicy}


def resolve_policy(spec: str | Policy | None) -> Policy:
    """The policy a store uses: LRU() for None, a Policy as it is, a new one for a name in POLICIES; else
    InvalidInput."""
    if spec is None:
        return LRU()
    if isinstance(spec, Policy):
        return spec
    if isinstance(spec, str) and spec in POLICIES:
        return POLICIES[spec]()
    raise InvalidInput(f"policy must be one of {sorted(POLICIES)} or a Policy instance, got {spec!r}")
