"""The `/docs` page: the API from `/openapi.json`, rendered by a few lines of inline script.

Self-contained (no CDN, no package assets), so it works on a machine without internet access:
each endpoint with its description, its request body's fields (type, limits, description) and a
form that sends a JSON body and shows the answer.
"""

from __future__ import annotations

import html

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__ API</title>
<style>
body { font-family: sans-serif; max-width: 60em; margin: 2em auto; padding: 0 1em; }
section { border: 1px solid #ccc; border-radius: 4px; margin: 1em 0; padding: 0.5em 1em; }
code, textarea, pre { font-family: monospace; } textarea { width: 100%; height: 6em; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; text-align: left;
  border-bottom: 1px solid #eee; vertical-align: top; }
pre { background: #f6f6f6; padding: 0.5em; white-space: pre-wrap; }
</style></head>
<body><h1>__TITLE__ API</h1>
<p>Schema: <a href="/openapi.json">/openapi.json</a>. Errors are <code>{"error": "..."}</code>.</p>
<p><label>API key, if the server was started with one (kept in this tab only):
<input id="key" type="password" autocomplete="off"></label></p>
<div id="api">loading /openapi.json ...</div>
<script>
const el = (tag, text) => { const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text; return e; };
function resolve(spec, s) {
  while (s && s.$ref) s = spec.components.schemas[s.$ref.split("/").pop()];
  return s || {};
}
function describe(spec, s) {
  if (s.anyOf) return s.anyOf.map(x => describe(spec, resolve(spec, x))).join(" or ");
  if (s.type === "array") return "list of " + describe(spec, resolve(spec, s.items));
  const limits = ["minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"]
    .filter(k => k in s).map(k => k + " " + s[k]);
  return ((!s.type || s.type === "object") && s.title ? s.title : s.type || "object") +
    (limits.length ? " (" + limits.join(", ") + ")" : "");
}
function fields(spec, schema) {
  const table = el("table"), body = resolve(spec, schema);
  for (const [name, p] of Object.entries(body.properties || {})) {
    const row = table.insertRow(), prop = resolve(spec, p);
    row.insertCell().appendChild(el("code", name));
    row.insertCell().textContent = describe(spec, prop) +
      ((body.required || []).includes(name) ? ", required" : "");
    row.insertCell().textContent = p.description || prop.description || "";
  }
  return table;
}
function tryIt(path, method) {
  const box = el("div"), input = el("textarea"), send = el("button", "send"), out = el("pre");
  input.value = method === "post" ? "{}" : "";
  send.onclick = async () => {
    const key = document.getElementById("key").value.trim();
    const headers = key ? {"authorization": "Bearer " + key} : {};
    const init = method === "post" ? {method: "POST", body: input.value,
      headers: {...headers, "content-type": "application/json"}} : {headers};
    const r = await fetch(path, init);
    out.textContent = r.status + "\\n" + await r.text();
  };
  if (method === "post") box.appendChild(input);
  box.append(send, out);
  return box;
}
fetch("/openapi.json").then(r => r.json()).then(spec => {
  const api = document.getElementById("api"); api.textContent = "";
  for (const [path, ops] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const s = el("section");
      s.appendChild(el("h2", method.toUpperCase() + " " + path));
      s.appendChild(el("p", op.description || op.summary || ""));
      const body = op.requestBody && op.requestBody.content["application/json"];
      if (body) s.appendChild(fields(spec, body.schema));
      s.appendChild(tryIt(path, method));
      api.appendChild(s);
    }
  }
}).catch(e => { document.getElementById("api").textContent = "could not load: " + e; });
</script></body></html>
"""


def docs_page(title: str) -> str:
    """The page's HTML for an API named `title`."""
    return PAGE.replace("__TITLE__", html.escape(title))
