package supervisor

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/fleetsync/fleetsync/consul"
)

// The kinds of foreign checks (fleetsync_consul_foreign_checks' kind).
const (
	checkKindNode    = "node"
	checkKindService = "service"
)

var checkStatuses = []string{consul.StatusPassing, consul.StatusWarning, consul.StatusCritical}

// newForeignChecks registers fleetsync_consul_foreign_checks, every
// series at 0.
func newForeignChecks(f promauto.Factory) *prometheus.GaugeVec {
	v := f.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetsync_consul_foreign_checks",
		Help: "Checks someone else registered on this cluster's Consul nodes (kind node) or under its instances (kind service) that concern a Service this replica syncs, by status, as the reads of owned state last saw them; never written or deleted by fleetsync. One not passing takes instances out of Consul's healthy answers and DNS, and fails /readyz."},
		[]string{"kind", "status"})
	for _, k := range []string{checkKindNode, checkKindService} {
		for _, st := range checkStatuses {
			v.WithLabelValues(k, st)
		}
	}
	return v
}

func (h hooks) ForeignChecks(checks []consul.ForeignCheck) {
	counts := map[[2]string]int{}
	for _, f := range checks {
		kind := checkKindService
		if f.NodeLevel() {
			kind = checkKindNode
		}
		counts[[2]string{kind, f.Status}]++
	}
	for _, k := range []string{checkKindNode, checkKindService} {
		for _, st := range checkStatuses {
			h.m.foreignChecks.WithLabelValues(k, st).Set(float64(counts[[2]string{k, st}]))
		}
	}
}
