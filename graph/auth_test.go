package graph

import (
	"context"
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
