package redisdb

import (
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/redistest"
)

// newTestDB returns a DB on a fresh Redis for t. Password hashing uses the
// lowest bcrypt cost, so that tests that sign up many users stay fast.
func newTestDB(t testing.TB, opts Options) *DB {
	t.Helper()
	srv := redistest.New(t)
	if opts.BcryptCost == 0 {
		opts.BcryptCost = bcrypt.MinCost
	}
	return NewDB(srv.Client(t), opts)
}
