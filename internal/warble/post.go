package warble

import (
	"context"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// MaxPostLen is the longest post body, in Unicode code points.
const MaxPostLen = 280

// Post is a short message written by a user.
type Post struct {
	ID        string
	AuthorID  string
	Body      string
	CreatedAt time.Time

	// Seq orders posts: it is the post's position in every timeline that
	// holds it, and what timeline cursors encode.
	Seq int64

	// Author is filled in when the post is read together with its author,
	// as timeline pages are; nil otherwise.
	Author *User
}

// CreatePostInput is what a person gives to write a post.
type CreatePostInput struct {
	Body string
}

// NormalizePostBody returns body without its surrounding whitespace, or an
// EINVALID error if what is left cannot be stored: empty, longer than
// MaxPostLen code points, not valid UTF-8, or with control characters other
// than newline and tab.
func NormalizePostBody(body string) (string, error) {
	if !utf8.ValidString(body) {
		return "", Errorf(EINVALID, "Post must be valid UTF-8.")
	}
	body = strings.TrimSpace(body)
	if body == "" {
		return "", Errorf(EINVALID, "Post must not be empty.")
	}
	if n := utf8.RuneCountInString(body); n > MaxPostLen {
		return "", Errorf(EINVALID, "Post must be at most %d characters long; this one has %d.", MaxPostLen, n)
	}
	for _, r := range body {
		if r != '\n' && r != '\t' && isControl(r) {
			return "", Errorf(EINVALID, "Post must not contain control characters other than newline and tab.")
		}
	}
	return body, nil
}

// isControl reports whether r is a control character (Unicode category Cc),
// a line or paragraph separator, or one of the bidirectional embedding,
// override and isolate controls, which can make text read in another order
// than it is stored. Marks that right-to-left scripts need (U+200E, U+200F)
// and joiners that emoji sequences need (U+200C, U+200D) are allowed.
func isControl(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' ||
		r >= '\u202a' && r <= '\u202e' || r >= '\u2066' && r <= '\u2069'
}

// CreatePostPayload is the answer to createPost.
type CreatePostPayload struct {
	Post *Post
}

// DeletePostInput names the post to delete.
type DeletePostInput struct {
	PostID string
}

// DeletePostPayload is the answer to deletePost.
type DeletePostPayload struct {
	PostID string
}

// PostService manages posts and the timelines they appear in.
type PostService interface {
	// CreatePost stores a post by authorID, its body normalized by
	// NormalizePostBody (EINVALID if it cannot be stored), puts it on the
	// author's timelines at once (read-your-writes) and delivers it to the
	// global timeline and the followers' home timelines.
	CreatePost(ctx context.Context, authorID, body string) (*Post, error)

	// DeletePost deletes a post of authorID's from every timeline. It is
	// ENOTFOUND for an unknown or deleted post and EFORBIDDEN for a post
	// by someone else.
	DeletePost(ctx context.Context, authorID, postID string) error

	// FindPostByID returns a post with its author, or ENOTFOUND.
	FindPostByID(ctx context.Context, id string) (*Post, error)

	// FindPostsByIDs returns posts with their authors in one batch, in the
	// order of ids; an id with no post has a nil entry.
	FindPostsByIDs(ctx context.Context, ids []string) ([]*Post, error)

	// FindTimeline returns a page of a feed, newest first, with authors.
	FindTimeline(ctx context.Context, feed Feed, page PageArgs) (*Timeline, error)
}
