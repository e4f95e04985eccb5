package loss

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleetsync/fleetsync/consul"
)

// fakeStore is a scripted Store: the nodes, their indexes and our
// committed ones, the catalog's marks, the KV index, the witnesses and the
// entries they read as (at an index, or gone). Safe for concurrent use.
type fakeStore struct {
	mu        sync.Mutex
	view      consul.NodesView
	index     map[string]uint64 // node index read
	committed map[string]uint64 // highest index our writes returned, by node
	marks     consul.CatalogMarks
	kv        uint64
	down      bool // every read fails
	ws        []consul.Witness
	entries   map[string]uint64 // by ID; absent: gone
	theirs    map[string]bool   // entries someone else re-registered
	retired   map[string]bool
	wreads    []string    // witnesses read, by ID
	after     []time.Time // CatalogMarks's after, by call
	nodeReads int
}

// errDown is Consul's own error text for a server that timed out.
//
//lint:ignore ST1005 the text is Consul's, as its client returns it
var errDown = errors.New("Unexpected response code: 500 (rpc error: timeout)")

func newFakeStore() *fakeStore {
	return &fakeStore{index: map[string]uint64{}, committed: map[string]uint64{}, entries: map[string]uint64{}, retired: map[string]bool{}}
}

func (s *fakeStore) edit(f func(s *fakeStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *fakeStore) ReadNodes(context.Context) (consul.NodesView, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeReads++
	if s.down {
		return consul.NodesView{}, errDown
	}
	return s.view, nil
}

func (s *fakeStore) NodeIndex(_ context.Context, node string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return 0, errDown
	}
	return s.index[node], nil
}

func (s *fakeStore) Committed(node string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed[node]
}

func (s *fakeStore) CommittedNodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.committed {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// ResetCommitted forgets the witnesses too, as the real client does.
func (s *fakeStore) ResetCommitted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.committed, s.ws = map[string]uint64{}, nil
}

func (s *fakeStore) CatalogMarks(_ context.Context, after time.Time) (consul.CatalogMarks, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.after = append(s.after, after)
	if s.down {
		return consul.CatalogMarks{}, errDown
	}
	return s.marks, nil
}

func (s *fakeStore) KVIndex(context.Context, string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return 0, errDown
	}
	return s.kv, nil
}

func (s *fakeStore) Witnesses() []consul.Witness {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ws)
}

func (s *fakeStore) IsWitness(w consul.Witness) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.ws, w) && !s.retired[w.ID]
}

func (s *fakeStore) ForgetWitnesses(prefix string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ws = slices.DeleteFunc(s.ws, func(w consul.Witness) bool { return strings.HasPrefix(w.ID, prefix) })
}

func (s *fakeStore) ReadWitness(_ context.Context, w consul.Witness) (consul.WitnessRead, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return consul.WitnessRead{}, errDown
	}
	s.wreads = append(s.wreads, w.ID)
	i, ok := s.entries[w.ID]
	return consul.WitnessRead{Found: ok, Index: i, Ours: ok && !s.theirs[w.ID]}, nil
}
