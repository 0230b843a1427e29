"""eval/layer_heterogeneity.py: heterogeneity h spreads the layers' distinct experts around the stated mean."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

from oled_hf.sim.synth_like import like

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("layer_heterogeneity", ROOT / "eval" / "layer_heterogeneity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["layer_heterogeneity"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_h_zero_is_every_layer_alike_and_h_spreads_them():
    m = _module()
    base = like("llada2.0-mini")
    ts = np.linspace(0.0, 6.0, 13)
    table = (ts, 250.0 - 30.0 * ts)  # a stand-in decreasing curve: distinct experts against the logit scale
    ratio = list(np.linspace(0.5, 1.5, base.num_layers))
    same, want0 = m.heterogeneous(base, ratio, 0.0, table)
    assert want0 == [69.5] * base.num_layers and len(set(same.popularity_scale)) == 1
    wide, want = m.heterogeneous(base, ratio, 2.0, table)
    assert min(want) == base.top_k  # clamped: 69.5 * (1 + 2 * (0.5 - 1)) = 0 -> top-k
    assert np.argmax(wide.block_scale) == 0  # fewest distinct experts = the most concentrated logits
    assert wide.check() is wide and base.popularity_scale != wide.popularity_scale  # base untouched, valid
