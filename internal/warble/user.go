package warble

import (
	"context"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits on account fields.
const (
	MinUsernameLen    = 3
	MaxUsernameLen    = 20
	MinPasswordBytes  = 8
	MaxPasswordBytes  = 72 // bcrypt reads no further
	MaxDisplayNameLen = 50 // Unicode code points
)

// User is a person with an account. Its counts are read apart (see
// UserCounts), as few requests need them.
type User struct {
	ID          string
	Username    string // as typed at signup; unique ignoring case
	DisplayName string
	CreatedAt   time.Time
}

// UserCounts are the sizes of a user's lists at the moment they are read.
type UserCounts struct {
	Followers int
	Following int
	Posts     int
}

// SignupInput is what a person gives to create an account.
type SignupInput struct {
	Username    string
	Password    string
	DisplayName *string
}

// Validate checks the input and fills in the default display name. It returns
// an EINVALID error that names the first field at fault.
func (in *SignupInput) Validate() error {
	if err := ValidateUsername(in.Username); err != nil {
		return err
	}
	if n := len(in.Password); n < MinPasswordBytes || n > MaxPasswordBytes {
		return Errorf(EINVALID, "Password must be %d to %d bytes long.", MinPasswordBytes, MaxPasswordBytes)
	}
	if in.DisplayName == nil {
		name := in.Username
		in.DisplayName = &name
	}
	return ValidateDisplayName(*in.DisplayName)
}

// LoginInput is what a person gives to sign in.
type LoginInput struct {
	Username string
	Password string
}

// ValidateUsername returns an EINVALID error unless name is 3 to 20 characters
// of A-Z, a-z, 0-9 and underscore.
func ValidateUsername(name string) error {
	if n := len(name); n < MinUsernameLen || n > MaxUsernameLen {
		return Errorf(EINVALID, "Username must be %d to %d characters long.", MinUsernameLen, MaxUsernameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return Errorf(EINVALID, "Username may contain only letters, digits and underscores.")
		}
	}
	return nil
}

// ValidateDisplayName returns an EINVALID error unless name is 1 to 50
// characters of valid UTF-8 without control characters, after trimming.
func ValidateDisplayName(name string) error {
	if strings.TrimSpace(name) != name {
		return Errorf(EINVALID, "Display name must not start or end with spaces.")
	}
	if !utf8.ValidString(name) {
		return Errorf(EINVALID, "Display name must be valid UTF-8.")
	}
	if n := utf8.RuneCountInString(name); n < 1 || n > MaxDisplayNameLen {
		return Errorf(EINVALID, "Display name must be 1 to %d characters long.", MaxDisplayNameLen)
	}
	for _, r := range name {
		if isControl(r) {
			return Errorf(EINVALID, "Display name must not contain control characters.")
		}
	}
	return nil
}

// UsernameKey is the form of a username that uniqueness is checked against.
func UsernameKey(name string) string { return strings.ToLower(name) }

// ValidUserID reports whether id has the form of a user id: a decimal
// number without leading zeros. It says nothing of whether the user exists.
func ValidUserID(id string) bool {
	if len(id) == 0 || len(id) > 18 || id[0] == '0' {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return false
		}
	}
	return true
}

// AuthPayload is the answer to a successful signup or login.
type AuthPayload struct {
	Token string
	User  *User
}

// Session is one signed-in device. Only a hash of its token is stored.
// Sessions expire after a period without use (30 days by default); each
// use pushes the expiry back.
type Session struct {
	// TokenHash names the session without giving it away (revocations
	// carry it): a hash of its token, which the store may prefix with
	// what it needs to find the session, such as the user id.
	TokenHash string
	UserID    string
	ExpiresAt time.Time // as of when the session was last read
}

// UserService manages accounts.
type UserService interface {
	// FindUserByID returns the user with the given id, or ENOTFOUND.
	FindUserByID(ctx context.Context, id string) (*User, error)

	// FindUserByUsername returns the user with the given username, matched
	// ignoring case, or ENOTFOUND.
	FindUserByUsername(ctx context.Context, username string) (*User, error)

	// FindUsersByIDs returns the users with the given ids in one batch, in the
	// order of ids; an id with no user has a nil entry.
	FindUsersByIDs(ctx context.Context, ids []string) ([]*User, error)

	// NewestUsers returns up to n of the most recently created users, newest first.
	NewestUsers(ctx context.Context, n int) ([]*User, error)

	// FindUserCounts returns the counts of the users with the given ids in
	// one batch, in the order of ids; an id with no user counts zeros.
	FindUserCounts(ctx context.Context, ids []string) ([]UserCounts, error)
}

// AuthService manages passwords and sessions.
type AuthService interface {
	// Signup creates a user and a first session. A taken username is ECONFLICT.
	Signup(ctx context.Context, in SignupInput) (*AuthPayload, error)

	// Login checks a password and opens a new session. A wrong password and an
	// unknown user give the same EUNAUTHENTICATED error.
	Login(ctx context.Context, in LoginInput) (*AuthPayload, error)

	// Authenticate returns the user and session of a token, or
	// EUNAUTHENTICATED if the token is malformed, unknown, expired or
	// revoked. It counts as a use of the session and slides its expiry.
	Authenticate(ctx context.Context, token string) (*User, *Session, error)

	// AuthenticateForHome is Authenticate for a request about to read page
	// of its viewer's home timeline. It may read ahead what
	// PostService.FindTimeline reads first for that page, with the
	// session: the returned context carries it, and FindTimeline uses it
	// for exactly that page of that timeline and reads it itself for any
	// other. Nothing is carried unless the session is good.
	AuthenticateForHome(ctx context.Context, token string, page PageArgs) (context.Context, *User, *Session, error)

	// AuthenticateForPost is Authenticate for a request about to create one
	// post by its viewer. It may reserve the post's sequence number with
	// the session: the returned context carries it, and
	// PostService.CreatePost takes it for the first post by that viewer
	// made with that context, and draws its own for any other. Nothing is
	// reserved unless the session is good. A reserved number that no post
	// takes (the post's rate limit refuses it, the client goes away) is a
	// gap in the sequence, as a post whose store fails leaves one.
	AuthenticateForPost(ctx context.Context, token string) (context.Context, *User, *Session, error)

	// SessionExpiry returns when the session with tokenHash expires, without
	// counting as a use, or EUNAUTHENTICATED if it has expired or was revoked.
	SessionExpiry(ctx context.Context, tokenHash string) (time.Time, error)

	// Logout revokes one session and ends the subscriptions opened with it.
	Logout(ctx context.Context, s *Session) error

	// LogoutEverywhere revokes every session of userID, ending their
	// subscriptions, and returns how many there were.
	LogoutEverywhere(ctx context.Context, userID string) (int, error)
}
