"""How the loop's models are placed: FSDP2 sharding, mixed precision, activation checkpointing.

One rule for every model the RL loop holds (policy, critic, implicit PRM, reference):

- **Trained models keep fp32 master weights.** Their parameters, gradients and AdamW state are
  float32; `model.dtype` is only the *compute* dtype. With bf16 compute and pure-bf16 weights,
  AdamW steps smaller than half a bf16 ulp of the weight vanish (at the paper's policy lr 5e-7
  almost every update does), which is why the master copy is not optional.
- **Under torchrun (world size > 1) every model is sharded with FSDP2** (`fully_shard` on each
  decoder layer, then on the root): each rank stores 1/W of each parameter and of its optimiser
  state; parameters are all-gathered layer by layer in the compute dtype for the forward and
  backward, and gradients are reduce-scattered in float32 (`MixedPrecisionPolicy(param_dtype=
  compute, reduce_dtype=float32)`) and averaged over ranks. gloo on CPUs, NCCL on GPUs: the same
  code. Frozen models (the reference, a frozen PRM) are sharded too, stored in the compute dtype.
- **In a single process** nothing is sharded; with a compute dtype other than float32 the trained
  models' scoring forward runs under `torch.autocast` (fp32 weights, low-precision matmuls), the
  single-process form of the same guarantee.

Log-probs (and hence the PRM's beta * log-ratio) are computed in float32 whatever the compute
dtype: `sequence_logprobs` upcasts the logits before the log-softmax.

The scoring forward (`sequence_logprobs`) calls the decoder and the lm_head separately, so that
the [N, T, V] logits are formed chunk by chunk. FSDP2 gathers a module's parameters when its
`forward` runs; the root's own parameters (embeddings, final norm, lm_head) would be missed by
a call that bypasses `model.forward`. `prepare_model` therefore attaches the scoring function to
the model as a method (`SCORE_METHOD`) and registers it with FSDP2 as a forward method; the
log-prob functions call that method when it exists.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from primekit.runtime import check_compiler

# Name of the per-instance scoring method `prepare_model` attaches (see the module docstring).
SCORE_METHOD = "primekit_score"


@dataclass(frozen=True)
class Placement:
    """How to place one model: compute dtype, sharding and memory switches.

    compute_dtype: dtype of the matmuls (the weights of trained models stay float32).
    trainable: the model is optimised (fp32 master weights) or frozen (stored in compute_dtype).
    shard: FSDP2-shard it over the default process group (needs one; world size >= 1).
    activation_checkpointing: recompute each decoder layer's activations in the backward.
    cpu_offload: keep sharded parameters, gradients and optimiser state in host memory
        (FSDP2 `CPUOffloadPolicy`; requires shard=True and a CUDA compute device).
    compile: `torch.compile(dynamic=True)` each decoder layer in place (`compile_layers`),
        before sharding (FSDP2's hooks then wrap the compiled layers, as torchtitan orders them).
    """

    compute_dtype: torch.dtype = torch.float32
    trainable: bool = True
    shard: bool = False
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    compile: bool = False

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype the weights are loaded and kept in."""
        return torch.float32 if self.trainable else self.compute_dtype


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a Hugging Face model (the FSDP2 sharding units).

    Found as the longest `torch.nn.ModuleList` in the model (`model.model.layers` for Llama,
    Qwen2, Mistral and most decoders); a model without one is an error.
    """
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of decoder layers to shard")
    return list(max(lists, key=len))


def prepare_model(model: torch.nn.Module, placement: Placement,
                  score_fn: Callable | None = None) -> torch.nn.Module:
    """Apply `placement` to `model` in place (it must already be in `placement.storage_dtype`).

    Args:
        model: a Hugging Face model on its device.
        placement: the switches (see `Placement`).
        score_fn: the function `sequence_logprobs` runs for this model, `f(model, *args)`; when
            given, it is attached as the method `SCORE_METHOD` (under autocast for mixed
            precision in one process; as an FSDP2 forward method when sharded).
    Returns:
        the same module (sharded: its class becomes an FSDPModule subclass).
    """
    if placement.cpu_offload and not placement.shard:
        raise ValueError("cpu_offload needs sharding (FSDP2): launch with torchrun")
    if placement.activation_checkpointing:
        if not hasattr(model, "gradient_checkpointing_enable"):
            raise ValueError(f"{type(model).__name__} cannot checkpoint activations")
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.20
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if hasattr(model, "config"):
            model.config.use_cache = False
    if not placement.trainable:
        model.requires_grad_(False)
    if placement.compile:
        compile_layers(model)
    if score_fn is not None:
        if placement.shard or placement.compute_dtype == torch.float32:
            method = score_fn
        else:
            method = _autocast(score_fn, placement.compute_dtype)
        setattr(model, SCORE_METHOD, types.MethodType(method, model))
    if placement.shard:
        _fully_shard(model, placement)
        if score_fn is not None:
            from torch.distributed.fsdp import register_fsdp_forward_method

            register_fsdp_forward_method(model, SCORE_METHOD)
    return model


def compile_layers(model: torch.nn.Module) -> None:
    """`torch.compile(dynamic=True)` each decoder layer of `model` in place (`Module.compile`:
    parameter names and state dicts unchanged, so checkpoints and weight syncs are as before).

    A layer is the unit that repeats, so one compiled graph serves every layer, and the parts
    of the forward between layers (embeddings, the mask built from the position ids, the
    lm_head in chunks) stay eager. dynamic=True: packed micro-batches change shape from one
    pass to the next without recompiling. The compiler fuses each layer's norms, rotary
    embedding, activations and residual adds, which on a CPU are most of a small model's time
    beside its matrix products (docs/performance.md). Sampling does not run compiled: the HF
    engine calls the model under `torch.compiler.set_stance("force_eager")` (its cache grows
    every step). Under torchrun `prepare_model` compiles before `fully_shard`, as torchtitan
    does; 2 gloo ranks train as the eager ranks do (tests/trainer/test_compile.py).
    """
    if next(model.parameters()).device.type == "cpu":
        check_compiler("train.compile=true")
    for layer in decoder_layers(model):
        layer.compile(dynamic=True)


def _autocast(fn: Callable, dtype: torch.dtype) -> Callable:
    def wrapped(model, *args, **kwargs):
        device_type = next(model.parameters()).device.type
        with torch.autocast(device_type=device_type, dtype=dtype):
            return fn(model, *args, **kwargs)

    return wrapped


def _fully_shard(model: torch.nn.Module, placement: Placement) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("sharding needs an initialised process group (launch with torchrun)")
    kwargs = {}
    if placement.trainable:
        # fp32 master weights in the shards; compute-dtype all-gathers; fp32 gradient reduction.
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=placement.compute_dtype,
                                                   reduce_dtype=torch.float32)
    if placement.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    # FSDP2 keeps the root's own parameters (embeddings, final norm, lm_head) gathered after a
    # forward, expecting the backward; a frozen model has none, so it reshards them at once.
    fully_shard(model, reshard_after_forward=True if not placement.trainable else None, **kwargs)


def is_sharded(model: torch.nn.Module) -> bool:
    """True for an FSDP2-sharded module."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_nbytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes this rank stores for `tensors` (a sharded DTensor counts only its local shard)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def optimizer_nbytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of `optimizer`'s state tensors on this rank (AdamW: the two moments and the step)."""
    return local_nbytes(v for state in optimizer.state.values() for v in state.values()
                        if isinstance(v, torch.Tensor))


def grad_norm_value(norm: torch.Tensor) -> torch.Tensor:
    """`clip_grad_norm_`'s result as a plain tensor (it is a DTensor for sharded models)."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

