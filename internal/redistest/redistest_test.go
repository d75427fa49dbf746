package redistest

import (
	"context"
	"testing"
)

func TestNewIsEmptyAndWritable(t *testing.T) {
	s := New(t)
	c := s.Client(t)
	ctx := context.Background()
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("DBSize = %d, %v; want 0, nil", n, err)
	}
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got := c.Get(ctx, "k").Val(); got != "v" {
		t.Fatalf("Get(k) = %q, want %q", got, "v")
	}
}

func TestStopAndRestart(t *testing.T) {
	s := New(t)
	if s.cmd == nil {
		t.Skip("needs a redis-server started by redistest")
	}
	c := s.Client(t)
	ctx := context.Background()
	s.Stop(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("Ping after Stop succeeded")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping after Restart: %v", err)
	}
}
