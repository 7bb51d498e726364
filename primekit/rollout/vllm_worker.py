"""Code that runs inside vLLM's model-worker process: `LLM(worker_extension_cls=...)` mixes
`WeightReload` into vLLM's worker class, and `LLM.collective_rpc("primekit_...", ...)` calls its
methods by name (only plain data crosses: a path, or a shared buffer's handle and slot table).
Kept free of heavy imports: the worker imports this module at start-up.
"""

from __future__ import annotations

import logging

EXTENSION = "primekit.rollout.vllm_worker.WeightReload"
# The vLLM module that logs a layer reloaded without a tensor of its own.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class WeightReload:
    """Weight reload for a running vLLM worker, tied embeddings included: from a file
    (`primekit_reload_weights`) or from a shared buffer, bucket by bucket
    (`primekit_load_bucket`, primekit/rollout/weight_transfer.py)."""

    def primekit_reload_weights(self, weights_path: str) -> int:
        """Reload the checkpoint at `weights_path` in place (vLLM's `reload_weights`), then
        re-process every layer whose weight is shared with another layer; returns their number.

        vLLM's in-place reload re-processes each layer it loads, but a tied output embedding
        (`lm_head` sharing `embed_tokens.weight`) is loaded under no name of its own: its
        values change through the shared tensor while the kernel form built from them stays
        old (on a CPU, a oneDNN-packed copy of the old matrix). Measured on the tiny model
        without this step: embeddings changed, vLLM's log-probs 0.3 nats away from the
        trainer's.
        """
        model = self.model_runner.get_model()
        tied, quiet = _tied_layers(model), _DropReloadWarning(_expected_unloaded(model))
        log = logging.getLogger(RELOAD_LOGGER)
        log.addFilter(quiet)
        try:
            self.reload_weights(weights_path=weights_path)  # a method of vLLM's worker
        finally:
            log.removeFilter(quiet)
        for module in tied:
            module.quant_method.process_weights_after_loading(module)
        return len(tied)

    def primekit_load_bucket(self, message: dict, first: bool, last: bool) -> int:
        """Load one bucket of a sync from the trainer's shared buffer; returns the number of
        tied layers re-processed (at the last bucket).

        The buckets of one sync form one in-place reload, as `reload_weights` does it in a
        single call: the first bucket starts vLLM's layerwise reload (each layer is
        re-processed for its kernels once all its tensors are in), the last one finishes it,
        re-processes the tied layers as `primekit_reload_weights` does, and checks that every
        parameter of the engine's (unquantized) model was loaded. The last bucket is read
        straight from the buffer, the others through copies (below). The buffer must not
        change until this returns: on a GPU it waits for its copies before returning.
        """
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        from primekit.rollout.weight_transfer import read_bucket

        model = self.model_runner.get_model()
        buffer = self._primekit_buffer(message["handle"])
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            if first:
                # Found before the reload starts: during it, layers hold placeholder tensors.
                self._primekit_tied = _tied_layers(model)
                self._primekit_quiet = _DropReloadWarning(_expected_unloaded(model))
                initialize_layerwise_reload(model)
                self._primekit_loaded: set[str] = set()
            weights = read_bucket(buffer, message)  # views into the shared buffer
            if not last:
                # vLLM may keep a layer's tensors until the reload finishes (a tied head, a
                # layer whose tensors span buckets, attention layers): a view would then be
                # read after the next bucket overwrote the buffer (measured: garbage outputs
                # with 6 buckets). Copies for every bucket but the last, which the reload
                # finishes with in this call.
                weights = ((name, tensor.clone()) for name, tensor in weights)
            self._primekit_loaded |= set(model.load_weights(weights) or ())
            if buffer.is_cuda:
                torch.cuda.synchronize(buffer.device)
            if not last:
                return 0
            tied, quiet = self._primekit_tied, self._primekit_quiet
            log = logging.getLogger(RELOAD_LOGGER)
            log.addFilter(quiet)
            try:
                finalize_layerwise_reload(model, self.vllm_config.model_config)
            finally:
                log.removeFilter(quiet)
            for module in tied:
                module.quant_method.process_weights_after_loading(module)
        # What vLLM's own reload_weights does after loading (gpu_model_runner.reload_weights).
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            getattr(self.model_runner, reset, lambda: None)()
        # vLLM's own reload checks the same way, and skips quantized models (their parameters
        # are not checkpoint tensors one for one).
        missing = {name for name, _ in model.named_parameters()} - self._primekit_loaded
        if missing and self.vllm_config.model_config.quantization is None:
            raise RuntimeError(f"weight sync left {len(missing)} parameters of the engine's "
                               f"model unloaded (kept their old values): {sorted(missing)[:5]}")
        return len(tied)

    def _primekit_buffer(self, handle: list):
        """The trainer's shared buffer, opened once and kept while the handle stays the same."""
        from primekit.rollout.weight_transfer import open_buffer

        key = tuple(handle)
        cached = getattr(self, "_primekit_opened", None)
        if cached is None or cached[0] != key:
            device = getattr(self, "device", None)  # the worker's own index of its GPU
            index = device.index if getattr(device, "type", None) == "cuda" else None
            self._primekit_opened = (key, open_buffer(list(handle), cuda_device=index))
        return self._primekit_opened[1]


def _tied_layers(model) -> list:
    """Layers whose weight tensor another layer shares (and that have a kernel form)."""
    users: dict[int, list] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None:
            users.setdefault(id(weight), []).append(module)
    return [m for group in users.values() if len(group) > 1 for m in group
            if getattr(m, "quant_method", None) is not None]


def _expected_unloaded(model) -> set[str]:
    """Layer classes that a reload leaves without a tensor of their own, as expected.

    vLLM warns "<layer>: Failed to load weights" at every reload for each layer that has
    tensors but no checkpoint entry of its own: the tied head (re-processed after the reload)
    and the rotary embeddings (their cos/sin cache comes from the config, and vLLM puts it back
    as it was). Expected for those; any other layer still warns.
    """
    return ({type(m).__name__ for m in _tied_layers(model)}
            | {type(m).__name__ for m in model.modules()
               if type(m).__name__.endswith("RotaryEmbedding")})


class _DropReloadWarning(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for the named layer classes only."""

    def __init__(self, layer_names: set[str]):
        super().__init__()
        self.layer_names = layer_names

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and record.args[0] in self.layer_names)
