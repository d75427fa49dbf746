package archive

import (
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultMaxConns is how many connections to the database a Warble process
// opens at most, unless the URL says otherwise (maxConns).
const DefaultMaxConns = 16

// ParseURL reads ARCHIVE_URL:
//
//	mysql://user:password@host:port/database?option=value&...
//	mysql://user:password@/database?socket=/run/mysqld/mysqld.sock
//
// The port defaults to 3306; user and password are percent-encoded, as in
// any URL. The options:
//
//	socket=<path>        a unix socket instead of host:port
//	tls=true|skip-verify|preferred|false
//	                     TLS to the server: verified, unverified, if the
//	                     server offers it, or none (the default)
//	timeout=<duration>   to connect (default 10s)
//	readTimeout=<duration>, writeTimeout=<duration>
//	                     for one read or write on a connection (default none)
//	maxConns=<n>         connections per process (default DefaultMaxConns)
//
// Any other option is an error, so that a misspelt one is not ignored.
// ParseURL returns the driver's configuration and the pool size.
func ParseURL(raw string) (*mysql.Config, int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url's errors quote the whole URL, password included.
		return nil, 0, fmt.Errorf("ARCHIVE_URL is not a URL")
	}
	if u.Scheme != "mysql" {
		return nil, 0, fmt.Errorf("ARCHIVE_URL: scheme %q, want mysql://", u.Scheme)
	}
	cfg := mysql.NewConfig()
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.DBName == "" || strings.Contains(cfg.DBName, "/") {
		return nil, 0, fmt.Errorf("ARCHIVE_URL %s", errNoDatabase)
	}
	cfg.Timeout = 10 * time.Second
	// Queries carry their arguments in their text, built by the driver:
	// one round trip each, where a prepared statement takes three.
	cfg.InterpolateParams = true
	pool := DefaultMaxConns
	q := u.Query()
	for name, values := range q {
		v := values[len(values)-1]
		switch name {
		case "socket":
			cfg.Net, cfg.Addr = "unix", v
		case "tls":
			switch v {
			case "true", "skip-verify", "preferred", "false":
				cfg.TLSConfig = v
			default:
				return nil, 0, fmt.Errorf("ARCHIVE_URL: tls=%q, want true, skip-verify, preferred or false", v)
			}
		case "timeout", "readTimeout", "writeTimeout":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return nil, 0, fmt.Errorf("ARCHIVE_URL: %s=%q is not a duration such as 5s", name, v)
			}
			switch name {
			case "timeout":
				cfg.Timeout = d
			case "readTimeout":
				cfg.ReadTimeout = d
			default:
				cfg.WriteTimeout = d
			}
		case "maxConns":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, 0, fmt.Errorf("ARCHIVE_URL: maxConns=%q is not a positive number", v)
			}
			pool = n
		default:
			return nil, 0, fmt.Errorf("ARCHIVE_URL: unknown option %q (known: socket, tls, timeout, readTimeout, writeTimeout, maxConns)", name)
		}
	}
	if cfg.Net == "unix" {
		if u.Host != "" {
			return nil, 0, fmt.Errorf("ARCHIVE_URL names both a host (%s) and a socket", u.Host)
		}
		if cfg.Addr == "" {
			return nil, 0, fmt.Errorf("ARCHIVE_URL: socket= needs a path")
		}
	} else {
		if u.Host == "" {
			return nil, 0, fmt.Errorf("ARCHIVE_URL names no host: mysql://user:password@host:port/database, or ?socket=<path>")
		}
		host, port := u.Hostname(), u.Port()
		if port == "" {
			port = "3306"
		}
		cfg.Net, cfg.Addr = "tcp", net.JoinHostPort(host, port)
	}
	return cfg, pool, nil
}

// migrationsDir is the embedded migrations, at the root of their FS as
// goose wants them.
func migrationsDir() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the directory is embedded, so this cannot happen
	}
	return sub
}
