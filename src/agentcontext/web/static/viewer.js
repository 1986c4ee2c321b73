// agentcontext viewer: folding and selection in the graph, without reloading the page.
// Pages work without it: every node is a plain link the server answers.
"use strict";
(function () {
  function swapPanel(url, panel) {
    return fetch(url, { credentials: "same-origin" })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) { panel.innerHTML = html; });
  }
  function graphUrl(link) {
    var url = new URL(link.getAttribute("href"), window.location.href);
    url.pathname = "/graph";
    return url;
  }
  function messageUrl(box, id) {
    var url = new URL("/message", window.location.href);
    url.searchParams.set("chat", box.dataset.chat);
    url.searchParams.set("id", id);
    url.searchParams.set("fragment", "1");
    return url;
  }
  function onClick(event) {
    var box = event.currentTarget;
    var link = event.target.closest("a");
    if (!link || !box.contains(link) || event.ctrlKey || event.metaKey || event.shiftKey) { return; }
    var target = new URL(link.getAttribute("href"), window.location.href);
    if (link.classList.contains("fold") || link.classList.contains("unfold")) {
      event.preventDefault();
      var holder = box.querySelector(".graph-holder");
      swapPanel(graphUrl(link), holder).then(function () {
        history.replaceState(null, "", target.pathname + target.search);
        box.dataset.opened = target.searchParams.getAll("open").join(" ");
      }).catch(function () { window.location.href = target.href; });
      return;
    }
    if (link.dataset.id) {
      event.preventDefault();
      var panel = document.getElementById("message-panel");
      swapPanel(messageUrl(box, link.dataset.id), panel).then(function () {
        box.querySelectorAll("a.selected").forEach(function (a) { a.classList.remove("selected"); });
        link.classList.add("selected");
        history.replaceState(null, "", target.pathname + target.search);
      }).catch(function () { window.location.href = target.href; });
    }
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll(".graph-box").forEach(function (box) {
      box.addEventListener("click", onClick);
    });
  });
})();
