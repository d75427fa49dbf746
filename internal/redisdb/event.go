package redisdb

import (
	"strconv"
	"strings"
)

// Messages on the timeline channels (homeChannel, userChannel, globalChannel)
// are one line of text, published only after the sorted set they announce
// has changed:
//
//	A <seq> <post id>   a post was added at position seq
//	R <seq> <post id>   a post was removed from position seq
//	S <seq>             the timeline was rewritten (a follow or unfollow);
//	                    seq is its newest position afterwards, 0 when empty
//
// Messages on revokedChannel are the hash of a revoked session token.
const (
	opAdded   = 'A'
	opRemoved = 'R'
	opResync  = 'S'
)

// channelEvent is a decoded timeline channel message.
type channelEvent struct {
	op     byte
	seq    int64
	postID string
}

func encodeAdded(seq int64, postID string) string {
	return "A " + strconv.FormatInt(seq, 10) + " " + postID
}

func encodeRemoved(seq int64, postID string) string {
	return "R " + strconv.FormatInt(seq, 10) + " " + postID
}

func encodeResync(seq int64) string { return "S " + strconv.FormatInt(seq, 10) }

// decodeEvent parses a timeline channel message; ok is false for anything
// malformed, which subscribers ignore.
func decodeEvent(msg string) (ev channelEvent, ok bool) {
	fields := strings.Fields(msg)
	if len(fields) < 2 || len(fields[0]) != 1 {
		return ev, false
	}
	seq, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil || seq < 0 {
		return ev, false
	}
	ev = channelEvent{op: fields[0][0], seq: seq}
	switch {
	case ev.op == opResync && len(fields) == 2:
		return ev, true
	case (ev.op == opAdded || ev.op == opRemoved) && len(fields) == 3:
		ev.postID = fields[2]
		return ev, true
	}
	return channelEvent{}, false
}
