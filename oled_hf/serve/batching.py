"""How many requests the server decodes together, and how long the oldest waits for company.

Apart from :mod:`.engine` (which imports torch) so that ``oled-moe serve --help`` shows the
defaults, and ``serve`` checks its flags, without importing torch.
"""

from __future__ import annotations

from .stragglers import STRAGGLER_MAX_S

DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_BATCH_WAIT_MS = 1e3 * STRAGGLER_MAX_S  # the straggler window's own bound (engine's module docstring)


def batching_problem(max_batch_size: int, batch_wait_ms: float) -> str | None:
    """Why these batching settings are unusable, or None."""
    if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
        return f"--max-batch-size {max_batch_size} is invalid: must be an integer of at least 1 (1: no batching)"
    if not 0 <= batch_wait_ms <= 10_000:
        return (f"--batch-wait-ms {batch_wait_ms:g} is invalid: must be between 0 and 10000 milliseconds "
                "(how long the first request waits for others to share its batch)")
    return None
