package app

import (
	"context"
	"log/slog"

	"github.com/warble/warble/internal/archive"
)

// openArchive opens the archive that cfg.ArchiveURL names, migrating its
// schema, into cfg.Archive, and returns what closes it. Without a URL (or
// with an archive set already, by a test) it does nothing.
func openArchive(ctx context.Context, cfg *Config, log *slog.Logger) (func(), error) {
	if cfg.ArchiveURL == "" || cfg.Archive != nil {
		return func() {}, nil
	}
	store, err := archive.Open(ctx, cfg.ArchiveURL, log)
	if err != nil {
		return nil, err
	}
	cfg.Archive = store
	log.Info("archive open", "posts_in_redis", cfg.PostsInRedis, "posts_in_redis_for", cfg.PostsInRedisFor.String())
	return func() { store.Close() }, nil
}
