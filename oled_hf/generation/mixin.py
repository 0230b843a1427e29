"""DiffusionGenerationMixin (placeholder until the generation issue lands)."""


class DiffusionGenerationMixin:
    pass
