"""Command-line options that more than one front end shares (``oled-moe``, the server, lm-eval's model args).

They live below ``cli``, ``serve`` and ``evaluation`` so that each takes them without importing
another front end: :mod:`.model` the model and device flags, :mod:`.budget` the expert-cache budget.
"""
