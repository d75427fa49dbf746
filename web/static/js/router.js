// History-API routing: links inside the app change the URL without a
// reload, and every URL can be opened directly (the server answers app
// routes with index.html). Each screen gets an AbortSignal that fires when
// the user leaves it, which ends its subscriptions and stale requests.

export class Router {
  #routes;
  #render;
  #controller = null;

  /**
   * @param {Array<{pattern: RegExp, view: Function}>} routes  first match wins
   * @param {(view, params, signal, nav) => void} render
   */
  constructor(routes, render) {
    this.#routes = routes;
    this.#render = render;
    window.addEventListener('popstate', () => this.#go({ focus: true }));
    document.addEventListener('click', (event) => this.#onClick(event));
  }

  start() {
    this.#go({ focus: false });
  }

  navigate(path, { replace = false } = {}) {
    if (replace) history.replaceState(null, '', path);
    else history.pushState(null, '', path);
    this.#go({ focus: !replace || document.activeElement !== document.body });
  }

  /** Shows the current URL's screen again (after signing in or out). */
  refresh() {
    this.#go({ focus: false });
  }

  #go({ focus }) {
    this.#controller?.abort();
    this.#controller = new AbortController();
    let path = location.pathname;
    try {
      path = decodeURIComponent(path);
    } catch {
      // A malformed %-escape: match it as it is, which finds no screen.
    }
    for (const { pattern, view } of this.#routes) {
      const match = pattern.exec(path);
      if (match) {
        this.#render(view, match.slice(1), this.#controller.signal, { focus, path });
        return;
      }
    }
  }

  // Plain left clicks on same-origin links stay in the app; anything else
  // (new tab, download, other site, the API pages) is left to the browser.
  #onClick(event) {
    if (event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    const link = event.target.closest('a[href]');
    if (!link || link.target || link.hasAttribute('download')) return;
    const url = new URL(link.href);
    if (url.origin !== location.origin) return;
    if (/^\/(graphql|playground|healthz)\b/.test(url.pathname)) return;
    event.preventDefault();
    if (url.pathname + url.search === location.pathname + location.search) return;
    this.navigate(url.pathname + url.search);
  }
}
