"""The toy reward-hacking model behind `primekit sim`: PRIME on three solution paths.

The PRIME explainer's worked path, as a model small enough to step in microseconds:

Paths. A response to the (one, repeated) problem is one of three paths, each L steps long
(`steps_per_response`): `sound` (correct reasoning, the verifier accepts it), `shortcut` (a fluent
answer that looks right but rests on wrong reasoning; the verifier rejects it) and `wrong`
(visibly wrong; rejected). Outcomes o = (1, 0, 0).

Policy. Logits theta over the paths, pi = softmax(theta) over the paths it can write. Until
`inject_shortcut` it cannot write the shortcut (probability 0); injecting gives the shortcut
`inject_mass` of the policy's probability, as a policy that has just discovered it. The reference
pi_ref = softmax(theta_ref) is the starting policy and writes the shortcut rarely (~2%).

Implicit PRM. A language model over the same paths whose per-step distribution is
    pi_phi(k) = pi_ref(k) * exp(w . f_k) / Z(w),   Z(w) = sum_j pi_ref(j) exp(w . f_j)
with surface features f_k = (answer looks right, reasoning valid, fluent): sound (1, 1, 0),
shortcut (1, 0, 1), wrong (0, 0, 0). Its reward is PRIME's implicit reward (Eq. 3) summed over
the L steps of a path:
    r_k = beta * L * (log pi_phi(k) - log pi_ref(k)) = beta * L * (w . f_k - log Z(w))
and its success prediction is sigmoid(r_k), the quantity its cross-entropy loss trains (Eq. 4).
It starts as a PRM trained before the shortcut existed: w0 = (2, 0, 1), it pays for answers that
look right and for fluency, and has never needed the reasoning feature. Online, each step takes a
gradient step of size `prm_lr` on the mean CE of the sampled batch against the verifier:
    dCE/dw = mean_i (sigmoid(r_i) - o_i) * beta * L * (f_i - E_phi[f]).
Frozen, w stays at w0.

Policy update. Each step samples B groups (`groups`) of K paths (`samples`), computes PRIME's
RLOO advantage (Eq. 5; for a path the decision is its first step, whose return is the whole
path's, so Eq. 5 reduces to)
    A_i = (r_i - mean_{j != i} r_j) + (o_i - mean_{j != i} o_j)
and takes a policy-gradient step theta += policy_lr * mean_i A_i * (e_{y_i} - pi).

Readouts (exact expectations under the current policy, so curves are not sampling noise):
true accuracy pi(sound); reported reward sum_k pi(k) sigmoid(r_k), the success rate the PRM
reports; PRM accuracy sum_k pi(k) [ (r_k > 0) == (o_k = 1) ] (like `prm/acc_abs`); the hacking
gap = reported reward - true accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from primekit.config import SimConfig

PATHS = ("sound", "shortcut", "wrong")
SOUND, SHORTCUT, WRONG = 0, 1, 2
OUTCOMES = np.array([1.0, 0.0, 0.0])  # the verifier's verdict on each path
# Surface features the PRM sees: (answer looks right, reasoning valid, fluent).
FEATURES = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])  # [paths, features]
REF_LOGITS = np.array([0.0, -3.0, 0.0])  # pi_ref = (0.488, 0.024, 0.488)
PRM_INIT = np.array([2.0, 0.0, 1.0])  # w0: trained before the shortcut existed
PRESETS = {
    # Identical but for the toggle, so the toggle alone explains the difference. A preset (and
    # Reset) also restores the knobs to the configured sim.beta and sim.prm_lr (`preset_knobs`).
    "online": {"prm_mode": "online"},
    "frozen": {"prm_mode": "frozen"},
}
# The knobs the page turns mid-run, and their bounds (inclusive). Within them the dynamics stay
# finite: the PRM's CE step is at most prm_lr * beta * L * |f - E f| per step, the log-sums are
# computed stably, and a step whose result would not be finite is refused (`Sim.step`).
KNOB_BOUNDS = {"beta": (0.01, 2.0), "prm_lr": (0.0, 1.0)}
KNOB_NAMES = {"beta": "reward weight beta", "prm_lr": "PRM update rate"}


class KnobError(ValueError):
    """A knob value outside its bounds or not a number; `.field` names the knob."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_knob(name: str, value: object) -> float:
    """The knob's value as a float, or KnobError naming the knob, its bounds and the value."""
    if name not in KNOB_BOUNDS:
        raise KnobError(name, f"unknown knob {name!r}; the knobs are {sorted(KNOB_BOUNDS)}")
    lo, hi = KNOB_BOUNDS[name]
    x = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        x = float(value)
    elif isinstance(value, str) and value.strip():
        try:
            x = float(value)
        except ValueError:
            x = None
    if x is None or not math.isfinite(x) or not lo <= x <= hi:
        got = "nothing" if value is None or value == "" else repr(value)
        raise KnobError(name, f"{name} ({KNOB_NAMES[name]}) must be a number in [{lo:g}, "
                              f"{hi:g}], got {got}")
    return x


def preset_knobs(name: str, cfg: SimConfig) -> dict:
    """The knob values and PRM mode preset `name` starts from (the configured beta and rate)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return {"beta": cfg.beta, "prm_lr": cfg.prm_lr, **PRESETS[name]}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # = 1 / (1 + exp(-x)), without overflow


def _softmax(logits: np.ndarray, available: np.ndarray) -> np.ndarray:
    z = np.where(available, logits, -np.inf)
    z = np.exp(z - z.max())
    return z / z.sum()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - float(np.logaddexp.reduce(x))


def path_rewards(w: np.ndarray, beta: float, steps: int) -> np.ndarray:
    """r_k = beta * L * (w . f_k - log Z(w)), the implicit reward of each whole path. [3]
    log Z(w) = logsumexp_j(log pi_ref(j) + w . f_j), so a large w cannot overflow."""
    log_ref = _log_softmax(REF_LOGITS)
    scores = FEATURES @ w  # [3]
    log_z = float(np.logaddexp.reduce(log_ref + scores))
    return beta * steps * (scores - log_z)


def rloo(x: np.ndarray) -> np.ndarray:
    """x_i - mean_{j != i} x_j within each group; x [B, K] -> [B, K]."""
    k = x.shape[1]
    return x - (x.sum(1, keepdims=True) - x) / (k - 1)


@dataclass
class Sim:
    """One toy PRIME run: the state, `step()`, and the knobs the page turns mid-run."""

    cfg: SimConfig
    theta: np.ndarray = field(default_factory=lambda: REF_LOGITS.copy())
    w: np.ndarray = field(default_factory=lambda: PRM_INIT.copy())
    available: np.ndarray = field(default_factory=lambda: np.array([True, False, True]))
    t: int = 0
    history: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.cfg.seed)
        self.history.append(self.readout())

    @classmethod
    def preset(cls, name: str, cfg: SimConfig) -> Sim:
        """A fresh run of preset `name`: its PRM mode, and the knobs `cfg` configures."""
        return cls(replace(cfg, **preset_knobs(name, cfg)))

    # ------------------------------------------------------------------ readouts
    def policy(self) -> np.ndarray:
        return _softmax(self.theta, self.available)

    def rewards(self) -> np.ndarray:
        return path_rewards(self.w, self.cfg.beta, self.cfg.steps_per_response)

    def readout(self) -> dict:
        pi, r = self.policy(), self.rewards()
        accuracy = float(pi[SOUND])
        reported = float(pi @ _sigmoid(r))
        prm_correct = (r > 0) == (OUTCOMES == 1)  # [3]
        return {"step": self.t, "accuracy": accuracy, "reported": reported,
                "prm_accuracy": float(pi @ prm_correct), "gap": reported - accuracy,
                "policy": pi.round(4).tolist(), "rewards": r.round(4).tolist(),
                "prm_online": self.cfg.prm_mode == "online"}

    # ------------------------------------------------------------------ dynamics
    def step(self) -> dict:
        """One RL step: sample, PRM update (online), RLOO advantage, policy-gradient step.

        The new state is computed aside and kept only if every number in it is finite: a step
        that would not be raises FloatingPointError and leaves the run as it was."""
        c = self.cfg
        state = self.rng.bit_generator.state
        with np.errstate(over="ignore", invalid="ignore"):  # checked below
            pi = self.policy()
            y = self.rng.choice(3, size=(c.groups, c.samples), p=pi)  # [B, K] path indices
            o = OUTCOMES[y]  # [B, K]
            r = self.rewards()[y]  # [B, K] rewards before the PRM update (single forward)
            w = self.w
            if c.prm_mode == "online" and c.prm_lr > 0:
                w = self.w - c.prm_lr * self._ce_grad(y.ravel(), o.ravel())
            adv = rloo(r) + rloo(o)  # [B, K]
            grad = np.zeros(3)
            np.add.at(grad, y.ravel(), adv.ravel())
            grad -= adv.sum() * pi  # sum_i A_i (e_{y_i} - pi)
            theta = self.theta + c.policy_lr * grad / y.size
            old = self.theta, self.w
            self.theta, self.w = theta, w
            out = {**self.readout(), "step": self.t + 1}
        if not (np.isfinite(theta).all() and np.isfinite(w).all() and _finite(out)):
            self.theta, self.w = old
            self.rng.bit_generator.state = state
            raise FloatingPointError(f"step {self.t + 1} would make the toy's state non-finite "
                                     f"(beta {c.beta:g}, PRM update rate {c.prm_lr:g}); not taken")
        self.t += 1
        self.history.append(out)
        return out

    def _ce_grad(self, y: np.ndarray, o: np.ndarray) -> np.ndarray:
        c = self.cfg
        phi = np.exp(_log_softmax(_log_softmax(REF_LOGITS) + FEATURES @ self.w))  # pi_phi, [3]
        dr_dw = c.beta * c.steps_per_response * (FEATURES - phi @ FEATURES)  # [3, features]
        err = _sigmoid(self.rewards()[y]) - o  # [n]
        return (err[:, None] * dr_dw[y]).mean(0)

    # ------------------------------------------------------------------ controls
    def inject_shortcut(self) -> None:
        """The policy discovers the shortcut: it gets `inject_mass` of the probability."""
        if not self.available[SHORTCUT]:
            m = self.cfg.inject_mass
            others = self.theta[self.available]
            self.theta[SHORTCUT] = math.log(m / (1 - m)) + float(np.logaddexp.reduce(others))
            self.available[SHORTCUT] = True
        self.events.append({"step": self.t, "event": "inject shortcut"})

    def set_mode(self, mode: str) -> None:
        if mode not in ("online", "frozen"):
            raise ValueError(f"PRM mode must be 'online' or 'frozen', got {mode!r}")
        self.cfg = replace(self.cfg, prm_mode=mode)
        self.events.append({"step": self.t, "event": f"PRM {mode}"})

    def set_knobs(self, **knobs: object) -> None:
        """beta and prm_lr, mid-run, each within KNOB_BOUNDS; a bad value raises KnobError and
        sets nothing."""
        self.cfg = replace(self.cfg, **{k: check_knob(k, v) for k, v in knobs.items()})


def _finite(x: object) -> bool:
    """Every number in a readout (nested lists and dicts) is finite."""
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list | tuple):
        return all(_finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


def run(cfg: SimConfig, steps: int, inject_at: int | None = 0) -> Sim:
    """A whole run without the page: `steps` steps, the shortcut injected before step
    `inject_at` (None: never)."""
    sim = Sim(cfg)
    for t in range(steps):
        if t == inject_at:
            sim.inject_shortcut()
        sim.step()
    return sim
