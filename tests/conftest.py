"""Shared test setup: one torch thread (tests are small; two threads on two busy cores only spin)."""

import torch

torch.set_num_threads(1)
