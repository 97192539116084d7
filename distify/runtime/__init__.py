"""distify's runtime: what converted scripts call (``import distify.runtime as distify``).

It depends on torch and the standard library only, so a standalone conversion can copy this
folder beside the script. Everything works without a launcher (one process, no process group);
under torchrun, ``distify launch``, ``accelerate launch`` or Ray Train it runs DDP.
"""

try:
    import torch  # noqa: F401
except ImportError as _err:
    raise ImportError("distify's runtime needs PyTorch, which is not installed: "
                      "pip install torch (or pip install \"distify[torch]\")") from _err

from ._accumulation import split_accumulation
from ._checkpoint import load_state, save_state
from ._collectives import (
    broadcast_object,
    gather,
    gather_for_metrics,
    gather_list,
    local_main_process_first,
    main_process_first,
    reduce,
    reduce_meters,
    shared_generator,
    wait_for_everyone,
)
from ._decisions import all_processes, any_process
from ._draws import data_generator, numpy_random, python_random
from ._errors import DistifyError, DistifyTypeError
from ._files import open
from ._io import load, on_main_process, print, save, set_seed
from ._model import sync_gradients, unwrap
from ._precision import autocast, clip_grad_norm_, clip_grad_value_
from ._prepare import prepare
from ._split import shard_stream
from ._state import (
    device,
    device_choice,
    device_index,
    init,
    is_local_main_process,
    is_main_process,
    local_rank,
    local_world_size,
    mixed_precision,
    rank,
    world_size,
)
from ._step import backward

__all__ = [
    "DistifyError", "DistifyTypeError", "autocast", "backward", "broadcast_object",
    "clip_grad_norm_", "clip_grad_value_", "device", "gather", "gather_for_metrics",
    "gather_list", "init",
    "is_local_main_process", "is_main_process", "load", "local_main_process_first",
    "local_rank", "local_world_size", "main_process_first", "mixed_precision", "on_main_process",
    "open", "prepare", "print", "rank", "reduce", "reduce_meters", "save", "set_seed",
    "shared_generator", "sync_gradients", "unwrap", "wait_for_everyone", "world_size",
    "data_generator", "numpy_random", "python_random", "save_state", "load_state", "shard_stream",
    "any_process", "all_processes", "device_choice", "device_index", "split_accumulation",
]
