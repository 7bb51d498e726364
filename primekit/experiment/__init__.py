"""`primekit experiment`: named comparisons (arms x seeds x task families) of ordinary
`primekit train` runs, with seeds, intervals and a verdict per claim (docs/experiments/README.md).

- spec.py    the YAML spec: claim, base config, arms and task families as config overrides, seeds,
             the verdict's rule; validated before anything runs; the runs it expands into
- runner.py  runs each (task, arm, seed) as `primekit train` in its own run directory; a finished
             run is recognised by its own final files and skipped, an interrupted one resumed
- stats.py   t-intervals, Welch intervals, seeded bootstrap intervals, steps-to-threshold
- report.py  reads only the runs' metrics.jsonl; report.md with tables and verdicts
- plots.py   the report's PNG figures (matplotlib, Agg)
"""
