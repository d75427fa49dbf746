// Post text rules, mirrored from the server so the composer can say what
// the server will say: surrounding whitespace is trimmed as Go's
// strings.TrimSpace does, then 1 to 280 Unicode code points, with no
// control characters except newline and tab.

export const MAX_POST_LENGTH = 280;

// unicode.IsSpace in Go: ASCII space and \t\n\v\f\r, U+0085, U+00A0 and the
// Zs, Zl and Zp categories. JavaScript's trim() differs (it trims U+FEFF and
// keeps U+0085), so it would count differently at the edges.
const SPACE = /[\s\u0085]/u;
const isSpace = (ch) => ch !== '\uFEFF' && SPACE.test(ch);

/** Trims `text` as the server does. */
export function trimLikeServer(text) {
  const chars = [...text];
  let start = 0;
  let end = chars.length;
  while (start < end && isSpace(chars[start])) start++;
  while (end > start && isSpace(chars[end - 1])) end--;
  return chars.slice(start, end).join('');
}

/** The length the server will count: code points after trimming. */
export function postLength(text) {
  return [...trimLikeServer(text)].length;
}

/** Control characters the server refuses (Cc but \n and \t, and U+2028/9). */
const FORBIDDEN = /[\u0000-\u0008\u000B-\u001F\u007F-\u009F\u2028\u2029]/u;

/**
 * Checks a draft. `ok` says whether Post should be enabled; `remaining` is
 * how many code points are left (negative when over); `problem` is a
 * sentence when the draft cannot be posted for a reason other than length
 * or emptiness.
 */
export function checkPost(text) {
  const length = postLength(text);
  const remaining = MAX_POST_LENGTH - length;
  if (FORBIDDEN.test(text)) {
    return { ok: false, length, remaining, problem: 'The post contains a character that cannot be posted.' };
  }
  return { ok: length > 0 && remaining >= 0, length, remaining, problem: null };
}

/**
 * Splits a post body into pieces to render: plain text, links (http and
 * https only) and @mentions. Rendering these as DOM nodes, never as HTML,
 * keeps a post from injecting markup.
 */
export function tokenize(body) {
  const pattern = /(https?:\/\/[^\s<>"]+[^\s<>".,;:!?)\]'])|(^|[^\w@])@(\w{3,20})\b/gu;
  const parts = [];
  let last = 0;
  for (const match of body.matchAll(pattern)) {
    let start = match.index;
    if (match[1]) {
      if (start > last) parts.push({ type: 'text', text: body.slice(last, start) });
      parts.push({ type: 'link', text: match[1], href: match[1] });
      last = start + match[0].length;
    } else {
      start += match[2].length; // keep the character before the @ as text
      if (start > last) parts.push({ type: 'text', text: body.slice(last, start) });
      parts.push({ type: 'mention', text: `@${match[3]}`, username: match[3] });
      last = start + 1 + match[3].length;
    }
  }
  if (last < body.length) parts.push({ type: 'text', text: body.slice(last) });
  return parts;
}
