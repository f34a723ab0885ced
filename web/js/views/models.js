// Models and adapters: upload a folder (with progress), sizes raw / stored /
// shared with other artifacts, and the functions that use each.

import { api, upload } from "../api.js";
import { field, formatBytes, h, replace, table } from "../dom.js";
import { folderFiles } from "./upload_util.js";

function row(a) {
  const ref = `${a.name}:${a.tag}`;
  const users = a.used_by.length
    ? a.used_by.map((f, i) => [i ? ", " : "", h("a", { href: `#/function/${encodeURIComponent(f)}` }, f)])
    : h("span", { class: "muted" }, "none");
  return h(
    "tr",
    { "data-ref": ref },
    h("th", { scope: "row" }, ref),
    h("td", {}, a.kind),
    h("td", { class: "num" }, a.files),
    h("td", { class: "num" }, formatBytes(a.raw_size_bytes)),
    h("td", { class: "num" }, formatBytes(a.stored_size_bytes)),
    h("td", { class: "num" }, formatBytes(a.shared_stored_bytes)),
    h("td", {}, users),
  );
}

function uploadCard(ctx) {
  const ref = h("input", { required: true, placeholder: "llama-tiny:v1", pattern: "[a-z0-9._\\/\\-]+:[A-Za-z0-9_][A-Za-z0-9_.\\-]*" });
  const kind = h("select", {}, ["auto", "model", "adapter"].map((k) => h("option", { value: k }, k)));
  const folder = h("input", { type: "file", webkitdirectory: true, multiple: true });
  const progress = h("progress", { id: "model-progress", max: 100, value: 0, "aria-label": "Upload progress" });
  const status = h("p", { id: "model-upload-status", class: "muted", "aria-live": "polite" });
  const send = h("button", { type: "submit", class: "primary" }, "Upload");
  const form = h(
    "form",
    { id: "model-upload", class: "card", "aria-labelledby": "upload-title" },
    h("h3", { id: "upload-title" }, "Upload a model or adapter folder"),
    h("div", { class: "row" }, field("up-ref", "Name:tag", ref), field("up-kind", "Kind", kind, "auto: adapter if adapter_config.json is present")),
    field("up-folder", "Folder (Hugging Face or PEFT layout)", folder),
    send,
    progress,
    status,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const files = folderFiles(folder.files);
    if (!files.length) {
      ctx.notify("Choose a folder first.", "error");
      return;
    }
    send.disabled = true;
    progress.value = 0;
    replace(status, "Uploading…");
    try {
      const r = await upload({ ref: ref.value.trim(), kind: kind.value }, files, (done, total) => {
        progress.value = Math.round((100 * done) / total);
        replace(status, `Uploading… ${formatBytes(done)} of ${formatBytes(total)}`);
      });
      progress.value = 100;
      replace(status, `Pushed ${r.ref} (${r.kind}): ${formatBytes(r.raw_size_bytes)} raw, ${formatBytes(r.new_bytes)} new in the store, ${formatBytes(r.dedup_bytes)} already there.`);
      ctx.notify(`Uploaded ${r.ref}.`, "success");
      await refreshTable(ctx);
    } catch (err) {
      replace(status, "");
      ctx.error(new Error(`Upload failed: ${err.message}`));
    } finally {
      send.disabled = false;
    }
  });
  return form;
}

const tableBox = h("div", { id: "catalog" });

async function refreshTable(ctx) {
  const rows = await api.get("/v1/catalog");
  if (ctx.stale()) return;
  replace(
    tableBox,
    rows.length
      ? table("Models and adapters in the store", ["Name:tag", "Kind", "Files", "Raw", "Stored", "Shared (deduplicated)", "Used by"], rows.map(row))
      : h("p", {}, "Nothing pushed yet."),
  );
}

export async function render(root, _params, ctx) {
  replace(tableBox);
  await refreshTable(ctx);
  if (ctx.stale()) return;
  replace(
    root,
    h("h2", { tabindex: "-1" }, "Models and adapters"),
    h("p", { class: "muted" }, "Stored: distinct chunks as kept in the store (compressed where it paid). Shared: stored bytes this artifact has in common with others, kept once."),
    tableBox,
    uploadCard(ctx),
  );
}
