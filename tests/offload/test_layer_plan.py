"""LayerPlan: the array form (compiled plans) and the list form (Python plans) say the same thing."""

import numpy as np

from oled_hf.offload.layer_plan import LayerPlan


def test_array_plan_lists_and_arrays():
    arr = np.full((9, 4), -1, dtype=np.int64)
    arr[0, :2], arr[1, :2] = [3, 7], [10, 11]  # hits and their slots
    arr[2:5, :3] = [[1, 4, 9], [12, 10, 13], [-1, 5, 6]]  # copies, slots, victims (the first took a free slot)
    arr[5, :1] = [2]  # CPU
    arr[6:9, :1] = [[8], [14], [-1]]  # one reuse copy into a free slot
    plan = LayerPlan.from_arrays(0, np.zeros(16, dtype=np.int64), arr, [2, 3, 1, 1, 1, 1, 0])
    assert plan.hits == [3, 7] and plan.cpu == [2]
    assert plan.copies == [(1, 12, None), (4, 10, 5), (9, 13, 6)]
    assert plan.background == [(8, 14, None)]
    assert plan.slot_of == {3: 10, 7: 11, 1: 12, 4: 10, 9: 13}
    assert [a.tolist() for a in plan.hit_arrays()] == [[3, 7], [10, 11]]
    assert [a.tolist() for a in plan.copy_arrays()] == [[1, 4, 9], [12, 10, 13]]
    assert plan.streamed is False


def test_list_plan_arrays():
    plan = LayerPlan([3, 7], [(1, 12, None), (4, 10, 5)], [2], {3: 10, 7: 11, 1: 12, 4: 10})
    assert [a.tolist() for a in plan.hit_arrays()] == [[3, 7], [10, 11]]
    assert [a.tolist() for a in plan.copy_arrays()] == [[1, 4], [12, 10]]
    assert plan.background == [] and plan.streamed is None and "hits=[3, 7]" in repr(plan)
