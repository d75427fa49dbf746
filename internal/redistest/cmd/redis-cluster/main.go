// Command redis-cluster starts a Redis Cluster of redis-server processes on
// loopback, for the suites that run Warble as a program (the conformance
// suite, the load tool's run.sh) and cannot start one through the test
// helper. It prints the cluster's URL, in go-redis's cluster form as
// REDIS_URL takes it, on a line of its own, and runs until it is
// interrupted or terminated, or its standard input closes; then it stops
// the nodes and removes their files.
//
//	go run ./internal/redistest/cmd/redis-cluster -masters 3 -replicas 0
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/warble/warble/internal/redistest"
)

func main() {
	masters := flag.Int("masters", 3, "how many masters share the slots")
	replicas := flag.Int("replicas", 0, "how many replicas each master has")
	nodeTimeout := flag.Duration("node-timeout", 2*time.Second, "cluster-node-timeout")
	watchStdin := flag.Bool("stdin", false, "also stop when standard input closes")
	flag.Parse()
	c, err := redistest.StartCluster(redistest.ClusterOptions{Masters: *masters, Replicas: *replicas, NodeTimeout: *nodeTimeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "redis-cluster:", err)
		os.Exit(1)
	}
	defer c.Stop()
	fmt.Println(c.URL)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	if *watchStdin {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			stop <- syscall.SIGTERM
		}()
	}
	<-stop
}
