"""The package's version: the one place it is written. Every layer reads it from here (the
protocol is the layer all the others import); the packaging reads it too (pyproject.toml)."""

__version__ = "0.2.0"
