"""The spec key `map` (primekit.experiment.spec.Grid): each mapped arm's final value of a metric,
or its difference from the map's baseline, placed on the (y, x) grid. Read by the report's
tables and the heatmaps."""

from __future__ import annotations

import math

from primekit.experiment import stats
from primekit.experiment.runlog import RunLog
from primekit.experiment.spec import Spec


def grid_values(spec: Spec, logs: dict[tuple[str, str], list[RunLog]], task: str,
                metric: str) -> tuple[list, list, dict[tuple[int, int], stats.Interval], bool]:
    """The spec's map for one task family and metric: (x values, y values, (i_y, i_x) -> cell,
    relative). A cell is the mapped arm's final `metric` over its finished seeds (t-interval)
    or, with a map baseline that logs the metric (`relative`), its difference from the
    baseline's (Welch interval); a metric the baseline does not log (hack/dense_success_corr of
    outcome-only RLOO) is shown as is. Cells without finished runs are absent."""
    grid = spec.grid
    cells = grid.cells(spec.arms)
    xs = sorted({x for x, _ in cells.values()}, key=_sort_key)
    ys = sorted({y for _, y in cells.values()}, key=_sort_key)

    def finals(arm: str) -> list[float]:
        return [x for g in logs.get((task, arm), []) if (x := g.final(metric, spec.window))
                is not None and math.isfinite(x)]

    base = finals(grid.baseline) if grid.baseline is not None else []
    out = {}
    for arm, (x, y) in cells.items():
        vals = finals(arm)
        if vals:
            out[(ys.index(y), xs.index(x))] = (stats.welch_interval(vals, base) if base
                                               else stats.mean_interval(vals, metric))
    return xs, ys, out, bool(base)


def _sort_key(v) -> tuple:
    return (0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, str(v))
