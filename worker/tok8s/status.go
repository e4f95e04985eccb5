package tok8s

import (
	"sync"
	"time"
)

// Status is a worker's figures for /debug/workers and the metrics, read at
// any time from any goroutine.
type Status struct {
	Namespace     string    `json:"namespace"`
	Service       string    `json:"service"`
	ConsulService string    `json:"consulService"` // "" for a unit whose objects are being deleted
	Mirror        bool      `json:"mirror"`        // fleetsync owns the Service too (else import mode)
	Known         bool      `json:"known"`         // the first health answer arrived
	Endpoints     int       `json:"endpoints"`     // endpoints wanted at the last look (instances mirrored)
	Writes        uint64    `json:"writes"`        // Kubernetes writes (creates, updates, deletes)
	Flushes       uint64    `json:"flushes"`       // flushes that wrote or failed
	Errors        uint64    `json:"errors"`        // failed flushes
	LastFlush     time.Time `json:"lastFlush"`     // end of the last flush that wrote or failed
	// LastFlushDuration is how long that flush took, its writes included.
	LastFlushDuration time.Duration `json:"lastFlushDuration"`
	LastError         string        `json:"lastError,omitempty"` // of the last flush, "" once one succeeds
	// Held says why endpoints or objects Consul's answers no longer have
	// are kept: HeldFilteredByACLs, HeldCatalogDrop, or "" (none held).
	Held string `json:"held,omitempty"`
}

// Why a unit's objects are held.
const (
	// HeldFilteredByACLs: the unit's health answers come filtered by
	// ACLs and drop endpoints mirrored now (hold.go).
	HeldFilteredByACLs = "filtered-by-acls"
	// HeldCatalogDrop: the supervisor's deletion guard holds the unit: a
	// catalog answer dropped most units at once.
	HeldCatalogDrop = "catalog-drop"
)

// stats is what Status reads, written by Run's goroutine.
type stats struct {
	mu sync.Mutex
	st Status
}

func (s *stats) flushed(began, ended time.Time, wrote int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Flushes++
	s.st.Writes += uint64(wrote)
	s.st.LastFlush, s.st.LastFlushDuration = ended, ended.Sub(began)
	s.st.LastError = ""
	if err != nil {
		s.st.Errors++
		s.st.LastError = err.Error()
	}
}

func (s *stats) held(held bool) {
	s.mu.Lock()
	s.st.Held = ""
	if held {
		s.st.Held = HeldFilteredByACLs
	}
	s.mu.Unlock()
}

func (s *stats) wanted(endpoints int) {
	s.mu.Lock()
	s.st.Endpoints = endpoints
	s.mu.Unlock()
}

// Status returns the worker's figures now.
func (w *Worker) Status() Status {
	w.stats.mu.Lock()
	st := w.stats.st
	w.stats.mu.Unlock()
	u := w.opts.Unit
	st.Namespace, st.Service, st.ConsulService, st.Mirror = u.Namespace, u.Name, u.ConsulName, u.Mirror
	st.Known = w.Known()
	return st
}
