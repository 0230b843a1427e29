"""``python -m oled_hf.evaluation``: the ``oled-lm-eval`` script (lm-eval's CLI with ``oled_llada2`` registered).

    python -m oled_hf.evaluation --model oled_llada2 --model_args pretrained=PATH \\
        --tasks toy_addition --include_path eval/tasks

See :mod:`oled_hf.evaluation.lm_eval_cli` for why the stock ``lm_eval`` script cannot know the model.
"""

from __future__ import annotations

import sys

from .lm_eval_cli import main

if __name__ == "__main__":
    sys.exit(main())
