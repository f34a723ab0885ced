// Charts of calls, drawn with the vendored Chart.js (window.Chart).
// The binning and phase tables are pure functions, so what a chart shows is
// decided here and the chart library only draws it.

export const PHASES = [
  "schedule",
  "transit",
  "pool_acquire",
  "process_start",
  "imports",
  "device_init",
  "weights_fetch",
  "weights_to_device",
  "adapters",
  "user_setup",
  "first_output",
];
const PHASE_COLORS = [
  "#6e7781", "#afb8c1", "#8250df", "#bf3989", "#cf222e", "#bc4c00",
  "#d4a72c", "#1a7f37", "#0969da", "#0550ae", "#57606a",
];
const COLD = "#c2410c";
const WARM = "#0e7490";

export function latencyMs(call) {
  if (call.status !== "succeeded" || !call.finished_at) return null;
  // Rounded to the microsecond: unix-second floats carry noise that would
  // otherwise push a 100 ms call past a 100 ms bucket edge.
  return Math.round((call.finished_at - call.accepted_at) * 1e6) / 1e3;
}

// Bins [0, max] into `count` equal buckets; cold and warm counted apart.
export function latencyBins(calls, count = 10) {
  return msBins(calls.map((c) => ({ ms: latencyMs(c), cold: c.cold })), count);
}

// An LLM function's calls (the `points` of /stats/llm) binned by one figure,
// "ttft_ms" or "tpot_ms"; calls without it (a one-token call has no TPOT) left out.
export function tokenBins(points, figure, count = 10) {
  return msBins(points.map((p) => ({ ms: p[figure] ?? null, cold: p.cold })), count);
}

// Points {ms, cold} (ms null: left out) binned into `count` equal buckets from 0.
export function msBins(all, count = 10) {
  const points = all.filter((p) => p.ms !== null);
  const max = Math.max(1, ...points.map((p) => p.ms));
  const width = Math.ceil(max / count) || 1;
  const labels = [];
  const cold = new Array(count).fill(0);
  const warm = new Array(count).fill(0);
  for (let i = 0; i < count; i += 1) labels.push(`${i * width}–${(i + 1) * width} ms`);
  for (const p of points) {
    const i = Math.min(count - 1, Math.floor(p.ms / width));
    if (p.cold) cold[i] += 1;
    else warm[i] += 1;
  }
  return { labels, cold, warm, coldCount: cold.reduce((a, b) => a + b, 0), warmCount: warm.reduce((a, b) => a + b, 0) };
}

// The phases of up to `limit` recent cold calls, oldest at the top.
export function coldWaterfall(calls, limit = 10) {
  const cold = calls.filter((c) => c.cold && Object.keys(c.phases_ms || {}).length).slice(0, limit).reverse();
  const present = PHASES.filter((p) => cold.some((c) => c.phases_ms[p] !== undefined));
  const extra = [...new Set(cold.flatMap((c) => Object.keys(c.phases_ms)))].filter((p) => !PHASES.includes(p));
  const phases = [...present, ...extra];
  return {
    labels: cold.map((c) => `${c.call_id.slice(0, 8)} · ${new Date(c.accepted_at * 1000).toLocaleTimeString()}`),
    phases: phases.map((p) => ({ phase: p, values: cold.map((c) => c.phases_ms[p] ?? 0) })),
    callIds: cold.map((c) => c.call_id),
  };
}

function draw(canvas, config) {
  const existing = window.Chart.getChart(canvas);
  if (existing) existing.destroy();
  return new window.Chart(canvas, config);
}

export function drawHistogram(canvas, calls) {
  const bins = latencyBins(calls);
  const what = `${bins.coldCount} cold and ${bins.warmCount} warm successful calls, in ${bins.labels.length} buckets`;
  return drawBins(canvas, bins, `Latency histogram: ${what}`, "latency (accepted → finished)");
}

const TOKEN_FIGURES = {
  ttft_ms: ["Time to first token", "time to first token (accepted → first token)"],
  tpot_ms: ["Time per output token", "time per output token (after the first)"],
};

// `figure`: "ttft_ms" or "tpot_ms", binned from an LLM function's call points.
export function drawTokenHistogram(canvas, points, figure) {
  const bins = tokenBins(points, figure);
  const [name, axis] = TOKEN_FIGURES[figure];
  const what = `${bins.coldCount} cold and ${bins.warmCount} warm calls, in ${bins.labels.length} buckets`;
  return drawBins(canvas, bins, `${name} histogram: ${what}`, axis);
}

function drawBins(canvas, bins, ariaLabel, xTitle) {
  canvas.setAttribute("aria-label", ariaLabel);
  return draw(canvas, {
    type: "bar",
    data: {
      labels: bins.labels,
      datasets: [
        { label: "cold", data: bins.cold, backgroundColor: COLD },
        { label: "warm", data: bins.warm, backgroundColor: WARM },
      ],
    },
    options: {
      animation: false,
      maintainAspectRatio: false,
      scales: {
        x: { title: { display: true, text: xTitle } },
        y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "calls" } },
      },
    },
  });
}

export function drawWaterfall(canvas, calls) {
  const w = coldWaterfall(calls);
  canvas.setAttribute(
    "aria-label",
    `Cold-start phases of ${w.labels.length} recent cold calls: ${w.phases.map((p) => p.phase).join(", ") || "none"}`,
  );
  return draw(canvas, {
    type: "bar",
    data: {
      labels: w.labels,
      datasets: w.phases.map((p) => ({
        label: p.phase,
        data: p.values,
        backgroundColor: PHASE_COLORS[PHASES.indexOf(p.phase)] || "#999",
      })),
    },
    options: {
      indexAxis: "y",
      animation: false,
      maintainAspectRatio: false,
      scales: {
        x: { stacked: true, beginAtZero: true, title: { display: true, text: "ms" } },
        y: { stacked: true },
      },
    },
  });
}
