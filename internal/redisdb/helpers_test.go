package redisdb

import (
	"context"
	"testing"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// mustSignup creates a user with the password "password123" and returns it.
func mustSignup(tb testing.TB, db *DB, username string) *warble.User {
	tb.Helper()
	return mustSignupSession(tb, NewAuthService(db), username).User
}

// mustSignupSession signs up a user with the password "password123"
// through auth, and returns the user with the session's token.
func mustSignupSession(tb testing.TB, auth *AuthService, username string) *warble.AuthPayload {
	tb.Helper()
	p, err := auth.Signup(context.Background(), warble.SignupInput{Username: username, Password: "password123"})
	if err != nil {
		tb.Fatalf("Signup(%q): %v", username, err)
	}
	return p
}

// snapshot returns what Redis holds, for assertUnchanged.
func snapshot(tb testing.TB, db *DB) map[string]string {
	tb.Helper()
	return redistest.Snapshot(tb, db.client)
}

// assertUnchanged fails tb if Redis differs from the snapshot before.
func assertUnchanged(tb testing.TB, db *DB, before map[string]string, what string) {
	tb.Helper()
	redistest.AssertUnchanged(tb, db.client, before, what)
}

// mustFollow makes followerID follow followeeID.
func mustFollow(tb testing.TB, db *DB, followerID, followeeID string) {
	tb.Helper()
	if err := NewFollowService(db).Follow(context.Background(), followerID, followeeID); err != nil {
		tb.Fatalf("Follow(%s, %s): %v", followerID, followeeID, err)
	}
}

// mustCounts returns the counts of userID.
func mustCounts(tb testing.TB, db *DB, userID string) warble.UserCounts {
	tb.Helper()
	counts, err := NewUserService(db).FindUserCounts(context.Background(), []string{userID})
	if err != nil {
		tb.Fatalf("FindUserCounts(%s): %v", userID, err)
	}
	return counts[0]
}
