// toolsidecar live view. Everything shown comes from /ui/events (SSE) and
// /v1/approvals, with the API token when the sidecar has one. Text from
// the sidecar is put in the page with textContent, never as HTML.
"use strict";

const state = { runs: new Map(), approvals: [], selected: null, skew: 0, open: new Set() }; // open: the calls whose details are shown

// The token: from #token=... once (then kept in this tab only), or typed.
function token() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("toolsidecar-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);
  }
  return sessionStorage.getItem("toolsidecar-token") || "";
}

function headers(extra) {
  const h = Object.assign({}, extra);
  const t = token();
  if (t) h.Authorization = "Bearer " + t;
  return h;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function setConn(on, text) {
  const c = document.getElementById("conn");
  c.className = "conn " + (on ? "on" : "off");
  c.textContent = text;
}

// follow reads /ui/events with fetch (EventSource cannot send a token),
// and reconnects after a second when the stream ends.
async function follow() {
  for (;;) {
    try {
      const resp = await fetch("/ui/events", { headers: headers({ Accept: "text/event-stream" }) });
      if (resp.status === 401) {
        setConn(false, "token needed");
        document.getElementById("login").hidden = false;
        return;
      }
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      setConn(true, "live");
      const reader = resp.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          handle(buf.slice(0, i));
          buf = buf.slice(i + 2);
        }
      }
    } catch (e) {
      console.warn("live view stream:", e);
    }
    setConn(false, "reconnecting…");
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function handle(frame) {
  let type = "message", data = "";
  for (const line of frame.split("\n")) {
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
  }
  if (!data) return;
  const v = JSON.parse(data);
  if (type === "snapshot") {
    state.skew = v.now - Date.now();
    state.runs = new Map(v.runs.map((r) => [r.id, r]));
    state.approvals = v.approvals;
    state.traceURL = v.trace_url || "";
  } else if (type === "run") {
    state.runs.set(v.id, v);
  } else if (type === "approvals") {
    state.approvals = v;
  }
  render();
}

function now() { return Date.now() + state.skew; }

// fmtTime writes a time with its date and zone: a run seen the next day,
// or from another zone, reads right.
function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString(undefined, { year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" }) : "";
}
function fmtDur(ms) { return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s"; }

function render() {
  renderApprovals();
  renderRuns();
  renderDetail();
}

// renderApprovals rebuilds the cards only when the list changed, so that a
// reason being typed is kept; otherwise it updates the countdowns.
let shownApprovals = null;
function renderApprovals() {
  const box = document.getElementById("approvals");
  const key = state.approvals.map((a) => a.action_id).join(",");
  if (key === shownApprovals) {
    for (const card of box.querySelectorAll(".approval")) {
      const a = state.approvals.find((x) => x.action_id === card.dataset.actionId);
      if (a) card.querySelector(".meta").textContent = approvalMeta(a);
    }
    return;
  }
  shownApprovals = key;
  document.getElementById("approval-count").textContent = state.approvals.length;
  box.replaceChildren();
  if (state.approvals.length === 0) {
    box.append(el("p", "empty", "No call waits for a decision."));
    return;
  }
  for (const a of state.approvals) {
    const card = el("div", "approval");
    card.dataset.actionId = a.action_id;
    card.append(el("div", "what", a.tool + " · run " + a.run_id));
    card.append(el("pre", "args", JSON.stringify(a.arguments, null, 2)));
    card.append(el("div", "meta", approvalMeta(a)));
    const reason = el("input");
    reason.placeholder = "reason (optional)";
    reason.maxLength = 1000;
    const approve = el("button", "approve", "Approve");
    const deny = el("button", "deny", "Deny");
    approve.onclick = () => decide(a.action_id, "approve", reason.value, card);
    deny.onclick = () => decide(a.action_id, "deny", reason.value, card);
    card.append(reason, " ", approve, " ", deny);
    box.append(card);
  }
}

function approvalMeta(a) {
  const left = Math.max(0, Date.parse(a.deadline) - now());
  return "action " + a.action_id + " · call " + a.tool_call_id +
    " · asked " + fmtTime(Date.parse(a.requested_at)) + " · times out in " + fmtDur(left);
}

async function decide(actionID, decision, reason, card) {
  for (const b of card.querySelectorAll("button")) b.disabled = true;
  const approver = document.getElementById("approver").value;
  localStorage.setItem("toolsidecar-approver", approver);
  const resp = await fetch("/v1/approvals/" + encodeURIComponent(actionID), {
    method: "POST",
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify({ decision, reason, approver }),
  });
  if (resp.ok || resp.status === 409 || resp.status === 404) {
    state.approvals = state.approvals.filter((a) => a.action_id !== actionID);
    if (resp.status !== 200) card.append(el("div", "meta", "already decided elsewhere"));
    render();
  } else {
    for (const b of card.querySelectorAll("button")) b.disabled = false;
    card.append(el("div", "meta", "decision failed: HTTP " + resp.status));
  }
}

function sortedRuns() {
  return [...state.runs.values()].sort((a, b) => b.started - a.started);
}

function renderRuns() {
  const body = document.querySelector("#runs tbody");
  body.replaceChildren();
  const runs = sortedRuns();
  if (!state.selected && runs.length) state.selected = runs[0].id;
  for (const r of runs) {
    const tr = el("tr");
    tr.dataset.runId = r.id;
    if (r.id === state.selected) tr.className = "selected";
    tr.append(el("td", "", r.id));
    const st = el("td");
    st.append(el("span", "status " + r.status, r.status));
    tr.append(st);
    tr.append(el("td", "", String(r.turns.length)));
    tr.append(el("td", "", String(r.calls)));
    tr.append(el("td", "", String(r.errors)));
    tr.append(el("td", "", fmtTime(r.started)));
    tr.append(el("td", "", fmtDur((r.ended || now()) - r.started)));
    tr.onclick = () => { state.selected = r.id; render(); };
    body.append(tr);
  }
}

function renderDetail() {
  const r = state.runs.get(state.selected);
  const box = document.getElementById("detail");
  box.hidden = !r;
  if (!r) return;
  document.getElementById("detail-id").textContent = r.id;
  const st = document.getElementById("detail-status");
  st.className = "status " + r.status;
  st.textContent = r.status + (r.error ? ": " + r.error : "");
  const trace = document.getElementById("detail-trace");
  trace.hidden = !(state.traceURL && r.trace_id);
  if (!trace.hidden) trace.href = state.traceURL.replaceAll("{trace_id}", encodeURIComponent(r.trace_id));
  const turns = document.getElementById("turns");
  turns.replaceChildren();
  for (const t of r.turns) turns.append(renderTurn(t));
}

// renderTurn draws a turn's batch: one bar per call, from its dispatch to
// its final status, on the turn's own time scale.
function renderTurn(t) {
  const box = el("div", "turn");
  box.dataset.turn = t.n;
  if (t.calls.length === 0) {
    box.className = "turn answer";
    box.append(el("h3", "", "Turn " + t.n + " · the model's answer, no tool calls · " + fmtTime(t.started)));
    return box;
  }
  const t0 = t.started;
  let end = t0 + 1;
  for (const c of t.calls) end = Math.max(end, c.finalised || c.recorded || c.replied || now());
  const span = end - t0;
  box.append(el("h3", "", "Turn " + t.n + " · " + t.calls.length + " call" + (t.calls.length === 1 ? "" : "s") + " · " + fmtDur(span)));
  const pct = (ms) => (100 * (ms - t0) / span).toFixed(2) + "%";
  box.append(axis(span));
  for (const c of t.calls) {
    const row = el("div", "row call");
    row.dataset.actionId = c.action_id;
    row.dataset.outcome = c.outcome || "running";
    row.append(el("div", "label", c.tool + " · " + c.tool_call_id));
    const track = el("div", "track");
    const seg = (cls, from, to) => {
      if (!from || !to || to < from) return;
      const s = el("div", "seg " + cls);
      s.style.left = pct(from);
      s.style.width = "calc(" + pct(to) + " - " + pct(from) + ")";
      track.append(s);
    };
    const waited = c.approval_asked ? (c.decided || now()) : 0;
    seg("wait", c.approval_asked, waited);
    const runFrom = c.decided || c.dispatched;
    if (!c.approval_asked || c.decided) {
      seg("run bar" + (c.outcome && c.outcome !== "ok" ? " error" : "") + (c.replied ? "" : " live"), runFrom, c.replied || now());
    }
    seg("rec", c.replied, c.recorded);
    seg("fin", c.recorded, c.finalised);
    row.append(track);
    const marks = el("div", "marks");
    const mark = (text, cls) => marks.append(el("span", "mark" + (cls ? " " + cls : ""), text));
    if (c.outcome && c.outcome !== "ok") mark(c.outcome, "error");
    if (c.approval) mark(c.approval + (c.approver ? " by " + c.approver : ""));
    if (c.attempts > 1) mark(c.attempts + " attempts");
    if (c.hedged) mark("hedged");
    if (c.lane) mark("lane " + c.lane);
    if (c.deduped_from) mark("dedupe of " + c.deduped_from);
    if (c.claim_check) mark("claim-check");
    row.title = c.error || c.preview || "";
    row.append(marks);
    row.onclick = () => {
      if (state.open.has(c.action_id)) state.open.delete(c.action_id); else state.open.add(c.action_id);
      render();
    };
    box.append(row);
    if (state.open.has(c.action_id)) box.append(details(c));
  }
  return box;
}

// axis is the turn's time scale: ticks from its start to its end.
function axis(span) {
  const row = el("div", "row axis");
  row.append(el("div", "label", ""));
  const track = el("div", "track");
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const tick = el("span", "tick", fmtDur(Math.round(span * f)));
    tick.style.left = (100 * f) + "%";
    track.append(tick);
  }
  row.append(track, el("div", "marks", ""));
  return row;
}

// details are a call's steps and what it returned, shown on a click.
function details(c) {
  const box = el("div", "details");
  box.dataset.actionId = c.action_id;
  const at = (ms) => ms ? fmtTime(ms) + " (+" + fmtDur(ms - c.dispatched) + ")" : "—";
  const lines = [
    ["tool_call_id", c.tool_call_id], ["action_id", c.action_id], ["outcome", c.outcome || "running"],
    ["dispatched", fmtTime(c.dispatched)], ["approval asked", c.approval_asked ? at(c.approval_asked) : ""],
    ["decided", c.decided ? at(c.decided) + " " + (c.approval || "") + (c.approver ? " by " + c.approver : "") : ""],
    ["replied", at(c.replied)], ["output recorded", at(c.recorded)], ["final status", at(c.finalised)],
    ["attempts", String(c.attempts || 1)], ["error", c.error || ""], ["output", c.preview || ""],
  ];
  for (const [k, v] of lines) {
    if (!v) continue;
    const line = el("div", "detail");
    line.append(el("span", "key-name", k), el("span", "value", v));
    box.append(line);
  }
  return box;
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("approver").value = localStorage.getItem("toolsidecar-approver") || "";
  document.getElementById("connect").onclick = () => {
    sessionStorage.setItem("toolsidecar-token", document.getElementById("token").value);
    document.getElementById("login").hidden = true;
    follow();
  };
  token();
  follow();
  setInterval(render, 1000); // bars of calls in flight grow, countdowns run
});
