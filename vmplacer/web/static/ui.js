// vmplacer web view: refreshes the page's data every few seconds without reloading.
// Every value from the server goes into the page as text (textContent, attributes), never as HTML.
"use strict";

(function () {
  const body = document.body;
  const refreshUrl = body.dataset.refresh;
  const everyS = Math.max(2, parseInt(body.dataset.refreshS || "10", 10) || 10);
  const prefix = "/ui";
  const hostName = body.dataset.host || "";

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== undefined && value !== null && value !== "") node.setAttribute(name, String(value));
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function gib(mib) { return (mib / 1024).toFixed(1); }

  function fleetRow(row) {
    const tr = el("tr", { "data-host": row.name });
    const name = el("td");
    name.appendChild(el("a", { href: prefix + "/hosts/" + encodeURIComponent(row.name) }, row.name));
    tr.appendChild(name);
    const state = el("td");
    state.appendChild(el("span", { class: "state s-" + row.state, title: row.error || row.maintenance }, row.state));
    tr.appendChild(state);
    tr.appendChild(el("td", { class: "num" }, row.guests === null ? "—" : row.guests));
    const cores = el("td", { class: "num" }, row.free_cores === null ? "—" : row.free_cores);
    const memory = el("td", { class: "num" }, row.free_memory === null ? "—" : gib(row.free_memory) + " GiB");
    if (row.free_cores !== null) {
      cores.appendChild(el("span", { class: "per-node" },
        row.nodes.filter((n) => n.cores).map((n) => " n" + n.node + ": " + n.whole_cores + "/" + n.cores).join("")));
      memory.appendChild(el("span", { class: "per-node" },
        row.nodes.map((n) => " n" + n.node + ": " + gib(n.free_mib)).join("")));
    }
    tr.appendChild(cores);
    tr.appendChild(memory);
    const isolation = el("td", { class: "num" });
    if (row.violations !== null) {
      isolation.appendChild(el("span", { class: row.violations ? "bad" : "good" }, row.violations));
    } else {
      isolation.textContent = row.checked ? "unreadable" : "not checked";
    }
    tr.appendChild(isolation);
    tr.appendChild(el("td", {}, row.last_plan ? "#" + row.last_plan.id + " " + row.last_plan.state : "—"));
    return tr;
  }

  function showFleet(data) {
    const rows = document.getElementById("fleet-rows");
    if (!rows) return;
    rows.replaceChildren(...data.rows.map(fleetRow));
    const count = document.getElementById("count");
    if (count) count.textContent = data.total + " of " + data.fleet + " hosts · page " + data.page + " of " + data.pages;
  }

  function showCpu(box, cell) {
    box.className = "cpu k-" + cell.kind + (cell.colour ? " " + cell.colour : "");
    box.dataset.kind = cell.kind;
    box.dataset.guests = cell.guests.join(",");
    box.title = cell.title;
    const mark = box.querySelector(".mark");
    if (mark) mark.textContent = cell.marks;
  }

  function guestRow(g) {
    const tr = el("tr", { "data-guest": g.name });
    const name = el("td");
    name.appendChild(el("span", { class: "swatch " + g.colour }));
    name.appendChild(el("a", { href: prefix + "/hosts/" + encodeURIComponent(hostName) + "/guests/" +
      encodeURIComponent(g.name) }, g.name));
    tr.appendChild(name);
    for (const value of [g.state, g.kind, g["class"]]) tr.appendChild(el("td", {}, value));
    const labels = el("td");
    for (const label of g.labels) labels.appendChild(el("span", { class: "label" }, label));
    tr.appendChild(labels);
    for (const value of [g.vcpupin, g.emulatorpin, g.iothreadpin, g.memory_nodes]) {
      tr.appendChild(el("td", { class: "mono" }, value));
    }
    tr.appendChild(el("td", {}, g.throttle));
    return tr;
  }

  function showHost(data) {
    for (const box of document.querySelectorAll(".cpu-map .cpu[data-cpu]")) {
      const cell = data.cpus[box.dataset.cpu];
      if (cell) showCpu(box, cell);
    }
    const rows = document.getElementById("guest-rows");
    if (rows) {
      if (data.guests.length) {
        rows.replaceChildren(...data.guests.map(guestRow));
      } else {
        const tr = el("tr", { class: "none" });
        tr.appendChild(el("td", { colspan: "10" }, "no placements recorded on this host"));
        rows.replaceChildren(tr);
      }
    }
    const violations = document.getElementById("violations");
    if (violations && data.violations !== null) violations.textContent = data.violations + " violation(s)";
  }

  function pick(box) {
    const shown = document.getElementById("picked");
    if (!shown) return;
    for (const old of document.querySelectorAll(".cpu.picked")) old.classList.remove("picked");
    box.classList.add("picked");
    shown.textContent = box.title;
  }

  const map = document.getElementById("cpu-map");
  if (map) {
    map.addEventListener("click", (event) => {
      const box = event.target.closest(".cpu[data-cpu]");
      if (box) pick(box);
    });
    map.addEventListener("keydown", (event) => {
      const box = event.target.closest(".cpu[data-cpu]");
      if (box && (event.key === "Enter" || event.key === " ")) { pick(box); event.preventDefault(); }
    });
  }

  async function refresh() {
    if (!refreshUrl) return; // a page with nothing live on it
    let response;
    try {
      response = await fetch(refreshUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch (error) {
      return; // the next round tries again
    }
    if (response.status === 401) {
      window.location.assign(prefix + "/login");
      return;
    }
    if (!response.ok) return;
    const data = await response.json();
    if (body.dataset.page === "fleet") showFleet(data);
    if (body.dataset.page === "host") showHost(data);
    const stamp = document.getElementById("refreshed");
    if (stamp) stamp.textContent = "refreshed " + new Date(data.at * 1000).toLocaleTimeString();
    body.dataset.refreshes = String((parseInt(body.dataset.refreshes || "0", 10) || 0) + 1);
  }

  if (refreshUrl) window.setInterval(refresh, everyS * 1000);
  window.vmplacerRefresh = refresh; // lets a test run a round now instead of waiting
})();
