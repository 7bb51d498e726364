"""Token-level reward heatmaps: each response's tokens coloured by their implicit reward.

Colour scale: white at 0, deepening green for positive rewards and red for negative ones,
linear in |r| / scale and saturated at `scale` (by default the largest |r| shown). The colour of a
token is `reward_color(r, scale)`, the same function for the HTML and the PNG, so what a reader
sees is the reward r_t = beta * (log pi_prm - log pi_ref) of primekit/viz/scoring.py.
"""

from __future__ import annotations

import html
import textwrap
from pathlib import Path

from primekit.viz.scoring import Scored

POSITIVE = (26, 158, 59)  # green
NEGATIVE = (212, 32, 32)  # red


def reward_color(r: float, scale: float) -> str:
    """'#rrggbb' for reward r: white at 0, POSITIVE / NEGATIVE at |r| >= scale."""
    a = min(abs(r) / scale, 1.0) if scale > 0 else 0.0
    end = POSITIVE if r >= 0 else NEGATIVE
    rgb = [round(255 + (c - 255) * a) for c in end]
    return "#{:02x}{:02x}{:02x}".format(*rgb)


def rows_of(scored: Scored) -> list[dict]:
    """One dict per response: prompt, tokens, their rewards, sum, score and verdict."""
    out = []
    for i, toks in enumerate(scored.tokens):
        rewards = scored.token_rewards[i, : len(toks)].tolist()
        out.append({"prompt": scored.problems[i].prompt, "tokens": toks, "rewards": rewards,
                    "sum": sum(rewards), "score": float(scored.scores[i]),
                    "status": scored.statuses[i]})
    return out


def auto_scale(rows: list[dict]) -> float:
    return max((abs(r) for row in rows for r in row["rewards"]), default=0.0) or 1.0


def _token_html(tok: str, r: float, scale: float) -> str:
    shown = html.escape(tok).replace("\n", "&#9166;<br>") or "&#8203;"
    return (f'<span class="tok" style="background:{reward_color(r, scale)}" '
            f'data-reward="{r:.6g}" title="r = {r:.4g}">{shown}</span>')


def response_html(row: dict, scale: float) -> str:
    """One response as HTML: verdict and summed reward, then its coloured tokens."""
    verdict = "ok" if row["score"] >= 1 else "bad"
    head = (f'<div class="muted">{html.escape(row["prompt"].strip())}</div>'
            f'<span class="{verdict}">{row["status"]} (score {row["score"]:.2f})</span> '
            f'<span class="muted">sum r = {row["sum"]:+.4f}</span>')
    toks = "".join(_token_html(t, r, scale) for t, r in zip(row["tokens"], row["rewards"]))
    return f'<div class="card">{head}<div class="resp">{toks}</div></div>'


def write_html(rows: list[dict], out: Path, title: str, scale: float | None = None) -> Path:
    scale = scale or auto_scale(rows)
    css = (Path(__file__).parent / "static" / "style.css").read_text()
    body = "\n".join(response_html(r, scale) for r in rows)
    legend = (f'<p class="muted">token colour: implicit reward r_t = beta * log(pi_prm / '
              f'pi_ref); <span style="background:{reward_color(scale, scale)}">&nbsp;'
              f'+{scale:.3g}&nbsp;</span> <span style="background:{reward_color(-scale, scale)}">'
              f'&nbsp;-{scale:.3g}&nbsp;</span> white = 0. Hover a token for its value.</p>')
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
                   f"</title><style>{css}</style></head><body><h1>{html.escape(title)}</h1>"
                   f"{legend}{body}</body></html>")
    return out


FONT = "DejaVu Sans Mono"  # matplotlib's own monospace font: one advance for every glyph


def _layout(rows: list[dict], width: int, scale: float) -> list[list[tuple[str, str]]]:
    """Text lines of (character, colour): per response its verdict and prompt, then its tokens'
    characters in their reward colours, `width` characters a line."""
    lines: list[list[tuple[str, str]]] = []
    for row in rows:
        mark = "OK " if row["score"] >= 1 else "X  "
        lines.append([(c, "#ffffff") for c in f"{mark}{row['prompt'].strip()[:width - 3]}"])
        current: list[tuple[str, str]] = []
        for tok, r in zip(row["tokens"], row["rewards"]):
            for ch in tok.replace("\n", "\u23ce") or " ":
                current.append((ch, reward_color(r, scale)))
                if len(current) == width:
                    lines.append(current)
                    current = []
        lines.append(current)
        lines.append([])
    return lines


def draw_png(rows: list[dict], title: str, scale: float | None = None, width: int = 72,
             fontsize: float = 8.0, dpi: int = 120):
    """The heatmap as a matplotlib figure. Each text line is drawn as one string in a monospace
    font, so its characters sit as the text reads ("13", not "1 3"); the coloured cells behind
    them are one glyph advance wide, measured from the font, so cell x holds character x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.font_manager import FontProperties

    scale = scale or auto_scale(rows)
    lines = _layout(rows, width, scale)
    prop = FontProperties(family=FONT, size=fontsize)
    fig = plt.figure(dpi=dpi)
    n = 100
    advance = fig.canvas.get_renderer().get_text_width_height_descent("0" * n, prop,
                                                                        ismath=False)[0] / n
    row_px = 1.7 * fontsize * dpi / 72
    heading = textwrap.wrap(f"{title}   (green +{scale:.3g}, red -{scale:.3g}, white 0)", width)
    fig.set_size_inches((width + 2) * advance / dpi,
                        (len(lines) + len(heading) + 3) * row_px / dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-1, width + 1)  # one x unit = one glyph advance
    ax.set_ylim(len(lines) + 1, -1 - len(heading) - 1)
    ax.axis("off")
    for i, text in enumerate(heading):
        ax.text(0, i - len(heading) - 0.5, text, va="center", fontproperties=prop,
                parse_math=False)
    for y, line in enumerate(lines):
        for x, (_, colour) in enumerate(line):
            if colour != "#ffffff":
                ax.add_patch(plt.Rectangle((x, y - 0.5), 1, 1, color=colour, linewidth=0))
        if line:
            ax.text(0, y, "".join(ch for ch, _ in line), ha="left", va="center",
                    fontproperties=prop, parse_math=False)
    return fig


def write_png(rows: list[dict], out: Path, title: str, scale: float | None = None,
              width: int = 72) -> Path:
    """The same heatmap as a PNG (`draw_png`): one coloured cell per character, `width`
    characters a line."""
    import matplotlib.pyplot as plt

    fig = draw_png(rows, title, scale, width)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def run_heatmap(cfg, *, model: str, prm: str, ref: str | None, num_problems: int) -> list[Path]:
    """`primekit heatmap`: sample, score, and write heatmap.html and heatmap.png to viz.out_dir."""
    from primekit.viz.scoring import sample_and_score

    v = cfg.viz
    scored = sample_and_score(cfg, model=model, prm=prm, ref=ref, num_problems=num_problems,
                              k=v.heatmap_samples, temperature=v.temperature, seed=v.seed)
    rows = rows_of(scored)
    # The reference as resolved (the PRM's own where its run recorded one), not the argument.
    title = f"implicit token rewards: PRM {prm} vs reference {scored.ref} (beta {cfg.prm.beta:g})"
    out = Path(v.out_dir)
    return [write_html(rows, out / "heatmap.html", title), write_png(rows, out / "heatmap.png", title)]
