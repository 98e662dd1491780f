"""Diffusion-side engine pieces shared by DiT families."""
