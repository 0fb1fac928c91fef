// The dashboard page: one view at a time, chosen by the URL hash (#metrics, #timeline,
// #rollouts, #sample/<rollout>/<index>), each drawn from the server's /api JSON.
"use strict";
const TOKEN = new URLSearchParams(location.search).get("token");
const PHASE_COLORS = {rollout: "#60a5fa", train: "#a78bfa", log_probs: "#34d399", actor_train: "#f59e0b",
                      update_weights: "#f472b6", checkpoint: "#94a3b8", eval: "#22d3ee", decode: "#93c5fd",
                      log_tokens: "#ef4444", token_stats: "#ef4444",
                      // a training rank's own phases, and its waits for the other ranks (light grey)
                      ref_log_probs: "#6ee7b7", forward: "#fbbf24", backward: "#d97706", grad_reduce: "#8b5cf6",
                      optimizer: "#c084fc", wait: "#e5e7eb",
                      // an engine's own phases of a weight push (its waits are `wait` spans too)
                      receive: "#0ea5e9", apply: "#be185d", pause: "#facc15", continue: "#4ade80",
                      // the router's lane: bursts of proxied requests, and its admin events (instants)
                      proxy: "#fdba74", add_worker: "#15803d", readmit: "#15803d", remove_worker: "#b91c1c",
                      quarantine: "#b91c1c", update_weight_version: "#db2777",
                      // a trainer taking over from a checkpoint: a chunk of `miles train` after the first, a resume
                      resume: "#6b7280"};
let RUN = null;
let lastSeen = null;
let lastState = null;
const RESUME_NOTE = "resume: a new trainer continued from a checkpoint here (a chunk boundary of `miles train`, " +
  "or a resume after a crash); its first iteration reloads weights and reopens the trackers, so seconds of " +
  "perf/train_time there are expected";

async function api(path) {
  const res = await fetch(path, {headers: TOKEN ? {Authorization: "Bearer " + TOKEN} : {}});
  if (!res.ok) throw new Error(`${errorText((await res.json().catch(() => ({}))).detail)} (${path}: ${res.status})`);
  return res.json();
}

// A refusal's detail as words: the server's sentence, or for a bad query value (a 422 lists them as
// {loc: ["query", "min_reward"], msg}) each field and what is wrong with it, never "[object Object]".
function errorText(detail) {
  if (detail === undefined || detail === null || detail === "") return "the server refused";
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map(d => (d && d.loc && d.msg) ?
    `${d.loc.filter(p => p !== "query" && p !== "path" && p !== "body").join(".")}: ${d.msg}` +
    (d.input !== undefined ? ` (got ${JSON.stringify(d.input)})` : "") : asText(d)).join("; ");
  return asText(detail);
}

// The "diagnose" button: POST /api/diagnose, then the verdict and the bundle's path above the view.
async function diagnose() {
  const button = document.getElementById("diagnose-button");
  const box = document.getElementById("diagnosis");
  button.disabled = true;
  box.hidden = false;
  box.replaceChildren(el("div", {class: "diagnosis-wait"}, "Diagnosing (stacks of every process, Ray, logs)..."));
  try {
    const headers = {"Content-Type": "application/json", ...(TOKEN ? {Authorization: "Bearer " + TOKEN} : {})};
    const res = await fetch("/api/diagnose", {method: "POST", headers, body: "{}"});
    const body = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(body.detail || body.error || `${res.status}`);
    const v = body.verdict;
    box.replaceChildren(
      el("div", {class: "diagnosis-headline " + v.status, id: "diagnosis-headline"}, verdictLine(v)),
      el("ul", {class: "diagnosis-details"}, ...v.details.map((d) => el("li", {}, d))),
      el("div", {class: "diagnosis-bundle"}, "bundle: ", el("code", {id: "diagnosis-bundle"}, body.bundle)));
  } catch (err) {
    box.replaceChildren(el("div", {class: "diagnosis-error", id: "diagnosis-error"}, "diagnose failed: " + err.message));
  } finally {
    button.disabled = false;
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "onclick" || k === "onchange") node[k] = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

// One legend entry: a swatch of the line's colour (dashed for a threshold or bound), then its name.
const legendItem = (name, color, dashed) => el("span", {class: "legend-item"},
  el("i", {class: "swatch" + (dashed ? " dashed" : ""), style: `border-top-color: ${color}`}), name);

// Any value as text (a hand-edited sample may hold null or a number where text belongs).
const asText = (v) => (v === null || v === undefined) ? "" : (typeof v === "string" ? v : JSON.stringify(v));
const fmt = (v) => (v === null || v === undefined) ? "–" : (typeof v === "number" ? Number(v.toPrecision(4)) : v);

function notice(run) {
  const box = document.getElementById("notice");
  box.replaceChildren();
  if (run.health && run.health.state === "healthy") box.append(el("div", {class: "healthy", id: "health-ok",
    title: "signals checked: " + run.health.signals.join(", ")}, healthLine(run.health.rollouts, run.health.signals)));
  if (run.health && run.health.state === "available") box.append(flaggedLine(run.health));
  if (run.missing.length) box.append(el("div", {class: "missing", id: "missing"},
    "Not available in this run directory: " + run.missing.join(", ")));
  if (run.off && run.off.length) box.append(el("div", {class: "off", id: "off"}, run.off.join("; ")));
  if (run.corrupt.length) box.append(el("div", {class: "missing"}, "Skipped: " + run.corrupt.join("; ")));
}

// A healthy run writes no health.jsonl; the journal's health/<signal> figures show the watch ran. The
// banner is on every view, so it counts the signals; their names are its tooltip and `miles doctor`'s rows.
const healthLine = (rollouts, signals) =>
  `Health watch: no red flags in ${rollouts} rollouts (${signals.length} signals checked)`;

// A run with flags keeps its line (first-hour N32): red when any flag is red, amber for warnings.
function flaggedLine(h) {
  const list = counts => Object.entries(counts || {}).map(([s, n]) => `${s} (${n})`).join(", ");
  const red = Object.keys(h.red || {}).length;
  const text = red ? `Health watch: red flags on ${list(h.red)}` +
    (Object.keys(h.warning || {}).length ? `; warnings on ${list(h.warning)}` : "")
    : `Health watch: no red flags in ${h.rollouts} rollouts; warnings on ${list(h.warning)}`;
  return el("div", {class: red ? "health-red" : "health-warn", id: "health-flags"}, text);
}

// ---- metrics ---------------------------------------------------------------------------
// The diagnosis's first line: its status, unless the headline already starts with it (review N34:
// a finished run read "finished: finished: all 12 rollouts ...").
function verdictLine(v) {
  return v.headline.startsWith(v.status + ":") ? v.headline : `${v.status}: ${v.headline}`;
}

// A path that wraps at its slashes, not mid-name (review N34: "runs/20261207-" /
// "030252/checkpoints/iter_000"): each "/" is followed by a line-break opportunity (<wbr>).
// Each part is one span (class path-part) that wraps as a whole: a "-" in a name is a break
// opportunity too, and "runs/20261207-" / "120215/checkpoints/" still broke after the <wbr>s.
function pathBreaks(path) {
  const part = (text) => el("span", {class: "path-part"}, text);
  return path.split("/").flatMap((name, i, names) =>
    i < names.length - 1 ? [part(name + "/"), el("wbr", {})] : [part(name)]);
}

// A figure as the terminal's scorecard prints it (Python's f"{v:.3f}"): an exact tie such as a
// reward of 0.3125 (80 of 256 samples) rounds to even there ("0.312"); toFixed rounds it up.
function scoreFigure(v, digits = 3) {
  if (v === null || v === undefined) return "–";
  const scaled = v * 10 ** digits;  // exact for a dyadic v (k / 2^n), the only kind that can tie
  const dyadic = Number.isInteger(v * 2 ** 24) && Math.abs(scaled) < 2 ** 30;
  if (dyadic && scaled - Math.floor(scaled) === 0.5) {
    const even = Math.floor(scaled) % 2 === 0 ? Math.floor(scaled) : Math.floor(scaled) + 1;
    return (even / 10 ** digits).toFixed(digits);
  }
  return v.toFixed(digits);
}

// The run's headline (first-hour N9): the scorecard's numbers, as the terminal, Prefect and MLflow show them.
function summaryCard(s) {
  const num = scoreFigure;
  const evalText = s.eval_key ? `${num(s.base_eval)} → ${num(s.final_eval)}` +
    (s.final_eval_rollout !== null ? ` (after rollout ${s.final_eval_rollout})` : "") : "no eval";
  const reward = s.reward_first ? `${num(s.reward_first[1])} → ${num(s.reward_last[1])}` +
    ` (rollouts ${s.reward_first[0]}–${s.reward_last[0]})` : "not logged";
  const cells = [
    ["state", s.state], ["rollouts", `${s.rollouts}` + (s.num_rollout ? ` of ${s.num_rollout}` : "")],
    ["training", s.duration ?? "–", s.duration_note], [s.eval_key ? s.eval_key.replace("eval/", "held-out ") : "held-out eval", evalText],
    [s.reward_key, reward], ["red flags", s.red_flags], ["model", s.checkpoint ?? "no checkpoint saved"]];
  const ok = !s.red.length;
  return el("div", {class: "summary", id: "run-summary"},
    el("div", {class: "summary-verdict " + (ok ? "ok" : "flag"), id: "summary-verdict"}, s.verdict),
    el("div", {class: "summary-grid"}, ...cells.map(([k, v, title]) => el("div", {class: "summary-cell",
      "data-key": k, ...(title ? {title} : {})}, el("div", {class: "summary-label"}, k),
      el("div", {class: "summary-value"},
        ...(k === "model" ? pathBreaks(String(v)) : [String(v)]))))));
}

// x positions of the resumes on a chart's step axis
const resumeMarks = (resumes, axis) => (resumes || []).map(r => r.x[axis]).filter(x => x !== undefined && x !== null);

async function showMetrics(view) {
  const [watch, metrics, summary] = await Promise.all([api("/api/watch"), api("/api/metrics"), api("/api/summary")]);
  view.append(summaryCard(summary));
  if (metrics.resumes.length) {
    view.append(el("div", {class: "legend", id: "resume-note"}, legendItem("", "#6b7280", true),
      `${metrics.resumes.length} resume(s), at rollout ${metrics.resumes.map(r => r.rollout_id).join(", ")}: ` + RESUME_NOTE));
  }
  view.append(el("h2", {}, "What to watch"));
  if (watch.health === "healthy") {
    view.append(el("div", {class: "legend", id: "watch-healthy"},
      `Health verdicts: none (the watch judged ${watch.health_rollouts} rollouts and flagged nothing to mark below)`));
  } else if (watch.health !== "available") {
    view.append(el("div", {class: "legend"}, "Health verdicts: not available (no health watch in this run)"));
  }
  const grid = el("div", {class: "grid", id: "watch-panels"});
  view.append(grid);
  for (const p of watch.panels) {
    const box = el("div", {class: "panel watch-panel"}, el("h3", {}, p.title),
      el("div", {class: "legend"}, `healthy: ${p.healthy} · `, el("span", {class: "flag"}, `red flag: ${p.red_flag}`)));
    grid.append(box);
    const series = Object.entries(p.series).map(([k, s]) => ({name: k, x: s.x, y: s.y}));
    if (!series.length) { box.append(el("div", {class: "na"}, "not logged")); continue; }
    const axis = Object.values(p.series)[0].step_key;
    lineChart(box, series, {threshold: p.threshold, flags: p.flag_steps, xlabel: axis,
                            marks: resumeMarks(watch.resumes, axis), markTitle: RESUME_NOTE});
    const legend = el("div", {class: "legend"},
      ...series.map((s, k) => legendItem(s.name, COLORS[k % COLORS.length])));
    if (p.threshold_label) legend.append(legendItem(p.threshold_label, "#dc2626", true));
    box.append(legend);
    for (const v of p.verdicts.slice(-3)) {
      box.append(el("div", {class: "flag"}, `rollout ${v.rollout_id} ${v.severity}: ${v.message}`));
    }
  }
  await showRouting(view);
  await showMismatch(view);
  if (watch.other_verdicts.length) {
    view.append(el("h3", {}, "Other health verdicts"), el("ul", {id: "other-verdicts"}, ...watch.other_verdicts.map(v =>
      el("li", {class: "flag"}, `rollout ${v.rollout_id} ${v.signal} ${v.severity}: ${v.message}`))));
  }
  for (const [ns, keys] of Object.entries(metrics.namespaces)) {
    view.append(el("h2", {}, ns + "/"));
    // a series that never moved (the health watch's 0s, a router that saw no error) says so in one line
    const isFlat = (key) => { const y = metrics.series[key].y; return y.length > 1 && y.every(v => v === y[0]); };
    const flat = keys.filter(isFlat);
    if (flat.length) {
      view.append(el("div", {class: "legend flat", "data-namespace": ns},
        `flat over the run (${flat.length}): ` + flat.map(k => `${k} = ${fmt(metrics.series[k].y[0])}`).join(", ")));
    }
    const g = el("div", {class: "grid"});
    view.append(g);
    for (const key of keys.filter(k => !isFlat(k))) {
      const s = metrics.series[key];
      const box = el("div", {class: "panel metric-panel"}, el("h3", {}, key));
      g.append(box);
      lineChart(box, [{name: key, x: s.x, y: s.y}], {xlabel: s.step_key, marks: resumeMarks(metrics.resumes, s.step_key),
                                                      markTitle: RESUME_NOTE});
    }
  }
}

// ---- timeline --------------------------------------------------------------------------
async function showTimeline(view) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const rid = params.get("rollout");
  const data = await api("/api/timeline" + (rid !== null ? "?rollout_id=" + rid : ""));
  const bar = el("div", {class: "filters"});
  const link = el("a", {href: "/api/timeline/chrome" + (TOKEN ? "?token=" + encodeURIComponent(TOKEN) : ""),
                        id: "chrome-trace"}, "Chrome trace (open in ui.perfetto.dev)");
  const input = el("input", {type: "number", id: "timeline-rollout", placeholder: "all", value: rid ?? ""});
  input.onchange = () => { location.hash = "#timeline" + (input.value !== "" ? "?rollout=" + input.value : ""); };
  bar.append(el("label", {}, "rollout", input), link);
  view.append(el("h2", {}, "Timeline"), bar);
  if (!data.spans.length) {
    view.append(el("div", {class: "na"}, data.available ? "no spans for this selection" :
      "Timeline: not available (no timeline.jsonl in this run)"));
    return;
  }
  const W = 1200, laneH = 26, top = 20, left = 240;
  const H = top + data.lanes.length * laneH + 20;
  const svg = svgEl("svg", {class: "timeline", id: "timeline-svg", viewBox: `0 0 ${W} ${H}`}, view);
  // Open on the training iterations (an engine's start-up probes can come long before them);
  // drag across to zoom, double-click for everything.
  const trained = data.spans.filter(s => s.rollout_id !== null && s.rollout_id !== undefined);
  const full = [data.start, data.end];
  let range = trained.length ? [Math.min(...trained.map(s => s.start)), Math.max(...trained.map(s => s.end))] : full;
  function draw() {
    svg.replaceChildren();
    const span = (range[1] - range[0]) || 1;
    const px = (t) => left + (t - range[0]) / span * (W - left - 10);
    data.lanes.forEach((lane, i) => {
      const y = top + i * laneH;
      svgEl("text", {x: 4, y: y + 16}, svg).textContent =
        `${lane} (${Math.round(100 * data.utilization[lane])}% busy)`;
      svgEl("line", {x1: left, x2: W - 10, y1: y + laneH, y2: y + laneH, stroke: "#f3f4f6"}, svg);
    });
    for (const s of data.spans) {
      if (s.end < range[0] || s.start > range[1]) continue;
      const i = data.lanes.indexOf(s.lane);
      const x0 = Math.max(px(s.start), left), x1 = Math.min(px(s.end), W - 10);
      const r = svgEl("rect", {x: x0, y: top + i * laneH + 3, height: laneH - 6, class: "span",
                               width: Math.max(x1 - x0, 1), fill: PHASE_COLORS[s.name] || "#cbd5e1",
                               "data-lane": s.lane, "data-name": s.name}, svg);
      svgEl("title", {}, r).textContent =
        `${s.lane} ${s.name}` + (s.rollout_id !== null && s.rollout_id !== undefined ? ` rollout ${s.rollout_id}` : "") +
        `: ${(s.end - s.start).toFixed(3)} s` + (s.args ? " " + JSON.stringify(s.args) : "");
    }
    for (const s of data.spans.filter(sp => sp.name === "resume" && sp.lane === "trainer")) {
      if (s.start < range[0] || s.start > range[1]) continue;
      const m = svgEl("line", {x1: px(s.start), x2: px(s.start), y1: top, y2: H - 20, stroke: "#6b7280",
                               "stroke-dasharray": "3 3", class: "resume-mark"}, svg);
      svgEl("title", {}, m).textContent = `rollout ${s.rollout_id}: ` + RESUME_NOTE;
    }
    for (let k = 0; k <= 4; k++) {
      const t = range[0] + span * k / 4;
      svgEl("text", {x: px(t), y: 12, "text-anchor": k === 4 ? "end" : "middle", class: "time-tick"}, svg)
        .textContent = (t - data.start).toFixed(2) + " s";
    }
    markPicked(svg);
    svg._toTime = (clientX) => {
      const box = svg.getBoundingClientRect();
      return range[0] + ((clientX - box.left) / box.width * W - left) / (W - left - 10) * span;
    };
  }
  let from = null;
  svg.addEventListener("mousedown", (ev) => { from = svg._toTime(ev.clientX); });
  svg.addEventListener("mouseup", (ev) => {
    const to = svg._toTime(ev.clientX);
    if (from !== null && Math.abs(to - from) > (range[1] - range[0]) / 200) {
      range = [Math.max(full[0], Math.min(from, to)), Math.min(full[1], Math.max(from, to))];
      draw();
    }
    from = null;
  });
  svg.addEventListener("dblclick", () => { range = full.slice(); draw(); });
  draw();
  const seen = new Set(data.spans.map(sp => sp.name));
  view.append(el("div", {class: "legend", id: "timeline-legend"}, ...Object.entries(PHASE_COLORS)
    .filter(([n]) => seen.has(n)).map(([n, c]) => el("span", {style: `border-left: 10px solid ${c}; padding-left: 4px`}, n))));
  await showRankHeatmap(view);
  view.append(el("h2", {}, "Profiler windows"));
  if (!data.profiler.available) {
    view.append(el("div", {class: "legend"}, "Profiler summaries: not available (no profiler/summaries.jsonl)"));
  } else {
    const t = el("table", {}, el("tr", {}, ...["target", "rank", "start", "end", "trace", "top ops"].map(h =>
      el("th", {}, h))));
    data.profiler.summaries.forEach((p, i) => {
      const ops = (p.top_ops || []).slice(0, 3).map(o => typeof o === "string" ? o : (o.name || JSON.stringify(o)));
      const trace = el("a", {href: `/api/profiler/${i}/trace` +
        (TOKEN ? "?token=" + encodeURIComponent(TOKEN) : "")}, String(fmt(p.trace)));
      t.append(el("tr", {}, ...[p.target, p.rank, p.start, p.end].map(v =>
        el("td", {}, String(fmt(v)))), el("td", {}, trace), el("td", {}, ops.join(", "))));
    });
    view.append(t);
  }
}

// The rank x phase heat map (/api/ranks): each training rank's own work per phase over the run,
// its waits for the other ranks left out; a cell's colour is its ratio to the phase's median over
// the ranks (1x white, 2x and more red), so the rank the others wait for stands out in any phase.
const RANK_RATIO = {low: 1, high: 2};

// A heat map cell's click picks that rank's spans of that phase on the timeline above: they get
// the class `picked` (outlined), the rest fade; a second click on the same cell clears it.
function markPicked(svg) {
  const pick = svg.dataset.pick ? JSON.parse(svg.dataset.pick) : null;
  for (const r of svg.querySelectorAll("rect.span")) {
    const hit = pick && r.dataset.lane === pick.lane && r.dataset.name === pick.phase;
    r.classList.toggle("picked", !!hit);
    r.classList.toggle("faded", !!pick && !hit);
  }
}

function pickRankPhase(rank, phase) {
  showRankTraces(rank);
  const svg = document.getElementById("timeline-svg");
  if (!svg) return;
  const pick = JSON.stringify({lane: rank.lane, phase});
  svg.dataset.pick = svg.dataset.pick === pick ? "" : pick;
  markPicked(svg);
  svg.scrollIntoView({block: "nearest"});
}

// Under the map: the picked rank's profiler windows, each a download of its Chrome trace
// (/api/profiler/<i>/trace; open it in Perfetto or chrome://tracing).
function showRankTraces(rank) {
  const box = document.getElementById("rank-heatmap-traces");
  if (!box) return;
  box.replaceChildren(`${rank.lane} (${rank.coords}): `);
  if (!rank.traces || !rank.traces.length) {
    box.append("no profiler window ran on this rank (--use-pytorch-profiler, --profile-ranks)");
    return;
  }
  box.append("profiler traces: ");
  rank.traces.forEach((w, i) => {
    if (i) box.append(", ");
    box.append(el("a", {class: "rank-trace", href: `/api/profiler/${w.index}/trace` +
      (TOKEN ? "?token=" + encodeURIComponent(TOKEN) : "")},
      `${w.target} rollouts ${w.start}-${w.end}`));
  });
}

async function showRankHeatmap(view) {
  const data = await api("/api/ranks");
  view.append(el("h2", {}, "Ranks x phases (own work over the run)"));
  if (!data.available) {
    view.append(el("div", {class: "legend", id: "rank-heatmap-na"},
      "Rank heat map: not available (no rank phase spans with coordinates in timeline.jsonl: " +
      "one rank, or a fake backend)"));
    return;
  }
  const t = el("table", {class: "rank-heatmap", id: "rank-heatmap"},
    el("tr", {}, el("th", {}, "rank"), ...data.phases.map(p => el("th", {}, p))));
  data.ranks.forEach((rank, i) => {
    const name = el("td", {}, `${rank.lane} (${rank.coords})`);
    t.append(el("tr", {}, name, ...data.phases.map((p, j) =>
      el("td", {class: "rank-cell", style: heat(data.ratio[i][j], RANK_RATIO),
                onclick: () => pickRankPhase(rank, p),
                title: `${rank.coords} ${p}: ${data.seconds[i][j].toFixed(3)} s, ` +
                       `${data.ratio[i][j].toFixed(2)}x the ranks' median`},
         data.seconds[i][j].toFixed(3) + " s"))));
  });
  const h = data.hottest;
  view.append(el("div", {class: "legend", id: "rank-heatmap-hottest"},
    `slowest: ${h.coords} in ${h.phase}, ${h.seconds.toFixed(3)} s ` +
    `vs median ${h.median.toFixed(3)} s (${h.ratio.toFixed(2)}x) over ${data.rollouts} rollouts `,
    el("span", {class: "scale"}), " 1x to 2x"), t,
    el("div", {class: "legend", id: "rank-heatmap-traces"},
      "click a cell: that rank's spans of that phase above, and its profiler traces here"));
}

// The routing panel (/api/routing, MoE runs only): each MoE layer's busiest expert per rollout,
// the cell coloured by that expert's share of the layer's tokens, from balanced (k/E, white) to
// every token (1, red); a dead expert outlines the cell, a router_collapse red flag marks its
// rollout (its message is listed under 'Other health verdicts').
const pct = (v) => (v === null || v === undefined) ? "–" : (100 * v).toFixed(1) + "%";

function routingCell(data, layer, c, rollout) {
  if (!c) return el("td", {class: "routing-cell"}, "");
  const balanced = c.balanced ?? 0;
  const kind = "routing-cell" + (c.dead > 0 ? " dead" : "") + (c.share > data.bound ? " over" : "");
  return el("td", {class: kind, style: heat(c.share, {low: balanced, high: 1}),
    title: `layer ${layer}, rollout ${rollout}: expert ${fmt(c.expert)} took ${pct(c.share)} ` +
           `of the tokens (balanced ${pct(balanced)}), ${fmt(c.dead)} dead expert(s), ` +
           `load-balancing loss ${fmt(c.loss)}`}, fmt(c.expert));
}

async function showRouting(view) {
  const data = await api("/api/routing");
  if (!data.available) return;  // a dense model has no router
  view.append(el("h2", {}, "Routing (MoE): each layer's busiest expert"));
  const t = el("table", {class: "routing-heatmap", id: "routing-heatmap"},
    el("tr", {}, el("th", {}, "layer / rollout"), ...data.rollouts.map(r =>
      el("th", {class: data.flagged.includes(r) ? "flag" : ""}, String(r)))));
  data.layers.forEach((layer, i) => t.append(el("tr", {}, el("td", {}, `layer ${layer}`),
    ...data.cells[i].map((c, j) => routingCell(data, layer, c, data.rollouts[j])))));
  const w = data.worst;
  view.append(el("div", {class: "legend", id: "routing-worst"},
    `busiest: expert ${fmt(w.expert)} of layer ${w.layer}, ${pct(w.share)} of its tokens at ` +
    `rollout ${w.rollout_id} (balanced: ${pct(w.balanced)}; a red flag above ` +
    `${pct(data.bound)} for --health-router-collapse-window rollouts) `,
    el("span", {class: "scale"}), " balanced to all"), t);
}

// The mismatch panel (/api/mismatch): where in the response the train-vs-rollout mismatch
// sits, per rollout and response-position bucket, the cell coloured by the bucket's k3
// estimate of KL(rollout || train) from 0 (white) to the run's largest (red).
function mismatchCell(data, c, rollout, bucket) {
  if (!c) return el("td", {class: "mismatch-cell"}, "");
  return el("td", {class: "mismatch-cell", style: heat(c.k3, {low: 0, high: data.max || 1}),
    title: `rollout ${rollout}, response tokens ${bucket}: k3 ${fmt(c.k3)}, ` +
           `mean |log p_train - log p_rollout| ${fmt(c.abs_diff)}, ${pct(c.tokens)} of its tokens`},
    c.k3.toExponential(1));
}

async function showMismatch(view) {
  const data = await api("/api/mismatch");
  if (!data.available) return;  // a journal from before the per-position figures
  view.append(el("h2", {}, "Train-vs-rollout mismatch by response position (k3)"));
  const t = el("table", {class: "mismatch-heatmap", id: "mismatch-heatmap"},
    el("tr", {}, el("th", {}, "rollout / tokens"), ...data.buckets.map(b => el("th", {}, b)),
      el("th", {}, "all k3"), el("th", {}, "ratio p99")));
  data.rollouts.forEach((r, i) => t.append(el("tr", {}, el("td", {}, String(r)),
    ...data.cells[i].map((c, j) => mismatchCell(data, c, r, data.buckets[j])),
    el("td", {}, fmt(data.k3[i])), el("td", {}, fmt(data.ratio_p99[i])))));
  const w = data.worst;
  view.append(el("div", {class: "legend", id: "mismatch-worst"},
    `largest: k3 ${fmt(w.k3)} at response tokens ${w.bucket} of rollout ${w.rollout_id} `,
    el("span", {class: "scale"}), " 0 to largest"), t);
}

// ---- rollouts --------------------------------------------------------------------------
const FILTERS = ["min_reward", "max_reward", "min_length", "max_length", "min_turns", "max_turns"];

async function showRollouts(view) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const list = (await api("/api/rollouts")).rollouts;
  view.append(el("h2", {}, "Rollouts"));
  if (!list.length) {
    view.append(el("div", {class: "na"}, "Sample tables: not available (logged every --log-samples-interval rollouts)"));
    return;
  }
  const rid = params.get("rollout") ?? String(list[list.length - 1].rollout_id);
  const pick = el("select", {id: "rollout-select"}, ...list.map(r => {
    const o = el("option", {value: r.rollout_id},
      `rollout ${r.rollout_id}: ${r.samples} samples, reward ${fmt(r.mean_reward)}, ` +
      `${r.zero_std_groups}/${r.groups} zero-std groups`);
    if (String(r.rollout_id) === rid) o.selected = true;
    return o;
  }));
  const form = el("div", {class: "filters", id: "filters"}, el("label", {}, "rollout", pick));
  const inputs = {};
  for (const f of FILTERS) {
    inputs[f] = el("input", {type: "number", step: "any", id: "f-" + f, value: params.get(f) ?? ""});
    form.append(el("label", {}, f.replace("_", " "), inputs[f]));
  }
  for (const f of ["truncated", "zero_std"]) {
    inputs[f] = el("select", {id: "f-" + f}, el("option", {value: ""}, "any"), el("option", {value: "true"}, "yes"),
                   el("option", {value: "false"}, "no"));
    inputs[f].value = params.get(f) ?? "";
    form.append(el("label", {}, f.replace("_", " "), inputs[f]));
  }
  const apply = el("button", {id: "apply-filters"}, "Filter");
  apply.onclick = () => {
    const q = new URLSearchParams({rollout: pick.value});
    for (const [k, i] of Object.entries(inputs)) if (i.value !== "") q.set(k, i.value);
    location.hash = "#rollouts?" + q.toString();
  };
  pick.onchange = apply.onclick;
  form.append(apply);
  view.append(form);
  const q = new URLSearchParams();
  for (const f of [...FILTERS, "truncated", "zero_std"]) if (params.get(f)) q.set(f, params.get(f));
  const data = await api(`/api/rollouts/${rid}?` + q.toString());
  view.append(el("div", {class: "legend", id: "rollout-count"}, `${data.samples.length} of ${data.total} samples`));
  const table = el("table", {id: "samples-table"}, el("tr", {}, ...["#", "group", "reward", "advantage", "length",
    "status", "turns", "zero std", "prompt", "label", "response"].map(h => el("th", {}, h))));
  for (const s of data.samples) {
    const row = el("tr", {class: "sample-row", "data-index": s.index},
      el("td", {}, String(s.index)), el("td", {}, String(s.group_index ?? "–")), el("td", {}, String(fmt(s.reward))),
      el("td", {class: "advantage"}, String(fmt(s.advantage))), el("td", {}, String(s.response_length)), el("td", {}, asText(s.status)), el("td", {}, String(s.turns)),
      el("td", {class: s.zero_std ? "zero" : ""}, s.zero_std ? "zero std" : ""),
      el("td", {class: "text"}, asText(s.prompt).slice(-120)), el("td", {class: "text label"}, asText(s.label).slice(0, 80)),
      el("td", {class: "text"}, asText(s.response).slice(0, 160)));
    row.onclick = () => { location.hash = `#sample/${rid}/${s.index}`; };
    table.append(row);
  }
  view.append(table);
}

// ---- one sample: tokens and conversation ----------------------------------------------
const COLOR_BY = {
  rollout_log_probs: {label: "rollout log-prob", value: (t, i) => t.rollout_log_probs[i], low: -6, high: 0, invert: true},
  log_probs: {label: "training log-prob", value: (t, i) => t.log_probs[i], low: -6, high: 0, invert: true},
  abs_diff: {label: "|training - rollout| log-prob", value: (t, i) =>
    (t.log_probs[i] === undefined || t.rollout_log_probs[i] === undefined) ? undefined :
      Math.abs(t.log_probs[i] - t.rollout_log_probs[i]), low: 0, high: 0.5},
  entropy: {label: "entropy", value: (t, i) => t.entropy[i], low: 0, high: 3},
};

// A token's style: white -> yellow -> orange -> red as the value gets worse; light text on dark.
function heat(v, spec) {
  if (v === undefined || v === null) return "";
  let f = (v - spec.low) / (spec.high - spec.low);
  f = Math.min(1, Math.max(0, spec.invert ? 1 - f : f));
  const stops = [[255, 255, 255], [253, 230, 138], [249, 115, 22], [185, 28, 28]];
  const p = f * (stops.length - 1), k = Math.min(Math.floor(p), stops.length - 2), w = p - k;
  const c = stops[k].map((a, j) => Math.round(a + (stops[k + 1][j] - a) * w));
  return `background:rgb(${c.join(",")})` + (f > 0.6 ? ";color:#fff" : "");
}

async function showSample(view) {
  const parts = location.hash.split("?")[0].split("/");
  if (parts.length < 3) {
    view.append(el("h2", {}, "Tokens"), el("div", {class: "na"}, "Pick a sample in the Rollouts view."));
    return;
  }
  const [rid, index] = [parts[1], parts[2]];
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const by = params.get("color") || "rollout_log_probs";
  const d = await api(`/api/rollouts/${rid}/samples/${index}`);
  const s = d.sample;
  view.append(el("h2", {id: "sample-title"}, `Rollout ${rid}, sample ${index}`));
  view.append(el("div", {class: "kv"}, ...[["reward", s.reward], ["raw reward", s.raw_reward],
    ["advantage", s.advantage], ["length", s.response_length], ["status", s.status], ["group", s.group_index],
    ["label", s.label], ["weights", s.weight_version]].map(([k, v]) => el("span", {}, `${k}: ${fmt(v)}`))));
  if (s.zero_std) view.append(el("div", {class: "zero"}, "zero-std group: every sample of this prompt got the same reward"));
  if (d.messages) {
    view.append(el("h2", {}, "Conversation"));
    const conv = el("div", {class: "conversation", id: "conversation"});
    for (const m of d.messages) {
      const body = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
      const msg = el("div", {class: "msg " + (m.role || "")}, el("div", {class: "role"}, m.role || "?"), body);
      for (const call of (m.tool_calls || [])) {
        const fn = call.function || call;
        msg.append(el("div", {class: "role"}, `tool call: ${fn.name}(${typeof fn.arguments === "string" ?
          fn.arguments : JSON.stringify(fn.arguments)})`));
      }
      conv.append(msg);
    }
    view.append(conv);
  }
  view.append(el("h2", {}, "Tokens"));
  if (!d.tokens) { view.append(el("div", {class: "na", id: "tokens-na"}, d.tokens_note)); return; }
  const pick = el("select", {id: "color-by"}, ...Object.entries(COLOR_BY).map(([k, c]) => {
    const o = el("option", {value: k}, c.label);
    if (k === by) o.selected = true;
    return o;
  }));
  pick.onchange = () => { location.hash = `#sample/${rid}/${index}?color=${pick.value}`; };
  const spec = COLOR_BY[by];
  view.append(el("div", {class: "filters"}, el("label", {}, "colour by", pick),
    el("span", {}, `${spec.invert ? spec.high : spec.low} `, el("span", {class: "scale"}),
       ` ${spec.invert ? spec.low : spec.high}${spec.invert ? " (darker: less likely)" : ""}`),
    el("span", {}, "dimmed: observation tokens (loss mask 0)")));
  const box = el("div", {class: "tokens", id: "token-strip"}, el("span", {class: "prompt"}, asText(s.prompt)));
  const t = d.tokens;
  t.ids.forEach((id, i) => {
    const masked = t.loss_mask && t.loss_mask[i] === 0;
    const tok = el("span", {class: "tok" + (masked ? " masked" : ""), style: heat(spec.value(t, i), spec)},
                   t.text[i]);
    tok.title = `token ${i} id ${id}\nrollout log-prob ${fmt(t.rollout_log_probs[i])}\n` +
      `training log-prob ${fmt(t.log_probs[i])}\nentropy ${fmt(t.entropy[i])}\nloss mask ${t.loss_mask[i]}`;
    box.append(tok);
  });
  view.append(box);
  const positions = t.ids.map((_, i) => i);
  const strips = [["rollout log-prob", t.rollout_log_probs], ["training log-prob", t.log_probs],
                  ["|difference|", COLOR_BY.abs_diff && t.ids.map((_, i) => COLOR_BY.abs_diff.value(t, i))],
                  ["entropy", t.entropy]].filter(([, ys]) => ys && ys.length === t.ids.length && ys.every(
                    v => v !== undefined));
  const grid = el("div", {class: "grid", id: "token-charts"});
  for (const [name, ys] of strips) {
    const panel = el("div", {class: "panel"}, el("h3", {}, name + " per token"));
    lineChart(panel, [{name, x: positions, y: ys}], {xlabel: "token"});
    grid.append(panel);
  }
  view.append(grid);
}

// ---- per-prompt evals: which held-out prompts the model still fails ---------------------
async function showEvals(view) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const step = params.get("step");
  const data = await api("/api/evals" + (step !== null ? "?step=" + encodeURIComponent(step) : ""));
  view.append(el("h2", {}, "Held-out eval, prompt by prompt"));
  if (!data.available) {
    view.append(el("div", {class: "na", id: "evals-na"}, "Per-prompt eval results: not available (samples/eval/ is written by each eval)"));
    return;
  }
  const pick = el("select", {id: "eval-step"}, ...data.steps.map(s => {
    const o = el("option", {value: s}, s === 0 ? "step 0 (the base eval, before training)" : `eval step ${s}`);
    if (s === data.step) o.selected = true;
    return o;
  }));
  pick.onchange = () => { location.hash = "#evals?step=" + pick.value; };
  view.append(el("div", {class: "filters"}, el("label", {}, "eval step", pick)));
  for (const [name, st] of Object.entries(data.sets)) {
    view.append(el("div", {class: "legend", "data-set": name}, `${name}: ${st.prompts} prompts, mean pass rate ` +
      `${fmt(st.mean_pass_rate)}, never solved at this step: ${st.never_solved}`));
  }
  const t = el("table", {id: "eval-prompts"}, el("tr", {}, ...["set", "pass rate", "rewards", "prompt", "label", "answers"].map(h =>
    el("th", {}, h))));
  for (const r of data.prompts) {
    t.append(el("tr", {class: "eval-row"}, el("td", {}, r.eval_set),
      el("td", {class: r.pass_rate === 0 ? "flag" : (r.pass_rate === 1 ? "ok" : "")}, String(fmt(r.pass_rate))),
      el("td", {}, Array.isArray(r.rewards) ? r.rewards.map(v => fmt(v)).join(" ") : ""),
      el("td", {class: "text"}, asText(r.prompt).slice(-160)), el("td", {class: "text"}, asText(r.label).slice(0, 80)),
      answersCell(r)));
  }
  view.append(t);
}

// What the model answered, one per reward in order (review N31): the start of each in the cell, all
// of them whole (as recorded: cut at 300 characters) in its tooltip; older runs have none: "–".
function answersCell(r) {
  if (!Array.isArray(r.responses)) return el("td", {class: "na-text"}, "–");
  const answers = r.responses.map(a => asText(a).trim());
  return el("td", {class: "text eval-answers", title: answers.join("\n")},
    answers.map(a => a.slice(0, 40)).join(" · "));
}

// ---- compare with baselines -----------------------------------------------------------
const VERDICT_CLASS = {within: "ok", outside: "flag", error: "flag", "no baseline": "na-text", "not reached": "na-text"};

function compareHash(paths) {
  return "#compare" + (paths.length ? "?" + paths.map(p => "baseline=" + encodeURIComponent(p)).join("&") : "");
}

async function showCompare(view) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const cands = (await api("/api/baselines")).candidates;
  let chosen = params.getAll("baseline");
  if (!chosen.length && !params.has("none")) chosen = cands.filter(c => c.given).map(c => c.path);
  view.append(el("h2", {}, "Compare with baselines"));
  const picker = el("div", {class: "filters", id: "baseline-picker"});
  for (const c of cands) {
    const box = el("input", {type: "checkbox", "data-path": c.path});
    box.checked = chosen.includes(c.path);
    box.onchange = () => {
      const next = [...picker.querySelectorAll("input:checked")].map(b => b.getAttribute("data-path"));
      location.hash = next.length ? compareHash(next) : "#compare?none=1";
    };
    picker.append(el("label", {class: "pick"}, box, `${c.name}${c.given ? " (--baseline)" : ""}`));
  }
  view.append(picker);
  if (!cands.length) {
    view.append(el("div", {class: "na"}, "No baselines: start the dashboard with --baseline DIR, or keep other run dirs beside this one"));
    return;
  }
  if (!chosen.length) { view.append(el("div", {class: "na", id: "compare-none"}, "Choose one or more baselines above")); return; }
  const data = await api("/api/compare?" + chosen.map(p => "baseline=" + encodeURIComponent(p)).join("&"));
  const failed = (data.failed.length ? ` · regressions: ${data.failed.join(", ")}` :
    " · every learning signal within the corridor") +
    (data.slower.length && !data.gate_timing ? ` · slower (timing, not gated): ${data.slower.join(", ")}` : "");
  view.append(el("div", {id: "compare-verdict", class: data.verdict === "within" ? "ok" : "flag"},
    `${data.run.name} vs ${data.baselines.map(b => b.name).join(", ")}: ${data.verdict}${failed}`));
  for (const n of data.notes) view.append(el("div", {class: "legend"}, n));
  const table = el("table", {id: "compare-table"}, el("tr", {}, ...["signal", "axis", "verdict", "step", "value",
    "baselines' mean", "bound", "delta", "steps outside", "why"].map(h => el("th", {}, h))));
  for (const s of data.signals) {
    const at = s.points.find(p => p.step === s.first_step) || s.points[s.points.length - 1] || {};
    table.append(el("tr", {class: "signal-row" + (s.timing ? " timing" : ""), "data-key": s.key, "data-verdict": s.verdict,
                           "data-first-step": s.first_step ?? ""},
      el("td", {}, s.key), el("td", {}, s.axis), el("td", {class: VERDICT_CLASS[s.verdict] || ""}, s.verdict),
      el("td", {}, at.step ?? "–"), el("td", {}, fmt(at.value)), el("td", {}, fmt(at.mean)), el("td", {}, fmt(at.bound)),
      el("td", {class: "delta"}, at.delta === null || at.delta === undefined ? "–" : (at.delta >= 0 ? "+" : "") + fmt(at.delta)),
      el("td", {}, `${s.steps_outside}/${s.steps}`),
      el("td", {}, [s.timing ? (data.gate_timing ? "timing" : "timing (not gated)") : "", s.why || s.note || ""]
        .filter(Boolean).join(" · "))));
  }
  view.append(table);
  view.append(el("h2", {}, "Curves (the run, each baseline, the corridor's bound dashed)"));
  const grid = el("div", {class: "grid", id: "compare-panels"});
  view.append(grid);
  const runCurves = data.curves[data.run.path];
  for (const s of data.signals) {
    const box = el("div", {class: "panel compare-panel", "data-key": s.key},
                   el("h3", {}, s.key + " "), el("div", {class: "legend"}, `worse: ${s.worse} · ${s.verdict}`));
    grid.append(box);
    const series = [];
    const mine = runCurves[s.key];
    if (mine) series.push({name: data.run.name, x: mine.x, y: mine.y, color: "#111827", cls: "series run"});
    data.baselines.forEach((b, i) => {
      const c = data.curves[b.path][s.key];
      if (c) series.push({name: b.name, x: c.x, y: c.y, color: COLORS[(i + 1) % COLORS.length], cls: "series baseline"});
    });
    const bounded = s.points.filter(p => p.bound !== null);
    if (bounded.length) series.push({name: "bound", x: bounded.map(p => p.step), y: bounded.map(p => p.bound),
                                     color: "#dc2626", dash: "4 3", cls: "corridor"});
    if (!series.length) { box.append(el("div", {class: "na"}, "not logged")); continue; }
    const outside = s.points.filter(p => p.verdict === "outside" || p.verdict === "error").map(p => p.step);
    lineChart(box, series, {flags: outside, xlabel: s.axis});
    box.append(el("div", {class: "legend"}, ...series.map(x => legendItem(x.name, x.color, Boolean(x.dash)))));
  }
  view.append(el("h2", {}, "Eval prompts whose pass rate changed most"));
  const pd = data.prompts;
  if (!pd.changes.length) {
    view.append(el("div", {class: "na", id: "prompt-diff-none"}, pd.note || "no prompt changed"));
    return;
  }
  view.append(el("div", {class: "legend"}, `eval step ${pd.eval_step}, ${pd.shared} prompts shared`));
  const pt = el("table", {id: "prompt-diff"}, el("tr", {}, ...["set", "prompt", "label", data.run.name,
    "baselines", "delta"].map(h => el("th", {}, h))));
  for (const c of pd.changes) {
    pt.append(el("tr", {class: "prompt-row"}, el("td", {}, c.eval_set), el("td", {class: "text"}, asText(c.prompt)),
      el("td", {class: "text"}, asText(c.label)), el("td", {}, fmt(c.run)), el("td", {}, fmt(c.baselines)),
      el("td", {class: c.delta < 0 ? "flag" : "ok"}, (c.delta >= 0 ? "+" : "") + fmt(c.delta))));
  }
  view.append(pt);
}

// ---- routing and following -------------------------------------------------------------
const VIEWS = {metrics: showMetrics, timeline: showTimeline, rollouts: showRollouts, sample: showSample,
               evals: showEvals, compare: showCompare};
// the nav calls the sample view "Tokens", so #tokens/<rollout>/<index> is the same view as #sample/...
const ROUTE_ALIASES = {tokens: "sample"};
const STATE_TEXT = {running: "running", finished: "finished", stopped: "no trainer running now", unknown: ""};

let renders = 0;

async function render() {
  const mine = ++renders;  // a newer render (the hash changed again) wins over this one
  const hash = location.hash;
  const asked = (hash.slice(1).split(/[/?]/)[0]) || "metrics";
  const name = ROUTE_ALIASES[asked] || (VIEWS[asked] ? asked : "metrics");
  for (const k of Object.keys(VIEWS)) document.getElementById("nav-" + k).classList.toggle("active", k === name);
  const view = el("main", {id: "view", "data-view": name});
  try {
    RUN = await api("/api/run");
    lastSeen = RUN.last_rollout_id;
    lastState = RUN.state;
    document.getElementById("run-name").textContent = RUN.name;
    const state = STATE_TEXT[RUN.state] ?? RUN.state;
    const runState = document.getElementById("run-state");
    runState.textContent = `${RUN.iterations}` + (RUN.num_rollout ? ` of ${RUN.num_rollout}` : "") + " iterations" +
      (RUN.last_rollout_id !== null ? `, last rollout ${RUN.last_rollout_id}` : "") + (state ? ` · ${state}` : "") +
      (RUN.follow ? (RUN.state === "finished" ? " · the run ended: nothing more to follow" : " · following") : "");
    runState.setAttribute("data-state", RUN.state);
    notice(RUN);
    if (name !== asked && !ROUTE_ALIASES[asked]) {  // a mistyped address says so rather than silently showing Metrics
      view.append(el("div", {class: "missing", id: "unknown-view"},
        `No view "${asked}": the views are ${Object.keys(VIEWS).join(", ")}; showing metrics`));
    }
    await VIEWS[name](view);
  } catch (err) {
    view.append(el("div", {class: "missing"}, String(err)));
  }
  if (mine !== renders) return;
  view.setAttribute("data-hash", hash);
  view.setAttribute("data-ready", "1");
  document.getElementById("view").replaceWith(view);
}

async function follow() {
  try {
    const run = await api("/api/run");
    if (run.last_rollout_id !== lastSeen || run.state !== lastState) await render();
    if (run.state === "finished") return;  // said in the header; nothing more will come
  } catch (err) { /* the next poll retries */ }
  setTimeout(follow, 2000);
}

window.addEventListener("hashchange", render);
render().then(() => { if (RUN && RUN.follow) setTimeout(follow, 2000); });

document.getElementById("diagnose-button").onclick = diagnose;
