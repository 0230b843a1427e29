"""lm-eval's own command line with the ``oled_llada2`` model registered.

    python -m oled_hf.evaluation --model oled_llada2 --model_args pretrained=PATH \\
        --tasks toy_addition --include_path eval/tasks

lm-eval 0.4.x has no plugin mechanism for models: its registry holds the names in
``lm_eval.models.MODEL_MAPPING`` and whatever the running process registered, and it reads no
entry points. So the stock ``lm_eval`` script cannot know ``oled_llada2``; this module registers
it and then runs that same script (same flags, same output, same subcommands: ``run``, ``ls``,
``validate``). The hub is off unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are exported as 0,
as for ``oled-moe eval``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's CLI on ``argv`` (default: this process's arguments) with ``oled_llada2`` registered."""
    from . import register
    from .runner import go_offline

    go_offline()  # before lm-eval / datasets read the variables
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as err:
        print(f"python -m oled_hf.evaluation: error: lm-eval is missing ({err}); "
              "install it with: pip install 'oled-hf[eval]'", file=sys.stderr)
        return 2
    register()
    saved = sys.argv
    sys.argv = ["lm-eval", *(sys.argv[1:] if argv is None else argv)]  # lm-eval's parser reads sys.argv
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
