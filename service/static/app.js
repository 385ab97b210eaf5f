// flaudit dashboard: a hash router over the list page and the audit page.

import { promptForKey, storedKey } from "./api.js";
import { renderAudit } from "./audit.js";
import { toast } from "./dom.js";
import { renderList } from "./list.js";

let cleanup = null;

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  const view = document.getElementById("view");
  const hash = location.hash.replace(/^#/, "") || "/";
  const match = hash.match(/^\/audits\/([^/?#]+)/);
  for (const a of document.querySelectorAll(".topnav a")) {
    if (a.getAttribute("href") === `#${hash}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (match) {
    cleanup = renderAudit(view, decodeURIComponent(match[1]));
  } else {
    document.title = "Audits · flaudit";
    cleanup = renderList(view, { focusForm: hash === "/new" });
    if (hash === "/new") document.getElementById("new-audit")?.scrollIntoView({ block: "start" });
  }
  const main = document.getElementById("main");
  if (route.initialised && !(hash === "/new")) main.focus({ preventScroll: true });
  route.initialised = true;
}

function keyButton() {
  const button = document.getElementById("key-button");
  const refresh = () => {
    button.textContent = storedKey() ? "API key ✓" : "API key";
    button.setAttribute("aria-label", storedKey() ? "API key stored for this tab; change or forget it" : "Enter the API key");
  };
  button.addEventListener("click", async () => {
    const key = await promptForKey("");
    refresh();
    if (key) toast("API key stored for this browser tab.");
  });
  window.addEventListener("flaudit:key-changed", refresh);
  refresh();
}

window.addEventListener("hashchange", route);
keyButton();
route();
