// What to tell a person when the API says no. Every Warble error carries
// extensions.code; each code gets a sentence here, and a screen can give
// its own for the codes that mean something particular to it (a failed
// login is UNAUTHENTICATED too).

const messages = {
  // The server's own sentence says which field is wrong and why.
  BAD_USER_INPUT: null,
  UNAUTHENTICATED: 'Your session has ended. Please log in again.',
  FORBIDDEN: 'You are not allowed to do that.',
  NOT_FOUND: 'That no longer exists. It may have been deleted.',
  // Also the server's sentence ("That username is taken."), with this as a fallback.
  CONFLICT: null,
  RATE_LIMITED: 'You are going a little fast. Wait a moment, then try again.',
  INTERNAL: 'Something went wrong on our side. Please try again.',
  NETWORK: 'Warble cannot be reached. Check your connection and try again.',
};

const fallbacks = {
  BAD_USER_INPUT: 'Please check what you entered.',
  CONFLICT: 'That already exists.',
};

/**
 * A sentence for a person about `error` (a GraphQLError or anything
 * thrown). `overrides` maps codes to sentences for one screen.
 */
export function describeError(error, overrides = {}) {
  const code = error?.code;
  if (code && overrides[code]) return overrides[code];
  if (code && code in messages) {
    return messages[code] ?? (error.message?.trim() || fallbacks[code]);
  }
  return 'Something went wrong. Please try again.';
}
