package graph

import (
	"context"
	"sync"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vikstrous/dataloadgen"

	"github.com/warble/warble/internal/warble"
)

// DefaultLoaderWait is how long a loader collects keys before it fetches
// them in one batch. The fields it serves are resolved concurrently, all at
// once, so a short window catches them and adds little to a request.
const DefaultLoaderWait = 2 * time.Millisecond

// loaders batch the reads that fields of many objects make one by one (an
// author per post, a follow state per user in a list) into one round trip
// each. A fresh set serves each response: each HTTP request and each
// subscription event, so nothing read for one is served stale to another.
type loaders struct {
	users        *dataloadgen.Loader[string, *warble.User]
	posts        *dataloadgen.Loader[string, *warble.Post]
	followStates *dataloadgen.Loader[string, warble.FollowState] // by user id, for the viewer
	counts       *dataloadgen.Loader[string, warble.UserCounts]
}

type loadersKey struct{}

// lazyLoaders makes the loaders of a response when a field first asks for
// one: most responses load nothing ({ __typename }, the viewer, a page
// whose posts came with their authors), and a set of loaders costs a
// dozen allocations.
//
// The viewer whose follow states a set reads is looked up then too, from
// the context of the field that asks: a lookup walks the response's
// chain of context values, which is long on a subscription, and most of
// a subscription's events are written from a payload marshalled once for
// all their subscribers (sharedTimelineEvent), which asks for no loader.
type lazyLoaders struct {
	once    sync.Once
	r       *Resolver
	wait    time.Duration
	loaders *loaders
}

// withLoaders is response middleware that gives each response its loaders.
func (r *Resolver) withLoaders(wait time.Duration) graphql.ResponseMiddleware {
	return func(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
		lazy := &lazyLoaders{r: r, wait: wait}
		return next(context.WithValue(ctx, loadersKey{}, lazy))
	}
}

func (r *Resolver) newLoaders(viewerID string, wait time.Duration) *loaders {
	opt := dataloadgen.WithWait(wait)
	return &loaders{
		users: dataloadgen.NewLoader(func(ctx context.Context, ids []string) ([]*warble.User, []error) {
			users, err := r.Users.FindUsersByIDs(ctx, ids)
			return users, spread(err, len(ids))
		}, opt),
		posts: dataloadgen.NewLoader(func(ctx context.Context, ids []string) ([]*warble.Post, []error) {
			posts, err := r.Posts.FindPostsByIDs(ctx, ids)
			return posts, spread(err, len(ids))
		}, opt),
		followStates: dataloadgen.NewLoader(func(ctx context.Context, ids []string) ([]warble.FollowState, []error) {
			states, err := r.Follows.FindFollowStates(ctx, viewerID, ids)
			return states, spread(err, len(ids))
		}, opt),
		counts: dataloadgen.NewLoader(func(ctx context.Context, ids []string) ([]warble.UserCounts, []error) {
			counts, err := r.Users.FindUserCounts(ctx, ids)
			return counts, spread(err, len(ids))
		}, opt),
	}
}

// spread gives a batch's error to each of its n keys, or nil for none.
func spread(err error, n int) []error {
	if err == nil {
		return nil
	}
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// loadersFrom returns the loaders of the response ctx belongs to, or nil
// outside a response.
func loadersFrom(ctx context.Context) *loaders {
	lazy, _ := ctx.Value(loadersKey{}).(*lazyLoaders)
	if lazy == nil {
		return nil
	}
	lazy.once.Do(func() { lazy.loaders = lazy.r.newLoaders(warble.UserIDFromContext(ctx), lazy.wait) })
	return lazy.loaders
}

// loadUser reads a user through the response's loader, or ENOTFOUND.
func (r *Resolver) loadUser(ctx context.Context, id string) (*warble.User, error) {
	l := loadersFrom(ctx)
	if l == nil {
		return r.Users.FindUserByID(ctx, id)
	}
	u, err := l.users.Load(ctx, id)
	if err == nil && u == nil {
		err = warble.Errorf(warble.ENOTFOUND, "User not found.")
	}
	return u, err
}

// loadPost reads a post through the response's loader, or ENOTFOUND.
func (r *Resolver) loadPost(ctx context.Context, id string) (*warble.Post, error) {
	l := loadersFrom(ctx)
	if l == nil {
		return r.Posts.FindPostByID(ctx, id)
	}
	p, err := l.posts.Load(ctx, id)
	if err == nil && p == nil {
		err = warble.Errorf(warble.ENOTFOUND, "Post not found.")
	}
	return p, err
}

// followState reads how the viewer and user follow each other; the zero
// state when signed out or for the viewer themself.
func (r *Resolver) followState(ctx context.Context, user *warble.User) (warble.FollowState, error) {
	viewerID := warble.UserIDFromContext(ctx)
	if viewerID == "" || viewerID == user.ID {
		return warble.FollowState{}, nil
	}
	if l := loadersFrom(ctx); l != nil {
		return l.followStates.Load(ctx, user.ID)
	}
	states, err := r.Follows.FindFollowStates(ctx, viewerID, []string{user.ID})
	if err != nil {
		return warble.FollowState{}, err
	}
	return states[0], nil
}

// userCounts reads a user's counts through the response's loader, so that
// the counts of every user in a response, and the three counts of one
// user, are one round trip.
func (r *Resolver) userCounts(ctx context.Context, userID string) (warble.UserCounts, error) {
	if l := loadersFrom(ctx); l != nil {
		return l.counts.Load(ctx, userID)
	}
	counts, err := r.Users.FindUserCounts(ctx, []string{userID})
	if err != nil {
		return warble.UserCounts{}, err
	}
	return counts[0], nil
}
