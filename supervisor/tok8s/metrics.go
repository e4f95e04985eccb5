package tok8s

import (
	"cmp"
	"slices"
	"sort"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/fleetsync/fleetsync/consul/watch"
	wtok8s "github.com/fleetsync/fleetsync/worker/tok8s"
)

// Metrics are the Consul -> Kubernetes fleet's Prometheus metrics: the
// fleet-wide series always, per-worker series (computed from the workers'
// Status at scrape time, so an ended worker leaves no stale series) for
// as many workers as PerWorker says.
type Metrics struct {
	// PerWorker is how many workers export their own series: negative
	// all, 0 none, K the K with a failing last flush first, then the
	// busiest (writes, flushes, errors).
	PerWorker int

	sup      atomic.Pointer[Supervisor]
	started  prometheus.Counter
	writes   prometheus.Counter
	flushes  prometheus.Counter
	errors   prometheus.Counter
	duration prometheus.Histogram
	watches  atomic.Pointer[func() watch.WatchStats]
}

// SetWatches makes the health-query series report stats (the workers'
// watch.Client.Stats).
func (m *Metrics) SetWatches(stats func() watch.WatchStats) { m.watches.Store(&stats) }

func (m *Metrics) watchStats() watch.WatchStats {
	if f := m.watches.Load(); f != nil {
		return (*f)()
	}
	return watch.WatchStats{}
}

// NewMetrics registers the fleet's metrics with reg; pass them as
// Options.Metrics to one Supervisor.
func NewMetrics(reg prometheus.Registerer, perWorker int) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{PerWorker: perWorker}
	m.started = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_tok8s_workers_started_total",
		Help: "Consul -> Kubernetes workers started (one per unit; a unit whose source changed starts a new one)."})
	m.writes = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_tok8s_writes_total",
		Help: "Kubernetes writes (creates, updates, deletes of Services and EndpointSlices) of the Consul -> Kubernetes direction."})
	m.flushes = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_tok8s_flushes_total",
		Help: "Consul -> Kubernetes flushes that wrote or failed, all workers."})
	m.errors = f.NewCounter(prometheus.CounterOpts{Name: "fleetsync_tok8s_flush_errors_total",
		Help: "Failed Consul -> Kubernetes flushes, all workers (each is retried with backoff)."})
	m.duration = f.NewHistogram(prometheus.HistogramOpts{Name: "fleetsync_tok8s_flush_duration_seconds",
		Help:    "Duration of Consul -> Kubernetes flushes that wrote or failed, their writes included.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}})
	const watchesHelp = "Consul health queries of the to-k8s workers: blocking now (mode=blocking, at most fleetsync_tok8s_health_watches_max when not 0) or waiting for their poll past that cap (mode=polling)."
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "fleetsync_tok8s_health_watches", Help: watchesHelp, ConstLabels: prometheus.Labels{"mode": "blocking"}},
		func() float64 { return float64(m.watchStats().Blocking) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "fleetsync_tok8s_health_watches", Help: watchesHelp, ConstLabels: prometheus.Labels{"mode": "polling"}},
		func() float64 { return float64(m.watchStats().Polling) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "fleetsync_tok8s_health_watches_max",
		Help: "The cap of blocking health queries in effect (0: none): --to-k8s-max-watches when given, else none when Consul speaks HTTP/2 (its HTTPS port), else the flag's default."},
		func() float64 { return float64(m.watchStats().Max) })
	f.NewCounterFunc(prometheus.CounterOpts{Name: "fleetsync_tok8s_health_polls_total",
		Help: "Health reads of to-k8s workers past --to-k8s-max-watches: each a poll instead of a blocking query."},
		func() float64 { return float64(m.watchStats().Polls) })
	f.NewCounterFunc(prometheus.CounterOpts{Name: "fleetsync_tok8s_health_nudged_polls_total",
		Help: "Polls past --to-k8s-max-watches that the change feed (blocking queries on the checks critical and warning) started before their interval, because their service's checks changed."},
		func() float64 { return float64(m.watchStats().Nudged) })
	reg.MustRegister(m)
	return m
}

// observe is every worker's hook: Options.Observe and the metrics.
func (s *Supervisor) observe(st wtok8s.Status, writes int, err error) {
	if m := s.opts.Metrics; m != nil {
		m.flushes.Inc()
		m.writes.Add(float64(writes))
		if err != nil {
			m.errors.Inc()
		}
		m.duration.Observe(st.LastFlushDuration.Seconds())
	}
	if s.opts.Observe != nil {
		s.opts.Observe(writes, err)
	}
}

// Workers is the status of every running worker, by namespace and name.
func (s *Supervisor) Workers() []wtok8s.Status {
	s.mu.Lock()
	out := make([]wtok8s.Status, 0, len(s.workers))
	for k, r := range s.workers {
		st := r.w.Status() // a worker never waits for s.mu under its own locks
		if st.Held == "" && s.held[k] {
			st.Held = wtok8s.HeldCatalogDrop
		}
		out = append(out, st)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b wtok8s.Status) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Service, b.Service))
	})
	return out
}

var (
	workerLabels  = []string{"namespace", "service"}
	descWorkers   = prometheus.NewDesc("fleetsync_tok8s_workers", "Consul -> Kubernetes workers running.", nil, nil)
	descEndpoints = prometheus.NewDesc("fleetsync_tok8s_endpoints", "Endpoints in the mirrored EndpointSlices, all workers, as last computed.", nil, nil)
	descWWrites   = wdesc("writes_total", "Kubernetes writes (Services and EndpointSlices).")
	descWFlushes  = wdesc("flushes_total", "Flushes that wrote or failed.")
	descWErrors   = wdesc("flush_errors_total", "Failed flushes.")
	descWLast     = wdesc("last_flush_duration_seconds", "Duration of the last flush that wrote or failed.")
	descWLastAt   = wdesc("last_flush_timestamp_seconds", "Unix time of the last flush that wrote or failed.")
	descWEps      = wdesc("endpoints", "Endpoints wanted in the unit's EndpointSlices at the last look (the Consul instances mirrored).")
	descWFailing  = wdesc("failing", "1 while the last flush failed.")
)

func wdesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("fleetsync_tok8s_worker_"+name, help, workerLabels, nil)
}

// Describe is prometheus.Collector's: the series computed at scrape time.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWorkers, descEndpoints, descWWrites, descWFlushes, descWErrors, descWLast, descWLastAt, descWEps, descWFailing} {
		ch <- d
	}
}

// Collect is prometheus.Collector's.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	var sts []wtok8s.Status
	if sup := m.sup.Load(); sup != nil {
		sts = sup.Workers()
	}
	eps := 0
	for _, st := range sts {
		eps += st.Endpoints
	}
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(len(sts)))
	ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(eps))
	for _, st := range m.pick(sts) {
		lv := []string{st.Namespace, st.Service}
		ch <- prometheus.MustNewConstMetric(descWWrites, prometheus.CounterValue, float64(st.Writes), lv...)
		ch <- prometheus.MustNewConstMetric(descWFlushes, prometheus.CounterValue, float64(st.Flushes), lv...)
		ch <- prometheus.MustNewConstMetric(descWErrors, prometheus.CounterValue, float64(st.Errors), lv...)
		ch <- prometheus.MustNewConstMetric(descWEps, prometheus.GaugeValue, float64(st.Endpoints), lv...)
		failing := 0.0
		if st.LastError != "" {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(descWFailing, prometheus.GaugeValue, failing, lv...)
		if !st.LastFlush.IsZero() {
			ch <- prometheus.MustNewConstMetric(descWLast, prometheus.GaugeValue, st.LastFlushDuration.Seconds(), lv...)
			ch <- prometheus.MustNewConstMetric(descWLastAt, prometheus.GaugeValue, float64(st.LastFlush.UnixNano())/1e9, lv...)
		}
	}
}

// pick applies PerWorker: failing workers first, then the busiest.
func (m *Metrics) pick(sts []wtok8s.Status) []wtok8s.Status {
	switch {
	case m.PerWorker < 0:
		return sts
	case m.PerWorker == 0:
		return nil
	}
	sorted := append([]wtok8s.Status(nil), sts...)
	busy := func(st wtok8s.Status) uint64 { return st.Writes + st.Flushes + st.Errors }
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if (a.LastError != "") != (b.LastError != "") {
			return a.LastError != ""
		}
		return busy(a) > busy(b)
	})
	return sorted[:min(m.PerWorker, len(sorted))]
}
