"""The command line: one module per command group; the only package that knows click."""
