// A user's page at /u/<username>, with /followers and /following tabs:
// their name and counts, Follow / Unfollow, who links you to them, and
// their posts, live.

import { h, plural } from '../dom.js';
import { describeError } from '../errors.js';
import { followButton } from '../follow.js';
import { liveTimeline } from '../timeline.js';
import { avatar, emptyState, notifyError, pageHeading, profileHref, userRow } from '../ui.js';
import { FOLLOWERS, FOLLOWING, PROFILE, USER_EVENTS, USER_POSTS } from '../queries.js';

const joinedFormat = new Intl.DateTimeFormat(undefined, { month: 'long', year: 'numeric' });

export async function profileView(app, [username, tab = 'posts'], signal) {
  app.setTitle(`@${username}`);
  const card = h('section', { class: 'card profile', 'aria-busy': 'true' }, h('p', { class: 'loading' }, 'Loading…'));
  app.main.append(card);

  let user;
  try {
    user = (await app.client.request(PROFILE, { username })).user;
  } catch (error) {
    if (signal.aborted) return;
    card.replaceChildren(pageHeading(`@${username}`), h('p', { class: 'form-error' }, describeError(error)),
      h('button', { type: 'button', class: 'button-secondary', onclick: () => app.refresh() }, 'Try again'));
    return;
  }
  if (signal.aborted) return;
  card.removeAttribute('aria-busy');
  if (!user) {
    app.setTitle('No such account');
    card.replaceChildren(pageHeading('This account doesn’t exist'),
      h('p', {}, `Nobody is called @${username}. `, h('a', { href: '/explore' }, 'Explore Warble'), ' to find people.'));
    return;
  }
  // Usernames match ignoring case; show the URL as the user typed it at signup.
  if (user.username !== username) {
    history.replaceState(null, '', location.pathname.replace(`/u/${username}`, profileHref(user.username)));
  }
  app.setTitle(`${user.displayName} (@${user.username})`);

  const counts = {
    posts: h('span', {}),
    followers: h('span', {}),
    following: h('span', {}),
  };
  const renderCounts = () => {
    counts.posts.textContent = plural(user.postsCount, 'post');
    counts.followers.textContent = plural(user.followersCount, 'follower');
    counts.following.textContent = `${user.followingCount.toLocaleString()} following`;
  };
  renderCounts();

  const isSelf = app.session.viewer?.id === user.id;
  // Through h(), which skips null and false, unlike replaceChildren.
  card.replaceChildren(...h('div', {},
    h('div', { class: 'profile-head' },
      avatar(user, 'xl'),
      h('div', { class: 'profile-names' },
        pageHeading(user.displayName),
        h('p', { class: 'profile-handle' }, `@${user.username}`,
          user.followsViewer && h('span', { class: 'badge' }, 'Follows you')),
        h('p', { class: 'profile-joined' }, `Joined ${joinedFormat.format(new Date(user.createdAt))}`)),
      h('div', { class: 'profile-action' }, followControl(app, user, isSelf, () => {
        renderCounts();
        if (tab === 'followers') showTab();
      }))),
    h('p', { class: 'profile-counts' },
      counts.posts, ' · ',
      h('a', { href: `${profileHref(user.username)}/followers` }, counts.followers), ' · ',
      h('a', { href: `${profileHref(user.username)}/following` }, counts.following)),
    app.session.signedIn && !isSelf && connections(user)).childNodes);

  const tabs = [
    ['posts', 'Posts', profileHref(user.username)],
    ['followers', 'Followers', `${profileHref(user.username)}/followers`],
    ['following', 'Following', `${profileHref(user.username)}/following`],
  ];
  const panel = h('section', { class: 'card tab-panel', 'aria-labelledby': 'tab-heading' });
  app.main.append(
    h('nav', { class: 'tabs', 'aria-label': 'Profile sections' },
      h('ul', {}, tabs.map(([key, label, href]) => h('li', {},
        h('a', { href, 'aria-current': key === tab ? 'page' : undefined }, label))))),
    panel);

  function showTab() {
    panel.replaceChildren();
    const heading = h('h2', { id: 'tab-heading', class: 'section-title' });
    if (tab === 'posts') {
      heading.textContent = `Posts by ${user.displayName}`;
      const timeline = liveTimeline({
        app,
        signal,
        label: `Posts by ${user.displayName}`,
        fetchPage: async (vars) => (await app.client.request(USER_POSTS, { username: user.username, ...vars })).user.posts,
        subscription: (after) => ({ query: USER_EVENTS, variables: after ? { username: user.username, after } : { username: user.username } }),
        pickEvent: (data) => data?.userPosts,
        empty: () => emptyPosts(app, user, isSelf),
        onChange(change) {
          user.postsCount = Math.max(0, user.postsCount + (change === 'added' ? 1 : -1));
          renderCounts();
        },
      });
      panel.append(heading, timeline.element);
    } else {
      const following = tab === 'following';
      heading.textContent = following ? `People ${user.displayName} follows` : `People following ${user.displayName}`;
      panel.append(heading, userList(app, signal, {
        query: following ? FOLLOWING : FOLLOWERS,
        pick: (data) => (following ? data.user.following : data.user.followers),
        username: user.username,
        empty: () => (following ? emptyFollowing(user, isSelf) : emptyFollowers(user, isSelf)),
      }));
    }
  }
  showTab();
}

/** Follow / Unfollow for others, a sign-in link when signed out, nothing on your own page. */
function followControl(app, user, isSelf, onChanged) {
  if (isSelf) return h('span', { class: 'badge badge-self' }, 'This is you');
  if (!app.session.signedIn) return h('a', { class: 'button button-primary', href: '/login' }, 'Log in to follow');

  return followButton(app, user, { onChange: onChanged });
}

/** "Followed by 2 people you follow" and followers in common. */
function connections(user) {
  const names = (conn) => conn.edges.map(({ node }, i) => [i ? ', ' : '', h('a', { href: profileHref(node.username) }, node.displayName)]);
  const yours = user.followersYouFollow;
  const common = user.commonFollowers;
  if (!yours.totalCount && !common.totalCount) return null;
  return h('div', { class: 'connections' },
    yours.totalCount > 0 && h('p', { class: 'connection-line' },
      `Followed by ${plural(yours.totalCount, 'person', 'people')} you follow: `, names(yours),
      yours.totalCount > yours.edges.length && ` and ${yours.totalCount - yours.edges.length} more`),
    common.totalCount > 0 && h('p', { class: 'connection-line' },
      `${plural(common.totalCount, 'follower')} in common with you: `, names(common),
      common.totalCount > common.edges.length && ` and ${common.totalCount - common.edges.length} more`));
}

/** What an empty Posts tab says, to its owner and to others. */
function emptyPosts(app, user, isSelf) {
  if (isSelf) {
    return emptyState('You have not posted yet',
      'Your posts show here, and in the home timeline of everyone who follows you.',
      h('p', { class: 'empty-text' }, h('a', { href: '/' }, 'Write your first post'), ' on Home.'));
  }
  return emptyState(`@${user.username} has not posted yet`,
    app.session.signedIn && !user.viewerIsFollowing
      ? 'Follow them, and their posts will appear in your home timeline when they write.'
      : 'Their posts will show here when they write.');
}

function emptyFollowers(user, isSelf) {
  if (isSelf) {
    return emptyState('Nobody follows you yet',
      'The people who follow you see your posts in their home timeline. Posting, and following others, is how they find you.',
      h('p', { class: 'empty-text' }, h('a', { href: '/explore' }, 'Find people in Explore'), '.'));
  }
  return emptyState(`Nobody follows @${user.username} yet`);
}

function emptyFollowing(user, isSelf) {
  if (isSelf) {
    return emptyState('You do not follow anyone yet',
      'Follow people to see their posts in your home timeline as they write them.',
      h('p', { class: 'empty-text' }, h('a', { href: '/explore' }, 'Find people in Explore'), '.'));
  }
  return emptyState(`@${user.username} does not follow anyone yet`);
}

/** A paged list of users (followers or following); `empty()` builds what shows when there are none. */
function userList(app, signal, { query, pick, username, empty }) {
  const list = h('ul', { class: 'user-list', 'aria-busy': 'true' });
  const more = h('button', { type: 'button', class: 'button-secondary load-more', hidden: true }, 'Load more');
  const status = h('div', { class: 'list-empty', hidden: true });
  let endCursor = null;

  async function load() {
    more.disabled = true;
    try {
      const conn = pick(await app.client.request(query, { username, first: 20, after: endCursor }));
      if (signal.aborted) return;
      list.append(...conn.edges.map(({ node, followedAt }) => userRow(node, {
        note: followedAt && h('span', { class: 'user-since' }, `since ${new Date(followedAt).toLocaleDateString()}`),
      })));
      endCursor = conn.pageInfo.endCursor ?? endCursor;
      more.hidden = !conn.pageInfo.hasNextPage;
      status.hidden = list.children.length > 0;
      if (!status.hidden && !status.firstChild) status.append(empty());
    } catch (error) {
      if (!signal.aborted) notifyError(describeError(error));
    } finally {
      more.disabled = false;
      list.setAttribute('aria-busy', 'false');
    }
  }
  more.addEventListener('click', load);
  load();
  return h('div', {}, list, status, h('div', { class: 'load-more-row' }, more));
}
