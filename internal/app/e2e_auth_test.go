package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/warble/warble/internal/redistest"
)

const signupMutation = `mutation($u: String!, $p: String!, $d: String) {
	signup(input: {username: $u, password: $p, displayName: $d}) { token user { id username displayName } }
}`

func TestSignupValidation(t *testing.T) {
	s := newTestServer(t)
	s.signup(t, "taken") // taken_N; the conflict case below uses its own name
	var ok struct{ Signup struct{ Token string } }
	s.mustQuery(t, "", signupMutation, map[string]any{"u": "Ada_Lovelace", "p": "12345678"}, &ok)

	tests := []struct {
		name     string
		username string
		password string
		display  any
		wantCode string
	}{
		{name: "TooShort", username: "ab", password: "12345678", wantCode: "BAD_USER_INPUT"},
		{name: "TooLong", username: strings.Repeat("a", 21), password: "12345678", wantCode: "BAD_USER_INPUT"},
		{name: "BadCharacter", username: "ada-l", password: "12345678", wantCode: "BAD_USER_INPUT"},
		{name: "Space", username: "ada l", password: "12345678", wantCode: "BAD_USER_INPUT"},
		{name: "ShortPassword", username: "newname1", password: "1234567", wantCode: "BAD_USER_INPUT"},
		{name: "LongPassword", username: "newname2", password: strings.Repeat("x", 73), wantCode: "BAD_USER_INPUT"},
		{name: "EmptyDisplayName", username: "newname3", password: "12345678", display: "", wantCode: "BAD_USER_INPUT"},
		{name: "LongDisplayName", username: "newname4", password: "12345678", display: strings.Repeat("é", 51), wantCode: "BAD_USER_INPUT"},
		{name: "TakenIgnoringCase", username: "ada_lovelace", password: "12345678", wantCode: "CONFLICT"},
		{name: "LongestPassword", username: "newname5", password: strings.Repeat("x", 72)},
		{name: "UnicodeDisplayName", username: "newname6", password: "12345678", display: strings.Repeat("é", 50)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.waitFirstPass(t)
			before := redistest.Snapshot(t, s.redis.Client(t))
			r := s.query(t, "", signupMutation, map[string]any{"u": tt.username, "p": tt.password, "d": tt.display})
			if got := r.code(); got != tt.wantCode {
				t.Fatalf("signup(%q) code = %q, want %q (%+v)", tt.username, got, tt.wantCode, r.Errors)
			}
			if tt.wantCode != "" {
				redistest.AssertUnchanged(t, s.redis.Client(t), before, "rejected signup")
				if r.Errors[0].Message == "" || strings.Contains(r.Errors[0].Message, "warble error") {
					t.Errorf("message %q is not a sentence for users", r.Errors[0].Message)
				}
			}
		})
	}
}

func TestSignupShowsNameAsTypedAndDefaultsDisplayName(t *testing.T) {
	s := newTestServer(t)
	var out struct {
		Signup struct {
			Token string
			User  struct{ ID, Username, DisplayName string }
		}
	}
	s.mustQuery(t, "", signupMutation, map[string]any{"u": "GraceH", "p": "password1"}, &out)
	if out.Signup.User.Username != "GraceH" || out.Signup.User.DisplayName != "GraceH" {
		t.Fatalf("user = %+v, want username and display name GraceH", out.Signup.User)
	}
	var found struct{ User struct{ ID string } }
	s.mustQuery(t, "", `{ user(username: "graceh") { id } }`, nil, &found)
	if found.User.ID != out.Signup.User.ID {
		t.Fatalf("user(graceh).id = %q, want %q", found.User.ID, out.Signup.User.ID)
	}
}

func TestConcurrentSignupsOfOneNameExactlyOneWins(t *testing.T) {
	s := newTestServer(t)
	const n = 20
	codes := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Vary the case: uniqueness ignores it.
			name := "race_name"
			if i%2 == 1 {
				name = "RACE_name"
			}
			codes[i] = s.query(t, "", signupMutation, map[string]any{"u": name, "p": "password1"}).code()
		}()
	}
	wg.Wait()
	wins, conflicts := 0, 0
	for _, c := range codes {
		switch c {
		case "":
			wins++
		case "CONFLICT":
			conflicts++
		default:
			t.Errorf("unexpected code %q", c)
		}
	}
	if wins != 1 || conflicts != n-1 {
		t.Fatalf("wins = %d, conflicts = %d; want 1 and %d", wins, conflicts, n-1)
	}
	var out struct{ NewestUsers []struct{ Username string } }
	s.mustQuery(t, "", `{ newestUsers(first: 100) { username } }`, nil, &out)
	if len(out.NewestUsers) != 1 {
		t.Fatalf("newestUsers = %+v, want exactly one user", out.NewestUsers)
	}
}

func TestLoginSessionsAndLogout(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "sess")
	login := func(name, password string) gqlResponse {
		return s.query(t, "", `mutation($u: String!, $p: String!) { login(input: {username: $u, password: $p}) { token user { id } } }`,
			map[string]any{"u": name, "p": password})
	}
	wrong := login(u.Username, "wrong password")
	unknown := login("nobody_here", "correct horse")
	if wrong.code() != "UNAUTHENTICATED" || unknown.code() != "UNAUTHENTICATED" {
		t.Fatalf("wrong password code %q, unknown user code %q; want UNAUTHENTICATED", wrong.code(), unknown.code())
	}
	if wrong.Errors[0].Message != unknown.Errors[0].Message {
		t.Fatalf("wrong password says %q but unknown user says %q: they must not differ", wrong.Errors[0].Message, unknown.Errors[0].Message)
	}

	var second struct{ Login struct{ Token string } }
	login(strings.ToUpper(u.Username), "correct horse").decode(t, &second)
	tokens := []string{u.Token, second.Login.Token}
	for _, tok := range tokens {
		var v struct{ Viewer struct{ ID string } }
		s.mustQuery(t, tok, `{ viewer { id } }`, nil, &v)
		if v.Viewer.ID != u.ID {
			t.Fatalf("viewer with a session = %q, want %q", v.Viewer.ID, u.ID)
		}
	}

	var out struct{ Logout bool }
	s.mustQuery(t, u.Token, `mutation { logout }`, nil, &out)
	if r := s.query(t, u.Token, `{ viewer { id } }`, nil); r.code() != "UNAUTHENTICATED" {
		t.Fatalf("revoked token: code %q, want UNAUTHENTICATED", r.code())
	}
	var v struct{ Viewer struct{ ID string } }
	s.mustQuery(t, second.Login.Token, `{ viewer { id } }`, nil, &v)
	if v.Viewer.ID != u.ID {
		t.Fatal("logging out one session ended another")
	}
}

// TestConcurrentViewers sends many signed-in requests at once, as a busy
// server gets them, whose session reads go to Redis in shared round trips:
// each answers with its own user, and a revoked token with
// UNAUTHENTICATED, on every request.
func TestConcurrentViewers(t *testing.T) {
	s := newTestServer(t, func(c *Config) { c.RateLimitsOn = false })
	var users []testUser
	for range 8 {
		users = append(users, s.signup(t, "crowd"))
	}
	gone := s.signup(t, "gone")
	var out struct{ Logout bool }
	s.mustQuery(t, gone.Token, `mutation { logout }`, nil, &out)
	users = append(users, gone)

	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for _, u := range users {
		for range 4 {
			wg.Go(func() {
				for range 10 {
					req := s.request(u.Token, `{ viewer { id username } }`, nil)
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						errs <- err.Error()
						return
					}
					var r gqlResponse
					err = json.NewDecoder(resp.Body).Decode(&r)
					resp.Body.Close()
					var v struct{ Viewer struct{ ID, Username string } }
					switch {
					case err != nil:
						errs <- err.Error()
						return
					case u == gone:
						if r.code() != "UNAUTHENTICATED" {
							errs <- fmt.Sprintf("revoked token: %s, errors %+v; want UNAUTHENTICATED", r.Data, r.Errors)
							return
						}
					case len(r.Errors) > 0 || json.Unmarshal(r.Data, &v) != nil || v.Viewer.ID != u.ID || v.Viewer.Username != u.Username:
						errs <- fmt.Sprintf("viewer of %s (%s) = %s, errors %+v", u.Username, u.ID, r.Data, r.Errors)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestAuthRequiredAndBadTokens(t *testing.T) {
	s := newTestServer(t)
	var anon struct{ Viewer *struct{ ID string } }
	s.mustQuery(t, "", `{ viewer { id } }`, nil, &anon)
	if anon.Viewer != nil {
		t.Fatalf("viewer without a token = %+v, want null", anon.Viewer)
	}
	for _, q := range []string{
		`{ homeTimeline { edges { cursor } } }`,
		`mutation { logout }`,
		`mutation { createPost(input: {body: "hi"}) { post { id } } }`,
		`mutation { deletePost(input: {postId: "1:1"}) { postId } }`,
		`mutation { follow(input: {userId: "1"}) { user { id } } }`,
		`mutation { unfollow(input: {userId: "1"}) { user { id } } }`,
	} {
		if got := s.query(t, "", q, nil).code(); got != "UNAUTHENTICATED" {
			t.Errorf("%s without a session: code %q, want UNAUTHENTICATED", q, got)
		}
	}
	for _, token := range []string{"garbage", strings.Repeat("A", 43), "a b c"} {
		if got := s.query(t, token, `{ globalTimeline { edges { cursor } } }`, nil).code(); got != "UNAUTHENTICATED" {
			t.Errorf("token %q: code %q, want UNAUTHENTICATED (never a silent anonymous request)", token, got)
		}
	}
}

func TestSecretsAreNotStoredInTheClear(t *testing.T) {
	s := newTestServer(t)
	u := s.signup(t, "secret")
	ctx := context.Background()
	c := s.redis.Client(t)
	keys, _ := redistest.Keys(ctx, c, "*")
	for _, k := range keys {
		if strings.Contains(k, u.Token) {
			t.Fatalf("key %q contains the session token", k)
		}
		dump := fmt.Sprint(c.Do(ctx, "DUMP", k).Val())
		if strings.Contains(dump, u.Token) || strings.Contains(dump, "correct horse") {
			t.Fatalf("key %q holds the token or the password in the clear", k)
		}
	}
	if b, _ := json.Marshal(keys); len(keys) == 0 {
		t.Fatalf("no keys: %s", b)
	}
}
