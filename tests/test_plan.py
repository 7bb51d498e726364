"""`primekit plan`: the 7B plan's numbers checked by hand, fit decisions, the CLI and its errors."""

from __future__ import annotations

import json

import pytest

from primekit.cli import main
from primekit.config import ConfigError, load_config, resolve_config
from primekit.models import memory as mem
from primekit.plan import alternatives, build_plan, pass_shape, read_model_shape

GIB = 2**30
P = 7_615_616_512  # Qwen2-7B parameters (tests/models/test_memory.py derives it)
QWEN2_7B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
}


@pytest.fixture(scope="module")
def qwen2_7b_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2_7b")
    (path / "config.json").write_text(json.dumps(QWEN2_7B_CONFIG))
    return path


@pytest.fixture(scope="module")
def shape_7b(qwen2_7b_dir):
    return read_model_shape(str(qwen2_7b_dir))


PADDED = ["policy.max_tokens_per_micro_batch=0", "prm.max_tokens_per_micro_batch=0"]
# paper-7b.yaml before it packed: 8 padded rows per micro-batch.
PADDED_7B = [*PADDED, "policy.micro_batch_size=8", "prm.micro_batch_size=8"]


def _plan(shape, *overrides: str, gpus: int = 8, gpu_mem: float = 80.0):
    cfg = load_config(resolve_config("paper-7b"), list(overrides))
    return cfg, build_plan(cfg, shape, gpus=gpus, gpu_mem_gib=gpu_mem, prompt_len=1024, chunk=512)


def test_paper_7b_plan_by_hand(shape_7b):
    assert mem.model_params(shape_7b) == P
    cfg, plan = _plan(shape_7b, "parallel.activation_checkpointing=true", *PADDED_7B)
    rows = dict((item, b) for item, b, _ in plan.persistent)
    # Trained policy and PRM, 8 GPUs: fp32 params 4P/8, fp32 grads 4P/8, AdamW 8P/8 each.
    assert rows["policy: parameters (fp32 master)"] == 4 * P / 8 == 3_807_808_256
    assert rows["PRM: AdamW state (fp32, 2 moments)"] == 8 * P / 8
    # Reference in bf16, sharded: 2P/8 = 1,903,904,128. Rollout copy: 2P = 15,231,233,024.
    assert rows["reference: weights (bfloat16, frozen)"] == 1_903_904_128
    assert rows["rollout: policy weights (full copy)"] == 15_231_233_024
    # persistent = 2 * 16P/8 + 2P/8 + 2P = 6.25P = 47,597,603,200 bytes (44.33 GiB)
    assert plan.persistent_bytes == 47_597_603_200
    rollout = dict((item, b) for item, b, _ in plan.phases["rollout"])
    # KV: 57,344 bytes/token * 64 rows * (1024 + 3072) tokens = 15,032,385,536
    assert rollout["KV cache"] == 15_032_385_536
    # prefill: 64*1024 tokens * 2*(2*3584 + 3*18944) = 8,388,608,000 + mask 64*1024^2*2
    assert rollout["prefill working set"] == 8_388_608_000 + 134_217_728
    update = dict((item, b) for item, b, _ in plan.phases["policy update"])
    # gathered: (root 1,089,998,336 + 2 layers * 233,057,792) * 2 bytes = 3,112,227,840,
    # plus fp32 grads of root + 1 layer: 1,323,056,128 * 4 = 5,292,224,512
    assert update["all-gathered root + 2 layers, grads"] == 8_404_452_352
    # saved activations with checkpointing, 8 rows x 4096 tokens = 32,768 tokens:
    #   layer inputs 28 * 32768 * 2 * 3584           = 6,576,668,672
    #   final norm 32768 * (4*3584 + 2*3584 + 4)     =   704,774,144
    #   scored 8*3072 = 24,576 tokens (> 512: chunked), their gathered hidden states
    #   24576*2h                                     =   176,160,768
    #   ids 32768*8 + 24576*12                       =       557,056
    assert update["saved activations, checkpointing on"] == 7_458_160_640
    # backward moment 1, logits of one chunk of 512 tokens x 152064 = 77,856,768 elements:
    # grads fp32 + bf16 (6 B) and the recomputed fp32 logits and softmax (8 B): 14 B each
    assert update["backward: logits of one chunk"] == 1_089_994_752
    # backward moment 2, one layer rebuilt: 32768 * 237,688 + mask 8*4096^2*2 = 8,056,995,840,
    # plus its gradients 32768 * 2 * (3584 + 2*18944) = 2,717,908,992; the larger moment
    assert update["backward: one layer rebuilt + its gradients"] == 10_774_904_832
    assert plan.peak_phase == "policy update"
    # peak = 47,597,603,200 + 8,404,452,352 + 7,458,160,640 + 10,774,904,832 (69.14 GiB)
    assert plan.peak == 74_235_121_024
    assert plan.fits  # 80 GiB = 85,899,345,920 bytes


def test_pass_shapes_by_hand():
    # By rows: 8 rows of 4096 columns, 8 x 3072 = 24576 tokens scored.
    assert pass_shape(8, 0, "packed", 4, 4096, 3072)[:3] == (8, 4096, 24576)
    # Packed, budget 32768 within 64 rows x 4096: n = 32768 columns in rows at most 2 x 4096
    # wide, 32768 / 8192 = 4 rows; at most those 32768 tokens scored.
    assert pass_shape(64, 32768, "packed", 1, 4096, 3072)[:3] == (4, 8192, 32768)
    # A budget below one group: the group alone, 4 x 4096 = 16384 columns.
    assert pass_shape(64, 1000, "packed", 4, 4096, 3072)[:3] == (2, 8192, 16384)
    # The rows cap: 8 rows x 100 columns = 800 < 32768; rows of min(200, 800) = 200, 4 of them;
    # at most 8 x 60 = 480 scored.
    assert pass_shape(8, 32768, "packed", 4, 100, 60)[:3] == (4, 200, 480)
    # Sorted padded rows, budget 10000 of 4096-column rows: ceil(10000 / 4096) = 3 rows for the
    # layers, at most 10000 tokens scored.
    assert pass_shape(64, 10000, "sorted", 1, 4096, 3072)[:3] == (3, 4096, 10000)


def test_paper_7b_packed_plan_by_hand(shape_7b):
    # paper-7b.yaml as shipped: packed micro-batches of at most 32768 tokens (64 sequences).
    cfg, plan = _plan(shape_7b)
    assert cfg.policy.max_tokens_per_micro_batch == cfg.prm.max_tokens_per_micro_batch == 32768
    update = dict((item, b) for item, b, _ in plan.phases["policy update"])
    # saved activations with checkpointing, 32768 tokens (4 packed rows of 8192):
    #   layer inputs 28 * 32768 * 2 * 3584           = 6,576,668,672
    #   final norm 32768 * (4*3584 + 2*3584 + 4)     =   704,774,144
    #   gathered hidden for the chunked head 32768*2h =   234,881,024
    #   ids 32768*8 + 32768*12                        =       655,360
    assert update["saved activations, checkpointing on"] == 7_516_979_200
    # logits of one chunk of 512 tokens: 512 * 152064 = 77,856,768 elements x 14 B (fp32 + bf16
    # gradients, recomputed fp32 logits and softmax)
    assert update["backward: logits of one chunk"] == 1_089_994_752
    # one layer rebuilt: 32768 * 237,688 + mask 4 rows * 8192^2 * 2 = 8,325,431,296, plus its
    # gradients 32768 * 2 * (3584 + 2*18944) = 2,717,908,992
    assert update["backward: one layer rebuilt + its gradients"] == 11_043_340_288
    # peak = 47,597,603,200 + 8,404,452,352 + 7,516,979,200 + 11,043,340,288 (69.44 GiB), 0.30
    # GiB above 8 padded rows of 4096 (test_paper_7b_plan_by_hand): the packed rows' wider mask
    # (0.25 GiB) and up to 32768 tokens scored where 8 padded rows score at most 24576.
    assert plan.peak == 74_562_375_040 and plan.peak_phase == "policy update" and plan.fits
    scoring = dict((item, b) for item, b, _ in plan.phases["scoring (no grad)"])
    assert scoring["logits of one chunk"] == 512 * 152064 * 6
    # Halving the micro-batches halves the token budgets too: at 68 GiB, once is enough
    # (a PRM micro-batch of one group, 4 x 4096 tokens, at 60.80 GiB).
    alts = dict(alternatives(cfg, shape_7b, gpus=8, gpu_mem_gib=68, prompt_len=1024, chunk=512))
    change = "policy.micro_batch_size=32 prm.micro_batch_size=32 rollout.micro_batch_size=32 " \
        "policy.max_tokens_per_micro_batch=16384 prm.max_tokens_per_micro_batch=16384"
    assert alts[change].fits and round(alts[change].peak / GIB, 2) == 60.80


def test_paper_7b_without_checkpointing_does_not_fit_and_the_alternatives(shape_7b):
    # paper-7b.yaml turns checkpointing on because of exactly this.
    cfg, plan = _plan(shape_7b, "parallel.activation_checkpointing=false", *PADDED_7B)
    assert not plan.fits and plan.peak > 250 * GIB  # 8 x 4096 tokens of activations in 28 layers
    alts = dict(alternatives(cfg, shape_7b, gpus=8, gpu_mem_gib=80, prompt_len=1024, chunk=512))
    assert not alts["parallel.cpu_offload=true"].fits  # offload does not touch activations
    assert alts["parallel.activation_checkpointing=true"].peak == 74_235_121_024  # as by hand
    both = alts["both of the above"]
    # offload moves the 2 * 16P/8 bytes of trained states to the host: 74,235,121,024 -
    # 30,462,466,048 = 43,772,654,976 per GPU; host 30,462,466,048 per GPU
    assert both.fits and both.peak == 43_772_654_976 and both.host == 2 * 16 * P / 8
    # Activations, the rollout copy and the KV cache do not shrink with more GPUs, and a
    # single row without checkpointing still does not fit.
    assert alts["more GPUs"] is None


def test_more_gpus_is_the_answer_when_only_the_sharded_part_is_too_big(shape_7b):
    cfg, plan = _plan(shape_7b, "parallel.activation_checkpointing=true", *PADDED_7B, gpu_mem=60)
    assert not plan.fits  # 69.14 GiB > 60 GiB
    alts = dict(alternatives(cfg, shape_7b, gpus=8, gpu_mem_gib=60, prompt_len=1024, chunk=512))
    # 16 GPUs: sharded states 34P/16 = 16,183,185,088 + rollout copy 2P = 15,231,233,024 +
    # policy update 26,637,517,824 = 58,051,935,936 bytes (54.07 GiB) <= 60 GiB
    assert alts["--gpus 16"].peak == 58_051_935_936
    assert alts["--gpus 16"].fits


def test_tiny_config_smaller_micro_batches_make_it_fit(tiny_model_dir):
    # Padded rows (the tiny configs pack: the next test), so that rows alone set the size.
    cfg = load_config(resolve_config("tiny"), [f"model.policy={tiny_model_dir}", *PADDED])
    shape = read_model_shape(str(tiny_model_dir))
    kw = dict(gpus=1, prompt_len=64, chunk=512)
    assert build_plan(cfg, shape, gpu_mem_gib=1.0, **kw).fits
    plan = build_plan(cfg, shape, gpu_mem_gib=0.5, **kw)
    # PRM update, fp32, 128 rows x 128 tokens: 0.88 GiB of saved activations
    assert not plan.fits and plan.peak_phase == "PRM update"
    alts = dict(alternatives(cfg, shape, gpu_mem_gib=0.5, **kw))
    # Halved once (32/64/128) is still too big; halved twice fits.
    once = ["policy.micro_batch_size=32", "prm.micro_batch_size=64", "rollout.micro_batch_size=128"]
    assert not build_plan(load_config(resolve_config("tiny"), once + PADDED), shape,
                          gpu_mem_gib=0.5, **kw).fits
    twice = "policy.micro_batch_size=16 prm.micro_batch_size=32 rollout.micro_batch_size=64"
    assert alts[twice].fits and alts["parallel.activation_checkpointing=true"].fits
    assert not alts["parallel.cpu_offload=true"].fits  # a 1 M model's states are nothing


def test_cli_prints_the_plan_for_paper_7b(qwen2_7b_dir, capsys):
    rc = main(["plan", "--config", "paper-7b", "--gpus", "8", "--gpu-mem", "80",
               f"model.policy={qwen2_7b_dir}", "parallel.activation_checkpointing=false"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "does NOT fit" in out and "what would make it fit" in out
    assert "parallel.activation_checkpointing=true" in out
    rc = main(["plan", "--config", "paper-7b", "--gpus", "8", "--gpu-mem", "80",
               "--model-config", str(qwen2_7b_dir), "parallel.activation_checkpointing=true"])
    out = capsys.readouterr().out
    # paper-7b.yaml packs (69.44 GiB: test_paper_7b_packed_plan_by_hand).
    assert rc == 0 and "peak 69.44 GiB per GPU (policy update)" in out and ": fits" in out
    assert "packed: 32768 tokens in rows of <= 8192" in out
    for bad in ("nan", "inf"):  # nan planned "headroom nan GiB" and exited 0
        rc = main(["plan", "--config", "paper-7b", "--gpus", "8", "--gpu-mem", bad,
                   "--model-config", str(qwen2_7b_dir)])
        assert rc == 2 and "--gpu-mem must be positive" in capsys.readouterr().err


def test_unreadable_model_config_is_one_clear_line(tmp_path, capsys):
    rc = main(["plan", "--config", "paper-7b", "--model-config", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "missing" in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot read the model config of .*empty"):
        read_model_shape(str(tmp_path / "empty"))


def test_an_unreachable_hub_id_says_to_give_model_config(monkeypatch):
    # paper-7b's model.policy is a hub id: offline its config.json cannot be fetched. One request
    # with a timeout says so (transformers' own retries took 26 s offline), and the line says
    # what to do instead (a walkthrough saw the bare network error).
    import huggingface_hub

    asked = []

    def model_info(name, timeout=None):
        asked.append((name, timeout))
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    with pytest.raises(ConfigError, match="model.policy: 'PRIME-RL/Eurus-2-7B-SFT' is no local "
                       "directory and no cached hub model, and the hub cannot confirm it "
                       "\\(OSError\\); check the path, or give --model-config with a local "
                       "copy of its config.json"):
        read_model_shape("PRIME-RL/Eurus-2-7B-SFT", field="model.policy")
    assert asked == [("PRIME-RL/Eurus-2-7B-SFT", 10)]
    # A config the hub lists but that cannot be read (here: the read itself fails) is named with
    # the same advice.
    monkeypatch.setattr(huggingface_hub, "model_info", lambda name, timeout=None: None)

    def unreadable(source, trust_remote_code=False):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr("primekit.models.hf.load_model_config", unreadable)
    with pytest.raises(ConfigError, match="\\(a hub id: its config.json is downloaded; "
                       "offline, give --model-config\\) \\(We couldn't connect"):
        read_model_shape("PRIME-RL/Eurus-2-7B-SFT", field="model.policy")


def test_models_held_follow_the_config(shape_7b):
    # PPO: a trained critic (value head h + 1 instead of the lm head) and its update phase.
    _, plan = _plan(shape_7b, "algorithm.estimator=ppo")
    rows = dict((item, b) for item, b, _ in plan.persistent)
    critic = mem.model_params(shape_7b, "value")
    assert critic == P - 152064 * 3584 + 3584 + 1
    assert rows["critic: AdamW state (fp32, 2 moments)"] == 8 * critic / 8
    assert "critic update" in plan.phases
    # A frozen PRM is stored in the compute dtype, sharded, and has no update phase.
    _, plan = _plan(shape_7b, "prm.update=frozen", "model.prm=some/prm")
    rows = dict((item, b) for item, b, _ in plan.persistent)
    assert rows["PRM: weights (bfloat16, frozen)"] == 2 * P / 8 and "PRM update" not in plan.phases
    # Outcome-only RLOO: no PRM and no reference; vLLM reserves the config's share of the GPU
    # (it read a field that does not exist and always planned vLLM's own default, 0.9).
    _, plan = _plan(shape_7b, "algorithm.reward_mode=outcome", "rollout.backend=vllm",
                    "rollout.vllm_gpu_memory_utilization=0.3")
    rows = dict((item, b) for item, b, _ in plan.persistent)
    assert set(rows) == {"policy: parameters (fp32 master)", "policy: gradients (fp32)",
                         "policy: AdamW state (fp32, 2 moments)", "rollout: vLLM reservation"}
    assert rows["rollout: vLLM reservation"] == 0.3 * 80 * GIB


def test_rollout_rows_are_the_largest_round_capped_by_the_micro_batch():
    from primekit.plan import rollout_rows

    def rows(*overrides: str, gpus: int = 1) -> int:
        return rollout_rows(load_config(resolve_config("tiny"), list(overrides)), gpus)

    # the filter off: one round of every prompt, 4 prompts x 4 samples = 16 rows (below 256)
    assert rows("filter.enabled=false", "train.prompts_per_step=4") == 16
    # the filter on: at the lowest pass rate (0.1) a round samples 4 x 1.5 / 0.1 = 60 prompts,
    # 240 rows; 5 prompts: ceil(75.0) = 75 prompts, 300 rows, capped at 256
    assert rows("train.prompts_per_step=4") == 240
    assert rows("train.prompts_per_step=5") == 256
    # each of 8 ranks samples its ceil(33 / 8) = 5 prompts: filter off, 5 x 4 = 20 rows
    assert rows("filter.enabled=false", "train.prompts_per_step=33", gpus=8) == 20


def test_a_sequence_past_the_models_context_is_named(tiny_model_dir, capsys):
    # The tiny model takes 512 positions; --prompt-len's default (1024, verl's PRIME recipe) plus
    # 64 new tokens plans sequences it cannot run. The title names a 1 M model in M, not 0.00 B.
    assert read_model_shape(str(tiny_model_dir)).context == 512
    argv = ["plan", "--config", "tiny", "--gpus", "1", "--gpu-mem", "80",
            f"model.policy={tiny_model_dir}"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(1.08 M params)" in out
    assert ("note: the planned sequence (1024 prompt + 64 new tokens = 1088) is longer than the "
            "model takes (512 positions, max_position_embeddings)") in " ".join(out.split())
    assert "give --prompt-len at most 448" in " ".join(out.split())
    assert main([*argv, "--prompt-len", "64"]) == 0
    assert "note: the planned sequence" not in capsys.readouterr().out
