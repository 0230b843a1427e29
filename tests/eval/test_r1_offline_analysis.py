"""eval/r1_offline_analysis.py: its replay of the greedy offline schedule is the schedule (same time), and
its counters add up; the ablations run the same timeline."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.offline import accesses_of, greedy_schedule

ROOT = Path(__file__).resolve().parents[2]
CM = CostModel(expert_bytes=1000, h2d_bytes_per_s=1e9, gpu_expert_fixed_s=1e-6, gpu_s_per_token=0.1e-6,
               cpu_expert_fixed_s=2e-6, cpu_s_per_token=1e-6, nonexpert_s_per_layer=0.5e-6, gpu_launch_s=1e-6,
               gpu_hbm_bytes_per_s=1e9, gpu_layer_fixed_s=0.5e-6, cpu_overhead_s=0.5e-6)


def _script():
    spec = importlib.util.spec_from_file_location("r1_offline_analysis", ROOT / "eval" / "r1_offline_analysis.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.mark.parametrize("seed", range(4))
def test_default_rules_time_exactly_the_greedy_schedule(seed):
    rng = np.random.default_rng(seed)
    L, F, E, S = 2, 6, 6, 4
    counts = rng.integers(1, 5, size=(L, F, E)) * (rng.random((L, F, E)) < 0.5)
    accs = accesses_of(counts, np.arange(F))
    a = _script()
    span, st, rd_copy, rd_cpu, tok_copy, tok_cpu = a.analyse(accs, CM, S, L)
    assert span == pytest.approx(greedy_schedule(accs, CM, S, timed_from=L), rel=1e-12)
    assert st["miss"] == st["copy"] + st["cpu"] == rd_copy.size + rd_cpu.size
    assert st["hits"] + st["miss"] == int(np.count_nonzero(counts[:, 1:]))
    assert tok_copy.sum() + tok_cpu.sum() <= counts[:, 1:].sum()
    none, _, _, _, _, _ = a.analyse(accs, CM, S, L, k_rule="none")
    lru, st_lru, *_ = a.analyse(accs, CM, S, L, retention="lru")
    assert st_lru["filtered"] == 0  # no future knowledge: nothing is filtered
    assert none > 0 and lru > 0
