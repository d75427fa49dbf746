package web

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// pageURLs matches every src and href in the playground's page.
var pageURLs = regexp.MustCompile(`(?:src|href)="([^"]*)"`)

func TestPlaygroundServesThePageWithItsPolicy(t *testing.T) {
	h := Playground("/graphql")
	res, body := get(t, h, "/playground")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200", res.StatusCode)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "script-src 'self';", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-eval") || strings.Contains(csp, "script-src 'self' 'unsafe-inline'") {
		t.Errorf("Content-Security-Policy %q lets scripts run from text", csp)
	}
	if res.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("no nosniff header")
	}
	if !strings.Contains(body, `data-endpoint="/graphql"`) {
		t.Errorf("the page does not name the endpoint:\n%s", body)
	}
	// Every script is a file: script-src 'self' would refuse inline code.
	if n, withSrc := strings.Count(body, "<script"), strings.Count(body, "<script src="); n != withSrc || n == 0 {
		t.Errorf("%d <script> elements, %d of them with src; want all from files", n, withSrc)
	}
	if strings.Contains(body, "://") {
		t.Errorf("the page names another origin:\n%s", body)
	}
}

func TestPlaygroundServesEveryFileThePageLoads(t *testing.T) {
	h := Playground("/graphql")
	_, page := get(t, h, "/playground")
	app := Handler() // the favicon is the app's
	want := map[string]string{
		".js":  "text/javascript; charset=utf-8",
		".css": "text/css; charset=utf-8",
		".svg": "image/svg+xml",
	}
	matches := pageURLs.FindAllStringSubmatch(page, -1)
	if len(matches) < 6 {
		t.Fatalf("the page loads %d files, want GraphiQL, React, ReactDOM, their styles and ours", len(matches))
	}
	for _, m := range matches {
		target := m[1]
		t.Run(target, func(t *testing.T) {
			handler := h
			if !strings.HasPrefix(target, "/playground/") {
				handler = app
			}
			res, body := get(t, handler, target)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", res.StatusCode)
			}
			ext := target[strings.LastIndex(target, "."):]
			if ct := res.Header.Get("Content-Type"); ct != want[ext] {
				t.Errorf("Content-Type %q, want %q", ct, want[ext])
			}
			if strings.Contains(body, "<!doctype html>") {
				t.Errorf("got a page instead of the file")
			}
			if res.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("no nosniff header")
			}
		})
	}
}

func TestPlaygroundServesTheLicenses(t *testing.T) {
	h := Playground("/graphql")
	for _, target := range []string{
		"/playground/vendor/LICENSE-graphiql.txt",
		"/playground/vendor/LICENSE-react.txt",
		"/playground/vendor/LICENSE-react-dom.txt",
		"/playground/vendor/THIRD-PARTY-NOTICES.txt",
	} {
		t.Run(target, func(t *testing.T) {
			res, body := get(t, h, target)
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200", res.StatusCode)
			}
			if ct := res.Header.Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if !strings.Contains(body, "Permission is hereby granted") {
				t.Errorf("no license text in:\n%.300s", body)
			}
		})
	}
}

func TestPlaygroundKeeps404ForOtherPaths(t *testing.T) {
	h := Playground("/graphql")
	for _, target := range []string{
		"/playground/missing.js",
		"/playground/index.html",
		"/playground/README.md",
		"/playground/update.sh",
		"/playground/vendor/",
		"/playground/vendor/../playground.js",
		"/playgroundx",
	} {
		t.Run(target, func(t *testing.T) {
			res, _ := get(t, h, target)
			if res.StatusCode != http.StatusNotFound {
				t.Fatalf("status %d, want 404", res.StatusCode)
			}
		})
	}
}

func TestPlaygroundRedirectsTheDirectoryToThePage(t *testing.T) {
	res, _ := get(t, Playground("/graphql"), "/playground/")
	if res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/playground" {
		t.Fatalf("status %d, Location %q; want 301 to /playground", res.StatusCode, res.Header.Get("Location"))
	}
}

func TestPlaygroundRevalidatesWithETags(t *testing.T) {
	h := Playground("/graphql")
	for _, target := range []string{"/playground", "/playground/vendor/graphiql.min.js"} {
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

func TestPlaygroundEscapesTheEndpoint(t *testing.T) {
	_, body := get(t, Playground(`/api?x="><script>`), "/playground")
	if strings.Contains(body, `"><script>`) {
		t.Fatalf("the endpoint is not escaped:\n%s", body)
	}
}

func TestPlaygroundRefusesAnEndpointOnAnotherOrigin(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Playground accepted https://api.example/graphql; the page's CSP would block it")
		}
	}()
	Playground("https://api.example/graphql")
}
