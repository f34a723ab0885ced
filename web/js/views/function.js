// One function: stats, a canary beside the active version (compare, promote,
// abort), spec and versions (roll back), scaling (edit, warm up), an invoke
// playground (streaming, adapters) and charts of its recent calls; for an LLM
// function, its tokens (tokens.js).

import { api, invokeOnce, invokeStream } from "../api.js";
import { drawHistogram, drawWaterfall } from "../charts.js";
import { canaryCard } from "./canary.js";
import { healthNote } from "./health.js";
import { tokensCard } from "./tokens.js";
import { field, formatMs, formatPercent, formatTime, h, replace } from "../dom.js";

const RECENT_CALLS = 200;
const REFRESH_MS = 5000; // stats and charts follow calls made from anywhere

function statsList(s) {
  const item = (label, value) => h("div", {}, h("dt", {}, label), h("dd", {}, value));
  const replicas = Object.entries(s.replicas).map(([k, n]) => `${n} ${k}`).join(", ") || "none";
  return h(
    "dl",
    { class: "stats", id: "fn-stats" },
    item("Status", h("span", { class: `badge ${s.status}` }, s.status)),
    item("Replicas", replicas),
    item("Calls", String(s.calls)),
    item("Cold starts", formatPercent(s.cold_start_rate)),
    item("Warm p50 / p95", `${formatMs(s.warm.p50_ms)} / ${formatMs(s.warm.p95_ms)}`),
    item("Cold p50 / p95", `${formatMs(s.cold.p50_ms)} / ${formatMs(s.cold.p95_ms)}`),
  );
}

function versionsCard(fn, ctx) {
  const rollback = async (version, button) => {
    button.disabled = true;
    try {
      const info = await api.post(`/v1/functions/${encodeURIComponent(fn.name)}/rollback`, { version });
      ctx.navigate(`#/function/${encodeURIComponent(fn.name)}`, `Rolled back: version ${info.version} is active.`);
    } catch (err) {
      button.disabled = false;
      ctx.error(err);
    }
  };
  const items = [...fn.versions].reverse().map((v) => {
    if (v === fn.version) return h("li", {}, `v${v} `, h("span", { class: "badge serving" }, "active"));
    const button = h("button", { type: "button", "aria-label": `Roll back to version ${v}` }, `Roll back to v${v}`);
    button.addEventListener("click", () => rollback(v, button));
    return h("li", {}, `v${v} `, button);
  });
  return h(
    "section",
    { class: "card", "aria-labelledby": "spec-title" },
    h("h3", { id: "spec-title" }, "Spec and versions"),
    h("p", { class: "muted" }, `Created ${formatTime(fn.created_at)}. Model digest: ${fn.model_digest || "none"}`),
    h("ul", { class: "plain versions" }, items),
    h("pre", { id: "fn-spec", tabindex: "0", "aria-label": "Active spec (JSON)" }, JSON.stringify(fn.spec, null, 2)),
  );
}

function scalingCard(fn, ctx, refresh) {
  const s = (fn.spec && fn.spec.scaling) || {};
  const num = (name, value, attrs) => h("input", { type: "number", name, value, required: true, ...attrs });
  const inputs = {
    min_replicas: num("min_replicas", s.min_replicas ?? 0, { min: 0, max: 64, step: 1 }),
    max_replicas: num("max_replicas", s.max_replicas ?? 1, { min: 0, max: 64, step: 1 }),
    idle_timeout_s: num("idle_timeout_s", s.idle_timeout_s ?? 300, { min: 0, max: 86400, step: "any" }),
    target_concurrency: num("target_concurrency", s.target_concurrency ?? 1, { min: 1, max: 1024, step: 1 }),
  };
  const save = h("button", { type: "submit", class: "primary" }, "Save scaling");
  const form = h(
    "form",
    { id: "scaling-form" },
    h(
      "div",
      { class: "row" },
      field("scale-min", "Min replicas", inputs.min_replicas),
      field("scale-max", "Max replicas", inputs.max_replicas),
      field("scale-idle", "Idle timeout (s)", inputs.idle_timeout_s),
      field("scale-target", "Target concurrency", inputs.target_concurrency),
    ),
    save,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = Object.fromEntries(Object.entries(inputs).map(([k, el]) => [k, Number(el.value)]));
    save.disabled = true;
    try {
      await api.patch(`/v1/functions/${encodeURIComponent(fn.name)}/scaling`, body);
      ctx.notify(`Scaling saved: ${body.min_replicas}–${body.max_replicas} replicas, idle ${body.idle_timeout_s} s, ${body.target_concurrency} calls per replica.`, "success");
      await refresh();
    } catch (err) {
      ctx.error(err);
    } finally {
      save.disabled = false;
    }
  });
  const warm = h("button", { type: "button", id: "warm-button" }, "Warm up");
  warm.addEventListener("click", async () => {
    warm.disabled = true;
    try {
      const r = await api.post(`/v1/functions/${encodeURIComponent(fn.name)}/warm`);
      ctx.notify(
        r.started_replica_id
          ? `Warming up: replica ${r.started_replica_id.slice(0, 8)} is starting.`
          : `Already warm: ${r.live_replicas} live replica(s).`,
        "success",
      );
      await refresh();
    } catch (err) {
      ctx.error(err);
    } finally {
      warm.disabled = false;
    }
  });
  return h(
    "section",
    { class: "card", "aria-labelledby": "scaling-title" },
    h("h3", { id: "scaling-title" }, "Scaling"),
    form,
    h("hr"),
    h("p", { class: "muted" }, "Start a replica now, ahead of traffic; it stays for the idle timeout."),
    warm,
  );
}

function playgroundCard(fn, ctx, refresh) {
  const input = h("textarea", { rows: 4, spellcheck: "false" }, '{"prompt": "hello"}');
  const adapters = ((fn.spec && fn.spec.adapters) || []).map((a) => a.name);
  const adapter = h("select", {}, h("option", { value: "" }, "(none: base model)"), adapters.map((a) => h("option", { value: a }, a)));
  const stream = h("input", { type: "checkbox", id: "pg-stream", checked: true });
  const output = h("pre", { id: "pg-output", class: "output", "aria-live": "polite", tabindex: "0", "aria-label": "Output" });
  const info = h("p", { id: "pg-info", class: "muted", "aria-live": "polite" });
  const run = h("button", { type: "submit", class: "primary" }, "Invoke");
  const form = h(
    "form",
    { id: "playground" },
    field("pg-input", "Input (JSON)", input),
    h(
      "div",
      { class: "row" },
      field("pg-adapter", "Adapter", adapter),
      h("div", { class: "field" }, h("label", { for: "pg-stream" }, stream, " Stream the output")),
    ),
    run,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    let value;
    try {
      value = input.value.trim() ? JSON.parse(input.value) : null;
    } catch (err) {
      replace(info, "");
      ctx.notify(`The input is not valid JSON: ${err.message}`, "error");
      input.focus();
      return;
    }
    const body = { input: value, adapter: adapter.value || null };
    run.disabled = true;
    replace(output);
    replace(info, "Running…");
    ctx.notify("");
    try {
      const call = stream.checked ? await runStreaming(fn.name, body, output) : await invokeOnce(fn.name, body);
      if (!stream.checked && call.status === "succeeded") output.append(JSON.stringify(call.output, null, 2));
      showCall(info, call, ctx);
      await refresh();
    } catch (err) {
      replace(info, "");
      ctx.error(err);
    } finally {
      run.disabled = false;
    }
  });
  return h(
    "section",
    { class: "card", "aria-labelledby": "pg-title" },
    h("h3", { id: "pg-title" }, "Invoke"),
    form,
    h("h4", {}, "Output"),
    output,
    info,
  );
}

async function runStreaming(name, body, output) {
  let final = null;
  await invokeStream(name, body, (ev) => {
    if (ev.event === "output") output.append(`${JSON.stringify(ev.data)}\n`);
    else if (ev.event === "done" || ev.event === "error") final = ev.data;
  });
  if (!final) throw new Error("The stream ended before the call finished; look the call up again later.");
  if (final.status === "succeeded" && final.output !== null && final.output !== undefined) {
    output.append(`→ ${JSON.stringify(final.output)}\n`);
  }
  return final;
}

function showCall(info, call, ctx) {
  const total = call.finished_at ? (call.finished_at - call.accepted_at) * 1000 : null;
  replace(info, `Call ${call.call_id}: ${call.status}, ${call.cold ? "cold" : "warm"}, ${formatMs(total)}.`);
  if (call.status !== "succeeded") {
    ctx.notify(`The call ${call.status}: ${call.error || "no error message"}`, "error");
  }
}

function chartCard(id, title, description) {
  return h(
    "section",
    { class: "card", "aria-labelledby": `${id}-title` },
    h("h3", { id: `${id}-title` }, title),
    h("p", { class: "muted" }, description),
    h("p", { id: `${id}-note`, class: "muted", hidden: true }, "No cold start among the recent calls."),
    h("div", { class: "chart-box" }, h("canvas", { id, role: "img" })),
  );
}

export async function render(root, [name], ctx) {
  const path = `/v1/functions/${encodeURIComponent(name)}`;
  const [fn, stats] = await Promise.all([api.get(path), api.get(`${path}/stats`)]);
  if (ctx.stale()) return;
  const statsBox = h("div", {}, statsList(stats));
  const healthBox = h("div", {}, healthNote(fn.health));
  const canary = canaryCard(fn, ctx);
  const tokens = tokensCard(fn);
  const refresh = async () => {
    const [s, calls, now] = await Promise.all([
      api.get(`${path}/stats`),
      api.get(`${path}/calls?limit=${RECENT_CALLS}`),
      api.get(path),
    ]);
    if (ctx.stale()) return;
    if (canary) await canary.refresh();
    if (tokens) await tokens.refresh();
    replace(statsBox, statsList(s));
    replace(healthBox, healthNote(now.health));
    drawHistogram(document.getElementById("latency-chart"), calls);
    drawWaterfall(document.getElementById("waterfall-chart"), calls);
    const coldSeen = calls.some((c) => c.cold);
    document.getElementById("waterfall-chart-note").hidden = coldSeen;
  };
  const refreshButton = h("button", { type: "button" }, "Refresh");
  refreshButton.addEventListener("click", () => refresh().catch(ctx.error));
  replace(
    root,
    h("h2", { tabindex: "-1" }, `Function ${fn.name}`, h("span", { class: "muted" }, ` v${fn.version ?? "–"}`)),
    h("div", { class: "row" }, statsBox, refreshButton),
    healthBox,
    canary,
    h("div", { class: "grid" }, playgroundCard(fn, ctx, refresh), scalingCard(fn, ctx, refresh)),
    h(
      "div",
      { class: "grid" },
      chartCard("latency-chart", "Latency", "Recent successful calls by latency, cold and warm apart."),
      chartCard("waterfall-chart", "Cold starts", "Where the time of recent cold starts went, phase by phase."),
    ),
    tokens,
    versionsCard(fn, ctx),
  );
  await refresh();
  ctx.every(REFRESH_MS, refresh);
}
