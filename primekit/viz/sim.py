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
    # Identical but for the toggle, so the toggle alone explains the difference.
    "online": {"prm_mode": "online"},
    "frozen": {"prm_mode": "frozen"},
}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(logits: np.ndarray, available: np.ndarray) -> np.ndarray:
    z = np.where(available, logits, -np.inf)
    z = np.exp(z - z.max())
    return z / z.sum()


def path_rewards(w: np.ndarray, beta: float, steps: int) -> np.ndarray:
    """r_k = beta * L * (w . f_k - log Z(w)), the implicit reward of each whole path. [3]"""
    ref = _softmax(REF_LOGITS, np.ones(3, bool))
    scores = FEATURES @ w  # [3]
    log_z = math.log(float(ref @ np.exp(scores)))
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
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
        return cls(replace(cfg, **PRESETS[name]))

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
        """One RL step: sample, PRM update (online), RLOO advantage, policy-gradient step."""
        c = self.cfg
        pi = self.policy()
        y = self.rng.choice(3, size=(c.groups, c.samples), p=pi)  # [B, K] path indices
        o = OUTCOMES[y]  # [B, K]
        r = self.rewards()[y]  # [B, K] rewards before the PRM update (single forward)
        if c.prm_mode == "online" and c.prm_lr > 0:
            self.w -= c.prm_lr * self._ce_grad(y.ravel(), o.ravel())
        adv = rloo(r) + rloo(o)  # [B, K]
        grad = np.zeros(3)
        np.add.at(grad, y.ravel(), adv.ravel())
        grad -= adv.sum() * pi  # sum_i A_i (e_{y_i} - pi)
        self.theta += c.policy_lr * grad / y.size
        self.t += 1
        out = self.readout()
        self.history.append(out)
        return out

    def _ce_grad(self, y: np.ndarray, o: np.ndarray) -> np.ndarray:
        c = self.cfg
        ref = _softmax(REF_LOGITS, np.ones(3, bool))
        phi = ref * np.exp(FEATURES @ self.w)
        phi /= phi.sum()
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

    def set_knobs(self, **knobs: float) -> None:
        """beta and prm_lr, mid-run; validated like the config."""
        bad = set(knobs) - {"beta", "prm_lr"}
        if bad:
            raise ValueError(f"unknown knob(s) {sorted(bad)}; the knobs are beta and prm_lr")
        if "beta" in knobs and not float(knobs["beta"]) > 0:
            raise ValueError(f"beta must be > 0, got {knobs['beta']}")
        if "prm_lr" in knobs and not float(knobs["prm_lr"]) >= 0:
            raise ValueError(f"prm_lr must be >= 0, got {knobs['prm_lr']}")
        self.cfg = replace(self.cfg, **{k: float(v) for k, v in knobs.items()})


def run(cfg: SimConfig, steps: int, inject_at: int | None = 0) -> Sim:
    """A whole run without the page: `steps` steps, the shortcut injected before step
    `inject_at` (None: never)."""
    sim = Sim(cfg)
    for t in range(steps):
        if t == inject_at:
            sim.inject_shortcut()
        sim.step()
    return sim
