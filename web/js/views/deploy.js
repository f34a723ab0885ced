// Deploy: upload a function's code folder (its thaw.toml fills the form), or
// fill the form by hand with a bundle digest already in the store.

import { api, upload } from "../api.js";
import { field, formatBytes, h, replace } from "../dom.js";
import { folderFiles } from "./upload_util.js";

function adaptersText(adapters) {
  return (adapters || []).map((a) => `${a.name}=${a.ref}`).join("\n");
}

// "name=NAME:TAG" per line → [{name, ref}]; throws naming the bad line.
export function parseAdapters(text) {
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .map((line) => {
      const eq = line.indexOf("=");
      if (eq <= 0) throw new Error(`Adapter line "${line}" must read name=NAME:TAG`);
      return { name: line.slice(0, eq).trim(), ref: line.slice(eq + 1).trim() };
    });
}

function deployForm(models, ctx) {
  const el = {
    name: h("input", { required: true, pattern: "[a-z0-9]([a-z0-9\\-]{0,61}[a-z0-9])?", placeholder: "echo" }),
    entry: h("input", { required: true, placeholder: "app:Echo" }),
    bundle: h("input", { required: true, pattern: "blake3:[0-9a-f]{64}", placeholder: "blake3:…" }),
    model: h(
      "select",
      {},
      h("option", { value: "" }, "(no model)"),
      models.filter((m) => m.kind === "model").map((m) => h("option", { value: `${m.name}:${m.tag}` }, `${m.name}:${m.tag}`)),
    ),
    adapters: h("textarea", { rows: 2, placeholder: "fr=llama-fr:v1" }),
    device: h("select", {}, ["any", "cpu", "cuda"].map((d) => h("option", { value: d }, d))),
    timeout: h("input", { type: "number", min: 1, step: "any", value: 300 }),
    min: h("input", { type: "number", min: 0, max: 64, value: 0 }),
    max: h("input", { type: "number", min: 0, max: 64, value: 1 }),
    idle: h("input", { type: "number", min: 0, step: "any", value: 300 }),
    target: h("input", { type: "number", min: 1, value: 1 }),
  };
  const submit = h("button", { type: "submit", class: "primary" }, "Deploy");
  const form = h(
    "form",
    { id: "deploy-form", class: "card", "aria-labelledby": "deploy-form-title" },
    h("h3", { id: "deploy-form-title" }, "Function spec"),
    h(
      "div",
      { class: "row" },
      field("dp-name", "Name", el.name),
      field("dp-entry", "Entry (module:Class)", el.entry),
      field("dp-device", "Device", el.device),
      field("dp-timeout", "Timeout per call (s)", el.timeout),
    ),
    field("dp-bundle", "Code bundle digest", el.bundle, "Filled in when you upload the code folder above."),
    h("div", { class: "row" }, field("dp-model", "Model", el.model), field("dp-adapters", "Adapters (name=NAME:TAG per line)", el.adapters)),
    h(
      "fieldset",
      {},
      h("legend", {}, "Scaling"),
      h(
        "div",
        { class: "row" },
        field("dp-min", "Min replicas", el.min),
        field("dp-max", "Max replicas", el.max),
        field("dp-idle", "Idle timeout (s)", el.idle),
        field("dp-target", "Target concurrency", el.target),
      ),
    ),
    submit,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    let spec;
    try {
      spec = {
        name: el.name.value.trim(),
        entry: el.entry.value.trim(),
        bundle: el.bundle.value.trim(),
        model: el.model.value || null,
        adapters: parseAdapters(el.adapters.value),
        device: el.device.value,
        timeout_s: Number(el.timeout.value),
        scaling: {
          min_replicas: Number(el.min.value),
          max_replicas: Number(el.max.value),
          idle_timeout_s: Number(el.idle.value),
          target_concurrency: Number(el.target.value),
        },
      };
    } catch (err) {
      ctx.notify(err.message, "error");
      return;
    }
    submit.disabled = true;
    try {
      const info = await api.post("/v1/functions", spec);
      ctx.navigate(`#/function/${encodeURIComponent(info.name)}`, `Deployed ${info.name} version ${info.version}.`);
    } catch (err) {
      ctx.error(new Error(`Deploy failed: ${err.message}`));
    } finally {
      submit.disabled = false;
    }
  });
  const fill = (spec, digest) => {
    if (spec) {
      if (spec.name) el.name.value = spec.name;
      if (spec.entry) el.entry.value = spec.entry;
      if (spec.model) {
        if (![...el.model.options].some((o) => o.value === spec.model)) el.model.append(h("option", { value: spec.model }, spec.model));
        el.model.value = spec.model;
      }
      el.adapters.value = adaptersText(spec.adapters);
      if (spec.device) el.device.value = spec.device;
      if (spec.timeout_s) el.timeout.value = spec.timeout_s;
      const s = spec.scaling || {};
      if (s.min_replicas !== undefined) el.min.value = s.min_replicas;
      if (s.max_replicas !== undefined) el.max.value = s.max_replicas;
      if (s.idle_timeout_s !== undefined) el.idle.value = s.idle_timeout_s;
      if (s.target_concurrency !== undefined) el.target.value = s.target_concurrency;
    }
    el.bundle.value = digest;
  };
  return { form, fill };
}

function bundleCard(ctx, fill) {
  const folder = h("input", { type: "file", webkitdirectory: true, multiple: true });
  const progress = h("progress", { id: "bundle-progress", max: 100, value: 0, "aria-label": "Upload progress" });
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const send = h("button", { type: "submit" }, "Upload code");
  const form = h(
    "form",
    { id: "bundle-form", class: "card", "aria-labelledby": "bundle-title" },
    h("h3", { id: "bundle-title" }, "1. Upload the function's code folder"),
    field("bundle-folder", "Code folder (with thaw.toml)", folder, "Its thaw.toml, if any, fills the form below."),
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
    const top = files[0].path.split("/")[0] || "bundle";
    const ref = `bundles/${top.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-+|-+$/g, "") || "bundle"}:${Date.now()}`;
    send.disabled = true;
    try {
      const r = await upload({ ref, kind: "bundle" }, files, (done, total) => {
        progress.value = Math.round((100 * done) / total);
      });
      progress.value = 100;
      replace(status, `Uploaded ${r.files} file(s), ${formatBytes(r.raw_size_bytes)}: ${r.digest}`);
      fill(r.spec, r.digest);
      ctx.notify(r.spec ? "Code uploaded; the form below is filled from its thaw.toml." : "Code uploaded; fill in the spec below.", "success");
    } catch (err) {
      ctx.error(new Error(`Upload failed: ${err.message}`));
    } finally {
      send.disabled = false;
    }
  });
  return form;
}

export async function render(root, _params, ctx) {
  const models = await api.get("/v1/models");
  if (ctx.stale()) return;
  const { form, fill } = deployForm(models, ctx);
  replace(root, h("h2", { tabindex: "-1" }, "Deploy a function"), bundleCard(ctx, fill), form);
}
