package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

// failsafe bounds every wait for the worker goroutine; it is never reached
// when the code under test is right.
const failsafe = 10 * time.Second

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeStore is an in-memory twin of the consul client: CAS on the service
// index, all-or-nothing applies, ownership checks like the real writer.
type fakeStore struct {
	cluster ownership.Cluster

	mu        sync.Mutex
	entries   map[string]consul.Registered
	index     uint64
	applies   []consul.Change // a copy of every Apply's change
	ctxErrs   []error         // ctx.Err() seen by every Apply
	reads     int
	fails     []error       // returned by the next applies, in order
	block     chan struct{} // the next Apply waits for it to close
	onApply   func()        // runs inside every Apply (before it commits)
	panics    int           // the next applies panic
	readFails int           // the next reads fail

	applied chan consul.Change // every Apply, as it starts
	started chan struct{}      // a blocked Apply is waiting
}

func newFakeStore(cluster ownership.Cluster) *fakeStore {
	return &fakeStore{
		cluster: cluster,
		entries: map[string]consul.Registered{},
		index:   100,
		applied: make(chan consul.Change, 1000),
		started: make(chan struct{}, 1),
	}
}

var errTransient = errors.New("consul: 500 leader lost")

// failNext makes the next n applies return err.
func (s *fakeStore) failNext(n int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < n; i++ {
		s.fails = append(s.fails, err)
	}
}

// blockNext makes the next Apply wait until the returned func is called.
func (s *fakeStore) blockNext() (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	block := make(chan struct{})
	s.block = block
	return sync.OnceFunc(func() { close(block) })
}

func (s *fakeStore) Apply(ctx context.Context, ch consul.Change) (consul.Applied, error) {
	s.mu.Lock()
	cp := cloneChange(ch)
	s.applies = append(s.applies, cp)
	s.ctxErrs = append(s.ctxErrs, ctx.Err())
	block, hook := s.block, s.onApply
	s.block = nil
	panics := s.panics > 0
	if panics {
		s.panics--
	}
	s.mu.Unlock()
	s.applied <- cp
	if panics {
		panic("store exploded")
	}
	if block != nil {
		s.started <- struct{}{}
		select {
		case <-block:
		case <-ctx.Done():
			return consul.Applied{}, ctx.Err()
		}
	}
	if hook != nil {
		hook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fails) > 0 {
		err := s.fails[0]
		s.fails = s.fails[1:]
		return consul.Applied{}, err
	}
	return s.commit(ch)
}

// commit applies ch atomically; s.mu is held.
func (s *fakeStore) commit(ch consul.Change) (consul.Applied, error) {
	for _, in := range ch.Register {
		if err := s.cluster.Stamped(in); err != nil {
			return consul.Applied{}, fmt.Errorf("%w: %v", consul.ErrRefused, err)
		}
	}
	for _, u := range ch.Update {
		if err := s.cluster.Stamped(u.Want); err != nil {
			return consul.Applied{}, fmt.Errorf("%w: %v", consul.ErrRefused, err)
		}
		if err := s.cluster.Owns(u.Have); err != nil {
			return consul.Applied{}, fmt.Errorf("%w: %v", consul.ErrRefused, err)
		}
	}
	for _, r := range ch.Deregister {
		if err := s.cluster.Owns(r); err != nil {
			return consul.Applied{}, fmt.Errorf("%w: %v", consul.ErrRefused, err)
		}
	}
	next := maps.Clone(s.entries)
	index := s.index
	var done consul.Applied
	conflict := func(id string) (consul.Applied, error) {
		return consul.Applied{}, fmt.Errorf("txn rolled back: %w: %s", consul.ErrConflict, id)
	}
	write := func(in consul.Instance) {
		index++
		r := consul.Registered{Instance: cloneInstance(in), Node: s.cluster.NodeName(), ServiceIndex: index, CheckIndex: index, HasCheck: true}
		next[in.ID] = r
		done.Written = append(done.Written, r)
	}
	for _, r := range ch.Deregister {
		if cur, ok := next[r.ID]; !ok || cur.ServiceIndex != r.ServiceIndex {
			return conflict(r.ID)
		}
		delete(next, r.ID)
		done.Deleted = append(done.Deleted, r.ID)
		done.Deregistered++
	}
	for _, u := range ch.Update {
		if cur, ok := next[u.Have.ID]; !ok || cur.ServiceIndex != u.Have.ServiceIndex || u.Want.ID != u.Have.ID {
			return conflict(u.Have.ID)
		}
		write(u.Want)
		done.Updated++
	}
	for _, in := range ch.Register {
		if _, ok := next[in.ID]; ok {
			return conflict(in.ID)
		}
		write(in)
		done.Registered++
	}
	s.entries, s.index = next, index
	done.Txns = 1
	done.Ops = 1 + 2*(len(ch.Register)+len(ch.Update)) + len(ch.Deregister)
	return done, nil
}

func (s *fakeStore) ReadPrefix(ctx context.Context, prefix string) ([]consul.Registered, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.readFails > 0 {
		s.readFails--
		return nil, errTransient
	}
	var out []consul.Registered
	for id, r := range s.entries {
		if strings.HasPrefix(id, prefix) {
			r.Instance = cloneInstance(r.Instance)
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, ctx.Err()
}

// put stores in as if written by fleetsync earlier; it returns the entry.
func (s *fakeStore) put(in consul.Instance) consul.Registered {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index++
	r := consul.Registered{Instance: cloneInstance(in), Node: s.cluster.NodeName(), ServiceIndex: s.index, CheckIndex: s.index, HasCheck: true}
	s.entries[in.ID] = r
	r.Instance = cloneInstance(in)
	return r
}

// edit changes an entry behind the worker's back (another writer).
func (s *fakeStore) edit(id string, f func(*consul.Registered)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.entries[id]
	if !ok {
		panic("no entry " + id)
	}
	r.Instance = cloneInstance(r.Instance)
	f(&r)
	s.index++
	r.ServiceIndex = s.index
	s.entries[id] = r
}

func (s *fakeStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.entries, id)
}

func (s *fakeStore) instances() []consul.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []consul.Instance
	for _, r := range s.entries {
		out = append(out, cloneInstance(r.Instance))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (s *fakeStore) counts() (applies, reads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.applies), s.reads
}

func (s *fakeStore) appliesCopy() []consul.Change {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.applies)
}

// fakeK8s is the informer cache of one Service, editable by the test.
type fakeK8s struct {
	mu         sync.Mutex
	svc        *k8s.Service
	selected   bool
	calls      int
	panics     int             // the next lookups panic
	gate       <-chan struct{} // lookups before it is closed are counted
	beforeGate int
}

func (f *fakeK8s) lookup() (*k8s.Service, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.gate != nil {
		select {
		case <-f.gate:
		default:
			f.beforeGate++
		}
	}
	if f.panics > 0 {
		f.panics--
		panic("lookup exploded")
	}
	return cloneSvc(f.svc), f.selected
}

// update edits the Service (create it with newSvc first).
func (f *fakeK8s) update(edit func(*k8s.Service)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	edit(f.svc)
}

func (f *fakeK8s) set(svc *k8s.Service, selected bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.svc, f.selected = svc, selected
}

func (f *fakeK8s) deselect() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.selected = false
}

func (f *fakeK8s) current() (*k8s.Service, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return cloneSvc(f.svc), f.selected
}

type fakeObserver struct {
	mu        sync.Mutex
	events    int
	conflicts int
	flushes   []Flush
	flushed   chan Flush
}

func (o *fakeObserver) Event() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events++
}

func (o *fakeObserver) Conflict() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.conflicts++
}

func (o *fakeObserver) Flushed(f Flush) {
	o.mu.Lock()
	o.flushes = append(o.flushes, f)
	o.mu.Unlock()
	o.flushed <- f
}

func (o *fakeObserver) snapshot() (events, conflicts int, flushes []Flush) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.events, o.conflicts, slices.Clone(o.flushes)
}

type warning struct{ reason, msg string }

type fakeReporter struct {
	mu       sync.Mutex
	warnings []warning
	panics   int
}

func (r *fakeReporter) Warning(obj k8sruntime.Object, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if obj == nil {
		panic("Warning without an object")
	}
	r.warnings = append(r.warnings, warning{reason, message})
	if r.panics > 0 {
		r.panics--
		panic("reporter exploded")
	}
}

func (r *fakeReporter) count(reason string) int {
	n := 0
	for _, w := range r.got() {
		if w.reason == reason {
			n++
		}
	}
	return n
}

func (r *fakeReporter) got() []warning {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.warnings)
}

// harness runs one Worker against the fakes with a fake clock.
type harness struct {
	t     *testing.T
	clk   *clocktesting.FakeClock
	store *fakeStore
	k8s   *fakeK8s
	obs   *fakeObserver
	rep   *fakeReporter
	cfg   Config
	w     *Worker

	cancel  context.CancelFunc
	done    chan error
	result  error
	stopped bool
}

// newHarness builds a worker for svc (selected), with window 1s, backoff
// 200ms-30s and the owned state known to be empty; edit changes options.
func newHarness(t *testing.T, svc *k8s.Service, edit func(*harness, *Options)) *harness {
	t.Helper()
	cluster := testCluster(t)
	h := &harness{
		t:     t,
		clk:   clocktesting.NewFakeClock(t0),
		store: newFakeStore(cluster),
		k8s:   &fakeK8s{svc: svc, selected: true},
		obs:   &fakeObserver{flushed: make(chan Flush, 1000)},
		rep:   &fakeReporter{},
	}
	opts := Options{
		Key:        testKey,
		Config:     testConfig(t),
		Lookup:     h.k8s.lookup,
		Store:      h.store,
		Clock:      h.clk,
		Reporter:   h.rep,
		Observer:   h.obs,
		OwnedKnown: true,
		MinBackoff: 200 * time.Millisecond,
		MaxBackoff: 30 * time.Second,
	}
	if edit != nil {
		edit(h, &opts)
	}
	h.cfg = opts.Config
	h.w = New(opts)
	t.Cleanup(func() { h.stop() })
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.w.Run(ctx) }()
}

// stop cancels Run and returns its result.
func (h *harness) stop() error {
	h.t.Helper()
	if h.cancel == nil || h.stopped {
		return h.result
	}
	h.cancel()
	return h.wait()
}

// wait returns Run's result once it has returned by itself.
func (h *harness) wait() error {
	h.t.Helper()
	if h.stopped {
		return h.result
	}
	select {
	case h.result = <-h.done:
		h.stopped = true
		h.cancel()
		return h.result
	case <-time.After(failsafe):
		h.t.Fatal("Run did not return")
		return nil
	}
}

// notify records a change to the Service and tells the worker.
func (h *harness) notify(edit func(*k8s.Service)) {
	if edit != nil {
		h.k8s.update(edit)
	}
	h.w.Notify()
}

// flush waits for the next flush to be recorded.
func (h *harness) flush() Flush {
	h.t.Helper()
	select {
	case f := <-h.obs.flushed:
		return f
	case <-time.After(failsafe):
		h.t.Fatalf("no flush within %v; status %+v", failsafe, h.w.Status())
		return Flush{}
	}
}

// apply waits for the next Apply and returns its change.
func (h *harness) apply() consul.Change {
	h.t.Helper()
	select {
	case ch := <-h.store.applied:
		return ch
	case <-time.After(failsafe):
		h.t.Fatalf("no Apply within %v; status %+v", failsafe, h.w.Status())
		return consul.Change{}
	}
}

// flushWrote waits for the next Apply and the flush it belongs to, which
// must have succeeded.
func (h *harness) flushWrote() (consul.Change, Flush) {
	h.t.Helper()
	ch := h.apply()
	f := h.flush()
	if f.Err != nil || !f.Wrote {
		h.t.Fatalf("flush after Apply: err %v, wrote %v", f.Err, f.Wrote)
	}
	return ch, f
}

// wrote waits for a flush that wrote and checks what it wrote.
func (h *harness) wrote(want ...string) Flush {
	h.t.Helper()
	ch, f := h.flushWrote()
	wantChange(h.t, ch, want...)
	return f
}

// until polls cond until it holds: only to wait for the worker goroutine
// to reach a blocking point.
func (h *harness) until(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(failsafe)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("worker never %s; status %+v", what, h.w.Status())
		}
		runtime.Gosched()
	}
}

// awaitBlockedIn waits until a goroutine is blocked in a select or channel
// operation inside function fn (as named in a stack trace).
func (h *harness) awaitBlockedIn(fn string) {
	h.t.Helper()
	buf := make([]byte, 1<<20)
	h.until("blocked in "+fn, func() bool {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if (strings.Contains(header, "[select") || strings.Contains(header, "[chan receive")) && strings.Contains(g, fn+"(") {
				return true
			}
		}
		return false
	})
}

// awaitTimer waits until the worker has armed its window timer.
func (h *harness) awaitTimer() {
	h.t.Helper()
	h.until("armed a timer", h.clk.HasWaiters)
}

// awaitIdle waits until the worker has done flushes flushes and is idle
// (or invalid) with nothing pending.
func (h *harness) awaitIdle(looks uint64) Status {
	h.t.Helper()
	var st Status
	h.until(fmt.Sprintf("became idle after %d looks", looks), func() bool {
		st = h.w.Status()
		return st.Looks == looks && (st.State == StateIdle || st.State == StateInvalid) && !st.Pending
	})
	if h.clk.HasWaiters() {
		h.t.Fatalf("idle worker has a timer armed; status %+v", st)
	}
	return st
}

// stepNotFired moves the clock by d and checks that the worker's timer has
// not fired (it is still a waiter of the clock).
func (h *harness) stepNotFired(d time.Duration) {
	h.t.Helper()
	h.awaitTimer()
	h.clk.Step(d)
	if !h.clk.HasWaiters() {
		h.t.Fatalf("timer fired at +%v", h.clk.Now().Sub(t0))
	}
}

// stepFire moves the clock by d (after the timer is armed) and checks that
// it fired.
func (h *harness) stepFire(d time.Duration) {
	h.t.Helper()
	h.awaitTimer()
	h.clk.Step(d)
	if h.clk.HasWaiters() {
		h.t.Fatalf("timer did not fire at +%v", h.clk.Now().Sub(t0))
	}
}

// quiet checks that nothing happened that the test did not wait for.
func (h *harness) quiet() {
	h.t.Helper()
	if n := len(h.store.applied); n != 0 {
		h.t.Errorf("%d unexpected applies", n)
	}
	if n := len(h.obs.flushed); n != 0 {
		h.t.Errorf("%d unexpected flushes", n)
	}
}

// converged checks that Consul holds exactly the desired instances.
func (h *harness) converged() {
	h.t.Helper()
	var want []consul.Instance
	if svc, selected := h.k8s.current(); svc != nil && selected {
		spec, err := Desired(svc, h.cfg)
		if err != nil {
			h.t.Fatalf("Desired: %v", err)
		}
		want = spec.Instances
	}
	h.holds(want)
}

// holds checks that Consul holds exactly want.
func (h *harness) holds(want []consul.Instance) {
	h.t.Helper()
	got := h.store.instances()
	if len(got) != len(want) {
		h.t.Fatalf("Consul has %v, want %v", ids(got), ids(want))
	}
	for i := range got {
		if !got[i].Equal(want[i]) {
			h.t.Errorf("instance %s:\n got %+v\nwant %+v", got[i].ID, got[i], want[i])
		}
	}
}

// describe summarises a change: +addr:port registered, ~addr:port updated
// (with its user tags), -addr:port deregistered.
func describe(ch consul.Change) []string {
	var out []string
	for _, r := range ch.Register {
		out = append(out, fmt.Sprintf("+%s:%d", r.Address, r.Port))
	}
	for _, u := range ch.Update {
		out = append(out, fmt.Sprintf("~%s:%d%v", u.Want.Address, u.Want.Port, u.Want.Tags))
	}
	for _, r := range ch.Deregister {
		out = append(out, fmt.Sprintf("-%s:%d", r.Address, r.Port))
	}
	return out
}

func ids(in []consul.Instance) []string {
	out := make([]string, len(in))
	for i, x := range in {
		out[i] = x.ID
	}
	return out
}

func wantChange(t *testing.T, ch consul.Change, want ...string) {
	t.Helper()
	if got := describe(ch); !slices.Equal(got, want) {
		t.Errorf("change %q, want %q", got, want)
	}
}

// tags returns an edit setting the service-tags annotation.
func tags(v string) func(*k8s.Service) {
	return func(s *k8s.Service) { s.Annotations[AnnotationTags] = v }
}

func addEndpoint(ep k8s.Endpoint) func(*k8s.Service) {
	return func(s *k8s.Service) { s.Endpoints = append(s.Endpoints, ep) }
}
