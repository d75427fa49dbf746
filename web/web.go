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
	"crypto/sha256"
	"embed"
	"encoding/hex"
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
	etags, err := contentTags(sub)
	if err != nil {
		panic(err)
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		// The files change only with the binary and carry no modification
		// time (embed), so browsers revalidate each time ("no-cache") and
		// the ETag, a hash of the content, lets that be a 304 (ServeContent
		// checks If-None-Match against it).
		h.Set("Cache-Control", "no-cache")
		if isAppRoute(r.URL.Path) {
			h.Set("Content-Security-Policy", contentSecurityPolicy)
			h.Set("Content-Type", "text/html; charset=utf-8")
			h.Set("ETag", etags["index.html"])
			http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(index))
			return
		}
		if tag, ok := etags[strings.TrimPrefix(path.Clean(r.URL.Path), "/")]; ok {
			h.Set("ETag", tag)
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

// contentTags returns a strong ETag for every file in fsys, by path.
func contentTags(fsys fs.FS) (map[string]string, error) {
	tags := map[string]string{}
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		tags[name] = `"` + hex.EncodeToString(sum[:12]) + `"`
		return nil
	})
	return tags, err
}
