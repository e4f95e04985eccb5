package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestGarbageProxy: off, the answer is Consul's; during a spell, in turn
// an HTML page, Consul's answer cut short, a null element in its first
// list, the huge body (once a spell: HTML in its turn after that).
func TestGarbageProxy(t *testing.T) {
	const answer = `[{"Node":"a"},{"Node":"b"}]`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(up.Close)
	g, err := newGarbageProxy(strings.TrimPrefix(up.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.close() })
	get := func() (int, string) {
		resp, err := http.Get("http://" + g.addr() + "/v1/catalog/nodes")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := get(); code != 200 || b != answer {
		t.Fatalf("off: %d %q", code, b)
	}
	stop := g.spell()
	want := []func(string) bool{
		func(b string) bool { return strings.HasPrefix(b, "<html>") },
		func(b string) bool { return b == answer[:len(answer)/2] },
		func(b string) bool { return b == `[null,{"Node":"a"},{"Node":"b"}]` },
		func(b string) bool { return len(b) == hugeAnswer && strings.TrimSpace(b) == "" },
		func(b string) bool { return strings.HasPrefix(b, "<html>") },
		func(b string) bool { return b == answer[:len(answer)/2] },
		func(b string) bool { return b == `[null,{"Node":"a"},{"Node":"b"}]` },
		func(b string) bool { return strings.HasPrefix(b, "<html>") }, // no second huge body
	}
	for i, ok := range want {
		if code, b := get(); code != 200 || !ok(b) {
			t.Fatalf("answer %d of the spell: %d %.80q", i+1, code, b)
		}
	}
	stop()
	if code, b := get(); code != 200 || b != answer || g.garbled.Load() != int64(len(want)) {
		t.Fatalf("after the spell: %d %q, %d garbled", code, b, g.garbled.Load())
	}
}
