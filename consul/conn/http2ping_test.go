package conn

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// holdProxy forwards TCP connections to a target; hold makes every
// connection open so far drop what it reads from then on (a peer gone
// without a reset), while new connections are forwarded.
type holdProxy struct {
	ln     net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool
	open   []net.Conn
	held   []*atomic.Bool // one per proxied connection
}

func newHoldProxy(t *testing.T, target string) *holdProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdProxy{ln: ln}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			held := &atomic.Bool{}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				c.Close()
				u.Close()
				return
			}
			p.open, p.held = append(p.open, c, u), append(p.held, held)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						dst.Close()
						return
					}
					if held.Load() {
						continue // dropped
					}
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			p.wg.Go(func() { pipe(u, c) })
			p.wg.Go(func() { pipe(c, u) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.closed = true
		for _, c := range p.open {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *holdProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.held {
		h.Store(true)
	}
}

// TestHTTP2DeadConnection: over HTTP/2, a connection whose peer stopped
// answering without a reset is closed by the PING health check, so the
// requests after it get a new connection; without the check every request
// went to the dead connection and timed out.
func TestHTTP2DeadConnection(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`"127.0.0.1:8300"`))
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	p := newHoldProxy(t, srv.Listener.Addr().String())
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	cn, err := Dial(t.Context(), Config{Addresses: []string{"https://" + p.ln.Addr().String()}, CAPem: ca, TLSServerName: "example.com"},
		DialOptions{PingAfter: 200 * time.Millisecond, PingTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if h2, err := cn.SpeaksHTTP2(t.Context()); err != nil || !h2 {
		t.Fatalf("HTTP/2 %t, error %v; want HTTP/2", h2, err)
	}
	p.hold()
	get := func() error {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		_, err := cn.SpeaksHTTP2(ctx)
		return err
	}
	var errs []error
	for range 5 {
		err := get()
		if err == nil {
			if len(errs) > 1 {
				t.Errorf("%d requests failed before one got a new connection: %v", len(errs), errs)
			}
			return
		}
		errs = append(errs, err)
	}
	t.Fatalf("every request went to the dead connection: %v", errs)
}
