package graph

import (
	"testing"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/redistest"
)

// TestMain stops the Redis Cluster that the tests would share under
// REDISTEST_CLUSTER=1 once they are done. The scripts Warble runs only on
// one Redis pass redistest's check of hash slots.
func TestMain(m *testing.M) {
	redistest.AllowOnOneRedis(redisdb.OneRedisScripts()...)
	redistest.Main(m)
}
