// An LLM function's tokens: time to first token and time per output token, cold
// and warm apart, and tokens a second, over its recent calls
// (GET /v1/functions/{name}/stats/llm). Shown on the function page only for a
// function with an [llm] table.

import { api } from "../api.js";
import { drawTokenHistogram } from "../charts.js";
import { h, replace, table } from "../dom.js";

const RECENT_CALLS = 200;

// Token gaps are a few milliseconds: keep a decimal there.
export function formatTokenMs(ms) {
  if (ms === null || ms === undefined) return "–";
  if (ms >= 1000) return `${(ms / 1000).toFixed(2)} s`;
  return ms >= 10 ? `${ms.toFixed(0)} ms` : `${ms.toFixed(1)} ms`;
}

export function formatRate(perS) {
  return perS === null || perS === undefined ? "–" : `${perS.toFixed(perS >= 10 ? 0 : 1)} tokens/s`;
}

// The figures in text: p50 / p99 of TTFT and TPOT per cold and warm, then tokens
// a second (per call p50 / p99, and the window's overall).
export function tokenFigures(s) {
  const pair = (l) => (l.count ? `${formatTokenMs(l.p50_ms)} / ${formatTokenMs(l.p99_ms)}` : "–");
  const row = (label, ...cells) => h("tr", {}, h("th", { scope: "row" }, label), cells.map((c) => h("td", {}, c)));
  const item = (label, value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
  const r = s.tokens_per_s;
  return [
    table(
      `${s.calls} recent calls: ${s.prompt_tokens} prompt and ${s.completion_tokens} completion tokens`,
      ["", "cold p50 / p99", "warm p50 / p99"],
      [
        row("Time to first token", pair(s.ttft.cold), pair(s.ttft.warm)),
        row("Time per output token", pair(s.tpot.cold), pair(s.tpot.warm)),
      ],
    ),
    h(
      "dl",
      { class: "stats", id: "llm-rate" },
      item("Tokens a second, p50 / p99 of calls", `${formatRate(r.p50)} / ${formatRate(r.p99)}`),
      item("Tokens a second, overall", formatRate(r.overall)),
    ),
  ];
}

function chartBox(canvas, title) {
  return h("div", {}, h("h4", { id: `${canvas.id}-title` }, title), h("div", { class: "chart-box" }, canvas));
}

// The card, or null for a function that is not an LLM function. `refresh`
// re-reads the figures and redraws.
export function tokensCard(fn) {
  if (!(fn.spec && fn.spec.llm)) return null;
  const path = `/v1/functions/${encodeURIComponent(fn.name)}/stats/llm?limit=${RECENT_CALLS}`;
  const figures = h("div", { id: "llm-stats" }, "Loading…");
  const ttft = h("canvas", { id: "ttft-chart", role: "img" });
  const tpot = h("canvas", { id: "tpot-chart", role: "img" });
  const card = h(
    "section",
    { class: "card", "aria-labelledby": "tokens-title" },
    h("h3", { id: "tokens-title" }, "Tokens"),
    h(
      "p",
      { class: "muted" },
      "Recent successful calls. Time to first token runs from the call's acceptance (a cold start included); " +
        "tokens a second are completion tokens over the time from the engine taking the request in to its last token.",
    ),
    figures,
    h("div", { class: "grid" }, chartBox(ttft, "Time to first token"), chartBox(tpot, "Time per output token")),
  );
  card.refresh = async () => {
    const s = await api.get(path);
    replace(figures, tokenFigures(s));
    drawTokenHistogram(ttft, s.points, "ttft_ms");
    drawTokenHistogram(tpot, s.points, "tpot_ms");
  };
  return card;
}
