"""`python -m hyperset.training ...` (and `torchrun ... -m hyperset.training ...`) is `hyperset-train ...`."""

from .cli import main

main()
