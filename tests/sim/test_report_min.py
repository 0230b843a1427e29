"""The report measures each run's hit rate against the MIN it can reach (demand MIN where every miss is copied)."""

from oled_hf.offload.costmodel import CostModel
from oled_hf.sim.belady import belady_min
from oled_hf.sim.report import ReportSystem, detail_table, run_systems
from oled_hf.sim.synthetic import synthetic_trace

CM = CostModel.h200_pcie5(2048, 512)


def test_report_rows_name_their_min():
    trace = synthetic_trace(num_layers=3, num_experts=32, top_k=4, block_length=8, num_blocks=3, batch=2,
                            num_sequences=2, seed=1)
    systems = [ReportSystem("mixtral-offloading", "mixtral-offloading", "lru, copy"),
               ReportSystem("lru-cpu", "lru+cpu", "lru, CPU"), ReportSystem("lru-full", "lru-full", "lru, all")]
    runs = run_systems(trace, "t", systems, [50], CM, 0.0)  # 16 of 32 slots per layer
    assert [r.bound_name for r in runs] == ["MIN", "MIN+bypass", "global MIN+bypass"]
    assert runs[0].bound_hit_rate == belady_min(trace, 16, bypass=False).hit_rate
    assert runs[1].bound_hit_rate == belady_min(trace, 16).hit_rate
    assert runs[0].bound_hit_rate < runs[1].bound_hit_rate  # the two MINs differ here
    assert runs[0].result.hit_rate <= runs[0].bound_hit_rate
    table = detail_table(runs)
    head = table.splitlines()[0]
    assert "| hit/MIN | MIN |" in head
    assert "| MIN |" in table.splitlines()[2] and "| global MIN+bypass |" in table.splitlines()[4]
    assert "- MIN: demand MIN (per layer, every miss admitted): the ceiling of uniform runs that copy" in table
