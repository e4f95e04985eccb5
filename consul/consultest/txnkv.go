package consultest

import (
	"bytes"
	"fmt"

	"github.com/hashicorp/consul/api"
)

// kvOp applies one KV op of a transaction (the catalog ops are in txn.go).
func (t *txn) kvOp(op *api.KVTxnOp) (*api.TxnResult, error) {
	cur := t.kv[op.Key]
	result := func() (*api.TxnResult, error) {
		c := *t.kv[op.Key]
		c.Value = nil // writes answer the entry without its value
		return &api.TxnResult{KV: &c}, nil
	}
	switch op.Verb {
	case api.KVGet:
		if cur == nil {
			return nil, fmt.Errorf("key %q doesn't exist", op.Key)
		}
		c := *cur
		return &api.TxnResult{KV: &c}, nil
	case api.KVSet:
		t.kvSet(op)
		return result()
	case api.KVCAS:
		if !casMatches(cur != nil, func() uint64 { return cur.ModifyIndex }, op.Index) {
			return nil, fmt.Errorf("failed to set key %q, index is stale", op.Key)
		}
		t.kvSet(op)
		return result()
	case api.KVLock:
		// As Consul's kvsLockTxn: a live session takes a free key (its
		// LockIndex goes up) or rewrites one it holds.
		if t.s.sessions[op.Session] == nil {
			return nil, fmt.Errorf("invalid session %q", op.Session)
		}
		if cur != nil && cur.Session != "" && cur.Session != op.Session {
			return nil, fmt.Errorf("failed to lock key %q, lock is already held", op.Key)
		}
		t.kvLock(op, cur, op.Session)
		return result()
	case api.KVUnlock:
		if cur == nil || cur.Session != op.Session {
			return nil, fmt.Errorf("failed to unlock key %q, lock isn't held, or is held by another session", op.Key)
		}
		t.kvLock(op, cur, "")
		return result()
	case api.KVDelete:
		t.kvDelete(op.Key)
		return nil, nil
	case api.KVDeleteCAS:
		// A missing key succeeds (kvsDeleteCASTxn returns entry == nil);
		// the catalog's delete-cas of a missing node or service fails.
		if cur != nil && cur.ModifyIndex != op.Index {
			return nil, fmt.Errorf("failed to delete key %q, index is stale", op.Key)
		}
		t.kvDelete(op.Key)
		return nil, nil
	case api.KVCheckIndex:
		if cur == nil {
			return nil, fmt.Errorf("failed to check index, key %q doesn't exist", op.Key)
		}
		if cur.ModifyIndex != op.Index {
			return nil, fmt.Errorf("failed index check for key %q, current modify index %d != %d", op.Key, cur.ModifyIndex, op.Index)
		}
		c := *cur
		return &api.TxnResult{KV: &c}, nil
	case api.KVCheckSession:
		// As Consul's kvsCheckSessionTxn: a missing key fails, and so
		// does one locked by another session or by none.
		if cur == nil {
			return nil, fmt.Errorf("failed to check session, key %q doesn't exist", op.Key)
		}
		if cur.Session != op.Session {
			return nil, fmt.Errorf("failed session check for key %q, current session %q != %q", op.Key, cur.Session, op.Session)
		}
		c := *cur
		c.Value = nil
		return &api.TxnResult{KV: &c}, nil
	case api.KVCheckNotExists:
		if cur != nil {
			return nil, fmt.Errorf("key %q exists", op.Key)
		}
		return nil, nil
	}
	return nil, fmt.Errorf("unknown KV verb %q", op.Verb)
}

// kvSet writes a key; an identical value keeps its indexes.
func (t *txn) kvSet(op *api.KVTxnOp) {
	rec := &api.KVPair{Key: op.Key, Value: bytes.Clone(op.Value), Flags: op.Flags, Namespace: op.Namespace, Partition: op.Partition}
	if cur := t.kv[op.Key]; cur != nil {
		rec.CreateIndex, rec.ModifyIndex, rec.LockIndex, rec.Session = cur.CreateIndex, cur.ModifyIndex, cur.LockIndex, cur.Session
		if bytes.Equal(cur.Value, rec.Value) && cur.Flags == rec.Flags {
			return
		}
		rec.ModifyIndex = t.idx
	} else {
		rec.CreateIndex, rec.ModifyIndex = t.idx, t.idx
	}
	t.kv[op.Key] = rec
	t.bump("kvs")
}

func (t *txn) kvDelete(key string) {
	if t.kv[key] == nil {
		return
	}
	delete(t.kv, key)
	t.bump("tombstones")
}

// kvLock writes a key under session (taking the lock when it is not yet
// held by it), or with "" lets the lock go; both write the op's value, as
// Consul's acquire and release do.
func (t *txn) kvLock(op *api.KVTxnOp, cur *api.KVPair, session string) {
	rec := &api.KVPair{Key: op.Key, Value: bytes.Clone(op.Value), Flags: op.Flags, Session: session,
		CreateIndex: t.idx, ModifyIndex: t.idx, Namespace: op.Namespace, Partition: op.Partition}
	if cur != nil {
		rec.CreateIndex, rec.LockIndex = cur.CreateIndex, cur.LockIndex
	}
	if session != "" && (cur == nil || cur.Session != session) {
		rec.LockIndex++
	}
	t.kv[op.Key] = rec
	t.bump("kvs")
}
