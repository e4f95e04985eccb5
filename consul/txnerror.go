package consul

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// TxnError is a transaction Consul rolled back: which ops failed and why,
// and (located) the instances, nodes and guard they belong to.
type TxnError struct {
	Errors   []api.TxnError
	Conflict bool     // a CAS failed: someone changed an entry since it was read
	IDs      []string // instances whose ops failed
	Nodes    []string // nodes whose op failed
	Guard    bool     // the guard op failed
	Fence    bool     // the shard's fence op failed
	// Fenced, when not "", says why the fence is another replica's now:
	// the error matches ErrFenced, not ErrConflict, and must not be
	// retried (see Change.Fence).
	Fenced string
}

// ErrFenced is matched by the error Apply returns when a transaction was
// refused on its shard's fence and the fence names a newer holder: another
// replica took the shard. The write is stale; retrying it is wrong.
var ErrFenced = errors.New("consul: shard fenced: another replica took it over")

func (e *TxnError) Error() string {
	msgs := make([]string, 0, len(e.Errors))
	for _, x := range e.Errors {
		msgs = append(msgs, fmt.Sprintf("op %d: %s", x.OpIndex, x.What))
	}
	var where []string
	if e.Guard {
		where = append(where, "the cluster-id claim check")
	}
	if e.Fence {
		where = append(where, "the shard's fence check")
	}
	if len(e.Nodes) > 0 {
		where = append(where, "node "+strings.Join(e.Nodes, ", "))
	}
	if len(e.IDs) > 0 {
		ids := e.IDs
		if len(ids) > 5 {
			ids = append(ids[:5:5], fmt.Sprintf("and %d more", len(e.IDs)-5))
		}
		where = append(where, "instance "+strings.Join(ids, ", "))
	}
	prefix := "transaction rolled back"
	switch {
	case e.Fenced != "":
		prefix = e.Fenced
	case e.Conflict:
		prefix = ErrConflict.Error()
	}
	if len(where) > 0 {
		prefix += " (" + strings.Join(where, "; ") + ")"
	}
	if len(msgs) == 0 {
		return prefix + ": no errors given"
	}
	return prefix + ": " + strings.Join(msgs, "; ")
}

// Is matches ErrFenced for a refusal on a fence that names another
// replica, else ErrConflict for a failed CAS.
func (e *TxnError) Is(target error) bool {
	if e.Fenced != "" {
		return target == ErrFenced
	}
	return e.Conflict && target == ErrConflict
}

// locate maps the failed op indexes to the guard, the fence, the nodes and
// the instances of the transaction (guarded guard ops, fenced fence ops,
// then nodes node ops, then the groups' ops in order).
func (e *TxnError) locate(ops api.TxnOps, guarded, fenced, nodes int, groups []group) {
	owner := make([]string, 0, len(ops))
	for range guarded + fenced {
		owner = append(owner, "")
	}
	first := guarded + fenced
	for i := range nodes {
		owner = append(owner, ops[first+i].Node.Node.Node)
	}
	for _, g := range groups {
		id := g.want.ID
		if g.have != nil {
			id = g.have.ID
		}
		for range g.ops {
			owner = append(owner, id)
		}
	}
	seenID, seenNode := map[string]bool{}, map[string]bool{}
	for _, x := range e.Errors {
		i := x.OpIndex
		switch {
		case i < 0 || i >= len(owner):
		case i < guarded:
			e.Guard = true
		case i < first:
			e.Fence = true
		case i < first+nodes:
			if !seenNode[owner[i]] {
				seenNode[owner[i]] = true
				e.Nodes = append(e.Nodes, owner[i])
			}
		default:
			if !seenID[owner[i]] {
				seenID[owner[i]] = true
				e.IDs = append(e.IDs, owner[i])
			}
		}
	}
	// A failed guard or node op makes the others fail too (their node is
	// missing, say): those are not separate findings.
	if e.Guard || e.Fence || len(e.Nodes) > 0 {
		e.IDs = nil
	}
	if e.Guard || e.Fence {
		e.Conflict = true // the claim or fence key changed since it was read
	}
}

func txnError(resp *wire.TxnResponse) error {
	te := &TxnError{}
	if resp != nil {
		for _, x := range resp.Errors {
			te.Errors = append(te.Errors, *x)
			if isCASFailure(x.What) {
				te.Conflict = true
			}
		}
	}
	return te
}

func isCASFailure(what string) bool {
	w := strings.ToLower(what)
	return strings.Contains(w, "cas") || strings.Contains(w, "index is stale") ||
		strings.Contains(w, "does not exist") || strings.Contains(w, "already exists")
}
