"""Code that runs inside vLLM's model-worker process: `LLM(worker_extension_cls=...)` mixes
`WeightReload` into vLLM's worker class, and `LLM.collective_rpc("primekit_reload_weights", ...)`
calls it by name (nothing is pickled but the path). Kept free of heavy imports: the worker
imports this module at start-up.
"""

from __future__ import annotations

import logging

EXTENSION = "primekit.rollout.vllm_worker.WeightReload"
# The vLLM module that logs a layer reloaded without a tensor of its own.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class WeightReload:
    """Weight reload for a running vLLM worker, tied embeddings included."""

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
        users: dict[int, list] = {}
        for module in model.modules():
            weight = module._parameters.get("weight")
            if weight is not None:
                users.setdefault(id(weight), []).append(module)
        tied = [m for group in users.values() if len(group) > 1 for m in group
                if getattr(m, "quant_method", None) is not None]
        # vLLM warns "<layer>: Failed to load weights" at every reload for each layer that has
        # tensors but no checkpoint entry of its own: the tied head (re-processed just below)
        # and the rotary embeddings (their cos/sin cache comes from the config, and vLLM puts
        # it back as it was). Expected for those; any other layer still warns.
        expected = {type(m).__name__ for m in tied}
        expected |= {type(m).__name__ for m in model.modules()
                     if type(m).__name__.endswith("RotaryEmbedding")}
        quiet = _DropReloadWarning(expected)
        log = logging.getLogger(RELOAD_LOGGER)
        log.addFilter(quiet)
        try:
            self.reload_weights(weights_path=weights_path)  # a method of vLLM's worker
        finally:
            log.removeFilter(quiet)
        for module in tied:
            module.quant_method.process_weights_after_loading(module)
        return len(tied)


class _DropReloadWarning(logging.Filter):
    """Drops vLLM's "<layer>: Failed to load weights" for the named layer classes only."""

    def __init__(self, layer_names: set[str]):
        super().__init__()
        self.layer_names = layer_names

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and record.args[0] in self.layer_names)
