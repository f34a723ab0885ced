// The console's shell: sign-in, navigation (hash routes), the message area.
//
//   #/functions            every function with its stats
//   #/function/NAME        one function: spec, versions, playground, charts, scaling
//   #/deploy               deploy from a form or an uploaded bundle
//   #/models               models and adapters; upload a folder
//   #/workers              workers, their devices, cache and replicas
//   #/keys                 API keys
//
// Every view is `render(root, params, ctx)`; it reports failures through
// ctx.error, which shows the server's message on the page (never only in the
// browser console).

import { api, ApiError, getKey, setKey } from "./api.js";
import { h, field, replace } from "./dom.js";
import * as functionsView from "./views/functions.js";
import * as functionView from "./views/function.js";
import * as deployView from "./views/deploy.js";
import * as modelsView from "./views/models.js";
import * as workersView from "./views/workers.js";
import * as keysView from "./views/keys.js";

const ROUTES = {
  functions: functionsView,
  function: functionView,
  deploy: deployView,
  models: modelsView,
  workers: workersView,
  keys: keysView,
};
const NAV = [
  ["functions", "Functions"],
  ["deploy", "Deploy"],
  ["models", "Models & adapters"],
  ["workers", "Workers"],
  ["keys", "Keys"],
];

const main = document.getElementById("main");
const message = document.getElementById("message");
const nav = document.getElementById("nav");
let generation = 0; // bumps on navigation; stale async renders check it and stop
let pendingMessage = null; // shown after the next navigation (e.g. "Deployed echo v2")

export function notify(text, kind = "info") {
  message.className = `message ${kind}`;
  replace(message, text ? h("p", {}, text) : null);
  message.hidden = !text;
}

function error(err) {
  const text = err instanceof ApiError || err instanceof Error ? err.message : String(err);
  notify(text, "error");
  if (err instanceof ApiError && err.status === 401) signOut(false);
}

function signOut(clearMessage = true) {
  setKey(null);
  if (clearMessage) notify("");
  renderSignIn();
}

function renderSignIn() {
  generation += 1; // stops the signed-in page's refreshes
  nav.hidden = true;
  document.getElementById("signout").hidden = true;
  const input = h("input", {
    type: "password",
    autocomplete: "off",
    required: true,
    placeholder: "thaw_…",
    "aria-describedby": "api-key-hint",
  });
  const form = h(
    "form",
    { class: "card signin", "aria-labelledby": "signin-title" },
    h("h2", { id: "signin-title" }, "Sign in"),
    field("api-key", "API key", input, "A key of scope admin or deploy; it is kept for this tab only."),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    await signIn(input.value.trim());
  });
  replace(main, form);
  input.focus();
}

async function signIn(key) {
  setKey(key);
  const before = generation;
  try {
    await api.get("/v1/functions");
  } catch (err) {
    setKey(null);
    if (err instanceof ApiError && err.status === 401) {
      notify("That API key is not valid: it is unknown, malformed or revoked. Check it and try again.", "error");
    } else if (err instanceof ApiError && err.status === 403) {
      notify(`That key cannot use the console: ${err.message}`, "error");
    } else {
      error(err);
    }
    return;
  }
  // A navigation while the key was checked has rendered its page already:
  // rendering it again would throw away what was typed into it meanwhile.
  if (generation !== before) return;
  notify("");
  if (!location.hash || location.hash === "#/") location.hash = "#/functions";
  else route();
}

function renderNav(current) {
  nav.hidden = false;
  document.getElementById("signout").hidden = false;
  replace(
    nav,
    h(
      "ul",
      {},
      NAV.map(([name, label]) =>
        h("li", {}, h("a", { href: `#/${name}`, "aria-current": name === current ? "page" : null }, label)),
      ),
    ),
  );
}

async function route() {
  if (!getKey()) {
    renderSignIn();
    return;
  }
  const [name, ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const view = ROUTES[name] || functionsView;
  const current = ROUTES[name] ? name : "functions";
  renderNav(current === "function" ? "functions" : current);
  const mine = ++generation;
  const ctx = {
    notify,
    error,
    navigate: (hash, text = null) => {
      if (location.hash === hash) {
        notify(text || "", "success"); // no hashchange event: render here
        route();
      } else {
        pendingMessage = text;
        location.hash = hash;
      }
    },
    stale: () => mine !== generation,
    // Re-run `fn` every `interval_ms` while this page is shown; errors end it, shown.
    every: (interval_ms, fn) => {
      const tick = async () => {
        if (mine !== generation) return;
        try {
          await fn();
        } catch (err) {
          if (mine === generation) error(err);
          return;
        }
        setTimeout(tick, interval_ms);
      };
      setTimeout(tick, interval_ms);
    },
  };
  replace(main, h("p", { class: "loading" }, "Loading…"));
  try {
    await view.render(main, rest.map(decodeURIComponent), ctx);
    const heading = main.querySelector("h2");
    if (heading && !ctx.stale()) heading.focus({ preventScroll: true });
  } catch (err) {
    if (!ctx.stale()) {
      replace(main, h("p", {}, "This page could not be loaded."));
      error(err);
    }
  }
}

window.addEventListener("hashchange", () => {
  notify(pendingMessage || "", "success");
  pendingMessage = null;
  route();
});
window.addEventListener("unhandledrejection", (e) => {
  e.preventDefault();
  error(e.reason);
});
document.getElementById("signout").addEventListener("click", () => signOut());
// The skip link moves focus; letting it set location.hash would count as a route.
document.querySelector(".skip").addEventListener("click", (e) => {
  e.preventDefault();
  main.focus();
});
route();
