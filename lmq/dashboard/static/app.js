// lmq-gateway dashboard: one page, hash routes, data from /api/* (docs/dashboard.md).
// Every value from the server is put into the page as text (never as HTML): topic names,
// client ids and payloads come from clients.
"use strict";

const state = { auth: sessionStorage.getItem("lmq-auth") || "", session: null, timer: null };

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function fmt(n) {
  if (n === null || n === undefined) return "–";
  if (typeof n !== "number") return String(n);
  return n.toLocaleString("en-US", { maximumFractionDigits: 2 });
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

async function api(path, options) {
  const headers = Object.assign({}, (options || {}).headers);
  if (state.auth) headers["Authorization"] = "Basic " + state.auth;
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  let data = null;
  try { data = await resp.json(); } catch (e) { data = { error: resp.statusText }; }
  if (!resp.ok) throw new Error((data && data.error) || ("HTTP " + resp.status));
  return data;
}

async function act(name, body) {
  if (!state.session || !state.session.csrf) { notice("log in with an admin account first", true); return null; }
  try {
    const data = await api("/api/actions/" + name, {
      method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", "X-CSRF-Token": state.session.csrf },
    });
    notice(data.message, false);
    return data;
  } catch (e) { notice(e.message, true); return null; }
}

function notice(text, error) {
  const el = document.getElementById("notice");
  el.textContent = text;
  el.className = "notice" + (error ? " error" : "");
  el.id = "notice";
}

function table(columns, rows, empty) {
  if (!rows.length) return h("p", { class: "muted" }, empty || "Nothing here yet.");
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map(c => h("th", { class: c.num ? "num" : "" }, c.title)))),
    h("tbody", {}, rows.map(r => h("tr", {}, columns.map(c => {
      const v = c.value(r);
      return h("td", { class: (c.num ? "num " : "") + (c.mono ? "mono" : "") },
        v instanceof Node ? v : (c.num ? fmt(v) : (v === null || v === undefined ? "–" : String(v))));
    })))));
}

function card(label, value) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label),
    h("div", { class: "value" }, value));
}

function pager(data, onPage) {
  const limit = 50;
  const first = data.total ? data.offset + 1 : 0;
  const last = data.offset + data.items.length;
  return h("div", { class: "pager" },
    h("button", { class: "plain", disabled: data.offset <= 0, onclick: () => onPage(Math.max(0, data.offset - limit)) }, "‹ prev"),
    h("span", { class: "muted" }, `${first}–${last} of ${fmt(data.total)}`),
    h("button", { class: "plain", disabled: last >= data.total, onclick: () => onPage(data.offset + limit) }, "next ›"));
}

function adminOnly(node) { return state.session && state.session.user ? node : ""; }

function perm(p) {  // RocketMQ permission bits: 4 read, 2 write, 1 inherit
  return [p & 4 && "read", p & 2 && "write", p & 1 && "inherit"].filter(Boolean).join(", ") || "none";
}

function niceMax(v) {  // 1, 2, 5 x 10^n at or above v
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 2, 5, 10].map(m => m * p).find(m => m >= v);
}

// -- charts ---------------------------------------------------------------------------------
function chart(title, rates, series) {
  const canvas = h("canvas", { width: 840, height: 360 });
  const box = h("div", { class: "chart" }, h("div", { class: "title" }, title),
    h("div", { class: "legend" }, series.map((s, i) => h("span", { class: "s" + i }, "● " + s.label))),
    canvas);
  requestAnimationFrame(() => drawChart(canvas, rates, series));
  return box;
}

function drawChart(canvas, rates, series) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, L = 90, B = 40, T = 14, R = 14;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "22px system-ui, sans-serif";
  const values = rates.flatMap(r => series.map(s => r[s.key] || 0));
  const max = niceMax(Math.max(4, ...values));
  const t0 = rates.length ? rates[0].t : Date.now(), t1 = rates.length ? rates[rates.length - 1].t : t0 + 1;
  const x = t => L + (W - L - R) * (t1 === t0 ? 1 : (t - t0) / (t1 - t0));
  const y = v => H - B - (H - B - T) * (v / max);
  ctx.strokeStyle = "#dde3ea"; ctx.fillStyle = "#667485"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = max * i / 4, yy = y(v);
    ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(W - R, yy); ctx.stroke();
    ctx.fillText(fmt(v), 4, yy + 7);
  }
  const mins = Math.round((t1 - t0) / 60000);
  ctx.fillText(rates.length > 1 ? `last ${mins || "<1"} min` : "collecting samples…", L, H - 8);
  const colors = ["#2f6fb3", "#d9822b"];
  series.forEach((s, i) => {
    ctx.strokeStyle = colors[i]; ctx.lineWidth = 3; ctx.beginPath();
    rates.forEach((r, j) => { const px = x(r.t), py = y(r[s.key] || 0); j ? ctx.lineTo(px, py) : ctx.moveTo(px, py); });
    if (rates.length === 1) { const r = rates[0]; ctx.arc(x(r.t), y(r[s.key] || 0), 4, 0, 7); }
    ctx.stroke();
  });
}

// -- pages ----------------------------------------------------------------------------------
const pages = {
  async overview(main) {
    const d = await api("/api/overview");
    const b = d.broker, m = d.mqtt, last = d.rates[d.rates.length - 1] || {};
    main.append(h("h2", {}, "Overview"),
      h("div", { class: "cards" },
        card("status", h("span", { class: "badge " + (d.ready === "ready" ? "on" : "off") }, d.ready)),
        b && card("messages stored", fmt(b.puts)),
        b && card("puts / s", fmt(last.puts)),
        b && card("CommitLog", bytes(b.commitlog_bytes)),
        b && card("topics", fmt(b.topics)),
        b && card("LMQs", fmt(b.lmqs)),
        b && card("groups online", fmt(b.groups_online)),
        m && card("MQTT clients", fmt(m.clients)),
        m && card("MQTT sessions", fmt(m.sessions)),
        m && card("subscriptions", fmt(m.subscriptions)),
        m && card("retained", fmt(m.retained)),
        d.amqp && card("AMQP queues", fmt(d.amqp.queues))),
      h("div", { class: "charts" },
        b && chart("Broker: messages per second", d.rates, [{ key: "puts", label: "stored" }, { key: "gets", label: "pulled" }]),
        m && chart("MQTT: PUBLISH per second", d.rates, [{ key: "mqtt_in", label: "in" }, { key: "mqtt_out", label: "out" }])));
  },

  async brokers(main) {
    const d = await api("/api/brokers");
    main.append(h("h2", {}, "Brokers and name servers"));
    const b = d.broker;
    if (b) main.append(h("h3", {}, "This broker"), table([
      { title: "name", value: r => r.name }, { title: "cluster", value: r => r.cluster },
      { title: "address", value: r => r.addr, mono: true }, { title: "role", value: r => r.role },
      { title: "flush", value: r => r.flush }, { title: "data dir", value: r => r.data_dir, mono: true },
      { title: "CommitLog", value: r => bytes(r.commitlog_bytes) },
      { title: "flush lag", value: r => bytes(r.flush_lag_bytes) },
      { title: "ConsumeQueues", value: r => r.consume_queues, num: true },
      { title: "LMQs", value: r => r.lmqs, num: true },
      { title: "long polls", value: r => r.long_poll_waiters, num: true }], [b]));
    const ns = d.namesrv;
    if (ns) {
      main.append(h("h3", {}, `Name server (port ${ns.port}, ${ns.topics} topics with routes)`),
        table([{ title: "broker", value: r => r.name }, { title: "cluster", value: r => r.cluster },
          { title: "addresses (id: address)", value: r => Object.entries(r.addrs).map(([i, a]) => `${i}: ${a}`).join(", "), mono: true }],
          ns.brokers, "No broker registered."),
        h("h3", {}, "Live registrations"),
        table([{ title: "address", value: r => r.addr, mono: true },
          { title: "last heartbeat (s ago)", value: r => r.last_seen_s, num: true },
          { title: "HA address", value: r => r.ha_addr || "–", mono: true }], ns.live, "None."));
    } else main.append(h("p", { class: "muted" }, "No name server in this process."));
  },

  async topics(main, params) {
    const offset = +params.get("offset") || 0, q = params.get("q") || "";
    const d = await api(`/api/topics?offset=${offset}&q=${encodeURIComponent(q)}`);
    const filter = h("input", { name: "q", value: q, placeholder: "filter" });
    main.append(h("h2", {}, "Topics"),
      h("form", { class: "inline", onsubmit: e => { e.preventDefault(); go("topics", { q: filter.value }); } },
        h("label", {}, "name contains", filter), h("button", { type: "submit" }, "Filter")));
    const name = h("input", { name: "topic", placeholder: "topic name", required: true });
    const queues = h("input", { name: "queues", type: "number", value: "4", min: "1", max: "64" });
    main.append(adminOnly(h("form", { class: "inline", id: "create-topic", onsubmit: async e => {
      e.preventDefault();
      if (await act("topic/create", { topic: name.value, queues: +queues.value })) render();
    } }, h("label", {}, "new topic", name), h("label", {}, "queues", queues), h("button", { type: "submit" }, "Create topic"))));
    main.append(table([
      { title: "topic", value: r => h("a", { href: "#messages?topic=" + encodeURIComponent(r.topic) }, r.topic), mono: true },
      { title: "read / write queues", value: r => `${r.read_queues} / ${r.write_queues}` },
      { title: "permission", value: r => perm(r.perm) },
      { title: "messages", value: r => r.messages, num: true },
      { title: "", value: r => adminOnly(h("button", { class: "danger", onclick: async () => {
        if (confirm(`Delete topic ${r.topic}?`) && await act("topic/delete", { topic: r.topic })) render();
      } }, "delete")) || "" }], d.items, "No topics."), pager(d, o => go("topics", { q, offset: o })));
  },

  async groups(main, params) {
    const offset = +params.get("offset") || 0;
    const d = await api(`/api/groups?offset=${offset}`);
    main.append(h("h2", {}, "Consumer groups"), table([
      { title: "group", value: r => r.group, mono: true }, { title: "topic", value: r => r.topic, mono: true },
      { title: "queues", value: r => r.queues, num: true }, { title: "lag (messages)", value: r => r.lag, num: true },
      { title: "clients online", value: r => r.clients, num: true },
      { title: "reset offset", value: r => adminOnly(h("span", {},
        h("button", { class: "plain", onclick: async () => { if (await act("group/reset", { group: r.group, topic: r.topic, to: "earliest" })) render(); } }, "to earliest"), " ",
        h("button", { class: "plain", onclick: async () => { if (await act("group/reset", { group: r.group, topic: r.topic, to: "latest" })) render(); } }, "to latest"))) || "" }],
      d.items, "No group has committed an offset yet."), pager(d, o => go("groups", { offset: o })));
  },

  async mqtt(main, params) {
    const offset = +params.get("offset") || 0;
    const d = await api(`/api/mqtt/clients?offset=${offset}`);
    main.append(h("h2", {}, "MQTT clients and sessions"));
    if (d.absent) { main.append(h("p", { class: "muted" }, d.absent)); return; }
    main.append(table([
      { title: "client id", value: r => r.client_id, mono: true },
      { title: "state", value: r => h("span", { class: "badge " + (r.connected ? "on" : "") }, r.connected ? "connected" : "offline") },
      { title: "from", value: r => r.remote, mono: true }, { title: "user", value: r => r.username },
      { title: "MQTT", value: r => ({ 3: "3.1", 4: "3.1.1", 5: "5.0" })[r.version] || r.version },
      { title: "session", value: r => r.persistent ? (r.expiry === null ? "persistent" : `expires ${r.expiry} s`) : "clean" },
      { title: "subscriptions", value: r => r.subscriptions.join(", ") + (r.subscription_count > r.subscriptions.length ? " …" : ""), mono: true },
      { title: "in flight", value: r => r.inflight, num: true },
      { title: "", value: r => (r.connected && adminOnly(h("button", { class: "danger", onclick: async () => {
        if (await act("mqtt/kick", { client_id: r.client_id })) setTimeout(render, 300);
      } }, "kick"))) || "" }], d.items, "No MQTT session."), pager(d, o => go("mqtt", { offset: o })));
  },

  async retained(main, params) {
    const offset = +params.get("offset") || 0;
    const d = await api(`/api/mqtt/retained?offset=${offset}`);
    main.append(h("h2", {}, "Retained messages"));
    if (d.absent) { main.append(h("p", { class: "muted" }, d.absent)); return; }
    main.append(table([
      { title: "topic", value: r => r.topic, mono: true }, { title: "QoS", value: r => r.qos, num: true },
      { title: "size", value: r => bytes(r.payload.size) },
      { title: "payload", value: r => h("pre", { class: "body mono" }, r.payload.text + (r.payload.truncated ? " …" : "")) }],
      d.items, "No retained message."), pager(d, o => go("retained", { offset: o })));
  },

  async amqp(main) {
    const d = await api("/api/amqp");
    main.append(h("h2", {}, "AMQP exchanges and queues"));
    if (d.absent) { main.append(h("p", { class: "muted" }, d.absent)); return; }
    main.append(h("h3", {}, `Queues (${d.queues_total})`), table([
      { title: "queue", value: r => r.name, mono: true }, { title: "LMQ", value: r => r.lmq, mono: true },
      { title: "ready", value: r => r.messages, num: true }, { title: "consumers", value: r => r.consumers, num: true },
      { title: "flags", value: r => [r.durable && "durable", r.exclusive && "exclusive", r.auto_delete && "auto-delete"].filter(Boolean).join(", ") },
      { title: "bindings", value: r => r.bindings.map(b => `${b.exchange || "(default)"} → ${b.routing_key || "*"}`).join("; "), mono: true },
      { title: "", value: r => adminOnly(h("button", { class: "danger", onclick: async () => {
        if (confirm(`Purge queue ${r.name}?`) && await act("queue/purge", { queue: r.name })) render();
      } }, "purge")) || "" }], d.queues, "No queue declared."),
    h("h3", {}, `Exchanges (${d.exchanges_total})`), table([
      { title: "exchange", value: r => r.name || "(default)", mono: true }, { title: "type", value: r => r.type },
      { title: "flags", value: r => [r.durable && "durable", r.auto_delete && "auto-delete", r.internal && "internal"].filter(Boolean).join(", ") }],
      d.exchanges));
  },

  async messages(main, params) {
    const field = (name, label, attrs) => h("label", {}, label, h("input", Object.assign({ name, value: params.get(name) || "" }, attrs || {})));
    const form = h("form", { class: "inline", id: "browse", onsubmit: e => {
      e.preventDefault();
      const q = {};
      for (const el of form.querySelectorAll("input")) if (el.value) q[el.name] = el.value;
      go("messages", q);
    } }, field("topic", "topic"), field("queue", "queue", { type: "number", min: "0", size: "4" }),
      field("offset", "offset (empty: the last ones)", { type: "number", min: "0" }),
      field("key", "or key"), field("id", "or message id", { size: "34" }), h("button", { type: "submit" }, "Search"));
    main.append(h("h2", {}, "Message browser"), form);
    if (![...params.keys()].length) { main.append(h("p", { class: "muted" }, "Search by topic and queue (and offset), by key within a topic, or by message id.")); return; }
    const d = await api("/api/messages?" + params.toString());
    main.append(table([
      { title: "queue / offset", value: r => `${r.topic} #${r.queue} @${r.offset}`, mono: true },
      { title: "message id", value: r => r.msg_id, mono: true },
      { title: "keys", value: r => r.keys.join(" "), mono: true }, { title: "tags", value: r => r.tags },
      { title: "stored (UTC)", value: r => new Date(r.store_time_ms).toISOString().replace("T", " ").slice(0, 19) },
      { title: "body", value: r => h("pre", { class: "body mono" }, r.body.kind === "hex" ? "hex: " + r.body.text : r.body.text, r.body.truncated ? ` … (${bytes(r.body.size)})` : "") }],
      d.items, "No message found."));
  },
};

// -- shell ----------------------------------------------------------------------------------
function go(page, params) {
  const q = new URLSearchParams(Object.entries(params || {}).filter(([, v]) => v !== "" && v !== undefined));
  location.hash = page + (q.toString() ? "?" + q.toString() : "");
}

async function refreshSession() {
  try { state.session = await api("/api/session"); }
  catch (e) { state.auth = ""; sessionStorage.removeItem("lmq-auth"); state.session = await api("/api/session"); notice(e.message, true); }
  const box = document.getElementById("login");
  box.replaceChildren();
  if (state.session.user) {
    box.append(h("span", { id: "who" }, "admin: " + state.session.user), h("button", { class: "plain", onclick: () => {
      state.auth = ""; sessionStorage.removeItem("lmq-auth"); refreshSession().then(render);
    } }, "log out"));
  } else {
    const user = h("input", { id: "user", placeholder: "access key", autocomplete: "username" });
    const pass = h("input", { id: "password", type: "password", placeholder: "secret key", autocomplete: "current-password" });
    box.append(h("form", { id: "login-form", class: "", onsubmit: async e => {
      e.preventDefault();
      state.auth = btoa(unescape(encodeURIComponent(user.value + ":" + pass.value)));
      sessionStorage.setItem("lmq-auth", state.auth);
      await refreshSession();
      if (state.session.user) notice("logged in as " + state.session.user, false);
      render();
    } }, user, " ", pass, " ", h("button", { type: "submit" }, "Log in")));
  }
  document.getElementById("footer").textContent = `lmq-gateway ${state.session.version}` +
    (state.session.can_act ? "" : " · actions need ACL on with an admin account (docs/acl.md)");
}

async function render() {
  const [page, query] = (location.hash.slice(1) || "overview").split("?");
  const params = new URLSearchParams(query || "");
  const main = document.getElementById("main");
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === "#" + page);
  const fresh = h("main", { id: "main" });
  fresh.dataset.page = page;
  try {
    await (pages[page] || pages.overview)(fresh, params);
    fresh.dataset.loaded = "1";
  } catch (e) {
    fresh.append(h("p", { class: "notice error" }, e.message));
    fresh.dataset.loaded = "error";
  }
  main.replaceWith(fresh);
  clearTimeout(state.timer);
  if (page === "overview" || page === "") state.timer = setTimeout(render, 5000);
}

window.addEventListener("hashchange", () => { document.getElementById("notice").className = "notice hidden"; render(); });
refreshSession().then(render);
