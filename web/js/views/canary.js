// A function's canary: the active version and the canary side by side over the
// calls since the canary began (GET /v1/functions/{name}/canary), with promote
// and abort. Shown on the function page only while the function has a canary.

import { api } from "../api.js";
import { formatMs, formatPercent, formatTime, h, replace, table } from "../dom.js";

const ROWS = [
  ["Calls", (s) => String(s.calls)],
  ["p50", (s) => formatMs(s.latency.p50_ms)],
  ["p95", (s) => formatMs(s.latency.p95_ms)],
  ["p99", (s) => formatMs(s.latency.p99_ms)],
  ["First output p50", (s) => formatMs(s.first_output.p50_ms)],
  ["First output p95", (s) => formatMs(s.first_output.p95_ms)],
  ["First output p99", (s) => formatMs(s.first_output.p99_ms)],
  ["Error rate", (s) => formatPercent(s.error_rate)],
  ["Cold-start rate", (s) => formatPercent(s.cold_start_rate)],
];

export function comparisonTable(status) {
  const { active, canary } = status;
  const rows = ROWS.map(([label, cell]) =>
    h("tr", {}, h("th", { scope: "row" }, label), h("td", {}, cell(active)), h("td", {}, cell(canary))),
  );
  return table(
    `Calls since ${formatTime(status.started_at)}`,
    ["", `v${active.version} (active)`, `v${canary.version} (canary, ${status.weight_pct}%)`],
    rows,
  );
}

// The card, or null when the function has no canary. `refresh` re-reads the
// comparison; promote and abort go back to the function page.
export function canaryCard(fn, ctx) {
  if (!fn.canary) return null;
  const path = `/v1/functions/${encodeURIComponent(fn.name)}/canary`;
  const box = h("div", { id: "canary-table" }, "Loading…");
  const act = (what, done) => {
    const button = h("button", { type: "button" }, what === "promote" ? `Promote v${fn.canary.version}` : "Abort canary");
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const info = await api.post(`${path}/${what}`);
        ctx.navigate(`#/function/${encodeURIComponent(fn.name)}`, done(info));
      } catch (err) {
        button.disabled = false;
        ctx.error(err);
      }
    });
    return button;
  };
  const card = h(
    "section",
    { class: "card", "aria-labelledby": "canary-title" },
    h("h3", { id: "canary-title" }, `Canary: v${fn.canary.version} takes ${fn.canary.weight_pct}% of calls`),
    box,
    h(
      "div",
      { class: "row" },
      act("promote", (info) => `Promoted: version ${info.version} is active.`),
      act("abort", (info) => `Canary aborted: version ${info.version} takes every call.`),
    ),
  );
  card.refresh = async () => {
    const status = await api.get(path);
    replace(box, comparisonTable(status));
  };
  return card;
}
