"""Block-diffusion decoding: the generation mixin, commit rules, streaming and iteration events."""
