"""Weight sync through a shared buffer (primekit/rollout/weight_transfer.py), without vLLM: the
bucket plan on hand-computed sizes, and a second process reading the trainer's parameters out of
the shared buffer exactly (CPU shared memory here; the same code on CUDA IPC in the gpu tier)."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from primekit.rollout.weight_transfer import (
    SharedWeightSender,
    Slot,
    layer_of,
    open_buffer,
    plan_buckets,
    read_bucket,
)

F32, BF16 = torch.float32, torch.bfloat16


def test_layer_of_groups_a_decoder_layer_and_keeps_other_modules_apart():
    assert layer_of("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert layer_of("model.layers.3.self_attn.q_proj.bias") == "model.layers.3"
    assert layer_of("model.layers.12.input_layernorm.weight") == "model.layers.12"
    assert layer_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert layer_of("model.norm.weight") == "model.norm"
    assert layer_of("lm_head.weight") == "lm_head"


def test_plan_buckets_on_hand_computed_sizes():
    tensors = [("m.0.w", F32, (2, 3)),  # 6 x 4 = 24 bytes at 0
               ("m.0.b", F32, (3,)),  # 12 bytes at 64 (the next multiple of 64): ends at 76
               ("head.w", BF16, (10,))]  # 20 bytes; at 128 it would end at 148 > 100
    a, b = plan_buckets(tensors, bucket_bytes=100)
    assert a.slots == (Slot("m.0.w", "float32", (2, 3), 0, 24),
                       Slot("m.0.b", "float32", (3,), 64, 12))
    assert a.nbytes == 76
    assert b.slots == (Slot("head.w", "bfloat16", (10,), 0, 20),)
    assert b.nbytes == 20
    # 50-byte buckets: layer m.0 (76 bytes) is not split; it gets a bucket of its own size.
    a, b = plan_buckets(tensors, bucket_bytes=50)
    assert [s.name for s in a.slots] == ["m.0.w", "m.0.b"] and a.nbytes == 76
    assert [s.name for s in b.slots] == ["head.w"]
    # Everything fits in 1 KiB: one bucket, head.w at 128.
    (one,) = plan_buckets(tensors, bucket_bytes=1024)
    assert [s.offset for s in one.slots] == [0, 64, 128] and one.nbytes == 148
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        plan_buckets(tensors, bucket_bytes=0)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(7, 5)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(5, 5) for _ in range(3))
        self.norm = torch.nn.LayerNorm(5)


def _receiver(conn) -> None:
    """Another process: opens each bucket's buffer from its handle, returns the values read
    (or the traceback of what failed, so that the test fails instead of waiting)."""
    while (message := conn.recv()) is not None:
        try:
            buffer = open_buffer(message["handle"])
            conn.send({name: (str(t.dtype), t.float().tolist()) for name, t in
                       read_bucket(buffer, message)})
        except Exception:  # noqa: BLE001 - anything: it goes back to the test as text
            import traceback

            conn.send(traceback.format_exc())


@pytest.fixture(scope="module")
def receiver():
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_receiver, args=(theirs,), daemon=True)
    proc.start()
    theirs.close()  # the child's end lives in the child only: its death ends our recv()

    def load(message, first, last):
        ours.send(message)
        if not ours.poll(120):
            raise TimeoutError(f"the receiving process did not answer in 120 s "
                               f"(alive: {proc.is_alive()}, exit code {proc.exitcode})")
        read = ours.recv()
        if isinstance(read, str):
            raise RuntimeError(f"the receiving process failed:\n{read}")
        return first, last, read

    yield load
    ours.send(None)
    proc.join(timeout=30)


# 256-byte buckets. fp32: embed 7x5x4 = 140 bytes; a Linear(5, 5) is a 100-byte weight at 0
# and a 20-byte bias at 128 (the next multiple of 64), 148 bytes, so no layer fits after another;
# the norm: 20 bytes at 0 and 20 at 64 = 84. bf16 halves every size: embed 70, then layers.0 at
# 128 (weight 50) and 192 (bias 10) ends at 202; layers.1 at 256 would not fit, so it starts the
# next bucket, which layers.2 also fits in (0-74, 128-202); the norm starts a third.
FP32_BUCKETS = [["embed.weight"], ["layers.0.weight", "layers.0.bias"],
                ["layers.1.weight", "layers.1.bias"], ["layers.2.weight", "layers.2.bias"],
                ["norm.weight", "norm.bias"]]
BF16_BUCKETS = [["embed.weight", "layers.0.weight", "layers.0.bias"],
                ["layers.1.weight", "layers.1.bias", "layers.2.weight", "layers.2.bias"],
                ["norm.weight", "norm.bias"]]


@pytest.mark.parametrize("dtype, buckets, buffer_bytes", [(None, FP32_BUCKETS, 148),
                                                          (BF16, BF16_BUCKETS, 202)])
def test_another_process_reads_every_parameter_exactly_bucket_by_bucket(
        receiver, dtype, buckets, buffer_bytes):
    model = _Tiny()
    sender = SharedWeightSender(model, bucket_bytes=256, dtype=dtype)
    assert [[s.name for s in b.slots] for b in sender.buckets] == buckets
    assert sender.buffer.numel() == buffer_bytes  # one buffer, the largest bucket's size
    flags = [(i == 0, i == len(buckets) - 1) for i in range(len(buckets))]
    for _ in range(2):  # the second sync reuses the buffer and sees the new values
        results = sender.send(model, receiver)
        assert [(first, last) for first, last, _ in results] == flags
        got = {name: v for *_, read in results for name, v in read.items()}
        assert list(got) == [name for name, _ in model.named_parameters()]
        for name, p in model.named_parameters():
            want = p.detach().to(dtype or p.dtype)
            assert got[name][0] == str(want.dtype)
            assert torch.equal(torch.tensor(got[name][1]), want.float()), name
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ipc_route_reads_every_parameter_exactly(receiver):
    model = _Tiny().cuda()
    sender = SharedWeightSender(model, bucket_bytes=256, dtype=BF16)
    assert sender.handle[0] == "cuda" and sender.buffer.is_cuda
    got = {name: v for *_, read in sender.send(model, receiver) for name, v in read.items()}
    for name, p in model.named_parameters():
        assert torch.equal(torch.tensor(got[name][1]), p.detach().to(BF16).float().cpu()), name


class _FakeLLM:
    """Records the RPCs `VLLMRolloutEngine.sync_weights` makes (no vLLM here)."""

    def __init__(self):
        self.calls = []

    def collective_rpc(self, method, args=()):
        if method == "primekit_load_bucket":
            message, first, last = args
            buffer = open_buffer(message["handle"])  # read now, as the worker does
            args = ({name: t.clone() for name, t in read_bucket(buffer, message)}, first, last)
        self.calls.append((method, args))
        return [0]

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache", ()))
        return True


def _engine(weight_sync: str, bucket_bytes: int):
    import tempfile

    from primekit.rollout.vllm import VLLMRolloutEngine

    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)  # without starting vLLM
    engine.llm, engine.weight_sync, engine.sync_bucket_bytes = _FakeLLM(), weight_sync, bucket_bytes
    engine.dtype, engine._sender = torch.float32, None
    engine._weights_dir = tempfile.TemporaryDirectory()
    return engine


def test_engine_sync_sends_one_rpc_per_bucket_then_resets_the_prefix_cache():
    model, engine = _Tiny(), _engine("shared", 256)
    engine.sync_weights(model)
    methods = [m for m, _ in engine.llm.calls]
    assert methods == ["primekit_load_bucket"] * 5 + ["reset_prefix_cache"]  # FP32_BUCKETS
    flags = [(a[1], a[2]) for m, a in engine.llm.calls if m == "primekit_load_bucket"]
    assert flags == [(True, False)] + [(False, False)] * 3 + [(False, True)]
    got = {k: v for m, a in engine.llm.calls if m == "primekit_load_bucket" for k, v in a[0].items()}
    assert all(torch.equal(got[n], p.detach()) for n, p in model.named_parameters())


def test_engine_falls_back_to_the_file_route_when_no_shared_buffer_can_be_made(monkeypatch):
    import primekit.rollout.vllm as vllm_engine

    def no_shm(*args, **kwargs):
        raise RuntimeError("unable to open shared memory object")

    monkeypatch.setattr(vllm_engine, "SharedWeightSender", no_shm)
    engine = _engine("shared", 256)
    with pytest.warns(RuntimeWarning, match="no shared buffer .*unable to open shared memory"):
        engine.sync_weights(_Tiny())
    assert engine.weight_sync == "file"
    (method, (directory,)), reset = engine.llm.calls
    assert method == "primekit_reload_weights" and reset[0] == "reset_prefix_cache"
    from safetensors.torch import load_file

    saved = load_file(f"{directory}/model.safetensors")
    assert sorted(saved) == sorted(name for name, _ in _Tiny().named_parameters())
