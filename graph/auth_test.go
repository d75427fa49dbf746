package graph

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
	"github.com/warble/warble/internal/warble"
)

// closingAuth is the real AuthService, except that its SessionExpiry first
// ends the connection whose expiry it checks, as a client leaving just then
// would, and counts the checks.
type closingAuth struct {
	*redisdb.AuthService
	close  context.CancelFunc
	checks atomic.Int32
}

func (a *closingAuth) SessionExpiry(ctx context.Context, tokenHash string) (time.Time, error) {
	a.checks.Add(1)
	a.close()
	// The connection's end stops the timer now, while this check runs.
	time.Sleep(100 * time.Millisecond)
	return a.AuthService.SessionExpiry(ctx, tokenHash)
}

// A connection that ends while endAtExpiry checks its session is not
// checked again: the check must not set again the timer that the end
// stopped, which then fired every expiryRecheck for as long as the process
// lived, holding the connection's context.
func TestExpiryCheckEndsWithItsConnection(t *testing.T) {
	auth := redisdb.NewAuthService(redisdb.NewDB(redistest.New(t).Client(t), redisdb.Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	a := &closingAuth{AuthService: auth, close: cancel}
	var expired atomic.Bool
	endAtExpiry(ctx, a, &warble.Session{TokenHash: "h", ExpiresAt: time.Now()}, func() { expired.Store(true) })
	time.Sleep(expiryRecheck + time.Second)
	if n := a.checks.Load(); n != 1 {
		t.Fatalf("the session was checked %d times, want once: the check went on after its connection ended", n)
	}
	if expired.Load() {
		t.Fatal("a connection that ended was expired")
	}
}

// loggingOutAuth is the real AuthService, except that a logout of the
// session lands right after Authenticate has found it valid.
type loggingOutAuth struct{ *redisdb.AuthService }

func (a loggingOutAuth) Authenticate(ctx context.Context, token string) (*warble.User, *warble.Session, error) {
	u, s, err := a.AuthService.Authenticate(ctx, token)
	if err == nil {
		err = a.Logout(ctx, s)
	}
	return u, s, err
}

// A session logged out while its websocket authenticates, after the token
// was checked and before the connection listens for revocations, is
// refused with 4403: the announcement came before anyone here listened,
// and the socket would otherwise have lived on with it until its expiry.
func TestWebsocketInitRefusesSessionRevokedMeanwhile(t *testing.T) {
	db := redisdb.NewDB(redistest.New(t).Client(t), redisdb.Options{})
	hub := redisdb.NewHub(db)
	t.Cleanup(func() { hub.Close() })
	auth := redisdb.NewAuthService(db)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	signed, err := auth.Signup(ctx, warble.SignupInput{Username: "leaver", Password: "correct horse"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = websocketInit(loggingOutAuth{auth}, hub)(ctx, map[string]any{"Authorization": "Bearer " + signed.Token})
	var ir *initRefusal
	if !errors.As(err, &ir) || ir.code != closeForbidden {
		t.Fatalf("init of a session revoked meanwhile: %v, want a refusal with %d", err, closeForbidden)
	}
}
