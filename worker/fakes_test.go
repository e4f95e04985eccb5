package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/consultest"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

// failsafe bounds every wait for the worker goroutine; it is never reached
// when the code under test is right.
const failsafe = 10 * time.Second

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeStore is the worker's Store in these tests: the real consul.Client
// on the Consul twin (consul/consultest), with a record of every Apply and
// faults the test asks for around it.
type fakeStore struct {
	*consul.Client
	twin    *consultest.Server
	setup   *consul.Client // fleetsync's earlier writes (put)
	other   *api.Client    // someone else writing to the catalog
	cluster ownership.Cluster

	mu         sync.Mutex
	applies    []consul.Change // a copy of every Apply's change
	ctxErrs    []error         // ctx.Err() seen by every Apply
	reads      int             // ReadPrefix calls
	byName     int             // ReadService calls
	indexReads int             // ServiceIndex calls
	nodeReads  int             // NodeIndex calls
	marksReads int             // CatalogMarks calls
	// staleMarks, when set, is a shared read of the marks begun at
	// staleAt (the harness's clock): answered to a caller that accepts
	// a read that old.
	staleMarks *consul.CatalogMarks
	staleAt    time.Time
	fails      []error          // returned by the next applies, in order
	block      chan struct{}    // the next Apply waits for it to close
	onApply    func()           // runs inside every Apply (before it commits)
	panics     int              // the next applies panic
	readFails  int              // the next reads fail
	now        func() time.Time // the harness's clock
	readTimes  []time.Time      // when each read was made, by that clock

	applied chan consul.Change // every Apply, as it starts
	started chan struct{}      // a blocked Apply is waiting
}

func newFakeStore(t testing.TB, cluster ownership.Cluster) *fakeStore {
	twin := consultest.New(t)
	return &fakeStore{
		// The marks are read on every call: the harness's clock is fake,
		// the sharing's is not (consul.TestCatalogMarksAreSharedForMaxAge).
		Client:  consul.NewClient(twin.Client(), cluster, consul.Options{MarksMaxAge: -1}),
		twin:    twin,
		setup:   consul.NewClient(twin.Client(), cluster, consul.Options{}),
		other:   twin.Client(),
		cluster: cluster,
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
			ch.Permit.Release()
			return consul.Applied{}, ctx.Err()
		}
	}
	if hook != nil {
		hook()
	}
	s.mu.Lock()
	if len(s.fails) > 0 {
		err := s.fails[0]
		s.fails = s.fails[1:]
		s.mu.Unlock()
		ch.Permit.Release()
		return consul.Applied{}, err
	}
	s.mu.Unlock()
	return s.Client.Apply(ctx, ch)
}

func (s *fakeStore) readFault() error {
	if s.readFails > 0 {
		s.readFails--
		return errTransient
	}
	return nil
}

// read counts one read in *n and returns the read fault due, if any.
func (s *fakeStore) read(n *int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*n++
	if s.now != nil {
		s.readTimes = append(s.readTimes, s.now())
	}
	return s.readFault()
}

// firstRead is the time of the first read (zero if none).
func (s *fakeStore) firstRead() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.readTimes) == 0 {
		return time.Time{}
	}
	return s.readTimes[0]
}

func (s *fakeStore) ReadPrefix(ctx context.Context, prefix string) ([]consul.Registered, error) {
	if err := s.read(&s.reads); err != nil {
		return nil, err
	}
	return s.Client.ReadPrefix(ctx, prefix)
}

func (s *fakeStore) ReadService(ctx context.Context, name string) ([]consul.Registered, uint64, error) {
	if err := s.read(&s.byName); err != nil {
		return nil, 0, err
	}
	return s.Client.ReadService(ctx, name)
}

func (s *fakeStore) NodeIndex(ctx context.Context, node string) (uint64, error) {
	if err := s.read(&s.nodeReads); err != nil {
		return 0, err
	}
	return s.Client.NodeIndex(ctx, node)
}

func (s *fakeStore) CatalogMarks(ctx context.Context, after time.Time) (consul.CatalogMarks, error) {
	if err := s.read(&s.marksReads); err != nil {
		return consul.CatalogMarks{}, err
	}
	s.mu.Lock()
	stale, at := s.staleMarks, s.staleAt
	s.mu.Unlock()
	if stale != nil && !at.Before(after) {
		return *stale, nil
	}
	return s.Client.CatalogMarks(ctx, after)
}

func (s *fakeStore) ServiceIndex(ctx context.Context, name string) (uint64, error) {
	if err := s.read(&s.indexReads); err != nil {
		return 0, err
	}
	return s.Client.ServiceIndex(ctx, name)
}

// nameReads counts the reads by Consul name (anti-entropy passes).
func (s *fakeStore) nameReads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byName
}

// indexCalls counts the ServiceIndex calls (gated periodic passes).
func (s *fakeStore) indexCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.indexReads
}

// setCheck sets the status of an entry's check behind the worker's back.
func (s *fakeStore) setCheck(id, status string) {
	r := s.entry(id)
	reg := &api.CatalogRegistration{Node: r.Node, SkipNodeUpdate: true, Check: &api.AgentCheck{
		Node: r.Node, CheckID: consul.CheckID(id), Name: "tampered", Status: status, ServiceID: id}}
	if _, err := s.other.Catalog().Register(reg, nil); err != nil {
		panic(err)
	}
}

// put stores in as if written by fleetsync earlier; it returns the entry.
func (s *fakeStore) put(in consul.Instance) consul.Registered {
	done, err := s.setup.Apply(context.Background(), consul.Change{Register: []consul.Instance{in}})
	if err != nil || len(done.Written) != 1 {
		panic(fmt.Sprintf("put %s: %v", in.ID, err))
	}
	return done.Written[0]
}

// entry reads the entry with ID id; it panics when there is none.
func (s *fakeStore) entry(id string) consul.Registered {
	got, err := s.setup.ReadPrefix(context.Background(), id)
	for _, r := range got {
		if r.ID == id {
			return r
		}
	}
	panic(fmt.Sprintf("no entry %s: %v", id, err))
}

// edit changes an entry behind the worker's back: another writer
// registers the service again, its check left as it is.
func (s *fakeStore) edit(id string, f func(*consul.Registered)) {
	r := s.entry(id)
	f(&r)
	reg := &api.CatalogRegistration{Node: r.Node, SkipNodeUpdate: true, Service: &api.AgentService{
		ID: r.ID, Service: r.Name, Address: r.Address, Port: r.Port, Tags: r.Tags, Meta: r.Meta}}
	if _, err := s.other.Catalog().Register(reg, nil); err != nil {
		panic(err)
	}
}

// remove deletes an entry behind the worker's back.
func (s *fakeStore) remove(id string) {
	r := s.entry(id)
	if _, err := s.other.Catalog().Deregister(&api.CatalogDeregistration{Node: r.Node, ServiceID: id}, nil); err != nil {
		panic(err)
	}
}

// instances is what Consul holds on the cluster's nodes, by ID.
func (s *fakeStore) instances() []consul.Instance {
	got, err := s.setup.ReadPrefix(context.Background(), "")
	if err != nil {
		panic(err)
	}
	out := make([]consul.Instance, 0, len(got))
	for _, r := range got {
		out = append(out, r.Instance)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// counts counts the applies and the reads (by prefix or by name).
func (s *fakeStore) counts() (applies, reads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.applies), s.reads + s.byName
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

func (f *fakeK8s) lookups() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
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

	gated   chan struct{} // Run waits for its Gate
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
		store: newFakeStore(t, cluster),
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
	h.store.now = h.clk.Now
	h.w = New(opts)
	h.gated = make(chan struct{}, 1)
	h.w.atGate = func() { h.gated <- struct{}{} }
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

// awaitGate waits until Run waits for its Gate.
func (h *harness) awaitGate() {
	h.t.Helper()
	select {
	case <-h.gated:
	case <-time.After(failsafe):
		h.t.Fatalf("worker never waited for its gate; status %+v", h.w.Status())
	}
}

// awaitBlocked waits until an Apply blocked by blockNext is waiting.
func (h *harness) awaitBlocked() {
	h.t.Helper()
	select {
	case <-h.store.started:
	case <-time.After(failsafe):
		h.t.Fatalf("Apply never blocked; status %+v", h.w.Status())
	}
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
// (with its user tags), -addr:port deregistered (from the ID: an entry to
// delete is handed over as held, without its address).
func describe(ch consul.Change) []string {
	var out []string
	for _, r := range ch.Register {
		out = append(out, fmt.Sprintf("+%s:%d", r.Address, r.Port))
	}
	for _, u := range ch.Update {
		out = append(out, fmt.Sprintf("~%s:%d%v", u.Want.Address, u.Want.Port, u.Want.Tags))
	}
	for _, r := range ch.Deregister {
		parts := strings.Split(r.ID, "_")
		if len(parts) < 2 {
			out = append(out, "-"+r.ID)
			continue
		}
		out = append(out, "-"+parts[len(parts)-2]+":"+parts[len(parts)-1])
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
