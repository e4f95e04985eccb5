package k8s

import (
	"context"
	"errors"
	"math"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// patientBackoff is the wait between two tries of a Patient list or watch
// while the API server is away: 100 ms doubling to 800 ms, each jittered
// to 75-125 %, so never more than patientMaxDelay. wait.Backoff jitters
// upwards only, so its steps are 75 % of those (75 ms doubling to 600 ms)
// and the jitter adds up to 2/3 of a step.
var patientBackoff = wait.Backoff{Duration: 75 * time.Millisecond, Factor: 2, Jitter: 2.0 / 3, Steps: math.MaxInt32, Cap: 600 * time.Millisecond}

// patientMaxDelay bounds every wait of patientBackoff.
const patientMaxDelay = time.Second

// Patient wraps the list and watch of an informer so that, while the
// Kubernetes API cannot answer (connection refused or reset, 429, 503, a
// server timeout), the call retries by itself at most patientMaxDelay
// apart instead of returning the error to the informer's reflector.
//
// Why: the reflector backs off on every failed list or watch, 800 ms
// doubling to 30 s with a jitter of 1.0, and forgets it only after two
// quiet minutes; client-go lets no informer built on SharedIndexInformer
// change that. After a 15 s kube-apiserver restart its next try can be
// 25 s away, and every change made meanwhile reaches Consul that much
// later (TestChangeAfterAnAPIServerOutageIsPrompt). fleetsync runs a
// few informers per replica, so one request per informer and second while
// the API server is down costs it nothing.
//
// Other errors (410 Gone, 403, a bad request) go to the reflector as
// before. The first failure of an outage is logged as a warning, again
// every 30 s while it lasts, its end at info with how long it lasted. A nil clk is the real clock.
func Patient(lw *cache.ListWatch, kind string, clk clock.Clock, log hclog.Logger) *cache.ListWatch {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	p := &patient{kind: kind, clock: clk, log: log}
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return retry(ctx, p, "list", func() (runtime.Object, error) { return list(ctx, opts) })
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return retry(ctx, p, "watch", func() (watch.Interface, error) { return watchFn(ctx, opts) })
		},
	}
}

type patient struct {
	kind  string
	clock clock.Clock
	log   hclog.Logger

	mu     sync.Mutex
	since  time.Time // start of the outage; zero when the API answers
	logged time.Time // the outage's last warning
}

// patientLogEvery is how often a lasting outage is logged again.
const patientLogEvery = 30 * time.Second

// retry calls f until it succeeds, fails with an error the API server's
// absence does not explain, or ctx ends.
func retry[T any](ctx context.Context, p *patient, verb string, f func() (T, error)) (T, error) {
	retries := patientBackoff
	for {
		v, err := f()
		if err == nil || !Unavailable(err) || ctx.Err() != nil {
			if err == nil {
				p.answered()
			}
			return v, err
		}
		p.failed(verb, err)
		t := p.clock.NewTimer(retries.Step())
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C():
		}
	}
}

func (p *patient) failed(verb string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	switch {
	case p.since.IsZero():
		p.since, p.logged = now, now
		p.log.Warn("Kubernetes API unavailable, retrying every second at most", "kind", p.kind, "request", verb, "error", err)
	case now.Sub(p.logged) >= patientLogEvery:
		p.logged = now
		p.log.Warn("Kubernetes API still unavailable, retrying every second at most", "kind", p.kind, "request", verb,
			"unavailable_for", now.Sub(p.since).Round(time.Second), "error", err)
	}
}

func (p *patient) answered() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.since.IsZero() {
		p.log.Info("Kubernetes API answers again", "kind", p.kind, "unavailable_for", p.clock.Since(p.since).Round(time.Millisecond))
		p.since = time.Time{}
	}
}

// Unavailable reports whether err says the Kubernetes API server is not
// there or not serving right now (rather than refusing the request).
func Unavailable(err error) bool {
	var ne net.Error
	switch {
	case err == nil:
		return false
	case utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err), utilnet.IsProbableEOF(err):
		return true
	case apierrors.IsTooManyRequests(err), apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return true
	}
	// The API server's name does not resolve (yet): DNS during a failover.
	var dns *net.DNSError
	return errors.As(err, &dns)
}
