"""The solver's defaults, importable without torch (the --help of hyperset-solve and hyperset-eval shows them)."""

DEFAULT_STRATEGY = "search"  # answers every valid puzzle; measured in bench/search_bench.py (docs/sudoku.md)
DEFAULT_NODES = 2000  # most nodes (model calls) of the search per board
DEFAULT_PASSES = 16  # most passes of the commit strategy
DEFAULT_PATIENCE = 4  # iterations a prediction of the auto strategy may stay the same before its board stops
# Boards per forward pass. Boards leave the batch as soon as they are valid, so a batch shrinks as it runs and the
# hard boards that remain run in small batches: a larger starting batch keeps more of them together, and 128 still
# prints the first boards within a few seconds on a CPU (measured in docs/sudoku.md, "Speed"). GPUs want big
# batches.
CPU_BATCH_SIZE = 128
GPU_BATCH_SIZE = 256
# A stream of puzzles (a file read as it comes) starts with a batch this small and doubles it up to the batch size:
# the first boards come after 16 are solved, not a whole batch.
FIRST_STREAM_BATCH = 16
# `--descent`: the step-length control from this iteration on. The first update lifts the embeddings onto the
# energy's landscape and raises it; the control would refuse it (docs/sudoku.md, "Depth and the energy").
DESCENT_FROM = 2
