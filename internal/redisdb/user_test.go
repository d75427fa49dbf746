package redisdb

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/warble/warble/internal/warble"
)

func TestFindUserByID(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	users := NewUserService(db)
	ada := mustSignup(t, db, "Ada")
	tests := []struct {
		name     string
		id       string
		wantCode string
	}{
		{name: "OK", id: ada.ID},
		{name: "Unknown", id: "987654", wantCode: warble.ENOTFOUND},
		{name: "Empty", id: "", wantCode: warble.ENOTFOUND},
		{name: "Letters", id: "abc", wantCode: warble.ENOTFOUND},
		{name: "LeadingZero", id: "0" + ada.ID, wantCode: warble.ENOTFOUND},
		{name: "PostID", id: ada.ID + ":1", wantCode: warble.ENOTFOUND},
		{name: "KeyPattern", id: "*", wantCode: warble.ENOTFOUND},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := users.FindUserByID(ctx, tt.id)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("FindUserByID(%q) code = %q, want %q (err %v)", tt.id, got, tt.wantCode, err)
			}
			if tt.wantCode == "" && (u.ID != ada.ID || u.Username != "Ada" || u.DisplayName != "Ada" || !u.CreatedAt.Equal(ada.CreatedAt)) {
				t.Errorf("FindUserByID(%q) = %+v, want %+v", tt.id, u, ada)
			}
		})
	}
}

func TestFindUserByUsername(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	users := NewUserService(db)
	ada := mustSignup(t, db, "Ada_L")
	tests := []struct {
		name     string
		username string
		wantCode string
	}{
		{name: "AsTyped", username: "Ada_L"},
		{name: "Lower", username: "ada_l"},
		{name: "Upper", username: "ADA_L"},
		{name: "Unknown", username: "bob", wantCode: warble.ENOTFOUND},
		{name: "Prefix", username: "Ada", wantCode: warble.ENOTFOUND},
		{name: "Empty", username: "", wantCode: warble.ENOTFOUND},
		{name: "Malformed", username: "ada l", wantCode: warble.ENOTFOUND},
		{name: "KeyPattern", username: "Ada_*", wantCode: warble.ENOTFOUND},
		{name: "TooLong", username: "Ada_L_" + strings.Repeat("x", 20), wantCode: warble.ENOTFOUND},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := users.FindUserByUsername(ctx, tt.username)
			if got := warble.ErrorCode(err); got != tt.wantCode {
				t.Fatalf("FindUserByUsername(%q) code = %q, want %q (err %v)", tt.username, got, tt.wantCode, err)
			}
			if tt.wantCode == "" && (u.ID != ada.ID || u.Username != "Ada_L") {
				t.Errorf("FindUserByUsername(%q) = %+v, want %+v (username as typed)", tt.username, u, ada)
			}
		})
	}
}

func TestFindUsersByIDs(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	users := NewUserService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	cal := mustSignup(t, db, "cal")
	tests := []struct {
		name string
		ids  []string
		want []string // usernames, "" for a nil entry
	}{
		{name: "None", ids: nil, want: nil},
		{name: "InOrder", ids: []string{ada.ID, bob.ID, cal.ID}, want: []string{"ada", "bob", "cal"}},
		{name: "OrderKept", ids: []string{cal.ID, ada.ID, bob.ID}, want: []string{"cal", "ada", "bob"}},
		{name: "Repeats", ids: []string{bob.ID, bob.ID}, want: []string{"bob", "bob"}},
		{name: "Missing", ids: []string{ada.ID, "987654", cal.ID}, want: []string{"ada", "", "cal"}},
		{name: "Malformed", ids: []string{"x", bob.ID, ""}, want: []string{"", "bob", ""}},
		{name: "AllMissing", ids: []string{"987654", "abc"}, want: []string{"", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := users.FindUsersByIDs(ctx, tt.ids)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("FindUsersByIDs(%q) returned %d users, want %d", tt.ids, len(got), len(tt.want))
			}
			for i, u := range got {
				name := ""
				if u != nil {
					name = u.Username
				}
				if name != tt.want[i] {
					t.Errorf("FindUsersByIDs(%q)[%d] = %q, want %q", tt.ids, i, name, tt.want[i])
				}
			}
		})
	}
}

func TestNewestUsers(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	users := NewUserService(db)
	var names []string
	for i := range 12 { // ids 1 to 12: the newest, 10 to 12, sort first by number, not by bytes
		names = append(names, mustSignup(t, db, fmt.Sprintf("user%d", i)).Username)
	}
	tests := []struct {
		name string
		n    int
		want []string
	}{
		{name: "One", n: 1, want: []string{"user11"}},
		{name: "Four", n: 4, want: []string{"user11", "user10", "user9", "user8"}},
		{name: "All", n: 12, want: reversed(names)},
		{name: "MoreThanThere", n: 100, want: reversed(names)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := users.NewestUsers(ctx, tt.n)
			if err != nil {
				t.Fatal(err)
			}
			var gotNames []string
			for _, u := range got {
				gotNames = append(gotNames, u.Username)
			}
			if fmt.Sprint(gotNames) != fmt.Sprint(tt.want) {
				t.Errorf("NewestUsers(%d) = %v, want %v", tt.n, gotNames, tt.want)
			}
		})
	}
}

func reversed(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// TestUserCounts checks that the counts of users are the sizes of the sets
// they count, read in one batch, with zeros for ids of no user.
func TestUserCounts(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t, Options{})
	users := NewUserService(db)
	ada := mustSignup(t, db, "ada")
	bob := mustSignup(t, db, "bob")
	cal := mustSignup(t, db, "cal")
	mustFollow(t, db, bob.ID, ada.ID)
	mustFollow(t, db, cal.ID, ada.ID)
	mustFollow(t, db, ada.ID, cal.ID)
	for range 3 {
		addPost(t, db, ada.ID)
	}
	addPost(t, db, cal.ID)

	ids := []string{ada.ID, bob.ID, cal.ID, "999", "not an id"}
	got, err := users.FindUserCounts(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	want := []warble.UserCounts{
		{Followers: 2, Following: 1, Posts: 3},
		{Followers: 0, Following: 1, Posts: 0},
		{Followers: 1, Following: 1, Posts: 1},
		{}, {},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("FindUserCounts(%q) = %+v, want %+v", ids, got, want)
	}
	for i, id := range ids[:3] {
		if int64(got[i].Followers) != db.client.ZCard(ctx, followersKey(id)).Val() ||
			int64(got[i].Following) != db.client.ZCard(ctx, followingKey(id)).Val() ||
			int64(got[i].Posts) != db.client.ZCard(ctx, postsKey(id)).Val() {
			t.Errorf("counts of %s differ from the sizes of the sets", id)
		}
	}
}
