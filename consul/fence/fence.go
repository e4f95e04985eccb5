package fence

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
)

// DefaultPrefix is the claim prefix the token keys live under by default
// (claim.DefaultPrefix).
const DefaultPrefix = "fleetsync/clusters"

// Value is the content of a token key.
type Value struct {
	Holder     string    `json:"holder"`
	Generation uint64    `json:"generation"`
	TakenAt    time.Time `json:"takenAt"`
}

// Options say whose tokens these are.
type Options struct {
	Prefix    string // the claim prefix (default DefaultPrefix)
	ClusterID string
	Holder    string // this replica's id, as in its shard Leases
	// RequestTimeout bounds each request (default 10s).
	RequestTimeout time.Duration
	// Scope puts the keys in a namespace and partition (as the claim's).
	Scope consul.Scope
	Log   hclog.Logger // default: none
	// OnFenced, when set, is told of each token found fenced (once per
	// token): the metric fleetsync_shard_fenced_total.
	OnFenced func(shard int)
	// Now is the clock of the values' TakenAt (default time.Now).
	Now func() time.Time
}

// Fences takes the tokens of one replica's shards.
type Fences struct {
	api  *api.Client
	opts Options
}

// New returns the Fences of opts.ClusterID's shards held by opts.Holder.
func New(c *api.Client, opts Options) *Fences {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 10 * time.Second
	}
	if opts.Log == nil {
		opts.Log = hclog.NewNullLogger()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.Scope = opts.Scope.Normal()
	return &Fences{api: c, opts: opts}
}

// Key is the token key of shard k of cluster id under the claim prefix.
func Key(prefix, clusterID string, k int) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return KeyPrefix(prefix, clusterID) + strconv.Itoa(k)
}

// KeyPrefix is the folder of a cluster's token keys (purge removes it).
func KeyPrefix(prefix, clusterID string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return strings.TrimSuffix(prefix, "/") + "/" + clusterID + "/shards/"
}

// Token is the fence of one shard as this replica took it: a consul.Guard
// for the shard's transactions. Safe for concurrent use.
type Token struct {
	f     *Fences
	shard int
	key   string
	gen   uint64
	taken time.Time  // the value's TakenAt, by this replica's clock
	mu    sync.Mutex // serialises Failed
	state atomic.Pointer[tokenState]
}

type tokenState struct {
	index  uint64
	fenced string // why writing is refused; "" while the token is ours
}

var _ consul.Guard = (*Token)(nil)

// Take takes shard k's token: it writes the next generation naming this
// replica, CAS on the index read (read again and retried when another
// write came between). Call it once this replica holds the shard's Lease,
// before the shard's workers start.
func (f *Fences) Take(ctx context.Context, k int) (*Token, error) {
	t := &Token{f: f, shard: k, key: Key(f.opts.Prefix, f.opts.ClusterID, k), taken: f.opts.Now().UTC()}
	for attempt := 0; attempt < 5; attempt++ {
		have, index, err := t.read(ctx)
		if err != nil {
			return nil, err
		}
		gen := uint64(1)
		if have != nil {
			gen = have.Generation + 1
		}
		written, ok, err := t.write(ctx, gen, index)
		if err != nil {
			return nil, err
		}
		if ok {
			t.gen = gen
			t.state.Store(&tokenState{index: written})
			f.opts.Log.Debug("Took the shard's fence", "shard", k, "key", t.key, "generation", gen, "index", written)
			return t, nil
		}
	}
	return nil, fmt.Errorf("take the fence of shard %d: key %s kept changing", k, t.key)
}

// Shard is the shard the token fences.
func (t *Token) Shard() int { return t.shard }

// Generation is the token's generation.
func (t *Token) Generation() uint64 { return t.gen }

// Ops are the check of every transaction of the shard: the key must still
// be at the index this replica wrote (or adopted). After a refusal that
// showed another holder it returns an error matching consul.ErrFenced.
func (t *Token) Ops() (api.TxnOps, error) {
	st := t.state.Load()
	if st.fenced != "" {
		return nil, &consul.TxnError{Fenced: st.fenced}
	}
	return api.TxnOps{{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: t.key, Index: st.index,
		Namespace: t.f.opts.Scope.Namespace, Partition: t.f.opts.Scope.Partition}}}, nil
}

// Failed re-reads the key after a transaction's check of it failed. It
// returns nil when the token is still this replica's (its index adopted,
// or the key written again when Consul lost or rolled it back), and an
// error matching consul.ErrFenced when a newer holder took it. The read
// is not cut short by ctx ending (it is bounded by the request timeout):
// a refusal seen as its worker stops is still counted.
func (t *Token) Failed(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.state.Load(); st.fenced != "" {
		return &consul.TxnError{Fenced: st.fenced}
	}
	ctx = context.WithoutCancel(ctx)
	have, index, err := t.read(ctx)
	if err != nil {
		return err
	}
	switch {
	case have != nil && t.newer(*have):
		why := fmt.Sprintf("%s: shard %d taken by replica %q (fence %s at generation %d; this replica's is %d): its transaction refused, not retried",
			consul.ErrFenced.Error(), t.shard, have.Holder, t.key, have.Generation, t.gen)
		t.state.Store(&tokenState{fenced: why})
		if t.f.opts.OnFenced != nil {
			t.f.opts.OnFenced(t.shard)
		}
		t.f.opts.Log.Warn("Shard fenced: another replica took it; a transaction of this replica was refused and is not retried",
			"shard", t.shard, "holder", have.Holder, "generation", have.Generation, "own_generation", t.gen)
		return &consul.TxnError{Fenced: why}
	case have != nil && have.Generation == t.gen:
		t.state.Store(&tokenState{index: index})
		return nil
	}
	// Gone, or older than ours: Consul lost or rolled back the key.
	written, ok, err := t.write(ctx, t.gen, index)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("fence of shard %d: key %s changed while it was written again", t.shard, t.key)
	}
	t.f.opts.Log.Warn("Wrote the shard's fence again: Consul lost or rolled it back", "shard", t.shard, "key", t.key, "generation", t.gen)
	t.state.Store(&tokenState{index: written})
	return nil
}

// newer reports whether have is a take of the shard after this token's:
// a newer generation, the same one by another replica, or another
// replica's taken later than this one (Consul lost the key and that
// replica took the shard from generation 1 again). Another replica's
// older value is the key rolled back: written again at this generation.
func (t *Token) newer(have Value) bool {
	if have.Generation > t.gen {
		return true
	}
	other := have.Holder != t.f.opts.Holder
	return other && (have.Generation == t.gen || have.TakenAt.After(t.taken))
}

// read returns the key's value (nil: none) and index (0: none).
func (t *Token) read(ctx context.Context) (*Value, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, t.f.opts.RequestTimeout)
	defer cancel()
	q := &api.QueryOptions{RequireConsistent: true, Namespace: t.f.opts.Scope.Namespace, Partition: t.f.opts.Scope.Partition}
	pair, _, err := t.f.api.KV().Get(t.key, q.WithContext(rctx))
	if err != nil {
		return nil, 0, fmt.Errorf("fence of shard %d: read %s: %w", t.shard, t.key, err)
	}
	if pair == nil {
		return nil, 0, nil
	}
	var v Value
	if err := json.Unmarshal(pair.Value, &v); err != nil {
		// Not a token: overwritten by the next generation.
		return &Value{}, pair.ModifyIndex, nil
	}
	return &v, pair.ModifyIndex, nil
}

// write sets the key to generation gen naming this replica, CAS on index
// (0: the key must not exist), and returns the index written, read back;
// ok is false when the CAS failed or another write came before the read.
// It is a KV write, not a transaction: Consul counts transactions as
// catalog writes, and gaining a shard writes nothing to the catalog.
func (t *Token) write(ctx context.Context, gen, index uint64) (uint64, bool, error) {
	b, err := json.Marshal(Value{Holder: t.f.opts.Holder, Generation: gen, TakenAt: t.taken})
	if err != nil {
		return 0, false, fmt.Errorf("fence of shard %d: encode: %w", t.shard, err)
	}
	rctx, cancel := context.WithTimeout(ctx, t.f.opts.RequestTimeout)
	defer cancel()
	w := &api.WriteOptions{Namespace: t.f.opts.Scope.Namespace, Partition: t.f.opts.Scope.Partition}
	ok, _, err := t.f.api.KV().CAS(&api.KVPair{Key: t.key, Value: b, ModifyIndex: index}, w.WithContext(rctx))
	if err != nil {
		return 0, false, fmt.Errorf("fence of shard %d: write %s: %w", t.shard, t.key, err)
	}
	if !ok {
		return 0, false, nil
	}
	have, written, err := t.read(ctx)
	if err != nil {
		return 0, false, err
	}
	if have == nil || have.Holder != t.f.opts.Holder || have.Generation != gen {
		return 0, false, nil // another write came first: look again
	}
	return written, true, nil
}
