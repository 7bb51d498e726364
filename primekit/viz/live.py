"""`primekit sim --live RUN_DIR`: the sim page's controls attached to a real PRIME run.

The run is a `primekit train ... live.enabled=true` writing RUN_DIR (started before or after the
page). The page follows its metrics.jsonl and samples.jsonl like the dashboard
(primekit/viz/dashboard.py: the same derived keys and lights) and writes RUN_DIR/control.json,
which the trainer reads before every step (the format: primekit/trainer/control.py; what the
toggle and the injection do to the real models: primekit/trainer/live.py).

JSON endpoints (every answer is the state below):
  GET  /api/state?since=N  metric rows from N on, the lights (PRM, gap, steps, accuracy; the page shows three), the requested control, what
                           the trainer applied (from its live/ metrics), events, latest samples
  POST /api/toggle {mode}  ask for the PRM "online" or "frozen" (from the next step)
  POST /api/inject         ask for one injection of the shortcut (before the next step)
"""

from __future__ import annotations

from pathlib import Path

from primekit.config import VizConfig
from primekit.trainer.control import MODES, read_control, write_control
from primekit.viz.dashboard import RunFollower
from primekit.viz.lights import thresholds
from primekit.viz.server import Routes, page


def live_events(rows: list[dict]) -> list[dict]:
    """What the trainer did, from its live/ metrics: each PRM mode change (and the mode at the
    first step) and each injection, with the step it applied to."""
    events, frozen = [], None
    for r in rows:
        if "live/prm_frozen" not in r:
            continue
        now = bool(r["live/prm_frozen"])
        if now != frozen:
            events.append({"step": r["step"], "event": "PRM frozen" if now else "PRM online"})
            frozen = now
        if r.get("live/shortcut_injected"):
            events.append({"step": r["step"], "event": "shortcut injected"})
    return events


class LiveApp:
    def __init__(self, run_dir: Path, viz: VizConfig) -> None:
        self.run_dir = Path(run_dir)
        if not self.run_dir.is_dir():
            raise FileNotFoundError(f"run directory not found: {run_dir} (start `primekit train "
                                    "... live.enabled=true` there, or create it first)")
        self.run, self.viz = RunFollower(self.run_dir), viz
        control = read_control(self.run_dir)
        self.mode, self.inject = control["prm"] or "online", control["inject"]

    def state(self, since: int = 0) -> dict:
        self.run.poll()
        rows = self.run.rows
        live_rows = [r for r in rows if "live/prm_frozen" in r]
        last = live_rows[-1] if live_rows else None
        return {
            "run": str(self.run_dir), "since": since, "n": len(rows), "rows": rows[since:],
            "step": last["step"] if last else 0,
            "lights": self.run.lights(self.viz), "thresholds": thresholds(self.viz),
            "requested": {"prm": self.mode, "inject": self.inject},
            "applied": None if last is None else {
                "prm": "frozen" if last["live/prm_frozen"] else "online",
                "injections": int(last["live/injections"])},
            "events": live_events(rows),
            "samples_step": self.run.samples[0]["step"] if self.run.samples else None,
            "samples": self.run.samples_html(),
        }

    def routes(self) -> Routes:
        def since(p: dict) -> int:
            return max(0, int(p.get("since", 0)))

        def toggle(p: dict) -> dict:
            mode = str(p.get("mode"))
            if mode not in MODES:
                raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
            self.mode = mode
            write_control(self.run_dir, prm=self.mode, inject=self.inject)
            return self.state(since(p))

        def inject(p: dict) -> dict:
            self.inject += 1
            write_control(self.run_dir, prm=self.mode, inject=self.inject)
            return self.state(since(p))

        return {("GET", "/"): page("live.html"),
                ("GET", "/api/state"): lambda p: self.state(since(p)),
                ("POST", "/api/toggle"): toggle, ("POST", "/api/inject"): inject}


def run_live(run_dir: Path, viz: VizConfig, *, port: int, open_browser: bool) -> None:
    from primekit.viz.server import serve

    serve(LiveApp(run_dir, viz).routes(), port, open_browser, "sim --live")
