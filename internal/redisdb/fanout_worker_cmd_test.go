package redisdb

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// TestFanOutSurvivesKilledWarbleWorker is TestFanOutSurvivesKilledWorker
// with the worker processes run as `warble worker`, the binary built here.
func TestFanOutSurvivesKilledWarbleWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and fans out to 50,000 followers")
	}
	bin := filepath.Join(t.TempDir(), "warble")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/warble/warble").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	testKilledWorker(t, func() *exec.Cmd { return exec.Command(bin, "worker") })
}
