// Workers: devices, memory, pre-warmed pool, cache tiers and what they hold, replicas.

import { api } from "../api.js";
import { formatBytes, formatTime, h, replace } from "../dom.js";

function devices(w) {
  return h(
    "ul",
    { class: "plain" },
    w.devices.map((d) => h("li", {}, `${d.kind}${d.name ? ` · ${d.name}` : ""}${d.memory_bytes ? ` · ${formatBytes(d.memory_bytes)}` : ""}`)),
  );
}

function cache(w) {
  return w.cache.map((tier) =>
    h(
      "div",
      {},
      h("strong", {}, `${tier.tier}: ${formatBytes(tier.bytes)}`),
      tier.artifacts.length
        ? h("ul", { class: "plain" }, tier.artifacts.map((a) => h("li", {}, a.refs.length ? a.refs.join(", ") : h("code", {}, a.digest.slice(0, 20)))))
        : h("p", { class: "muted" }, "holds no complete artifact"),
    ),
  );
}

function replicas(w) {
  if (!w.replicas.length) return h("p", { class: "muted" }, "no replicas");
  return h(
    "ul",
    { class: "plain" },
    w.replicas.map((r) =>
      h("li", {}, h("a", { href: `#/function/${encodeURIComponent(r.function)}` }, r.function), ` v${r.version} `, h("span", { class: `badge ${r.state}` }, r.state), ` on ${r.device}`),
    ),
  );
}

function card(w) {
  const state = w.lost ? "lost" : w.healthy ? "healthy" : "unhealthy";
  const title = `worker-${w.id}`;
  return h(
    "section",
    { class: "card worker", "aria-labelledby": title, "data-worker": w.id },
    h("h3", { id: title }, w.name || w.id, " ", h("span", { class: `badge ${state}` }, state)),
    h("p", { class: "muted" }, `id ${w.id} · last heartbeat ${formatTime(w.last_heartbeat_at)}`),
    h(
      "div",
      { class: "grid" },
      h("div", {}, h("h4", {}, "Devices"), devices(w), h("p", {}, `Memory: ${formatBytes(w.free_memory_bytes)} free of ${formatBytes(w.memory_bytes)}`), h("p", {}, `Pre-warmed pool: ${w.pool_size}`)),
      h("div", {}, h("h4", {}, "Cache"), cache(w), h("h4", {}, "Replicas"), replicas(w)),
    ),
  );
}

export async function render(root, _params, ctx) {
  const workers = await api.get("/v1/workers");
  if (ctx.stale()) return;
  replace(
    root,
    h("h2", { tabindex: "-1" }, "Workers"),
    workers.length ? workers.map(card) : h("p", {}, "No worker has registered. Start one with `thaw worker`."),
  );
}
