"""A store of distinct experts for slot-pool tests: expert ``e``'s row is all ``e + 1`` (pinned layout)."""

import torch


class StubStore:
    hidden, inter, dtype, mode = 4, 2, torch.float32, "pinned"
    numel = 3 * 4 * 2
    expert_bytes = numel * 4

    def __init__(self, num_experts: int = 8) -> None:
        self.num_experts = num_experts

    def flat(self, layer, expert):
        return torch.full((self.numel,), float(expert + 1))
