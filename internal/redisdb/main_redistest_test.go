package redisdb

import (
	"testing"

	"github.com/warble/warble/internal/mysqltest"
	"github.com/warble/warble/internal/redistest"
)

// TestMain stops the Redis Cluster that the tests share under
// REDISTEST_CLUSTER=1, and the MariaDB server of the archive tests, once
// they are done. The scripts Warble runs only on one Redis pass
// redistest's check of hash slots.
func TestMain(m *testing.M) {
	redistest.AllowOnOneRedis(OneRedisScripts()...)
	redistest.Main(m, mysqltest.Stop)
}
