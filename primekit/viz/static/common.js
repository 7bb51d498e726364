// Shared by the sim, live and dashboard pages: JSON calls, lights, uPlot charts.
"use strict";

async function api(method, path, body) {
  // The parsed JSON answer; a non-2xx answer throws an Error whose .body is the answer's JSON
  // (the server's 400s carry {"error", ...} and sometimes the state as it stands).
  const opts = { method, headers: { "Content-Type": "application/json" } };
  if (body !== undefined) opts.body = JSON.stringify(body);
  const res = await fetch(path, opts);
  const text = await res.text();
  let out;
  try { out = JSON.parse(text); } catch (e) { out = { error: text || res.statusText }; }
  if (!res.ok) {
    const err = new Error(out.error || res.statusText);
    err.body = out;
    err.status = res.status;
    throw err;
  }
  return out;
}

function setLight(el, light) {
  el.dataset.color = light.color;
  el.querySelector(".label").textContent = light.label;
  const v = light.value === null ? "" : ` (${light.value.toFixed(2)})`;
  el.querySelector(".value").textContent = v;
}

const COLORS = ["#1a9e3b", "#d42020", "#2d6cdf", "#8a4bd6", "#e8a100", "#555"];
// Step axes: whole steps only (never 1.2, 1.4, ...).
const STEP_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                    100000, 200000, 500000, 1000000];

function makeChart(el, title, names, opts = {}) {
  // opts.dashed: indices of series drawn dashed (so a curve that coincides with another shows);
  // opts.colors: a colour per series (default COLORS in order); opts.under: indices of series
  // drawn as a wide translucent band (visible even exactly under another curve);
  // opts.events(): [{step, event}] marked as labelled vertical lines; opts.xWindow(): the number
  // of last steps to show (0 or null: all). The chart follows its container's width.
  const dashed = opts.dashed || [], under = opts.under || [];
  const series = [{ label: opts.x || "step" }].concat(names.map((n, i) => {
    const colour = (opts.colors || COLORS)[i % (opts.colors || COLORS).length];
    if (under.includes(i))
      return { label: n, stroke: colour + "66", width: 8, spanGaps: true };
    return { label: n, stroke: colour, width: dashed.includes(i) ? 1.5 : 2, spanGaps: true,
             dash: dashed.includes(i) ? [6, 4] : undefined };
  }));
  const scales = { x: { time: false } };
  if (opts.xWindow) {
    scales.x.range = (u, min, max) => {
      const w = opts.xWindow();
      if (min === null || max === null) return [0, 1];
      const lo = w ? Math.max(min, max - w) : min;
      return lo === max ? [lo, lo + 1] : [lo, max];
    };
  }
  if (opts.range) scales.y = { range: opts.range };
  const height = opts.height || 240;
  const widthOf = () => Math.max(320, (el.clientWidth || 600) - 10);
  const data = [[]].concat(names.map(() => []));
  const hooks = opts.events ? { draw: [u => drawEvents(u, opts.events())] } : {};
  const chart = new uPlot({
    title, width: widthOf(), height, series, scales, hooks,
    axes: [{ incrs: STEP_INCRS, values: (u, splits) => splits.map(v => Number.isInteger(v) ? String(v) : "") },
           { size: 50 }],
  }, data, el);
  if (window.ResizeObserver) {
    let last = widthOf();
    new ResizeObserver(() => {
      const w = widthOf();
      if (w !== last) { last = w; chart.setSize({ width: w, height }); }
    }).observe(el);
  }
  return chart;
}

function drawEvents(u, events) {
  // A dashed vertical line and a label at each event's step inside the plotted range.
  const ctx = u.ctx, { left, top, width, height } = u.bbox;
  ctx.save();
  ctx.strokeStyle = "#444";
  ctx.fillStyle = "#222";
  ctx.lineWidth = 1 * devicePixelRatio;
  ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
  ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
  ctx.textBaseline = "top";
  let row = 0;
  for (const e of events) {
    const x = Math.round(u.valToPos(e.step, "x", true));
    if (!(x >= left && x <= left + width)) continue;
    ctx.beginPath();
    ctx.moveTo(x, top);
    ctx.lineTo(x, top + height);
    ctx.stroke();
    ctx.fillText(`${e.event} (${e.step})`, x + 3 * devicePixelRatio,
                 top + (2 + 13 * (row++ % 3)) * devicePixelRatio);
  }
  ctx.restore();
}
