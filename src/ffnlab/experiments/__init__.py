"""Experiments: one TOML file per claim about the MLP (experiments/), run as grids of work units."""
