"""`primekit dashboard RUN_DIR [RUN_DIR ...]`: follow runs' metrics.jsonl and samples.jsonl live.

Reads only what the trainer writes (docs/metrics.md; samples.jsonl: primekit.logging.
append_samples), incrementally: each poll parses the lines appended since the last one, and a file
rewritten under it (a resume truncates it) is read again from the top (`Tail`). Besides
the logged metrics, each row gets three derived keys the page and the lights use:
  derived/verifier_acc  reward/outcome_mean, the verifier's mean score on the trained batch;
  derived/reported      what the dense reward claims about the same batch: for PRIME,
                        sigmoid(reward/implicit_seq_mean), the PRM's cross-entropy prediction of
                        success at the batch's mean implicit return (an approximation of the mean
                        prediction: sigmoid of a mean, not a mean of sigmoids); for an explicit
                        ORM, explicit/orm_score_mean; absent otherwise;
  derived/gap           derived/reported - derived/verifier_acc (the gap light's input);
  derived/prm_acc       prm/acc_pairwise, else prm/acc_abs (the PRM light's input).
The lights use the last `viz.window` rows that have these values (primekit/viz/lights.py); the
step and accuracy lights read hack/steps_per_response and reward/outcome_mean_sampled.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from primekit.config import VizConfig
from primekit.logging import SAMPLES
from primekit.viz.heatmap import auto_scale, response_html
from primekit.viz.lights import accuracy_light, gap_light, prm_light, steps_light, thresholds
from primekit.viz.server import Routes, page

METRICS = "metrics.jsonl"


def _num(v) -> float | None:
    try:
        x = float(v)  # "nan" / "inf" strings read back as floats
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def derive(row: dict) -> dict:
    """The row with the derived/ keys added (see the module docstring)."""
    out = dict(row)
    acc = _num(row.get("reward/outcome_mean"))
    reported = None
    if _num(row.get("reward/implicit_seq_mean")) is not None:
        reported = 1 / (1 + math.exp(-_num(row["reward/implicit_seq_mean"])))
    elif _num(row.get("explicit/orm_score_mean")) is not None:
        reported = _num(row["explicit/orm_score_mean"])
    if acc is not None:
        out["derived/verifier_acc"] = acc
    if reported is not None:
        out["derived/reported"] = reported
        if acc is not None:
            out["derived/gap"] = reported - acc
    prm = _num(row.get("prm/acc_pairwise"))
    prm = prm if prm is not None else _num(row.get("prm/acc_abs"))
    if prm is not None:
        out["derived/prm_acc"] = prm
    return out


class Tail:
    """The complete JSON lines appended to a file since the last read.

    A file rewritten under it (a `--resume` truncates metrics.jsonl and samples.jsonl to the
    resumed step and appends again; an atomic replace gives a new inode) is noticed: the file is
    smaller than what was read, a new inode, or the last line read is no longer where it was.
    Then the tail starts again from the top and `read` says so. A half-written last line waits
    for its newline; a line that is not JSON is skipped and counted, so one bad line never stops
    the following (before, the stale byte offset answered HTTP 400 "Extra data" forever)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.inode: int | None = None
        self.last_line = b""  # the last complete line read, with its newline
        self.skipped = 0

    def _rewritten(self, st) -> bool:
        if st.st_ino != self.inode or st.st_size < self.offset:
            return True
        if not self.last_line:
            return False
        with open(self.path, "rb") as f:
            f.seek(self.offset - len(self.last_line))
            return f.read(len(self.last_line)) != self.last_line

    def read(self) -> tuple[list[dict], bool]:
        """(rows appended since the last read, whether the file was rewritten: then the rows are
        the whole file's)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            restarted = self.offset > 0
            self.__init__(self.path)
            return [], restarted
        restarted = self.inode is not None and self._rewritten(st)
        if restarted:
            self.offset, self.last_line, self.skipped = 0, b"", 0
        self.inode = st.st_ino
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        lines = data[:end].splitlines(keepends=True)
        rows = []
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                self.skipped += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
            else:
                self.skipped += 1
        if lines:
            self.last_line = lines[-1]
        self.offset += end
        return rows, restarted


class RunFollower:
    """One run directory: its metric rows so far and its latest step's samples. `generation`
    counts the times metrics.jsonl was rewritten under it (the rows then start over)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.rows: list[dict] = []
        self.samples: list[dict] = []
        self.generation = 0
        self._metrics = Tail(self.run_dir / METRICS)
        self._samples = Tail(self.run_dir / SAMPLES)

    def poll(self) -> None:
        new, restarted = self._metrics.read()
        if restarted:
            self.rows, self.generation = [], self.generation + 1
        self.rows += [derive(r) for r in new]
        new, restarted = self._samples.read()
        if restarted:
            self.samples = []
        for s in new:  # keep the latest step's rows, which may arrive over two polls
            if self.samples and s.get("step") == self.samples[-1].get("step"):
                self.samples.append(s)
            else:
                self.samples = [s]

    def lights(self, viz: VizConfig) -> dict:
        prm = [r["derived/prm_acc"] for r in self.rows if "derived/prm_acc" in r]
        gap = [r["derived/gap"] for r in self.rows if "derived/gap" in r]
        # The step light: steps per response against the verifier's accuracy on every sample
        # (before the online filter, which would bias it towards the kept accuracies).
        steps = [r["hack/steps_per_response"] for r in self.rows if "hack/steps_per_response" in r
                 and "reward/outcome_mean_sampled" in r]
        acc = [r["reward/outcome_mean_sampled"] for r in self.rows
               if "hack/steps_per_response" in r and "reward/outcome_mean_sampled" in r]
        # The accuracy light: the same all-samples accuracy (the trained batch's when a run
        # logs no sampled accuracy), every step that has it.
        key = "reward/outcome_mean_sampled" if any(
            "reward/outcome_mean_sampled" in r for r in self.rows) else "reward/outcome_mean"
        sampled = [_num(r[key]) for r in self.rows if key in r]
        return {"prm": prm_light(prm, viz), "gap": gap_light(gap, viz),
                "steps": steps_light([_num(v) for v in steps], [_num(v) for v in acc], viz),
                "accuracy": accuracy_light(sampled, viz)}

    def samples_html(self) -> list[str]:
        rows = [{"prompt": s["prompt"], "tokens": s["tokens"],
                 "rewards": s["token_rewards"] or [0.0] * len(s["tokens"]),
                 "sum": sum(s["token_rewards"] or []), "score": s["score"],
                 "status": s["status"]} for s in self.samples]
        scale = auto_scale(rows)
        return [response_html(r, scale) for r in rows]


class DashboardApp:
    def __init__(self, run_dirs: list[Path], viz: VizConfig) -> None:
        missing = [str(d) for d in run_dirs if not Path(d).is_dir()]
        if missing:
            raise FileNotFoundError(f"run directory not found: {', '.join(missing)}")
        self.runs = [RunFollower(Path(d)) for d in run_dirs]
        self.viz = viz

    def run_state(self, i: int, since: int, generation: int | None = None) -> dict:
        """Run i's rows from `since` on; all of them (since 0) when the page's `generation` is
        not the run's (its metrics.jsonl was rewritten since the page last read it)."""
        if not 0 <= i < len(self.runs):
            raise ValueError(f"run index {i} out of range [0, {len(self.runs)})")
        run = self.runs[i]
        run.poll()
        if generation is not None and generation != run.generation:
            since = 0
        return {"i": i, "name": str(run.run_dir), "since": since, "n": len(run.rows),
                "gen": run.generation, "skipped_lines": run._metrics.skipped,
                "rows": run.rows[since:], "lights": run.lights(self.viz),
                "samples_step": run.samples[0]["step"] if run.samples else None,
                "samples": run.samples_html()}

    def routes(self) -> Routes:
        return {
            ("GET", "/"): page("dashboard.html"),
            ("GET", "/api/runs"): lambda p: {"runs": [str(r.run_dir) for r in self.runs],
                                             "thresholds": thresholds(self.viz)},
            ("GET", "/api/run"): lambda p: self.run_state(
                int(p.get("i", 0)), max(0, int(p.get("since", 0))),
                int(p["gen"]) if "gen" in p else None),
        }


def run_dashboard(run_dirs: list[Path], viz: VizConfig, *, port: int, open_browser: bool) -> None:
    from primekit.viz.server import serve

    serve(DashboardApp(run_dirs, viz).routes(), port, open_browser, "dashboard")
