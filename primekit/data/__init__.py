"""Prompt datasets: Problem, the procedural arithmetic task, JSONL/parquet/HF loaders, prompt rendering."""
