"""``oled-moe report``: the paper's evaluation on recorded traces (markdown + PNG plots)."""

from __future__ import annotations

import argparse
from pathlib import Path

RECORD_COMMAND = "eval/record_traces.sh TRACES [LONG_MODEL]"


def register(sub: argparse._SubParsersAction) -> None:
    from ..sim.hardware import add_cost_model_args

    p = sub.add_parser("report", help="replay traces through every system and write the evaluation report")
    p.add_argument("traces", nargs="+", help=f"trace files (recorded by {RECORD_COMMAND})")
    p.add_argument("--out", required=True, help="folder for report.md and the plots")
    p.add_argument("--sizes", type=float, nargs="+", default=None,
                   help="cache sizes in percent, 10..100 (default: the report's sweep)")
    p.add_argument("--main", default=None, help="label of the trace for (c), (f), (g) (default: the first)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--warmup-sequences", type=int, default=1,
                   help="recorded sequences that warm the cache before timing starts (0 = cold start)")
    add_cost_model_args(p)
    p.set_defaults(func=report_cmd, as_model_default="llada2.0-mini")


def report_cmd(args: argparse.Namespace) -> int:
    import torch

    from ..sim import plots
    from ..sim.hardware import cost_model_from_args, planner_seconds
    from ..sim.report import (
        ABLATION,
        HEADLINE_PCT,
        PCIE_GBPS,
        SIZES_PCT,
        SYSTEMS,
        detail_table,
        family,
        groups,
        headline_table,
        md_table,
        run_systems,
        sweep_table,
        targets,
        trace_info,
        write_markdown,
    )
    from ..sim.trace import load_trace

    torch.set_num_threads(args.threads)
    if args.as_model is None:
        args.as_model = args.as_model_default
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.sizes or SIZES_PCT) | set(HEADLINE_PCT))
    planner = planner_seconds(args)
    names = [s.name for s in SYSTEMS]
    warm = args.warmup_sequences
    infos, traces, costs = [], {}, {}
    for path in args.traces:
        label = Path(path).name.removesuffix(".trace")
        trace = load_trace(path)
        info = trace_info(label, path, trace)
        cost = cost_model_from_args(trace, args)
        print(f"[report] {label}: {trace.num_forwards} forwards, {trace.num_layers}x{trace.num_experts}", flush=True)
        n_seq = len(set(trace.arrays["fwd_seq"].tolist()))
        info.warmup = min(warm, n_seq - 1)  # a one-request trace is timed from a cold start
        info.runs = run_systems(trace, label, SYSTEMS, sizes, cost, planner, warmup_sequences=info.warmup)
        infos.append(info)
        traces[label], costs[label] = trace, cost
    main = next((i for i in infos if i.label == args.main), infos[0])
    cm = costs[main.label]
    warm = main.warmup
    sec = ["# OLED-MoE evaluation on recorded traces",
           f"Timed as **{args.as_model}** experts ({cm.expert_bytes / 2**20:.2f} MiB) on H200 + PCIe 5.0 x16: "
           f"H2D {cm.h2d_bytes_per_s / 1e9:g} GB/s, HBM {cm.gpu_hbm_bytes_per_s / 1e9:g} GB/s, launch "
           f"{cm.gpu_launch_s * 1e6:g} us, {cm.kernel} GPU expert kernel for offloaded runs, non-expert "
           f"{cm.nonexpert_s_per_layer * 1e6:g} us/layer; planner host time "
           f"{'measured during replay on this CPU' if planner is None else f'{args.planner_us:g} us per access'}. "
           "`x fused` = TPOT / full residency as a fused MoE (one launch per layer, each active expert read "
           "once from HBM); `x loop` = TPOT / a per-expert-loop resident model. U_slot = hits / (slots x layer "
           "accesses); copies used = copied experts hit again before eviction. Belady MIN bounds demand/bypass "
           f"caching only. Traces recorded by `{RECORD_COMMAND}`.",
           "## Traces\n" + md_table(
               ["label", "model", "block", "batch", "layers x experts", "forwards", "output tokens", "v2 preds",
                "warm-up sequences"],
               [[i.label, Path(i.model).name[-40:], str(i.block_length), str(i.batch_size),
                 f"{i.num_layers}x{i.num_experts}", str(i.forwards), str(i.output_tokens),
                 "yes" if i.has_predictions else "no", str(i.warmup)] for i in infos]),
           "## Systems\n" + md_table(["system", "policy", "layer-adaptive", "CPU compute", "stands for"],
                                     [[s.name, s.policy, str(s.layer_adaptive), s.cpu_compute, s.models]
                                      for s in SYSTEMS])]
    # (a) + (b) per trace
    for info in infos:
        a = plots.tpot_and_utilization(info.runs, names, info.label, out / f"a_tpot_util_{info.label}.png")
        b = plots.gap_to_ideal(info.runs, names, info.label, out / f"b_gap_{info.label}.png")
        sec.append(f"## {info.label}\n### Headline (15/25/40%)\n" + headline_table(info.runs, names)
                   + "\n\nDeliverable-5 targets on this trace:\n" + "\n".join(targets(info.runs))
                   + f"\n\n![(a)]({a.name}) ![(b)]({b.name})\n\n<details><summary>(a)/(b) every run</summary>\n\n"
                   + detail_table(info.runs) + "\n\n</details>")
    # (c) ablation on the main trace
    trace = traces[main.label]
    abl = run_systems(trace, main.label, ABLATION, HEADLINE_PCT, cm, planner, bounds=False, warmup_sequences=warm)
    sec.append(f"## (c) Ablation on {main.label}\n" + sweep_table({main.label: abl}, [s.name for s in ABLATION],
                                                                   HEADLINE_PCT, "trace"))
    plots.bars({f"{p:g}%": {r.system: r.result.ratio_to_full for r in abl if r.pct == p} for p in HEADLINE_PCT},
               "TPOT / fused", f"(c) ablation, {main.label}", out / "c_ablation.png")
    sec[-1] += "\n\n![(c)](c_ablation.png)"
    # (d) block length, (e) batch
    for tag, vary, same, key in (("d", lambda i: i.block_length, lambda i: (family(i), i.batch_size), "block"),
                                 ("e", lambda i: i.batch_size, lambda i: (family(i), i.block_length), "batch")):
        found = groups(infos, vary, same)
        title = "(d) Block length x cache size" if tag == "d" else "(e) Batch size"
        if not found:
            sec.append(f"## {title}\nNot produced: no two traces of one model differ only in {key} "
                       f"(record them with `{RECORD_COMMAND}`).")
            continue
        parts = []
        for g in found:
            rows = {f"{family(g[0])} {key}={vary(i)}": i.runs for i in g}
            parts.append(sweep_table(rows, ["oled", "lru", "prefetch", "moe-infinity"], HEADLINE_PCT, key))
            plots.bars({k: {"oled": next((r.result.ratio_to_full for r in v if r.system == "oled" and r.pct == 40), 0),
                            "lru": next((r.result.ratio_to_full for r in v if r.system == "lru" and r.pct == 40), 0)}
                        for k, v in rows.items()}, "TPOT / fused at 40%", f"{title}, {family(g[0])}",
                       out / f"{tag}_{family(g[0])}.png")
            parts.append(f"![({tag})]({tag}_{family(g[0])}.png)")
        sec.append(f"## {title}\n" + "\n\n".join(parts))
    # (f) PCIe bandwidth on the main trace
    rows = {}
    for gbps in PCIE_GBPS:
        rows[f"{gbps} GB/s"] = run_systems(trace, main.label, SYSTEMS, (40,),
                                           cm.with_overrides(h2d_gbps=gbps), planner, bounds=False,
                                           warmup_sequences=warm)
    sec.append(f"## (f) PCIe bandwidth on {main.label} at 40% (x fused)\n" + sweep_table(rows, names, (40,), "H2D"))
    # (g) policy overhead per forward on the main trace at 40%: always measured here
    over = run_systems(trace, main.label, SYSTEMS, (40,), cm, None, bounds=False, warmup_sequences=warm)
    sec.append(f"## (g) Planner/policy host time per forward on {main.label} at 40% (measured on this CPU)\n"
               + md_table(["system", "planner ms / forward", "planner share of TPOT", "x fused (measured planner)",
                           "fused-resident forward ms"],
                          [[r.system, f"{1e3 * r.result.planner_per_forward_s:.3f}",
                            f"{r.result.planner_time_s / r.result.sim_time_s:.2f}", f"{r.result.ratio_to_full:.2f}",
                            f"{1e3 * r.result.full_time_s / max(r.result.forwards, 1):.3f}"] for r in over]))
    plots.bars({r.system: {"planner ms/fwd": 1e3 * r.result.planner_per_forward_s} for r in over},
               "ms per forward", f"(g) planner host time, {main.label}", out / "g_overhead.png")
    sec[-1] += "\n\n![(g)](g_overhead.png)"
    write_markdown(out / "report.md", sec)
    print(f"[report] wrote {out / 'report.md'}")
    return 0
