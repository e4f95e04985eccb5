package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// DefaultStartTimeout bounds one start of a server (all attempts together)
// when neither the options nor the context say otherwise.
const DefaultStartTimeout = 2 * time.Minute

// startAttempts is how often a start is tried when a picked port was taken.
const startAttempts = 3

// freePorts returns n distinct ports that were free on 127.0.0.1 a moment ago.
// All n listeners are held open together so that the ports are distinct.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// errPortTaken marks a failed start that a retry with new ports may fix.
var errPortTaken = errors.New("a picked port was taken")

// portClash reports whether a child's log says it could not bind.
func portClash(p *Process) bool {
	t := p.LogTail(40)
	return strings.Contains(t, "address already in use") || strings.Contains(t, "bind: permission denied")
}

// pollInterval is the readiness poll period.
const pollInterval = 50 * time.Millisecond

// waitFor polls check until it reports ready, one of procs exits (an error
// with its log tail; errPortTaken-wrapped when it could not bind), or ctx
// ends (an error with the last check error and the logs).
func waitFor(ctx context.Context, what string, procs []*Process, check func(context.Context) (bool, error)) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	var last error
	for {
		for _, p := range procs {
			if p.Exited() {
				err := fmt.Errorf("waiting for %s: %s", what, p.describe())
				if portClash(p) {
					err = fmt.Errorf("%w: %w", errPortTaken, err)
				}
				return err
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := check(cctx)
		cancel()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			var b strings.Builder
			fmt.Fprintf(&b, "waiting for %s: %v (last check: %v)", what, ctx.Err(), last)
			for _, p := range procs {
				b.WriteString("\n  ")
				b.WriteString(p.describe())
			}
			err := errors.New(b.String())
			for _, p := range procs {
				if portClash(p) {
					return fmt.Errorf("%w: %w", errPortTaken, err)
				}
			}
			return err
		case <-t.C:
		}
	}
}

// withStartTimeout applies a default deadline when ctx has none.
func withStartTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		d = DefaultStartTimeout
	}
	return context.WithTimeout(ctx, d)
}

// httpGet GETs url (with a bearer token if set) and returns the status code
// and up to 64 KiB of the body.
func httpGet(ctx context.Context, c *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), err
}
