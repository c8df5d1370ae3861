// The llmgw console: one page per subject, each rendered from its JSON
// under api/ (AdminService responses in protojson), refreshed every 2 s.
"use strict";

const REFRESH_MS = 2000;
const pages = { cluster: renderCluster, nodes: renderNodes, models: renderModels, adapters: renderAdapters, routers: renderRouters, tenants: renderTenants, flow: renderFlow };

function esc(v) {
  return String(v === undefined || v === null ? "" : v).replace(/[&<>"']/g, c => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}
function badge(text, cls) { return `<span class="badge ${cls}">${esc(text)}</span>`; }
function enumName(v, prefix) { return String(v || "").replace(prefix, "").toLowerCase() || "unknown"; }
function num(v, digits) { const n = Number(v); return Number.isFinite(n) ? n.toFixed(digits || 0) : "–"; }
// pct is a fraction (0..1) as a percentage an operator can tell from zero:
// whole percents from 10 %, one decimal below (0.2 %), "<0.1%" for less
// but not none — a KV cache at 0.2 % is in use, and "0%" said it was not.
function pct(v) {
  const p = 100 * Number(v);
  if (!Number.isFinite(p)) return "–";
  if (p === 0) return "0%";
  if (p < 0.1) return "<0.1%";
  return `${p < 10 ? p.toFixed(1) : p.toFixed(0)}%`;
}
function ago(ms) {
  if (!ms) return "never";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}
function dur(seconds) {
  const s = Number(seconds) || 0;
  if (s < 90) return `${s.toFixed(0)} s`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
function table(headers, rows, attrs) {
  const th = headers.map(h => h.startsWith("#") ? `<th class="num">${esc(h.slice(1))}</th>` : `<th>${esc(h)}</th>`).join("");
  const body = rows.length ? rows.join("") : `<tr><td colspan="${headers.length}" class="muted">none</td></tr>`;
  return `<div class="scroll"><table ${attrs || ""}><thead><tr>${th}</tr></thead><tbody>${body}</tbody></table></div>`;
}
function panel(title, sub, inner, attrs) {
  return `<section class="panel" ${attrs || ""}><div class="title"><h3>${title}</h3><span class="muted">${sub || ""}</span></div>${inner}</section>`;
}
function card(label, value, attrs) { return `<div class="card" ${attrs || ""}><div class="label">${esc(label)}</div><div class="value">${value}</div></div>`; }

const PHASE_CLASS = { ready: "ok", starting: "warn", restarting: "bad", unhealthy: "bad", failed: "bad", stopping: "idle", stopped: "idle", sleeping: "idle" };

// replicaPhase is a replica's phase as the console shows it: the agent's
// last report for this placement, or "no status" while there is none.
function replicaPhase(v) {
  const st = v.status;
  if (!st || st.uid !== v.replica.uid) return "no status";
  return enumName(st.phase, "REPLICA_PHASE_");
}

function renderCluster(d) {
  const st = d.status || {};
  const peers = (d.peers && d.peers.peers) || [];
  const members = (d.members && d.members.members) || [];
  const byPeer = Object.fromEntries(peers.map(p => [p.id, p]));
  const byMember = Object.fromEntries(members.map(m => [m.id, m]));
  const ids = [...new Set([...(st.servers || []).map(s => s.id), ...peers.map(p => p.id), ...members.map(m => m.id)])].sort();
  const servers = Object.fromEntries((st.servers || []).map(s => [s.id, s]));
  const rows = ids.map(id => {
    const s = servers[id] || {}, p = byPeer[id], m = byMember[id];
    const role = id === st.leader ? badge("leader", "ok") : (p ? (p.voter ? "follower" : "non-voter") : (s.voter ? "follower" : "not in raft"));
    const health = p ? (p.healthy ? badge("healthy", "ok") : badge("unhealthy", "bad")) : `<span class="muted">–</span>`;
    const gossip = m ? badge(m.status, m.status === "alive" ? "ok" : (m.status === "left" ? "idle" : "bad")) : `<span class="muted">no gossip</span>`;
    return `<tr data-server="${esc(id)}"><td><b>${esc(id)}</b>${id === st.server_id ? ' <span class="muted">(this server)</span>' : ""}</td><td>${role}</td><td>${health}</td><td>${gossip}</td>` +
      `<td>${esc(s.version || (p && p.version) || (m && m.version) || "")}</td><td class="num">${p ? esc(p.last_contact_ms) + " ms" : "–"}</td>` +
      `<td class="num">${p ? esc(p.last_index) : "–"}</td><td class="num">${p && p.healthy ? dur(p.stable_seconds) : "–"}</td>` +
      `<td class="mono">${esc(s.grpc_addr || (m && m.grpc_addr) || "")}</td><td class="mono">${esc(s.raft_addr || (p && p.address) || "")}</td><td class="mono">${esc(s.http_addr || "")}</td></tr>`;
  });
  const tol = Number(st.failure_tolerance || 0);
  return `<div class="cards">` +
    card("Leader", st.leader ? esc(st.leader) : badge("no leader", "bad"), 'data-card="leader"') +
    card("Health", st.healthy ? badge("healthy", "ok") : badge("unhealthy", "bad"), 'data-card="health"') +
    card("Failure tolerance", `${tol} <span class="muted" style="font-size:13px">of ${esc(st.voters)} voters</span>`, 'data-card="tolerance"') +
    card("Revision", esc(st.revision), 'data-card="revision"') +
    card("Minimum version", esc(st.min_version || "none"), 'data-card="min-version"') +
    `</div>` +
    panel("Servers", `as ${esc(st.server_id)} sees them; Raft figures from the leader`,
      table(["Server", "Raft role", "Autopilot", "Gossip", "Version", "#Last contact", "#Last index", "#Stable", "gRPC", "Raft", "HTTP"], rows, 'id="servers"'));
}

function renderNodes(d) {
  const nodes = (d.nodes && d.nodes.nodes) || [];
  const connected = (d.nodes && d.nodes.connected) || {};
  const reps = (d.replicas && d.replicas.replicas) || [];
  const rows = nodes.map(n => {
    const mine = reps.filter(v => v.replica.node === n.id);
    const used = mine.reduce((a, v) => a + (v.replica.gpu_indices || []).length, 0);
    const state = enumName(n.state, "NODE_STATE_");
    const labels = Object.entries(n.labels || {}).map(([k, v]) => `<code>${esc(k)}=${esc(v)}</code>`).join(" ");
    const ready = mine.filter(v => replicaPhase(v) === "ready").length;
    return `<tr data-node="${esc(n.id)}" data-state="${esc(state)}"><td><b>${esc(n.id)}</b></td><td>${badge(state, state === "active" ? "ok" : (state === "draining" ? "warn" : "bad"))}</td>` +
      `<td>${connected[n.id] ? badge("attached", "ok") : badge("no session", "bad")}</td>` +
      `<td class="num"><span class="bar"><i style="width:${n.gpus ? (100 * used / n.gpus).toFixed(0) : 0}%"></i></span>${used} / ${esc(n.gpus)}</td>` +
      `<td class="num">${ready} / ${mine.length}</td><td>${esc(n.version)}</td><td class="mono">${esc(n.address)}</td>` +
      `<td class="mono">${esc(n.agent_http_addr)}</td><td class="wrap">${labels || '<span class="muted">–</span>'}</td></tr>`;
  });
  return panel("Nodes", `${nodes.length} registered`, table(["Node", "State", "Agent", "#GPUs used", "#Replicas ready", "Version", "Address", "Agent HTTP", "Labels"], rows, 'id="nodes"'));
}

// The state of a model as the page colours it (ModelSummary.state), and
// the label of its "why" line.
const MODEL_STATE = {
  ready: ["ok", "Above the count"], idle: ["idle", "Idle"], unplaced: ["bad", "Not placed"], starting: ["warn", "Starting"],
  not_ready: ["bad", "Not ready"], unknown: ["warn", "Unknown"],
};

function clock(ms) {
  const n = Number(ms);
  return n ? `${new Date(n).toLocaleTimeString()} <span class="muted">(${ago(n)})</span>` : "–";
}

// autoscaleFacts: an autoscaled model's range, targets, the count the
// autoscaler set and the demand its last decision saw (ModelStatus).
function autoscaleFacts(m, st) {
  const a = m.autoscale, facts = [];
  facts.push(`<span data-fact="range"><b>autoscale</b> ${esc(a.min)}..${esc(a.max)}</span>`);
  const targets = [];
  if (Number(a.target_waiting) > 0) targets.push(`waiting ${esc(a.target_waiting)}/replica`);
  if (Number(a.target_kv_usage) > 0) targets.push(`KV ${num(100 * a.target_kv_usage)}%`);
  if (Number(a.ttft_p90_slo_ms) > 0) targets.push(`TTFT p90 ${esc(a.ttft_p90_slo_ms)} ms`);
  facts.push(`<span><b>targets</b> ${targets.join(" · ") || "none"}</span>`);
  if (a.sleep) facts.push(`<span><b>sleep</b> idle replicas sleep</span>`);
  const dm = st && st.demand;
  facts.push(dm
    ? `<span data-fact="demand"><b>demand</b> held ${num(dm.held)} · waiting ${num(dm.waiting, 1)} · running ${num(dm.running, 1)} on ${num(dm.replicas)} replicas · ${num(dm.requests)} requests in the last minute</span>`
    : `<span data-fact="demand"><b>demand</b> <span class="muted">none reported</span></span>`);
  return facts;
}

// scaleEvents: the autoscaler's decisions, newest first, as ModelStatus
// gives them (at most 20): STEP a count it set, HELD one it could not.
const MAX_EVENTS_SHOWN = 10;
function scaleEvents(m, st) {
  const evs = (st && st.events) || [];
  const set = st && st.scale;
  const head = set
    ? `set to <b>${esc(set.replicas)}</b> at ${clock(set.decided_unix_ms)}: ${esc(set.reason)}`
    : `no count set yet: the model runs its starting count (replicas ${esc(m.replicas)})`;
  const rows = evs.slice(0, MAX_EVENTS_SHOWN).map(e => {
    const kind = e.blocked ? "held" : "step";
    return `<tr data-event="${kind}"><td>${clock(e.unix_ms)}</td><td>${e.blocked ? badge("HELD", "warn") : badge("STEP", "ok")}</td>` +
      `<td class="num">${esc(e.from)} → ${esc(e.to)}</td><td class="reason">${esc(e.reason)}</td></tr>`;
  });
  const more = evs.length > MAX_EVENTS_SHOWN ? `<div class="more muted">${evs.length - MAX_EVENTS_SHOWN} older: <code>llmgwctl model status ${esc(m.name)}</code></div>` : "";
  const empty = `<tr><td colspan="4" class="muted">no decision kept on this leader yet (a new leader starts with none)</td></tr>`;
  return `<div class="decisions" data-decisions="${esc(m.name)}"><h4>Autoscaler decisions <span class="muted">newest first · ${head}</span></h4>` +
    `<div class="scroll"><table><thead><tr><th>At</th><th></th><th class="num">From → to</th><th class="reason">Reason</th></tr></thead><tbody>${rows.join("") || empty}</tbody></table></div>${more}</div>`;
}

function renderModels(d) {
  const models = (d.models && d.models.models) || [];
  const reps = (d.replicas && d.replicas.replicas) || [];
  const load = d.load || {};
  const statuses = d.status || {}, summaries = d.summary || {};
  return models.map(m => {
    const mine = reps.filter(v => v.replica.model === m.name);
    const st = statuses[m.name];
    const sum = summaries[m.name] || { desired: 0, placed: 0, ready: 0, asleep: 0, state: "unknown", why: "no summary for this model" };
    const rows = mine.map(v => {
      const r = v.replica, st = v.status || {};
      const phase = replicaPhase(v);
      const l = load[r.id];
      let loadCells = `<td class="num muted">–</td><td class="num muted">–</td><td class="num muted">–</td>`;
      if (l && l.error) loadCells = `<td colspan="3" class="muted wrap">${esc(l.error)}</td>`;
      else if (l) loadCells = `<td class="num">${num(l.running)}</td><td class="num">${num(l.waiting)}</td>` +
        `<td class="num" data-kv-usage="${esc(l.kv_usage)}"><span class="bar"><i style="width:${(100 * l.kv_usage).toFixed(0)}%"></i></span>${pct(l.kv_usage)}</td>`;
      // The KV index: untrusted (routers place the replica by tier 1,
      // design §7.5) with the agent's reason, or the blocks it holds.
      const kv = v.kv;
      const kvState = !kv ? "none" : (kv.untrusted ? "untrusted" : "trusted");
      const kvCell = !kv ? `<td class="muted">–</td>` : (kv.untrusted
        ? `<td class="wrap">${badge("untrusted", "bad")} <span class="muted">${esc(kv.untrusted_reason)}</span></td>`
        : `<td class="num">${num(Number(kv.blocks || 0))} blocks</td>`);
      return `<tr data-replica="${esc(r.id)}" data-phase="${esc(phase)}" data-restarts="${esc(st.restarts || 0)}" data-kv="${kvState}"><td><b>${esc(r.id)}</b>${r.draining ? " " + badge("draining", "warn") : ""}${r.sleeping ? " " + badge("asleep", "idle") : ""}</td>` +
        `<td>${badge(phase, PHASE_CLASS[phase] || "idle")}</td><td>${esc(r.node)}</td><td>${esc((r.gpu_indices || []).join(","))}</td>` +
        `<td class="mono">${esc(st.address)}</td><td class="num">${esc(st.restarts || 0)}</td>${loadCells}${kvCell}<td class="wrap muted">${esc(st.message)}</td></tr>`;
    });
    // The count is the leader's (ModelStatus): the autoscaler's, or
    // replicas; an external model's is its endpoints. Whenever fewer are
    // ready, the summary says why (controlplane/console/modelstatus.go).
    const [cls, label] = MODEL_STATE[sum.state] || ["warn", sum.state];
    const known = sum.state !== "unknown";
    const desired = known ? esc(sum.desired) : "?";
    const readyBadge = badge(`${sum.ready} / ${known ? sum.desired : "?"} ready`, sum.state === "ready" || sum.state === "idle" ? "ok" : cls);
    const stateBadge = sum.state === "ready" ? "" : " " + badge(label.toLowerCase(), cls);
    const why = sum.why ? `<div class="why ${cls}" data-why="${esc(sum.state)}"><b>${esc(label)}:</b> ${esc(sum.why)}</div>` : "";
    const err = sum.error ? `<div class="why warn" data-status-error><b>No model status:</b> ${esc(sum.error)}</div>` : "";
    const facts = [`<span data-fact="counts"><b>desired</b> ${desired} · <b>placed</b> ${esc(sum.placed)} · <b>ready</b> ${esc(sum.ready)} · <b>asleep</b> ${esc(sum.asleep)}</span>`];
    if (m.autoscale) facts.push(...autoscaleFacts(m, st));
    else facts.push(`<span><b>replicas</b> ${esc(m.engine === "external" ? (m.endpoints || []).length : m.replicas)} (no autoscale)</span>`);
    if (Number(m.priority)) facts.push(`<span><b>priority</b> ${esc(m.priority)}</span>`);
    if (m.pinned) facts.push(`<span><b>pinned</b> never gives a GPU</span>`);
    return panel(`${esc(m.name)} ${readyBadge}${stateBadge}`,
      `<span data-task="${esc(m.task || "generate")}">${m.task === "embed" ? badge("embedding", "idle") : "generate"}</span> · ${esc(m.engine)} · <code>${esc(m.model || (m.endpoints || []).join(", "))}</code> · profile ${esc(m.profile)} · ${esc(m.gpus_per_replica)} GPU/replica · ${(m.adapters || []).length} adapters`,
      why + err + `<div class="facts">${facts.join("")}</div>` +
      table(["Replica", "Phase", "Node", "GPUs", "Address", "#Restarts", "#Running", "#Waiting", "#KV cache", "KV index", "Message"], rows) +
      (m.autoscale ? scaleEvents(m, st) : ""),
      `data-model="${esc(m.name)}" data-state="${esc(sum.state)}" data-desired="${esc(sum.desired)}" data-placed="${esc(sum.placed)}" data-ready="${esc(sum.ready)}" data-asleep="${esc(sum.asleep)}"`);
  }).join("") || `<p class="muted">No model. Apply one with <code>llmgwctl model apply -f model.yaml</code>.</p>`;
}

const ADAPTER_CLASS = { loaded: "ok", loading: "warn", failed: "bad", unloading: "idle" };

function renderAdapters(d) {
  const ads = (d.adapters && d.adapters.adapters) || [];
  const rows = ads.map(a => {
    const held = (a.statuses || []).map(s => {
      const state = enumName(s.state, "ADAPTER_STATE_");
      return `${badge(state, ADAPTER_CLASS[state] || "idle")} <code>${esc(s.replica_id)}</code>${s.active ? ` <span class="muted">${esc(s.active)} active</span>` : ""}${s.reason ? ` <span class="muted">${esc(s.reason)}</span>` : ""}`;
    }).join("<br>");
    const placed = (a.placed_on || []).map(r => `<code>${esc(r)}</code>`).join(" ");
    return `<tr data-adapter="${esc(a.adapter)}"><td><b>${esc(a.adapter)}</b></td><td>${esc(a.model)}</td><td class="mono wrap">${esc(a.path)}</td>` +
      `<td>${placed || badge("cold", "idle")}</td><td>${held || '<span class="muted">held nowhere</span>'}</td></tr>`;
  });
  return panel("Adapters", "placement by the leader; states as the agents report them",
    table(["Adapter", "Model", "Path", "Placed on", "Held (state per replica)"], rows, 'id="adapters"'));
}

function spark(values) {
  const top = Math.max(1, ...values);
  return `<span class="spark" title="decisions per interval">${values.map(v => `<i style="height:${Math.max(1, 22 * v / top).toFixed(0)}px"></i>`).join("")}</span>`;
}

function renderRouters(d) {
  const v = d.routers || { routers: [] };
  let out = d.hint ? `<div class="hint">${esc(d.hint)}</div>` : "";
  out += (v.routers || []).map(r => {
    const head = r.error ? badge(r.read_unix_ms ? "stale" : "unreachable", "bad") : badge("up", "ok");
    const sub = `read ${ago(r.read_unix_ms)} · history ${dur(r.span_seconds)} of ${dur(v.window_seconds)}${r.error ? " · " + esc(r.error) : ""}`;
    const tiers = (r.tiers || []).map(t => {
      const total = t.decisions.reduce((a, x) => a + x.window, 0);
      const rows = t.decisions.map(x => `<tr data-decision="${esc(x.decision)}"><td>${esc(x.decision || "(none)")}</td><td class="num">${num(x.last_minute)}</td><td class="num">${num(x.window)}</td>` +
        `<td class="num">${total ? num(100 * x.window / total) + "%" : "–"}</td><td class="num muted">${num(x.total)}</td></tr>`);
      return `<div data-tier="${esc(t.tier)}"><h4>${esc(t.tier)} ${spark(t.per_interval || [])}</h4>${table(["Decision", "#1 min", `#${dur(v.window_seconds)}`, "#Share", "#Total"], rows)}</div>`;
    }).join("");
    return panel(`<span class="mono">${esc(r.url)}</span> ${head}`, sub, `<div class="tiers">${tiers}</div>`, `data-router="${esc(r.url)}"`);
  }).join("");
  return out || `<p class="muted">No router.</p>`;
}

// The limits of TenantLimits as llmgwctl spells them (--input-tpm, ...).
const LIMITS = [["rpm", "rpm"], ["input_tpm", "input-tpm"], ["output_tpm", "output-tpm"], ["weighted_tpm", "weighted-tpm"],
  ["concurrency", "concurrency"], ["daily_tokens", "daily-tokens"], ["monthly_tokens", "monthly-tokens"]];

function limitsText(l) {
  const set = LIMITS.filter(([k]) => Number((l || {})[k] || 0) > 0).map(([k, name]) => `${name} <b>${num(l[k])}</b>`);
  return set.length ? set.join(" · ") : `<span class="muted">no limits</span>`;
}

// classText is a tenant's priority classes (flow control, design §7.8):
// the class its requests get unless they ask a lower one, and the highest
// they may ask for. Empty is the routers' flow.default_class, and for the
// highest the tenant's default class.
function classText(t) {
  const def = t.default_class ? `<code>${esc(t.default_class)}</code>` : "the routers' default";
  const max = t.max_class ? `<code>${esc(t.max_class)}</code>` : "its default";
  return ` · priority class ${def}, may ask up to ${max}`;
}

// budgetCell is a budget left: "–" without a budget, a bar of what is
// left of it, or what was spent beyond it.
function budgetCell(left, budget) {
  if (left === null || left === undefined) return `<td class="num muted">–</td>`;
  const n = Number(left), b = Number(budget) || 1;
  if (n < 0) return `<td class="num" data-left="${n}">${badge("over by " + num(-n), "bad")}</td>`;
  return `<td class="num" data-left="${n}"><span class="bar"><i style="width:${Math.min(100, 100 * n / b).toFixed(0)}%"></i></span>${num(n)}</td>`;
}

function refusedCell(n, cls) {
  return Number(n) > 0 ? `<td class="num">${badge(num(n), cls)}</td>` : `<td class="num muted">0</td>`;
}

function usageCells(u) {
  const h = (u && u.hour) || {}, t = (u && u.today) || {};
  const n = v => num(v || 0);
  return `<td class="num">${n(h.requests)}</td><td class="num">${n(h.input_tokens)}</td><td class="num">${n(h.output_tokens)}</td>` +
    `<td class="num">${n(t.requests)}</td><td class="num">${n(t.input_tokens)}</td><td class="num">${n(t.output_tokens)}</td>`;
}

function renderTenants(d) {
  const tenants = (d.tenants && d.tenants.tenants) || [];
  const usage = (d.usage && d.usage.tenants) || {};
  const heads = ["Scope", "Limits", "#Requests this hour", "#Input this hour", "#Output this hour", "#Requests today", "#Input today", "#Output today",
    "#Budget left today", "#Budget left this month", "#Refused today", "#Shadow refused today"];
  let out = tenants.map(t => {
    const u = usage[t.name] || {};
    const byModel = u.models || {};
    const limitsOf = Object.fromEntries((t.model_limits || []).map(ml => [ml.model, ml.limits || {}]));
    const models = [...new Set([...Object.keys(limitsOf), ...Object.keys(byModel)])].sort();
    const scope = (label, model, l, su) => {
      const today = (su && su.today) || {};
      return `<tr data-scope="${esc(model)}"><td>${label}</td><td class="wrap">${limitsText(l)}</td>${usageCells(su)}` +
        budgetCell(su && su.daily_left, l && l.daily_tokens) + budgetCell(su && su.monthly_left, l && l.monthly_tokens) +
        refusedCell(today.refused, "bad") + refusedCell(today.shadow_refused, "warn") + `</tr>`;
    };
    const rows = [scope("<b>all models</b>", "", t.limits || {}, u)].concat(models.map(m => scope(`<code>${esc(m || "(no model)")}</code>`, m, limitsOf[m], byModel[m])));
    const w = t.weights;
    const x = milli => String(Number(milli || 0) / 1000);
    const weights = w ? ` · weights input ${x(w.input_milli)}, cached ${x(w.cached_milli)}, output ${x(w.output_milli)}` : "";
    const mode = t.shadow ? badge("shadow: counts, never refuses", "warn") : badge("enforcing", "ok");
    return panel(`${esc(t.name)} ${mode}`, `models: ${esc((t.models || []).join(", ") || "every model")}${weights}${classText(t)}`,
      table(heads, rows), `data-tenant="${esc(t.name)}" data-shadow="${t.shadow ? "true" : "false"}" ` +
      `data-default-class="${esc(t.default_class || "")}" data-max-class="${esc(t.max_class || "")}"`);
  }).join("");
  // Usage of tenants without limits: keys' own tenants and requests
  // without a key (-).
  const known = new Set(tenants.map(t => t.name));
  const others = Object.keys(usage).filter(n => !known.has(n)).sort().map(n => {
    const today = usage[n].today || {};
    return `<tr data-usage-tenant="${esc(n)}"><td>${n ? esc(n) : "-"}</td>${usageCells(usage[n])}${refusedCell(today.refused, "bad")}</tr>`;
  });
  if (others.length) {
    out += panel("Usage without a tenant's limits", "a key's own tenant, and - for requests without a key",
      table(["Tenant", "#Requests this hour", "#Input this hour", "#Output this hour", "#Requests today", "#Input today", "#Output today", "#Refused today"], others, 'id="other-usage"'));
  }
  return out || `<p class="muted">No tenant. Create one with <code>llmgwctl tenant create NAME --rpm N</code>.</p>`;
}

// wait is a queue's oldest wait in milliseconds, as the routers report it.
function wait(ms) {
  const n = Number(ms) || 0;
  return n < 1000 ? `${n.toFixed(0)} ms` : (n < 90000 ? `${(n / 1000).toFixed(1)} s` : dur(n / 1000));
}
function bytes(v) {
  const n = Number(v) || 0;
  if (n < 1024) return `${n} B`;
  if (n < 1 << 20) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1 << 20)).toFixed(1)} MiB`;
}

// renderFlow: the routers' flow-control queues as the leader last heard
// them (FlowStatus), summed per model and class, then each router's own.
function renderFlow(d) {
  const st = d.flow || {};
  const total = st.total || [], routers = st.routers || [];
  const queueCells = q => `<td class="num">${num(q.queued)}</td><td class="num">${bytes(q.queued_bytes)}</td><td class="num">${wait(q.oldest_wait_ms)}</td>`;
  const rows = total.map(q => `<tr data-flow-model="${esc(q.model)}" data-flow-class="${esc(q.class)}" data-queued="${esc(q.queued)}">` +
    `<td><b>${esc(q.model)}</b></td><td>${esc(q.class)}</td><td class="num">${esc(q.rank)}</td>${queueCells(q)}<td class="num">${esc(q.routers)}</td></tr>`);
  const perRouter = routers.flatMap(r => {
    const head = `<td><b>${esc(r.router)}</b></td><td class="muted">${ago(Number(r.reported_unix_ms))}</td>`;
    const qs = r.depths || [];
    if (!qs.length) return [`<tr data-flow-router="${esc(r.router)}">${head}<td colspan="5" class="muted">no queue</td></tr>`];
    return qs.map((q, i) => `<tr data-flow-router="${esc(r.router)}">${i ? "<td></td><td></td>" : head}` +
      `<td>${esc(q.model)}</td><td>${esc(q.class)}</td>${queueCells(q)}</tr>`);
  });
  return panel("Queued by model and class", "summed over the routers; rank 0 is the highest class",
    table(["Model", "Class", "#Rank", "#Queued", "#Queued bytes", "#Oldest wait", "#Routers"], rows, 'id="flow-total"')) +
    panel("By router", `${routers.length} reporting · each reports every 250 ms, and drops off 3 s after its last report`,
      table(["Router", "Reported", "Model", "Class", "#Queued", "#Queued bytes", "#Oldest wait"], perRouter, 'id="flow-routers"'));
}

let current = "", timer = 0, seq = 0;

async function refresh() {
  clearTimeout(timer);
  const page = current, mine = ++seq;
  try {
    const resp = await fetch(`api/${page}`, { cache: "no-store" });
    if (!resp.ok) throw new Error(`${resp.status} ${(await resp.text()).trim()}`);
    const d = await resp.json();
    if (mine !== seq) return;
    const errs = Object.entries(d.errors || {}).map(([k, e]) => `<div class="error"><b>${esc(k)}</b>: ${esc(e)}</div>`).join("");
    document.getElementById("errors").innerHTML = errs;
    document.getElementById("content").innerHTML = pages[page](d);
    document.getElementById("updated").textContent = `updated ${new Date(d.now_unix_ms || Date.now()).toLocaleTimeString()}`;
    document.body.dataset.rendered = page;
  } catch (e) {
    if (mine !== seq) return;
    document.getElementById("errors").innerHTML = `<div class="error">${esc(e.message || e)}</div>`;
  }
  if (mine === seq) timer = setTimeout(refresh, REFRESH_MS);
}

async function serverName() {
  try {
    const d = await (await fetch("api/cluster", { cache: "no-store" })).json();
    if (d.status) document.getElementById("server").textContent = `server ${d.status.server_id}`;
  } catch (e) { /* the page's own refresh reports errors */ }
}

function route() {
  const page = (location.hash || "#cluster").slice(1);
  current = pages[page] ? page : "cluster";
  document.querySelectorAll("nav a").forEach(a => a.classList.toggle("active", a.dataset.page === current));
  document.body.dataset.rendered = "";
  refresh();
}

window.addEventListener("hashchange", route);
serverName();
route();
