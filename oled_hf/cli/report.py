"""``oled-moe report``: the evaluation on recorded traces (markdown + PNG plots), every system tuned on dev."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..progress import add_quiet_argument, progress
from .common import add_command
from .report_sections import bracket_section, like_figures, miscalibration_section, seed_group_section
from .report_tuning import Tuning, parse_dev_for, tune_on, tuning_for

RECORD_COMMAND = "LONG_ONLY=1 eval/record_traces.sh TRACES oled_hf/toy/long/checkpoint"
PREDICTOR_FIGURE, PREDICTOR_TEXT = "i_predictors.png", "i_predictors.txt"  # eval/predictor_quality.py's, if present


def trace_kind(info) -> str:
    """"synthetic" for a generated trace (``trace synth`` names its model so), else "recorded"."""
    return "synthetic" if str(info.model).startswith("synthetic") else "recorded"


def register(sub: argparse._SubParsersAction) -> None:
    add_command(sub, "report", "replay traces through every system and write the evaluation report", configure)


def configure(p: argparse.ArgumentParser) -> None:
    from ..sim.hardware import add_cost_model_args

    p.add_argument("traces", nargs="+", help=f"held-out trace files (recorded by {RECORD_COMMAND})")
    p.add_argument("--dev", default=None,
                   help="dev-split trace (training prompts) on which every system's knobs are tuned and "
                        "kTransformers/Fiddler's placement is profiled (default: none; systems at their defaults)")
    p.add_argument("--dev-for", action="append", default=None, metavar="NAME=PATH[,PATH...]",
                   help="tune the traces of workload NAME (a trace label, or the seed group NAME of traces "
                        "NAME-s<seed>) on these dev traces instead of --dev (mean over them); repeatable "
                        "(default: none, every trace tuned on --dev)")
    p.add_argument("--out", required=True, help="folder for report.md and the plots")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report.md in --out")
    p.add_argument("--sizes", type=float, nargs="+", default=None,
                   help="cache sizes in percent, 10..100 (default: the report's sweep)")
    p.add_argument("--main", default=None, help="label of the trace for (c), (f), (g), (h) (default: the first)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--warmup-sequences", type=int, default=1,
                   help="recorded sequences that warm the cache before timing starts (0 = cold start)")
    p.add_argument("--lp-window", type=int, default=2,
                   help="forwards per window of the valid LP bound (oled_hf/sim/bounds/lp.py; each window starts "
                        "from a free cache, so longer is tighter and slower: HiGHS takes seconds per window of "
                        "2 forwards at mini's shape); 0 leaves the LP bound out (default 2)")
    p.add_argument("--bracket-window", type=int, default=0,
                   help="section (j): also the LP bound in windows of this many forwards on the --main trace (the "
                        "larger of the two bounds is kept; longer windows are tighter at 40%% and slower: the deep "
                        "toy's takes minutes at 8); 0: the tables' bound only (default)")
    p.add_argument("--lp-all-seeds", action="store_true",
                   help="traces NAME-s<seed> form a seed group (median and range over seeds); its later seeds "
                        "replay at the headline sizes only and without the LP bound (the slow part) unless this "
                        "is given")
    add_quiet_argument(p)
    add_cost_model_args(p)
    p.set_defaults(func=report_cmd, as_model_default="llada2.0-mini")


def _check(args: argparse.Namespace) -> None:
    """Refuse bad paths before any work (one-line errors, exit 2)."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out}: exists and is not a directory")
    if (out / "report.md").exists() and not args.overwrite:
        raise ValueError(f"--out {args.out}: {out / 'report.md'} exists; pass --overwrite to replace it")
    for path in [*args.traces, *([args.dev] if args.dev else [])]:
        if not Path(path).is_file():
            raise ValueError(f"trace {path}: no such file")
    if args.bracket_window < 0:
        raise ValueError(f"--bracket-window {args.bracket_window}: must be >= 0 forwards (0 = the tables' bound)")
    if args.lp_window < 0:
        raise ValueError(f"--lp-window {args.lp_window}: must be >= 0 forwards (0 = no LP bound)")
    if args.sizes and any(not 0 < s <= 100 for s in args.sizes):
        raise ValueError(f"--sizes {args.sizes}: every size must be in (0, 100] percent")


def report_cmd(args: argparse.Namespace) -> int:
    _check(args)
    dev_for = parse_dev_for(args.dev_for, [Path(p).name.removesuffix(".trace") for p in args.traces], args.traces)
    import torch

    from ..offload.trace import load_trace
    from ..sim import plots
    from ..sim import report as rp
    from ..sim import report_seeds as rs
    from ..sim.hardware import MODEL_SHAPES, cost_model_from_args, planner_seconds

    torch.set_num_threads(args.threads)
    if args.as_model is None:
        args.as_model = args.as_model_default
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes = sorted(set(args.sizes or rp.SIZES_PCT) | set(rp.HEADLINE_PCT))
    planner = planner_seconds(args)
    names = [s.name for s in rp.SYSTEMS]
    warm = args.warmup_sequences
    # tuning on the dev split only: --dev for every trace, a workload's own dev traces where --dev-for names it
    default = Tuning(f"`{Path(args.dev).name}`" if args.dev else "-")
    bar = progress(total=len(args.traces) + bool(args.dev) + len(dev_for), desc="report", unit="trace",
                   quiet=args.quiet)
    if args.dev:
        print(f"[report] tuning on {default.source}", flush=True)
        default = tune_on([args.dev], args, planner)
        bar.update()
    workloads = {}
    for name, paths in dev_for.items():
        print(f"[report] tuning {name} on {', '.join(paths)}", flush=True)
        workloads[name] = tune_on(paths, args, planner)
        bar.update()
    infos, traces, costs = [], {}, {}
    seed_groups = rs.seed_groups(Path(p).name.removesuffix(".trace") for p in args.traces)
    later_seeds = {label for members in seed_groups.values() for _, label in members[1:]}
    for path in args.traces:
        label = Path(path).name.removesuffix(".trace")
        trace = load_trace(path)
        info = rp.trace_info(label, path, trace)
        like = rs.like_model(info.model)  # a --like trace is timed at the model it is like
        info.timed_as = like if like in MODEL_SHAPES else args.as_model
        cost = cost_model_from_args(trace, argparse.Namespace(**{**vars(args), "as_model": info.timed_as}))
        print(f"[report] {label}: {trace.num_forwards} forwards, {trace.num_layers}x{trace.num_experts}", flush=True)
        n_seq = len(set(trace.arrays["fwd_seq"].tolist()))
        info.warmup = min(warm, n_seq - 1)  # a one-request trace is timed from a cold start
        tuning = tuning_for(label, default, workloads)
        info.tuned, info.profile = tuning.knobs, tuning.profile_for(trace.num_layers, trace.num_experts)
        later = label in later_seeds and not args.lp_all_seeds  # a group's later seeds: headline sizes, no LP
        info.runs = rp.run_systems(trace, label, rp.SYSTEMS, rp.HEADLINE_PCT if later else sizes, cost, planner,
                                   warmup_sequences=info.warmup, tuned=info.tuned, profile=info.profile,
                                   lp_window=0 if later else args.lp_window)
        infos.append(info)
        traces[label], costs[label] = trace, cost
        bar.update()
    bar.close()  # a log gets "report: done, 3/3 trace in 4m12s (...)"
    main = next((i for i in infos if i.label == args.main), infos[0])
    cm = costs[main.label]
    warm = main.warmup
    trace = traces[main.label]
    tuned, prof = main.tuned, main.profile
    depth = ", ".join(sorted({f"{i.num_layers} MoE layers x {i.num_experts} experts" for i in infos}))
    kinds = " and ".join(sorted({trace_kind(i) for i in infos}, reverse=True))
    sec = [f"# OLED-MoE evaluation on {kinds} traces",
           f"Traces: **{depth}** (LLaDA2.0-mini has 19 MoE layers x 256): only the expert size is that of the "
           f"model in the column `timed as` (**{args.as_model}**'s for every trace but a `trace synth --like NAME` "
           "one, which is timed at NAME's), on H200 + PCIe 5.0 x16: "
           f"H2D {cm.h2d_bytes_per_s / 1e9:g} GB/s, HBM {cm.gpu_hbm_bytes_per_s / 1e9:g} GB/s, host DRAM "
           f"{cm.host_dram_bytes_per_s / 1e9:g} GB/s shared by DMA and CPU reads, launch {cm.gpu_launch_s * 1e6:g} us, "
           f"{cm.kernel} GPU expert kernel, CPU {cm.cpu_overhead_s * 1e6:g} us per batch + "
           f"{cm.cpu_expert_fixed_s * 1e6:.1f} us per read-bound expert (at {main.timed_as}'s size), non-expert "
           f"{cm.nonexpert_s_per_layer * 1e6:g} us/layer; planner host time "
           f"{'measured during replay on this CPU' if planner is None else f'{args.planner_us:g} us per access'}. "
           "`x fused` = TPOT / full residency as a fused MoE (one launch per layer, each active expert read "
           "once from HBM); `x bound (LP)` = TPOT / the valid lower bound (`oled_hf/sim/bounds/lp.py`: an LP "
           "relaxation of offline caching with bypass in which every expert entering the GPU cache pays a copy, "
           "copy engine, GPU and CPU run in parallel per access as the timeline charges them, prefetching within "
           "copy-engine windows, any split of the slots across layers, objective time; solved by HiGHS in "
           f"windows of {args.lp_window} forwards, each from a free cache; what it drops is in its docstring). "
           "The row `MIN bound (CPU-served misses enter free, loose)` is the old bound "
           "(`oled_hf/sim/bounds/physical.py`): "
           "Belady MIN's misses at min(copy, CPU), a CPU-served miss entering the cache without a copy; it is "
           "lower than the optimum by much more. U_slot = hits / (slots x layer accesses). Dispatchers decide "
           "from the true "
           f"cost model except in (h). Traces recorded by `{RECORD_COMMAND}`.",
           "## Traces\n" + rp.md_table(
               ["label", "model", "recorded or synthetic", "block", "batch", "layers x experts", "forwards",
                "output tokens", "v2 preds", "warm-up sequences", "timed as"],
               [[i.label, Path(i.model).name[-40:], trace_kind(i), str(i.block_length), str(i.batch_size),
                 f"{i.num_layers}x{i.num_experts}", str(i.forwards), str(i.output_tokens),
                 "yes" if i.has_predictions else "no", str(i.warmup),
                 f"{i.timed_as} ({costs[i.label].expert_bytes / 2**20:.2f} MiB)"] for i in infos])]

    def systems_table(tuning: Tuning) -> str:
        rows = []
        for spec in rp.SYSTEMS:
            s = rp.resolve(spec, tuning.knobs.get(spec.name), tuning.profile)
            grid = ("; ".join(", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in g.items()) or "defaults"
                              for g in spec.grid) + " (not searched: no --dev)" if spec.name not in tuning.searched
                    else "; ".join((", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in g.items()) or "defaults")
                                   + f": {x:.2f}" for g, x in tuning.searched[spec.name]))
            rows.append([spec.name, s.retention, s.prefetch, s.dispatch, s.allocation, s.knob_text(), grid,
                         spec.models])
        return rp.md_table(["system", "retention", "prefetch", "dispatch", "allocation", "chosen on dev",
                            "searched (dev x fused)", "stands for"], rows)

    sec.append("## Systems\nEvery system is a composition of the same parts (`--system` names them). Every system "
               f"searched at most {rp.TUNING_BUDGET} settings of its own knobs on the dev split ({default.source}), "
               "scored by mean x fused at 15/25/40%; the setting with the lowest score runs on the held-out traces. "
               "`searched` lists each setting and its dev score.\n\n" + systems_table(default)
               + "".join(f"\n\nThe traces of `{name}` were tuned instead on its own dev split ({t.source}; "
                         "`--dev-for`: mean x fused over those traces and 15/25/40%), the same grids:\n\n"
                         + systems_table(t) for name, t in workloads.items()))
    def sim_note(info) -> str:
        mib = costs[info.label].expert_bytes / 2**20
        return (f"simulated time: {info.timed_as}-sized experts ({mib:.2f} MiB) on H200 + PCIe "
                f"5.0 x16; trace {info.label}: {info.num_layers} MoE layers x {info.num_experts} experts, "
                f"{trace_kind(info)}")

    # headline + (a) + (b) per trace; a seed group once, as median and range over its seeds
    first_seed = {members[0][1]: base for base, members in seed_groups.items()}
    by_label = {i.label: i for i in infos}
    like_params: dict = {}
    for info in infos:
        if info.label in later_seeds:
            continue
        if info.label in first_seed:
            base = first_seed[info.label]
            group = [by_label[label] for _, label in seed_groups[base]]
            sec.append(seed_group_section(base, group, traces, names, out, sim_note, args.lp_all_seeds, like_params))
            continue
        a = plots.tpot_and_utilization(info.runs, names, info.label, out / f"a_tpot_util_{info.label}.png",
                                       sim_note(info))
        b = plots.gap_to_ideal(info.runs, names, info.label, out / f"b_gap_{info.label}.png", sim_note(info))
        sec.append(f"## {info.label}\n### Headline (15/25/40%): oled against the strongest fair system\n"
                   + "\n".join(rp.margin_lines(info.runs)) + "\n\n" + rp.headline_table(info.runs, names)
                   + "\n\nTargets on this trace:\n" + "\n".join(rp.targets(info.runs))
                   + f"\n\n![(a)]({a.name}) ![(b)]({b.name})\n\n<details><summary>(a)/(b) every run</summary>\n\n"
                   + rp.detail_table(info.runs) + "\n\n</details>" + like_figures([info], traces, like_params))
    # (c) ablation on the main trace, from the strongest fair published baseline at 25%
    published = [s for s in rp.SYSTEMS if s.name not in (rp.OURS, *rp.COMPOSED)]
    at25 = [r for r in main.runs if r.pct == 25 and r.system in {s.name for s in published}]
    if at25:
        best = min(at25, key=lambda r: r.result.tpot_s).system
        base = next(s for s in published if s.name == best)
        steps = rp.ablation_systems(base, tuned)
        abl = []
        for label, system in steps:
            if rp.needs_predictions(system) and not trace.has_predictions:
                continue
            spec = rp.ReportSystem(label, system.parts, "")
            for pct in rp.HEADLINE_PCT:
                size = rp.slots_for(pct, trace.num_experts)
                r = rp.replay(trace, label, size, system=system if not base.dev_profile or label != steps[0][0]
                              else rp.resolve(base, tuned.get(base.name), prof), cost_model=cm, planner_s=planner,
                              warmup_sequences=warm)
                abl.append(rp.Run(main.label, spec.name, pct, r))
        labels = [label for label, _ in steps]
        parts = {label: system.parts for label, system in steps}
        sec.append(f"## (c) Ablation on {main.label}\nFrom the strongest fair published baseline at 25% "
                   f"(`{best}`), one part changed per step (x fused; parts in the second column).\n\n"
                   + rp.md_table(["step", "parts"] + [f"{p:g}%" for p in rp.HEADLINE_PCT],
                                 [[lab, parts[lab]] + [f"{rp.pick(abl, lab, p).result.ratio_to_full:.2f}"
                                                      if rp.pick(abl, lab, p) else "-" for p in rp.HEADLINE_PCT]
                                  for lab in labels]))
        plots.bars({f"{p:g}%": {r.system: r.result.ratio_to_full for r in abl if r.pct == p}
                    for p in rp.HEADLINE_PCT}, "simulated TPOT / fused residency", f"(c) ablation, {main.label}",
                   out / "c_ablation.png", sim_note(main))
        sec[-1] += "\n\n![(c)](c_ablation.png)"
    # (d) block length, (e) batch
    for tag, vary, same, key in (("d", lambda i: i.block_length, lambda i: (rp.family(i), i.batch_size), "block"),
                                 ("e", lambda i: i.batch_size, lambda i: (rp.family(i), i.block_length), "batch")):
        found = rp.groups(infos, vary, same)
        title = "(d) Block length x cache size" if tag == "d" else "(e) Batch size"
        if not found:
            sec.append(f"## {title}\nNot produced: no two traces of one model differ only in {key} "
                       f"(record them with `{RECORD_COMMAND}`).")
            continue
        parts_ = []
        for g in found:
            rows_ = {f"{rp.family(g[0])} {key}={vary(i)}": i.runs for i in g}
            parts_.append(rp.sweep_table(rows_, names, rp.HEADLINE_PCT, key))
            plots.bars({k: {n: next((r.result.ratio_to_full for r in v if r.system == n and r.pct == 40), 0)
                            for n in ("oled", "lru-full", "hybrimoe", "tide")}
                        for k, v in rows_.items()}, "simulated TPOT / fused at 40%", f"{title}, {rp.family(g[0])}",
                       out / f"{tag}_{rp.family(g[0])}.png", sim_note(g[0]))
            parts_.append(f"![({tag})]({tag}_{rp.family(g[0])}.png)")
        sec.append(f"## {title}\n" + "\n\n".join(parts_))
    # (f) PCIe bandwidth on the main trace
    rows_f = {}
    for gbps in rp.PCIE_GBPS:
        rows_f[f"{gbps} GB/s"] = rp.run_systems(trace, main.label, rp.SYSTEMS, (40,), cm.with_overrides(h2d_gbps=gbps),
                                                planner, bounds=False, warmup_sequences=warm, tuned=tuned, profile=prof)
    sec.append(f"## (f) PCIe bandwidth on {main.label} at 40% (x fused)\n"
               + rp.sweep_table(rows_f, names, (40,), "H2D"))
    # (g) policy overhead per forward on the main trace at 40%: always measured here
    over = rp.run_systems(trace, main.label, rp.SYSTEMS, (40,), cm, None, bounds=False, warmup_sequences=warm,
                          tuned=tuned, profile=prof)
    sec.append(f"## (g) Planner/policy host time per forward on {main.label} at 40% (measured on this CPU)\n"
               + rp.md_table(["system", "planner ms / forward", "planner share of TPOT", "x fused (measured planner)",
                              "fused-resident forward ms"],
                             [[r.system, f"{1e3 * r.result.planner_per_forward_s:.3f}",
                               f"{r.result.planner_time_s / r.result.sim_time_s:.2f}",
                               f"{r.result.ratio_to_full:.2f}",
                               f"{1e3 * r.result.full_time_s / max(r.result.forwards, 1):.3f}"] for r in over]))
    plots.bars({r.system: {"planner ms/fwd": 1e3 * r.result.planner_per_forward_s} for r in over},
               "planner host ms per forward", f"(g) planner host time, {main.label}", out / "g_overhead.png",
               f"measured on this CPU during replay of {main.label} at 40% ({main.num_layers} MoE layers)")
    sec[-1] += "\n\n![(g)](g_overhead.png)"
    sec.append(miscalibration_section(main, trace, cm, planner, tuned, prof))
    sec.append(ladder_section(infos, traces, costs, planner, out, sim_note, later_seeds))
    picked = [main] + [i for i in infos if i.label in first_seed and i is not main and i.batch_size == 1]
    sec.append(bracket_section(picked, traces, costs, planner,  # 40%: always among the sizes
                               windows={main.label: args.bracket_window} if args.bracket_window else {}))
    rp.write_markdown(out / "report.md", sec)
    print(f"[report] wrote {out / 'report.md'}")
    return 0


def ladder_section(infos, traces, costs, planner, out: Path, sim_note, skip: set[str]) -> str:
    """(i): the oracle ladder (``sim/ladder.py``) on every batch-1 trace but ``skip`` (a seed group's later seeds),
    with a figure of the main one."""
    from ..sim import ladder, plots
    from ..sim import report as rp

    spec = next(s for s in rp.SYSTEMS if s.name == ladder.FAIR_BASE)
    parts = [f"## (i) Oracle ladder: where the headroom of retention lies\nEach rung is a retention part under "
             f"the same dispatch and allocation: the strongest fair one (`{ladder.FAIR_BASE}`'s parts and dev-tuned "
             "knobs, only retention swapped) and pure caching (every miss copied, uniform split). `belady` knows the "
             "whole future, `foresight-K` the next K accesses of each layer (Belady within them, LRU beyond), "
             "`next-oracle` exactly the next access's expert set per layer and nothing further, "
             "`belady-reuse` is belady whose reuse prediction (what the dispatcher's reuse copies admit) is the "
             "exact run of uses a copy would be held for: Belady with cost-aware admission, `lru-reuse` LRU with the "
             "same exact reuse (what perfect admission adds to an online retention), both fair dispatch only "
             "(all five replay only, `offload/policies/oracle.py`). `score` (HybriMoE's gate-score EMA), `oled` and "
             "`learned` (a next-use predictor learned online) run at their defaults; gain = lru's TPOT / the rung's. "
             "Of a seed group (traces NAME-s<seed>) only the first seed."]
    first = None
    for info in infos:
        if info.batch_size != 1 or info.label in skip:
            continue
        trace = traces[info.label]
        fair = rp.resolve(spec, info.tuned.get(spec.name), info.profile)
        print(f"[report] (i) oracle ladder on {info.label}", flush=True)
        runs = ladder.oracle_ladder(trace, info.label, fair, costs[info.label], planner, info.warmup)
        parts.append(f"### {info.label} ({info.num_layers} MoE layers x {info.num_experts})\n"
                     + "\n".join(ladder.headroom_lines(runs["fair"]))
                     + f"\n\nStrongest fair dispatch (`{fair.parts}`):\n\n" + ladder.ladder_table(runs["fair"])
                     + "\n\nPure caching (`copy+uniform`):\n\n" + ladder.ladder_table(runs["pure caching"]))
        if first is None:
            first = info
            plots.bars({f"{p:g}%": {r.system: r.result.ratio_to_full for r in runs["fair"] if r.pct == p}
                        for p in rp.HEADLINE_PCT}, "simulated TPOT / fused residency",
                       f"(i) oracle ladder, {info.label}, strongest fair dispatch", out / "i_ladder.png",
                       sim_note(info))
            parts.append("![(i)](i_ladder.png)")
    if first is None:
        parts.append("Not produced: no batch-1 trace.")
    if (out / PREDICTOR_FIGURE).is_file():  # written before the report by eval/report/regenerate.sh
        parts.append(f"### Predictor quality\nPrecision and recall of each predictor of the next access's expert set, "
                     "by block position and token class, and the pure-caching ladder of every predictor used as "
                     f"retention (`eval/predictor_quality.py`; its printed tables: `{PREDICTOR_TEXT}`).\n\n"
                     f"![(i) predictors]({PREDICTOR_FIGURE})")
    return "\n\n".join(parts)
