// The console's only way to the control plane: its public REST API.
// The key lives in sessionStorage (gone when the tab closes) and is sent as
// `Authorization: Bearer`; every failure becomes an ApiError whose message
// is the server's own `detail`, ready to show to a person.

const KEY_NAME = "thaw.apiKey";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY_NAME);
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY_NAME, key);
  else sessionStorage.removeItem(KEY_NAME);
}

// FastAPI's 422 detail is a list of {loc, msg}; others are a string.
export function describeDetail(detail) {
  if (Array.isArray(detail)) {
    return detail
      .map((d) => `${(d.loc || []).filter((p) => p !== "body").join(".") || "request"}: ${d.msg}`)
      .join("; ");
  }
  if (typeof detail === "string") return detail;
  return JSON.stringify(detail);
}

async function errorFrom(response) {
  let detail = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.detail !== undefined) detail = describeDetail(body.detail);
  } catch {
    // Not JSON (a proxy's HTML page): the status line says enough.
  }
  if (response.status === 401) {
    detail = `The API key was refused (${detail}). Sign in again with a valid key.`;
  }
  return new ApiError(response.status, detail);
}

function headers(extra = {}) {
  const h = { ...extra };
  const key = getKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function send(method, path, body, extraHeaders = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body === undefined ? extraHeaders : { "Content-Type": "application/json", ...extraHeaders }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, `Cannot reach the control plane (${err.message}). Is it running?`);
  }
  if (!response.ok) throw await errorFrom(response);
  if (response.status === 204) return null;
  return response.json();
}

export const api = {
  get: (path) => send("GET", path),
  post: (path, body = {}) => send("POST", path, body),
  patch: (path, body) => send("PATCH", path, body),
  del: (path) => send("DELETE", path),
};

// Parse a text/event-stream body: yields {event, data} for each event.
export async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      yield { event, data: data.length ? JSON.parse(data.join("\n")) : null };
    }
  }
}

// Invoke with streaming. EventSource cannot send Authorization, so this is
// fetch + ReadableStream. Calls onEvent({event, data}) for every event.
export async function invokeStream(name, body, onEvent) {
  let response;
  try {
    response = await fetch(`/v1/functions/${encodeURIComponent(name)}/invoke`, {
      method: "POST",
      headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, `Cannot reach the control plane (${err.message}).`);
  }
  if (!response.ok) throw await errorFrom(response);
  const callId = response.headers.get("X-Thaw-Call-Id");
  for await (const ev of readEvents(response.body)) onEvent(ev, callId);
}

// Invoke without streaming: resolves with the call (also when it failed).
export async function invokeOnce(name, body) {
  let response;
  try {
    response = await fetch(`/v1/functions/${encodeURIComponent(name)}/invoke`, {
      method: "POST",
      headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(0, `Cannot reach the control plane (${err.message}).`);
  }
  const data = await response.json().catch(() => null);
  if (data && data.call_id && data.status) return data; // a call: succeeded or not
  throw new ApiError(response.status, describeDetail(data ? data.detail : response.statusText));
}

// Upload files as multipart with progress (fetch has no upload progress; XHR does).
// files: [{path, file}]; fields: {ref, kind}; onProgress(loadedBytes, totalBytes).
export function upload(fields, files, onProgress) {
  const form = new FormData();
  for (const [k, v] of Object.entries(fields)) form.append(k, v);
  for (const f of files) {
    form.append("paths", f.path);
    form.append("files", f.file, f.file.name);
  }
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/v1/uploads");
    const key = getKey();
    if (key) xhr.setRequestHeader("Authorization", `Bearer ${key}`);
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) onProgress(e.loaded, e.total);
    };
    xhr.onerror = () => reject(new ApiError(0, "The upload could not reach the control plane."));
    xhr.onload = () => {
      let body = null;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = null;
      }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else if (xhr.status === 413) {
        const why = body && body.detail ? describeDetail(body.detail) : "too large";
        reject(new ApiError(413, `The folder is larger than the control plane accepts in one upload: ${why}. Push it with \`thaw models push\` instead.`));
      } else reject(new ApiError(xhr.status, describeDetail(body ? body.detail : xhr.statusText)));
    };
    xhr.send(form);
  });
}
