// Follow and Unfollow as one button: on a profile, beside the newest
// accounts in Explore, and in a newcomer's suggestions on Home.

import { h } from './dom.js';
import { describeError } from './errors.js';
import { FOLLOW, UNFOLLOW } from './queries.js';
import { notify, notifyError } from './ui.js';

/**
 * A button that follows `user`, or unfollows them when the viewer already
 * does (`user.viewerIsFollowing`), and keeps `user`'s fields current.
 * `onChange(user)` runs after each change. In a list, `inList` makes the
 * button small and names whom it follows ("Follow @ada"), since a screen
 * reader's list of buttons would otherwise be many alike "Follow"s.
 */
export function followButton(app, user, { onChange, inList = false } = {}) {
  const button = h('button', { type: 'button' });
  const render = () => {
    const label = user.viewerIsFollowing ? 'Unfollow' : 'Follow';
    button.textContent = label;
    if (inList) button.setAttribute('aria-label', `${label} @${user.username}`);
    button.className = [user.viewerIsFollowing ? 'button-secondary' : 'button-primary', inList && 'button-small']
      .filter(Boolean).join(' ');
  };
  button.addEventListener('click', async () => {
    button.disabled = true;
    const follow = !user.viewerIsFollowing;
    try {
      const data = await app.client.request(follow ? FOLLOW : UNFOLLOW, { input: { userId: user.id } });
      const result = follow ? data.follow : data.unfollow;
      user.viewerIsFollowing = result.user.viewerIsFollowing;
      user.followersCount = result.user.followersCount;
      render();
      onChange?.(user);
      notify(follow ? `You follow @${user.username}. Their posts are in your home timeline.` : `You no longer follow @${user.username}.`);
    } catch (error) {
      notifyError(describeError(error));
    } finally {
      button.disabled = false;
      button.focus();
    }
  });
  render();
  return button;
}
