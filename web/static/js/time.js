// Relative times ("5m", "3h", "Nov 2") for posts, with the exact time for
// the title. Pure functions of (date, now) so they are testable.

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/** A short relative time, as timelines show it. */
export function relativeTime(date, now = new Date(), locale = undefined) {
  const then = date instanceof Date ? date : new Date(date);
  const ago = now.getTime() - then.getTime();
  if (ago < 45_000) return 'now'; // also covers small clock skew into the future
  if (ago < HOUR) return `${Math.max(1, Math.round(ago / MINUTE))}m`;
  if (ago < DAY) return `${Math.floor(ago / HOUR)}h`;
  if (ago < 7 * DAY) return `${Math.floor(ago / DAY)}d`;
  const sameYear = then.getFullYear() === now.getFullYear();
  return then.toLocaleDateString(locale, sameYear
    ? { month: 'short', day: 'numeric' }
    : { year: 'numeric', month: 'short', day: 'numeric' });
}

/** The same time spelled out for screen readers and the tooltip. */
export function exactTime(date, locale = undefined) {
  const then = date instanceof Date ? date : new Date(date);
  return then.toLocaleString(locale, { dateStyle: 'long', timeStyle: 'short' });
}
