"""Code that runs inside vLLM's model-worker process: `LLM(worker_extension_cls=...)` mixes
`WeightReload` into vLLM's worker class, and `LLM.collective_rpc("primekit_reload_weights", ...)`
calls it by name (nothing is pickled but the path). Kept free of heavy imports: the worker
imports this module at start-up.
"""

from __future__ import annotations

EXTENSION = "primekit.rollout.vllm_worker.WeightReload"


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
        self.reload_weights(weights_path=weights_path)  # a method of vLLM's worker
        model = self.model_runner.get_model()
        users: dict[int, list] = {}
        for module in model.modules():
            weight = module._parameters.get("weight")
            if weight is not None:
                users.setdefault(id(weight), []).append(module)
        tied = [m for group in users.values() if len(group) > 1 for m in group
                if getattr(m, "quant_method", None) is not None]
        for module in tied:
            module.quant_method.process_weights_after_loading(module)
        return len(tied)
