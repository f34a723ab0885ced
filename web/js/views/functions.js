// Every function: status, replicas by state, calls, cold-start rate, warm and cold p50/p95.

import { api } from "../api.js";
import { formatMs, formatPercent, h, replace, table } from "../dom.js";
import { healthBadge } from "./health.js";

function replicaSummary(replicas) {
  const parts = Object.entries(replicas).map(([state, n]) => `${n} ${state}`);
  return parts.length ? parts.join(", ") : "none";
}

function row(s, health) {
  const link = h("a", { href: `#/function/${encodeURIComponent(s.name)}` }, s.name);
  return h(
    "tr",
    { "data-function": s.name },
    h("th", { scope: "row" }, link),
    h("td", {}, h("span", { class: `badge ${s.status}` }, s.status), " ", healthBadge(health)),
    h("td", { class: "num" }, s.version ?? "–"),
    h("td", {}, replicaSummary(s.replicas)),
    h("td", { class: "num" }, s.calls, s.calls_failed ? ` (${s.calls_failed} failed)` : ""),
    h("td", { class: "num" }, formatPercent(s.cold_start_rate)),
    h("td", { class: "num" }, `${formatMs(s.warm.p50_ms)} / ${formatMs(s.warm.p95_ms)}`),
    h("td", { class: "num" }, `${formatMs(s.cold.p50_ms)} / ${formatMs(s.cold.p95_ms)}`),
  );
}

const REFRESH_MS = 5000;

export async function render(root, _params, ctx) {
  const box = h("div", { id: "functions-table" });
  await draw(box, ctx);
  if (ctx.stale()) return;
  replace(
    root,
    h("h2", { tabindex: "-1" }, "Functions"),
    h("p", { class: "muted" }, "Latency percentiles are over each function's latest finished calls, queueing included. Refreshed every 5 s."),
    box,
  );
  ctx.every(REFRESH_MS, () => draw(box, ctx));
}

// Redraws the table; a link that had keyboard focus keeps it across the redraw.
async function draw(box, ctx) {
  const [stats, fns] = await Promise.all([api.get("/v1/stats/functions"), api.get("/v1/functions")]);
  if (ctx.stale()) return;
  const health = Object.fromEntries(fns.map((f) => [f.name, f.health]));
  const focused = box.contains(document.activeElement) ? document.activeElement.closest("tr") : null;
  const focusedName = focused ? focused.dataset.function : null;
  replace(
    box,
    stats.length
      ? table(
          "Functions",
          ["Name", "Status", "Version", "Replicas", "Calls", "Cold starts", "Warm p50 / p95", "Cold p50 / p95"],
          stats.map((s) => row(s, health[s.name])),
        )
      : h("p", {}, "No functions yet. ", h("a", { href: "#/deploy" }, "Deploy one"), "."),
  );
  if (focusedName) {
    const link = box.querySelector(`tr[data-function="${CSS.escape(focusedName)}"] a`);
    if (link) link.focus();
  }
}
