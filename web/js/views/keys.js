// API keys: create (the token is shown once), scopes, revoke.

import { api } from "../api.js";
import { field, formatTime, h, replace, table } from "../dom.js";

const SCOPES = ["admin", "deploy", "invoke", "worker"];

function createCard(ctx, rerender) {
  const name = h("input", { placeholder: "ci-deployer", maxlength: 200 });
  const fn = h("input", { placeholder: "(any function)", maxlength: 200 });
  const boxes = SCOPES.map((s) => h("input", { type: "checkbox", id: `scope-${s}`, value: s, checked: s === "invoke" }));
  const shown = h("div", { id: "new-key", "aria-live": "polite" });
  const submit = h("button", { type: "submit", class: "primary" }, "Create key");
  const form = h(
    "form",
    { id: "key-form", class: "card", "aria-labelledby": "key-form-title" },
    h("h3", { id: "key-form-title" }, "Create a key"),
    h("div", { class: "row" }, field("key-name", "Name", name), field("key-function", "Limit to function (optional)", fn)),
    h("fieldset", {}, h("legend", {}, "Scopes"), boxes.map((b, i) => h("label", { for: b.id, class: "scope" }, b, ` ${SCOPES[i]} `))),
    submit,
    shown,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const scopes = boxes.filter((b) => b.checked).map((b) => b.value);
    if (!scopes.length) {
      ctx.notify("Choose at least one scope.", "error");
      return;
    }
    submit.disabled = true;
    try {
      const k = await api.post("/v1/keys", { name: name.value, scopes, function: fn.value.trim() || null });
      await rerender();
      replace(
        shown,
        h("p", {}, h("strong", {}, "Copy this key now; it is shown only once.")),
        h("p", { class: "token", id: "new-key-token", tabindex: "0", "aria-label": "The new key" }, k.token),
      );
      ctx.notify(`Created key ${k.id}.`, "success");
    } catch (err) {
      ctx.error(err);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function row(k, ctx, rerender) {
  const revoke = h("button", { type: "button", class: "danger", "aria-label": `Revoke key ${k.id}`, disabled: Boolean(k.revoked_at) }, "Revoke");
  revoke.addEventListener("click", async () => {
    revoke.disabled = true;
    try {
      await api.del(`/v1/keys/${encodeURIComponent(k.id)}`);
      ctx.notify(`Revoked key ${k.id}.`, "success");
      await rerender();
    } catch (err) {
      revoke.disabled = false;
      ctx.error(err);
    }
  });
  return h(
    "tr",
    { "data-key": k.id },
    h("th", { scope: "row" }, h("code", {}, k.id)),
    h("td", {}, k.name || h("span", { class: "muted" }, "–")),
    h("td", {}, k.scopes.join(", ")),
    h("td", {}, k.function || "any"),
    h("td", {}, formatTime(k.created_at)),
    h("td", { class: "status" }, k.revoked_at ? `revoked ${formatTime(k.revoked_at)}` : "active"),
    h("td", {}, revoke),
  );
}

export async function render(root, _params, ctx) {
  const listBox = h("div", { id: "keys-list" });
  const rerender = async () => {
    const keys = await api.get("/v1/keys");
    if (ctx.stale()) return;
    replace(listBox, table("API keys", ["Id", "Name", "Scopes", "Function", "Created", "Status", ""], keys.map((k) => row(k, ctx, rerender))));
  };
  await rerender();
  if (ctx.stale()) return;
  replace(root, h("h2", { tabindex: "-1" }, "API keys"), createCard(ctx, rerender), listBox);
}
