/* The queue overview refreshes itself: every data-refresh-seconds it fetches the page again and
 * swaps #sq-overview-live (the counts, the charts, the time they were measured) for the new one.
 * It skips a round while the tab is hidden. The button pauses and resumes it; the choice is kept
 * in localStorage. Without JavaScript the page is a plain page (reload it). No dependencies. */
"use strict";
(function () {
  const box = document.getElementById("sq-refresh");
  const button = document.getElementById("sq-refresh-toggle");
  const status = document.getElementById("sq-refresh-status");
  if (!box || !button || !status || !window.fetch || !window.DOMParser) {
    return;
  }
  const seconds = Number(box.dataset.refreshSeconds) || 5;
  const storageKey = "spanner_queues.overview.paused";
  let paused = false;
  let busy = false;
  let timer = null;
  try {
    paused = window.localStorage.getItem(storageKey) === "1";
  } catch (error) {
    paused = false; // storage refused (privacy mode): not kept, but the button still works
  }

  function show(text) {
    status.textContent = text;
  }

  function render() {
    button.textContent = paused ? box.dataset.resumeLabel : box.dataset.pauseLabel;
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    show(paused ? box.dataset.pausedText : box.dataset.runningText);
  }

  function stop(text) {
    window.clearInterval(timer);
    button.hidden = true;
    show(text);
  }

  async function refresh() {
    if (paused || busy || document.hidden) {
      return;
    }
    busy = true;
    try {
      const response = await fetch(window.location.href, {
        credentials: "same-origin",
        headers: { "X-Requested-With": "XMLHttpRequest" },
        cache: "no-store",
      });
      if (!response.ok) {
        throw new Error(String(response.status));
      }
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("sq-overview-live");
      if (!fresh) {
        stop(box.dataset.stoppedText); // e.g. the session ended: the login page came back
        return;
      }
      const current = document.getElementById("sq-overview-live");
      if (current && !paused) {
        current.replaceWith(document.importNode(fresh, true));
      }
      render();
    } catch (error) {
      show(box.dataset.failedText);
    } finally {
      busy = false;
    }
  }

  button.addEventListener("click", function () {
    paused = !paused;
    try {
      window.localStorage.setItem(storageKey, paused ? "1" : "0");
    } catch (error) {
      // not kept across pages; nothing else to do
    }
    render();
    if (!paused) {
      refresh();
    }
  });
  button.hidden = false;
  render();
  timer = window.setInterval(refresh, seconds * 1000);
})();
