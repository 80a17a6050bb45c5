"""The process's global random number generators as one value (torch, NumPy, `random`, and the
GPUs' when CUDA is in use): what crash recovery commits and restores."""

import random

import numpy as np
import torch


def state():
    s = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
         "random": random.getstate()}
    # A model on a GPU draws its dropout masks from the devices' generators.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_state(s):
    torch.set_rng_state(s["torch"])
    np.random.set_state(s["numpy"])
    random.setstate(s["random"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
