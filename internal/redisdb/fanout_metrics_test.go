package redisdb

import (
	"context"
	"testing"
	"time"
)

func TestFanOutQueueStats(t *testing.T) {
	ctx := context.Background()
	// The clock runs a minute ahead of Redis's, so the oldest job is a
	// minute old as soon as it is queued.
	db := newTestDB(t, Options{AsyncFanOut: true, Now: func() time.Time { return time.Now().Add(time.Minute) }})
	n, lag, err := db.FanOutQueueStats(ctx)
	if err != nil || n != 0 || lag != 0 {
		t.Fatalf("empty queue: %d jobs, lag %s, %v", n, lag, err)
	}
	for _, seq := range []int64{1, 2} {
		if err := db.enqueueFanOut(ctx, opDeliver, "1:"+string(rune('0'+seq))); err != nil {
			t.Fatal(err)
		}
	}
	n, lag, err = db.FanOutQueueStats(ctx)
	if err != nil || n != 2 || lag < 50*time.Second || lag > 2*time.Minute {
		t.Fatalf("two jobs: %d jobs, lag %s, %v; want 2 and about a minute", n, lag, err)
	}
	drainFanOut(t, db)
	if n, lag, err = db.FanOutQueueStats(ctx); err != nil || n != 0 || lag != 0 {
		t.Fatalf("drained queue: %d jobs, lag %s, %v", n, lag, err)
	}
}
