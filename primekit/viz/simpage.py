"""`primekit sim`: the toy model (primekit/viz/sim.py) behind a local page.

JSON endpoints (POST bodies are JSON objects; every answer is the state below):
  GET  /api/state?since=N   the run from step N on, the knobs, the two lights
  POST /api/step {n}        take n steps (1..200); the page's play button calls this on a timer
  POST /api/preset {name}   restart from a preset: "online" (Online PRIME) or "frozen"
                            (Frozen reward hacks)
  POST /api/reset           restart with the current preset and knobs
  POST /api/inject          inject the shortcut
  POST /api/toggle {mode}   the PRM "online" or "frozen", mid-run
  POST /api/knobs {beta, prm_lr}
  GET  /api/map             the danger-zone map numbers (an error without --map); /map.png
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from primekit.config import SimConfig, VizConfig
from primekit.viz.lights import gap_light, prm_light, thresholds
from primekit.viz.server import Routes, page
from primekit.viz.sim import PATHS, SHORTCUT, Sim

MAX_STEPS_PER_CALL = 200


class SimApp:
    def __init__(self, cfg: SimConfig, viz: VizConfig, map_result: dict | None = None,
                 map_png: Path | None = None) -> None:
        self.cfg, self.viz = cfg, viz
        self.map_result, self.map_png = map_result, map_png
        self.preset_name = cfg.prm_mode
        self.sim = Sim.preset(self.preset_name, cfg)

    def state(self, since: int = 0) -> dict:
        h = self.sim.history
        c = self.sim.cfg
        return {
            "t": self.sim.t, "since": since, "history": h[since:], "events": self.sim.events,
            "paths": PATHS, "preset": self.preset_name,
            "knobs": {"beta": c.beta, "prm_lr": c.prm_lr, "prm_mode": c.prm_mode},
            "shortcut_available": bool(self.sim.available[SHORTCUT]),
            "lights": {"prm": prm_light([x["prm_accuracy"] for x in h], self.viz),
                       "gap": gap_light([x["gap"] for x in h], self.viz)},
            "thresholds": thresholds(self.viz), "has_map": self.map_result is not None,
        }

    def routes(self) -> Routes:
        def since(p: dict) -> int:
            return max(0, int(p.get("since", 0)))

        def step(p: dict) -> dict:
            n = int(p.get("n", 1))
            if not 1 <= n <= MAX_STEPS_PER_CALL:
                raise ValueError(f"n must lie in [1, {MAX_STEPS_PER_CALL}], got {n}")
            for _ in range(n):
                self.sim.step()
            return self.state(since(p))

        def preset(p: dict) -> dict:
            name = str(p.get("name"))
            self.sim = Sim.preset(name, replace(self.cfg, beta=self.sim.cfg.beta,
                                                prm_lr=self.sim.cfg.prm_lr))
            self.preset_name = name
            return self.state()

        def reset(p: dict) -> dict:
            self.sim = Sim(replace(self.sim.cfg, prm_mode=self.preset_name))
            return self.state()

        def inject(p: dict) -> dict:
            self.sim.inject_shortcut()
            return self.state(since(p))

        def toggle(p: dict) -> dict:
            mode = p.get("mode") or ("frozen" if self.sim.cfg.prm_mode == "online" else "online")
            self.sim.set_mode(str(mode))
            return self.state(since(p))

        def knobs(p: dict) -> dict:
            self.sim.set_knobs(**{k: p[k] for k in ("beta", "prm_lr") if k in p})
            return self.state(since(p))

        def map_json(p: dict) -> dict:
            if self.map_result is None:
                raise KeyError("no map: start with `primekit sim --map`")
            return self.map_result

        def map_png(p: dict) -> tuple[str, bytes]:
            if self.map_png is None:
                raise KeyError("no map: start with `primekit sim --map`")
            return "image/png", self.map_png.read_bytes()

        return {("GET", "/"): page("sim.html"), ("GET", "/api/state"): lambda p: self.state(
            since(p)), ("POST", "/api/step"): step, ("POST", "/api/preset"): preset,
            ("POST", "/api/reset"): reset, ("POST", "/api/inject"): inject,
            ("POST", "/api/toggle"): toggle, ("POST", "/api/knobs"): knobs,
            ("GET", "/api/map"): map_json, ("GET", "/map.png"): map_png}


def run_sim(cfg: SimConfig, viz: VizConfig, *, port: int, open_browser: bool,
            with_map: bool) -> None:
    """`primekit sim`: compute the map if asked (saving its PNG), then serve the page."""
    from primekit.viz.server import serve

    map_result = map_png = None
    if with_map:
        import json

        from primekit.viz.danger import plot, sweep

        map_result = sweep(cfg, viz)
        map_png = plot(map_result, Path(cfg.map_out))
        map_png.with_suffix(".json").write_text(json.dumps(map_result, indent=1))
        print(f"danger-zone map: {map_png} (numbers in {map_png.with_suffix('.json')})")
    serve(SimApp(cfg, viz, map_result, map_png).routes(), port, open_browser, "sim")
