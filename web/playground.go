package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// The playground is GraphiQL with every file it needs in the binary:
// GraphiQL's, React's and ReactDOM's prebuilt files (vendored in
// playground/vendor by playground/update.sh, see playground/README.md) and
// a page and script of our own. Nothing is loaded from another origin, so it
// works offline, behind a firewall and under a strict CSP.
//
//go:embed playground/index.html playground/playground.js playground/playground.css playground/vendor
var playgroundFiles embed.FS

// playgroundPolicy is the playground page's Content-Security-Policy.
// Scripts come only from this origin: the page's own script is a file, not
// inline. Styles also allow 'unsafe-inline', and only because GraphiQL needs
// it: its dialogs (settings, short keys), built on Radix UI, add a <style>
// element while they are open to lock the page's scrolling, which
// style-src 'self' alone refuses. GraphiQL's stylesheet carries its fonts as
// data: URLs. connect-src 'self' covers fetch to the endpoint and the
// same-origin websocket for subscriptions.
const playgroundPolicy = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; " +
	"frame-ancestors 'none'; object-src 'none'"

// playgroundPath is where Playground serves its page; its files are under
// playgroundPath + "/".
const playgroundPath = "/playground"

// Playground returns a handler that serves GraphiQL, an in-browser IDE for
// the GraphQL API at endpoint, entirely from the binary: the page at
// /playground and its scripts, styles and licenses under /playground/.
// Register it for both:
//
//	mux.Handle("GET /playground", h)
//	mux.Handle("GET /playground/", h)
//
// endpoint is a path on the same origin, such as "/graphql". Queries and
// mutations are sent to it over HTTP, and subscriptions to the same path
// over a websocket (graphql-transport-ws) whose connection_init payload is
// the headers the user typed in GraphiQL's Headers tab.
func Playground(endpoint string) http.Handler {
	if !strings.HasPrefix(endpoint, "/") {
		panic("web.Playground: endpoint must be a path on this origin, such as /graphql")
	}
	page, files := playgroundContent(endpoint)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		// As for the app: the files change only with the binary, so browsers
		// revalidate and the content's hash, as ETag, makes that a 304.
		h.Set("Cache-Control", "no-cache")
		switch r.URL.Path {
		case playgroundPath:
			page.serve(w, r, "text/html; charset=utf-8", playgroundPolicy)
			return
		case playgroundPath + "/":
			// One address for the page: its files are named from the root,
			// so it would work here too, but a bookmark should not split.
			http.Redirect(w, r, playgroundPath, http.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, playgroundPath+"/")
		if f, found := files[name]; ok && found {
			f.serve(w, r, f.contentType, "")
			return
		}
		http.NotFound(w, r)
	})
}

// playgroundFile is one response the playground serves.
type playgroundFile struct {
	data        []byte
	etag        string
	contentType string
}

func (f playgroundFile) serve(w http.ResponseWriter, r *http.Request, contentType, policy string) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("ETag", f.etag)
	if policy != "" {
		h.Set("Content-Security-Policy", policy)
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.data))
}

// playgroundContent renders the page for endpoint and reads every other
// embedded file, keyed by its path under /playground/.
func playgroundContent(endpoint string) (playgroundFile, map[string]playgroundFile) {
	sub, err := fs.Sub(playgroundFiles, "playground")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	tmpl := template.Must(template.ParseFS(sub, "index.html"))
	var page bytes.Buffer
	if err := tmpl.Execute(&page, struct{ Endpoint string }{endpoint}); err != nil {
		panic(err)
	}
	files := map[string]playgroundFile{}
	err = fs.WalkDir(sub, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || name == "index.html" {
			return err
		}
		data, err := fs.ReadFile(sub, name)
		if err != nil {
			return err
		}
		files[name] = playgroundFile{data: data, etag: etagOf(data), contentType: playgroundType(name)}
		return nil
	})
	if err != nil {
		panic(err)
	}
	return playgroundFile{data: page.Bytes(), etag: etagOf(page.Bytes())}, files
}

// playgroundType pins the content types browsers are strict about (module
// and classic scripts, styles) rather than rely on the system's MIME table;
// the licenses are plain text.
func playgroundType(name string) string {
	switch path.Ext(name) {
	case ".js":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	default:
		return "text/plain; charset=utf-8"
	}
}

// etagOf returns a strong ETag for data: a hash of its content.
func etagOf(data []byte) string {
	sum := sha256.Sum256(data)
	return `"` + hex.EncodeToString(sum[:12]) + `"`
}
