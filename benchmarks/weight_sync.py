"""Weight sync into a running vLLM engine: the shared-buffer route against the file route.

One engine, one policy; each round syncs the same weights by every route in turn (the order
alternating between rounds), after one untimed sync per route (the shared route's first sync
allocates its buffer and the worker opens it). Routes:
- `shared`: `rollout.vllm_weight_sync=shared` (the default): the parameters copied, bucket by
  bucket, into one shared buffer that the worker loads from (primekit/rollout/weight_transfer.py).
- `file`: `rollout.vllm_weight_sync=file`: one safetensors file in /dev/shm, re-read by the worker.
- `copy only`: the shared route's trainer-side copies into the buffer with no RPC, to tell the
  copy from the worker's load and vLLM's re-processing.
Both sync routes do the same work in the worker after the tensors arrive (vLLM's in-place reload
and re-processing); they differ in how the bytes get there (one copy into shared memory against
a serialised file write and read) and in the number of RPCs (one per bucket against one).

`--random-0.5b` builds a random-weight model of Qwen2-0.5B's shape (hidden 896, 24 layers,
vocab 151,936, tied embeddings: 494 M parameters, 1.98 GB in fp32) in a temporary directory, with
the tiny model's tokenizer, so that no download is needed. A 7B projection divides a 7B model's
bf16 bytes (7.6 G parameters x 2 bytes) by each route's measured bytes/s: a projection from
this machine, not a measurement (a GPU node moves bytes over other paths: CUDA IPC, no copy
through the CPU).

Usage (in the `.venv-vllm` of `.ci/vllm.sh`):
    python benchmarks/weight_sync.py --policy runs/demo/sft [--syncs 5] [--bucket-mb 512]
    python benchmarks/weight_sync.py --random-0.5b --policy runs/demo/sft [--syncs 5]
Without vLLM the script says so and exits 0 (skipped).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import add_policy_argument, half_billion_config, missing_policy

from primekit.models.hf import load_model, load_tokenizer, stop_token_ids

PARAMS_7B = 7.6e9  # Qwen2.5-7B's parameter count; bf16: 2 bytes each


def random_half_billion(tokenizer_dir: str, out: Path) -> Path:
    """A random-weight Qwen2 of 0.5B's shape, saved with the tokenizer at `tokenizer_dir`."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(half_billion_config())
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


def summary(seconds: list[float]) -> str:
    ms = [1000 * s for s in seconds]
    return (f"median {statistics.median(ms):8.1f} ms  (min {min(ms):.1f}, max {max(ms):.1f}, "
            f"n {len(ms)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_policy_argument(parser, use="sync (and take the tokenizer from)")
    parser.add_argument("--random-0.5b", dest="random_half", action="store_true",
                        help="sync a random-weight model of Qwen2-0.5B's shape instead")
    parser.add_argument("--syncs", type=int, default=5, help="timed rounds")
    parser.add_argument("--bucket-mb", type=int, default=512, help="the shared route's bucket")
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    args = parser.parse_args(argv)
    if missing_policy(args.policy):
        return 1
    try:  # any exception: a broken install raises more than ImportError (rollout/vllm.py)
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported; skipped, as vs_trl.py is without TRL
        print(f"skipped: vLLM cannot be imported here ({type(e).__name__}: {e}); run it in the "
              f"`.venv-vllm` of `.ci/vllm.sh`")
        return 0

    from primekit.rollout.vllm import VLLMRolloutEngine
    from primekit.rollout.weight_transfer import SharedWeightSender

    with tempfile.TemporaryDirectory(prefix="primekit-sync-bench-") as tmp:
        model_dir = (str(random_half_billion(args.policy, Path(tmp) / "random-0.5b"))
                     if args.random_half else args.policy)
        tokenizer = load_tokenizer(model_dir)
        policy = load_model(model_dir, dtype=torch.float32)
        nbytes = sum(p.numel() * p.element_size() for p in policy.parameters())
        print(f"model: {model_dir}, {sum(p.numel() for p in policy.parameters()) / 1e6:.1f} M "
              f"parameters, {nbytes / 2**20:.1f} MiB in fp32; bucket {args.bucket_mb} MiB; "
              f"torch threads {torch.get_num_threads()}")
        start = time.perf_counter()
        engine = VLLMRolloutEngine(model_dir, tokenizer, seed=0, max_model_len=256,
                                   kv_cache_gib=args.kv_cache_gib,
                                   eos_token_ids=stop_token_ids(model_dir, tokenizer),
                                   sync_bucket_mb=args.bucket_mb)
        print(f"engine start: {time.perf_counter() - start:.1f} s")
        try:
            copy_sender = SharedWeightSender(policy, args.bucket_mb << 20, torch.float32)

            def sync(route: str) -> None:
                engine.weight_sync = route
                engine.sync_weights(policy)

            sides = {"shared": lambda: sync("shared"), "file": lambda: sync("file"),
                     "copy only": lambda: copy_sender.send(policy, lambda *_: None)}
            for name, call in sides.items():  # untimed warm-up of each side
                start = time.perf_counter()
                call()
                print(f"first {name}: {1000 * (time.perf_counter() - start):.1f} ms (untimed)")
            times: dict[str, list[float]] = {name: [] for name in sides}
            for i in range(args.syncs):
                for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
                    start = time.perf_counter()
                    sides[name]()
                    times[name].append(time.perf_counter() - start)
            buckets = len(engine._sender.buckets)
        finally:
            engine.close()

    print(f"\n{buckets} bucket(s) per shared sync")
    for name, seconds in times.items():
        rate = nbytes / statistics.median(seconds)
        projection = ("" if name == "copy only" else
                      f"; 7B bf16 projected {2 * PARAMS_7B / rate:.1f} s")
        print(f"{name:>10}: {summary(seconds)}  {rate / 1e9:.2f} GB/s{projection}")
    ratio = statistics.median(times["shared"]) / statistics.median(times["file"])
    print(f"shared / file median: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
