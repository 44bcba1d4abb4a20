"""`python -m specadapt` is the `specadapt` command."""

from specadapt.cli import main

main()
