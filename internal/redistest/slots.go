package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// SlotGuard is a go-redis hook that fails a test when an atomic step would
// not run on Redis Cluster: a Lua script whose KEYS, or a MULTI/EXEC block
// whose commands, touch more than one hash slot. Clients from Server.Client
// carry it, so every test checks Warble's cluster rule on every code path it
// takes, without a cluster.
//
// It knows the key positions of the commands Warble sends in transactions
// (the first argument, except PUBLISH, which names a channel, and the
// multi-key DEL, EXISTS, UNLINK, MGET, TOUCH, where every argument is a key).
//
// Scripts declared with AllowOnOneRedis are let through.
//
// Commands run on the goroutines of the code under test, which may outlive
// the test, so the guard collects what it finds and reports it when the
// test ends.
type SlotGuard struct{ found *violations }

// oneRedis holds the SHA1s of the scripts declared with AllowOnOneRedis.
var oneRedis sync.Map

// AllowOnOneRedis declares scripts, by SHA1, that the code under test runs
// only on one Redis, never on a Redis Cluster, and whose keys may span
// slots there (a script may touch any key it declares on one Redis): the
// guards let them through. On a cluster, Redis itself refuses them.
func AllowOnOneRedis(shas ...string) {
	for _, sha := range shas {
		oneRedis.Store(sha, true)
	}
}

type violations struct {
	mu   sync.Mutex
	list []string
}

var _ redis.Hook = SlotGuard{}

// NewSlotGuard returns a SlotGuard that reports to tb when tb ends.
func NewSlotGuard(tb testing.TB) SlotGuard {
	g := SlotGuard{found: &violations{}}
	tb.Cleanup(func() {
		g.found.mu.Lock()
		defer g.found.mu.Unlock()
		for _, v := range g.found.list {
			tb.Error(v)
		}
	})
	return g
}

// DialHook implements redis.Hook.
func (g SlotGuard) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (g SlotGuard) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.check([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook. Transactions reach it wrapped
// in MULTI and EXEC.
func (g SlotGuard) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.check(cmds)
		return next(ctx, cmds)
	}
}

// check reports every script and every MULTI/EXEC block of cmds whose keys
// span more than one slot.
func (g SlotGuard) check(cmds []redis.Cmder) {
	var tx []string // keys of the open MULTI block; nil outside one
	inTx := false
	for _, cmd := range cmds {
		name := strings.ToLower(cmd.Name())
		switch {
		case name == "multi":
			inTx, tx = true, nil
		case name == "exec":
			g.sameSlot("MULTI/EXEC block", tx)
			inTx = false
		case inTx:
			tx = append(tx, commandKeys(cmd)...)
		case isScript(name):
			if name != "evalsha" || !allowed(cmd.Args()[1]) {
				g.sameSlot(argText(cmd.Args()[0])+" "+argText(cmd.Args()[1]), commandKeys(cmd))
			}
		}
	}
}

func (g SlotGuard) sameSlot(what string, keys []string) {
	for _, k := range keys[min(1, len(keys)):] {
		if Slot(k) != Slot(keys[0]) {
			g.found.mu.Lock()
			defer g.found.mu.Unlock()
			g.found.list = append(g.found.list, fmt.Sprintf("redistest: %s spans hash slots on Redis Cluster: %q (slot %d) and %q (slot %d)",
				what, keys[0], Slot(keys[0]), k, Slot(k)))
			return
		}
	}
}

// allowed reports whether sha names a script declared with
// AllowOnOneRedis.
func allowed(sha any) bool {
	_, ok := oneRedis.Load(argText(sha))
	return ok
}

func isScript(name string) bool {
	switch name {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

// commandKeys returns the keys a command touches, for the commands SlotGuard
// knows (see its doc).
func commandKeys(cmd redis.Cmder) []string {
	args := cmd.Args()
	if len(args) < 2 {
		return nil
	}
	name := strings.ToLower(cmd.Name())
	switch {
	case isScript(name):
		n, _ := strconv.Atoi(argText(args[2]))
		keys := make([]string, 0, n)
		for _, k := range args[3:min(len(args), 3+n)] {
			keys = append(keys, argText(k))
		}
		return keys
	case name == "publish":
		return nil // a channel, not a key
	case name == "del" || name == "exists" || name == "unlink" || name == "mget" || name == "touch":
		keys := make([]string, 0, len(args)-1)
		for _, k := range args[1:] {
			keys = append(keys, argText(k))
		}
		return keys
	}
	return []string{argText(args[1])}
}

// argText is a command argument as Redis receives it, for the arguments
// Warble sends: strings, numbers, and pointers to strings (go-redis writes
// the string pointed to; fan-out passes its keys so).
func argText(a any) string {
	if p, ok := a.(*string); ok && p != nil {
		return *p
	}
	return fmt.Sprint(a)
}

// Slot returns the Redis Cluster hash slot of key: the CRC16 of its hash tag
// (the text between the first "{" and the next "}", when not empty) or of
// the whole key, modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
