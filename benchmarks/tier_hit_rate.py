"""Tier hit rate: how often each placement policy and skip rule answers without the cold tier, at what recall.

    .venv/bin/python benchmarks/tier_hit_rate.py                 # both workloads, full size (~15 min on 2 cores)
    .venv/bin/python benchmarks/tier_hit_rate.py --quick         # small sizes, a smoke run
    .venv/bin/python benchmarks/tier_hit_rate.py --workloads synthetic --out results/tier_hit_rate
    # ~8 min on 2 cores: every policy x rule set at 10 %, both size skews, namespace policy swept
    .venv/bin/python benchmarks/tier_hit_rate.py --workloads synthetic --namespaces 1000 --preload 5000 \
        --writes 200 --reads 1000 --sweep-policies namespace --out results/synthetic_sizes
    # ~5 min: a 4x longer replay (fewer first reads), rules 1+2 only
    .venv/bin/python benchmarks/tier_hit_rate.py --workloads synthetic --namespaces 1000 --preload 5000 \
        --writes 800 --reads 4000 --policies lru lfu recency namespace --rule-sets complete+bound \
        --shares 0.10 --out results/synthetic_sizes_long

Both workloads are replayed through the real coordinator (TieredMemory), sidecar (CPU backend here)
and LanceDB cold tier, once per (policy, rule set, hot capacity), each run in a fresh store.

* synthetic: a multi-tenant agent workload. Namespaces get Zipf read popularity (exponent 1.1);
  how many memories each namespace holds is the explicit parameter --size-skew:
    proportional  writes follow the same Zipf ranking as reads, so a namespace's size grows with its
                  popularity (the most-read tenants are the largest; at 1000 namespaces the most
                  read one holds ~17 % of all memories, more than a 10 % hot tier);
    independent   writes follow the same Zipf law over a random permutation of the namespaces:
                  the same heavy-tailed size distribution, but a namespace's size says nothing
                  about how often it is read.
  Both are reported by default (workload names synthetic-proportional / synthetic-independent);
  the issue text ("thousands of namespaces with Zipf popularity") fixes neither. Namespace names are
  a random relabelling (t<label>), so a name says nothing about popularity (policies break ties by name). Memories arrive in episodes (a run of memories on one topic, a topic is a random
  direction and a memory is topic + noise); a read references one memory of the namespace with
  age rank r ~ P(r) proportional to (r + 1)^-1.6 (biased to recent memories, a long tail: about 12 % of
  references are older than the 20th newest memory), the query is that memory plus noise. A history
  is preloaded straight into the cold tier (the store is then opened, which warms the hot tier),
  then writes and reads are interleaved. Hot capacity: 10 % of all memories at the end.
* locomo: the LoCoMo development split. One namespace per conversation; sessions are ingested in
  time order (conversations interleaved session by session); each question is asked right after
  the session holding its last evidence turn, and again at the end. WordLlama embeddings.

Policies: lru, lfu, recency, lfu+pin, namespace, namespace+new (the namespace policy with a
reserve of --new-share of the hot capacity for recently written small namespaces; not run by default)
namespace+prior (the namespace policy valuing each namespace at (aged reads + --prior) / rows, so
small namespaces never read yet are kept whole and warmed first; not run by default) and namespace+zipf
(the namespace policy valuing each namespace at its posterior mean read rate under a Zipf popularity
law fitted to the reads seen, per row; counts age with --zipf-half-life; not run by default).

--ceilings (synthetic) adds what placement alone can reach with rule 1 at the main capacity, replayed at
namespace granularity without the sidecar (rule1_ceilings): a policy that knows the true read popularity,
the best policy that ranks by read counts (Bayes posterior mean under the true popularity law), and the
prior model of namespace+prior; reported in the workload's JSON entry.

    # the issue's target (10 % capacity); ~7 min on 2 cores, then two more seeds (~1.5 min each)
    .venv/bin/python benchmarks/tier_hit_rate.py --workloads synthetic --size-skew independent \
        --policies lru lfu namespace namespace+prior namespace+zipf --rule-sets complete+bound complete+bound+tau \
        --sweep-policies namespace+zipf namespace+prior lfu --shares 0.05 0.10 0.20 --ceilings --out results/t7_final
    .venv/bin/python benchmarks/tier_hit_rate.py --workloads synthetic --size-skew independent --seed 1 \
        --policies namespace+prior namespace+zipf --rule-sets complete+bound --shares 0.10 --ceilings \
        --out results/t7_zipf_seed1

Per run: the share of searches answered without the cold tier (rule complete / bound / threshold),
recall@10 against exact search over all memories of the namespace, latency p50/p99 per path, and
rows moved between tiers (inserted, promoted, evicted). The synthetic searches are also reported for
the second half of the replay alone ("hit rate 2nd half"): the first reads of each namespace find a
policy with no read history yet (a cold start), the second half is closer to a steady state. Prints a table; writes <out>.json and
<out>_hit_rate_vs_capacity.png, <out>_recall_vs_hit_rate.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


from tiered_recall import TieredMemory  # noqa: E402
from tiered_recall.policies import LFU, LRU, NamespacePolicy, RecencyWindow, zipf_read_rates  # noqa: E402
from tiered_recall.hot import HotTier, segment_path  # noqa: E402

LOCOMO = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
K = 10
_DIA = re.compile(r"^D:?(\d+):0*(\d+)$")


# ---- workloads ----------------------------------------------------------------------------

@dataclass
class Workload:
    name: str
    dim: int
    preload: list  # (namespace, ids, vectors, created_s) rows written straight to the cold tier first
    events: list  # ("add", ns, ids, vectors, created_s) | ("search", ns, q, phase)
    total_rows: int
    tau: float
    pin: list  # namespaces a "pinned" policy pins
    info: dict | None = None  # workload parameters and shape, reported in the JSON
    read_pop: np.ndarray | None = None  # synthetic: the true read popularity of the i-th most read namespace
    ns_index: dict | None = None  # synthetic: namespace name -> i (its rank in read popularity)


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


SIZE_SKEWS = ("proportional", "independent")


def synthetic(*, namespaces: int, preload_rows: int, writes: int, reads: int, dim: int = 64,
              seed: int = 0, tau: float = 0.5, size_skew: str = "proportional") -> Workload:
    """size_skew: "proportional" (writes follow the read popularity: size grows with popularity) or
    "independent" (writes follow the same Zipf law over a random permutation of the namespaces)."""
    if size_skew not in SIZE_SKEWS:
        raise ValueError(f"size_skew must be one of {SIZE_SKEWS}, got {size_skew!r}")
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, namespaces + 1) ** 1.1
    pop /= pop.sum()
    if size_skew == "independent":
        write_pop = pop[np.random.default_rng(seed + 1).permutation(namespaces)]
    else:
        write_pop = pop
    # names carry no rank: namespace i (i-th most read) is called t<label[i]> for a random label, so a
    # policy that breaks ties by name learns nothing about popularity from it
    label = np.random.default_rng(seed + 2).permutation(namespaces)
    name = [f"t{label[i]}" for i in range(namespaces)]
    index = {n: i for i, n in enumerate(name)}
    rows: dict[int, list[int]] = {i: [] for i in range(namespaces)}  # ids per namespace, oldest first
    vecs: dict[int, np.ndarray] = {}
    episode: dict[int, tuple[np.ndarray, int]] = {}
    next_id = [1]
    clock = [1_700_000_000.0]

    def write(ns: int, m: int):
        topic, left = episode.get(ns, (None, 0))
        out_ids, out_vecs = [], []
        for _ in range(m):
            if left <= 0:
                topic, left = unit(rng.standard_normal(dim)), int(rng.geometric(1 / 6))
            v = unit(topic + 0.35 * rng.standard_normal(dim) / math.sqrt(dim))
            left -= 1
            i = next_id[0]
            next_id[0] += 1
            vecs[i] = v
            rows[ns].append(i)
            out_ids.append(i)
            out_vecs.append(v)
        episode[ns] = (topic, left)
        clock[0] += 1.0
        return out_ids, np.stack(out_vecs), clock[0]

    preload = []
    while next_id[0] <= preload_rows:
        ns = int(rng.choice(namespaces, p=write_pop))
        ids, v, t = write(ns, int(rng.integers(1, 4)))
        preload.append((name[ns], ids, v, t))
    ranks = np.arange(1, 100_000, dtype=np.float64) ** -1.6
    events = []
    total = reads + writes
    read_at = set(rng.choice(total, size=reads, replace=False).tolist())
    for e in range(total):
        ns = int(rng.choice(namespaces, p=pop if e in read_at else write_pop))
        if e in read_at and rows[ns]:
            n = len(rows[ns])
            p = ranks[:n] / ranks[:n].sum()
            target = rows[ns][n - 1 - int(rng.choice(n, p=p))]
            q = unit(vecs[target] + 0.3 * rng.standard_normal(dim) / math.sqrt(dim))
            events.append(("search", name[ns], q, "first-half" if 2 * e < total else "second-half"))
        else:
            ids, v, t = write(ns, int(rng.integers(1, 4)))
            events.append(("add", name[ns], ids, v, t))
    top = [name[i] for i in range(5)]
    sizes = np.array([len(rows[i]) for i in range(namespaces)], dtype=np.float64)
    total_rows = next_id[0] - 1
    info = {"size_skew": size_skew, "namespaces": namespaces, "rows": total_rows,
            "nonempty_namespaces": int((sizes > 0).sum()),
            "largest_namespace_share": float(sizes.max() / total_rows),
            "most_read_namespace_share": float(sizes[0] / total_rows),
            "read_share_of_top10_read": float(pop[:10].sum()),
            "rows_of_top10_read_share": float(sizes[:10].sum() / total_rows)}
    # What rule 1 can reach at a 10 % hot tier, whatever the policy: a namespace's first read finds
    # no read history; a clairvoyant static set of complete namespaces (final sizes, greedy by reads
    # per row) is an upper estimate; reads to a namespace larger than the tier can never be rule 1.
    reads_per_ns = np.zeros(namespaces)
    for ev in events:
        if ev[0] == "search":
            reads_per_ns[index[ev[1]]] += 1
    searches, cap = reads_per_ns.sum(), round(0.10 * total_rows)
    budget, oracle = cap, 0.0
    for i in sorted(np.flatnonzero(reads_per_ns), key=lambda i: -reads_per_ns[i] / sizes[i]):
        if sizes[i] <= budget:
            budget -= sizes[i]
            oracle += reads_per_ns[i]
    info.update({"searches": int(searches), "first_read_share": float((reads_per_ns > 0).sum() / searches),
                 "oracle_complete_share_at_10pct": float(oracle / searches),
                 "reads_to_namespaces_larger_than_10pct": float(reads_per_ns[sizes > cap].sum() / searches)})
    w = Workload(f"synthetic-{size_skew}", dim, preload, events, total_rows, tau, top, info)
    w.read_pop = pop  # true read popularity of the i-th most read namespace (for rule1_ceilings only)
    w.ns_index = index  # namespace name -> i
    return w


def rule1_ceilings(w: Workload, share: float = 0.10, prior: float = 0.3, half_life: float = 2000.0,
                   zipf_half_life: float = math.inf) -> dict:
    """What placement alone can reach with rule 1 at this capacity, replayed at namespace granularity
    (no sidecar: a namespace is hot-complete or not; rows move as in NamespacePolicy: the chosen set is a
    greedy knapsack by value per row; warm loads it; a write to a chosen namespace enters, evicting the
    lowest-valued rows; a miss on a chosen namespace loads it whole). Values per row:
      true_popularity  the generator's own read probability (knows what no policy can): an upper estimate
      bayes_counts     the posterior mean read rate given the namespace's read count so far, under the
                       generator's true popularity distribution as the prior: the best any policy that
                       ranks by read counts can do
      prior_model      (aged reads + prior) / rows: NamespacePolicy(prior=...) at namespace granularity
      zipf_model       the posterior mean read rate under a Zipf law fitted to the reads seen / rows:
                       NamespacePolicy(popularity="zipf") at namespace granularity (zipf_read_rates)
    Returns {name: {"hit_rate", "hit_rate_2nd_half", "first_read_hit_rate"}}."""
    names = w.ns_index
    pop = np.asarray(w.read_pop, dtype=np.float64)
    n_ns = len(pop)
    cap = int(round(share * w.total_rows))
    tie = np.random.default_rng(12345).permutation(n_ns)
    out = {}
    for model in ("true_popularity", "bayes_counts", "prior_model", "zipf_model"):
        aged_model = model in ("prior_model", "zipf_model")
        model_half_life = zipf_half_life if model == "zipf_model" else half_life
        total = np.zeros(n_ns)
        for ns, ids, _v, _t in w.preload:
            total[names[ns]] += len(ids)
        hot = np.zeros(n_ns)
        count = np.zeros(n_ns)  # raw read counts (bayes) or aged counts (prior model)
        count_at = np.zeros(n_ns)
        state = {"reads": 0, "tick": 0}
        cache: dict = {}

        def value() -> np.ndarray:
            size = np.maximum(total, 1)
            if model == "true_popularity":
                v = pop / size
            elif model == "prior_model":
                v = (count * np.exp2(-(state["tick"] - count_at) / half_life) + prior) / size
            elif model == "zipf_model":
                v = np.zeros(n_ns)
                with_rows = total > 0
                aged = count * np.exp2(-(state["tick"] - count_at) / model_half_life)
                v[with_rows] = zipf_read_rates(aged[with_rows], cache=cache) / size[with_rows]
            else:
                t = state["reads"]
                rate = np.empty(n_ns)
                logp = np.log(pop)
                for n in np.unique(count):
                    key = (n, t)
                    if key not in cache:
                        a = n * logp - pop * t
                        e = np.exp(a - a.max())
                        cache[key] = float((e * pop).sum() / e.sum())
                    rate[count == n] = cache[key]
                v = rate / size
            return np.where(total > 0, v, -np.inf)

        def plan(v: np.ndarray) -> np.ndarray:
            chosen = np.zeros(n_ns, dtype=bool)
            budget = cap
            for i in tie[np.argsort(-v[tie], kind="stable")]:  # equal values: a random order, not the rank
                if not np.isfinite(v[i]):
                    break
                if 0 < total[i] <= budget:
                    chosen[i] = True
                    budget -= total[i]
            return chosen

        def make_room(need: float, protect: int, v: np.ndarray) -> bool:
            if need <= 0:
                return True
            for i in tie[np.argsort(v[tie], kind="stable")]:
                if i == protect or hot[i] <= 0:
                    continue
                take = min(hot[i], need)
                hot[i] -= take
                need -= take
                if need <= 0:
                    return True
            return False

        v = value()
        chosen = plan(v)
        hot[chosen] = total[chosen]
        hits, first, seen = [], [], set()
        for ev in w.events:
            state["tick"] += 1
            i = names[ev[1]]
            if ev[0] == "add":
                m = len(ev[2])
                total[i] += m
                v = value()
                chosen = plan(v)
                if chosen[i]:
                    if make_room(hot.sum() + m - cap, i, v):
                        hot[i] += m
                else:
                    hot[i] += min(m, max(0.0, cap - hot.sum()))
            else:
                hit = hot[i] == total[i]
                hits.append(hit)
                first.append(i not in seen)
                seen.add(i)
                state["reads"] += 1
                count[i] = count[i] * (2.0 ** (-(state["tick"] - count_at[i]) / model_half_life) if aged_model else 1.0) + 1
                count_at[i] = state["tick"]
                v = value()
                chosen = plan(v)
                if not hit and chosen[i] and make_room(hot.sum() + total[i] - hot[i] - cap, i, v):
                    hot[i] = total[i]
        hits_a, first_a = np.array(hits), np.array(first)
        out[model] = {"hit_rate": float(hits_a.mean()), "hit_rate_2nd_half": float(hits_a[len(hits_a) // 2:].mean()),
                      "first_read_hit_rate": float(hits_a[first_a].mean())}
    return out


def locomo(path: Path, *, tau: float = 0.5, max_conversations: int | None = None) -> Workload:
    from tiered_recall.embedders import WordLlamaEmbedder

    embed = WordLlamaEmbedder()
    data = json.loads(path.read_text())[:max_conversations]
    per_conv = []
    next_id = 1
    for conv in data:
        c = conv["conversation"]
        ns = conv["sample_id"]
        sessions = sorted(int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k) and c[k])
        by_session = {}
        for s in sessions:
            date = c.get(f"session_{s}_date_time", "")
            texts = [f"{date}: {t['speaker']} said, \"{t['text']}\"" for t in c[f"session_{s}"]]
            ids = list(range(next_id, next_id + len(texts)))
            next_id += len(texts)
            by_session[s] = (ids, unit(embed(texts)), texts)
        qs = [qa for qa in conv["qa"] if qa.get("category") in (1, 2, 3, 4, 5) and qa.get("question")]
        qv = unit(embed([qa["question"] for qa in qs]))
        after: dict[int, list] = {}
        for qa, v in zip(qs, qv):
            last = 0
            for ev in qa.get("evidence", []):
                for part in str(ev).replace(",", ";").split(";"):
                    m = _DIA.match(part.strip())
                    if m and int(m.group(1)) in by_session:
                        last = max(last, int(m.group(1)))
            after.setdefault(last if last else sessions[-1], []).append(v)
        per_conv.append((ns, sessions, by_session, after, qv))
    events = []
    t = 1_700_000_000.0
    for step in range(max(len(p[1]) for p in per_conv)):
        for ns, sessions, by_session, after, _ in per_conv:
            if step < len(sessions):
                s = sessions[step]
                ids, v, _texts = by_session[s]
                t += 3600
                events.append(("add", ns, ids, v, t))
                for q in after.get(s, []):
                    events.append(("search", ns, q, "after-evidence"))
    for ns, _, _, _, qv in per_conv:
        for q in qv:
            events.append(("search", ns, q, "end"))
    return Workload("locomo", embed.dim, [], events, next_id - 1, tau, [per_conv[0][0]])


# ---- replay -------------------------------------------------------------------------------

NEW_SHARE = [0.3]  # --new-share: the namespace+new policy's reserve for new rows (share of the capacity)
PRIOR = [0.3]  # --prior: the namespace+prior policy's prior reads per namespace
ZIPF_HALF_LIFE = [math.inf]  # --zipf-half-life: the namespace+zipf policy's read-count half-life (ticks)


def make_policy(name: str, pin: list[str]):
    return {"lru": lambda: LRU(), "lfu": lambda: LFU(half_life=2000), "recency": lambda: RecencyWindow(),
            "lfu+pin": lambda: LFU(half_life=2000, pin_namespaces=pin),
            "namespace": lambda: NamespacePolicy(half_life=2000),
            "namespace+new": lambda: NamespacePolicy(half_life=2000, new_share=NEW_SHARE[0]),
            "namespace+prior": lambda: NamespacePolicy(half_life=2000, prior=PRIOR[0]),
            "namespace+zipf": lambda: NamespacePolicy(half_life=ZIPF_HALF_LIFE[0], popularity="zipf")}[name]()


RULE_SETS = {"complete": (("complete",), None), "complete+bound": (("complete", "bound"), None),
             "complete+bound+tau": (("complete", "bound"), "tau")}


def stop_sidecar(memory: TieredMemory) -> None:
    name = memory.sidecar_name
    memory.close()
    if segment_path(name).exists():
        try:
            with HotTier.attach(name) as hot:
                os.kill(hot.owner_pid, signal.SIGTERM)
        except Exception:
            pass


def build_preload(w: Workload, root: Path) -> Path | None:
    if not w.preload:
        return None
    from tiered_recall.storage import ColdStore

    base = root / f"{w.name}-base"
    cold = ColdStore(base / "cold", dim=w.dim, background=False)
    batch: list = []

    def flush():
        if not batch:
            return
        ids = np.concatenate([np.asarray(b[1]) for b in batch]).astype(np.int64)
        cold.add(ids=ids, vectors=np.vstack([b[2] for b in batch]),
                 namespaces=[b[0] for b in batch for _ in b[1]], texts=[f"m{i}" for i in ids],
                 sessions=[None] * len(ids), roles=[None] * len(ids),
                 created_at_us=np.concatenate([[int(b[3] * 1e6)] * len(b[1]) for b in batch]),
                 metadata=[None] * len(ids))
        batch.clear()

    for item in w.preload:
        batch.append(item)
        if len(batch) >= 4000:
            flush()
    flush()
    cold.optimize()
    cold.close()
    return base


def replay(w: Workload, root: Path, base: Path | None, *, policy: str, rules: str, capacity: int) -> dict:
    run = root / f"{w.name}-{policy}-{rules}-{capacity}"
    if run.exists():
        shutil.rmtree(run)
    if base is not None:
        shutil.copytree(base, run)
    rule_list, tau = RULE_SETS[rules]
    memory = TieredMemory(run, dim=w.dim, embedder=None, device="cpu", hot_capacity=capacity,
                          policy=make_policy(policy, w.pin), rules=rule_list,
                          confidence=w.tau if tau else None, orphan_grace_s=5.0)
    exact_ids: dict[str, list] = {}
    exact_vecs: dict[str, list] = {}
    for ns, ids, v, _ in w.preload:
        exact_ids.setdefault(ns, []).extend(ids)
        exact_vecs.setdefault(ns, []).append(v)
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def exact(ns: str, q: np.ndarray) -> set[int]:
        if ns not in cache:
            cache[ns] = (np.asarray(exact_ids[ns], dtype=np.int64), np.vstack(exact_vecs[ns]))
        ids, x = cache[ns]
        s = x @ q
        order = np.lexsort((ids, -s))[:K]
        return set(ids[order].tolist())

    moved0 = dict(memory.stats()["rows_moved"])
    records = []
    t_start = time.perf_counter()
    for ev in w.events:
        if ev[0] == "add":
            _, ns, ids, v, t = ev
            memory.add(["m"] * len(ids), vectors=v, ids=ids, namespace=ns, created_at=t)
            exact_ids.setdefault(ns, []).extend(ids)
            exact_vecs.setdefault(ns, []).append(v)
            cache.pop(ns, None)
        else:
            _, ns, q, phase = ev
            report = memory.search(q, k=K, namespace=ns, explain=True)
            want = exact(ns, q)
            got = {h.id for h in report.hits}
            records.append((report.rule, report.path, report.seconds, len(got & want) / max(1, len(want)), phase))
    wall = time.perf_counter() - t_start
    stats = memory.stats()
    moved = {key: stats["rows_moved"][key] - moved0.get(key, 0) for key in ("inserted", "promoted", "evicted")}
    stop_sidecar(memory)
    shutil.rmtree(run, ignore_errors=True)
    n = len(records)
    rules_arr = np.array([r[0] for r in records])
    paths = np.array([r[1] for r in records])
    secs = np.array([r[2] for r in records]) * 1e6
    rec = np.array([r[3] for r in records])
    latency = {}
    for p in ("hot", "hot+cold"):
        sel = paths == p
        if sel.any():
            latency[p] = {"searches": int(sel.sum()), "p50_us": float(np.percentile(secs[sel], 50)),
                          "p99_us": float(np.percentile(secs[sel], 99))}
    by_rule = {r: int((rules_arr == r).sum()) for r in ("complete", "bound", "threshold", "cold", "no-spare-core", "no-hot")}
    skipped = rules_arr != "cold"
    return {
        "workload": w.name, "policy": policy, "rules": rules, "capacity": capacity,
        "capacity_share": capacity / w.total_rows, "searches": n,
        "hit_rate": float(skipped.mean()) if n else None,
        "recall_at_10": float(rec.mean()) if n else None,
        "recall_when_skipped": float(rec[skipped].mean()) if skipped.any() else None,
        "exact_when_bound": bool((rec[rules_arr == "bound"] == 1.0).all()),
        "decided_by": by_rule, "latency": latency, "rows_moved": moved, "wall_s": wall,
        "phases": {ph: {"hit_rate": float(skipped[[r[4] == ph for r in records]].mean()),
                        "recall_at_10": float(rec[[r[4] == ph for r in records]].mean())}
                   for ph in sorted({r[4] for r in records})},
    }


# ---- report -------------------------------------------------------------------------------

def second(r: dict) -> str:
    ph = r["phases"].get("second-half")
    return f"{100 * ph['hit_rate']:.1f}% (recall {ph['recall_at_10']:.4f})" if ph else "-"


def table(results: list[dict]) -> str:
    head = ("| workload | policy | rules | hot cap | hit rate | recall@10 | hit rate 2nd half | by rule (complete/bound/tau/cold) "
            "| p50/p99 hot us | p50/p99 hot+cold us | rows in/promoted/evicted |")
    lines = [head, "|" + "---|" * 11]
    for r in results:
        d = r["decided_by"]
        lat = r["latency"]
        hot = lat.get("hot")
        cold = lat.get("hot+cold")
        fmt = (lambda x: f"{x['p50_us']:.0f}/{x['p99_us']:.0f}" if x else "-")
        m = r["rows_moved"]
        lines.append(f"| {r['workload']} | {r['policy']} | {r['rules']} | {r['capacity']} ({100 * r['capacity_share']:.0f}%) "
                     f"| {100 * r['hit_rate']:.1f}% | {r['recall_at_10']:.4f} | {second(r)} | {d['complete']}/{d['bound']}/{d['threshold']}/{d['cold']} "
                     f"| {fmt(hot)} | {fmt(cold)} | {m['inserted']}/{m['promoted']}/{m['evicted']} |")
    return "\n".join(lines)


def plots(results: list[dict], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    workloads = sorted({r["workload"] for r in results})
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    for ax, wl in zip(axes[0], workloads):
        for pol in sorted({r["policy"] for r in results}):
            pts = sorted((r["capacity_share"], r["hit_rate"]) for r in results
                         if r["workload"] == wl and r["policy"] == pol and r["rules"] == "complete+bound")
            if pts:
                ax.plot([100 * p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=pol)
        ax.set_title(f"{wl}: answered without the cold tier (rules 1+2)")
        ax.set_xlabel("hot capacity (% of all memories)")
        ax.set_ylabel("hit rate (%)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = f"{out}_hit_rate_vs_capacity.png"
    fig.savefig(path, dpi=110)
    written.append(path)
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.5), squeeze=False)
    markers = {"complete": "o", "complete+bound": "s", "complete+bound+tau": "^"}
    for ax, wl in zip(axes[0], workloads):
        for r in results:
            if r["workload"] == wl:
                ax.scatter(100 * r["hit_rate"], r["recall_at_10"], marker=markers[r["rules"]],
                           label=f"{r['policy']} {r['rules']}" if r["capacity_share"] == max(
                               x["capacity_share"] for x in results if x["workload"] == wl) else None, alpha=0.8)
        ax.set_title(f"{wl}: recall@10 against hit rate (all runs)")
        ax.set_xlabel("hit rate (%)")
        ax.set_ylabel("recall@10 vs exact")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = f"{out}_recall_vs_hit_rate.png"
    fig.savefig(path, dpi=110)
    written.append(path)
    plt.close("all")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=["synthetic", "locomo"], choices=["synthetic", "locomo"])
    ap.add_argument("--policies", nargs="+", default=["lru", "lfu", "recency", "lfu+pin", "namespace"])
    ap.add_argument("--rule-sets", nargs="+", default=list(RULE_SETS), choices=list(RULE_SETS),
                    help="rule sets compared at the main capacity")
    ap.add_argument("--sweep-policies", nargs="+", default=None, help="policies for the capacity sweep (default: --policies)")
    ap.add_argument("--locomo-conversations", type=int, default=None, help="only the first N conversations")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument("--namespaces", type=int, default=2000)
    ap.add_argument("--size-skew", nargs="+", default=list(SIZE_SKEWS), choices=SIZE_SKEWS,
                    help="synthetic: namespace sizes proportional to read popularity, or independent of it "
                         "(same Zipf size law, permuted); each one given is a separate workload")
    ap.add_argument("--preload", type=int, default=20000, help="synthetic: memories written before the replay")
    ap.add_argument("--writes", type=int, default=1500, help="synthetic: add calls (1-3 memories each) in the replay")
    ap.add_argument("--reads", type=int, default=6000, help="synthetic: searches in the replay")
    ap.add_argument("--shares", nargs="+", type=float, default=[0.05, 0.10, 0.20],
                    help="hot capacities for the sweep, as shares of all memories (rules 1+2)")
    ap.add_argument("--main-share", type=float, default=0.10, help="synthetic capacity for the rule comparison")
    ap.add_argument("--locomo-main-share", type=float, default=0.25)
    ap.add_argument("--locomo-shares", nargs="+", type=float, default=[0.10, 0.25, 0.50])
    ap.add_argument("--new-share", type=float, default=NEW_SHARE[0],
                    help="policy namespace+new: share of the hot capacity reserved for the newest rows of "
                         "namespaces not kept whole")
    ap.add_argument("--prior", type=float, default=PRIOR[0],
                    help="policy namespace+prior: reads credited to every namespace before its reads are seen "
                         "(value per row = (aged reads + prior) / rows; unread small namespaces are kept whole)")
    ap.add_argument("--zipf-half-life", type=float, default=ZIPF_HALF_LIFE[0],
                    help="policy namespace+zipf: half-life of its read counts in ticks (default inf: no ageing, "
                         "the synthetic popularity does not drift)")
    ap.add_argument("--seed", type=int, default=0, help="synthetic: the workload's random seed")
    ap.add_argument("--ceilings", action="store_true",
                    help="synthetic: also replay placement alone at namespace granularity (no sidecar) at the main "
                         "capacity: a policy knowing the true popularity, the best read-count policy (Bayes "
                         "posterior under the true popularity law), the prior model and the fitted Zipf model "
                         "(see rule1_ceilings)")
    ap.add_argument("--out", default=str(REPO / "results" / "tier_hit_rate"))
    args = ap.parse_args(argv)
    NEW_SHARE[0] = args.new_share
    PRIOR[0] = args.prior
    ZIPF_HALF_LIFE[0] = args.zipf_half_life
    if args.quick:
        args.namespaces, args.preload, args.writes, args.reads = 200, 2000, 150, 600
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = []
    workloads_info: dict = {}
    with tempfile.TemporaryDirectory(prefix="tier-hit-rate-") as tmp:
        root = Path(tmp)
        todo = [(wl, skew) for wl in args.workloads for skew in (args.size_skew if wl == "synthetic" else [None])]
        for wl, skew in todo:
            if wl == "synthetic":
                w = synthetic(namespaces=args.namespaces, preload_rows=args.preload, writes=args.writes, reads=args.reads,
                              size_skew=skew, seed=args.seed)
                main_share, shares = args.main_share, args.shares
            else:
                if not LOCOMO.exists():
                    print(f"LoCoMo not found at {LOCOMO}: skipped", file=sys.stderr)
                    continue
                w = locomo(LOCOMO, max_conversations=2 if args.quick else args.locomo_conversations)
                main_share, shares = args.locomo_main_share, args.locomo_shares
            if w.info is not None and args.ceilings and w.read_pop is not None:
                w.info["rule1_ceilings"] = rule1_ceilings(w, main_share, prior=args.prior,
                                                              zipf_half_life=args.zipf_half_life)
            if w.info:
                print(f"{w.name}: {json.dumps(w.info)}", flush=True)
                workloads_info[w.name] = w.info
            base = build_preload(w, root)
            runs = [(p, rs, main_share) for p in args.policies for rs in args.rule_sets]
            runs += [(p, "complete+bound", s) for p in (args.sweep_policies or args.policies) for s in shares
                     if s != main_share]
            for policy, rules, share in runs:
                capacity = max(1, int(round(share * w.total_rows)))
                r = replay(w, root, base, policy=policy, rules=rules, capacity=capacity)
                results.append(r)
                print(f"  {w.name:22s} {policy:9s} {rules:20s} cap {capacity:6d}: hit {100 * r['hit_rate']:5.1f}% "
                      f"recall {r['recall_at_10']:.4f} ({r['wall_s']:.0f} s)", flush=True)
    print()
    print(table(results))
    Path(f"{out}.json").write_text(json.dumps({"command": " ".join(sys.argv), "k": K, "workloads": workloads_info,
                                                "results": results}, indent=1))
    written = [f"{out}.json"]
    try:
        written += plots(results, out)
    except ImportError:
        print("matplotlib is not installed: no PNGs (pip install matplotlib)", file=sys.stderr)
    print("\nwrote " + ", ".join(written))
    bad = [r for r in results if not r["exact_when_bound"]]
    if bad:
        print(f"ERROR: rule 2 changed an answer in {len(bad)} runs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
