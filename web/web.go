// Package web is Warble's browser app, embedded in the binary and served at /.
//
// The app is plain JavaScript modules and CSS under static/, with no build
// step. It routes in the browser (/, /explore, /u/<username>, …), so every
// path that does not name a file gets index.html, and a reload or a shared
// link lands on the right screen. Paths that look like files (a dot in the
// last segment) are served from static/ or are a real 404, so that a typo
// in an asset URL fails loudly instead of returning HTML.
package web

import (
	"bytes"
	"embed"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// contentSecurityPolicy lets the app load only its own files and talk only
// to its own origin ('self' covers same-origin websockets in current
// browsers). Nothing in the app is inline, so no 'unsafe-inline' is needed.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'"

// Handler serves the app's files, and index.html for the app's routes.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	index, err := fs.ReadFile(sub, "index.html")
	if err != nil {
		panic(err)
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		// The files change only with the binary and carry no modification
		// time (embed), so ask browsers to check each time rather than
		// keep a stale app after an upgrade.
		h.Set("Cache-Control", "no-cache")
		if isAppRoute(r.URL.Path) {
			h.Set("Content-Security-Policy", contentSecurityPolicy)
			h.Set("Content-Type", "text/html; charset=utf-8")
			http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(index))
			return
		}
		// Go's MIME table may be overridden by the system's; pin the types
		// that browsers are strict about for module scripts and styles.
		switch path.Ext(r.URL.Path) {
		case ".js", ".mjs":
			h.Set("Content-Type", "text/javascript; charset=utf-8")
		case ".css":
			h.Set("Content-Type", "text/css; charset=utf-8")
		}
		files.ServeHTTP(w, r)
	})
}

// isAppRoute reports whether p is a screen of the app rather than a file:
// its last segment has no dot. "/index.html" itself counts as a file, which
// http.FileServer redirects to "/".
func isAppRoute(p string) bool {
	last := p[strings.LastIndex(p, "/")+1:]
	return !strings.Contains(last, ".")
}
