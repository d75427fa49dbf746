package warble

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Page sizes.
const (
	DefaultPageSize    = 20
	MaxPageSize        = 100
	DefaultNewestUsers = 10 // newestUsers has a smaller default page
)

// FeedKind says which timeline a Feed is.
type FeedKind int

// The timelines.
const (
	FeedHome   FeedKind = iota + 1 // a user's own posts and those of whom they follow
	FeedUser                       // a user's own posts
	FeedGlobal                     // everyone's latest posts
)

// Feed names one timeline.
type Feed struct {
	Kind   FeedKind
	UserID string // the owner; empty for FeedGlobal
}

// HomeFeed is the home timeline of userID.
func HomeFeed(userID string) Feed { return Feed{Kind: FeedHome, UserID: userID} }

// UserFeed is the timeline of userID's own posts.
func UserFeed(userID string) Feed { return Feed{Kind: FeedUser, UserID: userID} }

// GlobalFeed is everyone's latest posts.
func GlobalFeed() Feed { return Feed{Kind: FeedGlobal} }

// String names the feed in logs and errors.
func (f Feed) String() string {
	switch f.Kind {
	case FeedHome:
		return "home timeline of " + f.UserID
	case FeedUser:
		return "posts of " + f.UserID
	case FeedGlobal:
		return "global timeline"
	}
	return "unknown feed"
}

// PageArgs asks for a page of a list: First items after the cursor After.
type PageArgs struct {
	First int
	After *string
}

// Validate returns an EINVALID error unless First is in 1..max.
func (p PageArgs) Validate(max int) error {
	if p.First < 1 || p.First > max {
		return Errorf(EINVALID, "first must be between 1 and %d.", max)
	}
	return nil
}

// PageInfo tells whether a list goes on after a page and where.
type PageInfo struct {
	HasNextPage bool
	EndCursor   *string
}

// Timeline is a page of posts, newest first.
type Timeline struct {
	Edges    []*PostEdge
	PageInfo PageInfo
}

// PostEdge is one post in a timeline page and its position there.
type PostEdge struct {
	Cursor string
	Node   *Post
}

// Cursors are opaque to clients. Inside they are a kind letter and the
// numbers of a keyset position, base64url-encoded so that nobody is tempted
// to build them by hand.
const (
	cursorPost   = "p" // a post seq
	cursorFollow = "f" // a follow time and the user id, for ties
)

// PostCursor returns the cursor of the post with the given seq.
func PostCursor(seq int64) string {
	return encodeCursor(cursorPost + strconv.FormatInt(seq, 10))
}

// AppendPostCursor appends PostCursor(seq) to dst without allocating
// more than dst's growth: a page encodes its cursors into one buffer, where
// one string at a time cost three allocations per post.
func AppendPostCursor(dst []byte, seq int64) []byte {
	var raw [1 + 20]byte // the kind letter and the longest int64
	return base64.RawURLEncoding.AppendEncode(dst, strconv.AppendInt(append(raw[:0], cursorPost...), seq, 10))
}

// ParsePostCursor returns the seq a post cursor encodes, or EINVALID.
func ParsePostCursor(cursor string) (int64, error) {
	raw, ok := decodeCursor(cursor, cursorPost)
	if !ok {
		return 0, errBadCursor
	}
	seq, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || seq < 0 || strconv.FormatInt(seq, 10) != raw {
		return 0, errBadCursor
	}
	return seq, nil
}

// FollowCursor returns the cursor of a follow made at t by userID.
func FollowCursor(t time.Time, userID string) string {
	return encodeCursor(fmt.Sprintf("%s%d:%s", cursorFollow, t.UnixMilli(), userID))
}

// ParseFollowCursor returns the follow time in unix ms and the user id a
// follow cursor encodes, or EINVALID.
func ParseFollowCursor(cursor string) (ms int64, userID string, err error) {
	raw, ok := decodeCursor(cursor, cursorFollow)
	if !ok {
		return 0, "", errBadCursor
	}
	msText, userID, found := strings.Cut(raw, ":")
	ms, perr := strconv.ParseInt(msText, 10, 64)
	if !found || perr != nil || ms < 0 || strconv.FormatInt(ms, 10) != msText || !ValidUserID(userID) {
		return 0, "", errBadCursor
	}
	return ms, userID, nil
}

var errBadCursor = Errorf(EINVALID, "The cursor is not valid.")

func encodeCursor(raw string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(raw))
}

func decodeCursor(cursor, kind string) (string, bool) {
	if len(cursor) > 64 {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	// The decoder skips CR and LF and ignores the unused low bits of the
	// last character, so several strings decode alike. Only the one that
	// encodeCursor makes is a cursor: one position, one cursor.
	if err != nil || encodeCursor(string(b)) != cursor || !strings.HasPrefix(string(b), kind) {
		return "", false
	}
	return string(b[len(kind):]), true
}

// TimelineEventKind says what happened to a timeline.
type TimelineEventKind string

// The kinds of timeline events.
const (
	PostAdded   TimelineEventKind = "POST_ADDED"
	PostRemoved TimelineEventKind = "POST_REMOVED"
	Resync      TimelineEventKind = "RESYNC"
)

// TimelineEvent is one change to a timeline, as live subscribers see it.
type TimelineEvent struct {
	Kind   TimelineEventKind
	Cursor string  // the post's position; for RESYNC the newest position
	PostID *string // nil for RESYNC
	Post   *Post   // set for POST_ADDED only
}

// LiveService streams the changes to timelines.
type LiveService interface {
	// SubscribeTimeline returns the events of feed until ctx ends, when the
	// channel is closed. With after set, it first replays, oldest first,
	// every post newer than after, then goes on live with no gap and no
	// duplicate; if after is older than the feed still holds, it starts
	// with a RESYNC instead. A subscriber that falls behind loses events
	// and receives a RESYNC.
	// A subscriber whose ctx carries an EventReceiver (see
	// NewContextWithEventReceiver) is handed each event instead of waiting
	// for it.
	SubscribeTimeline(ctx context.Context, feed Feed, after *string) (<-chan *TimelineEvent, error)
}

// EventReceiver takes the events of a subscription from the goroutine that
// delivers them, so that the subscriber needs no goroutine of its own
// parked on the channel while the timeline is quiet: with thousands of
// idle websockets, those goroutines and their stacks were most of the
// server's memory. A LiveService that accepts it calls Attached with the
// channel before SubscribeTimeline returns, gives the channel a buffer of
// one, and after each event it sends, and once after it closes the
// channel, calls EventReady: the event (or the close) is then waiting in
// the channel, so that EventReady can receive it without blocking, and
// must, before it returns. EventReady is passed the event it will receive
// (nil for the close), so that it may choose how to write it before it
// takes it. Calls are made one at a time and in order; the next event is
// not sent before EventReady returns. EventReady may come before
// SubscribeTimeline returns.
type EventReceiver interface {
	Attached(events <-chan *TimelineEvent)
	EventReady(ev *TimelineEvent)
}

// NewContextWithEventReceiver returns a copy of ctx whose subscription, if
// any, hands its events to r.
func NewContextWithEventReceiver(ctx context.Context, r EventReceiver) context.Context {
	return context.WithValue(ctx, eventReceiverContextKey, r)
}

// EventReceiverFromContext returns the EventReceiver of ctx, or nil.
func EventReceiverFromContext(ctx context.Context) EventReceiver {
	r, _ := ctx.Value(eventReceiverContextKey).(EventReceiver)
	return r
}
