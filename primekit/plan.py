"""`primekit plan`: per-GPU memory of a run's config, whether it fits, and what would make it fit.

The arithmetic is in `primekit.models.memory`; this module decides which models a config holds
and in which phase of the RL step each tensor lives, then prints the table. Peak per GPU =
persistent states (every model's shards, the rollout engine's weights) + the largest transient of
one phase (rollout, no-grad scoring, policy update, PRM update, critic update): the phases of a
step run one after another, so their transients never coexist.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from math import ceil
from pathlib import Path
from typing import NamedTuple

from primekit.algorithms import ESTIMATORS
from primekit.config import Config, ConfigError
from primekit.models import memory as mem
from primekit.rollout.batching import PACKED_ROW_FACTORS
from primekit.trainer.collect import MIN_PASS_RATE, round_prompts

MAX_GPUS = 1024  # the "more GPUs" search stops here
NOT_COUNTED = "not counted"


def logprob_chunk(vocab: int) -> int:
    """Scored tokens per lm_head chunk of `sequence_logprobs` for a vocabulary of `vocab` (its
    default, `head_chunk_tokens`)."""
    from primekit.models.logprobs import head_chunk_tokens

    return head_chunk_tokens(vocab)


def read_model_shape(source: str, trust_remote_code: bool = False,
                     field: str = "--model-config") -> mem.ModelShape:
    """The ModelShape of a local directory, a config.json file or a hub id (transformers
    AutoConfig), or a one-line ConfigError naming the source and the `field` it came from."""
    from primekit.models.hf import load_model_config
    from primekit.validate import check_hub_model

    if not Path(source).expanduser().exists():  # a hub id: one request, not a minute of retries
        check_hub_model(source, field, "give --model-config with a local copy of its config.json")
    try:
        config = load_model_config(source, trust_remote_code=trust_remote_code)
        return mem.shape_from_hf_config(config)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hub = "" if Path(source).expanduser().exists() else (
            " (a hub id: its config.json is downloaded; offline, give --model-config)")
        raise ConfigError(f"{field}: cannot read the model config of {source!r}{hub} ({first}); "
                          "--model-config takes a model directory or its config.json") from None


@dataclass
class Plan:
    """Per-GPU bytes: `persistent` rows live all step, `phases` rows only in their phase."""

    gpus: int
    gpu_mem: float  # bytes
    persistent: list[tuple[str, float, str]] = field(default_factory=list)  # (item, bytes, note)
    # Rows of a phase; a row whose note starts with "not counted" is shown but not summed (the
    # activations of the checkpointing setting the config does not use).
    phases: dict[str, list[tuple[str, float, str]]] = field(default_factory=dict)
    host: float = 0.0  # host bytes per GPU (cpu_offload)
    replicated: float = 0.0  # per-GPU bytes that more GPUs do not shrink

    @property
    def persistent_bytes(self) -> float:
        return sum(b for _, b, _ in self.persistent)

    def phase_bytes(self, phase: str) -> float:
        return sum(b for _, b, note in self.phases[phase] if not note.startswith(NOT_COUNTED))

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_bytes)

    @property
    def peak(self) -> float:
        return self.persistent_bytes + self.phase_bytes(self.peak_phase)

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_mem


def prm_rows(cfg: Config) -> int:
    """PRM micro-batch rows: rounded down to whole groups of K, at least one group (row_chunks)."""
    k = cfg.rollout.n_samples
    return max(k, cfg.prm.micro_batch_size // k * k)


class PassShape(NamedTuple):
    """The largest micro-batch of one model pass, as `primekit.models.memory` takes it: `rows`
    rows of `seq` columns for the layers, `scored` tokens in all for the output head."""

    rows: int
    seq: int
    scored: int
    note: str


def pass_shape(rows: int, budget: int, packing: str, group: int, seq: int,
               response: int) -> PassShape:
    """The largest micro-batch of a pass cut by `rollout.batching.iter_layout`, for sequences
    of at most `seq` tokens of which at most `response` are scored.

    By rows (budget 0): `rows` padded rows of seq columns, rows*response scored tokens. By a
    token budget B: the columns a micro-batch computes, padding included, stay within B (a
    single group of `group` rows may exceed it alone) and within rows x seq, n = min(rows*seq,
    max(B, group*seq)), with at most min(n, rows*response) tokens scored. Packed, the n columns
    lie in rows at most max(PACKED_ROW_FACTORS) = 2x the longest sequence wide, C = min(2*seq,
    n), so n/C rows of C for the layers (the attention mask is [n/C, C, C]); length-sorted padded
    rows are n/seq rows of seq."""
    if budget <= 0:
        return PassShape(rows, seq, rows * response, f"{rows} rows x {seq} tokens")
    n = min(rows * seq, max(budget, group * seq))
    scored = min(n, rows * response)
    if packing == "packed":
        width = min(int(max(PACKED_ROW_FACTORS) * seq), n)
        return PassShape(ceil(n / width), width, scored,
                         f"packed: {n} tokens in rows of <= {width}")
    return PassShape(ceil(n / seq), seq, scored, f"sorted: {n} tokens, <= {rows} rows")


def policy_pass(cfg: Config, seq: int) -> PassShape:
    """The policy's (and critic's, and the old log-probs') largest micro-batch."""
    p = cfg.policy
    return pass_shape(p.micro_batch_size, p.max_tokens_per_micro_batch, p.packing, 1, seq,
                      cfg.rollout.max_new_tokens)


def prm_pass(cfg: Config, seq: int) -> PassShape:
    """The implicit PRM's (and the reference's) largest micro-batch: whole groups of K."""
    return pass_shape(prm_rows(cfg), cfg.prm.max_tokens_per_micro_batch, cfg.prm.packing,
                      cfg.rollout.n_samples, seq, cfg.rollout.max_new_tokens)


def build_plan(cfg: Config, shape: mem.ModelShape, *, gpus: int, gpu_mem_gib: float,
               prompt_len: int, chunk: int) -> Plan:
    """The per-GPU memory plan of `cfg` on `gpus` GPUs of `gpu_mem_gib` GiB each.

    Every model is assumed to have the policy's architecture (PRIME initialises the PRM,
    reference and critic from the policy's checkpoint).
    """
    if gpus < 1 or prompt_len < 1 or not 0 < gpu_mem_gib < math.inf:  # nan fails both
        raise ConfigError(f"--gpus, --prompt-len and --gpu-mem must be positive (and finite), "
                          f"got {gpus}, {prompt_len}, {gpu_mem_gib}")
    a = cfg.algorithm
    plan = Plan(gpus=gpus, gpu_mem=gpu_mem_gib * mem.GIB)
    critic = ESTIMATORS[a.estimator].critic
    prm_online = a.reward_mode == "prime" and cfg.prm.update == "online"
    _model_states(plan, cfg, shape, critic=critic, prm_online=prm_online)
    engine = _rollout_phase(plan, cfg, shape, prompt_len)
    _scoring_phase(plan, cfg, shape, prompt_len, chunk)
    seq = prompt_len + cfg.rollout.max_new_tokens
    plan.phases["policy update"] = _update_phase(cfg, shape, chunk, policy_pass(cfg, seq), "lm",
                                                 entropy=True)
    if prm_online:
        plan.phases["PRM update"] = _update_phase(cfg, shape, chunk, prm_pass(cfg, seq), "lm",
                                                  entropy=False)
    if critic:
        plan.phases["critic update"] = _update_phase(cfg, shape, chunk, policy_pass(cfg, seq),
                                                     "value", entropy=False)
    plan.replicated = engine + max(plan.phase_bytes(p) for p in plan.phases)
    return plan


def _model_states(plan: Plan, cfg: Config, shape: mem.ModelShape, *, critic: bool,
                  prm_online: bool) -> None:
    """The persistent rows of every model: sharded fp32 params, grads and AdamW of the trained
    ones (host memory under cpu_offload), compute-dtype weights of the frozen ones."""
    a, gpus = cfg.algorithm, plan.gpus
    cb = mem.DTYPE_BYTES[cfg.model.dtype]
    P = mem.model_params(shape)
    per = f"1/{gpus} per GPU"

    def trained(name: str, params: int) -> None:
        states = mem.trained_state_bytes(params, gpus)
        if cfg.parallel.cpu_offload:
            plan.host += sum(states.values())
            plan.persistent.append((f"{name}: params + grads + AdamW (fp32)", 0.0,
                                    f"cpu_offload: {sum(states.values()) / mem.GIB:.2f} GiB "
                                    "in host memory"))
            return
        plan.persistent += [
            (f"{name}: parameters (fp32 master)", states["params"], f"{params / 1e9:.3f} B, {per}"),
            (f"{name}: gradients (fp32)", states["grads"], per),
            (f"{name}: AdamW state (fp32, 2 moments)", states["optimizer"], per)]

    def frozen(name: str, params: int) -> None:
        plan.persistent.append((f"{name}: weights ({cfg.model.dtype}, frozen)",
                                mem.frozen_state_bytes(params, cb, gpus), per))

    trained("policy", P)
    if critic:
        trained("critic", mem.model_params(shape, "value"))
    if a.reward_mode == "prime":
        (trained if prm_online else frozen)("PRM", P)
    elif a.reward_mode != "outcome":
        frozen("explicit reward model", P)
    if (a.reward_mode == "prime" and cfg.prm.reference == "sft") or a.kl_coef > 0:
        frozen("reference", P)


def rollout_rows(cfg: Config, gpus: int) -> int:
    """Rows of the HF engine's largest micro-batch on one rank: the largest rollout round
    (`round_prompts` at the lowest pass rate, for this rank's share of train.prompts_per_step)
    times rollout.n_samples, capped by rollout.micro_batch_size."""
    need = ceil(cfg.train.prompts_per_step / gpus)  # as the trainer's collect
    largest = round_prompts(need, cfg.filter, MIN_PASS_RATE) * cfg.rollout.n_samples
    return min(cfg.rollout.micro_batch_size, largest)


def _rollout_phase(plan: Plan, cfg: Config, shape: mem.ModelShape, prompt_len: int) -> float:
    """The rollout engine's persistent bytes (returned) and its phase. The HF engine samples from
    a full copy of the policy in the compute dtype; vLLM reserves its share of the GPU for
    weights and KV cache together."""
    cb = mem.DTYPE_BYTES[cfg.model.dtype]
    if cfg.rollout.backend == "vllm":
        util = cfg.rollout.vllm_gpu_memory_utilization
        engine = util * plan.gpu_mem
        plan.persistent.append(("rollout: vLLM reservation", engine,
                                f"rollout.vllm_gpu_memory_utilization {util}: weights + KV "
                                f"cache"))
        plan.phases["rollout"] = [("KV cache", 0.0, "inside the vLLM reservation")]
        return engine
    engine = mem.model_params(shape) * cb
    rows, seq = rollout_rows(cfg, plan.gpus), prompt_len + cfg.rollout.max_new_tokens
    plan.persistent.append(("rollout: policy weights (full copy)", engine,
                            f"{cfg.model.dtype}, unsharded"))
    plan.phases["rollout"] = [
        ("KV cache", mem.kv_cache_bytes(shape, rows, seq, cb),
         f"{rows} rows x {seq} tokens"),
        ("prefill working set", mem.forward_working_bytes(shape, rows, prompt_len, cb),
         f"{rows} rows x {prompt_len} prompt tokens")]
    return engine


def _scoring_phase(plan: Plan, cfg: Config, shape: mem.ModelShape, prompt_len: int,
                   chunk: int) -> None:
    """No-grad forwards: old-policy log-probs, reference, PRM scoring, critic values; in the
    larger of the policy's and the PRM's micro-batches."""
    cb = mem.DTYPE_BYTES[cfg.model.dtype]
    seq = prompt_len + cfg.rollout.max_new_tokens
    passes = [policy_pass(cfg, seq)]
    if cfg.algorithm.reward_mode == "prime":
        passes.append(prm_pass(cfg, seq))

    work = max(passes, key=lambda p: mem.forward_working_bytes(shape, p.rows, p.seq, cb))
    c = min(max(p.scored for p in passes), chunk)  # the head's largest chunk, in tokens
    plan.phases["scoring (no grad)"] = [
        ("all-gathered root + 2 layers", mem.gathered_bytes(shape, cb, trained=False),
         cfg.model.dtype),
        ("forward working set", mem.forward_working_bytes(shape, work.rows, work.seq, cb),
         work.note),
        ("logits of one chunk", c * shape.vocab * (cb + mem.FP32),
         f"[{c}, {shape.vocab}] {cfg.model.dtype} + fp32")]


def _update_phase(cfg: Config, shape: mem.ModelShape, chunk: int, mb: PassShape, head: str, *,
                  entropy: bool) -> list:
    """The rows of one training phase (policy, PRM or critic update) over micro-batches no
    larger than `mb`: the gathered layers with their gradients, the saved activations with
    checkpointing off and on (the configured one counted), the larger backward moment."""
    cb = mem.DTYPE_BYTES[cfg.model.dtype]
    ckpt = cfg.parallel.activation_checkpointing
    c = min(mb.scored, chunk)
    kw = dict(entropy=entropy, chunk=chunk, head=head)
    onoff = {False: "off", True: "on"}
    items = [("all-gathered root + 2 layers, grads", mem.gathered_bytes(
        shape, cb, trained=True, head=head), f"{cfg.model.dtype} params, fp32 grads")]
    for on in (False, True):
        saved = mem.saved_activation_bytes(shape, mb.rows, mb.seq, mb.scored, cb,
                                           checkpointing=on, **kw)
        peak = mem.activation_peak_bytes(shape, mb.rows, mb.seq, mb.scored, cb,
                                         checkpointing=on, **kw)
        where = mb.note if on == ckpt else f"{NOT_COUNTED} (checkpointing {onoff[ckpt]})"
        items.append((f"saved activations, checkpointing {onoff[on]}", saved,
                      f"{where}; with the backward: {peak / mem.GIB:.2f} GiB"))
    moments = mem.backward_moments(shape, mb.rows, mb.seq, mb.scored, cb, checkpointing=ckpt,
                                   **kw)
    larger = max(moments, key=moments.get)
    labels = {"logits": ("backward: logits of one chunk",
                         f"[{c}, {shape.vocab}] fp32 + {cfg.model.dtype}"),
              "layer": ("backward: one layer rebuilt + its gradients" if ckpt
                        else "backward: one layer's gradients", "")}
    for key, (label, note) in labels.items():
        if key == "logits" and head != "lm":
            continue
        if key != larger:
            note = f"{NOT_COUNTED}: the other backward moment is larger"
        items.append((label, moments[key], note))
    return items


def _with(cfg: Config, **changes: object) -> Config:
    """A copy of cfg with dotted fields changed: _with(cfg, **{"parallel.cpu_offload": True})."""
    out = copy.deepcopy(cfg)
    for dotted, value in changes.items():
        section, name = dotted.split(".")
        setattr(getattr(out, section), name, value)
    return out


def alternatives(cfg: Config, shape: mem.ModelShape, *, gpus: int, gpu_mem_gib: float,
                 prompt_len: int, chunk: int) -> list[tuple[str, Plan | None]]:
    """Each switch that could make the plan fit, computed: offload, checkpointing, both, smaller
    micro-batches (rows and token budgets halved together until they fit), more GPUs (doubled
    until they fit).
    A None plan means no setting of that switch fits."""
    def plan_of(c: Config, n: int = gpus) -> Plan:
        return build_plan(c, shape, gpus=n, gpu_mem_gib=gpu_mem_gib, prompt_len=prompt_len,
                          chunk=chunk)

    par, out = cfg.parallel, []
    if not par.cpu_offload:
        out.append(("parallel.cpu_offload=true", plan_of(_with(cfg, **{"parallel.cpu_offload":
                                                                       True}))))
    if not par.activation_checkpointing:
        out.append(("parallel.activation_checkpointing=true",
                    plan_of(_with(cfg, **{"parallel.activation_checkpointing": True}))))
    if not par.cpu_offload and not par.activation_checkpointing:
        out.append(("both of the above", plan_of(_with(
            cfg, **{"parallel.cpu_offload": True, "parallel.activation_checkpointing": True}))))
    sizes = {"policy.micro_batch_size": cfg.policy.micro_batch_size,
             "prm.micro_batch_size": cfg.prm.micro_batch_size,
             "rollout.micro_batch_size": cfg.rollout.micro_batch_size}
    for budget in ("policy.max_tokens_per_micro_batch", "prm.max_tokens_per_micro_batch"):
        section, name = budget.split(".")
        if getattr(getattr(cfg, section), name) > 0:  # token budgets are halved with the rows
            sizes[budget] = getattr(getattr(cfg, section), name)
    found: tuple[str, Plan | None] = ("smaller micro-batches (halved together)", None)
    while max(sizes.values()) > 1:
        sizes = {k: max(1, v // 2) for k, v in sizes.items()}
        p = plan_of(_with(cfg, **sizes))
        if p.fits:
            found = (" ".join(f"{k}={v}" for k, v in sizes.items()), p)
            break
    out.append(found)
    found = ("more GPUs", None)
    n = gpus * 2
    while n <= MAX_GPUS:
        p = plan_of(cfg, n)
        if p.fits:
            found = (f"--gpus {n}", p)
            break
        n *= 2
    out.append(found)
    return out


def print_plan(cfg: Config, plan: Plan, alts: list[tuple[str, Plan | None]], *,
               title: str, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 120))
    gib = mem.GIB
    table = Table(title=title)
    for col in ("phase", "item", "GiB per GPU", "note"):
        table.add_column(col, justify="right" if col == "GiB per GPU" else "left")
    for k, (item, b, note) in enumerate(plan.persistent):
        table.add_row("" if k else "all step", item, f"{b / gib:.2f}", note)
    table.add_row("", "[bold]persistent total", f"[bold]{plan.persistent_bytes / gib:.2f}",
                  "", end_section=True)
    for phase, items in plan.phases.items():
        for k, (item, b, note) in enumerate(items):
            table.add_row("" if k else phase, item, f"{b / gib:.2f}", note)
        peak = " (peak)" if phase == plan.peak_phase else ""
        table.add_row("", f"[bold]persistent + this phase{peak}",
                      f"[bold]{(plan.persistent_bytes + plan.phase_bytes(phase)) / gib:.2f}", "",
                      end_section=True)
    console.print(table)
    verdict = "fits" if plan.fits else "does NOT fit"
    console.print(f"peak {plan.peak / gib:.2f} GiB per GPU ({plan.peak_phase}) vs --gpu-mem "
                  f"{plan.gpu_mem / gib:g} GiB: {verdict} "
                  f"(headroom {(plan.gpu_mem - plan.peak) / gib:.2f} GiB; CUDA context, NCCL "
                  "buffers and allocator fragmentation are not counted)")
    if plan.host:
        console.print(f"host memory for offloaded states: {plan.host / gib:.2f} GiB per GPU, "
                      f"{plan.host * plan.gpus / gib:.2f} GiB over {plan.gpus} GPUs")
    if plan.fits:
        return
    alt = Table(title="what would make it fit")
    for col in ("change", "peak GiB per GPU", "peak phase", "fits"):
        alt.add_column(col)
    for label, p in alts:
        if p is None:
            if label == "more GPUs":
                why = f"no: {plan.replicated / gib:.2f} GiB per GPU does not shrink with more GPUs"
            else:
                why = "no: not even at 1 row"
                if "PRM update" in plan.phases:  # PRM micro-batches hold whole groups of K
                    why += f" (a PRM micro-batch is at least {cfg.rollout.n_samples} rows)"
            alt.add_row(label, "-", "-", why)
        else:
            alt.add_row(label, f"{p.peak / gib:.2f}", p.peak_phase, "yes" if p.fits else "no")
    console.print(alt)


def run_plan(cfg: Config, *, gpus: int, gpu_mem_gib: float, prompt_len: int,
             model_config: str | None = None, console=None) -> Plan:
    """Read the model config, build the plan and its alternatives, print them; returns the plan."""
    source = model_config or cfg.model.policy
    shape = read_model_shape(source, cfg.model.trust_remote_code,
                             "--model-config" if model_config else "model.policy")
    chunk = logprob_chunk(shape.vocab)
    plan = build_plan(cfg, shape, gpus=gpus, gpu_mem_gib=gpu_mem_gib, prompt_len=prompt_len,
                      chunk=chunk)
    alts = [] if plan.fits else alternatives(cfg, shape, gpus=gpus, gpu_mem_gib=gpu_mem_gib,
                                             prompt_len=prompt_len, chunk=chunk)
    params = mem.model_params(shape)
    size = f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.2f} M"
    title = (f"memory plan per GPU: {source} ({size} params), {gpus} GPUs, {cfg.model.dtype}, "
             f"sequence {prompt_len}+{cfg.rollout.max_new_tokens}")
    print_plan(cfg, plan, alts, title=title, console=console)
    sequence = prompt_len + cfg.rollout.max_new_tokens
    if shape.context is not None and sequence > shape.context:
        from primekit.logging import console as default_console

        (console or default_console).print(
            f"note: the planned sequence ({prompt_len} prompt + {cfg.rollout.max_new_tokens} new "
            f"tokens = {sequence}) is longer than the model takes ({shape.context} positions, "
            f"max_position_embeddings): the plan is for sequences this model cannot run; give "
            f"--prompt-len at most {max(shape.context - cfg.rollout.max_new_tokens, 1)}",
            markup=False, highlight=False, soft_wrap=True)
    return plan
