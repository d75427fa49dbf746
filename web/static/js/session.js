// Who is signed in. The token lives in sessionStorage: it is kept across
// reloads of this tab and forgotten when the tab closes, and another tab
// can sign in as someone else without stepping on it.

const KEY = 'warble.token';

export class Session {
  #storage;
  #listeners = new Set();
  /** The signed-in user ({id, username, displayName}) or null. */
  viewer = null;

  constructor(storage) {
    this.#storage = storage;
  }

  get token() {
    try {
      return this.#storage.getItem(KEY);
    } catch {
      return null; // storage disabled: act signed out
    }
  }

  get signedIn() {
    return this.viewer !== null;
  }

  signIn(token, viewer) {
    this.#storage.setItem(KEY, token);
    this.viewer = viewer;
    this.#changed();
  }

  /** Sets the viewer after checking a stored token. */
  restore(viewer) {
    this.viewer = viewer;
    this.#changed();
  }

  signOut() {
    try {
      this.#storage.removeItem(KEY);
    } catch {
      // nothing stored
    }
    this.viewer = null;
    this.#changed();
  }

  onChange(listener) {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #changed() {
    for (const listener of [...this.#listeners]) listener(this.viewer);
  }
}
