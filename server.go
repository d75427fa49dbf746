// Command warble runs the Warble service: a GraphQL API over Redis with live
// timelines on websockets. See README.md.
//
//	warble          the server
//	warble worker   fan-out workers only, beside the servers
//
// Every setting is an environment variable and a flag: warble -h lists them.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/warble/warble/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// run is the whole program: the server, or with the argument "worker"
// first, fan-out workers only.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "worker" {
		return app.RunWorkers(ctx, args[1:], getenv, stderr)
	}
	return app.Run(ctx, args, getenv, stderr)
}
