package web

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, target string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	res := rec.Result()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(body)
}

func TestHandlerServesIndexForAppRoutes(t *testing.T) {
	h := Handler()
	for _, target := range []string{"/", "/login", "/explore", "/u/ada", "/u/ada/followers", "/u/ada/", "/u/ada?x=1"} {
		t.Run(target, func(t *testing.T) {
			res, body := get(t, h, target)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", res.StatusCode)
			}
			if ct := res.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if !strings.Contains(body, `<script type="module" src="/js/app.js">`) {
				t.Errorf("body is not index.html:\n%.300s", body)
			}
			if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
				t.Errorf("Content-Security-Policy %q", csp)
			}
		})
	}
}

func TestHandlerServesAssetsWithTheirTypes(t *testing.T) {
	h := Handler()
	for target, want := range map[string]string{
		"/js/app.js":     "text/javascript; charset=utf-8",
		"/js/graphql.js": "text/javascript; charset=utf-8",
		"/app.css":       "text/css; charset=utf-8",
		"/favicon.svg":   "image/svg+xml",
	} {
		t.Run(target, func(t *testing.T) {
			res, body := get(t, h, target)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", res.StatusCode)
			}
			if ct := res.Header.Get("Content-Type"); ct != want {
				t.Errorf("Content-Type %q, want %q", ct, want)
			}
			if strings.Contains(body, "<!doctype html>") {
				t.Errorf("got index.html instead of the file")
			}
			if res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("no nosniff header")
			}
		})
	}
}

func TestHandlerKeeps404ForMissingFiles(t *testing.T) {
	h := Handler()
	for _, target := range []string{"/missing.js", "/app.js", "/js/nope.js", "/u/ada/avatar.png"} {
		t.Run(target, func(t *testing.T) {
			res, body := get(t, h, target)
			if res.StatusCode != http.StatusNotFound {
				t.Fatalf("status %d, want 404", res.StatusCode)
			}
			if strings.Contains(body, "<!doctype html>") {
				t.Errorf("a missing file got index.html")
			}
		})
	}
}

func TestHandlerDoesNotServeTests(t *testing.T) {
	// The tests live beside static/, not in it, so they stay out of the binary.
	res, _ := get(t, Handler(), "/unit/graphql.test.mjs")
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d, want 404", res.StatusCode)
	}
}

func TestHandlerRevalidatesWithETags(t *testing.T) {
	h := Handler()
	for _, target := range []string{"/js/app.js", "/u/ada"} {
		t.Run(target, func(t *testing.T) {
			res, _ := get(t, h, target)
			tag := res.Header.Get("ETag")
			if !strings.HasPrefix(tag, `"`) || len(tag) < 10 {
				t.Fatalf("ETag %q", tag)
			}
			if cc := res.Header.Get("Cache-Control"); cc != "no-cache" {
				t.Errorf("Cache-Control %q", cc)
			}
			req := httptest.NewRequest(http.MethodGet, target, nil)
			req.Header.Set("If-None-Match", tag)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusNotModified {
				t.Errorf("status %d with a matching If-None-Match, want 304", rec.Code)
			}
		})
	}
}

func TestHandlerRedirectsIndexHTMLToRoot(t *testing.T) {
	res, _ := get(t, Handler(), "/index.html")
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "./" {
		t.Fatalf("status %d, Location %q; want 301 to ./", res.StatusCode, res.Header.Get("Location"))
	}
}
