"""Predictor quality and the pure-caching oracle ladder of recorded traces (issue 25), printed and drawn.

For each trace: the ladder (CPU off, uniform split, demand caching; hit rate and % of demand MIN
per rung, and where the hits are by block position), precision/recall of each predictor of the next
iteration's expert set (per layer, by block position, and on *returns*: experts the next access
uses that the current one does not), per-token route persistence by token class, and the
set-level view per class. The confidence-persistence table of the ``weighted`` predictor is
estimated on ``--dev`` only; on the dev trace itself its numbers are in-sample (marked ``dev``).
See ``oled_hf/sim/predictors.py`` for every definition.

    .venv/bin/python eval/predictor_quality.py --dev DEV.trace HELD_OUT.trace [...] \\
        [--capacity-pct 15 25 40 | --capacity SLOTS ...] [--out fig.png [--overwrite]] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a clone without installing
    sys.path.insert(0, str(ROOT))

from oled_hf.cli.common import one_line, user_error_types  # noqa: E402
from oled_hf.offload.trace import Trace, load_trace  # noqa: E402
from oled_hf.sim import predictors as P  # noqa: E402

PROG = "predictor_quality.py"
BY_POSITION = ("next-16 oracle", "next-oracle", "lru", "oled", "combined (c,f,g,h)")
LADDER_ORDER = ("MIN", "MIN+bypass", "next-oracle", "next-2 oracle", "next-4 oracle", "next-16 oracle",
                "previous set", "lru", "lfu", "oled", "persisting (b) + lru", "weighted (c) + lru",
                "periodic (f) + lru", "phase starts (g) + lru", "token memory (h) + lru", "(g) + (h) + lru",
                "combined (c,f,g,h)")


def slots_for(pct: float, num_experts: int) -> int:
    """Slots per layer for ``pct`` percent of a layer's experts (as ``oled-moe report`` sizes caches)."""
    from oled_hf.sim.report import slots_for as report_slots

    return report_slots(pct, num_experts)


def _load(path: str, flag: str) -> Trace:
    if not Path(path).is_file():
        raise ValueError(f"{flag} {path}: no such trace file")
    try:
        return load_trace(path)
    except ValueError as exc:
        raise ValueError(f"{flag} {path}: {exc}") from None


def _fmt(x: float, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def _table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def analyse(trace: Trace, table: P.PersistenceTable, capacities: list[int], oled: bool = True) -> dict:
    """Everything printed for one trace, as plain data (also the --json output)."""
    acc = P.accesses(trace)
    prio = P.oled_priorities(trace) if oled else np.zeros(0)
    ladder = P.cache_ladder(trace, capacities, acc=acc, table=table, oled=prio)
    quality = P.predictor_quality(trace, table, capacities, acc=acc, oled=prio)
    own = P.persistence_table(acc)
    cs = P.class_sets(acc)
    L = trace.num_layers
    return {
        "capacities": capacities, "num_experts": trace.num_experts, "num_layers": L,
        "forwards": trace.num_forwards,
        "ladder": [{"name": r.name, "capacity": r.capacity, "hits": r.hits, "requests": r.requests,
                    "hit_rate": r.hit_rate, "per_layer_hits": r.per_layer_hits,
                    "per_position_hits": r.per_position_hits, "per_position_requests": r.per_position_requests,
                    "return_hits_by_age": r.return_hits_by_age}
                   for r in ladder],
        "predictors": [{"name": q.name, "precision": q.precision(), "recall": q.recall(),
                        "returns_recall": q.returns_recall(),
                        "per_layer": [[q.precision(layer=l), q.recall(layer=l)] for l in range(L)],
                        "per_position": {p: [q.precision(position=j), q.recall(position=j),
                                             q.returns_recall(position=j), float(q.true[:, j].sum())]
                                         for j, p in enumerate(P.POSITIONS)}}
                       for q in quality],
        "persistence": {lab: {"rate": float(own.kept[:, c].sum() / own.rows[:, c].sum()) if own.rows[:, c].sum()
                              else None, "per_layer": [float(own.kept[l, c] / own.rows[l, c]) if own.rows[l, c]
                                                       else None for l in range(L)],
                              "rows": float(own.rows[:, c].sum())}
                        for c, lab in enumerate(own.labels)},
        "class_sets": {lab: {"experts": float(cs.used[:, c].sum()),
                             "in_next": float(cs.used_next[:, c].sum() / cs.used[:, c].sum()) if cs.used[:, c].sum()
                             else None,
                             "only_this_class": float(cs.only[:, c].sum()),
                             "only_in_next": float(cs.only_next[:, c].sum() / cs.only[:, c].sum())
                             if cs.only[:, c].sum() else None}
                       for c, lab in enumerate(cs.labels)},
        "set_rate_without_event": own.set_rate().tolist(),
        "return_ages": {"labels": P.age_labels(), "per_position": dict(zip(P.POSITIONS, P.return_ages(acc).tolist())),
                        "returns": int((acc.sets[:, 1:] & ~acc.sets[:, :-1]).sum()),
                        "requests": int(acc.sets.sum()), "mean_set": float(acc.sets.sum(-1).mean())},
    }


def format_report(name: str, a: dict, dev_rates: dict) -> str:
    caps = a["capacities"]
    by = {(r["name"], r["capacity"]): r for r in a["ladder"]}
    names = [n for n in LADDER_ORDER if any((n, c) in by for c in caps)]
    out = [f"== {name}: {a['forwards']} forwards x {a['num_layers']} MoE layers x {a['num_experts']} experts"]
    head = ["ladder (CPU off, uniform)"] + [f"C={c} ({100 * c / a['num_experts']:.0f}%)" for c in caps] + \
        [f"% MIN @{c}" for c in caps]
    rows = []
    for n in names:
        hr = [by[(n, c)]["hit_rate"] for c in caps]
        pm = [100 * by[(n, c)]["hits"] / by[("MIN", c)]["hits"] if by[("MIN", c)]["hits"] else float("nan")
              for c in caps]
        rows.append([n] + [_fmt(x) for x in hr] + [_fmt(x, ".1f") for x in pm])
    out.append(_table(head, rows))
    out.append("MIN: Belady, demand paging (the bound of CPU-off caching); MIN+bypass: the bound `trace replay` "
               "prints (misses may skip the cache)")
    head = ["hit rate by access position"] + list(P.POSITIONS) + ["all"]
    rows = []
    for c in caps:
        for n in BY_POSITION:
            r = by.get((n, c))
            if r is None or not r["per_position_hits"]:
                continue
            rows.append([f"{n} @{c}"] + [_fmt(h / q if q else float("nan")) for h, q in
                                         zip(r["per_position_hits"], r["per_position_requests"])]
                        + [_fmt(r["hit_rate"])])
    if rows:
        q = by[("lru", caps[0])]["per_position_requests"]
        rows.append(["share of requests"] + [_fmt(x / max(sum(q), 1)) for x in q] + ["1.000"])
        out.append(_table(head, rows))
        out.append("positions are the access's own; next-16 oracle: within 0.2% of MIN (no per-access split)")
    ages = a["return_ages"]
    head = ["returns by age (target)"] + ages["labels"] + ["returns"]
    rows = []
    for p, v in ages["per_position"].items():
        n = max(sum(v), 1)
        rows.append([p] + [_fmt(x / n) for x in v] + [str(sum(v))])
    tot = np.sum(list(ages["per_position"].values()), axis=0)
    rows.append(["all"] + [_fmt(x / max(tot.sum(), 1)) for x in tot] + [str(int(tot.sum()))])
    out.append(_table(head, rows))
    out.append(f"returns: experts of S_t+1 not in S_t ({ages['returns']} of {ages['requests']} requests; "
               f"mean |S_t| {ages['mean_set']:.1f}); age: accesses since their last use before S_t")
    head = ["returns hit, by age"] + ages["labels"] + ["all returns"]
    rows = []
    for c in caps:
        for n in BY_POSITION:
            r = by.get((n, c))
            if r is None or not r["return_hits_by_age"]:
                continue
            rows.append([f"{n} @{c}"] + [_fmt(h / x if x else float("nan")) for h, x in
                                         zip(r["return_hits_by_age"], tot)]
                        + [_fmt(sum(r["return_hits_by_age"]) / max(tot.sum(), 1))])
    out.append(_table(head, rows))
    head = ["predictor of S_t+1", "precision", "recall", "ret.recall"] + \
        [f"{p} P/R" for p in P.POSITIONS]
    rows = []
    for q in a["predictors"]:
        rows.append([q["name"], _fmt(q["precision"]), _fmt(q["recall"]), _fmt(q["returns_recall"])]
                    + [f"{_fmt(v[0], '.2f')}/{_fmt(v[1], '.2f')}" for v in q["per_position"].values()])
    out.append(_table(head, rows))
    out.append("ret.recall: share of the next access's *returning* experts (not used by this access) the "
               "predicted set holds; positions are the target's")
    head = ["per layer P/R"] + [f"layer {l + 1}" for l in range(a["num_layers"])]
    rows = [[q["name"]] + [f"{_fmt(p, '.2f')}/{_fmt(r, '.2f')}" for p, r in q["per_layer"]]
            for q in a["predictors"] if "top-" not in q["name"] and "keep-" not in q["name"]]
    out.append(_table(head, rows))
    head = ["token class at t", "rows", "persistence", "dev table", "experts", "in next", "only-class", "in next"]
    rows = []
    for lab, v in a["persistence"].items():
        cs = a["class_sets"][lab]
        if not v["rows"] and not cs["experts"]:
            continue
        rows.append([lab, f"{v['rows']:.0f}", _fmt(v["rate"]), _fmt(dev_rates.get(lab)), f"{cs['experts']:.0f}",
                     _fmt(cs["in_next"]), f"{cs['only_this_class']:.0f}", _fmt(cs["only_in_next"])])
    out.append(_table(head, rows))
    out.append("persistence: share of a row's top-k the same row routes again in the next forward of its block; "
               "experts / in next: experts the class routes at t and the share requested at t+1; only-class: "
               "experts only that class routes")
    return "\n".join(out)


def plot(results: dict[str, dict], path: str, everything: dict[str, dict] | None = None) -> None:
    """Four panels: ladder (% of MIN), predictors' precision/recall by position, top-C recall, persistence."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(14, 10))
    styles = ["-", "--", ":", "-."]
    colour = plt.get_cmap("tab20").colors
    a = ax[0, 0]
    for k, r in enumerate(results.values()):
        caps = r["capacities"]
        by = {(x["name"], x["capacity"]): x for x in r["ladder"]}
        pct = [100 * c / r["num_experts"] for c in caps]
        for j, n in enumerate(n for n in LADDER_ORDER if (n, caps[0]) in by and n != "MIN"):
            a.plot(pct, [by[(n, c)]["hits"] / by[("MIN", c)]["hits"] for c in caps], styles[k % 4], marker="o",
                   color=colour[j % 20], label=n if k == 0 else None)
    a.set(title="pure caching ladder: hit rate / MIN (line style = trace)", xlabel="cache, % of a layer's experts",
          ylabel="hits / MIN hits")
    a.legend(fontsize=7, ncol=2)
    first = next(iter(results.values()))
    a = ax[0, 1]
    base = [q for q in first["predictors"] if "top-" not in q["name"] and "keep-" not in q["name"]]
    w = 0.8 / max(len(base), 1)
    x = np.arange(len(P.POSITIONS) + 1)
    for j, q in enumerate(base):
        prec = [q["precision"]] + [v[0] for v in q["per_position"].values()]
        rec = [q["recall"]] + [v[1] for v in q["per_position"].values()]
        a.bar(x + j * w, rec, w, color=f"C{j}", label=f"{q['name']} recall")
        a.scatter(x + j * w, prec, color="k", marker="_", s=120, zorder=3)
    a.set_xticks(x + 0.4 - w / 2, ["all", *P.POSITIONS])
    a.set(title=f"next-set predictors on {next(iter(results))}: recall (bars), precision (ticks)", ylim=(0, 1))
    a.legend(fontsize=7)
    a = ax[1, 0]
    ranked = sorted({q["name"].split(" top-")[0] for q in first["predictors"] if " top-" in q["name"]})
    caps = first["capacities"]
    for j, n in enumerate(ranked):
        qs = {int(q["name"].split(" top-")[1].split()[0]): q for q in first["predictors"]
              if q["name"].startswith(n + " top-")}
        a.plot([100 * c / first["num_experts"] for c in caps], [qs[c]["recall"] for c in caps], marker="o",
               color=f"C{j}", label=f"{n}: recall of S_t+1")
        a.plot([100 * c / first["num_experts"] for c in caps], [qs[c]["returns_recall"] for c in caps], "--",
               marker="x", color=f"C{j}", label=f"{n}: recall of returns")
    a.set(title="top-C rankings (C slots) vs the next access's set", xlabel="C, % of a layer's experts", ylim=(0, 1))
    a.legend(fontsize=7)
    a = ax[1, 1]
    for k, (name, r) in enumerate((everything or results).items()):
        labs = [lab for lab, v in r["persistence"].items() if v["rows"]]
        a.plot(range(len(labs)), [r["persistence"][lab]["rate"] for lab in labs], styles[k % 4], marker="o",
               label=name)
        a.set_xticks(range(len(labs)), labs, rotation=35, ha="right", fontsize=8)
    a.set(title="per-token route persistence t -> t+1 by class at t", ylim=(0, 1), ylabel="share of top-k kept")
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.out and Path(args.out).exists() and not args.overwrite:
        raise ValueError(f"--out {args.out} exists; pass --overwrite to replace it")
    if args.json and Path(args.json).exists() and not args.overwrite:
        raise ValueError(f"--json {args.json} exists; pass --overwrite to replace it")
    dev = _load(args.dev, "--dev")
    traces = [(args.dev, dev)] + [(p, _load(p, "trace")) for p in args.traces]
    E = {t.num_experts for _, t in traces}
    if len(E) != 1:
        raise ValueError(f"traces have different expert counts {sorted(E)}: give traces of one model")
    e = E.pop()
    if args.capacity:
        bad = [c for c in args.capacity if not 1 <= c <= e]
        if bad:
            raise ValueError(f"--capacity {bad[0]}: slots per layer must be in [1, {e}]")
        caps = list(args.capacity)
    else:
        bad = [p for p in args.capacity_pct if not 0 < p <= 100]
        if bad:
            raise ValueError(f"--capacity-pct {bad[0]}: must be in (0, 100]")
        caps = [slots_for(p, e) for p in args.capacity_pct]
    table = P.persistence_table(P.accesses(dev))
    dev_rates = {lab: float(table.kept[:, c].sum() / table.rows[:, c].sum()) if table.rows[:, c].sum() else None
                 for c, lab in enumerate(table.labels)}
    results: dict[str, dict] = {}
    for k, (path, tr) in enumerate(traces):
        name = f"{Path(path).parent.name}/{Path(path).name}" + (" (dev)" if k == 0 else "")
        results[name] = analyse(tr, table, caps, oled=not args.no_oled)
        print(format_report(name, results[name], dev_rates))
        print()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        print(f"json -> {args.json}")
    if args.out:
        plot({n: r for n, r in results.items() if not n.endswith("(dev)")} or results, args.out, results)
        print(f"figure -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dev", required=True, help="dev trace: the weighted predictor's persistence table comes from it")
    p.add_argument("traces", nargs="*", help="traces to evaluate (held-out); the dev trace is always reported too")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--capacity-pct", type=float, nargs="+", default=list(P.CAPACITY_PCTS),
                   help="cache sizes, percent of a layer's experts (default: 15 25 40)")
    g.add_argument("--capacity", type=int, nargs="+", default=None, help="cache sizes in slots per layer")
    p.add_argument("--out", default=None, help="write the figure (PNG) here")
    p.add_argument("--json", default=None, help="write every number (JSON) here")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out / --json")
    p.add_argument("--no-oled", action="store_true", help="skip replaying OledPolicy's priorities")
    args = p.parse_args(argv)
    try:
        return run(args)
    except user_error_types() as err:
        print(f"{PROG}: error: {one_line(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
