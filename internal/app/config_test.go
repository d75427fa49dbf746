package app

import (
	"flag"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the README's table of settings from the code")

const (
	tableStart = "<!-- settings: made by `go test ./internal/app -run TestREADMESettings -update` -->\n"
	tableEnd   = "<!-- end of settings -->\n"
)

// TestREADMESettings checks that the README's table of settings is the one
// the code makes from its table of settings (ConfigTable), so that the two
// cannot drift apart; -update rewrites it.
func TestREADMESettings(t *testing.T) {
	const path = "../../README.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	before, rest, ok1 := strings.Cut(readme, tableStart)
	table, after, ok2 := strings.Cut(rest, tableEnd)
	if !ok1 || !ok2 {
		t.Fatalf("README.md has no table of settings between %q and %q", tableStart, tableEnd)
	}
	want := ConfigTable()
	if table == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(before+tableStart+want+tableEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's table of settings differs from the code's; run go test ./internal/app -run TestREADMESettings -update\n--- README\n%s--- code\n%s", table, want)
}

// TestEverySettingParses: each setting is read from its environment
// variable and from its flag, the flag winning, and a bad value names the
// variable.
func TestEverySettingParses(t *testing.T) {
	c, p := defaultConfig()
	for _, s := range c.settings(p) {
		if s.env == "" || s.flag == "" || s.usage == "" {
			t.Errorf("setting %+v lacks a variable, flag or meaning", s)
		}
	}
	cfg, err := ParseConfig([]string{"-home-cap", "7"}, func(k string) string {
		return map[string]string{"HOME_TIMELINE_CAP": "5", "GLOBAL_TIMELINE_CAP": "6", "LOG_LEVEL": "debug"}[k]
	})
	if err != nil || cfg.HomeCap != 7 || cfg.GlobalCap != 6 || cfg.LogLevel.String() != "DEBUG" {
		t.Fatalf("home cap %d (want the flag's 7), global cap %d (want 6), log level %v: %v", cfg.HomeCap, cfg.GlobalCap, cfg.LogLevel, err)
	}
	if _, err := ParseConfig(nil, func(k string) string { return map[string]string{"GLOBAL_TIMELINE_CAP": "lots"}[k] }); err == nil ||
		!strings.Contains(err.Error(), "GLOBAL_TIMELINE_CAP") {
		t.Errorf("a bad GLOBAL_TIMELINE_CAP: %v, want an error naming it", err)
	}
}
