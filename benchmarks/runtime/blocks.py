"""The FSDP benchmark's shared parts: a small transformer, its data, step timing, memory per rank.

Imported by the three versions of one training loop (``train_blocks_single.py``, converted by
``distify convert`` in each benchmark run; ``train_blocks_torch.py``, hand-written DDP or FSDP2),
so they differ only in how they distribute it. Nothing here is distributed code: it reads
``RANK`` to label its output, and measures what each process holds.

- ``TinyTransformer``: token + position embeddings, ``Block`` layers (pre-norm causal
  self-attention and a 4x MLP), a final norm and an untied head. ``Block`` is the class an FSDP
  wrap policy names (``FSDP_TRANSFORMER_CLS_TO_WRAP=Block``).
- ``sequences``: arithmetic progressions of tokens modulo the vocabulary, each with its own
  start and stride, so predicting the next token needs the previous ones (the loss falls).
- ``Meter``: wall time per training step after the warm-up steps, process CPU time, and the
  memory each rank holds — see ``Meter.report`` for exactly what each number measures.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import TensorDataset


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int, length: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def sequences(n: int, vocab: int, length: int, seed: int) -> TensorDataset:
    """``n`` (inputs, next tokens) pairs of arithmetic progressions modulo ``vocab``."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    tokens = (start + stride * torch.arange(length + 1)) % vocab
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def add_arguments(parser) -> None:
    """The workload's options, the same for every version of the loop."""
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--samples", type=int, default=320,
                        help="training sequences: an epoch is samples / (batch size x processes) "
                             "steps (40 on 2 processes)")
    parser.add_argument("--warmup", type=int, default=8, help="untimed first steps")
    parser.add_argument("--batch-size", type=int, default=4, help="per process")
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-precision", choices=["no", "bf16"], default="no")


def _rss_bytes() -> int:
    """This process's resident set size now (Linux); its peak so far elsewhere."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def _local_bytes(tensor: torch.Tensor) -> int:
    """The bytes this process holds of ``tensor``: its own shard for a DTensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state this process holds (shards for FSDP)."""
    params = list(model.parameters())
    return {
        "param_bytes": sum(_local_bytes(p) for p in params),
        "grad_bytes": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
        "optim_bytes": sum(_local_bytes(value) for state in optimizer.state.values()
                           for value in state.values() if isinstance(value, torch.Tensor)),
        "full_param_count": sum(p.numel() for p in params),  # the whole model's (DTensor shape)
    }


class Meter:
    """Times the steady-state training step and records the memory this process uses.

    Call ``before_model()`` just before the model is built, ``step()`` after every optimizer
    step, ``report(...)`` after the loop.
    """

    def __init__(self, device: torch.device, warmup: int) -> None:
        self.device = device
        self.warmup = warmup
        self.steps = 0
        self.step_times: list[float] = []
        self.start = self.last = self.cpu_start = 0.0
        self.rss_base = self.cuda_base = 0

    def before_model(self) -> None:
        try:  # code imported on first use (DTensor, FSDP) is not the model's memory
            import torch.distributed.fsdp
            import torch.distributed.tensor
        except ImportError:
            pass
        self.rss_base = _rss_bytes()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.cuda_base = torch.cuda.memory_allocated(self.device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            self._sync()
            self.start = self.last = time.perf_counter()
            self.cpu_start = time.process_time()
        elif self.steps > self.warmup:
            now = time.perf_counter()
            self.step_times.append(now - self.last)
            self.last = now

    def report(self, variant: str, model: nn.Module, optimizer: torch.optim.Optimizer,
               loss: torch.Tensor) -> None:
        """Print this process's numbers as one JSON line (every rank prints its own).

        - ``step_ms_mean``: wall time of the steps after the warm-up / their number;
          ``step_ms_median`` the median single step; ``cpu_ms_per_step`` process CPU time
          (all threads) over the same steps;
        - ``param_bytes``, ``grad_bytes``, ``optim_bytes``: what this process holds of the
          parameters, their gradients and the optimizer state (a DTensor's local shard), read
          from the tensors themselves after the last step;
        - ``peak_rss_mb``: on the CPU, this process's peak resident set size (``ru_maxrss``)
          minus its resident size just before the model was built: the most memory building,
          distributing and training the model took, as the OS counts it (freed memory that the
          allocator keeps mapped included; imports and the data set excluded);
          ``end_rss_mb`` the resident size after the loop, on the same base;
        - ``peak_cuda_mb``: on CUDA, ``torch.cuda.max_memory_allocated()`` since just before
          the model was built (tensors only, not the caching allocator's reserve).
        """
        self._sync()
        elapsed = time.perf_counter() - self.start
        cpu = time.process_time() - self.cpu_start
        timed = len(self.step_times)
        result = {"bench": "blocks", "variant": variant, "rank": int(os.environ.get("RANK", 0)),
                  "world_size": int(os.environ.get("WORLD_SIZE", 1)), "timed_steps": timed,
                  "step_ms_mean": 1e3 * elapsed / timed, "cpu_ms_per_step": 1e3 * cpu / timed,
                  "step_ms_median": 1e3 * sorted(self.step_times)[timed // 2],
                  "final_loss": loss.item(), **held_bytes(model, optimizer),
                  "peak_rss_mb": (_peak_rss_bytes() - self.rss_base) / 2**20,
                  "end_rss_mb": (_rss_bytes() - self.rss_base) / 2**20}
        if self.device.type == "cuda":
            result["peak_cuda_mb"] = (torch.cuda.max_memory_allocated(self.device)
                                      - self.cuda_base) / 2**20
        # one write, so that the processes' lines, sharing torchrun's stdout, do not interleave
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
