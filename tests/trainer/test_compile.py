"""`train.compile`: every decoder layer of the loop's models under torch.compile(dynamic=True).

Compiling fuses kernels; it must not change what the passes compute beyond float rounding, nor
the names of parameters (checkpoints, weight sync), nor sampling (the HF engine runs eager). The
compiled passes themselves are slow tests: the first call compiles (tens of seconds on 2 cores).
"""

from __future__ import annotations

import copy

import pytest
import torch

from primekit import distributed as dist
from primekit.config import load_config
from primekit.factory import build_rl_trainer
from primekit.models.parallel import Placement, decoder_layers, prepare_model
from primekit.rollout.base import SamplingParams
from primekit.rollout.hf import HFRolloutEngine
from tests.spawn import run_processes
from tests.trainer.conftest import CONFIG
from tests.trainer.test_distributed_trainer import (
    TOLERANCE,
    _overrides,
    _Parity,
    _state,
    _two_steps,
)
from tests.trainer.test_packed_trajectory import COMMON, LAYOUTS, _passes


def _compiled_frames() -> int:
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_compile_marks_every_decoder_layer_keeps_names_and_sampling_stays_eager(sft_model_dir):
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(sft_model_dir).float().eval()
    compiled = prepare_model(copy.deepcopy(eager), Placement(compile=True))
    layers = decoder_layers(compiled)
    assert len(layers) >= 2 and all(layer._compiled_call_impl is not None for layer in layers)
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(eager))
    assert list(compiled.state_dict()) == list(eager.state_dict())  # no `_orig_mod.` prefixes

    # Greedy samples of the compiled model are the eager model's, in both decode paths (the
    # model's own forward, and the written-out step after a prefill through the model), and
    # nothing was compiled for them.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(sft_model_dir)
    prompts = [tokenizer.encode(q) for q in ("Q: 2+3*4\nA:", "Q: 17-5\nA:", "Q: (1+2)*3\nA:")]
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    before = _compiled_frames()
    for decode in ("model", "auto"):
        got = HFRolloutEngine(compiled, tokenizer, decode=decode).generate(prompts, params)
        want = HFRolloutEngine(eager, tokenizer, decode=decode).generate(prompts, params)
        assert torch.equal(got.response_ids, want.response_ids), decode
    assert _compiled_frames() == before
    assert got.response_ids.shape[1] > 0


def test_compile_without_a_cxx_compiler_is_refused_before_any_pass(sft_model_dir, monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder
    from transformers import AutoModelForCausalLM

    def no_compiler():
        raise RuntimeError("No working C++ compiler found in torch._inductor.config.cpp.cxx")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    model = AutoModelForCausalLM.from_pretrained(sft_model_dir)
    with pytest.raises(ValueError, match=r"train.compile=true needs a C\+\+ compiler .*No working"
                                         r".*or turn it off"):
        prepare_model(model, Placement(compile=True))
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))


@pytest.mark.slow
@pytest.mark.parametrize("layout,extra", [("padded-rows", ()), ("packed-tokens", ()), (
    "packed-tokens", ("parallel.activation_checkpointing=true",))])
def test_every_pass_agrees_compiled_and_eager(rl_config, layout, extra):
    # The step's passes (old log-probs, reference, PRM forward and backward, critic values and
    # update, policy update) on one collected batch, eager and with every layer compiled: equal
    # within float rounding, also with each layer's activations recomputed in the backward.
    # Fused kernels sum in another order, so not bitwise: measured, at most 9.5e-7 relative.
    trainers = {c: build_rl_trainer(rl_config(*COMMON, *LAYOUTS[layout], *extra,
                                              f"train.compile={c}"))
                for c in ("false", "true")}
    eager, compiled = trainers["false"], trainers["true"]
    assert all(layer._compiled_call_impl is not None
               for m in (compiled.policy, compiled.rewarder.model, compiled.critic)
               for layer in decoder_layers(m))
    compiled.critic.load_state_dict(eager.critic.state_dict())  # fresh value heads differ
    exp, _ = eager.collect({})
    want, got = _passes(eager, exp), _passes(compiled, exp)
    assert _compiled_frames() > 0  # graphs were compiled (here, or for an earlier layout)
    worst = 0.0
    for key, value in want.items():
        if isinstance(value, dict):
            assert value.keys() == got[key].keys() and value, key
            for k in value:
                scale = max(float(value[k].abs().max()), 1.0)
                worst = max(worst, float((got[key][k] - value[k]).abs().max()) / scale)
                torch.testing.assert_close(got[key][k], value[k], rtol=0, atol=1e-5 * scale,
                                           msg=f"{key} {k}")
        else:
            worst = max(worst, float(torch.as_tensor(got[key] - value).abs().max()))
            torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-5, msg=key)
    print(f"{layout} {extra}: largest difference {worst:.1e} (relative to the largest value)")


def _sharded_worker(rank: int, world: int, init_file: str, policy: str, run_dir: str,
                    out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                         world_size=world)
    try:
        torch.set_num_threads(1)
        cfg = load_config(CONFIG, _overrides(policy, run_dir) + ["train.compile=true"])
        trainer = build_rl_trainer(cfg, verifier=_Parity())
        compiled = [layer._compiled_call_impl is not None
                    for m in (trainer.policy, trainer.rewarder.model, trainer.ref)
                    for layer in decoder_layers(m)]
        steps = [dist.reduce_metrics(m) for m in _two_steps(trainer)]
        torch.save({"compiled": compiled, "state": _state(trainer), "steps": steps,
                    "graphs": _compiled_frames()}, f"{out}/rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_sharded_compiled_ranks_train_as_one_eager_process(sft_model_dir, tmp_path):
    # Compiled before FSDP2 shards them (torchtitan's order), the layers of 2 gloo ranks train
    # two steps as one eager process does: the tolerance of the eager ranks' own comparison
    # (tests/trainer/test_distributed_trainer.py), fused kernels' rounding on top.
    out = tmp_path / "out"
    out.mkdir()
    run_processes(_sharded_worker, (2, str(tmp_path / "store"), str(sft_model_dir),
                                    str(tmp_path / "run"), str(out)),
                  nprocs=2, timeout_s=500, what="2 compiled ranks")
    r0, r1 = (torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert all(r0["compiled"]) and all(r1["compiled"]) and len(r0["compiled"]) >= 6
    assert r0["graphs"] > 0 and r1["graphs"] > 0
    single = build_rl_trainer(load_config(CONFIG, _overrides(str(sft_model_dir),
                                                             str(tmp_path / "single"))),
                              verifier=_Parity())
    one_steps, one = _two_steps(single), _state(single)
    for name in ("policy", "prm"):
        diff = max((v - r0["state"][name][k]).abs().max().item() for k, v in one[name].items())
        print(f"{name}: max |1 eager process - 2 compiled ranks| = {diff:.3g}")
        assert diff < TOLERANCE, (name, diff)
    for a, b in zip(one_steps, r0["steps"]):
        for key in ("reward/outcome_mean", "prm/loss", "prm/acc_abs"):
            assert abs(a[key] - b[key]) < 1e-4, (key, a[key], b[key])
