package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"time"
)

// hugeAnswer is the size of the one huge answer of a garbage spell: over
// the daemon's cap on an answer (64 MiB), all whitespace, as the 1 GiB
// answer that once grew the daemon's memory without bound.
const hugeAnswer = 96 << 20

// garbageProxy is a loopback HTTP proxy in front of one address (a
// replica's way to Consul). It forwards every request, except while a
// spell is on: then each request is answered with status 200 and, in
// turn, an HTML page (not forwarded), Consul's answer cut in half, Consul's
// answer with a null element put into its first list (or, when it has
// none, the whole answer null), and once per spell a body of hugeAnswer
// bytes. A write forwarded while the spell is on may have been applied
// although its answer is garbage.
type garbageProxy struct {
	ln     net.Listener
	srv    *http.Server
	rp     *httputil.ReverseProxy
	served chan struct{}

	on      atomic.Bool
	huge    atomic.Bool  // the spell's huge answer is still to send
	garbled atomic.Int64 // answers replaced, all spells
}

func newGarbageProxy(target string) (*garbageProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("garbage proxy: %w", err)
	}
	to := &url.URL{Scheme: "http", Host: target}
	g := &garbageProxy{ln: ln, served: make(chan struct{}), rp: &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(to) },
		Transport:     &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second},
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}}
	g.srv = &http.Server{Handler: http.HandlerFunc(g.serve), ErrorLog: log.New(io.Discard, "", 0)}
	go func() {
		defer close(g.served)
		_ = g.srv.Serve(ln)
	}()
	return g, nil
}

func (g *garbageProxy) addr() string { return g.ln.Addr().String() }

// spell answers garbage from now until stop.
func (g *garbageProxy) spell() (stop func()) {
	g.huge.Store(true)
	g.on.Store(true)
	return func() { g.on.Store(false) }
}

func (g *garbageProxy) close() error {
	err := g.srv.Close()
	<-g.served
	return err
}

func (g *garbageProxy) serve(w http.ResponseWriter, r *http.Request) {
	if !g.on.Load() {
		g.rp.ServeHTTP(w, r)
		return
	}
	n := g.garbled.Add(1)
	if n%4 == 0 && g.huge.CompareAndSwap(true, false) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Consul-Index", "1")
		chunk := bytes.Repeat([]byte(" "), 1<<20)
		for range hugeAnswer / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // the client gave up reading: what it should do
			}
		}
		return
	}
	if n%4 == 1 || n%4 == 0 {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, "<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>\n")
		return
	}
	rec := httptest.NewRecorder()
	g.rp.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	if n%4 == 2 {
		body = body[:len(body)/2]
	} else {
		body = withNull(body)
	}
	for k, v := range rec.Header() {
		if k != "Content-Length" {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// withNull puts a null element first into body's first list of objects
// (or empty list); a body without one becomes null.
func withNull(body []byte) []byte {
	if i := bytes.Index(body, []byte("[{")); i >= 0 {
		return append(append(append([]byte(nil), body[:i+1]...), "null,"...), body[i+1:]...)
	}
	if i := bytes.Index(body, []byte("[]")); i >= 0 {
		return append(append(append([]byte(nil), body[:i+1]...), "null"...), body[i+1:]...)
	}
	return []byte("null")
}

// garbageFault turns one replica's proxy to garbage for hold.
func (w *world) garbageFault(ctx context.Context, rng *rand.Rand, hold time.Duration) error {
	r := w.allReplicas()[rng.IntN(len(w.allReplicas()))]
	if r.garbage == nil {
		return errNotYet
	}
	before := r.garbage.garbled.Load()
	id := w.chk.faultStart("consul-garbage", fmt.Sprintf("replica %s's answers garbage for %s (HTML, truncated JSON, null elements, one %d MiB body)",
		r.id, hold.Round(time.Second), hugeAnswer>>20), nil)
	stop := r.garbage.spell()
	sleep(ctx, hold)
	stop()
	w.chk.faultEnd(id)
	w.logf("consul-garbage: %d answers of replica %s garbled", r.garbage.garbled.Load()-before, r.id)
	return nil
}
