package graph

import (
	"fmt"
	"time"

	"github.com/99designs/gqlgen/graphql"
)

// timeLayout is RFC 3339 with exactly three fractional digits, so that every
// time Warble sends has the same shape: 2026-11-22T07:03:01.120Z.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// MarshalTime writes the Time scalar: RFC 3339 in UTC, millisecond precision
// (see plainTime).
func MarshalTime(t time.Time) graphql.Marshaler {
	return plainTime{&t}
}

// UnmarshalTime reads the Time scalar from any RFC 3339 string.
func UnmarshalTime(v any) (time.Time, error) {
	s, ok := v.(string)
	if !ok {
		return time.Time{}, fmt.Errorf("time must be an RFC 3339 string")
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("time must be an RFC 3339 string")
	}
	return t.UTC(), nil
}
