package app

import (
	"bytes"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// withLimits turns rate limits on with change applied to the defaults.
func withLimits(change func(l *warble.RateLimits)) func(*Config) {
	return func(c *Config) {
		c.RateLimitsOn = true
		change(&c.RateLimits)
	}
}

// every is a rate of n events per hour, all available at once.
func every(n int) warble.Rate { return warble.Rate{Events: n, Per: time.Hour, Burst: n} }

// assertRateLimited checks that r is a RATE_LIMITED error with a wait.
func assertRateLimited(t *testing.T, r gqlResponse, what string) {
	t.Helper()
	if r.code() != "RATE_LIMITED" {
		t.Fatalf("%s: code %q (%+v), want RATE_LIMITED", what, r.code(), r.Errors)
	}
	if secs, _ := r.Errors[0].Extensions["retryAfter"].(float64); secs < 1 {
		t.Fatalf("%s: extensions %v, want retryAfter in whole seconds", what, r.Errors[0].Extensions)
	}
}

const loginMutation = `mutation($u: String!, $p: String!) { login(input: {username: $u, password: $p}) { token } }`

func TestFailedLoginsAreLimitedPerUsername(t *testing.T) {
	s := newTestServer(t, withLimits(func(l *warble.RateLimits) { l.LoginFailuresPerUsername = every(3) }))
	u := s.signup(t, "target")
	other := s.signup(t, "other")
	for i := range 3 {
		if r := s.query(t, "", loginMutation, map[string]any{"u": u.Username, "p": "wrong guess"}); r.code() != "UNAUTHENTICATED" {
			t.Fatalf("wrong password %d: code %q, want UNAUTHENTICATED", i, r.code())
		}
	}
	// Over the limit even the right password is refused, so that guessing
	// on learns nothing; the username is matched ignoring case.
	assertRateLimited(t, s.query(t, "", loginMutation, map[string]any{"u": u.Username, "p": "correct horse"}), "right password after 3 wrong")
	// Other usernames from the same address are not affected.
	if r := s.query(t, "", loginMutation, map[string]any{"u": other.Username, "p": "correct horse"}); len(r.Errors) > 0 {
		t.Fatalf("another user's login: %+v", r.Errors)
	}
	// Successful logins do not count.
	for range 5 {
		if r := s.query(t, "", loginMutation, map[string]any{"u": other.Username, "p": "correct horse"}); len(r.Errors) > 0 {
			t.Fatalf("repeated good logins: %+v", r.Errors)
		}
	}
}

func TestFailedLoginsAreLimitedPerAddress(t *testing.T) {
	s := newTestServer(t, withLimits(func(l *warble.RateLimits) { l.LoginFailuresPerAddress = every(3) }))
	for i := range 3 {
		// Unknown usernames count like wrong passwords.
		r := s.query(t, "", loginMutation, map[string]any{"u": "nobody_" + strconv.Itoa(i), "p": "wrong guess"})
		if r.code() != "UNAUTHENTICATED" {
			t.Fatalf("attempt %d: code %q, want UNAUTHENTICATED", i, r.code())
		}
	}
	assertRateLimited(t, s.query(t, "", loginMutation, map[string]any{"u": "nobody_9", "p": "wrong guess"}), "a fourth failure from one address")
}

func TestSignupsPostsAndFollowsAreLimited(t *testing.T) {
	s := newTestServer(t, withLimits(func(l *warble.RateLimits) {
		l.SignupsPerAddress = every(3)
		l.PostsPerUser = every(2)
		l.FollowsPerUser = every(2)
	}))
	ada, bob, eve := s.signup(t, "ada"), s.signup(t, "bob"), s.signup(t, "eve")
	s.waitFirstPass(t)
	before := redistest.Snapshot(t, s.redis.Client(t))
	r := s.query(t, "", signupMutation, map[string]any{"u": "one_too_many", "p": "password1"})
	assertRateLimited(t, r, "a fourth signup from one address")
	var found struct{ User *struct{ ID string } }
	s.mustQuery(t, "", `{ user(username: "one_too_many") { id } }`, nil, &found)
	if found.User != nil {
		t.Fatal("a refused signup created the user")
	}
	assertUnchangedButLimits(t, s, before, "refused signup")

	s.post(t, ada, "one")
	s.post(t, ada, "two")
	assertRateLimited(t, s.query(t, ada.Token, createPostMutation, map[string]any{"b": "three"}), "a third post")
	s.post(t, bob, "bob's own budget") // limits are per user
	var profile struct{ User struct{ PostsCount int } }
	s.mustQuery(t, "", `query($u: String!) { user(username: $u) { postsCount } }`, map[string]any{"u": ada.Username}, &profile)
	if profile.User.PostsCount != 2 {
		t.Fatalf("postsCount = %d after a refused post, want 2", profile.User.PostsCount)
	}

	s.follow(t, ada, bob)
	s.mustQuery(t, ada.Token, unfollowMutation, map[string]any{"id": bob.ID}, new(any))
	assertRateLimited(t, s.query(t, ada.Token, followMutation, map[string]any{"id": eve.ID}), "a third follow or unfollow")
}

// assertUnchangedButLimits is AssertUnchanged that ignores rate limit keys,
// which a refused request updates by design.
func assertUnchangedButLimits(t *testing.T, s *testServer, before map[string]string, what string) {
	t.Helper()
	after := redistest.Snapshot(t, s.redis.Client(t))
	for _, snap := range []map[string]string{before, after} {
		for k := range snap {
			if len(k) > 5 && k[:5] == "rate:" {
				delete(snap, k)
			}
		}
	}
	if len(before) != len(after) {
		t.Fatalf("%s: %d keys before, %d after", what, len(before), len(after))
	}
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("%s changed %s", what, k)
		}
	}
}

func TestWebsocketsAreLimitedPerAddress(t *testing.T) {
	s := newTestServer(t, withLimits(func(l *warble.RateLimits) { l.WebsocketsPerAddress = every(2) }))
	for range 2 {
		s.connect(t, protoTransportWS, "")
	}
	_, resp, err := s.dialWS(t, protoTransportWS, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third websocket: err %v, want a 429 refusal", err)
	}
	if secs, _ := strconv.Atoi(resp.Header.Get("Retry-After")); secs < 1 {
		t.Fatalf("Retry-After = %q, want whole seconds", resp.Header.Get("Retry-After"))
	}
}

func TestForwardedForIsTrustedOnlyWhenConfigured(t *testing.T) {
	for _, trust := range []bool{false, true} {
		s := newTestServer(t, withLimits(func(l *warble.RateLimits) { l.SignupsPerAddress = every(1) }),
			func(c *Config) { c.TrustXFF = trust })
		signupFrom := func(addr, name string) gqlResponse {
			req, _ := http.NewRequest(http.MethodPost, s.URL+"/graphql", jsonBody(map[string]any{
				"query": signupMutation, "variables": map[string]any{"u": name, "p": "password1"},
			}))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Forwarded-For", "203.0.113.9, "+addr)
			return s.send(t, req)
		}
		first := signupFrom("198.51.100.1", "first_"+strconv.FormatBool(trust))
		second := signupFrom("198.51.100.2", "second_"+strconv.FormatBool(trust))
		if len(first.Errors) > 0 {
			t.Fatalf("trust %v: first signup: %+v", trust, first.Errors)
		}
		// Trusted, the two are different clients; untrusted, both are the
		// test's own address, and the second is one too many.
		if got := second.code(); (trust && got != "") || (!trust && got != "RATE_LIMITED") {
			t.Fatalf("trust %v: second signup from another forwarded address: code %q", trust, got)
		}
	}
}

func TestRateLimitConfiguration(t *testing.T) {
	cfg, err := ParseConfig(nil, func(k string) string {
		return map[string]string{"RATE_LIMIT_POSTS_PER_USER": "5/1m/2"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.RateLimitsOn || cfg.RateLimits.PostsPerUser != (warble.Rate{Events: 5, Per: time.Minute, Burst: 2}) ||
		cfg.RateLimits.SignupsPerAddress != warble.DefaultRateLimits().SignupsPerAddress {
		t.Fatalf("config = %+v", cfg.RateLimits)
	}
	off, err := ParseConfig([]string{"-rate-limits", "off"}, func(string) string { return "" })
	if err != nil || off.RateLimitsOn {
		t.Fatalf("-rate-limits off: on = %v, %v", off.RateLimitsOn, err)
	}
	for _, bad := range []map[string]string{{"RATE_LIMITS": "maybe"}, {"RATE_LIMIT_SIGNUPS_PER_ADDRESS": "10"}, {"RATE_LIMIT_FOLLOWS_PER_USER": "0/1h"}} {
		if _, err := ParseConfig(nil, func(k string) string { return bad[k] }); err == nil {
			t.Errorf("config %v accepted", bad)
		}
	}
}

func jsonBody(v any) *bytes.Reader { return bytes.NewReader(mustJSON(v)) }
