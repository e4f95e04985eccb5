package supervisor

import (
	"fmt"
	"sync"
	"testing"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/worker"
)

func TestChooseNodes(t *testing.T) {
	for _, tc := range []struct{ selected, inUse, want int }{
		{0, 0, 1},
		{1, 0, 1},
		{100, 0, 1},
		{101, 0, 2},
		{200, 0, 2},
		{2000, 0, 20},
		{10000, 0, 100},
		{30000, 0, 300},
		{500000, 0, ownership.MaxNodes},
		// The nodes in use are kept while they hold 50 to 200 Services
		// on average (target/2 <= in use <= 2 x target).
		{150, 1, 1},    // target 2: one node of 150 stays
		{200, 1, 1},    // target 2
		{201, 1, 3},    // target 3: one node of 201 is too many
		{2000, 10, 10}, // target 20
		{2000, 9, 20},
		{2000, 40, 40},
		{2000, 41, 20},
		{80, 3, 1}, // target 1: three nodes for 80 are too many
		{80, 2, 2},
		{10000, 100, 100},
		{12000, 100, 100},
		{25000, 100, 250},
		{10000, ownership.MaxNodes + 1, 100}, // not a node count we write
	} {
		if got := ChooseNodes(tc.selected, tc.inUse); got != tc.want {
			t.Errorf("ChooseNodes(%d services, %d in use) = %d, want %d", tc.selected, tc.inUse, got, tc.want)
		}
	}
}

type nodeHooks struct {
	nopHooks
	mu sync.Mutex
	n  int
}

func (h *nodeHooks) ConsulNodes(n int) { h.mu.Lock(); h.n = n; h.mu.Unlock() }
func (h *nodeHooks) get() int          { h.mu.Lock(); defer h.mu.Unlock(); return h.n }

// TestAutoNodesSpreadAtBootstrap: with AutoNodes the supervisor chooses
// the node count before any worker starts, from the selected Services (one
// node per 100) and the nodes already in use (kept within the band), and
// every worker places its instances by that count; the loss detector's
// "in use" follows it.
func TestAutoNodesSpreadAtBootstrap(t *testing.T) {
	cluster, _ := ownership.New("test")
	for _, tc := range []struct {
		name            string
		services, inUse int
		want            int
	}{
		{name: "empty Consul, 250 Services", services: 250, want: 3},
		{name: "250 Services already on 5 nodes keep them", services: 250, inUse: 5, want: 5},
		{name: "250 Services on 8 nodes come back to 3", services: 250, inUse: 8, want: 3},
		{name: "a small cluster stays on one node", services: 40, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, store := newFakeWatcher(), newMemStore()
			for i := range tc.services {
				name := fmt.Sprintf("s%d", i)
				w.services[k8s.Key{Namespace: "ns", Name: name}] = service("ns", name, "10.0.0.1")
			}
			if tc.inUse > 0 {
				// One stale instance on the highest node in use, of a
				// Service that is gone: it is reaped, and it says how
				// many nodes are in use.
				stale := cluster.Stamp(consul.Instance{ID: cluster.InstanceID("ns", "gone", "10.0.0.9", 8080), Name: "gone",
					Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "gone"}, Check: consul.Check{Status: consul.StatusPassing}})
				store.put(stale, fmt.Sprintf("k8s-test.%d", tc.inUse-1))
			}
			close(w.synced)
			hooks := &nodeHooks{}
			f := startWith(t, w, store, func(s *Supervisor) { s.opts.AutoNodes, s.opts.Hooks.Consul = true, hooks })
			f.waitFor(t, "every Service registered and the stale one reaped", func() bool {
				return f.store.count("") == tc.services
			})
			if got := hooks.get(); got != tc.want {
				t.Errorf("chose %d nodes, want %d", got, tc.want)
			}
			spread, _ := cluster.WithNodes(tc.want)
			used := map[string]int{}
			entries, _ := f.store.ReadNode(t.Context())
			for _, r := range entries {
				used[r.Node]++
				if want := spread.NodeNameFor(r.ID); r.Node != want {
					t.Errorf("%s on %s, want %s (%d nodes)", r.ID, r.Node, want, tc.want)
				}
			}
			if len(used) != tc.want {
				t.Errorf("instances on %d nodes, want %d: %v", len(used), tc.want, used)
			}
			last := cluster.NodeName()
			if tc.want > 1 {
				last = fmt.Sprintf("k8s-test.%d", tc.want-1)
			}
			if !f.sup.nodeInUse(last) || f.sup.nodeInUse(fmt.Sprintf("k8s-test.%d", tc.want)) {
				t.Errorf("nodeInUse: %s should be in use and k8s-test.%d not", last, tc.want)
			}
		})
	}
}

// TestUsedNodesCountsEveryOwnedEntry: the highest node number of an
// entry of ours counts, also where another entry on a lower node shares
// its ID (the held maps keep one per ID); someone else's entries, and
// nodes not ours, count for nothing.
func TestUsedNodesCountsEveryOwnedEntry(t *testing.T) {
	cluster, err := ownership.New("used")
	if err != nil {
		t.Fatal(err)
	}
	ours := func(id, node string) consul.Registered {
		in := cluster.Stamp(consul.Instance{ID: id, Name: "web", Meta: map[string]string{worker.MetaNamespace: "ns", worker.MetaService: "web"}})
		return consul.Registered{Instance: in, Node: node}
	}
	foreign := ours("f", cluster.NodeName()+".30")
	foreign.Meta = map[string]string{"k8s-cluster": "other"}
	entries := []consul.Registered{
		ours("a", cluster.NodeName()+".10"), // the same ID on .10 and .2: read in name order, .2 last
		ours("a", cluster.NodeName()+".2"),
		ours("b", cluster.NodeName()),
		foreign,
		ours("c", "k8s-someone-else.40"),
	}
	if got := UsedNodes(cluster, entries); got != 11 {
		t.Errorf("UsedNodes = %d, want 11 (node .10 holds an entry of ours)", got)
	}
	if got := UsedNodes(cluster, nil); got != 0 {
		t.Errorf("UsedNodes of nothing = %d, want 0", got)
	}
}
