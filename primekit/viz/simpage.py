"""`primekit sim`: the toy model (primekit/viz/sim.py) behind a local page.

JSON endpoints (POST bodies are JSON objects; every answer is the state below):
  GET  /api/state?since=N   the run from step N on, the knobs, the presets' knobs, the lights
  POST /api/step {n}        take n steps (1..200); the page's play button calls this on a timer
  POST /api/preset {name}   restart from a preset: "online" (Online PRIME) or "frozen"
                            (Frozen reward hacks), with the preset's own knobs
  POST /api/reset           restart the current preset, with its own knobs
  POST /api/inject          inject the shortcut
  POST /api/toggle {mode}   the PRM "online" or "frozen", mid-run
  POST /api/knobs {beta?, prm_lr?}  each knob given is checked against sim.KNOB_BOUNDS on its
                            own: the valid ones are set, and a 400 names each invalid one
                            ({"error", "errors": {knob: message}, "state"})
  GET  /api/map             the danger-zone map numbers; /map.png its picture (404 without --map)
A step that would make the state non-finite is refused (400) and not stored.
"""

from __future__ import annotations

from pathlib import Path

from primekit.config import ConfigError, SimConfig, VizConfig
from primekit.viz.lights import gap_light, prm_light, thresholds
from primekit.viz.server import BadRequest, NotFound, Routes, page
from primekit.viz.sim import (
    KNOB_BOUNDS,
    PATHS,
    PRESETS,
    SHORTCUT,
    KnobError,
    Sim,
    check_knob,
    preset_knobs,
)

MAX_STEPS_PER_CALL = 200


class SimApp:
    def __init__(self, cfg: SimConfig, viz: VizConfig, map_result: dict | None = None,
                 map_png: Path | None = None) -> None:
        for name in KNOB_BOUNDS:  # the page's knobs start at the configured values
            try:
                check_knob(name, getattr(cfg, name))
            except KnobError as e:
                raise ConfigError(f"sim.{e}") from None
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
            "bounds": KNOB_BOUNDS,
            "presets": {name: preset_knobs(name, self.cfg) for name in PRESETS},
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
            try:
                for _ in range(n):
                    self.sim.step()
            except FloatingPointError as e:  # the steps before it stay; this one is not stored
                raise BadRequest(str(e), state=self.state(since(p))) from None
            return self.state(since(p))

        def preset(p: dict) -> dict:
            name = str(p.get("name"))
            self.sim = Sim.preset(name, self.cfg)
            self.preset_name = name
            return self.state()

        def reset(p: dict) -> dict:
            self.sim = Sim.preset(self.preset_name, self.cfg)
            return self.state()

        def inject(p: dict) -> dict:
            self.sim.inject_shortcut()
            return self.state(since(p))

        def toggle(p: dict) -> dict:
            mode = p.get("mode") or ("frozen" if self.sim.cfg.prm_mode == "online" else "online")
            self.sim.set_mode(str(mode))
            return self.state(since(p))

        def knobs(p: dict) -> dict:
            unknown = sorted(set(p) - set(KNOB_BOUNDS) - {"since"})
            if unknown:
                raise ValueError(f"unknown knob(s) {unknown}; the knobs are {sorted(KNOB_BOUNDS)}")
            errors = {}
            for name in KNOB_BOUNDS:  # each on its own: a bad one never blocks the other
                if name in p:
                    try:
                        self.sim.set_knobs(**{name: p[name]})
                    except KnobError as e:
                        errors[name] = str(e)
            if errors:
                raise BadRequest("; ".join(errors.values()), errors=errors,
                                 state=self.state(since(p)))
            return self.state(since(p))

        def map_json(p: dict) -> dict:
            if self.map_result is None:
                raise NotFound("no map: start with `primekit sim --map`")
            return self.map_result

        def map_png(p: dict) -> tuple[str, bytes]:
            if self.map_png is None:
                raise NotFound("no map: start with `primekit sim --map`")
            return "image/png", self.map_png.read_bytes()

        return {("GET", "/"): page("sim.html"), ("GET", "/api/state"): lambda p: self.state(
            since(p)), ("POST", "/api/step"): step, ("POST", "/api/preset"): preset,
            ("POST", "/api/reset"): reset, ("POST", "/api/inject"): inject,
            ("POST", "/api/toggle"): toggle, ("POST", "/api/knobs"): knobs,
            ("GET", "/api/map"): map_json, ("GET", "/map.png"): map_png}


def run_sim(cfg: SimConfig, viz: VizConfig, *, port: int, open_browser: bool,
            with_map: bool) -> None:
    """`primekit sim`: take the port (a busy or invalid one is refused before any work), compute
    the map if asked (saving its PNG), then serve the page."""
    from primekit.viz.server import bind, serve_bound

    SimApp(cfg, viz)  # the configured knobs within their bounds, before anything else
    routes: Routes = {}
    server = bind(routes, port)
    try:
        map_result = map_png = None
        if with_map:
            import json

            from primekit.viz.danger import plot, sweep

            map_result = sweep(cfg, viz)
            map_png = plot(map_result, Path(cfg.map_out))
            map_png.with_suffix(".json").write_text(json.dumps(map_result, indent=1))
            print(f"danger-zone map: {map_png} (numbers in {map_png.with_suffix('.json')})")
        routes.update(SimApp(cfg, viz, map_result, map_png).routes())
    except BaseException:
        server.server_close()
        raise
    serve_bound(server, open_browser, "sim")
