// The state of one live timeline, without the DOM: the posts shown, the
// cursors to page and to resume from, and how each subscription event
// changes them. The view (timeline.js) renders `items` after each change.
//
// Cursor rules, from the API: page cursors and event cursors are the same
// kind, so the newest one we have shown can be passed as `after:` when
// (re)subscribing, and the server replays what we missed. Cursors are
// opaque, so "newest" is never computed by comparing them: it is the first
// edge of the first page until an event arrives, then the last event's
// cursor (events come in increasing cursor order).

export class TimelineModel {
  /** The posts shown, newest first: {postId, cursor, post, live}. */
  items = [];
  /** Resume from here: pass as `after:` when subscribing. */
  newestCursor = null;
  /** Pass as `after:` for "Load more". */
  endCursor = null;
  hasNextPage = false;

  #byId = new Map();
  // Ids deleted while a page request was in flight, so the page's stale
  // copy does not bring them back.
  #removed = new Set();
  // Posts that arrived live while the first page was being refetched: the
  // page may have been read before they were written, so they are kept.
  #pendingAdds = null;

  /** Replaces what is shown with a first page (on load and after RESYNC). */
  setFirstPage(timeline) {
    const kept = this.#pendingAdds ?? [];
    this.#pendingAdds = null;
    this.items = [];
    this.#byId.clear();
    for (const edge of timeline.edges) this.#push(edge.node, edge.cursor, false);
    for (const item of kept) if (!this.#byId.has(item.postId)) this.#insertByTime(item);
    if (this.newestCursor === null) this.newestCursor = timeline.edges[0]?.cursor ?? null;
    this.endCursor = timeline.pageInfo.endCursor ?? null;
    this.hasNextPage = timeline.pageInfo.hasNextPage;
  }

  /** Adds an older page below, for "Load more". */
  appendPage(timeline) {
    for (const edge of timeline.edges) {
      if (!this.#byId.has(edge.node.id)) this.#push(edge.node, edge.cursor, false);
    }
    this.endCursor = timeline.pageInfo.endCursor ?? this.endCursor;
    this.hasNextPage = timeline.pageInfo.hasNextPage;
  }

  /** Call before refetching the first page, so live posts meanwhile are kept. */
  beginRefetch() {
    this.#pendingAdds = [];
  }

  /**
   * Applies one TimelineEvent. Returns what changed: "added", "removed",
   * "resync" (the caller must refetch the first page) or null (nothing, as
   * for a post already shown).
   */
  apply(event) {
    switch (event.kind) {
      case 'POST_ADDED': {
        this.newestCursor = event.cursor;
        if (!event.post || this.#removed.has(event.postId)) return null;
        const existing = this.#byId.get(event.postId);
        if (existing) {
          existing.cursor ??= event.cursor; // our own post, added before its event
          return null;
        }
        const item = { postId: event.postId, cursor: event.cursor, post: event.post, live: true };
        this.#insertByTime(item);
        this.#pendingAdds?.push(item);
        return 'added';
      }
      case 'POST_REMOVED':
        return this.remove(event.postId) ? 'removed' : null;
      case 'RESYNC':
        this.newestCursor = event.cursor;
        return 'resync';
      default:
        return null; // a kind added to the API later: ignore it rather than break
    }
  }

  /** Shows a post we just wrote, before its event arrives (read-your-writes). */
  addLocal(post) {
    if (this.#byId.has(post.id) || this.#removed.has(post.id)) return false;
    this.#insertByTime({ postId: post.id, cursor: null, post, live: true });
    return true;
  }

  /** Removes a post (deleted here or elsewhere). Returns whether it was shown. */
  remove(postId) {
    this.#removed.add(postId);
    const item = this.#byId.get(postId);
    if (!item) return false;
    this.#byId.delete(postId);
    this.items.splice(this.items.indexOf(item), 1);
    return true;
  }

  #push(post, cursor, live) {
    if (this.#removed.has(post.id)) return;
    const item = { postId: post.id, cursor, post, live };
    this.items.push(item);
    this.#byId.set(post.id, item);
  }

  // New posts go to the top, except that one arriving late (a slow event
  // for an older post than our own just written) goes below newer ones.
  #insertByTime(item) {
    let i = 0;
    while (i < this.items.length && this.items[i].post.createdAt > item.post.createdAt) i++;
    this.items.splice(i, 0, item);
    this.#byId.set(item.postId, item);
  }
}
