package supervisor

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/loss"
	"github.com/fleetsync/fleetsync/worker"
)

// PerWorker says which workers export their own series: all, none, or the
// top K: the workers in trouble first (backing off, invalid, blocked by
// someone else's entries, or failing), then the most active since the last
// scrape (events + flushes + errors), then the most active in all.
type PerWorker struct {
	All  bool
	TopK int // when !All: 0 means none
}

// DefaultPerWorker is --metrics-per-worker's default: a bounded number of
// per-worker series whatever the number of Services (the fleet-wide
// series, histograms included, are always complete).
const DefaultPerWorker = "top-20"

// ParsePerWorker parses --metrics-per-worker: "all", "none" or "top-<K>".
func ParsePerWorker(s string) (PerWorker, error) {
	switch {
	case s == "all":
		return PerWorker{All: true}, nil
	case s == "none":
		return PerWorker{}, nil
	case strings.HasPrefix(s, "top-"):
		k, err := strconv.Atoi(strings.TrimPrefix(s, "top-"))
		if err == nil && k > 0 {
			return PerWorker{TopK: k}, nil
		}
	}
	return PerWorker{}, fmt.Errorf("%q: must be all, none or top-<K> (K > 0)", s)
}

// Metrics are the fleet's Prometheus metrics. Fleet-wide series are always
// complete; per-worker series are computed from worker status snapshots at
// scrape time, so a stopped worker leaves no stale series.
type Metrics struct {
	perWorker PerWorker
	sup       atomic.Pointer[Supervisor] // the one whose Options.Metrics it is

	rankMu   sync.Mutex
	lastSeen map[k8s.Key]uint64 // activity of each worker at the last scrape (top-K)

	events         prometheus.Counter
	flushes        prometheus.Counter
	flushErrors    prometheus.Counter
	conflicts      prometheus.Counter
	ops            *prometheus.CounterVec
	latency        prometheus.Histogram
	coalesced      prometheus.Histogram
	restarts       prometheus.Counter
	started        prometheus.Counter
	stopped        prometheus.Counter
	bootstrapSecs  prometheus.Gauge
	bootstrapRead  prometheus.Gauge
	bootstrapped   prometheus.Gauge
	bootstrapFails prometheus.Counter
	ownedAtStart   prometheus.Gauge
	foreignAtStart prometheus.Gauge
	resyncs        prometheus.Counter
	repairs        prometheus.Counter
	dataLost       *prometheus.CounterVec
	foreignNodes   prometheus.Gauge
	consulNodes    prometheus.Gauge
	shardHeld      *prometheus.GaugeVec
	shardMoves     *prometheus.CounterVec
	idConflicts    prometheus.Counter
	readPanics     *prometheus.CounterVec
	fenced         prometheus.Counter
	foreignChecks  *prometheus.GaugeVec

	TxnDuration  prometheus.Histogram
	TxnErrors    prometheus.Counter
	TxnOps       prometheus.Counter
	BudgetWait   *prometheus.HistogramVec
	InformerSync prometheus.Gauge
}

// NewMetrics registers the fleet's metrics with reg. Pass them to one
// Supervisor as Options.Metrics (and their ObserveTxn and ObserveWait to
// the consul client's options); the per-worker series come from that
// supervisor.
func NewMetrics(reg prometheus.Registerer, perWorker PerWorker) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{perWorker: perWorker}
	m.events = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_fleet_events_total",
		Help: "Kubernetes events routed to workers (each means: look again)."})
	m.flushes = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_fleet_flushes_total",
		Help: "Flushes that wrote to Consul or failed, all workers."})
	m.flushErrors = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_fleet_flush_errors_total",
		Help: "Failed flushes, all workers (each is retried with backoff)."})
	m.conflicts = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_fleet_cas_conflicts_total",
		Help: "CAS conflicts (an entry changed since it was read), all workers."})
	m.ops = f.NewCounterVec(prometheus.CounterOpts{Name: "fleetsync_fleet_instance_writes_total",
		Help: "Instances written to Consul by kind (register, update, deregister), all workers."}, []string{"kind"})
	m.latency = f.NewHistogram(prometheus.HistogramOpts{Name: "fleetsync_fleet_change_latency_seconds",
		Help:    "Time from the Kubernetes event that made a service dirty to the committed Consul transaction.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}})
	m.coalesced = f.NewHistogram(prometheus.HistogramOpts{Name: "fleetsync_fleet_flush_coalesced_events",
		Help: "Events folded into one flush.", Buckets: worker.CoalescedBuckets})
	m.restarts = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_supervisor_worker_restarts_total",
		Help: "Workers restarted after a crash."})
	m.started = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_supervisor_workers_started_total",
		Help: "Workers started."})
	m.stopped = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_supervisor_workers_stopped_total",
		Help: "Workers stopped (service gone and deregistered, or shutdown)."})
	m.bootstrapSecs = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_supervisor_bootstrap_duration_seconds",
		Help: "Time from start to a bootstrapped fleet (informers synced, owned state read)."})
	m.bootstrapRead = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_supervisor_bootstrap_read_duration_seconds",
		Help: "Time from start until the owned Consul state was read (beside the informers' sync; retries included)."})
	m.bootstrapped = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_supervisor_bootstrapped",
		Help: "1 once the fleet is bootstrapped."})
	m.bootstrapFails = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_supervisor_bootstrap_read_errors_total",
		Help: "Failed reads of the owned Consul state during bootstrap (retried)."})
	m.ownedAtStart = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_supervisor_owned_instances_at_bootstrap",
		Help: "Instances carrying our mark found on our node at bootstrap."})
	m.foreignAtStart = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_supervisor_foreign_entries_at_bootstrap",
		Help: "Entries on our node without our mark at bootstrap (never touched)."})
	m.resyncs = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_fleet_antientropy_passes_total",
		Help: "Anti-entropy passes (a worker re-read its owned state from Consul and diffed)."})
	m.repairs = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_fleet_antientropy_repairs_total",
		Help: "Anti-entropy passes that found drift and wrote a repair."})
	m.dataLost = f.NewCounterVec(prometheus.CounterOpts{Name: "fleetsync_consul_data_loss_detected_total",
		Help: "Signs that Consul lost or rolled back data (every worker re-read and repaired its Service), by signal: node_vanished, node_recreated, index_went_back, entry_lost, worker_evidence."}, []string{"signal"})
	for _, sig := range []string{loss.SignalNodeVanished, loss.SignalNodeRecreated, loss.SignalIndexBack, loss.SignalEntryLost, loss.SignalWorker} {
		m.dataLost.WithLabelValues(sig)
	}
	m.foreignNodes = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_consul_foreign_nodes",
		Help: "Nodes named like this cluster's that lack its mark (someone else's): nothing is written onto them, /readyz fails."})
	m.consulNodes = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_consul_nodes",
		Help: "Consul nodes this cluster's instances are spread over: --consul-nodes, or chosen at bootstrap (one per 100 Services, nodes in use kept while between 50 and 200 per node)."})
	m.shardHeld = f.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetsync_shard_held",
		Help: "1 for each shard this replica holds (with --shards > 1)."}, []string{"shard"})
	m.shardMoves = f.NewCounterVec(prometheus.CounterOpts{Name: "fleetsync_shard_transitions_total",
		Help: "Shards gained and lost by this replica."}, []string{"direction"})
	m.idConflicts = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_shard_replica_id_conflicts_total",
		Help: "Renewals of this replica's Lease by another process: --replica-id is not unique, and both processes hold the same shards."})
	m.readPanics = newReadPanics(f)
	m.fenced = newFenced(f)
	m.foreignChecks = newForeignChecks(f)
	m.TxnDuration = f.NewHistogram(prometheus.HistogramOpts{Name: "fleetsync_consul_txn_duration_seconds",
		Help:    "Duration of Consul transactions (one Raft apply each).",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5}})
	m.TxnErrors = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_consul_txn_errors_total",
		Help: "Consul transactions that failed or were rolled back (CAS conflicts included)."})
	m.TxnOps = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_consul_txn_ops_total",
		Help: "Operations sent in committed Consul transactions (node ops included)."})
	m.BudgetWait = f.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetsync_consul_budget_wait_seconds",
		Help:    "Time spent waiting for the global write budget, by priority.",
		Buckets: []float64{0.001, 0.01, 0.1, 0.5, 1, 5, 30}}, []string{"priority"})
	m.InformerSync = f.NewGauge(prometheus.GaugeOpts{Name: "fleetsync_k8s_informers_synced",
		Help: "1 once the Service and EndpointSlice informers have synced."})
	reg.MustRegister(&fleetCollector{m: m})
	return m
}

// ObserveTxn is the consul.Options.Observe hook.
func (m *Metrics) ObserveTxn(ops int, seconds float64, err error) {
	m.TxnDuration.Observe(seconds)
	if err != nil {
		m.TxnErrors.Inc()
		return
	}
	m.TxnOps.Add(float64(ops))
}

// ObserveWait is the consul.Options.ObserveWait hook.
func (m *Metrics) ObserveWait(waited time.Duration, high bool) {
	p := "bulk"
	if high {
		p = "high"
	}
	m.BudgetWait.WithLabelValues(p).Observe(waited.Seconds())
}

// attach makes the metrics report on sup and its workers (New does it for
// Options.Metrics).
func (m *Metrics) attach(sup *Supervisor) {
	if !m.sup.CompareAndSwap(nil, sup) {
		panic("supervisor: one Metrics given to two Supervisors")
	}
}

func (m *Metrics) observerFor(k8s.Key) worker.Observer { return observer{m} }

type observer struct{ m *Metrics }

func (o observer) Event()    { o.m.events.Inc() }
func (o observer) Conflict() { o.m.conflicts.Inc() }
func (o observer) Flushed(f worker.Flush) {
	if f.Resync && f.Err == nil {
		o.m.resyncs.Inc()
		if f.Wrote {
			o.m.repairs.Inc()
		}
	}
	if !f.Wrote && f.Err == nil {
		return // a look that found nothing to write
	}
	o.m.flushes.Inc()
	if f.Err != nil {
		o.m.flushErrors.Inc()
	}
	o.m.coalesced.Observe(float64(f.Coalesced))
	o.m.ops.WithLabelValues("register").Add(float64(f.Applied.Registered))
	o.m.ops.WithLabelValues("update").Add(float64(f.Applied.Updated))
	o.m.ops.WithLabelValues("deregister").Add(float64(f.Applied.Deregistered))
	if f.Latency > 0 {
		o.m.latency.Observe(f.Latency.Seconds())
	}
}

type hooks struct{ m *Metrics }

func (h hooks) WorkerStarted(k8s.Key)   { h.m.started.Inc() }
func (h hooks) WorkerStopped(k8s.Key)   { h.m.stopped.Inc() }
func (h hooks) WorkerRestarted(k8s.Key) { h.m.restarts.Inc() }
func (h hooks) Bootstrapped(d, read time.Duration, owned, foreign int) {
	h.m.bootstrapSecs.Set(d.Seconds())
	h.m.bootstrapRead.Set(read.Seconds())
	h.m.bootstrapped.Set(1)
	h.m.ownedAtStart.Set(float64(owned))
	h.m.foreignAtStart.Set(float64(foreign))
}
func (h hooks) BootstrapReadFailed(error)    { h.m.bootstrapFails.Inc() }
func (h hooks) InformersSynced()             { h.m.InformerSync.Set(1) }
func (h hooks) ConsulDataLost(signal string) { h.m.dataLost.WithLabelValues(signal).Inc() }
func (h hooks) ForeignNodes(n int)           { h.m.foreignNodes.Set(float64(n)) }
func (h hooks) ConsulNodes(n int)            { h.m.consulNodes.Set(float64(n)) }
func (h hooks) ShardGained(k int) {
	h.m.shardHeld.WithLabelValues(strconv.Itoa(k)).Set(1)
	h.m.shardMoves.WithLabelValues("gained").Inc()
}
func (h hooks) ShardLost(k int) {
	h.m.shardHeld.DeleteLabelValues(strconv.Itoa(k))
	h.m.shardMoves.WithLabelValues("lost").Inc()
}
func (h hooks) ReplicaIDConflict() { h.m.idConflicts.Inc() }

// Per-worker and per-state descriptors, exported at scrape time.
var (
	workerLabels = []string{"namespace", "service"}
	descWorkers  = prometheus.NewDesc("fleetsync_fleet_workers", "Workers by state.", []string{"state"}, nil)

	descEvents     = wdesc("events_total", "Kubernetes events received.")
	descFlushes    = wdesc("flushes_total", "Flushes that wrote to Consul or failed.")
	descOps        = prometheus.NewDesc("fleetsync_worker_instance_writes_total", "Instances written to Consul by kind.", append(workerLabels, "kind"), nil)
	descConflicts  = wdesc("cas_conflicts_total", "CAS conflicts.")
	descErrors     = wdesc("flush_errors_total", "Failed flushes.")
	descRetries    = wdesc("retries_total", "Flushes that retried a failed one.")
	descDesired    = wdesc("desired_instances", "Instances wanted in Consul.")
	descRegistered = wdesc("registered_instances", "Instances of ours in Consul, as last read or written.")
	descPending    = wdesc("pending", "1 while a change waits for the window or a retry.")
	descLastFlush  = wdesc("last_flush_timestamp_seconds", "Unix time of the last flush that wrote or failed.")
	descWindow     = wdesc("window_seconds", "The worker's batching window.")
	descLatency    = wdesc("change_latency_seconds", "Time from the Kubernetes event that made the service dirty to the committed transaction.")
	descCoalesced  = wdesc("flush_coalesced_events", "Events folded into one flush.")
	descBlocked    = wdesc("blocked_instances", "Desired instances not registered because someone else's entry holds their ID on our node (left untouched).")
	descFleetBlock = prometheus.NewDesc("fleetsync_fleet_blocked_instances", "Desired instances, all workers, not registered because someone else's entry holds their ID on our node.", nil, nil)
)

func wdesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("fleetsync_worker_"+name, help, workerLabels, nil)
}

type fleetCollector struct{ m *Metrics }

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWorkers, descEvents, descFlushes, descOps, descConflicts, descErrors,
		descRetries, descDesired, descRegistered, descPending, descLastFlush, descWindow, descLatency, descCoalesced,
		descBlocked, descFleetBlock} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	var sts []worker.Status
	if sup := c.m.sup.Load(); sup != nil {
		sts = sup.Workers()
	}
	byState := map[worker.State]int{}
	for _, s := range []worker.State{worker.StateWaiting, worker.StateIdle, worker.StatePending,
		worker.StateFlushing, worker.StateBackingOff, worker.StateInvalid} {
		byState[s] = 0
	}
	blocked := 0
	for _, st := range sts {
		byState[st.State]++
		blocked += st.Blocked
	}
	ch <- prometheus.MustNewConstMetric(descFleetBlock, prometheus.GaugeValue, float64(blocked))
	for s, n := range byState {
		ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(n), string(s))
	}
	for _, st := range c.m.selectWorkers(sts) {
		emitWorker(ch, st)
	}
}

// selectWorkers applies --metrics-per-worker.
func (m *Metrics) selectWorkers(sts []worker.Status) []worker.Status {
	switch {
	case m.perWorker.All:
		return sts
	case m.perWorker.TopK <= 0:
		return nil
	}
	m.rankMu.Lock()
	defer m.rankMu.Unlock()
	type ranked struct {
		st       worker.Status
		troubled bool
		recent   uint64
		total    uint64
	}
	rs := make([]ranked, len(sts))
	seen := make(map[k8s.Key]uint64, len(sts))
	for i, st := range sts {
		key := k8s.Key{Namespace: st.Namespace, Name: st.Service}
		total := activity(st)
		rs[i] = ranked{st: st, troubled: troubled(st), recent: total - min(m.lastSeen[key], total), total: total}
		seen[key] = total
	}
	m.lastSeen = seen
	sort.SliceStable(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		switch {
		case a.troubled != b.troubled:
			return a.troubled
		case a.recent != b.recent:
			return a.recent > b.recent
		default:
			return a.total > b.total
		}
	})
	out := make([]worker.Status, 0, min(m.perWorker.TopK, len(rs)))
	for _, r := range rs[:min(m.perWorker.TopK, len(rs))] {
		out = append(out, r.st)
	}
	return out
}

// activity is what a worker did in all: events, flushes and errors.
func activity(st worker.Status) uint64 { return st.Events + st.Flushes + st.Errors }

// troubled reports a worker an operator wants to see first.
func troubled(st worker.Status) bool {
	return st.State == worker.StateBackingOff || st.State == worker.StateInvalid || st.Blocked > 0 || st.Failures > 0
}

func emitWorker(ch chan<- prometheus.Metric, st worker.Status) {
	lv := []string{st.Namespace, st.Service}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), lv...)
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
	}
	counter(descEvents, st.Events)
	counter(descFlushes, st.Flushes)
	counter(descConflicts, st.Conflicts)
	counter(descErrors, st.Errors)
	counter(descRetries, st.Retries)
	for kind, v := range map[string]uint64{"register": st.Ops.Register, "update": st.Ops.Update, "deregister": st.Ops.Deregister} {
		ch <- prometheus.MustNewConstMetric(descOps, prometheus.CounterValue, float64(v), st.Namespace, st.Service, kind)
	}
	gauge(descDesired, float64(st.Desired))
	gauge(descRegistered, float64(st.Registered))
	gauge(descBlocked, float64(st.Blocked))
	pending := 0.0
	if st.Pending {
		pending = 1
	}
	gauge(descPending, pending)
	if !st.LastFlush.IsZero() {
		gauge(descLastFlush, float64(st.LastFlush.UnixNano())/1e9)
	}
	gauge(descWindow, st.Window.Seconds())
	n, sum, b := st.Latency.Snapshot()
	ch <- prometheus.MustNewConstHistogram(descLatency, n, sum, b, lv...)
	n, sum, b = st.Coalesced.Snapshot()
	ch <- prometheus.MustNewConstHistogram(descCoalesced, n, sum, b, lv...)
}
