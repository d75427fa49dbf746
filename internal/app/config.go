package app

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/warble/warble/internal/redisdb"
	"github.com/warble/warble/internal/warble"
)

// Config is Warble's configuration. Each setting is an environment variable
// and a flag (the flag wins), parsed once into its type by ParseConfig; the
// table of settings (settings) is the one description of them, from which
// the README's table is made.
type Config struct {
	Addr          string // listen address, from HOST and PORT
	RedisURL      string
	CORSOrigins   []string
	Env           string // development or production
	Playground    bool
	Introspection bool
	Suggestions   bool // "Did you mean …?" in validation errors
	HomeCap       int
	GlobalCap     int
	MaxFollowing  int
	SessionTTL    time.Duration
	RateLimitsOn  bool
	RateLimits    warble.RateLimits
	TrustXFF      bool // take client addresses from X-Forwarded-For
	LogLevel      slog.Level
	MetricsOn     bool   // serve Prometheus metrics at GET /metrics
	MetricsAddr   string // if set, serve them on this address instead of Addr

	WaitReplicas int           // replicas that confirm a signup, post or follow: 0 auto, -1 none
	WaitTimeout  time.Duration // how long to wait for them
	SetListpack  bool          // raise the servers' sorted-set listpack limits to HomeCap by CONFIG SET

	FanoutWorkers   int           // fan-out workers run in this process
	FanoutClaimIdle time.Duration // how long a dead worker's job waits before another takes it
	FanoutBatch     int           // followers delivered to per round trip
	FanoutShards    int           // streams the fan-out jobs are split over; 0: 1 on one Redis, 8 on a cluster
	PullThreshold   int           // followers above which posts are pulled, not pushed; -1: never
	InactiveAfter   time.Duration // unseen this long, a follower is skipped by fan-out; -1: never
	BucketThreshold int           // followers above which an account's followers go into buckets; 0: auto, -1: never
	FollowerBuckets int           // how many buckets they go into

	ArchiveURL      string        // the MySQL database of the posts that leave Redis; "" for none
	PostsInRedis    int           // with an archive, each author's newest posts kept in Redis
	PostsInRedisFor time.Duration // with an archive, older posts move too; -1: by count alone

	PostCacheSize int // posts (and as many authors) this process caches; 0: no cache

	// Not settings: tests change them.
	Archive      warble.PostArchive // opened from ArchiveURL by Run and RunWorkers; tests set it
	BcryptCost   int                // zero for the default
	WriteTimeout time.Duration      // of each websocket write; zero for the default
	LoaderWait   time.Duration      // dataloaders' batching window; zero for the default
}

// DefaultPostsInRedisFor is POSTS_IN_REDIS_FOR's default. By count alone,
// an author who posts twice a day keeps 500 days of posts in Redis; the
// home timelines that readers mostly read are a few days deep, and a
// profile read past a month goes on in the archive in the same page.
const DefaultPostsInRedisFor = 30 * 24 * time.Hour

// setting is one configuration setting: its environment variable, its
// flag, what it means, and the value that parses it into a Config field.
type setting struct {
	env, flag string
	value     flag.Value
	def       string // the default as the README shows it; value's text if empty
	usage     string // one sentence or so, for -h and the README
}

// settings returns the table of settings, each bound to a field of c (or,
// for those whose default depends on WARBLE_ENV, to a value that ParseConfig
// resolves), with the defaults in place.
func (c *Config) settings(p *pending) []setting {
	d := warble.DefaultRateLimits()
	c.RateLimits = d
	rate := func(env, flagName, what string, r *warble.Rate) setting {
		return setting{env: env, flag: flagName, value: (*rateValue)(r), usage: what}
	}
	return []setting{
		{env: "PORT", flag: "port", value: (*portValue)(&p.port), def: "8080", usage: "listen port"},
		{env: "HOST", flag: "host", value: (*stringValue)(&p.host), def: "all interfaces", usage: "listen host"},
		{env: "REDIS_URL", flag: "redis-url", value: (*stringValue)(&c.RedisURL), def: "unset",
			usage: "`redis://` or `rediss://` URL. Unset: embedded in-memory Redis, data not kept"},
		{env: "ARCHIVE_URL", flag: "archive-url", value: (*stringValue)(&c.ArchiveURL), def: "unset",
			usage: "`mysql://user:password@host:port/database`, or `mysql://user:password@/database?socket=/path/to/mysqld.sock`, of a MySQL 8 or MariaDB 10.11+ database that keeps the posts that leave Redis (`POSTS_IN_REDIS`, `POSTS_IN_REDIS_FOR`); Warble creates and migrates its tables. Unset: every post stays in Redis. See [The archive](#the-archive)"},
		{env: "POSTS_IN_REDIS", flag: "posts-in-redis", value: &intValue{v: &c.PostsInRedis, min: 1},
			usage: "with `ARCHIVE_URL`, how many of each author's newest posts stay in Redis; the fan-out workers move older ones to the archive"},
		{env: "POSTS_IN_REDIS_FOR", flag: "posts-in-redis-for", value: &durationValue{v: &c.PostsInRedisFor, min: time.Hour, off: true}, def: "`720h` (30 days)",
			usage: "with `ARCHIVE_URL`, posts older than this move to the archive too, however few their author has; `off` moves by count alone"},
		{env: "CORS_ORIGINS", flag: "cors-origins", value: (*listValue)(&c.CORSOrigins), def: "unset",
			usage: "comma-separated extra origins allowed for HTTP (CORS) and websockets; same-origin always works"},
		{env: "WARBLE_ENV", flag: "env", value: &enumValue{v: &c.Env, allowed: []string{"development", "production"}},
			usage: "`production` turns off introspection, the playground and \"did you mean\" suggestions"},
		{env: "WARBLE_PLAYGROUND", flag: "playground", value: &p.playground, def: "on in development",
			usage: "serve `/playground` (`true`/`false`)"},
		{env: "WARBLE_INTROSPECTION", flag: "introspection", value: &p.introspection, def: "on in development",
			usage: "allow schema introspection (`true`/`false`)"},
		{env: "WARBLE_SUGGESTIONS", flag: "suggestions", value: &p.suggestions, def: "on in development",
			usage: "\"Did you mean …?\" in validation errors (`true`/`false`); they name fields a query did not ask for"},
		{env: "HOME_TIMELINE_CAP", flag: "home-cap", value: &intValue{v: &c.HomeCap, min: 1}, usage: "posts kept per home timeline"},
		{env: "GLOBAL_TIMELINE_CAP", flag: "global-cap", value: &intValue{v: &c.GlobalCap, min: 1}, usage: "posts kept in the global timeline"},
		{env: "MAX_FOLLOWING", flag: "max-following", value: &intValue{v: &c.MaxFollowing, min: 1}, usage: "how many users one user may follow"},
		{env: "SESSION_TTL", flag: "session-ttl", value: &durationValue{v: &c.SessionTTL, min: time.Minute}, def: "`720h` (30 days)",
			usage: "how long a session lasts unused; each use pushes its expiry back"},
		{env: "RATE_LIMITS", flag: "rate-limits", value: (*onOffValue)(&c.RateLimitsOn),
			usage: "`off` disables every rate limit (load tests, harnesses that sign up many users from one address)"},
		rate("RATE_LIMIT_LOGIN_FAILURES_PER_USERNAME", "rate-login-failures-per-username", "wrong passwords for one username", &c.RateLimits.LoginFailuresPerUsername),
		rate("RATE_LIMIT_LOGIN_FAILURES_PER_ADDRESS", "rate-login-failures-per-address", "wrong passwords from one client address", &c.RateLimits.LoginFailuresPerAddress),
		rate("RATE_LIMIT_SIGNUPS_PER_ADDRESS", "rate-signups-per-address", "signups from one client address", &c.RateLimits.SignupsPerAddress),
		rate("RATE_LIMIT_POSTS_PER_USER", "rate-posts-per-user", "posts by one user", &c.RateLimits.PostsPerUser),
		rate("RATE_LIMIT_FOLLOWS_PER_USER", "rate-follows-per-user", "follows and unfollows by one user", &c.RateLimits.FollowsPerUser),
		rate("RATE_LIMIT_WEBSOCKETS_PER_ADDRESS", "rate-websockets-per-address", "websocket connections opened from one client address", &c.RateLimits.WebsocketsPerAddress),
		{env: "REDIS_WAIT_REPLICAS", flag: "redis-wait-replicas", value: (*waitReplicasValue)(&c.WaitReplicas), def: "`auto`",
			usage: "how many replicas of each Redis master must confirm the writes of a signup, a post or a follow before Warble answers (Redis's `WAIT`), so that a master that dies does not take acknowledged writes with it: `auto` waits for one on a Redis Cluster whose every master has a replica, for none elsewhere; `off` never waits. See [Redis Cluster](#redis-cluster)"},
		{env: "REDIS_WAIT_TIMEOUT", flag: "redis-wait-timeout", value: &durationValue{v: &c.WaitTimeout, min: time.Millisecond},
			usage: "how long a write waits for its replicas; one they did not confirm by then is answered with an error (it may have been kept)"},
		{env: "REDIS_SET_LISTPACK", flag: "redis-set-listpack", value: (*boolValue)(&c.SetListpack),
			usage: "at start, raise `zset-max-listpack-entries` to `HOME_TIMELINE_CAP` + 128 (fan-out trims home timelines one add in 8, so they may pass their cap by a few entries, which readers never see) (and `zset-max-listpack-value` to 33) by `CONFIG SET` on every Redis server where they are lower, so that home timelines are kept compact, about 4 times smaller; `false` only checks and logs what to set. See [Compact timelines](#compact-timelines)"},
		{env: "TRUST_FORWARDED_FOR", flag: "trust-forwarded-for", value: (*boolValue)(&c.TrustXFF),
			usage: "behind a proxy that appends the client's address to `X-Forwarded-For`, take the address from there"},
		{env: "FANOUT_WORKERS", flag: "fanout-workers", value: &intValue{v: &c.FanoutWorkers, min: 0},
			usage: "fan-out workers inside the server; `0` when separate `warble worker` processes (`go run . worker`, same settings, `REDIS_URL` required) do all of it"},
		{env: "FANOUT_CLAIM_IDLE", flag: "fanout-claim-idle", value: &durationValue{v: &c.FanoutClaimIdle, min: time.Millisecond},
			usage: "how long a job of a worker that died waits before another worker takes it over"},
		{env: "FANOUT_BATCH", flag: "fanout-batch", value: &intValue{v: &c.FanoutBatch, min: 1}, usage: "followers one fan-out round trip delivers to"},
		{env: "FANOUT_SHARDS", flag: "fanout-shards", value: &intValue{v: &c.FanoutShards, min: 1}, def: "1 on one Redis, 8 on a Redis Cluster",
			usage: "how many streams (each in a hash slot of its own) the fan-out jobs are split over, an author's jobs always in the same one; every server and `warble worker` must have the same value, and lowering it strands the jobs queued in the shards it drops, so let the queue drain first"},
		{env: "FANOUT_PULL_THRESHOLD", flag: "fanout-pull-threshold", value: &intValue{v: &c.PullThreshold, min: 1, off: true},
			usage: "an account with more followers than this is not fanned out: its posts are merged into its followers' home timelines when they are read (hybrid push/pull); `off` fans out every post"},
		{env: "FOLLOWERS_BUCKET_THRESHOLD", flag: "followers-bucket-threshold", value: &intValue{v: &c.BucketThreshold, min: 1, off: true},
			def:   "`100000` on a Redis Cluster, `off` on one Redis",
			usage: "an account with more followers than this has them moved, by the fan-out workers and with no downtime, from one sorted set (one hash slot, so one master) into `FOLLOWERS_BUCKETS` sorted sets with hash slots of their own, spread over the masters; follows, counts, follower lists and fan-out read and write the buckets from then on; `off` keeps every account's followers in one set"},
		{env: "FOLLOWERS_BUCKETS", flag: "followers-buckets", value: &intValue{v: &c.FollowerBuckets, min: 2},
			usage: "how many buckets an account's followers are split into when it crosses `FOLLOWERS_BUCKET_THRESHOLD`; an account keeps the number it got"},
		{env: "FANOUT_INACTIVE_AFTER", flag: "fanout-inactive-after", value: &durationValue{v: &c.InactiveAfter, min: time.Hour, off: true},
			usage: "fan-out skips a follower who has made no signed-in request for this long (an hour or more); their home timeline is rebuilt from the people they follow on their next request; `off` skips nobody"},
		{env: "POST_CACHE_SIZE", flag: "post-cache-size", value: &intValue{v: &c.PostCacheSize, min: 0},
			usage: "how many posts, and as many of their authors, each server process keeps in memory so that pages of cached posts read only their timeline from Redis; a deleted post leaves every process's cache within pub/sub's latency (at once in the process that deleted it), a process whose pub/sub connection goes silent stops using its cache within 6 seconds, and an entry lives a minute at most; `0` turns the cache off. See [The post cache](#the-post-cache)"},
		{env: "METRICS", flag: "metrics", value: &p.metrics, def: "`on` in development, `off` in production",
			usage: "Prometheus metrics at `GET /metrics`: `on` serves them on the main listener, `off` not at all, and a `host:port` (e.g. `127.0.0.1:9090`) on a listener of their own only. See [Metrics](#metrics)"},
		{env: "LOG_LEVEL", flag: "log-level", value: (*levelValue)(&c.LogLevel), usage: "`debug`, `info`, `warn` or `error`"},
	}
}

// pending holds what ParseConfig resolves after every setting is read:
// the listen address, and the settings whose default depends on WARBLE_ENV.
type pending struct {
	port, host                             string
	playground, introspection, suggestions optionalBool
	metrics                                metricsValue
}

// defaultConfig is the configuration with no setting given.
func defaultConfig() (Config, *pending) {
	c := Config{
		Env:             "development",
		HomeCap:         redisdb.DefaultHomeCap,
		GlobalCap:       redisdb.DefaultGlobalCap,
		MaxFollowing:    warble.DefaultMaxFollowing,
		SessionTTL:      redisdb.DefaultSessionTTL,
		RateLimitsOn:    true,
		LogLevel:        slog.LevelInfo,
		FanoutWorkers:   2,
		FanoutClaimIdle: redisdb.DefaultClaimIdle,
		FanoutBatch:     redisdb.DefaultBatch,
		PullThreshold:   redisdb.DefaultPullThreshold,
		FollowerBuckets: redisdb.DefaultFollowerBuckets,
		InactiveAfter:   redisdb.DefaultInactiveAfter,
		WaitTimeout:     redisdb.DefaultWaitTimeout,
		PostsInRedis:    redisdb.DefaultPostsInRedis,
		PostsInRedisFor: DefaultPostsInRedisFor,
		PostCacheSize:   redisdb.DefaultPostCacheSize,
	}
	return c, &pending{port: "8080"}
}

// ParseConfig reads the configuration from the environment (through
// getenv) and then from args, whose flags win.
func ParseConfig(args []string, getenv func(string) string) (Config, error) {
	c, p := defaultConfig()
	fs := flag.NewFlagSet("warble", flag.ContinueOnError)
	for _, s := range c.settings(p) {
		fs.Var(s.value, s.flag, s.usage+" (env "+s.env+")")
		if v := getenv(s.env); v != "" {
			if err := s.value.Set(v); err != nil {
				return c, fmt.Errorf("%s: %w", s.env, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	c.Addr = net.JoinHostPort(p.host, p.port)
	dev := c.Env == "development"
	c.Playground, c.Introspection, c.Suggestions = p.playground.or(dev), p.introspection.or(dev), p.suggestions.or(dev)
	c.MetricsOn, c.MetricsAddr = p.metrics.on.or(dev), p.metrics.addr
	return c, nil
}

// ConfigTable returns the settings as the rows of the README's table of
// them: variable, flag, default and meaning.
func ConfigTable() string {
	c, p := defaultConfig()
	var b strings.Builder
	b.WriteString("| variable | flag | default | meaning |\n|---|---|---|---|\n")
	for _, s := range c.settings(p) {
		def := s.def
		if def == "" {
			def = s.value.String()
		}
		if !strings.ContainsAny(def, "` ") && def != "unset" {
			def = "`" + def + "`" // a value, not words
		}
		fmt.Fprintf(&b, "| `%s` | `-%s` | %s | %s |\n", s.env, s.flag, def, s.usage)
	}
	return b.String()
}

// The flag.Value types of the settings. Each refuses what its setting does
// not take, with a sentence that says what it takes.

type stringValue string

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }

type portValue string

func (v *portValue) String() string { return string(*v) }
func (v *portValue) Set(s string) error {
	if _, err := strconv.ParseUint(s, 10, 16); err != nil {
		return fmt.Errorf("%q is not a port number", s)
	}
	*v = portValue(s)
	return nil
}

type listValue []string

func (v *listValue) String() string { return strings.Join(*v, ",") }
func (v *listValue) Set(s string) error {
	*v = nil
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			*v = append(*v, item)
		}
	}
	return nil
}

type enumValue struct {
	v       *string
	allowed []string
}

func (e *enumValue) String() string {
	if e.v == nil {
		return ""
	}
	return *e.v
}

func (e *enumValue) Set(s string) error {
	for _, a := range e.allowed {
		if s == a {
			*e.v = s
			return nil
		}
	}
	return fmt.Errorf("%q must be %s", s, strings.Join(e.allowed, " or "))
}

// intValue is a whole number of at least min, or with off, also "off",
// which it stores as -1.
type intValue struct {
	v   *int
	min int
	off bool
}

func (i *intValue) String() string {
	if i.v == nil {
		return ""
	} else if i.off && *i.v < 0 {
		return "off"
	}
	return strconv.Itoa(*i.v)
}

func (i *intValue) Set(s string) error {
	if i.off && s == "off" {
		*i.v = -1
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < i.min {
		what := "a whole number"
		if i.min == 1 {
			what = "a positive whole number"
		}
		if i.off {
			what += " or off"
		}
		return fmt.Errorf("%q must be %s", s, what)
	}
	*i.v = n
	return nil
}

// durationValue is a duration of at least min, or with off, also "off",
// which it stores as -1.
type durationValue struct {
	v   *time.Duration
	min time.Duration
	off bool
}

func (d *durationValue) String() string {
	if d.v == nil {
		return ""
	} else if d.off && *d.v < 0 {
		return "off"
	}
	return d.v.String()
}

func (d *durationValue) Set(s string) error {
	if d.off && s == "off" {
		*d.v = -1
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < d.min {
		what := fmt.Sprintf("a duration of at least %v, such as %v", d.min, max(d.min, time.Hour))
		if d.off {
			what += ", or off"
		}
		return fmt.Errorf("%q must be %s", s, what)
	}
	*d.v = v
	return nil
}

type boolValue bool

func (b *boolValue) String() string { return strconv.FormatBool(bool(*b)) }
func (b *boolValue) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q must be true or false", s)
	}
	*b = boolValue(v)
	return nil
}
func (b *boolValue) IsBoolFlag() bool { return true }

// onOffValue is "on" or "off".
type onOffValue bool

func (o *onOffValue) String() string {
	if *o {
		return "on"
	}
	return "off"
}

func (o *onOffValue) Set(s string) error {
	switch s {
	case "on":
		*o = true
	case "off":
		*o = false
	default:
		return fmt.Errorf("%q must be on or off", s)
	}
	return nil
}

// optionalBool is true or false, or unset: then its default is decided
// later, by WARBLE_ENV.
type optionalBool struct{ set, v bool }

func (o *optionalBool) String() string {
	if !o.set {
		return ""
	}
	return strconv.FormatBool(o.v)
}

func (o *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q must be true or false", s)
	}
	o.set, o.v = true, v
	return nil
}

func (o *optionalBool) IsBoolFlag() bool { return true }

// or returns the value, or def if it was not set.
func (o optionalBool) or(def bool) bool {
	if o.set {
		return o.v
	}
	return def
}

// metricsValue is "on", "off", or a host:port for a listener of their own.
type metricsValue struct {
	on   optionalBool
	addr string
}

func (m *metricsValue) String() string {
	if m.addr != "" {
		return m.addr
	}
	return m.on.String()
}

func (m *metricsValue) Set(s string) error {
	m.addr = ""
	switch s {
	case "on", "off":
		m.on = optionalBool{set: true, v: s == "on"}
		return nil
	}
	if _, port, err := net.SplitHostPort(s); err != nil || port == "" {
		return fmt.Errorf("%q must be on, off or a host:port such as 127.0.0.1:9090", s)
	}
	m.on, m.addr = optionalBool{set: true, v: true}, s
	return nil
}

type rateValue warble.Rate

func (r *rateValue) String() string { return warble.Rate(*r).String() }
func (r *rateValue) Set(s string) error {
	v, err := warble.ParseRate(s)
	if err != nil {
		return err
	}
	*r = rateValue(v)
	return nil
}

type levelValue slog.Level

func (l *levelValue) String() string { return strings.ToLower(slog.Level(*l).String()) }
func (l *levelValue) Set(s string) error {
	var v slog.Level
	if err := v.UnmarshalText([]byte(s)); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "slog: "))
	}
	*l = levelValue(v)
	return nil
}

// waitReplicasValue is REDIS_WAIT_REPLICAS: auto (0), off (-1) or a
// positive number.
type waitReplicasValue int

func (w *waitReplicasValue) String() string {
	switch {
	case w == nil:
		return ""
	case *w == 0:
		return "auto"
	case *w < 0:
		return "off"
	}
	return strconv.Itoa(int(*w))
}

func (w *waitReplicasValue) Set(s string) error {
	switch s {
	case "auto":
		*w = 0
		return nil
	case "off":
		*w = -1
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("%q must be auto, off or a positive whole number", s)
	}
	*w = waitReplicasValue(n)
	return nil
}
