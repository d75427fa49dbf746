package warble

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Rate is how many events of one kind one subject (a user, a username, a
// client address) may cause: Burst at once, refilled evenly at Events per Per.
type Rate struct {
	Events int
	Per    time.Duration
	Burst  int
}

// String formats r as ParseRate reads it.
func (r Rate) String() string {
	s := strconv.Itoa(r.Events) + "/" + r.Per.String()
	if r.Burst != r.Events {
		s += "/" + strconv.Itoa(r.Burst)
	}
	return s
}

// ParseRate reads "EVENTS/PERIOD" ("100/1h") or "EVENTS/PERIOD/BURST"
// ("100/1h/20"); the burst defaults to EVENTS.
func ParseRate(s string) (Rate, error) {
	parts := strings.Split(s, "/")
	bad := fmt.Errorf("rate %q must be EVENTS/PERIOD or EVENTS/PERIOD/BURST, such as 100/1h", s)
	if len(parts) != 2 && len(parts) != 3 {
		return Rate{}, bad
	}
	events, err := strconv.Atoi(parts[0])
	if err != nil || events < 1 {
		return Rate{}, bad
	}
	per, err := time.ParseDuration(parts[1])
	if err != nil || per < time.Second {
		return Rate{}, bad
	}
	r := Rate{Events: events, Per: per, Burst: events}
	if len(parts) == 3 {
		if r.Burst, err = strconv.Atoi(parts[2]); err != nil || r.Burst < 1 {
			return Rate{}, bad
		}
	}
	return r, nil
}

// RateLimits are the limits Warble enforces.
type RateLimits struct {
	LoginFailuresPerUsername Rate // wrong passwords for one username
	LoginFailuresPerAddress  Rate // wrong passwords from one client address
	SignupsPerAddress        Rate
	PostsPerUser             Rate
	FollowsPerUser           Rate // follows and unfollows
	WebsocketsPerAddress     Rate // websocket connections opened
}

// DefaultRateLimits are generous for people and tight for scripts.
func DefaultRateLimits() RateLimits {
	return RateLimits{
		LoginFailuresPerUsername: Rate{Events: 10, Per: 15 * time.Minute, Burst: 10},
		LoginFailuresPerAddress:  Rate{Events: 50, Per: 15 * time.Minute, Burst: 50},
		SignupsPerAddress:        Rate{Events: 10, Per: time.Hour, Burst: 10},
		PostsPerUser:             Rate{Events: 100, Per: time.Hour, Burst: 20},
		FollowsPerUser:           Rate{Events: 200, Per: time.Hour, Burst: 50},
		WebsocketsPerAddress:     Rate{Events: 60, Per: time.Minute, Burst: 30},
	}
}

// RateLimiter counts events per kind and subject.
type RateLimiter interface {
	// Take counts one event of kind by subject and returns an ERATELIMITED
	// error, with RetryAfter set, if it is one too many; then it is not
	// counted.
	Take(ctx context.Context, kind, subject string, r Rate) error

	// Check returns the error Take would, without counting an event: for
	// limits on failures, which are counted only once they have happened.
	Check(ctx context.Context, kind, subject string, r Rate) error

	// Count counts one event that has happened, even past the limit.
	Count(ctx context.Context, kind, subject string, r Rate) error
}

// RateLimited returns the ERATELIMITED error for a wait of retryAfter.
func RateLimited(retryAfter time.Duration) *Error {
	secs := int((retryAfter + time.Second - 1) / time.Second)
	e := Errorf(ERATELIMITED, "Too many requests. Please try again in %d seconds.", max(secs, 1))
	e.RetryAfter = time.Duration(max(secs, 1)) * time.Second
	return e
}

type clientAddrKey struct{}

// NewContextWithClientAddress returns a copy of ctx that carries the
// address of the client that made the request, for per-address limits.
func NewContextWithClientAddress(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, clientAddrKey{}, addr)
}

// ClientAddressFromContext returns the client's address, or "" if unknown.
func ClientAddressFromContext(ctx context.Context) string {
	a, _ := ctx.Value(clientAddrKey{}).(string)
	return a
}
