// A function's health (FunctionPublic.health): "failing" while the active version's
// latest replica start failed, with that start's error; "ok" once a replica is ready.

import { formatTime, h } from "../dom.js";

export function isFailing(health) {
  return !!health && health.state === "failing";
}

// A red "failing" badge whose title is the last start error; nothing while ok.
export function healthBadge(health) {
  if (!isFailing(health)) return "";
  return h("span", { class: "badge failing", title: health.last_error || "" }, "failing");
}

// The function page's note: the last failed start, when, and its error.
export function healthNote(health) {
  if (!isFailing(health)) return h("p", { id: "fn-health", class: "muted" }, "Replica starts: ok.");
  return h(
    "div",
    { id: "fn-health", class: "health-failing", role: "status" },
    h("p", {}, h("span", { class: "badge failing" }, "failing"), ` Its last replica start failed at ${formatTime(health.last_error_at)}:`),
    h("pre", { class: "output" }, health.last_error || "no error was reported"),
  );
}
