package redisdb

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

func strPtr(s string) *string { return &s }

func TestSignup(t *testing.T) {
	tests := []struct {
		name     string
		existing []string
		in       warble.SignupInput
		wantCode string
		wantName string // display name, when the signup succeeds
	}{
		{name: "OK", in: warble.SignupInput{Username: "ada", Password: "password123"}, wantName: "ada"},
		{name: "DisplayName", in: warble.SignupInput{Username: "Ada_L", Password: "password123", DisplayName: strPtr("Ada Lovelace ✨")}, wantName: "Ada Lovelace ✨"},
		{name: "UsernameShownAsTyped", existing: []string{"bob"}, in: warble.SignupInput{Username: "AdaL", Password: "password123"}, wantName: "AdaL"},
		{name: "UsernameTooShort", in: warble.SignupInput{Username: "ad", Password: "password123"}, wantCode: warble.EINVALID},
		{name: "UsernameTooLong", in: warble.SignupInput{Username: strings.Repeat("a", 21), Password: "password123"}, wantCode: warble.EINVALID},
		{name: "UsernameBadChars", in: warble.SignupInput{Username: "ada-l", Password: "password123"}, wantCode: warble.EINVALID},
		{name: "UsernameNonASCII", in: warble.SignupInput{Username: "adé", Password: "password123"}, wantCode: warble.EINVALID},
		{name: "PasswordTooShort", in: warble.SignupInput{Username: "ada", Password: "1234567"}, wantCode: warble.EINVALID},
		{name: "PasswordTooLong", in: warble.SignupInput{Username: "ada", Password: strings.Repeat("p", 73)}, wantCode: warble.EINVALID},
		{name: "DisplayNameEmpty", in: warble.SignupInput{Username: "ada", Password: "password123", DisplayName: strPtr("")}, wantCode: warble.EINVALID},
		{name: "DisplayNameSpaces", in: warble.SignupInput{Username: "ada", Password: "password123", DisplayName: strPtr(" Ada")}, wantCode: warble.EINVALID},
		{name: "DisplayNameControl", in: warble.SignupInput{Username: "ada", Password: "password123", DisplayName: strPtr("A\x07da")}, wantCode: warble.EINVALID},
		{name: "DisplayNameTooLong", in: warble.SignupInput{Username: "ada", Password: "password123", DisplayName: strPtr(strings.Repeat("é", 51))}, wantCode: warble.EINVALID},
		{name: "Taken", existing: []string{"ada"}, in: warble.SignupInput{Username: "ada", Password: "password123"}, wantCode: warble.ECONFLICT},
		{name: "TakenIgnoringCase", existing: []string{"ada"}, in: warble.SignupInput{Username: "ADA", Password: "password123"}, wantCode: warble.ECONFLICT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			db := newTestDB(t, Options{})
			for _, name := range tt.existing {
				mustSignup(t, db, name)
			}
			before := snapshot(t, db)
			p, err := NewAuthService(db).Signup(ctx, tt.in)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("Signup(%q) code = %q, want %q (err %v)", tt.in.Username, got, tt.wantCode, err)
			}
			if tt.wantCode != "" {
				assertUnchanged(t, db, before, "failed Signup")
				if tt.wantCode == warble.ECONFLICT && warble.ErrorMessage(err) != `Username "`+tt.in.Username+`" is taken.` {
					t.Errorf("Signup(%q) message = %q", tt.in.Username, warble.ErrorMessage(err))
				}
				return
			}
			u := p.User
			if u.Username != tt.in.Username || u.DisplayName != tt.wantName || u.ID == "" || u.CreatedAt.IsZero() {
				t.Errorf("Signup(%q) user = %+v", tt.in.Username, u)
			}
			if c := mustCounts(t, db, u.ID); c != (warble.UserCounts{}) {
				t.Errorf("new user has counts %+v", c)
			}
			if id, secret, _ := strings.Cut(p.Token, "."); id != u.ID || len(secret) != secretLen {
				t.Errorf("token %q, want %s.<%d characters>", p.Token, u.ID, secretLen)
			}
			if ttl := db.client.TTL(ctx, usernameKey(warble.UsernameKey(tt.in.Username))).Val(); ttl != -1 {
				t.Errorf("username claim TTL = %v after signup, want none (-1)", ttl)
			}
			if got := db.client.ZRevRange(ctx, newestUsersKey, 0, 0).Val(); len(got) != 1 || got[0] != u.ID {
				t.Errorf("newest users = %v, want %s first", got, u.ID)
			}
		})
	}
}

func TestSignupConcurrentSameName(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	const n = 20
	codes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := "racer"
			if i%2 == 1 {
				name = "RACER"
			}
			_, err := auth.Signup(ctx, warble.SignupInput{Username: name, Password: "password123"})
			codes[i] = warble.ErrorCode(err)
		}()
	}
	wg.Wait()
	wins := 0
	for i, code := range codes {
		switch code {
		case "":
			wins++
		case warble.ECONFLICT:
		default:
			t.Errorf("signup %d: code %q", i, code)
		}
	}
	if wins != 1 {
		t.Fatalf("%d of %d concurrent signups won, want 1", wins, n)
	}
	users, err := redistest.Keys(ctx, db.client, "w:u:{*}")
	if err != nil {
		t.Fatal(err)
	}
	if len(users) != 1 {
		t.Errorf("user hashes = %v, want exactly one", users)
	}
	if got := db.client.ZCard(ctx, newestUsersKey).Val(); got != 1 {
		t.Errorf("newest users has %d entries, want 1", got)
	}
	id := db.client.Get(ctx, usernameKey("racer")).Val()
	if len(users) == 1 && users[0] != userKey(id) {
		t.Errorf("username leads to %s, but the user is %s", userKey(id), users[0])
	}
}

func TestLogin(t *testing.T) {
	tests := []struct {
		name     string
		in       warble.LoginInput
		wantCode string
	}{
		{name: "OK", in: warble.LoginInput{Username: "ada", Password: "password123"}},
		{name: "UsernameIgnoringCase", in: warble.LoginInput{Username: "ADA", Password: "password123"}},
		{name: "WrongPassword", in: warble.LoginInput{Username: "ada", Password: "password124"}, wantCode: warble.EUNAUTHENTICATED},
		{name: "PasswordCaseMatters", in: warble.LoginInput{Username: "ada", Password: "PASSWORD123"}, wantCode: warble.EUNAUTHENTICATED},
		{name: "UnknownUser", in: warble.LoginInput{Username: "bob", Password: "password123"}, wantCode: warble.EUNAUTHENTICATED},
		{name: "MalformedUsername", in: warble.LoginInput{Username: "a d a", Password: "password123"}, wantCode: warble.EUNAUTHENTICATED},
		{name: "Empty", in: warble.LoginInput{}, wantCode: warble.EUNAUTHENTICATED},
	}
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	ada := mustSignup(t, db, "ada")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := db.client.SCard(ctx, sessionsKey(ada.ID)).Val()
			p, err := auth.Login(ctx, tt.in)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("Login(%q) code = %q, want %q (err %v)", tt.in.Username, got, tt.wantCode, err)
			}
			after := db.client.SCard(ctx, sessionsKey(ada.ID)).Val()
			if tt.wantCode != "" {
				// Wrong password and unknown user must not be told apart.
				if msg := warble.ErrorMessage(err); msg != "Wrong username or password." {
					t.Errorf("Login(%q) message = %q", tt.in.Username, msg)
				}
				if after != before {
					t.Errorf("failed login changed the session count from %d to %d", before, after)
				}
				return
			}
			if p.User.ID != ada.ID || p.User.Username != "ada" {
				t.Errorf("Login(%q) user = %+v, want ada", tt.in.Username, p.User)
			}
			if after != before+1 {
				t.Errorf("login made %d sessions, want 1", after-before)
			}
		})
	}
}

func TestSessions(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	signup, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	bob := mustSignup(t, db, "bob")
	tokens := []string{signup.Token}
	for range 2 {
		p, err := auth.Login(ctx, warble.LoginInput{Username: "ada", Password: "password123"})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, p.Token)
	}
	bobLogin, err := auth.Login(ctx, warble.LoginInput{Username: "bob", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}

	// Every session of ada's is valid at once, each its own.
	sessions := make([]*warble.Session, len(tokens))
	for i, token := range tokens {
		u, s, err := auth.Authenticate(ctx, token)
		if err != nil {
			t.Fatalf("Authenticate(token %d): %v", i, err)
		}
		if u.ID != signup.User.ID || s.UserID != u.ID || s.TokenHash != hashToken(token) {
			t.Fatalf("Authenticate(token %d) = %+v, %+v", i, u, s)
		}
		sessions[i] = s
	}
	if got := db.client.SCard(ctx, sessionsKey(signup.User.ID)).Val(); got != 3 {
		t.Errorf("ada has %d sessions, want 3", got)
	}
	if key := sessionKeyOf(sessions[0].TokenHash); !strings.HasPrefix(key, userKey(signup.User.ID)+":session:") {
		t.Errorf("session key %s is not in its user's slot", key)
	}
	if ttl := db.client.TTL(ctx, sessionKeyOf(sessions[0].TokenHash)).Val(); ttl <= 0 || ttl > DefaultSessionTTL {
		t.Errorf("session TTL = %v, want in (0, %v]", ttl, DefaultSessionTTL)
	}

	// Logging out revokes that session only.
	if err := auth.Logout(ctx, sessions[1]); err != nil {
		t.Fatal(err)
	}
	for i, token := range tokens {
		_, _, err := auth.Authenticate(ctx, token)
		if i == 1 {
			if warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
				t.Errorf("revoked token: err = %v, want EUNAUTHENTICATED", err)
			}
		} else if err != nil {
			t.Errorf("token %d after another session's logout: %v", i, err)
		}
	}
	if _, _, err := auth.Authenticate(ctx, bobLogin.Token); err != nil {
		t.Errorf("bob's token after ada's logout: %v", err)
	}
	if db.client.SIsMember(ctx, sessionsKey(signup.User.ID), sessions[1].TokenHash).Val() {
		t.Error("revoked session is still in ada's session index")
	}
	if got := db.client.SCard(ctx, sessionsKey(bob.ID)).Val(); got != 2 {
		t.Errorf("bob has %d sessions, want 2", got)
	}

	// A second logout of the same session is harmless.
	if err := auth.Logout(ctx, sessions[1]); err != nil {
		t.Errorf("repeated Logout: %v", err)
	}
}

func TestAuthenticateBadTokens(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	bob := mustSignup(t, db, "bob")
	id, secret, _ := strings.Cut(p.Token, ".")
	tests := []struct {
		name  string
		token string
	}{
		{name: "Empty", token: ""},
		{name: "TooShort", token: p.Token[:len(p.Token)-1]},
		{name: "TooLong", token: p.Token + "A"},
		{name: "WrongAlphabet", token: id + ".+" + secret[1:]},
		{name: "Padding", token: p.Token[:len(p.Token)-1] + "="},
		{name: "Unknown", token: id + "." + strings.Repeat("A", secretLen)},
		{name: "UnknownUser", token: "999." + secret},
		{name: "OtherUser", token: bob.ID + "." + secret},
		{name: "SecretAlone", token: secret},
		{name: "UnknownOldForm", token: strings.Repeat("A", secretLen)},
		{name: "NoUser", token: "." + secret},
		{name: "MalformedUser", token: "0" + p.Token},
		{name: "TwoUsers", token: id + "." + p.Token},
		{name: "HashOfToken", token: hashToken(p.Token)},
		{name: "OtherCase", token: strings.ToUpper(p.Token)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.token == p.Token {
				t.Skip("the variant happens to equal the token")
			}
			u, s, err := auth.Authenticate(ctx, tt.token)
			if warble.ErrorCode(err) != warble.EUNAUTHENTICATED || u != nil || s != nil {
				t.Fatalf("Authenticate(%q) = %v, %v, %v; want EUNAUTHENTICATED", tt.token, u, s, err)
			}
			if msg := warble.ErrorMessage(err); msg != "Your session has expired or was revoked. Please log in again." {
				t.Errorf("message = %q", msg)
			}
		})
	}

	// A session whose key has gone (as when it expires) is no longer valid.
	if err := db.client.Del(ctx, sessionKeyOf(hashToken(p.Token))).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.Authenticate(ctx, p.Token); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Errorf("Authenticate(expired) err = %v, want EUNAUTHENTICATED", err)
	}
}

// TestAuthSecretsNotStored reads back every key and value Redis holds and
// checks that neither a token nor a password appears in it.
func TestAuthSecretsNotStored(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	const password = "correct horse battery"
	signup, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: password})
	if err != nil {
		t.Fatal(err)
	}
	login, err := auth.Login(ctx, warble.LoginInput{Username: "ada", Password: password})
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{signup.Token, login.Token, password}

	keys, err := redistest.Keys(ctx, db.client, "*")
	if err != nil {
		t.Fatal(err)
	}
	var stored []string
	for _, key := range keys {
		stored = append(stored, key)
		switch typ := db.client.Type(ctx, key).Val(); typ {
		case "string":
			stored = append(stored, db.client.Get(ctx, key).Val())
		case "hash":
			for f, v := range db.client.HGetAll(ctx, key).Val() {
				stored = append(stored, f, v)
			}
		case "set":
			stored = append(stored, db.client.SMembers(ctx, key).Val()...)
		case "zset":
			stored = append(stored, db.client.ZRange(ctx, key, 0, -1).Val()...)
		default:
			t.Errorf("key %s has unexpected type %s", key, typ)
		}
	}
	for _, s := range stored {
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("Redis holds %q, which contains the secret %q", s, secret)
			}
		}
	}
	hash := db.client.HGet(ctx, userKey(signup.User.ID), "password").Val()
	if !strings.HasPrefix(hash, "$2") {
		t.Errorf("stored password %q is not a bcrypt hash", hash)
	}
	if db.client.Exists(ctx, sessionKeyOf(hashToken(login.Token))).Val() != 1 {
		t.Error("no session stored under the SHA-256 of the token")
	}
}

func TestLogoutPublishesRevocation(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	_, s, err := auth.Authenticate(ctx, p.Token)
	if err != nil {
		t.Fatal(err)
	}

	sub := listen(t, db, revokedChannel)
	if err := auth.Logout(ctx, s); err != nil {
		t.Fatal(err)
	}
	msg := nextMessage(t, sub)
	if msg.Payload != hashToken(p.Token) || msg.Payload == p.Token {
		t.Errorf("revocation message = %q, want the token hash %q", msg.Payload, hashToken(p.Token))
	}
}

// TestSessionsSlideWithUse checks that a session used within its lifetime
// outlives it, that one left unused expires, and what SessionExpiry says.
// The lifetime is short so that Redis's own clock runs it out.
func TestSessionsSlideWithUse(t *testing.T) {
	ctx := context.Background()
	const ttl = 1500 * time.Millisecond
	db := newTestDB(t, Options{SessionTTL: ttl})
	auth := NewAuthService(db)
	used, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	idle, err := auth.Login(ctx, warble.LoginInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	idleHash := hashToken(idle.Token)
	at, err := auth.SessionExpiry(ctx, idleHash)
	if err != nil || time.Until(at) <= 0 || time.Until(at) > ttl {
		t.Fatalf("SessionExpiry of a new session = %v (in %v), %v; want within %v", at, time.Until(at), err, ttl)
	}

	// Use one session for twice its lifetime; the other waits.
	for end := time.Now().Add(2 * ttl); time.Now().Before(end); time.Sleep(ttl / 5) {
		_, s, err := auth.Authenticate(ctx, used.Token)
		if err != nil {
			t.Fatalf("a session in use expired: %v", err)
		}
		if left := time.Until(s.ExpiresAt); left <= 0 || left > ttl {
			t.Fatalf("session expires in %v, want within %v", left, ttl)
		}
	}
	if _, _, err := auth.Authenticate(ctx, idle.Token); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Fatalf("a session unused past its lifetime: err = %v, want EUNAUTHENTICATED", err)
	}
	if _, err := auth.SessionExpiry(ctx, idleHash); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Fatalf("SessionExpiry of an expired session: err = %v, want EUNAUTHENTICATED", err)
	}
}

// TestAuthenticateWritesOnlyWhenStale checks that reading a fresh session
// does not rewrite its expiry: most requests cost one read.
func TestAuthenticateWritesOnlyWhenStale(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	key := sessionKeyOf(hashToken(p.Token))
	stale := DefaultSessionTTL - 2*sessionSlack(DefaultSessionTTL)
	if err := db.client.PExpire(ctx, key, stale).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.Authenticate(ctx, p.Token); err != nil {
		t.Fatal(err)
	}
	if left := db.client.PTTL(ctx, key).Val(); left <= stale {
		t.Fatalf("a stale expiry was not moved: %v left", left)
	}
	fresh := DefaultSessionTTL - sessionSlack(DefaultSessionTTL)/2
	if err := db.client.PExpire(ctx, key, fresh).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.Authenticate(ctx, p.Token); err != nil {
		t.Fatal(err)
	}
	if left := db.client.PTTL(ctx, key).Val(); left > fresh {
		t.Fatalf("a fresh expiry was rewritten: %v left, was %v", left, fresh)
	}
}

func TestLogoutEverywhere(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	tokens := []string{p.Token}
	for range 2 {
		l, err := auth.Login(ctx, warble.LoginInput{Username: "ada", Password: "password123"})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, l.Token)
	}
	bob, err := auth.Signup(ctx, warble.SignupInput{Username: "bob", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}

	sub := listen(t, db, revokedChannel)
	n, err := auth.LogoutEverywhere(ctx, p.User.ID)
	if err != nil || n != 3 {
		t.Fatalf("LogoutEverywhere = %d, %v; want 3 sessions", n, err)
	}
	revoked := map[string]bool{}
	for range 3 {
		revoked[nextMessage(t, sub).Payload] = true
	}
	for i, token := range tokens {
		if _, _, err := auth.Authenticate(ctx, token); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
			t.Errorf("token %d after LogoutEverywhere: err = %v, want EUNAUTHENTICATED", i, err)
		}
		if !revoked[hashToken(token)] {
			t.Errorf("the revocation of token %d was not announced", i)
		}
	}
	if n := db.client.Exists(ctx, sessionsKey(p.User.ID)).Val(); n != 0 {
		t.Error("the session index is still there")
	}
	if _, _, err := auth.Authenticate(ctx, bob.Token); err != nil {
		t.Errorf("another user's session after LogoutEverywhere: %v", err)
	}
	if n, err := auth.LogoutEverywhere(ctx, p.User.ID); err != nil || n != 0 {
		t.Errorf("a second LogoutEverywhere = %d, %v; want 0", n, err)
	}
}

// TestSessionIndexIsPruned checks that a user who logs in often and never
// out does not grow a session index without bound: entries of expired
// sessions are dropped once it holds more than pruneSessionsAbove.
func TestSessionIndexIsPruned(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{SessionTTL: 100 * time.Millisecond})
	auth := NewAuthService(db)
	p, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	var last *warble.AuthPayload
	for range 3 * pruneSessionsAbove {
		if last, err = auth.Login(ctx, warble.LoginInput{Username: "ada", Password: "password123"}); err != nil {
			t.Fatal(err)
		}
		if n := db.client.SCard(ctx, sessionsKey(p.User.ID)).Val(); n > pruneSessionsAbove+1 {
			// Sessions live 100 ms, so past the threshold most are dead.
			live := 0
			for _, h := range db.client.SMembers(ctx, sessionsKey(p.User.ID)).Val() {
				live += int(db.client.Exists(ctx, sessionKeyOf(h)).Val())
			}
			if n-int64(live) > pruneSessionsAbove {
				t.Fatalf("session index holds %d entries, %d of them of expired sessions", n, n-int64(live))
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !db.client.SIsMember(ctx, sessionsKey(p.User.ID), hashToken(last.Token)).Val() {
		t.Fatal("pruning dropped the newest session's entry")
	}
}

// TestSignupSurvivesARetriedClaim checks a username claim whose reply was
// lost, so that the client sent its SET NX again: the second answer says
// the key exists, and the signup must see that the claim is its own.
func TestSignupSurvivesARetriedClaim(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	db.client.AddHook(sendTwice{match: func(cmd redis.Cmder) bool {
		args := cmd.Args()
		return cmd.Name() == "set" && len(args) > 3 && strings.EqualFold(fmt.Sprint(args[len(args)-1]), "nx")
	}})
	p, err := NewAuthService(db).Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatalf("Signup with a retried claim: %v", err)
	}
	if ttl := db.client.TTL(ctx, usernameKey("ada")).Val(); ttl != -1 {
		t.Fatalf("claim TTL = %v, want the claim made permanent", ttl)
	}
	if got := db.client.Get(ctx, usernameKey("ada")).Val(); got != p.User.ID {
		t.Fatalf("claim holds %q, want %q", got, p.User.ID)
	}
	// A claim held by someone else still means taken.
	if _, err := NewAuthService(db).Signup(ctx, warble.SignupInput{Username: "ADA", Password: "password123"}); warble.ErrorCode(err) != warble.ECONFLICT {
		t.Fatalf("Signup of a taken name: err = %v, want ECONFLICT", err)
	}
}

// sendTwice is a go-redis hook that sends the commands match picks twice
// and keeps the second answer, as the client's retry after a lost reply does.
type sendTwice struct{ match func(redis.Cmder) bool }

func (h sendTwice) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h sendTwice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.match(cmd) {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h sendTwice) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestAuthenticateOneRoundTrip checks that a signed-in request reads its
// session and its user in one round trip to Redis.
func TestAuthenticateOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	p, err := auth.Signup(ctx, warble.SignupInput{Username: "ada", Password: "password123", DisplayName: strPtr("Ada L")})
	if err != nil {
		t.Fatal(err)
	}
	// The first use loads the script; the seen time was recorded at signup.
	if _, _, err := auth.Authenticate(ctx, p.Token); err != nil {
		t.Fatal(err)
	}
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	u, s, err := auth.Authenticate(ctx, p.Token)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter.N(); n != 1 {
		t.Errorf("Authenticate made %d round trips, want 1", n)
	}
	if *u != *p.User || s.UserID != u.ID || time.Until(s.ExpiresAt) <= 0 {
		t.Errorf("Authenticate = %+v, %+v; want %+v", u, s, p.User)
	}

	// A session whose user is gone leads nowhere.
	if err := db.client.Del(ctx, userKey(u.ID)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := auth.Authenticate(ctx, p.Token); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Errorf("Authenticate for a user who is gone: err = %v, want EUNAUTHENTICATED", err)
	}
}

// TestAuthenticateHidesWhichUsersExist checks that a wrong token naming a
// user who exists costs Redis exactly what one naming nobody does: the
// same commands with the same number of arguments, and the same error.
func TestAuthenticateHidesWhichUsersExist(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	ada := mustSignup(t, db, "ada")
	secret := strings.Repeat("A", secretLen)
	rec := &commandLog{}
	db.client.AddHook(rec)
	// The first use loads the script.
	if _, _, err := auth.Authenticate(ctx, "1."+secret); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Fatal(err)
	}
	var sent [2][]string
	var msgs [2]string
	for i, token := range []string{ada.ID + "." + secret, "999." + secret} {
		rec.take()
		_, _, err := auth.Authenticate(ctx, token)
		if warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
			t.Fatalf("Authenticate(%q): err = %v, want EUNAUTHENTICATED", token, err)
		}
		sent[i], msgs[i] = rec.take(), warble.ErrorMessage(err)
	}
	if !slices.Equal(sent[0], sent[1]) || len(sent[0]) == 0 || msgs[0] != msgs[1] {
		t.Errorf("a wrong token of a user who exists sent %q and said %q; of nobody, %q and %q", sent[0], msgs[0], sent[1], msgs[1])
	}
}

// commandLog is a go-redis hook that records the name and the number of
// arguments of each command sent.
type commandLog struct {
	mu   sync.Mutex
	cmds []string
}

// take returns the commands recorded since the last take.
func (l *commandLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	cmds := l.cmds
	l.cmds = nil
	return cmds
}

func (l *commandLog) add(cmds ...redis.Cmder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cmds {
		l.cmds = append(l.cmds, fmt.Sprintf("%s/%d", c.Name(), len(c.Args())))
	}
}

func (l *commandLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *commandLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		l.add(cmd)
		return next(ctx, cmd)
	}
}

func (l *commandLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.add(cmds...)
		return next(ctx, cmds)
	}
}

// oldSession stores a session of userID as Warble did before tokens named
// their user, and returns its token.
func oldSession(tb testing.TB, db *DB, userID string, ttl time.Duration) string {
	tb.Helper()
	ctx := context.Background()
	b := make([]byte, tokenBytes)
	rand.Read(b)
	token := base64.RawURLEncoding.EncodeToString(b)
	sha := hashToken(token)
	if err := db.client.SAdd(ctx, sessionsKey(userID), sha).Err(); err != nil {
		tb.Fatal(err)
	}
	key := legacySessionKey(sha)
	if err := db.client.HSet(ctx, key, "userID", userID, "createdAt", msString(time.Now())).Err(); err != nil {
		tb.Fatal(err)
	}
	if err := db.client.PExpire(ctx, key, ttl).Err(); err != nil {
		tb.Fatal(err)
	}
	return token
}

// TestOldTokens checks that the sessions of tokens made before tokens named
// their user keep working until they expire or are revoked: authenticated,
// their expiry read and slid, logged out one by one or everywhere (with
// the new sessions of the same user), each revocation announced.
func TestOldTokens(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	auth := NewAuthService(db)
	ada := mustSignup(t, db, "ada")
	old := oldSession(t, db, ada.ID, time.Hour)
	if _, ok := parseToken(old); !ok || strings.Contains(old, ".") {
		t.Fatalf("%q is not a token of the old form", old)
	}

	u, s, err := auth.Authenticate(ctx, old)
	if err != nil {
		t.Fatalf("Authenticate(old token): %v", err)
	}
	if *u != *ada || s.UserID != ada.ID || s.TokenHash != hashToken(old) || sessionKeyOf(s.TokenHash) != legacySessionKey(s.TokenHash) {
		t.Fatalf("Authenticate(old token) = %+v, %+v", u, s)
	}
	// A use slides its expiry as for a new session.
	if left := time.Until(s.ExpiresAt); left <= time.Hour {
		t.Errorf("old session expires in %v after a use, want its lifetime again", left)
	}
	if at, err := auth.SessionExpiry(ctx, s.TokenHash); err != nil || !at.After(time.Now().Add(time.Hour)) {
		t.Errorf("SessionExpiry(old session) = %v, %v", at, err)
	}

	sub := listen(t, db, revokedChannel)
	if err := auth.Logout(ctx, s); err != nil {
		t.Fatal(err)
	}
	if msg := nextMessage(t, sub); msg.Payload != s.TokenHash {
		t.Errorf("revocation message = %q, want %q", msg.Payload, s.TokenHash)
	}
	if _, _, err := auth.Authenticate(ctx, old); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Errorf("old token after logout: err = %v, want EUNAUTHENTICATED", err)
	}

	// Everywhere: an old session and a new one of the same user.
	old = oldSession(t, db, ada.ID, time.Hour)
	login, err := auth.Login(ctx, warble.LoginInput{Username: "ada", Password: "password123"})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := auth.LogoutEverywhere(ctx, ada.ID); err != nil || n != 3 { // with signup's
		t.Fatalf("LogoutEverywhere = %d, %v; want 3", n, err)
	}
	revoked := map[string]bool{}
	for range 3 {
		revoked[nextMessage(t, sub).Payload] = true
	}
	for _, token := range []string{old, login.Token} {
		if _, _, err := auth.Authenticate(ctx, token); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
			t.Errorf("token %q after LogoutEverywhere: err = %v", token, err)
		}
		if !revoked[hashToken(token)] {
			t.Errorf("the revocation of %q was not announced", token)
		}
	}

	// And an old session expires as it always did.
	old = oldSession(t, db, ada.ID, 50*time.Millisecond)
	if _, _, err := auth.Authenticate(ctx, old); err != nil {
		t.Fatalf("old token before its expiry: %v", err)
	}
	if err := db.client.PExpire(ctx, legacySessionKey(hashToken(old)), 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if _, _, err := auth.Authenticate(ctx, old); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
		t.Errorf("old token past its expiry: err = %v, want EUNAUTHENTICATED", err)
	}
}

// TestAuthenticateForPost: on one Redis a good session's request takes
// its post's seq with the session, in the one round trip, and CreatePost
// takes it in place of its INCR: the post is one round trip more. The seq
// is taken once, for the signed-in author only; a bad token, a revoked
// session or a user who is gone takes none, and a Redis that lost the
// script takes none once and has it again for the next request. On a
// Redis Cluster nothing is taken ahead.
func TestAuthenticateForPost(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{AsyncFanOut: true})
	auth, posts := NewAuthService(db), NewPostService(db)
	p := mustSignupSession(t, auth, "ada")
	bob := mustSignupSession(t, auth, "bob")
	mustCreatePost(t, db, p.User.ID, "loads the step's script")
	seqNow := func() int64 {
		t.Helper()
		n, err := db.client.Get(ctx, postSeqKey).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	counter := &redistest.RoundTrips{}
	db.client.AddHook(counter)
	signedIn := func(token string) (context.Context, error) {
		t.Helper()
		c, u, _, err := auth.AuthenticateForPost(ctx, token)
		if err == nil {
			c = warble.NewContextWithUser(c, u)
		}
		return c, err
	}
	if _, err := signedIn(p.Token); err != nil { // loads the script
		t.Fatal(err)
	}

	before, trips := seqNow(), counter.N()
	c, err := signedIn(p.Token)
	if err != nil {
		t.Fatal(err)
	}
	if n := counter.N() - trips; n != 1 {
		t.Errorf("AuthenticateForPost: %d round trips, want 1", n)
	}
	want := before + 1
	if db.onCluster() {
		want = before // nothing taken ahead
	}
	if got := seqNow(); got != want {
		t.Fatalf("seq after AuthenticateForPost = %d, want %d", got, want)
	}
	trips = counter.N()
	first, err := posts.CreatePost(c, p.User.ID, "with the seq taken ahead")
	if err != nil {
		t.Fatal(err)
	}
	if first.Seq != before+1 {
		t.Errorf("post seq %d, want %d", first.Seq, before+1)
	}
	if n := counter.N() - trips; !db.onCluster() && n != 1 {
		t.Errorf("CreatePost with the seq taken ahead: %d round trips, want 1", n)
	}
	// Taken once: a second post with the same context draws its own.
	second, err := posts.CreatePost(c, p.User.ID, "a second one")
	if err != nil {
		t.Fatal(err)
	}
	if second.Seq != first.Seq+1 || seqNow() != first.Seq+1 {
		t.Errorf("second post seq %d (counter %d), want %d", second.Seq, seqNow(), first.Seq+1)
	}
	// Only for the signed-in author.
	c, err = signedIn(p.Token)
	if err != nil {
		t.Fatal(err)
	}
	if seq, ok := takeSeqAhead(c, bob.User.ID); ok {
		t.Errorf("bob took ada's seq %d", seq)
	}
	if db.onCluster() {
		return
	}
	if seq, ok := takeSeqAhead(c, p.User.ID); !ok || seq != seqNow() {
		t.Errorf("ada's seq ahead = %d, %v; want %d", seq, ok, seqNow())
	}

	// Nothing taken for a token that fails.
	id, secret, _ := strings.Cut(p.Token, ".")
	wrong := id + "." + strings.Repeat("A", len(secret))
	revoked := mustSignupSession(t, auth, "cyd")
	if err := auth.Logout(ctx, &warble.Session{TokenHash: hashToken(revoked.Token), UserID: revoked.User.ID}); err != nil {
		t.Fatal(err)
	}
	gone := mustSignupSession(t, auth, "dee")
	if err := db.client.HDel(ctx, userKey(gone.User.ID), "username").Err(); err != nil {
		t.Fatal(err)
	}
	for name, token := range map[string]string{"wrong": wrong, "revoked": revoked.Token, "user gone": gone.Token} {
		before := seqNow()
		if _, err := signedIn(token); warble.ErrorCode(err) != warble.EUNAUTHENTICATED {
			t.Errorf("%s token: %v, want EUNAUTHENTICATED", name, err)
		}
		if got := seqNow(); got != before {
			t.Errorf("%s token moved the seq from %d to %d", name, before, got)
		}
	}

	// A Redis that lost its scripts: none taken, and the next has it.
	if err := db.client.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before = seqNow()
	if c, err = signedIn(p.Token); err != nil {
		t.Fatal(err)
	}
	if _, ok := takeSeqAhead(c, p.User.ID); ok || seqNow() != before {
		t.Errorf("after SCRIPT FLUSH: a seq taken ahead (counter %d, was %d)", seqNow(), before)
	}
	if c, err = signedIn(p.Token); err != nil {
		t.Fatal(err)
	}
	if seq, ok := takeSeqAhead(c, p.User.ID); !ok || seq != before+1 {
		t.Errorf("the request after: seq ahead %d, %v; want %d", seq, ok, before+1)
	}
}
