"""Expert offloading: config, cost model, policies, planner, dispatch and layer-adaptive allocation.

Only light, device-independent modules are imported here; the runtime pieces (store, cache,
executor, runtime) are imported from their own modules.
"""

from .config import OffloadConfig

__all__ = ["OffloadConfig"]
