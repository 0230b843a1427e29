"""``oled-lm-eval``: lm-eval's own command line with the ``oled_llada2`` model registered.

    oled-lm-eval --model oled_llada2 --model_args pretrained=PATH --tasks toy_addition --include_path eval/tasks
    oled-lm-eval ls tasks            # every lm-eval subcommand and flag, unchanged

lm-eval 0.4.x has no plugin mechanism for models: its registry holds the names ``lm_eval.models``
registers and whatever the running process registered, and it reads no entry points. So the stock
``lm_eval`` script answers ``--model oled_llada2`` with "no model for this name found"; this
script imports the adapter (which registers the name) and then runs lm-eval's own entry point,
``lm_eval.__main__.cli_evaluate``, on the same arguments: same parser, flags, subcommands
(``run``, ``ls``, ``validate``) and output. ``python -m oled_hf.evaluation`` is the same program.

The hub is off unless HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are exported as 0, as for
``oled-moe eval``. git's "fatal: not a git repository", which lm-eval's results logging provokes
outside a clone, is kept off stderr; when stderr is not a terminal (a log, a pipe), datasets' and
transformers' bars are off and lm-eval's request bars become a progress line every 10 s and a last
line with the duration (:mod:`oled_hf.evaluation.quiet`); on a terminal the bars are lm-eval's.
A ``ValueError`` (an unknown model or task name, a bad model argument) is one line, exit 2.
"""

from __future__ import annotations

import sys

PROG = "oled-lm-eval"


def main(argv: list[str] | None = None) -> int:
    """Run lm-eval's CLI on ``argv`` (default: this process's arguments) with ``oled_llada2`` registered."""
    from . import register
    from .quiet import lm_eval_quiet
    from .runner import go_offline

    go_offline()  # before lm-eval / datasets read the variables
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as err:
        print(f"{PROG}: error: lm-eval is missing ({err}); install it with: pip install 'oled-hf[eval]'",
              file=sys.stderr)
        return 2
    register()
    saved = sys.argv
    sys.argv = [PROG, *(sys.argv[1:] if argv is None else argv)]  # lm-eval's parser reads sys.argv itself
    try:
        with lm_eval_quiet():
            cli_evaluate()
    except ValueError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
