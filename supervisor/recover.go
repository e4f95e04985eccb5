package supervisor

import (
	"fmt"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The supervisor's long-running reads of Consul, the label of
// fleetsync_supervisor_read_panics_total.
const (
	readBootstrap = "bootstrap"
	readNodeCheck = "node_check"
	readRepair    = "repair"
)

// recoverRead runs the read f and turns a panic in it into its error: the
// read failed (and is retried as a failed read is), counted and logged
// with the panic's value and stack, and the daemon runs on. A broken
// answer must not end the process, which would then crash-loop on it.
func (s *Supervisor) recoverRead(read string, f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%s read panicked: %v", read, p)
			s.opts.Hooks.Consul.ReadPanicked(read)
			s.log.Error("A read of Consul panicked; it counts as a failed read", "read", read, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
	}()
	return f()
}

// newReadPanics registers fleetsync_supervisor_read_panics_total, every
// read's series at 0.
func newReadPanics(f promauto.Factory) *prometheus.CounterVec {
	v := f.NewCounterVec(prometheus.CounterOpts{Name: "fleetsync_supervisor_read_panics_total",
		Help: "Long-running reads of Consul that panicked (each a failed read, retried), by read: bootstrap, node_check, repair."}, []string{"read"})
	for _, r := range []string{readBootstrap, readNodeCheck, readRepair} {
		v.WithLabelValues(r)
	}
	return v
}

func (h hooks) ReadPanicked(read string) { h.m.readPanics.WithLabelValues(read).Inc() }
