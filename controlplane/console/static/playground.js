// The console playground (templates/playground.html): POSTs the message to the console, which
// mints a short-lived key and streams the gateway's answer back as server-sent events.
(function () {
  "use strict";
  const form = document.getElementById("try-form");
  if (!form) return;
  const $ = (id) => document.getElementById(id);
  function show(ev, data) {
    if (ev === "token") {
      $("answer").textContent += data.text;
    } else if (ev === "done") {
      $("stat-ttft").textContent = data.ttft_ms + " ms";
      $("stat-rate").textContent = data.tokens_per_s === null ? "—" : data.tokens_per_s + " tokens/s";
      $("stat-replica").textContent = data.replica || "(not reported)";
      $("stat-replica").dataset.source = data.replica_source || "";
      const u = data.usage || {};
      $("stat-usage").textContent = (u.prompt_tokens ?? "?") + " prompt + " + (u.completion_tokens ?? data.completion_tokens) + " completion tokens";
      form.dataset.done = "1";
    } else if (ev === "error") {
      $("try-error").hidden = false;
      $("try-error").textContent = data.status + " " + data.code + ": " + data.message;
    }
  }
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    $("answer").textContent = "";
    $("try-error").hidden = true;
    delete form.dataset.done;
    for (const id of ["stat-ttft", "stat-rate", "stat-replica", "stat-usage"]) $(id).textContent = "…";
    $("send").disabled = true;
    try {
      const resp = await fetch(form.dataset.url, {
        method: "POST", headers: {"content-type": "application/json", "x-csrf-token": form.dataset.csrf},
        body: JSON.stringify({prompt: $("prompt").value, max_tokens: $("max-tokens").value}),
      });
      if (!resp.ok) {
        let err = {};
        try { err = (await resp.json()).error || {}; } catch (_) { /* not JSON */ }
        show("error", {status: resp.status, code: err.code || "error", message: err.message || resp.statusText});
        return;
      }
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buf += dec.decode(value, {stream: true});
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let ev = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith("event: ")) ev = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (data) show(ev, JSON.parse(data));
        }
      }
    } catch (err) {
      show("error", {status: 0, code: "network", message: String(err)});
    } finally {
      $("send").disabled = false;
    }
  });
})();
