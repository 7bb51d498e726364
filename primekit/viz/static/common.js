// Shared by the sim and dashboard pages: JSON calls, lights, uPlot charts.
"use strict";

async function api(method, path, body) {
  const opts = { method, headers: { "Content-Type": "application/json" } };
  if (body !== undefined) opts.body = JSON.stringify(body);
  const res = await fetch(path, opts);
  const out = await res.json();
  if (!res.ok) throw new Error(out.error || res.statusText);
  return out;
}

function setLight(el, light) {
  el.dataset.color = light.color;
  el.querySelector(".label").textContent = light.label;
  const v = light.value === null ? "" : ` (${light.value.toFixed(2)})`;
  el.querySelector(".value").textContent = v;
}

const COLORS = ["#1a9e3b", "#d42020", "#2d6cdf", "#8a4bd6", "#e8a100", "#555"];

function makeChart(el, title, names, opts = {}) {
  // opts.dashed: indices of series drawn dashed (so a curve that coincides with another shows).
  const dashed = opts.dashed || [];
  const series = [{ label: opts.x || "step" }].concat(names.map((n, i) => ({
    label: n, stroke: COLORS[i % COLORS.length], width: dashed.includes(i) ? 1.5 : 2,
    spanGaps: true, dash: dashed.includes(i) ? [6, 4] : undefined,
  })));
  const scales = { x: { time: false } };
  if (opts.range) scales.y = { range: opts.range };
  const width = Math.max(320, (el.clientWidth || 600) - 10);
  const data = [[]].concat(names.map(() => []));
  return new uPlot({ title, width, height: opts.height || 240, series, scales,
                     axes: [{}, { size: 50 }] }, data, el);
}
