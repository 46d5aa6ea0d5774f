"""`python -m training ...` (and `torchrun ... -m training ...`) is `hyperset-train ...`."""

from .cli import main

main()
