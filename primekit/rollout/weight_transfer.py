"""Weight sync through shared memory: the policy's tensors cross to vLLM's worker process as
handles to one shared buffer, bucket by bucket, instead of as a file.

One code path for both devices (torch.multiprocessing's sharing primitives):
- CPU: the buffer is a shared-memory segment that torch's shm manager names and reference-counts
  (the `file_system` sharing strategy); its handle is (manager socket, segment name, size).
- CUDA: the buffer lives on the trainer's GPU; its handle is a CUDA IPC handle
  (`UntypedStorage._share_cuda_`), which the worker on the same GPU opens without a copy.

Each sync walks the buckets in order: copy the bucket's tensors into the buffer (cast to the
engine's dtype on the way), then one synchronous RPC has the worker load that bucket straight
from the buffer. The buffer is allocated once, the size of the largest bucket, and reused, so the
transfer costs one bucket of memory rather than a second copy of the model. Handles and slot
tables are plain bytes, strings and ints: vLLM's RPC encoding (msgpack) carries them, where it
cannot carry tensors (they arrive as lists).

This module imports only torch; its worker side (`open_buffer`, `read_bucket`) runs in vLLM's
worker process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64  # bytes; every tensor starts on a cache line (and on its dtype's alignment)

@dataclass(frozen=True)
class Slot:
    """Where one tensor sits in a bucket: `nbytes` bytes from byte `offset`."""

    name: str
    dtype: str  # "float32", "bfloat16", ...
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Bucket:
    slots: tuple[Slot, ...]
    nbytes: int  # end of the last slot


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def layer_of(name: str) -> str:
    """The layer a checkpoint tensor belongs to, for bucketing: the name up to its first
    numeric component ("model.layers.3.mlp.up_proj.weight" -> "model.layers.3"), else its
    module ("model.embed_tokens.weight" -> "model.embed_tokens")."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1])


def plan_buckets(tensors: list[tuple[str, torch.dtype, tuple[int, ...]]],
                 bucket_bytes: int) -> list[Bucket]:
    """Cut (name, dtype, shape) entries, in their given order, into buckets of at most
    `bucket_bytes` each, never splitting a layer (`layer_of`): a layer larger than that gets a
    bucket of its own, its size. Offsets are multiples of ALIGN bytes.

    Whole layers because vLLM's in-place reload processes a layer once all its tensors are in
    and keeps the tensors it was given until then: a layer inside one bucket is processed, and
    its tensors let go, within that bucket's RPC (the worker copies the tensors of every bucket
    but the last out of the reused buffer, `vllm_worker.WeightReload.primekit_load_bucket`).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    layers: list[list[tuple[str, torch.dtype, tuple[int, ...]]]] = []
    for entry in tensors:
        if layers and layer_of(layers[-1][-1][0]) == layer_of(entry[0]):
            layers[-1].append(entry)
        else:
            layers.append([entry])

    def place(entries, start: int) -> tuple[list[Slot], int]:
        slots, end = [], start
        for name, dtype, shape in entries:
            offset = _aligned(end)
            size = torch.Size(shape).numel() * dtype.itemsize
            slots.append(Slot(name, str(dtype).removeprefix("torch."), tuple(shape), offset,
                              size))
            end = offset + size
        return slots, end

    buckets: list[Bucket] = []
    slots: list[Slot] = []
    end = 0
    for layer in layers:
        placed, layer_end = place(layer, end)
        if slots and layer_end > bucket_bytes:  # the layer starts the next bucket
            buckets.append(Bucket(tuple(slots), end))
            placed, layer_end = place(layer, 0)
            slots = []
        slots += placed
        end = layer_end
    if slots:
        buckets.append(Bucket(tuple(slots), end))
    return buckets


def slot_view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The tensor that `slot` describes, as a view into the flat uint8 `buffer` ([bytes])."""
    flat = buffer[slot.offset: slot.offset + slot.nbytes]  # [nbytes] uint8
    return flat.view(getattr(torch, slot.dtype)).view(slot.shape)


def shared_buffer(nbytes: int, device: torch.device) -> tuple[torch.Tensor, list]:
    """A flat uint8 buffer ([nbytes]) that another process can open, and its handle.

    CPU: a segment named by torch's shm manager; the segment is removed once every process
    holding it has let go (a crashed trainer leaves nothing behind in /dev/shm). CUDA: device
    memory with an IPC handle; the trainer must outlive the worker's use of it.
    """
    if device.type == "cpu":
        storage = torch.UntypedStorage._new_using_filename_cpu(max(nbytes, 1))
        manager, name, size = storage._share_filename_cpu_()
        handle = ["cpu", manager, name, size]
    elif device.type == "cuda":
        storage = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device).untyped_storage()
        handle = ["cuda", *storage._share_cuda_()]
    else:
        raise ValueError(f"shared weight sync supports cpu and cuda tensors, not {device.type}")
    buffer = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)  # [nbytes]
    return buffer, handle


def open_buffer(handle: list, cuda_device: int | None = None) -> torch.Tensor:
    """The buffer behind `shared_buffer`'s handle, opened in this (another) process.

    `cuda_device`: this process's index of the trainer's GPU, where it differs from the
    trainer's (another CUDA_VISIBLE_DEVICES); the IPC handle only opens on that same device.
    """
    kind, *args = handle
    if kind == "cpu":
        manager, name, size = args
        storage = torch.UntypedStorage._new_shared_filename_cpu(bytes(manager), bytes(name),
                                                                int(size))
        device = torch.device("cpu")
    elif kind == "cuda":
        args[1] = bytes(args[1])  # the IPC handle
        args[4] = bytes(args[4])  # the ref-counter handle
        args[6] = bytes(args[6])  # the event handle
        if cuda_device is not None:
            args[0] = cuda_device
        # CUDA must be initialised in this process first (torch.multiprocessing's own rebuild
        # does the same): in a fresh process, opening the handle otherwise segfaults (seen on
        # an H200 with torch 2.11).
        torch.cuda.init()
        storage = torch.UntypedStorage._new_shared_cuda(*args)
        device = torch.device("cuda", int(args[0]))
    else:
        raise ValueError(f"unknown shared-buffer kind {kind!r}")
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


def bucket_message(handle: list, bucket: Bucket) -> dict[str, Any]:
    """What one RPC carries: the buffer's handle and the bucket's slot table (plain data)."""
    return {"handle": handle,
            "slots": [[s.name, s.dtype, list(s.shape), s.offset, s.nbytes] for s in bucket.slots]}


def read_bucket(buffer: torch.Tensor, message: dict[str, Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) views of one bucket in an opened buffer, in slot order (no copy)."""
    for name, dtype, shape, offset, nbytes in message["slots"]:
        yield name, slot_view(buffer, Slot(name, dtype, tuple(shape), offset, nbytes))


class SharedWeightSender:
    """The trainer's side: a model's parameters, bucketed into one reused shared buffer.

    Args:
        model: whose `named_parameters()` (checkpoint names, a tied embedding once) are sent.
        bucket_bytes: the most bytes one RPC carries, and the buffer's size (a larger layer
            gets a bucket, and the buffer its size, of its own).
        dtype: the dtype the receiving engine holds its weights in; tensors are cast to it while
            they are copied in (None: each parameter's own dtype).
    """

    def __init__(self, model: torch.nn.Module, bucket_bytes: int,
                 dtype: torch.dtype | None = None) -> None:
        params = list(model.named_parameters())
        if not params:
            raise ValueError("the model has no parameters to send")
        self.device = params[0][1].device
        self.bucket_bytes = bucket_bytes
        self.buckets = plan_buckets(
            [(name, dtype or p.dtype, tuple(p.shape)) for name, p in params], bucket_bytes)
        self.buffer, self.handle = shared_buffer(max(b.nbytes for b in self.buckets),
                                                 self.device)

    def send(self, model: torch.nn.Module, load: Callable[[dict[str, Any], bool, bool], Any]
             ) -> list[Any]:
        """Copy each bucket into the buffer and call `load(message, first, last)` on it, in
        order; `load` must return only once the receiver has finished reading the buffer.
        Returns what each `load` returned."""
        params = dict(model.named_parameters())
        results = []
        with torch.no_grad():
            for i, bucket in enumerate(self.buckets):
                for slot in bucket.slots:
                    slot_view(self.buffer, slot).copy_(params[slot.name].detach())
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
                results.append(load(bucket_message(self.handle, bucket), i == 0,
                                    i == len(self.buckets) - 1))
        return results
