"""`python -m meshplan` (and `torchrun -m meshplan calibrate`) run the CLI."""

from meshplan.cli import main

main()
