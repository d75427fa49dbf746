package graph

import "github.com/warble/warble/internal/warble"

// complexity gives list fields a cost in proportion to the page they ask
// for, so that the complexity limit bounds the work an operation can cause:
// a nested list multiplies, and followers(first: 100) of each of 100 posts'
// authors is priced as the 10,000 users it would read. Other fields cost 1.
func complexity() ComplexityRoot {
	var c ComplexityRoot
	page := func(child int, first *int, def int) int {
		n := def
		if first != nil && *first > 0 {
			n = min(*first, warble.MaxPageSize) // larger pages are refused anyway
		}
		return 1 + n*child
	}
	timeline := func(child int, first *int, _ *string) int { return page(child, first, warble.DefaultPageSize) }
	users := timeline

	c.Query.HomeTimeline = timeline
	c.Query.GlobalTimeline = timeline
	c.Query.NewestUsers = func(child int, first *int) int { return page(child, first, warble.DefaultNewestUsers) }
	c.User.Posts = timeline
	c.User.Followers = users
	c.User.Following = users
	c.User.CommonFollowers = users
	c.User.CommonFollowing = users
	c.User.FollowersYouFollow = users
	return c
}
