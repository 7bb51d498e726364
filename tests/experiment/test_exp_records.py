"""The committed evidence holds together: every packaged spec with run records in
docs/experiments/records/ rebuilds its report from them alone (nothing trained; a spec still
running across sessions from its finished runs, its page stating how many), and every
estimate in the rebuilt report's verdict table is the one its page in docs/experiments/ states;
and every estimate the README gives is one of the pages', rounded."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from primekit.cli import main
from primekit.experiment.report import write_report
from primekit.experiment.runner import FINISHED, run_experiment
from primekit.experiment.spec import load_spec, packaged_specs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "experiments"
RECORDS = DOCS / "records"
# Specs whose report is a section of another spec's page.
PAGE = {"gao-clip-delta-eta": "gao-clip-delta"}
# An estimate and its interval as reports and pages write them ("+0.004 [−0.031, +0.039]").
NUMBER = r"([+\-−]?\d*\.\d+)"
ESTIMATE = re.compile(rf"{NUMBER}\s*\[{NUMBER},\s*{NUMBER}\]")


def estimates(text: str) -> list[tuple[float, float, float]]:
    return [tuple(float(x.replace("−", "-")) for x in m.groups()) for m in ESTIMATE.finditer(text)]


def test_estimates_parse_both_spellings():
    assert estimates("| +0.004 [−0.031, +0.039] | and -0.720 [-0.845, -0.595]") == [
        (0.004, -0.031, 0.039), (-0.720, -0.845, -0.595)]


def recorded_specs() -> list[str]:
    return [name for name in packaged_specs() if (RECORDS / name).is_dir()]


def test_every_recorded_spec_has_a_page():
    names = recorded_specs()
    assert len(names) >= 20
    for name in names:
        assert (DOCS / f"{PAGE.get(name, name)}.md").is_file(), name


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> dict[str, tuple[Path, int, int]]:
    """Every recorded spec rebuilt from the records as `primekit experiment --all --records DIR
    --max-runs 0` does: one after the other, side by side in one directory (so that runs finished
    by one are beside the next, and models one spec's `prepare` restores sit in another's run
    directories), from an empty working directory (a `runs/demo/sft` of this machine would differ
    from the recorded copy). Per spec: its report, its finished runs, its runs."""
    work = tmp_path_factory.mktemp("rebuild")
    here = Path.cwd()
    os.chdir(work)
    reports = {}
    try:
        for name in recorded_specs():
            spec = load_spec(name)
            out = work / "runs" / "experiments" / name

            def no_training(launch, name=name):
                raise AssertionError(f"{name}: {launch.name} would be trained")

            result = run_experiment(spec, out, in_process=main, records=RECORDS, max_runs=0,
                                    on_launch=no_training)
            # Every run restores from a record, but for a spec still running across sessions,
            # which has records for its finished runs only (its page says how many: below).
            assert set(result.values()) <= {FINISHED}, name
            reports[name] = (write_report(spec, out, plots=False), len(result),
                             len(spec.runs(out)))
    finally:
        os.chdir(here)
    return reports


@pytest.mark.slow
@pytest.mark.parametrize("name", recorded_specs())
def test_report_rebuilds_from_records_as_its_page_states(name, rebuilt):
    path, done, total = rebuilt[name]
    report = path.read_text()
    page_text = (DOCS / f"{PAGE.get(name, name)}.md").read_text()
    if done < total:  # a spec still running: its page must say so, with the count
        assert f"{done} of {total} runs" in page_text, (
            f"{name}: {done} of {total} runs restore from records; its page does not say so")
    table = report.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "[" in line
            and not line.startswith("| task family")]
    assert rows, name
    page = estimates(page_text)
    for row in rows:
        cells = row.split("|")
        (found,) = estimates(cells[4])
        # Pages round to 3 decimals, a few to 4: the same figure within half a unit of the 3rd.
        assert any(all(abs(a - b) <= 6e-4 for a, b in zip(found, stated)) for stated in page), (
            f"{name}: {cells[1:5]} is not on docs/experiments/{PAGE.get(name, name)}.md")


def test_readme_estimates_are_the_pages():
    # The README's evidence table and demo paragraph round the pages' figures: each estimate
    # with its interval there is one stated in docs/experiments/ or docs/demo.md, to the README's
    # own precision (half a unit of its last decimal).
    root = DOCS.parents[1]
    stated = [e for page in [*DOCS.glob("*.md"), root / "docs" / "demo.md"]
              for e in estimates(page.read_text())]
    text = (root / "README.md").read_text()
    found = [(m.group(0), estimates(m.group(0))[0]) for m in ESTIMATE.finditer(text)]
    assert len(found) >= 15
    for written, figure in found:
        decimals = max(len(x.split(".")[1]) for x in re.findall(r"\d*\.\d+", written))
        tol = 0.5 * 10 ** -decimals + 1e-9
        assert any(all(abs(a - b) <= tol for a, b in zip(figure, s)) for s in stated), written
