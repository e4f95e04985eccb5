package admin

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
)

// nodeCatalog is the part of the Consul API that a Purger reads nodes
// and removeNode deletes them with (wire.API implements it).
type nodeCatalog interface {
	CatalogNode(name string, q *api.QueryOptions) (*api.CatalogNode, *api.QueryMeta, error)
	HealthNode(name string, q *api.QueryOptions) (api.HealthChecks, *api.QueryMeta, error)
	Txn(ops api.TxnOps, q *api.QueryOptions) (bool, *api.TxnResponse, *api.QueryMeta, error)
}

// purgeFenceMeta is the node meta key removeNode adds before it reads a
// node for the last time (see removeNode).
const purgeFenceMeta = "fleetsync-purging"

// nodeFate is what removeNode did with one node.
type nodeFate struct {
	removed bool   // deleted by us
	gone    bool   // deleted by someone else meanwhile
	why     string // neither: why the node was left
}

// removeNode deletes node, as read when purge found it empty, only if it
// still carries the cluster's mark and holds nothing: Consul deletes a
// node's services and checks with it, so a service registered on it since
// the read would go too. A CAS delete on the index read is not enough for
// that: Consul leaves a node's ModifyIndex alone when a service is
// registered on it with the node's data unchanged (as every fleetsync
// transaction and a plain catalog registration do). So the node is first
// fenced: its meta gets purgeFenceMeta, CAS on the index read (a node
// changed or replaced since is left alone). Any registration that writes
// the node from then on (a catalog registration, an agent's sync, a
// fleetsync transaction: they send the node without the fence) changes it,
// and so its index. The node is then read again, and deleted with a CAS on
// the fenced index only if it is still marked and empty; if not, the fence
// is taken off again (CAS too). Only a write that skips the node (a
// transaction with service ops alone, a registration with SkipNodeUpdate)
// between that read and the delete goes unseen. It returns an error only
// when Consul cannot be asked.
func removeNode(ctx context.Context, nc nodeCatalog, c consul.ClusterOwner, node *api.Node) (nodeFate, error) {
	name := node.Node
	if err := ownsNode(c, node); err != nil {
		return nodeFate{why: err.Error()}, nil
	}
	fenced := *node
	fenced.Meta = maps.Clone(node.Meta)
	fenced.Meta[purgeFenceMeta] = "true"
	resp, ok, err := nodeTxn(ctx, nc, api.NodeCAS, fenced)
	if err != nil {
		return nodeFate{}, fmt.Errorf("fence node %s before deleting it: %w", name, err)
	}
	if !ok || resp == nil || len(resp.Results) == 0 || resp.Results[0].Node == nil {
		now, err := readNode(ctx, nc, name)
		switch {
		case err != nil:
			return nodeFate{}, err
		case now == nil:
			return nodeFate{gone: true}, nil
		case now.Node.ModifyIndex != node.ModifyIndex:
			return nodeFate{why: fmt.Sprintf("it changed after purge read it (index %d, now %d), so it is left as it is", node.ModifyIndex, now.Node.ModifyIndex)}, nil
		}
		return nodeFate{why: "Consul refused to fence it before the delete: " + txnErrors(resp)}, nil
	}
	index := resp.Results[0].Node.ModifyIndex
	now, err := readNode(ctx, nc, name)
	if err != nil {
		return nodeFate{}, err
	}
	if now == nil {
		return nodeFate{gone: true}, nil
	}
	why, err := nodeInUse(ctx, nc, c, now, index)
	if err != nil {
		return nodeFate{}, err
	}
	if why == "" {
		if _, ok, err = nodeTxn(ctx, nc, api.NodeDeleteCAS, api.Node{Node: name, ModifyIndex: index}); err != nil {
			return nodeFate{}, fmt.Errorf("delete node %s: %w", name, err)
		}
		if ok {
			return nodeFate{removed: true}, nil
		}
		return nodeFate{why: "it was written to while purge was deleting it, so it is left as it is"}, nil
	}
	unfenced := *node
	unfenced.ModifyIndex = index
	if _, ok, err = nodeTxn(ctx, nc, api.NodeCAS, unfenced); err != nil || !ok {
		why += fmt.Sprintf(" (its node meta may still hold %s=true: harmless, gone with the node's next write)", purgeFenceMeta)
	}
	return nodeFate{why: why}, nil
}

// readNode reads node name with its services, consistently; nil when it
// does not exist.
func readNode(ctx context.Context, nc nodeCatalog, name string) (*api.CatalogNode, error) {
	n, _, err := nc.CatalogNode(name, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", name, err)
	}
	if n == nil || n.Node == nil {
		return nil, nil
	}
	return n, nil
}

// nodeInUse says why the node read as now must stay ("" when it may go):
// not at the fenced index, no longer marked, or not empty.
func nodeInUse(ctx context.Context, nc nodeCatalog, c consul.ClusterOwner, now *api.CatalogNode, index uint64) (string, error) {
	if now.Node.ModifyIndex != index {
		return "it was written to while purge was deleting it, so it is left as it is", nil
	}
	if err := ownsNode(c, now.Node); err != nil {
		return err.Error(), nil
	}
	var kept []string
	for _, svc := range now.Services {
		kept = append(kept, fmt.Sprintf("service %s id %s", svc.Service, svc.ID))
	}
	checks, _, err := nc.HealthNode(now.Node.Node, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("read checks of node %s: %w", now.Node.Node, err)
	}
	for _, hc := range checks {
		if hc.ServiceID == "" {
			kept = append(kept, "node check "+hc.CheckID)
		}
	}
	if len(kept) == 0 {
		return "", nil
	}
	sort.Strings(kept)
	return strings.Join(kept, "; ") + " registered on it after purge read it", nil
}

func txnErrors(resp *api.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return "rolled back without errors"
	}
	msgs := make([]string, 0, len(resp.Errors))
	for _, e := range resp.Errors {
		msgs = append(msgs, e.What)
	}
	return strings.Join(msgs, "; ")
}

// nodeTxn sends one node operation as a transaction. ok is false when
// Consul rolled it back (a CAS that failed).
func nodeTxn(ctx context.Context, nc nodeCatalog, verb api.NodeOp, node api.Node) (*api.TxnResponse, bool, error) {
	ok, resp, _, err := nc.Txn(api.TxnOps{{Node: &api.NodeTxnOp{Verb: verb, Node: node}}},
		(&api.QueryOptions{}).WithContext(ctx))
	return resp, ok, err
}
