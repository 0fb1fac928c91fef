// A small SVG line chart: several series on one x axis, an optional threshold line and
// red-flag markers; drag across it to zoom in on the x range, double-click to zoom out.
"use strict";
const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#2563eb", "#ea580c", "#059669", "#7c3aed", "#db2777", "#0891b2"];

function svgEl(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

function niceNumber(v) {
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1000 || a < 0.001) return v.toExponential(1);
  return Number(v.toPrecision(3)).toString();
}

// Round tick values, as a reader would draw them: multiples of 1, 2, 2.5 or 5 x 10^k, about `count` of them
// over [lo, hi] (0 0.5 1 1.5 2, not 0.148 1.08 2); an integer axis (steps, token positions) steps by 1, 2 or
// 5 x 10^k, so it neither skips a whole number between even ticks nor shows a half (0 1 2 3, not 0 2 3 or 1.5).
function tickStep(lo, hi, count, integral) {
  const raw = (hi - lo) / Math.max(count, 1);
  if (!(raw > 0)) return 1;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = (integral ? [1, 2, 5, 10] : [1, 2, 2.5, 5, 10]).map(m => m * mag).find(s => s >= raw * 0.999);
  return integral ? Math.max(1, Math.round(step)) : step;
}

function niceTicks(lo, hi, count, integral, step) {
  step = step || tickStep(lo, hi, count, integral);
  const out = [];
  const first = Math.ceil(lo / step - 1e-9);
  for (let k = first; k * step <= hi + step * 1e-9 && k < first + 50; k++) {
    out.push(Number((k * step).toPrecision(12)));  // 0.30000000000000004 -> 0.3
  }
  return [...new Set(out)];
}

// The x ticks: round values inside the range (the range is the data's, or the zoom's, and stays so).
const xTicks = (range, integral) => niceTicks(range[0], range[1], 5, integral);

// series: [{name, x: [], y: [], color?, dash? (a dashed line, no points), cls?}];
// opts: {threshold, flags: [x...] (red bands), marks: [x...] (grey dotted verticals: resumes), markTitle, xlabel}
function lineChart(container, series, opts) {
  opts = opts || {};
  const svg = svgEl("svg", {class: "chart", viewBox: "0 0 400 170", preserveAspectRatio: "none"}, container);
  const allX = series.flatMap(s => s.x);
  const full = [Math.min(...allX), Math.max(...allX)];
  let range = full.slice();
  const integral = allX.every(Number.isInteger);  // a step or token axis: its ticks are whole numbers
  const W = 400, H = 170, L = 44, R = 6, T = 6, B = 22;

  function draw() {
    svg.replaceChildren();
    const inRange = (x) => x >= range[0] && x <= range[1];
    const ys = series.flatMap(s => s.y.filter((_, i) => inRange(s.x[i])));
    if (opts.threshold !== null && opts.threshold !== undefined) ys.push(opts.threshold);
    let lo = Math.min(...ys), hi = Math.max(...ys);
    if (!isFinite(lo)) { lo = 0; hi = 1; }
    // a constant series gets room around it; one at 0 (a |difference| that is all 0) stays on [0, 1],
    // never a negative axis for a value that cannot be negative
    if (lo === hi) {
      if (lo === 0) hi = 1; else { const pad = 0.5 * Math.abs(lo); lo -= pad; hi += pad; }
    }
    // the y axis runs from one round tick to another, so its ticks are round numbers (0 0.5 1 1.5 2)
    const yStep = tickStep(lo, hi, 4, false);
    lo = Math.floor(lo / yStep + 1e-9) * yStep;
    hi = Math.ceil(hi / yStep - 1e-9) * yStep;
    const span = range[1] - range[0] || 1;
    const px = (x) => L + (x - range[0]) / span * (W - L - R);
    const py = (y) => T + (hi - y) / (hi - lo) * (H - T - B);
    svgEl("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#d1d5db"}, svg);
    svgEl("line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#d1d5db"}, svg);
    for (const y of niceTicks(lo, hi, 4, false, yStep)) {
      svgEl("text", {x: L - 3, y: py(y) + 3, "text-anchor": "end"}, svg).textContent = niceNumber(y);
    }
    for (const x of xTicks(range, integral)) {
      svgEl("text", {x: px(x), y: H - 8, "text-anchor": "middle", class: "x-tick"}, svg).textContent = niceNumber(x);
    }
    if (opts.xlabel) svgEl("text", {x: W - R, y: H - 1, "text-anchor": "end"}, svg).textContent = opts.xlabel;
    if (opts.threshold !== null && opts.threshold !== undefined) {
      svgEl("line", {x1: L, x2: W - R, y1: py(opts.threshold), y2: py(opts.threshold), stroke: "#dc2626",
                     "stroke-dasharray": "4 3", class: "threshold"}, svg);
    }
    for (const mx of (opts.marks || [])) {
      if (!inRange(mx)) continue;
      const m = svgEl("line", {x1: px(mx), x2: px(mx), y1: T, y2: H - B, stroke: "#6b7280", "stroke-dasharray": "2 3",
                               class: "resume-mark"}, svg);
      if (opts.markTitle) svgEl("title", {}, m).textContent = `${mx}: ${opts.markTitle}`;
    }
    for (const fx of (opts.flags || [])) {
      if (!inRange(fx)) continue;
      svgEl("rect", {x: px(fx) - 2, y: T, width: 4, height: H - T - B, fill: "#fecaca", class: "red-flag"}, svg);
    }
    series.forEach((s, k) => {
      const pts = s.x.map((x, i) => [x, s.y[i]]).filter(p => inRange(p[0]));
      if (!pts.length) return;
      const d = pts.map((p, i) => (i ? "L" : "M") + px(p[0]).toFixed(1) + " " + py(p[1]).toFixed(1)).join(" ");
      const color = s.color || COLORS[k % COLORS.length];
      svgEl("path", {d, fill: "none", stroke: color, "stroke-width": s.dash ? 1 : 1.5,
                     "vector-effect": "non-scaling-stroke", class: s.cls || "series",
                     ...(s.dash ? {"stroke-dasharray": s.dash} : {})}, svg);
      if (pts.length < 40 && !s.dash) {
        for (const p of pts) {
          const c = svgEl("circle", {cx: px(p[0]), cy: py(p[1]), r: 2, fill: color}, svg);
          svgEl("title", {}, c).textContent = `${s.name} @ ${p[0]}: ${p[1]}`;
        }
      }
    });
    svg._px = px;
  }

  let dragFrom = null, band = null;
  const toX = (ev) => {
    const box = svg.getBoundingClientRect();
    const vx = (ev.clientX - box.left) / box.width * W;
    return range[0] + (vx - L) / (W - L - R) * (range[1] - range[0]);
  };
  svg.addEventListener("mousedown", (ev) => { dragFrom = toX(ev); });
  svg.addEventListener("mousemove", (ev) => {
    if (dragFrom === null) return;
    if (!band) band = svgEl("rect", {y: T, height: H - T - B, fill: "rgba(96,165,250,0.25)"}, svg);
    const a = svg._px(Math.min(dragFrom, toX(ev))), b = svg._px(Math.max(dragFrom, toX(ev)));
    band.setAttribute("x", a); band.setAttribute("width", Math.max(b - a, 0));
  });
  svg.addEventListener("mouseup", (ev) => {
    const to = toX(ev);
    if (dragFrom !== null && Math.abs(to - dragFrom) > (range[1] - range[0]) / 100) {
      range = [Math.max(full[0], Math.min(dragFrom, to)), Math.min(full[1], Math.max(dragFrom, to))];
    }
    dragFrom = null; band = null; draw();
  });
  svg.addEventListener("dblclick", () => { range = full.slice(); draw(); });
  draw();
  return svg;
}
