package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "127.5.6.7": true,
		"10.0.0.1": false, "example.com": false, "": false,
	} {
		if got := loopback(host); got != want {
			t.Errorf("loopback(%q) = %v", host, got)
		}
	}
}

func TestRunRefusesRemoteTargets(t *testing.T) {
	for _, o := range []options{
		{serverURL: "http://example.com", redisURL: "redis://127.0.0.1:6379", users: 10, runs: 1, concurrency: 1},
		{serverURL: "http://127.0.0.1:8080", redisURL: "redis://10.1.2.3:6379", users: 10, runs: 1, concurrency: 1},
	} {
		err := run(context.Background(), o, nil)
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%+v: %v, want a refusal", o, err)
		}
	}
}

func TestMedian(t *testing.T) {
	got := median([]result{
		{rate: 3, p50: 3 * time.Millisecond, p99: 1 * time.Millisecond},
		{rate: 1, p50: 1 * time.Millisecond, p99: 9 * time.Millisecond},
		{rate: 2, p50: 2 * time.Millisecond, p99: 5 * time.Millisecond},
	})
	if got.rate != 2 || got.p50 != 2*time.Millisecond || got.p99 != 5*time.Millisecond {
		t.Errorf("median = %+v", got)
	}
}

func TestMeasure(t *testing.T) {
	r, err := measure(context.Background(), 2, 50*time.Millisecond, func(context.Context, *rand.Rand) error {
		time.Sleep(time.Millisecond)
		return nil
	})
	if err != nil || r.rate <= 0 || r.p50 <= 0 || r.p99 < r.p50 {
		t.Errorf("measure = %+v, %v", r, err)
	}
	boom := errors.New("boom")
	if _, err := measure(context.Background(), 2, time.Second, func(context.Context, *rand.Rand) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("measure with failing requests: %v", err)
	}
}
