package warble

import "context"

// PostArchive keeps the posts that have left Redis: an author's posts past
// the newest few hundred or thousand, and posts older than a set age (see
// the README, "Where data lives"). Posts in it keep their ids and Seq, so
// cursors are the same keyset positions whether a post is in Redis or
// archived. Every method is one statement or query, whatever the number of
// ids or authors.
type PostArchive interface {
	// SavePosts writes posts, replacing any archived post of the same id:
	// saving a batch twice leaves what saving it once does.
	SavePosts(ctx context.Context, posts []*Post) error
	// DeletePosts removes the posts with these ids. An id not archived is
	// no error.
	DeletePosts(ctx context.Context, ids []string) error
	// PostsByIDs returns the archived posts among ids, by id; an id not
	// archived is absent from the map. Posts come without Author.
	PostsByIDs(ctx context.Context, ids []string) (map[string]*Post, error)
	// PostsByAuthors returns up to limit archived posts written by any of
	// authorIDs with a Seq below beforeSeq (no bound when beforeSeq <= 0),
	// highest Seq first.
	PostsByAuthors(ctx context.Context, authorIDs []string, beforeSeq int64, limit int) ([]*Post, error)
	// LatestPosts returns up to limit archived posts of anyone with a Seq
	// below beforeSeq (no bound when beforeSeq <= 0), highest Seq first.
	LatestPosts(ctx context.Context, beforeSeq int64, limit int) ([]*Post, error)
}
