"""The solver's defaults, importable without torch (the --help of hyperset-solve and hyperset-eval shows them)."""

DEFAULT_STRATEGY = "search"  # answers every valid puzzle; measured in bench/search_bench.py (docs/sudoku.md)
DEFAULT_NODES = 2000  # most nodes (model calls) of the search per board
STRATEGY_NAMES = ("search", "commit", "single", "auto")  # hyperset.strategies.REGISTRY's, for --help without torch
DEFAULT_PASSES = 16  # most passes of the commit strategy
# Boards per forward pass. Boards leave the batch as soon as they are valid, so a batch shrinks as it runs and the
# hard boards that remain run in small batches: a larger starting batch keeps more of them together. The default
# strategy of the shipped model on the first 256 of the protocol's validation draw, 2 threads of a 2-vCPU Intel
# Xeon with AMX (idle otherwise): 24.5 / 27.5 / 31.6 / 35.9 / 39.1 boards/s at batch 16 / 32 / 64 / 128 / 256;
# 128 keeps the first boards printed within a few seconds. GPUs want big batches.
CPU_BATCH_SIZE = 128
GPU_BATCH_SIZE = 256
