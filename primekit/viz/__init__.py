"""Seeing PRIME: the reward-hacking simulation (sim, danger, simpage), the live run dashboard
(dashboard), token-level reward heatmaps (heatmap) and best-of-N with the implicit PRM (rerank),
served by a small local HTTP server (server) and sharing the lights (lights). docs/viz.md."""
