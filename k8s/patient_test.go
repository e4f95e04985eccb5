package k8s

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

// refused is the error client-go returns while nothing listens on the API
// server's port.
func refused() error {
	return &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api/v1/services", Err: &net.OpError{
		Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}}
}

func TestUnavailable(t *testing.T) {
	gr := schema.GroupResource{Resource: "services"}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{refused(), true},
		{fmt.Errorf("list: %w", refused()), true},
		{&url.Error{Op: "Get", URL: "https://x", Err: syscall.ECONNRESET}, true},
		{apierrors.NewTooManyRequests("slow down", 1), true},
		{&url.Error{Op: "Get", URL: "https://x", Err: &net.OpError{Op: "dial", Err: &os.SyscallError{Syscall: "connect", Err: syscall.EHOSTUNREACH}}}, true},
		{&url.Error{Op: "Get", URL: "https://kube-api:6443", Err: &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "kube-api", IsNotFound: true}}}, true},
		{apierrors.NewServiceUnavailable("starting"), true},
		{apierrors.NewServerTimeout(gr, "list", 1), true},
		{apierrors.NewResourceExpired("too old resource version"), false},
		{apierrors.NewForbidden(gr, "", errors.New("no RBAC")), false},
		{apierrors.NewBadRequest("bad"), false},
		{errors.New("something else"), false},
	} {
		if got := Unavailable(tt.err); got != tt.want {
			t.Errorf("Unavailable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// fakeLW fails its first `fails` calls of each verb with err.
type fakeLW struct {
	fails int32
	err   error
	lists atomic.Int32
	watch atomic.Int32
}

func (f *fakeLW) listWatch() *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			if f.lists.Add(1) <= f.fails {
				return nil, f.err
			}
			return &corev1.ServiceList{}, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			if f.watch.Add(1) <= f.fails {
				return nil, f.err
			}
			return watch.NewFake(), nil
		},
	}
}

// TestPatientRetriesAtMostASecondApart: while the API server refuses
// connections, a list retries by itself, and a one-second step of the clock
// always lets the next try happen, however many failed before (the
// reflector's own backoff reaches 30 s): the first try after the API server
// is back is at most a second late.
func TestPatientRetriesAtMostASecondApart(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f := &fakeLW{fails: 25, err: refused()}
	lw := Patient(f.listWatch(), "Service", clk, nil)
	done := make(chan error, 1)
	go func() {
		_, err := lw.ListWithContext(t.Context(), metav1.ListOptions{})
		done <- err
	}()
	for i := int32(1); i <= f.fails; i++ {
		waitFor(t, func() bool { return clk.HasWaiters() })
		if n := f.lists.Load(); n != i {
			t.Fatalf("after failure %d: %d list calls while waiting, want %d (no retry before the delay)", i, n, i)
		}
		clk.Step(patientMaxDelay)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("list after the API server is back: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("list did not return once the API server answered")
	}
	if n := f.lists.Load(); n != f.fails+1 {
		t.Errorf("%d list calls, want %d", n, f.fails+1)
	}
}

// TestPatientWatchRetries: the same for a watch.
func TestPatientWatchRetries(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f := &fakeLW{fails: 3, err: apierrors.NewServiceUnavailable("apiserver is shutting down")}
	lw := Patient(f.listWatch(), "EndpointSlice", clk, nil)
	done := make(chan error, 1)
	go func() {
		w, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{})
		if w != nil {
			w.Stop()
		}
		done <- err
	}()
	for range f.fails {
		waitFor(t, func() bool { return clk.HasWaiters() })
		clk.Step(patientMaxDelay)
	}
	if err := <-done; err != nil {
		t.Fatalf("watch: %v", err)
	}
	if n := f.watch.Load(); n != f.fails+1 {
		t.Errorf("%d watch calls, want %d", n, f.fails+1)
	}
}

// TestPatientPassesOtherErrors: an error the API server's absence does not
// explain (an expired resource version, RBAC) goes to the reflector at once,
// which relists or backs off as before.
func TestPatientPassesOtherErrors(t *testing.T) {
	for _, err := range []error{
		apierrors.NewResourceExpired("too old resource version: 1 (20)"),
		apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", errors.New("no RBAC")),
	} {
		f := &fakeLW{fails: 1, err: err}
		lw := Patient(f.listWatch(), "Service", clocktesting.NewFakeClock(time.Unix(1000, 0)), nil)
		if _, got := lw.WatchWithContext(t.Context(), metav1.ListOptions{}); got != err {
			t.Errorf("watch returned %v, want %v", got, err)
		}
		if n := f.watch.Load(); n != 1 {
			t.Errorf("%v: %d watch calls, want 1", err, n)
		}
	}
}

// TestPatientEndsWithItsContext: a retrying list returns when the informer
// stops.
func TestPatientEndsWithItsContext(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f := &fakeLW{fails: 1 << 30, err: refused()}
	lw := Patient(f.listWatch(), "Node", clk, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := lw.ListWithContext(ctx, metav1.ListOptions{})
		done <- err
	}()
	waitFor(t, func() bool { return clk.HasWaiters() })
	cancel()
	select {
	case err := <-done:
		if !Unavailable(err) {
			t.Errorf("list ended with %v, want the last refusal", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("list did not end with its context")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPatientBackoffStaysUnderASecond: every wait of the retry policy, at
// any failure count, is within 75-125 % of 100 ms doubling to 800 ms, so
// at most patientMaxDelay (the jitter is random: many sequences are drawn).
func TestPatientBackoffStaysUnderASecond(t *testing.T) {
	below, above := 0, 0
	for range 200 {
		b := patientBackoff
		base := 100 * time.Millisecond
		for n := 1; n < 100; n++ {
			d := b.Step()
			if d < base*3/4 || d >= base*5/4 || d > patientMaxDelay {
				t.Fatalf("wait after failure %d = %v, want in [%v, %v) and at most %v", n, d, base*3/4, base*5/4, patientMaxDelay)
			}
			if d < base {
				below++
			} else {
				above++
			}
			base = min(2*base, 800*time.Millisecond)
		}
	}
	if below == 0 || above == 0 { // the jitter goes both ways
		t.Fatalf("%d waits below the step, %d at or above it: want both", below, above)
	}
}

// TestPatientLogsALastingOutage: the first failure is a warning, a lasting
// outage is warned of again every 30 s, and its end is said once.
func TestPatientLogsALastingOutage(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var buf bytes.Buffer
	var mu sync.Mutex
	log := hclog.New(&hclog.LoggerOptions{Output: &lockedWriter{w: &buf, mu: &mu}, Level: hclog.Info})
	f := &fakeLW{fails: 45, err: refused()}
	lw := Patient(f.listWatch(), "Service", clk, log)
	done := make(chan error, 1)
	go func() {
		_, err := lw.ListWithContext(t.Context(), metav1.ListOptions{})
		done <- err
	}()
	for range f.fails {
		waitFor(t, func() bool { return clk.HasWaiters() })
		clk.Step(patientMaxDelay)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for what, want := range map[string]int{"Kubernetes API unavailable": 1, "Kubernetes API still unavailable": 1, "Kubernetes API answers again": 1} {
		if n := strings.Count(out, what); n != want {
			t.Errorf("%q logged %d times, want %d:\n%s", what, n, want, out)
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
