package redisdb

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/bcrypt"

	"github.com/warble/warble/internal/warble"
)

// Session tokens are "<user id>.<secret>", the secret tokenBytes random
// bytes in base64url without padding. The user id puts the session in its
// user's hash slot (see sessionKey), so that one round trip reads both. Tokens
// made before are the secret alone; they work until they expire.
const (
	tokenBytes = 32
	secretLen  = 43 // base64.RawURLEncoding.EncodedLen(tokenBytes)
)

// usernameClaimTTL bounds how long a username stays taken by a signup that
// died before its user was stored. A finished signup removes the expiry.
const usernameClaimTTL = 60 * time.Second

// Errors that users see from sign-in.
var (
	errWrongLogin     = warble.Errorf(warble.EUNAUTHENTICATED, "Wrong username or password.")
	errSessionExpired = warble.Errorf(warble.EUNAUTHENTICATED, "Your session has expired or was revoked. Please log in again.")
)

// AuthService implements warble.AuthService: bcrypt password hashes and
// random session tokens of which Redis keeps only a SHA-256 hash.
type AuthService struct {
	db    *DB
	reads *sessionReads // Authenticate's reads, batched under load

	// dummyHash is compared against when a login names an unknown user, so
	// that it takes as long as a wrong password and does not reveal which
	// usernames exist. It has the cost of real hashes and is made once, on
	// first use.
	dummyHash func() []byte
}

// NewAuthService returns an AuthService over db.
func NewAuthService(db *DB) *AuthService {
	cost := db.opts.BcryptCost
	return &AuthService{
		db:    db,
		reads: newSessionReads(db.client),
		dummyHash: sync.OnceValue(func() []byte {
			h, err := bcrypt.GenerateFromPassword([]byte("not a password of anyone"), cost)
			if err != nil {
				panic(fmt.Sprintf("redisdb: dummy bcrypt hash: %v", err)) // only a bad cost gets here
			}
			return h
		}),
	}
}

var _ warble.AuthService = (*AuthService)(nil)

// persistClaimScript makes a pending username claim permanent, if it is
// still the claim of the given user: a signup stalled past usernameClaimTTL
// must not take over a name that someone else has claimed since.
//
// KEYS[1] -> w:uname:<username>
// ARGV[1] -> user id that claimed it
//
// Returns 1 if the claim was ours and is now permanent, 0 otherwise.
var persistClaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
	return 0
end
redis.call('PERSIST', KEYS[1])
return 1
`)

// releaseClaimScript gives up a pending username claim, if it is still
// the claim of the given user.
//
// KEYS[1] -> w:uname:<username>
// ARGV[1] -> user id that claimed it
//
// Returns 1 if the claim was deleted, 0 otherwise.
var releaseClaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
	return 0
end
return redis.call('DEL', KEYS[1])
`)

// Signup implements warble.AuthService.
//
// The steps cross hash slots, so they are ordered for crashes: a new id,
// then a claim on the username that expires unless the signup finishes, then
// the user hash, then the claim made permanent, then the newest-users list.
// A crash leaves at most an unused id, a name taken for a minute, or a user
// hash that no username leads to.
func (s *AuthService) Signup(ctx context.Context, in warble.SignupInput) (*warble.AuthPayload, error) {
	ctx = s.db.noteWrites(ctx) // see awaitReplicas
	if err := in.Validate(); err != nil {
		return nil, err
	}
	nameKey := usernameKey(warble.UsernameKey(in.Username))
	taken := func() error { return warble.Errorf(warble.ECONFLICT, "Username %q is taken.", in.Username) }

	// A cheap look first, so that a plainly taken name costs neither a
	// password hash nor a user id. The SET NX below is what decides.
	if n, err := s.db.client.Exists(ctx, nameKey).Result(); err != nil {
		return nil, fmt.Errorf("signup %q: %w", in.Username, err)
	} else if n > 0 {
		return nil, taken()
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(in.Password), s.db.opts.BcryptCost)
	if err != nil {
		return nil, fmt.Errorf("signup %q: hash password: %w", in.Username, err)
	}

	seq, err := s.db.client.Incr(ctx, userSeqKey).Result()
	if err != nil {
		return nil, fmt.Errorf("signup %q: new user id: %w", in.Username, err)
	}
	id := strconv.FormatInt(seq, 10)
	ok, err := s.db.client.SetNX(ctx, nameKey, id, usernameClaimTTL).Result()
	if err != nil {
		return nil, fmt.Errorf("signup %q: claim username: %w", in.Username, err)
	} else if !ok {
		// The client retries a command whose reply timed out, so a
		// SET NX that was applied may answer "exists": the claim is
		// ours if it holds our id.
		holder, err := s.db.client.Get(ctx, nameKey).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("signup %q: claim username: %w", in.Username, err)
		} else if holder != id {
			return nil, taken()
		}
	}

	now := s.db.now()
	err = s.db.client.HSet(ctx, userKey(id),
		"username", in.Username,
		"displayName", *in.DisplayName,
		"createdAt", msString(now),
		"password", string(hash),
	).Err()
	if err != nil {
		// Free the name now rather than in a minute; if this fails too,
		// the claim's expiry frees it.
		_ = releaseClaimScript.Run(ctx, s.db.client, []string{nameKey}, id).Err()
		return nil, fmt.Errorf("signup %q: store user %s: %w", in.Username, id, err)
	}
	owned, err := persistClaimScript.Run(ctx, s.db.client, []string{nameKey}, id).Int()
	if err != nil {
		return nil, fmt.Errorf("signup %q: keep username claim of user %s: %w", in.Username, id, err)
	} else if owned == 0 {
		// The claim expired while this signup stalled, and the name may
		// belong to someone else now. Drop the user no name leads to.
		_ = s.db.client.Del(ctx, userKey(id)).Err()
		return nil, fmt.Errorf("signup %q: username claim of user %s expired before the signup finished", in.Username, id)
	}
	_, err = s.db.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZAdd(ctx, newestUsersKey, redis.Z{Score: float64(seq), Member: id})
		pipe.ZRemRangeByRank(ctx, newestUsersKey, 0, -int64(DefaultNewestCap+1))
		return nil
	})
	if err != nil {
		// The account exists and works; only the newest-users list missed it.
		s.db.log.WarnContext(ctx, "signup: add to newest users", "user", id, "err", err)
	}
	p, err := s.openSession(ctx, id)
	if err != nil {
		return nil, err
	}
	// The account, its name and its first session, on their replicas.
	if err := s.db.awaitReplicas(ctx, userSeqKey, nameKey, userKey(id), newestUsersKey, sessionKeyOf(hashToken(p.Token))); err != nil {
		return nil, err
	}
	return p, nil
}

// Login implements warble.AuthService.
func (s *AuthService) Login(ctx context.Context, in warble.LoginInput) (*warble.AuthPayload, error) {
	var id string
	var hash []byte
	if warble.ValidateUsername(in.Username) == nil {
		var err error
		id, hash, err = s.findPassword(ctx, in.Username)
		if err != nil {
			return nil, err
		}
	}
	if hash == nil {
		// Unknown user: spend the time a real comparison takes, then fail
		// the same way a wrong password does.
		_ = bcrypt.CompareHashAndPassword(s.dummyHash(), []byte(in.Password))
		return nil, errWrongLogin
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(in.Password)) != nil {
		return nil, errWrongLogin
	}
	return s.openSession(ctx, id)
}

// findPassword returns the id and password hash of the user with a username,
// or a nil hash when there is no such user.
func (s *AuthService) findPassword(ctx context.Context, username string) (id string, hash []byte, err error) {
	id, err = s.db.client.Get(ctx, usernameKey(warble.UsernameKey(username))).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil, nil
	} else if err != nil {
		return "", nil, fmt.Errorf("login %q: %w", username, err)
	}
	h, err := s.db.client.HGet(ctx, userKey(id), "password").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil, nil // a claim whose signup has not finished
	} else if err != nil {
		return "", nil, fmt.Errorf("login %q: read user %s: %w", username, id, err)
	}
	return id, []byte(h), nil
}

// openSession creates a session for userID and returns its token with the user.
func (s *AuthService) openSession(ctx context.Context, userID string) (*warble.AuthPayload, error) {
	token, err := s.createSession(ctx, userID)
	if err != nil {
		return nil, err
	}
	s.seen(ctx, userID)
	u, err := s.db.findUser(ctx, userID)
	if err != nil {
		return nil, err
	}
	return &warble.AuthPayload{Token: token, User: u}, nil
}

// createSession stores a new session of userID and returns its token. Only
// the token's hash reaches Redis. The session, its expiry and its entry in
// the user's session index are in the user's hash slot, written in one
// MULTI.
func (s *AuthService) createSession(ctx context.Context, userID string) (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("new session of %s: %w", userID, err)
	}
	token := userID + "." + base64.RawURLEncoding.EncodeToString(b)
	tokenHash := hashToken(token)
	key := sessionKeyOf(tokenHash)
	var indexed *redis.IntCmd
	_, err := s.db.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.HSet(ctx, key, "userID", userID, "createdAt", msString(s.db.now()))
		pipe.PExpire(ctx, key, s.db.opts.SessionTTL)
		pipe.SAdd(ctx, sessionsKey(userID), tokenHash)
		indexed = pipe.SCard(ctx, sessionsKey(userID))
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("new session of %s: %w", userID, err)
	}
	if indexed.Val() > pruneSessionsAbove {
		s.pruneSessions(ctx, userID)
	}
	return token, nil
}

// useSessionScript reads a session and slides its expiry, but writes only
// when the expiry has not moved for a while (slack), so that most requests
// cost a read alone. It serves tokens of the old form, whose session is not
// in its user's slot (see Authenticate).
//
// KEYS[1] -> w:session:<hash>
// ARGV[1] -> the session lifetime, ms
// ARGV[2] -> slack, ms: how stale the expiry may get before it is moved
//
// Returns {user id, ms left}, or nil when there is no such session.
var useSessionScript = redis.NewScript(`
local user = redis.call('HGET', KEYS[1], 'userID')
if not user then
	return nil
end
local left = redis.call('PTTL', KEYS[1])
local ttl = tonumber(ARGV[1])
if left >= 0 and left < ttl - tonumber(ARGV[2]) then
	redis.call('PEXPIRE', KEYS[1], ttl)
	left = ttl
end
return {user, left}
`)

// pruneSessionsAbove is how many entries a user's session index may hold
// before a new session prunes the entries of expired sessions.
const pruneSessionsAbove = 32

// pruneSessions drops the index entries of sessions that have expired, once
// the index has grown past pruneSessionsAbove, so that it stays small for a
// user who logs in often and never out. It is tidying: errors are logged.
func (s *AuthService) pruneSessions(ctx context.Context, userID string) {
	key := sessionsKey(userID)
	hashes, err := s.db.client.SMembers(ctx, key).Result()
	if err != nil || len(hashes) <= pruneSessionsAbove {
		return
	}
	pipe := s.db.client.Pipeline()
	exists := make([]*redis.IntCmd, len(hashes))
	for i, h := range hashes {
		exists[i] = pipe.Exists(ctx, sessionKeyOf(h))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		s.db.log.WarnContext(ctx, "prune session index", "user", userID, "err", err)
		return
	}
	var gone []any
	for i, e := range exists {
		if e.Val() == 0 {
			gone = append(gone, hashes[i])
		}
	}
	if len(gone) > 0 {
		if err := s.db.client.SRem(ctx, key, gone...).Err(); err != nil {
			s.db.log.WarnContext(ctx, "prune session index", "user", userID, "err", err)
		}
	}
}

// Authenticate implements warble.AuthService (see authenticate).
func (s *AuthService) Authenticate(ctx context.Context, token string) (*warble.User, *warble.Session, error) {
	u, sess, _, _, err := s.authenticate(ctx, token, nil, false)
	return u, sess, err
}

// AuthenticateForHome implements warble.AuthService. A signed-in home page
// took three round trips one after the other: the session, the range read
// of the home timeline, and the posts with their authors. The token names
// its user, and the session, the user and the home timeline are all in the
// user's slot (one master of a cluster), so the range read that
// FindTimeline would make first goes in the session's pipeline, and its
// ids in the returned context (homeAhead), which FindTimeline takes in its
// place: two round trips.
//
// The ids are read before the session is known to be good, and kept only
// once it is: a wrong token sends the same commands as a right one for the
// same query, and its ids are dropped unread. They are dropped too when
// this request records the user's visit (see seen), which may rebuild a
// returning user's home timeline after the range was read; that costs the
// read again once per user per seenEvery in each process.
func (s *AuthService) AuthenticateForHome(ctx context.Context, token string, page warble.PageArgs) (context.Context, *warble.User, *warble.Session, error) {
	var args *redis.ZRangeArgs
	if userID, ok := parseToken(token); ok && userID != "" {
		if a, ok := homeFirstRead(userID, page); ok {
			args = &a
		}
	}
	u, sess, ahead, _, err := s.authenticate(ctx, token, args, false)
	if err != nil {
		return ctx, nil, nil, err
	}
	if ahead != nil {
		ctx = context.WithValue(ctx, homeAheadKey{}, ahead)
	}
	return ctx, u, sess, nil
}

// AuthenticateForPost implements warble.AuthService. A signed-in
// createPost took three round trips one after the other: the session, the
// post's seq (INCR), and the atomic step that stores the post. On one
// Redis, where a script may declare keys of any slot, the seq is taken in
// the session's pipeline, by reserveSeqScript, which takes it only if the
// session and its user are there: a wrong token sends the same commands
// as a right one and writes nothing. The seq is in the returned context
// (seqAhead), for CreatePost to take in place of its INCR: two round trips.
// On a Redis Cluster, where the seq is in a slot of its own, this is
// Authenticate.
//
// A reserved seq that no post takes (the post's rate limit, taken after
// the session, refuses it; the request fails after its authentication; its
// client goes away) is a gap in the seqs, as a post whose atomic step fails
// leaves one, and nothing else is written for it. The graph layer asks for
// it only for a createPost whose body is valid, so that a refused body
// leaves none.
func (s *AuthService) AuthenticateForPost(ctx context.Context, token string) (context.Context, *warble.User, *warble.Session, error) {
	u, sess, _, seq, err := s.authenticate(ctx, token, nil, !s.db.chainedPosts)
	if err != nil {
		return ctx, nil, nil, err
	}
	if seq > 0 {
		ctx = context.WithValue(ctx, seqAheadKey{}, &seqAhead{userID: u.ID, seq: seq})
	}
	return ctx, u, sess, nil
}

// authenticate is Authenticate, and with home set, the range read of the
// user's home timeline with those arguments in the same round trip: its
// ids are returned when the session is good, the read answered, and the
// timeline cannot have been rebuilt since (nil otherwise). With reserve, a
// post seq is taken in the same round trip if the session is good
// (reserveSeqScript), and returned (0 otherwise).
//
// The session's expiry slides with use; it is written at most once per
// sessionSlack, in a second round trip, so that most requests cost one
// pipeline of two reads in the user's slot: the session's time to live and
// the user's fields. The user comes without counts, which most requests do
// not ask for (see FindUserCounts). A plain pipeline costs Redis about 40%
// less CPU than a script that does the same (BenchmarkRequests: 6.5 against
// 10.8 µs per request). Requests that arrive while such a pipeline is on
// its way share the next one (see sessionReads).
//
// A wrong token sends the same commands as a right one, whether or not the
// user it names exists, and gets the same answer: the session is looked up
// by the hash of the whole token, so no secret is compared byte by byte,
// and nothing is cut short when the user is unknown.
func (s *AuthService) authenticate(ctx context.Context, token string, home *redis.ZRangeArgs, reserve bool) (*warble.User, *warble.Session, *homeAhead, int64, error) {
	userID, ok := parseToken(token)
	if !ok {
		return nil, nil, nil, 0, errSessionExpired
	} else if userID == "" {
		u, sess, err := s.authenticateLegacy(ctx, token)
		return u, sess, nil, 0, err
	}
	tokenHash := hashToken(token)
	key := sessionKeyOf(tokenHash)
	uKey := userKey(userID)
	r := newSessionRead(ctx, key, uKey)
	r.homeArgs = home
	if reserve && s.loadReserveSeq(ctx, false) {
		r.seq = redis.NewCmd(ctx, "evalsha", reserveSeqScript.Hash(), 3, key, uKey, postSeqKey)
	}
	err := s.reads.read(ctx, uKey, r)
	if err == nil {
		err = r.left.Err()
	}
	if err == nil {
		err = r.fields.Err()
	}
	if err != nil {
		return nil, nil, nil, 0, fmt.Errorf("authenticate: %w", err)
	}
	left := r.left
	if left.Val() < 0 { // -2: no such session; -1 cannot happen, sessions always expire
		return nil, nil, nil, 0, errSessionExpired
	}
	vals := r.fields.Val()
	username, _ := vals[0].(string)
	if username == "" {
		return nil, nil, nil, 0, errSessionExpired // a session of a user who is gone
	}
	expiresIn := left.Val()
	if ttl := s.db.opts.SessionTTL; expiresIn < ttl-sessionSlack(ttl) {
		// PEXPIRE of a session revoked meanwhile does nothing.
		if err := s.db.client.PExpire(ctx, key, ttl).Err(); err != nil {
			return nil, nil, nil, 0, fmt.Errorf("authenticate: %w", err)
		}
		expiresIn = ttl
	}
	// Recording the visit may rebuild a returning user's home timeline
	// after it was read: then FindTimeline reads it again.
	recorded := s.seen(ctx, userID)
	var ahead *homeAhead
	if !recorded && r.home != nil && r.home.Err() == nil && r.homeCard.Err() == nil {
		ahead = &homeAhead{args: *home, ids: r.home.Val(), card: r.homeCard.Val()}
		if ahead.ids == nil {
			ahead.ids = []string{} // an empty timeline, read
		}
	}
	displayName, _ := vals[1].(string)
	createdAt, _ := vals[2].(string)
	u := &warble.User{ID: userID, Username: username, DisplayName: displayName, CreatedAt: msTime(createdAt)}
	return u, &warble.Session{TokenHash: tokenHash, UserID: userID, ExpiresAt: s.db.now().Add(expiresIn)}, ahead, s.reservedSeq(ctx, r), nil
}

// reservedSeq returns the seq that r's reserveSeqScript took, or 0 if it
// took none or was not asked. A Redis that lost its scripts answers
// NOSCRIPT, and took none: the script is loaded again for the next
// request, and CreatePost takes a seq of its own.
func (s *AuthService) reservedSeq(ctx context.Context, r *sessionRead) int64 {
	if r.seq == nil {
		return 0
	}
	seq, err := r.seq.Int64()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		s.loadReserveSeq(ctx, true)
	}
	if err != nil {
		return 0
	}
	return seq
}

// loadReserveSeq loads reserveSeqScript at its first use in this process,
// or again with force, and reports whether Redis has it: a session read
// sends it by EVALSHA in a pipeline that other requests share, where a
// NOSCRIPT could not be answered by running the pipeline again.
func (s *AuthService) loadReserveSeq(ctx context.Context, force bool) bool {
	if err := s.db.loadScript(ctx, reserveSeqScript, force); err != nil {
		s.db.log.WarnContext(ctx, "load the script that reserves post seqs", "err", err)
		return false
	}
	return true
}

// reserveSeqScript takes the next post seq (INCR) if the session exists
// and so does its user, as authenticate would find them: for
// AuthenticateForPost, in the session's pipeline, after its reads. On one
// Redis only: its keys are in three slots.
//
// KEYS[1] -> w:u:{<user>}:session:<token hash>
// KEYS[2] -> w:u:{<user>}
// KEYS[3] -> w:seq:post
//
// Returns the seq, or 0 if it took none.
var reserveSeqScript = redis.NewScript(`
if redis.call('PTTL', KEYS[1]) >= 0 and redis.call('HEXISTS', KEYS[2], 'username') == 1 then
	return redis.call('INCR', KEYS[3])
end
return 0
`)

// seqAhead is a post seq that AuthenticateForPost reserved for userID's
// next post, which CreatePost takes once (take).
type seqAhead struct {
	userID string
	seq    int64
	taken  atomic.Bool
}

type seqAheadKey struct{}

// takeSeqAhead returns the seq that ctx carries for a post by userID, once.
func takeSeqAhead(ctx context.Context, userID string) (int64, bool) {
	a, _ := ctx.Value(seqAheadKey{}).(*seqAhead)
	if a == nil || a.userID != userID || !a.taken.CompareAndSwap(false, true) {
		return 0, false
	}
	return a.seq, true
}

// authenticateLegacy is Authenticate for a token of the old form: two round
// trips, the session and then its user.
func (s *AuthService) authenticateLegacy(ctx context.Context, token string) (*warble.User, *warble.Session, error) {
	tokenHash := hashToken(token)
	ttl := s.db.opts.SessionTTL
	res, err := useSessionScript.Run(ctx, s.db.client, []string{sessionKeyOf(tokenHash)},
		ttl.Milliseconds(), sessionSlack(ttl).Milliseconds()).Slice()
	if errors.Is(err, redis.Nil) {
		return nil, nil, errSessionExpired
	} else if err != nil {
		return nil, nil, fmt.Errorf("authenticate: %w", err)
	}
	userID := replyString(res[0])
	left, _ := res[1].(int64)
	s.seen(ctx, userID)
	u, err := s.db.findUser(ctx, userID)
	if warble.ErrorCode(err) == warble.ENOTFOUND {
		return nil, nil, errSessionExpired
	} else if err != nil {
		return nil, nil, err
	}
	return u, &warble.Session{TokenHash: tokenHash, UserID: userID, ExpiresAt: s.db.now().Add(time.Duration(left) * time.Millisecond)}, nil
}

// seen records that userID made a request (see DB.Seen), waiting for it
// at most a short while (see DB.seenSoon), and reports whether the visit
// was due to be recorded: only then may the user's home timeline have been
// rebuilt. A failure is logged, not returned: the request does not depend
// on it, and the next one tries again.
func (s *AuthService) seen(ctx context.Context, userID string) bool {
	if !s.db.seenDue(userID) {
		return false
	}
	if err := s.db.recordSeenSoon(ctx, userID); err != nil {
		s.db.log.WarnContext(ctx, "record a user's visit", "user", userID, "err", err)
	}
	return true
}

// sessionSlack is how far a session's expiry may lag behind its last use:
// an hour, or a tenth of the lifetime for short ones.
func sessionSlack(ttl time.Duration) time.Duration { return min(time.Hour, ttl/10) }

// SessionExpiry implements warble.AuthService.
func (s *AuthService) SessionExpiry(ctx context.Context, tokenHash string) (time.Time, error) {
	left, err := s.db.client.PTTL(ctx, sessionKeyOf(tokenHash)).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("session expiry: %w", err)
	} else if left < 0 { // -2: no such key; -1 cannot happen, sessions always expire
		return time.Time{}, errSessionExpired
	}
	return s.db.now().Add(left), nil
}

// LogoutEverywhere implements warble.AuthService. It deletes every session
// in the user's index, then announces each one's hash on revokedChannel.
func (s *AuthService) LogoutEverywhere(ctx context.Context, userID string) (int, error) {
	hashes, err := s.db.client.SMembers(ctx, sessionsKey(userID)).Result()
	if err != nil {
		return 0, fmt.Errorf("logout everywhere of %s: %w", userID, err)
	}
	if len(hashes) == 0 {
		return 0, nil
	}
	// Per session key a DEL (those of old tokens are in other slots), then
	// the index entries; a crash between leaves entries that lead to no
	// session.
	pipe := s.db.client.Pipeline()
	dels := make([]*redis.IntCmd, len(hashes))
	for i, h := range hashes {
		dels[i] = pipe.Del(ctx, sessionKeyOf(h))
	}
	members := make([]any, len(hashes))
	for i, h := range hashes {
		members[i] = h
	}
	pipe.SRem(ctx, sessionsKey(userID), members...)
	for _, h := range hashes {
		s.db.publish(ctx, pipe, revokedChannel, h)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("logout everywhere of %s: %w", userID, err)
	}
	n := 0
	for _, d := range dels {
		n += int(d.Val())
	}
	return n, nil
}

// Logout implements warble.AuthService. It deletes the session, then
// announces its hash on revokedChannel so that every process closes the
// subscriptions opened with it.
func (s *AuthService) Logout(ctx context.Context, sess *warble.Session) error {
	if sess == nil {
		return nil
	}
	_, err := s.db.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Del(ctx, sessionKeyOf(sess.TokenHash))
		pipe.SRem(ctx, sessionsKey(sess.UserID), sess.TokenHash)
		return nil
	})
	if err != nil {
		return fmt.Errorf("logout of %s: %w", sess.UserID, err)
	}
	if err := s.db.publish(ctx, s.db.client, revokedChannel, sess.TokenHash).Err(); err != nil {
		return fmt.Errorf("logout of %s: announce revocation: %w", sess.UserID, err)
	}
	return nil
}

// hashToken returns the only form of a well-formed token that is stored,
// which names its session (warble.Session.TokenHash) in the user's session
// index and in revocations: "<user id>.<SHA-256 of the token in hex>", or
// the SHA-256 alone for a token of the old form. The user id is no secret;
// the hash hands out no session.
func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	sha := hex.EncodeToString(sum[:])
	if userID, _ := parseToken(token); userID != "" {
		return userID + "." + sha
	}
	return sha
}

// sessionKeyOf returns the key of the session that tokenHash names.
func sessionKeyOf(tokenHash string) string {
	if userID, sha, ok := strings.Cut(tokenHash, "."); ok {
		return sessionKey(userID, sha)
	}
	return legacySessionKey(tokenHash)
}

// parseToken reports whether token could have come from createSession, and
// the id of the user it names: "" for a token of the old form.
func parseToken(token string) (userID string, ok bool) {
	secret := token
	if id, rest, found := strings.Cut(token, "."); found {
		if !warble.ValidUserID(id) {
			return "", false
		}
		userID, secret = id, rest
	}
	if len(secret) != secretLen {
		return "", false
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(secret)
	return userID, err == nil && len(b) == tokenBytes
}
