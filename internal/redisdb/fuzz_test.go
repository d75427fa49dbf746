package redisdb

// FuzzCommonCursor checks the cursors of commonFollowers, commonFollowing
// and followersYouFollow. It needs no Redis. Its seeds, here and under
// testdata/fuzz/FuzzCommonCursor/, run as ordinary tests in go test.

import (
	"encoding/base64"
	"math"
	"strings"
	"testing"

	"github.com/warble/warble/internal/warble"
)

func FuzzCommonCursor(f *testing.F) {
	enc := func(raw string) string { return base64.RawURLEncoding.EncodeToString([]byte(raw)) }
	for _, s := range []struct {
		cursor string
		side   byte
		at     int64
		member string
	}{
		{"", sideUser, 0, "1"},
		{formatCommonCursor(sideUser, 1_700_000_000_000, "42"), sideUser, 1_700_000_000_000, "42"},
		{formatCommonCursor(sideViewer, math.MaxInt64, "999999999999999999"), sideViewer, math.MaxInt64, "999999999999999999"},
		{formatCommonCursor(sideUser, -1, "1"), sideUser, -1, "1"},
		{formatCommonCursor('x', 1, "1"), 'x', 1, "1"},
		{enc("cu01:1"), sideUser, 1, "1"},
		{enc("cu+1:1"), sideUser, 1, "1"},
		{enc("cu1:01"), sideUser, 1, "01"},
		{enc("cu1:1:1"), sideUser, 1, "1:1"},
		{enc("cv:1"), sideViewer, 0, ""},
		{enc("c"), 0, 0, ""},
		{enc("cu"), sideUser, 0, ""},
		{enc("cx1:1"), 'x', 1, "1"},
		{enc("f1:1"), sideUser, 1, "1"},            // a follow cursor
		{enc("p1"), sideUser, 1, "1"},              // a post cursor
		{enc("cu1:1") + "\n", sideUser, 1, "1"},    // a newline the decoder skips
		{enc("cu1:1") + "==", sideUser, 1, "1"},    // padding
		{strings.Repeat("Y3UxOjE", 10), 0, 0, "1"}, // over the length limit
		{"Y3UxOjF", sideUser, 1, "1"},              // cu1:1 with non-zero trailing bits
		{"Y3UxOjE+", sideUser, 1, "1"},             // the standard alphabet
		{enc("cu1:1\x00"), sideUser, 1, "1\x00"},   //
		{enc("cu\xff1:1"), sideUser, 1, "1"},       //
		{enc("cv1:" + strings.Repeat("9", 18)), sideViewer, 1, strings.Repeat("9", 19)},
	} {
		f.Add(s.cursor, s.side, s.at, s.member)
	}
	f.Fuzz(func(t *testing.T, cursor string, side byte, at int64, member string) {
		// Every cursor findCommon makes parses back to its position.
		c := formatCommonCursor(side, at, member)
		gotSide, pos, err := parseCommonCursor(c)
		valid := (side == sideUser || side == sideViewer) && at >= 0 && warble.ValidUserID(member)
		switch {
		case valid && (err != nil || gotSide != side || pos != followPos{at: at, member: member, set: true}):
			t.Fatalf("parseCommonCursor(formatCommonCursor(%q, %d, %q) = %q) = %q, %+v, %v", side, at, member, c, gotSide, pos, err)
		case !valid && err == nil:
			t.Fatalf("parseCommonCursor(formatCommonCursor(%q, %d, %q) = %q) accepted a position no follow set has", side, at, member, c)
		case valid && len(c) > 64:
			t.Fatalf("formatCommonCursor(%q, %d, %q) = %q is longer than the parser takes", side, at, member, c)
		}

		// Any string is refused as EINVALID, or names a position that
		// formats to a cursor naming the same position.
		gotSide, pos, err = parseCommonCursor(cursor)
		if err != nil {
			if code := warble.ErrorCode(err); code != warble.EINVALID {
				t.Fatalf("parseCommonCursor(%q): code %q, want %q", cursor, code, warble.EINVALID)
			}
			if gotSide != 0 || pos != (followPos{}) {
				t.Fatalf("parseCommonCursor(%q) failed but returned %q, %+v", cursor, gotSide, pos)
			}
			return
		}
		if gotSide != sideUser && gotSide != sideViewer || pos.at < 0 || !warble.ValidUserID(pos.member) || !pos.set {
			t.Fatalf("parseCommonCursor(%q) = %q, %+v: not a position", cursor, gotSide, pos)
		}
		again := formatCommonCursor(gotSide, pos.at, pos.member)
		side2, pos2, err := parseCommonCursor(again)
		if err != nil || side2 != gotSide || pos2 != pos {
			t.Fatalf("parseCommonCursor(%q) = %q, %+v, but its cursor %q parses to %q, %+v, %v", cursor, gotSide, pos, again, side2, pos2, err)
		}
		if again != cursor {
			t.Fatalf("parseCommonCursor(%q) = %q, %+v, which formats as %q: two cursors for one position", cursor, gotSide, pos, again)
		}
		if _, err := warble.ParsePostCursor(cursor); err == nil {
			t.Fatalf("%q parses both as a common cursor and as a post cursor", cursor)
		}
		if _, _, err := warble.ParseFollowCursor(cursor); err == nil {
			t.Fatalf("%q parses both as a common cursor and as a follow cursor", cursor)
		}
	})
}
